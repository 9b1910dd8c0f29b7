"""`ShapeMethods`: Tensor's shape, indexing and creation methods, written out.

Each method is one line that forwards to its op module function (`Tensor.reshape` is
`graphc.ops.movement.reshape`), as in graphc.tensor_methods, the other mixin of
`graphc.Tensor`: movement and views, indexing and gather/scatter, and the `new_*` creators.

>>> import graphc
>>> graphc.arange(6).reshape(2, 3).t().shape
graphc.Size([3, 2])
"""

from __future__ import annotations

from graphc.errors import ShapeError, where
from graphc.ops import gather, indexing, movement, sources
from graphc.ops.registry import call
from graphc.utils import shape_composites as sc


class ShapeMethods:
    """Shape, indexing and creation methods of `graphc.Tensor` (see the module docstring)."""

    __slots__ = ()

    # ---- movement and views ------------------------------------------------------------------
    def reshape(self, *shape):
        """A tensor with x's elements in `shape` (one entry may be -1); a view when possible."""
        return movement.reshape(self, *shape)

    def view(self, *shape):
        """As reshape (graphc does not refuse non-viewable strides as PyTorch's view does)."""
        return movement.view(self, *shape)

    def view_as(self, other):
        """reshape to other's shape."""
        return movement.view_as(self, other)

    def reshape_as(self, other):
        """reshape to other's shape."""
        return movement.reshape_as(self, other)

    def permute(self, *dims):
        """The dimensions reordered as `dims` (a view)."""
        return movement.permute(self, *dims)

    def transpose(self, dim0, dim1):
        """Swap two dimensions (a view)."""
        return movement.transpose(self, dim0, dim1)

    def swapaxes(self, dim0, dim1):
        """Swap two dimensions (a view)."""
        return movement.transpose(self, dim0, dim1)

    def swapdims(self, dim0, dim1):
        """Swap two dimensions (a view)."""
        return movement.transpose(self, dim0, dim1)

    def t(self):
        """Transpose a tensor of at most 2 dimensions."""
        return movement.t(self)

    def expand(self, *sizes):
        """A broadcast view of x with `sizes` (-1 keeps a dimension); no memory is copied."""
        return movement.expand(self, *sizes)

    def expand_as(self, other):
        """expand to other's shape (a view)."""
        return movement.expand_as(self, other)

    def broadcast_to(self, shape):
        """A broadcast view of self with `shape`."""
        return movement.broadcast_to(self, shape)

    def squeeze(self, dim=None):
        """Remove size-1 dimensions (all, or those among `dim`; others are left alone)."""
        return movement.squeeze(self, dim)

    def unsqueeze(self, dim):
        """A size-1 dimension inserted at `dim` (a view)."""
        return movement.unsqueeze(self, dim)

    def flatten(self, start_dim=0, end_dim=-1):
        """Dimensions start_dim..end_dim merged into one."""
        return movement.flatten(self, start_dim, end_dim)

    def unflatten(self, dim, sizes):
        """Dimension `dim` split into `sizes`."""
        return movement.unflatten(self, dim, sizes)

    def flip(self, *dims):
        """Reverse the order of elements along `dims` (a copy, as in PyTorch)."""
        return movement.flip(self, *dims)

    def clone(self, *, memory_format=None):
        """A copy of x with its own memory; gradients flow through unchanged."""
        return movement.clone(self, memory_format=memory_format)

    def contiguous(self, memory_format=None):
        """x itself when its memory is row-major already, else a row-major copy."""
        return movement.contiguous(self, memory_format)

    def repeat(self, *sizes):
        """Tile x: sizes[i] copies along dimension i (extra leading sizes add dimensions)."""
        return movement.repeat(self, *sizes)

    def narrow(self, dim, start, length):
        """x's elements start..start+length-1 along `dim` (a view)."""
        return movement.narrow(self, dim, start, length)

    def select(self, dim, index):
        """The slice at `index` along `dim`, that dimension removed (a view)."""
        return movement.select(self, dim, index)

    def split(self, split_size_or_sections, dim=0):
        """Views of x along `dim`: pieces of one size (the last may be smaller) or given sizes."""
        return movement.split(self, split_size_or_sections, dim)

    def chunk(self, chunks, dim=0):
        """`chunks` views of nearly equal size along `dim`."""
        return movement.chunk(self, chunks, dim)

    def unbind(self, dim=0):
        """The slices along `dim`, that dimension removed."""
        return movement.unbind(self, dim)

    @property
    def T(self):  # noqa: N802 (PyTorch's name)
        """The dimensions in reverse order (a view)."""
        return call("permute", self, dims=tuple(reversed(range(self.ndim))))

    @property
    def mT(self):  # noqa: N802
        """The last two dimensions swapped (a view of a batch of matrices)."""
        if self.ndim < 2:
            raise ShapeError(f"{where('mT')}: tensor.mT is only supported on matrices or "
                             f"batches of matrices. Got {self.ndim}-D tensor.")
        return movement.transpose(self, -2, -1)

    # ---- indexing, gather and scatter --------------------------------------------------------
    def __getitem__(self, index):
        """x[index] with PyTorch's rules (ints, slices, None, ..., int and bool tensors/lists)."""
        return indexing.getitem(self, index)

    def __setitem__(self, index, value):
        """x[index] = value, in place: bumps x's version counter and records autograd history."""
        return indexing.setitem(self, index, value)

    def index_select(self, dim, index):
        """Rows (along `dim`) of x picked by a 1-d int64 `index`."""
        return gather.index_select(self, dim, index)

    def index_add(self, dim, index, source, *, alpha=1):
        """x with `source` rows added at `index` along `dim` (repeated indices accumulate)."""
        return gather.index_add(self, dim, index, source, alpha=alpha)

    def gather(self, dim, index):
        """out[i][j] = x[index[i][j]][j] for dim 0 (and so on): PyTorch's gather."""
        return gather.gather(self, dim, index)

    def scatter_add(self, dim, index, src):
        """x plus src's entries added at the positions `index` names along `dim`."""
        return gather.scatter_add(self, dim, index, src)

    # ---- moving, tiling, diagonals, index writes (graphc.utils.shape_composites) ----------------
    def movedim(self, source, destination):
        """Dims `source` moved to `destination`."""
        return sc.movedim(self, source, destination)

    def moveaxis(self, source, destination):
        """movedim (numpy's name)."""
        return sc.movedim(self, source, destination)

    def roll(self, shifts, dims=None):
        """Elements shifted circularly along dims."""
        return sc.roll(self, shifts, dims)

    def tile(self, *dims):
        """self repeated dims[i] times along dim i."""
        return sc.tile(self, dims[0] if len(dims) == 1 and not isinstance(dims[0], int) else dims)

    def repeat_interleave(self, repeats, dim=None, *, output_size=None):
        """Each element repeated along dim."""
        return sc.repeat_interleave(self, repeats, dim, output_size=output_size)

    def diagonal(self, offset=0, dim1=0, dim2=1):
        """The diagonal over dim1, dim2, as the last dim (a copy)."""
        return sc.diagonal(self, offset, dim1, dim2)

    def diag(self, diagonal=0):
        """1-D: a diagonal matrix; 2-D: the diagonal."""
        return sc.diag(self, diagonal)

    def diag_embed(self, offset=0, dim1=-2, dim2=-1):
        """Matrices with self's last dim on their diagonal."""
        return sc.diag_embed(self, offset, dim1, dim2)

    def trace(self):
        """The sum of a matrix's diagonal."""
        return sc.trace(self)

    def diff(self, n=1, dim=-1, prepend=None, append=None):
        """The n-th forward difference along dim."""
        return sc.diff(self, n, dim, prepend, append)

    def take(self, index):
        """self as 1-D at index."""
        return sc.take(self, index)

    def index_fill(self, dim, index, value):
        """Slices at index along dim set to value."""
        return sc.index_fill(self, dim, index, value)

    def index_fill_(self, dim, index, value):
        """In-place index_fill."""
        return sc.index_fill_(self, dim, index, value)

    def index_copy(self, dim, index, source):
        """source's slices written at index along dim."""
        return sc.index_copy(self, dim, index, source)

    def index_copy_(self, dim, index, source):
        """In-place index_copy."""
        return sc.index_copy_(self, dim, index, source)

    def scatter(self, dim, index, src=None, *, value=None, reduce=None):
        """src (or value) written at index along dim."""
        return sc.scatter(self, dim, index, src, value=value, reduce=reduce)

    def scatter_(self, dim, index, src=None, *, value=None, reduce=None):
        """In-place scatter."""
        return sc.scatter_(self, dim, index, src, value=value, reduce=reduce)

    def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
        """scatter with a 'sum' or 'mean' reduction."""
        return sc.scatter_reduce(self, dim, index, src, reduce, include_self=include_self)

    def scatter_reduce_(self, dim, index, src, reduce, *, include_self=True):
        """In-place scatter_reduce."""
        return sc.scatter_reduce_(self, dim, index, src, reduce, include_self=include_self)

    def new_empty(self, *size, dtype=None, requires_grad=False, device=None):
        """A tensor of `size` (graphc fills it with zeros)."""
        return self.new_zeros(*size, dtype=dtype, requires_grad=requires_grad, device=device)

    @property
    def H(self):  # noqa: N802 (PyTorch's name)
        """The conjugate transpose of a matrix (for real tensors, its transpose)."""
        if self.ndim != 2:
            raise ShapeError(f"tensor.H is only supported on matrices (2-D tensors). Got "
                             f"{self.ndim}-D tensor. For batches of matrices, consider using "
                             "tensor.mH")
        return movement.transpose(self, 0, 1)

    @property
    def mH(self):  # noqa: N802
        """The last two dims swapped (for real tensors, mT)."""
        return self.mT

    # ---- new tensors like this one -----------------------------------------------------------
    def new_zeros(self, *size, dtype=None, requires_grad=False, device=None):
        """Zeros of `size`, of this tensor's dtype unless `dtype` is given."""
        return sources.zeros(*size, dtype=dtype or self.dtype, requires_grad=requires_grad,
                             device=device)

    def new_ones(self, *size, dtype=None, requires_grad=False, device=None):
        """Ones of `size`, of this tensor's dtype unless `dtype` is given."""
        return sources.ones(*size, dtype=dtype or self.dtype, requires_grad=requires_grad,
                            device=device)

    def new_full(self, size, fill_value, *, dtype=None, requires_grad=False, device=None):
        """`fill_value` in `size`, of this tensor's dtype unless `dtype` is given."""
        return sources.full(size, fill_value, dtype=dtype or self.dtype,
                            requires_grad=requires_grad, device=device)

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
        """A new tensor (a copy, no history) of `data`, of this tensor's dtype by default."""
        from graphc.creation import tensor

        if isinstance(data, ShapeMethods):
            data = data.detach()
        return tensor(data, dtype=dtype or self.dtype, device=device,
                      requires_grad=requires_grad)
