"""The stride-1 input gradient of conv2d by shifted runs (graphc.ops.conv._input_grad_by_shifts)
against the general im2col/col2im path, bit for bit: padding, groups (depthwise too),
non-square kernels, 1x1 kernels, unbatched inputs, float32 and float64; and against PyTorch.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.ops import conv
from graphc.testing.rounding import assert_rounding_within
from tests.conftest import torch_or_skip


def _by_col2im(gy, w, *, stride, padding, dilation, groups, input_hw):
    gb = conv._batched(gy)
    n, out_ch, ho, wo = gb.shape
    _, cg, kh, kw = w.shape
    wt = w.reshape(groups, out_ch // groups, cg * kh * kw).transpose(0, 2, 1)
    cols = np.matmul(wt, gb.reshape(n, groups, out_ch // groups, ho * wo))
    cols = cols.reshape(n, groups * cg, kh, kw, ho, wo)
    gx = conv._col2im(cols, (n, groups * cg) + tuple(input_hw), (kh, kw), (ho, wo), stride,
                      padding, dilation)
    return gx[0] if gy.ndim == 3 else gx


CASES = [  # grad_output shape, weight shape, padding, groups, input H, W
    ((8, 16, 10, 10), (16, 6, 5, 5), (0, 0), 1, (14, 14)),
    ((4, 6, 28, 28), (6, 1, 5, 5), (2, 2), 1, (28, 28)),
    ((3, 4, 5, 7), (4, 2, 3, 2), (1, 0), 2, (5, 8)),
    ((2, 8, 6, 6), (8, 1, 3, 3), (1, 1), 8, (6, 6)),
    ((3, 3, 4), (3, 2, 1, 1), (0, 0), 1, (3, 4)),
]


def _one_tap_weights(rng, wshape, groups, dtype):
    """Random weights with one nonzero per row of the transposed weight (each group's rows
    over its output channels, the im2col GEMM's k): each GEMM element is one product, so
    every BLAS gives it the same bits whatever its blocking, and what is compared is the
    taps' sums."""
    out_ch, cg, kh, kw = wshape
    out_g, rows = out_ch // groups, np.arange(cg * kh * kw)
    picked = np.zeros((groups, out_g, cg * kh * kw), dtype=bool)
    for group in range(groups):
        picked[group, (rows * 7 + group) % out_g, rows] = True
    return np.where(picked, rng.standard_normal(picked.shape), 0).reshape(wshape).astype(dtype)


def _dense_weights(rng, wshape, groups, dtype):
    return rng.standard_normal(wshape).astype(dtype)


def _inputs(case, dtype, weights):
    gshape, wshape, padding, groups, input_hw = case
    rng = np.random.default_rng(len(str(case)))
    gy = rng.standard_normal(gshape).astype(dtype)
    attrs = dict(stride=(1, 1), padding=padding, dilation=(1, 1), groups=groups,
                 input_hw=input_hw)
    return gy, weights(rng, wshape, groups, dtype), attrs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_shifted_runs_are_col2im_bit_for_bit(case, dtype):
    """The taps' sums in col2im's order, bit for bit, on weights whose GEMM is exact per
    element: the shifted runs' GEMM has wider rows (the padded width) than col2im's, and
    numpy's OpenBLAS 0.3.31's Haswell kernels (run on a Zen 5) round a dense product's
    element by where its column falls in their blocking, so dense weights are judged by
    `test_shifted_runs_on_dense_weights_are_within_rounding`."""
    gy, w, attrs = _inputs(case, dtype, _one_tap_weights)
    got = conv._conv2d_input_grad_kernel(gy, w, **attrs)
    want = _by_col2im(gy, w, **attrs)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.mark.parametrize("case", CASES, ids=str)
def test_shifted_runs_on_dense_weights_are_within_rounding(case):
    """Dense float32 weights: within 2x col2im's distance from a float64 col2im run."""
    gy, w, attrs = _inputs(case, np.float32, _dense_weights)
    got = conv._conv2d_input_grad_kernel(gy, w, **attrs)
    assert got.shape == _by_col2im(gy, w, **attrs).shape
    assert_rounding_within(got, _by_col2im(gy, w, **attrs),
                           _by_col2im(gy.astype(np.float64), w.astype(np.float64), **attrs))


def test_input_gradient_matches_pytorch():
    torch = torch_or_skip()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    gx = graphc.tensor(x, requires_grad=True)
    graphc.conv2d(gx, graphc.tensor(w), padding=(1, 0)).square().sum().backward()
    tx = torch.tensor(x, requires_grad=True)
    torch.nn.functional.conv2d(tx, torch.tensor(w), padding=(1, 0)).square().sum().backward()
    np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
