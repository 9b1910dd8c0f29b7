"""OpInfo entries for the elementwise op group."""

from __future__ import annotations

import math

import numpy as np
from scipy import special

import graphc
from graphc.errors import ArgumentError, DTypeError, ShapeError
from tests.opinfo import ErrorInput, OpInfo, Sample, arr, away_from, positive


def _torch(name):
    def fn(*args, **kwargs):
        import torch

        return getattr(torch, name)(*args, **kwargs)

    fn.__name__ = f"torch_{name}"
    return fn


def _torch_f(name):
    def fn(*args, **kwargs):
        import torch.nn.functional as F

        return getattr(F, name)(*args, **kwargs)

    fn.__name__ = f"torch_F_{name}"
    return fn


def _unary_samples(make):
    def samples(rng):
        return [
            Sample((make(rng, 3, 4),), desc="3x4"),
            Sample((make(rng, 5),), desc="vector"),
            Sample((make(rng),), desc="0-d"),
        ]

    return samples


def _np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _np_gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + special.erf(x / math.sqrt(2)))


def _np_leaky(x, negative_slope=0.01):
    return np.where(x > 0, x, x * negative_slope)


def _np_rsqrt(x):
    return 1.0 / np.sqrt(x)


def _np_relu(x):
    return np.maximum(x, 0)


def _kinked(rng, *shape):
    return away_from(rng, *shape, points=(0.0,))


UNARY = [
    ("neg", graphc.neg, np.negative, arr),
    ("abs", graphc.abs, np.abs, _kinked),
    ("exp", graphc.exp, np.exp, arr),
    ("log", graphc.log, np.log, positive),
    ("sqrt", graphc.sqrt, np.sqrt, positive),
    ("rsqrt", graphc.rsqrt, _np_rsqrt, positive),
    ("tanh", graphc.tanh, np.tanh, arr),
    ("sigmoid", graphc.sigmoid, _np_sigmoid, arr),
    ("relu", graphc.relu, _np_relu, _kinked),
    ("sin", graphc.sin, np.sin, arr),
    ("cos", graphc.cos, np.cos, arr),
    ("erf", graphc.erf, special.erf, arr),
]

OP_INFOS: list[OpInfo] = [
    OpInfo(name, fn, ref, _unary_samples(make), (name,), torch_fn=_torch(name))
    for name, fn, ref, make in UNARY
]


def _sign_samples(rng):
    return [Sample((_kinked(rng, 4, 3),), desc="4x3")]


OP_INFOS.append(OpInfo("sign", graphc.sign, np.sign, _sign_samples, ("sign",),
                       torch_fn=_torch("sign"), differentiable=False))


def _leaky_samples(rng):
    return [Sample((_kinked(rng, 3, 4),), desc="default slope"),
            Sample((_kinked(rng, 6),), {"negative_slope": 0.2}, desc="slope 0.2")]


OP_INFOS.append(OpInfo("leaky_relu", graphc.leaky_relu, _np_leaky, _leaky_samples,
                       ("leaky_relu",), torch_fn=_torch_f("leaky_relu")))


def _gelu_samples(rng):
    return [Sample((arr(rng, 3, 4),), desc="exact"),
            Sample((arr(rng, 5),), {"approximate": "tanh"}, desc="tanh")]


def _gelu_errors(rng):
    return [ErrorInput(Sample((arr(rng, 3),), {"approximate": "fast"}), ArgumentError,
                       "approximate must be 'none' or 'tanh'")]


OP_INFOS.append(OpInfo("gelu", graphc.gelu, _np_gelu, _gelu_samples, ("gelu",),
                       torch_fn=_torch_f("gelu"), error_inputs=_gelu_errors))


def _clamp_samples(rng):
    x = away_from(rng, 4, 5, points=(-0.5, 0.8))
    return [Sample((x,), {"min": -0.5, "max": 0.8}, desc="both"),
            Sample((x,), {"min": -0.5}, desc="min only"),
            Sample((x,), {"max": 0.8}, desc="max only")]


def _np_clamp(x, min=None, max=None):  # noqa: A002
    return np.clip(x, min, max)


def _clamp_errors(rng):
    return [ErrorInput(Sample((arr(rng, 3),)), ArgumentError, "At least one of 'min' or 'max'")]


OP_INFOS.append(OpInfo("clamp", graphc.clamp, _np_clamp, _clamp_samples, ("clamp",),
                       torch_fn=_torch("clamp"), error_inputs=_clamp_errors))


# ---- binary ----------------------------------------------------------------------------------
def _binary_samples(make_a, make_b=None):
    make_b = make_b or make_a

    def samples(rng):
        return [
            Sample((make_a(rng, 3, 4), make_b(rng, 3, 4)), desc="same shape"),
            Sample((make_a(rng, 2, 3, 4), make_b(rng, 4)), desc="broadcast trailing"),
            Sample((make_a(rng, 3, 1), make_b(rng, 1, 4)), desc="broadcast both"),
            Sample((make_a(rng, 3), make_b(rng)), desc="0-d operand"),
        ]

    return samples


def _broadcast_error(rng):
    return [ErrorInput(Sample((arr(rng, 2, 3), arr(rng, 2))), ShapeError,
                       r"The size of tensor a \(3\) must match the size of tensor b \(2\) at "
                       r"non-singleton dimension 1")]


def _np_pow(a, b):
    return np.power(a, b)


def _pow_samples(rng):
    return [Sample((positive(rng, 3, 4), arr(rng, 3, 4)), desc="tensor exponent"),
            Sample((arr(rng, 4), 2.0), desc="square"),
            Sample((positive(rng, 2, 3), 0.5), desc="sqrt-like")]


def _ties_free(rng, *shape):
    return arr(rng, *shape)


BINARY = [
    ("add", graphc.add, np.add, _binary_samples(arr)),
    ("sub", graphc.sub, np.subtract, _binary_samples(arr)),
    ("mul", graphc.mul, np.multiply, _binary_samples(arr)),
    ("div", graphc.div, np.true_divide, _binary_samples(arr, positive)),
    ("pow", graphc.pow, _np_pow, _pow_samples),
    ("maximum", graphc.maximum, np.maximum, _binary_samples(_ties_free)),
    ("minimum", graphc.minimum, np.minimum, _binary_samples(_ties_free)),
]

for _name, _fn, _ref, _samples in BINARY:
    OP_INFOS.append(OpInfo(_name, _fn, _ref, _samples, (_name,), torch_fn=_torch(_name),
                           error_inputs=_broadcast_error))


def _int_samples(rng):
    a = rng.integers(-5, 5, size=(3, 4))
    b = rng.integers(1, 5, size=(4,))
    return [Sample((a, b), desc="int64 broadcast")]


def _int_ref(name):
    def ref(a, b):
        return getattr(np, name)(a, b)

    return ref


for _name, _fn, _np_name in (("add_int", graphc.add, "add"), ("mul_int", graphc.mul, "multiply"),
                             ("div_int", graphc.div, "true_divide")):
    OP_INFOS.append(OpInfo(_name, _fn, _int_ref(_np_name), _int_samples, (),
                           torch_fn=_torch(_name.split("_")[0]), differentiable=False,
                           atol=1e-6))


COMPARE = [("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
           ("gt", np.greater), ("ge", np.greater_equal)]


def _compare_samples(rng):
    a = rng.integers(-2, 3, size=(3, 4)).astype(np.float32)
    b = rng.integers(-2, 3, size=(4,)).astype(np.float32)
    return [Sample((a, b), desc="with ties")]


for _name, _ref in COMPARE:
    OP_INFOS.append(OpInfo(_name, getattr(graphc, _name), _ref, _compare_samples, (_name,),
                           torch_fn=_torch(_name), differentiable=False, exact=True))


def _logical_samples(rng):
    return [Sample((rng.random((3, 4)) > 0.5, rng.random((4,)) > 0.5), desc="bool")]


for _name in ("logical_and", "logical_or", "logical_xor"):
    OP_INFOS.append(OpInfo(_name, getattr(graphc, _name), getattr(np, _name), _logical_samples,
                           (_name,), torch_fn=_torch(_name), differentiable=False, exact=True))


def _not_samples(rng):
    return [Sample((rng.random((3, 4)) > 0.5,), desc="bool")]


OP_INFOS.append(OpInfo("logical_not", graphc.logical_not, np.logical_not, _not_samples,
                       ("logical_not",), torch_fn=_torch("logical_not"), differentiable=False,
                       exact=True))


def _where_samples(rng):
    return [Sample((rng.random((3, 4)) > 0.5, arr(rng, 3, 4), arr(rng, 4)), desc="broadcast"),
            Sample((rng.random((3, 1)) > 0.5, arr(rng, 1, 4), arr(rng)), desc="0-d other")]


def _where_errors(rng):
    return [ErrorInput(Sample((arr(rng, 3), arr(rng, 3), arr(rng, 3))), DTypeError,
                       "expected condition of dtype bool")]


OP_INFOS.append(OpInfo("where", graphc.where, np.where, _where_samples, ("where",),
                       torch_fn=_torch("where"), error_inputs=_where_errors))


def _cast_samples(rng):
    return [Sample((arr(rng, 3, 4),), {"dtype": graphc.float64}, desc="to float64"),
            Sample((arr(rng, 5) * 3,), {"dtype": graphc.int64}, desc="to int64 (truncates)",
                   grad_args=())]


def _np_cast(x, dtype):
    return x.astype(dtype.np)


def _torch_cast(x, dtype):
    import torch

    return x.to(getattr(torch, dtype.name))


OP_INFOS.append(OpInfo("cast", graphc.cast, _np_cast, _cast_samples, ("cast",),
                       torch_fn=_torch_cast))


def _divmod_samples(rng):
    a = rng.uniform(-5, 5, size=(3, 4)).astype(np.float32)
    b = rng.choice([-2.5, -1.5, 1.25, 3.0], size=(4,)).astype(np.float32)
    ints = rng.integers(-9, 9, size=(3, 4))
    return [Sample((a, b), desc="float broadcast"),
            Sample((ints, rng.choice([-3, 2, 4], size=(3, 4))), desc="int64", grad_args=())]


def _remainder_grad_samples(rng):
    # Keep a/b away from integers, where remainder jumps.
    b = rng.choice([-2.5, 1.25, 3.0], size=(4,))
    q = rng.integers(-3, 3, size=(3, 4)) + rng.uniform(0.2, 0.8, size=(3, 4))
    return [Sample(((q * b).astype(np.float32), b.astype(np.float32)), desc="float broadcast")]


def _divmod_errors(rng):
    return [ErrorInput(Sample((np.array([1, 2]), np.array([1, 0]))), ArgumentError,
                       "ZeroDivisionError")]


def _remainder_samples(rng):
    return _divmod_samples(rng)[1:] + _remainder_grad_samples(rng)


def _clamp_int_samples(rng):
    x = rng.integers(-5, 5, size=(6,))
    return [Sample((x,), {"min": -2, "max": 3}, desc="int bounds stay int64"),
            Sample((x,), {"min": -2.5}, desc="float bound gives float32")]


OP_INFOS += [
    OpInfo("floor_divide", graphc.floor_divide, np.floor_divide, _divmod_samples,
           ("floor_divide",), torch_fn=_torch("floor_divide"), differentiable=False,
           error_inputs=_divmod_errors),
    OpInfo("remainder", graphc.remainder, np.mod, _remainder_samples, ("remainder",),
           torch_fn=_torch("remainder"), error_inputs=_divmod_errors),
    OpInfo("clamp_int", graphc.clamp, _np_clamp, _clamp_int_samples, (),
           torch_fn=_torch("clamp"), differentiable=False, exact=True),
]


# ---- the fused op: a body of elementwise instructions and a reduction ------------------------
_FUSED_BODY = (("mul", (0, 1), ()), ("add", (3, 2), ()), ("relu", (4,), ()),
               ("reduce_sum", (5,), (("axes", (1,)), ("keepdim", False))))


def _fused_call(*inputs, body=_FUSED_BODY, outputs=(5, 6)):
    from graphc.ops.registry import call

    return call("fused", *inputs, body=body, outputs=outputs)


def _fused_ref(x, w, b):
    y = np.maximum(x * w + b, 0)
    return y, y.sum(axis=1)


def _fused_samples(rng):
    return [Sample((away_from(rng, 3, 4), arr(rng, 4), arr(rng, 3, 1)), desc="broadcast")]


def _fused_errors(rng):
    from graphc.ops.fused import FusedBodyError

    x = arr(rng, 3)
    return [
        ErrorInput(Sample((x,), {"body": (("relu", (3,), ()),), "outputs": (1,)}),
                   FusedBodyError, "refers to %3"),
        ErrorInput(Sample((x,), {"body": (("frobnicate", (0,), ()),), "outputs": (1,)}),
                   FusedBodyError, "unknown op 'frobnicate'"),
        ErrorInput(Sample((x, arr(rng, 4)), {"body": (("add", (0, 1), ()),), "outputs": (2,)}),
                   ShapeError, "must match"),
    ]


OP_INFOS.append(OpInfo("fused", _fused_call, _fused_ref, _fused_samples, ("fused",),
                       differentiable=False, error_inputs=_fused_errors))
