"""Review of the batch norm kernels of the eleventh and twelfth sessions (batch_norm_relu, its
sums from the convolution, its backward: h6 this session) over the modes a model puts a
batch norm in, as a seeded fuzzer: a conv - batch norm - (+ residual) - ReLU layer whose
batch norm is in training mode, in eval mode with gradients flowing through it (a frozen
batch norm, as when fine-tuning), with a cumulative average (momentum None), without
running statistics (batch statistics in eval mode too), or without weight and bias; one
compiled step called in train mode, then eval mode, then train mode again (a retrace each
switch, the running statistics carried across), SGD-momentum updates after each call;
fuse_batch_norm_backward (h6) turned on where it exists.

Each case runs the same calls eagerly (graphc float32), compiled for the cpu on one thread
and on two, and in PyTorch 2.13 float64, and checks every output, input gradient, parameter
and running statistic after each call within 2x eager graphc's distance from float64
(docs/performance.md, "Rounding").
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")
torch = pytest.importorskip("torch", reason="PyTorch 2.13 CPU is the reference")

import graphc  # noqa: E402
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.test_review_s12_resnet_steps_fuzz import fixed_threads  # noqa: E402

resolve_blas()
MODES = {
    "training": {},
    "momentum None": {"momentum": None},
    "no running statistics": {"track_running_stats": False},
    "no weight and bias": {"affine": False},
}
CALLS = ("train", "eval", "train")


@pytest.fixture(autouse=True)
def _shared_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _layer(lib, c, o, stride, options):
    nn = lib.nn

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(c, o, 3, stride=stride, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(o, **options)

        def forward(self, x, r):
            y = self.bn(self.conv(x))
            return (y + r).relu() if r is not None else y.relu()

    return Layer()


def _step(model, lib, residual: bool):
    opt = lib.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, r, q):
        opt.zero_grad()
        x.grad = None
        y = model(x, r if residual else None)
        z = y.reshape(y.shape[0], -1) @ q  # a product: the ReLU stays the batch norm's
        (z * z).sum().backward()
        grad = x.grad
        opt.step()
        return [y.detach(), grad]

    return step


def _state(model) -> dict:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()
            if "num_batches" not in k}


def fused_backward_on(monkeypatch) -> None:
    """h6's fuse_batch_norm_backward (off by default when it landed: FUSE False) turned on,
    where the pass exists, so that its batch_norm_relu_backward kernel is reviewed too (the
    pipeline cache keys on tuning constants)."""
    try:
        module = importlib.import_module("graphc.passes.batch_norm_backward")
    except ImportError:
        return
    monkeypatch.setattr(module, "FUSE", True)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_batch_norm_modes_through_train_eval_train_calls_within_rounding(mode, monkeypatch):
    fused_backward_on(monkeypatch)
    rng = np.random.default_rng(sorted(MODES).index(mode))
    c, o = int(rng.choice([3, 16, 24])), int(rng.choice([16, 32]))
    n, size, stride = int(rng.choice([2, 3])), int(rng.choice([8, 16])), int(rng.choice([1, 2]))
    residual = bool(rng.integers(2))
    what = f"{mode}: x[{n},{c},{size},{size}] -> {o}, stride {stride}, residual {residual}"
    out = (size - 1) // stride + 1
    x = (rng.standard_normal((n, c, size, size)) + 0.3).astype(np.float32)
    r = rng.standard_normal((n, o, out, out)).astype(np.float32)
    q = (rng.standard_normal((o * out * out, 3)) / np.sqrt(o * out * out)).astype(np.float32)
    graphc.manual_seed(0)
    models = {key: _layer(graphc, c, o, stride, MODES[mode]) for key in ("eager", 1, 2)}
    for key in (1, 2):
        models[key].load_state_dict(models["eager"].state_dict())
    reference = _layer(torch, c, o, stride, MODES[mode])
    reference.load_state_dict({k: torch.tensor(v.detach().numpy().copy())
                               for k, v in models["eager"].state_dict().items()})
    reference.double()
    steps = {key: _step(m, graphc, residual) for key, m in models.items()}
    for count in (1, 2):
        fixed_threads(monkeypatch, count)
        steps[count] = graphc.compile(steps[count], backend="cpu")
    ref_step = _step(reference, torch, residual)
    for i, call in enumerate(CALLS):
        got = {}
        for key, model in models.items():
            model.train(call == "train")
            got[key] = [t.numpy().copy() for t in steps[key](
                graphc.tensor(x).requires_grad_(), graphc.tensor(r), graphc.tensor(q))]
        reference.train(call == "train")
        want = [t.detach().numpy() for t in ref_step(
            torch.tensor(x).double().requires_grad_(), torch.tensor(r).double(),
            torch.tensor(q).double())]
        state = {key: _state(m) for key, m in models.items()}
        want_state = _state(reference)
        for count in (1, 2):
            results = list(zip(("y", "x.grad"), got[count], got["eager"], want)) + \
                [(k, state[count][k], state["eager"][k], v) for k, v in want_state.items()]
            for name, g, e, ref_value in results:
                try:
                    assert_rounding_within(g, e, ref_value)
                except AssertionError as error:
                    raise AssertionError(f"{what}: call {i} ({call}), {name}, {count} "
                                         f"thread(s): {error}") from None
