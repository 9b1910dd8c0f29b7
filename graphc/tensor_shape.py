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
