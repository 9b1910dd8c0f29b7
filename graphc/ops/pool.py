"""2-D pooling: max_pool2d and avg_pool2d with their gradient ops, vectorised numpy.

Registry ops (kind POOL) and how they differentiate (with the movement ops gather/reshape
and scatter_add, the gather's VJP, the set closes, so any order works):

    max_pool2d(x)               -> (values, indices)  VJP: max_pool2d_grad(g, indices)
    max_pool2d_grad(g, indices) -> gx                 VJP: gather(ggx, indices) per H*W plane
    avg_pool2d(x)               -> y                  VJP: avg_pool2d_grad(g)
    avg_pool2d_grad(g)          -> gx                 VJP: avg_pool2d(ggx)

Invariants:
- Inputs are (N, C, H, W) or unbatched (C, H, W); every op keeps the leading dimensions and
  works on the last two.
- `indices` are int64 flat positions `row * W + col` inside each H*W plane, as PyTorch
  returns them; ties and NaN follow PyTorch's CPU kernel (the first maximum in row-major
  window order wins, a NaN wins over numbers), and a window of -inf points at its first
  in-bounds element.
- Output sizes follow PyTorch's `pooling_output_shape`, ceil_mode included: the last window
  must start inside the input or the left padding. Padding is at most half the kernel (with
  and without dilation, PyTorch's two checks), so no window lies entirely in the padding.
- Attributes are canonical: kernel_size, stride, padding, dilation are (h, w) int pairs; the
  gradient ops carry the input's spatial size as `input_hw`.
"""

from __future__ import annotations

import numpy as np

from graphc.errors import ArgumentError, DTypeError, ShapeError, where
from graphc.ops.registry import POOL, OpDef, call, register
from graphc.ops.shapes import format_size
from graphc.types import TensorType, int64

_MAX_ATTRS = {"kernel_size": tuple, "stride": tuple, "padding": tuple, "dilation": tuple,
              "ceil_mode": bool}
_AVG_ATTRS = {"kernel_size": tuple, "stride": tuple, "padding": tuple, "ceil_mode": bool,
              "count_include_pad": bool, "divisor_override": int}
_AVG_NAMES = tuple(_AVG_ATTRS)


# ---- shapes ----------------------------------------------------------------------------------
def pool_output_size(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling_output_shape for one dimension."""
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1  # the last window must start inside the input or the left padding
    return out


def _pool_shape(op: str, x: TensorType, kernel_size, stride, padding, dilation, ceil_mode):
    """PyTorch's pool2d_shape_check, in its order and wording; returns (H_out, W_out)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel_size, stride, padding, dilation
    if kh <= 0 or kw <= 0:
        raise ArgumentError(
            f"{where(op)}: kernel size should be greater than zero, but got kH: {kh} kW: {kw}")
    if sh <= 0 or sw <= 0:
        raise ArgumentError(
            f"{where(op)}: stride should be greater than zero, but got dH: {sh} dW: {sw}")
    if dh <= 0 or dw <= 0:
        raise ArgumentError(
            f"{where(op)}: dilation should be greater than zero, but got dilationH: {dh} "
            f"dilationW: {dw}")
    if ph < 0 or pw < 0:
        raise ArgumentError(f"{where(op)}: pad must be non-negative, but got pad: {min(ph, pw)}")
    if x.ndim not in (3, 4):
        raise ShapeError(
            f"{where(op)}: non-empty 3D or 4D (batch mode) tensor expected for input, but got "
            f"input of size {format_size(x.shape)}")
    if 0 in x.shape[-3:]:
        raise ShapeError(
            f"{where(op)}: Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size "
            f"for input, but got:{format_size(x.shape)}")
    for p, k, d in ((ph, kh, dh), (pw, kw, dw)):
        if p > (d * (k - 1) + 1) // 2:
            raise ArgumentError(
                f"{where(op)}: pad should be at most half of effective kernel size, but got "
                f"pad={p}, kernel_size={k} and dilation={d}")
    if ph > kh // 2 or pw > kw // 2:  # PyTorch checks the undilated kernel as well
        raise ArgumentError(
            f"{where(op)}: pad should be smaller than or equal to half of kernel size, but got "
            f"padW = {pw}, padH = {ph}, kW = {kw}, kH = {kh}")
    c, h, w = x.shape[-3:]
    ho = pool_output_size(h, kh, sh, ph, dh, ceil_mode)
    wo = pool_output_size(w, kw, sw, pw, dw, ceil_mode)
    if ho < 1 or wo < 1:
        raise ShapeError(
            f"{where(op)}: Given input size: ({c}x{h}x{w}). Calculated output size: "
            f"({c}x{ho}x{wo}). Output size is too small")
    return ho, wo


def _require_float(op: str, t: TensorType, what: str) -> None:
    if not t.dtype.is_floating:
        raise DTypeError(
            f"{where(op)}: expected a floating point {what} (float32 or float64), got "
            f"{t.dtype.name}; convert it with .float() or .double()")


def _check_grad_shape(op: str, g: TensorType, x_shape, out_hw) -> None:
    want = tuple(x_shape[:-2]) + tuple(out_hw)
    if g.shape != want:
        raise ShapeError(
            f"{where(op)}: expected grad_output of size {format_size(want)} for an input of size "
            f"{format_size(x_shape)}, got {format_size(g.shape)}")


# ---- numpy building blocks -------------------------------------------------------------------
def _planes(x: np.ndarray) -> np.ndarray:
    """View the leading dimensions as one: (B, H, W)."""
    return x.reshape((-1,) + x.shape[-2:])


def _offset_range(n: int, out: int, stride: int, start: int) -> tuple[slice, slice] | None:
    """Outputs o whose tap o*stride + start lies inside [0, n): their slice, and the taps'.

    Pooling then reads (or writes) the unpadded planes directly, one strided slice per kernel
    offset, and never builds a padded copy: padding only shrinks the range of windows a tap
    reaches.
    """
    lo = max(0, -(start // stride))  # ceil(-start / stride)
    hi = min(out, (n - 1 - start) // stride + 1)
    if hi <= lo:
        return None
    first = lo * stride + start
    return slice(lo, hi), slice(first, first + (hi - lo - 1) * stride + 1, stride)


def _taps(kernel_size, in_hw, out_hw, stride, padding, dilation):
    """For each kernel offset (i, j) that reaches the input: (i, j, out slices, in slices)."""
    for i in range(kernel_size[0]):
        rows = _offset_range(in_hw[0], out_hw[0], stride[0], i * dilation[0] - padding[0])
        if rows is None:
            continue
        for j in range(kernel_size[1]):
            cols = _offset_range(in_hw[1], out_hw[1], stride[1], j * dilation[1] - padding[1])
            if cols is not None:
                yield (i, j, (slice(None), rows[0], cols[0]), (slice(None), rows[1], cols[1]))


def _lowest(dtype) -> float | int:
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


# ---- max_pool2d ------------------------------------------------------------------------------
def _max_pool2d_infer(x: TensorType, *, kernel_size, stride, padding, dilation, ceil_mode):
    if x.dtype.name == "bool":
        raise DTypeError(f'{where("max_pool2d")}: "max_pool2d" not implemented for \'Bool\'')
    out_hw = _pool_shape("max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode)
    shape = x.shape[:-2] + out_hw
    return (TensorType(shape, x.dtype), TensorType(shape, int64))


def _max_pool2d_kernel(x, *, kernel_size, stride, padding, dilation, ceil_mode):
    h, w = x.shape[-2:]
    out_hw = tuple(pool_output_size(n, k, s, p, d, ceil_mode) for n, k, s, p, d in
                   zip((h, w), kernel_size, stride, padding, dilation))
    x3 = _planes(x)
    # One pass per kernel offset keeps the running maximum and the offset it came from; a
    # strict `>` keeps the first maximum, and a NaN always wins (PyTorch's CPU rule).
    has_nan = np.issubdtype(x.dtype, np.floating) and bool(np.isnan(x3).any())
    best = np.full((x3.shape[0],) + out_hw, _lowest(x.dtype), dtype=x.dtype)
    # The winning offset from each window's start, as a flat H*W distance (-1: none yet).
    offset = np.full(best.shape, -1, dtype=np.int32 if h * w < 2**31 else np.int64)
    better_buf = np.empty(best.shape, dtype=bool)
    # best = where(better, vals, best) and offset = where(better, tap, offset), branch-free
    # (a copy masked by data-dependent bits costs ten times as much: mispredicted branches):
    # old + better * (new - old) in integers, on the values' bit patterns (exact: the
    # integer arithmetic wraps around and back)
    bits = np.dtype(f"i{x.dtype.itemsize}")
    x_bits, best_bits = x3.view(bits), best.view(bits)
    best_step, offset_step = np.empty(best.shape, bits), np.empty(best.shape, offset.dtype)
    for i, j, out_sl, in_sl in _taps(kernel_size, (h, w), out_hw, stride, padding, dilation):
        vals, better = x3[in_sl], better_buf[out_sl]
        np.greater(vals, best[out_sl], out=better)
        if has_nan:
            better |= np.isnan(vals)
        _blend(best_bits[out_sl], x_bits[in_sl], better, best_step[out_sl])
        _blend(offset[out_sl], i * dilation[0] * w + j * dilation[1], better, offset_step[out_sl])
    # Flat index = window start + the winning offset. A window that never beat its initial
    # value (all -inf) points at its first in-bounds element, as PyTorch's maxindex starts.
    starts = [np.arange(o) * s - p for o, s, p in zip(out_hw, stride, padding)]
    unset = offset < 0
    index = offset.astype(np.int64)
    index += starts[0][:, None] * w + starts[1][None, :]
    if unset.any():
        firsts = [np.where(st < 0, st + (-st + d - 1) // d * d, st)
                  for st, d in zip(starts, dilation)]
        first = np.broadcast_to(firsts[0][:, None] * w + firsts[1][None, :], index.shape)
        index[unset] = first[unset]
    shape = x.shape[:-2] + out_hw
    return best.reshape(shape), index.reshape(shape)


def _blend(old: np.ndarray, new, better: np.ndarray, step: np.ndarray) -> None:
    """old[better] = new[better], in place, for integer arrays: old += better * (new - old)."""
    np.subtract(new, old, out=step)
    np.multiply(step, better, out=step)
    np.add(old, step, out=old)


def _max_pool2d_vjp(ctx, g, _g_indices):
    if g is None:
        return (None,)
    indices = ctx.outputs[1]
    return (call("max_pool2d_grad", g, indices, input_hw=tuple(ctx.input_types[0].shape[-2:])),)


register(OpDef("max_pool2d", POOL, ("input",), _max_pool2d_infer, _max_pool2d_kernel,
               _max_pool2d_vjp, attrs=dict(_MAX_ATTRS), saved_outputs=(1,),
               doc="2-D max pooling; returns the maxima and their flat H*W positions."))


# ---- max_pool2d_grad: scatter by indices -----------------------------------------------------
def _check_indices(op: str, t: TensorType, indices: TensorType) -> None:
    if indices.dtype is not int64:
        raise DTypeError(f"{where(op)}: expected indices of dtype int64, got "
                         f"{indices.dtype.name}")
    if indices.shape != t.shape or t.ndim not in (3, 4):
        raise ShapeError(
            f"{where(op)}: expected 3D or 4D grad_output and indices of the same size, got "
            f"{format_size(t.shape)} and {format_size(indices.shape)}")


def _max_pool2d_grad_infer(g: TensorType, indices: TensorType, *, input_hw):
    op = "max_pool2d_grad"
    _require_float(op, g, "grad_output")
    _check_indices(op, g, indices)
    return TensorType(g.shape[:-2] + tuple(input_hw), g.dtype)


def _max_pool2d_grad_kernel(g, indices, *, input_hw):
    plane = input_hw[0] * input_hw[1]
    g3, i3 = _planes(g), _planes(indices)
    b = g3.shape[0]
    flat = (i3.reshape(b, i3.shape[1] * i3.shape[2]) + (np.arange(b) * plane)[:, None]).ravel()
    out = np.bincount(flat, weights=g3.ravel(), minlength=b * plane)
    return out.astype(g.dtype, copy=False).reshape(g.shape[:-2] + tuple(input_hw))


def _max_pool2d_grad_vjp(ctx, gg):
    # The transpose of a scatter by indices is a gather by the same indices (per H*W plane).
    indices = ctx.inputs[1]
    lead = tuple(indices.shape[:-2])
    planes = call("reshape", gg, shape=lead + (gg.shape[-2] * gg.shape[-1],))
    flat = call("reshape", indices, shape=lead + (indices.shape[-2] * indices.shape[-1],))
    picked = call("gather", planes, flat, axis=len(lead))
    return (call("reshape", picked, shape=tuple(indices.shape)), None)


register(OpDef("max_pool2d_grad", POOL, ("grad_output", "indices"), _max_pool2d_grad_infer,
               _max_pool2d_grad_kernel, _max_pool2d_grad_vjp, attrs={"input_hw": tuple},
               saved_inputs=(1,),
               doc="Gradient of max_pool2d: grad_output scattered (added) at the indices."))


# ---- avg_pool2d ------------------------------------------------------------------------------
def _avg_pool2d_infer(x: TensorType, *, kernel_size, stride, padding, ceil_mode,
                      count_include_pad, divisor_override):
    op = "avg_pool2d"
    _require_float(op, x, "input")
    if divisor_override is not None and divisor_override == 0:
        raise ArgumentError(f"{where(op)}: divisor must be not zero")
    out_hw = _pool_shape(op, x, kernel_size, stride, padding, (1, 1), ceil_mode)
    return TensorType(x.shape[:-2] + out_hw, x.dtype)


def _avg_divisor(in_hw, out_hw, kernel_size, stride, padding, count_include_pad,
                 divisor_override, dtype) -> np.ndarray | float:
    """The (H_out, W_out) divisor of each window, as PyTorch's CPU kernel computes it."""
    if divisor_override is not None:
        return float(divisor_override)
    sizes = []
    for n, o, k, s, p in zip(in_hw, out_hw, kernel_size, stride, padding):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, n + p)  # windows may reach past the padding (ceil_mode)
        if count_include_pad:
            sizes.append(end - start)
        else:
            sizes.append(np.minimum(end, n) - np.maximum(start, 0))
    return (sizes[0][:, None] * sizes[1][None, :]).astype(dtype)


def _avg_pool2d_kernel(x, *, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override):
    in_hw = x.shape[-2:]
    out_hw = tuple(pool_output_size(n, k, s, p, 1, ceil_mode)
                   for n, k, s, p in zip(in_hw, kernel_size, stride, padding))
    x3 = _planes(x)
    total = np.zeros((x3.shape[0],) + out_hw, dtype=x.dtype)
    for _, _, out_sl, in_sl in _taps(kernel_size, in_hw, out_hw, stride, padding, (1, 1)):
        total[out_sl] += x3[in_sl]
    total /= _avg_divisor(in_hw, out_hw, kernel_size, stride, padding, count_include_pad,
                          divisor_override, x.dtype)
    return total.reshape(x.shape[:-2] + out_hw)


def _avg_pool2d_vjp(ctx, g):
    input_hw = tuple(ctx.input_types[0].shape[-2:])
    return (call("avg_pool2d_grad", g, input_hw=input_hw, **ctx.attrs),)


register(OpDef("avg_pool2d", POOL, ("input",), _avg_pool2d_infer, _avg_pool2d_kernel,
               _avg_pool2d_vjp, attrs=dict(_AVG_ATTRS),
               doc="2-D average pooling (PyTorch's divisor rules, ceil_mode, overrides)."))


# ---- avg_pool2d_grad -------------------------------------------------------------------------
def _avg_pool2d_grad_infer(g: TensorType, *, input_hw, kernel_size, stride, padding, ceil_mode,
                           count_include_pad, divisor_override):
    op = "avg_pool2d_grad"
    _require_float(op, g, "grad_output")
    if g.ndim not in (3, 4):
        raise ShapeError(
            f"{where(op)}: expected a 3D or 4D grad_output, got {format_size(g.shape)}")
    x_shape = g.shape[:-2] + tuple(input_hw)
    out_hw = _pool_shape(op, TensorType(x_shape, g.dtype), kernel_size, stride, padding, (1, 1),
                         ceil_mode)
    _check_grad_shape(op, g, x_shape, out_hw)
    return TensorType(x_shape, g.dtype)


def _avg_pool2d_grad_kernel(g, *, input_hw, kernel_size, stride, padding, ceil_mode,
                            count_include_pad, divisor_override):
    out_hw = g.shape[-2:]
    g3 = _planes(g) / _avg_divisor(input_hw, out_hw, kernel_size, stride, padding,
                                   count_include_pad, divisor_override, g.dtype)
    out = np.zeros((g3.shape[0],) + tuple(input_hw), dtype=g.dtype)
    for _, _, out_sl, in_sl in _taps(kernel_size, input_hw, out_hw, stride, padding, (1, 1)):
        out[in_sl] += g3[out_sl]
    return out.reshape(g.shape[:-2] + tuple(input_hw))


def _avg_pool2d_grad_vjp(ctx, gg):
    return (call("avg_pool2d", gg, **{k: ctx.attrs[k] for k in _AVG_NAMES}),)


register(OpDef("avg_pool2d_grad", POOL, ("grad_output",), _avg_pool2d_grad_infer,
               _avg_pool2d_grad_kernel, _avg_pool2d_grad_vjp,
               attrs=dict(_AVG_ATTRS, input_hw=tuple),
               doc="Gradient of avg_pool2d: grad_output / divisor spread over each window."))


# ---- public functions ------------------------------------------------------------------------
def _pair(op: str, name: str, value) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value), int(value))
    if isinstance(value, (tuple, list)) and len(value) in (1, 2) \
            and all(isinstance(v, (int, np.integer)) for v in value):
        return (int(value[0]), int(value[-1]))
    raise ArgumentError(
        f"{where(op)}: {name} must either be a single int, or a tuple of two ints")


def _stride(op: str, stride, kernel_size) -> tuple[int, int]:
    if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0):
        return kernel_size
    stride = _pair(op, "stride", stride)
    if 0 in stride:
        raise ArgumentError(f"{where(op)}: stride should not be zero")
    return stride


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """2-D max pooling over an NCHW or CHW input, as torch's F.max_pool2d.

    >>> import graphc
    >>> graphc.max_pool2d(graphc.arange(16.0).reshape(1, 1, 4, 4), 2).tolist()
    [[[[5.0, 7.0], [13.0, 15.0]]]]
    """
    op = "max_pool2d"
    kernel_size = _pair(op, "kernel_size", kernel_size)
    values, indices = call("max_pool2d", input, kernel_size=kernel_size,
                           stride=_stride(op, stride, kernel_size),
                           padding=_pair(op, "padding", padding),
                           dilation=_pair(op, "dilation", dilation), ceil_mode=bool(ceil_mode))
    return (values, indices) if return_indices else values


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """2-D average pooling over an NCHW or CHW input, as torch's F.avg_pool2d.

    >>> import graphc
    >>> graphc.avg_pool2d(graphc.arange(16.0).reshape(1, 1, 4, 4), 2).tolist()
    [[[[2.5, 4.5], [10.5, 12.5]]]]
    """
    op = "avg_pool2d"
    kernel_size = _pair(op, "kernel_size", kernel_size)
    if divisor_override is not None:
        if isinstance(divisor_override, bool) or not isinstance(divisor_override,
                                                                (int, np.integer)):
            raise ArgumentError(f"{where(op)}: divisor_override must be an int or None, got "
                                f"{divisor_override!r}")
        divisor_override = int(divisor_override)
    return call("avg_pool2d", input, kernel_size=kernel_size,
                stride=_stride(op, stride, kernel_size), padding=_pair(op, "padding", padding),
                ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad),
                divisor_override=divisor_override)


TENSOR_METHODS: dict = {}
PUBLIC: tuple = ("max_pool2d", "avg_pool2d")
