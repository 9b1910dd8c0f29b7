"""Helpers the shape/dtype rules share: broadcasting, axis normalisation, type checks, and
the element-stride helpers of the view rules (`c_contiguous`, `contiguous_element_strides`).

All of them are pure functions over shapes and TensorTypes. Errors carry PyTorch's wording
where PyTorch has one (broadcasting), prefixed with the op name and the user's source line.
"""

from __future__ import annotations

import operator

from graphc.errors import ArgumentError, DTypeError, IndexOutOfRangeError, ShapeError, where
from graphc.symbolic import Sym
from graphc.types import TensorType, bool_, float32, int64, promote


def broadcast_shapes(op: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Align trailing dimensions; each pair must be equal, or one is 1 (PyTorch's rule)."""
    ndim = max(len(a), len(b))
    pa = (1,) * (ndim - len(a)) + tuple(a)
    pb = (1,) * (ndim - len(b)) + tuple(b)
    out = []
    for dim, (x, y) in enumerate(zip(pa, pb)):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeError(
                f"{where(op)}: The size of tensor a ({x}) must match the size of tensor b ({y}) "
                f"at non-singleton dimension {dim}"
            )
    return tuple(out)


def broadcast_many(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    out: tuple[int, ...] = ()
    for s in shapes:
        out = broadcast_shapes(op, out, s)
    return out


def normalize_axis(op: str, axis: int, ndim: int) -> int:
    """Map a possibly negative axis into [0, ndim); a 0-d tensor accepts axis 0 and -1."""
    bound = max(ndim, 1)
    if not -bound <= axis < bound:  # an IndexError, as PyTorch's (and still an ArgumentError)
        raise IndexOutOfRangeError(
            f"{where(op)}: Dimension out of range (expected to be in range of "
            f"[{-bound}, {bound - 1}], but got {axis})"
        )
    return axis % bound


def normalize_axes(op: str, axes, ndim: int) -> tuple[int, ...]:
    """None means all axes; an int or a sequence is normalised, sorted, and checked unique."""
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, int):
        axes = (axes,)
    out = tuple(sorted(normalize_axis(op, a, ndim) for a in axes))
    if len(set(out)) != len(out):
        raise ArgumentError(f"{where(op)}: dim {axes} appears multiple times in the list of dims")
    return out if ndim else ()


def _category(dtype) -> int:
    return 2 if dtype.is_floating else (0 if dtype is bool_ else 1)


def result_dtype(*types: TensorType):
    """PyTorch's promotion: 0-d tensors only decide the dtype when their category (bool <
    integer < floating) is higher than that of every dimensioned tensor."""
    dims = [t.dtype for t in types if t.shape]
    zero_d = [t.dtype for t in types if not t.shape]
    out = None
    for group in (dims, zero_d):
        best = None
        for d in group:
            best = d if best is None else promote(best, d)
        if best is not None and (out is None or _category(best) > _category(out)):
            out = best
    return out


def require_float(op: str, t: TensorType, what: str = "input") -> None:
    if not t.dtype.is_floating:
        raise DTypeError(
            f"{where(op)}: expected a floating point {what} (float32 or float64), "
            f"got {t.dtype.name}; convert it with .float() or .double()"
        )


def require_dtype(op: str, t: TensorType, allowed, what: str = "input") -> None:
    if t.dtype not in allowed:
        names = ", ".join(d.name for d in allowed)
        raise DTypeError(f"{where(op)}: expected {what} of dtype {names}, got {t.dtype.name}")


def same_type(x: TensorType, **_attrs) -> TensorType:
    """Shape rule of unary elementwise ops that keep shape and dtype."""
    return x


def float_unary(op: str, x: TensorType) -> TensorType:
    """Unary math on floats; integer and bool inputs promote to float32 as in PyTorch."""
    return x if x.dtype.is_floating else TensorType(x.shape, float32)


def binary_type(op: str, a: TensorType, b: TensorType) -> TensorType:
    return TensorType(broadcast_shapes(op, a.shape, b.shape), result_dtype(a, b))


def compare_type(op: str, a: TensorType, b: TensorType) -> TensorType:
    return TensorType(broadcast_shapes(op, a.shape, b.shape), bool_)


def index_dtype_check(op: str, t: TensorType, what: str = "index") -> None:
    if t.dtype is not int64:
        raise DTypeError(f"{where(op)}: expected {what} of dtype int64, got {t.dtype.name}")


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def as_size(s) -> int | Sym:
    """A size argument as an int, or the symbolic size itself (graphc.symbolic.Sym): a rule
    that keeps sizes symbolic never asks for a concrete one."""
    return s if type(s) is Sym else operator.index(s)


def size_arg(op: str, size) -> tuple[int, ...]:
    """A shape given as varargs `(2, 3)` or one sequence `((2, 3),)`; negatives refused."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    shape = tuple(s if type(s) is Sym else int(s) for s in size)
    if any(s < 0 for s in shape):
        raise ArgumentError(f"{where(op)}: Trying to create tensor with negative dimension: "
                            f"{list(shape)}")
    return shape


def format_size(shape) -> str:
    """A shape as PyTorch prints it in messages: [2, 3]."""
    return "[" + ", ".join(str(s) for s in shape) + "]"


# ---- element strides (the view ops' `view_strides` rules and the backends use them) --------
def c_contiguous(shape: tuple, strides: tuple) -> bool:
    """numpy's C-contiguity in element strides: size-1 dims do not count, empty is contiguous."""
    if 0 in shape:
        return True
    step = 1
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1:
            if s != step:
                return False
            step *= n
    return True


def contiguous_element_strides(shape: tuple) -> tuple[int, ...]:
    """Row-major element strides of `shape` (numpy's: a 0-size dim does not scale the rest)."""
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n or 1
    return tuple(reversed(out))
