"""A restricted unpickler: tensors, containers and numbers come back; nothing else runs.

`pickle` rebuilds objects by calling whatever callables the file names. `find_class` here
answers only from an allow-list, in the spirit of `torch.load(weights_only=True)`:
- PyTorch's tensor rebuilders (`torch._utils._rebuild_tensor_v2`, `_rebuild_parameter`, ...)
  and storage types, mapped onto graphc tensors over numpy arrays;
- `collections.OrderedDict`, `builtins.set`/`frozenset`, PyTorch dtypes (as graphc dtypes);
- numpy arrays and scalars of plain dtypes (object arrays are refused);
- graphc's own tensor and parameter rebuilders (files of older graphc versions).
Any other global is refused before it is called, with an `UnsafeCheckpointError` naming it
and saying what to do. `weights_only=False` lifts the restriction for files the user trusts
(PyTorch's own classes then need PyTorch installed).
"""

from __future__ import annotations

import io
import pickle
import struct
from collections import OrderedDict
from typing import Any, BinaryIO, Callable

import numpy as np

from graphc.errors import GraphcError

__all__ = ["UnsafeCheckpointError", "load_pickle", "load_plain"]

StorageReader = Callable[[str, np.dtype, int], np.ndarray]


class UnsafeCheckpointError(GraphcError, pickle.UnpicklingError):
    """A file asked to call something beyond tensors, containers and numbers."""


class _StorageType:
    """Stands for `torch.<Name>Storage` in a persistent id."""

    def __init__(self, name: str) -> None:
        from graphc.serialization.torch_format import STORAGE_DTYPES

        self.name = name
        self.dtype = np.dtype(STORAGE_DTYPES[name]) if name in STORAGE_DTYPES else None


class _ParameterType:
    """Stands for `torch.nn.parameter.Parameter` in `_rebuild_from_type_v2`."""


class _TensorType:
    """Stands for `torch.Tensor` in `_rebuild_from_type_v2`."""


def _tensor(array: np.ndarray, requires_grad: bool = False):
    import graphc

    kept = array.dtype in (np.float32, np.float64, np.int64, np.bool_)
    t = graphc.from_numpy(array) if kept else graphc.tensor(array)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _view(storage: np.ndarray, offset: int, size, stride) -> np.ndarray:
    size, stride = tuple(int(n) for n in size), tuple(int(s) for s in stride)
    if any(n < 0 for n in size) or any(s < 0 for s in stride) or offset < 0:
        raise GraphcError(f"graphc.load: a tensor of size {size}, stride {stride} at offset "
                          f"{offset} is malformed: the file is corrupt")
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset - 1
    if last >= storage.size:
        raise GraphcError(f"graphc.load: a tensor of size {size}, stride {stride} at offset "
                          f"{offset} reaches past its storage of {storage.size} elements: the "
                          "file is corrupt")
    return np.lib.stride_tricks.as_strided(storage[offset:], size,
                                           tuple(s * storage.itemsize for s in stride))


def _rebuild_tensor(storage, storage_offset, size, stride):
    return _tensor(_view(storage, int(storage_offset), size, stride))


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):
    return _tensor(_view(storage, int(storage_offset), size, stride), bool(requires_grad))


def _rebuild_parameter(data, requires_grad, backward_hooks=None, state=None):
    from graphc.nn.parameter import Parameter

    return Parameter(data, bool(requires_grad))


def _rebuild_from_type_v2(func, new_type, args, state):
    result = func(*args)
    if new_type is _ParameterType and not hasattr(result, "_is_param"):
        return _rebuild_parameter(result, result.requires_grad)
    return result


def _graphc_tensor(array, requires_grad):
    return _tensor(np.asarray(array), bool(requires_grad))


def _graphc_parameter(array, requires_grad):
    return _rebuild_parameter(_tensor(np.array(array)), requires_grad)


def _numpy_dtype(*args):
    dtype = np.dtype(*args)
    if dtype.hasobject:
        raise UnsafeCheckpointError("graphc.load: the file holds a numpy array of Python "
                                    "objects, which could run code when loaded; save plain "
                                    "numeric arrays or tensors")
    return dtype


def _torch_dtypes() -> dict[tuple[str, str], Any]:
    import graphc

    return {("torch", "float32"): graphc.float32, ("torch", "float"): graphc.float32,
            ("torch", "float64"): graphc.float64, ("torch", "double"): graphc.float64,
            ("torch", "int64"): graphc.int64, ("torch", "long"): graphc.int64,
            ("torch", "bool"): graphc.bool}


def _allowed() -> dict[tuple[str, str], Any]:
    reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy's own _reconstruct
    table = {
        ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
        ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
        ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
        ("torch.nn.parameter", "Parameter"): _ParameterType,
        ("torch", "Tensor"): _TensorType,
        ("torch._tensor", "Tensor"): _TensorType,
        ("collections", "OrderedDict"): OrderedDict,
        ("builtins", "set"): set,
        ("builtins", "frozenset"): frozenset,
        ("graphc.tensor", "_rebuild"): _graphc_tensor,
        ("graphc.nn.parameter", "_rebuild_parameter"): _graphc_parameter,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): _numpy_dtype,
    }
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        table[(module, "_reconstruct")] = reconstruct
        table[(module, "scalar")] = _numpy_scalar
    table.update(_torch_dtypes())
    return table


def _numpy_scalar(dtype, data=None):
    if not isinstance(dtype, np.dtype) or dtype.hasobject or not isinstance(data, bytes):
        raise UnsafeCheckpointError("graphc.load: a numpy scalar in the file is not a plain "
                                    "number; save plain numbers or tensors")
    return np.frombuffer(data, dtype, 1)[0]


class _Restricted(pickle.Unpickler):
    def __init__(self, file: BinaryIO, storage: StorageReader | None, where: str,
                 weights_only: bool) -> None:
        super().__init__(file)
        self.storage = storage
        self.where = where
        self.weights_only = weights_only
        self.allowed = _allowed()

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get((module, name))
        if found is not None:
            return found
        if module == "torch" and name.endswith("Storage"):
            return _StorageType(name)
        if not self.weights_only:
            return super().find_class(module, name)
        raise UnsafeCheckpointError(
            f"graphc.load: {self.where} asks to call {module}.{name}, which is not a tensor, "
            "a container or a number, and could run code; graphc loads such files only when "
            "told they are trusted: graphc.load(..., weights_only=False) (do that only for "
            "files you made or trust)")

    def persistent_load(self, pid: Any) -> Any:
        if self.storage is None:
            raise UnsafeCheckpointError(f"graphc.load: {self.where} refers to an external "
                                        "object where none is allowed")
        if (not isinstance(pid, tuple) or len(pid) < 5 or pid[0] != "storage"
                or not isinstance(pid[1], _StorageType) or not isinstance(pid[4], int)):
            raise GraphcError(f"graphc.load: {self.where}: unknown persistent id {pid!r:.80}; "
                              "only PyTorch storages are understood")
        kind, key, numel = pid[1], str(pid[2]), pid[4]
        if kind.dtype is None:
            raise GraphcError(f"graphc.load: {self.where}: storage {key!r} is a "
                              f"torch.{kind.name}, which numpy cannot hold; convert it in "
                              "PyTorch first (e.g. tensor.float()) and save again")
        if numel < 0:
            raise GraphcError(f"graphc.load: {self.where}: storage {key!r} has a negative "
                              "size: the file is corrupt")
        storage = self.storage(key, kind.dtype, numel)
        view = pid[5] if len(pid) > 5 else None  # legacy: (view key, offset, size) or None
        if view is not None:
            _, offset, size = view
            return storage[int(offset):int(offset) + int(size)]
        return storage


def load_pickle(data: bytes | BinaryIO, storage: StorageReader | None, where: str,
                weights_only: bool, stream: bool = False) -> Any:
    """Unpickle one object from `data` (bytes, or a file positioned at it) under the
    allow-list; `storage(key, dtype, numel)` supplies PyTorch storages."""
    f = data if stream else io.BytesIO(data)
    try:
        return _Restricted(f, storage, where, weights_only).load()
    except GraphcError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError,
            KeyError, AttributeError, struct.error, RecursionError, MemoryError) as err:
        raise GraphcError(f"graphc.load: {where} could not be read ({type(err).__name__}: "
                          f"{err}); it is corrupt or not a checkpoint") from None


def load_plain(f: BinaryIO, where: str) -> Any:
    """Unpickle one object of a stream that holds no storages (legacy headers)."""
    return load_pickle(f, None, where, weights_only=True, stream=True)
