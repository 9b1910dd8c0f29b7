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

Trust: cached code is loaded and run, so only files this user wrote count. The cache root
and each backend's folder are created 0700; a folder that is a symlink, belongs to another
user, or is writable by group or others is not used at all (a `CacheWarning` names it and
says what to do; the backend compiles without the cache), and an entry that is not a
regular file of this user's, writable by no one else, is skipped the same way (never
loaded, never deleted). Entries are opened with O_NOFOLLOW; `clear` never follows a link
(a link in the folder is removed itself, its target untouched). `ALL` lists every cache
made in the process, for `graphc cache info|clear`.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import tempfile
import threading
import warnings
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


class CacheWarning(UserWarning):
    """A cache folder or entry that graphc does not trust was left unused."""


def untrusted(st: os.stat_result, kind: str) -> str | None:
    """Why a folder's or entry's lstat result makes it untrusted, or None: a symlink, not a
    `kind` ("dir" or "file"), another user's, or writable by group or others."""
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not (stat.S_ISDIR(st.st_mode) if kind == "dir" else stat.S_ISREG(st.st_mode)):
        return f"it is not a {'folder' if kind == 'dir' else 'regular file'}"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"it belongs to user id {st.st_uid}, not to you ({os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"others may write to it (mode {stat.S_IMODE(st.st_mode):o})"
    return None


_warned: set[str] = set()


def _warn(path: str, reason: str) -> None:
    if path not in _warned:
        _warned.add(path)
        warnings.warn(f"graphc cache: not using {path}: {reason}; compiled code is loaded from "
                      "the cache and run, so graphc trusts only a folder (and files) of yours "
                      "that no one else can write: fix its owner or mode, or point "
                      "GRAPHC_CACHE_DIR at one", CacheWarning, stacklevel=3)


ALL: list["DiskCache"] = []  # every cache made in this process (graphc cache info|clear)


class DiskCache:
    """One folder of checksummed entries (see the module docstring)."""

    def __init__(self, name: str, suffix: str,
                 check: Callable[[bytes], object] | None = None) -> None:
        self.name, self.suffix, self.check = name, suffix, check
        self.stats = {"hits": 0, "misses": 0, "corrupt": 0}  # this process's
        self._locks: dict[str, threading.Lock] = {}  # one per key compiled here
        self._guard = threading.Lock()
        ALL.append(self)

    def trusted_folder(self, create: bool = False) -> bool:
        """Whether the cache root and this folder are usable (created 0700 when `create`);
        warns once per folder it refuses."""
        root, folder = config.cache_dir(), self.folder
        for path in (root, folder):
            if create and not os.path.lexists(path):
                try:
                    os.makedirs(path, mode=0o700, exist_ok=True)
                except OSError:
                    return False
            try:
                st = os.lstat(path)
            except OSError:
                return False
            reason = untrusted(st, "dir")
            if reason is not None:
                _warn(path, reason)
                return False
        return True

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
        if not os.path.lexists(path) or not self.trusted_folder():
            return None
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:  # gone, or a symlink (O_NOFOLLOW)
            if os.path.islink(path):
                _warn(path, "it is a symbolic link")
            return None
        with os.fdopen(fd, "rb") as f:
            reason = untrusted(os.fstat(f.fileno()), "file")
            if reason is not None:
                _warn(path, reason)
                return None
            data = f.read()
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
        if not self.trusted_folder(create=True):
            return False
        try:
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
        if os.path.lexists(folder) and self.trusted_folder():
            for entry in os.scandir(folder):
                if entry.name.endswith(self.suffix) and entry.is_file(follow_symlinks=False):
                    entries += 1
                    size += entry.stat(follow_symlinks=False).st_size
        return {"path": folder, "entries": entries, "bytes": size, **self.stats}

    def clear(self) -> int:
        """Delete every entry (and leftover temp files); return how many entries went."""
        folder, removed = self.folder, 0
        if os.path.lexists(folder) and self.trusted_folder():  # never a linked folder
            for entry in os.scandir(folder):
                # a link is removed itself (unlink never follows one), its target untouched
                if entry.name.endswith((self.suffix, ".tmp")) and (
                        entry.is_file(follow_symlinks=False) or entry.is_symlink()):
                    try:
                        os.unlink(entry.path)
                        removed += entry.name.endswith(self.suffix)
                    except FileNotFoundError:
                        pass
        return removed


__all__ = ["ALL", "HEADER", "MAGIC", "CacheWarning", "DiskCache", "pack_entry", "unpack_entry",
           "untrusted"]
