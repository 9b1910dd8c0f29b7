"""Indexing: `Tensor.__getitem__` and `Tensor.__setitem__`, composed from movement ops.

PyTorch's order: integers select, slices slice, None inserts a dimension, Ellipsis fills, then
integer tensors (or lists) index what is left: together, in place if they are adjacent, in
front otherwise. A boolean mask is data-dependent: eager mode turns it into integer positions
with numpy; inside a trace it raises TraceError (use graphc.where instead). Unlike PyTorch, a
negative slice step is accepted (numpy's meaning), computed as a positive-step slice plus
`flip`. `__setitem__` goes through `registry.inplace`, so version counters and autograd
history follow PyTorch's rules.
"""

from __future__ import annotations

import numpy as np

from graphc.errors import ArgumentError, IndexOutOfRangeError, TraceError, where
from graphc.ops.gather import _check_index_range, _eager_range_check, _taken_shape
from graphc.ops.movement import expand, slice_count
from graphc.ops.registry import call, inplace
from graphc.ops.shapes import numel
from graphc.symbolic import Sym, same_shape
from graphc.types import bool_, int64


# ---- __getitem__ / __setitem__ ---------------------------------------------------------------
class _IndexPlan:
    """What an index does to a tensor: one slice, flips, one reshape, then integer indexing.

    starts/stops/steps: the canonical slice of every input dimension; flips: dimensions
    read backwards (negative steps); sliced: the shape after slicing; basic: the shape after
    integers drop their dimension and None adds one; advanced: (position in `basic`, index)
    pairs, the index an int64 Tensor or ndarray.
    """

    def __init__(self, x, index) -> None:
        shape = tuple(x.shape)
        items = self._items(x, index if isinstance(index, tuple) else (index,))
        self.starts, self.stops = [0] * len(shape), list(shape)
        self.steps, self.flips = [1] * len(shape), []
        self.basic: list[int] = []
        self.advanced: list[tuple[int, object]] = []
        d = 0
        for it in items:
            if it is None:
                self.basic.append(1)
                continue
            if isinstance(it, _Mask):
                d = self._mask(it, shape, d)
                continue
            n = shape[d]
            if isinstance(it, int):
                if not -n <= it < n:
                    raise IndexOutOfRangeError(f"{where('getitem')}: index {it} is out of bounds "
                                               f"for dimension {d} with size {n}")
                start = it if it >= 0 else it + n  # it % n, without asking a symbolic n
                self.starts[d], self.stops[d] = start, start + 1
            elif isinstance(it, slice):
                self.basic.append(self._slice(it, d, n))
            else:
                self.advanced.append((len(self.basic), it))
                self.basic.append(n)
            d += 1
        self.sliced = tuple(slice_count(a, b, s)
                            for a, b, s in zip(self.starts, self.stops, self.steps))

    @staticmethod
    def _items(x, index: tuple) -> list:
        from graphc.tensor import Tensor

        items, consumed, ellipses = [], 0, 0
        for it in index:
            if isinstance(it, (bool, np.bool_)):
                it = _Mask(np.asarray(it))
            elif isinstance(it, (int, np.integer)):
                it = int(it)
            elif isinstance(it, Tensor):
                if it.dtype is bool_:
                    it = _Mask(_mask_values(it))
                elif it.dtype is not int64:
                    raise IndexOutOfRangeError(_bad_index_message(it.dtype.name))
            elif isinstance(it, (list, np.ndarray)):
                arr = np.asarray(it)
                if arr.dtype == np.bool_:
                    it = _Mask(arr)
                elif arr.size == 0 or np.issubdtype(arr.dtype, np.integer):
                    it = arr.astype(np.int64)
                else:
                    raise IndexOutOfRangeError(_bad_index_message(str(arr.dtype)))
            elif not (it is None or it is Ellipsis or isinstance(it, slice)):
                raise IndexOutOfRangeError(_bad_index_message(type(it).__name__))
            if it is Ellipsis:
                ellipses += 1
                if ellipses > 1:
                    raise IndexOutOfRangeError(f"{where('getitem')}: an index can only have a "
                                               "single ellipsis ('...')")
            elif isinstance(it, _Mask):
                consumed += it.values.ndim
            elif it is not None:
                consumed += 1
            items.append(it)
        if consumed > x.ndim:
            raise IndexOutOfRangeError(f"{where('getitem')}: too many indices for tensor of "
                                       f"dimension {x.ndim}")
        fill = [slice(None)] * (x.ndim - consumed)
        if ellipses:
            k = next(i for i, it in enumerate(items) if it is Ellipsis)
            return items[:k] + fill + items[k + 1:]
        return items + fill

    def _slice(self, it: slice, d: int, n: int) -> int:
        if it.step == 0:
            raise ArgumentError(f"{where('getitem')}: slice step cannot be zero")
        if any(type(v) is Sym for v in (it.start, it.stop, n)) and (it.step or 1) > 0:
            return self._symbolic_slice(it, d, n)
        start, stop, step = it.indices(n)
        count = len(range(start, stop, step))
        if step < 0:
            if count:
                self.flips.append(d)
                start, stop, step = start + (count - 1) * step, start + 1, -step
            else:
                start, stop, step = 0, 0, 1
        self.starts[d], self.stops[d], self.steps[d] = start, max(start, stop), step
        return count

    def _symbolic_slice(self, it: slice, d: int, n) -> int:
        """`slice.indices` for a positive step where a bound or the size is symbolic
        (`mask[:t, :t]` with t a symbolic length): the clamps compare symbolic sizes, which
        guards what the trace assumed (`t <= 32`), as PyTorch does."""
        step = it.step or 1

        def bound(v, default):
            if v is None:
                return default
            if type(v) is not Sym and v < 0:
                v = n + v
                return 0 if type(v) is not Sym and v < 0 else v
            return v if v <= n else n

        start, stop = bound(it.start, 0), bound(it.stop, n)
        if start >= stop:
            start = stop = 0 if type(start) is Sym else start
            self.starts[d], self.stops[d], self.steps[d] = start, start, 1
            return 0
        count = stop - start if step == 1 else -((start - stop) // step)
        self.starts[d], self.stops[d], self.steps[d] = start, stop, step
        return count

    def _mask(self, mask: _Mask, shape: tuple, d: int) -> int:
        m = mask.values
        if m.ndim == 0:  # x[True] adds a dimension of size 1, x[False] one of size 0
            self.advanced.append((len(self.basic), np.zeros(int(m), dtype=np.int64)))
            self.basic.append(1)
            return d
        for k, (ms, xs) in enumerate(zip(m.shape, shape[d:])):
            if ms != xs:
                raise IndexOutOfRangeError(
                    f"{where('getitem')}: The shape of the mask {list(m.shape)} at index {k} "
                    f"does not match the shape of the indexed tensor {list(shape)} at index "
                    f"{d + k}"
                )
        for k, positions in enumerate(np.nonzero(m)):
            self.advanced.append((len(self.basic), positions.astype(np.int64)))
            self.basic.append(shape[d + k])
        return d + m.ndim

    def is_identity_slice(self, shape) -> bool:
        return same_shape(self.sliced, tuple(shape)) and all(s == 1 for s in self.steps)


class _Mask:
    __slots__ = ("values",)

    def __init__(self, values: np.ndarray) -> None:
        self.values = values


def _mask_values(mask) -> np.ndarray:
    from graphc.dispatch import current_tracer

    if current_tracer() is not None:
        raise TraceError(
            f"{where('getitem')}: indexing with a boolean mask gives a shape that depends on the "
            "mask's values, which a trace does not have. Use graphc.where(mask, x, other) to "
            "keep the shape, or move this code out of the compiled function."
        )
    return mask._data


def _bad_index_message(got: str) -> str:
    return (f"{where('getitem')}: only integers, slices (`:`), ellipsis (`...`), None and long "
            f"or byte Variables are valid indices (got {got})")


def _basic(x, plan: _IndexPlan):
    """Slice, flip and reshape x as the plan's basic part says (views unless flipped)."""
    y = x
    if not plan.is_identity_slice(x.shape):
        y = call("slice", y, starts=tuple(plan.starts), stops=tuple(plan.stops),
                 steps=tuple(plan.steps))
    if plan.flips:
        y = call("flip", y, axes=tuple(plan.flips))
    if not same_shape(tuple(plan.basic), plan.sliced):
        y = call("reshape", y, shape=tuple(plan.basic))
    if y is x and not plan.advanced:  # x[:] and x[...] are new views of x, not x itself
        y = call("reshape", x, shape=tuple(x.shape))
    return y


def _index_tensor(index):
    from graphc.tensor import Tensor

    return index if isinstance(index, Tensor) else Tensor._wrap(np.asarray(index, np.int64))


def _advanced_layout(y, plan: _IndexPlan):
    """Bring the advanced dimensions of y together and merge them into one.

    Returns (merged tensor, axis, flat index, undo) where undo(t) maps a tensor of the merged
    layout back to y's layout (for __setitem__).
    """
    from graphc.tensor import Tensor

    positions = [p for p, _ in plan.advanced]
    sizes = [y.shape[p] for p in positions]
    indices = [idx for _, idx in plan.advanced]
    for p, n, idx in zip(positions, sizes, indices):
        if isinstance(idx, Tensor):
            _eager_range_check("getitem", idx, n, p)
        else:
            _check_index_range("getitem", idx, n, p)
    try:
        np.broadcast_shapes(*(tuple(i.shape) for i in indices))
    except ValueError:
        shapes = ", ".join(str(list(i.shape)) for i in indices)
        raise IndexOutOfRangeError(f"{where('getitem')}: shape mismatch: indexing tensors could "
                                   f"not be broadcast together with shapes {shapes}") from None
    if len(indices) == 1:
        return y, positions[0], _index_tensor(indices[0]), _identity

    perm = None
    if positions != list(range(positions[0], positions[0] + len(positions))):
        perm = tuple(positions) + tuple(d for d in range(y.ndim) if d not in positions)
        y = call("permute", y, dims=perm)
        positions = list(range(len(positions)))
    p0, k = positions[0], len(positions)
    grouped = tuple(y.shape)
    merged = call("reshape", y, shape=grouped[:p0] + (numel(tuple(sizes)),) + grouped[p0 + k:])

    if all(not isinstance(i, Tensor) for i in indices):
        flat = np.zeros((), np.int64)
        for idx, n in zip(indices, sizes):
            flat = flat * n + np.where(idx < 0, idx + n, idx)
        flat = _index_tensor(flat)
    else:
        flat = None
        for idx, n in zip(indices, sizes):
            idx = _index_tensor(idx)
            idx = call("where", idx < 0, idx + n, idx)
            flat = idx if flat is None else flat * n + idx

    def undo(t):
        t = call("reshape", t, shape=grouped)
        if perm is not None:
            t = call("permute", t, dims=tuple(int(i) for i in np.argsort(perm)))
        return t

    return merged, p0, flat, undo


def _identity(t):
    return t


def getitem(x, index):
    """x[index] with PyTorch's rules (ints, slices, None, ..., int and bool tensors/lists)."""
    plan = _IndexPlan(x, index)
    y = _basic(x, plan)
    if not plan.advanced:
        return y
    merged, axis, flat, _ = _advanced_layout(y, plan)
    return call("take", merged, flat, axis=axis)


def _value_like(value, target, shape: tuple):
    """`value` as a tensor of target's dtype broadcast to `shape` (PyTorch's setitem rules)."""
    from graphc.ops.elementwise import cast
    from graphc.tensor import Tensor

    if isinstance(value, Tensor):
        value = cast(value, target.dtype)
    else:
        value = Tensor._wrap(np.asarray(value).astype(target.dtype.np))
    while value.ndim > len(shape) and value.shape[0] == 1:
        value = call("reshape", value, shape=tuple(value.shape)[1:])
    if tuple(value.shape) != shape:
        value = expand(value, shape, _op="setitem")
    return value


def index_put_value(x, index, value):
    """Out-of-place x[index] = value: a new tensor (what `__setitem__` writes back)."""
    plan = _IndexPlan(x, index)
    if plan.advanced:
        y = _basic(x, plan)
        merged, axis, flat, undo = _advanced_layout(y, plan)
        ty = _taken_shape("setitem", merged.type, flat.type, axis)
        new = call("index_put", merged, flat, _value_like(value, x, ty), axis=axis)
        new_basic = undo(new)
    else:
        new_basic = _value_like(value, x, tuple(plan.basic))
    if not same_shape(tuple(plan.basic), plan.sliced):
        new_basic = call("reshape", new_basic, shape=plan.sliced)
    if plan.flips:
        new_basic = call("flip", new_basic, axes=tuple(plan.flips))
    # Even x[...] = value goes through slice_scatter: the result is a new tensor whose history
    # still reaches x (with a zero gradient), as in PyTorch.
    return call("slice_scatter", x, new_basic, starts=tuple(plan.starts),
                stops=tuple(plan.stops), steps=tuple(plan.steps))


def setitem(x, index, value) -> None:
    """x[index] = value, in place: bumps x's version counter and records autograd history."""

    def assigned(old):
        return index_put_value(old, index, value)

    inplace(x, "setitem", assigned)


TENSOR_METHODS = {"__getitem__": getitem, "__setitem__": setitem}
PUBLIC: tuple = ()
