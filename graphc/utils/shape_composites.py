"""Composite shape functions of PyTorch's surface: moving, rolling, tiling, diagonals, grids.

Each is a decomposition into registry primitives (permute, reshape, narrow, cat, pad,
expand, where, index_select, index_add, scatter_add), so it runs eagerly with autograd, traces,
and compiles on every backend with no lowering of its own. Where PyTorch returns a view
(`diagonal`, `movedim`), graphc returns a view where the primitive is one (permute) and a copy
otherwise (diagonal): values and gradients agree, writes into the result do not reach input.

`repeat_interleave` with a tensor of repeats, `scatter`/`index_copy` with repeated indices:
see each docstring.

>>> import graphc
>>> graphc.roll(graphc.arange(4), 1)
tensor([3, 0, 1, 2])
"""

from __future__ import annotations

from graphc import dispatch
from graphc.errors import ArgumentError, DTypeError, IndexOutOfRangeError, ShapeError, TraceError
from graphc.ops import elementwise, gather, movement, reduce
from graphc.ops.registry import call, inplace_method
from graphc.ops.shapes import broadcast_many, normalize_axis
from graphc.types import bool_, int64


def _is_tensor(x) -> bool:
    from graphc.tensor import Tensor  # graphc.tensor imports the mixins that import this module

    return isinstance(x, Tensor)


def _dims(value) -> list[int]:
    return [value] if isinstance(value, int) else list(value)


def _iota(n):
    return call("arange", start=0.0, end=float(n), step=1.0, dtype="int64")


def _traced(x) -> bool:
    return dispatch.current_tracer() is not None or x.is_abstract


# ---- moving and rolling ----------------------------------------------------------------------
def movedim(input, source, destination):  # noqa: A002 (PyTorch's names)
    """input with dims `source` moved to positions `destination` (the others keep their order).

    >>> graphc.movedim(graphc.zeros(2, 3, 4), 0, -1).shape
    graphc.Size([3, 4, 2])
    """
    src, dst = _dims(source), _dims(destination)
    if len(src) != len(dst):
        raise ArgumentError(f"movedim: Invalid source or destination dims: source ({src} dims) "
                            f"should contain the same number of dims as destination ({dst} "
                            "dims)")
    n = input.ndim
    src = [normalize_axis("movedim", d, max(n, 1)) for d in src]
    dst = [normalize_axis("movedim", d, max(n, 1)) for d in dst]
    if len(set(src)) != len(src):
        raise ArgumentError(f"movedim: repeated dim in `source` ({list(source)})")
    if len(set(dst)) != len(dst):
        raise ArgumentError(f"movedim: repeated dim in `destination` ({list(destination)})")
    order = [None] * n
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(k for k in range(n) if k not in src)
    order = [k if k is not None else next(rest) for k in order]
    return movement.permute(input, *order) if n else input


moveaxis = movedim


def roll(input, shifts, dims=None):  # noqa: A002
    """input's elements shifted (circularly) by `shifts` along `dims` (flattened if None)."""
    shifts = _dims(shifts)
    if dims is None:
        if len(shifts) != 1:
            raise ArgumentError(f"`shifts` required to be a scalar or of length 1 when `dims` "
                                f"is None, got {len(shifts)}")  # not PyTorch's words: it has none
        flat = movement.flatten(input)
        return movement.reshape(roll(flat, shifts, 0), tuple(input.shape))
    dims = _dims(dims)
    if len(shifts) != len(dims):
        raise ShapeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:"
                            f"{len(dims)}")
    out = input
    for s, d in zip(shifts, dims):
        d = normalize_axis("roll", d, max(input.ndim, 1))
        n = out.shape[d]
        if n == 0:
            continue
        s = s % n
        if s:
            out = movement.cat([movement.narrow(out, d, n - s, s),
                                movement.narrow(out, d, 0, n - s)], d)
    return out if out is not input else movement.clone(input)


def tile(input, dims):  # noqa: A002
    """input repeated dims[i] times along dim i (dims shorter than input.ndim get leading 1s)."""
    dims = _dims(dims)
    dims = [1] * (input.ndim - len(dims)) + dims
    return movement.repeat(input, *dims)


def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):  # noqa: A002
    """Each element repeated `repeats` times along `dim` (input flattened when dim is None).

    An int `repeats` traces and compiles. A tensor of repeats gives a shape that depends on
    its values: eager only (inside a trace it is a TraceError, as torch.compile graph-breaks).
    """
    if repeats is None:  # torch.repeat_interleave(repeats): indices repeated by their counts
        return repeat_interleave(_iota(input.shape[0]), input, 0)
    x = movement.flatten(input) if dim is None else input
    d = 0 if dim is None else normalize_axis("repeat_interleave", dim, max(x.ndim, 1))
    if x.ndim == 0:
        x = movement.reshape(x, (1,))
    if _is_tensor(repeats) and repeats.ndim == 0:
        repeats = int(repeats.item())
    if isinstance(repeats, int):
        if repeats < 0:
            raise ArgumentError("Repeats must be non-negative")
        shape = tuple(x.shape)
        y = movement.unsqueeze(x, d + 1)
        y = movement.expand(y, *shape[:d + 1], repeats, *shape[d + 1:])
        return movement.reshape(y, shape[:d] + (shape[d] * repeats,) + shape[d + 1:])
    if not _is_tensor(repeats):
        from graphc.creation import tensor

        repeats = tensor(repeats, dtype=int64)
    if repeats.ndim != 1 or repeats.shape[0] != x.shape[d]:
        raise ShapeError(f"repeats must have the same size as input along dim, but got "
                         f"repeats.size(0) = {repeats.shape[0] if repeats.ndim else 1} and "
                         f"input.size({d}) = {x.shape[d]}")
    if _traced(repeats):
        raise TraceError("repeat_interleave with a tensor of repeats: the result's length is "
                         "the sum of the repeats, which a trace does not have (torch.compile "
                         "graph-breaks here); pass an int, or call it outside the compiled "
                         "function")
    import numpy as np

    from graphc.tensor import Tensor

    counts = repeats.detach().numpy()
    if (counts < 0).any():
        raise ArgumentError("repeats can not be negative")
    index = Tensor._wrap(np.repeat(np.arange(len(counts)), counts).astype(np.int64), False)
    return gather.index_select(x, d, index)


# ---- diagonals -------------------------------------------------------------------------------
def diagonal(input, offset: int = 0, dim1: int = 0, dim2: int = 1):  # noqa: A002
    """The diagonal of input over dims dim1, dim2 (offset > 0: above it), as the last dim."""
    n = input.ndim
    if n < 2:
        raise ShapeError(f"diagonal dimensions requires ndim larger than 1, got {n}")
    d1, d2 = normalize_axis("diagonal", dim1, n), normalize_axis("diagonal", dim2, n)
    if d1 == d2:
        raise ArgumentError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    rest = [k for k in range(n) if k not in (d1, d2)]
    x = movement.permute(input, *rest, d1, d2)
    rows, cols = x.shape[-2], x.shape[-1]
    if offset >= 0:
        x = movement.narrow(x, -1, min(offset, cols), max(cols - offset, 0))
    else:
        x = movement.narrow(x, -2, min(-offset, rows), max(rows + offset, 0))
    m = min(x.shape[-2], x.shape[-1])
    x = movement.narrow(movement.narrow(x, -2, 0, m), -1, 0, m)
    flat = movement.reshape(x, tuple(x.shape[:-2]) + (m * m,))
    return flat[..., ::m + 1] if m else flat


def diag_embed(input, offset: int = 0, dim1: int = -2, dim2: int = -1):  # noqa: A002
    """Matrices with input's last dim on their diagonal (offset > 0: above it), at dims
    dim1, dim2 of the result."""
    n = input.shape[-1] if input.ndim else 1
    size = n + abs(offset)
    x = movement.unsqueeze(input, -1)
    eye = movement.unsqueeze(_iota(n), -1) == _iota(n)
    out = elementwise.where(eye, x, _zero(input))
    pads = (offset, 0, 0, offset) if offset >= 0 else (0, -offset, -offset, 0)
    out = movement.pad(out, pads)
    rank = out.ndim
    d1, d2 = normalize_axis("diag_embed", dim1, rank), normalize_axis("diag_embed", dim2, rank)
    if d1 == d2:
        raise ArgumentError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    assert out.shape[-1] == size
    return movedim(out, [rank - 2, rank - 1], [d1, d2])


def _zero(like):
    return call("full", shape=(), value=False if like.dtype is bool_ else 0,
                dtype=like.dtype.name)


def diag(input, diagonal: int = 0):  # noqa: A002
    """A 1-D input on the diagonal of a square matrix, or a 2-D input's diagonal."""
    if input.ndim == 1:
        return diag_embed(input, diagonal)
    if input.ndim == 2:
        return globals()["diagonal"](input, diagonal)
    raise ShapeError(f"diag(): Supports 1D or 2D tensors. Got {input.ndim}D")


def trace(input):  # noqa: A002
    """The sum of a matrix's diagonal (integers give int64)."""
    if input.ndim != 2:
        raise ShapeError(f"trace: expected a matrix, but got tensor with dim {input.ndim}")
    return reduce.sum(diagonal(input))


# ---- joining, grids, broadcasting ------------------------------------------------------------
def broadcast_tensors(*tensors):
    """The tensors expanded to their common broadcast shape (views)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    shape = broadcast_many("broadcast_tensors", *(tuple(t.shape) for t in tensors))
    return tuple(movement.broadcast_to(t, shape) for t in tensors)


def broadcast_shapes(*shapes):
    """The broadcast of `shapes` as a graphc.Size (no tensors made)."""
    from graphc.tensor import Size

    return Size(broadcast_many("broadcast_shapes",
                               *(tuple(_dims(s)) for s in shapes)))


def meshgrid(*tensors, indexing: str | None = None):
    """Coordinate grids from 1-D tensors ('ij' indexing by default, as PyTorch; 'xy' swaps
    the first two)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    indexing = indexing or "ij"
    if indexing not in ("ij", "xy"):
        raise ArgumentError(f"torch.meshgrid: indexing must be one of \"xy\" or \"ij\", but "
                            f"received: {indexing}")
    for t in tensors:
        if t.ndim > 1:
            raise ShapeError(f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list but "
                             f"got: {t}")
    flat = [movement.reshape(t, (-1,)) for t in tensors]
    swap = indexing == "xy" and len(flat) >= 2
    if swap:
        flat[0], flat[1] = flat[1], flat[0]
    shape = tuple(t.shape[0] for t in flat)
    grids = []
    for k, t in enumerate(flat):
        view = [1] * len(flat)
        view[k] = shape[k]
        grids.append(movement.expand(movement.reshape(t, tuple(view)), *shape))
    if swap:  # grids of (y, x, ...) in 'ij' order: x varies along dim 1, as 'xy' wants
        grids[0], grids[1] = grids[1], grids[0]
    return tuple(grids)


def _atleast(t, n: int):
    if t.ndim >= n:
        return t
    if n == 2 and t.ndim == 1:
        return movement.unsqueeze(t, 0)
    return movement.reshape(t, (1,) * (n - t.ndim) + tuple(t.shape))


def atleast_1d(*tensors):
    """Each tensor with at least 1 dim (a 0-d tensor becomes shape (1,))."""
    out = tuple(_atleast(t, 1) for t in _flat_args(tensors))
    return out[0] if len(out) == 1 else out


def atleast_2d(*tensors):
    """Each tensor with at least 2 dims (a 1-D tensor becomes a row)."""
    out = tuple(_atleast(t, 2) for t in _flat_args(tensors))
    return out[0] if len(out) == 1 else out


def _flat_args(tensors):
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        return tuple(tensors[0])
    return tensors


def hstack(tensors):
    """Tensors joined column-wise: along dim 1, or dim 0 for 1-D tensors."""
    tensors = [_atleast(t, 1) for t in tensors]
    return movement.cat(tensors, 0 if tensors and tensors[0].ndim == 1 else 1)


def vstack(tensors):
    """Tensors joined row-wise (1-D tensors become rows)."""
    return movement.cat([_atleast(t, 2) for t in tensors], 0)


row_stack = vstack


def dstack(tensors):
    """Tensors joined along dim 2 (made at least 3-D first)."""
    out = []
    for t in tensors:
        if t.ndim == 0:
            t = movement.reshape(t, (1, 1, 1))
        elif t.ndim == 1:
            t = movement.reshape(t, (1, t.shape[0], 1))
        elif t.ndim == 2:
            t = movement.unsqueeze(t, -1)
        out.append(t)
    return movement.cat(out, 2)


def column_stack(tensors):
    """1-D tensors as columns (others as they are), joined along dim 1."""
    cols = [movement.reshape(t, (t.shape[0] if t.ndim else 1, 1)) if t.ndim <= 1 else t
            for t in tensors]
    return movement.cat(cols, 1)


# ---- differences, take, index writes ---------------------------------------------------------
def diff(input, n: int = 1, dim: int = -1, prepend=None, append=None):  # noqa: A002
    """The n-th forward difference along `dim` (bool: xor, as PyTorch)."""
    if input.ndim == 0:
        raise ShapeError("diff expects input to be at least one-dimensional")
    d = normalize_axis("diff", dim, input.ndim)
    parts = [t for t in (prepend, input, append) if t is not None]
    x = movement.cat(parts, d) if len(parts) > 1 else input
    for _ in range(n):
        size = x.shape[d]
        if size <= 1:
            return movement.narrow(x, d, 0, 0)
        hi, lo = movement.narrow(x, d, 1, size - 1), movement.narrow(x, d, 0, size - 1)
        x = elementwise.logical_xor(hi, lo) if x.dtype is bool_ else hi - lo
    return x if x is not input else movement.clone(x)


def take(input, index):  # noqa: A002
    """input treated as 1-D, at `index` (negative indices count from the end); index's shape."""
    flat = movement.flatten(input)
    numel = flat.shape[0]
    if not _traced(index):
        values = index.detach().numpy()
        bad = (values >= numel) | (values < -numel)
        if bad.any():
            raise IndexOutOfRangeError(f"out of range: tried to access index "
                                       f"{int(values[bad].flat[0])} on a tensor of {numel} "
                                       "elements.")
    wrapped = elementwise.where(index < 0, index + numel, index)
    picked = gather.index_select(flat, 0, movement.flatten(wrapped))
    return movement.reshape(picked, tuple(index.shape))


def _mask_along(x, d: int, index):
    """A bool tensor, True at the positions of `index` along dim d, shaped to broadcast on x."""
    n = x.shape[d]
    hits = reduce.any(movement.unsqueeze(index, -1) == _iota(n), dim=0)
    shape = [1] * x.ndim
    shape[d] = n
    return movement.reshape(hits, tuple(shape))


def _check_index(op: str, index):
    if not _is_tensor(index) or index.dtype is not int64:
        got = index.dtype.name if _is_tensor(index) else type(index).__name__
        raise DTypeError(f"{op}_(): Expected dtype int64 for index (got {got}).")
    if index.ndim > 1:
        raise ShapeError(f"{op}(): Index is supposed to be a vector")


def index_fill(input, dim: int, index, value):  # noqa: A002
    """input with the slices at `index` along `dim` set to `value`."""
    _check_index("index_fill", index)
    d = normalize_axis("index_fill", dim, max(input.ndim, 1))
    if input.ndim == 0:
        return elementwise.where(reduce.any(index == 0), _cast_value(value, input), input)
    mask = _mask_along(input, d, movement.reshape(index, (-1,)))
    return elementwise.where(mask, _cast_value(value, input), input)


def _cast_value(value, like):
    if _is_tensor(value):
        if value.ndim != 0:
            raise ShapeError(f"index_fill_ only supports a 0-dimensional value tensor, but got "
                             f"tensor with {value.ndim} dimension(s).")
        return elementwise.cast(value, like.dtype)
    return call("full", shape=(), value=value if like.dtype.is_floating else int(value),
                dtype=like.dtype.name)


def index_copy(input, dim: int, index, source):  # noqa: A002
    """input with source's slices written at `index` along `dim`.

    A repeated index leaves PyTorch's result undefined; graphc refuses it eagerly (and sums
    the repeated slices inside a trace, which cannot see the values)."""
    _check_index("index_copy", index)
    d = normalize_axis("index_copy", dim, max(input.ndim, 1))
    if not _traced(index):
        import numpy as np

        values = index.detach().numpy().reshape(-1)
        if len(np.unique(values)) != len(values):
            raise ArgumentError("index_copy(): index has repeated entries, for which the "
                                "result is undefined in PyTorch; graphc refuses them")
    placed = gather.index_add(_zeros_of(input), d, index, source)
    return elementwise.where(_mask_along(input, d, index), placed, input)


def scatter(input, dim: int, index, src=None, *, value=None, reduce=None):  # noqa: A002
    """input with src's values (or `value`) written at the positions `index` names along
    `dim` (PyTorch's scatter). `reduce="add"` is scatter_add; "multiply" is refused.

    Repeated indices with a src tensor are undefined in PyTorch; eagerly graphc refuses them,
    inside a trace (no values) they sum. With a scalar `value` they are exact."""
    if src is not None and not _is_tensor(src):
        value, src = src, None
    d = normalize_axis("scatter", dim, max(input.ndim, 1))
    if src is not None:
        src = _narrow_to(src, tuple(index.shape))
    if reduce == "add":
        addend = src if src is not None else movement.expand(_cast_value(value, input),
                                                             *index.shape)
        return gather.scatter_add(input, d, index, addend)
    if reduce is not None:
        raise ArgumentError(f"scatter(): reduce={reduce!r} is not supported by graphc (use "
                            "scatter_reduce with 'sum' or 'mean', or scatter_add)")
    hits = _scatter_hits(input, d, index)
    if src is None:
        return elementwise.where(hits > 0, _cast_value(value, input), input)
    if not _traced(index) and hits.numel() and int(reduce_max(hits)) > 1:
        raise ArgumentError("scatter(): index has repeated positions, for which the result is "
                            "undefined in PyTorch; graphc refuses them")
    cleared = elementwise.where(hits > 0, _zero(input), input)
    return gather.scatter_add(cleared, d, index, elementwise.cast(src, input.dtype))


def reduce_max(t) -> int:
    return int(reduce.amax(t).item())


def _zeros_of(like):
    return call("full", shape=tuple(like.shape), value=0, dtype=like.dtype.name)


def _zeros_int(like):
    return call("full", shape=tuple(like.shape), value=0, dtype="int64")


def _narrow_to(src, shape):
    """src cut to `shape` from the front of each dim (scatter reads only index's extent)."""
    for k, n in enumerate(shape):
        if src.shape[k] != n:
            src = movement.narrow(src, k, 0, n)
    return src


def scatter_reduce(input, dim: int, index, src, reduce: str, *,  # noqa: A002
                   include_self: bool = True):
    """PyTorch's scatter_reduce for reduce "sum" and "mean" ("prod", "amax", "amin" are
    refused: graphc has no scatter primitive with those combiners yet)."""
    if reduce not in ("sum", "mean", "prod", "amax", "amin"):
        raise ArgumentError(f"reduce argument must be either sum, prod, mean, amax or amin, "
                            f"got {reduce}")
    if reduce not in ("sum", "mean"):
        raise ArgumentError(f"scatter_reduce(reduce={reduce!r}) is not supported by graphc: "
                            "only 'sum' and 'mean' (a scatter with a max/min/prod combiner is "
                            "not a primitive yet)")
    d = normalize_axis("scatter_reduce", dim, max(input.ndim, 1))
    src = _narrow_to(src, tuple(index.shape))
    base = input if include_self else elementwise.where(
        _scatter_hits(input, d, index) > 0, _zero(input), input)
    total = gather.scatter_add(base, d, index, src)
    if reduce == "sum":
        return total
    count = _scatter_hits(input, d, index) + (1 if include_self else 0)
    count = elementwise.maximum(count, 1)
    out = total / elementwise.cast(count, total.dtype)
    if not input.dtype.is_floating:
        out = elementwise.cast(elementwise.floor_divide(total, count), input.dtype)
    return out


def _scatter_hits(input, d, index):
    ones = elementwise.cast(movement.expand(_iota(1) >= 0, *index.shape), int64)
    return gather.scatter_add(_zeros_int(input), d, index, ones)


# ---- in-place variants -----------------------------------------------------------------------
index_fill_ = inplace_method("index_fill_", index_fill)
index_copy_ = inplace_method("index_copy_", index_copy)
scatter_ = inplace_method("scatter_", scatter)
scatter_reduce_ = inplace_method("scatter_reduce_", scatter_reduce)

PUBLIC = ("movedim", "moveaxis", "roll", "tile", "repeat_interleave", "diagonal", "diag_embed",
          "diag", "broadcast_tensors", "broadcast_shapes", "meshgrid", "atleast_1d",
          "atleast_2d", "hstack", "vstack", "row_stack", "dstack", "column_stack", "diff",
          "take", "index_fill", "index_copy", "scatter", "scatter_reduce")
