"""Sorting, searching and data-dependent selection of PyTorch's surface, as composites.

- `sort`/`argsort`/`kthvalue`/`median`: eagerly the order comes from numpy's stable sort
  (NaN sorts as the largest value, as in PyTorch) and the values are gathered through it, so
  gradients flow to the picked elements. Inside a trace the order comes from `topk`'s traced
  path (n rounds of argmax, O(n^2)): fine for the short rows models sort; past 256 elements
  per row it is a TraceError; ties come out in index order there too, NaN is not placed.
- `searchsorted`/`bucketize`: a broadcast comparison and a count (O(n m)), traceable.
- `cummax`/`cummin`: a running max scan gives the positions, the values are gathered there.
- `nonzero`, `unique`, `masked_select`, `masked_scatter`, `argwhere`: the result's shape
  depends on the input's values. They run eagerly; inside a trace they raise TraceError
  naming the op and why (torch.compile graph-breaks on them the same way).

>>> import graphc
>>> graphc.sort(graphc.tensor([3.0, 1.0, 2.0]))
sort(values=tensor([1., 2., 3.]), indices=tensor([1, 2, 0]))
"""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from graphc import dispatch
from graphc.errors import ArgumentError, DTypeError, ShapeError, TraceError
from graphc.ops import elementwise, gather, movement, reduce
from graphc.ops.registry import call
from graphc.ops.shapes import normalize_axis
from graphc.types import bool_
from graphc.utils import composites

SortResult = namedtuple("sort", ("values", "indices"))
KthvalueResult = namedtuple("kthvalue", ("values", "indices"))
MedianResult = namedtuple("median", ("values", "indices"))
CummaxResult = namedtuple("cummax", ("values", "indices"))
CumminResult = namedtuple("cummin", ("values", "indices"))
for _t in (SortResult, KthvalueResult, MedianResult, CummaxResult, CumminResult):
    _t.__module__ = "graphc.return_types"


_TRACED_SORT_LIMIT = 256  # elements per sorted row inside a trace (n argmax rounds)


def _traced(x) -> bool:
    return dispatch.current_tracer() is not None or x.is_abstract


def _eager_only(op: str, x, why: str = "its result's shape depends on the input's values"):
    if _traced(x):
        raise TraceError(f"graphc.{op}: {why}, which a trace does not have (torch.compile "
                         "graph-breaks here too); call it outside the traced/compiled "
                         "function, or use a fixed-shape form (where, masked_fill, topk)")


def _wrap(array: np.ndarray):
    from graphc.tensor import Tensor

    return Tensor._wrap(np.ascontiguousarray(array), False)


# ---- sorting ---------------------------------------------------------------------------------
def _order(x, d: int, descending: bool):
    """The int64 permutation sorting x along d (a tensor without history)."""
    if _traced(x):
        n = x.shape[d]
        if not isinstance(n, int) or n > _TRACED_SORT_LIMIT:
            raise TraceError(f"graphc.sort inside a trace unrolls one argmax round per element "
                             f"(graphc has no sort primitive yet): {n} elements along dim {d} "
                             f"is past the {_TRACED_SORT_LIMIT} it unrolls; sort outside the "
                             "compiled function, or use topk with a small k")
        return composites.topk(x.detach(), n, d, largest=descending).indices
    arr = x.detach().numpy()
    if arr.dtype.kind == "b":
        arr = arr.astype(np.int64)
    if descending and arr.dtype.kind == "f":
        nan = np.isnan(arr)  # NaN first (the largest), then the values from the top, stably
        key = np.where(nan, 0.0, -arr.astype(np.float64))
        return _wrap(np.lexsort((key, ~nan), axis=d).astype(np.int64))
    key = -arr if descending else arr  # numpy sorts NaN last, as PyTorch does ascending
    return _wrap(np.argsort(key, axis=d, kind="stable").astype(np.int64))


def sort(input, dim: int = -1, descending: bool = False, stable: bool = False):  # noqa: A002
    """(values, indices) of input sorted along `dim` (ties keep index order: stable)."""
    if input.ndim == 0:
        return SortResult(movement.clone(input), call("full", shape=(), value=0, dtype="int64"))
    d = normalize_axis("sort", dim, input.ndim)
    index = _order(input, d, descending)
    return SortResult(gather.gather(input, d, index), index)


def argsort(input, dim: int = -1, descending: bool = False, stable: bool = False):  # noqa: A002
    """The indices that sort input along `dim`."""
    return sort(input, dim, descending, stable).indices


def msort(input):  # noqa: A002
    """input sorted along dim 0."""
    return sort(input, 0).values


def kthvalue(input, k: int, dim: int = -1, keepdim: bool = False):  # noqa: A002
    """(values, indices) of the k-th smallest element along `dim` (k counts from 1)."""
    d = normalize_axis("kthvalue", dim, max(input.ndim, 1))
    n = input.shape[d] if input.ndim else 1
    if not 1 <= k <= n:
        raise ArgumentError(f"kthvalue(): selected number k out of range for dimension {d}")
    return KthvalueResult(*_pick_sorted(input, d, k - 1, keepdim))


def _pick_sorted(x, d: int, position: int, keepdim: bool):
    if x.ndim == 0:
        return movement.clone(x), call("full", shape=(), value=0, dtype="int64")
    index = movement.narrow(_order(x, d, False), d, position, 1)
    values = gather.gather(x, d, index)
    if not keepdim:
        values, index = movement.squeeze(values, d), movement.squeeze(index, d)
    return values, index


def median(input, dim=None, keepdim: bool = False):  # noqa: A002
    """The lower median (sorted[(n - 1) // 2]); NaN if the row has one. With `dim`: (values,
    indices)."""
    if dim is None:
        flat = movement.reshape(input, (-1,))
        if flat.shape[0] == 0:
            return call("full", shape=(), value=math.nan, dtype=input.dtype.name)
        values, _ = _median_along(flat, 0, False)
        return values
    d = normalize_axis("median", dim, max(input.ndim, 1))
    return MedianResult(*_median_along(input, d, keepdim))


def _median_along(x, d: int, keepdim: bool):
    n = x.shape[d] if x.ndim else 1
    if x.dtype.is_floating and not _traced(x):
        arr = x.detach().numpy()
        has_nan = np.isnan(arr).any(axis=d, keepdims=True) if x.ndim else np.isnan(arr)
        if has_nan.any():  # PyTorch: the first NaN of the row, and its index
            order = np.argsort(np.where(np.isnan(arr), 0, 1), axis=d, kind="stable")
            first_nan = np.take(order, [0], axis=d)
            _, median_idx = _pick_sorted(x, d, (n - 1) // 2, True)
            idx = np.where(has_nan, first_nan, median_idx.numpy()).astype(np.int64)
            index = _wrap(idx)
            values = gather.gather(x, d, index)
            if not keepdim:
                values, index = movement.squeeze(values, d), movement.squeeze(index, d)
            return values, index
    return _pick_sorted(x, d, (n - 1) // 2, keepdim)


# ---- searching -------------------------------------------------------------------------------
def searchsorted(sorted_sequence, input, *, out_int32: bool = False,  # noqa: A002
                 right: bool = False, side=None, sorter=None):
    """For each value, the index where it would be inserted into the sorted innermost dim of
    `sorted_sequence` (left: first such index; right=True / side="right": last)."""
    if out_int32:
        raise DTypeError("searchsorted(out_int32=True): graphc has no int32 dtype; the "
                         "result is int64")
    if side is not None:
        if side not in ("left", "right"):
            raise ArgumentError(f"torch.searchsorted(): side can only be 'left' or 'right' but "
                                f"got {side}")
        if right and side == "left":
            raise ArgumentError("torch.searchsorted(): side and right can't be set to opposites,"
                                " got side of left while right was True")
        right = side == "right"
    from graphc.tensor import Tensor

    seq = sorted_sequence
    if sorter is not None:
        seq = gather.gather(seq, -1, sorter)
    scalar = not isinstance(input, Tensor)
    values = composites._zero_of(seq) + input if scalar else input
    if seq.ndim == 1:
        below = movement.unsqueeze(values, -1)
        rows = seq
    else:
        if tuple(seq.shape[:-1]) != tuple(values.shape[:-1]):
            raise ShapeError("torch.searchsorted(): boundaries tensor should be 1 dimension or "
                             "the first N-1 dimensions of boundaries tensor and input value "
                             "tensor must match, but we got boundaries tensor "
                             f"{list(seq.shape)} and input value tensor {list(values.shape)}")
        below = movement.unsqueeze(values, -1)
        rows = movement.unsqueeze(seq, -2)
    hit = rows <= below if right else rows < below
    return reduce.sum(hit, dim=-1)


def bucketize(input, boundaries, *, out_int32: bool = False, right: bool = False):  # noqa: A002
    """The bucket of each value among 1-D `boundaries` (right=False: b[i-1] < x <= b[i])."""
    if boundaries.ndim != 1:
        raise ShapeError(f"boundaries tensor must be 1 dimension, but got dim("
                         f"{boundaries.ndim})")
    return searchsorted(boundaries, input, out_int32=out_int32, right=right)


def _cum_extreme(input, dim: int, largest: bool, result):  # noqa: A002
    d = normalize_axis("cummax" if largest else "cummin", dim, max(input.ndim, 1))
    if input.ndim == 0:
        return result(movement.clone(input), call("full", shape=(), value=0, dtype="int64"))
    from graphc.utils.math_composites import _scan

    x = input.detach()
    pick = elementwise.maximum if largest else elementwise.minimum
    fill = _lowest(x) if largest else _highest(x)
    running = _scan(x, d, pick, fill)
    n = x.shape[d]
    shape = [1] * x.ndim
    shape[d] = n
    iota = movement.reshape(composites._iota(n), tuple(shape))
    is_extreme = x == running
    if x.dtype.is_floating:  # a NaN is the running value from where it appears
        is_extreme = elementwise.logical_or(is_extreme, x != x)
    candidate = elementwise.where(is_extreme, iota, -1)
    index = _scan(candidate, d, elementwise.maximum, -1)
    return result(gather.gather(input, d, index), index)


def _lowest(x):
    if x.dtype is bool_:
        return False
    return -math.inf if x.dtype.is_floating else -(2**63)


def _highest(x):
    if x.dtype is bool_:
        return True
    return math.inf if x.dtype.is_floating else 2**63 - 1


def cummax(input, dim: int):  # noqa: A002
    """(values, indices) of the running maximum along `dim` (ties: the latest index)."""
    return _cum_extreme(input, dim, True, CummaxResult)


def cummin(input, dim: int):  # noqa: A002
    """(values, indices) of the running minimum along `dim` (ties: the latest index)."""
    return _cum_extreme(input, dim, False, CumminResult)


# ---- data-dependent shapes: eager only -------------------------------------------------------
def nonzero(input, *, as_tuple: bool = False):  # noqa: A002
    """The indices of the non-zero elements: (count, ndim) int64, or one index tensor per dim."""
    _eager_only("nonzero", input)
    found = np.nonzero(input.detach().numpy())
    if as_tuple:
        if input.ndim == 0:
            return (_wrap(np.zeros(int(bool(input.item())), dtype=np.int64)),)
        return tuple(_wrap(k.astype(np.int64)) for k in found)
    return _wrap(np.stack(found, axis=1).astype(np.int64) if input.ndim
                 else np.zeros((int(bool(input.item())), 0), dtype=np.int64))


def where(condition, input=None, other=None):  # noqa: A002
    """`where(condition, input, other)`: input where condition, else other (broadcasting);
    `where(condition)` alone is nonzero(condition, as_tuple=True) (eager only), as PyTorch."""
    if input is None and other is None:
        _eager_only("where(condition)", condition)
        return nonzero(condition, as_tuple=True)
    if input is None or other is None:
        raise TypeError("where() takes 1 or 3 arguments: where(condition) or "
                        "where(condition, input, other)")
    return elementwise.where(condition, input, other)


def argwhere(input):  # noqa: A002
    """nonzero(input) as a (count, ndim) tensor."""
    _eager_only("argwhere", input)
    return nonzero(input)


def masked_select(input, mask):  # noqa: A002
    """The elements of input where the (broadcast) bool mask is True, as a 1-D tensor."""
    if mask.dtype is not bool_:
        raise DTypeError("masked_select: expected BoolTensor for mask")
    _eager_only("masked_select", mask)
    from graphc.utils.shape_composites import broadcast_tensors

    x, m = broadcast_tensors(input, mask)
    return x[m]


def masked_scatter(input, mask, source):  # noqa: A002
    """input with the True positions of mask filled, in order, from source's elements."""
    if mask.dtype is not bool_:
        raise DTypeError(f"masked_scatter_ only supports boolean masks, but got mask with dtype "
                         f"{mask.dtype.name}")
    _eager_only("masked_scatter", mask)
    m = movement.broadcast_to(mask, tuple(input.shape)).detach().numpy()
    count = int(m.sum())
    if source.numel() < count:
        raise ArgumentError("masked_scatter: expected source to have at least as many "
                            f"elements as ones in mask ({count}), got {source.numel()}")
    flat_index = _wrap(np.flatnonzero(m).astype(np.int64))
    values = movement.narrow(movement.reshape(source, (-1,)), 0, 0, count)
    flat = movement.reshape(input, (-1,))
    from graphc.utils.shape_composites import index_copy

    return movement.reshape(index_copy(flat, 0, flat_index, values), tuple(input.shape))


def unique(input, sorted: bool = True, return_inverse: bool = False,  # noqa: A002
           return_counts: bool = False, dim=None):
    """The distinct values of input (sorted), with the inverse indices and the counts on
    request; `dim` takes distinct slices along it."""
    _eager_only("unique", input)
    arr = input.detach().numpy()
    if dim is None:
        values, inverse, counts = np.unique(arr, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(arr.shape)
    else:
        d = normalize_axis("unique", dim, max(input.ndim, 1))
        values, inverse, counts = np.unique(arr, return_inverse=True, return_counts=True,
                                            axis=d)
        inverse = inverse.reshape(-1)
    out = [_wrap(values.astype(arr.dtype))]
    if return_inverse:
        out.append(_wrap(inverse.astype(np.int64)))
    if return_counts:
        out.append(_wrap(counts.astype(np.int64)))
    return out[0] if len(out) == 1 else tuple(out)


def unique_consecutive(input, return_inverse: bool = False,  # noqa: A002
                       return_counts: bool = False, dim=None):
    """Consecutive runs of equal values collapsed to one (flattened when dim is None)."""
    _eager_only("unique_consecutive", input)
    if dim is not None:
        raise ArgumentError("unique_consecutive(dim=...) is not supported by graphc yet")
    arr = input.detach().numpy().reshape(-1)
    starts = np.ones(len(arr), dtype=bool)
    starts[1:] = arr[1:] != arr[:-1]
    out = [_wrap(arr[starts])]
    if return_inverse:
        out.append(_wrap((np.cumsum(starts) - 1).reshape(input.shape).astype(np.int64)))
    if return_counts:
        out.append(_wrap(np.diff(np.append(np.flatnonzero(starts), len(arr))).astype(np.int64)))
    return out[0] if len(out) == 1 else tuple(out)


PUBLIC = ("where", "sort", "argsort", "msort", "kthvalue", "median", "searchsorted", "bucketize",
          "cummax", "cummin", "nonzero", "argwhere", "masked_select", "masked_scatter",
          "unique", "unique_consecutive")
