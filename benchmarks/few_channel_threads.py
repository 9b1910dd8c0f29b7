"""The few-channel convolution case and the LeNet-5 step on one thread and on two, per call.

    python -m benchmarks.few_channel_threads                 # 12 interleaved blocks
    python -m benchmarks.few_channel_threads --realtime      # the cores to itself (root)
    python -m benchmarks.few_channel_threads --quick --blocks 1

The cases are benchmarks.run's `conv2d` (N=64, 3->64, 3x3, pad 1, 32x32, bias: the register
tiles of graphc/backends/cpu/conv_few_channels.py, split over images) and `lenet5_b64` (its
first layer's forward and weight gradient take the same tiles). Each compiled callable runs
in blocks of calls on a forced thread count (`ThreadChooser(fixed=n)`): one thread, two
threads, and "chosen" (a fresh chooser, as benchmarks.run gets it), the blocks interleaved.
It prints per count the 5th percentile and the median of the calls' wall times (the 5th
percentile: the calls no other task interrupted) and how many calls the chooser ran on each
count.

On a machine shared with other work a two-thread call waits for whichever of its threads the
OS parked (docs/performance.md, "Threads"), so the two-thread figures say more about the
load than about the code. `--realtime` puts this process under SCHED_FIFO (root or
CAP_SYS_NICE; Linux keeps 5% of every second for other tasks): its threads then take the
cores whenever they are runnable, as on an idle machine. The chooser still sees the other
tasks as runnable (`threads.cores_free`) and keeps one thread: its line shows what it does
under the load at hand, not on an idle machine (docs/performance.md, "Two threads: the
few-channel convolutions").
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import graphc
from benchmarks import models
from benchmarks.harness import keep_freed_memory
from graphc.backends.cpu import threads

COUNTS = ("1", "2", "chosen")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=12, help="interleaved blocks (12)")
    parser.add_argument("--calls", type=int, default=15, help="timed calls a block (15)")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--realtime", action="store_true",
                        help="run under SCHED_FIFO, as on an idle machine (root)")
    args = parser.parse_args(argv)
    for flag, value in (("--blocks", args.blocks), ("--calls", args.calls)):
        if value < 1:  # else no call is timed, and every figure is the median of nothing
            parser.error(f"{flag} must be at least 1, got {value}")
    if args.realtime:  # before any thread exists: libgomp's threads inherit the policy
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        except (PermissionError, AttributeError) as error:
            raise SystemExit(f"benchmarks/few_channel_threads.py: --realtime needs SCHED_FIFO "
                             f"(root or CAP_SYS_NICE on Linux): {error}") from None
    keep_freed_memory()
    print(f"most threads {threads.most_threads()}; load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}; runnable {_runnable()}"
          f"{'; SCHED_FIFO' if args.realtime else ''}")
    for name, call, executable in (_conv2d(args.quick), _lenet5(args.quick)):
        _measure(name, call, executable, args.blocks, args.calls)
    print(f"load average at the end {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"runnable {_runnable()}")


def _runnable() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[3]


def _conv2d(quick: bool):
    n, hw = (4, 16) if quick else (64, 32)
    rng = np.random.default_rng(4)
    x = graphc.tensor(rng.standard_normal((n, 3, hw, hw)).astype(np.float32))
    w = graphc.tensor((rng.standard_normal((64, 3, 3, 3)) * 0.2).astype(np.float32))
    b = graphc.tensor(rng.standard_normal(64).astype(np.float32))
    compiled = graphc.compile(lambda x, w, b: graphc.conv2d(x, w, b, padding=1), backend="cpu")

    def call():
        with graphc.no_grad():
            return compiled(x, w, b)

    call()
    return f"conv2d N={n} 3->64 3x3 {hw}x{hw} (bias)", call, compiled.executable


def _lenet5(quick: bool):
    batch = 4 if quick else 64
    x, y = models.batches("lenet5", batch, 1, models.MlpSizes())[0]
    step = models.graphc_step(models.graphc_model("lenet5"))
    compiled = graphc.compile(step, backend="cpu")
    gx, gy = graphc.tensor(x), graphc.tensor(y)

    def call():
        return compiled(gx, gy)

    call()
    call()
    return f"LeNet-5 training step b{batch}", call, compiled.executable


def _measure(name: str, call, executable, blocks: int, calls: int) -> None:
    """Blocks of `calls` timed calls per count, interleaved; one line per count."""
    most = threads.most_threads()
    chooser = threads.ThreadChooser(most)
    seconds: dict[str, list[float]] = {c: [] for c in COUNTS}
    picked = {1: 0, most: 0}
    record = chooser.record

    def counted(n: int, s: float) -> None:
        picked[n] = picked.get(n, 0) + 1
        record(n, s)

    chooser.record = counted
    for _ in range(blocks):
        for count in COUNTS:
            executable.thread_chooser = chooser if count == "chosen" else \
                threads.ThreadChooser(most, fixed=int(count))
            call()  # the block's first call wakes or parks the team: not timed
            for _ in range(calls):
                start = time.perf_counter()
                call()
                seconds[count].append(time.perf_counter() - start)
    executable.thread_chooser = chooser
    one = float(np.median(seconds["1"]))
    for count in COUNTS:
        v = np.array(seconds[count]) * 1e3
        line = (f"{name}: {count:>6} thread(s): p5 {np.percentile(v, 5):.3f} ms, median "
                f"{np.median(v):.3f} ms ({np.median(v) / (one * 1e3):.2f}x one thread's)")
        if count == "chosen":
            line += f"; calls on 1 / {most} threads: {picked.get(1, 0)} / {picked.get(most, 0)}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
