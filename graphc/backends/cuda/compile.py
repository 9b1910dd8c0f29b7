"""compile: one generated CUDA C source per graph -> a loaded runtime module, cached on disk.

`load_module(rt, source)` returns a `Module` (the `gc_module` handle and a `function(name)`
lookup) for the runtime `rt`:
- emulation (`rt.kind == "emulation"`): `g++ -O1 -shared -fPIC -x c++ -include gc_emu.h`
  linked with libgraphc_rt_emu.so -> a shared object; the header is precompiled once per
  cache folder (graphc.backends.cuda.emu_pch), which halves a small graph's compile; in the
  emulation's checking modes (graphc.config.cuda_emu_checking) also `EMU_CHECKED_FLAGS`, so
  the kernels' memory accesses reach its race checker and random schedule;
- CUDA: `nvcc -fatbin` of the source for the device `rt` runs on: SASS for its exact
  architecture (`sm_<major><minor>`, so loading runs no ptxas and needs no PTX JIT from the
  driver) plus that architecture's PTX (`compute_<major><minor>`, for a driver to JIT on a
  newer device); NVRTC is not used: nvcc is what the runtime build needs anyway. The
  fatbinary is cached like every object, keyed by the source's hash and the architecture, so
  a process pays nvcc and ptxas once per graph and device kind, not at every start.
Invariants of the cache (under `graphc.config.cache_dir()/cuda-<format>`):
- the key is the sha256 of (source, compiler command and `--version` text, the emulation
  header's bytes, graphc's version, the cache format), so a change of any of them misses;
- entries are graphc.backends.cache's `DiskCache` entries (the one format of every backend:
  a length and sha256 header, one file published with one atomic rename); an entry that
  does not verify, or whose object the runtime refuses to load, is deleted and rebuilt
  (once). The runtime loads a module from a file, so a verified object is copied into a
  folder of this process (removed at exit) and loaded from there;
- compiles of one key in one process are serialised; a failed compile raises
  `CudaCompileError` with the command and the compiler's messages;
- a cache folder that cannot be written costs only speed: the precompiled header goes to
  this process's folder and nothing is stored, with one warning per process.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings

from graphc import config
from graphc.backends.cache import DiskCache
from graphc.backends.cuda import emu_pch
from graphc.backends.cuda.build import build_dir, emu_header
from graphc.backends.cuda.rt import CudaRuntimeError, Runtime
from graphc.errors import GraphcError
from graphc.version import __version__ as GRAPHC_VERSION

CACHE_FORMAT = "cuda-2"  # cuda-1 kept an object and a .sha256 file: two renames
_CACHES = {suffix: DiskCache(CACHE_FORMAT, suffix) for suffix in (".so", ".fatbin")}
_guard = threading.Lock()


class CudaCompileError(GraphcError, RuntimeError):
    """The generated source did not compile (or the compiler is missing)."""


def cache_folder() -> str:
    return _CACHES[".so"].folder


def cache_stats() -> dict:
    """This process's cache hits, misses and corrupt entries rebuilt."""
    return {event: sum(cache.stats[event] for cache in _CACHES.values())
            for event in ("hits", "misses", "corrupt")}


@functools.lru_cache(maxsize=None)
def _compiler_version(compiler: str) -> str:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                              check=False)
    except OSError:
        return ""
    return done.stdout + done.stderr


# g++'s ThreadSanitizer instrumentation calls the emulation library's own __tsan_* hooks;
# -nodefaultlibs (then the usual libraries by name) keeps ThreadSanitizer's runtime out
EMU_CHECKED_FLAGS = ("-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0", "-g1")
EMU_CHECKED_LIBS = ("-nodefaultlibs", "-lstdc++", "-lm", "-lgcc_s", "-lgcc", "-lc")


def _emu_command(source_path: str, out_path: str, header: str) -> list[str]:
    checked = config.cuda_emu_checking()
    return ["g++", *emu_pch.FLAGS, *(EMU_CHECKED_FLAGS if checked else ()), "-shared", "-x",
            "c++", "-include", header, source_path, "-o", out_path, f"-L{build_dir()}",
            "-lgraphc_rt_emu", f"-Wl,-rpath,{build_dir()}",
            *(EMU_CHECKED_LIBS if checked else ())]


def _cuda_flags(arch: str) -> list[str]:
    """nvcc's flags for `arch` ("sm_90"): a fatbinary of its SASS and its PTX."""
    number = arch.removeprefix("sm_")
    return ["-fatbin", "-O3", f"-gencode=arch=compute_{number},code=[sm_{number},"
            f"compute_{number}]"]


def _cuda_command(source_path: str, out_path: str, arch: str) -> list[str]:
    return ["nvcc", *_cuda_flags(arch), "-x", "cu", source_path, "-o", out_path]


def _device_arch(rt: Runtime) -> str:
    name = ctypes.create_string_buffer(256)
    major, minor = ctypes.c_int32(), ctypes.c_int32()
    memory, sms = ctypes.c_int64(), ctypes.c_int32()
    rt.gc_device_properties(0, name, 256, ctypes.byref(major), ctypes.byref(minor),
                            ctypes.byref(memory), ctypes.byref(sms))
    return f"sm_{major.value}{minor.value}"


def _toolchain(rt: Runtime) -> tuple[str, str, str, bytes]:
    """(compiler, arch, suffix, extra key bytes) for the runtime's kind."""
    if rt.kind == "emulation":
        if shutil.which("g++") is None:
            raise CudaCompileError("cuda backend (emulation): g++ is not on PATH; install g++ "
                                   "to compile generated kernels")
        try:
            with open(emu_header(), "rb") as f:
                header = f.read()
        except OSError as error:
            raise CudaCompileError(f"cuda backend (emulation): cannot read the emulation "
                                   f"header {emu_header()}: {error}") from None
        return "g++", "emulation", ".so", header
    if shutil.which("nvcc") is None:
        raise CudaCompileError("cuda backend: nvcc is not on PATH; install the CUDA toolkit "
                               "to compile generated kernels")
    arch = _device_arch(rt)
    return "nvcc", arch, ".fatbin", " ".join(_cuda_flags(arch)).encode()


def cache_key(rt: Runtime, source: str) -> str:
    compiler, arch, _, extra = _toolchain(rt)
    parts = [source.encode(), compiler.encode(), arch.encode(),
             _compiler_version(compiler).encode(), extra, GRAPHC_VERSION.encode(),
             CACHE_FORMAT.encode()]
    if rt.kind == "emulation" and config.cuda_emu_checking():
        parts.append(b"emu-checked")  # instrumented objects: EMU_CHECKED_FLAGS
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


class Module:
    """A loaded generated module; `function(name)` -> gc_function handle (an int)."""

    def __init__(self, rt: Runtime, path: str, key: str, from_cache: bool) -> None:
        self.rt, self.path, self.key, self.from_cache = rt, path, key, from_cache
        handle = ctypes.c_void_p()
        rt.gc_module_load(ctypes.byref(handle), path.encode())
        self.handle = handle.value

    def function(self, name: str) -> int:
        fn = ctypes.c_void_p()
        self.rt.gc_module_function(ctypes.byref(fn), self.handle, name.encode())
        return fn.value

    def __del__(self) -> None:
        handle, self.handle = getattr(self, "handle", None), None
        if handle:
            try:
                self.rt.gc_module_unload(handle)
            except Exception:  # noqa: BLE001 (interpreter shutdown: nothing to report to)
                pass


def load_module(rt: Runtime, source: str, name: str = "graph") -> Module:
    """Compile (or find in the cache) and load `source` (see the module docstring)."""
    key = cache_key(rt, source)
    _, _, suffix, _ = _toolchain(rt)
    cache = _CACHES[suffix]
    with cache.lock(key):
        data = cache.read(key)
        if data is not None:
            try:
                module = Module(rt, _loadable(key, suffix, data), key, True)
                cache.count("hits")
                return module
            except CudaRuntimeError:
                cache.discard(key)  # a corrupt object that passed the digest check: rebuild
        cache.count("misses")
        data = _compile(rt, source, name, suffix, _writable(cache.folder))
        cache.write(key, data)
        return Module(rt, _loadable(key, suffix, data), key, False)


_fallback: list[str] = []  # this process's folder (loaded module copies, an unwritable cache)
_warned: list[str] = []  # the unwritable cache folder warned about, once per process


def _process_folder() -> str:
    with _guard:
        if not _fallback:
            _fallback.append(tempfile.mkdtemp(prefix="graphc-cuda-cache-"))
            atexit.register(shutil.rmtree, _fallback[0], True)
        return _fallback[0]


def _loadable(key: str, suffix: str, data: bytes) -> str:
    """A file of this process holding the verified object `data`, for the runtime to load."""
    fd, path = tempfile.mkstemp(dir=_process_folder(), prefix=key[:16] + ".", suffix=suffix)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _writable(folder: str) -> str:
    """`folder` when a file can be created in it, else this process's folder."""
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
        return folder
    except OSError as error:
        reason = error
    fallback = _process_folder()
    with _guard:
        if not _warned:
            _warned.append(folder)
            warnings.warn(f"graphc cuda backend: the kernel cache folder {folder} cannot be "
                          f"written ({reason}); compiling into {fallback} for this "
                          "process instead (nothing is reused across runs); set "
                          "GRAPHC_CACHE_DIR to a writable folder", RuntimeWarning,
                          stacklevel=4)
    return fallback


def _compile(rt: Runtime, source: str, name: str, suffix: str, folder: str) -> bytes:
    """The compiled object of `source` (`folder` holds the precompiled emulation header)."""
    with tempfile.TemporaryDirectory(prefix="graphc-cuda-") as work:
        src = os.path.join(work, f"{name}.cu")
        obj = os.path.join(work, "module" + suffix)
        with open(src, "w") as f:
            f.write(source)
        if rt.kind == "emulation":
            _, _, _, header = _toolchain(rt)
            command = _emu_command(src, obj, emu_pch.header_for(
                folder, header, _compiler_version("g++")))
        else:
            command = _cuda_command(src, obj, _device_arch(rt))
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise CudaCompileError(f"cuda backend: compiling the kernels of graph @{name} "
                                   f"failed ({' '.join(command)}):\n"
                                   f"{(done.stdout + done.stderr)[-4000:]}")
        with open(obj, "rb") as f:
            return f.read()


__all__ = ["CACHE_FORMAT", "CudaCompileError", "Module", "cache_folder", "cache_key",
           "cache_stats", "load_module"]
