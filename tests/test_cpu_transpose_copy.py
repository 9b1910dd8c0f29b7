"""Transposing copies on the cpu backend: walked in square tiles where the tile divides both
sides (graphc.backends.cpu.values.transpose_tiles), row by row otherwise; every element lands
where numpy puts it, for every dtype."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
from graphc.backends.cpu.values import TRANSPOSE_TILE, transpose_tiles  # noqa: E402

SHAPES = [(512, 128), (128, 512), (32, 48), (48, 32), (16, 64), (40, 33), (7, 5), (64, 64)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.bool_])
def test_transposed_copy_matches_numpy(shape, dtype):
    x = np.arange(np.prod(shape)).reshape(shape)
    x = (x % 3 == 0) if dtype is np.bool_ else x.astype(dtype)
    compiled = graphc.compile(lambda t: t.t(), backend="cpu")  # a view copied out
    np.testing.assert_array_equal(compiled(graphc.tensor(x)).numpy(), x.T)
    tiled = all(n % TRANSPOSE_TILE == 0 and n >= 2 * TRANSPOSE_TILE for n in shape)
    assert ('"d3.head"' in compiled.executable.lowered.ir_text) is tiled


def test_batched_permute_copy_matches_numpy():
    x = np.arange(4 * 32 * 48, dtype=np.float32).reshape(4, 32, 48)
    compiled = graphc.compile(lambda t: t.permute(2, 0, 1), backend="cpu")
    np.testing.assert_array_equal(compiled(graphc.tensor(x)).numpy(), x.transpose(2, 0, 1))


def test_tiles_only_a_transposing_walk():
    t = TRANSPOSE_TILE
    sizes, strides = transpose_tiles([2 * t, 3 * t], [(1, 2 * t), (3 * t, 1)])
    assert sizes == [2, 3, t, t]
    assert strides == [(t, 2 * t * t, 1, 2 * t), (3 * t * t, t, 3 * t, 1)]
    assert transpose_tiles([2 * t, 3 * t], [(3 * t, 1), (3 * t, 1)]) == \
        ([2 * t, 3 * t], [(3 * t, 1), (3 * t, 1)])  # a plain copy stays one row loop
    assert transpose_tiles([2 * t + 1, 3 * t], [(1, 2 * t + 1), (3 * t, 1)])[0] == \
        [2 * t + 1, 3 * t]  # the tile does not divide a side
