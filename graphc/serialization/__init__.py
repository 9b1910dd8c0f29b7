"""`graphc.save` / `graphc.load`: checkpoints that PyTorch reads, and that never run code.

Format written by `save`:
- a path ending in `.safetensors`: a safetensors file (the `safetensors` package) of a flat
  dict of tensors, e.g. `model.state_dict()`; `safetensors.torch.load_file` reads it;
- anything else: PyTorch's zip checkpoint format (graphc.serialization.torch_format), which
  `torch.load(path)` reads as its own, `weights_only=True` included. It holds tensors,
  parameters, dicts (ordered or not), lists, tuples, strings, numbers, bools and None: a
  state_dict, an optimizer's state_dict, or a dict of them. Modules and other objects are
  refused with a SaveError (save `model.state_dict()`, as PyTorch recommends).

Formats read by `load`, told apart by their first bytes:
- PyTorch zip checkpoints (`torch.save` since 1.6, and graphc's own);
- legacy PyTorch checkpoints (`_use_new_zipfile_serialization=False`);
- safetensors files (a dict of tensors);
- plain pickles of graphc tensors (files of older graphc versions).
With `weights_only=True` (the default, as in PyTorch 2.6 and later) the unpickler calls only
tensor rebuilders and containers (graphc.serialization.unpickler); a file that asks for
anything else is refused with UnsafeCheckpointError naming what it asked for. Pass
`weights_only=False` only for files you trust. A file that is none of these is a GraphcError
that says so; a truncated or corrupt one is a GraphcError too, never a wrong object.

>>> import graphc, io
>>> buffer = io.BytesIO()
>>> graphc.save({"w": graphc.ones(2), "step": 3}, buffer)
>>> graphc.load(io.BytesIO(buffer.getvalue()))
{'w': tensor([1., 1.]), 'step': 3}
"""

from __future__ import annotations

import io
import os
import struct
import zipfile
from typing import Any, BinaryIO

from graphc.errors import ArgumentError, GraphcError
from graphc.serialization.torch_format import (
    LEGACY_MAGIC,
    SaveError,
    read_legacy,
    read_zip,
    write_zip,
)
from graphc.serialization.unpickler import UnsafeCheckpointError, load_pickle

__all__ = ["SaveError", "UnsafeCheckpointError", "load", "save"]

_ZIP_MAGIC = b"PK\x03\x04"


def save(obj: Any, f: str | os.PathLike | BinaryIO, **torch_options: Any) -> None:
    """Write `obj` to a path or a binary file: PyTorch's zip format, or safetensors for a
    path ending in `.safetensors` (see the module docstring). PyTorch's keyword options
    (`pickle_protocol`, `_use_new_zipfile_serialization`, ...) are accepted and ignored."""
    if isinstance(f, (str, os.PathLike)) and os.fspath(f).endswith(".safetensors"):
        _save_safetensors(obj, os.fspath(f))
        return
    if isinstance(f, (str, os.PathLike)):
        name = os.path.splitext(os.path.basename(os.fspath(f)))[0] or "archive"
        buffer = io.BytesIO()
        write_zip(obj, buffer, _record_name(name))  # nothing is written when obj is refused
        with open(f, "wb") as fh:
            fh.write(buffer.getvalue())
    else:
        write_zip(obj, f)


def _record_name(name: str) -> str:
    kept = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)
    return kept or "archive"


def _save_safetensors(obj: Any, path: str) -> None:
    from safetensors.numpy import save_file

    from graphc.tensor import Tensor

    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, Tensor)
                                            for k, v in obj.items()):
        raise SaveError(f"graphc.save: {path}: a safetensors file holds a flat dict of "
                        "tensors by name (e.g. model.state_dict()); save other objects to a "
                        "path without the .safetensors suffix")
    save_file({k: v.detach().numpy().copy() for k, v in obj.items()}, path)


def load(f: str | os.PathLike | BinaryIO | bytes, map_location: Any = None,
         pickle_module: Any = None, *, weights_only: bool | None = None,
         mmap: bool | None = None, **pickle_load_args: Any) -> Any:
    """Read a checkpoint written by `graphc.save`, `torch.save` or safetensors (see the
    module docstring). Tensors come back in host memory, whatever device they were saved
    from; `map_location` may be None or "cpu" (or a torch.device("cpu")) for PyTorch code
    that passes it. `weights_only` defaults to True."""
    _check_map_location(map_location)
    if pickle_module is not None:
        raise ArgumentError("graphc.load: pickle_module is not supported: graphc reads "
                            "checkpoints with its own restricted unpickler")
    weights_only = True if weights_only is None else bool(weights_only)
    if isinstance(f, (bytes, bytearray, memoryview)):
        data, where = bytes(f), "the given bytes"
    elif isinstance(f, (str, os.PathLike)):
        where = os.fspath(f)
        try:
            with open(f, "rb") as fh:
                data = fh.read()
        except IsADirectoryError:
            raise GraphcError(f"graphc.load: {where} is a directory, not a checkpoint "
                              "file") from None
    else:
        data, where = f.read(), getattr(f, "name", "the given file")
        if not isinstance(data, bytes):
            raise ArgumentError("graphc.load: the file object must be opened in binary mode "
                                "('rb')")
    return _load_bytes(data, str(where), weights_only)


def _check_map_location(map_location: Any) -> None:
    if map_location is None or callable(map_location) or isinstance(map_location, dict):
        return
    text = str(map_location)
    if text != "cpu":
        raise ArgumentError(f"graphc.load: map_location={text!r}: graphc tensors live in host "
                            "memory; pass map_location='cpu' or leave it out")


def _load_bytes(data: bytes, where: str, weights_only: bool) -> Any:
    if not data:
        raise GraphcError(f"graphc.load: {where} is empty: it is not a checkpoint")
    if data.startswith(_ZIP_MAGIC):
        try:
            archive = zipfile.ZipFile(io.BytesIO(data))
        except (zipfile.BadZipFile, ValueError, OSError) as err:
            raise GraphcError(f"graphc.load: {where} is a damaged zip file ({err}): the "
                              "checkpoint is truncated or corrupt") from None
        try:
            return read_zip(archive, where, weights_only)
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
            raise GraphcError(f"graphc.load: {where}: a record could not be read ({err}): "
                              "the checkpoint is corrupt") from None
    if _is_safetensors(data):
        return _load_safetensors(data, where)
    if data[:1] == b"\x80":  # a pickle: the legacy torch format, or an older graphc file
        stream = io.BytesIO(data)
        first = load_pickle(stream, None, where, weights_only, stream=True)
        if isinstance(first, int) and not isinstance(first, bool) and first == LEGACY_MAGIC:
            return read_legacy(stream, where, weights_only)
        return first
    raise GraphcError(f"graphc.load: {where} is neither a PyTorch checkpoint nor a "
                      "safetensors file; graphc.load reads files written by graphc.save, "
                      "torch.save and safetensors")


def _is_safetensors(data: bytes) -> bool:
    if len(data) < 10:
        return False
    (header,) = struct.unpack("<Q", data[:8])
    return header <= len(data) - 8 and data[8:9] == b"{"


def _load_safetensors(data: bytes, where: str) -> dict:
    from safetensors import SafetensorError
    from safetensors.numpy import load as load_arrays

    import graphc

    try:
        arrays = load_arrays(data)
    except (SafetensorError, ValueError, TypeError) as err:
        raise GraphcError(f"graphc.load: {where} is not a valid safetensors file ({err}); it "
                          "is truncated, corrupt, or holds a dtype numpy lacks (bfloat16: "
                          "convert it to float32 first)") from None
    kept = ("float32", "float64", "int64", "bool")
    return {k: graphc.from_numpy(a.copy()) if a.dtype.name in kept else graphc.tensor(a)
            for k, a in arrays.items()}
