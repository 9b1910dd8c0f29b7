"""Tensors from user data: `graphc.tensor`, `as_tensor`, `from_numpy`.

`tensor` always copies; `from_numpy` shares memory with the array (as PyTorch); `as_tensor`
shares when it can. Dtypes are inferred as PyTorch does: Python floats become float32 (the
default dtype), ints int64, bools bool; numpy arrays and numpy scalars keep their dtype
(float64 stays float64); graphc tensors inside a list keep theirs.
"""

from __future__ import annotations

import numpy as np

from graphc.errors import DTypeError, TraceError
from graphc.tensor import Tensor, check_device
from graphc.types import as_dtype, dtype_of_numpy, float32, float64


def _has_exact_float(data) -> bool:
    """True when a float64 array built from `data` must stay float64 (numpy/graphc values)."""
    if isinstance(data, (np.ndarray, np.generic)):
        return data.dtype == np.float64
    if isinstance(data, Tensor):
        return data.dtype is float64
    if isinstance(data, (list, tuple)):
        return any(_has_exact_float(x) for x in data)
    return False


def _ragged_error(data, dim: int = 0):
    """PyTorch's message for a list whose rows differ in length, or None if it is not ragged."""
    if not isinstance(data, (list, tuple)) or not data:
        return None
    lengths = [len(x) if isinstance(x, (list, tuple)) else None for x in data]
    first = lengths[0]
    for n in lengths:
        if n != first:
            if first is None or n is None:
                return f"expected sequence of length {first} at dim {dim} (got {n})"
            return f"expected sequence of length {first} at dim {dim + 1} (got {n})"
    for x in data:
        message = _ragged_error(x, dim + 1)
        if message:
            return message
    return None


def _array_of(data, dtype) -> np.ndarray:
    if isinstance(data, Tensor):
        if data.is_abstract:
            raise TraceError(
                "graphc.tensor(t) copies t's values, and t is abstract (a trace has shapes and "
                "dtypes only); use t.clone() or t.detach() inside a traced function")
        arr = data._data
    elif isinstance(data, (list, tuple)) and _has_tensor(data):
        arr = np.array([_array_of(x, None) for x in data])
    else:
        try:
            arr = np.asarray(data)
        except ValueError as err:
            raise ValueError(_ragged_error(data) or str(err)) from None
    if arr.dtype.kind in "USO":
        found = _first_str(data)
        if found is not None:
            raise TypeError(f"new(): invalid data type '{type(found).__name__}'")
        raise TypeError(f"graphc.tensor: cannot make a tensor from {type(data).__name__} data "
                        f"(numpy made an array of dtype {arr.dtype})")
    if dtype is not None:
        return arr.astype(as_dtype(dtype).np)
    if arr.dtype == np.float64 and not _has_exact_float(data):
        return arr.astype(float32.np)  # Python floats take the default dtype
    return arr.astype(dtype_of_numpy(arr.dtype).np, copy=False)


def _has_tensor(data) -> bool:
    return any(isinstance(x, Tensor) or (isinstance(x, (list, tuple)) and _has_tensor(x))
               for x in data)


def _first_str(data):
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, (list, tuple)):
        for x in data:
            found = _first_str(x)
            if found is not None:
                return found
    return None


def tensor(data, *, dtype=None, device=None, requires_grad: bool = False,
           pin_memory: bool = False) -> Tensor:
    """A new tensor holding a copy of `data` (nested lists, numbers, arrays, tensors).

    >>> import graphc
    >>> graphc.tensor([[1, 2], [3, 4]]).dtype
    graphc.int64
    >>> graphc.tensor([0.5, 1.0], requires_grad=True)
    tensor([0.5000, 1.0000], requires_grad=True)
    """
    check_device("graphc.tensor", device)
    arr = np.array(_array_of(data, dtype), copy=True)
    if requires_grad and not dtype_of_numpy(arr.dtype).is_floating:
        raise DTypeError("Only Tensors of floating point and complex dtype can require gradients")
    return Tensor._wrap(arr, requires_grad)


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """`data` as a tensor, sharing memory with a tensor or ndarray of the right dtype."""
    check_device("graphc.as_tensor", device)
    if isinstance(data, Tensor) and (dtype is None or as_dtype(dtype) is data.dtype):
        return data
    if isinstance(data, np.ndarray) and (dtype is None or np.dtype(as_dtype(dtype).np) ==
                                         data.dtype):
        try:
            return from_numpy(data)
        except TypeError:
            pass  # a numpy dtype graphc widens (int32, float16): copy instead
    return Tensor._wrap(np.array(_array_of(data, dtype)))


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor sharing memory with `array` (changes to one show in the other).

    >>> import numpy as np, graphc
    >>> a = np.zeros(2)
    >>> t = graphc.from_numpy(a)
    >>> a[0] = 5.0
    >>> t
    tensor([5., 0.], dtype=graphc.float64)
    """
    if not isinstance(array, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(array).__name__})")
    dtype = dtype_of_numpy(array.dtype)
    if array.dtype != dtype.np:
        raise TypeError(
            f"can't convert np.ndarray of type numpy.{array.dtype} without a copy: graphc "
            "keeps float32, float64, int64 and bool; convert it first (array.astype(...)) or "
            "use graphc.tensor(array)"
        )
    return Tensor._wrap(array)





def from_dlpack(ext) -> Tensor:
    """A tensor sharing memory with `ext`, any object with `__dlpack__` on the CPU (a torch
    tensor, a numpy array, a JAX array...), as torch.from_dlpack. A dtype graphc does not
    hold (int32, float16...) is copied into the nearest one it does.

    >>> import numpy as np, graphc
    >>> a = np.arange(3.0)
    >>> t = graphc.from_dlpack(a)
    >>> a[0] = 7.0
    >>> t.tolist()
    [7.0, 1.0, 2.0]
    """
    try:
        array = np.from_dlpack(ext)
    except (TypeError, BufferError, RuntimeError, AttributeError) as err:
        raise TypeError(f"graphc.from_dlpack: cannot take {type(ext).__name__} ({err}); it "
                        "must be a CPU tensor with __dlpack__ (a tensor that requires grad "
                        "must be detached first)") from None
    if array.dtype in (np.float32, np.float64, np.int64, np.bool_):
        return from_numpy(array)
    return tensor(array)
