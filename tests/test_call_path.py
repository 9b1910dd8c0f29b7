"""The compiled call's fast path: guards compiled into one function, the CallPlan that binds
and wraps a cpu call, and the cpu executable's batched input checks. Each shortcut must give
what the general path gives, and refuse what it refuses."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
import graphc.nn as nn  # noqa: E402
import graphc.optim as optim  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.ir import parse  # noqa: E402
from graphc.jit.compiler import reachable_state, signature_of  # noqa: E402

SETTINGS = {"scale": 2.0, "shift": 1.0}
EXTRA = {"bias": 3.0}


def _uses_two_dicts(x):
    return x * SETTINGS["scale"] + EXTRA["bias"]


def _signature(fn, args):
    modules, captured = reachable_state(fn, args, {})
    return signature_of(fn, modules, args, {}, captured)


def test_the_guard_is_one_function_whose_source_can_be_read():
    f = graphc.compile(_uses_two_dicts, backend="cpu")
    x = graphc.ones(3)
    f(x)
    guard = f._entries[-1].guard
    assert guard.source.startswith("def checks(args, kwargs):")
    assert guard.holds((x,), {})
    assert not guard.holds((graphc.ones(4),), {})
    assert not guard.holds((x, x), {})
    assert not guard.holds((x,), {"k": 1})


def test_a_key_moved_between_two_dicts_fails_the_guard():
    """The dicts' keys and values, gathered into one tuple each, stay the same sequence when
    a key moves from the end of one dict to the front of the next: the separator after each
    dict's keys is what tells them apart."""
    saved = dict(SETTINGS), dict(EXTRA)
    try:
        f = graphc.compile(_uses_two_dicts, backend="cpu")
        x = graphc.ones(3)
        np.testing.assert_array_equal(f(x).numpy(), np.full(3, 5.0))
        guard = f._entries[-1].guard
        before = _signature(_uses_two_dicts, (x,))
        shift = SETTINGS.pop("shift")
        rest = dict(EXTRA)
        EXTRA.clear()
        EXTRA.update({"shift": shift, **rest})
        assert _signature(_uses_two_dicts, (x,)) != before
        assert not guard.holds((x,), {})
    finally:
        SETTINGS.clear()
        SETTINGS.update(saved[0])
        EXTRA.clear()
        EXTRA.update(saved[1])


def _step_setup(dropout: float = 0.0):
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(dropout), nn.ReLU(), nn.Linear(8, 3))
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y, scale=1.0):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean() * scale
        loss.backward()
        opt.step()
        return loss.detach(), model[0].weight.grad

    return model, step


@pytest.mark.parametrize("dropout", [0.0, 0.5], ids=["plain", "dropout"])
def test_the_plan_gives_what_the_general_path_gives(dropout):
    """Two copies of one training step (random draws included), one through the CallPlan and
    one with its entry's plan removed: the same losses, parameters, `.grad`s; the returned
    `.grad` is the one assigned; every call's results are fresh tensors."""
    rng = np.random.default_rng(0)
    batches = [(graphc.tensor(rng.standard_normal((5, 4)).astype(np.float32)),
                graphc.tensor(rng.standard_normal((5, 3)).astype(np.float32)))
               for _ in range(5)]
    runs = []
    for use_plan in (True, False):
        model, step = _step_setup(dropout)
        f = graphc.compile(step, backend="cpu")
        graphc.manual_seed(1)
        results = []
        for k, (x, y) in enumerate(batches):
            entry = f._entries[-1] if f._entries else None
            if entry is not None and not use_plan:
                entry.plan = None
            elif entry is not None and k >= 2:
                assert entry.plan is not None
            loss, grad = f(x, y, scale=0.5)
            assert grad is model[0].weight.grad
            results.append((loss.numpy().copy(), grad))
        assert len({id(g) for _, g in results}) == len(results)
        runs.append((results, [p.detach().numpy().copy() for p in model.parameters()]))
    (plan_results, plan_params), (general_results, general_params) = runs
    for (a, ga), (b, gb) in zip(plan_results, general_results):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ga.numpy(), gb.numpy())
    for a, b in zip(plan_params, general_params):
        np.testing.assert_array_equal(a, b)


def test_tensors_that_share_storage_unlike_the_trace_leave_the_plan():
    f = graphc.compile(lambda a, b: a * 2 + b, backend="cpu")
    x, y = graphc.ones(3), graphc.full((3,), 5.0)
    f(x, y)
    f(x, y)
    assert f._entries[-1].plan is not None
    np.testing.assert_array_equal(f(x, x).numpy(), np.full(3, 3.0))
    assert len(f._entries) == 2  # f(x, x) is another graph (one input)


def test_an_input_returned_as_itself_and_an_in_place_update():
    def bump(x, counter):
        counter.add_(1)
        return x, counter * 2

    f = graphc.compile(bump, backend="cpu")
    x, counter = graphc.ones(2), graphc.zeros(1)
    versions = []
    for k in range(1, 4):
        same, doubled = f(x, counter)
        assert same is x
        np.testing.assert_array_equal(counter.numpy(), [k])
        np.testing.assert_array_equal(doubled.numpy(), [2 * k])
        versions.append(counter._version)
    assert versions[2] - versions[1] == versions[1] - versions[0] == 1  # one bump a call
    assert f._entries[-1].plan is not None


def test_a_written_input_made_read_only_between_calls_is_not_written():
    g = parse('''graph @f(%x: f32[4], %b: f32[4]) -> (f32[4]) {
      %0: f32[4] = add(%x, %b)
      %1: f32[4] = mul(%b, %b)
      %x <- %0
      return (%1)
    }''')
    ex = CpuExecutable(g)
    assert ex._written == {0}  # the update is computed in its input's array
    x, b = np.zeros(4, np.float32), np.ones(4, np.float32)
    _, updated = ex.run(x, b)
    assert updated is x
    x.flags.writeable = False  # the same array, now read-only: the call writes a copy
    _, updated = ex.run(x, b)
    np.testing.assert_array_equal(x, np.ones(4))
    np.testing.assert_array_equal(updated, np.full(4, 2.0))
    assert updated is not x


def test_inputs_that_are_not_arrays_or_not_contiguous_are_converted():
    g = parse('''graph @f(%x: f32[4], %b: f32[4]) -> (f32[4]) {
      %0: f32[4] = add(%x, %b)
      return (%0)
    }''')
    ex = CpuExecutable(g)
    b = np.ones(4, np.float32)
    np.testing.assert_array_equal(ex.run(np.zeros(4, np.float32), b)[0], np.ones(4))
    strided = np.arange(8, dtype=np.float32)[::2]
    np.testing.assert_array_equal(ex.run(strided, b)[0], np.arange(0, 8, 2) + 1)
    with pytest.raises(graphc.GraphcError, match="expects f32"):
        ex.run([1.0, 2.0, 3.0, 4.0], b)  # a list becomes a float64 array: refused
    with pytest.raises(graphc.GraphcError, match="expects f32"):
        ex.run(np.zeros(4, np.float64), b)


def test_the_call_overhead_benchmark_runs_and_splits_the_call():
    """benchmarks/call_overhead.py (a smoke run of its smallest case; no timing is judged):
    the native figure is the time inside the generated code, and it is part of the call."""
    from benchmarks.call_overhead import measure

    figures = measure("tiny")
    assert 0 < figures.native < figures.call and figures.python > 0
    assert figures.guard > 0 and figures.guard_in_call > 0
