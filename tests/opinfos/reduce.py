"""OpInfo entries for the 'reduce' op group: sum, mean, amax/amin, max/min, argmax/argmin,
var/std, logsumexp, norm, all/any.

Samples for max/min gradcheck use distinct random values (no ties); separate `*_ties` entries
check, against PyTorch only, how the gradient is shared at ties (evenly for amax/amin, to the
returned index for max(x, dim)).
"""

from __future__ import annotations

import numpy as np
from scipy import special

import graphc
from graphc.errors import ArgumentError, DTypeError, ShapeError
from tests.opinfo import ErrorInput, OpInfo, Sample, arr

_TIE_SKIP = {"gradcheck": "ties are non-differentiable points; the torch entries check how the "
                          "gradient is shared there"}


def _torch(name):
    def fn(*args, **kwargs):
        import torch

        return getattr(torch, name)(*args, **kwargs)

    fn.__name__ = f"torch_{name}"
    return fn


def _axis(x, dim):
    """numpy's axis for PyTorch's dim (None and () mean every axis)."""
    if dim is None or dim == () or dim == [] or x.ndim == 0:
        return None
    return tuple(dim) if isinstance(dim, (tuple, list)) else dim


def _np_reduce(fn, int_result=False):
    def ref(x, dim=None, keepdim=False):
        dtype = np.int64 if int_result and not np.issubdtype(x.dtype, np.floating) else None
        kw = {"dtype": dtype} if dtype is not None else {}
        return np.asarray(fn(x, axis=_axis(x, dim), keepdims=keepdim, **kw))

    ref.__name__ = f"np_{fn.__name__}"
    return ref


def _mean(x, axis=None, keepdims=False):
    """np.mean without the empty-slice warning (an empty mean is nan, as in PyTorch)."""
    count = np.prod([x.shape[a] for a in range(x.ndim)] if axis is None else
                    [x.shape[a] for a in np.atleast_1d(axis)])
    with np.errstate(invalid="ignore"):
        return np.sum(x, axis=axis, keepdims=keepdims) / count


def _np_max_dim(x, dim, keepdim=False):
    return np.max(x, axis=dim, keepdims=keepdim), np.argmax(x, axis=dim, keepdims=keepdim)


def _np_min_dim(x, dim, keepdim=False):
    return np.min(x, axis=dim, keepdims=keepdim), np.argmin(x, axis=dim, keepdims=keepdim)


def _np_arg(fn):
    def ref(x, dim=None, keepdim=False):
        out = fn(x, axis=dim)
        if keepdim:
            out = np.reshape(out, (1,) * x.ndim) if dim is None else np.expand_dims(out, dim)
        return np.asarray(out, dtype=np.int64)

    ref.__name__ = f"np_{fn.__name__}"
    return ref


def _np_var(x, dim=None, unbiased=None, keepdim=False, correction=None):
    if correction is None:
        correction = 0 if unbiased is False else 1
    return np.asarray(np.var(x, axis=_axis(x, dim), ddof=correction, keepdims=keepdim))


def _np_std(x, dim=None, unbiased=None, keepdim=False, correction=None):
    return np.sqrt(_np_var(x, dim, unbiased, keepdim, correction))


def _np_logsumexp(x, dim, keepdim=False):
    return np.asarray(special.logsumexp(x, axis=_axis(x, dim), keepdims=keepdim))


def _np_norm(x, p="fro", dim=None, keepdim=False):
    p = 2.0 if p == "fro" else float(p)
    a = np.abs(x)
    axis = _axis(x, dim)
    if p == np.inf:
        return np.max(a, axis=axis, keepdims=keepdim)
    if p == 0:
        return np.sum(a != 0, axis=axis, keepdims=keepdim).astype(x.dtype)
    return np.sum(a**p, axis=axis, keepdims=keepdim) ** (1.0 / p)


def _np_all(x, dim=None, keepdim=False):
    return np.all(x != 0, axis=_axis(x, dim), keepdims=keepdim)


def _np_any(x, dim=None, keepdim=False):
    return np.any(x != 0, axis=_axis(x, dim), keepdims=keepdim)


# ---- samples ---------------------------------------------------------------------------------
def _tie_full_samples(rng):
    return [Sample((_ties(),), desc="ties")]


def _dim_samples(rng):
    """Float inputs over the ways a dim can be given."""
    return [
        Sample((arr(rng, 3, 4),), desc="all axes"),
        Sample((arr(rng, 3, 4),), {"dim": 1}, desc="dim=1"),
        Sample((arr(rng, 2, 3, 4),), {"dim": (0, 2), "keepdim": True}, desc="dims (0,2) keep"),
        Sample((arr(rng, 2, 3, 4),), {"dim": -1}, desc="dim=-1"),
        Sample((arr(rng, 2, 3),), {"dim": ()}, desc="dim=() is all"),
        Sample((arr(rng),), desc="0-d"),
        Sample((arr(rng),), {"dim": 0, "keepdim": True}, desc="0-d dim=0"),
    ]


def _sum_samples(rng):
    return _dim_samples(rng) + [
        Sample((rng.integers(-5, 5, size=(3, 4)),), {"dim": 0}, desc="int64"),
        Sample((rng.random((3, 4)) > 0.5,), {"dim": 1}, desc="bool counts as int64"),
        Sample((arr(rng, 0, 3),), {"dim": 0}, desc="empty axis"),
    ]


def _prod_samples(rng):
    with_zero = arr(rng, 3, 4)
    with_zero[0, 1] = 0.0
    two_zeros = arr(rng, 3, 4)
    two_zeros[1, 0] = two_zeros[1, 2] = 0.0
    return [
        Sample((arr(rng, 3, 4),), desc="all elements"),
        Sample((arr(rng, 3, 4),), {"dim": 1}, desc="dim=1"),
        Sample((arr(rng, 2, 3, 4),), {"dim": -3, "keepdim": True}, desc="dim=-3 keep"),
        Sample((with_zero,), {"dim": 1}, desc="one zero in a row"),
        Sample((two_zeros,), {"dim": 1}, desc="two zeros in a row"),
        Sample((with_zero,), desc="one zero, all elements"),
        Sample((arr(rng),), {"dim": 0}, desc="0-d"),
        Sample((rng.integers(-3, 4, size=(3, 4)),), {"dim": 0}, desc="int64"),
        Sample((rng.random((3, 4)) > 0.3,), desc="bool -> int64"),
    ]


def _prod_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 2, 3),), {"dim": 2}), ArgumentError, "Dimension out of range"),
        ErrorInput(Sample((arr(rng, 2, 3),), {"dim": (0, 1)}), TypeError,
                   "argument 'dim' must be int, not tuple"),
    ]


def _np_prod(x, dim=None, keepdim=False):
    dtype = None if np.issubdtype(x.dtype, np.floating) else np.int64
    return np.asarray(np.prod(x, axis=None if x.ndim == 0 else dim, keepdims=keepdim,
                              dtype=dtype))


def _mean_samples(rng):
    return _dim_samples(rng) + [Sample((arr(rng, 0, 3),), {"dim": 0}, desc="empty: nan")]


def _amax_samples(rng):
    return [
        Sample((arr(rng, 3, 4),), desc="all axes"),
        Sample((arr(rng, 3, 4),), {"dim": 1}, desc="dim=1"),
        Sample((arr(rng, 2, 3, 4),), {"dim": (0, 2), "keepdim": True}, desc="dims keep"),
        Sample((arr(rng, 2, 3),), {"dim": -2}, desc="dim=-2"),
        Sample((arr(rng),), desc="0-d"),
        Sample((rng.integers(-5, 5, size=(3, 4)),), {"dim": 1}, desc="int64"),
    ]


def _ties():
    return np.array([[1.0, 3.0, 3.0, 0.5], [2.0, 2.0, 2.0, 2.0], [-1.0, 0.0, -1.0, 0.0]],
                    dtype=np.float32)


def _amax_tie_samples(rng):
    return [Sample((_ties(),), desc="ties, all"), Sample((_ties(),), {"dim": 1}, desc="ties")]


def _full_samples(rng):
    return [
        Sample((arr(rng, 3, 4),), desc="3x4"),
        Sample((arr(rng, 5),), desc="vector"),
        Sample((arr(rng),), desc="0-d"),
        Sample((rng.integers(-5, 5, size=(3, 4)),), desc="int64"),
        Sample((rng.random((3, 4)) > 0.5,), desc="bool"),
    ]


def _dim_result_samples(rng):
    return [
        Sample((arr(rng, 3, 4),), {"dim": 1}, desc="dim=1"),
        Sample((arr(rng, 3, 4),), {"dim": 0, "keepdim": True}, desc="dim=0 keep"),
        Sample((arr(rng, 2, 3, 4),), {"dim": -2}, desc="3-D dim=-2"),
        Sample((arr(rng),), {"dim": 0}, desc="0-d"),
        Sample((rng.integers(-5, 5, size=(3, 4)),), {"dim": 1}, desc="int64"),
    ]


def _dim_tie_samples(rng):
    return [Sample((_ties(),), {"dim": 1}, desc="ties"),
            Sample((_ties(),), {"dim": 0, "keepdim": True}, desc="ties keep")]


def _binary_samples(rng):
    return [Sample((arr(rng, 3, 4), arr(rng, 4)), desc="broadcast")]


def _arg_samples(rng):
    return [
        Sample((arr(rng, 3, 4),), desc="flattened"),
        Sample((arr(rng, 3, 4),), {"dim": None, "keepdim": True}, desc="flattened keep"),
        Sample((arr(rng, 3, 4),), {"dim": 1}, desc="dim=1"),
        Sample((arr(rng, 2, 3, 4),), {"dim": -3, "keepdim": True}, desc="dim=-3 keep"),
        Sample((_ties(),), {"dim": 1}, desc="ties: first index"),
        Sample((rng.integers(-3, 3, size=(4, 5)),), {"dim": 0}, desc="int64"),
        Sample((arr(rng),), {"dim": 0}, desc="0-d"),
    ]


def _var_samples(rng):
    return [
        Sample((arr(rng, 3, 4),), desc="all, unbiased"),
        Sample((arr(rng, 3, 4),), {"dim": 1, "keepdim": True}, desc="dim=1 keep"),
        Sample((arr(rng, 2, 3, 4),), {"dim": (0, 2), "correction": 0}, desc="correction=0"),
        Sample((arr(rng, 3, 4),), {"dim": 0, "unbiased": False}, desc="unbiased=False"),
        Sample((arr(rng, 4, 3),), {"dim": -1, "correction": 2}, desc="correction=2"),
        Sample((arr(rng, 6) + np.float32(1000.0),), desc="far from zero"),
    ]


def _logsumexp_samples(rng):
    return [
        Sample((arr(rng, 3, 4),), {"dim": 1}, desc="dim=1"),
        Sample((arr(rng, 2, 3, 4),), {"dim": (0, 2), "keepdim": True}, desc="dims keep"),
        Sample((arr(rng, 3, 4) * 100 + 500,), {"dim": -1}, desc="large: no overflow"),
        Sample((arr(rng, 3, 4) - 800,), {"dim": 0}, desc="very negative: no underflow"),
    ]


def _norm_samples(rng):
    return [
        Sample((arr(rng, 3, 4),), desc="fro"),
        Sample((arr(rng, 3, 4),), {"p": 2, "dim": 1, "keepdim": True}, desc="p=2 dim=1"),
        Sample((arr(rng, 3, 4),), {"p": 1, "dim": 0}, desc="p=1"),
        Sample((arr(rng, 3, 4),), {"p": float("inf"), "dim": 1}, desc="p=inf"),
        Sample((arr(rng, 3, 4),), {"p": 3.0}, desc="p=3"),
        Sample((np.zeros((2, 3), np.float32),), {"dim": 1}, desc="origin: zero gradient"),
    ]


def _logical_samples(rng):
    return [
        Sample((rng.random((3, 4)) > 0.3,), desc="bool all axes"),
        Sample((rng.random((3, 4)) > 0.3,), {"dim": 1}, desc="bool dim=1"),
        Sample((rng.integers(0, 2, size=(2, 3, 4)),), {"dim": (0, 2), "keepdim": True},
               desc="int64 dims"),
        Sample((np.array([[0.0, 1.5], [2.0, 3.0]], np.float32),), {"dim": 0}, desc="float"),
    ]


# ---- error inputs ----------------------------------------------------------------------------
def _axis_errors(rng):
    x = arr(rng, 2, 3)
    return [
        ErrorInput(Sample((x,), {"dim": 2}), ArgumentError,
                   r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"),
        ErrorInput(Sample((x,), {"dim": (0, -2)}), ArgumentError,
                   "appears multiple times in the list of dims"),
    ]


def _mean_errors(rng):
    return _axis_errors(rng) + [
        ErrorInput(Sample((np.ones((2, 3), np.int64),)), DTypeError,
                   r"mean\(\): could not infer output dtype. Input dtype must be either a "
                   r"floating point or complex dtype. Got: Long"),
    ]


def _amax_errors(rng):
    return _axis_errors(rng) + [
        ErrorInput(Sample((arr(rng, 0, 3),), {"dim": 0}), ShapeError,
                   "Expected reduction dim 0 to have non-zero size"),
        ErrorInput(Sample((arr(rng, 0, 3),)), ShapeError,
                   r"amax\(\): Expected reduction dim to be specified for input.numel\(\) == 0"),
    ]


def _max_errors(rng):
    return [ErrorInput(Sample((arr(rng, 0, 3),)), ShapeError,
                       r"max\(\): Expected reduction dim to be specified for input.numel\(\) == 0")]


def _max_dim_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 2, 3),), {"dim": 2}), ArgumentError, "Dimension out of range"),
        ErrorInput(Sample((arr(rng, 2, 0),), {"dim": 1}), ShapeError,
                   "Expected reduction dim 1 to have non-zero size"),
    ]


def _arg_errors(rng):
    return [
        ErrorInput(Sample((rng.random((2, 3)) > 0.5,)), DTypeError, "does not support bool input"),
        ErrorInput(Sample((arr(rng, 0, 3),)), ShapeError,
                   r"Expected reduction dim to be specified for input.numel\(\) == 0"),
        ErrorInput(Sample((arr(rng, 2, 3),), {"dim": (0, 1)}), TypeError,
                   "argument 'dim' must be int, not tuple"),
        ErrorInput(Sample((arr(rng, 2, 3),), {"dim": -3}), ArgumentError,
                   "Dimension out of range"),
    ]


def _var_errors(rng):
    return _axis_errors(rng) + [
        ErrorInput(Sample((np.ones((2, 3), np.int64),)), DTypeError,
                   "std and var only support floating point and complex dtypes"),
        ErrorInput(Sample((arr(rng, 2, 3),), {"unbiased": True, "correction": 1}), TypeError,
                   "invalid combination of arguments"),
    ]


def _norm_errors(rng):
    return _axis_errors(rng) + [
        ErrorInput(Sample((np.ones((2, 3), np.int64),)), DTypeError,
                   "Expected a floating point or complex tensor as input. Got Long"),
        ErrorInput(Sample((arr(rng, 2, 3),), {"p": "nuc"}), ArgumentError, "matrix norm"),
    ]


# ---- wrappers for arguments that differ between graphc and torch ---------------------------
def _sum_float64(x):
    return graphc.sum(x, dim=1, dtype=graphc.float64)


def _torch_sum_float64(x):
    import torch

    return torch.sum(x, dim=1, dtype=torch.float64)


def _np_sum_float64(x):
    return np.sum(x.astype(np.float64), axis=1)


def _sum_dtype_samples(rng):
    return [Sample((arr(rng, 3, 4),), desc="float32 -> float64"),
            Sample((rng.integers(-5, 5, size=(3, 4)),), desc="int64 -> float64")]


def _mean_float64(x):
    return graphc.mean(x, dtype=graphc.float64)


def _torch_mean_float64(x):
    import torch

    return torch.mean(x, dtype=torch.float64)


def _np_mean_float64(x):
    return np.mean(x.astype(np.float64))


_RED = ("reduce_sum",)
_TIE = {"ref": "covered by the tie-free entry", **_TIE_SKIP}

OP_INFOS: list[OpInfo] = [
    OpInfo("sum", graphc.sum, _np_reduce(np.sum, int_result=True), _sum_samples, _RED,
           torch_fn=_torch("sum"), error_inputs=_axis_errors),
    OpInfo("sum_dtype", _sum_float64, _np_sum_float64, _sum_dtype_samples, _RED + ("cast",),
           torch_fn=_torch_sum_float64),
    OpInfo("mean", graphc.mean, _np_reduce(_mean), _mean_samples, ("reduce_mean",),
           torch_fn=_torch("mean"), error_inputs=_mean_errors),
    OpInfo("mean_dtype", _mean_float64, _np_mean_float64, _sum_dtype_samples,
           ("reduce_mean", "cast"), torch_fn=_torch_mean_float64),
    OpInfo("prod", graphc.prod, _np_prod, _prod_samples, ("reduce_prod",),
           torch_fn=_torch("prod"), error_inputs=_prod_errors),
    OpInfo("amax", graphc.amax, _np_reduce(np.max), _amax_samples, ("reduce_max",),
           torch_fn=_torch("amax"), error_inputs=_amax_errors),
    OpInfo("amin", graphc.amin, _np_reduce(np.min), _amax_samples, ("reduce_min",),
           torch_fn=_torch("amin")),
    OpInfo("amax_ties", graphc.amax, _np_reduce(np.max), _amax_tie_samples, ("reduce_max",),
           torch_fn=_torch("amax"), skips=_TIE),
    OpInfo("amin_ties", graphc.amin, _np_reduce(np.min), _amax_tie_samples, ("reduce_min",),
           torch_fn=_torch("amin"), skips=_TIE),
    OpInfo("max", graphc.max, _np_reduce(np.max), _full_samples, ("reduce_max",),
           torch_fn=_torch("max"), error_inputs=_max_errors),
    OpInfo("min", graphc.min, _np_reduce(np.min), _full_samples, ("reduce_min",),
           torch_fn=_torch("min")),
    OpInfo("max_ties", graphc.max, _np_reduce(np.max), _tie_full_samples, ("reduce_max",),
           torch_fn=_torch("max"), skips=_TIE),
    OpInfo("max_dim", graphc.max, _np_max_dim, _dim_result_samples, ("reduce_max", "argmax",
           "arange", "eq", "where", "reduce_sum"), torch_fn=_torch("max"),
           error_inputs=_max_dim_errors),
    OpInfo("min_dim", graphc.min, _np_min_dim, _dim_result_samples, ("reduce_min", "argmin"),
           torch_fn=_torch("min"), error_inputs=_max_dim_errors),
    OpInfo("max_dim_ties", graphc.max, _np_max_dim, _dim_tie_samples, ("argmax",),
           torch_fn=_torch("max"), skips=_TIE),
    OpInfo("min_dim_ties", graphc.min, _np_min_dim, _dim_tie_samples, ("argmin",),
           torch_fn=_torch("min"), skips=_TIE),
    OpInfo("max_binary", graphc.max, np.maximum, _binary_samples, ("maximum",),
           torch_fn=_torch("max")),
    OpInfo("min_binary", graphc.min, np.minimum, _binary_samples, ("minimum",),
           torch_fn=_torch("min")),
    OpInfo("argmax", graphc.argmax, _np_arg(np.argmax), _arg_samples, ("argmax",),
           torch_fn=_torch("argmax"), differentiable=False, exact=True,
           error_inputs=_arg_errors),
    OpInfo("argmin", graphc.argmin, _np_arg(np.argmin), _arg_samples, ("argmin",),
           torch_fn=_torch("argmin"), differentiable=False, exact=True),
    OpInfo("var", graphc.var, _np_var, _var_samples, ("reduce_mean", "reduce_sum", "sub", "mul",
           "div"), torch_fn=_torch("var"), error_inputs=_var_errors),
    OpInfo("std", graphc.std, _np_std, _var_samples, ("reduce_mean", "reduce_sum", "sqrt"),
           torch_fn=_torch("std")),
    OpInfo("logsumexp", graphc.logsumexp, _np_logsumexp, _logsumexp_samples,
           ("reduce_max", "reduce_sum", "exp", "log"), torch_fn=_torch("logsumexp"),
           error_inputs=_axis_errors),
    OpInfo("norm", graphc.norm, _np_norm, _norm_samples, ("reduce_sum", "reduce_max", "abs",
           "pow", "sqrt", "where"), torch_fn=_torch("norm"), error_inputs=_norm_errors),
    OpInfo("all", graphc.all, _np_all, _logical_samples, ("reduce_sum", "logical_not", "eq"),
           torch_fn=_torch("all"), differentiable=False, exact=True, error_inputs=_axis_errors),
    OpInfo("any", graphc.any, _np_any, _logical_samples, ("reduce_sum", "ne", "gt"),
           torch_fn=_torch("any"), differentiable=False, exact=True),
]
