"""graphc.compile's first try (`Compiled._fast_path`): the newest entry's guard checks and plan,
run in `Compiled.__call__`'s own frame. It must pick exactly what the guards' loop
(`_guarded`) picks: made only for an entry with a plan, no ShapeGuard and a guard that implies
its captured tensors' types; dropped when an entry is added or removed or gets a new guard;
never taken inside a trace or under GRAPHC_CHECK_NANS; a guard that fails or raises hands the
call to the loop, which does not try that entry again."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
from graphc.jit import guards  # noqa: E402
from graphc.jit.nan_check import NonFiniteError  # noqa: E402


def _times_two(x):
    return x * 2


def _warm(f, *args):
    for _ in range(3):
        f(*args)


def test_the_first_try_is_made_for_the_newest_planned_entry_and_dropped_on_a_new_one():
    f = graphc.compile(_times_two, backend="cpu", dynamic=False)
    x3, x4 = graphc.ones(3), graphc.ones(4)
    _warm(f, x3)
    checks, run, entry = f._fast
    assert entry is f._entries[-1] and checks is entry.guard.checks
    assert run is entry.plan.reading  # a reading call: its reading path, written out
    f(x4)  # another shape: a new (static) entry, the first try dropped
    assert len(f._entries) == 2 and f._fast is None
    f(x4)
    assert f._fast[2] is f._entries[-1]
    np.testing.assert_array_equal(f(x4).numpy(), np.full(4, 2, np.float32))


def test_an_older_entry_is_found_by_the_loop_and_the_failed_guard_is_not_tried_twice(
        monkeypatch):
    f = graphc.compile(_times_two, backend="cpu", dynamic=False)
    x3, x4 = graphc.ones(3), graphc.full((4,), 3.0)
    _warm(f, x3)
    f(x4)
    f(x4)  # the newest entry (shape 4) has the first try
    newest = f._entries[-1]
    tried = []
    real = guards.Guard.holds

    def counted(guard, args, kwargs):
        tried.append(guard)
        return real(guard, args, kwargs)

    monkeypatch.setattr(guards.Guard, "holds", counted)
    np.testing.assert_array_equal(f(x3).numpy(), np.full(3, 2, np.float32))
    assert newest.guard not in tried and f._entries[0].guard in tried
    assert len(f._entries) == 2  # no retrace
    tried.clear()
    np.testing.assert_array_equal(f(x4).numpy(), np.full(4, 6, np.float32))
    assert tried == []  # the first try held: no loop


def test_a_guard_that_raises_fails_the_first_try_and_the_signature_decides():
    config = type("Config", (), {})()
    config.scale = 3.0

    def scaled(x):
        return x * getattr(config, "scale", 5.0)

    f = graphc.compile(scaled, backend="cpu")
    x = graphc.ones(2)
    _warm(f, x)
    assert f._fast
    del config.scale  # the guard's getattr raises AttributeError
    np.testing.assert_array_equal(f(x).numpy(), np.full(2, 5, np.float32))
    np.testing.assert_array_equal(f(x).numpy(), np.full(2, 5, np.float32))


def test_inside_a_trace_a_compiled_function_with_a_first_try_runs_inline():
    f = graphc.compile(_times_two, backend="cpu")
    x = graphc.ones(3)
    _warm(f, x)
    assert f._fast
    outer = graphc.compile(lambda y: f(y) + 1, backend="cpu")
    np.testing.assert_array_equal(outer(x).numpy(), np.full(3, 3, np.float32))
    ops = [n.op for n in outer.graph.nodes if n.op != "full"]  # (the constants)
    assert ops == ["mul", "add"]  # f's op recorded inline


def _log_shifted(x):
    return (x - 1.0).log()


def test_check_nans_set_after_the_first_try_was_made_checks_the_next_call(monkeypatch):
    monkeypatch.delenv("GRAPHC_CHECK_NANS", raising=False)
    f = graphc.compile(_log_shifted, backend="cpu")
    good, bad = graphc.tensor([2.0, 3.0]), graphc.tensor([2.0, 0.5])
    _warm(f, good)
    assert f._fast
    assert np.isnan(f(bad).numpy()).any()  # off: the first try runs, no check
    monkeypatch.setenv("GRAPHC_CHECK_NANS", "1")
    with pytest.raises(NonFiniteError):
        f(bad)
    monkeypatch.setenv("GRAPHC_CHECK_NANS", "0")
    assert np.isnan(f(bad).numpy()).any()
    assert len(f._entries) == 1


def test_an_entry_with_a_shape_guard_gets_a_first_try_that_checks_its_sizes():
    f = graphc.compile(_times_two, backend="cpu", dynamic=True)
    x = graphc.ones(3)
    _warm(f, x)
    assert f._entries[-1].shapes is not None and f._fast
    assert ">= 2" in f._fast[0].__doc__  # graphc.jit.shape_checks: the symbol's size
    np.testing.assert_array_equal(f(graphc.ones(5)).numpy(), np.full(5, 2, np.float32))
    assert len(f._entries) == 1
    # size 1 is not the symbol's (sizes 0 and 1 are specialised): a new entry, not the first try
    np.testing.assert_array_equal(f(graphc.ones(1)).numpy(), np.full(1, 2, np.float32))
    assert len(f._entries) == 2


def test_the_first_try_is_not_made_while_another_thread_holds_the_trace_lock():
    """Every change of the entries and guards is made under `_slow_path`; the first try is
    made under it too, else a trace in another thread between `_fast_path`'s read and its
    store would leave an older entry's guard and plan as the first try."""
    import threading

    f = graphc.compile(_times_two, backend="cpu", dynamic=False)
    x = graphc.ones(3)
    _warm(f, x)
    f._fast = None  # as a new entry or guard leaves it
    held, release = threading.Event(), threading.Event()

    def tracing():  # another thread in the middle of a trace
        with f._slow_path:
            held.set()
            release.wait(30)

    other = threading.Thread(target=tracing)
    other.start()
    try:
        assert held.wait(30)
        np.testing.assert_array_equal(f(x).numpy(), np.full(3, 2, np.float32))
        assert f._fast is None  # not made while the entries may change
    finally:
        release.set()
        other.join()
    f(x)
    assert f._fast and f._fast[2] is f._entries[-1]
