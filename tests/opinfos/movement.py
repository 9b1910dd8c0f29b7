"""OpInfo entries for the 'movement' op group: views, slicing, indexing, joins, pad, flip.

Entries call the public functions (and tensor methods) so the canonicalisation they do
(negative dims, -1 sizes, PyTorch's pad order) is tested too. Functions that take a list of
tensors are wrapped to take them positionally, so gradcheck perturbs each one. Integer and
boolean index arrays in samples become int64/bool tensors (graphc and torch alike).
"""

from __future__ import annotations

import numpy as np

import graphc
from graphc.errors import ArgumentError, DTypeError, ShapeError
from graphc.ops import movement
from tests.opinfo import ErrorInput, OpInfo, Sample, arr


def _torch(name):
    def fn(*args, **kwargs):
        import torch

        return getattr(torch, name)(*args, **kwargs)

    fn.__name__ = f"torch_{name}"
    return fn


def _method(name):
    """x.name(*args, **kwargs), for graphc and torch tensors alike."""

    def fn(x, *args, **kwargs):
        return getattr(x, name)(*args, **kwargs)

    fn.__name__ = f"method_{name}"
    return fn


def _i(*values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# ---- reshape, view, permute, transpose --------------------------------------------------------
def _reshape_samples(rng):
    return [
        Sample((arr(rng, 3, 4), (2, 6)), desc="3x4 -> 2x6"),
        Sample((arr(rng, 2, 3, 4), (4, -1)), desc="-1 inferred"),
        Sample((arr(rng, 5), (5, 1)), desc="add a dim"),
        Sample((arr(rng), (1, 1)), desc="0-d"),
        Sample((arr(rng, 1, 1), ()), desc="to 0-d"),
    ]


def _np_reshape(x, shape):
    return np.reshape(x, shape)


def _reshape_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 2, 3), (2, 5))), ShapeError,
                   r"(reshape|view) at .*shape '\[2, 5\]' is invalid for input of size 6"),
        ErrorInput(Sample((arr(rng, 2, 3), (-1, -1))), ShapeError,
                   "only one dimension can be inferred"),
        ErrorInput(Sample((arr(rng, 2, 3), (4, -1))), ShapeError,
                   r"shape '\[4, -1\]' is invalid for input of size 6"),
        ErrorInput(Sample((arr(rng, 2, 3), (-2, 3))), ShapeError, "invalid shape dimension -2"),
    ]


def _view(x, shape):
    return x.view(shape)


def _view_as(x, y):
    return x.view_as(y)


def _view_as_samples(rng):
    return [Sample((arr(rng, 2, 6), arr(rng, 3, 4)), grad_args=(0,))]


def _matrix_samples(rng):
    return [Sample((arr(rng, 2, 3),), desc="2x3")]


def _np_view_as(x, y):
    return np.reshape(x, y.shape)


def _permute_samples(rng):
    return [
        Sample((arr(rng, 2, 3, 4), (2, 0, 1)), desc="3-d"),
        Sample((arr(rng, 2, 3), (-1, 0)), desc="negative dim"),
        Sample((arr(rng), ()), desc="0-d"),
    ]


def _np_permute(x, dims):
    return np.transpose(x, dims)


def _permute(x, dims):
    return x.permute(dims)


def _permute_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 2, 3), (1, 1))), ArgumentError, "duplicate dims"),
        ErrorInput(Sample((arr(rng, 2, 3), (1, 0, 2))), ShapeError,
                   r"input.dim\(\) = 2 is not equal to len\(dims\) = 3"),
        ErrorInput(Sample((arr(rng, 2, 3), (0, 2))), ArgumentError,
                   r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"),
    ]


def _transpose_samples(rng):
    return [
        Sample((arr(rng, 2, 3, 4), 0, 2), desc="3-d"),
        Sample((arr(rng, 2, 3), -1, -2), desc="negative dims"),
        Sample((arr(rng, 3), 0, 0), desc="1-d"),
    ]


def _np_transpose(x, d0, d1):
    return np.swapaxes(x, d0, d1)


def _t_samples(rng):
    return [Sample((arr(rng, 2, 3),), desc="2-d"), Sample((arr(rng, 4),), desc="1-d"),
            Sample((arr(rng),), desc="0-d")]


def _np_t(x):
    return x.T


def _t_errors(rng):
    return [ErrorInput(Sample((arr(rng, 2, 3, 4),)), ShapeError, r"<= 2 dimensions.*3D")]


def _T(x):  # noqa: N802
    return x.T


def _mT(x):  # noqa: N802
    return x.mT


def _np_mT(x):  # noqa: N802
    return np.swapaxes(x, -1, -2)


def _mT_samples(rng):  # noqa: N802
    return [Sample((arr(rng, 2, 3, 4),), desc="batch"), Sample((arr(rng, 2, 3),), desc="2-d")]


# ---- expand, broadcast_to, squeeze, unsqueeze, flatten, unflatten -----------------------------
def _expand_samples(rng):
    return [
        Sample((arr(rng, 3, 1), (3, 4)), desc="size-1 dim"),
        Sample((arr(rng, 3), (2, 3)), desc="new leading dim"),
        Sample((arr(rng, 2, 1, 3), (-1, 4, -1)), desc="-1 keeps"),
        Sample((arr(rng), (2, 2)), desc="0-d"),
        Sample((arr(rng, 2, 3), (2, 3)), desc="no-op"),
    ]


def _expand(x, sizes):
    return x.expand(*sizes)


def _np_expand(x, sizes):
    lead = len(sizes) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(sizes))
    return np.broadcast_to(x, shape)


def _expand_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 2, 3), (2, 4))), ShapeError,
                   r"The expanded size of the tensor \(4\) must match the existing size \(3\) "
                   r"at non-singleton dimension 1.  Target sizes: \[2, 4\].  Tensor sizes: "
                   r"\[2, 3\]"),
        ErrorInput(Sample((arr(rng, 2, 3), (3,))), ShapeError,
                   r"the number of sizes provided \(1\) must be greater or equal"),
        ErrorInput(Sample((arr(rng, 3), (-1, 3))), ShapeError,
                   "leading, non-existing dimension 0"),
    ]


def _broadcast_to_samples(rng):
    return [Sample((arr(rng, 3, 1), (2, 3, 4)), desc="3x1 -> 2x3x4"),
            Sample((arr(rng, 4), (3, 4)), desc="vector")]


def _squeeze_samples(rng):
    return [
        Sample((arr(rng, 1, 3, 1, 2),), desc="all"),
        Sample((arr(rng, 1, 3, 1, 2),), {"dim": 2}, desc="one dim"),
        Sample((arr(rng, 1, 3, 1, 2),), {"dim": (0, -2)}, desc="tuple of dims"),
        Sample((arr(rng, 2, 3),), {"dim": 1}, desc="size is not 1: unchanged"),
        Sample((arr(rng, 1),), desc="to 0-d"),
    ]


def _np_squeeze(x, dim=None):
    if dim is None:
        return np.squeeze(x)
    dims = (dim,) if isinstance(dim, int) else dim
    dims = tuple(d % x.ndim for d in dims if x.shape[d] == 1)
    return np.squeeze(x, axis=dims)


def _squeeze_errors(rng):
    return [ErrorInput(Sample((arr(rng, 2, 3),), {"dim": 5}), ArgumentError,
                       "Dimension out of range")]


def _unsqueeze_samples(rng):
    return [Sample((arr(rng, 2, 3), 0), desc="front"), Sample((arr(rng, 2, 3), -1), desc="back"),
            Sample((arr(rng, 2, 3), 1), desc="middle"), Sample((arr(rng), 0), desc="0-d")]


def _np_unsqueeze(x, dim):
    return np.expand_dims(x, dim)


def _unsqueeze_errors(rng):
    return [ErrorInput(Sample((arr(rng, 2, 3), 3)), ArgumentError,
                       r"expected to be in range of \[-3, 2\], but got 3")]


def _flatten_samples(rng):
    return [
        Sample((arr(rng, 2, 3, 4),), desc="all"),
        Sample((arr(rng, 2, 3, 4),), {"start_dim": 1}, desc="from 1"),
        Sample((arr(rng, 2, 3, 4, 2),), {"start_dim": 1, "end_dim": -2}, desc="middle"),
        Sample((arr(rng),), desc="0-d"),
    ]


def _np_flatten(x, start_dim=0, end_dim=-1):
    if x.ndim == 0:
        return x.reshape(1)
    a, b = start_dim % x.ndim, end_dim % x.ndim
    return x.reshape(x.shape[:a] + (-1,) + x.shape[b + 1:])


def _flatten_errors(rng):
    return [ErrorInput(Sample((arr(rng, 2, 3),), {"start_dim": 1, "end_dim": 0}), ArgumentError,
                       "start_dim cannot come after end_dim")]


def _unflatten_samples(rng):
    return [Sample((arr(rng, 2, 6), 1, (2, 3)), desc="last"),
            Sample((arr(rng, 6, 2), 0, (3, -1)), desc="-1 inferred")]


def _np_unflatten(x, dim, sizes):
    return x.reshape(x.shape[:dim] + tuple(sizes) + x.shape[dim + 1:])


def _unflatten_errors(rng):
    return [ErrorInput(Sample((arr(rng, 2, 3), 1, (2, 2))), ShapeError,
                       r"Provided sizes \[2, 2\] don't multiply up to the size of dim 1 \(3\)")]


# ---- flip, clone, contiguous, repeat ----------------------------------------------------------
def _flip_samples(rng):
    return [Sample((arr(rng, 2, 3, 4), (0, 2)), desc="two dims"),
            Sample((arr(rng, 5), (-1,)), desc="vector")]


def _np_flip(x, dims):
    return np.flip(x, dims)


def _flip_errors(rng):
    return [ErrorInput(Sample((arr(rng, 2, 3), (0, 0))), ArgumentError,
                       "appears multiple times")]


def _clone_samples(rng):
    return [Sample((arr(rng, 2, 3),), desc="2-d"), Sample((arr(rng),), desc="0-d")]


def _np_copy(x):
    return np.array(x, copy=True)


def _contiguous(x):
    return x.t().contiguous()


def _np_contiguous(x):
    return np.ascontiguousarray(x.T)


def _repeat_samples(rng):
    return [Sample((arr(rng, 2, 3), (2, 3)), desc="2-d"),
            Sample((arr(rng, 3), (2, 1, 2)), desc="new dims"),
            Sample((arr(rng, 2, 1), (1, 1)), desc="ones")]


def _repeat(x, sizes):
    return x.repeat(*sizes)


def _np_repeat(x, sizes):
    return np.tile(x, sizes)


def _repeat_errors(rng):
    return [ErrorInput(Sample((arr(rng, 2, 3), (2,))), ShapeError,
                       "repeat dims can not be smaller")]


# ---- narrow, select, split, chunk, unbind ----------------------------------------------------
def _narrow_samples(rng):
    return [Sample((arr(rng, 4, 5), 1, 1, 3), desc="dim 1"),
            Sample((arr(rng, 4, 5), 0, -2, 2), desc="negative start")]


def _np_narrow(x, dim, start, length):
    start = start % x.shape[dim]
    return np.take(x, np.arange(start, start + length), axis=dim)


def _narrow_errors(rng):
    return [ErrorInput(Sample((arr(rng, 2, 3), 1, 2, 2)), ArgumentError,
                       r"start \(2\) \+ length \(2\) exceeds dimension size \(3\)")]


def _select_samples(rng):
    return [Sample((arr(rng, 3, 4), 1, 2), desc="middle"),
            Sample((arr(rng, 3, 4), 0, -1), desc="negative")]


def _np_select(x, dim, index):
    return np.take(x, index, axis=dim)


def _select_errors(rng):
    return [ErrorInput(Sample((arr(rng, 3, 4), 1, 4)), IndexError, "out of range")]


def _split_samples(rng):
    return [Sample((arr(rng, 5, 3), 2), desc="size 2"),
            Sample((arr(rng, 4, 6), [1, 2, 3], 1), desc="sections")]


def _np_split(x, sizes, dim=0):
    n = x.shape[dim]
    if isinstance(sizes, int):
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)]
    return np.split(x, np.cumsum(sizes)[:-1], axis=dim)


def _split_errors(rng):
    return [ErrorInput(Sample((arr(rng, 3, 2), [1, 1])), ArgumentError,
                       r"split_with_sizes expects split_sizes to sum exactly to 3")]


def _chunk_samples(rng):
    return [Sample((arr(rng, 5, 3), 3), desc="uneven"),
            Sample((arr(rng, 2, 6), 4, 1), desc="fewer chunks than asked")]


def _np_chunk(x, chunks, dim=0):
    n = x.shape[dim]
    return _np_split(x, -(-n // chunks), dim)


def _unbind_samples(rng):
    return [Sample((arr(rng, 3, 2),), desc="dim 0"), Sample((arr(rng, 3, 2), 1), desc="dim 1")]


def _np_unbind(x, dim=0):
    return [np.take(x, i, axis=dim) for i in range(x.shape[dim])]


# ---- cat, stack ------------------------------------------------------------------------------
def _cat(a, b, dim=0):
    return graphc.cat([a, b], dim)


def _torch_cat(a, b, dim=0):
    import torch

    return torch.cat([a, b], dim)


def _np_cat(a, b, dim=0):
    return np.concatenate([a, b], axis=dim)


def _cat_samples(rng):
    return [
        Sample((arr(rng, 2, 3), arr(rng, 4, 3)), desc="dim 0"),
        Sample((arr(rng, 2, 3), arr(rng, 2, 1)), {"dim": -1}, desc="dim -1"),
        Sample((arr(rng, 3), arr(rng, 0)), desc="with an empty tensor"),
    ]


def _cat_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 2, 2), arr(rng, 3, 3)), {"dim": 1}), ShapeError,
                   r"Sizes of tensors must match except in dimension 1. Expected size 2 but got "
                   r"size 3 for tensor number 1 in the list."),
        ErrorInput(Sample((arr(rng, 2, 3), arr(rng, 3)), {"dim": 1}), ShapeError,
                   "Tensors must have same number of dimensions: got 2 and 1"),
        ErrorInput(Sample((arr(rng, 2, 3), arr(rng, 2, 3)), {"dim": 2}), ArgumentError,
                   r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"),
    ]


def _cat_mixed(a, b):
    return graphc.cat([a, b.long()], 0)


def _torch_cat_mixed(a, b):
    import torch

    return torch.cat([a, b.long()], 0)


def _np_cat_mixed(a, b):
    return np.concatenate([a, b.astype(np.int64)], 0)


def _cat_mixed_samples(rng):
    return [Sample((arr(rng, 2, 3), arr(rng, 1, 3) * 3), grad_args=(0,), desc="float + long")]


def _stack3(a, b, c, dim=0):
    return graphc.stack([a, b, c], dim)


def _torch_stack3(a, b, c, dim=0):
    import torch

    return torch.stack([a, b, c], dim)


def _np_stack3(a, b, c, dim=0):
    return np.stack([a, b, c], axis=dim)


def _stack_samples(rng):
    return [Sample((arr(rng, 2, 3), arr(rng, 2, 3), arr(rng, 2, 3)), desc="dim 0"),
            Sample((arr(rng, 2, 3), arr(rng, 2, 3), arr(rng, 2, 3)), {"dim": -1}, desc="last")]


def _stack_errors(rng):
    return [ErrorInput(Sample((arr(rng, 2, 3), arr(rng, 2, 4), arr(rng, 2, 3))), ShapeError,
                       r"stack expects each tensor to be equal size, but got \[2, 3\] at entry 0 "
                       r"and \[2, 4\] at entry 1")]


# ---- pad -------------------------------------------------------------------------------------
def _pad_samples(rng):
    return [
        Sample((arr(rng, 2, 3), (1, 2)), desc="last dim"),
        Sample((arr(rng, 2, 3, 4), (1, 0, 2, 1)), {"value": 1.5}, desc="two dims, value"),
        Sample((arr(rng, 3, 5), (-1, 2, 1, -2)), desc="negative pads crop"),
        Sample((arr(rng, 2, 3), (0, 0, 0, 0)), desc="zeros"),
    ]


def _np_pad(x, pad, value=None):
    pads = [(0, 0)] * x.ndim
    for k in range(len(pad) // 2):
        pads[x.ndim - 1 - k] = (pad[2 * k], pad[2 * k + 1])
    crop = tuple(slice(max(-b, 0), n - max(-a, 0)) for n, (b, a) in zip(x.shape, pads))
    widths = [(max(b, 0), max(a, 0)) for b, a in pads]
    return np.pad(x[crop], widths, constant_values=0.0 if value is None else value)


def _torch_pad(x, pad, value=None):
    import torch.nn.functional as F

    return F.pad(x, pad, value=value)


def _pad_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 2, 3), (1,))), ArgumentError,
                   "Padding length must be divisible by 2"),
        ErrorInput(Sample((arr(rng, 2, 3), (1, 1, 1, 1, 1, 1))), ArgumentError,
                   "Padding length should be less than or equal to two times the input "
                   "dimension but got padding length 6 and input of dimension 2"),
        ErrorInput(Sample((arr(rng, 2, 3), (-2, -2))), ShapeError, "negative output size"),
    ]


# ---- index_select, gather, scatter_add, index_add --------------------------------------------
def _index_select_samples(rng):
    return [
        Sample((arr(rng, 4, 3), 0, _i(3, 0, 3)), desc="rows, repeated"),
        Sample((arr(rng, 2, 5, 2), 1, _i(4, 1)), desc="middle dim"),
        Sample((arr(rng, 3, 2), -1, _i(1)), desc="negative dim"),
    ]


def _np_index_select(x, dim, index):
    return np.take(x, index, axis=dim)


def _index_select_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 2, 3), 0, _i(5))), IndexError, "index out of range in self"),
        ErrorInput(Sample((arr(rng, 2, 3), 0, np.array([0.0]))), DTypeError,
                   "Expected dtype int64"),
        ErrorInput(Sample((arr(rng, 2, 3), 0, _i(0, 1).reshape(1, 2))), IndexError,
                   "Index is supposed to be a vector"),
    ]


def _gather_samples(rng):
    return [
        Sample((arr(rng, 3, 4), 1, _i(0, 3, 3, 1, 2, 2).reshape(3, 2)), desc="dim 1"),
        Sample((arr(rng, 3, 4), 0, _i(2, 0, 1, 1).reshape(1, 4)), desc="dim 0, smaller"),
        Sample((arr(rng, 2, 3, 2), -1, _i(1, 0, 0, 1, 1, 1).reshape(1, 3, 2)), desc="3-d"),
    ]


def _np_gather(x, dim, index):
    sub = x[tuple(slice(0, s) if d != dim % x.ndim else slice(None)
                  for d, s in enumerate(index.shape))]
    return np.take_along_axis(sub, index, axis=dim)


def _gather_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 2, 3), 1, _i(5).reshape(1, 1))), IndexError,
                   "index 5 is out of bounds for dimension 1 with size 3"),
        ErrorInput(Sample((arr(rng, 2, 3), 1, _i(0).reshape(1))), ShapeError,
                   "Index tensor must have the same number of dimensions"),
        ErrorInput(Sample((arr(rng, 2, 3), 1, np.zeros((3, 1), np.int64))), ShapeError,
                   r"Size does not match at dimension 0"),
    ]


def _scatter_add_samples(rng):
    return [
        Sample((arr(rng, 3, 4), 1, _i(0, 3, 3, 1, 2, 2).reshape(3, 2), arr(rng, 3, 2)),
               desc="dim 1, repeated"),
        Sample((arr(rng, 2, 3, 2), -1, _i(1, 0, 0, 1, 1, 1).reshape(1, 3, 2),
                arr(rng, 1, 3, 2)), desc="3-d, index smaller than self"),
    ]


def _scatter_add_large_src_samples(rng):
    return [Sample((arr(rng, 3, 4), 0, _i(2, 0, 2, 1).reshape(1, 4), arr(rng, 2, 4)),
                   desc="src larger than index")]


def _np_scatter_add(x, dim, index, src):
    out = x.copy()
    src = src[tuple(slice(0, s) for s in index.shape)]
    grids = list(np.indices(index.shape, sparse=True))
    grids[dim] = index
    np.add.at(out, tuple(grids), src)
    return out


def _index_add_samples(rng):
    return [
        Sample((arr(rng, 4, 3), 0, _i(3, 0, 3), arr(rng, 3, 3)), desc="rows, repeated"),
        Sample((arr(rng, 2, 5), 1, _i(4, 1), arr(rng, 2, 2)), {"alpha": 2.0}, desc="alpha"),
    ]


def _np_index_add(x, dim, index, source, alpha=1):
    out = x.copy()
    np.add.at(out, (slice(None),) * dim + (index,), source * alpha)
    return out


def _index_add_errors(rng):
    return [ErrorInput(Sample((arr(rng, 2, 3), 0, _i(2), arr(rng, 1, 3))), IndexError,
                       "index 2 is out of bounds for dimension 0 with size 2")]


# ---- __getitem__ / __setitem__ ---------------------------------------------------------------
def _getitem(x, index):
    return x[index]


def _getitem_samples(rng):
    return [
        Sample((arr(rng, 4, 5), 1), desc="int"),
        Sample((arr(rng, 4, 5), (slice(1, 3), -1)), desc="slice, negative int"),
        Sample((arr(rng, 4, 5, 3), (slice(None, None, 2), None, Ellipsis, 0)),
               desc="step, None, ellipsis"),
        Sample((arr(rng, 6, 3), (slice(-5, None, 3),)), desc="negative start, step 3"),
        Sample((arr(rng, 3, 4), ()), desc="empty tuple"),
        Sample((arr(rng, 3), slice(5, 10)), desc="empty slice"),
        Sample((arr(rng, 5, 4), _i(4, 0, -1)), desc="int array"),
        Sample((arr(rng, 5, 4), (slice(None), _i(1, 1, 3))), desc="int array, dim 1, repeats"),
        Sample((arr(rng, 4, 5, 3), (_i(0, 3), slice(1, 4), _i(2, 0))), desc="split advanced"),
        Sample((arr(rng, 4, 5, 3), (slice(None), _i(0, 4), _i(2, 0))), desc="adjacent advanced"),
        Sample((arr(rng, 4, 5, 3), (_i(0, 3).reshape(2, 1), _i(1, 2, 4))), desc="broadcast"),
        Sample((arr(rng, 4, 5, 3), (0, slice(None), _i(2, 0))), desc="int then array (torch)"),
        Sample((arr(rng, 4, 3), np.array([True, False, True, True])), desc="bool mask"),
        Sample((arr(rng, 3, 4), (np.arange(12).reshape(3, 4) % 3 == 0,)), desc="2-d mask"),
        Sample((arr(rng, 3, 4), (slice(None), np.array([False, True, True, False]))),
               desc="mask on dim 1"),
    ]


def _np_getitem(x, index):
    if isinstance(index, tuple) and len(index) == 3 and isinstance(index[0], int) and \
            isinstance(index[2], np.ndarray):  # PyTorch: the int selects first
        return x[index[0]][(index[1], index[2])]
    return x[index]


def _getitem_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 2, 3), 5)), IndexError,
                   "index 5 is out of bounds for dimension 0 with size 2"),
        ErrorInput(Sample((arr(rng, 2, 3), (slice(None), 3))), IndexError,
                   "index 3 is out of bounds for dimension 1 with size 3"),
        ErrorInput(Sample((arr(rng, 2, 3), _i(0, 7))), IndexError,
                   "index 7 is out of bounds for dimension 0 with size 2"),
        ErrorInput(Sample((arr(rng, 2, 3), (0, 0, 0))), IndexError,
                   "too many indices for tensor of dimension 2"),
        ErrorInput(Sample((arr(rng, 2, 3), np.array([True, False, True]))), IndexError,
                   r"The shape of the mask \[3\] at index 0 does not match"),
        ErrorInput(Sample((arr(rng, 3, 4, 5), (_i(0, 1), _i(0, 1, 2)))), IndexError,
                   r"shape mismatch: indexing tensors could not be broadcast together with "
                   r"shapes \[2\], \[3\]"),
        ErrorInput(Sample((arr(rng, 2, 3), 1.0)), IndexError, "valid indices"),
    ]


def _getitem_negative_step_samples(rng):
    return [
        Sample((arr(rng, 5, 4), slice(None, None, -1)), desc="reverse"),
        Sample((arr(rng, 5, 4), (slice(None), slice(3, 0, -2))), desc="step -2"),
        Sample((arr(rng, 5, 4), (slice(-1, None, -3), _i(0, 2))), desc="with an int array"),
        Sample((arr(rng, 5), slice(1, 3, -1)), desc="empty"),
    ]


def _setitem(x, index, value):
    y = x.clone()
    y[index] = value
    return y


def _np_setitem(x, index, value):
    y = x.copy()
    y[index] = value
    return y


def _setitem_samples(rng):
    return [
        Sample((arr(rng, 4, 3), 1, arr(rng, 3)), desc="row"),
        Sample((arr(rng, 4, 3), (slice(1, 4, 2), slice(None)), arr(rng, 2, 1)),
               desc="strided slice, broadcast value"),
        Sample((arr(rng, 4, 3), (Ellipsis, 0), 2.5), desc="scalar into a column"),
        Sample((arr(rng, 5, 3), _i(4, 0), arr(rng, 2, 3)), desc="int array"),
        Sample((arr(rng, 4, 5, 3), (_i(0, 3), slice(None), _i(2, 0)), arr(rng, 2, 5)),
               desc="split advanced"),
        Sample((arr(rng, 4, 3), np.array([True, False, False, True]), arr(rng, 1, 3)),
               desc="bool mask"),
        Sample((arr(rng, 3, 4), (slice(None), _i(0, 2)), arr(rng, 1, 3, 2)),
               desc="leading size-1 value dim"),
    ]


def _setitem_errors(rng):
    return [ErrorInput(Sample((arr(rng, 3), slice(0, 2), arr(rng, 3))), ShapeError,
                       r"The expanded size of the tensor \(2\) must match the existing size "
                       r"\(3\)")]


def _setitem_negative_step_samples(rng):
    return [Sample((arr(rng, 5, 3), slice(None, None, -2), arr(rng, 3, 3)), desc="step -2"),
            Sample((arr(rng, 5, 3), (slice(3, 0, -1), _i(2, 0)), arr(rng, 3, 2)),
                   desc="with an int array")]


_NO_NEGATIVE_STEP = "PyTorch refuses negative slice steps (graphc accepts them, numpy's meaning)"

OP_INFOS: list[OpInfo] = [
    OpInfo("reshape", graphc.reshape, _np_reshape, _reshape_samples, ("reshape",),
           torch_fn=_torch("reshape"), error_inputs=_reshape_errors),
    OpInfo("view", _view, _np_reshape, _reshape_samples, ("reshape",), torch_fn=_view,
           error_inputs=_reshape_errors),
    OpInfo("view_as", _view_as, _np_view_as,
           _view_as_samples, ("reshape",), torch_fn=_view_as),
    OpInfo("permute", _permute, _np_permute, _permute_samples, ("permute",), torch_fn=_permute,
           error_inputs=_permute_errors),
    OpInfo("transpose", graphc.transpose, _np_transpose, _transpose_samples, ("permute",),
           torch_fn=_torch("transpose")),
    OpInfo("t", graphc.t, _np_t, _t_samples, ("permute", "reshape"), torch_fn=_torch("t"),
           error_inputs=_t_errors),
    OpInfo("T", _T, _np_t, _matrix_samples, ("permute",), torch_fn=_T),
    OpInfo("mT", _mT, _np_mT, _mT_samples, ("permute",), torch_fn=_mT),
    OpInfo("expand", _expand, _np_expand, _expand_samples, ("broadcast_to",), torch_fn=_expand,
           error_inputs=_expand_errors),
    OpInfo("broadcast_to", graphc.broadcast_to, np.broadcast_to, _broadcast_to_samples,
           ("broadcast_to",), torch_fn=_torch("broadcast_to")),
    OpInfo("squeeze", graphc.squeeze, _np_squeeze, _squeeze_samples, ("reshape",),
           torch_fn=_torch("squeeze"), error_inputs=_squeeze_errors),
    OpInfo("unsqueeze", graphc.unsqueeze, _np_unsqueeze, _unsqueeze_samples, ("reshape",),
           torch_fn=_torch("unsqueeze"), error_inputs=_unsqueeze_errors),
    OpInfo("flatten", graphc.flatten, _np_flatten, _flatten_samples, ("reshape",),
           torch_fn=_torch("flatten"), error_inputs=_flatten_errors),
    OpInfo("unflatten", graphc.unflatten, _np_unflatten, _unflatten_samples, ("reshape",),
           torch_fn=_torch("unflatten"), error_inputs=_unflatten_errors),
    OpInfo("flip", graphc.flip, _np_flip, _flip_samples, ("flip",), torch_fn=_torch("flip"),
           error_inputs=_flip_errors),
    OpInfo("clone", graphc.clone, _np_copy, _clone_samples, ("copy",), torch_fn=_torch("clone")),
    OpInfo("contiguous", _contiguous, _np_contiguous, _matrix_samples, ("copy", "permute"),
           torch_fn=_contiguous),
    OpInfo("repeat", _repeat, _np_repeat, _repeat_samples, ("broadcast_to", "reshape", "copy"),
           torch_fn=_repeat, error_inputs=_repeat_errors),
    OpInfo("narrow", graphc.narrow, _np_narrow, _narrow_samples, ("slice",),
           torch_fn=_torch("narrow"), error_inputs=_narrow_errors),
    OpInfo("select", graphc.select, _np_select, _select_samples, ("slice", "reshape"),
           torch_fn=_torch("select"), error_inputs=_select_errors),
    OpInfo("split", graphc.split, _np_split, _split_samples, ("slice",),
           torch_fn=_torch("split"), error_inputs=_split_errors),
    OpInfo("chunk", graphc.chunk, _np_chunk, _chunk_samples, ("slice",),
           torch_fn=_torch("chunk")),
    OpInfo("unbind", graphc.unbind, _np_unbind, _unbind_samples, ("slice", "reshape"),
           torch_fn=_torch("unbind")),
    OpInfo("cat", _cat, _np_cat, _cat_samples, ("concat",), torch_fn=_torch_cat,
           error_inputs=_cat_errors),
    OpInfo("cat_mixed_dtypes", _cat_mixed, _np_cat_mixed, _cat_mixed_samples,
           ("concat", "cast"), torch_fn=_torch_cat_mixed),
    OpInfo("stack", _stack3, _np_stack3, _stack_samples, ("concat", "reshape"),
           torch_fn=_torch_stack3, error_inputs=_stack_errors),
    OpInfo("pad", movement.pad, _np_pad, _pad_samples, ("pad",), torch_fn=_torch_pad,
           error_inputs=_pad_errors),
    OpInfo("index_select", graphc.index_select, _np_index_select, _index_select_samples,
           ("take", "index_add"), torch_fn=_torch("index_select"),
           error_inputs=_index_select_errors),
    OpInfo("gather", graphc.gather, _np_gather, _gather_samples, ("gather", "scatter_add"),
           torch_fn=_torch("gather"), error_inputs=_gather_errors),
    OpInfo("scatter_add", graphc.scatter_add, _np_scatter_add, _scatter_add_samples,
           ("scatter_add", "gather"), torch_fn=_torch("scatter_add")),
    OpInfo("scatter_add_large_src", graphc.scatter_add, _np_scatter_add,
           _scatter_add_large_src_samples, ("scatter_add", "slice"),
           torch_fn=_torch("scatter_add"),
           skips={"torch_grad": "PyTorch 2.13's ScatterAddBackward0 returns a gradient of the "
                                "index's shape for a larger src and fails its own shape check"}),
    OpInfo("index_add", graphc.index_add, _np_index_add, _index_add_samples,
           ("index_add", "take"), torch_fn=_torch("index_add"), error_inputs=_index_add_errors),
    OpInfo("getitem", _getitem, _np_getitem, _getitem_samples,
           ("slice", "reshape", "take", "permute", "index_add", "slice_scatter"),
           torch_fn=_getitem, error_inputs=_getitem_errors),
    OpInfo("getitem_negative_step", _getitem, _np_getitem, _getitem_negative_step_samples,
           ("slice", "flip", "take"), skips={"torch": _NO_NEGATIVE_STEP}),
    OpInfo("setitem", _setitem, _np_setitem, _setitem_samples,
           ("slice_scatter", "index_put", "copy", "broadcast_to"), torch_fn=_setitem,
           error_inputs=_setitem_errors),
    OpInfo("setitem_negative_step", _setitem, _np_setitem, _setitem_negative_step_samples,
           ("slice_scatter", "index_put", "flip"), skips={"torch": _NO_NEGATIVE_STEP}),
]
