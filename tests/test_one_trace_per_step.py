"""A compiled training step compiles once (issue 13): its first call, which creates the
optimizer state and the `.grad`s, compiles the steady-state graph that every later call
replays (from one trace where the state can be made beforehand, graphc.jit.first_step; else
the first call runs on the interpreter and the steady graph is traced after it); the second
call neither traces nor compiles. Results equal the eager step's."""

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F

OPTIMIZERS = {
    "sgd_momentum": lambda p: graphc.optim.SGD(p, lr=0.1, momentum=0.9),
    "sgd_dampening": lambda p: graphc.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.5),
    "adam": lambda p: graphc.optim.Adam(p, lr=0.01),
    "adamw": lambda p: graphc.optim.AdamW(p, lr=0.01),
}
if hasattr(graphc.optim, "RMSprop"):
    OPTIMIZERS["rmsprop"] = lambda p: graphc.optim.RMSprop(p, lr=0.01)


def _losses(make_opt, compiled: bool, steps: int = 4):
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = make_opt(model.parameters())

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    run = graphc.compile(step, backend="cpu") if compiled else step
    graphc.manual_seed(1)
    x, y = graphc.randn(8, 6), graphc.randint(0, 3, (8,))
    losses = [run(x, y).item() for _ in range(steps)]
    return losses, [p.detach().numpy().copy() for p in model.parameters()], run


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_training_step_traces_one_graph_and_matches_eager(name):
    losses, params, run = _losses(OPTIMIZERS[name], compiled=True)
    eager_losses, eager_params, _ = _losses(OPTIMIZERS[name], compiled=False)
    assert len(run.graphs) == 1 and run.recompile_reasons == []
    assert run.executable.backend == "cpu"
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(params, eager_params):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_an_inference_call_still_compiles_its_own_first_graph():
    f = graphc.compile(lambda x: (x * 2).relu(), backend="cpu")
    assert f(graphc.tensor([-1.0, 2.0])).tolist() == [0.0, 4.0]
    assert len(f.graphs) == 1 and f.executable.backend == "cpu"
