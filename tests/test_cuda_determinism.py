"""Deterministic scatters of the cuda backend (docs/backends.md, "Determinism"), emulated.

On a GPU, float atomicAdd scatters and plain stores to repeated indices depend on which
thread gets there first. The cuda backend has none: every output element gathers its
contributions in index order (scatter_add, index_add, index_put, embedding_backward) or over
its pooling windows in output order (max_pool2d_grad). So two runs give equal bits, and the
results equal the interpreter's (numpy's `add.at` / bincount order) bit for bit. The emulator
runs blocks one after another, so these tests also read the generated source: no atomics.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from graphc.backends import compile as compile_graph
from graphc.ir import parse

pytestmark = pytest.mark.usefixtures("cuda_runtime_built", "cuda_backend")


def _same_bits(text: str, *arrays):
    ex = compile_graph(parse(text), "cuda")
    # no atomic accumulation (its order varies run to run); the error word's atomicExch of
    # a constant is order-free
    assert re.findall(r"atomic(?!Exch\(\(unsigned long long \*\))", ex.lowered.source) == []
    first, second = ex.run(*arrays), ex.run(*arrays)
    want = compile_graph(parse(text), "interp").run(*arrays)
    for a, b, w in zip(first, second, want):
        assert a.tobytes() == b.tobytes(), "two runs differ"
        assert a.dtype == w.dtype and a.tobytes() == w.tobytes(), np.max(np.abs(a - w))
    return first


def test_embedding_backward_with_repeated_indices(rng):
    g = rng.standard_normal((6, 50, 8)).astype(np.float32)
    idx = rng.integers(0, 5, (6, 50))  # 300 lookups of 5 rows: ~60 per row
    idx[0, :3] = 2  # the padding row gets nothing
    _same_bits('''graph @f(%g: f32[6,50,8], %i: i64[6,50]) -> (f32[7,8]) {
  %0: f32[7,8] = embedding_backward[num_weights=7, padding_idx=2](%g, %i)
  return (%0)
}''', g, idx)


def test_index_add_and_index_put_with_repeated_indices(rng):
    x = rng.standard_normal((5, 4, 3)).astype(np.float32)
    src = rng.standard_normal((5, 30, 3)).astype(np.float32)
    idx = rng.integers(-4, 4, 30)  # negative indices wrap
    out = _same_bits('''graph @f(%x: f32[5,4,3], %i: i64[30], %s: f32[5,30,3]) -> (f32[5,4,3], f32[5,4,3]) {
  %0: f32[5,4,3] = index_add[axis=1](%x, %i, %s)
  %1: f32[5,4,3] = index_put[axis=1](%x, %i, %s)
  return (%0, %1)
}''', x, idx, src)  # noqa: E501
    last = {int(v) % 4: j for j, v in enumerate(idx)}  # index_put: the last write wins
    for row, j in last.items():
        np.testing.assert_array_equal(out[1][:, row], src[:, j])


def test_scatter_add_with_repeated_indices(rng):
    x = rng.standard_normal((3, 6)).astype(np.float32)
    src = rng.standard_normal((3, 40)).astype(np.float32)
    idx = rng.integers(0, 6, (3, 40))
    _same_bits('''graph @f(%x: f32[3,6], %i: i64[3,40], %s: f32[3,40]) -> (f32[3,6]) {
  %0: f32[3,6] = scatter_add[axis=1](%x, %i, %s)
  return (%0)
}''', x, idx, src)


def test_scatter_bad_index_is_reported(rng):
    from graphc.errors import IndexOutOfRangeError

    ex = compile_graph(parse('''graph @f(%x: f32[3,6], %i: i64[3,2], %s: f32[3,2]) -> (f32[3,6]) {
  %0: f32[3,6] = scatter_add[axis=1](%x, %i, %s)
  return (%0)
}'''), "cuda")
    x, s = np.zeros((3, 6), np.float32), np.ones((3, 2), np.float32)
    with pytest.raises(IndexOutOfRangeError, match="scatter_add: an index is out of bounds"):
        ex.run(x, np.array([[0, 1], [6, 0], [1, 1]]), s)


def test_max_pool_backward_with_overlapping_windows(rng):
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    x[0, 0] = 1.0  # ties everywhere in one plane: many windows pick the same element
    g = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    _same_bits('''graph @f(%x: f32[2,3,9,9], %g: f32[2,3,7,7]) -> (f32[2,3,9,9]) {
  %0: f32[2,3,7,7], %1: i64[2,3,7,7] = max_pool2d[kernel_size=(3, 3), stride=(1, 1), padding=(0, 0), dilation=(1, 1), ceil_mode=false](%x)
  %2: f32[2,3,9,9] = max_pool2d_grad[input_hw=(9, 9)](%g, %1)
  return (%2)
}''', x, g)  # noqa: E501


def test_max_pool_backward_with_indices_from_outside(rng):
    """Indices that are a graph input (windows unknown): each element scans its plane."""
    g = rng.standard_normal((2, 4, 4)).astype(np.float32)
    idx = rng.integers(0, 25, (2, 4, 4))
    _same_bits('''graph @f(%g: f32[2,4,4], %i: i64[2,4,4]) -> (f32[2,5,5]) {
  %0: f32[2,5,5] = max_pool2d_grad[input_hw=(5, 5)](%g, %i)
  return (%0)
}''', g, idx)
