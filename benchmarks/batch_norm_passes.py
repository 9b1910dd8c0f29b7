"""ResNet-18's batch-norm forward kernels, channel by channel and image by image, in one
process, and their rounding on hostile inputs.

    python -m benchmarks.batch_norm_passes                 # 7 alternated rounds
    python -m benchmarks.batch_norm_passes --rounds 3 --accuracy-only
    python -m benchmarks.batch_norm_passes --step --rounds 9   # the whole training step

For each batch-norm shape of benchmarks/model_steps.py's ResNet-18 step (batch 32: 64
channels at 32x32, 128 at 16x16, 256 at 8x8, 512 at 4x4) the one-op `batch_norm` graph
(training) is compiled once per variant (`--variants`), each with its own GRAPHC_CACHE_DIR,
graphc.backends.cpu.batch_norm's settings changed while it compiles: "by-channel" (IMAGE_ORDER
= False: the kernel before, channel by channel the mean, the squared deviations and the
output), "no-prefetch" (PREFETCH = False: image by image, shifted sums, then the
output) and "by-image" (the default: the same, prefetching ahead). Each kernel is
called natively (benchmarks.profiles.native_call), the variants alternated, each sample >= 40
ms of this process's CPU time at one thread; it prints the medians and GB/s of the nominal
bytes (x read once, the output written once).

Rounding: per input kind (normal; mean 1e4, deviation 1e-2; mean 1e5, deviation 1e-1; a
channel whose first elements are an outlier 10^4 deviations away), each variant's distance
from a float64 run (numpy, two passes over the float32 input upcast) over eager graphc's
(graphc.ops' numpy kernel), for the output, the mean and invstd: the rule of
docs/performance.md, at most 2.

`--step`: the ResNet-18 training step compiled per variant from one set of weights, timed in
alternation (benchmarks.resnet18_bytes.compare_steps: step medians and the memory-bound
kernels by op list).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import contextmanager

import numpy as np

LAYERS = ((64, 32), (128, 16), (256, 8), (512, 4))  # (channels, plane side)
# graphc.backends.cpu.batch_norm's settings per variant
VARIANTS = {"by-channel": {"IMAGE_ORDER": False},
            "no-prefetch": {"PREFETCH": False},
            "by-image": {}}
INPUTS = ("normal", "mean 1e4 sd 1e-2", "mean 1e5 sd 1e-1", "outlier first")


@contextmanager
def variant(root: str, name: str):
    """The variant's settings (see the module docstring) and its own cache folder."""
    from graphc.backends.cpu import batch_norm as module

    os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, name)
    kept = {key: getattr(module, key) for key in VARIANTS[name]}
    for key, value in VARIANTS[name].items():
        setattr(module, key, value)
    try:
        yield
    finally:
        for key, value in kept.items():
            setattr(module, key, value)


def compiled(root: str, name: str, shape: tuple):
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.passes.plan import plan_buffers
    from tests.test_cpu_backend import one_op_graph

    c = shape[1]
    graph = one_op_graph("batch_norm", [(shape, "float32")] + [((c,), "float32")] * 4,
                         training=True, eps=1e-5)
    with variant(root, name):
        plan_buffers(graph)
        return CpuExecutable(graph)


def arguments(rng, shape: tuple, kind: str) -> list[np.ndarray]:
    c = shape[1]
    x = rng.standard_normal(shape)
    if kind == "mean 1e4 sd 1e-2":
        x = 1e4 + 1e-2 * x
    elif kind == "mean 1e5 sd 1e-1":
        x = 1e5 + 1e-1 * x
    elif kind == "outlier first":
        x[0, :, 0] = 1e4
    params = [rng.uniform(0.5, 2, c), rng.uniform(-1, 1, c), np.zeros(c), np.ones(c)]
    return [a.astype(np.float32) for a in [x] + params]


def float64_run(x, weight, bias) -> list[np.ndarray]:
    axes = (0,) + tuple(range(2, x.ndim))
    bshape = (1, -1) + (1,) * (x.ndim - 2)
    xd = x.astype(np.float64)
    mean = xd.mean(axis=axes)
    var = ((xd - mean.reshape(bshape)) ** 2).mean(axis=axes)
    invstd = 1.0 / np.sqrt(var + 1e-5)
    out = (xd - mean.reshape(bshape)) * (invstd * weight).reshape(bshape) + \
        bias.reshape(bshape)
    return [out, mean, invstd]


def distance(got, want) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / max(np.linalg.norm(want),
                                                                       1e-300))


def accuracy(root: str, names) -> list[str]:
    from graphc.ops.registry import REGISTRY

    lines = ["| input | layer | output | mean | invstd |", "|---|---|---|---|---|"]
    rng = np.random.default_rng(0)
    for kind in INPUTS:
        for channels, side in LAYERS[::3]:
            shape = (32, channels, side, side)
            args = arguments(rng, shape, kind)
            want = float64_run(*args[:3])
            eager = REGISTRY["batch_norm"].kernel(*args, training=True, eps=1e-5)
            cells = []
            for k in range(3):
                base = distance(eager[k], want[k])
                ratios = []
                for name in names:
                    got = compiled(root, name, shape).run(*args)[k]
                    d = distance(got, want[k])
                    ratios.append("=" if d == base else
                                  f"{d / base:.2f}x" if base else f"{d:.1e} (eager 0)")
                cells.append(" / ".join(ratios))
            lines.append(f"| {kind} | {channels} | " + " | ".join(cells) + " |")
    return lines


def speed(root: str, rounds: int, names) -> list[str]:
    from benchmarks.profiles import native_call

    lines = ["| layer (N = 32) | " + " | ".join(names) + " | GB/s |",
             "|---" * (len(names) + 2) + "|"]
    rng = np.random.default_rng(1)
    for channels, side in LAYERS:
        shape = (32, channels, side, side)
        args = arguments(rng, shape, "normal")
        calls = [native_call(compiled(root, name, shape), args) for name in names]
        times: list[list[float]] = [[] for _ in calls]
        for r in range(rounds):
            order = list(enumerate(calls))
            for k, call in (order if r % 2 else order[::-1]):
                call()
                count, start = 0, time.process_time()
                while time.process_time() - start < 0.04:
                    call()
                    count += 1
                times[k].append((time.process_time() - start) / count)
        medians = [statistics.median(t) for t in times]
        nominal = 2 * args[0].nbytes
        lines.append(f"| {channels} channels, {side}x{side} | " +
                     " | ".join(f"{m * 1e3:.3f} ms" for m in medians) + " | " +
                     " -> ".join(f"{nominal / m / 1e9:.1f}" for m in medians) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="alternated rounds (7)")
    parser.add_argument("--accuracy-only", action="store_true", help="skip the timing")
    parser.add_argument("--step", action="store_true", help="the whole training step")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                        help="which variants (all)")
    args = parser.parse_args(argv)
    from benchmarks.harness import cache_root, run_with_threads

    run_with_threads("benchmarks.batch_norm_passes", 1, sys.argv[1:] if argv is None else argv)
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))
    with cache_root("batch_norm_passes.") as root:
        if args.step:
            from benchmarks.resnet18_bytes import compare_steps

            print(compare_steps(args.variants, lambda name: variant(root, name), args.rounds))
        else:
            print("\n".join(accuracy(root, args.variants)), flush=True)
        if not (args.step or args.accuracy_only):
            print("\n".join(speed(root, args.rounds, args.variants)), flush=True)
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
