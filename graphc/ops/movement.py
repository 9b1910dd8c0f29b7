"""Movement ops: reshape, permute, broadcast, slicing, concat, pad, flip (gathers: gather.py).

Primitives (registry ops), each with its rule, kernel and VJP on consecutive lines:
  reshape, permute, broadcast_to, slice        views of the input (`view=True`) where numpy
                                               gives one, so they share the version counter
  slice_scatter                                out-of-place slice assignment (slice's VJP)
  concat, pad, flip, copy
Every VJP is written with these ops, so gradients of gradients work and trace.

Slices are canonical (0 <= start <= stop <= n, step >= 1): the public functions normalise.
Everything else (transpose, squeeze, stack, split, narrow, repeat, __getitem__, __setitem__...)
is a composition of the primitives. `__getitem__` follows PyTorch's order: integers select,
slices slice, None inserts, then integer tensors index what is left (together, in place if
they are adjacent, in front otherwise). Unlike PyTorch, a negative slice step is accepted
(numpy's meaning), computed as a positive-step slice plus `flip`.
"""

from __future__ import annotations

import math
import operator

import numpy as np

from graphc.errors import ArgumentError, IndexOutOfRangeError, ShapeError, where
from graphc.ops.grad_utils import sum_to
from graphc.ops.registry import MOVEMENT, OpDef, call, register
from graphc.ops.shapes import (
    as_size,
    c_contiguous,
    contiguous_element_strides,
    normalize_axis,
    numel,
    result_dtype,
)
from graphc.symbolic import Sym
from graphc.types import TensorType, dtype_of_numpy, promote


def _zeros(ty: TensorType, dtype):
    return call("full", shape=tuple(ty.shape), value=0.0, dtype=dtype.name)


# ---- reshape ---------------------------------------------------------------------------------
def _reshape_infer(x: TensorType, shape: tuple) -> TensorType:
    if numel(shape) != x.numel or any(s < 0 for s in shape):
        raise ShapeError(
            f"{where('reshape')}: shape '{list(shape)}' is invalid for input of size {x.numel}"
        )
    return TensorType(shape, x.dtype)


def _reshape_kernel(x, shape):
    return np.reshape(x, shape)  # a view when the strides allow one, else a copy


def _reshape_without_copy(shape: tuple, strides: tuple, new: tuple) -> tuple[int, ...] | None:
    """numpy's `_attempt_nocopy_reshape` (C order): strides of `new` over the same elements,
    or None when some merged run of old dims is not contiguous."""
    old = [(n, s) for n, s in zip(shape, strides) if n != 1]
    new_strides = [0] * len(new)
    oi = ni = 0
    while ni < len(new) and oi < len(old):
        nj, oj = ni + 1, oi + 1
        np_, op = new[ni], old[oi][0]
        while np_ != op:
            if np_ < op:
                np_ *= new[nj]
                nj += 1
            else:
                op *= old[oj][0]
                oj += 1
        for k in range(oi, oj - 1):
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                return None
        new_strides[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            new_strides[k - 1] = new_strides[k] * new[k]
        ni, oi = nj, oj
    last = new_strides[ni - 1] if ni >= 1 else 1
    for k in range(ni, len(new)):
        new_strides[k] = last
    return tuple(new_strides)


def _reshape_view_strides(shape: tuple, strides: tuple, *, shape_to: tuple):
    if tuple(shape_to) == tuple(shape):
        return 0, tuple(strides)
    if c_contiguous(shape, strides):
        return 0, contiguous_element_strides(shape_to)
    found = _reshape_without_copy(tuple(shape), tuple(strides), tuple(shape_to))
    return None if found is None else (0, found)


def _reshape_view(shape: tuple, strides: tuple, /, **attrs):
    return _reshape_view_strides(shape, strides, shape_to=attrs["shape"])


def _reshape_vjp(ctx, g):
    return (call("reshape", g, shape=ctx.input_types[0].shape),)


register(OpDef("reshape", MOVEMENT, ("x",), _reshape_infer, _reshape_kernel, _reshape_vjp,
               attrs={"shape": tuple}, view=True, view_strides=_reshape_view))


# ---- permute ---------------------------------------------------------------------------------
def _permute_infer(x: TensorType, dims: tuple) -> TensorType:
    if len(dims) != x.ndim:
        raise ShapeError(
            f"{where('permute')}: number of dimensions in the tensor input does not match the "
            f"length of the desired ordering of dimensions i.e. input.dim() = {x.ndim} is not "
            f"equal to len(dims) = {len(dims)}"
        )
    if sorted(dims) != list(range(x.ndim)):
        raise ArgumentError(f"{where('permute')}: duplicate dims are not allowed (got {dims})")
    return TensorType(tuple(x.shape[d] for d in dims), x.dtype)


def _permute_kernel(x, dims):
    return np.transpose(x, dims)


def _permute_view(shape: tuple, strides: tuple, /, *, dims: tuple):
    return 0, tuple(strides[d] for d in dims)


def _permute_vjp(ctx, g):
    inverse = tuple(int(i) for i in np.argsort(ctx.attrs["dims"]))
    return (call("permute", g, dims=inverse),)


register(OpDef("permute", MOVEMENT, ("x",), _permute_infer, _permute_kernel, _permute_vjp,
               attrs={"dims": tuple}, view=True, view_strides=_permute_view))


# ---- broadcast_to ----------------------------------------------------------------------------
def _expand_error(x_shape, shape) -> str | None:
    if len(shape) < len(x_shape):
        return (f"the number of sizes provided ({len(shape)}) must be greater or equal to the "
                f"number of dimensions in the tensor ({len(x_shape)})")
    lead = len(shape) - len(x_shape)
    for i, s in enumerate(shape):
        if s < 0:
            return f"The expanded size of the tensor ({s}) isn't allowed (dimension {i})"
        if i >= lead and x_shape[i - lead] not in (1, s):
            return (f"The expanded size of the tensor ({s}) must match the existing size "
                    f"({x_shape[i - lead]}) at non-singleton dimension {i}.  Target sizes: "
                    f"{list(shape)}.  Tensor sizes: {list(x_shape)}")
    return None


def _broadcast_to_infer(x: TensorType, shape: tuple) -> TensorType:
    problem = _expand_error(x.shape, shape)
    if problem:
        raise ShapeError(f"{where('broadcast_to')}: {problem}")
    return TensorType(shape, x.dtype)


def _broadcast_to_kernel(x, shape):
    lead = len(shape) - x.ndim
    if all(s == 1 for s in shape[:lead]) and tuple(shape[lead:]) == x.shape:
        return np.reshape(x, shape)  # nothing repeats: a writable view, as PyTorch's expand
    return np.broadcast_to(x, shape)  # read-only: in-place writes to it are refused


def _broadcast_to_view(shape: tuple, strides: tuple, /, **attrs):
    to = tuple(attrs["shape"])
    lead = len(to) - len(shape)
    if all(s == 1 for s in to[:lead]) and to[lead:] == tuple(shape):
        return _reshape_view_strides(shape, strides, shape_to=to)  # as the kernel does
    # np.broadcast_to: stride 0 along new dims and along every size-1 dim of the input
    return 0, tuple(0 if d < lead or shape[d - lead] == 1 else strides[d - lead]
                    for d in range(len(to)))


def _broadcast_to_vjp(ctx, g):
    return (sum_to(g, ctx.input_types[0].shape),)


register(OpDef("broadcast_to", MOVEMENT, ("x",), _broadcast_to_infer, _broadcast_to_kernel,
               _broadcast_to_vjp, attrs={"shape": tuple}, view=True,
               view_strides=_broadcast_to_view))


# ---- slice and slice_scatter -----------------------------------------------------------------
def _slice_shape(op: str, x: TensorType, starts, stops, steps) -> tuple[int, ...]:
    if not len(starts) == len(stops) == len(steps) == x.ndim:
        raise ArgumentError(f"{where(op)}: expected one start/stop/step per dimension of "
                            f"{x}, got {starts}, {stops}, {steps}")
    out = []
    for d, (a, b, s) in enumerate(zip(starts, stops, steps)):
        if not (0 <= a <= b <= x.shape[d] and s >= 1):
            raise ArgumentError(f"{where(op)}: slice {a}:{b}:{s} of dimension {d} (size "
                                f"{x.shape[d]}) is not canonical (0 <= start <= stop <= size, "
                                "step >= 1)")
        out.append(slice_count(a, b, s))
    return tuple(out)


def slice_count(a, b, s):
    """len(range(a, b, s)) for a canonical slice whose bounds may be symbolic sizes."""
    if type(a) is Sym or type(b) is Sym:
        return b - a if s == 1 else -((a - b) // s)  # -((a-b)//s): ceil, exact or specialised
    return len(range(a, b, s))


def _slices(starts, stops, steps) -> tuple:
    return tuple(slice(a, b, s) for a, b, s in zip(starts, stops, steps))


def _slice_infer(x: TensorType, starts: tuple, stops: tuple, steps: tuple) -> TensorType:
    return TensorType(_slice_shape("slice", x, starts, stops, steps), x.dtype)


def _slice_kernel(x, starts, stops, steps):
    return x[_slices(starts, stops, steps)]


def _slice_view(shape: tuple, strides: tuple, /, *, starts: tuple, stops: tuple, steps: tuple):
    if not shape:
        return None  # numpy's x[()] of a 0-d array is a scalar: a copy
    # numpy points an empty dim at its start with step 1
    ranges = [(a, step) if slice_count(a, b, step) != 0 else (0, 1)
              for a, b, step in zip(starts, stops, steps)]
    return (sum(a * s for (a, _), s in zip(ranges, strides)),
            tuple(s * step for (_, step), s in zip(ranges, strides)))


def _slice_vjp(ctx, g):
    return (call("slice_scatter", _zeros(ctx.input_types[0], g.dtype), g, **ctx.attrs),)


register(OpDef("slice", MOVEMENT, ("x",), _slice_infer, _slice_kernel, _slice_vjp,
               attrs={"starts": tuple, "stops": tuple, "steps": tuple}, view=True,
               view_strides=_slice_view))


def _slice_scatter_infer(x: TensorType, src: TensorType, starts, stops, steps) -> TensorType:
    shape = _slice_shape("slice_scatter", x, starts, stops, steps)
    if src.shape != shape or src.dtype != x.dtype:
        raise ShapeError(f"{where('slice_scatter')}: src must be {TensorType(shape, x.dtype)} "
                         f"(the slice it replaces), got {src}")
    return x


def _slice_scatter_kernel(x, src, starts, stops, steps):
    out = x.copy()
    out[_slices(starts, stops, steps)] = src
    return out


def _slice_scatter_vjp(ctx, g):
    gx = gsrc = None
    if ctx.needs_input_grad[0]:
        gx = call("slice_scatter", g, _zeros(ctx.input_types[1], g.dtype), **ctx.attrs)
    if ctx.needs_input_grad[1]:
        gsrc = call("slice", g, **ctx.attrs)
    return (gx, gsrc)


register(OpDef("slice_scatter", MOVEMENT, ("x", "src"), _slice_scatter_infer,
               _slice_scatter_kernel, _slice_scatter_vjp,
               attrs={"starts": tuple, "stops": tuple, "steps": tuple}))


# ---- concat ----------------------------------------------------------------------------------
def _concat_infer(*xs: TensorType, axis: int) -> TensorType:
    if not xs:
        raise ArgumentError(f"{where('concat')}: expected a non-empty list of Tensors")
    first = xs[0]
    for k, t in enumerate(xs[1:], 1):
        if t.ndim != first.ndim:
            raise ShapeError(f"{where('concat')}: Tensors must have same number of dimensions: "
                             f"got {first.ndim} and {t.ndim}")
        for d in range(first.ndim):
            if d != axis and t.shape[d] != first.shape[d]:
                raise ShapeError(
                    f"{where('concat')}: Sizes of tensors must match except in dimension "
                    f"{axis}. Expected size {first.shape[d]} but got size {t.shape[d]} for "
                    f"tensor number {k} in the list."
                )
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in xs)
    return TensorType(tuple(shape), result_dtype(*xs))


def _concat_kernel(*xs, axis):
    dtype = dtype_of_numpy(xs[0].dtype)
    for x in xs[1:]:
        dtype = promote(dtype, dtype_of_numpy(x.dtype))  # graphc's rule: int64 + f32 is f32
    return np.concatenate([x.astype(dtype.np, copy=False) for x in xs], axis=axis)


def _concat_vjp(ctx, g):
    axis = ctx.attrs["axis"]
    grads, offset = [], 0
    for ty, needed in zip(ctx.input_types, ctx.needs_input_grad):
        size = ty.shape[axis]
        grads.append(_narrow(g, axis, offset, size) if needed else None)
        offset += size
    return tuple(grads)


register(OpDef("concat", MOVEMENT, ("*tensors",), _concat_infer, _concat_kernel, _concat_vjp,
               attrs={"axis": int}))


# ---- pad -------------------------------------------------------------------------------------
def _pad_infer(x: TensorType, pads: tuple, value: float) -> TensorType:
    """pads: (before, after) per axis, axis 0 first, flattened; negative entries crop."""
    if len(pads) != 2 * x.ndim:
        raise ArgumentError(f"{where('pad')}: expected {2 * x.ndim} pads for {x}, got {pads}")
    shape = []
    for d in range(x.ndim):
        size = x.shape[d] + pads[2 * d] + pads[2 * d + 1]
        if size < 0:
            raise ShapeError(
                f"{where('pad')}: The input size {x.shape[d]}, plus negative padding "
                f"{pads[2 * d]} and {pads[2 * d + 1]} resulted in a negative output size, "
                f"which is invalid. Check dimension {d} of your input."
            )
        shape.append(size)
    return TensorType(tuple(shape), x.dtype)


def _pad_kernel(x, pads, value):
    before, after = pads[0::2], pads[1::2]
    crop = tuple(slice(max(-b, 0), n - max(-a, 0)) for n, b, a in zip(x.shape, before, after))
    widths = tuple((max(b, 0), max(a, 0)) for b, a in zip(before, after))
    cropped = x[crop]
    if cropped.size == 0 and any(n == 0 for n in cropped.shape):
        out_shape = tuple(c + w0 + w1 for c, (w0, w1) in zip(cropped.shape, widths))
        return np.full(out_shape, value, dtype=x.dtype)
    return np.pad(cropped, widths, constant_values=value).astype(x.dtype, copy=False)


def _pad_vjp(ctx, g):
    return (call("pad", g, pads=tuple(-p for p in ctx.attrs["pads"]), value=0.0),)


register(OpDef("pad", MOVEMENT, ("x",), _pad_infer, _pad_kernel, _pad_vjp,
               attrs={"pads": tuple, "value": float}))


# ---- flip and copy ---------------------------------------------------------------------------
def _flip_infer(x: TensorType, axes: tuple) -> TensorType:
    return x


def _flip_kernel(x, axes):
    return np.flip(x, axes).copy()  # PyTorch's flip copies (no negative strides)


def _flip_vjp(ctx, g):
    return (call("flip", g, axes=ctx.attrs["axes"]),)


register(OpDef("flip", MOVEMENT, ("x",), _flip_infer, _flip_kernel, _flip_vjp,
               attrs={"axes": tuple}))


def _copy_infer(x: TensorType) -> TensorType:
    return x


def _copy_kernel(x):
    if x.ndim == 2 and x.size >= _TILED_FROM and abs(x.strides[1]) > x.itemsize \
            and abs(x.strides[0]) < abs(x.strides[1]):
        return _tiled_copy(x)
    return np.array(x, copy=True, order="C")


_TILE, _TILED_FROM = 64, 1 << 14


def _tiled_copy(x):
    """A C-order copy of a matrix stored the other way round (a transpose, as a Linear
    weight's gradient arrives), in 64x64 tiles: numpy's own copy walks the source column by
    column across the whole matrix (~1.7x slower at 784x256 and 256x256)."""
    out = np.empty(x.shape, x.dtype)
    rows, cols = x.shape
    for i in range(0, rows, _TILE):
        for j in range(0, cols, _TILE):
            out[i:i + _TILE, j:j + _TILE] = x[i:i + _TILE, j:j + _TILE]
    return out


def _copy_vjp(ctx, g):
    return (g,)


register(OpDef("copy", MOVEMENT, ("x",), _copy_infer, _copy_kernel, _copy_vjp))


# ---- public functions: shapes ----------------------------------------------------------------
def _ints(op: str, args) -> tuple[int, ...]:
    """Accept f(2, 3) and f((2, 3)) / f([2, 3]) / f(Size): a tuple of ints."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    try:
        return tuple(map(as_size, args))
    except TypeError:
        raise TypeError(f"{where(op)}: expected a sequence of ints, got {args!r}") from None


def _infer_shape(op: str, shape: tuple[int, ...], size: int) -> tuple[int, ...]:
    """Resolve one -1 in `shape` against `size` elements (PyTorch's errors)."""
    unknown = [i for i, s in enumerate(shape) if s == -1]
    if len(unknown) > 1:
        raise ShapeError(f"{where(op)}: only one dimension can be inferred")
    for i, s in enumerate(shape):
        if s < -1:
            raise ShapeError(f"{where(op)}: invalid shape dimension {s} at index {i} of shape "
                             f"{list(shape)}")
    known = numel(tuple(s for s in shape if s != -1))
    if unknown:
        if known == 0 or size % known:
            raise ShapeError(f"{where(op)}: shape '{list(shape)}' is invalid for input of "
                             f"size {size}")
        shape = tuple(size // known if s == -1 else s for s in shape)
    elif known != size:
        raise ShapeError(f"{where(op)}: shape '{list(shape)}' is invalid for input of size {size}")
    return shape


def reshape(x, *shape):
    """A tensor with x's elements in `shape` (one entry may be -1); a view when possible.

    >>> import graphc
    >>> graphc.arange(6).reshape(2, -1).shape
    graphc.Size([2, 3])
    """
    shape = _infer_shape("reshape", _ints("reshape", shape), x.numel())
    return call("reshape", x, shape=shape)


def view(x, *shape):
    """As reshape (graphc does not refuse non-viewable strides as PyTorch's view does)."""
    shape = _infer_shape("view", _ints("view", shape), x.numel())
    return call("reshape", x, shape=shape)


def view_as(x, other):
    """x reshaped to the shape of `other`."""
    return view(x, tuple(other.shape))


def reshape_as(x, other):
    """x reshaped to the shape of `other`."""
    return reshape(x, tuple(other.shape))


def permute(x, *dims):
    """x with its dimensions reordered by `dims`."""
    dims = _ints("permute", dims)
    if len(dims) != x.ndim:
        call("permute", x, dims=dims)  # raises PyTorch's count error
    dims = tuple(normalize_axis("permute", d, x.ndim) for d in dims)
    if len(set(dims)) != len(dims):
        raise ArgumentError(f"{where('permute')}: duplicate dims are not allowed.")
    return call("permute", x, dims=dims)


def transpose(x, dim0: int, dim1: int):
    """Swap two dimensions (a view)."""
    if x.ndim == 0:
        normalize_axis("transpose", dim0, 0)
        normalize_axis("transpose", dim1, 0)
        return call("reshape", x, shape=())
    d0, d1 = normalize_axis("transpose", dim0, x.ndim), normalize_axis("transpose", dim1, x.ndim)
    dims = list(range(x.ndim))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return call("permute", x, dims=tuple(dims))


swapaxes = swapdims = transpose


def t(x):
    """Transpose a tensor of at most 2 dimensions."""
    if x.ndim > 2:
        raise ShapeError(f"{where('t')}: t() expects a tensor with <= 2 dimensions, but self "
                         f"is {x.ndim}D")
    return transpose(x, 0, -1) if x.ndim == 2 else call("reshape", x, shape=tuple(x.shape))


def _T(x):  # noqa: N802 (PyTorch's name)
    return call("permute", x, dims=tuple(reversed(range(x.ndim))))


def _mT(x):  # noqa: N802
    if x.ndim < 2:
        raise ShapeError(f"{where('mT')}: tensor.mT is only supported on matrices or batches "
                         f"of matrices. Got {x.ndim}-D tensor.")
    return transpose(x, -2, -1)


def broadcast_to(x, shape):
    """x broadcast to `shape` (a view: nothing is copied)."""
    shape = _ints("broadcast_to", (shape,))
    return expand(x, shape, _op="broadcast_to")


def expand(x, *sizes, _op: str = "expand"):
    """A broadcast view of x with `sizes` (-1 keeps a dimension); no memory is copied."""
    sizes = _ints(_op, sizes)
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise ShapeError(f"{where(_op)}: expand({x.type_name()}{{{list(x.shape)}}}, size="
                         f"{list(sizes)}): the number of sizes provided ({len(sizes)}) must be "
                         f"greater or equal to the number of dimensions in the tensor ({x.ndim})")
    shape = []
    for i, s in enumerate(sizes):
        if s == -1:
            if i < lead:
                raise ShapeError(f"{where(_op)}: The expanded size of the tensor (-1) isn't "
                                 f"allowed in a leading, non-existing dimension {i}")
            s = x.shape[i - lead]
        shape.append(s)
    problem = _expand_error(tuple(x.shape), tuple(shape))
    if problem:  # raised here so the message names the user's call (expand, setitem...)
        raise ShapeError(f"{where(_op)}: {problem}")
    return call("broadcast_to", x, shape=tuple(shape))


def expand_as(x, other):
    """x broadcast to the shape of `other`."""
    return expand(x, tuple(other.shape))


def squeeze(x, dim=None):
    """Remove size-1 dimensions (all, or those among `dim`; others are left alone)."""
    if dim is None:
        dims = range(x.ndim)
    else:
        dims = {normalize_axis("squeeze", d, x.ndim)
                for d in ((dim,) if isinstance(dim, int) else dim)}
    shape = tuple(s for d, s in enumerate(x.shape) if not (d in dims and s == 1))
    return call("reshape", x, shape=shape)


def unsqueeze(x, dim: int):
    """x with a dimension of size 1 inserted at `dim`."""
    d = normalize_axis("unsqueeze", dim, x.ndim + 1)
    shape = tuple(x.shape)
    return call("reshape", x, shape=shape[:d] + (1,) + shape[d:])


def flatten(x, start_dim: int = 0, end_dim: int = -1):
    """x with dimensions start_dim..end_dim merged into one."""
    if x.ndim == 0:
        normalize_axis("flatten", start_dim, 0)
        normalize_axis("flatten", end_dim, 0)
        return call("reshape", x, shape=(1,))
    a = normalize_axis("flatten", start_dim, x.ndim)
    b = normalize_axis("flatten", end_dim, x.ndim)
    if a > b:
        raise ArgumentError(f"{where('flatten')}: flatten() has invalid args: start_dim cannot "
                            "come after end_dim")
    shape = tuple(x.shape)
    return call("reshape", x, shape=shape[:a] + (numel(shape[a:b + 1]),) + shape[b + 1:])


def unflatten(x, dim: int, sizes):
    """x with dimension `dim` split into `sizes`."""
    d = normalize_axis("unflatten", dim, x.ndim)
    sizes = _ints("unflatten", (sizes,))
    n = x.shape[d]
    known = numel(tuple(s for s in sizes if s != -1))
    if sizes.count(-1) > 1:
        raise ShapeError(f"{where('unflatten')}: only one dimension can be inferred")
    if (-1 in sizes and (known == 0 or n % known)) or (-1 not in sizes and known != n):
        raise ShapeError(f"{where('unflatten')}: Provided sizes {list(sizes)} don't multiply up "
                         f"to the size of dim {dim} ({n}) in the input tensor")
    sizes = tuple(n // known if s == -1 else s for s in sizes)
    shape = tuple(x.shape)
    return call("reshape", x, shape=shape[:d] + sizes + shape[d + 1:])


def flip(x, *dims):
    """Reverse the order of elements along `dims` (a copy, as in PyTorch)."""
    dims = _ints("flip", dims)
    axes = tuple(normalize_axis("flip", d, x.ndim) for d in dims)
    if len(set(axes)) != len(axes):
        raise ArgumentError(f"{where('flip')}: dim {dims[0]} appears multiple times in the list "
                            "of dims")
    return call("flip", x, axes=tuple(sorted(axes)))


def clone(x, *, memory_format=None):
    """A copy of x with its own memory; gradients flow through unchanged."""
    return call("copy", x)


def contiguous(x, memory_format=None):
    """x itself when its memory is row-major already, else a row-major copy."""
    from graphc.dispatch import current_tracer

    if current_tracer() is not None or x._data.flags.c_contiguous:
        return x
    return call("copy", x)


def repeat(x, *sizes):
    """Tile x: sizes[i] copies along dimension i (extra leading sizes add dimensions)."""
    sizes = _ints("repeat", sizes)
    if len(sizes) < x.ndim:
        raise ShapeError(f"{where('repeat')}: Number of dimensions of repeat dims can not be "
                         "smaller than number of dimensions of tensor")
    shape = (1,) * (len(sizes) - x.ndim) + tuple(x.shape)
    spread = tuple(v for s in shape for v in (1, s))  # (1, s0, 1, s1, ...)
    target = tuple(v for r, s in zip(sizes, shape) for v in (r, s))
    y = call("broadcast_to", call("reshape", x, shape=spread), shape=target)
    y = call("reshape", y, shape=tuple(r * s for r, s in zip(sizes, shape)))
    return call("copy", y)  # the reshape may still alias x (all sizes 1): repeat always copies


# ---- public functions: slicing, joining, splitting -------------------------------------------
def _narrow(x, axis: int, start: int, length: int):
    starts = [0] * x.ndim
    stops = list(x.shape)
    starts[axis], stops[axis] = start, start + length
    return call("slice", x, starts=tuple(starts), stops=tuple(stops), steps=(1,) * x.ndim)


def narrow(x, dim: int, start: int, length: int):
    """x's elements start..start+length-1 along `dim` (a view)."""
    d = normalize_axis("narrow", dim, x.ndim)
    n = x.shape[d]
    if length < 0:
        raise ArgumentError(f"{where('narrow')}: narrow(): length must be non-negative.")
    if not -n <= start <= n:
        raise IndexOutOfRangeError(f"{where('narrow')}: start out of range (expected to be in "
                                   f"range of [{-n}, {n}], but got {start})")
    start = start + n if start < 0 else start
    if start + length > n:
        raise ArgumentError(f"{where('narrow')}: start ({start}) + length ({length}) exceeds "
                            f"dimension size ({n}).")
    return _narrow(x, d, start, length)


def select(x, dim: int, index: int):
    """The slice of x at `index` along `dim`, that dimension removed."""
    d = normalize_axis("select", dim, x.ndim)
    n = x.shape[d]
    if not -n <= index < n:
        raise IndexOutOfRangeError(f"{where('select')}: select(): index {index} out of range "
                                   f"for tensor of size {list(x.shape)} at dimension {dim}")
    y = _narrow(x, d, index % n, 1)
    shape = tuple(x.shape)
    return call("reshape", y, shape=shape[:d] + shape[d + 1:])


def _cast_all(op: str, tensors):
    from graphc.ops.elementwise import cast

    tensors = list(tensors)
    if not tensors:
        return tensors
    dtype = result_dtype(*(t.type for t in tensors))
    return [cast(t, dtype) for t in tensors]


def cat(tensors, dim: int = 0):
    """Join tensors along an existing dimension.

    >>> import graphc
    >>> graphc.cat([graphc.zeros(2, 3), graphc.ones(1, 3)]).shape
    graphc.Size([3, 3])
    """
    tensors = list(tensors)
    if not tensors:
        raise ArgumentError(f"{where('cat')}: torch.cat(): expected a non-empty list of Tensors")
    # PyTorch still accepts 1-d empty tensors next to tensors of any shape: reshape them to
    # an empty slab of the others' shape so they stay in the graph (and get a gradient).
    shaped = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or tensors[:1]
    axis = normalize_axis("cat", dim, shaped[0].ndim)
    empty = list(shaped[0].shape)
    empty[axis] = 0
    tensors = [call("reshape", t, shape=tuple(empty))
               if t.ndim == 1 and t.shape[0] == 0 and len(empty) != 1 else t for t in tensors]
    return call("concat", *_cast_all("cat", tensors), axis=axis)


concat = cat
concatenate = cat


def stack(tensors, dim: int = 0):
    """Join equal-shaped tensors along a new dimension `dim`."""
    tensors = list(tensors)
    if not tensors:
        raise ArgumentError(f"{where('stack')}: stack expects a non-empty TensorList")
    for k, t in enumerate(tensors[1:], 1):
        if tuple(t.shape) != tuple(tensors[0].shape):
            raise ShapeError(f"{where('stack')}: stack expects each tensor to be equal size, "
                             f"but got {list(tensors[0].shape)} at entry 0 and "
                             f"{list(t.shape)} at entry {k}")
    d = normalize_axis("stack", dim, tensors[0].ndim + 1)
    return call("concat", *(unsqueeze(t, d) for t in _cast_all("stack", tensors)), axis=d)


def split(x, split_size_or_sections, dim: int = 0):
    """Views of x along `dim`: pieces of one size (the last may be smaller) or given sizes."""
    d = normalize_axis("split", dim, x.ndim)
    n = x.shape[d]
    if isinstance(split_size_or_sections, int):
        size = split_size_or_sections
        if size < 0:
            raise ArgumentError(f"{where('split')}: split expects split_size be non-negative, "
                                f"but got split_size={size}")
        if size == 0 and n != 0:
            raise ArgumentError(f"{where('split')}: split_size can only be 0 if dimension size "
                                f"is 0, but got dimension size of {n}")
        sizes = [min(size, n - s) for s in range(0, n, size)] if size else [0]
    else:
        sizes = [operator.index(s) for s in split_size_or_sections]
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise ArgumentError(f"{where('split')}: split_with_sizes expects split_sizes to sum "
                                f"exactly to {n} (input tensor's size at dimension {d}), but "
                                f"got split_sizes={sizes}")
    out, offset = [], 0
    for s in sizes:
        out.append(_narrow(x, d, offset, s))
        offset += s
    return tuple(out)


def chunk(x, chunks: int, dim: int = 0):
    """x split into `chunks` pieces along `dim` (the last may be smaller)."""
    if chunks <= 0:
        raise ArgumentError(f"{where('chunk')}: chunk expects `chunks` to be greater than 0, "
                            f"got: {chunks}")
    n = x.shape[normalize_axis("chunk", dim, x.ndim)]
    if n == 0:
        return split(x, [0] * chunks, dim)  # PyTorch gives `chunks` empty pieces here
    return split(x, math.ceil(n / chunks), dim)


def unbind(x, dim: int = 0):
    """The slices of x along `dim`, each without that dimension."""
    d = normalize_axis("unbind", dim, x.ndim)
    return tuple(select(x, d, i) for i in range(x.shape[d]))


def pad(x, pad, mode: str = "constant", value=None):  # noqa: A002 (PyTorch's F.pad signature)
    """Pad (or, with negative entries, crop) x; `pad` starts from the last dimension.

    >>> import graphc
    >>> graphc.ops.movement.pad(graphc.ones(2, 3), (1, 1)).shape
    graphc.Size([2, 5])
    """
    pad = _ints("pad", (pad,))
    if mode != "constant":
        raise ArgumentError(f"{where('pad')}: mode {mode!r} is not supported by graphc yet; "
                            "only 'constant'")
    if len(pad) % 2:
        raise ArgumentError(f"{where('pad')}: Padding length must be divisible by 2")
    if len(pad) > 2 * x.ndim:
        raise ArgumentError(f"{where('pad')}: Padding length should be less than or equal to "
                            f"two times the input dimension but got padding length {len(pad)} "
                            f"and input of dimension {x.ndim}")
    pads = [0] * (2 * x.ndim)
    for k in range(len(pad) // 2):
        axis = x.ndim - 1 - k
        pads[2 * axis], pads[2 * axis + 1] = pad[2 * k], pad[2 * k + 1]
    return call("pad", x, pads=tuple(pads), value=0.0 if value is None else float(value))


TENSOR_METHODS = {
    "reshape": reshape, "view": view, "view_as": view_as, "reshape_as": reshape_as,
    "permute": permute, "transpose": transpose, "swapaxes": transpose, "swapdims": transpose,
    "t": t, "T": property(_T), "mT": property(_mT), "expand": expand, "expand_as": expand_as,
    "broadcast_to": broadcast_to, "squeeze": squeeze, "unsqueeze": unsqueeze,
    "flatten": flatten, "unflatten": unflatten, "flip": flip, "clone": clone,
    "contiguous": contiguous, "repeat": repeat, "narrow": narrow, "select": select,
    "split": split, "chunk": chunk, "unbind": unbind,
}

PUBLIC = (
    "reshape", "view_as", "reshape_as", "permute", "transpose", "swapaxes", "swapdims", "t",
    "expand_as", "broadcast_to", "squeeze", "unsqueeze", "flatten", "unflatten", "flip",
    "clone", "repeat", "narrow", "select", "cat", "concat", "concatenate", "stack", "split",
    "chunk", "unbind",
)
