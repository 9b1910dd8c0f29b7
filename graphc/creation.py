"""Tensors from user data: `graphc.tensor`, `as_tensor`, `from_numpy`.

`tensor` always copies; `from_numpy` shares memory with the array (as PyTorch); `as_tensor`
shares when it can. Python floats become float32 (the default dtype), ints int64.
"""

from __future__ import annotations

import numpy as np

from graphc.tensor import Tensor
from graphc.types import as_dtype, dtype_of_numpy, float32


def _array_of(data, dtype) -> np.ndarray:
    if isinstance(data, Tensor):
        arr = data._data
    elif isinstance(data, (list, tuple)) and any(isinstance(x, Tensor) for x in data):
        arr = np.array([x._data if isinstance(x, Tensor) else x for x in data])
    else:
        arr = np.asarray(data)
    if dtype is not None:
        return arr.astype(as_dtype(dtype).np)
    if arr.dtype == np.float64 and not isinstance(data, np.ndarray):
        return arr.astype(float32.np)  # Python floats take the default dtype
    if arr.dtype.kind in "U S O".split():
        raise TypeError(f"graphc.tensor: cannot make a tensor from {type(data).__name__} data")
    return arr.astype(dtype_of_numpy(arr.dtype).np)


def tensor(data, *, dtype=None, requires_grad: bool = False) -> Tensor:
    """A new tensor holding a copy of `data` (nested lists, numbers, arrays, tensors).

    >>> import graphc
    >>> graphc.tensor([[1, 2], [3, 4]]).dtype
    graphc.int64
    """
    arr = np.array(_array_of(data, dtype), copy=True)
    return Tensor._wrap(arr, requires_grad)


def as_tensor(data, dtype=None) -> Tensor:
    if isinstance(data, Tensor) and (dtype is None or as_dtype(dtype) is data.dtype):
        return data
    if isinstance(data, np.ndarray) and (dtype is None or np.dtype(as_dtype(dtype).np) ==
                                         data.dtype):
        return from_numpy(data)
    return Tensor._wrap(_array_of(data, dtype))


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor sharing memory with `array` (changes to one show in the other)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy expects an np.ndarray, got {type(array).__name__}")
    dtype = dtype_of_numpy(array.dtype)
    if array.dtype != dtype.np:
        raise TypeError(
            f"from_numpy: can't share memory with a {array.dtype} array: graphc keeps float32, "
            "float64, int64 and bool; convert it first (array.astype(...))"
        )
    return Tensor._wrap(array)
