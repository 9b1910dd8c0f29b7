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
- Size limit: a read that hits marks the entry used (its mtime); a write that takes the
  folder's entries past `max_bytes` (GRAPHC_CACHE_MAX_BYTES, default 1 GiB, per cache)
  deletes the least recently used entries until they fit again (never the one just written).
  Processes that evict at once only race to unlink the same files, which is harmless; a
  reader that opened an entry before it went still reads it whole.
- Counts across processes: `count` also adds the event to `<root>/<name>-<suffix>.stats`
  (hits, misses, evictions as three little-endian u64), read-modify-written under an
  exclusive `flock`, so concurrent processes never lose a count; `info()` reports them and
  the hit rate, and `clear()` resets them. Where that file cannot be used (no fcntl, not
  this user's), only this process's counts exist.
The key is the backend's (a sha256 of everything the compiled code depends on, the cache's
format name included), so a change of format, toolchain or graphc version misses.

The pipeline cache (`PIPELINES`): graphc.compile looks a traced graph up *before* the passes,
so a warm first call skips the passes and the lowering as well as LLVM. `pipeline_key` names
an entry by what comes in: the traced graph's text (source lines included), the passes (by
qualified name and arguments; only graphc's own, whose code the key covers), the backend, its
options and its toolchain (for cpu: host triple, CPU, features, LLVM, BLAS), graphc's version
and a fingerprint of graphc's source files (`source_fingerprint`: a checkout whose code
changed misses), and the tuning constants of the passes and the backend
(`tuning_constants`: upper-case module literals, which tests and benchmarks change). An
entry is a bundle of named sections (`pack_sections`), whose structure `unpack_sections`
checks before the backend reads it (graphc.backends.cpu.executable: the optimized graph's
text, what the lowering made, the key of its object code in the backend's own cache).

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

import ast
import functools
import hashlib
import json
import operator
import os
import re
import stat
import struct
import tempfile
import threading
import warnings
from typing import Callable

try:
    import fcntl
except ImportError:  # not on POSIX: counts are this process's only
    fcntl = None

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
COUNTERS = struct.Struct("<QQQ")  # the .stats file: hits, misses, evictions
_PERSISTED = ("hits", "misses", "evicted")


class DiskCache:
    """One folder of checksummed entries (see the module docstring)."""

    def __init__(self, name: str, suffix: str,
                 check: Callable[[bytes], object] | None = None,
                 max_bytes: int | None = None) -> None:
        self.name, self.suffix, self.check = name, suffix, check
        self._max_bytes = max_bytes  # None: GRAPHC_CACHE_MAX_BYTES at each write
        self.stats = {"hits": 0, "misses": 0, "corrupt": 0, "evicted": 0}  # this process's
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

    @property
    def max_bytes(self) -> int:
        return config.cache_max_bytes() if self._max_bytes is None else self._max_bytes

    @property
    def stats_path(self) -> str:
        return os.path.join(config.cache_dir(), f"{self.name}-{self.suffix.lstrip('.')}.stats")

    def count(self, event: str, n: int = 1) -> None:
        """Add `n` to this process's count of `event`, and to the folder's own counts."""
        with self._guard:
            self.stats[event] += n
        if event in _PERSISTED and n:
            self._update_counters(lambda counts: counts.__setitem__(
                _PERSISTED.index(event), counts[_PERSISTED.index(event)] + n))

    def counters(self) -> dict | None:
        """The counts kept in the cache folder across processes, or None."""
        counts = self._update_counters(None)
        return None if counts is None else dict(zip(_PERSISTED, counts))

    def _update_counters(self, change) -> list[int] | None:
        """Read the .stats file under an exclusive lock, apply `change(counts)` (a list, in
        place; None: only read) and write it back; None where the file cannot be used."""
        if fcntl is None or not self.trusted_folder(create=change is not None):
            return None
        path = self.stats_path
        flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | (os.O_CREAT if change else 0)
        try:
            fd = os.open(path, flags, 0o600)
        except OSError:  # absent (reading only), or a symlink (O_NOFOLLOW)
            if os.path.islink(path):
                _warn(path, "it is a symbolic link")
            return None
        try:
            reason = untrusted(os.fstat(fd), "file")
            if reason is not None:
                _warn(path, reason)
                return None
            fcntl.flock(fd, fcntl.LOCK_EX)
            data = os.pread(fd, COUNTERS.size, 0)
            counts = list(COUNTERS.unpack(data)) if len(data) == COUNTERS.size else [0, 0, 0]
            if change is not None:
                change(counts)
                os.pwrite(fd, COUNTERS.pack(*counts), 0)
            return counts
        except OSError:
            return None
        finally:
            os.close(fd)  # releases the lock

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
            try:
                os.utime(f.fileno())  # used now: the last to go when the cache is full
            except OSError:
                pass
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
        self.evict(keep=path)
        return True

    def _entries(self) -> list[tuple[float, int, str]]:
        """(last use, bytes, path) of every entry of this user's in the folder."""
        found = []
        try:
            scan = list(os.scandir(self.folder))
        except OSError:
            return found
        for entry in scan:
            if not entry.name.endswith(self.suffix):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if untrusted(st, "file") is None:
                found.append((st.st_mtime, st.st_size, entry.path))
        return found

    def evict(self, keep: str | None = None, max_bytes: int | None = None) -> int:
        """Delete the least recently used entries until the folder's entries fit in
        `max_bytes` (default `self.max_bytes`); never `keep`. Returns how many went."""
        limit = self.max_bytes if max_bytes is None else max_bytes
        entries = self._entries()
        total = sum(size for _, size, _ in entries)
        removed = 0
        for _, size, path in sorted(entries):
            if total <= limit:
                break
            if path == keep:
                continue
            try:
                os.unlink(path)
                removed += 1
            except FileNotFoundError:  # another process evicted it first
                pass
            except OSError:
                continue
            total -= size
        if removed:
            self.count("evicted", removed)
        return removed

    def info(self) -> dict:
        """Where the cache lives, its entries and bytes, its limit, this process's counts
        (hits, misses, corrupt, evicted) and the counts of every process that used the
        folder (`total`: hits, misses, evicted, or None) with their `hit_rate` (or None)."""
        folder, entries, size = self.folder, 0, 0
        if os.path.lexists(folder) and self.trusted_folder():
            for entry in os.scandir(folder):
                if entry.name.endswith(self.suffix) and entry.is_file(follow_symlinks=False):
                    entries += 1
                    size += entry.stat(follow_symlinks=False).st_size
        total = self.counters() if os.path.lexists(self.stats_path) else None
        lookups = total["hits"] + total["misses"] if total else 0
        return {"path": folder, "entries": entries, "bytes": size,
                "max_bytes": self.max_bytes, **self.stats, "total": total,
                "hit_rate": total["hits"] / lookups if lookups else None}

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
            if os.path.lexists(self.stats_path):
                self._update_counters(lambda counts: counts.__setitem__(slice(None), [0] * 3))
        return removed


# ---- the pipeline cache ----------------------------------------------------------------------
PIPELINE_FORMAT = "pipelines-v1"  # the folder; bump when the key or the sections change
_SECTIONS = struct.Struct("<8sI")  # magic, length of the JSON table of section lengths
_SECTIONS_MAGIC = b"GCSECT01"


def pack_sections(sections: dict[str, bytes]) -> bytes:
    """One payload of named byte strings: a table of their names and lengths, then them."""
    table = json.dumps([[name, len(data)] for name, data in sections.items()]).encode()
    return b"".join([_SECTIONS.pack(_SECTIONS_MAGIC, len(table)), table, *sections.values()])


def unpack_sections(payload: bytes) -> dict[str, bytes]:
    """The sections of a payload; ValueError unless its table and lengths hold together."""
    try:
        magic, size = _SECTIONS.unpack_from(payload)
        table = json.loads(payload[_SECTIONS.size:_SECTIONS.size + size])
        at = _SECTIONS.size + size
        sections = {}
        for name, length in table:
            if not isinstance(name, str) or not isinstance(length, int) or length < 0:
                raise ValueError
            sections[name] = payload[at:at + length]
            at += length
    except (struct.error, ValueError, TypeError, UnicodeDecodeError):
        raise ValueError("not a graphc section bundle") from None
    if magic != _SECTIONS_MAGIC or at != len(payload):
        raise ValueError("not a graphc section bundle")
    return sections


PIPELINES = DiskCache(PIPELINE_FORMAT, ".gp", unpack_sections)


def storable(backend: str):
    """The executable class whose executables the pipeline cache keeps for `backend` (it
    gives `toolchain(graph)`, `sections()` and `from_sections(sections)`), or None: only the
    cpu backend, as graphc registers it (a factory registered in its place is not known)."""
    from graphc.backends import BACKENDS

    if backend != "cpu" or getattr(BACKENDS.get(backend), "__module__", None) != \
            "graphc.backends":
        return None
    from graphc.backends.cpu.executable import CpuExecutable  # loads llvmlite: only here

    return CpuExecutable


@functools.cache
def source_fingerprint() -> str:
    """A sha256 of every graphc source file (path and bytes), once per process: an edited
    checkout, whose version string stays the same, misses every pipeline entry."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # graphc/
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()


def tuning_constants(packages: tuple[str, ...]) -> str:
    """The upper-case module constants of `packages` whose value differs from the one their
    source assigns (`NAME = <number or string expression>`), as text: block sizes,
    thresholds and O levels decide what the passes and the lowering make, and a test or a
    benchmark may change them at run time. The source's own values are covered by
    `source_fingerprint`, so only a change counts, and the text does not depend on which
    modules happen to be loaded (a module that is not loaded has its source's values)."""
    import sys

    rows = []
    for name in sorted(n for n in list(sys.modules) if n.startswith(packages)):
        module = sys.modules[name]
        for attr, default in _source_constants(module).items():
            value = getattr(module, attr, default)
            if type(value) is not type(default) or value != default:
                rows.append(f"{name}.{attr}={value!r}")
    return "\n".join(rows)


_ASSIGNMENT = re.compile(r"^([A-Z][A-Z0-9_]*)[ \t]*(?::[^=\n]+)?=[ \t]*([^\n]+)$", re.M)
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv,
              ast.Pow: operator.pow, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
              ast.Mod: operator.mod}
_source_values: dict[str, dict] = {}


def _source_constants(module) -> dict:
    """{NAME: value} of the module-level assignments of a number or string (or arithmetic on
    them) in the module's source, read once per process."""
    name = getattr(module, "__name__", "")
    found = _source_values.get(name)
    if found is None:
        found = {}
        try:
            with open(module.__file__, encoding="utf-8") as f:
                text = f.read()
        except (OSError, TypeError, AttributeError):
            text = ""
        for match in _ASSIGNMENT.finditer(text):
            try:
                found[match[1]] = _evaluate(ast.parse(match[2].strip(), mode="eval").body)
            except (SyntaxError, ValueError, TypeError, ArithmeticError):
                continue
        _source_values[name] = found
    return found


def _evaluate(node):
    """A number or string literal, or arithmetic on such (`1 << 16`, `25 * 2**20`)."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float, str, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("not a constant expression")


def pass_names(passes) -> list[str] | None:
    """Each pass as `module.qualname(args)`, or None when one is not graphc's own module-level
    function (a pass of the user's: its code is not in the key, so nothing is cached)."""
    names = []
    for p in passes:
        fn, args = (p.func, (p.args, sorted(p.keywords.items()))) \
            if isinstance(p, functools.partial) else (p, ())
        module, qualname = getattr(fn, "__module__", ""), getattr(fn, "__qualname__", "")
        if not module.startswith("graphc.") or not qualname or "<" in qualname:
            return None
        names.append(f"{module}.{qualname}{args!r}" if args else f"{module}.{qualname}")
    return names


def pipeline_key(graph_text: str, passes, backend: str, options: dict, toolchain: str,
                 packages: tuple[str, ...]) -> str | None:
    """The hex sha256 naming the pipeline entry of a traced graph (see the module docstring),
    or None when the passes cannot be named (nothing is cached then). `toolchain`: what the
    backend's code depends on besides graphc; `packages`: whose tuning constants count."""
    from graphc.version import __version__

    names = pass_names(passes)
    if names is None:
        return None
    parts = (PIPELINE_FORMAT, graph_text, "\n".join(names), backend,
             repr(sorted(options.items())), toolchain, __version__, source_fingerprint(),
             tuning_constants(("graphc.passes", "graphc.backends.common") + packages))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


__all__ = ["ALL", "COUNTERS", "HEADER", "MAGIC", "PIPELINES", "CacheWarning", "DiskCache",
           "pack_entry", "pack_sections", "pass_names", "pipeline_key", "source_fingerprint",
           "storable", "tuning_constants", "unpack_entry", "unpack_sections", "untrusted"]
