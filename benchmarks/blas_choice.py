"""Which BLAS should graphc's CPU GEMMs call: OpenBLAS (numpy's) or Intel MKL (the `mkl` wheel)?

    python -m benchmarks.blas_choice                    # every library, 1 thread and 2
    python -m benchmarks.blas_choice --threads 1 --step gpt_b16

Times cblas_sgemm of each library on the GEMMs one training step of the benchmark models
calls, exactly as graphc's generated code calls them (row-major, the transpose flags and
leading dimensions it passes; recorded on 2026-11-26 by wrapping graphc's registered
`graphc_blas_sgemm` symbol during one compiled step of each model in benchmarks/), plus the
square SGEMMs of the benchmark table. Each library runs in a fresh child process, because
MKL's threading layer is chosen once per process:

- `openblas`: numpy's bundled OpenBLAS (ILP64), with `openblas_set_num_threads(n)`.
- `mkl-seq`: libmkl_rt with MKL_Set_Threading_Layer(SEQUENTIAL) (single-threaded only).
- `mkl-gnu`: libmkl_rt with the GNU OpenMP layer (its parallel GEMMs fork libgomp's team,
  the same team graphc's own loops use) and MKL_Set_Num_Threads(n).

One thread is timed with the process's CPU clock (as `benchmarks.run --clock cpu`), two with
the wall clock. A child's figure is the median over `--rounds` samples of the step's whole
GEMM time (every GEMM of the step, each called as often as the step calls it, through
ctypes: ~0.5 us a call for every library alike); each library runs `--passes` children, in
an order that rotates, and a ratio is the median of the passes' ratios (this shared machine
drifts by 30% within a minute).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from benchmarks.blas_shapes import STEP_GEMMS

NO_TRANS = 111
SQUARE = {f"sgemm_{n}": ((111, 111, n, n, n, n, n, n, 0, 1),) for n in (256, 1024, 2048)}
STEPS = {**STEP_GEMMS, **SQUARE}
LIBRARIES = ("openblas", "mkl-seq", "mkl-gnu")


class _Sgemm:
    """cblas_sgemm of one library, typed for its integer width, and its thread setter."""

    def __init__(self, library: str) -> None:
        if library == "openblas":
            from graphc.backends.cpu.blas import blas_libraries

            path = next(p for p in blas_libraries() if "openblas" in p)
            lib = ctypes.CDLL(path)
            self.function, integer = lib.scipy_cblas_sgemm64_, ctypes.c_int64
            setter = lib.scipy_openblas_set_num_threads64_
        else:
            from graphc.backends.cpu.blas import mkl_library

            path = mkl_library()
            if path is None:
                raise SystemExit("benchmarks/blas_choice.py: the `mkl` package is not "
                                 "installed (pip install mkl)")
            lib = ctypes.CDLL(path)
            layer = 1 if library == "mkl-seq" else 3  # MKL_THREADING_SEQUENTIAL / _GNU
            lib.MKL_Set_Threading_Layer.argtypes = [ctypes.c_int]
            if lib.MKL_Set_Threading_Layer(layer) != layer:
                raise SystemExit(f"blas_choice: MKL refused threading layer {layer}")
            self.function, integer = lib.cblas_sgemm_64, ctypes.c_int64
            setter = lib.MKL_Set_Num_Threads
        self.path = path
        i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
        self.function.argtypes = [i, i, i, integer, integer, integer, f, p, integer, p,
                                  integer, f, p, integer]
        self.function.restype = None
        setter.argtypes, setter.restype = [ctypes.c_int], None
        self.set_threads = setter

    def calls(self, gemms):
        """The step's calls, bound to arrays, as argument tuples."""
        rng = np.random.default_rng(0)
        bound = []
        for ta, tb, m, n, k, lda, ldb, ldc, beta, count in gemms:
            a = rng.standard_normal((m if ta == NO_TRANS else k, lda), dtype=np.float32)
            b = rng.standard_normal((k if tb == NO_TRANS else n, ldb), dtype=np.float32)
            c = np.zeros((m, ldc), np.float32)
            args = (101, ta, tb, m, n, k, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb,
                    float(beta), c.ctypes.data, ldc)
            bound.append((args, count, (a, b, c)))
        return bound


def time_library(library: str, threads: int, steps: list[str], rounds: int) -> dict:
    """{step: median seconds of the step's GEMMs} for one library at `threads`."""
    sgemm = _Sgemm(library)
    sgemm.set_threads(threads)
    clock = time.process_time if threads == 1 else time.perf_counter
    out = {}
    for step in steps:
        bound = sgemm.calls(STEPS[step])
        flops = sum(2 * a[3] * a[4] * a[5] * count for a, count, _ in bound)
        inner = max(1, int(2e9 // flops))  # samples of ~20 ms at ~100 GFLOP/s
        samples = []
        for _ in range(rounds + 2):
            start = clock()
            for _ in range(inner):
                for args, count, _ in bound:
                    for _ in range(count):
                        sgemm.function(*args)
            samples.append((clock() - start) / inner)
        out[step] = statistics.median(samples[2:])
    return out


def _child(args) -> None:
    result = time_library(args.library, args.threads, args.step, args.rounds)
    print(json.dumps(result))


def _run_child(args, library: str, threads: int) -> dict:
    command = [sys.executable, "-m", "benchmarks.blas_choice", "--child", "--library", library,
               "--threads", str(threads), "--rounds", str(args.rounds)]
    for step in args.step:
        command += ["--step", step]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, action="append", choices=(1, 2))
    parser.add_argument("--step", action="append", choices=tuple(STEPS))
    parser.add_argument("--library", choices=LIBRARIES, action="append")
    parser.add_argument("--rounds", type=int, default=5, help="samples per child")
    parser.add_argument("--passes", type=int, default=3,
                        help="children per library, in rotating order")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.step = args.step or list(STEPS)
    if args.child:
        args.library, args.threads = args.library[0], args.threads[0]
        return _child(args)
    libraries = args.library or list(LIBRARIES)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'step':<12} {'thr':>3} " + " ".join(f"{lib:>12}" for lib in libraries)
          + "   (ms of the step's GEMMs, median over passes; ratio to openblas: the median of"
          " the passes' ratios)")
    for threads in args.threads or [1, 2]:
        results: dict[str, list[dict]] = {}
        present = [lib for lib in libraries if not (lib == "mkl-seq" and threads > 1)]
        for turn in range(args.passes):  # the order rotates, so drift spreads over all
            for library in present[turn % len(present):] + present[:turn % len(present)]:
                results.setdefault(library, []).append(_run_child(args, library, threads))
        for step in args.step:
            base = [one[step] for one in results.get("openblas", [])]
            cells = []
            for library in libraries:
                if library not in results:
                    cells.append(f"{'-':>12}")
                    continue
                seconds = [one[step] for one in results[library]]
                ratio = (f" {statistics.median(s / b for s, b in zip(seconds, base)):4.2f}x"
                         if base else "")
                cells.append(f"{statistics.median(seconds) * 1e3:>6.3f}{ratio:>6}")
            print(f"{step:<12} {threads:>3} " + " ".join(cells), flush=True)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
