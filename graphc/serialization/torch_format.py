"""PyTorch's checkpoint formats, read and written without PyTorch and without running code.

Writing (`write_zip`): the zip format `torch.save` writes since PyTorch 1.6: a zip (stored,
not compressed) of `<name>/data.pkl`, one `<name>/data/<key>` record of raw little-endian
bytes per storage, and the `version`/`byteorder` records. `data.pkl` is a protocol-2 pickle
emitted here opcode by opcode (`PickleWriter`): it names only what `torch.load(...,
weights_only=True)` allows (`collections.OrderedDict`, `torch._utils._rebuild_tensor_v2`,
`torch._utils._rebuild_parameter`, the `torch.<Type>Storage` classes), so PyTorch reads a
graphc file as its own. Python's pickler cannot write those names without importing torch
(it checks that every global it writes resolves), hence the emitter.

Reading (`read_zip`, `read_legacy`): a restricted unpickler (`graphc.serialization.unpickler`)
rebuilds tensors from the storages; any other global is refused before anything is called.
The legacy format (PyTorch < 1.6, or `_use_new_zipfile_serialization=False`) is a sequence
of pickles (magic number, protocol version, system info, the object, the storage keys)
followed by each storage's element count and bytes.

An array saved twice (tied weights) is one storage; a view is saved as a contiguous copy of
its own elements, never as the larger buffer it looks into.
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections import OrderedDict
from typing import Any, BinaryIO

import numpy as np

from graphc.errors import GraphcError

__all__ = ["LEGACY_MAGIC", "PickleWriter", "SaveError", "STORAGE_DTYPES", "read_legacy",
           "read_zip", "write_zip"]

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
# torch.<name>Storage -> numpy dtype; BFloat16 has no numpy dtype and is refused on read
STORAGE_DTYPES = {"FloatStorage": np.float32, "DoubleStorage": np.float64,
                  "HalfStorage": np.float16, "LongStorage": np.int64, "IntStorage": np.int32,
                  "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
                  "BoolStorage": np.bool_}
_STORAGE_OF = {np.dtype(v): k for k, v in STORAGE_DTYPES.items()}
_MAX_DEPTH = 100


class SaveError(GraphcError, TypeError):
    """`graphc.save` was given something its file format cannot hold without code."""


# ---- writing -----------------------------------------------------------------------------------
class PickleWriter:
    """Emits a protocol-2 pickle of tensors, containers and numbers, naming only the globals
    torch's weights-only loader allows. `storages` collects (key, array) per storage."""

    def __init__(self) -> None:
        self.out = io.BytesIO()
        self.storages: list[tuple[str, np.ndarray]] = []
        self._keys: dict[tuple, str] = {}  # (address, shape, strides, dtype) -> storage key

    def dump(self, obj: Any) -> bytes:
        self.out.write(b"\x80\x02")
        self._save(obj, 0, "obj")
        self.out.write(b".")
        return self.out.getvalue()

    # opcodes
    def _global(self, module: str, name: str) -> None:
        self.out.write(b"c" + module.encode() + b"\n" + name.encode() + b"\n")

    def _int(self, value: int) -> None:
        if 0 <= value < 256:
            self.out.write(b"K" + bytes([value]))
        elif -(2**31) <= value < 2**31:
            self.out.write(b"J" + struct.pack("<i", value))
        else:
            raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            self.out.write(b"\x8a" + bytes([len(raw)]) + raw)

    def _str(self, value: str) -> None:
        raw = value.encode("utf-8", "surrogatepass")
        self.out.write(b"X" + struct.pack("<I", len(raw)) + raw)

    def _tuple(self, items, depth: int, where: str) -> None:
        self.out.write(b"(")
        for k, item in enumerate(items):
            self._save(item, depth + 1, f"{where}[{k}]")
        self.out.write(b"t")

    def _save(self, obj: Any, depth: int, where: str) -> None:
        from graphc.nn.parameter import Parameter
        from graphc.tensor import Tensor

        if depth > _MAX_DEPTH:
            raise SaveError(f"graphc.save: {where} is nested more than {_MAX_DEPTH} deep (a "
                            "cycle?); save tensors, dicts, lists, tuples and numbers")
        if obj is None:
            self.out.write(b"N")
        elif obj is True or obj is False:
            self.out.write(b"\x88" if obj else b"\x89")
        elif isinstance(obj, (int, np.integer)) and not isinstance(obj, bool):
            self._int(int(obj))
        elif isinstance(obj, (float, np.floating)):
            self.out.write(b"G" + struct.pack(">d", float(obj)))
        elif isinstance(obj, str):
            self._str(obj)
        elif isinstance(obj, Parameter):
            self._global("torch._utils", "_rebuild_parameter")
            self.out.write(b"(")
            self._tensor(obj, False)
            self.out.write(b"\x88" if obj.requires_grad else b"\x89")
            self._empty_ordered_dict()
            self.out.write(b"tR")
        elif isinstance(obj, Tensor):
            self._tensor(obj, obj.requires_grad)
        elif isinstance(obj, np.ndarray):
            raise SaveError(f"graphc.save: {where} is a numpy array; wrap it with "
                            "graphc.from_numpy(...) to save it as a tensor")
        elif isinstance(obj, dict):
            self._dict(obj, depth, where)
        elif isinstance(obj, list):
            self.out.write(b"](")
            for k, item in enumerate(obj):
                self._save(item, depth + 1, f"{where}[{k}]")
            self.out.write(b"e")
        elif isinstance(obj, tuple):
            self._tuple(obj, depth, where)
        else:
            what = type(obj).__module__ + "." + type(obj).__qualname__
            hint = (" (save model.state_dict() and load it into a new model with "
                    "load_state_dict, as in PyTorch)" if hasattr(obj, "state_dict") else "")
            raise SaveError(f"graphc.save: {where} is a {what}, which a weights-only file "
                            f"cannot hold{hint}; save tensors, dicts, lists, tuples, strings "
                            "and numbers")

    def _dict(self, obj: dict, depth: int, where: str) -> None:
        if isinstance(obj, OrderedDict):
            self._global("collections", "OrderedDict")
            self.out.write(b")R")
        else:
            self.out.write(b"}")
        if obj:
            self.out.write(b"(")
            for key, value in obj.items():
                self._save(key, depth + 1, f"{where} key {key!r}")
                self._save(value, depth + 1, f"{where}[{key!r}]")
            self.out.write(b"u")
        metadata = getattr(obj, "_metadata", None)
        if isinstance(obj, OrderedDict) and isinstance(metadata, dict):
            # torch keeps each module's state_dict version here (BUILD sets the attribute)
            self.out.write(b"}")
            self._str("_metadata")
            self._save(metadata, depth + 1, f"{where}._metadata")
            self.out.write(b"sb")

    def _empty_ordered_dict(self) -> None:
        self._global("collections", "OrderedDict")
        self.out.write(b")R")

    def _tensor(self, tensor, requires_grad: bool) -> None:
        array = tensor.detach().numpy()
        if array.dtype not in _STORAGE_OF:
            raise SaveError(f"graphc.save: a tensor of dtype {array.dtype} has no PyTorch "
                            "storage type")
        # one storage per distinct array (tied weights stay tied); a view is saved as its
        # own contiguous copy, never as the (maybe much larger) buffer it looks into
        identity = (array.__array_interface__["data"][0], array.shape, array.strides,
                    array.dtype.str)
        key = self._keys.get(identity)
        if key is None:
            key = str(len(self.storages))
            self._keys[identity] = key
            self.storages.append((key, np.ascontiguousarray(array).reshape(-1)))
        strides = tuple(int(np.prod(array.shape[k + 1:], dtype=np.int64))
                        for k in range(array.ndim))
        self._global("torch._utils", "_rebuild_tensor_v2")
        self.out.write(b"((")
        self._str("storage")
        self._global("torch", _STORAGE_OF[array.dtype])
        self._str(key)
        self._str("cpu")
        self._int(array.size)
        self.out.write(b"tQ")  # the persistent id of the storage
        self._int(0)
        self.out.write(b"(")
        for n in array.shape:
            self._int(n)
        self.out.write(b"t(")
        for s in strides:
            self._int(s)
        self.out.write(b"t")
        self.out.write(b"\x88" if requires_grad else b"\x89")
        self._empty_ordered_dict()
        self.out.write(b"tR")


def write_zip(obj: Any, f: BinaryIO, name: str = "archive") -> None:
    """`obj` in torch.save's zip format (see the module docstring)."""
    writer = PickleWriter()
    pickled = writer.dump(obj)
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(f"{name}/data.pkl", pickled)
        archive.writestr(f"{name}/byteorder", "little")
        for key, array in writer.storages:
            archive.writestr(f"{name}/data/{key}", array.astype(array.dtype.newbyteorder("<"),
                                                                copy=False).tobytes())
        archive.writestr(f"{name}/version", "3\n")


# ---- reading -----------------------------------------------------------------------------------
def read_zip(archive: zipfile.ZipFile, where: str, weights_only: bool) -> Any:
    """The object of a torch.save zip, its storages read from the archive's records."""
    from graphc.serialization.unpickler import load_pickle

    names = archive.namelist()
    pkl = next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)
    if pkl is None:
        raise GraphcError(f"graphc.load: {where} is a zip file but not a PyTorch checkpoint "
                          "(no data.pkl record); save it with torch.save or graphc.save")
    prefix = pkl[:-len("data.pkl")]
    order = _byteorder(archive, prefix)
    loaded: dict[str, np.ndarray] = {}

    def storage(key: str, dtype: np.dtype, numel: int) -> np.ndarray:
        if key not in loaded:
            loaded[key] = _record(key, dtype, numel)
        return loaded[key]

    def _record(key: str, dtype: np.dtype, numel: int) -> np.ndarray:
        record = f"{prefix}data/{key}"
        try:
            raw = archive.read(record)
        except KeyError:
            raise GraphcError(f"graphc.load: {where} names storage {key!r}, which has no "
                              f"record {record!r}: the file is truncated or corrupt") from None
        return _array(raw, dtype, numel, order, where, key)

    return load_pickle(archive.read(pkl), storage, where, weights_only)


def _byteorder(archive: zipfile.ZipFile, prefix: str) -> str:
    try:
        return archive.read(f"{prefix}byteorder").decode().strip() or "little"
    except KeyError:
        return "little"


def _array(raw: bytes, dtype: np.dtype, numel: int, order: str, where: str,
           key: str) -> np.ndarray:
    dtype = np.dtype(dtype).newbyteorder("<" if order == "little" else ">")
    if len(raw) < numel * dtype.itemsize:
        raise GraphcError(f"graphc.load: {where}: storage {key!r} holds {len(raw)} bytes, "
                          f"expected {numel * dtype.itemsize} ({numel} x {dtype.name}): the "
                          "file is truncated or corrupt")
    return np.frombuffer(raw, dtype, numel).astype(dtype.newbyteorder("="))


def read_legacy(f: BinaryIO, where: str, weights_only: bool) -> Any:
    """The object of a legacy (pre-zip) torch.save file, `f` just past its magic number
    (the caller reads that first pickle to tell the format)."""
    from graphc.serialization.unpickler import load_pickle, load_plain

    version = load_plain(f, where)
    if version != 1001:
        raise GraphcError(f"graphc.load: {where}: legacy PyTorch protocol {version!r} is not "
                          "supported (1001 is); load it with torch and save it again")
    load_plain(f, where)  # system info: endianness and type sizes (little-endian assumed)
    placeholders: dict[str, np.ndarray] = {}

    def storage(key: str, dtype: np.dtype, numel: int) -> np.ndarray:
        # legacy storages follow the object: hand out one placeholder per key, filled below
        # (tensors are views of their storage, so they see the data)
        if key not in placeholders:
            placeholders[key] = np.zeros(numel, dtype)
        return placeholders[key]

    obj = load_pickle(f, storage, where, weights_only, stream=True)
    keys = load_plain(f, where)
    if not isinstance(keys, list):
        raise GraphcError(f"graphc.load: {where}: the legacy storage list is missing")
    for key in keys:
        (count,) = struct.unpack("<q", _exactly(f, 8, where))
        placeholder = placeholders.get(str(key))
        if placeholder is None or count != placeholder.size:
            raise GraphcError(f"graphc.load: {where}: legacy storage {key!r} does not match "
                              "the object that names it: the file is corrupt")
        raw = _exactly(f, count * placeholder.itemsize, where)
        placeholder[...] = _array(raw, placeholder.dtype, count, "little", where, str(key))
    return obj


def _exactly(f: BinaryIO, n: int, where: str) -> bytes:
    raw = f.read(n)
    if len(raw) != n:
        raise GraphcError(f"graphc.load: {where} ends early ({len(raw)} of {n} bytes): the "
                          "file is truncated")
    return raw
