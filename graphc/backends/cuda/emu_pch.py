"""emu_pch: the precompiled emulation header, so a generated module's g++ compile skips it.

Parsing runtime/csrc/emu/gc_emu.h (with <cmath>, <memory>, <tuple>, ...) is most of an
emulated graph's compile; `header_for(folder)` returns the path of a copy of the header that
has a g++ precompiled header (`gc_emu.h.gch`) next to it, built once into
`<folder>/pch-<key>/` with exactly `FLAGS` (the flags every module compile uses: g++ only
accepts a `.gch` made with the same options, and silently reads the header text otherwise).

Invariants: the key is the sha256 of (the header's bytes, `g++ --version`, FLAGS), so a change
of any of them builds a new one; the folder appears complete or not at all (built in a
temporary folder beside it, then renamed; a concurrent process that renamed first wins);
a failed build is never an error, only slower: the original header is returned (and this
process does not try that folder again).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading

from graphc.backends.cuda.build import emu_header

# shared by the header's precompile and every module compile (g++ requires them equal)
FLAGS = ("-O1", "-fPIC", "-std=c++17", "-w")
_HEADER_NAME = "gc_emu.h"
_lock = threading.Lock()
_ready: dict[str, str] = {}  # folder -> the header path to -include


def pch_key(header: bytes, compiler_version: str) -> str:
    parts = [header, compiler_version.encode(), " ".join(FLAGS).encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def header_for(folder: str, header: bytes, compiler_version: str) -> str:
    """The header to `-include`: a precompiled copy under `folder`, else the original."""
    with _lock:
        if folder not in _ready or not os.path.isfile(_ready[folder]):  # (a folder removed)
            _ready[folder] = _build(folder, header, compiler_version) or emu_header()
        return _ready[folder]


def _build(folder: str, header: bytes, compiler_version: str) -> str | None:
    final = os.path.join(folder, f"pch-{pch_key(header, compiler_version)}")
    target = os.path.join(final, _HEADER_NAME)
    if os.path.isfile(target + ".gch"):
        return target
    try:
        os.makedirs(folder, exist_ok=True)
        work = tempfile.mkdtemp(dir=folder, prefix="pch-building-")
    except OSError:
        return None
    try:
        copy = os.path.join(work, _HEADER_NAME)
        with open(copy, "wb") as f:
            f.write(header)
        command = ["g++", *FLAGS, "-x", "c++-header", copy, "-o", copy + ".gch"]
        done = subprocess.run(command, capture_output=True, check=False)
        if done.returncode != 0:
            return None
        try:
            os.rename(work, final)
        except OSError:  # another process renamed its own build first: use that one
            pass
        return target if os.path.isfile(target + ".gch") else None
    except OSError:
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)


__all__ = ["FLAGS", "header_for", "pch_key"]
