"""OpInfo entries for graphc.ops.mathops: rounding, inverse and hyperbolic trig,
expm1/log2/log10, atan2 and fmod."""

from __future__ import annotations

import numpy as np

import graphc
from graphc.errors import ArgumentError, DTypeError, ShapeError
from tests.opinfo import ErrorInput, OpInfo, Sample, arr, positive


def _torch(name):
    def fn(*args, **kwargs):
        import torch

        return getattr(torch, name)(*args, **kwargs)

    fn.__name__ = f"torch_{name}"
    return fn


def _unary_samples(make):
    def samples(rng):
        return [Sample((make(rng, 3, 4),), desc="3x4"), Sample((make(rng, 5),), desc="vector"),
                Sample((make(rng),), desc="0-d")]

    return samples


def _off_integers(rng, *shape):
    """Values whose fractional part is in [0.1, 0.4] or [0.6, 0.9]: no rounding edge within
    the finite-difference step, no tie."""
    whole = rng.integers(-4, 4, size=shape)
    frac = rng.uniform(0.1, 0.4, size=shape) + rng.integers(0, 2, size=shape) * 0.5
    return np.asarray(whole + frac, dtype=np.float32)


def _unit(rng, *shape):
    return np.asarray(rng.uniform(-0.9, 0.9, size=shape), dtype=np.float32)


def _small(rng, *shape):
    return np.asarray(rng.uniform(-1.2, 1.2, size=shape), dtype=np.float32)


def _np_round(x):
    return np.rint(x)


UNARY = [
    ("floor", graphc.floor, np.floor, _off_integers),
    ("ceil", graphc.ceil, np.ceil, _off_integers),
    ("round", graphc.round, _np_round, _off_integers),
    ("trunc", graphc.trunc, np.trunc, _off_integers),
    ("tan", graphc.tan, np.tan, _small),
    ("atan", graphc.atan, np.arctan, arr),
    ("asin", graphc.asin, np.arcsin, _unit),
    ("acos", graphc.acos, np.arccos, _unit),
    ("sinh", graphc.sinh, np.sinh, arr),
    ("cosh", graphc.cosh, np.cosh, arr),
    ("expm1", graphc.expm1, np.expm1, arr),
    ("log2", graphc.log2, np.log2, positive),
    ("log10", graphc.log10, np.log10, positive),
]

OP_INFOS: list[OpInfo] = [
    OpInfo(name, fn, ref, _unary_samples(make), (name,), torch_fn=_torch(name))
    for name, fn, ref, make in UNARY
]


# ---- rounding: ties to even, integer inputs, decimals, bool refused --------------------------
def _ties_samples(rng):
    ties = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 1e-8, 7.0], dtype=np.float32)
    return [Sample((ties,), desc="halves to even"),
            Sample((rng.integers(-5, 5, size=(4,)),), desc="int64 as is")]


def _bool_error(name):
    def errors(rng):
        return [ErrorInput(Sample((np.array([True, False]),)), DTypeError,
                           f"\"{name}_vml_cpu\" not implemented for 'Bool'")]

    return errors


for _name, _ref in (("floor", np.floor), ("ceil", np.ceil), ("round", np.rint),
                    ("trunc", np.trunc)):
    OP_INFOS.append(OpInfo(f"{_name}.exact", getattr(graphc, _name), _ref, _ties_samples,
                           (_name,), torch_fn=_torch(_name), differentiable=False, exact=True,
                           error_inputs=_bool_error(_name)))


def _round_decimals_samples(rng):
    return [Sample((_off_integers(rng, 3, 4) * 10.0,), {"decimals": 1}, desc="decimals=1"),
            Sample((_off_integers(rng, 5) * 1000.0,), {"decimals": -2}, desc="decimals=-2")]


def _np_round_decimals(x, decimals=0):
    scale = 10.0 ** abs(decimals)
    return np.rint(x * scale) / scale if decimals > 0 else np.rint(x / scale) * scale


OP_INFOS.append(OpInfo("round.decimals", graphc.round, _np_round_decimals,
                       _round_decimals_samples, ("round", "mul", "div"),
                       torch_fn=_torch("round"), differentiable=False))


# ---- integer inputs of the float ops: float32 results ----------------------------------------
def _int_unary_samples(rng):
    return [Sample((rng.integers(1, 9, size=(2, 3)),), desc="int64")]


for _name, _ref in (("tan", np.tan), ("atan", np.arctan), ("sinh", np.sinh),
                    ("cosh", np.cosh), ("expm1", np.expm1), ("log2", np.log2),
                    ("log10", np.log10)):
    OP_INFOS.append(OpInfo(f"{_name}.int", getattr(graphc, _name), _ref, _int_unary_samples,
                           (_name,), torch_fn=_torch(_name), differentiable=False))


# ---- atan2 and fmod --------------------------------------------------------------------------
def _atan2_samples(rng):
    return [Sample((arr(rng, 3, 4), arr(rng, 3, 4)), desc="same shape"),
            Sample((arr(rng, 2, 3, 4), arr(rng, 4)), desc="broadcast trailing"),
            Sample((arr(rng, 3, 1), arr(rng, 1, 4)), desc="broadcast both"),
            Sample((arr(rng, 3), arr(rng)), desc="0-d other")]


def _broadcast_error(rng):
    return [ErrorInput(Sample((arr(rng, 2, 3), arr(rng, 2))), ShapeError,
                       r"The size of tensor a \(3\) must match the size of tensor b \(2\) at "
                       r"non-singleton dimension 1")]


OP_INFOS.append(OpInfo("atan2", graphc.atan2, np.arctan2, _atan2_samples, ("atan2",),
                       torch_fn=_torch("atan2"), error_inputs=_broadcast_error))


def _fmod_operands(rng, *shape):
    """Dividends whose quotient by the divisors below is 0.1-0.4 or 0.6-0.9 past an integer:
    fmod is smooth there (its jumps are where a / b is an integer)."""
    return _off_integers(rng, *shape) * 1.5


def _fmod_samples(rng):
    return [Sample((_fmod_operands(rng, 3, 4), 1.5), desc="scalar divisor"),
            Sample((_fmod_operands(rng, 3, 4), np.full((4,), -1.5, np.float32)),
                   desc="negative divisor, broadcast"),
            Sample((rng.integers(-9, 9, size=(5,)), rng.integers(1, 4, size=(5,))),
                   grad_args=(), desc="int64")]


def _fmod_errors(rng):
    return [ErrorInput(Sample((np.array([3, -3]), np.array([0, 1]))), ArgumentError,
                       "ZeroDivisionError"),
            *_broadcast_error(rng)]


OP_INFOS.append(OpInfo("fmod", graphc.fmod, np.fmod, _fmod_samples, ("fmod",),
                       torch_fn=_torch("fmod"), error_inputs=_fmod_errors))
