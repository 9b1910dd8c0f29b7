"""OpInfo entries for the composites of PyTorch's wider surface (graphc.utils.math_composites,
shape_composites, selection, graphc.creation): each is a decomposition into primitives, so
these entries check its forward against numpy and PyTorch, its gradient, and (through
tests/compile_opinfo.py) its traced and compiled form. The eager-only ops (nonzero, unique,
masked_select...) are checked in tests/test_torch_surface.py, not here: compiling them is a
TraceError by design."""

from __future__ import annotations

import numpy as np

import graphc
from graphc.errors import DTypeError, ShapeError
from tests.opinfo import ErrorInput, OpInfo, Sample, arr, away_from, positive


def _torch(name):
    def fn(*args, **kwargs):
        import torch

        return getattr(torch, name)(*args, **kwargs)

    fn.__name__ = f"torch_{name}"
    return fn


def _np_lerp(a, b, w):
    return a + w * (b - a)


def _np_logaddexp(a, b):
    return np.logaddexp(a, b)


def _np_addcmul(x, a, b, value=1):
    return x + value * a * b


def _np_addcdiv(x, a, b, value=1):
    return x + value * a / b


def _np_nan_to_num(x, nan=0.0, posinf=None, neginf=None):
    big = float(np.finfo(np.float32).max)  # the samples are float32; the reference float64
    return np.nan_to_num(x, nan=nan, posinf=big if posinf is None else posinf,
                         neginf=-big if neginf is None else neginf)


def _with_specials(rng, *shape):
    x = arr(rng, *shape)
    x.flat[0], x.flat[1], x.flat[2] = np.nan, np.inf, -np.inf
    return x


def _np_isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)


def _np_cumprod(x, dim):
    return np.cumprod(x, axis=dim)


def _np_logcumsumexp(x, dim):
    return np.logaddexp.accumulate(x, axis=dim)


def _np_roll(x, shifts, dims=None):
    return np.roll(x, shifts, axis=dims)


def _np_tile(x, dims):
    return np.tile(x, dims)


def _np_repeat_interleave(x, repeats, dim=None):
    return np.repeat(x, repeats, axis=dim)


def _np_diagonal(x, offset=0, dim1=0, dim2=1):
    return np.diagonal(x, offset, dim1, dim2)


def _np_diag(x, diagonal=0):
    return np.diag(x, diagonal)


def _np_trace(x):
    return np.trace(x)


def _np_movedim(x, source, destination):
    return np.moveaxis(x, source, destination)


def _np_diff(x, n=1, dim=-1):
    return np.diff(x, n=n, axis=dim)


def _np_kron(a, b):
    return np.kron(a, b)


def _np_cross(a, b, dim=None):
    return np.cross(a, b, axis=dim)


def _np_tensordot(a, b, dims=2):
    return np.tensordot(a, b, axes=dims)


def _np_addmm(x, a, b, beta=1, alpha=1):
    return beta * x + alpha * (a @ b)


def _np_cdist(a, b, p=2.0):
    d = np.abs(a[..., :, None, :] - b[..., None, :, :])
    return (d ** p).sum(-1) ** (1 / p)


def _np_sort_values(x, dim=-1, descending=False):
    s = np.sort(x, axis=dim)
    return np.flip(s, axis=dim) if descending else s


def _sort_values(x, dim=-1, descending=False):
    return graphc.sort(x, dim, descending).values


def _torch_sort_values(x, dim=-1, descending=False):
    import torch

    return torch.sort(x, dim=dim, descending=descending).values


def _np_searchsorted(seq, values, right=False):
    return np.searchsorted(seq, values, side="right" if right else "left")


def _np_square(x):
    return x * x


def _np_reciprocal(x):
    return 1.0 / x


def _np_hypot(a, b):
    return np.hypot(a, b)


def _np_erfinv(x):
    from scipy import special

    return special.erfinv(x)


def _inside_unit(rng, *shape):
    return rng.uniform(-0.95, 0.95, size=shape).astype(np.float32)


def _one(make):
    def samples(rng):
        return [Sample((make(rng, 3, 4),), desc="3x4")]

    return samples


def _two(make_a, make_b=None, kwargs=None):
    make_b = make_b or make_a

    def samples(rng):
        return [Sample((make_a(rng, 3, 4), make_b(rng, 3, 4)), dict(kwargs or {}), desc="3x4"),
                Sample((make_a(rng, 2, 3, 4), make_b(rng, 4)), dict(kwargs or {}),
                       desc="broadcast")]

    return samples


def _three(rng):
    return [Sample((arr(rng, 3, 4), arr(rng, 3, 4), positive(rng, 4)), {"value": 0.5},
                   desc="value=0.5")]


def _lerp_samples(rng):
    return [Sample((arr(rng, 3, 4), arr(rng, 3, 4), 0.3), desc="scalar weight < 0.5"),
            Sample((arr(rng, 3, 4), arr(rng, 3, 4), 0.8), desc="scalar weight >= 0.5"),
            Sample((arr(rng, 3, 4), arr(rng, 4), rng.uniform(0, 1, (3, 4)).astype(np.float32)),
                   desc="tensor weight")]


def _addcdiv_errors(rng):
    ints = rng.integers(1, 5, size=(3,))
    return [ErrorInput(Sample((arr(rng, 3), ints, ints)), DTypeError,
                       "Integer division with addcdiv is no longer supported")]


OP_INFOS: list[OpInfo] = [
    OpInfo("square", graphc.square, _np_square, _one(arr), ("mul",), torch_fn=_torch("square")),
    OpInfo("reciprocal", graphc.reciprocal, _np_reciprocal, _one(positive), ("div",),
           torch_fn=_torch("reciprocal")),
    OpInfo("addcmul", graphc.addcmul, _np_addcmul, _three, ("mul", "add"),
           torch_fn=_torch("addcmul")),
    OpInfo("addcdiv", graphc.addcdiv, _np_addcdiv, _three, ("div", "add"),
           torch_fn=_torch("addcdiv"), error_inputs=_addcdiv_errors),
    OpInfo("lerp", graphc.lerp, _np_lerp, _lerp_samples, ("sub", "mul", "where"),
           torch_fn=_torch("lerp")),
    OpInfo("hypot", graphc.hypot, _np_hypot, _two(arr), ("sqrt",), torch_fn=_torch("hypot")),
    OpInfo("erfinv", graphc.erfinv, _np_erfinv, _one(_inside_unit), ("erf", "exp", "log"),
           torch_fn=_torch("erfinv")),
    OpInfo("logaddexp", graphc.logaddexp, _np_logaddexp, _two(arr),
           ("maximum", "log1p", "exp"), torch_fn=_torch("logaddexp")),
]


def _nan_to_num_samples(rng):
    # the default posinf/neginf are the dtype's limits: the compile harness reruns in float64,
    # so they are checked in tests/test_torch_surface.py instead
    return [Sample((_with_specials(rng, 3, 4),), {"posinf": 1e30, "neginf": -1e30},
                   desc="default nan"),
            Sample((_with_specials(rng, 5),), {"nan": 1.0, "posinf": 9.0, "neginf": -9.0},
                   desc="given values")]


def _classify_samples(rng):
    return [Sample((_with_specials(rng, 3, 4),), desc="nan and infs"),
            Sample((rng.integers(-3, 3, size=(4,)),), desc="int64")]


OP_INFOS += [
    OpInfo("nan_to_num", graphc.nan_to_num, _np_nan_to_num, _nan_to_num_samples, ("where",),
           torch_fn=_torch("nan_to_num"), differentiable=False),
    OpInfo("isnan", graphc.isnan, np.isnan, _classify_samples, ("ne",),
           torch_fn=_torch("isnan"), differentiable=False, exact=True),
    OpInfo("isinf", graphc.isinf, np.isinf, _classify_samples, ("abs", "eq"),
           torch_fn=_torch("isinf"), differentiable=False, exact=True),
    OpInfo("isfinite", graphc.isfinite, np.isfinite, _classify_samples, ("lt",),
           torch_fn=_torch("isfinite"), differentiable=False, exact=True),
    OpInfo("isclose", graphc.isclose, _np_isclose,
           lambda rng: [Sample((_with_specials(rng, 6), _with_specials(rng, 6)),
                               {"equal_nan": True}, desc="equal_nan")],
           ("le", "logical_or"), torch_fn=_torch("isclose"), differentiable=False, exact=True,
           error_inputs=lambda rng: [ErrorInput(
               Sample((arr(rng, 2), arr(rng, 2, dtype=np.float64))), DTypeError,
               "Float did not match Double")]),
]


# ---- scans and reductions --------------------------------------------------------------------
def _scan_samples(rng):
    return [Sample((arr(rng, 3, 5), 1), desc="dim 1"), Sample((arr(rng, 6, 2), 0), desc="dim 0")]


OP_INFOS += [
    OpInfo("cumprod", graphc.cumprod, _np_cumprod, _scan_samples, ("mul", "pad"),
           torch_fn=_torch("cumprod")),
    OpInfo("logcumsumexp", graphc.logcumsumexp, _np_logcumsumexp, _scan_samples,
           ("maximum", "log1p"), torch_fn=_torch("logcumsumexp")),
    OpInfo("addmm", graphc.addmm, _np_addmm,
           lambda rng: [Sample((arr(rng, 4), arr(rng, 3, 5), arr(rng, 5, 4)),
                               {"beta": 0.5, "alpha": 2.0}, desc="beta, alpha")],
           ("matmul",), torch_fn=_torch("addmm")),
    OpInfo("tensordot", graphc.tensordot, _np_tensordot,
           lambda rng: [Sample((arr(rng, 2, 3, 4), arr(rng, 3, 4, 5)), {"dims": 2},
                               desc="dims=2")],
           ("matmul",), torch_fn=_torch("tensordot")),
    OpInfo("kron", graphc.kron, _np_kron,
           lambda rng: [Sample((arr(rng, 2, 3), arr(rng, 3, 2)), desc="2x3 (x) 3x2")],
           ("mul",), torch_fn=_torch("kron")),
    OpInfo("cross", graphc.cross, _np_cross,
           lambda rng: [Sample((arr(rng, 4, 3), arr(rng, 4, 3)), {"dim": 1}, desc="dim 1")],
           ("sub",), torch_fn=_torch("cross")),
    OpInfo("cdist", graphc.cdist, _np_cdist,
           lambda rng: [Sample((arr(rng, 3, 4), arr(rng, 5, 4)), desc="p=2"),
                        Sample((arr(rng, 2, 3, 4), arr(rng, 2, 2, 4)), {"p": 3.0}, desc="p=3"),
                        Sample((arr(rng, 26, 3), arr(rng, 4, 3)), desc="p=2, matmul form")],
           ("reduce_sum",), torch_fn=_torch("cdist"),
           error_inputs=lambda rng: [ErrorInput(Sample((arr(rng, 3, 4), arr(rng, 2, 5))),
                                                ShapeError, "same number of columns")]),
]


# ---- shape -----------------------------------------------------------------------------------
def _roll_samples(rng):
    return [Sample((arr(rng, 3, 4), 1), desc="flat"),
            Sample((arr(rng, 3, 4), (1, -2), (0, 1)), desc="two dims")]


def _roll_errors(rng):
    return [ErrorInput(Sample((arr(rng, 3, 4), (1, 2), (0,))), ShapeError,
                       "shifts and dimensions must align")]


def _diag_errors(rng):
    return [ErrorInput(Sample((arr(rng, 2, 2, 2),)), ShapeError,
                       r"diag\(\): Supports 1D or 2D tensors. Got 3D")]


OP_INFOS += [
    OpInfo("roll", graphc.roll, _np_roll, _roll_samples, ("concat", "slice"),
           torch_fn=_torch("roll"), error_inputs=_roll_errors),
    OpInfo("tile", graphc.tile, _np_tile,
           lambda rng: [Sample((arr(rng, 2, 3), (2, 1, 2)), desc="more dims")],
           ("broadcast_to",), torch_fn=_torch("tile")),
    OpInfo("repeat_interleave", graphc.repeat_interleave, _np_repeat_interleave,
           lambda rng: [Sample((arr(rng, 2, 3), 2), {"dim": 1}, desc="int repeats"),
                        Sample((arr(rng, 2, 3), 3), desc="flattened")],
           ("broadcast_to", "reshape"), torch_fn=_torch("repeat_interleave")),
    OpInfo("movedim", graphc.movedim, _np_movedim,
           lambda rng: [Sample((arr(rng, 2, 3, 4), (0, 1), (2, 0)), desc="two dims")],
           ("permute",), torch_fn=_torch("movedim")),
    OpInfo("diagonal", graphc.diagonal, _np_diagonal,
           lambda rng: [Sample((arr(rng, 3, 4),), desc="main"),
                        Sample((arr(rng, 4, 3), -1), desc="below"),
                        Sample((arr(rng, 2, 3, 4), 1, 1, 2), desc="batched, above")],
           ("permute", "slice"), torch_fn=_torch("diagonal")),
    OpInfo("diag", graphc.diag, _np_diag,
           lambda rng: [Sample((arr(rng, 3), 1), desc="1-D above"),
                        Sample((arr(rng, 3, 4),), desc="2-D")],
           ("where", "pad"), torch_fn=_torch("diag"), error_inputs=_diag_errors),
    OpInfo("trace", lambda x: x.trace(), _np_trace,
           lambda rng: [Sample((arr(rng, 3, 4),), desc="3x4")],
           ("reduce_sum",), torch_fn=_torch("trace")),
    OpInfo("diff", graphc.diff, _np_diff,
           lambda rng: [Sample((arr(rng, 3, 5),), {"n": 2}, desc="n=2"),
                        Sample((arr(rng, 4, 3),), {"dim": 0}, desc="dim 0")],
           ("sub",), torch_fn=_torch("diff")),
    OpInfo("sort", _sort_values, _np_sort_values,
           lambda rng: [Sample((away_from(rng, 3, 5, points=()),), {"descending": True},
                               desc="descending"),
                        Sample((arr(rng, 4, 3), 0), desc="dim 0")],
           ("gather",), torch_fn=_torch_sort_values),
    OpInfo("searchsorted", graphc.searchsorted, _np_searchsorted,
           lambda rng: [Sample((np.sort(arr(rng, 6)), arr(rng, 3, 4)), desc="left"),
                        Sample((np.sort(arr(rng, 6)), arr(rng, 5)), {"right": True},
                               desc="right")],
           ("lt", "le"), torch_fn=_torch("searchsorted"), differentiable=False, exact=True),
]
