"""Reductions: sum, mean, max/min (amax/amin), argmax/argmin, and the composites on top.

Primitives (registry ops) take canonical attributes: `axes` is a sorted tuple of normalised,
unique axes (an empty tuple reduces nothing), `keepdim` a bool; argmax/argmin take one `axis`
(or None: the flattened tensor). The public functions map PyTorch's arguments onto them
(`dim=None` or `()` reduces every axis, negative dims, `dtype=`), so the registry only ever
sees canonical attributes.

Composites, written with registry calls only so they differentiate and trace:
- `max(x, dim)` / `min(x, dim)` return `(values, indices)` like torch.return_types.max. For a
  float input that requires grad, the values are picked out at the returned indices
  (`sum(where(iota == index, x, 0))`), so the gradient goes to that index alone, as PyTorch's
  does; `amax`/`amin` and `max(x)` split it evenly among ties.
- var/std (two-pass, `correction`), logsumexp (shifted by the max), norm (vector norms),
  all/any (counts of False/True).

Invariants: integer and bool sums are int64; mean of a non-float tensor is refused with
PyTorch's message; reducing an empty axis with max/min/argmax/argmin is refused.
"""

from __future__ import annotations

import builtins
import math
from collections import namedtuple
from types import SimpleNamespace

import numpy as np

from graphc.errors import ArgumentError, DTypeError, ShapeError, where
from graphc.ops.elementwise import cast
from graphc.ops.grad_utils import size_value
from graphc.ops.registry import REDUCE, OpDef, Reduction, call, register
from graphc.ops.shapes import normalize_axes, normalize_axis, numel
from graphc.symbolic import Sym
from graphc.types import TensorType, as_dtype, bool_, int64

_TORCH_DTYPE = {"float32": "Float", "float64": "Double", "int64": "Long", "bool": "Bool"}


# ---- shared shape helpers --------------------------------------------------------------------
def _check_axes(op: str, x: TensorType, axes: tuple) -> None:
    """The registry's canonical form: sorted, unique, in [0, ndim)."""
    if tuple(sorted(set(axes))) != tuple(axes) or builtins.any(not 0 <= a < x.ndim for a in axes):
        raise ArgumentError(
            f"{where(op)}: axes must be sorted unique axes in [0, {x.ndim}), got {axes}; "
            "the public functions normalise dims before calling the op"
        )


def _reduced_shape(shape: tuple, axes: tuple, keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _check_nonempty(op: str, x: TensorType, axes: tuple) -> None:
    for a in axes:
        if x.shape[a] == 0:
            raise ShapeError(f"{where(op)}: Expected reduction dim {a} to have non-zero size.")


def _expand_back(g, in_shape: tuple, axes: tuple, keepdim: bool):
    """Broadcast a reduced gradient back over the input's shape (the VJP of every reduction)."""
    if not keepdim and axes:
        g = call("reshape", g, shape=_reduced_shape(in_shape, axes, True))
    if tuple(g.shape) != tuple(in_shape):
        g = call("broadcast_to", g, shape=tuple(in_shape))
    return g


# ---- reduce_sum ------------------------------------------------------------------------------
def _sum_like_infer(op: str):
    """Shape rule of reduce_sum and reduce_prod: bool and int64 inputs give int64."""

    def infer(x: TensorType, axes: tuple, keepdim: bool) -> TensorType:
        _check_axes(op, x, axes)
        dtype = x.dtype if x.dtype.is_floating else int64
        return TensorType(_reduced_shape(x.shape, axes, keepdim), dtype)

    infer.__name__ = f"_{op}_infer"
    return infer


def _sum_kernel(x, axes, keepdim):
    dtype = None if np.issubdtype(x.dtype, np.floating) else np.int64
    return np.asarray(np.sum(x, axis=axes, keepdims=keepdim, dtype=dtype))


def _sum_vjp(ctx, g):
    x = ctx.input_types[0]
    return (_expand_back(g, x.shape, ctx.attrs["axes"], ctx.attrs["keepdim"]),)


register(OpDef("reduce_sum", REDUCE, ("x",), _sum_like_infer("reduce_sum"), _sum_kernel,
               _sum_vjp, attrs={"axes": tuple, "keepdim": bool},
               reduction=Reduction("add", "zero")))


# ---- reduce_mean -----------------------------------------------------------------------------
def _require_float_mean(x: TensorType) -> None:
    if not x.dtype.is_floating:
        raise DTypeError(
            f"{where('mean')}: mean(): could not infer output dtype. Input dtype must be either "
            f"a floating point or complex dtype. Got: {_TORCH_DTYPE[x.dtype.name]}"
        )


def _mean_infer(x: TensorType, axes: tuple, keepdim: bool) -> TensorType:
    _check_axes("reduce_mean", x, axes)
    _require_float_mean(x)
    return TensorType(_reduced_shape(x.shape, axes, keepdim), x.dtype)


def _mean_kernel(x, axes, keepdim):
    count = numel(tuple(x.shape[a] for a in axes))
    total = np.sum(x, axis=axes, keepdims=keepdim)
    return np.asarray(np.true_divide(total, x.dtype.type(count)), dtype=x.dtype)  # 0/0: nan


def _mean_vjp(ctx, g):
    x = ctx.input_types[0]
    axes = ctx.attrs["axes"]
    count = size_value(numel(tuple(x.shape[a] for a in axes)), g.dtype.name)  # symbolic stays
    return (_expand_back(call("div", g, count), x.shape, axes, ctx.attrs["keepdim"]),)


register(OpDef("reduce_mean", REDUCE, ("x",), _mean_infer, _mean_kernel, _mean_vjp,
               attrs={"axes": tuple, "keepdim": bool},
               reduction=Reduction("add", "zero", mean=True)))


# ---- reduce_max / reduce_min -----------------------------------------------------------------
def _extremum_infer(op: str):
    def infer(x: TensorType, axes: tuple, keepdim: bool) -> TensorType:
        _check_axes(op, x, axes)
        _check_nonempty(op, x, axes)
        return TensorType(_reduced_shape(x.shape, axes, keepdim), x.dtype)

    infer.__name__ = f"_{op}_infer"
    return infer


def _max_kernel(x, axes, keepdim):
    return np.asarray(np.max(x, axis=axes, keepdims=keepdim)) if axes else x.copy()


def _min_kernel(x, axes, keepdim):
    return np.asarray(np.min(x, axis=axes, keepdims=keepdim)) if axes else x.copy()


def _with_kept_dims(ctx, *tensors):
    """The reduced tensors reshaped to keepdim form, so they broadcast against the input."""
    if ctx.attrs["keepdim"]:
        return tensors
    keep = _reduced_shape(tuple(ctx.input_types[0].shape), ctx.attrs["axes"], True)
    return tuple(call("reshape", t, shape=keep) for t in tensors)


def _extremum_vjp(ctx, g):
    """Gradient split evenly among the elements equal to the result (PyTorch's amax/amin).

    A row whose result is NaN gets NaN gradients (PyTorch routes them to the NaN elements).
    """
    x, y = ctx.inputs[0], ctx.outputs[0]
    axes = ctx.attrs["axes"]
    if not axes:
        return (g,)
    y, g = _with_kept_dims(ctx, y, g)
    mask = cast(call("eq", x, y), x.dtype)
    count = call("reduce_sum", mask, axes=axes, keepdim=True)
    return (g * mask / count,)


register(OpDef("reduce_max", REDUCE, ("x",), _extremum_infer("reduce_max"), _max_kernel,
               _extremum_vjp, attrs={"axes": tuple, "keepdim": bool},
               saved_inputs=(0,), saved_outputs=(0,), reduction=Reduction("max", "lowest")))
register(OpDef("reduce_min", REDUCE, ("x",), _extremum_infer("reduce_min"), _min_kernel,
               _extremum_vjp, attrs={"axes": tuple, "keepdim": bool},
               saved_inputs=(0,), saved_outputs=(0,), reduction=Reduction("min", "highest")))


# ---- reduce_prod -----------------------------------------------------------------------------
def _prod_kernel(x, axes, keepdim):
    dtype = None if np.issubdtype(x.dtype, np.floating) else np.int64
    return np.asarray(np.prod(x, axis=axes, keepdims=keepdim, dtype=dtype))


def _prod_vjp(ctx, g):
    """d prod / d x_i = product of the others, computed without dividing by zero.

    Where x_i != 0 that is result / x_i; where x_i == 0 it is the product of the non-zero
    elements if x_i is the slice's only zero, else 0. Zeros are replaced by 1 before dividing
    (`nonzero`), so no branch ever computes 0/0, and the rule differentiates again; its
    second derivative is exact except between two zeros of one slice (it reads 0 there, as
    PyTorch's full-reduction rule does).
    """
    x, y = ctx.inputs[0], ctx.outputs[0]
    axes = ctx.attrs["axes"]
    if not axes:
        return (g,)
    y, g = _with_kept_dims(ctx, y, g)
    is_zero = call("eq", x, 0.0)
    nonzero = call("where", is_zero, 1.0, x)
    zeros = call("reduce_sum", is_zero, axes=axes, keepdim=True)
    others_if_zero = call("where", call("eq", zeros, 1),
                          call("reduce_prod", nonzero, axes=axes, keepdim=True), 0.0)
    return (g * call("where", is_zero, others_if_zero, y / nonzero),)


register(OpDef("reduce_prod", REDUCE, ("x",), _sum_like_infer("reduce_prod"), _prod_kernel,
               _prod_vjp, attrs={"axes": tuple, "keepdim": bool},
               saved_inputs=(0,), saved_outputs=(0,), reduction=Reduction("mul", "one")))


# ---- argmax / argmin (not differentiable) ----------------------------------------------------
def _arg_infer(op: str):
    def infer(x: TensorType, axis, keepdim: bool) -> TensorType:
        if x.dtype is bool_:
            raise DTypeError(f"{where(op)}: {op}(): does not support bool input")
        if axis is None:
            if x.numel == 0:
                raise ShapeError(f"{where(op)}: {op}(): Expected reduction dim to be specified "
                                 "for input.numel() == 0.")
            return TensorType((1,) * x.ndim if keepdim else (), int64)
        if not 0 <= axis < builtins.max(x.ndim, 1):
            raise ArgumentError(f"{where(op)}: axis must be normalised into [0, {x.ndim}), "
                                f"got {axis}")
        if x.ndim == 0:
            return TensorType((), int64)
        if x.shape[axis] == 0:
            raise ShapeError(f"{where(op)}: {op}(): Expected reduction dim {axis} to have "
                             "non-zero size.")
        return TensorType(_reduced_shape(x.shape, (axis,), keepdim), int64)

    infer.__name__ = f"_{op}_infer"
    return infer


def _arg_kernel(np_fn):
    def kernel(x, axis, keepdim):
        if x.ndim == 0:
            return np.zeros((), np.int64)
        return np.asarray(np_fn(x, axis=axis, keepdims=keepdim), dtype=np.int64)

    kernel.__name__ = f"_{np_fn.__name__}_kernel"
    return kernel


register(OpDef("argmax", REDUCE, ("x",), _arg_infer("argmax"), _arg_kernel(np.argmax), None,
               attrs={"axis": int, "keepdim": bool}))
register(OpDef("argmin", REDUCE, ("x",), _arg_infer("argmin"), _arg_kernel(np.argmin), None,
               attrs={"axis": int, "keepdim": bool}))


# ---- argument normalisation ------------------------------------------------------------------
def _axes(op: str, x, dim) -> tuple[int, ...]:
    """PyTorch's dim argument: None, () or [] reduce everything; ints may be negative."""
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return tuple(range(x.ndim))
    if isinstance(dim, (tuple, list)):
        return normalize_axes(op, tuple(int(d) for d in dim), x.ndim)
    return normalize_axes(op, int(dim), x.ndim)


def _int_dim(op: str, dim) -> int:
    if isinstance(dim, (tuple, list)) or isinstance(dim, bool):
        raise TypeError(f"{op}(): argument 'dim' must be int, not {type(dim).__name__}")
    return int(dim)


def _count(x, axes: tuple) -> int:
    return numel(tuple(x.shape[a] for a in axes))


def _require_specified_dim(op: str, x) -> None:
    if x.numel() == 0:
        raise ShapeError(
            f"{where(op)}: {op}(): Expected reduction dim to be specified for input.numel() "
            "== 0. Specify the reduction dim with the 'dim' argument."
        )


# ---- public functions ------------------------------------------------------------------------
def sum(x, dim=None, keepdim: bool = False, *, dtype=None):  # noqa: A001 (PyTorch's name)
    """Sum over `dim` (all axes by default); bool and int64 sums are int64.

    >>> graphc.tensor([[1.0, 2.0], [3.0, 4.0]]).sum(dim=1)
    tensor([3., 7.])
    """
    if dtype is not None:
        x = cast(x, as_dtype(dtype))
    return call("reduce_sum", x, axes=_axes("sum", x, dim), keepdim=bool(keepdim))


def mean(x, dim=None, keepdim: bool = False, *, dtype=None):
    """Mean over `dim` (all axes by default); integer inputs need `dtype=` as in PyTorch."""
    if dtype is not None:
        x = cast(x, as_dtype(dtype))
    return call("reduce_mean", x, axes=_axes("mean", x, dim), keepdim=bool(keepdim))


def prod(x, dim=None, keepdim: bool = False, *, dtype=None):
    """Product over one `dim` (all elements by default); bool and int64 products are int64.

    >>> graphc.tensor([[1.0, 2.0], [3.0, 4.0]]).prod(1)
    tensor([ 2., 12.])
    """
    if dtype is not None:
        x = cast(x, as_dtype(dtype))
    if dim is None:
        axes = tuple(range(x.ndim))
    else:
        axis = normalize_axis("prod", _int_dim("prod", dim), x.ndim)
        axes = (axis,) if x.ndim else ()
    return call("reduce_prod", x, axes=axes, keepdim=bool(keepdim))


def amax(x, dim=(), keepdim: bool = False):
    """Maximum over `dim` (all axes by default); the gradient is split evenly among ties."""
    if dim is None or dim == () or dim == []:
        _require_specified_dim("amax", x)
    return call("reduce_max", x, axes=_axes("amax", x, dim), keepdim=bool(keepdim))


def amin(x, dim=(), keepdim: bool = False):
    """Minimum over `dim` (all axes by default); the gradient is split evenly among ties."""
    if dim is None or dim == () or dim == []:
        _require_specified_dim("amin", x)
    return call("reduce_min", x, axes=_axes("amin", x, dim), keepdim=bool(keepdim))


def argmax(x, dim=None, keepdim: bool = False):
    """Index of the (first) maximum over `dim`, or in the flattened tensor; int64."""
    axis = None if dim is None else normalize_axis("argmax", _int_dim("argmax", dim), x.ndim)
    return call("argmax", x, axis=axis, keepdim=bool(keepdim))


def argmin(x, dim=None, keepdim: bool = False):
    """Index of the (first) minimum over `dim`, or in the flattened tensor; int64."""
    axis = None if dim is None else normalize_axis("argmin", _int_dim("argmin", dim), x.ndim)
    return call("argmin", x, axis=axis, keepdim=bool(keepdim))


# The result of max(x, dim) / min(x, dim), as torch.return_types.max / .min.
_MaxResult = namedtuple("max", ("values", "indices"))
_MinResult = namedtuple("min", ("values", "indices"))
_MaxResult.__module__ = _MinResult.__module__ = "graphc.return_types"
return_types = SimpleNamespace(max=_MaxResult, min=_MinResult)


def _is_dim(dim) -> bool:
    return isinstance(dim, (int, np.integer)) and not isinstance(dim, bool)


def _values_at(x, indices, axis: int, keepdim: bool):
    """x picked at `indices` (keepdim form) along `axis`, differentiable toward those indices."""
    n = x.shape[axis]
    iota = call("arange", start=0.0, end=n if type(n) is Sym else float(n), step=1.0,
                dtype="int64")
    iota = call("reshape", iota, shape=(n,) + (1,) * (x.ndim - 1 - axis))
    picked = call("where", call("eq", iota, indices), x, 0.0)
    return call("reduce_sum", picked, axes=(axis,), keepdim=keepdim)


def _extremum_with_dim(op: str, x, dim, keepdim: bool, result_type):
    axis = normalize_axis(op, dim, x.ndim)
    keepdim = bool(keepdim)
    reduce_op, arg_op = ("reduce_max", "argmax") if op == "max" else ("reduce_min", "argmin")
    from graphc.autograd.grad_mode import is_grad_enabled  # the front end's, when called

    if x.ndim == 0 or not (x.dtype.is_floating and x.requires_grad and is_grad_enabled()):
        values = call(reduce_op, x, axes=(axis,) if x.ndim else (), keepdim=keepdim)
        return result_type(values, call(arg_op, x, axis=axis, keepdim=keepdim))
    indices = call(arg_op, x, axis=axis, keepdim=True)
    values = _values_at(x, indices, axis, keepdim)
    if not keepdim:
        indices = call("reshape", indices, shape=tuple(values.shape))
    return result_type(values, indices)


def max(x, dim=None, keepdim: bool = False):  # noqa: A001
    """max(x) -> the maximum; max(x, dim, keepdim=False) -> (values, indices);
    max(x, other_tensor) -> the elementwise maximum (as torch.max).

    >>> graphc.tensor([[1.0, 5.0], [4.0, 2.0]]).max(dim=1).indices
    tensor([1, 0])
    """
    if dim is None:
        _require_specified_dim("max", x)
        return call("reduce_max", x, axes=tuple(range(x.ndim)), keepdim=False)
    if not _is_dim(dim):
        return call("maximum", x, dim)
    return _extremum_with_dim("max", x, int(dim), keepdim, _MaxResult)


def min(x, dim=None, keepdim: bool = False):  # noqa: A001
    """min(x), min(x, dim, keepdim=False) -> (values, indices), min(x, other) (as torch.min)."""
    if dim is None:
        _require_specified_dim("min", x)
        return call("reduce_min", x, axes=tuple(range(x.ndim)), keepdim=False)
    if not _is_dim(dim):
        return call("minimum", x, dim)
    return _extremum_with_dim("min", x, int(dim), keepdim, _MinResult)


def _correction(op: str, dim, unbiased, correction):
    """Sort out var/std's overloads: (dim, unbiased, keepdim), (unbiased), (dim, correction=)."""
    if isinstance(dim, bool):  # var(x, True): the old `unbiased` overload
        dim, unbiased = None, dim if unbiased is None else unbiased
    if unbiased is not None and correction is not None:
        raise TypeError(f"{op}() received an invalid combination of arguments: give either "
                        "unbiased= or correction=, not both")
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    return dim, float(correction)


def var(x, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
    """Variance over `dim` with Bessel's `correction` (default 1; `unbiased=False` means 0).

    Two-pass (mean first), so it stays accurate for data far from zero; divides by
    max(0, N - correction), giving inf/nan where that is 0, as PyTorch.

    >>> graphc.tensor([1.0, 2.0, 3.0, 4.0]).var()
    tensor(1.6667)
    """
    dim, corr = _correction("var", dim, unbiased, correction)
    if not x.dtype.is_floating:
        raise DTypeError(f"{where('var')}: std and var only support floating point and complex "
                         f"dtypes, got {x.dtype.name}")
    axes = _axes("var", x, dim)
    centered = x - call("reduce_mean", x, axes=axes, keepdim=True)
    total = call("reduce_sum", centered * centered, axes=axes, keepdim=bool(keepdim))
    count = _count(x, axes)
    if type(count) is Sym:  # a dynamic trace: the divisor stays symbolic, clamped per call
        return call("div", total, call("maximum", size_value(count, x.dtype.name) - corr, 0.0))
    return call("div", total, builtins.max(0.0, count - corr))


def std(x, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
    """Standard deviation: sqrt(var(x, ...)), same arguments as var."""
    if not x.dtype.is_floating:
        raise DTypeError(f"{where('std')}: std and var only support floating point and complex "
                         f"dtypes, got {x.dtype.name}")
    return call("sqrt", var(x, dim, unbiased, keepdim, correction=correction))


def logsumexp(x, dim, keepdim: bool = False):
    """log(sum(exp(x), dim)), computed stably by shifting with the max along `dim`.

    >>> graphc.tensor([[0.0, 1000.0]]).logsumexp(1)
    tensor([1000.])
    """
    if not x.dtype.is_floating:
        x = cast(x, "float32")
    axes = _axes("logsumexp", x, dim)
    if not axes:
        return x * 1.0
    shift = call("reduce_max", x, axes=axes, keepdim=True)
    # An all -inf (or +inf) slice shifts by 0, so it gives -inf (inf) rather than nan.
    shift = call("where", call("eq", call("abs", shift), math.inf), 0.0, shift)
    total = call("reduce_sum", call("exp", x - shift), axes=axes, keepdim=True)
    out = call("log", total) + shift
    if not keepdim:
        out = call("reshape", out, shape=_reduced_shape(tuple(x.shape), axes, False))
    return out


def _safe_root(total, root):
    """root(total) with a zero gradient where total == 0 (PyTorch's norm at the origin)."""
    zero = call("eq", total, 0.0)
    safe = call("where", zero, 1.0, total)
    return call("where", zero, 0.0, root(safe))


def _pth_root(p: float):
    def root(t):
        return call("pow", t, 1.0 / p)

    return root


def norm(x, p="fro", dim=None, keepdim: bool = False, dtype=None):
    """Vector p-norm over `dim` (all axes by default): p = 'fro'/2, 1, inf, -inf, 0 or any float.

    >>> graphc.tensor([3.0, 4.0]).norm()
    tensor(5.)
    """
    if dtype is not None:
        x = cast(x, as_dtype(dtype))
    if not x.dtype.is_floating:
        raise DTypeError(
            f"{where('norm')}: linalg.vector_norm: Expected a floating point or complex tensor "
            f"as input. Got {_TORCH_DTYPE[x.dtype.name]}"
        )
    if isinstance(p, str) and p != "fro":
        raise ArgumentError(f"{where('norm')}: p={p!r} is a matrix norm graphc does not "
                            "implement; vector norms take p = 'fro', a number, inf or -inf")
    p = 2.0 if p == "fro" else float(p)
    axes = _axes("norm", x, dim)
    keepdim = bool(keepdim)
    if p == math.inf:
        return call("reduce_max", call("abs", x), axes=axes, keepdim=keepdim)
    if p == -math.inf:
        return call("reduce_min", call("abs", x), axes=axes, keepdim=keepdim)
    if p == 0.0:
        return cast(call("reduce_sum", call("ne", x, 0.0), axes=axes, keepdim=keepdim), x.dtype)
    if p == 1.0:
        return call("reduce_sum", call("abs", x), axes=axes, keepdim=keepdim)
    if p == 2.0:
        return _safe_root(call("reduce_sum", x * x, axes=axes, keepdim=keepdim), _sqrt)
    powered = call("pow", call("abs", x), p)
    return _safe_root(call("reduce_sum", powered, axes=axes, keepdim=keepdim), _pth_root(p))


def _sqrt(t):
    return call("sqrt", t)


def _truth(x):
    return x if x.dtype is bool_ else call("ne", x, 0)


def all(x, dim=None, keepdim: bool = False):  # noqa: A001
    """True where every element along `dim` is True (non-zero); a bool tensor."""
    false_count = call("reduce_sum", call("logical_not", _truth(x)), axes=_axes("all", x, dim),
                       keepdim=bool(keepdim))
    return call("eq", false_count, 0)


def any(x, dim=None, keepdim: bool = False):  # noqa: A001
    """True where some element along `dim` is True (non-zero); a bool tensor."""
    true_count = call("reduce_sum", _truth(x), axes=_axes("any", x, dim), keepdim=bool(keepdim))
    return call("gt", true_count, 0)


TENSOR_METHODS = {
    "sum": sum, "mean": mean, "prod": prod, "amax": amax, "amin": amin, "argmax": argmax,
    "argmin": argmin, "max": max, "min": min, "var": var, "std": std, "logsumexp": logsumexp,
    "norm": norm, "all": all, "any": any,
}

PUBLIC = (
    "sum", "mean", "prod", "amax", "amin", "argmax", "argmin", "max", "min", "var", "std",
    "logsumexp", "norm", "all", "any", "return_types",
)
