"""Test support for graphc's CUDA runtime library: builds it once per test session.

`runtime_library("emu")` returns the path of `runtime/build/libgraphc_rt_emu.so` (g++ only),
`runtime_library("cuda")` that of `runtime/build/libgraphc_rt.so` (needs nvcc), each built by
`make -C runtime/csrc <kind>` at most once per process. Builds run under an exclusive file lock
(pytest-xdist workers share the build directory); make itself skips what is up to date, so the
second worker only pays a no-op make. A missing compiler is a skip naming it; a failing build
is an error carrying make's output.

`cuda_test_kind()` is the library the cuda backend's tests run on: "emu" (the CPU emulation:
every machine, CI) unless GRAPHC_TEST_ON_GPU=1 asks for the GPU ("cuda";
benchmarks/gpu_check.sh sets it on a machine with one). Tests of the emulation itself (its
fault reports, checking modes, capture shim) name "emu" directly; `emulation_only` skips a
test whose claim holds only there when the run is on a GPU.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
RUNTIME_SOURCE = REPO_ROOT / "runtime" / "csrc"
RUNTIME_BUILD = REPO_ROOT / "runtime" / "build"

LIBRARIES = {"emu": "libgraphc_rt_emu.so", "cuda": "libgraphc_rt.so"}
COMPILERS = {"emu": "g++", "cuda": "nvcc"}
BUILD_TIMEOUT_S = 900  # the CUDA build takes about two minutes on two cores

_built: dict[str, Path] = {}


def cuda_test_kind() -> str:
    """"cuda" when GRAPHC_TEST_ON_GPU=1 (run the cuda backend's tests on the GPU), else "emu"."""
    return "cuda" if os.environ.get("GRAPHC_TEST_ON_GPU", "") == "1" else "emu"


emulation_only = pytest.mark.skipif(
    cuda_test_kind() != "emu", reason="a property of the CPU emulation, not of a GPU run")


def run_make(*targets: str, timeout: float = BUILD_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Runs `make -C runtime/csrc -j2 <targets>` under the build lock; returns the result."""
    RUNTIME_BUILD.mkdir(parents=True, exist_ok=True)
    with open(RUNTIME_BUILD / ".make.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.run(
            ["make", "-C", str(RUNTIME_SOURCE), "-j2", *targets],
            capture_output=True, text=True, timeout=timeout,
        )


def runtime_library(kind: str) -> str:
    """The path of the built runtime library of `kind` ("emu" or "cuda"), built if needed."""
    if kind not in LIBRARIES:
        raise ValueError(f"runtime_library: kind must be 'emu' or 'cuda', got {kind!r}")
    if kind in _built:
        return str(_built[kind])
    compiler = COMPILERS[kind]
    if shutil.which(compiler) is None:
        _unavailable(f"{compiler} is not on PATH: the {kind} runtime library cannot be built")
    if shutil.which("make") is None:
        _unavailable("GNU make is not on PATH: the runtime libraries cannot be built")
    result = run_make(kind)
    if result.returncode != 0:
        raise RuntimeError(
            f"runtime_library({kind!r}): `make -C {RUNTIME_SOURCE} {kind}` failed with exit "
            f"code {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
        )
    path = RUNTIME_BUILD / LIBRARIES[kind]
    _built[kind] = path
    return str(path)


def _unavailable(why: str):
    """A skip, except on a GPU run (GRAPHC_TEST_ON_GPU=1), where a runtime that cannot be had
    fails the test: a GPU check must never pass by running nothing."""
    if cuda_test_kind() == "cuda":
        pytest.fail(why)
    pytest.skip(why)


def built_test_runtime() -> str:
    """The library of `cuda_test_kind()`, built if needed; a test that needs it is skipped
    when it cannot be built here (a failing build: its error), or fails on a GPU run."""
    try:
        return runtime_library(cuda_test_kind())
    except Exception as error:  # noqa: BLE001 (any build failure: say why)
        _unavailable(f"the {cuda_test_kind()} runtime does not build here: {error}")


def loaded_test_runtime():
    """The library of `cuda_test_kind()`, built if needed and loaded through
    graphc.backends.cuda.rt."""
    kind = cuda_test_kind()
    os.environ.setdefault("GRAPHC_CUDA", kind)
    runtime_library(kind)
    from graphc.backends.cuda.rt import runtime_library as load

    return load(kind)


def loaded_emulation_runtime():
    """The emulation library, built if needed and loaded through graphc.backends.cuda.rt (for
    tests that call the runtime directly)."""
    os.environ.setdefault("GRAPHC_CUDA", "emu")
    runtime_library("emu")
    from graphc.backends.cuda.rt import runtime_library as load

    return load("emu")
