"""OpInfo entries for the 'conv' op group: conv2d and its two gradient ops.

The numpy references loop over output pixels (not im2col), so they check the kernels' column
layout independently. The gradient ops get entries of their own: their gradcheck is the
gradient-of-gradient of conv2d, and their torch parity is against torch.nn.grad.
"""

from __future__ import annotations

import warnings

import numpy as np

import graphc
from graphc.errors import ArgumentError, DTypeError, ShapeError
from graphc.ops.registry import call
from tests.opinfo import ErrorInput, OpInfo, Sample, arr


# ---- numpy references (float64, loops over output pixels) -----------------------------------
def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _geometry(in_hw, k_hw, stride, padding, dilation):
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    out_hw = tuple((n + 2 * p - d * (k - 1) - 1) // s + 1
                   for n, k, s, p, d in zip(in_hw, k_hw, stride, padding, dilation))
    return stride, padding, dilation, out_hw


def _patch_index(oh, ow, k_hw, stride, dilation):
    rows = oh * stride[0] + np.arange(k_hw[0]) * dilation[0]
    cols = ow * stride[1] + np.arange(k_hw[1]) * dilation[1]
    return np.ix_(rows, cols)


def _same_pads(k_hw, dilation):
    total = [d * (k - 1) for k, d in zip(k_hw, _pair(dilation))]
    return [(t // 2, t - t // 2) for t in total]


def ref_conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    unbatched = x.ndim == 3
    x = x[None] if unbatched else x
    k_hw = w.shape[2:]
    if padding == "valid":
        padding = 0
    if padding == "same":
        pads = _same_pads(k_hw, dilation)
        padding = 0
    else:
        pads = [(p, p) for p in _pair(padding)]
    xp = np.pad(x, [(0, 0), (0, 0)] + pads)
    stride, _, dilation, out_hw = _geometry(xp.shape[2:], k_hw, stride, 0, dilation)
    n, c = x.shape[:2]
    o, cg = w.shape[:2]
    og = o // groups
    out = np.zeros((n, o) + out_hw)
    for oh in range(out_hw[0]):
        for ow in range(out_hw[1]):
            ix = _patch_index(oh, ow, k_hw, stride, dilation)
            for g in range(groups):
                patch = xp[:, g * cg:(g + 1) * cg][:, :, ix[0], ix[1]]  # (n, cg, kh, kw)
                out[:, g * og:(g + 1) * og, oh, ow] = np.einsum(
                    "nckl,ockl->no", patch, w[g * og:(g + 1) * og])
    if b is not None:
        out += b[None, :, None, None]
    return out[0] if unbatched else out


def ref_conv2d_input_grad(gy, w, stride, padding, dilation, groups, input_hw):
    unbatched = gy.ndim == 3
    gy = gy[None] if unbatched else gy
    n, o = gy.shape[:2]
    _, cg, kh, kw = w.shape
    og = o // groups
    ph, pw = padding
    gxp = np.zeros((n, cg * groups, input_hw[0] + 2 * ph, input_hw[1] + 2 * pw))
    for oh in range(gy.shape[2]):
        for ow in range(gy.shape[3]):
            ix = _patch_index(oh, ow, (kh, kw), stride, dilation)
            for g in range(groups):
                contrib = np.einsum("no,ockl->nckl", gy[:, g * og:(g + 1) * og, oh, ow],
                                    w[g * og:(g + 1) * og])
                view = gxp[:, g * cg:(g + 1) * cg]
                view[:, :, ix[0], ix[1]] += contrib
    gx = gxp[:, :, ph:ph + input_hw[0], pw:pw + input_hw[1]]
    return gx[0] if unbatched else gx


def ref_conv2d_weight_grad(gy, x, stride, padding, dilation, groups, kernel_size):
    if gy.ndim == 3:
        gy, x = gy[None], x[None]
    n, o = gy.shape[:2]
    c = x.shape[1]
    cg, og = c // groups, o // groups
    xp = np.pad(x, [(0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2])
    gw = np.zeros((o, cg) + tuple(kernel_size))
    for oh in range(gy.shape[2]):
        for ow in range(gy.shape[3]):
            ix = _patch_index(oh, ow, kernel_size, stride, dilation)
            for g in range(groups):
                patch = xp[:, g * cg:(g + 1) * cg][:, :, ix[0], ix[1]]
                gw[g * og:(g + 1) * og] += np.einsum("no,nckl->ockl",
                                                     gy[:, g * og:(g + 1) * og, oh, ow], patch)
    return gw


# ---- graphc and torch callables for the gradient ops -----------------------------------------
def conv2d_input_grad(gy, w, **attrs):
    return call("conv2d_input_grad", gy, w, **attrs)


def conv2d_weight_grad(gy, x, **attrs):
    return call("conv2d_weight_grad", gy, x, **attrs)


def _torch():
    import torch

    return torch


def torch_conv2d(*args, **kwargs):
    with warnings.catch_warnings():  # torch warns that even 'same' kernels copy the input
        warnings.simplefilter("ignore", UserWarning)
        return _torch().nn.functional.conv2d(*args, **kwargs)


def torch_conv2d_input_grad(gy, w, stride, padding, dilation, groups, input_hw):
    torch = _torch()
    unbatched = gy.ndim == 3
    gy = gy.unsqueeze(0) if unbatched else gy
    size = (gy.shape[0], w.shape[1] * groups) + tuple(input_hw)
    gx = torch.nn.grad.conv2d_input(size, w, gy, stride, padding, dilation, groups)
    return gx.squeeze(0) if unbatched else gx


def torch_conv2d_weight_grad(gy, x, stride, padding, dilation, groups, kernel_size):
    torch = _torch()
    if gy.ndim == 3:
        gy, x = gy.unsqueeze(0), x.unsqueeze(0)
    size = (gy.shape[1], x.shape[1] // groups) + tuple(kernel_size)
    return torch.nn.grad.conv2d_weight(x, size, gy, stride, padding, dilation, groups)


# ---- samples ---------------------------------------------------------------------------------
# (input shape, weight shape, kwargs): small, since gradcheck is O(numel^2).
_CASES = [
    ((2, 3, 5, 5), (4, 3, 3, 3), {}),
    ((1, 2, 6, 5), (3, 2, 3, 2), {"stride": 2, "padding": 1}),
    ((1, 2, 7, 6), (2, 2, 2, 3), {"stride": (2, 1), "padding": (1, 0), "dilation": (2, 1)}),
    ((2, 4, 5, 4), (4, 2, 3, 3), {"padding": 1, "groups": 2}),
    ((1, 4, 5, 5), (4, 1, 3, 3), {"stride": 2, "padding": 1, "groups": 4}),  # depthwise
    ((1, 2, 5, 5), (3, 2, 1, 1), {"stride": 3}),
    ((2, 5, 5), (3, 2, 3, 3), {"padding": "same"}),  # unbatched
    ((1, 2, 6, 6), (2, 2, 3, 3), {"padding": "same", "dilation": 2}),
    ((1, 2, 4, 4), (2, 2, 3, 3), {"padding": "valid"}),
    ((1, 2, 5, 6), (2, 2, 2, 4), {"padding": "same"}),  # even kernels: extra pad bottom/right
    ((2, 4, 5), (2, 2, 2, 3), {"padding": "same", "dilation": (1, 2)}),
]


def conv2d_samples(rng):
    out = []
    for k, (xs, ws, kwargs) in enumerate(_CASES):
        args = (arr(rng, *xs), arr(rng, *ws))
        if k % 2 == 0:
            args += (arr(rng, ws[0]),)  # with bias on every other case
        out.append(Sample(args, dict(kwargs), desc=f"x{list(xs)} w{list(ws)} {kwargs}"))
    return out


def _grad_op_cases():
    """Canonical attributes of the conv cases that have numeric padding."""
    for xs, ws, kwargs in _CASES:
        if isinstance(kwargs.get("padding", 0), str):
            continue
        attrs = {"stride": _pair(kwargs.get("stride", 1)),
                 "padding": _pair(kwargs.get("padding", 0)),
                 "dilation": _pair(kwargs.get("dilation", 1)),
                 "groups": kwargs.get("groups", 1)}
        _, _, _, out_hw = _geometry(xs[-2:], ws[2:], attrs["stride"], attrs["padding"],
                                    attrs["dilation"])
        yield xs, ws, attrs, xs[:-3] + (ws[0],) + out_hw


def input_grad_samples(rng):
    return [Sample((arr(rng, *ys), arr(rng, *ws)), dict(attrs, input_hw=tuple(xs[-2:])),
                   desc=f"gy{list(ys)} w{list(ws)} {attrs}")
            for xs, ws, attrs, ys in _grad_op_cases()]


def weight_grad_samples(rng):
    return [Sample((arr(rng, *ys), arr(rng, *xs)), dict(attrs, kernel_size=tuple(ws[2:])),
                   desc=f"gy{list(ys)} x{list(xs)} {attrs}")
            for xs, ws, attrs, ys in _grad_op_cases()]


def conv2d_errors(rng):
    x = arr(rng, 2, 3, 8, 8)
    return [
        ErrorInput(Sample((arr(rng, 2, 3), arr(rng, 8, 3, 3, 3))), ShapeError,
                   r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv2d, but got "
                   r"input of size: \[2, 3\]"),
        ErrorInput(Sample((x, arr(rng, 8, 4, 3, 3))), ShapeError,
                   r"Given groups=1, weight of size \[8, 4, 3, 3\], expected input\[2, 3, 8, 8\] "
                   r"to have 4 channels, but got 3 channels instead"),
        ErrorInput(Sample((arr(rng, 1, 3, 2, 2), arr(rng, 8, 3, 3, 3))), ShapeError,
                   r"Calculated padded input size per channel: \(2 x 2\). Kernel size: \(3 x 3\)."
                   r" Kernel size can't be greater than actual input size"),
        ErrorInput(Sample((arr(rng, 1, 3, 4, 4), arr(rng, 2, 3, 2, 2)), {"dilation": 4}),
                   ShapeError, r"Kernel size: \(5 x 5\)"),
        ErrorInput(Sample((arr(rng, 2, 4, 8, 8), arr(rng, 6, 2, 3, 3)), {"groups": 4}),
                   ShapeError, r"Given groups=4, expected weight to be divisible by 4 at "
                   r"dimension 0, but got weight of size \[6, 2, 3, 3\] instead"),
        ErrorInput(Sample((arr(rng, 2, 6, 8, 8), arr(rng, 4, 2, 3, 3)), {"groups": 2}),
                   ShapeError, r"Given groups=2, weight of size \[4, 2, 3, 3\], expected "
                   r"input\[2, 6, 8, 8\] to have 4 channels, but got 6 channels instead"),
        ErrorInput(Sample((x, arr(rng, 8, 3, 3, 3)), {"groups": 0}), ArgumentError,
                   "non-positive groups is not supported"),
        ErrorInput(Sample((np.ones((1, 3, 5, 5), np.int64), np.ones((2, 3, 3, 3), np.int64))),
                   DTypeError, "expected a floating point input"),
        ErrorInput(Sample((x, arr(rng, 8, 3, 3, 3, dtype=np.float64))), DTypeError,
                   r"Input type \(float32\) and weight type \(float64\) should be the same"),
        ErrorInput(Sample((x, arr(rng, 8, 3, 3, 3)), {"stride": 0}), ArgumentError,
                   "non-positive stride is not supported"),
        ErrorInput(Sample((x, arr(rng, 8, 3, 3, 3)), {"padding": -1}), ArgumentError,
                   "negative padding is not supported"),
        ErrorInput(Sample((x, arr(rng, 8, 3, 3, 3)), {"stride": (1, 2, 3)}), ArgumentError,
                   r"expected stride to be a single integer value or a list of 2 values"),
        ErrorInput(Sample((x, arr(rng, 8, 3, 3, 3)), {"padding": "same", "stride": 2}),
                   ArgumentError, "padding='same' is not supported for strided convolutions"),
        ErrorInput(Sample((x, arr(rng, 8, 3, 3, 3)), {"padding": "full"}), ArgumentError,
                   "Invalid padding string: 'full'"),
        ErrorInput(Sample((x, arr(rng, 8, 3, 3, 3), arr(rng, 5))), ShapeError,
                   r"Given weight of size \[8, 3, 3, 3\], expected bias to be 1-dimensional "
                   r"with 8 elements, but got bias of size \[5\] instead"),
        ErrorInput(Sample((x, arr(rng, 8, 3, 3))), ShapeError, "expected weight to be 4-D"),
    ]


def input_grad_errors(rng):
    attrs = {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "groups": 1}
    return [
        ErrorInput(Sample((arr(rng, 1, 4, 5, 5), arr(rng, 4, 3, 3, 3)),
                          dict(attrs, input_hw=(8, 8))), ShapeError,
                   r"expected grad_output of size \[1, 4, 6, 6\]"),
    ]


def weight_grad_errors(rng):
    attrs = {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "groups": 1}
    return [
        ErrorInput(Sample((arr(rng, 2, 4, 6, 6), arr(rng, 1, 3, 8, 8)),
                          dict(attrs, kernel_size=(3, 3))), ShapeError,
                   "disagree on the batch dimension"),
        ErrorInput(Sample((arr(rng, 1, 4, 5, 5), arr(rng, 1, 3, 8, 8)),
                          dict(attrs, kernel_size=(3, 3))), ShapeError,
                   r"expected grad_output of spatial size \[6, 6\]"),
    ]


OP_INFOS: list[OpInfo] = [
    OpInfo("conv2d", graphc.conv2d, ref_conv2d, conv2d_samples,
           registry_ops=("conv2d", "conv2d_input_grad", "conv2d_weight_grad"),
           torch_fn=torch_conv2d, error_inputs=conv2d_errors, atol=1e-5, rtol=1e-4),
    OpInfo("conv2d_input_grad", conv2d_input_grad, ref_conv2d_input_grad, input_grad_samples,
           registry_ops=("conv2d_input_grad", "conv2d", "conv2d_weight_grad"),
           torch_fn=torch_conv2d_input_grad, error_inputs=input_grad_errors),
    OpInfo("conv2d_weight_grad", conv2d_weight_grad, ref_conv2d_weight_grad,
           weight_grad_samples,
           registry_ops=("conv2d_weight_grad", "conv2d", "conv2d_input_grad"),
           torch_fn=torch_conv2d_weight_grad, error_inputs=weight_grad_errors),
]
