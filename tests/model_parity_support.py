"""Shared harness of the model-family parity tests (tests/test_models_vision.py,
tests/test_models_recurrent.py): the issue-12 criterion.

A family's natural program is written once as `build(nn)` (the model from a module namespace,
torch.nn or graphc.nn) and `step(F, model, batch) -> loss` (its loss, from a functional
namespace). The torch float64 model is seeded and its weights copied into a torch float32
model, a graphc eager model and a graphc compiled model (backend="cpu", or the one named),
all float32 except the reference. All four train STEPS steps from the same weights on the
same batches with the same optimizer; then each graphc run's parameters must end within

    max(10 * (torch float32's own distance from torch float64), 1e-4)

of torch float64's, distance being the largest absolute difference over all parameters and
buffers (BatchNorm's running statistics included).
"""

from __future__ import annotations

import numpy as np

import graphc
import graphc.nn as gnn
import graphc.nn.functional as GF
from tests.conftest import torch_or_skip

STEPS = 5


def _optimizer(lib, params, name: str, lr: float):
    if name == "adam":
        return lib.optim.Adam(params, lr=lr)
    return lib.optim.SGD(params, lr=lr, momentum=0.9)


def _float_state(model) -> dict:
    out = {}
    for k, v in model.state_dict().items():
        a = v.detach().numpy()
        if np.issubdtype(a.dtype, np.floating):
            out[k] = a.astype(np.float64)
    return out


def distance(a: dict, b: dict) -> float:
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def run_family(build, step, batches, *, optimizer="sgd", lr=0.05, seed=0, bound=10.0,
               backend="cpu"):
    """Train torch f64, torch f32, graphc eager f32 and graphc compiled f32 (for `backend`);
    check the bound.

    `batches`: STEPS tuples of float64 / int64 numpy arrays. Returns the distances."""
    torch = torch_or_skip()
    import torch.nn.functional as TF

    torch.manual_seed(seed)
    reference = build(torch.nn).double()
    state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    t32 = build(torch.nn).float()
    t32.load_state_dict(state)
    graphc_models = []
    for _ in range(2):
        g = build(gnn)
        g.load_state_dict({k: graphc.tensor(v.numpy().copy()) for k, v in state.items()})
        g.float()
        graphc_models.append(g)

    def as_torch(a, dtype):
        t = torch.tensor(a)
        return t.to(dtype) if t.is_floating_point() else t

    def as_graphc(a):
        t = graphc.tensor(a)
        return t.float() if t.dtype.is_floating else t

    def torch_run(model, dtype):
        model.train()
        opt = _optimizer(torch, model.parameters(), optimizer, lr)
        for batch in batches:
            opt.zero_grad()
            loss = step(TF, model, [as_torch(a, dtype) for a in batch])
            loss.backward()
            opt.step()

    def graphc_run(model, compiled: bool):
        model.train()
        opt = _optimizer(graphc, model.parameters(), optimizer, lr)

        def train_step(*batch):
            opt.zero_grad()
            loss = step(GF, model, list(batch))
            loss.backward()
            opt.step()
            return loss

        fn = graphc.compile(train_step, backend=backend) if compiled else train_step
        for batch in batches:
            fn(*[as_graphc(a) for a in batch])

    torch_run(reference, torch.float64)
    torch_run(t32, torch.float32)
    graphc_run(graphc_models[0], compiled=False)
    graphc_run(graphc_models[1], compiled=True)
    want = _float_state(reference)
    own = distance(_float_state(t32), want)
    tolerance = max(bound * own, 1e-4)
    moved = distance(want, {k: v.numpy().astype(np.float64) for k, v in state.items()
                            if v.is_floating_point()})
    assert moved > 2 * tolerance, "training moved the weights too little to test anything"
    result = {"torch_float32": own}
    for name, g in zip(("eager", "compiled"), graphc_models):
        d = distance(_float_state(g), want)
        result[name] = d
        assert d <= tolerance, (f"graphc {name}: {d:.3g} from torch float64, allowed "
                                f"{tolerance:.3g} (torch float32 is {own:.3g} away)")
    return result
