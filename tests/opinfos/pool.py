"""OpInfo entries for the 'pool' op group: max/avg pooling and their gradient ops.

The numpy references loop over output pixels with PyTorch's window clipping rules written out
directly. Max-pool samples hold distinct values at least 0.1 apart, so no window has a tie
and finite differences never cross one. The gradient ops get entries of their own: their
gradcheck is the gradient-of-gradient of pooling.
"""

from __future__ import annotations

import numpy as np

import graphc
from graphc.errors import ArgumentError, DTypeError, ShapeError
from graphc.ops.registry import call
from tests.opinfo import ErrorInput, OpInfo, Sample, arr


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _out_size(n, k, s, p, d, ceil_mode):
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def _geometry(in_hw, kernel_size, stride, padding, dilation, ceil_mode):
    k = _pair(kernel_size)
    s = k if stride is None else _pair(stride)
    p, d = _pair(padding), _pair(dilation)
    out = tuple(_out_size(*a, ceil_mode) for a in zip(in_hw, k, s, p, d))
    return k, s, p, d, out


def distinct(rng, *shape):
    """Values spaced 0.1 apart in random order: no ties inside any pooling window."""
    n = int(np.prod(shape))
    return ((rng.permutation(n) - n / 2) * 0.1).reshape(shape).astype(np.float32)


# ---- references ------------------------------------------------------------------------------
def ref_max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                   return_indices=False):
    h, w = x.shape[-2:]
    k, s, p, d, (ho, wo) = _geometry((h, w), kernel_size, stride, padding, dilation, ceil_mode)
    planes = x.reshape(-1, h, w)
    values = np.zeros((planes.shape[0], ho, wo), x.dtype)
    indices = np.zeros((planes.shape[0], ho, wo), np.int64)
    for oh in range(ho):
        for ow in range(wo):
            rows = [r for r in oh * s[0] - p[0] + np.arange(k[0]) * d[0] if 0 <= r < h]
            cols = [c for c in ow * s[1] - p[1] + np.arange(k[1]) * d[1] if 0 <= c < w]
            flat = np.array([r * w + c for r in rows for c in cols])
            window = planes.reshape(planes.shape[0], -1)[:, flat]
            best = np.argmax(window, axis=1)
            values[:, oh, ow] = window[np.arange(len(best)), best]
            indices[:, oh, ow] = flat[best]
    shape = x.shape[:-2] + (ho, wo)
    values, indices = values.reshape(shape), indices.reshape(shape)
    return (values, indices) if return_indices else values


def ref_max_pool2d_grad(g, indices, input_hw, **_pool_args):
    h, w = input_hw
    g2 = g.reshape(-1, g.shape[-2] * g.shape[-1])
    i2 = indices.reshape(g2.shape)
    out = np.zeros((g2.shape[0], h * w))
    for b in range(g2.shape[0]):
        np.add.at(out[b], i2[b], g2[b])
    return out.reshape(g.shape[:-2] + (h, w))


def _avg_weights(in_hw, k, s, p, out_hw, count_include_pad, divisor_override):
    """weights[oh, ow] is an (H, W) array: the share of each input in that output."""
    h, w = in_hw
    weights = np.zeros(out_hw + (h, w))
    for oh in range(out_hw[0]):
        for ow in range(out_hw[1]):
            h0, w0 = oh * s[0] - p[0], ow * s[1] - p[1]
            h1, w1 = min(h0 + k[0], h + p[0]), min(w0 + k[1], w + p[1])
            size = (h1 - h0) * (w1 - w0)
            h0c, w0c, h1c, w1c = max(h0, 0), max(w0, 0), min(h1, h), min(w1, w)
            if divisor_override:
                div = divisor_override
            elif count_include_pad:
                div = size
            else:
                div = (h1c - h0c) * (w1c - w0c)
            weights[oh, ow, h0c:h1c, w0c:w1c] = 1.0 / div
    return weights


def ref_avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False,
                   count_include_pad=True, divisor_override=None):
    k, s, p, _, out_hw = _geometry(x.shape[-2:], kernel_size, stride, padding, 1, ceil_mode)
    weights = _avg_weights(x.shape[-2:], k, s, p, out_hw, count_include_pad, divisor_override)
    return np.einsum("...hw,ijhw->...ij", x, weights)


def ref_avg_pool2d_grad(g, input_hw, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override):
    weights = _avg_weights(input_hw, kernel_size, stride, padding, g.shape[-2:],
                           count_include_pad, divisor_override)
    return np.einsum("...ij,ijhw->...hw", g, weights)


# ---- graphc and torch callables for the gradient ops -----------------------------------------
def _torch():
    import torch

    return torch


def max_pool2d_grad(g, indices, input_hw, **_pool_args):
    """The registry op; the pooling arguments are there for torch's signature only."""
    return call("max_pool2d_grad", g, indices, input_hw=input_hw)


def torch_max_pool2d(*args, **kwargs):
    return _torch().nn.functional.max_pool2d(*args, **kwargs)


def torch_avg_pool2d(*args, **kwargs):
    return _torch().nn.functional.avg_pool2d(*args, **kwargs)


def torch_max_pool2d_grad(g, indices, input_hw, kernel_size, stride, padding, dilation,
                          ceil_mode):
    torch = _torch()
    like = torch.zeros(tuple(g.shape[:-2]) + tuple(input_hw), dtype=g.dtype)
    return torch.ops.aten.max_pool2d_with_indices_backward(
        g, like, kernel_size, stride, padding, dilation, ceil_mode, indices)


def avg_pool2d_grad(g, **attrs):
    return call("avg_pool2d_grad", g, **attrs)


def torch_avg_pool2d_grad(g, input_hw, kernel_size, stride, padding, ceil_mode,
                          count_include_pad, divisor_override):
    torch = _torch()
    like = torch.zeros(tuple(g.shape[:-2]) + tuple(input_hw), dtype=g.dtype)
    return torch.ops.aten.avg_pool2d_backward(g, like, kernel_size, stride, padding, ceil_mode,
                                              count_include_pad, divisor_override)


# ---- samples ---------------------------------------------------------------------------------
_MAX_CASES = [
    ((2, 2, 4, 4), {"kernel_size": 2}),
    ((1, 2, 5, 5), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ((1, 1, 6, 5), {"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 0)}),
    ((1, 2, 6, 6), {"kernel_size": 2, "stride": 2, "dilation": 2}),
    ((1, 1, 5, 6), {"kernel_size": 2, "stride": 2, "ceil_mode": True}),
    ((1, 1, 5, 5), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ((2, 5, 4), {"kernel_size": 2, "stride": 1}),  # unbatched
]

_AVG_CASES = [
    ((2, 2, 4, 4), {"kernel_size": 2}),
    ((1, 2, 5, 5), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ((1, 2, 5, 5), {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False}),
    ((1, 1, 6, 5), {"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 1)}),
    ((1, 1, 5, 6), {"kernel_size": 2, "stride": 2, "ceil_mode": True}),
    ((1, 1, 5, 5), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ((1, 1, 5, 5), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True,
                    "count_include_pad": False}),
    ((1, 2, 5, 5), {"kernel_size": 2, "padding": 1, "divisor_override": 3}),
    ((2, 5, 4), {"kernel_size": 2, "stride": 1}),  # unbatched
]


def max_pool2d_samples(rng):
    out = []
    for k, (shape, kwargs) in enumerate(_MAX_CASES):
        kw = dict(kwargs, return_indices=bool(k % 2))
        out.append(Sample((distinct(rng, *shape),), kw, desc=f"x{list(shape)} {kw}"))
    return out


def _canonical_max(shape, kwargs):
    k, s, p, d, out_hw = _geometry(shape[-2:], kwargs["kernel_size"], kwargs.get("stride"),
                                   kwargs.get("padding", 0), kwargs.get("dilation", 1),
                                   kwargs.get("ceil_mode", False))
    return {"kernel_size": k, "stride": s, "padding": p, "dilation": d,
            "ceil_mode": kwargs.get("ceil_mode", False)}, out_hw


def max_pool2d_grad_samples(rng):
    out = []
    for shape, kwargs in _MAX_CASES:
        attrs, out_hw = _canonical_max(shape, kwargs)
        _, indices = ref_max_pool2d(distinct(rng, *shape), return_indices=True, **attrs)
        g = arr(rng, *(shape[:-2] + out_hw))
        out.append(Sample((g, indices), dict(attrs, input_hw=tuple(shape[-2:])),
                          desc=f"g{list(g.shape)} {attrs}", grad_args=(0,)))
    return out


def avg_pool2d_samples(rng):
    return [Sample((arr(rng, *shape),), dict(kwargs), desc=f"x{list(shape)} {kwargs}")
            for shape, kwargs in _AVG_CASES]


def avg_pool2d_grad_samples(rng):
    out = []
    for shape, kwargs in _AVG_CASES:
        k, s, p, _, out_hw = _geometry(shape[-2:], kwargs["kernel_size"], kwargs.get("stride"),
                                       kwargs.get("padding", 0), 1,
                                       kwargs.get("ceil_mode", False))
        attrs = {"input_hw": tuple(shape[-2:]), "kernel_size": k, "stride": s, "padding": p,
                 "ceil_mode": kwargs.get("ceil_mode", False),
                 "count_include_pad": kwargs.get("count_include_pad", True),
                 "divisor_override": kwargs.get("divisor_override")}
        g = arr(rng, *(shape[:-2] + out_hw))
        out.append(Sample((g,), attrs, desc=f"g{list(g.shape)} {attrs}"))
    return out


# ---- error inputs ----------------------------------------------------------------------------
def _common_errors(rng, op_name, extra=()):
    x = arr(rng, 2, 3, 8, 8)
    return [
        ErrorInput(Sample((x, 3), {"padding": 2}), ArgumentError,
                   "pad should be at most half of effective kernel size, but got pad=2, "
                   "kernel_size=3 and dilation=1"),
        ErrorInput(Sample((arr(rng, 1, 1, 2, 2), 3)), ShapeError,
                   r"Given input size: \(1x2x2\). Calculated output size: \(1x0x0\). Output "
                   "size is too small"),
        ErrorInput(Sample((arr(rng, 3, 3), 2)), ShapeError,
                   r"non-empty 3D or 4D \(batch mode\) tensor expected for input"),
        ErrorInput(Sample((x, -1)), ArgumentError,
                   "kernel size should be greater than zero, but got kH: -1 kW: -1"),
        ErrorInput(Sample((x, 2), {"stride": 0}), ArgumentError, "stride should not be zero"),
        ErrorInput(Sample((x, 2), {"padding": -1}), ArgumentError,
                   "pad must be non-negative, but got pad: -1"),
        ErrorInput(Sample((x, (2, 2, 2))), ArgumentError,
                   f"{op_name}.*: kernel_size must either be a single int, or a tuple of two "
                   "ints"),
    ] + list(extra)


def max_pool2d_errors(rng):
    x = arr(rng, 2, 3, 8, 8)
    return _common_errors(rng, "max_pool2d", [
        ErrorInput(Sample((x, 2), {"dilation": 0}), ArgumentError,
                   "dilation should be greater than zero, but got dilationH: 0 dilationW: 0"),
        ErrorInput(Sample((x, 3), {"padding": 3, "dilation": 2}), ArgumentError,
                   "pad should be at most half of effective kernel size, but got pad=3, "
                   "kernel_size=3 and dilation=2"),
    ])


def avg_pool2d_errors(rng):
    x = arr(rng, 2, 3, 8, 8)
    return _common_errors(rng, "avg_pool2d", [
        ErrorInput(Sample((np.ones((1, 1, 4, 4), np.int64), 2)), DTypeError,
                   "expected a floating point input"),
        ErrorInput(Sample((x, 2), {"divisor_override": 0}), ArgumentError,
                   "divisor must be not zero"),
    ])


def max_pool2d_grad_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 1, 1, 2, 2), np.zeros((1, 1, 2, 3), np.int64)),
                          {"input_hw": (4, 4)}), ShapeError,
                   "expected 3D or 4D grad_output and indices of the same size"),
        ErrorInput(Sample((arr(rng, 1, 1, 2, 2), np.zeros((1, 1, 2, 2), np.float32)),
                          {"input_hw": (4, 4)}), DTypeError,
                   "expected indices of dtype int64, got float32"),
    ]


def avg_pool2d_grad_errors(rng):
    attrs = {"input_hw": (8, 8), "kernel_size": (2, 2), "stride": (2, 2), "padding": (0, 0),
             "ceil_mode": False, "count_include_pad": True, "divisor_override": None}
    return [
        ErrorInput(Sample((arr(rng, 1, 1, 3, 4),), attrs), ShapeError,
                   r"expected grad_output of size \[1, 1, 4, 4\]"),
    ]


OP_INFOS: list[OpInfo] = [
    OpInfo("max_pool2d", graphc.max_pool2d, ref_max_pool2d, max_pool2d_samples,
           registry_ops=("max_pool2d", "max_pool2d_grad"), torch_fn=torch_max_pool2d,
           error_inputs=max_pool2d_errors),
    OpInfo("max_pool2d_grad", max_pool2d_grad, ref_max_pool2d_grad, max_pool2d_grad_samples,
           registry_ops=("max_pool2d_grad",), torch_fn=torch_max_pool2d_grad,
           error_inputs=max_pool2d_grad_errors),
    OpInfo("avg_pool2d", graphc.avg_pool2d, ref_avg_pool2d, avg_pool2d_samples,
           registry_ops=("avg_pool2d", "avg_pool2d_grad"), torch_fn=torch_avg_pool2d,
           error_inputs=avg_pool2d_errors),
    OpInfo("avg_pool2d_grad", avg_pool2d_grad, ref_avg_pool2d_grad, avg_pool2d_grad_samples,
           registry_ops=("avg_pool2d_grad", "avg_pool2d"), torch_fn=torch_avg_pool2d_grad,
           error_inputs=avg_pool2d_grad_errors),
]
