"""graphc.compile pauses Python's cyclic garbage collector while a call traces and compiles
(graphc.jit.pipeline.collector_paused), and always gives it back: after a compile, after a
failed trace, and as the user left it when they had turned it off themselves."""

import gc

import pytest

import graphc


def test_the_collector_is_off_while_tracing_and_on_after():
    seen = []

    def f(x):
        seen.append(gc.isenabled())
        return x * 2

    g = graphc.compile(f, backend="interp")
    assert gc.isenabled()
    for _ in range(3):
        g(graphc.ones(3))
        assert gc.isenabled()
    assert seen and not any(seen)  # every run of f was a trace, with the collector off


def test_a_failed_trace_gives_the_collector_back():
    def f(x):
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        graphc.compile(f, backend="interp")(graphc.ones(2))
    assert gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off():
    gc.disable()
    try:
        graphc.compile(lambda x: x + 1, backend="interp")(graphc.ones(2))
        assert not gc.isenabled()
    finally:
        gc.enable()
