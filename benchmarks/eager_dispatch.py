"""Eager dispatch cost: Python time per small op, graphc next to PyTorch in the same process.

    python -m benchmarks.eager_dispatch --threads 1 --clock cpu
    python -m benchmarks.eager_dispatch --profile "w * b"    # cProfile of one case

Each op figure is the median of 7 rounds of 20,000 calls on 10-element float32 tensors (the
work itself is negligible, so this is the per-op overhead users pay while debugging in eager
mode, and that tracing pays too); graphc's and PyTorch's rounds alternate. The performance
issue's target is <= 5 us per small elementwise op. `w` requires grad, so its rows build an
autograd node per call; `x.add_(b)` changes a tensor that does not; `(w * b).add_(b)` runs
two ops (a result with history changed in place: target 10 us). The last rows are eager
training steps (MLP 784-256-256-10 and LeNet-5, batch 64, cross-entropy, SGD momentum;
benchmarks.models) in graphc and in PyTorch, median of 7 rounds of 20 steps (10 for LeNet-5).

`--threads N` sets OMP_NUM_THREADS / OPENBLAS_NUM_THREADS (restarting the process so the
libraries read them) and PyTorch's intra-op threads; `--clock cpu` times by this process's CPU
time (steadier on a shared machine; use with --threads 1).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
import timeit

import numpy as np

import graphc
from benchmarks.harness import run_with_threads

CALLS, ROUNDS, STEPS = 20_000, 7, 20
TARGET_US = 5.0


def op_cases(lib):
    """[(label, fn)] of the small ops, on tensors of `lib` (graphc or torch)."""
    a, b = lib.ones(10), lib.full((10,), 2.0)
    x = lib.ones(10)
    w = lib.ones(10, requires_grad=True)
    return [
        ("a + b", lambda: a + b),
        ("a - b", lambda: a - b),
        ("a * b", lambda: a * b),
        ("a / b", lambda: a / b),
        ("a.relu()", lambda: a.relu()),
        ("-a", lambda: -a),
        ("a.exp()", lambda: a.exp()),
        ("a < b", lambda: a < b),
        ("a * 2.0", lambda: a * 2.0),
        ("x.add_(b)", lambda: x.add_(b)),
        ("w + b (grad)", lambda: w + b),
        ("w * b (grad)", lambda: w * b),
        ("w.relu() (grad)", lambda: w.relu()),
        ("w.exp() (grad)", lambda: w.exp()),
        ("w * 2.0 (grad)", lambda: w * 2.0),
        ("(w * b).add_(b) (grad; 2 ops)", lambda: (w * b).add_(b)),
    ]


def ops_in(label: str) -> int:
    """How many ops a case's call runs (its target is 5 us per op)."""
    return 2 if "2 ops" in label else 1


STEP_CASES = [("mlp", "MLP 784-256-256-10 b64 SGD step", STEPS),
              ("lenet5", "LeNet-5 b64 SGD step", STEPS // 2)]


def training_step(lib_name: str, model_name: str = "mlp"):
    """A closure running one eager b64 SGD-momentum step of `model_name` (benchmarks.models:
    "mlp" or "lenet5") in graphc or torch."""
    from benchmarks import models

    base = models.graphc_model(model_name)
    x, y = models.batch(model_name, 64)
    if lib_name == "graphc":
        step, xs, ys = models.graphc_step(base), graphc.tensor(x), graphc.tensor(y)
    else:
        import torch

        model = models.torch_copy(base, model_name)
        step, xs, ys = models.torch_step(model), torch.from_numpy(x), torch.from_numpy(y)
    return lambda: step(xs, ys)


def interleaved(ours, theirs, number: int, timer) -> tuple[float, float | None]:
    """Medians of seconds per call of `ours` and `theirs` (None: skipped), rounds alternating."""
    for fn in (ours, theirs):
        if fn is not None:
            timeit.repeat(fn, number=max(1, number // 10), repeat=1, timer=timer)  # warm up
    mine, other = [], []
    for _ in range(ROUNDS):
        mine.append(timeit.timeit(ours, number=number, timer=timer) / number)
        if theirs is not None:
            other.append(timeit.timeit(theirs, number=number, timer=timer) / number)
    return statistics.median(mine), (statistics.median(other) if other else None)


def _row(label: str, ours: float, theirs: float | None, unit: float, suffix: str,
         target: str) -> str:
    cell = f"{theirs / unit:.2f} {suffix}" if theirs else "torch not installed"
    ratio = f"{ours / theirs:.1f}x" if theirs else "-"
    return f"| {label} | {ours / unit:.2f} {suffix} | {cell} | {ratio} | {target} |"


def table(timer, clock: str, argv: list[str]) -> str:
    try:
        import torch
    except ImportError:
        torch = None
    ours = op_cases(graphc)
    theirs = op_cases(torch) if torch is not None else [(label, None) for label, _ in ours]
    lines = ["| op (10 float32) | graphc eager | PyTorch eager | ratio | target |",
             "|---|---|---|---|---|"]
    met = 0
    for (label, fn), (_, anchor) in zip(ours, theirs):
        mine, other = interleaved(fn, anchor, CALLS, timer)
        target = TARGET_US * ops_in(label)
        met += mine * 1e6 <= target
        lines.append(_row(label, mine, other, 1e-6, "us", f"<= {target:g} us"))
    for model_name, label, steps in STEP_CASES:
        mine, other = interleaved(training_step("graphc", model_name),
                                  training_step("torch", model_name) if torch is not None
                                  else None, steps, timer)
        lines.append(_row(label, mine, other, 1e-3, "ms", "-"))
    load = os.getloadavg()
    threads = os.environ.get("OMP_NUM_THREADS", f"default ({os.cpu_count()})")
    head = (f"command: `python -m benchmarks.eager_dispatch {' '.join(argv)}`".rstrip()
            + f"; threads: {threads}; clock: {clock}; load average at the end "
            f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; numpy {np.__version__}, torch "
            f"{torch.__version__ if torch is not None else 'not installed'}; "
            f"{met}/{len(ours)} ops within {TARGET_US:g} us")
    return head + "\n\n" + "\n".join(lines)


def profile(label: str, timer) -> str:
    """cProfile of CALLS calls of the graphc case `label`, by own time."""
    cases = dict(op_cases(graphc))
    if label not in cases:
        raise SystemExit(f"--profile: no case {label!r}; cases: {sorted(cases)}")
    fn = cases[label]
    fn()
    profiler = cProfile.Profile(timer)
    profiler.enable()
    for _ in range(CALLS):
        fn()
    profiler.disable()
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(15)
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, metavar="N",
                        help="threads for OpenMP, OpenBLAS and PyTorch (default: every core)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall clock, or this process's CPU time")
    parser.add_argument("--profile", metavar="CASE", help="cProfile one graphc case instead")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    run_with_threads("benchmarks.eager_dispatch", args.threads, argv)
    if args.threads is not None:
        try:
            import torch

            torch.set_num_threads(args.threads)
        except ImportError:
            pass
    timer = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.profile:
        profile(args.profile, timer)
        return 0
    print(table(timer, args.clock, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
