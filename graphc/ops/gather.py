"""Gathers and scatters: integer-tensor indexing along one axis, and PyTorch's gather.

Primitives (registry ops), each with its rule, kernel and VJP on consecutive lines:
  take, index_add, index_put    integer-tensor indexing along one axis, its scatter-add VJP,
                                and out-of-place index assignment
  gather, scatter_add           PyTorch's gather and its scatter-add VJP
Every VJP is written with these ops (and movement's), so gradients of gradients work and
trace. Indices may be negative (in [-n, n), numpy's wrap-around); eager mode checks the range
when the index values are known, a compiled graph checks them in its kernels.
"""

from __future__ import annotations

import numpy as np

from graphc.errors import DTypeError, IndexOutOfRangeError, ShapeError, where
from graphc.ops.movement import _zeros
from graphc.ops.registry import MOVEMENT, OpDef, call, register
from graphc.ops.shapes import index_dtype_check, normalize_axis
from graphc.types import TensorType, int64


def _check_index_range(op: str, index: np.ndarray, size: int, dim: int, message=None,
                       allow_negative: bool = True) -> None:
    """Raise PyTorch's IndexError when an index lies outside [-size, size) (or [0, size))."""
    if index.size == 0:
        return
    bad = (index < (-size if allow_negative else 0)) | (index >= size)
    if bad.any():
        value = int(index[bad].reshape(-1)[0])
        raise IndexOutOfRangeError(
            f"{where(op)}: " + (message or f"index {value} is out of bounds for dimension {dim} "
                                f"with size {size}")
        )


def _axis_index(axis: int, index):
    return (slice(None),) * axis + (index,)


# ---- take, index_add, index_put: integer-tensor indexing along one axis ----------------------
def _taken_shape(op: str, x: TensorType, index: TensorType, axis: int) -> tuple[int, ...]:
    index_dtype_check(op, index)
    axis = normalize_axis(op, axis, x.ndim)
    if x.ndim == 0:
        raise ShapeError(f"{where(op)}: cannot index a 0-d tensor along an axis")
    return x.shape[:axis] + index.shape + x.shape[axis + 1:]


def _take_infer(x: TensorType, index: TensorType, axis: int) -> TensorType:
    return TensorType(_taken_shape("take", x, index, axis), x.dtype)


def _take_kernel(x, index, axis):
    _check_index_range("take", index, x.shape[axis], axis)
    return np.take(x, index, axis=axis)


def _take_vjp(ctx, g):
    x = ctx.input_types[0]
    return (call("index_add", _zeros(x, g.dtype), ctx.inputs[1], g, axis=ctx.attrs["axis"]),
            None)


register(OpDef("take", MOVEMENT, ("x", "index"), _take_infer, _take_kernel, _take_vjp,
               attrs={"axis": int}, saved_inputs=(1,)))


def _scatter_like_infer(op: str, x: TensorType, index: TensorType, src: TensorType,
                        axis: int) -> TensorType:
    shape = _taken_shape(op, x, index, axis)
    if src.shape != shape or src.dtype != x.dtype:
        raise ShapeError(f"{where(op)}: source must be {TensorType(shape, x.dtype)} (what "
                         f"take would give for this index), got {src}")
    return x


def _index_add_infer(x: TensorType, index: TensorType, src: TensorType, axis: int):
    return _scatter_like_infer("index_add", x, index, src, axis)


def _index_add_kernel(x, index, src, axis):
    _check_index_range("index_add", index, x.shape[axis], axis)
    out = x.copy()
    np.add.at(out, _axis_index(axis, index), src)  # repeated indices accumulate
    return out


def _index_add_vjp(ctx, g):
    gsrc = call("take", g, ctx.inputs[1], axis=ctx.attrs["axis"])
    return (g, None, gsrc if ctx.needs_input_grad[2] else None)


register(OpDef("index_add", MOVEMENT, ("x", "index", "src"), _index_add_infer,
               _index_add_kernel, _index_add_vjp, attrs={"axis": int}, saved_inputs=(1,)))


def _index_put_infer(x: TensorType, index: TensorType, values: TensorType, axis: int):
    return _scatter_like_infer("index_put", x, index, values, axis)


def _index_put_kernel(x, index, values, axis):
    _check_index_range("index_put", index, x.shape[axis], axis)
    out = x.copy()
    out[_axis_index(axis, index)] = values  # a repeated index keeps one of its values
    return out


def _index_put_vjp(ctx, g):
    index, axis = ctx.inputs[1], ctx.attrs["axis"]
    gx = gv = None
    if ctx.needs_input_grad[0]:
        gx = call("index_put", g, index, _zeros(ctx.input_types[2], g.dtype), axis=axis)
    if ctx.needs_input_grad[2]:
        gv = call("take", g, index, axis=axis)
    return (gx, None, gv)


register(OpDef("index_put", MOVEMENT, ("x", "index", "values"), _index_put_infer,
               _index_put_kernel, _index_put_vjp, attrs={"axis": int}, saved_inputs=(1,)))


# ---- gather and scatter_add (PyTorch's) ------------------------------------------------------
def _gather_check(op: str, x: TensorType, index: TensorType, axis: int) -> None:
    index_dtype_check(op, index)
    if index.ndim != x.ndim and not (index.ndim <= 1 and x.ndim <= 1):
        raise ShapeError(f"{where(op)}: Index tensor must have the same number of dimensions "
                         f"as input tensor ({index.ndim} vs {x.ndim})")
    for d in range(index.ndim):
        if d != axis and index.shape[d] > x.shape[d]:
            raise ShapeError(
                f"{where(op)}: Size does not match at dimension {d} expected index "
                f"{list(index.shape)} to be no larger than self {list(x.shape)} apart from "
                f"dimension {axis}"
            )


def _gather_infer(x: TensorType, index: TensorType, axis: int) -> TensorType:
    _gather_check("gather", x, index, axis)
    return TensorType(index.shape, x.dtype)


def _along_axis(index, axis):
    """Full numpy index arrays that pick, at each position of `index`, entry index[...]."""
    grids = list(np.indices(index.shape, sparse=True))
    grids[axis] = index
    return tuple(grids)


def _gather_kernel(x, index, axis):
    if x.ndim == 0:
        return x.reshape(index.shape)
    _check_index_range("gather", index, x.shape[axis], axis, allow_negative=False)
    return x[_along_axis(index, axis)]


def _gather_vjp(ctx, g):
    x = ctx.input_types[0]
    return (call("scatter_add", _zeros(x, g.dtype), ctx.inputs[1], g, axis=ctx.attrs["axis"]),
            None)


register(OpDef("gather", MOVEMENT, ("x", "index"), _gather_infer, _gather_kernel, _gather_vjp,
               attrs={"axis": int}, saved_inputs=(1,)))


def _scatter_add_infer(x: TensorType, index: TensorType, src: TensorType, axis: int):
    _gather_check("scatter_add", x, index, axis)
    if src.shape != index.shape or src.dtype != x.dtype:
        raise ShapeError(f"{where('scatter_add')}: src must be "
                         f"{TensorType(index.shape, x.dtype)} (the index's shape), got {src}")
    return x


def _scatter_add_kernel(x, index, src, axis):
    out = x.copy()
    if x.ndim == 0:
        return out + src.sum()
    _check_index_range("scatter_add", index, x.shape[axis], axis, allow_negative=False)
    np.add.at(out, _along_axis(index, axis), src)
    return out


def _scatter_add_vjp(ctx, g):
    gsrc = call("gather", g, ctx.inputs[1], axis=ctx.attrs["axis"])
    return (g, None, gsrc if ctx.needs_input_grad[2] else None)


register(OpDef("scatter_add", MOVEMENT, ("x", "index", "src"), _scatter_add_infer,
               _scatter_add_kernel, _scatter_add_vjp, attrs={"axis": int}, saved_inputs=(1,)))


# ---- public functions: gathers and scatters --------------------------------------------------
def _as_index(op: str, index, what: str = "index"):
    from graphc.tensor import Tensor

    if not isinstance(index, Tensor):
        index = Tensor._wrap(np.asarray(index))
    if index.dtype is not int64:
        raise DTypeError(f"{where(op)}: {op}(): Expected dtype int64 for {what}, got "
                         f"{index.dtype.name}")
    return index


def index_select(x, dim: int, index):
    """Rows (along `dim`) of x picked by a 1-d int64 `index`."""
    index = _as_index("index_select", index)
    if index.ndim > 1:
        raise IndexOutOfRangeError(f"{where('index_select')}: index_select(): Index is "
                                   "supposed to be a vector")
    d = normalize_axis("index_select", dim, x.ndim)
    _eager_range_check("index_select", index, x.shape[d] if x.ndim else 1, d,
                       allow_negative=False, message="index out of range in self")
    if index.ndim == 0:
        index = call("reshape", index, shape=(1,))
    if x.ndim == 0:
        return call("reshape", call("take", call("reshape", x, shape=(1,)), index, axis=0),
                    shape=())
    return call("take", x, index, axis=d)


def index_add(x, dim: int, index, source, *, alpha=1):
    """x with `source` rows added at `index` along `dim` (repeated indices accumulate)."""
    index = _as_index("index_add", index)
    d = normalize_axis("index_add", dim, x.ndim)
    if alpha != 1:
        source = source * alpha
    return call("index_add", x, index, source, axis=d)


def gather(x, dim: int, index):
    """out[i][j] = x[index[i][j]][j] for dim 0 (and so on): PyTorch's gather."""
    index = _as_index("gather", index)
    d = normalize_axis("gather", dim, x.ndim)
    return call("gather", x, index, axis=d)


def scatter_add(x, dim: int, index, src):
    """x plus src's entries added at the positions `index` names along `dim`."""
    index = _as_index("scatter_add", index)
    d = normalize_axis("scatter_add", dim, x.ndim)
    if tuple(src.shape) != tuple(index.shape):
        if src.ndim != index.ndim or any(i > s for i, s in zip(index.shape, src.shape)):
            raise ShapeError(f"{where('scatter_add')}: Expected index {list(index.shape)} to be "
                             f"no larger than src {list(src.shape)}")
        src = call("slice", src, starts=(0,) * src.ndim, stops=tuple(index.shape),
                   steps=(1,) * src.ndim)
    return call("scatter_add", x, index, src, axis=d)


def _eager_range_check(op, index, size, dim, allow_negative=True, message=None) -> None:
    """Check index values now when they are known (eager mode); a trace checks at run time."""
    from graphc.dispatch import current_tracer

    if current_tracer() is None:
        _check_index_range(op, index._data, size, dim, message, allow_negative)


TENSOR_METHODS = {
    "index_select": index_select, "index_add": index_add, "gather": gather,
    "scatter_add": scatter_add,
}

PUBLIC = ("index_select", "index_add", "gather", "scatter_add")
