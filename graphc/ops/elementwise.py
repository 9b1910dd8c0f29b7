"""Elementwise ops: unary math, binary arithmetic with broadcasting, comparisons, where, cast.

Each op's registration, kernel, gradient and public function stand together. `scalar` names
the scalar operation a backend renders inside a fused loop (the same as the op name here).
"""

from __future__ import annotations

import math

import numpy as np

from graphc.errors import ArgumentError
from graphc.errors import where as _where
from graphc.ops.grad_utils import sum_to, zeros_like
from graphc.ops.registry import ELEMENTWISE, OpDef, call, inplace_method, register
from graphc.ops.shapes import binary_type, broadcast_many, compare_type, float_unary
from graphc.types import TensorType, as_dtype, bool_, float32

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _unary(name: str, kernel, vjp, saved_inputs=(), saved_outputs=(), attrs=None, float_only=True):
    """Register a unary elementwise op whose scalar op has the op's own name."""

    def infer(x: TensorType, **_attrs) -> TensorType:
        return float_unary(name, x) if float_only else x

    return register(OpDef(
        name, ELEMENTWISE, ("x",), infer, kernel, vjp, scalar=name, attrs=attrs or {},
        saved_inputs=saved_inputs, saved_outputs=saved_outputs,
    ))


def _is_float(dtype: np.dtype) -> bool:
    """np.issubdtype(dtype, np.floating), in a tenth of its time (kernels run once per eager
    op)."""
    return dtype.kind == "f"


def _float_kernel(fn):
    """Wrap a numpy function so integer inputs compute in float32 (PyTorch's promotion)."""

    def kernel(x, **attrs):
        if not _is_float(x.dtype):
            x = x.astype(np.float32)
        return fn(x, **attrs)

    kernel.__name__ = getattr(fn, "__name__", "kernel")
    return kernel


# ---- unary -----------------------------------------------------------------------------------
def _neg_vjp(ctx, g):
    return (-g,)


_unary("neg", np.negative, _neg_vjp, float_only=False)


def _abs_vjp(ctx, g):
    return (g * call("sign", ctx.inputs[0]),)


_unary("abs", np.abs, _abs_vjp, saved_inputs=(0,), float_only=False)


def _sign_vjp(ctx, g):
    return (None,)  # zero almost everywhere


_unary("sign", np.sign, _sign_vjp, float_only=False)


def _exp_vjp(ctx, g):
    return (g * ctx.outputs[0],)


_unary("exp", _float_kernel(np.exp), _exp_vjp, saved_outputs=(0,))


def _log_vjp(ctx, g):
    return (g / ctx.inputs[0],)


_unary("log", _float_kernel(np.log), _log_vjp, saved_inputs=(0,))


def _sqrt_vjp(ctx, g):
    return (g / (ctx.outputs[0] * 2.0),)


_unary("sqrt", _float_kernel(np.sqrt), _sqrt_vjp, saved_outputs=(0,))


def _rsqrt_kernel(x):
    return 1.0 / np.sqrt(x)


def _rsqrt_vjp(ctx, g):
    y = ctx.outputs[0]
    return (g * (y * y * y) * -0.5,)


_unary("rsqrt", _float_kernel(_rsqrt_kernel), _rsqrt_vjp, saved_outputs=(0,))


def _tanh_vjp(ctx, g):
    y = ctx.outputs[0]
    return (g * (1.0 - y * y),)


_unary("tanh", _float_kernel(np.tanh), _tanh_vjp, saved_outputs=(0,))


def _sigmoid_kernel(x):
    # Split by sign so exp never overflows: 1/(1+e^-x) for x >= 0, e^x/(1+e^x) otherwise.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype)


def _sigmoid_vjp(ctx, g):
    y = ctx.outputs[0]
    return (g * y * (1.0 - y),)


_unary("sigmoid", _float_kernel(_sigmoid_kernel), _sigmoid_vjp, saved_outputs=(0,))


def _relu_kernel(x):
    zero = _ZEROS.get(x.dtype.char)  # a 0-d array: half the time of a numpy scalar operand
    return np.maximum(x, x.dtype.type(0) if zero is None else zero)


def _read_only_zero(dtype) -> np.ndarray:
    zero = np.zeros((), dtype)
    zero.flags.writeable = False
    return zero


_ZEROS = {np.dtype(t).char: _read_only_zero(t)
          for t in (np.float32, np.float64, np.int64, np.bool_)}


def _relu_vjp(ctx, g):
    return (call("where", ctx.outputs[0] > 0, g, zeros_like(g)),)


_unary("relu", _relu_kernel, _relu_vjp, saved_outputs=(0,), float_only=False)


def _leaky_relu_kernel(x, negative_slope):
    return np.where(x > 0, x, x * negative_slope).astype(x.dtype)


def _leaky_relu_vjp(ctx, g):
    slope = ctx.attrs["negative_slope"]
    return (call("where", ctx.inputs[0] > 0, g, g * slope),)


_unary("leaky_relu", _float_kernel(_leaky_relu_kernel), _leaky_relu_vjp, saved_inputs=(0,),
       attrs={"negative_slope": float})


def _gelu_kernel(x, approximate):
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
        return 0.5 * x * (1.0 + np.tanh(inner))
    return 0.5 * x * (1.0 + _erf_kernel(x * _SQRT_HALF))


def _gelu_vjp(ctx, g):
    x = ctx.inputs[0]
    if ctx.attrs["approximate"] == "tanh":
        k = math.sqrt(2.0 / math.pi)
        t = call("tanh", (x + x * x * x * 0.044715) * k)
        dinner = (x * x * (3 * 0.044715) + 1.0) * k
        return (g * ((t + 1.0) * 0.5 + x * 0.5 * (1.0 - t * t) * dinner),)
    cdf = (call("erf", x * _SQRT_HALF) + 1.0) * 0.5
    pdf = call("exp", x * x * -0.5) * _INV_SQRT_2PI
    return (g * (cdf + x * pdf),)


def _check_gelu(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise ArgumentError(
            f"{_where('gelu')}: approximate must be 'none' or 'tanh', got {approximate!r}"
        )


_unary("gelu", _float_kernel(_gelu_kernel), _gelu_vjp, saved_inputs=(0,),
       attrs={"approximate": str})


def _sin_vjp(ctx, g):
    return (g * call("cos", ctx.inputs[0]),)


_unary("sin", _float_kernel(np.sin), _sin_vjp, saved_inputs=(0,))


def _cos_vjp(ctx, g):
    return (-g * call("sin", ctx.inputs[0]),)


_unary("cos", _float_kernel(np.cos), _cos_vjp, saved_inputs=(0,))


def _erf_vjp(ctx, g):
    x = ctx.inputs[0]
    return (g * call("exp", -(x * x)) * _TWO_OVER_SQRT_PI,)


def _erf_kernel(x):
    from scipy import special  # imported on first use: it costs ~0.4 s of `import graphc`

    return special.erf(x)


_unary("erf", _float_kernel(_erf_kernel), _erf_vjp, saved_inputs=(0,))


def _clamp_infer(x: TensorType, min, max) -> TensorType:  # noqa: A002
    # An integer tensor clamped with a float bound becomes float32, as in PyTorch.
    if not x.dtype.is_floating and any(isinstance(b, float) for b in (min, max)):
        return TensorType(x.shape, float32)
    return x


def _clamp_kernel(x, min, max):  # noqa: A002 (PyTorch's argument names)
    if not _is_float(x.dtype) and any(isinstance(b, float) for b in (min, max)):
        x = x.astype(np.float32)
    out = x
    if min is not None:
        out = np.maximum(out, min)
    if max is not None:
        out = np.minimum(out, max)
    return out.astype(x.dtype)


def _clamp_vjp(ctx, g):
    x = ctx.inputs[0]
    lo, hi = ctx.attrs["min"], ctx.attrs["max"]
    keep = None
    if lo is not None:
        keep = x >= lo
    if hi is not None:
        keep = (x <= hi) if keep is None else call("logical_and", keep, x <= hi)
    return (g if keep is None else call("where", keep, g, zeros_like(g)),)


register(OpDef("clamp", ELEMENTWISE, ("x",), _clamp_infer, _clamp_kernel, _clamp_vjp,
               scalar="clamp", attrs={"min": float, "max": float}, saved_inputs=(0,)))


# ---- log1p (log(1 + x), accurate near 0: the stable log-sigmoid uses it) -----------------------
def _log1p_infer(x: TensorType) -> TensorType:
    return float_unary("log1p", x)


def _log1p_kernel(x):
    if not _is_float(x.dtype):
        x = x.astype(np.float32)
    return np.log1p(x)


def _log1p_vjp(ctx, g):
    return (g / (ctx.inputs[0] + 1.0),)


register(OpDef("log1p", ELEMENTWISE, ("x",), _log1p_infer, _log1p_kernel, _log1p_vjp,
               scalar="log1p", saved_inputs=(0,)))


# ---- binary ----------------------------------------------------------------------------------
def _binary(name: str, kernel, vjp, saved_inputs=(), saved_outputs=(), infer=None):
    def infer_binary(a: TensorType, b: TensorType) -> TensorType:
        return binary_type(name, a, b)

    return register(OpDef(
        name, ELEMENTWISE, ("a", "b"), infer or infer_binary, kernel, vjp, scalar=name,
        saved_inputs=saved_inputs, saved_outputs=saved_outputs,
    ))


def _add_vjp(ctx, g):
    a, b = ctx.input_types
    need_a, need_b = ctx.needs_input_grad
    return (sum_to(g, a.shape) if need_a else None, sum_to(g, b.shape) if need_b else None)


_binary("add", np.add, _add_vjp)


def _sub_vjp(ctx, g):
    a, b = ctx.input_types
    need_a, need_b = ctx.needs_input_grad
    return (sum_to(g, a.shape) if need_a else None, sum_to(-g, b.shape) if need_b else None)


_binary("sub", np.subtract, _sub_vjp)


def _mul_vjp(ctx, g):
    a, b = ctx.inputs
    need_a, need_b = ctx.needs_input_grad
    return (sum_to(g * b, a.shape) if need_a else None, sum_to(g * a, b.shape) if need_b else None)


_binary("mul", np.multiply, _mul_vjp, saved_inputs=(0, 1))


def _div_infer(a: TensorType, b: TensorType) -> TensorType:
    return float_unary("div", binary_type("div", a, b))


def _div_kernel(a, b):
    out = np.true_divide(a, b)
    return out if _is_float(a.dtype) or _is_float(b.dtype) \
        else out.astype(np.float32)


def _div_vjp(ctx, g):
    a, b = ctx.inputs
    need_a, need_b = ctx.needs_input_grad
    ga = sum_to(g / b, a.shape) if need_a else None
    gb = sum_to(-g * a / (b * b), b.shape) if need_b else None
    return (ga, gb)


_binary("div", _div_kernel, _div_vjp, saved_inputs=(0, 1), infer=_div_infer)


def _pow_kernel(a, b):
    if not _is_float(a.dtype) and not _is_float(b.dtype):
        if (b < 0).any():
            raise ArgumentError(
                f"{_where('pow')}: Integers to negative integer powers are not allowed."
            )
    return np.power(a, b)


def _pow_vjp(ctx, g):
    a, b = ctx.inputs
    need_a, need_b = ctx.needs_input_grad
    ga = gb = None
    if need_a:
        ga = sum_to(g * b * call("pow", a, b - 1.0), a.shape)
    if need_b:
        y = ctx.outputs[0]
        safe = call("where", a == 0.0, zeros_like(g) + 1.0, a)
        gb = sum_to(call("where", a == 0.0, zeros_like(g), g * y * call("log", safe)), b.shape)
    return (ga, gb)


_binary("pow", _pow_kernel, _pow_vjp, saved_inputs=(0, 1), saved_outputs=(0,))


def _max_min_vjp(ctx, g, wins_a):
    a, b = ctx.inputs
    tie = a == b
    half = g * 0.5
    ga = call("where", tie, half, call("where", wins_a, g, zeros_like(g)))
    gb = call("where", tie, half, call("where", wins_a, zeros_like(g), g))
    return (sum_to(ga, a.shape), sum_to(gb, b.shape))


def _maximum_vjp(ctx, g):
    a, b = ctx.inputs
    return _max_min_vjp(ctx, g, a > b)


def _minimum_vjp(ctx, g):
    a, b = ctx.inputs
    return _max_min_vjp(ctx, g, a < b)


_binary("maximum", np.maximum, _maximum_vjp, saved_inputs=(0, 1))
_binary("minimum", np.minimum, _minimum_vjp, saved_inputs=(0, 1))


def _floor_divide_kernel(a, b):
    if not _is_float(a.dtype) and not _is_float(b.dtype):
        if (b == 0).any():
            raise ArgumentError(f"{_where('floor_divide')}: ZeroDivisionError")
    return np.floor_divide(a, b)


# PyTorch defines no derivative for floor_divide: it is piecewise constant.
_binary("floor_divide", _floor_divide_kernel, None)


def _remainder_kernel(a, b):
    if not _is_float(a.dtype) and not _is_float(b.dtype):
        if (b == 0).any():
            raise ArgumentError(f"{_where('remainder')}: ZeroDivisionError")
    return np.mod(a, b)  # the result takes the divisor's sign, as Python's % and PyTorch's


def _remainder_vjp(ctx, g):
    a, b = ctx.inputs
    need_a, need_b = ctx.needs_input_grad
    ga = sum_to(g, a.shape) if need_a else None
    gb = sum_to(-g * call("floor_divide", a, b), b.shape) if need_b else None
    return (ga, gb)


_binary("remainder", _remainder_kernel, _remainder_vjp, saved_inputs=(0, 1))


def _compare(name: str, kernel) -> None:
    def infer(a: TensorType, b: TensorType) -> TensorType:
        return compare_type(name, a, b)

    register(OpDef(name, ELEMENTWISE, ("a", "b"), infer, kernel, None, scalar=name))


for _name, _kernel in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less),
                       ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal),
                       ("logical_and", np.logical_and), ("logical_or", np.logical_or),
                       ("logical_xor", np.logical_xor)):
    _compare(_name, _kernel)


def _logical_not_infer(x: TensorType) -> TensorType:
    return TensorType(x.shape, bool_)


register(OpDef("logical_not", ELEMENTWISE, ("x",), _logical_not_infer, np.logical_not, None,
               scalar="logical_not"))


# ---- where and cast --------------------------------------------------------------------------
def _where_infer(cond: TensorType, a: TensorType, b: TensorType) -> TensorType:
    from graphc.ops.shapes import require_dtype, result_dtype

    require_dtype("where", cond, (bool_,), "condition")
    return TensorType(broadcast_many("where", cond.shape, a.shape, b.shape), result_dtype(a, b))


def _where_vjp(ctx, g):
    cond = ctx.inputs[0]
    _, a, b = ctx.input_types
    zero = zeros_like(g)
    ga = sum_to(call("where", cond, g, zero), a.shape) if ctx.needs_input_grad[1] else None
    gb = sum_to(call("where", cond, zero, g), b.shape) if ctx.needs_input_grad[2] else None
    return (None, ga, gb)


def _where_kernel(cond, a, b):
    """np.where(cond, a, b); for a and b of one 4- or 8-byte dtype, as the branch-free
    b + cond * (a - b) in integers on their bit patterns (exact: the arithmetic wraps around
    and back). np.where branches per element, which a mask of mixed bits (a ReLU's) makes
    ~5x slower."""
    if a.dtype != b.dtype or a.dtype.itemsize not in (4, 8):
        return np.where(cond, a, b)
    bits = np.dtype(f"i{a.dtype.itemsize}")
    out = np.empty(np.broadcast_shapes(cond.shape, a.shape, b.shape), bits)
    b_bits = b.view(bits)
    if not b_bits.any():  # b is all +0 (zeros_like in a VJP, a ReLU's): cond * a, in bits
        np.multiply(a.view(bits), cond, out=out)
        return out.view(a.dtype)
    np.subtract(a.view(bits), b_bits, out=out)
    np.multiply(out, cond, out=out)
    np.add(out, b_bits, out=out)
    return out.view(a.dtype)


register(OpDef("where", ELEMENTWISE, ("cond", "a", "b"), _where_infer, _where_kernel,
               _where_vjp, scalar="select", saved_inputs=(0,)))


def _cast_infer(x: TensorType, dtype: str) -> TensorType:
    return TensorType(x.shape, as_dtype(dtype))


def _cast_kernel(x, dtype):
    return x.astype(as_dtype(dtype).np)


def _cast_vjp(ctx, g):
    src = ctx.input_types[0].dtype
    return (call("cast", g, dtype=src.name) if src.is_floating else None,)


register(OpDef("cast", ELEMENTWISE, ("x",), _cast_infer, _cast_kernel, _cast_vjp,
               scalar="cast", attrs={"dtype": str}))


# ---- public functions (graphc.exp, Tensor.exp, ...) ------------------------------------------
def neg(x):
    """-x, elementwise."""
    return call("neg", x)


def abs(x):  # noqa: A001 (PyTorch's name)
    """|x|, elementwise."""
    return call("abs", x)


def sign(x):
    """The sign of x (-1, 0 or 1; NaN stays NaN)."""
    return call("sign", x)


def exp(x):
    """e**x, elementwise."""
    return call("exp", x)


def log(x):
    """The natural logarithm of x, elementwise."""
    return call("log", x)


def sqrt(x):
    """The square root of x, elementwise."""
    return call("sqrt", x)


def rsqrt(x):
    """1 / sqrt(x), elementwise."""
    return call("rsqrt", x)


def tanh(x):
    """The hyperbolic tangent of x, elementwise."""
    return call("tanh", x)


def sigmoid(x):
    """1 / (1 + exp(-x)), elementwise."""
    return call("sigmoid", x)


def log1p(x):
    """log(1 + x), accurate near 0."""
    return call("log1p", x)


def relu(x):
    """max(x, 0), elementwise."""
    return call("relu", x)


def leaky_relu(x, negative_slope: float = 0.01):
    """x where x > 0, else x * negative_slope."""
    return call("leaky_relu", x, negative_slope=float(negative_slope))


def gelu(x, approximate: str = "none"):
    """x * Phi(x) (the Gaussian error linear unit; `approximate="tanh"` for the tanh form)."""
    _check_gelu(approximate)
    return call("gelu", x, approximate=approximate)


def sin(x):
    """The sine of x, elementwise."""
    return call("sin", x)


def cos(x):
    """The cosine of x, elementwise."""
    return call("cos", x)


def erf(x):
    """The error function of x, elementwise."""
    return call("erf", x)


def clamp(x, min=None, max=None):  # noqa: A002
    """x limited to [min, max] (either bound may be None; a tensor bound broadcasts)."""
    if min is None and max is None:
        raise ArgumentError(f"{_where('clamp')}: At least one of 'min' or 'max' must not be None")
    if _is_tensor_bound(min) or _is_tensor_bound(max):  # PyTorch's clamp(Tensor min, max)
        out = x if min is None else call("maximum", x, min)
        return out if max is None else call("minimum", out, max)
    return call("clamp", x, min=_bound(min), max=_bound(max))


def _is_tensor_bound(value) -> bool:
    return value is not None and hasattr(value, "dtype") and hasattr(value, "shape") and \
        not isinstance(value, (np.generic, np.ndarray))


def _bound(value):
    """A clamp bound as an IR literal: ints stay ints (integer tensors stay integer)."""
    if value is None or isinstance(value, float):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    return float(value)


def add(a, b, alpha=1):
    """a + b with broadcasting (`alpha` scales b, as torch.add)."""
    return call("add", a, b if alpha == 1 else call("mul", b, alpha))


def sub(a, b, alpha=1):
    """a - b with broadcasting (`alpha` scales b, as torch.sub)."""
    return call("sub", a, b if alpha == 1 else call("mul", b, alpha))


def mul(a, b):
    """a * b with broadcasting."""
    return call("mul", a, b)


def div(a, b):
    """a / b with broadcasting (true division)."""
    return call("div", a, b)


def pow(a, b):  # noqa: A001
    """a ** b with broadcasting."""
    return call("pow", a, b)


def maximum(a, b):
    """The larger of a and b, elementwise (NaN wins)."""
    return call("maximum", a, b)


def floor_divide(a, b):
    """floor(a / b), elementwise, as Python's //."""
    return call("floor_divide", a, b)


def remainder(a, b):
    """a mod b with the sign of b, as Python's %."""
    return call("remainder", a, b)


def minimum(a, b):
    """The smaller of a and b, elementwise (NaN wins)."""
    return call("minimum", a, b)


def eq(a, b):
    """a == b, elementwise (bool)."""
    return call("eq", a, b)


def ne(a, b):
    """a != b, elementwise (bool)."""
    return call("ne", a, b)


def lt(a, b):
    """a < b, elementwise (bool)."""
    return call("lt", a, b)


def le(a, b):
    """a <= b, elementwise (bool)."""
    return call("le", a, b)


def gt(a, b):
    """a > b, elementwise (bool)."""
    return call("gt", a, b)


def ge(a, b):
    """a >= b, elementwise (bool)."""
    return call("ge", a, b)


def logical_and(a, b):
    """a and b as truth values, elementwise (bool)."""
    return call("logical_and", a, b)


def logical_or(a, b):
    """a or b as truth values, elementwise (bool)."""
    return call("logical_or", a, b)


def logical_xor(a, b):
    """a xor b as truth values, elementwise (bool)."""
    return call("logical_xor", a, b)


def logical_not(x):
    """not x as a truth value, elementwise (bool)."""
    return call("logical_not", x)


def where(cond, a, b):
    """Elementwise choice: a where cond is True, else b (broadcasting all three)."""
    return call("where", cond, a, b)


def cast(x, dtype):
    """x converted to `dtype` (numpy's astype)."""
    dtype = as_dtype(dtype)
    if x.dtype is dtype:
        return x
    return call("cast", x, dtype=dtype.name)


# ---- in-place variants -----------------------------------------------------------------------
TENSOR_METHODS = {
    "neg": neg, "abs": abs, "sign": sign, "exp": exp, "log": log, "sqrt": sqrt, "rsqrt": rsqrt,
    "tanh": tanh, "sigmoid": sigmoid, "relu": relu, "sin": sin, "cos": cos, "erf": erf,
    "clamp": clamp, "clip": clamp, "add": add, "sub": sub, "mul": mul, "div": div, "pow": pow,
    "maximum": maximum, "minimum": minimum, "floor_divide": floor_divide,
    "remainder": remainder, "eq": eq, "ne": ne, "lt": lt, "le": le, "gt": gt,
    "ge": ge, "logical_and": logical_and, "logical_or": logical_or, "logical_not": logical_not,
    "logical_xor": logical_xor, "where": where, "log1p": log1p,
    "add_": inplace_method("add_", add), "sub_": inplace_method("sub_", sub),
    "mul_": inplace_method("mul_", mul), "div_": inplace_method("div_", div),
    "pow_": inplace_method("pow_", pow), "clamp_": inplace_method("clamp_", clamp),
    "neg_": inplace_method("neg_", neg), "exp_": inplace_method("exp_", exp),
    "log_": inplace_method("log_", log), "sqrt_": inplace_method("sqrt_", sqrt),
    "tanh_": inplace_method("tanh_", tanh), "sigmoid_": inplace_method("sigmoid_", sigmoid),
    "relu_": inplace_method("relu_", relu),
}

PUBLIC = (
    "neg", "abs", "sign", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "leaky_relu",
    "gelu", "sin", "cos", "erf", "clamp", "add", "sub", "mul", "div", "pow", "maximum",
    "minimum", "floor_divide", "remainder", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
    "logical_or", "logical_xor", "logical_not", "where", "cast", "log1p",
)
