"""A training step's plan written out as one function (`CallPlan.stepping`): the compiled
callable's first try runs it, and it does exactly what the plan's general `run` does: the
same losses, parameters, optimizer state, `.grad`s and version counts bit for bit, a random
generator advanced the same way, Ctrl-C held over the whole step."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
import graphc.nn as gnn  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
import graphc.optim as goptim  # noqa: E402
from graphc.jit import call_plan  # noqa: E402


def _step(dropout: bool):
    graphc.manual_seed(0)
    model = gnn.Sequential(gnn.Linear(32, 64), gnn.ReLU(), gnn.Linear(64, 10))
    opt = goptim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        hidden = model(x)
        if dropout:
            hidden = F.dropout(hidden, 0.25)
        loss = F.cross_entropy(hidden, y)
        loss.backward()
        opt.step()
        return loss.detach()

    return model, opt, graphc.compile(step, backend="cpu")


def _state(model, opt) -> list[np.ndarray]:
    arrays = []
    for p in model.parameters():
        arrays += [p.detach().numpy().copy(), p.grad.numpy().copy(),
                   opt.state[p]["momentum_buffer"].numpy().copy()]
    return arrays


@pytest.mark.parametrize("dropout", [False, True], ids=["plain", "dropout"])
def test_the_step_function_does_what_the_plan_does(dropout, monkeypatch):
    rng = np.random.default_rng(5)
    x = graphc.tensor(rng.standard_normal((16, 32)).astype(np.float32))
    y = graphc.tensor(rng.integers(0, 10, 16))
    runs = []
    for written_out in (True, False):
        model, opt, step = _step(dropout)
        graphc.manual_seed(1)
        losses = [float(step(x, y)) for _ in range(2)]  # traced, then planned
        plan = step._entries[-1].plan
        assert plan.stepping is not None
        if not written_out:
            plan.stepping = None
            step._fast = None
        ran = []
        real = call_plan.CallPlan.run
        monkeypatch.setattr(call_plan.CallPlan, "run",
                            lambda self, *a: ran.append(1) or real(self, *a))
        losses += [float(step(x, y)) for _ in range(4)]
        monkeypatch.undo()
        assert step._fast[1] is (plan.stepping or plan.run) or not written_out
        assert (ran == []) is written_out  # the written-out step never calls `run`
        versions = [p._version_counter for p in model.parameters()]
        runs.append((losses, _state(model, opt), [v.__dict__.copy() for v in versions]))
    (losses, state, versions), (losses2, state2, versions2) = runs
    assert losses == losses2
    for a, b in zip(state, state2):
        np.testing.assert_array_equal(a, b)
    assert versions == versions2


def test_the_step_function_holds_interrupts_over_the_step():
    model, opt, step = _step(False)
    x = graphc.tensor(np.ones((16, 32), np.float32))
    y = graphc.tensor(np.zeros(16, np.int64))
    step(x, y)
    step(x, y)
    source = step._entries[-1].plan.stepping.__doc__
    held = source.index("with HeldInterrupts():")
    assert held < source.index("EX.run(") < source.index("._grad = ")
    assert source.index("._version_counter.bump()") > held
