"""`Tensor`: a numpy array plus autograd state.

A Tensor owns (or, for views and `from_numpy`, shares) a numpy array in one of graphc's four
dtypes, or, when abstract evaluation made it (graphc.dispatch.abstract_eval, which tracing and
`derive_backward` use), an `AbstractArray`: a shape and a dtype with no data, whose values
cannot be read. Its autograd state follows PyTorch: `requires_grad`, `grad`, `grad_fn` with
the output slot it fills, a version counter shared with its views and bumped by every in-place
change, and `is_leaf`. Every piece of math is a function of an op module that goes through the
dispatch point; the operators and math methods (graphc.tensor_methods) and the shape methods
(graphc.tensor_shape) are mixins of one-line methods that only forward to those functions, so
eager mode and trace mode see the same calls.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np

from graphc.autograd.graph import AccumulateGrad, RemovableHandle, add_hook
from graphc.backends.residency import fresh as _fresh_host_copy
from graphc.backends.residency import stale as _stale_host_copies
from graphc.errors import AutogradError, DTypeError, ShapeError, TraceError
from graphc.symbolic import Sym
from graphc.tensor_methods import TensorMethods
from graphc.tensor_shape import ShapeMethods
from graphc.types import DType, TensorType, dtype_of_numpy, float32

serials = itertools.count()  # every tensor's `_serial`, in the order they are made


def tensor_serial() -> int:
    """A serial number above every tensor made so far (tensors are numbered as they are made)."""
    return next(serials)


class AbstractArray:
    """Stands in for the numpy array of an abstract tensor: a shape and a dtype, no data.

    It answers what code asks of an array's metadata (`shape`, `dtype`, `ndim`, `size`,
    `nbytes`); anything that needs the values (numpy conversion, arithmetic) raises TraceError.
    """

    __slots__ = ("dtype", "shape")
    __array_priority__ = 2000  # `ndarray + AbstractArray` asks this class, which refuses

    def __init__(self, shape: tuple, dtype) -> None:
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def copy(self) -> AbstractArray:
        return AbstractArray(self.shape, self.dtype)

    def __array__(self, dtype=None, copy=None):
        raise TraceError(
            f"an abstract tensor (shape {list(self.shape)}, dtype {self.dtype}) has no values: "
            "it was made by abstract evaluation (tracing, derive_backward), which runs each op's "
            "shape rule only. Read values outside the traced function, or from the compiled "
            "call's results.")

    def __repr__(self) -> str:
        return f"AbstractArray(shape={self.shape}, dtype={self.dtype})"


class VersionCounter:
    """Counts in-place changes; a tensor and all its views share one counter.

    The count starts as the class's 0 (no __init__, no __slots__: making one costs a third of
    a slotted class with an __init__, and eager mode makes one per op result)."""

    value = 0

    def bump(self) -> None:
        self.value += 1


class Size(tuple):
    """A shape, as PyTorch's torch.Size: a tuple of ints with a readable repr."""

    def __repr__(self) -> str:
        return f"graphc.Size({list(self)})"

    def numel(self) -> int:
        n = 1
        for s in self:
            n *= s
        return n


_TYPE_NAMES = {"float32": "FloatTensor", "float64": "DoubleTensor", "int64": "LongTensor",
               "bool": "BoolTensor"}


class device:
    """The device a tensor lives on; eager graphc tensors are always on the CPU."""

    __slots__ = ("index", "type")

    def __init__(self, type: str = "cpu", index: int | None = None) -> None:
        self.type, self.index = str(type), index

    def __repr__(self) -> str:
        return f"device(type={self.type!r})"

    def __str__(self) -> str:
        return self.type

    def __eq__(self, other) -> bool:
        if isinstance(other, device):
            return self.type == other.type
        return isinstance(other, str) and other == self.type

    def __hash__(self) -> int:
        return hash(self.type)


CPU = device("cpu")


def check_device(function: str, value) -> None:
    """Refuse a device other than the CPU for an eager tensor, naming `function`."""
    if value is not None and str(value) != "cpu":
        from graphc.errors import ArgumentError, where

        raise ArgumentError(
            f"{where(function)}: graphc eager tensors live on the CPU; got device={str(value)!r}."
            " Keep tensors on 'cpu' and compile for a GPU instead: "
            "graphc.compile(fn, backend=\"cuda\")")

_NON_FLOAT_GRAD = "only Tensors of floating point and complex dtype can require gradients"

_NON_LEAF_GRAD_WARNING = (
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad "
    "attribute won't be populated during autograd.backward(). If you indeed want the .grad "
    "field to be populated for a non-leaf Tensor, use .retain_grad() on the non-leaf Tensor. "
    "If you access the non-leaf Tensor by mistake, make sure you access the leaf Tensor instead."
)


class Tensor(TensorMethods, ShapeMethods):
    """An n-dimensional array with autograd. Create one with `graphc.tensor(data)`.

    >>> import graphc
    >>> x = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    >>> (x * x).sum().backward()
    >>> x.grad
    tensor([2., 4., 6.])
    """

    __array_priority__ = 1000  # numpy defers `ndarray + Tensor` to Tensor.__radd__

    # Autograd state at its fresh value, as class defaults: an op's result sets only what
    # differs (graphc.dispatch's eager path makes one tensor per op, and each attribute
    # written costs time there).
    _requires_grad = False
    _grad = None
    grad_fn = None
    _output_nr = 0
    _base = None
    _view_of = None  # (parent, op name, attrs) for a view made by a view op
    _accumulator = None
    _retains_grad = False

    def __new__(cls, *args, **kwargs):
        """`graphc.Tensor(data)` or `graphc.Tensor(*sizes)`: float32, as `torch.Tensor(...)`.

        Prefer `graphc.tensor(data)` (dtype inferred) or `graphc.zeros(shape)`.
        """
        if kwargs:
            raise TypeError(f"Tensor(): unexpected keyword arguments {sorted(kwargs)}")
        if all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in args):
            array = np.zeros(tuple(int(a) for a in args) if args else (0,), dtype=np.float32)
        elif len(args) == 1:
            source = args[0]
            if isinstance(source, Tensor):
                source = source._data
            array = np.array(source, dtype=np.float32)
        else:
            raise TypeError(
                "Tensor(): expected a sequence of numbers or sizes, got "
                f"({', '.join(type(a).__name__ for a in args)})"
            )
        t = object.__new__(cls)
        t._init(array)
        return t

    def __init__(self, *args, **kwargs) -> None:
        pass  # __new__ (or a subclass's __new__) has built the tensor

    @property
    def _data(self) -> np.ndarray:
        """The tensor's array. A compiled step may keep the current value on a device and
        leave this array out of date (graphc.backends.residency); reading it fetches it."""
        if _stale_host_copies:
            _fresh_host_copy(self._array)
        return self._array

    @_data.setter
    def _data(self, array) -> None:
        self._array = array

    @classmethod
    def _wrap(cls, array: np.ndarray, requires_grad: bool = False) -> Tensor:
        """Make a tensor around `array` without copying (internal constructor)."""
        t = object.__new__(cls)
        t._init(array, requires_grad)
        return t

    @classmethod
    def _abstract(cls, ty: TensorType, requires_grad: bool = False) -> Tensor:
        """An abstract tensor of type `ty`: shape and dtype, no data (internal constructor)."""
        t = object.__new__(cls)
        t._init(AbstractArray(ty.shape, ty.dtype.np), requires_grad)
        return t

    def _init(self, array: np.ndarray | AbstractArray, requires_grad: bool = False) -> None:
        if not isinstance(array, (np.ndarray, AbstractArray)):
            array = np.asarray(array)
        dtype = dtype_of_numpy(array.dtype)
        if array.dtype != dtype.np:
            array = array.astype(dtype.np)
        self._data = array
        self._dtype = dtype
        self._serial = next(serials)
        self._version_counter = VersionCounter()
        if requires_grad:
            if not dtype.is_floating:
                raise DTypeError("O" + _NON_FLOAT_GRAD[1:])
            self._requires_grad = True

    @classmethod
    def _result(cls, array: np.ndarray, dtype: DType) -> Tensor:
        """A fresh tensor around `array`, whose dtype is already `dtype.np` (internal
        constructor of graphc.dispatch's eager path: no checks, no conversion)."""
        t = object.__new__(cls)
        t._array = array
        t._dtype = dtype
        t._serial = next(serials)
        t._version_counter = VersionCounter()
        return t

    # ---- metadata -------------------------------------------------------------------------
    @property
    def shape(self) -> Size:
        return Size(self._data.shape)

    def size(self, dim: int | None = None):
        if dim is None:
            return self.shape
        if self.ndim == 0:
            raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
        bound = self.ndim
        if not -bound <= dim < bound:
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{-bound}, {bound - 1}], "
                f"but got {dim})"
            )
        return self._data.shape[dim]

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def type(self) -> TensorType:
        """The static type (shape, dtype) the op registry's rules compute with."""
        return TensorType(self._data.shape, self._dtype)

    @property
    def ndim(self) -> int:
        return self._data.ndim

    def dim(self) -> int:
        return self._data.ndim

    def numel(self) -> int:
        n = self._data.size
        return n if type(n) is Sym else int(n)  # a symbolic trace's size stays symbolic

    def nelement(self) -> int:
        return int(self._data.size)

    def element_size(self) -> int:
        return self._dtype.itemsize

    def is_floating_point(self) -> bool:
        return self._dtype.is_floating

    @property
    def device(self) -> device:
        return CPU

    @property
    def is_cuda(self) -> bool:
        return False

    def get_device(self) -> int:
        return -1

    def is_contiguous(self, memory_format=None) -> bool:
        return True

    def type_name(self) -> str:
        return "graphc." + _TYPE_NAMES[self._dtype.name]

    @property
    def is_abstract(self) -> bool:
        """Whether this tensor has a shape and dtype but no data (made by abstract evaluation,
        see graphc.dispatch.abstract_eval); reading its values raises TraceError."""
        return type(self._data) is AbstractArray

    @property
    def _version(self) -> int:
        return self._version_counter.value

    # ---- autograd state -------------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self._change_requires_grad(value, _NON_FLOAT_GRAD)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        self._change_requires_grad(requires_grad,
                                   "only Tensors of floating point dtype can require gradients")
        return self

    def _change_requires_grad(self, value: bool, non_float_message: str) -> None:
        value = bool(value)
        if self.grad_fn is not None:
            if value:
                return  # a non-leaf already requires grad: nothing to change (as PyTorch)
            raise AutogradError(
                "you can only change requires_grad flags of leaf variables. If you want to use "
                "a computed variable in a subgraph that doesn't require differentiation use "
                "var_no_grad = var.detach()."
            )
        if value and not self._dtype.is_floating:
            raise DTypeError(f"{non_float_message} (got {self._dtype.name})")
        self._requires_grad = value

    @property
    def grad(self) -> Tensor | None:
        """The accumulated gradient (leaves, and non-leaves after retain_grad())."""
        if self.grad_fn is not None and not self._retains_grad and self._grad is None:
            warnings.warn(_NON_LEAF_GRAD_WARNING, UserWarning, stacklevel=2)
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(
                    f"assigned grad expected to be a Tensor or None but got grad of type "
                    f"{type(value).__name__}"
                )
            if tuple(value.shape) != tuple(self.shape):
                raise ShapeError(
                    f"attempting to assign a gradient of size '{list(value.shape)}' to a "
                    f"tensor of size '{list(self.shape)}'. Please ensure that the gradient and "
                    "the tensor are the same size"
                )
            if value.dtype is not self._dtype:
                raise DTypeError(
                    f"attempting to assign a gradient with dtype '{value.dtype.name}' to a "
                    f"tensor with dtype '{self._dtype.name}'. Please ensure that the gradient "
                    "and the tensor have the same dtype"
                )
        self._grad = value

    @grad.deleter
    def grad(self) -> None:
        self._grad = None

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    def _set_history(self, node, output_nr: int) -> None:
        self.grad_fn = node
        self._output_nr = output_nr
        self._requires_grad = node is not None
        if node is None:
            self._retains_grad = False

    def _grad_accumulator(self) -> AccumulateGrad:
        if self._accumulator is None:
            self._accumulator = AccumulateGrad(self)
        return self._accumulator

    def _detached_copy_with_history(self, abstract: bool, copy: bool = True) -> Tensor:
        """A snapshot of the current value that keeps this tensor's history (for in-place);
        an abstract one under abstract evaluation (`abstract`: no data is copied). With
        `copy=False` it shares this tensor's memory, under a version counter of its own (for
        an op whose backward never reads that input: graphc.autograd.inplace)."""
        if abstract:
            t = Tensor._abstract(self.type)
        else:
            array = self._data
            t = Tensor._result(array.copy() if copy else array, self._dtype)
        if self.grad_fn is not None:
            t.grad_fn, t._output_nr, t._requires_grad = self.grad_fn, self._output_nr, True
        elif self._requires_grad:  # a leaf: route gradients to this tensor's accumulator
            t._requires_grad = True
            t._accumulator = self._grad_accumulator()
        return t

    def detach(self) -> Tensor:
        """A tensor sharing this one's memory and version counter, with no history."""
        t = Tensor._wrap(self._data)
        t._version_counter = self._version_counter
        t._base = self._base
        return t

    def detach_(self) -> Tensor:
        self._set_history(None, 0)
        return self

    @property
    def data(self) -> Tensor:
        """This tensor's memory without history and with its own version counter.

        Changes through `.data` are invisible to autograd (PyTorch's semantics): prefer
        `detach()` or `with graphc.no_grad():`, which keep the in-place checks.
        """
        t = Tensor._wrap(self._data)
        t._base = self._base
        return t

    @data.setter
    def data(self, value: Tensor) -> None:
        if not isinstance(value, Tensor):
            raise TypeError(f"data must be a Tensor, got {type(value).__name__}")
        self._data = value._data
        self._dtype = value._dtype

    def retain_grad(self) -> None:
        """Keep the gradient of this non-leaf tensor in `.grad` after backward."""
        if not self._requires_grad:
            raise AutogradError("can't retain_grad on Tensor that has requires_grad=False")
        if self.grad_fn is None or self._retains_grad:
            return
        self._retains_grad = True
        self.grad_fn.retains_grad[self._output_nr] = self._store_retained_grad

    def _store_retained_grad(self, grad: Tensor) -> None:
        if not grad.requires_grad:  # a copy of its own, through the dispatch point (traceable)
            from graphc.ops.registry import call

            grad = call("cast", grad, dtype=self._dtype.name)
        self._grad = grad if self._grad is None else self._grad + grad

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def register_hook(self, hook) -> RemovableHandle:
        """hook(grad) -> None or a replacement grad; runs when this tensor's grad is computed."""
        if not self._requires_grad:
            raise AutogradError(
                "cannot register a hook on a tensor that doesn't require gradient"
            )
        if self.grad_fn is not None:
            return self.grad_fn.add_tensor_hook(self._output_nr, hook)
        acc = self._grad_accumulator()
        return add_hook(acc.tensor_pre_hooks.setdefault(0, {}), hook)

    def register_post_accumulate_grad_hook(self, hook) -> RemovableHandle:
        """hook(tensor) -> None; runs on a leaf once its gradient is accumulated into `.grad`
        (as PyTorch's; DistributedDataParallel's buckets use it)."""
        if self.grad_fn is not None:
            raise AutogradError("post accumulate grad hooks cannot be registered on non-leaf "
                                "tensors")
        if not self._requires_grad:
            raise AutogradError(
                "cannot register a hook on a tensor that doesn't require gradient"
            )
        return add_hook(self._grad_accumulator().post_accumulate_hooks, hook)

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """Accumulate d(self)/d(leaf) into every leaf's `.grad` (see graphc.autograd)."""
        from graphc.autograd import backward

        backward(self, gradient, retain_graph, create_graph, inputs=inputs)

    # ---- conversion -----------------------------------------------------------------------
    def _refuse_in_trace(self, what: str) -> None:
        from graphc.dispatch import current_tracer

        if current_tracer() is not None:
            raise TraceError(
                f"{what} needs the tensor's value, which a trace does not have. Use graphc.where "
                "for data-dependent choices, or move this code out of the compiled function."
            )
        if self.is_abstract:
            raise TraceError(
                f"{what} needs the tensor's value, and this tensor is abstract (shape "
                f"{list(self.shape)}, {self._dtype.name}, no data): it was made by abstract "
                "evaluation (graphc.dispatch.abstract_eval). Compute it outside that mode."
            )

    def numpy(self, *, force: bool = False) -> np.ndarray:
        """The underlying array (shared memory, as PyTorch's .numpy())."""
        self._refuse_in_trace(".numpy()")
        if force:
            return self._data.copy() if self._requires_grad else self._data
        if self._requires_grad:
            raise AutogradError(
                "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() "
                "instead."
            )
        return self._data

    def item(self):
        self._refuse_in_trace(".item()")
        if self._data.size != 1:
            raise RuntimeError(
                f"a Tensor with {self._data.size} elements cannot be converted to Scalar"
            )
        return self._data.reshape(()).item()

    def _scalar(self, what: str = ".item()"):
        self._refuse_in_trace(what)
        if self._data.size != 1:
            raise ValueError("only one element tensors can be converted to Python scalars")
        return self.item()

    def tolist(self):
        self._refuse_in_trace(".tolist()")
        return self._data.tolist()

    def __array__(self, dtype=None, copy=None):
        self._refuse_in_trace("numpy conversion")
        return self._data if dtype is None else self._data.astype(dtype)

    @property
    def __array_interface__(self) -> dict:
        """numpy's array interface of the data (no copy): torch.as_tensor, numpy and others
        read a graphc tensor's memory through it."""
        self._refuse_in_trace("numpy conversion")
        return self._data.__array_interface__

    def __dlpack__(self, *args, **kwargs):
        """A DLPack capsule of the data (no copy), for torch.from_dlpack and friends."""
        self._refuse_in_trace("DLPack export")
        return self._data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        """(kDLCPU, 0): graphc tensors live in host memory."""
        return (1, 0)

    def __bool__(self) -> bool:
        self._refuse_in_trace("bool(tensor) (e.g. `if tensor:`)")
        if self._data.size != 1:
            raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
        return bool(self._data.reshape(()).item())

    def __float__(self) -> float:
        return float(self._scalar("float(tensor)"))

    def __int__(self) -> int:
        return int(self._scalar("int(tensor)"))

    def __complex__(self) -> complex:
        return complex(self._scalar("complex(tensor)"))

    def __format__(self, spec: str) -> str:
        if self.ndim == 0:
            self._refuse_in_trace("formatting a tensor (f-string)")
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def __index__(self) -> int:
        if self._dtype.is_floating or self._data.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._data.shape[0]))

    def __repr__(self) -> str:
        if self.is_abstract:
            grad = ", requires_grad=True" if self._requires_grad else ""
            return (f"tensor(..., size={tuple(self.shape)}, dtype=graphc.{self._dtype.name}, "
                    f"abstract=True{grad})")
        from graphc.printing import tensor_repr

        return tensor_repr(self)

    def __reduce_ex__(self, protocol):
        return (_rebuild, (self._data, self._requires_grad))

    def __deepcopy__(self, memo):
        if not self.is_leaf:
            raise AutogradError(
                "Only Tensors created explicitly by the user (graph leaves) support the "
                "deepcopy protocol at the moment."
            )
        new = type(self)._wrap(self._data.copy(), self._requires_grad)
        new.__dict__.update({k: v for k, v in self.__dict__.items() if k not in new.__dict__})
        if self.grad is not None:
            new.grad = Tensor._wrap(self.grad._data.copy())
        memo[id(self)] = new
        return new


def _rebuild(array, requires_grad):
    return Tensor._wrap(np.array(array), requires_grad)


def default_dtype() -> DType:
    return float32
