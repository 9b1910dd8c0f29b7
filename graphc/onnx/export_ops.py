"""The export table: one function per registry op, emitting the ONNX nodes that compute it.

`EXPORTERS` maps a registry op name to a function `(em, node, xs) -> list[str | None]`: `em`
is the `Emitter` of graphc.onnx.exporter (fresh names, constants, `em.node(...)`), `node` the IR
node and `xs` the ONNX names of its inputs. It returns one ONNX name per IR output (None for
an output it cannot give). `REFUSED` names the registry ops
that have no export, each with the reason; graphc.onnx.export raises OnnxExportError for them.

Semantics follow the registry's numpy kernels, not the ONNX op of the same name: graphc's
`remainder` is Python's (sign of the divisor) and `floor_divide` floors, so both are built from
ONNX ops that agree for every sign; `gelu` is written with Erf/Tanh so it needs no opset 20;
max_pool2d's indices are ONNX's modulo the plane; index_put/index_add/slice_scatter are
ScatterND; an unbatched (C, H, W) conv or pool gets a batch of one.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, numpy_helper

from graphc.types import TensorType

ONNX_DTYPES = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE,
               "int64": TensorProto.INT64, "bool": TensorProto.BOOL}
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


def onnx_dtype(ty: TensorType) -> int:
    """The ONNX element type of a graphc tensor type."""
    return ONNX_DTYPES[ty.dtype.name]


def _cast_to(em, name: str, src: TensorType, dst_dtype) -> str:
    if src.dtype is dst_dtype:
        return name
    return em.node("Cast", [name], to=ONNX_DTYPES[dst_dtype.name])


def _inputs_as(em, node, xs, dtype) -> list[str]:
    return [_cast_to(em, x, v.type, dtype) for x, v in zip(xs, node.inputs)]


def _common_dtype(node):
    dtypes = [v.type.dtype for v in node.inputs]
    return max(dtypes, key=lambda d: d.rank)


# ---- elementwise -------------------------------------------------------------------------
def _simple(op_type: str, same_as_output: bool = True):
    """An op that is one ONNX node; inputs are cast to the output (or common) dtype first."""
    def export(em, node, xs):
        dtype = node.outputs[0].type.dtype if same_as_output else _common_dtype(node)
        return [em.node(op_type, _inputs_as(em, node, xs, dtype))]

    export.__name__ = f"export_{op_type.lower()}"
    return export


def export_rsqrt(em, node, xs):
    return [em.node("Reciprocal", [em.node("Sqrt", xs)])]


def export_log1p(em, node, xs):
    one = em.const(np.ones((), node.outputs[0].type.dtype.np))
    return [em.node("Log", [em.node("Add", [xs[0], one])])]


def export_gelu(em, node, xs):
    dt = node.outputs[0].type.dtype.np
    x = xs[0]
    half, one = em.const(np.array(0.5, dt)), em.const(np.array(1.0, dt))
    if node.attrs["approximate"] == "tanh":
        c = em.const(np.array(math.sqrt(2.0 / math.pi), dt))
        k = em.const(np.array(0.044715, dt))
        cube = em.node("Mul", [em.node("Mul", [x, x]), x])
        inner = em.node("Mul", [c, em.node("Add", [x, em.node("Mul", [k, cube])])])
        t = em.node("Tanh", [inner])
    else:
        t = em.node("Erf", [em.node("Div", [x, em.const(np.array(math.sqrt(2.0), dt))])])
    return [em.node("Mul", [em.node("Mul", [half, x]), em.node("Add", [one, t])])]


def export_leaky_relu(em, node, xs):
    return [em.node("LeakyRelu", xs, alpha=float(node.attrs["negative_slope"]))]


def export_clamp(em, node, xs):
    ty = node.outputs[0].type
    x = _cast_to(em, xs[0], node.inputs[0].type, ty.dtype)
    bounds = [em.const(np.array(b, ty.dtype.np)) if b is not None else ""
              for b in (node.attrs["min"], node.attrs["max"])]
    while bounds and bounds[-1] == "":
        bounds.pop()
    return [em.node("Clip", [x, *bounds])]


def export_cast(em, node, xs):
    return [em.node("Cast", xs, to=onnx_dtype(node.outputs[0].type))]


def export_ne(em, node, xs):
    return [em.node("Not", [export_compare("Equal")(em, node, xs)[0]])]


def export_compare(op_type: str):
    return _simple(op_type, same_as_output=False)


def export_minmax(op_type: str):
    return _simple(op_type)


def export_remainder(em, node, xs):
    dtype = node.outputs[0].type.dtype
    a, b = _inputs_as(em, node, xs, dtype)
    if not dtype.is_floating:
        return [em.node("Mod", [a, b], fmod=0)]  # integer Mod takes the divisor's sign
    floor = em.node("Floor", [em.node("Div", [a, b])])
    return [em.node("Sub", [a, em.node("Mul", [floor, b])])]


def export_floor_divide(em, node, xs):
    dtype = node.outputs[0].type.dtype
    a, b = _inputs_as(em, node, xs, dtype)
    if dtype.is_floating:
        return [em.node("Floor", [em.node("Div", [a, b])])]
    # (a - a mod b) / b divides exactly, so ONNX's truncating integer Div gives the floor
    return [em.node("Div", [em.node("Sub", [a, em.node("Mod", [a, b], fmod=0)]), b])]


def export_where(em, node, xs):
    dtype = node.outputs[0].type.dtype
    cond = _cast_to(em, xs[0], node.inputs[0].type, node.inputs[0].type.dtype)
    a, b = (_cast_to(em, x, v.type, dtype) for x, v in zip(xs[1:], node.inputs[1:]))
    if dtype.name == "bool":  # onnxruntime has no bool Where: (c and a) or (not c and b)
        return [em.node("Or", [em.node("And", [cond, a]),
                               em.node("And", [em.node("Not", [cond]), b])])]
    return [em.node("Where", [cond, a, b])]


# ---- contraction, norm, pool ---------------------------------------------------------------
def _batched(export):
    """Wrap a conv/pool export so an unbatched (C, H, W) input gets a batch of one."""
    def run(em, node, xs):
        if len(node.inputs[0].type.shape) != 3:
            return export(em, node, xs)
        axis0 = em.const(np.array([0], np.int64))
        outs = export(em, node, [em.node("Unsqueeze", [xs[0], axis0]), *xs[1:]])
        return [None if o is None else em.node("Squeeze", [o, axis0]) for o in outs]

    run.__name__ = export.__name__
    return run


def export_conv2d(em, node, xs):
    a = node.attrs
    ph, pw = a["padding"]
    return [em.node("Conv", xs, strides=list(a["stride"]), pads=[ph, pw, ph, pw],
                    dilations=list(a["dilation"]), group=a["groups"])]


def export_conv_transpose(em, node, xs):
    """conv2d_input_grad in a forward graph is a transposed convolution (ConvTranspose2d)."""
    a = node.attrs
    ph, pw = a["padding"]
    gy, w = node.inputs[0].type.shape, node.inputs[1].type.shape
    extra = [size - ((n - 1) * s - 2 * p + d * (k - 1) + 1) for size, n, s, p, d, k in
             zip(a["input_hw"], gy[-2:], a["stride"], a["padding"], a["dilation"], w[-2:])]
    return [em.node("ConvTranspose", xs, strides=list(a["stride"]), pads=[ph, pw, ph, pw],
                    dilations=list(a["dilation"]), group=a["groups"], output_padding=extra)]


def export_batch_norm(em, node, xs):
    if node.attrs["training"]:
        raise em.refuse(node, "batch_norm in training mode: call model.eval() before export")
    y = em.node("BatchNormalization", [xs[0], xs[1], xs[2], xs[3], xs[4]],
                epsilon=float(node.attrs["eps"]))
    return [y, xs[3], xs[4]]  # eval mode: the running statistics pass through unchanged


def export_softmax(op_type: str):
    def export(em, node, xs):
        return [em.node(op_type, xs, axis=node.attrs["dim"])]

    export.__name__ = f"export_{op_type.lower()}"
    return export


def export_max_pool2d(em, node, xs):
    a = node.attrs
    ph, pw = a["padding"]
    y, idx = em.node("MaxPool", xs, outputs=2, kernel_shape=list(a["kernel_size"]),
                     strides=list(a["stride"]), pads=[ph, pw, ph, pw],
                     dilations=list(a["dilation"]), ceil_mode=int(a["ceil_mode"]))
    h, w = node.inputs[0].type.shape[-2:]  # ONNX counts across N and C; graphc in one plane
    return [y, em.node("Mod", [idx, em.const(np.array(h * w, np.int64))])]


def export_avg_pool2d(em, node, xs):
    a = node.attrs
    ph, pw = a["padding"]
    kh, kw = a["kernel_size"]
    y = em.node("AveragePool", xs, kernel_shape=[kh, kw], strides=list(a["stride"]),
                pads=[ph, pw, ph, pw], ceil_mode=int(a["ceil_mode"]),
                count_include_pad=int(a["count_include_pad"] or a["divisor_override"] is not None))
    if a["divisor_override"] is not None:
        dt = node.outputs[0].type.dtype.np
        y = em.node("Mul", [y, em.const(np.array(kh * kw / a["divisor_override"], dt))])
    return [y]


# ---- movement --------------------------------------------------------------------------------
def export_reshape(em, node, xs):
    shape = tuple(node.outputs[0].type.shape)
    src = tuple(node.inputs[0].type.shape)
    if em.is_dynamic(src) and not em.is_dynamic(shape):
        # the dynamic axes were merged into a dimension (B*T): let Reshape infer it
        merged = int(np.prod([d for d in src if d in em.dynamic_dims]))
        for i, d in enumerate(shape):
            if d and d % merged == 0:
                target = list(shape)
                target[i] = -1
                return [em.node("Reshape", [xs[0], em.const(np.array(target, np.int64))])]
    zero = {"allowzero": 1} if 0 in shape and em.opset >= 14 else {}  # a real 0, not "copy"
    return [em.node("Reshape", [xs[0], em.shape_of(shape)], **zero)]


def export_permute(em, node, xs):
    return [em.node("Transpose", xs, perm=list(node.attrs["dims"]))]


def export_broadcast_to(em, node, xs):
    return [em.node("Expand", [xs[0], em.shape_of(tuple(node.attrs["shape"]))])]


def export_concat(em, node, xs):
    return [em.node("Concat", xs, axis=node.attrs["axis"])]


def export_copy(em, node, xs):
    return [em.node("Identity", xs)]


def export_flip(em, node, xs):
    axes = list(node.attrs["axes"])
    if not axes:
        return [em.node("Identity", xs)]
    n = len(axes)
    return [em.node("Slice", [xs[0], em.const(np.full(n, -1, np.int64)),
                              em.const(np.full(n, INT64_MIN, np.int64)),
                              em.const(np.array(axes, np.int64)),
                              em.const(np.full(n, -1, np.int64))])]


def export_slice(em, node, xs):
    """Slice only the axes the IR restricts: a whole axis stays whole (a dynamic batch)."""
    a = node.attrs
    shape = node.inputs[0].type.shape
    kept = [(axis, start, stop, step) for axis, (start, stop, step, n) in
            enumerate(zip(a["starts"], a["stops"], a["steps"], shape))
            if (start, stop, step) != (0, n, 1)]
    if not kept:
        return [em.node("Identity", xs)]
    axes, starts, ends, steps = (np.array(v, np.int64) for v in zip(*kept))
    return [em.node("Slice", [xs[0], *(em.const(v) for v in (starts, ends, axes, steps))])]


def export_pad(em, node, xs):
    pads = node.attrs["pads"]
    ty = node.inputs[0].type
    pads = list(pads) + [0] * (2 * len(ty.shape) - len(pads))
    onnx_pads = np.array(pads[0::2] + pads[1::2], np.int64)
    value = em.const(np.array(node.attrs["value"], ty.dtype.np))
    return [em.node("Pad", [xs[0], em.const(onnx_pads), value], mode="constant")]


def export_take(em, node, xs):
    return [em.node("Gather", xs, axis=node.attrs["axis"])]


def export_gather(em, node, xs):
    return [em.node("GatherElements", xs, axis=node.attrs["axis"])]


def export_embedding(em, node, xs):
    return [em.node("Gather", xs, axis=0)]


def _axis_first(em, node, xs, reduction: str):
    """index_put / index_add as ScatterND: the indexed axis moved first."""
    if reduction == "add" and em.opset < 16:
        raise em.refuse(node, "ScatterND with reduction='add' needs opset 16 or newer")
    x_ty, index_ty, src_ty = (v.type for v in node.inputs)
    axis, k, rank = node.attrs["axis"], len(index_ty.shape), len(x_ty.shape)
    perm = [axis] + [d for d in range(rank) if d != axis]
    src_perm = list(range(axis, axis + k)) + list(range(axis)) + \
        list(range(axis + k, len(src_ty.shape)))
    n = em.const(np.array(x_ty.shape[axis], np.int64))
    index = em.node("Where", [em.node("Less", [xs[1], em.const(np.array(0, np.int64))]),
                              em.node("Add", [xs[1], n]), xs[1]])
    index = em.node("Unsqueeze", [index, em.const(np.array([-1], np.int64))])
    moved = em.node("ScatterND", [em.node("Transpose", [xs[0]], perm=perm), index,
                                  em.node("Transpose", [xs[2]], perm=src_perm)],
                    reduction=reduction)
    return [em.node("Transpose", [moved], perm=[int(p) for p in np.argsort(perm)])]


def export_index_put(em, node, xs):
    return _axis_first(em, node, xs, "none")


def export_index_add(em, node, xs):
    return _axis_first(em, node, xs, "add")


def export_slice_scatter(em, node, xs):
    """x with src written at a (strided) slice: ScatterND at the slice's positions."""
    a = node.attrs
    ranges = [np.arange(lo, hi, st) for lo, hi, st in zip(a["starts"], a["stops"], a["steps"])]
    rank = len(node.inputs[0].type.shape)
    if rank == 0 or any(len(r) == 0 for r in ranges):
        return [em.node("Identity", [xs[0]])]
    grid = np.stack(np.meshgrid(*ranges, indexing="ij"), axis=-1).astype(np.int64)
    src = xs[1]
    if tuple(node.inputs[1].type.shape) != grid.shape[:-1]:
        src = em.node("Expand", [src, em.const(np.array(grid.shape[:-1], np.int64))])
    return [em.node("ScatterND", [xs[0], em.const(grid), src])]


def export_nll_loss(em, node, xs):
    """NegativeLogLikelihoodLoss, and the total weight of the counted targets."""
    x_ty = node.inputs[0].type
    x, target, weight = xs
    ignore = node.attrs["ignore_index"]
    if len(x_ty.shape) == 1:  # unbatched (C,): a batch of one
        axis0 = em.const(np.array([0], np.int64))
        x, target = em.node("Unsqueeze", [x, axis0]), em.node("Unsqueeze", [target, axis0])
    loss = em.node("NegativeLogLikelihoodLoss", [x, target, weight],
                   reduction=node.attrs["reduction"], ignore_index=ignore)
    if len(x_ty.shape) == 1 and node.attrs["reduction"] == "none":
        loss = em.node("Squeeze", [loss, em.const(np.array([0], np.int64))])
    counted = em.node("Not", [em.node("Equal", [target, em.const(np.array(ignore, np.int64))])])
    safe = em.node("Where", [counted, target, em.const(np.array(0, np.int64))])
    w = em.node("Where", [counted, em.node("Gather", [weight, safe], axis=0),
                          em.const(np.array(0, x_ty.dtype.np))])
    return [loss, em.node("ReduceSum", [w], keepdims=0)]


def export_scatter_add(em, node, xs):
    if em.opset < 16:
        raise em.refuse(node, "ScatterElements with reduction='add' needs opset 16 or newer")
    return [em.node("ScatterElements", xs, axis=node.attrs["axis"], reduction="add")]


# ---- reductions, sources -----------------------------------------------------------------
def export_reduce(op_type: str):
    def export(em, node, xs):
        x = xs[0]
        in_ty, out_ty = node.inputs[0].type, node.outputs[0].type
        axes = list(node.attrs["axes"]) if node.attrs["axes"] is not None else []
        keep = int(node.attrs["keepdim"])
        if not in_ty.shape:  # a 0-d reduction is the value itself
            return [_cast_to(em, x, in_ty, out_ty.dtype)]
        if not axes:
            axes = list(range(len(in_ty.shape)))
        if in_ty.dtype.name == "bool":
            x = em.node("Cast", [x], to=TensorProto.INT64)
        if op_type == "ReduceMean" and any(in_ty.shape[a] == 0 for a in axes):
            # mean over nothing: 0/0 = nan, as the registry's kernel (and PyTorch) gives
            total = em.node("ReduceSum", [x, em.const(np.array(axes, np.int64))], keepdims=keep)
            return [em.node("Div", [total, em.const(np.zeros((), out_ty.dtype.np))])]
        if op_type == "ReduceSum" or em.opset >= 18:
            y = em.node(op_type, [x, em.const(np.array(axes, np.int64))], keepdims=keep)
        else:
            y = em.node(op_type, [x], axes=axes, keepdims=keep)
        if in_ty.dtype.name == "bool" and out_ty.dtype.name == "bool":
            y = em.node("Cast", [y], to=TensorProto.BOOL)
        return [y]

    export.__name__ = f"export_{op_type.lower()}"
    return export


def export_arg(op_type: str):
    def export(em, node, xs):
        in_ty = node.inputs[0].type
        axis, keep = node.attrs["axis"], int(node.attrs["keepdim"])
        x = xs[0]
        if not in_ty.shape:
            return [em.const(np.zeros((), np.int64))]
        if axis is None:
            y = em.node(op_type, [em.node("Reshape", [x, em.const(np.array([-1], np.int64))])],
                        axis=0, keepdims=0)
            if keep:
                y = em.node("Reshape", [y, em.const(np.ones(len(in_ty.shape), np.int64))])
            return [y]
        return [em.node(op_type, [x], axis=axis, keepdims=keep)]

    export.__name__ = f"export_{op_type.lower()}"
    return export


def export_full(em, node, xs):
    ty = node.outputs[0].type
    value = np.array(node.attrs["value"], ty.dtype.np)
    small = len(ty.shape) == 0 or int(np.prod(ty.shape)) <= 16
    if small and not em.is_dynamic(ty.shape):
        return [em.const(np.full(ty.shape, value))]
    return [em.node("ConstantOfShape", [em.shape_of(tuple(ty.shape))],
                    value=numpy_helper.from_array(value.reshape(1)))]


def export_arange(em, node, xs):
    a = node.attrs
    values = np.arange(a["start"], a["end"], a["step"]).astype(node.outputs[0].type.dtype.np)
    return [em.const(values)]


# ---- graphc.ops.mathops ---------------------------------------------------------------------
def _rounding(op_type: str):
    """floor/ceil/round (ONNX Round is half to even, as graphc's): integers pass through."""
    def export(em, node, xs):
        if not node.outputs[0].type.dtype.is_floating:
            return [em.node("Identity", xs)]
        return [em.node(op_type, xs)]

    export.__name__ = f"export_{op_type.lower()}"
    return export


def export_trunc(em, node, xs):
    if not node.outputs[0].type.dtype.is_floating:
        return [em.node("Identity", xs)]
    zero = em.const(np.array(0, node.outputs[0].type.dtype.np))
    negative = em.node("Less", [xs[0], zero])
    return [em.node("Where", [negative, em.node("Ceil", xs), em.node("Floor", xs)])]


def _scaled_log(factor: float):
    def export(em, node, xs):
        (x,) = _inputs_as(em, node, xs, node.outputs[0].type.dtype)
        scale = em.const(np.array(factor, node.outputs[0].type.dtype.np))
        return [em.node("Mul", [em.node("Log", [x]), scale])]

    export.__name__ = "export_log_scaled"
    return export


def export_expm1(em, node, xs):
    (x,) = _inputs_as(em, node, xs, node.outputs[0].type.dtype)
    one = em.const(np.array(1, node.outputs[0].type.dtype.np))
    return [em.node("Sub", [em.node("Exp", [x]), one])]


def export_atan2(em, node, xs):
    """atan(y / x), moved by +-pi (the sign of y) where x < 0."""
    dtype = node.outputs[0].type.dtype
    y, x = _inputs_as(em, node, xs, dtype)
    zero, pi = em.const(np.array(0, dtype.np)), em.const(np.array(math.pi, dtype.np))
    base = em.node("Atan", [em.node("Div", [y, x])])
    turn = em.node("Where", [em.node("Less", [y, zero]), em.node("Neg", [pi]), pi])
    shift = em.node("Where", [em.node("Less", [x, zero]), turn, zero])
    return [em.node("Add", [base, shift])]


def export_fmod(em, node, xs):
    return [em.node("Mod", _inputs_as(em, node, xs, node.outputs[0].type.dtype), fmod=1)]


EXPORTERS = {
    "abs": _simple("Abs"), "neg": _simple("Neg"), "exp": _simple("Exp"), "log": _simple("Log"),
    "sqrt": _simple("Sqrt"), "rsqrt": export_rsqrt, "tanh": _simple("Tanh"),
    "sigmoid": _simple("Sigmoid"), "sign": _simple("Sign"), "sin": _simple("Sin"),
    "cos": _simple("Cos"), "erf": _simple("Erf"), "relu": _simple("Relu"),
    "log1p": export_log1p, "gelu": export_gelu, "leaky_relu": export_leaky_relu,
    "clamp": export_clamp, "cast": export_cast, "logical_not": _simple("Not"),
    "add": _simple("Add"), "sub": _simple("Sub"), "mul": _simple("Mul"),
    "div": _simple("Div"), "pow": _simple("Pow"), "maximum": export_minmax("Max"),
    "minimum": export_minmax("Min"), "remainder": export_remainder,
    "floor_divide": export_floor_divide,
    "floor": _rounding("Floor"), "ceil": _rounding("Ceil"), "round": _rounding("Round"),
    "trunc": export_trunc, "tan": _simple("Tan"), "atan": _simple("Atan"),
    "asin": _simple("Asin"), "acos": _simple("Acos"), "sinh": _simple("Sinh"),
    "cosh": _simple("Cosh"), "expm1": export_expm1, "log2": _scaled_log(1 / math.log(2)),
    "log10": _scaled_log(1 / math.log(10)), "atan2": export_atan2, "fmod": export_fmod,
    "eq": export_compare("Equal"), "ne": export_ne, "lt": export_compare("Less"),
    "le": export_compare("LessOrEqual"), "gt": export_compare("Greater"),
    "ge": export_compare("GreaterOrEqual"), "logical_and": _simple("And"),
    "logical_or": _simple("Or"), "logical_xor": _simple("Xor"),
    "where": export_where,
    "matmul": _simple("MatMul"), "conv2d": _batched(export_conv2d),
    "conv2d_input_grad": _batched(export_conv_transpose), "batch_norm": export_batch_norm,
    "softmax": export_softmax("Softmax"), "log_softmax": export_softmax("LogSoftmax"),
    "max_pool2d": _batched(export_max_pool2d), "avg_pool2d": _batched(export_avg_pool2d),
    "reshape": export_reshape, "permute": export_permute, "broadcast_to": export_broadcast_to,
    "concat": export_concat, "copy": export_copy, "flip": export_flip, "slice": export_slice,
    "pad": export_pad, "take": export_take, "gather": export_gather,
    "embedding": export_embedding, "scatter_add": export_scatter_add,
    "index_put": export_index_put, "index_add": export_index_add,
    "slice_scatter": export_slice_scatter, "nll_loss": export_nll_loss,
    "reduce_sum": export_reduce("ReduceSum"), "reduce_mean": export_reduce("ReduceMean"),
    "reduce_max": export_reduce("ReduceMax"), "reduce_min": export_reduce("ReduceMin"),
    "reduce_prod": export_reduce("ReduceProd"),
    "argmax": export_arg("ArgMax"), "argmin": export_arg("ArgMin"),
    "full": export_full, "arange": export_arange,
}

_BACKWARD = "a backward op: export an inference graph (under graphc.no_grad(), model.eval())"
_RANDOM = "a random op: call model.eval() so dropout is off; ONNX random ops differ in stream"
_COLLECTIVE = ("a collective between the ranks of a training job: ONNX has no operator for it; "
               "export the model of one rank")
REFUSED = {
    "fused": "a fused group: export the traced IR, before the fuse pass",
    "attention": "made by the cpu pipeline's fuse_attention pass: export the traced IR",
    "batch_norm_relu": "made by the cpu pipeline's fuse_batch_norm_relu pass: export the "
                       "traced IR",
    "batch_norm_relu_backward": "made by the cpu pipeline's fuse_batch_norm_backward pass: "
                                "export the traced IR",
    "conv2d_channel_sums": "made by the cpu pipeline's fuse_conv_channel_sums pass: export the "
                           "traced IR",
    "attention_backward": _BACKWARD,
    "conv2d_weight_grad": _BACKWARD,
    "avg_pool2d_grad": _BACKWARD, "max_pool2d_grad": _BACKWARD,
    "embedding_backward": _BACKWARD, "nll_loss_backward": _BACKWARD,
    "dropout": _RANDOM, "bernoulli": _RANDOM, "normal": _RANDOM, "uniform": _RANDOM,
    "randint": _RANDOM, "randperm": _RANDOM,
    "all_reduce": _COLLECTIVE, "all_reduce_start": _COLLECTIVE,
    "all_reduce_wait": _COLLECTIVE,
}
