"""Import table, part 2: ONNX contractions, convolution, pooling, normalisation, softmax.

Convolutions and pools of 1 or 2 spatial dims map to the registry's conv2d / max_pool2d /
avg_pool2d (1-D ones with a unit height). Padding the registry op cannot express (asymmetric
pads, `auto_pad=SAME_*`, more than half the kernel) becomes an explicit `pad` of the input
first: zeros for Conv, -inf for MaxPool; AveragePool without `count_include_pad` divides by a
pooled mask of ones, so the count is ONNX's. Normalisations are written with reductions.
"""

from __future__ import annotations

import math

import numpy as np

from graphc.ops.registry import call
from graphc.utils.composites import cumsum, einsum, topk, tril, triu


def _t(ctx, x):
    return ctx.tensor(x)


def _scalar(x, value):
    return call("full", shape=(), value=float(value), dtype=x.dtype.name)


def _spatial(ctx, x, kernel, default_dilation=1):
    """Strides, dilations and (begin, end) pads per spatial dim, auto_pad resolved."""
    n = len(kernel)
    strides = list(ctx.attr("strides", [1] * n))
    dilations = list(ctx.attr("dilations", [default_dilation] * n))
    pads = list(ctx.attr("pads", [0] * (2 * n)))
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    begin, end = pads[:n], pads[n:]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(n):
            size = x.shape[2 + i]
            out = -(-size // strides[i])
            total = max((out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - size, 0)
            small = total // 2
            begin[i], end[i] = (small, total - small) if auto_pad == "SAME_UPPER" else \
                (total - small, small)
    elif auto_pad == "VALID":
        begin, end = [0] * n, [0] * n
    return strides, dilations, begin, end


def _pad_spatial(x, begin, end, value):
    pads = [0, 0, 0, 0]
    for b, e in zip(begin, end):
        pads += [b, e]
    return call("pad", x, pads=tuple(pads), value=float(value))


def _to_2d(ctx, x, nspatial):
    if nspatial == 2:
        return x
    if nspatial == 1:
        return call("reshape", x, shape=(*x.shape[:2], 1, x.shape[2]))
    raise ctx.refuse(f"{nspatial} spatial dimensions (graphc maps 1 and 2)")


def _pair(values, nspatial, fill):
    return tuple(values) if nspatial == 2 else (fill, *values)


def _conv3d(ctx, x, w, strides, dilations, begin, end):
    """A 3-D convolution as one conv2d per kernel depth, the output depths folded into the
    batch: y[:, :, o] = sum_k conv2d(x[:, :, o * stride + k * dilation], w[:, :, k])."""
    x = _pad_spatial(x, begin, end, 0.0)
    n, c, depth, h, wd = x.shape
    (sd, sh, sw), (dd, dh, dw) = strides, dilations
    k_depth = w.shape[2]
    out_depth = (depth - ((k_depth - 1) * dd + 1)) // sd + 1
    total = None
    for k in range(k_depth):
        lo = k * dd
        part = call("slice", x, starts=(0, 0, lo, 0, 0),
                    stops=(n, c, lo + sd * (out_depth - 1) + 1, h, wd), steps=(1, 1, sd, 1, 1))
        part = call("reshape", call("permute", part, dims=(0, 2, 1, 3, 4)),
                    shape=(n * out_depth, c, h, wd))
        wk = call("slice", w, starts=(0, 0, k, 0, 0), stops=(w.shape[0], w.shape[1], k + 1,
                                                                 *w.shape[3:]), steps=(1,) * 5)
        wk = call("reshape", wk, shape=(w.shape[0], w.shape[1], *w.shape[3:]))
        y = call("conv2d", part, wk, stride=(sh, sw), padding=(0, 0), dilation=(dh, dw),
                 groups=ctx.attr("group", 1))
        total = y if total is None else call("add", total, y)
    total = call("reshape", total, shape=(n, out_depth, *total.shape[1:]))
    return call("permute", total, dims=(0, 2, 1, 3, 4))


def import_conv(ctx, x, w, b=None):
    x, w = _t(ctx, x), _t(ctx, w)
    ns = x.ndim - 2
    kernel = list(ctx.attr("kernel_shape", w.shape[2:]))
    strides, dilations, begin, end = _spatial(ctx, x, kernel)
    if ns == 3:
        y = _conv3d(ctx, x, w, strides, dilations, begin, end)
        if b is not None:
            y = call("add", y, call("reshape", _t(ctx, b), shape=(y.shape[1], 1, 1, 1)))
        return y
    x2, w2 = _to_2d(ctx, x, ns), _to_2d(ctx, w, ns)
    if begin != end:
        x2 = _pad_spatial(x2, _pair(begin, ns, 0), _pair(end, ns, 0), 0.0)
        begin = [0] * ns
    y = call("conv2d", x2, w2, stride=_pair(strides, ns, 1), padding=_pair(begin, ns, 0),
             dilation=_pair(dilations, ns, 1), groups=ctx.attr("group", 1))
    if b is not None:
        y = call("add", y, call("reshape", _t(ctx, b), shape=(y.shape[1], 1, 1)))
    return y if ns == 2 else call("reshape", y, shape=(*y.shape[:2], y.shape[3]))


def import_conv_transpose(ctx, x, w, b=None):
    x, w = _t(ctx, x), _t(ctx, w)
    ns = x.ndim - 2
    kernel = list(ctx.attr("kernel_shape", w.shape[2:]))
    strides = list(ctx.attr("strides", [1] * ns))
    dilations = list(ctx.attr("dilations", [1] * ns))
    extra = list(ctx.attr("output_padding", [0] * ns))
    full = [s * (n - 1) + e + (k - 1) * d + 1 for s, n, e, k, d in
            zip(strides, x.shape[2:], extra, kernel, dilations)]
    pads = list(ctx.attr("pads", [0] * (2 * ns)))
    begin, end = pads[:ns], pads[ns:]
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    out_shape = ctx.attr("output_shape")
    if out_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        wanted = (list(out_shape)[-ns:] if out_shape is not None
                  else [n * s for n, s in zip(x.shape[2:], strides)])
        full = [max(f, o) for f, o in zip(full, wanted)]  # a larger output: output padding
        total = [f - o for f, o in zip(full, wanted)]
        if auto_pad == "SAME_UPPER":
            begin, end = [t // 2 for t in total], [t - t // 2 for t in total]
        else:
            begin, end = [t - t // 2 for t in total], [t // 2 for t in total]
    x2, w2 = _to_2d(ctx, x, ns), _to_2d(ctx, w, ns)
    y = call("conv2d_input_grad", x2, w2, stride=_pair(strides, ns, 1), padding=(0, 0),
             dilation=_pair(dilations, ns, 1), groups=ctx.attr("group", 1),
             input_hw=_pair(full, ns, 1))
    if any(begin) or any(end):
        starts = (0, 0) + _pair(begin, ns, 0)
        stops = tuple(y.shape[:2]) + tuple(f - e for f, e in zip(_pair(full, ns, 1),
                                                                 _pair(end, ns, 0)))
        y = call("slice", y, starts=starts, stops=stops, steps=(1, 1, 1, 1))
    if b is not None:
        y = call("add", y, call("reshape", _t(ctx, b), shape=(y.shape[1], 1, 1)))
    return y if ns == 2 else call("reshape", y, shape=(*y.shape[:2], y.shape[3]))


def _separable_3d(pool):
    """A 3-D pool as two 2-D ones (max, average and Lp pooling are separable: the window is
    a product of per-axis windows, and so is the count of valid elements): over (H, W) with
    depth folded into channels, then over depth with H*W as the width."""
    def run(ctx, x):
        x = _t(ctx, x)
        if x.ndim != 5:
            return pool(ctx, x)
        if ctx.wants(1):
            raise ctx.refuse("the Indices output of a 3-D MaxPool")
        kernel = list(ctx.attr("kernel_shape"))
        strides, dilations, begin, end = _spatial(ctx, x, kernel)
        n, c, depth = x.shape[:3]
        planes = ctx.with_attrs(kernel_shape=kernel[1:], strides=strides[1:],
                                dilations=dilations[1:], pads=begin[1:] + end[1:],
                                auto_pad="NOTSET")
        y = pool(planes, call("reshape", x, shape=(n, c * depth, *x.shape[3:])))
        h, w = y.shape[2:]
        y = call("reshape", y, shape=(n, c, depth, h * w))
        depths = ctx.with_attrs(kernel_shape=[kernel[0], 1], strides=[strides[0], 1],
                                dilations=[dilations[0], 1], pads=[begin[0], 0, end[0], 0],
                                auto_pad="NOTSET")
        y = pool(depths, y)
        return call("reshape", y, shape=(n, c, y.shape[2], h, w))

    run.__name__ = f"{pool.__name__}_3d"
    return run


def _pool_setup(ctx, x):
    ns = x.ndim - 2
    kernel = list(ctx.attr("kernel_shape"))
    strides, dilations, begin, end = _spatial(ctx, x, kernel)
    return ns, kernel, strides, dilations, begin, end


def import_max_pool(ctx, x):
    x = _t(ctx, x)
    ns, kernel, strides, dilations, begin, end = _pool_setup(ctx, x)
    x2 = _to_2d(ctx, x, ns)
    h, w = x2.shape[2:]
    fits = all(b == e and 2 * b <= (k - 1) * d + 1
               for b, e, k, d in zip(begin, end, kernel, dilations))
    shift = (0, 0)
    if not fits:
        x2 = _pad_spatial(x2, _pair(begin, ns, 0), _pair(end, ns, 0), -math.inf)
        shift, begin = _pair(begin, ns, 0), [0] * ns
    y, idx = call("max_pool2d", x2, kernel_size=_pair(kernel, ns, 1),
                  stride=_pair(strides, ns, 1), padding=_pair(begin, ns, 0),
                  dilation=_pair(dilations, ns, 1), ceil_mode=bool(ctx.attr("ceil_mode", 0)))
    if ns == 1:
        y = call("reshape", y, shape=(*y.shape[:2], y.shape[3]))
    if not ctx.wants(1):
        return y
    return y, _onnx_indices(ctx, idx, x2.shape[3], shift, h, w, ns)


def _onnx_indices(ctx, idx, padded_w, shift, h, w, ns):
    """graphc's indices (row * W + col in the pooled plane) as ONNX's: offsets into the
    whole unpadded N x C x H x W tensor, row-major (or column-major, storage_order=1)."""
    def const(v):
        return call("full", shape=(), value=int(v), dtype="int64")

    row = call("sub", call("floor_divide", idx, const(padded_w)), const(shift[0]))
    col = call("sub", call("remainder", idx, const(padded_w)), const(shift[1]))
    if ctx.attr("storage_order", 0):
        flat = call("add", call("mul", col, const(h)), row)
    else:
        flat = call("add", call("mul", row, const(w)), col)
    n, c = idx.shape[:2]
    planes = call("arange", start=0.0, end=float(n * c), step=1.0, dtype="int64")
    planes = call("mul", call("reshape", planes, shape=(n, c, 1, 1)), const(h * w))
    flat = call("add", flat, planes)
    return flat if ns == 2 else call("reshape", flat, shape=(n, c, flat.shape[3]))


def _window_sums(x2, kernel, strides, dilations, begin, end, ceil_mode, include_pad):
    """(sum, count) of every pooling window of a 2-D input by strided slices, one per kernel
    offset (pools with dilations: graphc's avg_pool2d has none). `count` is the number of
    elements each window covers in the input (with its pads, where `include_pad`); windows
    ceil_mode adds past the padded input count nothing there."""
    n, c = x2.shape[:2]
    sizes = list(x2.shape[2:])
    padded = [sz + b + e for sz, b, e in zip(sizes, begin, end)]
    outs, extra = [], []
    for p, k, st, d, b, sz in zip(padded, kernel, strides, dilations, begin, sizes):
        span = (k - 1) * d + 1
        out = (p - span) // st + 1
        if ceil_mode and (p - span) % st and out * st < sz + b:
            out += 1  # a last, partial window that starts inside the input or left pad
        outs.append(out)
        extra.append(max(0, (out - 1) * st + span - p))
    ones = call("full", shape=tuple(x2.shape), value=1.0, dtype=x2.dtype.name)
    grow = [e + x for e, x in zip(end, extra)]
    data = _pad_spatial(x2, begin, grow, 0.0)
    if include_pad:
        mask = _pad_spatial(_pad_spatial(ones, begin, end, 1.0), [0, 0], extra, 0.0)
    else:
        mask = _pad_spatial(ones, begin, grow, 0.0)
    total = count = None
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            starts = (0, 0, i * dilations[0], j * dilations[1])
            stops = (n, c, starts[2] + strides[0] * (outs[0] - 1) + 1,
                     starts[3] + strides[1] * (outs[1] - 1) + 1)
            steps = (1, 1, strides[0], strides[1])
            part = call("slice", data, starts=starts, stops=stops, steps=steps)
            seen = call("slice", mask, starts=starts, stops=stops, steps=steps)
            total = part if total is None else call("add", total, part)
            count = seen if count is None else call("add", count, seen)
    return total, count


def import_average_pool(ctx, x):
    x = _t(ctx, x)
    ns, kernel, strides, dilations, begin, end = _pool_setup(ctx, x)
    if any(d != 1 for d in dilations):
        x2 = _to_2d(ctx, x, ns)
        total, count = _window_sums(x2, _pair(kernel, ns, 1), _pair(strides, ns, 1),
                                    _pair(dilations, ns, 1), _pair(begin, ns, 0),
                                    _pair(end, ns, 0), bool(ctx.attr("ceil_mode", 0)),
                                    bool(ctx.attr("count_include_pad", 0)))
        y = call("div", total, count)
        return y if ns == 2 else call("reshape", y, shape=(*y.shape[:2], y.shape[3]))
    x2 = _to_2d(ctx, x, ns)
    attrs = dict(kernel_size=_pair(kernel, ns, 1), stride=_pair(strides, ns, 1),
                 ceil_mode=bool(ctx.attr("ceil_mode", 0)), divisor_override=None)
    include = bool(ctx.attr("count_include_pad", 0))
    fits = all(b == e and 2 * b <= k for b, e, k in zip(begin, end, kernel))
    if fits:
        y = call("avg_pool2d", x2, padding=_pair(begin, ns, 0), count_include_pad=include,
                 **attrs)
    else:
        padded = _pad_spatial(x2, _pair(begin, ns, 0), _pair(end, ns, 0), 0.0)
        y = call("avg_pool2d", padded, padding=(0, 0), count_include_pad=True, **attrs)
        if not include:
            ones = call("full", shape=tuple(x2.shape), value=1.0, dtype=x2.dtype.name)
            mask = _pad_spatial(ones, _pair(begin, ns, 0), _pair(end, ns, 0), 0.0)
            y = call("div", y, call("avg_pool2d", mask, padding=(0, 0), count_include_pad=True,
                                    **attrs))
    return y if ns == 2 else call("reshape", y, shape=(*y.shape[:2], y.shape[3]))


def import_lp_pool(ctx, x):
    x = _t(ctx, x)
    ns, kernel, strides, dilations, begin, end = _pool_setup(ctx, x)
    p = ctx.attr("p", 2)
    x2 = call("pow", call("abs", _to_2d(ctx, x, ns)), _scalar(x, p))
    if any(d != 1 for d in dilations):
        total, _ = _window_sums(x2, _pair(kernel, ns, 1), _pair(strides, ns, 1),
                                _pair(dilations, ns, 1), _pair(begin, ns, 0),
                                _pair(end, ns, 0), bool(ctx.attr("ceil_mode", 0)), True)
    else:
        padded = _pad_spatial(x2, _pair(begin, ns, 0), _pair(end, ns, 0), 0.0)
        total = call("avg_pool2d", padded, kernel_size=_pair(kernel, ns, 1),
                     stride=_pair(strides, ns, 1), padding=(0, 0),
                     ceil_mode=bool(ctx.attr("ceil_mode", 0)), count_include_pad=True,
                     divisor_override=1)
    y = call("pow", total, _scalar(x, 1.0 / p))
    return y if ns == 2 else call("reshape", y, shape=(*y.shape[:2], y.shape[3]))


def _global(op: str):
    def run(ctx, x):
        x = _t(ctx, x)
        return call(op, x, axes=tuple(range(2, x.ndim)), keepdim=True)

    run.__name__ = f"import_global_{op}"
    return run


def _channel_shape(x):
    return (x.shape[1],) + (1,) * (x.ndim - 2)


def import_batch_norm(ctx, x, scale, bias, mean, var):
    if ctx.attr("training_mode", 0) or any(ctx.wants(i) for i in (1, 2)):
        raise ctx.refuse("training_mode (graphc imports inference graphs)")
    x = _t(ctx, x)
    shape = _channel_shape(x)
    scale, bias, mean, var = (call("reshape", _t(ctx, p), shape=shape)
                              for p in (scale, bias, mean, var))
    inv = call("rsqrt", call("add", var, _scalar(var, ctx.attr("epsilon", 1e-5))))
    return call("add", call("mul", call("mul", call("sub", x, mean), inv), scale), bias)


def _normalize(x, axes, eps):
    mean = call("reduce_mean", x, axes=axes, keepdim=True)
    centred = call("sub", x, mean)
    var = call("reduce_mean", call("mul", centred, centred), axes=axes, keepdim=True)
    inv = call("rsqrt", call("add", var, _scalar(var, eps)))
    return call("mul", centred, inv), mean, inv


def import_instance_norm(ctx, x, scale, bias):
    x = _t(ctx, x)
    y, _, _ = _normalize(x, tuple(range(2, x.ndim)), ctx.attr("epsilon", 1e-5))
    shape = _channel_shape(x)
    return call("add", call("mul", y, call("reshape", _t(ctx, scale), shape=shape)),
                call("reshape", _t(ctx, bias), shape=shape))


def import_layer_norm(ctx, x, scale, bias=None):
    x = _t(ctx, x)
    axis = ctx.attr("axis", -1) % x.ndim
    y, mean, inv = _normalize(x, tuple(range(axis, x.ndim)), ctx.attr("epsilon", 1e-5))
    y = call("mul", y, _t(ctx, scale))
    if bias is not None:
        y = call("add", y, _t(ctx, bias))
    return y, mean, inv


def import_rms_norm(ctx, x, scale):
    x = _t(ctx, x)
    axis = ctx.attr("axis", -1) % x.ndim
    axes = tuple(range(axis, x.ndim))
    ms = call("reduce_mean", call("mul", x, x), axes=axes, keepdim=True)
    inv = call("rsqrt", call("add", ms, _scalar(ms, ctx.attr("epsilon", 1e-5))))
    return call("mul", call("mul", x, inv), _t(ctx, scale))


def import_lp_norm(ctx, x):
    x = _t(ctx, x)
    axis, p = ctx.attr("axis", -1) % x.ndim, ctx.attr("p", 2)
    if p == 1:
        norm = call("reduce_sum", call("abs", x), axes=(axis,), keepdim=True)
    else:
        norm = call("sqrt", call("reduce_sum", call("mul", x, x), axes=(axis,), keepdim=True))
    safe = call("where", call("eq", norm, _scalar(norm, 0)), _scalar(norm, 1), norm)
    return call("div", x, safe)


def import_one_hot(ctx, indices, depth, values):
    indices = _t(ctx, indices)
    depth = int(np.ravel(ctx.static(depth, "depth"))[0])
    values = _t(ctx, values)
    axis = ctx.attr("axis", -1)
    axis = axis + indices.ndim + 1 if axis < 0 else axis
    idx = call("cast", indices, dtype="int64") if indices.dtype.name != "int64" else indices
    idx = call("where", call("lt", idx, 0), call("add", idx, depth), idx)
    shape = list(idx.shape)
    shape.insert(axis, 1)
    idx = call("reshape", idx, shape=tuple(shape))
    positions = call("arange", start=0.0, end=float(depth), step=1.0, dtype="int64")
    positions = call("reshape", positions, shape=tuple(depth if i == axis else 1
                                                       for i in range(len(shape))))
    off = call("take", values, call("full", shape=(), value=0, dtype="int64"), axis=0)
    on = call("take", values, call("full", shape=(), value=1, dtype="int64"), axis=0)
    return call("where", call("eq", positions, idx), on, off)


def import_group_norm(ctx, x, scale, bias):
    x = _t(ctx, x)
    groups = ctx.attr("num_groups")
    n, c = x.shape[0], x.shape[1]
    grouped = call("reshape", x, shape=(n, groups, int(np.prod(x.shape[1:])) // groups))
    y, _, _ = _normalize(grouped, (2,), ctx.attr("epsilon", 1e-5))
    y = call("reshape", y, shape=tuple(x.shape))
    scale, bias = _t(ctx, scale), _t(ctx, bias)
    if scale.shape[0] != c:  # opset 18's per-group scale and bias
        scale = call("reshape", call("broadcast_to", call("reshape", scale, shape=(groups, 1)),
                                     shape=(groups, c // groups)), shape=(c,))
        bias = call("reshape", call("broadcast_to", call("reshape", bias, shape=(groups, 1)),
                                    shape=(groups, c // groups)), shape=(c,))
    shape = _channel_shape(x)
    return call("add", call("mul", y, call("reshape", scale, shape=shape)),
                call("reshape", bias, shape=shape))


def import_mvn(ctx, x):
    x = _t(ctx, x)
    axes = tuple(sorted(a % x.ndim for a in ctx.attr("axes", [0, 2, 3])))
    mean = call("reduce_mean", x, axes=axes, keepdim=True)
    centred = call("sub", x, mean)
    var = call("reduce_mean", call("mul", centred, centred), axes=axes, keepdim=True)
    return call("div", centred, call("add", call("sqrt", var), _scalar(var, 1e-9)))


def _softmax(op: str):
    def run(ctx, x):
        x = _t(ctx, x)
        if ctx.opset >= 13:
            return call(op, x, dim=ctx.attr("axis", -1) % max(x.ndim, 1))
        axis = ctx.attr("axis", 1) % max(x.ndim, 1)
        rows = int(np.prod(x.shape[:axis], dtype=np.int64))
        flat = call("reshape", x, shape=(rows, int(np.prod(x.shape[axis:], dtype=np.int64))))
        return call("reshape", call(op, flat, dim=1), shape=tuple(x.shape))

    run.__name__ = f"import_{op}"
    return run


def import_hardmax(ctx, x):
    x = _t(ctx, x)
    axis = ctx.attr("axis", -1 if ctx.opset >= 13 else 1) % max(x.ndim, 1)
    if ctx.opset < 13:
        shape = tuple(x.shape)
        x = call("reshape", x, shape=(int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))))
        axis = 1
    else:
        shape = None
    idx = call("argmax", x, axis=axis, keepdim=True)
    positions = call("arange", start=0.0, end=float(x.shape[axis]), step=1.0, dtype="int64")
    positions = call("reshape", positions, shape=tuple(x.shape[axis] if i == axis else 1
                                                       for i in range(x.ndim)))
    y = call("cast", call("eq", positions, idx), dtype=x.dtype.name)
    return y if shape is None else call("reshape", y, shape=shape)


def import_matmul(ctx, a, b):
    return call("matmul", _t(ctx, a), _t(ctx, b))


def import_gemm(ctx, a, b, c=None):
    a, b = _t(ctx, a), _t(ctx, b)
    if ctx.attr("transA", 0):
        a = call("permute", a, dims=(1, 0))
    if ctx.attr("transB", 0):
        b = call("permute", b, dims=(1, 0))
    y = call("matmul", a, b)
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    if alpha != 1.0:
        y = call("mul", y, _scalar(y, alpha))
    if c is not None:
        c = _t(ctx, c)
        y = call("add", y, c if beta == 1.0 else call("mul", c, _scalar(c, beta)))
    return y


def import_lrn(ctx, x):
    x = _t(ctx, x)
    size = ctx.attr("size")
    alpha, beta, bias = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    sq = call("mul", x, x)
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    pads = [0, 0, before, after] + [0, 0] * (x.ndim - 2)
    padded = call("pad", sq, pads=tuple(pads), value=0.0)
    c = x.shape[1]
    total = None
    for i in range(size):
        starts = tuple(i if d == 1 else 0 for d in range(x.ndim))
        stops = tuple(i + c if d == 1 else x.shape[d] for d in range(x.ndim))
        part = call("slice", padded, starts=starts, stops=stops, steps=(1,) * x.ndim)
        total = part if total is None else call("add", total, part)
    denom = call("add", _scalar(x, bias), call("mul", total, _scalar(x, alpha / size)))
    return call("div", x, call("pow", denom, _scalar(x, beta)))


def import_dropout(ctx, x, ratio=None, training=None):
    if training is not None and bool(np.all(ctx.static(training, "training_mode"))):
        raise ctx.refuse("training_mode=True (graphc imports inference graphs)")
    x = _t(ctx, x)
    y = call("copy", x)
    if ctx.wants(1):
        return y, call("full", shape=tuple(x.shape), value=1.0, dtype="bool")
    return y


def import_einsum(ctx, *xs):
    equation = ctx.attr("equation").replace(" ", "")
    for operand in equation.split("->")[0].split(","):
        letters = operand.replace("...", "")
        if len(set(letters)) != len(letters):
            raise ctx.refuse(f"a subscript repeated within one operand ({operand!r}: a diagonal)")
    return einsum(ctx.attr("equation"), *(_t(ctx, x) for x in xs))


def import_topk(ctx, x, k):
    x = _t(ctx, x)
    k = int(np.ravel(ctx.static(k, "k"))[0])
    axis = ctx.attr("axis", -1) % x.ndim
    return topk(x, k, dim=axis, largest=bool(ctx.attr("largest", 1)),
                sorted=bool(ctx.attr("sorted", 1)))


def import_cumsum(ctx, x, axis):
    x = _t(ctx, x)
    dim = int(np.ravel(ctx.static(axis, "axis"))[0]) % x.ndim
    if ctx.attr("reverse", 0):
        x = call("flip", x, axes=(dim,))
    y = cumsum(x, dim)
    if ctx.attr("exclusive", 0):
        y = call("sub", y, x)
    if ctx.attr("reverse", 0):
        y = call("flip", y, axes=(dim,))
    return y


def import_trilu(ctx, x, k=None):
    x = _t(ctx, x)
    k = 0 if k is None else int(np.ravel(ctx.static(k, "k"))[0])
    return triu(x, k) if ctx.attr("upper", 1) else tril(x, k)


NN_IMPORTERS = {
    "MatMul": import_matmul, "Gemm": import_gemm, "Conv": import_conv,
    "ConvTranspose": import_conv_transpose,
    "MaxPool": _separable_3d(import_max_pool),
    "AveragePool": _separable_3d(import_average_pool),
    "LpPool": _separable_3d(import_lp_pool), "GlobalAveragePool": _global("reduce_mean"),
    "GlobalMaxPool": _global("reduce_max"),
    "BatchNormalization": import_batch_norm, "InstanceNormalization": import_instance_norm,
    "LayerNormalization": import_layer_norm, "GroupNormalization": import_group_norm,
    "MeanVarianceNormalization": import_mvn, "RMSNormalization": import_rms_norm,
    "LpNormalization": import_lp_norm, "OneHot": import_one_hot,
    "Softmax": _softmax("softmax"), "LogSoftmax": _softmax("log_softmax"),
    "Hardmax": import_hardmax, "LRN": import_lrn, "Dropout": import_dropout,
    "Einsum": import_einsum, "TopK": import_topk, "CumSum": import_cumsum,
    "Trilu": import_trilu,
}
