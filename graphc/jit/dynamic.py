"""Dimensions users mark dynamic (`graphc.mark_dynamic`, as torch._dynamo.mark_dynamic), and
the error a trace raises when it cannot keep one symbolic (graphc.jit.compiler checks it)."""

from __future__ import annotations

from graphc.errors import ArgumentError, GraphcError
from graphc.tensor import Tensor

__all__ = ["ConstraintViolationError", "mark_dynamic", "marked_dims"]


class ConstraintViolationError(GraphcError, RuntimeError):
    """A dimension marked dynamic (`graphc.mark_dynamic`) cannot be: the traced code needs
    one size there, or the size is 0 or 1 (always specialised)."""


_MARK_ATTR = "_graphc_dynamic_dims"


def mark_dynamic(t: Tensor, dim: int | list | tuple) -> None:
    """Mark dimension(s) `dim` of `t` dynamic, as torch._dynamo.mark_dynamic: a compiled
    function called with `t` traces that dimension as a symbolic size from its first call,
    and refuses (ConstraintViolationError) a trace that needs it to be one size.

    >>> import graphc
    >>> x = graphc.ones(8, 3)
    >>> graphc.mark_dynamic(x, 0)
    >>> f = graphc.compile(lambda x: x * 2, backend="interp")
    >>> f(x).shape, str(f.graph.inputs[0].type)
    (graphc.Size([8, 3]), 'f32[s0,3]')
    """
    if not isinstance(t, Tensor):
        raise ArgumentError(f"graphc.mark_dynamic: expected a Tensor, got {type(t).__name__}")
    dims = tuple(dim) if isinstance(dim, (list, tuple)) else (dim,)
    marks = set(getattr(t, _MARK_ATTR, ()))
    for d in dims:
        if not isinstance(d, int) or not -t.ndim <= d < max(t.ndim, 1):
            raise ArgumentError(f"graphc.mark_dynamic: dim {d!r} is out of range for a tensor "
                                f"of {t.ndim} dimensions")
        marks.add(d % t.ndim)
    setattr(t, _MARK_ATTR, frozenset(marks))


def marked_dims(t: Tensor) -> frozenset:
    """The dimensions of `t` marked with mark_dynamic."""
    return getattr(t, _MARK_ATTR, frozenset())
