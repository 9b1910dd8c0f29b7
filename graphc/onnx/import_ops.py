"""Import table, part 1: ONNX elementwise, comparison, activation and reduction ops.

Each function takes the NodeContext and the node's inputs (graphc tensors, numpy arrays for
static values, None for an absent optional input) and returns one output or a tuple; it
computes with registry ops through `call`, so eager runs, traces and compiles see the same
ops. ONNX semantics that differ from graphc's are written out: integer Div truncates, Mod
without fmod takes the divisor's sign, Pow keeps the base's type.
"""

from __future__ import annotations

import math

import numpy as np

from graphc.ops.registry import call
from graphc.types import bool_, int64


def _t(ctx, x):
    return ctx.tensor(x)


def _cast(x, dtype):
    return x if x.dtype is dtype else call("cast", x, dtype=dtype.name)


def _unary(op: str):
    def run(ctx, x):
        return call(op, _t(ctx, x))

    run.__name__ = f"import_{op}"
    return run


def _binary(op: str):
    def run(ctx, a, b):
        return call(op, _t(ctx, a), _t(ctx, b))

    run.__name__ = f"import_{op}"
    return run


def import_div(ctx, a, b):
    a, b = _t(ctx, a), _t(ctx, b)
    if a.dtype.is_floating:
        return call("div", a, b)
    q = call("floor_divide", a, b)  # truncate toward zero: floor, plus one where signs differ
    inexact = call("ne", call("remainder", a, b), 0)
    signs = call("logical_xor", call("lt", a, 0), call("lt", b, 0))
    return call("add", q, call("cast", call("logical_and", inexact, signs), dtype="int64"))


def import_pow(ctx, a, b):
    a, b = _t(ctx, a), _t(ctx, b)
    return _cast(call("pow", a, b), a.dtype)


def import_mod(ctx, a, b):
    a, b = _t(ctx, a), _t(ctx, b)
    r = call("remainder", a, b)
    if not ctx.attr("fmod", 0):
        return r
    # C fmod: the dividend's sign
    fix = call("logical_and", call("ne", r, 0), call("ne", call("lt", r, 0), call("lt", a, 0)))
    return call("where", fix, call("sub", r, b), r)


def import_reciprocal(ctx, x):
    x = _t(ctx, x)
    return call("div", call("full", shape=(), value=1.0, dtype=x.dtype.name), x)


def import_floor(ctx, x):
    x = _t(ctx, x)
    return call("floor_divide", x, call("full", shape=(), value=1.0, dtype=x.dtype.name))


def import_ceil(ctx, x):
    return call("neg", import_floor(ctx, call("neg", _t(ctx, x))))


def _scalar(x, value):
    return call("full", shape=(), value=float(value), dtype=x.dtype.name)


def import_sinh(ctx, x):
    x = _t(ctx, x)
    return call("mul", call("sub", call("exp", x), call("exp", call("neg", x))), _scalar(x, 0.5))


def import_cosh(ctx, x):
    x = _t(ctx, x)
    return call("mul", call("add", call("exp", x), call("exp", call("neg", x))), _scalar(x, 0.5))


def import_tan(ctx, x):
    x = _t(ctx, x)
    return call("div", call("sin", x), call("cos", x))


def import_asinh(ctx, x):
    x = _t(ctx, x)
    r = call("sqrt", call("add", call("mul", x, x), _scalar(x, 1)))
    return call("log", call("add", x, r))


def import_acosh(ctx, x):
    x = _t(ctx, x)
    r = call("sqrt", call("sub", call("mul", x, x), _scalar(x, 1)))
    return call("log", call("add", x, r))


def import_atanh(ctx, x):
    x = _t(ctx, x)
    one = _scalar(x, 1)
    ratio = call("div", call("add", one, x), call("sub", one, x))
    return call("mul", call("log", ratio), _scalar(x, 0.5))


def _atan(x):
    """arctan with Cephes' atanf: reduce |x| below tan(pi/8), then an odd polynomial
    (about 1e-7 relative in float32)."""
    a = call("abs", x)
    big = call("gt", a, _scalar(x, 2.414213562373095))
    mid = call("logical_and", call("gt", a, _scalar(x, 0.4142135623730950)),
               call("logical_not", big))
    one = _scalar(x, 1)
    safe = call("where", big, a, one)
    reduced = call("where", big, call("neg", call("div", one, safe)),
                   call("where", mid, call("div", call("sub", a, one), call("add", a, one)), a))
    base = call("where", big, _scalar(x, math.pi / 2),
                call("where", mid, _scalar(x, math.pi / 4), _scalar(x, 0)))
    z = call("mul", reduced, reduced)
    poly = _scalar(x, 8.05374449538e-2)
    for c in (-1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1):
        poly = call("add", call("mul", poly, z), _scalar(x, c))
    y = call("add", call("add", call("mul", call("mul", poly, z), reduced), reduced), base)
    return call("mul", y, call("sign", x))


def import_atan(ctx, x):
    return _atan(_t(ctx, x))


def import_asin(ctx, x):
    x = _t(ctx, x)  # asin(x) = atan(x / sqrt(1 - x^2)); +-pi/2 at +-1 through the inf
    return _atan(call("div", x, call("sqrt", call("sub", _scalar(x, 1), call("mul", x, x)))))


def import_acos(ctx, x):
    return call("sub", _scalar(_t(ctx, x), math.pi / 2), import_asin(ctx, x))


def import_softplus(ctx, x):
    x = _t(ctx, x)  # log(1 + e^x) = max(x, 0) + log1p(e^-|x|), stable for large |x|
    return call("add", call("relu", x), call("log1p", call("exp", call("neg", call("abs", x)))))


def import_softsign(ctx, x):
    x = _t(ctx, x)
    return call("div", x, call("add", call("abs", x), _scalar(x, 1)))


def import_elu(ctx, x):
    x = _t(ctx, x)
    alpha = ctx.attr("alpha", 1.0)
    neg = call("mul", call("sub", call("exp", x), _scalar(x, 1)), _scalar(x, alpha))
    return call("where", call("gt", x, 0.0), x, neg)


def import_celu(ctx, x):
    x = _t(ctx, x)
    alpha = ctx.attr("alpha", 1.0)
    neg = call("mul", call("sub", call("exp", call("div", x, _scalar(x, alpha))),
                           _scalar(x, 1)), _scalar(x, alpha))
    return call("add", call("relu", x), call("minimum", neg, _scalar(x, 0)))


def import_selu(ctx, x):
    alpha = ctx.attr("alpha", 1.67326319217681884765625)
    gamma = ctx.attr("gamma", 1.05070102214813232421875)
    ctx.attrs["alpha"] = alpha
    y = import_elu(ctx, x)
    return call("mul", y, _scalar(y, gamma))


def import_hard_sigmoid(ctx, x):
    x = _t(ctx, x)
    y = call("add", call("mul", x, _scalar(x, ctx.attr("alpha", 0.2))),
             _scalar(x, ctx.attr("beta", 0.5)))
    return call("clamp", y, min=0.0, max=1.0)


def import_hard_swish(ctx, x):
    x = _t(ctx, x)
    y = call("add", call("mul", x, _scalar(x, 1 / 6)), _scalar(x, 0.5))
    return call("mul", x, call("clamp", y, min=0.0, max=1.0))


def import_leaky_relu(ctx, x):
    return call("leaky_relu", _t(ctx, x), negative_slope=float(ctx.attr("alpha", 0.01)))


def import_thresholded_relu(ctx, x):
    x = _t(ctx, x)
    return call("where", call("gt", x, _scalar(x, ctx.attr("alpha", 1.0))), x, _scalar(x, 0))


def import_prelu(ctx, x, slope):
    x, slope = _t(ctx, x), _t(ctx, slope)
    if slope.ndim == 1 and x.ndim >= 3 and slope.shape[0] == x.shape[1] != x.shape[-1]:
        # a per-channel slope (opsets before 7 broadcast it along axis 1)
        slope = call("reshape", slope, shape=(slope.shape[0],) + (1,) * (x.ndim - 2))
    return call("where", call("lt", x, _scalar(x, 0)), call("mul", x, slope), x)


def import_mish(ctx, x):
    x = _t(ctx, x)
    return call("mul", x, call("tanh", import_softplus(ctx, x)))


def import_swish(ctx, x):
    x = _t(ctx, x)
    return call("mul", x, call("sigmoid", call("mul", x, _scalar(x, ctx.attr("alpha", 1.0)))))


def import_round(ctx, x):
    x = _t(ctx, x)  # half to even: floor(x + 0.5), one less where that rounded a tie up to odd
    r = import_floor(ctx, call("add", x, _scalar(x, 0.5)))
    tie = call("eq", call("sub", r, x), _scalar(x, 0.5))
    odd = call("ne", call("remainder", r, _scalar(x, 2)), _scalar(x, 0))
    return call("where", call("logical_and", tie, odd), call("sub", r, _scalar(x, 1)), r)


def import_gelu(ctx, x):
    return call("gelu", _t(ctx, x), approximate=ctx.attr("approximate", "none"))


def import_shrink(ctx, x):
    x = _t(ctx, x)
    lambd, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    low = call("add", x, _scalar(x, bias))
    high = call("sub", x, _scalar(x, bias))
    zero = _scalar(x, 0)
    return call("where", call("lt", x, _scalar(x, -lambd)), low,
                call("where", call("gt", x, _scalar(x, lambd)), high, zero))


def import_isnan(ctx, x):
    x = _t(ctx, x)
    return call("ne", x, x)


def import_isinf(ctx, x):
    x = _t(ctx, x)
    inf = _scalar(x, math.inf)
    pos = call("eq", x, inf) if ctx.attr("detect_positive", 1) else None
    neg = call("eq", x, call("neg", inf)) if ctx.attr("detect_negative", 1) else None
    if pos is not None and neg is not None:
        return call("logical_or", pos, neg)
    if pos is None and neg is None:
        return call("logical_and", call("eq", x, inf), call("ne", x, x))  # all False
    return pos if pos is not None else neg


def import_clip(ctx, x, lo=None, hi=None):
    x = _t(ctx, x)
    if ctx.opset < 11:
        lo, hi = ctx.attr("min", None), ctx.attr("max", None)
        lo = None if lo is None else np.array(lo)
        hi = None if hi is None else np.array(hi)
    if all(b is None or isinstance(b, np.ndarray) for b in (lo, hi)):
        kind = float if x.dtype.is_floating else int
        return call("clamp", x, min=None if lo is None else kind(lo),
                    max=None if hi is None else kind(hi))
    if lo is not None:
        x = call("maximum", x, _t(ctx, lo))
    if hi is not None:
        x = call("minimum", x, _t(ctx, hi))
    return x


def _variadic(op: str, mean: bool = False):
    def run(ctx, *xs):
        xs = [_t(ctx, x) for x in xs]
        out = xs[0]
        for x in xs[1:]:
            out = call(op, out, x)
        if mean:
            out = call("div", out, _scalar(out, len(xs)))
        if len(xs) == 1:
            out = call("copy", out)
        return out

    run.__name__ = f"import_variadic_{op}"
    return run


def import_where(ctx, cond, a, b):
    return call("where", _t(ctx, cond), _t(ctx, a), _t(ctx, b))


def import_not(ctx, x):
    return call("logical_not", _t(ctx, x))


def import_cast(ctx, x, like=None):
    from onnx import helper

    from graphc.types import dtype_of_numpy

    if like is not None:
        target = _t(ctx, like).dtype
    else:
        to = ctx.attr("to")
        np_type = helper.tensor_dtype_to_np_dtype(to)
        if np_type.kind not in "fiub" or np_type.itemsize > 8:
            raise ctx.refuse(f"cast to {helper.tensor_dtype_to_string(to)}")
        try:
            target = dtype_of_numpy(np_type)
        except TypeError as err:
            raise ctx.refuse(f"graphc has no dtype for {np_type}") from err
    x = _t(ctx, x)
    return call("cast", x, dtype=target.name) if x.dtype is not target else call("copy", x)


# ---- reductions ---------------------------------------------------------------------------
def _reduce_axes(ctx, x, axes_input):
    if ctx.node.op_type == "ReduceSum" and ctx.opset >= 13 or ctx.opset >= 18:
        axes = ctx.static(axes_input, "axes")
    else:
        axes = ctx.attr("axes")
    if axes is None or len(axes) == 0:
        if ctx.attr("noop_with_empty_axes", 0):
            return None
        return tuple(range(x.ndim))
    return tuple(sorted(int(a) % max(x.ndim, 1) for a in np.ravel(axes)))


def _empty_extreme(ctx, x, dims, is_max):
    """Max or min over an empty dimension: ONNX's identity (-inf / +inf, the int limits)."""
    keep = bool(ctx.attr("keepdims", 1))
    shape = tuple(1 if i in dims else d for i, d in enumerate(x.shape) if keep or i not in dims)
    if x.dtype.is_floating:
        value = -math.inf if is_max else math.inf
    elif x.dtype is bool_:
        value = not is_max
    else:
        info = np.iinfo(np.int64)
        value = info.min if is_max else info.max
    return call("full", shape=shape, value=value, dtype=x.dtype.name)


def _reduce(op: str, pre=None, post=None):
    def run(ctx, x, axes=None):
        x = _t(ctx, x)
        dims = _reduce_axes(ctx, x, axes)
        if pre is not None:
            x = pre(x)
        if dims is None:
            y = call("copy", x)
        elif x.ndim == 0:
            y = call("copy", x)
        elif op in ("reduce_max", "reduce_min") and any(x.shape[d] == 0 for d in dims):
            y = _empty_extreme(ctx, x, dims, op == "reduce_max")
        else:
            src = x.dtype
            if x.dtype is bool_:
                x = _cast(x, int64)
            y = call(op, x, axes=dims, keepdim=bool(ctx.attr("keepdims", 1)))
            y = _cast(y, src) if src is bool_ else y
        return post(y) if post is not None else y

    run.__name__ = f"import_{op}"
    return run


def _square(x):
    return call("mul", x, x)


def _log(x):
    return call("log", x)


def import_reduce_log_sum_exp(ctx, x, axes=None):
    x = _t(ctx, x)
    dims = _reduce_axes(ctx, x, axes)
    if dims is None or x.ndim == 0:
        return call("copy", x)
    keep = bool(ctx.attr("keepdims", 1))
    if any(x.shape[d] == 0 for d in dims):
        return _empty_extreme(ctx, x, dims, True)  # log(0) = -inf
    m = call("reduce_max", x, axes=dims, keepdim=True)
    m = call("where", call("eq", call("abs", m), _scalar(m, math.inf)), _scalar(m, 0), m)
    s = call("reduce_sum", call("exp", call("sub", x, m)), axes=dims, keepdim=True)
    y = call("add", call("log", s), m)
    if not keep:
        y = call("reshape", y, shape=tuple(d for i, d in enumerate(x.shape) if i not in dims))
    return y


def _arg(op: str):
    def run(ctx, x):
        x = _t(ctx, x)
        axis = ctx.attr("axis", 0) % max(x.ndim, 1)
        keep = bool(ctx.attr("keepdims", 1))
        if ctx.attr("select_last_index", 0):
            n = x.shape[axis]
            idx = call(op, call("flip", x, axes=(axis,)), axis=axis, keepdim=keep)
            return call("sub", call("full", shape=(), value=n - 1, dtype="int64"), idx)
        return call(op, x, axis=axis, keepdim=keep)

    run.__name__ = f"import_{op}"
    return run




def _unary_abs(x):
    return call("abs", x)


def _unary_sqrt(x):
    return call("sqrt", x)


ELEMENTWISE_IMPORTERS = {
    "Abs": _unary("abs"), "Neg": _unary("neg"), "Exp": _unary("exp"), "Log": _unary("log"),
    "Sqrt": _unary("sqrt"), "Tanh": _unary("tanh"), "Sigmoid": _unary("sigmoid"),
    "Sign": _unary("sign"), "Sin": _unary("sin"), "Cos": _unary("cos"), "Erf": _unary("erf"),
    "Relu": _unary("relu"), "Reciprocal": import_reciprocal, "Floor": import_floor,
    "Ceil": import_ceil, "Sinh": import_sinh, "Cosh": import_cosh, "Tan": import_tan,
    "Asinh": import_asinh, "Acosh": import_acosh, "Atanh": import_atanh,
    "Atan": import_atan, "Asin": import_asin, "Acos": import_acos,
    "Softplus": import_softplus, "Softsign": import_softsign, "Elu": import_elu,
    "Celu": import_celu, "Selu": import_selu, "HardSigmoid": import_hard_sigmoid,
    "HardSwish": import_hard_swish, "LeakyRelu": import_leaky_relu,
    "ThresholdedRelu": import_thresholded_relu, "PRelu": import_prelu, "Mish": import_mish,
    "Gelu": import_gelu, "Swish": import_swish, "Round": import_round,
    "Shrink": import_shrink, "IsNaN": import_isnan, "IsInf": import_isinf,
    "Clip": import_clip, "Not": import_not, "Cast": import_cast, "CastLike": import_cast,
    "Add": _binary("add"), "Sub": _binary("sub"), "Mul": _binary("mul"), "Div": import_div,
    "Pow": import_pow, "Mod": import_mod,
    "Equal": _binary("eq"), "Less": _binary("lt"), "LessOrEqual": _binary("le"),
    "Greater": _binary("gt"), "GreaterOrEqual": _binary("ge"), "And": _binary("logical_and"),
    "Or": _binary("logical_or"), "Xor": _binary("logical_xor"), "Where": import_where,
    "Max": _variadic("maximum"), "Min": _variadic("minimum"), "Sum": _variadic("add"),
    "Mean": _variadic("add", mean=True),
    "ReduceSum": _reduce("reduce_sum"), "ReduceMean": _reduce("reduce_mean"),
    "ReduceMax": _reduce("reduce_max"), "ReduceMin": _reduce("reduce_min"),
    "ReduceProd": _reduce("reduce_prod"), "ReduceL1": _reduce("reduce_sum", pre=_unary_abs),
    "ReduceL2": _reduce("reduce_sum", pre=_square, post=_unary_sqrt),
    "ReduceSumSquare": _reduce("reduce_sum", pre=_square),
    "ReduceLogSum": _reduce("reduce_sum", post=_log),
    "ReduceLogSumExp": import_reduce_log_sum_exp,
    "ArgMax": _arg("argmax"), "ArgMin": _arg("argmin"),
}

