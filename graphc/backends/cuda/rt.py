"""rt: the ctypes binding of graphc's CUDA runtime library (the only ctypes module here).

`runtime_library()` loads the library once per process and kind and returns a `Runtime`,
whose attributes are the C functions of `runtime/csrc/include/graphc_rt.h` with their
declared signatures: a call returns None (or the declared value for the few functions that
do not return a gc_status) and raises a `CudaRuntimeError` subclass, carrying
`gc_last_error()`'s text, when the status is not GC_SUCCESS.

Invariants:
- `SIGNATURES` holds every `gc_` function of graphc_rt.h, in header order, as
  (name, restype, [(argument name, ctypes type), ...]); tests/test_cuda_rt.py parses the
  header and checks this table, the enums and the structs against it (the header is the
  source of truth). Mapping: int32_t/enums -> c_int32, int64_t -> c_int64, float/double as
  themselves, `const char *` -> c_char_p, `char *` (a buffer filled by the callee) ->
  POINTER(c_char), struct pointers -> POINTER(struct), every other pointer or handle ->
  c_void_p (device addresses travel as ints; out-parameters as `ctypes.byref`).
- Library choice (`GRAPHC_CUDA`): "emu" -> `runtime/build/libgraphc_rt_emu.so` (CUDA threads
  as fibers on the host; `runtime/build/emu-checked/` in the emulation's checking modes,
  graphc.config.cuda_emu_checking); unset or "cuda" -> `runtime/build/libgraphc_rt.so`,
  which needs a CUDA driver and at least one device (`gc_device_count`). A library not built
  yet is built on first use (`graphc.backends.cuda.build.build_runtime`, a message on stderr
  first).
- The ABI version of the loaded library must equal `ABI_VERSION`.
- The CUDA build checks the driver before anything else (`check_driver`): its static CUDA
  runtime needs a driver of at least the toolkit's major version (CUDA 12: R525, 13: R580),
  and an older one would otherwise look like "no device".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
import threading
from ctypes import POINTER, c_char, c_char_p, c_double, c_float, c_int32, c_int64, c_void_p

from graphc.errors import GraphcError

ABI_VERSION = 2
GC_EMU_ENTRY_SUFFIX = "__gc_emu_entry"

# ---- enums (values as in graphc_rt.h) -------------------------------------------------------
STATUS = {
    "GC_SUCCESS": 0, "GC_ERROR_INVALID_ARGUMENT": 1, "GC_ERROR_OUT_OF_MEMORY": 2,
    "GC_ERROR_NO_DEVICE": 3, "GC_ERROR_LAUNCH": 4, "GC_ERROR_CUDA": 5,
    "GC_ERROR_NOT_SUPPORTED": 6, "GC_ERROR_WORKSPACE": 7, "GC_ERROR_EMULATION": 8,
    "GC_ERROR_MODULE": 9, "GC_ERROR_DEVICE_LOST": 10,
}
CONV2D_PASS = {"GC_CONV2D_FWD_IM2COL": 0, "GC_CONV2D_FWD_IMPLICIT": 1,
               "GC_CONV2D_BWD_DATA": 2, "GC_CONV2D_BWD_FILTER": 3}
REDUCTION = {"GC_REDUCTION_NONE": 0, "GC_REDUCTION_MEAN": 1, "GC_REDUCTION_SUM": 2}
REDUCE_OP = {"GC_REDUCE_SUM": 0, "GC_REDUCE_MEAN": 1, "GC_REDUCE_MAX": 2, "GC_REDUCE_MIN": 3,
             "GC_REDUCE_PROD": 4}
ENUMS = {"gc_status": STATUS, "gc_conv2d_pass": CONV2D_PASS, "gc_reduction": REDUCTION,
         "gc_reduce_op": REDUCE_OP}


# ---- structs --------------------------------------------------------------------------------
class Conv2dDesc(ctypes.Structure):
    """gc_conv2d_desc."""

    _fields_ = [(name, c_int64) for name in (
        "n", "c_in", "h", "w", "c_out", "kh", "kw", "stride_h", "stride_w", "pad_h", "pad_w",
        "dilation_h", "dilation_w", "groups", "out_h", "out_w")]


class Pool2dDesc(ctypes.Structure):
    """gc_pool2d_desc."""

    _fields_ = [(name, c_int64) for name in (
        "planes", "h", "w", "out_h", "out_w", "kh", "kw", "stride_h", "stride_w", "pad_h",
        "pad_w", "dilation_h", "dilation_w")] + [("count_include_pad", c_int32),
                                                 ("divisor_override", c_int64)]


STRUCTS = {"gc_conv2d_desc": Conv2dDesc, "gc_pool2d_desc": Pool2dDesc}

# ---- the signature table --------------------------------------------------------------------
STATUS_T = c_int32  # gc_status is returned as an int
ENUM_T = c_int32
P = c_void_p
CONV = POINTER(Conv2dDesc)
POOL = POINTER(Pool2dDesc)

SIGNATURES: list[tuple[str, type, list[tuple[str, type]]]] = [
    ("gc_abi_version", c_int32, []),
    ("gc_runtime_kind", c_char_p, []),
    ("gc_status_string", c_char_p, [("status", ENUM_T)]),
    ("gc_last_error", c_char_p, []),
    ("gc_device_count", STATUS_T, [("count", P)]),
    ("gc_set_device", STATUS_T, [("device", c_int32)]),
    ("gc_device_properties", STATUS_T, [
        ("device", c_int32), ("name", POINTER(c_char)), ("capacity", c_int64), ("major", P),
        ("minor", P), ("total_memory_bytes", P), ("multiprocessor_count", P)]),
    ("gc_device_synchronize", STATUS_T, []),
    ("gc_driver_version", STATUS_T, [("driver", P), ("runtime", P)]),
    ("gc_device_reset", STATUS_T, []),
    ("gc_malloc", STATUS_T, [("ptr", P), ("bytes", c_int64)]),
    ("gc_free", STATUS_T, [("ptr", P)]),
    ("gc_memcpy_h2d", STATUS_T, [("dst", P), ("src", P), ("bytes", c_int64), ("stream", P)]),
    ("gc_memcpy_d2h", STATUS_T, [("dst", P), ("src", P), ("bytes", c_int64), ("stream", P)]),
    ("gc_memcpy_d2d", STATUS_T, [("dst", P), ("src", P), ("bytes", c_int64), ("stream", P)]),
    ("gc_memset", STATUS_T, [("dst", P), ("byte_value", c_int32), ("bytes", c_int64),
                             ("stream", P)]),
    ("gc_host_alloc", STATUS_T, [("ptr", P), ("bytes", c_int64)]),
    ("gc_host_free", STATUS_T, [("ptr", P)]),
    ("gc_transfer_bytes", STATUS_T, [("h2d_bytes", P), ("d2h_bytes", P)]),
    ("gc_transfer_bytes_reset", STATUS_T, []),
    ("gc_stream_create", STATUS_T, [("stream", P)]),
    ("gc_stream_destroy", STATUS_T, [("stream", P)]),
    ("gc_stream_synchronize", STATUS_T, [("stream", P)]),
    ("gc_event_create", STATUS_T, [("event", P)]),
    ("gc_event_destroy", STATUS_T, [("event", P)]),
    ("gc_event_record", STATUS_T, [("event", P), ("stream", P)]),
    ("gc_event_synchronize", STATUS_T, [("event", P)]),
    ("gc_event_elapsed_ms", STATUS_T, [("ms", P), ("start", P), ("end", P)]),
    ("gc_graph_begin_capture", STATUS_T, [("stream", P)]),
    ("gc_graph_end_capture", STATUS_T, [("graph", P), ("stream", P)]),
    ("gc_graph_launch", STATUS_T, [("graph", P), ("stream", P)]),
    ("gc_graph_destroy", STATUS_T, [("graph", P)]),
    ("gc_module_load", STATUS_T, [("module", P), ("path", c_char_p)]),
    ("gc_module_unload", STATUS_T, [("module", P)]),
    ("gc_module_function", STATUS_T, [("function", P), ("module", P), ("name", c_char_p)]),
    ("gc_launch", STATUS_T, [("function", P), ("grid", P), ("block", P),
                             ("shared_bytes", c_int64), ("args", P), ("stream", P)]),
    ("gc_gemm_f32", STATUS_T, [
        ("trans_a", c_int32), ("trans_b", c_int32), ("m", c_int64), ("n", c_int64),
        ("k", c_int64), ("alpha", c_float), ("a", P), ("lda", c_int64), ("b", P),
        ("ldb", c_int64), ("beta", c_float), ("c", P), ("ldc", c_int64), ("stream", P)]),
    ("gc_gemm_strided_batched_f32", STATUS_T, [
        ("trans_a", c_int32), ("trans_b", c_int32), ("m", c_int64), ("n", c_int64),
        ("k", c_int64), ("alpha", c_float), ("a", P), ("lda", c_int64), ("stride_a", c_int64),
        ("b", P), ("ldb", c_int64), ("stride_b", c_int64), ("beta", c_float), ("c", P),
        ("ldc", c_int64), ("stride_c", c_int64), ("batch", c_int64), ("stream", P)]),
    ("gc_gemm_tf32_f32", STATUS_T, [
        ("trans_a", c_int32), ("trans_b", c_int32), ("m", c_int64), ("n", c_int64),
        ("k", c_int64), ("alpha", c_float), ("a", P), ("lda", c_int64), ("b", P),
        ("ldb", c_int64), ("beta", c_float), ("c", P), ("ldc", c_int64), ("stream", P)]),
    ("gc_gemm_provider", c_char_p, [("tf32", c_int32), ("m", c_int64), ("n", c_int64),
                                    ("k", c_int64)]),
    ("gc_conv2d_check", STATUS_T, [("desc", CONV)]),
    ("gc_conv2d_workspace_size", STATUS_T, [("desc", CONV), ("pass", ENUM_T), ("bytes", P)]),
    ("gc_conv2d_fwd_f32", STATUS_T, [
        ("desc", CONV), ("pass", ENUM_T), ("x", P), ("weight", P), ("bias", P), ("y", P),
        ("workspace", P), ("workspace_bytes", c_int64), ("stream", P)]),
    ("gc_conv2d_bwd_data_f32", STATUS_T, [
        ("desc", CONV), ("dy", P), ("weight", P), ("dx", P), ("workspace", P),
        ("workspace_bytes", c_int64), ("stream", P)]),
    ("gc_conv2d_bwd_filter_f32", STATUS_T, [
        ("desc", CONV), ("x", P), ("dy", P), ("dweight", P), ("workspace", P),
        ("workspace_bytes", c_int64), ("stream", P)]),
    ("gc_conv2d_bwd_bias_f32", STATUS_T, [("desc", CONV), ("dy", P), ("dbias", P),
                                          ("stream", P)]),
    ("gc_conv2d_provider", c_char_p, [("desc", CONV), ("pass", ENUM_T)]),
    ("gc_max_pool2d_fwd_f32", STATUS_T, [("desc", POOL), ("x", P), ("y", P), ("indices", P),
                                         ("stream", P)]),
    ("gc_max_pool2d_bwd_f32", STATUS_T, [("desc", POOL), ("dy", P), ("indices", P),
                                         ("dx", P), ("stream", P)]),
    ("gc_avg_pool2d_fwd_f32", STATUS_T, [("desc", POOL), ("x", P), ("y", P), ("stream", P)]),
    ("gc_avg_pool2d_bwd_f32", STATUS_T, [("desc", POOL), ("dy", P), ("dx", P), ("stream", P)]),
    ("gc_softmax_fwd_f32", STATUS_T, [
        ("outer", c_int64), ("dim", c_int64), ("inner", c_int64), ("log", c_int32), ("x", P),
        ("y", P), ("stream", P)]),
    ("gc_softmax_bwd_f32", STATUS_T, [
        ("outer", c_int64), ("dim", c_int64), ("inner", c_int64), ("log", c_int32), ("y", P),
        ("dy", P), ("dx", P), ("stream", P)]),
    ("gc_nll_loss_fwd_f32", STATUS_T, [
        ("n", c_int64), ("classes", c_int64), ("inner", c_int64), ("x", P), ("target", P),
        ("weight", P), ("ignore_index", c_int64), ("reduction", ENUM_T), ("out", P),
        ("total_weight", P), ("bad_target", P), ("stream", P)]),
    ("gc_nll_loss_bwd_f32", STATUS_T, [
        ("n", c_int64), ("classes", c_int64), ("inner", c_int64), ("dy", P), ("target", P),
        ("weight", P), ("total_weight", P), ("ignore_index", c_int64), ("reduction", ENUM_T),
        ("dx", P), ("stream", P)]),
    ("gc_batch_norm_fwd_f32", STATUS_T, [
        ("n", c_int64), ("c", c_int64), ("hw", c_int64), ("training", c_int32),
        ("eps", c_double), ("x", P), ("weight", P), ("bias", P), ("running_mean", P),
        ("running_var", P), ("y", P), ("save_mean", P), ("save_invstd", P), ("stream", P)]),
    ("gc_batch_norm_bwd_f32", STATUS_T, [
        ("n", c_int64), ("c", c_int64), ("hw", c_int64), ("x", P), ("dy", P), ("weight", P),
        ("save_mean", P), ("save_invstd", P), ("dx", P), ("dweight", P), ("dbias", P),
        ("stream", P)]),
    ("gc_reduce_f32", STATUS_T, [
        ("op", ENUM_T), ("outer", c_int64), ("extent", c_int64), ("inner", c_int64), ("x", P),
        ("y", P), ("stream", P)]),
    ("gc_arg_reduce_f32", STATUS_T, [
        ("is_min", c_int32), ("outer", c_int64), ("extent", c_int64), ("inner", c_int64),
        ("x", P), ("y", P), ("stream", P)]),
    ("gc_fill_f32", STATUS_T, [("dst", P), ("value", c_float), ("count", c_int64),
                               ("stream", P)]),
    ("gc_axpy_f32", STATUS_T, [("count", c_int64), ("alpha", c_float), ("x", P), ("y", P),
                               ("stream", P)]),
    ("gc_copy_strided", STATUS_T, [
        ("ndim", c_int32), ("shape", P), ("src", P), ("src_strides", P), ("dst", P),
        ("element_bytes", c_int32), ("stream", P)]),
    ("gc_memcpy_d2d_batch", STATUS_T, [("dst", P), ("src", P), ("bytes", P), ("count", c_int64),
                                       ("stream", P)]),
]


# the functions that return something else than a gc_status (never checked)
NOT_STATUS = frozenset({"gc_abi_version", "gc_runtime_kind", "gc_status_string",
                        "gc_last_error", "gc_gemm_provider", "gc_conv2d_provider"})


# ---- errors ---------------------------------------------------------------------------------
class CudaRuntimeError(GraphcError, RuntimeError):
    """A graphc_rt call failed: `.function`, `.status` (its gc_status), the library's text."""

    def __init__(self, message: str, function: str = "", status: int = -1) -> None:
        super().__init__(message)
        self.function, self.status = function, status


class CudaInvalidArgumentError(CudaRuntimeError, ValueError):
    """GC_ERROR_INVALID_ARGUMENT (or GC_ERROR_WORKSPACE): the call's arguments are wrong."""


class CudaOutOfMemoryError(CudaRuntimeError, MemoryError):
    """GC_ERROR_OUT_OF_MEMORY."""


class CudaNoDeviceError(CudaRuntimeError):
    """No CUDA driver or device (GC_ERROR_NO_DEVICE, or found so before loading)."""


class CudaNotSupportedError(CudaRuntimeError, NotImplementedError):
    """GC_ERROR_NOT_SUPPORTED: valid, but this build does not implement it."""


class CudaModuleError(CudaRuntimeError):
    """GC_ERROR_MODULE: a generated module or one of its functions could not be loaded."""


class CudaEmulationError(CudaRuntimeError):
    """GC_ERROR_EMULATION: the emulation found a fault in a kernel (barrier, block size)."""


class CudaDeviceLostError(CudaRuntimeError):
    """GC_ERROR_DEVICE_LOST: a kernel faulted and the CUDA context is unusable (a sticky
    error) until `gc_device_reset`; everything on the device is lost with it."""


_ERROR_CLASSES = {1: CudaInvalidArgumentError, 2: CudaOutOfMemoryError, 3: CudaNoDeviceError,
                  6: CudaNotSupportedError, 7: CudaInvalidArgumentError, 8: CudaEmulationError,
                  9: CudaModuleError, 10: CudaDeviceLostError}
_STATUS_NAMES = {v: k for k, v in STATUS.items()}


# ---- the loaded library ---------------------------------------------------------------------
class Runtime:
    """One loaded graphc_rt library: `.kind` ("cuda"/"emulation"), `.path`, and one checked
    method per C function (`rt.gc_malloc(ctypes.byref(ptr), 256)`)."""

    def __init__(self, path: str) -> None:
        try:
            self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as error:
            raise CudaRuntimeError(f"cuda backend: cannot load the runtime library {path}: "
                                   f"{error}; rebuild it with `graphc build-runtime`") from None
        self.path = path
        self.raw: dict[str, ctypes._CFuncPtr] = {}
        self.missing: list[str] = []
        for name, restype, args in SIGNATURES:
            try:
                fn = getattr(self.lib, name)
            except AttributeError:  # a partial build: fails when (and only if) called
                self.missing.append(name)
                setattr(self, name, self._absent(name))
                continue
            fn.restype, fn.argtypes = restype, [t for _, t in args]
            self.raw[name] = fn
            setattr(self, name, self._plain(fn) if name in NOT_STATUS else
                    self._checked(name, fn))
        essential = [n for n in ("gc_abi_version", "gc_last_error", "gc_malloc") if n in
                     self.missing]
        if essential:
            raise CudaRuntimeError(f"cuda backend: {path} lacks {', '.join(essential)}; it is "
                                   "not a graphc_rt library; rebuild it with "
                                   "`graphc build-runtime`")
        version = self.raw["gc_abi_version"]()
        if version != ABI_VERSION:
            raise CudaRuntimeError(f"cuda backend: {path} has ABI version {version}, graphc "
                                   f"expects {ABI_VERSION}; rebuild it with "
                                   "`graphc build-runtime`")
        self.kind = self.raw["gc_runtime_kind"]().decode()

    def _absent(self, name: str):
        def call(*args):
            raise CudaNotSupportedError(f"cuda backend: {self.path} has no {name} (a partial "
                                        "build of the runtime); rebuild it with "
                                        "`graphc build-runtime`", name,
                                        STATUS["GC_ERROR_NOT_SUPPORTED"])
        return call

    @staticmethod
    def _plain(fn):
        def call(*args):
            result = fn(*args)
            return result.decode() if isinstance(result, bytes) else result
        return call

    def _checked(self, name: str, fn):
        def call(*args):
            status = fn(*args)
            if status:
                raise self.error(name, status)
        call.__name__ = name
        return call

    def error(self, function: str, status: int) -> CudaRuntimeError:
        """The exception for a failed call: its status name and gc_last_error()'s text."""
        text = (self.raw["gc_last_error"]() or b"").decode(errors="replace")
        cls = _ERROR_CLASSES.get(status, CudaRuntimeError)
        name = _STATUS_NAMES.get(status, f"status {status}")
        return cls(f"cuda backend: {function} failed with {name}: {text or '(no message)'}",
                   function, status)

    def __repr__(self) -> str:
        return f"Runtime({self.kind!r}, {self.path!r})"


def requested_kind() -> str:
    """"emu" or "cuda", from GRAPHC_CUDA (graphc.config.cuda_kind)."""
    from graphc import config

    return config.cuda_kind()


def library_path(kind: str) -> str:
    from graphc import config
    from graphc.backends.cuda.build import build_dir

    if kind == "emu" and config.cuda_emu_checking():  # kernels instrumented for the checks
        return os.path.join(build_dir(), "emu-checked", "libgraphc_rt_emu.so")
    name = "libgraphc_rt_emu.so" if kind == "emu" else "libgraphc_rt.so"
    return os.path.join(build_dir(), name)


_NO_DEVICE_HINT = ("set GRAPHC_CUDA=emu to run on the CPU emulation (built on first use, or "
                   "with `graphc build-runtime --emu`), or compile with backend=\"cpu\"")


def _cuda_driver_present() -> bool:
    for name in ("libcuda.so.1", ctypes.util.find_library("cuda")):
        if name:
            try:
                ctypes.CDLL(name)
                return True
            except OSError:
                continue
    return False


# the NVIDIA wheels whose libraries the runtime dlopens by soname: (module, file patterns)
VENDOR_WHEELS = (("nvidia.cublas", ("libcublasLt.so.*", "libcublas.so.*")),
                 ("nvidia.cudnn", ("libcudnn.so.*",)))


def _preload_vendor_libraries() -> None:
    """Loads the nvidia-cublas and nvidia-cudnn wheels' libraries (RTLD_GLOBAL), so the
    runtime's dlopen of libcublas.so.<major> at its first GEMM and of libcudnn.so.<major> at
    its first convolution finds them by soname (a pip-installed library is not on the
    loader's path; cuDNN finds its own sub-libraries beside itself); nothing for a wheel that
    is absent, nor with GRAPHC_CUDA_LIBS=0. A library the loader finds itself
    (LD_LIBRARY_PATH, the toolkit's lib64) needs none of this."""
    import importlib

    from graphc import config

    if not config.cuda_vendor_libs():
        return
    for module, patterns in VENDOR_WHEELS:
        try:
            wheel = importlib.import_module(module)
        except ImportError:
            continue
        for folder in getattr(wheel, "__path__", []):
            for pattern in patterns:
                for path in sorted(glob.glob(os.path.join(folder, "lib", pattern))):
                    try:
                        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                    except OSError:
                        continue


# the oldest driver branch of each CUDA major version (CUDA's release notes, "CUDA Toolkit
# and Minimum Required Driver Version for CUDA Minor Version Compatibility")
MIN_DRIVER_BRANCH = {11: "R450", 12: "R525", 13: "R580"}


def _cuda_version(value: int) -> str:
    return f"{value // 1000}.{value % 1000 // 10}"


def driver_problem(driver: int, runtime: int, path: str) -> str | None:
    """Why a library built with CUDA `runtime` cannot run on a driver supporting CUDA
    `driver` (both as cudaDriverGetVersion gives them: 1000 * major + 10 * minor), or None.
    Within one major version CUDA's minor-version compatibility holds for SASS, which the
    library (sm_80, sm_90) and the generated kernels (the device's own) carry."""
    if not runtime:  # the emulation
        return None
    if not driver:
        return (f"cuda backend: no NVIDIA driver on this machine (cudaDriverGetVersion gives "
                f"0); {_NO_DEVICE_HINT}")
    if driver // 1000 >= runtime // 1000:
        return None
    major = runtime // 1000
    return (f"cuda backend: the NVIDIA driver supports CUDA {_cuda_version(driver)}, but {path} "
            f"was built with CUDA {_cuda_version(runtime)}: its statically linked CUDA runtime "
            f"needs a driver for CUDA {major}.x ({MIN_DRIVER_BRANCH.get(major, 'a newer one')} "
            "or newer); with an older one every CUDA call fails as if there were no device. "
            "Update the NVIDIA driver, or rebuild the runtime with a CUDA "
            f"{driver // 1000}.x toolkit (that nvcc first on PATH, then `graphc build-runtime "
            f"--cuda`); or {_NO_DEVICE_HINT}")


def check_driver(rt: Runtime) -> None:
    """Raise CudaNoDeviceError when the driver is too old for the loaded library."""
    driver, runtime = c_int32(0), c_int32(0)
    try:
        rt.gc_driver_version(ctypes.byref(driver), ctypes.byref(runtime))
    except CudaNotSupportedError:  # a library older than the check: nothing to compare
        return
    problem = driver_problem(driver.value, runtime.value, rt.path)
    if problem:
        raise CudaNoDeviceError(problem, "gc_driver_version", STATUS["GC_ERROR_NO_DEVICE"])


_runtimes: dict[str, Runtime] = {}
_load_lock = threading.Lock()


def runtime_library(kind: str | None = None) -> Runtime:
    """The runtime for `kind` ("emu" or "cuda"; default: `requested_kind()`), loaded once."""
    kind = kind or requested_kind()
    with _load_lock:
        if kind in _runtimes:
            return _runtimes[kind]
        if kind == "cuda" and not _cuda_driver_present():
            raise CudaNoDeviceError(f"cuda backend: no CUDA device found (no CUDA driver, "
                                    f"libcuda.so.1, on this machine); {_NO_DEVICE_HINT}",
                                    "", STATUS["GC_ERROR_NO_DEVICE"])
        path = library_path(kind)
        if not os.path.exists(path):
            from graphc.backends.cuda.build import build_runtime

            print(f"graphc: building the CUDA runtime library ({kind}) into {path} "
                  "(once; `graphc build-runtime` does it ahead of time)", file=sys.stderr)
            build_runtime(kind)
        rt = Runtime(path)
        if kind == "cuda":
            check_driver(rt)
            _preload_vendor_libraries()
            count = c_int32(0)
            try:
                rt.gc_device_count(ctypes.byref(count))
            except CudaRuntimeError as error:
                raise CudaNoDeviceError(f"cuda backend: no CUDA device found ({error}); "
                                        f"{_NO_DEVICE_HINT}", "gc_device_count",
                                        error.status) from None
            if count.value < 1:
                raise CudaNoDeviceError(f"cuda backend: no CUDA device found "
                                        f"(gc_device_count is 0); {_NO_DEVICE_HINT}",
                                        "gc_device_count", STATUS["GC_ERROR_NO_DEVICE"])
        _runtimes[kind] = rt
        return rt


__all__ = ["ABI_VERSION", "CONV2D_PASS", "Conv2dDesc", "CudaDeviceLostError",
           "CudaEmulationError", "CudaInvalidArgumentError", "CudaModuleError",
           "CudaNoDeviceError", "CudaNotSupportedError", "CudaOutOfMemoryError",
           "CudaRuntimeError", "ENUMS", "MIN_DRIVER_BRANCH", "NOT_STATUS", "Pool2dDesc",
           "REDUCE_OP", "REDUCTION", "Runtime", "SIGNATURES", "STATUS", "STRUCTS", "check_driver",
           "driver_problem", "library_path", "requested_kind", "runtime_library"]
