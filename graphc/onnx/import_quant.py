"""Import table, part 6: ONNX's integer quantization ops with 8- and 16-bit integer types.

graphc holds the integers in int64 (the narrow types widen on the way in), so the ops compute
exactly and saturate to the range of the type the graph declares for the zero point or the
output (`NodeContext.elem_type`); the backend casts outputs back to that type. Rounding is
half to even, as ONNX's. Float8, int4 and int2 values have no graphc tensor and are refused.
Integer matmuls and convolutions run in float64, exact for these magnitudes.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from graphc.ops.registry import call


def _scalar(x, value):
    return call("full", shape=(), value=float(value), dtype=x.dtype.name)


def _f64(ctx, x):
    x = ctx.tensor(x)
    return x if x.dtype.name == "float64" else call("cast", x, dtype="float64")


def _round_half_even(x):
    r = call("floor_divide", call("add", x, _scalar(x, 0.5)), _scalar(x, 1.0))
    tie = call("eq", call("sub", r, x), _scalar(x, 0.5))
    odd = call("ne", call("remainder", r, _scalar(x, 2)), _scalar(x, 0))
    return call("where", call("logical_and", tie, odd), call("sub", r, _scalar(x, 1)), r)


def _int_range(ctx, elem: int):
    if not elem:
        elem = TensorProto.UINT8
    np_type = helper.tensor_dtype_to_np_dtype(elem)
    if np_type.kind not in "iu" or np_type.itemsize > 4:
        raise ctx.refuse(f"quantized type {helper.tensor_dtype_to_string(elem)}")
    info = np.iinfo(np_type)
    return int(info.min), int(info.max)


def _along_axis(ctx, param, x, axis: int):
    """A per-tensor, per-axis or blocked quantization parameter broadcast against `x`."""
    if param.ndim == 0:
        return param
    axis = axis % x.ndim
    block = ctx.attr("block_size", 0)
    if block:
        index = ctx.tensor(np.arange(x.shape[axis]) // block)
        return call("take", param, index, axis=axis)
    shape = [1] * x.ndim
    shape[axis] = param.shape[0]
    return call("reshape", param, shape=tuple(shape))


def _saturate(ctx, y, elem):
    lo, hi = _int_range(ctx, elem)
    y = call("clamp", _round_half_even(y), min=float(lo), max=float(hi))
    return call("cast", y, dtype="int64")


def import_dequantize_linear(ctx, x, scale, zero_point=None):
    x, scale = ctx.tensor(x), ctx.tensor(scale)
    axis = ctx.attr("axis", 1)
    values = _f64(ctx, x)
    if zero_point is not None:
        values = call("sub", values, _along_axis(ctx, _f64(ctx, zero_point), x, axis))
    y = call("mul", values, _along_axis(ctx, _f64(ctx, scale), x, axis))
    return call("cast", y, dtype=scale.dtype.name)


def import_quantize_linear(ctx, x, scale, zero_point=None):
    x = ctx.tensor(x)
    axis = ctx.attr("axis", 1)
    elem = ctx.elem_type(ctx.node.input[2]) if zero_point is not None else 0
    elem = ctx.attr("output_dtype", 0) or elem or ctx.elem_type(ctx.node.output[0])
    scale = ctx.tensor(scale)  # divide in x's float type, as onnx's definition does
    y = _round_half_even(call("div", x, _along_axis(ctx, scale, x, axis)))
    if zero_point is not None:
        zp = call("cast", ctx.tensor(zero_point), dtype=x.dtype.name)
        y = call("add", y, _along_axis(ctx, zp, x, axis))
    return _saturate(ctx, y, elem)


def import_dynamic_quantize_linear(ctx, x):
    x = ctx.tensor(x)  # in x's own float type, as onnx's definition computes the scale
    axes = tuple(range(x.ndim))
    zero = _scalar(x, 0)
    low = call("minimum", call("reduce_min", x, axes=axes, keepdim=False), zero)
    high = call("maximum", call("reduce_max", x, axes=axes, keepdim=False), zero)
    scale = call("div", call("sub", high, low), _scalar(x, 255))
    zero_point = _saturate(ctx, call("neg", call("div", low, scale)), TensorProto.UINT8)
    y = call("add", _round_half_even(call("div", x, scale)), call("cast", zero_point,
                                                                 dtype=x.dtype.name))
    return _saturate(ctx, y, TensorProto.UINT8), scale, zero_point


def _shifted(ctx, x, zero_point):
    x = _f64(ctx, x)
    return x if zero_point is None else call("sub", x, _f64(ctx, zero_point))


def import_qlinear_matmul(ctx, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp=None):
    product = call("matmul", _shifted(ctx, a, a_zp), _shifted(ctx, b, b_zp))
    factor = call("div", call("mul", _f64(ctx, a_scale), _f64(ctx, b_scale)),
                  _f64(ctx, y_scale))
    y = call("mul", product, factor)
    if y_zp is not None:
        y = call("add", y, _f64(ctx, y_zp))
    elem = ctx.elem_type(ctx.node.input[7] if y_zp is not None else ctx.node.input[0])
    return _saturate(ctx, y, elem)


def import_matmul_integer(ctx, a, b, a_zp=None, b_zp=None):
    a_shifted = _f64(ctx, a)
    if a_zp is not None:
        zp = _f64(ctx, a_zp)
        if zp.ndim == 1 and a_shifted.ndim >= 2:  # one zero point per row of A
            zp = call("reshape", zp, shape=(zp.shape[0], 1))
        a_shifted = call("sub", a_shifted, zp)
    y = call("matmul", a_shifted, _shifted(ctx, b, b_zp))
    return call("cast", y, dtype="int64")


def import_conv_integer(ctx, x, w, x_zp=None, w_zp=None):
    from graphc.onnx.import_nn import import_conv

    x = _shifted(ctx, x, x_zp)
    w = _f64(ctx, w)
    if w_zp is not None:
        zp = _f64(ctx, w_zp)
        if zp.ndim == 1:  # one zero point per output channel
            zp = call("reshape", zp, shape=(zp.shape[0],) + (1,) * (w.ndim - 1))
        w = call("sub", w, zp)
    return call("cast", import_conv(ctx, x, w), dtype="int64")


QUANT_IMPORTERS = {
    "DequantizeLinear": import_dequantize_linear, "QuantizeLinear": import_quantize_linear,
    "DynamicQuantizeLinear": import_dynamic_quantize_linear,
    "QLinearMatMul": import_qlinear_matmul, "MatMulInteger": import_matmul_integer,
    "ConvInteger": import_conv_integer,
}
