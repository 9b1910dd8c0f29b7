"""The cpu executable's steady call written out per executable
(graphc.backends.cpu.steady_call): it is made for ordinary executables, checks what
`run_general` checks, gives what it gives, refuses what it refuses (a written input made
read-only, another number of inputs), and holds no reference to its executable (no cycle:
an executable goes as soon as it is dropped, collector or not)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
from graphc.backends import compile as backend_compile  # noqa: E402
from graphc.errors import ArgumentError  # noqa: E402
from graphc.ir import parse  # noqa: E402

N = 64  # the N x 4N float32 output (64 KB) is kept for reuse; the N-float one is not

GRAPH = f'''graph @f(%x: f32[{N},{N}], %w: f32[{N},{4 * N}]) -> (f32[{N},{4 * N}], f32[{N}]) {{
  %0: f32[{N},{4 * N}] = matmul(%x, %w)
  %1: f32[{N}] = reduce_sum[axes=(1,), keepdim=false](%x)
  return (%0, %1)
}}'''


@pytest.fixture
def inputs(request):
    rng = np.random.default_rng(abs(hash(request.node.name)) % 2**32)
    return (rng.standard_normal((N, N)).astype(np.float32),
            rng.standard_normal((N, 4 * N)).astype(np.float32))


def test_the_steady_call_is_made_and_spells_out_each_check():
    ex = backend_compile(parse(GRAPH), "cpu")
    source = ex._steady.__doc__
    assert "a0 is last[0]" in source and "a1 is last[1]" in source
    assert "a0.shape ==" in source and "a1.dtype is" in source
    assert "getrefcount(o0) != 3" in source  # the kept (large) output
    assert "o1 = empty(" in source  # the small one, new every call
    assert "return [o0, o1]" in source


def test_it_gives_what_the_general_run_gives(inputs):
    ex = backend_compile(parse(GRAPH), "cpu")
    x, w = inputs
    want = [x @ w, x.sum(axis=1)]
    for _ in range(3):  # bound, then steady
        steady = ex.run(x, w)
        general = ex.run_general((x, w))
        for s, g, v in zip(steady, general, want):
            np.testing.assert_array_equal(s, g)
            np.testing.assert_allclose(s, v, rtol=1e-4, atol=1e-4)
        assert steady[0] is not general[0]  # each call's outputs its own
        del steady, general, s, g


def test_another_number_of_inputs_is_refused_as_before(inputs):
    ex = backend_compile(parse(GRAPH), "cpu")
    with pytest.raises(ArgumentError, match="takes 2 inputs, got 1"):
        ex.run(inputs[0])


def test_a_written_input_made_read_only_leaves_the_steady_call():
    def step(w, g):
        w.sub_(g * 0.5)  # computed straight into w's array
        return g.sum()

    f = graphc.compile(step, backend="cpu")
    with graphc.no_grad():
        f(graphc.ones(4, 64), graphc.ones(4, 64))
    ex = f.executable
    assert ex._written and "flags.writeable" in ex._steady.__doc__
    w, g = np.ones((4, 64), np.float32), np.ones((4, 64), np.float32)
    for _ in range(2):
        ex.run(w, g)
    calls = []
    real = ex._call
    ex._call = lambda *args: calls.append(1) or real(*args)
    total, updated = ex.run(w, g)
    assert calls == [] and updated is w  # steady: written in place
    np.testing.assert_array_equal(w, np.full((4, 64), -0.5, np.float32))
    w.flags.writeable = False
    total, updated = ex.run(w, g)
    assert calls == [1]  # the general path: a read-only written input is copied
    assert updated is not w and float(total) == 256.0
    np.testing.assert_array_equal(w, np.full((4, 64), -0.5, np.float32))
    np.testing.assert_array_equal(updated, np.full((4, 64), -1.0, np.float32))


def test_the_executable_goes_when_dropped_with_the_collector_off(inputs):
    ex = backend_compile(parse(GRAPH), "cpu")
    ex.run(*inputs)
    gone = weakref.ref(ex)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del ex
        assert gone() is None
    finally:
        if enabled:
            gc.enable()
