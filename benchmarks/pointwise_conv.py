"""ResNet-18's 1x1 stride-2 shortcut convolutions: conv.py's im2col path against
graphc.backends.cpu.conv_pointwise's kernels, each pass a one-op graph.

    python -m benchmarks.pointwise_conv --rounds 15
    python -m benchmarks.pointwise_conv --rounds 15 --threads 2     # wall clock
    python -m benchmarks.pointwise_conv --step --rounds 21 --repeat 5
    python -m benchmarks.pointwise_conv --ab graphc.backends.cpu.conv_pointwise.K_BLOCK=64

For the three shortcuts of the CIFAR ResNet-18 step (batch 32: 64 -> 128 at 32x32 in,
128 -> 256 at 16x16, 256 -> 512 at 8x8), forward, input gradient and weight gradient, each
compiled twice (conv_pointwise.ENABLED off and on, each its own GRAPHC_CACHE_DIR) and
called natively in alternated rounds (`--rounds` rounds of >= 40 ms, medians), at
`--threads` threads (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS, set before graphc loads; the
kernels are built for that many shares): CPU time at one thread, wall clock at more.
GFLOP/s are the GEMM's 2*N*O*C*H_out*W_out over the time; "same" says whether the two
results are within float32 rounding of each other (max difference over max |value|).
`--ab MODULE.NAME=VALUE ...`: the first column compiled with those settings (as
benchmarks.stride2_grads') instead of conv_pointwise off.

`--step`: benchmarks/resnet18_kernels.py's `switches_gain` instead: the whole ResNet-18
step compiled with conv_pointwise off ("im2col") and on ("pointwise"), each with its own
GRAPHC_CACHE_DIR, the steps' CPU time in alternation (`--rounds` samples), then the 1x1
kernels by weight shape inside the step (graphc.profile, `--repeat` runs, 3 rounds); one
thread.
"""

from __future__ import annotations

import argparse
import os
import time

SHORTCUTS = ((64, 32), (128, 16), (256, 8))  # (input channels, input plane side)
DEFAULT_AB = ["graphc.backends.cpu.conv_pointwise.ENABLED=False"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="alternated rounds (15)")
    parser.add_argument("--batch", type=int, default=32, help="images (32)")
    parser.add_argument("--threads", type=int, default=1, help="threads (1)")
    parser.add_argument("--step", action="store_true", help="the whole step's A/B")
    parser.add_argument("--ab", nargs="+", metavar="MODULE.NAME=VALUE", default=DEFAULT_AB,
                        help="the first column's settings (default: " + DEFAULT_AB[0] + ")")
    parser.add_argument("--repeat", type=int, default=5, help="--step: profiled runs (5)")
    args = parser.parse_args(argv)
    for flag, value in (("--rounds", args.rounds), ("--threads", args.threads),
                        ("--repeat", args.repeat)):
        if value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    if args.step and args.threads != 1:
        parser.error("--step runs one thread (switches_gain's CPU time): drop --threads")
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    from benchmarks.harness import cache_root

    print(f"load average before: {_load()}", flush=True)
    with cache_root("pointwise_conv.") as root:
        if args.step:
            from benchmarks.resnet18_kernels import switches_gain

            print(switches_gain(root, args.rounds, args.repeat, ("im2col", "pointwise"),
                                {("conv_pointwise", "ENABLED"): False}, shown=("1x1",)),
                  flush=True)
        else:
            from benchmarks.stride2_grads import settings

            print(shortcut_table(root, args.rounds, args.batch, clock, settings(args.ab)),
                  flush=True)
    print(f"load average after: {_load()}")


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def shortcut_table(root: str, rounds: int, n: int, clock=time.process_time,
                   switches: dict | None = None) -> str:
    """The markdown table of the module docstring; `switches` ({(module, attribute):
    value}) set while the first column compiles (default: conv_pointwise off)."""
    import numpy as np

    from benchmarks.harness import switched
    from benchmarks.profiles import native_call
    from graphc.backends.cpu import conv_pointwise
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.passes.plan import plan_buffers
    from tests.test_cpu_conv_paths import _graphs

    switches = switches or {(conv_pointwise, "ENABLED"): False}

    lines = ["| shortcut (N = %d) | pass | im2col | conv_pointwise | GFLOP/s | same |" % n,
             "|---|---|---|---|---|---|"]
    totals = [0.0, 0.0]
    for c, side in SHORTCUTS:
        xs, ws = (n, c, side, side), (2 * c, c, 1, 1)
        gs, _ = _graphs(xs, ws, (2, 2), (0, 0), 1)
        rng = np.random.default_rng(c)
        flops = 2 * n * 2 * c * c * (side // 2) ** 2
        for kind, shapes in (("fwd", (xs, ws)), ("gx", (gs, ws)), ("gw", (gs, xs))):
            inputs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
            exes = []
            for name in ("before", "after"):
                with switched(root, f"{c}-{kind}-{name}", switches, name == "before"):
                    graph = _graphs(xs, ws, (2, 2), (0, 0), 1)[1][kind]
                    plan_buffers(graph)
                    exes.append(CpuExecutable(graph))
            results = [e.run(*inputs)[0] for e in exes]
            diff = float(np.abs(results[0] - results[1]).max() / np.abs(results[0]).max())
            before, after = (float(np.median(t)) for t in
                             _alternated([native_call(e, inputs) for e in exes], rounds,
                                         clock))
            totals[0] += before
            totals[1] += after
            lines.append(f"| {c} -> {2 * c}, {side // 2}x{side // 2} out | {kind} | "
                         f"{before * 1e3:.3f} ms | {after * 1e3:.3f} ms | "
                         f"{flops / before / 1e9:.0f} -> {flops / after / 1e9:.0f} | "
                         f"{'yes' if diff < 1e-5 else f'no ({diff:.1e})'} |")
    lines.append(f"| all nine | | {totals[0] * 1e3:.2f} ms | {totals[1] * 1e3:.2f} ms | | |")
    return "\n".join(lines)


def _alternated(calls, rounds: int, clock) -> list[list[float]]:
    """Per call, one sample a round: its mean time over >= 40 ms of `clock`."""
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds):
        for call, samples in zip(calls, times):
            call()
            count, start = 0, clock()
            while clock() - start < 0.04:
                call()
                count += 1
            samples.append((clock() - start) / count)
    return times


if __name__ == "__main__":
    main()
