"""GRAPHC_POISON (graphc.backends.cpu.poison): before every native run, each output array is
filled with its sentinel (NaN, the smallest integer, True) and the whole arena with 0xFF
bytes, so a kernel that skips an element cannot pass for right on a value an earlier call or a
freed array left behind. tests/conftest.py turns it on for the whole suite.

Checked here: what the driver finds at its entry (every output's every element poisoned,
recycled arrays included, and every byte of the arena, the backend's scratch too), that
poisoning changes no result (float, integer and bool outputs, an update written into its
input, a runtime-sized graph at two sizes), and that the switch is off where unset.
"""

from __future__ import annotations

import ctypes
import gc
import weakref

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends import compile as backend_compile  # noqa: E402
from graphc.backends.cpu.poison import ARENA_BYTE, poisoned, sentinel  # noqa: E402
from graphc.ir import parse  # noqa: E402
from graphc.ir.interpreter import Interpreter  # noqa: E402

N = 20_000  # 80 KB of float32: a kept (recycled) output (RECYCLE_MIN_BYTES)

MIXED = (f"graph @poison_mixed(%x: f32[{N}], %w: f32[64,64], %i: i64[8], %im: f32[2,8,8,8], "
         f"%k: f32[16,8,3,3]) -> (f32[{N}], f32[64,64], bool[{N}], i64[8], f32[2,16,8,8]) {{"
         + f'''
  %0: f32[{N}] = exp(%x)
  %1: f32[{N}] = mul(%0, %x)
  %2: f32[64,64] = matmul(%w, %w)
  %3: f32[64,64] = tanh(%2)
  %4: bool[{N}] = gt(%1, %x)
  %5: i64[8] = add(%i, %i)
  %6: f32[2,16,8,8] = conv2d[stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1](%im, %k)
  return (%1, %3, %4, %5, %6)
}}''')


def _inputs(rng):
    return (rng.standard_normal(N).astype(np.float32),
            rng.standard_normal((64, 64)).astype(np.float32),
            rng.integers(-5, 5, 8),
            rng.standard_normal((2, 8, 8, 8)).astype(np.float32),
            rng.standard_normal((16, 8, 3, 3)).astype(np.float32))


def _assert_matches(got, expected):
    """Floats within rounding (exp, tanh and the conv's sums round otherwise than numpy),
    integers and bools exactly; a poisoned element (NaN, -2**63, True) fails either."""
    for g, e in zip(got, expected, strict=True):
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(g, e)


def _memory(address: int, nbytes: int, dtype) -> np.ndarray:
    return np.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype).copy()


def test_the_driver_finds_every_output_and_arena_byte_poisoned(monkeypatch, rng):
    monkeypatch.delenv("GRAPHC_POISON", raising=False)
    ex = backend_compile(parse(MIXED), "cpu")
    real = ex._run
    seen = []

    def inspecting(in_ptrs, out_ptrs, *tail):
        out_types, _, arena_bytes = ex.written_layout(tail)
        seen.append(([_memory(out_ptrs[k], int(np.prod(shape)) * dtype.itemsize, dtype)
                      for k, (shape, dtype, _) in enumerate(out_types)],
                     _memory(tail[0].value, arena_bytes, np.uint8)))
        return real(in_ptrs, out_ptrs, *tail)

    ex._run = poisoned(inspecting, ex)
    inputs = _inputs(rng)
    expected = Interpreter(parse(MIXED)).run(*inputs)
    for _ in range(3):  # the first call's outputs come back recycled, holding right values
        got = ex.run(*inputs)
        _assert_matches(got, expected)
        del got
    # the conv's workspace is backend scratch, past the plan's arena
    assert len(seen) == 3 and ex.lowered.arena_bytes > ex.memory_plan.arena_bytes > 0
    for outputs, arena in seen:
        assert np.isnan(outputs[0]).all() and np.isnan(outputs[1]).all()
        assert outputs[2].view(np.uint8).all()  # True
        assert (outputs[3] == np.iinfo(np.int64).min).all() and np.isnan(outputs[4]).all()
        assert (arena == ARENA_BYTE).all()


def test_poisoning_changes_no_result(monkeypatch, rng):
    monkeypatch.setenv("GRAPHC_POISON", "1")
    ex = backend_compile(parse(MIXED), "cpu")
    assert not isinstance(ex._run, ctypes._CFuncPtr)  # wrapped
    for _ in range(3):
        inputs = _inputs(rng)
        _assert_matches(ex.run(*inputs), Interpreter(parse(MIXED)).run(*inputs))


def test_an_update_into_its_input_is_not_poisoned(monkeypatch):
    monkeypatch.setenv("GRAPHC_POISON", "1")
    g = parse('''graph @poison_update(%p: f32[300], %g: f32[300]) -> (f32[300]) {
      %0: f32[300] = exp(%g)
      %1: f32[300] = sub(%p, %g)
      %p <- %1
      return (%0)
    }''')
    ex = backend_compile(g, "cpu")
    assert ex.updates_in_place == (True,)
    p = np.ones(300, np.float32)
    for k in range(1, 4):
        out, new = ex.run(p, np.full(300, 2, np.float32))
        assert new is p
        np.testing.assert_array_equal(p, 1 - 2 * k)
        np.testing.assert_allclose(out, np.exp(np.float32(2)), rtol=1e-6)


def test_a_runtime_sized_graph_is_poisoned_at_each_size(monkeypatch):
    monkeypatch.setenv("GRAPHC_POISON", "1")
    g = parse('''graph @poison_sized(%x: f32[s0,32], %w: f32[32,16]) -> (f32[s0,16]) {
      %0: f32[s0,16] = matmul(%x, %w)
      %1: f32[s0,16] = relu(%0)
      return (%1)
    }''')
    ex = backend_compile(g, "cpu")
    w = np.linspace(-1, 1, 512, dtype=np.float32).reshape(32, 16)
    for rows in (5, 40, 5, 40):
        x = np.linspace(-2, 2, rows * 32, dtype=np.float32).reshape(rows, 32)
        out, = ex.run(x, w)
        np.testing.assert_allclose(out, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)


def test_sentinels():
    assert np.isnan(sentinel(np.dtype(np.float64)))
    assert sentinel(np.dtype(np.int32)) == -(2 ** 31)
    assert sentinel(np.dtype(np.bool_)) is True


def test_off_unless_set(monkeypatch):
    monkeypatch.setenv("GRAPHC_POISON", "0")
    ex = backend_compile(parse(MIXED), "cpu")
    assert isinstance(ex._run, ctypes._CFuncPtr)


def test_a_poisoned_executable_goes_when_dropped_with_the_collector_off(monkeypatch, rng):
    """The wrapper is stored on the executable and holds it weakly: no reference cycle."""
    monkeypatch.setenv("GRAPHC_POISON", "1")
    ex = backend_compile(parse(MIXED), "cpu")
    ex.run(*_inputs(rng))
    gone = weakref.ref(ex)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del ex
        assert gone() is None
    finally:
        if enabled:
            gc.enable()
