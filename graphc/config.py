"""Every environment variable graphc reads, in one place.

- GRAPHC_LOG: comma-separated topics to log to stderr; `recompiles` logs why a compiled
  callable traced again (a field-level diff of its guards).
- GRAPHC_DUMP: what to write for every compiled graph, and where: comma-separated topics
  `ir` (the IR after tracing and after every pass, one `.gir` file per stage), `llvm` (the
  CPU backend's LLVM IR as generated and as optimised, `.ll`), `asm` (its assembly, `.s`),
  `all`; any other item is the directory (default `./graphc-dump`). Without a topic, `ir`:
  `GRAPHC_DUMP=/tmp/d` dumps the IR into /tmp/d; `GRAPHC_DUMP=llvm,asm` the code.
- GRAPHC_RECOMPILE_LIMIT: how many times one compiled callable may trace (default 8).
- GRAPHC_CACHE_DIR: where compiled object code is cached on disk (default
  `$XDG_CACHE_HOME/graphc`, else `~/.cache/graphc`).
- GRAPHC_CACHE_MAX_BYTES: the size limit of each backend's disk cache folder (default
  1 GiB; suffixes K, M, G); the least recently used entries go first (graphc.backends.cache).
- GRAPHC_COMPILE_WORKERS: how many processes may compile one large CPU module at once
  (default: the cores this process may use; `1` compiles in this process only; see
  graphc.backends.cpu.workers).
- GRAPHC_CHECK_NANS: `1` makes every call of a graphc.compile'd function check its floating
  outputs and in-place updates for NaN/Inf; on one it replays the traced graph on the
  interpreter with the same inputs and raises `graphc.jit.nan_check.NonFiniteError` naming the first
  node that produced a NaN or an Inf (its op, its IR line, the user source line it was traced
  from), before anything is written back (see graphc.jit.nan_check). The first call of a signature
  then runs the compiled graph too (its eager run is undone). Off by default, and free when off.
- GRAPHC_POISON: `1` makes every CPU executable made afterwards fill its output arrays (NaN,
  the smallest integer, or True) and its whole arena (0xFF bytes: NaN in every float width)
  before each run, so an element a kernel fails to write cannot pass for a right value left
  by an earlier array (graphc.backends.cpu.poison). For tests and debugging; off by default.
- GRAPHC_CUDA: which library the cuda backend runs on: `cuda` (or `gpu`, or unset) the GPU
  build, `emu` (or `emulation`) the CPU emulation of graphc's CUDA runtime (every CUDA thread
  a fiber on the host; slow, for machines without a GPU); anything else is an error.
- GRAPHC_CUDA_SYNC: `1` makes the cuda backend synchronise after every kernel launch and
  library call (no CUDA graph), so a fault is reported by the call that made it, naming the
  kernel, the graph node and the user source line (slow; for debugging).
- GRAPHC_CUDA_ALLOW_TF32: `1` lets the cuda backend run float32 matmuls on tensor cores with
  inputs rounded to TF32 (10 mantissa bits), as `torch.backends.cuda.matmul.allow_tf32 = True`;
  off by default (PyTorch's default for matmul too): full float32 GEMMs.
- GRAPHC_CUDA_LIBS: `0` makes the CUDA runtime run graphc's own GEMM kernels even where
  cuBLAS can be loaded (read by the runtime library itself; docs/backends.md).
- GRAPHC_CUDA_TILE_BLOCKS: `2` bounds the convolutions' 128-row GEMM tiles for two blocks an
  SM instead of one (read once by the runtime library itself; docs/backends.md).
- GRAPHC_EMU_STICKY: `1` makes the CUDA emulation's kernel faults sticky, as on a GPU
  (`unrecoverable`: the reset fails too); read by the emulation library (runtime/csrc/README.md).
- GRAPHC_EMU_RACECHECK, GRAPHC_EMU_SCHEDULE: the CUDA emulation's checking modes (read by the
  emulation library itself; runtime/csrc/README.md): `GRAPHC_EMU_RACECHECK=1` reports racing
  shared/global memory accesses as a launch failure (`warn`: on stderr only);
  `GRAPHC_EMU_SCHEDULE=random:SEED` runs CUDA threads in a seeded random order. With either
  set, the cuda backend compiles its generated kernels instrumented for them.
- GRAPHC_BLAS_THREADS: how the CPU backend's BLAS (OpenBLAS or MKL) uses threads: `shared`
  (the default) runs its parallel jobs on the one libgomp team graphc's own loops use (see
  graphc.backends.cpu.threads); `native` leaves the BLAS's own threads alone (OpenBLAS's
  pool, MKL's default Intel OpenMP layer).
- GRAPHC_BLAS: which BLAS the CPU backend's GEMMs call (graphc.backends.cpu.blas): `auto`
  (the default) Intel MKL's libmkl_rt where the `mkl` wheel is installed, else numpy's
  OpenBLAS; `openblas` never MKL; `mkl` MKL or an error that says to install it. Read once
  per process, by the first compiled GEMM.
- GRAPHC_CUDA_ALL_OPINFO: `1` makes tests/test_cuda_backend.py run every sample of every
  OpInfo entry on the cuda backend instead of each entry's first (slow under emulation).

One variable graphc sets rather than reads: GOMP_SPINCOUNT (libgomp's spin before a waiting
thread sleeps), to OPENMP_SPIN_COUNT unless the user set it, by `set_openmp_waiting`, which
`import graphc` calls: libgomp reads it once, when it loads, and a process has one libgomp
(PyTorch's and the system's share the name), so it must be set before the first library that
uses OpenMP loads (graphc.backends.cpu.threads).

Read at use, not at import, so tests can set them with monkeypatch.
"""

from __future__ import annotations

import os

from graphc.errors import ArgumentError, GraphcError


def log_topics() -> set[str]:
    return {t.strip() for t in os.environ.get("GRAPHC_LOG", "").split(",") if t.strip()}


DUMP_TOPICS = ("ir", "llvm", "asm")


def _dump_items() -> list[str]:
    return [t.strip() for t in os.environ.get("GRAPHC_DUMP", "").split(",") if t.strip()]


def dump_dir() -> str | None:
    """Where GRAPHC_DUMP writes, or None when it is unset."""
    items = _dump_items()
    if not items:
        return None
    places = [t for t in items if t not in DUMP_TOPICS + ("all",)]
    return places[-1] if places else os.path.join(os.getcwd(), "graphc-dump")


def write_dump_file(directory: str, filename: str, text: str) -> str:
    """Write one GRAPHC_DUMP file and return its path. The folder must be this user's; the
    file is created anew (an earlier one is unlinked first, a symlink included, never
    followed) with O_EXCL and O_NOFOLLOW, so a link planted in a shared folder cannot send
    the dump anywhere else."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    folder = os.lstat(directory)
    if hasattr(os, "getuid") and folder.st_uid != os.getuid():
        raise GraphcError(f"GRAPHC_DUMP: {directory} belongs to another user; graphc writes "
                          "dumps only into a folder of yours: set GRAPHC_DUMP to one")
    path = os.path.join(directory, filename)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    with os.fdopen(os.open(path, flags, 0o644), "w") as f:
        f.write(text)
    return path


def dumps(topic: str) -> bool:
    """Whether GRAPHC_DUMP asks for `topic` (one of DUMP_TOPICS)."""
    items = _dump_items()
    topics = [t for t in items if t in DUMP_TOPICS + ("all",)]
    if items and not topics:
        topics = ["ir"]
    return topic in topics or "all" in topics


def cuda_sync() -> bool:
    return os.environ.get("GRAPHC_CUDA_SYNC", "") not in ("", "0")


def cuda_allow_tf32() -> bool:
    return os.environ.get("GRAPHC_CUDA_ALLOW_TF32", "") not in ("", "0")


def cuda_vendor_libs() -> bool:
    return os.environ.get("GRAPHC_CUDA_LIBS", "") != "0"


# GRAPHC_CHECK_NANS is read on every compiled call. `os.environ.get` (and `name in
# os.environ`, which is Mapping.__contains__ over the same `__getitem__`) raises and catches
# two KeyErrors inside when the variable is unset: ~0.6 us warm, 4-10 us on the caches a short
# native run leaves (docs/performance.md, "SGEMM 256"). CPython keeps os.environ's items in a
# plain dict, `os.environ._data`, keyed by `os.environ.encodekey(name)` (bytes on POSIX, upper
# case str on Windows), which every change through os.environ (monkeypatch.setenv included)
# writes first; a lookup there raises nothing. Where that dict is missing (another Python),
# `os.environ.get`. os.environ itself is looked up at each call, so a replaced one is seen.
_CHECK_NANS = "GRAPHC_CHECK_NANS"
_CHECK_NANS_KEY = os.environ.encodekey(_CHECK_NANS)
_OFF = frozenset((os.environ.encodevalue(""), os.environ.encodevalue("0")))


def check_nans() -> bool:
    """Whether GRAPHC_CHECK_NANS is set to something other than "" or "0"."""
    items = getattr(os.environ, "_data", None)
    if type(items) is not dict:
        return os.environ.get(_CHECK_NANS, "") not in ("", "0")
    value = items.get(_CHECK_NANS_KEY)
    return value is not None and value not in _OFF


def poison() -> bool:
    """Whether GRAPHC_POISON is set to something other than "" or "0"."""
    return os.environ.get("GRAPHC_POISON", "") not in ("", "0")


def recompile_limit() -> int:
    raw = os.environ.get("GRAPHC_RECOMPILE_LIMIT", "8")
    limit = int(raw) if raw.strip().isdigit() else 0
    if limit < 1:
        raise ArgumentError(
            "GRAPHC_RECOMPILE_LIMIT: expected a positive integer (how many times one compiled "
            f"callable may trace), got {raw!r}; set it to e.g. 16, or unset it for the default 8"
        )
    return limit


def cuda_emu_checking() -> bool:
    """Whether GRAPHC_EMU_RACECHECK or GRAPHC_EMU_SCHEDULE asks for an emulation checking mode
    (their values are the emulation library's to check: it fails a launch on one it does not
    understand)."""
    race = os.environ.get("GRAPHC_EMU_RACECHECK", "").strip()
    schedule = os.environ.get("GRAPHC_EMU_SCHEDULE", "").strip()
    return race not in ("", "0") or schedule not in ("", "in-order")


def cache_dir() -> str:
    """The on-disk cache root: GRAPHC_CACHE_DIR, else the user cache directory + `graphc`."""
    explicit = os.environ.get("GRAPHC_CACHE_DIR")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "graphc")


CACHE_MAX_BYTES = 1 << 30


def cache_max_bytes() -> int:
    """GRAPHC_CACHE_MAX_BYTES (default 1 GiB): an integer of bytes, or with a K/M/G suffix."""
    raw = os.environ.get("GRAPHC_CACHE_MAX_BYTES", "").strip()
    if not raw:
        return CACHE_MAX_BYTES
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(raw[-1:].upper(), 1)
    try:
        value = int(raw[:-1] if scale > 1 else raw) * scale
    except ValueError:
        value = -1
    if value < 0:
        raise ArgumentError(f"GRAPHC_CACHE_MAX_BYTES: expected a size in bytes such as "
                            f"500M or 2G, got {raw!r}; unset it for the default 1G")
    return value


def compile_workers() -> int | None:
    """GRAPHC_COMPILE_WORKERS: the most processes compiling one module, or None (unset)."""
    raw = os.environ.get("GRAPHC_COMPILE_WORKERS", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ArgumentError(f"GRAPHC_COMPILE_WORKERS: expected a positive integer (processes "
                            f"compiling one module at once), got {raw!r}; 1 compiles in this "
                            f"process only")
    return int(raw)


def cuda_kind() -> str:
    """"emu" or "cuda", from GRAPHC_CUDA (unset: "cuda"); anything else is an error."""
    value = os.environ.get("GRAPHC_CUDA", "").strip().lower()
    if value in ("", "cuda", "gpu"):
        return "cuda"
    if value in ("emu", "emulation"):
        return "emu"
    raise GraphcError(f"cuda backend: GRAPHC_CUDA={value!r} is not understood; expected "
                      "\"emu\" (the CPU emulation) or \"cuda\" (a GPU), or leave it unset")


def cuda_all_opinfo() -> bool:
    """Whether GRAPHC_CUDA_ALL_OPINFO asks the cuda OpInfo test for every entry."""
    return os.environ.get("GRAPHC_CUDA_ALL_OPINFO", "") not in ("", "0")


def blas_threads() -> str:
    """GRAPHC_BLAS_THREADS: "shared" (default) or "native"."""
    raw = os.environ.get("GRAPHC_BLAS_THREADS", "shared").strip().lower() or "shared"
    if raw not in ("shared", "native"):
        raise ArgumentError(f"GRAPHC_BLAS_THREADS: expected 'shared' or 'native', got {raw!r}; "
                            "unset it for the default (shared)")
    return raw


def blas_choice() -> str:
    """GRAPHC_BLAS: "auto" (default), "openblas" or "mkl"."""
    raw = os.environ.get("GRAPHC_BLAS", "auto").strip().lower() or "auto"
    if raw not in ("auto", "openblas", "mkl"):
        raise ArgumentError(f"GRAPHC_BLAS: expected 'auto', 'openblas' or 'mkl' (which BLAS "
                            f"the cpu backend's GEMMs call), got {raw!r}; unset it for the "
                            "default (auto: MKL where the mkl package is installed)")
    return raw


# libgomp's threads spin this many rounds (some hundred microseconds) after a parallel region
# before they sleep: enough to catch the next kernel of the same step, short enough that the
# core is soon free for other work.
OPENMP_SPIN_COUNT = "20000"
_openmp_waiting: list[str] = []  # what holds, decided by the first call


def set_openmp_waiting() -> str:
    """Set GOMP_SPINCOUNT to OPENMP_SPIN_COUNT unless the user set it (see the module
    docstring); returns which spin count the process's libgomp has: graphc's, the user's, or,
    when libgomp was loaded before graphc's first call (PyTorch imported before graphc), its
    loader's."""
    if not _openmp_waiting:
        import ctypes

        user = os.environ.get("GOMP_SPINCOUNT")
        try:
            ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
            loaded = True
        except (OSError, AttributeError):
            loaded = False
        if user is not None:
            _openmp_waiting.append(f"the user's GOMP_SPINCOUNT={user}")
        elif loaded:
            _openmp_waiting.append(
                "libgomp's own default (about 300,000 rounds): it was loaded before graphc "
                "could set GOMP_SPINCOUNT (e.g. `import torch` before `import graphc`); set "
                f"GOMP_SPINCOUNT={OPENMP_SPIN_COUNT} before starting Python for graphc's")
        else:
            os.environ["GOMP_SPINCOUNT"] = OPENMP_SPIN_COUNT
            _openmp_waiting.append(f"graphc's GOMP_SPINCOUNT={OPENMP_SPIN_COUNT}")
    return _openmp_waiting[0]
