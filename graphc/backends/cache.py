"""cache: the one on-disk cache of every backend's compiled code (cpu objects, cuda modules).

A `DiskCache` is one folder under `graphc.config.cache_dir()` holding entries
`<key><suffix>`, one file each, in one integrity format: a header (an 8-byte magic, the
payload's length, the payload's sha256) followed by the payload.
- `write(key, payload)` writes the entry to a temp file in the folder and publishes it with a
  single `os.replace`, so a reader sees a whole entry or none; a folder that cannot be
  written only costs speed (`write` returns False).
- `read(key)` returns the payload when magic, length and digest hold and the backend's own
  `check(payload)` (e.g. the cpu backend's ELF check) raises no ValueError; a bad entry is
  deleted and counted as corrupt, so the caller rebuilds it.
- `lock(key)`: compiles of one key in one process are serialised, so concurrent callers
  compile it once. `stats` counts this process's hits, misses and corrupt entries;
  `info()` and `clear()` serve `graphc cache info|clear`.
The key is the backend's (a sha256 of everything the compiled code depends on, the cache's
format name included), so a change of format, toolchain or graphc version misses.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import threading
from typing import Callable

from graphc import config

MAGIC = b"GCOBJ01\n"
HEADER = struct.Struct("<8sQ32s")  # magic, payload length, sha256 of the payload


def pack_entry(payload: bytes) -> bytes:
    """An entry's bytes: the header, then `payload`."""
    return HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload


def unpack_entry(data: bytes) -> bytes | None:
    """The payload of an entry's bytes, or None when the header does not vouch for it."""
    try:
        magic, length, digest = HEADER.unpack_from(data)
    except struct.error:
        return None
    payload = data[HEADER.size:]
    if magic != MAGIC or length != len(payload) or hashlib.sha256(payload).digest() != digest:
        return None
    return payload


class DiskCache:
    """One folder of checksummed entries (see the module docstring)."""

    def __init__(self, name: str, suffix: str,
                 check: Callable[[bytes], object] | None = None) -> None:
        self.name, self.suffix, self.check = name, suffix, check
        self.stats = {"hits": 0, "misses": 0, "corrupt": 0}  # this process's
        self._locks: dict[str, threading.Lock] = {}  # one per key compiled here
        self._guard = threading.Lock()

    @property
    def folder(self) -> str:
        """Read at each use: GRAPHC_CACHE_DIR may change while the process runs (tests)."""
        return os.path.join(config.cache_dir(), self.name)

    def path(self, key: str) -> str:
        return os.path.join(self.folder, key + self.suffix)

    def lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def count(self, event: str) -> None:
        with self._guard:
            self.stats[event] += 1

    def read(self, key: str) -> bytes | None:
        """The verified payload of `key`'s entry, or None (a bad entry is deleted)."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        payload = unpack_entry(data)
        if payload is not None and self.check is not None:
            try:
                self.check(payload)
            except ValueError:
                payload = None
        if payload is not None:
            return payload
        self.discard(key)
        return None

    def discard(self, key: str) -> None:
        """Delete `key`'s entry (a bad one: counted as corrupt)."""
        self.count("corrupt")
        try:
            os.unlink(self.path(key))
        except OSError:
            pass

    def write(self, key: str, payload: bytes) -> bool:
        """Store `payload` under `key` atomically; False when the folder cannot be written."""
        path = self.path(key)
        try:
            os.makedirs(self.folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=os.path.basename(path) + ".",
                                       suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(pack_entry(payload))
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            return False
        return True

    def info(self) -> dict:
        """Where the cache lives, its entries and bytes, and this process's counts."""
        folder, entries, size = self.folder, 0, 0
        if os.path.isdir(folder):
            for entry in os.scandir(folder):
                if entry.name.endswith(self.suffix) and entry.is_file():
                    entries += 1
                    size += entry.stat().st_size
        return {"path": folder, "entries": entries, "bytes": size, **self.stats}

    def clear(self) -> int:
        """Delete every entry (and leftover temp files); return how many entries went."""
        folder, removed = self.folder, 0
        if os.path.isdir(folder):
            for entry in os.scandir(folder):
                if entry.name.endswith((self.suffix, ".tmp")) and entry.is_file():
                    try:
                        os.unlink(entry.path)
                        removed += entry.name.endswith(self.suffix)
                    except FileNotFoundError:
                        pass
        return removed


__all__ = ["HEADER", "MAGIC", "DiskCache", "pack_entry", "unpack_entry"]
