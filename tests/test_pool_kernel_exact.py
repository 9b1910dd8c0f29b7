"""max_pool2d's numpy kernel against a window-by-window reference of PyTorch's CPU rule (taps
in row-major order, a strict `>` keeps the first maximum, a NaN always wins), bit for bit:
ties, signed zeros (the value is the winner's, -0.0 included), all -inf windows, NaNs,
integers, padding, dilation and ceil mode. The kernel's running updates are branch-free
integer blends on the values' bit patterns, which must change no bit.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from graphc.ops import pool


def _reference(x, kernel_size, stride, padding, dilation, ceil_mode):
    h, w = x.shape[-2:]
    out_hw = tuple(pool.pool_output_size(n, k, s, p, d, ceil_mode) for n, k, s, p, d in
                   zip((h, w), kernel_size, stride, padding, dilation))
    planes = x.reshape((-1, h, w))
    best = np.empty((planes.shape[0],) + out_hw, x.dtype)
    index = np.empty(best.shape, np.int64)
    for b, oi, oj in itertools.product(range(planes.shape[0]), *map(range, out_hw)):
        value, where_ = None, None
        for ki, kj in itertools.product(*map(range, kernel_size)):
            r = oi * stride[0] - padding[0] + ki * dilation[0]
            c = oj * stride[1] - padding[1] + kj * dilation[1]
            if not (0 <= r < h and 0 <= c < w):
                continue
            v = planes[b, r, c]
            if value is None or v > value or np.isnan(v):
                value, where_ = v, r * w + c
        best[b, oi, oj], index[b, oi, oj] = value, where_
    shape = x.shape[:-2] + out_hw
    return best.reshape(shape), index.reshape(shape)


CONFIGS = [  # kernel, stride, padding, dilation, ceil
    ((2, 2), (2, 2), (0, 0), (1, 1), False),
    ((3, 3), (2, 2), (1, 1), (1, 1), True),
    ((3, 2), (1, 2), (1, 0), (2, 1), False),
    ((2, 2), (2, 2), (1, 1), (1, 1), True),
]


def _input(dtype, seed, nan: bool):
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, (2, 3, 7, 9)).astype(dtype)  # many ties
    if np.issubdtype(dtype, np.floating):
        x[..., :2, :2] = 0.0
        x[0, 0, 2:4, 2:4] = -0.0
        x[0, 1, 1, 1:3] = -0.0
        x[1, 0, :, :] = -np.inf
        if nan:
            x[0, 2, 3, 3] = x[1, 1, 0, 0] = x[1, 1, 0, 1] = np.nan
    return x


@pytest.mark.parametrize("nan", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_kernel_is_the_window_reference_bit_for_bit(config, dtype, nan):
    if nan and dtype is np.int64:
        pytest.skip("integers have no NaN")
    kernel_size, stride, padding, dilation, ceil_mode = config
    x = _input(dtype, 0, nan)
    best, index = pool._max_pool2d_kernel(x, kernel_size=kernel_size, stride=stride,
                                          padding=padding, dilation=dilation,
                                          ceil_mode=ceil_mode)
    ref_best, ref_index = _reference(x, *config)
    assert best.dtype == ref_best.dtype and best.shape == ref_best.shape
    assert best.tobytes() == ref_best.tobytes()  # signed zeros and NaN bits included
    np.testing.assert_array_equal(index, ref_index)
