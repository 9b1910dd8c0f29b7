"""A compiled call that only reads (no update written back, no random generator advanced, no
`.grad` assigned) runs through CallPlan's reading path: it holds no Ctrl-C (nothing can be
left half done) and gives what the general path gives; a call that writes still holds it. Its
reading path written out per plan (`CallPlan.reading`) gives what `run_reading` gives and
refuses what it refuses."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
import graphc.jit.run as jit_run  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
from graphc.jit.call_plan import MISFIT  # noqa: E402


def _count_handlers(monkeypatch) -> list[int]:
    """Count the SIGINT handler changes HeldInterrupts makes (two per held call)."""
    changes = [0]
    real = jit_run._set_handler

    def counted(*args):
        changes[0] += 1
        return real(*args)

    monkeypatch.setattr(jit_run, "_set_handler", counted)
    return changes


def _warm(f, *args, **kwargs):
    for _ in range(3):  # the third call runs the plan
        f(*args, **kwargs)
    plan = f._entries[-1].plan
    assert plan is not None
    return plan


def test_a_call_that_only_reads_holds_no_interrupt_and_matches_the_general_path(monkeypatch):
    rng = np.random.default_rng(5)
    a, b = (graphc.tensor(rng.standard_normal((8, 8)).astype(np.float32)) for _ in range(2))

    def f(a, b):
        return (a @ b).relu(), a  # a new output and an input returned as itself

    compiled = graphc.compile(f, backend="cpu")
    with graphc.no_grad():
        plan = _warm(compiled, a, b)
        assert plan.reads_only
        changes = _count_handlers(monkeypatch)
        out, same = compiled(a, b)
        assert changes == [0]
        assert same is a
        np.testing.assert_allclose(out.numpy(), np.maximum(a.numpy() @ b.numpy(), 0),
                                   rtol=1e-5, atol=1e-6)
        compiled._entries[-1].plan = None  # the general path gives the same
        compiled._fast = None  # (the first try keeps the plan's run: made again, without)
        general, _ = compiled(a, b)
        np.testing.assert_array_equal(general.numpy(), out.numpy())


def test_calls_that_write_back_or_draw_random_numbers_still_hold_interrupts(monkeypatch):
    counter, x = graphc.zeros(1), graphc.ones(4)

    def bump(x, counter):
        counter.add_(1)
        return x * 2

    def noisy(x):
        return F.dropout(x, 0.5, training=True)

    bumping = graphc.compile(bump, backend="cpu")
    assert not _warm(bumping, x, counter).reads_only
    dropping = graphc.compile(noisy, backend="cpu")
    assert not _warm(dropping, x).reads_only
    changes = _count_handlers(monkeypatch)
    bumping(x, counter)
    np.testing.assert_array_equal(counter.numpy(), [4])
    dropping(x)
    assert changes == [4]  # each call held Ctrl-C: two handler changes apiece


def test_the_written_out_reading_path_gives_what_run_reading_gives():
    rng = np.random.default_rng(7)
    a = graphc.tensor(rng.standard_normal((8, 8)).astype(np.float32))
    bias = graphc.tensor(rng.standard_normal(8).astype(np.float32))  # captured

    def f(a):
        return (a @ a).relu() + bias, a

    compiled = graphc.compile(f, backend="cpu")
    with graphc.no_grad():
        plan = _warm(compiled, a)
        source = plan.reading.__doc__
        assert "t0 = args[0]" in source and "CAPTURED0" in source
        assert compiled._fast[1] is plan.reading  # the first try runs it
        out, same = plan.reading((a,), {})
        want, want_same = plan.run_reading((a,), {})
    assert same is a and want_same is a
    np.testing.assert_array_equal(out.numpy(), want.numpy())
    np.testing.assert_allclose(out.numpy(), np.maximum(a.numpy() @ a.numpy(), 0) + bias.numpy(),
                               rtol=1e-5, atol=1e-5)


def test_the_written_out_reading_path_refuses_shared_storage_and_keyword_inputs():
    x, y = graphc.ones(4), graphc.full((4,), 3.0)
    f = graphc.compile(lambda a, b: a * b, backend="cpu")
    with graphc.no_grad():
        plan = _warm(f, x, y)
        assert plan.reading((x, x), {}) is MISFIT  # the trace had two distinct tensors
        np.testing.assert_array_equal(f(x, x).numpy(), np.ones(4, np.float32))
        g = graphc.compile(lambda a, *, scale: a * scale, backend="cpu")
        keyword = _warm(g, x, scale=y)
        assert keyword.reads_only and keyword.reading is None  # run_reading's pool
        np.testing.assert_array_equal(g(x, scale=y).numpy(), np.full(4, 3.0, np.float32))
