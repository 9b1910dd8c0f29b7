"""The CUDA runtime library's infrastructure: its builds, its emulation, its C tests.

Builds go through tests/cuda_support.py (make, once per session, under a file lock). The
C/C++ programs of runtime/csrc/tests run under AddressSanitizer via `make check`; the fault
program is also run here to read the partial-barrier message and ASan's out-of-bounds report.
A generated kernel module (g++ against gc_emu.h, as the cuda backend builds them) is loaded
and launched through gc_module_load / gc_module_function / gc_launch with plain ctypes.
Cost from a clean build (CPU seconds, halved in wall time by make -j2 on 2 idle cores):
emulation 7 s, ASan library and C tests 19 s, `make cuda` 24 s; with the libraries built
(CI runs make first) the tests take about 3 s.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.cuda_support import RUNTIME_BUILD, RUNTIME_SOURCE, run_make, runtime_library

GC_SUCCESS = 0
GC_ERROR_INVALID_ARGUMENT = 1
GC_ERROR_NO_DEVICE = 3
GC_ERROR_EMULATION = 8
GC_ERROR_MODULE = 9
ABI_VERSION = 2  # graphc_rt.h: 2 added transfer counters, pinned memory, CUDA graphs, device reset
FAULT_PROGRAM = RUNTIME_BUILD / "asan" / "tests" / "test_emu_faults"

GENERATED_MODULE = r"""
extern "C" __global__ void scale_rows(const float *x, float *y, long long cols, float factor) {
    long long i = (long long)blockIdx.x * cols + threadIdx.x;
    if (threadIdx.x < cols) y[i] = factor * x[i];
}
GC_EMU_EXPORT(scale_rows)

extern "C" __global__ void half_barrier(float *y) {
    if (threadIdx.x % 2) return;
    __syncthreads();
    y[threadIdx.x] = 1.0f;
}
GC_EMU_EXPORT(half_barrier)
"""


def load(path: str) -> ctypes.CDLL:
    library = ctypes.CDLL(path)
    library.gc_runtime_kind.restype = ctypes.c_char_p
    library.gc_last_error.restype = ctypes.c_char_p
    library.gc_status_string.restype = ctypes.c_char_p
    library.gc_status_string.argtypes = [ctypes.c_int]
    library.gc_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64]
    library.gc_device_count.argtypes = [ctypes.POINTER(ctypes.c_int32)]
    return library


@pytest.fixture(scope="module")
def emu() -> ctypes.CDLL:
    return load(runtime_library("emu"))


@pytest.fixture(scope="module")
def fault_program() -> Path:
    if shutil.which("g++") is None:
        pytest.skip("g++ is not on PATH: the AddressSanitizer test programs cannot be built")
    result = run_make("asan-tests")
    assert result.returncode == 0, f"make asan-tests failed:\n{result.stdout}\n{result.stderr}"
    return FAULT_PROGRAM


def test_emu_library_abi_kind_and_last_error(emu):
    assert emu.gc_abi_version() == ABI_VERSION
    assert emu.gc_runtime_kind() == b"emulation"
    assert emu.gc_status_string(GC_ERROR_EMULATION).startswith(b"GC_ERROR_EMULATION")
    pointer = ctypes.c_void_p()
    assert emu.gc_malloc(ctypes.byref(pointer), -5) == GC_ERROR_INVALID_ARGUMENT
    assert emu.gc_last_error() == b"gc_malloc: bytes is -5; expected >= 0"


def test_make_check_runs_every_c_test_under_asan():
    if shutil.which("g++") is None:
        pytest.skip("g++ is not on PATH: `make check` cannot build the C tests")
    result = run_make("check")
    assert result.returncode == 0, f"make check failed:\n{result.stdout}\n{result.stderr}"
    assert "test_runtime: all checks passed" in result.stdout
    assert "test_emu_faults: all faults reported" in result.stdout
    assert "check: all passed" in result.stdout


def test_partial_barrier_is_reported_not_hung(fault_program):
    result = subprocess.run([str(fault_program), "partial_barrier"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "GC_ERROR_EMULATION" in result.stdout
    assert ("kernel partial_barrier block (1,0,0): __syncthreads() reached by 40 of 64 threads"
            in result.stdout)


def test_out_of_bounds_device_write_is_caught_by_asan(fault_program):
    result = subprocess.run([str(fault_program), "oob"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0, "the out-of-bounds write went unnoticed"
    assert "AddressSanitizer: heap-buffer-overflow" in result.stderr
    assert "fill_one_too_many" in result.stderr  # the report points into the kernel
    assert "0 bytes to the right of 400-byte region" in result.stderr


def build_generated_module(tmp_path: Path, library: str) -> Path:
    source = tmp_path / "generated.cu"
    source.write_text(GENERATED_MODULE)
    module = tmp_path / "generated.so"
    command = [
        "g++", "-std=c++17", "-O1", "-fPIC", "-shared", "-x", "c++",
        "-include", str(RUNTIME_SOURCE / "emu" / "gc_emu.h"),
        "-I", str(RUNTIME_SOURCE / "include"), str(source),
        "-L", str(Path(library).parent), "-lgraphc_rt_emu", f"-Wl,-rpath,{Path(library).parent}",
        "-o", str(module),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return module


def test_generated_module_loads_and_launches(emu, tmp_path):
    module_path = build_generated_module(tmp_path, runtime_library("emu"))
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    assert emu.gc_module_load(ctypes.byref(module), str(module_path).encode()) == GC_SUCCESS
    status = emu.gc_module_function(ctypes.byref(function), module, b"scale_rows")
    assert status == GC_SUCCESS, emu.gc_last_error()

    rows, cols = 3, 40
    x = np.arange(rows * cols, dtype=np.float32)
    y = np.zeros_like(x)
    arguments = [ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data),
                 ctypes.c_int64(cols), ctypes.c_float(2.5)]
    argv = (ctypes.c_void_p * 4)(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p)
                                   for a in arguments])
    grid, block = (ctypes.c_int64 * 3)(rows, 1, 1), (ctypes.c_int64 * 3)(64, 1, 1)
    assert emu.gc_launch(function, grid, block, ctypes.c_int64(0), argv, None) == GC_SUCCESS
    np.testing.assert_array_equal(y, 2.5 * x)

    bad_block = (ctypes.c_int64 * 3)(2048, 1, 1)
    status = emu.gc_launch(function, grid, bad_block, ctypes.c_int64(0), argv, None)
    assert status == GC_ERROR_INVALID_ARGUMENT
    assert b"scale_rows: block (2048, 1, 1)" in emu.gc_last_error()

    assert emu.gc_module_function(ctypes.byref(function), module, b"half_barrier") == GC_SUCCESS
    argv = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(arguments[1]), ctypes.c_void_p))
    status = emu.gc_launch(function, grid, block, ctypes.c_int64(0), argv, None)
    assert status == GC_ERROR_EMULATION
    assert b"reached by 32 of 64 threads" in emu.gc_last_error()

    assert emu.gc_module_function(ctypes.byref(function), module, b"missing") == GC_ERROR_MODULE
    assert b"GC_EMU_EXPORT(missing)" in emu.gc_last_error()
    assert emu.gc_module_unload(module) == GC_SUCCESS
    assert emu.gc_module_load(ctypes.byref(module), b"/nonexistent.so") == GC_ERROR_MODULE


def test_cuda_build_compiles_and_reports_a_missing_device():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH: the CUDA build cannot be checked here")
    # the emulation library loaded RTLD_GLOBAL first (as for generated modules) must not
    # capture the CUDA library's own gc_fail: each binds its own symbols (-Bsymbolic)
    ctypes.CDLL(runtime_library("emu"), mode=ctypes.RTLD_GLOBAL)
    cuda = load(runtime_library("cuda"))
    assert cuda.gc_abi_version() == ABI_VERSION
    assert cuda.gc_runtime_kind() == b"cuda"
    count = ctypes.c_int32(-1)
    status = cuda.gc_device_count(ctypes.byref(count))
    if status == GC_SUCCESS:
        assert count.value >= 1
    else:
        assert status == GC_ERROR_NO_DEVICE
        assert count.value == 0
        assert b"no usable CUDA device or driver" in cuda.gc_last_error()


_PROVIDER = """
import ctypes, sys
library = ctypes.CDLL(sys.argv[1])
provider = library.gc_gemm_provider
provider.restype = ctypes.c_char_p
provider.argtypes = [ctypes.c_int32, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
for tf32, k in ((0, 256), (0, 8), (1, 256)):
    print(provider(tf32, 512, 512, k).decode())
"""


@pytest.mark.parametrize("libs", ["auto", "0"])
def test_cuda_build_says_which_gemm_runs(libs, monkeypatch):
    """The CUDA build dlopens cuBLAS at its first GEMM where the process can load it and
    says so (gc_gemm_provider); without it, or with GRAPHC_CUDA_LIBS=0, graphc's kernels run
    and the answer says why. Run in a child process: the choice is made once per process."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH: the CUDA build cannot be checked here")
    path = runtime_library("cuda")
    if libs == "0":
        monkeypatch.setenv("GRAPHC_CUDA_LIBS", "0")
    else:
        monkeypatch.delenv("GRAPHC_CUDA_LIBS", raising=False)
    result = subprocess.run(["python", "-c", _PROVIDER, path], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    if libs == "0":
        assert lines == [
            f"graphc {kernel} (cuBLAS not used: GRAPHC_CUDA_LIBS=0 forces graphc's kernels)"
            for kernel in ("SIMT tile kernel, 3-stage cp.async pipeline",
                           "SIMT tile kernel, register double buffering",
                           "wmma TF32 tensor-core kernel")]
    elif lines[0].startswith("cuBLAS from libcublas"):  # a machine with cuBLAS on its path
        assert lines == [lines[0]] * 3
    else:
        assert lines[0].startswith("graphc SIMT tile kernel, 3-stage cp.async pipeline "
                                   "(cuBLAS not found (")
        assert "graphc's kernels run every GEMM" in lines[2]
