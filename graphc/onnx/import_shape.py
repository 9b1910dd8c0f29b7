"""Import table, part 3: ONNX constants, shapes and data movement.

`Shape`, `Size`, `Constant`, `ConstantOfShape`, `Range` and `EyeLike` give static numpy values
(see graphc.onnx.importer), so the shapes and indices that later nodes read as attributes stay
literals in a trace. Movement ops map to the registry's reshape, permute, slice (plus flip for
negative steps), concat, pad, take, gather, scatter_add and broadcast_to.
"""

from __future__ import annotations

import numpy as np

from graphc.ops.registry import call


def _t(ctx, x):
    return ctx.tensor(x)


def _ints(ctx, x, what) -> list[int]:
    return [int(v) for v in np.ravel(ctx.static(x, what))]


def import_identity(ctx, x):
    return x if isinstance(x, np.ndarray) else call("copy", x)


def import_constant(ctx):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in ctx.attrs:
            value = ctx.attrs[key]
            dtype = np.float32 if "float" in key else np.int64 if "int" in key else None
            return np.array(value, dtype=dtype)
    raise ctx.refuse(f"attribute {sorted(ctx.attrs)} (strings and sparse tensors)")


def import_constant_of_shape(ctx, shape):
    value = ctx.attr("value", np.zeros(1, np.float32))
    return np.full(_ints(ctx, shape, "shape"), np.ravel(value)[0], dtype=value.dtype)


def import_shape(ctx, x):
    shape = list(x.shape)
    n = len(shape)
    start, end = ctx.attr("start", 0), ctx.attr("end", n)
    start, end = (max(0, min(n, v + n if v < 0 else v)) for v in (start, end))
    if not all(isinstance(d, (int, np.integer)) for d in shape):
        raise ctx.refuse("a symbolic dimension: Shape of a dynamic dim is not static")
    return np.array(shape[start:end], dtype=np.int64)


def import_size(ctx, x):
    return np.array(int(np.prod(x.shape, dtype=np.int64)), dtype=np.int64)


def import_reshape(ctx, x, shape=None):
    x = ctx.tensor(x)
    target = _ints(ctx, shape, "shape") if shape is not None else list(ctx.attr("shape"))
    if not ctx.attr("allowzero", 0):
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    if -1 in target:
        known = int(np.prod([d for d in target if d != -1], dtype=np.int64))
        total = int(np.prod(x.shape, dtype=np.int64))
        target[target.index(-1)] = total // known if known else 0
    return call("reshape", x, shape=tuple(target))


def import_flatten(ctx, x):
    x = _t(ctx, x)
    axis = ctx.attr("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    return call("reshape", x, shape=(rows, int(np.prod(x.shape[axis:], dtype=np.int64))))


def import_transpose(ctx, x):
    x = _t(ctx, x)
    perm = ctx.attr("perm", list(range(x.ndim))[::-1])
    return call("permute", x, dims=tuple(int(p) for p in perm))


def _axes(ctx, x_ndim, axes_input):
    if ctx.opset >= 13:
        return None if axes_input is None else _ints(ctx, axes_input, "axes")
    return ctx.attr("axes")


def import_squeeze(ctx, x, axes=None):
    x = _t(ctx, x)
    dims = _axes(ctx, x.ndim, axes)
    dims = ([i for i, d in enumerate(x.shape) if d == 1] if dims is None
            else [a % x.ndim for a in dims])
    return call("reshape", x, shape=tuple(d for i, d in enumerate(x.shape) if i not in dims))


def import_unsqueeze(ctx, x, axes=None):
    x = _t(ctx, x)
    dims = _axes(ctx, x.ndim, axes)
    out_ndim = x.ndim + len(dims)
    dims = sorted(a % out_ndim for a in dims)
    shape = list(x.shape)
    for d in dims:
        shape.insert(d, 1)
    return call("reshape", x, shape=tuple(shape))


def import_concat(ctx, *xs):
    xs = [_t(ctx, x) for x in xs]
    return call("concat", *xs, axis=ctx.attr("axis") % max(xs[0].ndim, 1))


def _slice_axis(x, axis, start, stop, step):
    """x[start:stop:step] along one axis with numpy's rules, negative steps included."""
    n = x.shape[axis]
    start, stop, step = slice(start, stop, step).indices(n)
    picked = range(start, stop, step)
    starts = [0] * x.ndim
    stops = list(x.shape)
    steps = [1] * x.ndim
    if len(picked) == 0:
        stops[axis] = 0
        return call("slice", x, starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))
    lo, hi = min(picked[0], picked[-1]), max(picked[0], picked[-1])
    starts[axis], stops[axis], steps[axis] = lo, hi + 1, abs(step)
    y = call("slice", x, starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))
    return call("flip", y, axes=(axis,)) if step < 0 else y


def _clip_index(v: int) -> int:
    return int(max(min(v, 2**62), -(2**62)))


def import_slice(ctx, x, starts=None, ends=None, axes=None, steps=None):
    x = _t(ctx, x)
    if ctx.opset < 10:
        starts, ends, axes = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes")
        steps = None
    else:
        starts, ends = _ints(ctx, starts, "starts"), _ints(ctx, ends, "ends")
        axes = None if axes is None else _ints(ctx, axes, "axes")
        steps = None if steps is None else _ints(ctx, steps, "steps")
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for a, s, e, st in zip(axes, starts, ends, steps):
        x = _slice_axis(x, a % x.ndim, _clip_index(s), _clip_index(e), st)
    return x


def import_split(ctx, x, split=None):
    x = _t(ctx, x)
    axis = ctx.attr("axis", 0) % x.ndim
    if split is not None:
        sizes = _ints(ctx, split, "split")
    elif "split" in ctx.attrs:
        sizes = list(ctx.attr("split"))
    else:
        parts = ctx.attr("num_outputs", ctx.num_outputs)
        each = -(-x.shape[axis] // parts)
        sizes = [min(each, x.shape[axis] - i * each) for i in range(parts)]
    outs, at = [], 0
    for size in sizes:
        outs.append(_slice_axis(x, axis, at, at + size, 1))
        at += size
    return tuple(outs)


def import_gather(ctx, x, index):
    x = _t(ctx, x)
    return call("take", x, _t(ctx, index), axis=ctx.attr("axis", 0) % x.ndim)


def _nonnegative(index, size):
    return call("where", call("lt", index, 0), call("add", index, size), index)


def import_gather_elements(ctx, x, index):
    x = _t(ctx, x)
    axis = ctx.attr("axis", 0) % x.ndim
    return call("gather", x, _nonnegative(_t(ctx, index), x.shape[axis]), axis=axis)


def import_scatter_elements(ctx, x, index, updates):
    reduction = ctx.attr("reduction", "none")
    x, updates = _t(ctx, x), _t(ctx, updates)
    axis = ctx.attr("axis", 0) % x.ndim
    index = _nonnegative(_t(ctx, index), x.shape[axis])
    if reduction in ("mul", "max", "min"):
        # the flat position each update goes to: its own position, with `axis` from index
        positions = np.indices(tuple(index.shape)).reshape(index.ndim, -1)
        strides = np.cumprod((1,) + tuple(x.shape[::-1]))[-2::-1]
        fixed = np.zeros(positions.shape[1], np.int64)
        for d, st in enumerate(strides):
            if d != axis:
                fixed = fixed + int(st) * positions[d]
        flat_index = call("add", call("mul", call("reshape", index,
                                                  shape=(int(np.prod(index.shape)),)),
                                      call("full", shape=(), value=int(strides[axis]),
                                           dtype="int64")), ctx.tensor(fixed.astype(np.int64)))
        flat = call("reshape", x, shape=(int(np.prod(x.shape)),))
        values = call("reshape", updates, shape=(int(np.prod(updates.shape)),))
        return call("reshape", _scatter_reduce(flat, flat_index, values, reduction),
                    shape=tuple(x.shape))
    if reduction not in ("none", "add"):
        raise ctx.refuse(f"reduction={reduction!r}")
    if reduction == "add":
        return call("scatter_add", x, index, updates, axis=axis)
    # replace: clear the written places, then add (ONNX leaves repeated indices undefined)
    zeros = call("full", shape=tuple(x.shape), value=0.0, dtype=x.dtype.name)
    ones = call("full", shape=tuple(updates.shape), value=1.0, dtype=x.dtype.name)
    written = call("gt", call("scatter_add", zeros, index, ones, axis=axis), _scalar0(x))
    kept = call("where", written, zeros, x)
    return call("scatter_add", kept, index, updates, axis=axis)


def _scatter_reduce(data, index, updates, reduction: str):
    """data (P, ...) with each updates[m] combined into row index[m] by mul/max/min, through
    a dense (P, M) one-hot (no scatter-reduce primitive: memory grows as rows x updates)."""
    rows, m = data.shape[0], index.shape[0]
    rest = tuple(data.shape[1:])
    positions = call("arange", start=0.0, end=float(rows), step=1.0, dtype="int64")
    hit = call("eq", call("reshape", positions, shape=(rows, 1)),
               call("reshape", index, shape=(1, m)))
    hit = call("reshape", hit, shape=(rows, m) + (1,) * len(rest))
    identity = {"mul": 1.0, "max": -np.inf, "min": np.inf}[reduction]
    if not data.dtype.is_floating and reduction != "mul":
        # beyond every value of the (at most 32-bit) integer types that widen to int64, and
        # exact as the float the `full` attribute holds
        identity = float(-(2**62) if reduction == "max" else 2**62)
    fill = call("full", shape=(), value=identity, dtype=data.dtype.name)
    spread = call("where", hit, call("reshape", updates, shape=(1, m, *rest)), fill)
    op = {"mul": "reduce_prod", "max": "reduce_max", "min": "reduce_min"}[reduction]
    combined = call(op, spread, axes=(1,), keepdim=False)
    binary = {"mul": "mul", "max": "maximum", "min": "minimum"}[reduction]
    return call(binary, data, combined)


def _scalar0(x):
    return call("full", shape=(), value=0.0, dtype=x.dtype.name)


def _linear_index(index, dims):
    """(..., k) int64 indices into the first k `dims` (negative ones wrap) as (...) offsets
    into those dims flattened."""
    k = len(dims)
    flat = None
    stride = int(np.prod(dims, dtype=np.int64))
    for j in range(k):
        stride //= dims[j]
        starts = (0,) * (index.ndim - 1) + (j,)
        stops = tuple(index.shape[:-1]) + (j + 1,)
        part = call("slice", index, starts=starts, stops=stops, steps=(1,) * index.ndim)
        part = call("reshape", part, shape=tuple(index.shape[:-1]))
        part = _nonnegative(part, dims[j])
        term = call("mul", part, call("full", shape=(), value=stride, dtype="int64"))
        flat = term if flat is None else call("add", flat, term)
    return flat


def import_gather_nd(ctx, x, index):
    x, index = _t(ctx, x), _t(ctx, index)
    b = ctx.attr("batch_dims", 0)
    k = index.shape[-1]
    batch = int(np.prod(x.shape[:b], dtype=np.int64))
    dims = tuple(x.shape[b:b + k])
    rest = tuple(x.shape[b + k:])
    size = int(np.prod(dims, dtype=np.int64))
    data = call("reshape", x, shape=(batch * size, *rest))
    inner = tuple(index.shape[b:-1])
    linear = _linear_index(call("reshape", index, shape=(batch, *inner, k)), dims)
    offsets = call("arange", start=0.0, end=float(batch), step=1.0, dtype="int64")
    offsets = call("reshape", offsets, shape=(batch,) + (1,) * len(inner))
    linear = call("add", linear, call("mul", offsets, call("full", shape=(), value=size,
                                                            dtype="int64")))
    out = call("take", data, linear, axis=0)
    return call("reshape", out, shape=tuple(x.shape[:b]) + inner + rest)


def import_scatter_nd(ctx, x, index, updates):
    reduction = ctx.attr("reduction", "none")
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise ctx.refuse(f"reduction={reduction!r}")
    x, index, updates = _t(ctx, x), _t(ctx, index), _t(ctx, updates)
    k = index.shape[-1]
    dims, rest = tuple(x.shape[:k]), tuple(x.shape[k:])
    m = int(np.prod(index.shape[:-1], dtype=np.int64))
    data = call("reshape", x, shape=(int(np.prod(dims, dtype=np.int64)), *rest))
    linear = _linear_index(call("reshape", index, shape=(m, k)), dims)
    updates = call("reshape", updates, shape=(m, *rest))
    if reduction in ("mul", "max", "min"):
        return call("reshape", _scatter_reduce(data, linear, updates, reduction),
                    shape=tuple(x.shape))
    op = "index_put" if reduction == "none" else "index_add"
    return call("reshape", call(op, data, linear, updates, axis=0), shape=tuple(x.shape))


def import_center_crop_pad(ctx, x, shape):
    x = _t(ctx, x)
    target = _ints(ctx, shape, "shape")
    axes = [a % x.ndim for a in ctx.attr("axes", range(x.ndim))]
    for a, want in zip(axes, target):
        n = x.shape[a]
        if want < n:  # crop the centre; the extra element comes off the end
            start = (n - want) // 2
            x = _slice_axis(x, a, start, start + want, 1)
        elif want > n:  # pad around; the extra zero goes at the end
            before = (want - n) // 2
            pads = [0] * (2 * x.ndim)
            pads[2 * a], pads[2 * a + 1] = before, want - n - before
            x = call("pad", x, pads=tuple(pads), value=0.0)
    return x


def import_reverse_sequence(ctx, x, lengths):
    x = _t(ctx, x)
    lengths = ctx.static(lengths, "sequence_lens").astype(np.int64)
    time_axis, batch_axis = ctx.attr("time_axis", 0), ctx.attr("batch_axis", 1)
    steps = x.shape[time_axis]
    # source time step for each (time, batch): reversed inside the length, kept after it
    t = np.arange(steps).reshape(-1, 1)
    source = np.where(t < lengths.reshape(1, -1), lengths.reshape(1, -1) - 1 - t, t)
    if time_axis > batch_axis:
        source = source.T
    shape = [1] * x.ndim
    shape[time_axis], shape[batch_axis] = steps, len(lengths)
    index = np.broadcast_to(source.reshape(shape), x.shape)
    return call("gather", x, ctx.tensor(np.ascontiguousarray(index)), axis=time_axis)


def import_expand(ctx, x, shape):
    x = _t(ctx, x)
    target = np.broadcast_shapes(tuple(x.shape), tuple(_ints(ctx, shape, "shape")))
    return call("broadcast_to", x, shape=tuple(int(d) for d in target))


def import_tile(ctx, x, repeats):
    x = _t(ctx, x)
    reps = _ints(ctx, repeats, "repeats")
    inner = []
    for d in x.shape:
        inner += [1, d]
    wide = call("reshape", x, shape=tuple(inner))
    full = []
    for r, d in zip(reps, x.shape):
        full += [r, d]
    wide = call("broadcast_to", wide, shape=tuple(full))
    return call("reshape", wide, shape=tuple(r * d for r, d in zip(reps, x.shape)))


def import_pad(ctx, x, pads=None, value=None, axes=None):
    x = _t(ctx, x)
    mode = ctx.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise ctx.refuse(f"mode={mode!r}")
    if ctx.opset < 11:
        pads, fill = list(ctx.attr("pads")), ctx.attr("value", 0.0)
    else:
        pads = _ints(ctx, pads, "pads")
        fill = [] if value is None else np.ravel(ctx.static(value, "constant_value"))
        fill = float(fill[0]) if len(fill) else 0.0
    dims = list(range(x.ndim)) if axes is None else [a % x.ndim for a in
                                                      _ints(ctx, axes, "axes")]
    k = len(dims)
    interleaved = [0] * (2 * x.ndim)
    for i, d in enumerate(dims):
        interleaved[2 * d], interleaved[2 * d + 1] = pads[i], pads[k + i]
    if mode == "constant":
        return call("pad", x, pads=tuple(interleaved), value=fill)
    for d in range(x.ndim):  # the other modes read source positions: one take per axis
        before, after = interleaved[2 * d], interleaved[2 * d + 1]
        if before or after:
            index = _pad_index(mode, x.shape[d], before, after)
            x = call("take", x, ctx.tensor(index), axis=d)
    return x


def _pad_index(mode: str, n: int, before: int, after: int) -> np.ndarray:
    """The source position of each output position along one padded axis."""
    pos = np.arange(-before, n + after)
    if mode == "edge":
        return np.clip(pos, 0, n - 1)
    if mode == "wrap":
        return pos % n
    period = 2 * (n - 1) if n > 1 else 1  # reflect, without repeating the edge
    pos = np.abs(pos) % period
    return np.where(pos >= n, period - pos, pos)


def import_range(ctx, start, limit, delta):
    start, limit, delta = (ctx.static(v, name) for v, name in
                           ((start, "start"), (limit, "limit"), (delta, "delta")))
    return np.arange(start, limit, delta).astype(np.asarray(start).dtype)


def import_eye_like(ctx, x):
    from onnx import helper

    dtype = (helper.tensor_dtype_to_np_dtype(ctx.attr("dtype")) if "dtype" in ctx.attrs
             else np.dtype(_t(ctx, x).dtype.np))
    return np.eye(x.shape[0], x.shape[1], k=ctx.attr("k", 0), dtype=dtype)


def import_depth_to_space(ctx, x):
    x = _t(ctx, x)
    b = ctx.attr("blocksize")
    n, c, h, w = x.shape
    if ctx.attr("mode", "DCR") == "DCR":
        y = call("reshape", x, shape=(n, b, b, c // (b * b), h, w))
        y = call("permute", y, dims=(0, 3, 4, 1, 5, 2))
    else:
        y = call("reshape", x, shape=(n, c // (b * b), b, b, h, w))
        y = call("permute", y, dims=(0, 1, 4, 2, 5, 3))
    return call("reshape", y, shape=(n, c // (b * b), h * b, w * b))


def import_space_to_depth(ctx, x):
    x = _t(ctx, x)
    b = ctx.attr("blocksize")
    n, c, h, w = x.shape
    y = call("reshape", x, shape=(n, c, h // b, b, w // b, b))
    crd = ctx.attr("mode", "DCR") == "CRD"
    y = call("permute", y, dims=(0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4))
    return call("reshape", y, shape=(n, c * b * b, h // b, w // b))


SHAPE_IMPORTERS = {
    "Identity": import_identity, "Constant": import_constant,
    "ConstantOfShape": import_constant_of_shape, "Shape": import_shape, "Size": import_size,
    "Reshape": import_reshape, "Flatten": import_flatten, "Transpose": import_transpose,
    "Squeeze": import_squeeze, "Unsqueeze": import_unsqueeze, "Concat": import_concat,
    "Slice": import_slice, "Split": import_split, "Gather": import_gather,
    "GatherElements": import_gather_elements, "ScatterElements": import_scatter_elements,
    "Expand": import_expand, "Tile": import_tile, "Pad": import_pad, "Range": import_range,
    "EyeLike": import_eye_like, "DepthToSpace": import_depth_to_space,
    "SpaceToDepth": import_space_to_depth, "GatherND": import_gather_nd,
    "ScatterND": import_scatter_nd, "Scatter": import_scatter_elements,
    "CenterCropPad": import_center_crop_pad, "ReverseSequence": import_reverse_sequence,
}
