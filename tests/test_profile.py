"""graphc.profile: every kernel of a compiled call timed natively, in a table and a Chrome
trace, without changing the user's model."""

import json

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
import graphc.nn as nn  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
from graphc.errors import GraphcError  # noqa: E402


def _step():
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = graphc.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return model, graphc.compile(step, backend="cpu")


def test_a_training_step_profiles_kernel_by_kernel_without_moving_the_model(tmp_path):
    model, step = _step()
    x, y = graphc.randn(16, 32), graphc.randint(0, 10, (16,))
    for _ in range(3):
        step(x, y)
    before = [p.detach().numpy().copy() for p in model.parameters()]
    report = graphc.profile(step, x, y, repeat=5, trace=str(tmp_path / "t.json"))
    after = [p.detach().numpy() for p in model.parameters()]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert len(report.rows) == len(step.executable.lowered.kernels)
    assert [r.seconds for r in report.rows] == sorted((r.seconds for r in report.rows),
                                                      reverse=True)
    assert sum(r.seconds for r in report.rows) <= report.total * 1.5 + 1e-4
    gemms = [r for r in report.rows if "matmul" in r.op]
    assert gemms and all(r.flops > 0 for r in gemms)
    assert any("test_profile.py" in r.source for r in report.rows)  # the user's lines
    table = report.table()
    assert "GFLOP/s" in table and "matmul" in table
    events = json.load(open(tmp_path / "t.json"))["traceEvents"]
    assert len(events) == len(report.rows) and all(e["ph"] == "X" for e in events)
    starts = [e["ts"] for e in events]
    assert starts == sorted(starts)


def test_a_plain_function_is_compiled_and_profiled():
    report = graphc.profile(lambda a: (a @ a).relu().sum(), graphc.randn(64, 64), repeat=3)
    assert report.runs == 3 and report.total > 0
    assert report.rows[0].seconds >= report.rows[-1].seconds


def test_a_forward_whose_outputs_need_gradients_profiles_its_forward_part():
    # outputs that need a grad_fn run the entry's forward part, an executable of its own
    # under autograd; the profile times that one (it used to say the call "traced again")
    graphc.manual_seed(0)
    layer = nn.ConvTranspose2d(8, 4, 4, 2, 1)
    forward = graphc.compile(lambda x: layer(x).relu(), backend="cpu")
    x = graphc.randn(2, 8, 4, 4)
    forward(x)
    report = graphc.profile(forward, x, repeat=3)
    assert report.graph_name.endswith("_forward")
    assert [r.op for r in report.rows].count("conv2d_input_grad") == 1
    assert forward(x).requires_grad  # the call still runs under autograd afterwards


def test_only_the_cpu_backend_is_profiled():
    f = graphc.compile(lambda a: a * 2, backend="interp")
    with pytest.raises(GraphcError, match="compile it with backend=\"cpu\""):
        graphc.profile(f, graphc.ones(3))
