"""The CUDA emulation's checking modes: racecheck and the random schedule (issue 18, item 8).

`GRAPHC_EMU_RACECHECK=1` reports racing shared/global memory accesses of instrumented kernels
as a launch failure; `GRAPHC_EMU_SCHEDULE=random:SEED` resumes CUDA threads in a seeded random
order and preempts them at memory accesses; both check that the lanes of a warp function make
the same call (runtime/csrc/README.md). The emulation reads the variables once per process,
so every check here runs in a subprocess:
- planted races are reported, naming the kernel, the memory, the threads and the source lines:
  in a C++ test kernel (runtime/csrc/tests/test_emu_racecheck.cpp, built instrumented against
  the checked library by `make racecheck-tests`) and in a generated-style module compiled by
  the cuda backend (graphc.backends.cuda.compile adds the instrumentation in these modes);
  the same kernels with their barrier are clean;
- every C++ test program of the runtime (the library's GEMM, convolution, pooling,
  normalisation, softmax/NLL and reduction kernels, instrumented) passes under both modes,
  with three seeds;
- a representative part of the cuda backend suite (generated elementwise, reduction,
  softmax, GEMM-epilogue kernels and a training step; the backend then loads the checked
  library, so its GEMM and other library kernels are checked too) passes under both modes,
  two seeds.
About 1 CPU-minute in all on top of the builds (the checked library, ~15 CPU-s).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.cuda_support import REPO_ROOT, RUNTIME_BUILD, run_make, runtime_library

CHECKED_TESTS = RUNTIME_BUILD / "emu-checked" / "tests"
PROGRAMS = ("test_kernels_gemm", "test_kernels_conv", "test_kernels_nn", "test_kernels_reduce",
            "test_runtime", "test_emu_faults")
SEEDS = (1, 2, 3)
TIMEOUT_S = 600


def _checking_env(seed: int | None = 1, race: str = "1", **extra: str) -> dict:
    env = dict(os.environ)
    env.update(GRAPHC_EMU_RACECHECK=race, GRAPHC_CUDA="emu")
    if seed is None:
        env.pop("GRAPHC_EMU_SCHEDULE", None)
    else:
        env["GRAPHC_EMU_SCHEDULE"] = f"random:{seed}"
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def checked_programs():
    runtime_library("emu")  # skips, naming the compiler, where g++ or make is missing
    result = run_make("racecheck-tests")
    if result.returncode != 0:
        raise RuntimeError(f"make racecheck-tests failed:\n{result.stdout[-3000:]}\n"
                           f"{result.stderr[-6000:]}")
    return CHECKED_TESTS


# ---- the planted race in a C++ test kernel --------------------------------------------------
def test_planted_race_in_a_test_kernel_is_reported(checked_programs):
    result = subprocess.run([str(checked_programs / "test_emu_racecheck"), "planted"],
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    report = result.stdout
    assert "GC_ERROR_EMULATION" in report
    assert "racy_block_sum test: racecheck: kernel racy_block_sum: read-write race on " \
           "__shared__ memory" in report
    # both sides: the store of one thread, the load of thread 0, with their source lines
    assert "write by thread (" in report and "read  by thread (0,0,0) of block (" in report
    assert "test_emu_racecheck.cpp:45" in report and "test_emu_racecheck.cpp:49" in report
    assert "no __syncthreads() orders them" in report


def test_checking_modes_find_every_planted_bug(checked_programs):
    """Shared, cross-block and intra-warp races, divergent warp calls, a shuffled order; the
    barrier-correct kernels, atomics and the library's block reduction stay clean."""
    result = subprocess.run([str(checked_programs / "test_emu_racecheck")], capture_output=True,
                            text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all planted bugs found, correct kernels clean" in result.stdout
    assert "kernel block_sum" not in result.stderr
    assert "kernel atomic_count" not in result.stderr


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("program", PROGRAMS)
def test_runtime_programs_pass_under_checking_modes(checked_programs, program, seed):
    result = subprocess.run([str(checked_programs / program)], capture_output=True, text=True,
                            timeout=TIMEOUT_S, env=_checking_env(seed))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "racecheck:" not in output, output[-6000:]


def test_a_mode_value_not_understood_fails_every_launch(checked_programs):
    env = _checking_env(None, GRAPHC_EMU_SCHEDULE="sometimes")
    result = subprocess.run([str(checked_programs / "test_kernels_reduce")],
                            capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    assert result.returncode != 0
    assert ("GRAPHC_EMU_SCHEDULE='sometimes' is not understood; expected random:SEED"
            in result.stdout + result.stderr)


# ---- a generated-style module, compiled by the cuda backend ---------------------------------
GENERATED = textwrap.dedent("""\
    #ifndef GC_EMULATION
    #define GC_EMU_EXPORT(name)
    #endif
    extern "C" __global__ void racy_sum(const float *x, float *out) {
        __shared__ float partial[64];
        partial[threadIdx.x] = x[threadIdx.x];
        if (threadIdx.x == 0) {
            float s = 0.0f;
            for (int i = 0; i < 64; ++i) s += partial[i];
            out[0] = s;
        }
    }
    GC_EMU_EXPORT(racy_sum)
    extern "C" __global__ void block_sum(const float *x, float *out) {
        __shared__ float partial[64];
        partial[threadIdx.x] = x[threadIdx.x];
        __syncthreads();
        if (threadIdx.x == 0) {
            float s = 0.0f;
            for (int i = 0; i < 64; ++i) s += partial[i];
            out[0] = s;
        }
    }
    GC_EMU_EXPORT(block_sum)
""")

LAUNCH_SCRIPT = textwrap.dedent("""\
    import ctypes, sys
    import numpy as np
    from graphc.backends.cuda import compile as cuda_compile
    from graphc.backends.cuda.rt import CudaEmulationError, runtime_library

    rt = runtime_library("emu")
    module = cuda_compile.load_module(rt, open(sys.argv[1]).read(), name="planted")
    x = np.ones(64, dtype=np.float32)
    out = np.zeros(1, dtype=np.float32)
    values = [ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(out.ctypes.data)]
    args = (ctypes.c_void_p * 2)(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
                                   for v in values])
    grid, block = (ctypes.c_int64 * 3)(1, 1, 1), (ctypes.c_int64 * 3)(64, 1, 1)
    for name in ("block_sum", "racy_sum"):
        try:
            rt.gc_launch(module.function(name), grid, block, 0, args, None)
            print(name, "clean", out[0])
        except CudaEmulationError as error:
            print(name, "FAULT", error)
""")


def test_planted_race_in_a_generated_module_is_reported(tmp_path):
    runtime_library("emu")
    source = tmp_path / "planted.cu"
    source.write_text(GENERATED)
    env = _checking_env(seed=None, GRAPHC_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-c", LAUNCH_SCRIPT, str(source)],
                            capture_output=True, text=True, timeout=TIMEOUT_S, env=env,
                            cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "block_sum clean 64.0", result.stdout + result.stderr
    assert lines[1].startswith("racy_sum FAULT"), result.stdout + result.stderr
    assert "racecheck: kernel racy_sum: read-write race on __shared__ memory" in lines[1]
    assert "planted.cu:" in result.stdout  # the generated source's line
    assert "no __syncthreads() orders them" in result.stdout


# ---- the cuda backend suite, in part ----------------------------------------------------------
# generated kernels of every kind (elementwise with broadcasting, block/warp reductions,
# softmax, a GEMM epilogue, scatters with atomics through the OpInfo entries) and the library
# calls of a training step; the whole suite takes minutes more under the checking modes
BACKEND_SELECTION = ("fused or matmul_epilogue or mlp_training or randperm or bad_index or "
                     "opinfo and (sum or mean or amax or softmax or argmax or index_put or "
                     "embedding or max_pool2d or layer_norm or where)")


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_cuda_backend_tests_pass_under_checking_modes(tmp_path, seed):
    runtime_library("emu")
    env = _checking_env(seed, GRAPHC_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("PYTEST_XDIST_WORKER", None)
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
               "-p", "no:randomly", "tests/test_cuda_backend.py", "-k", BACKEND_SELECTION]
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S,
                            env=env, cwd=REPO_ROOT)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    assert " passed" in result.stdout, output[-4000:]
    assert "racecheck:" not in output, output[-8000:]
