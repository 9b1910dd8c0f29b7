"""2-D convolution: `conv2d` and its two gradient ops, im2col + GEMM in vectorised numpy.

The three registry ops (kind CONTRACTION) close under differentiation, so gradients of any
order are themselves these ops (the standard identities, with y = conv2d(x, w)):

    conv2d(x, w)              -> y   VJP: conv2d_input_grad(gy, w), conv2d_weight_grad(gy, x)
    conv2d_input_grad(gy, w)  -> gx  VJP: conv2d(ggx, w),           conv2d_weight_grad(gy, ggx)
    conv2d_weight_grad(gy, x) -> gw  VJP: conv2d(x, ggw),           conv2d_input_grad(gy, ggw)

Invariants:
- Attributes are canonical: stride, padding, dilation are (h, w) int pairs, groups an int;
  the gradient ops also carry the spatial size they cannot infer (`input_hw`, `kernel_size`).
- Every op accepts a batched (N, C, H, W) or an unbatched (C, H, W) layout, as PyTorch's
  conv2d does; the gradient ops keep the rank of their tensor inputs.
- Kernels follow THNN's SpatialConvolutionMM (see ../shared/SEEDS.md section 3): im2col as one
  strided view and one copy, then one batched matmul over the whole batch and all groups. The
  input gradient is weight^T @ grad columns, scattered back (col2im) with one strided add per
  kernel offset.
- Bias is not part of the op: the public `conv2d` adds it with a broadcast add, so its
  gradient is the ordinary sum of the add's VJP.
"""

from __future__ import annotations

import numpy as np

from graphc.errors import ArgumentError, DTypeError, ShapeError, where
from graphc.ops.registry import CONTRACTION, OpDef, call, register
from graphc.ops.shapes import format_size
from graphc.types import TensorType

_CONV_ATTRS = {"stride": tuple, "padding": tuple, "dilation": tuple, "groups": int}


# ---- shared shape helpers --------------------------------------------------------------------
def conv_output_hw(in_hw, kernel_hw, stride, padding, dilation) -> tuple[int, int]:
    """H_out = (H + 2*pad - dilation*(k-1) - 1) // stride + 1, per spatial dimension."""
    return tuple(
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, k, s, p, d in zip(in_hw, kernel_hw, stride, padding, dilation)
    )


def _check_attrs(op: str, stride, padding, dilation, groups) -> None:
    for name, value in (("stride", stride), ("padding", padding), ("dilation", dilation)):
        if not (isinstance(value, tuple) and len(value) == 2
                and all(isinstance(v, int) for v in value)):
            raise ArgumentError(
                f"{where(op)}: expected {name} to be a single integer value or a list of 2 "
                f"values to match the convolution dimensions, but got {name}={list(value)}"
            )
    if any(s <= 0 for s in stride):
        raise ArgumentError(f"{where(op)}: non-positive stride is not supported")
    if any(p < 0 for p in padding):
        raise ArgumentError(f"{where(op)}: negative padding is not supported")
    if any(d <= 0 for d in dilation):
        raise ArgumentError(f"{where(op)}: non-positive dilation is not supported")
    if not isinstance(groups, int) or groups <= 0:
        raise ArgumentError(f"{where(op)}: non-positive groups is not supported")


def _check_float_pair(op: str, a: TensorType, b: TensorType, a_name: str, b_name: str) -> None:
    if not a.dtype.is_floating:
        raise DTypeError(
            f"{where(op)}: expected a floating point {a_name} (float32 or float64), got "
            f"{a.dtype.name}; convert it with .float() or .double()"
        )
    if a.dtype is not b.dtype:
        raise DTypeError(
            f"{where(op)}: {a_name.capitalize()} type ({a.dtype.name}) and {b_name} type "
            f"({b.dtype.name}) should be the same"
        )


def _check_weight(op: str, w: TensorType, groups: int) -> None:
    if w.ndim != 4:
        raise ShapeError(
            f"{where(op)}: expected weight to be 4-D [out_channels, in_channels/groups, kH, kW], "
            f"but got weight of size {format_size(w.shape)}"
        )
    if w.shape[0] % groups:
        raise ShapeError(
            f"{where(op)}: Given groups={groups}, expected weight to be divisible by {groups} "
            f"at dimension 0, but got weight of size {format_size(w.shape)} instead"
        )


def _check_batched(op: str, t: TensorType, what: str) -> None:
    if t.ndim not in (3, 4):
        raise ShapeError(
            f"{where(op)}: Expected 3D (unbatched) or 4D (batched) {what} to conv2d, but got "
            f"{what} of size: {format_size(t.shape)}"
        )


def _check_input_fits(op: str, x_shape, w_shape, groups, stride, padding, dilation):
    """The channel and kernel-size checks of PyTorch's conv, in its wording; returns out hw."""
    if x_shape[-3] != w_shape[1] * groups:
        raise ShapeError(
            f"{where(op)}: Given groups={groups}, weight of size {format_size(w_shape)}, expected "
            f"input{format_size(x_shape)} to have {w_shape[1] * groups} channels, but got "
            f"{x_shape[-3]} channels instead"
        )
    padded = tuple(n + 2 * p for n, p in zip(x_shape[-2:], padding))
    eff = tuple(d * (k - 1) + 1 for k, d in zip(w_shape[2:], dilation))
    if any(p < e for p, e in zip(padded, eff)):
        raise ShapeError(
            f"{where(op)}: Calculated padded input size per channel: ({padded[0]} x "
            f"{padded[1]}). Kernel size: ({eff[0]} x {eff[1]}). Kernel size can't be greater "
            "than actual input size"
        )
    return conv_output_hw(x_shape[-2:], w_shape[2:], stride, padding, dilation)


# ---- numpy building blocks -------------------------------------------------------------------
def _batched(a: np.ndarray) -> np.ndarray:
    return a[None] if a.ndim == 3 else a


def _pad_hw(x: np.ndarray, padding) -> np.ndarray:
    ph, pw = padding
    if not ph and not pw:
        return x
    n, c, h, w = x.shape
    out = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=x.dtype)
    out[:, :, ph:ph + h, pw:pw + w] = x
    return out


def _im2col(x: np.ndarray, kernel_hw, out_hw, stride, padding, dilation, groups) -> np.ndarray:
    """Columns (N, groups, C/groups*kH*kW, H_out*W_out) of a batched input: one view, one copy."""
    xp = _pad_hw(x, padding)
    n, c = xp.shape[:2]
    (kh, kw), (ho, wo), (sh, sw), (dh, dw) = kernel_hw, out_hw, stride, dilation
    s_n, s_c, s_h, s_w = xp.strides
    view = np.lib.stride_tricks.as_strided(
        xp, shape=(n, c, kh, kw, ho, wo),
        strides=(s_n, s_c, dh * s_h, dw * s_w, sh * s_h, sw * s_w), writeable=False,
    )
    return np.ascontiguousarray(view).reshape(n, groups, (c // groups) * kh * kw, ho * wo)


def _col2im(cols: np.ndarray, in_shape, kernel_hw, out_hw, stride, padding, dilation):
    """Scatter columns (N, C, kH, kW, H_out, W_out) back to (N, C, H, W), adding overlaps."""
    n, c, h, w = in_shape
    (kh, kw), (ho, wo), (sh, sw), (dh, dw), (ph, pw) = (
        kernel_hw, out_hw, stride, dilation, padding)
    out = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=cols.dtype)
    for i in range(kh):
        r0 = i * dh
        for j in range(kw):
            c0 = j * dw
            rows = slice(r0, r0 + sh * (ho - 1) + 1, sh)
            out[:, :, rows, c0:c0 + sw * (wo - 1) + 1:sw] += cols[:, :, i, j]
    return out[:, :, ph:ph + h, pw:pw + w]


# ---- conv2d ----------------------------------------------------------------------------------
def _conv2d_infer(x: TensorType, w: TensorType, *, stride, padding, dilation, groups):
    op = "conv2d"
    _check_batched(op, x, "input")
    _check_attrs(op, stride, padding, dilation, groups)
    _check_float_pair(op, x, w, "input", "weight")
    _check_weight(op, w, groups)
    out_hw = _check_input_fits(op, x.shape, w.shape, groups, stride, padding, dilation)
    return TensorType(x.shape[:-3] + (w.shape[0],) + out_hw, x.dtype)


def _conv2d_kernel(x, w, *, stride, padding, dilation, groups):
    xb = _batched(x)
    out_ch, _, kh, kw = w.shape
    out_hw = conv_output_hw(xb.shape[2:], (kh, kw), stride, padding, dilation)
    cols = _im2col(xb, (kh, kw), out_hw, stride, padding, dilation, groups)
    wmat = w.reshape(groups, out_ch // groups, -1)
    out = np.matmul(wmat, cols)  # (N, groups, O/groups, H_out*W_out): NCHW with no transpose
    out = out.reshape((xb.shape[0], out_ch) + out_hw)
    return out[0] if x.ndim == 3 else out


def _conv2d_vjp(ctx, g):
    x, w = ctx.inputs
    attrs = ctx.attrs
    need_x, need_w = ctx.needs_input_grad
    gx = call("conv2d_input_grad", g, w, input_hw=tuple(x.shape[-2:]), **attrs) \
        if need_x else None
    gw = call("conv2d_weight_grad", g, x, kernel_size=tuple(w.shape[-2:]), **attrs) \
        if need_w else None
    return (gx, gw)


register(OpDef("conv2d", CONTRACTION, ("input", "weight"), _conv2d_infer, _conv2d_kernel,
               _conv2d_vjp, attrs=dict(_CONV_ATTRS), saved_inputs=(0, 1), epilogue_anchor=True,
               doc="2-D cross-correlation, NCHW (or CHW), im2col + GEMM per group."))


# ---- conv2d_input_grad -----------------------------------------------------------------------
def _conv2d_input_grad_infer(gy: TensorType, w: TensorType, *, stride, padding, dilation,
                             groups, input_hw):
    op = "conv2d_input_grad"
    _check_batched(op, gy, "grad_output")
    _check_attrs(op, stride, padding, dilation, groups)
    _check_float_pair(op, gy, w, "grad_output", "weight")
    _check_weight(op, w, groups)
    in_shape = gy.shape[:-3] + (w.shape[1] * groups,) + tuple(input_hw)
    out_hw = _check_input_fits(op, in_shape, w.shape, groups, stride, padding, dilation)
    want = gy.shape[:-3] + (w.shape[0],) + out_hw
    if gy.shape != want:
        raise ShapeError(
            f"{where(op)}: expected grad_output of size {format_size(want)} for input"
            f"{format_size(in_shape)} and weight{format_size(w.shape)}, got {format_size(gy.shape)}"
        )
    return TensorType(in_shape, gy.dtype)


def _conv2d_input_grad_kernel(gy, w, *, stride, padding, dilation, groups, input_hw):
    gb = _batched(gy)
    n, out_ch, ho, wo = gb.shape
    _, cg, kh, kw = w.shape
    wt = w.reshape(groups, out_ch // groups, cg * kh * kw).transpose(0, 2, 1)
    if stride == (1, 1) and dilation == (1, 1):
        gx = _input_grad_by_shifts(gb, wt, (kh, kw), padding, input_hw, groups * cg)
        return gx[0] if gy.ndim == 3 else gx
    cols = np.matmul(wt, gb.reshape(n, groups, out_ch // groups, ho * wo))
    cols = cols.reshape(n, groups * cg, kh, kw, ho, wo)
    gx = _col2im(cols, (n, groups * cg) + tuple(input_hw), (kh, kw), (ho, wo), stride, padding,
                 dilation)
    return gx[0] if gy.ndim == 3 else gx


def _input_grad_by_shifts(gb, wt, kernel_hw, padding, input_hw, channels):
    """The input gradient of a stride-1, dilation-1 convolution: col2im with each tap's
    columns added as one shifted run over the flat padded planes. The output gradient is
    widened to the padded width first (zero columns), so a tap is the flat offset
    i * W_pad + j and its rows are contiguous: 25 long adds for a 5x5 kernel instead of 25
    times N*C*H_out short ones. The extra columns add only zeros (to neighbours and at most
    kW - 1 elements past a plane into the next, or into the spare tail), which change no sum:
    the gradient equals `_col2im`'s bit for bit."""
    n, groups, out_g = gb.shape[0], wt.shape[0], wt.shape[2]
    ho, wo = gb.shape[2:]
    (kh, kw), (ph, pw) = kernel_hw, padding
    hp, wp = ho + kh - 1, wo + kw - 1  # the padded input's size
    wide = np.zeros((n, groups, out_g, ho, wp), dtype=gb.dtype)
    wide[..., :wo] = gb.reshape(n, groups, out_g, ho, wo)
    cols = np.matmul(wt, wide.reshape(n, groups, out_g, ho * wp))
    cols = cols.reshape(n * channels, kh, kw, ho * wp)
    plane = hp * wp
    flat = np.zeros(n * channels * plane + kw, dtype=gb.dtype)  # + the last plane's spill
    item = flat.itemsize
    for i in range(kh):
        for j in range(kw):
            run = np.lib.stride_tricks.as_strided(
                flat[i * wp + j:], shape=(n * channels, ho * wp), strides=(plane * item, item))
            run += cols[:, i, j]
    planes = flat[:n * channels * plane].reshape(n, channels, hp, wp)
    return planes[:, :, ph:ph + input_hw[0], pw:pw + input_hw[1]]


def _conv2d_input_grad_vjp(ctx, ggx):
    gy, w = ctx.inputs
    attrs = {k: ctx.attrs[k] for k in _CONV_ATTRS}
    need_gy, need_w = ctx.needs_input_grad
    d_gy = call("conv2d", ggx, w, **attrs) if need_gy else None
    d_w = call("conv2d_weight_grad", gy, ggx, kernel_size=tuple(w.shape[-2:]), **attrs) \
        if need_w else None
    return (d_gy, d_w)


register(OpDef("conv2d_input_grad", CONTRACTION, ("grad_output", "weight"),
               _conv2d_input_grad_infer, _conv2d_input_grad_kernel, _conv2d_input_grad_vjp,
               attrs=dict(_CONV_ATTRS, input_hw=tuple), saved_inputs=(0, 1),
               doc="Gradient of conv2d w.r.t. its input: weight^T @ grad columns, then col2im."))


# ---- conv2d_weight_grad ----------------------------------------------------------------------
def _conv2d_weight_grad_infer(gy: TensorType, x: TensorType, *, stride, padding, dilation,
                              groups, kernel_size):
    op = "conv2d_weight_grad"
    _check_batched(op, gy, "grad_output")
    _check_batched(op, x, "input")
    _check_attrs(op, stride, padding, dilation, groups)
    _check_float_pair(op, gy, x, "grad_output", "input")
    out_ch, in_ch = gy.shape[-3], x.shape[-3]
    if gy.ndim != x.ndim or gy.shape[:-3] != x.shape[:-3]:
        raise ShapeError(
            f"{where(op)}: grad_output{format_size(gy.shape)} and "
            f"input{format_size(x.shape)} disagree "
            "on the batch dimension"
        )
    if in_ch % groups:
        raise ShapeError(
            f"{where(op)}: Given groups={groups}, expected input{format_size(x.shape)} to have a "
            f"channel count divisible by {groups}"
        )
    w_shape = (out_ch, in_ch // groups) + tuple(kernel_size)
    _check_weight(op, TensorType(w_shape, x.dtype), groups)
    out_hw = _check_input_fits(op, x.shape, w_shape, groups, stride, padding, dilation)
    if gy.shape[-2:] != out_hw:
        raise ShapeError(
            f"{where(op)}: expected grad_output of spatial size {list(out_hw)} for "
            f"input{format_size(x.shape)} and kernel {list(kernel_size)}, "
            f"got {format_size(gy.shape)}"
        )
    return TensorType(w_shape, x.dtype)


def _conv2d_weight_grad_kernel(gy, x, *, stride, padding, dilation, groups, kernel_size):
    gb, xb = _batched(gy), _batched(x)
    n, out_ch, ho, wo = gb.shape
    cols = _im2col(xb, kernel_size, (ho, wo), stride, padding, dilation, groups)
    g = gb.reshape(n, groups, out_ch // groups, ho * wo)
    gw = np.matmul(g, cols.transpose(0, 1, 3, 2)).sum(axis=0)  # (groups, O/groups, K)
    return gw.reshape((out_ch, xb.shape[1] // groups) + tuple(kernel_size))


def _conv2d_weight_grad_vjp(ctx, ggw):
    gy, x = ctx.inputs
    attrs = {k: ctx.attrs[k] for k in _CONV_ATTRS}
    need_gy, need_x = ctx.needs_input_grad
    d_gy = call("conv2d", x, ggw, **attrs) if need_gy else None
    d_x = call("conv2d_input_grad", gy, ggw, input_hw=tuple(x.shape[-2:]), **attrs) \
        if need_x else None
    return (d_gy, d_x)


register(OpDef("conv2d_weight_grad", CONTRACTION, ("grad_output", "input"),
               _conv2d_weight_grad_infer, _conv2d_weight_grad_kernel, _conv2d_weight_grad_vjp,
               attrs=dict(_CONV_ATTRS, kernel_size=tuple), saved_inputs=(0, 1),
               doc="Gradient of conv2d w.r.t. its weight: grad_output @ im2col(input)^T."))


# ---- public function -------------------------------------------------------------------------
def _pair(op: str, name: str, value) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value), int(value))
    if isinstance(value, (tuple, list)):
        if len(value) == 1:
            value = (value[0], value[0])
        if len(value) == 2 and all(isinstance(v, (int, np.integer)) for v in value):
            return (int(value[0]), int(value[1]))
    shown = list(value) if isinstance(value, (tuple, list)) else value
    raise ArgumentError(
        f"{where(op)}: expected {name} to be a single integer value or a list of 2 values to "
        f"match the convolution dimensions, but got {name}={shown}"
    )


def _same_padding(kernel_hw, dilation) -> tuple[tuple[int, int], tuple[int, int]]:
    """PyTorch's padding='same': total d*(k-1) per dim, the odd extra element on the right."""
    total = tuple(d * (k - 1) for k, d in zip(kernel_hw, dilation))
    left = tuple(t // 2 for t in total)
    return left, tuple(t - lo for t, lo in zip(total, left))


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution (cross-correlation) over an NCHW or CHW input, as torch's F.conv2d.

    >>> import graphc
    >>> x = graphc.ones(1, 1, 4, 4)
    >>> graphc.conv2d(x, graphc.ones(1, 1, 3, 3), padding=1).shape
    graphc.Size([1, 1, 4, 4])
    """
    op = "conv2d"
    if isinstance(getattr(input, "type", None), TensorType):  # non-tensors: dispatch says so
        _check_batched(op, input.type, "input")
    stride = _pair(op, "stride", stride)
    dilation = _pair(op, "dilation", dilation)
    extra = None
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0, 0)
        elif padding == "same":
            if stride != (1, 1):
                raise ArgumentError(
                    f"{where(op)}: padding='same' is not supported for strided convolutions")
            if weight.ndim == 4:
                padding, right = _same_padding(tuple(weight.shape[2:]), dilation)
                extra = tuple(r - lo for r, lo in zip(right, padding))
            else:
                padding = (0, 0)  # the weight check in the shape rule reports the problem
        else:
            raise ArgumentError(f"{where(op)}: Invalid padding string: {padding!r}")
    else:
        padding = _pair(op, "padding", padding)
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)):
        raise ArgumentError(f"{where(op)}: groups must be an int, got {groups!r}")
    if extra is not None and any(extra):
        # Even kernel extents under 'same': one more zero row/column at the bottom/right.
        pads = (0, 0) * (input.ndim - 2) + (0, extra[0], 0, extra[1])
        input = call("pad", input, pads=pads, value=0.0)
    out = call("conv2d", input, weight, stride=stride, padding=padding, dilation=dilation,
               groups=int(groups))
    if bias is not None:
        out_ch = weight.shape[0]
        if bias.ndim != 1 or bias.shape[0] != out_ch:
            raise ShapeError(
                f"{where(op)}: Given weight of size {format_size(weight.shape)}, "
                "expected bias to be "
                f"1-dimensional with {out_ch} elements, but got bias of size "
                f"{format_size(bias.shape)} instead"
            )
        if bias.dtype is not out.dtype:
            raise DTypeError(
                f"{where(op)}: Input type ({out.dtype.name}) and bias type ({bias.dtype.name}) "
                "should be the same"
            )
        out = out + call("reshape", bias, shape=(out_ch, 1, 1))
    return out


TENSOR_METHODS: dict = {}
PUBLIC: tuple = ("conv2d",)
