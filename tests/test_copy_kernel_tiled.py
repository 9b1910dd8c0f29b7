"""The `copy` op's kernel copies a large transposed matrix in tiles (graphc.ops.movement):
the result is the C-order copy numpy makes, for every layout around the threshold, and what
is not a transposed matrix takes numpy's copy."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.ops import movement


@pytest.mark.parametrize("shape", [(784, 256), (256, 256), (130, 129), (200, 70), (64, 300)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.bool_])
def test_tiled_copy_is_numpys_copy(shape, dtype):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(shape[::-1]) * 5).astype(dtype)
    for view in (a.T, a[::-1].T, a[:, ::2].T):
        got = movement._copy_kernel(view)
        assert got.flags.c_contiguous and got.dtype == view.dtype and got.shape == view.shape
        assert got.tobytes() == np.array(view, order="C").tobytes()
        assert not np.shares_memory(got, a)


def test_the_tiled_path_is_taken_only_for_large_transposed_matrices(monkeypatch):
    taken = []
    tiled = movement._tiled_copy
    monkeypatch.setattr(movement, "_tiled_copy", lambda x: taken.append(x.shape) or tiled(x))
    big = np.ones((300, 200), np.float32)
    movement._copy_kernel(big.T)
    movement._copy_kernel(big)  # C order already
    movement._copy_kernel(np.ones((20, 30), np.float32).T)  # small
    movement._copy_kernel(np.ones((3, 300, 200), np.float32).swapaxes(1, 2))  # 3-D
    assert taken == [(200, 300)]
