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


def test_an_update_the_run_could_not_make_in_place_is_written_back_the_same_way():
    """A momentum buffer in Fortran order is bound as a contiguous copy: its update comes back
    in the copy, and the written-out step hands it to `write_back`, as the plan's `run` does."""
    rng = np.random.default_rng(9)
    x = graphc.tensor(rng.standard_normal((16, 32)).astype(np.float32))
    y = graphc.tensor(rng.integers(0, 10, 16))
    runs = []
    for written_out in (True, False):
        model, opt, step = _step(False)
        losses = [float(step(x, y)) for _ in range(2)]
        plan = step._entries[-1].plan
        if not written_out:
            plan.stepping = None
            step._fast = None
        buffer = opt.state[model[0].weight]["momentum_buffer"]
        buffer._array = np.asfortranarray(buffer._array)
        written = []
        if written_out:
            names = plan.stepping.__globals__
            real = names["write_back"]
            names["write_back"] = lambda *a: written.append(1) or real(*a)
        losses += [float(step(x, y)) for _ in range(3)]
        if written_out:
            assert step._entries[-1].plan is plan and written == [1, 1, 1]
            names["write_back"] = real
        assert not buffer._array.flags.c_contiguous  # written into, not replaced
        runs.append((losses, _state(model, opt)))
    (losses, state), (losses2, state2) = runs
    assert losses == losses2
    for a, b in zip(state, state2):
        np.testing.assert_array_equal(a, b)


def test_an_update_made_in_a_fresh_array_is_copied_into_its_target():
    """`w -= (a.T @ b).T * 0.1`: the update is not computed in place (the plan gives it an
    array of its own), so the written-out step copies it into `w`'s array and bumps its
    version, as `write_back` does."""
    rng = np.random.default_rng(3)
    a = graphc.tensor(rng.standard_normal((64, 64)).astype(np.float32))
    b = graphc.tensor(rng.standard_normal((64, 64)).astype(np.float32))
    start = rng.standard_normal((64, 64)).astype(np.float32)
    results = []
    for written_out in (True, False):
        w = graphc.tensor(start.copy())

        def update(a, b, w=w):
            w.sub_((a.T @ b).T * 0.1)
            return w.sum()

        f = graphc.compile(update, backend="cpu")
        sums = [float(f(a, b)) for _ in range(2)]
        plan = f._entries[-1].plan
        assert f.executable.updates_in_place == (False,)
        assert "np.copyto(" in plan.stepping.__doc__
        if not written_out:
            plan.stepping = None
            f._fast = None
        array, version = w._array, w._version
        sums += [float(f(a, b)) for _ in range(3)]
        assert w._array is array and w._version == version + 3
        results.append((sums, w.numpy().copy()))
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])
    np.testing.assert_allclose(results[0][1], start - 0.5 * (a.numpy().T @ b.numpy()).T,
                               rtol=1e-4, atol=1e-3)


def test_a_step_accumulating_gradients_is_left_to_run():
    """A step without zero_grad reads each holder's `.grad`: its sharing check leaves those out
    (`plan.shared`), so no step function is written, and the plan's `run` gives eager's
    losses, parameters and `.grad`s."""
    rng = np.random.default_rng(11)
    x = graphc.tensor(rng.standard_normal((16, 32)).astype(np.float32))
    y = graphc.tensor(rng.integers(0, 10, 16))
    runs = []
    for compiled in (True, False):
        graphc.manual_seed(0)
        model = gnn.Linear(32, 10)
        opt = goptim.SGD(model.parameters(), lr=0.05)

        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        run = graphc.compile(step, backend="cpu") if compiled else step
        losses = [float(run(x, y)) for _ in range(4)]
        if compiled:
            plan = run._entries[-1].plan
            assert plan.holders and plan.stepping is None
        runs.append((losses, [a.numpy().copy() for p in model.parameters()
                              for a in (p.detach(), p.grad)]))
    (losses, state), (losses2, state2) = runs
    np.testing.assert_allclose(losses, losses2, rtol=1e-5)
    for a, b in zip(state, state2):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
