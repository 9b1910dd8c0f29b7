"""Pieces VJP rules share, written with graph-building calls only.

`sum_to(grad, shape)` undoes broadcasting: it sums the gradient of a broadcast result back to
the shape of the operand that was broadcast (leading dims summed away, size-1 dims summed with
keepdim). `zeros_like`/`full_like` make constants through the `full` source op so they trace;
`size_value(n, dtype)` makes a count of elements a number that stays symbolic when it is one.
"""

from __future__ import annotations

from graphc.ops.registry import call
from graphc.symbolic import Sym, same_shape


def can_sum_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """True when `target` broadcasts to `shape` (so a gradient of `shape` can sum down)."""
    if len(target) > len(shape):
        return False
    lead = len(shape) - len(target)
    return all(t == s or t == 1 for s, t in zip(shape[lead:], target))


def sum_to(grad, shape: tuple[int, ...]):
    """Sum `grad` down to `shape`, the inverse of broadcasting `shape` to grad.shape."""
    shape = tuple(shape)
    gshape = tuple(grad.shape)
    if same_shape(gshape, shape):  # the identity, structurally (a symbolic size never guards)
        return grad
    lead = len(gshape) - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and gshape[lead + i] != 1
    )
    out = call("reduce_sum", grad, axes=axes, keepdim=True) if axes else grad
    if not same_shape(tuple(out.shape), shape):
        out = call("reshape", out, shape=shape)
    return out


def full_like(t, value: float, dtype=None):
    """A constant tensor of t's shape (and dtype unless given), built with the `full` op."""
    dtype = t.dtype if dtype is None else dtype
    return call("full", shape=tuple(t.shape), value=value, dtype=dtype.name)


def zeros_like(t):
    return full_like(t, 0.0)


def size_value(n, dtype: str):
    """A count of elements as a number for arithmetic (a mean's divisor, BatchNorm's n/(n-1)):
    a float, or, where the count is a symbolic size (graphc.symbolic), a 0-d `full` whose
    value is that size per call (asking it for a float would specialise it, so one trace
    would serve one batch size only)."""
    if type(n) is not Sym:
        return float(n)
    return call("full", shape=(), value=n, dtype=dtype)
