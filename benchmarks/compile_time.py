"""Cold and warm compile time of the LeNet-5 training step, each in a fresh process.

What is measured (`measure`, run in a child process by `compile_time_case`): the child imports
graphc, builds LeNet-5 with SGD momentum and runs one eager step (so the momentum buffers
exist and the compiled step traces exactly once); none of that is counted. The figure is the
wall time of the first compiled call, which does all of the compile work:
- trace: the traced call runs the step abstractly (shape rules only) while recording it
  (graphc.jit.tracer),
- default_passes: building the pass list, which imports graphc.passes.fuse (and networkx)
  on the first compile of a process,
- passes: simplify, fuse, plan_buffers (with the verifier after each),
- backend: CpuExecutable set-up; inside it `lower` (LLVM IR text from the planned graph)
  and `llvm` (`compile_module`: llvmlite's first-use set-up, deduplicating identical
  kernels (graphc.backends.cpu.module_text), cache key, then optimisation + object code on
  a cache miss (in parts on worker processes for a large module), or reading and checking
  the cached objects on a hit, and loading them into MCJIT), the rest being BLAS resolution
  and arena allocation;
- import: the CPU backend's modules and llvmlite, which a fresh process loads on its first
  compile (imported just before the call, so its stages can be wrapped, and counted);
- other: the rest of the call (guards, output checks, bookkeeping).
*Cold* runs with `GRAPHC_CACHE_DIR` set to an empty temporary directory; *warm* runs again in
a new process with that directory populated by the cold run: a warm compile still traces,
runs the passes and lowers (the cache key is the hash of the IR text), and skips LLVM's
optimisation and code generation. The stage times come from wrapping the functions
graphc.jit.retrace and graphc.jit.pipeline call (trace_call, default_passes, run_pipeline,
compile_graph) and the CPU backend's `lower` and `llvm.compile_module` in timers in the
child; graphc is not changed.
The timers read the clock run.py's --clock chose (wall, or this process's CPU time).

    python -m benchmarks.compile_time --batch 64 --clock wall   # one measurement, JSON
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from benchmarks.harness import CaseResult, Contender, now, set_clock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("import", "trace", "default_passes", "passes", "backend", "lower", "llvm", "other")
OUTER = ("import", "trace", "default_passes", "passes", "backend")  # they add up to the call


def _timed(table: dict, key: str, fn):
    def wrapper(*args, **kwargs):
        start = now()
        try:
            return fn(*args, **kwargs)
        finally:
            table[key] = table.get(key, 0.0) + now() - start
    return wrapper


def measure(batch: int) -> dict:
    """In this (fresh) process: the compile time of the LeNet-5 step and its stages."""
    import graphc
    import graphc.jit.pipeline as pipeline
    import graphc.jit.retrace as retrace
    from benchmarks import models

    stages: dict[str, float] = {}
    retrace.trace_call = _timed(stages, "trace", retrace.trace_call)
    pipeline.run_pipeline = _timed(stages, "passes", pipeline.run_pipeline)
    pipeline.compile_graph = _timed(stages, "backend", pipeline.compile_graph)
    retrace.default_passes = _timed(stages, "default_passes", retrace.default_passes)

    x, y = models.batch("lenet5", batch)
    gx, gy = graphc.tensor(x), graphc.tensor(y)
    step = models.graphc_step(models.graphc_model("lenet5"))
    step(gx, gy)  # creates the momentum buffers: the compiled call below traces once
    compiled = graphc.compile(step, backend="cpu")

    imported = now()
    import graphc.backends.cpu.executable as executable  # what the first compile imports

    stages["import"] = now() - imported
    executable.lower = _timed(stages, "lower", executable.lower)
    executable.llvm.compile_module = _timed(stages, "llvm", executable.llvm.compile_module)
    start = now()
    compiled(gx, gy)
    first = stages["import"] + now() - start
    stages["other"] = first - sum(stages.get(k, 0.0) for k in OUTER)  # a cache hit skips some
    start = now()
    compiled(gx, gy)
    second = now() - start
    library = compiled.executable.library
    kernels = set(compiled.executable.lowered.kernels)
    return {"compile_s": first, "stages": stages, "next_call_s": second,
            "traces": len(compiled.graphs), "from_cache": library.from_cache,
            "passes": {r.name: r.seconds for r in compiled.report.records},
            "ir_chars": len(compiled.executable.lowered.ir_text),
            "compiled_chars": len(library._ir_text), "kernels": len(kernels),
            "distinct_kernels": len(kernels - set(library.aliases)), "parts": library.parts}


def _child(batch: int, cache_dir: str, clock: str) -> dict:
    env = dict(os.environ, GRAPHC_CACHE_DIR=cache_dir, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.compile_time", "--batch",
                           str(batch), "--clock", clock], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"compile-time child failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compile_time_cases(batch: int, runs: int, clock: str = "wall") -> list[CaseResult]:
    """Two rows: cold and warm compile of the LeNet-5 step, medians over `runs` pairs of
    fresh processes (each pair: an empty cache directory, cold, then warm)."""
    cold, warm = [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="graphc-bench-cache-") as cache:
            cold.append(_child(batch, cache, clock))
            warm.append(_child(batch, cache, clock))
    rows = []
    for label, target, results, cached in (("cold", 2.0, cold, False),
                                           ("warm", 0.3, warm, True)):
        bad = [r for r in results if r["from_cache"] != cached or r["traces"] != 1]
        status = "ok" if not bad else (f"disagrees: a {label} run loaded from_cache="
                                       f"{bad[0]['from_cache']} after {bad[0]['traces']} traces")
        median = float(np.median([r["compile_s"] for r in results]))
        stages = {k: float(np.median([r["stages"].get(k, 0.0) for r in results]))
                  for k in STAGES}
        passes = {k: float(np.median([r["passes"][k] for r in results]))
                  for k in results[0]["passes"]}
        contender = Contender(f"graphc {label}", run=lambda: None, status=status,
                              seconds=median if status == "ok" else None, rounds=len(results))
        breakdown = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in stages.items())
        rows.append(CaseResult(
            f"compile_{label}", f"LeNet-5 step (batch {batch}) compile, {label}",
            f"graphc {label}", None, ("<=", target), [contender],
            note=f"median of {len(results)} fresh processes; stages: {breakdown} (lower and "
                 "llvm are inside backend); the next call takes "
                 f"{np.median([r['next_call_s'] for r in results]) * 1e3:.1f} ms; "
                 f"{results[0]['kernels']} kernels, {results[0]['distinct_kernels']} distinct "
                 f"(LLVM text {results[0]['ir_chars']:,} -> {results[0]['compiled_chars']:,} "
                 f"characters), {results[0]['parts']} part(s)",
            extra={"stages": stages, "passes": passes,
                   "ir_chars": results[0]["ir_chars"], "kernels": results[0]["kernels"],
                   "distinct_kernels": results[0]["distinct_kernels"]}))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="one compile-time measurement (JSON)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    set_clock(args.clock)
    print(json.dumps(measure(args.batch)))


if __name__ == "__main__":
    main()
