"""The cpu executable reuses a large output array only once nothing references it: results
stay correct, and an array the caller still holds (directly, through a view, inside a
graphc Tensor) is never written by a later call."""

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
from graphc.backends import compile as backend_compile  # noqa: E402
from graphc.ir import parse  # noqa: E402

N = 50_000  # 200 KB of float32: over RECYCLE_MIN_BYTES


def _negate():
    return backend_compile(parse(f'''graph @f(%x: f32[{N}]) -> (f32[{N}]) {{
      %0: f32[{N}] = neg(%x)
      return (%0)
    }}'''), "cpu")


def test_a_dropped_output_is_reused_and_holds_the_new_result():
    ex = _negate()
    a, = ex.run(np.full(N, 1, np.float32))
    b, = ex.run(np.full(N, 2, np.float32))
    first = id(a)
    del a
    c, = ex.run(np.full(N, 3, np.float32))
    assert id(c) == first  # the array the caller dropped
    np.testing.assert_array_equal(c, -3)
    np.testing.assert_array_equal(b, -2)  # the one still held is untouched


def test_held_outputs_are_never_written_again():
    ex = _negate()
    held = [ex.run(np.full(N, 1, np.float32))[0]]
    view = ex.run(np.full(N, 2, np.float32))[0][10:20]  # only a view is kept
    tensor = graphc.from_numpy(ex.run(np.full(N, 3, np.float32))[0])
    for k in range(4, 10):
        ex.run(np.full(N, k, np.float32))
    np.testing.assert_array_equal(held[0], -1)
    np.testing.assert_array_equal(view, -2)
    np.testing.assert_array_equal(tensor.numpy(), -3)


def test_small_outputs_are_always_new():
    ex = backend_compile(parse('''graph @f(%x: f32[8]) -> (f32[8]) {
      %0: f32[8] = neg(%x)
      return (%0)
    }'''), "cpu")
    for _ in range(3):
        out, = ex.run(np.ones(8, np.float32))
        del out
    assert ex._recent[0] == [(None, None), (None, None)]  # none kept for reuse
