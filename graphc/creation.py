"""Tensors from user data: `graphc.tensor`, `as_tensor`, `from_numpy`.

`tensor` always copies; `from_numpy` shares memory with the array (as PyTorch); `as_tensor`
shares when it can. Dtypes are inferred as PyTorch does: Python floats become float32 (the
default dtype), ints int64, bools bool; numpy arrays and numpy scalars keep their dtype
(float64 stays float64); graphc tensors inside a list keep theirs.
"""

from __future__ import annotations

import numpy as np

from graphc.errors import ArgumentError, DTypeError, TraceError
from graphc.tensor import Tensor, check_device
from graphc.types import as_dtype, dtype_of_numpy, float32, float64, int64


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


# ---- creation functions of PyTorch's surface beyond zeros/ones/full/arange -------------------
def eye(n: int, m: int | None = None, *, dtype=None, requires_grad: bool = False,
        device=None) -> Tensor:
    """An n x m matrix with ones on the diagonal (m = n by default).

    >>> import graphc
    >>> graphc.eye(2, 3, dtype=graphc.int64)
    tensor([[1, 0, 0],
            [0, 1, 0]])
    """
    from graphc.ops import elementwise, movement, sources

    check_device("graphc.eye", device)
    m = n if m is None else m
    if n < 0:
        raise ValueError(f"n must be greater or equal to 0, got {n}")
    if m < 0:
        raise ValueError(f"m must be greater or equal to 0, got {m}")
    rows = movement.unsqueeze(sources.arange(n), -1)
    out = elementwise.cast(rows == sources.arange(m), as_dtype(dtype or float32))
    return out.requires_grad_(True) if requires_grad else out


def _scalar(value, name: str) -> float:
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise ValueError(f"linspace only supports 0-dimensional start and end tensors, but "
                             f"got {name} with {value.ndim} dimension(s).")
        return float(value.item())
    return float(value)


def linspace(start, end, steps: int, *, dtype=None, requires_grad: bool = False,
             device=None) -> Tensor:
    """`steps` evenly spaced values from start to end, with PyTorch's two-sided formula
    (start + i*step in the first half, end - (steps-1-i)*step in the second), in `dtype`.

    >>> graphc.linspace(0, 1, 5)
    tensor([0.0000, 0.2500, 0.5000, 0.7500, 1.0000])
    """
    from graphc.ops import elementwise, sources

    check_device("graphc.linspace", device)
    if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool):
        raise TypeError(f"linspace(): argument 'steps' must be int, not {type(steps).__name__}")
    if steps < 0:
        raise ArgumentError("number of steps must be non-negative")
    dt = as_dtype(dtype or float32)
    work = dt if dt.is_floating else float64
    a, b = _scalar(start, "start"), _scalar(end, "end")
    if steps <= 1:
        out = sources.full((steps,), a, dtype=work)
    else:
        # the step in the working dtype, as PyTorch's kernel computes it
        cast = work.np
        step = float((cast(b) - cast(a)) / cast(steps - 1))
        idx = sources.arange(steps, dtype=work)
        first = idx * step + a
        second = (float(steps - 1) - idx) * (-step) + b
        out = elementwise.where(idx < float(steps // 2), first, second)
    out = elementwise.cast(out, dt)
    return out.requires_grad_(True) if requires_grad else out


def logspace(start, end, steps: int, base: float = 10.0, *, dtype=None,
             requires_grad: bool = False, device=None) -> Tensor:
    """base ** linspace(start, end, steps), in `dtype`."""
    from graphc.ops import elementwise

    dt = as_dtype(dtype or float32)
    exponents = linspace(start, end, steps, dtype=float64, device=device)
    out = elementwise.cast(elementwise.pow(float(base), exponents), dt)
    return out.requires_grad_(True) if requires_grad else out


def empty_like(input, *, dtype=None, requires_grad: bool = False, device=None,  # noqa: A002
               memory_format=None) -> Tensor:
    """A tensor shaped like input (graphc fills it with zeros: its values are unspecified)."""
    from graphc.ops import sources

    return sources.zeros_like(input, dtype=dtype, requires_grad=requires_grad, device=device)


def _triangle_indices(function: str, row: int, col: int, offset: int, dtype, lower: bool):
    dt = as_dtype(dtype or int64)
    if dt is not int64:
        raise DTypeError(f"{function}: graphc's indices are int64, got dtype={dt.name}")
    if row < 0 or col < 0:
        raise ValueError(f"row must be non-negative, got{row}" if row < 0 else
                         f"col must be non-negative, got{col}")
    r, c = np.tril_indices(row, offset, col) if lower else np.triu_indices(row, offset, col)
    return Tensor._wrap(np.stack([r, c]).astype(np.int64).reshape(2, -1), False)


def tril_indices(row: int, col: int, offset: int = 0, *, dtype=None, device=None) -> Tensor:
    """The (2, N) row and column indices of the lower triangle of a row x col matrix."""
    check_device("graphc.tril_indices", device)
    return _triangle_indices("tril_indices", row, col, offset, dtype, lower=True)


def triu_indices(row: int, col: int, offset: int = 0, *, dtype=None, device=None) -> Tensor:
    """The (2, N) row and column indices of the upper triangle of a row x col matrix."""
    check_device("graphc.triu_indices", device)
    return _triangle_indices("triu_indices", row, col, offset, dtype, lower=False)


def numel(input) -> int:  # noqa: A002
    """The number of elements of input."""
    return input.numel()


PUBLIC = ("eye", "linspace", "logspace", "empty_like", "tril_indices", "triu_indices", "numel")
