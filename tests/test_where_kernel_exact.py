"""The `where` op's numpy kernel (a branch-free blend on bit patterns for 4- and 8-byte
dtypes) against np.where, bit for bit: NaNs, signed zeros, infinities, integers, broadcasting
of every operand, 0-d operands, non-contiguous views and the dtypes it leaves to np.where.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphc.ops.elementwise import _where_kernel

SHAPES = [((5, 4), (5, 4), (5, 4)), ((5, 1), (4,), ()), ((3, 5, 4), (5, 4), (1, 4)),
          ((), (2,), (2,)), ((4,), (), ())]


def _values(dtype, shape, rng):
    if dtype is np.bool_:
        return rng.random(shape) > 0.5
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    if np.issubdtype(dtype, np.floating) and x.ndim:
        x.flat[0] = np.nan
        x.flat[-1] = -0.0
        if x.size > 2:
            x.flat[1] = -np.inf
    return x


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32, np.bool_])
def test_where_kernel_is_np_where(dtype, shapes):
    rng = np.random.default_rng(len(str(shapes)))
    cond = rng.random(shapes[0]) > 0.5
    a, b = _values(dtype, shapes[1], rng), _values(dtype, shapes[2], rng)
    got, want = _where_kernel(cond, a, b), np.where(cond, a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("zero", [0.0, -0.0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_a_zero_other_branch_is_np_where(dtype, zero):
    """where(mask, g, zeros) (a ReLU's backward) takes a one-pass path when every bit of b is
    0; a -0.0 among the zeros must not."""
    rng = np.random.default_rng(1)
    cond = rng.random((4, 6)) > 0.5
    a = _values(dtype, (4, 6), rng)
    for b in (np.zeros((4, 6), dtype), np.zeros((), dtype), np.zeros((1, 6), dtype)):
        if np.issubdtype(dtype, np.floating):
            b = b + np.asarray(zero, dtype)  # -0.0 + -0.0 stays -0.0
        got, want = _where_kernel(cond, a, b), np.where(cond, a, b)
        assert got.shape == want.shape and got.tobytes() == want.tobytes()


def test_views_and_mixed_dtypes():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 8)).astype(np.float32)[::2, 1::3]  # non-contiguous
    b = rng.standard_normal((8, 6)).astype(np.float32).T[::2, 1::3]
    cond = (rng.random((6, 8)) > 0.5)[::2, 1::3]
    assert _where_kernel(cond, a, b).tobytes() == np.where(cond, a, b).tobytes()
    mixed = _where_kernel(cond, a, b.astype(np.float64))
    assert mixed.dtype == np.float64
    assert mixed.tobytes() == np.where(cond, a, b.astype(np.float64)).tobytes()
