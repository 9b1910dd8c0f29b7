"""Elementwise math beyond graphc.ops.elementwise: rounding, inverse and hyperbolic trig,
expm1/log2/log10, atan2 and fmod, each a primitive with its own scalar op.

These are primitives (not compositions of other scalars) where a composite would be wrong or
lose accuracy: `round` is half-to-even, `fmod` takes the dividend's sign (C's fmod, unlike
`remainder`), `expm1` and `sinh` keep full relative accuracy near 0 where `exp(x) - 1`
cancels, `atan2` gets every quadrant and signed zero right. Each scalar name is rendered by
both backends (graphc/backends/cpu/scalars.py, graphc/backends/cuda/cudagen.py).

Dtypes follow PyTorch: the transcendental ops turn integer and bool inputs into float32;
floor/ceil/round/trunc keep integer dtypes (the identity there) and refuse bool as PyTorch
does; fmod promotes as `remainder` does and refuses an integer division by zero.

>>> import graphc
>>> graphc.round(graphc.tensor([0.5, 1.5, 2.5]))
tensor([0., 2., 2.])
"""

from __future__ import annotations

import numpy as np

from graphc.errors import ArgumentError, DTypeError
from graphc.errors import where as _where
from graphc.ops.grad_utils import sum_to, zeros_like
from graphc.ops.registry import ELEMENTWISE, OpDef, call, register
from graphc.ops.shapes import binary_type, float_unary
from graphc.types import TensorType, bool_


def _float_kernel(fn):
    """A numpy function with integer inputs computed in float32 (PyTorch's promotion)."""

    def kernel(x):
        if not np.issubdtype(x.dtype, np.floating):
            x = x.astype(np.float32)
        with np.errstate(all="ignore"):
            return fn(x)

    kernel.__name__ = f"{fn.__name__}_kernel"
    return kernel


def _float_op(name: str, fn, vjp, saved_inputs=(), saved_outputs=()):
    """Register a unary op with a float result (integers compute in float32)."""

    def infer(x: TensorType) -> TensorType:
        return float_unary(name, x)

    return register(OpDef(name, ELEMENTWISE, ("x",), infer, _float_kernel(fn), vjp,
                          scalar=name, saved_inputs=saved_inputs,
                          saved_outputs=saved_outputs))


# ---- rounding: floor, ceil, round (half to even), trunc ---------------------------------------
def _rounding_infer_for(name: str):
    def infer(x: TensorType) -> TensorType:
        if x.dtype is bool_:
            raise DTypeError(f"{_where(name)}: \"{name}_vml_cpu\" not implemented for 'Bool'")
        return x

    infer.__name__ = f"_{name}_infer"
    return infer


def _rounding_vjp(ctx, g):
    return (zeros_like(g),)  # piecewise constant: PyTorch's gradient is zeros


def _rounding(name: str, fn) -> None:
    def kernel(x):
        return fn(x) if np.issubdtype(x.dtype, np.floating) else x.copy()

    kernel.__name__ = f"_{name}_kernel"
    register(OpDef(name, ELEMENTWISE, ("x",), _rounding_infer_for(name), kernel, _rounding_vjp,
                   scalar=name))


_rounding("floor", np.floor)
_rounding("ceil", np.ceil)
_rounding("round", np.rint)  # rint rounds half to even, as torch.round
_rounding("trunc", np.trunc)


# ---- trigonometric and hyperbolic -------------------------------------------------------------
def _tan_vjp(ctx, g):
    y = ctx.outputs[0]
    return (g * (y * y + 1.0),)


_float_op("tan", np.tan, _tan_vjp, saved_outputs=(0,))


def _atan_vjp(ctx, g):
    x = ctx.inputs[0]
    return (g / (x * x + 1.0),)


_float_op("atan", np.arctan, _atan_vjp, saved_inputs=(0,))


def _asin_vjp(ctx, g):
    x = ctx.inputs[0]
    return (g * call("rsqrt", 1.0 - x * x),)


_float_op("asin", np.arcsin, _asin_vjp, saved_inputs=(0,))


def _acos_vjp(ctx, g):
    x = ctx.inputs[0]
    return (-g * call("rsqrt", 1.0 - x * x),)


_float_op("acos", np.arccos, _acos_vjp, saved_inputs=(0,))


def _sinh_vjp(ctx, g):
    return (g * call("cosh", ctx.inputs[0]),)


_float_op("sinh", np.sinh, _sinh_vjp, saved_inputs=(0,))


def _cosh_vjp(ctx, g):
    return (g * call("sinh", ctx.inputs[0]),)


_float_op("cosh", np.cosh, _cosh_vjp, saved_inputs=(0,))


# ---- exponentials and logarithms --------------------------------------------------------------
def _expm1_vjp(ctx, g):
    return (g * (ctx.outputs[0] + 1.0),)


_float_op("expm1", np.expm1, _expm1_vjp, saved_outputs=(0,))

_LN2 = 0.6931471805599453
_LN10 = 2.302585092994046


def _log2_vjp(ctx, g):
    return (g / (ctx.inputs[0] * _LN2),)


_float_op("log2", np.log2, _log2_vjp, saved_inputs=(0,))


def _log10_vjp(ctx, g):
    return (g / (ctx.inputs[0] * _LN10),)


_float_op("log10", np.log10, _log10_vjp, saved_inputs=(0,))


# ---- binary: atan2 and fmod -------------------------------------------------------------------
def _atan2_infer(a: TensorType, b: TensorType) -> TensorType:
    return float_unary("atan2", binary_type("atan2", a, b))


def _atan2_kernel(a, b):
    out = np.arctan2(a, b)
    floating = np.issubdtype(a.dtype, np.floating) or np.issubdtype(b.dtype, np.floating)
    return out if floating else out.astype(np.float32)


def _atan2_vjp(ctx, g):
    a, b = ctx.inputs
    need_a, need_b = ctx.needs_input_grad
    denom = a * a + b * b
    ga = sum_to(g * b / denom, ctx.input_types[0].shape) if need_a else None
    gb = sum_to(-g * a / denom, ctx.input_types[1].shape) if need_b else None
    return (ga, gb)


register(OpDef("atan2", ELEMENTWISE, ("a", "b"), _atan2_infer, _atan2_kernel, _atan2_vjp,
               scalar="atan2", saved_inputs=(0, 1)))


def _fmod_infer(a: TensorType, b: TensorType) -> TensorType:
    out = binary_type("fmod", a, b)
    if out.dtype is bool_:
        raise DTypeError(f"{_where('fmod')}: \"fmod_cpu\" not implemented for 'Bool'")
    return out


def _fmod_kernel(a, b):
    if not np.issubdtype(a.dtype, np.floating) and not np.issubdtype(b.dtype, np.floating):
        if (b == 0).any():
            raise ArgumentError(f"{_where('fmod')}: ZeroDivisionError")
    with np.errstate(all="ignore"):
        return np.fmod(a, b)  # the result takes the dividend's sign, as C's fmod


def _fmod_vjp(ctx, g):
    a, b = ctx.inputs
    need_a, need_b = ctx.needs_input_grad
    ga = sum_to(g, a.shape) if need_a else None
    gb = sum_to(-g * call("trunc", a / b), b.shape) if need_b else None
    return (ga, gb)


register(OpDef("fmod", ELEMENTWISE, ("a", "b"), _fmod_infer, _fmod_kernel, _fmod_vjp,
               scalar="fmod", saved_inputs=(0, 1)))


# ---- public functions -------------------------------------------------------------------------
def floor(input):  # noqa: A002 (PyTorch's argument names)
    """The largest integer <= x, elementwise (integer tensors are returned as they are)."""
    return call("floor", input)


def ceil(input):  # noqa: A002
    """The smallest integer >= x, elementwise."""
    return call("ceil", input)


def trunc(input):  # noqa: A002
    """x rounded toward zero, elementwise."""
    return call("trunc", input)


def fix(input):  # noqa: A002
    """trunc (PyTorch's alias)."""
    return call("trunc", input)


def round(input, *, decimals: int = 0):  # noqa: A001, A002
    """x rounded to the nearest integer, halves to even (`decimals`: to 10**-decimals).

    >>> graphc.round(graphc.tensor([1.2345]), decimals=2)
    tensor([1.2300])
    """
    if decimals == 0:
        return call("round", input)
    if not input.dtype.is_floating:
        return call("round", input)
    scale = 10.0 ** abs(int(decimals))  # PyTorch: x * 10^d rounded, then divided
    if decimals > 0:
        return call("round", input * scale) / scale
    return call("round", input / scale) * scale


def tan(input):  # noqa: A002
    """The tangent of x, elementwise."""
    return call("tan", input)


def atan(input):  # noqa: A002
    """The arctangent of x, elementwise, in (-pi/2, pi/2)."""
    return call("atan", input)


def asin(input):  # noqa: A002
    """The arcsine of x, elementwise (nan outside [-1, 1])."""
    return call("asin", input)


def acos(input):  # noqa: A002
    """The arccosine of x, elementwise (nan outside [-1, 1])."""
    return call("acos", input)


def sinh(input):  # noqa: A002
    """The hyperbolic sine of x, elementwise."""
    return call("sinh", input)


def cosh(input):  # noqa: A002
    """The hyperbolic cosine of x, elementwise."""
    return call("cosh", input)


def expm1(input):  # noqa: A002
    """exp(x) - 1, accurate near 0."""
    return call("expm1", input)


def log2(input):  # noqa: A002
    """The base-2 logarithm of x, elementwise."""
    return call("log2", input)


def log10(input):  # noqa: A002
    """The base-10 logarithm of x, elementwise."""
    return call("log10", input)


def atan2(input, other):  # noqa: A002
    """The angle of the point (other, input), elementwise, in [-pi, pi] (torch.atan2)."""
    return call("atan2", input, other)


def fmod(input, other):  # noqa: A002
    """input - trunc(input / other) * other: C's fmod, the result has the dividend's sign.

    >>> graphc.fmod(graphc.tensor([-3.0, 3.0]), 2)
    tensor([-1.,  1.])
    """
    return call("fmod", input, other)


arctan, arcsin, arccos, arctan2 = atan, asin, acos, atan2  # numpy's names, as PyTorch has

TENSOR_METHODS: dict = {}  # Tensor methods are written out in graphc.tensor_methods

PUBLIC = ("floor", "ceil", "trunc", "fix", "round", "tan", "atan", "asin", "acos", "sinh",
          "cosh", "expm1", "log2", "log10", "atan2", "fmod", "arctan", "arcsin", "arccos",
          "arctan2")
