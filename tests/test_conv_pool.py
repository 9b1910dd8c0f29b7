"""conv2d and 2-D pooling against PyTorch: values, every gradient, and second derivatives.

The OpInfo entries (tests/opinfos/conv.py, pool.py) check each op on a few samples; this file
sweeps stride/padding/dilation/groups and the pooling modes (ceil_mode, count_include_pad,
divisor_override), checks double backward against torch and with gradgradcheck, and covers
the corner cases PyTorch defines (NaN and -inf windows, unbatched inputs, saved tensors).
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

import graphc
from graphc.autograd import grad, gradgradcheck
from tests.conftest import torch_or_skip

CONV_CASES = [  # (N, C_in, H, W, C_out, kH, kW, stride, padding, dilation, groups)
    (2, 3, 7, 6, 4, 3, 3, 1, 0, 1, 1),
    (2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1),
    (1, 3, 8, 7, 2, 3, 2, 2, 1, 1, 1),
    (1, 2, 9, 9, 3, 3, 3, (2, 3), (1, 0), 1, 1),
    (1, 2, 9, 8, 2, 3, 3, 1, 2, 2, 1),
    (2, 4, 7, 7, 6, 3, 3, 2, (0, 1), (2, 1), 2),
    (1, 6, 6, 6, 6, 3, 3, 1, 1, 1, 6),  # depthwise
    (1, 4, 6, 5, 8, 1, 1, 1, 0, 1, 4),  # grouped pointwise
    (2, 2, 5, 5, 3, 5, 5, 1, 2, 1, 1),  # kernel as large as the input
    (1, 3, 10, 10, 2, 2, 2, 3, 0, 3, 1),  # stride leaves the last rows untouched
]


def _ids(cases):
    return ["-".join(str(v).replace(" ", "") for v in c) for c in cases]


def _pair_tensors(torch, *arrays, requires_grad=True):
    gs = [graphc.tensor(a, requires_grad=requires_grad) for a in arrays]
    ts = [torch.tensor(a, requires_grad=requires_grad) for a in arrays]
    return gs, ts


def _backward_both(torch, g_out, t_out, rng):
    seed = rng.standard_normal(tuple(t_out.shape)).astype(t_out.detach().numpy().dtype)
    g_out.backward(graphc.tensor(seed))
    t_out.backward(torch.tensor(seed))


def _close(g, t, atol=1e-4, rtol=1e-4, msg=""):
    np.testing.assert_allclose(g.detach().numpy(), t.detach().numpy(), atol=atol, rtol=rtol,
                               err_msg=msg)


# ---- conv2d ----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CONV_CASES, ids=_ids(CONV_CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv2d_matches_torch(case, dtype, rng):
    torch = torch_or_skip()
    n, c, h, w, o, kh, kw, stride, padding, dilation, groups = case
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((o, c // groups, kh, kw)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    (gx, gw, gb), (tx, tw, tb) = _pair_tensors(torch, x, wt, b)
    kwargs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    g_out = graphc.conv2d(gx, gw, gb, **kwargs)
    t_out = torch.nn.functional.conv2d(tx, tw, tb, **kwargs)
    assert g_out.dtype.np == dtype
    _close(g_out, t_out, msg="forward")
    _backward_both(torch, g_out, t_out, rng)
    for name, g, t in (("input", gx, tx), ("weight", gw, tw), ("bias", gb, tb)):
        _close(g.grad, t.grad, msg=f"grad of {name}")


@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("kernel,dilation", [((3, 3), 1), ((2, 4), 1), ((3, 2), (2, 3))])
def test_conv2d_string_padding(padding, kernel, dilation, rng):
    torch = torch_or_skip()
    x = rng.standard_normal((2, 3, 7, 8)).astype(np.float32)
    wt = rng.standard_normal((4, 3) + kernel).astype(np.float32)
    (gx, gw), (tx, tw) = _pair_tensors(torch, x, wt)
    g_out = graphc.conv2d(gx, gw, padding=padding, dilation=dilation)
    with warnings.catch_warnings():  # torch warns (once per process) about even 'same' kernels
        warnings.simplefilter("ignore", UserWarning)
        t_out = torch.nn.functional.conv2d(tx, tw, padding=padding, dilation=dilation)
    if padding == "same":
        assert tuple(g_out.shape[2:]) == (7, 8)
    _close(g_out, t_out)
    _backward_both(torch, g_out, t_out, rng)
    _close(gx.grad, tx.grad)
    _close(gw.grad, tw.grad)


def test_conv2d_unbatched_matches_batched(rng):
    torch = torch_or_skip()
    x = rng.standard_normal((3, 6, 5)).astype(np.float32)
    wt = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    (gx, gw, gb), (tx, tw, tb) = _pair_tensors(torch, x, wt, b)
    g_out = graphc.conv2d(gx, gw, gb, padding=1, stride=(1, 2))
    t_out = torch.nn.functional.conv2d(tx, tw, tb, padding=1, stride=(1, 2))
    assert tuple(g_out.shape) == (4, 6, 3)
    _close(g_out, t_out)
    _backward_both(torch, g_out, t_out, rng)
    for g, t in ((gx, tx), (gw, tw), (gb, tb)):
        _close(g.grad, t.grad)


def test_conv2d_only_weight_requires_grad(rng):
    x = graphc.tensor(rng.standard_normal((1, 2, 5, 5)))
    w = graphc.tensor(rng.standard_normal((3, 2, 3, 3)), requires_grad=True)
    graphc.conv2d(x, w).sum().backward()
    assert x.grad is None
    want = np.broadcast_to(
        np.lib.stride_tricks.sliding_window_view(x.numpy()[0], (3, 3), axis=(1, 2))
        .sum(axis=(1, 2)), (3, 2, 3, 3))
    np.testing.assert_allclose(w.grad.numpy(), want)


def test_conv2d_gradgradcheck():
    rng = np.random.default_rng(0)
    x = graphc.tensor(rng.standard_normal((1, 2, 4, 4)), requires_grad=True)
    w = graphc.tensor(rng.standard_normal((2, 1, 2, 2)), requires_grad=True)
    b = graphc.tensor(rng.standard_normal(2), requires_grad=True)

    def fn(x, w, b):
        return graphc.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2), groups=2)

    assert gradgradcheck(fn, (x, w, b))


def test_conv2d_double_backward_matches_torch(rng):
    torch = torch_or_skip()
    x = rng.standard_normal((2, 4, 6, 5))
    wt = rng.standard_normal((4, 2, 3, 2))
    (gx, gw), (tx, tw) = _pair_tensors(torch, x, wt)
    kwargs = dict(stride=(1, 2), padding=(1, 0), dilation=(2, 1), groups=2)
    results = []
    for _lib, fgrad, xs, conv in ((graphc, grad, (gx, gw), graphc.conv2d),
                                 (torch, torch.autograd.grad, (tx, tw),
                                  torch.nn.functional.conv2d)):
        y = conv(*xs, **kwargs)
        dx, dw = fgrad([(y * y).sum()], list(xs), create_graph=True)
        ((dx * dx).sum() + (dw * dw * dw).sum()).backward()
        results.append([dx, dw, xs[0].grad, xs[1].grad])
    for g, t in zip(*results):
        _close(g, t, atol=1e-8, rtol=1e-7)


def test_conv2d_saved_input_changed_in_place(rng):
    x = graphc.tensor(rng.standard_normal((1, 1, 4, 4)).astype(np.float32))
    w = graphc.tensor(rng.standard_normal((1, 1, 3, 3)).astype(np.float32), requires_grad=True)
    y = graphc.conv2d(x, w)
    x.add_(1.0)
    with pytest.raises(graphc.AutogradError, match="modified by an inplace operation"):
        y.sum().backward()


def test_conv2d_errors_name_the_user_line():
    x = graphc.zeros(2, 3, 8, 8)
    with pytest.raises(graphc.ShapeError, match=r"^conv2d at test_conv_pool\.py:\d+: Given "):
        graphc.conv2d(x, graphc.zeros(8, 4, 3, 3))


# ---- pooling ---------------------------------------------------------------------------------
MAX_CASES = [  # (shape, kernel, stride, padding, dilation, ceil_mode)
    ((2, 3, 7, 7), 2, None, 0, 1, False),
    ((2, 3, 7, 7), 2, None, 0, 1, True),
    ((1, 2, 8, 9), 3, 2, 1, 1, False),
    ((1, 2, 8, 9), 3, 2, 1, 1, True),
    ((1, 2, 9, 8), (3, 2), (2, 3), (1, 1), 1, True),
    ((1, 2, 9, 9), 3, 2, 1, 2, False),
    ((0, 2, 9, 9), 3, 2, 1, 2, False),  # an empty batch is allowed
    ((1, 2, 10, 9), 3, 3, 1, (2, 1), True),
    ((1, 1, 5, 5), 3, 3, 1, 1, True),  # the ceil-mode window that would start in padding
    ((3, 6, 6), 3, 1, 1, 1, False),  # unbatched
]


def _distinct(rng, shape):
    n = int(np.prod(shape))
    return ((rng.permutation(n) - n / 2) * 0.1).reshape(shape)


@pytest.mark.parametrize("case", MAX_CASES, ids=_ids(MAX_CASES))
def test_max_pool2d_matches_torch(case, rng):
    torch = torch_or_skip()
    shape, kernel, stride, padding, dilation, ceil_mode = case
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[::7] = 1.5  # ties: the first maximum must win, as in torch
    (gx,), (tx,) = _pair_tensors(torch, x)
    kwargs = dict(stride=stride, padding=padding, dilation=dilation, ceil_mode=ceil_mode,
                  return_indices=True)
    g_val, g_idx = graphc.max_pool2d(gx, kernel, **kwargs)
    t_val, t_idx = torch.nn.functional.max_pool2d(tx, kernel, **kwargs)
    _close(g_val, t_val, atol=0, rtol=0)
    np.testing.assert_array_equal(g_idx.numpy(), t_idx.numpy())
    assert g_idx.dtype is graphc.int64 and not g_idx.requires_grad
    _backward_both(torch, g_val, t_val, rng)
    _close(gx.grad, tx.grad, atol=1e-6)


@pytest.mark.parametrize("case", MAX_CASES[:4] + MAX_CASES[-1:], ids=_ids(MAX_CASES[:4] +
                                                                          MAX_CASES[-1:]))
def test_max_pool2d_gradgradcheck(case):
    shape, kernel, stride, padding, dilation, ceil_mode = case
    rng = np.random.default_rng(1)
    x = graphc.tensor(_distinct(rng, (1,) + shape[-2:]), requires_grad=True)

    def fn(x):
        return graphc.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode)

    assert gradgradcheck(fn, (x,))


def test_max_pool2d_nan_and_neg_inf_windows():
    torch = torch_or_skip()
    x = np.array([[[[1.0, np.nan, 3.0, -np.inf],
                    [np.nan, 2.0, 1.0, -np.inf],
                    [0.0, 0.0, -np.inf, -np.inf]]]], dtype=np.float32)
    for kwargs in ({"kernel_size": 2, "stride": 1}, {"kernel_size": 2, "padding": 1}):
        g_val, g_idx = graphc.max_pool2d(graphc.tensor(x), return_indices=True, **kwargs)
        t_val, t_idx = torch.nn.functional.max_pool2d(torch.tensor(x), return_indices=True,
                                                      **kwargs)
        np.testing.assert_array_equal(g_val.numpy(), t_val.numpy())
        np.testing.assert_array_equal(g_idx.numpy(), t_idx.numpy())


def test_max_pool2d_int64_input():
    x = graphc.tensor(np.arange(16).reshape(1, 1, 4, 4))
    np.testing.assert_array_equal(graphc.max_pool2d(x, 2).numpy(), [[[[5, 7], [13, 15]]]])


AVG_CASES = [  # (shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor)
    *[((2, 3, 7, 7), 3, 2, 1, ceil, cip, None)
      for ceil, cip in itertools.product([False, True], [True, False])],
    ((1, 2, 8, 9), (3, 2), (2, 3), (1, 1), True, False, None),
    ((1, 2, 8, 9), (3, 2), (2, 3), (1, 1), True, True, None),
    ((1, 1, 5, 5), 3, 3, 1, True, True, None),
    ((1, 2, 6, 6), 2, None, 1, False, True, 3),
    ((1, 2, 6, 6), 4, 1, 2, True, False, 5),
    ((3, 6, 5), 2, 1, 0, False, True, None),  # unbatched
]


@pytest.mark.parametrize("case", AVG_CASES, ids=_ids(AVG_CASES))
def test_avg_pool2d_matches_torch(case, rng):
    torch = torch_or_skip()
    shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor = case
    x = rng.standard_normal(shape).astype(np.float32)
    (gx,), (tx,) = _pair_tensors(torch, x)
    kwargs = dict(stride=stride, padding=padding, ceil_mode=ceil_mode,
                  count_include_pad=count_include_pad, divisor_override=divisor)
    g_out = graphc.avg_pool2d(gx, kernel, **kwargs)
    t_out = torch.nn.functional.avg_pool2d(tx, kernel, **kwargs)
    _close(g_out, t_out, atol=1e-6)
    _backward_both(torch, g_out, t_out, rng)
    _close(gx.grad, tx.grad, atol=1e-6)


@pytest.mark.parametrize("case", AVG_CASES[1:5:2] + AVG_CASES[-2:], ids=_ids(
    AVG_CASES[1:5:2] + AVG_CASES[-2:]))
def test_avg_pool2d_gradgradcheck(case):
    shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor = case
    rng = np.random.default_rng(2)
    x = graphc.tensor(rng.standard_normal((1,) + shape[-2:]), requires_grad=True)

    def fn(x):
        return graphc.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad,
                                 divisor)

    assert gradgradcheck(fn, (x,))


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_pool_double_backward_matches_torch(pool, rng):
    torch = torch_or_skip()
    x = _distinct(rng, (2, 2, 7, 6))
    (gx,), (tx,) = _pair_tensors(torch, x)
    results = []
    for fgrad, xt, f in ((grad, gx, getattr(graphc, f"{pool}_pool2d")),
                         (torch.autograd.grad, tx,
                          getattr(torch.nn.functional, f"{pool}_pool2d"))):
        y = f(xt, 3, 2, 1, ceil_mode=True)
        (dx,) = fgrad([(y * y * y).sum()], [xt], create_graph=True)
        (dx * dx).sum().backward()
        results.append([y, dx, xt.grad])
    for g, t in zip(*results):
        _close(g, t, atol=1e-8, rtol=1e-7)


def test_pool_errors_name_the_user_line():
    x = graphc.zeros(1, 1, 4, 4)
    with pytest.raises(graphc.ArgumentError,
                       match=r"^max_pool2d at test_conv_pool\.py:\d+: pad should be at most"):
        graphc.max_pool2d(x, 2, padding=2)
    with pytest.raises(graphc.ShapeError, match=r"^avg_pool2d at test_conv_pool\.py:\d+: "
                                                r"Given input size: \(1x4x4\)"):
        graphc.avg_pool2d(x, 5)
