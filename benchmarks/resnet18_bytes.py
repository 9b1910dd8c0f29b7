"""Every byte of ResNet-18's memory-bound kernels: each kernel's bytes read + written against
its time inside the step, next to a copy's rate on this machine.

    python -m benchmarks.resnet18_bytes                  # the table, worst first
    python -m benchmarks.resnet18_bytes --repeat 5 --limit 40
    python -m benchmarks.resnet18_bytes --ab graphc.backends.cpu.reductions.PREFETCH_ROWS=False

The step is benchmarks/model_steps.py's ResNet-18 (CIFAR, width 64, batch 32), profiled under
graphc.profile at one thread (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = 1, or `--threads`; each
kernel's median of `--repeat` runs). Every kernel that is not a convolution or a GEMM is
listed, grouped by its role (batch-norm statistics, the fused elementwise groups by their op
lists), with its nominal bytes (each input and output once: graphc.profile's figure) and the
time those bytes would take at the anchor: numpy's copy of a 16 MiB float32 array into another
(one thread, CPU time, median of 9 rounds), counted as bytes read + written. "excess" is the
kernel's time minus that floor: what a kernel far from memory speed could still give.

`--ab MODULE.NAME=VALUE ...`: an in-process A/B of the step instead (`compare_steps`):
"default" against "changed", compiled with those module attributes set (Python literals),
each with its own GRAPHC_CACHE_DIR, `--rounds` alternated rounds (with `--threads 2`, the CPU
time of both threads: the work, not the wall clock). `--set MODULE.NAME=VALUE
...`: the table of the step compiled with those settings.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager

import numpy as np

COPY_FLOATS = 1 << 22  # 16 MiB of float32: past the caches, as the step's planes are


def copy_rate(rounds: int = 9) -> float:
    """Bytes read + written per second of numpy's copy of COPY_FLOATS floats (CPU time)."""
    src = np.random.default_rng(0).standard_normal(COPY_FLOATS).astype(np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    rates = []
    for _ in range(rounds):
        start, count = time.process_time(), 0
        while time.process_time() - start < 0.05:
            np.copyto(dst, src)
            count += 1
        rates.append(2 * src.nbytes * count / (time.process_time() - start))
    return statistics.median(rates)


def _role(node) -> str | None:
    """The row's group name, or None for a convolution, GEMM or fused convolution."""
    from graphc.ops.fused import FusedBody

    if node.op in ("conv2d", "conv2d_channel_sums", "conv2d_input_grad", "conv2d_weight_grad",
                   "matmul"):
        return None
    if node.op != "fused":
        return node.op
    body = FusedBody.of_node(node)
    if body.anchor is not None:
        return None
    ops = [i.op for i in body.instructions if i.op not in ("full", "broadcast_to")]
    return "fused(" + ",".join(ops) + ")"


def byte_table(repeat: int, limit: int, rate: float) -> str:
    """A markdown table of the step's memory-bound kernels (see the module docstring)."""
    import graphc
    from benchmarks import model_steps, models

    shape = model_steps.FULL["resnet18"]
    graphc.manual_seed(0)
    model = model_steps.build(graphc, "resnet18", shape)
    x, y = model_steps.batch_of("resnet18", shape)
    step = graphc.compile(models.graphc_step(model), backend="cpu")
    report = graphc.profile(step, graphc.tensor(x), graphc.tensor(y), repeat=repeat)
    producer = {v.name: node for node in report.graph.nodes for v in node.outputs}
    groups: dict[str, list] = defaultdict(lambda: [0, 0.0, 0])
    for row in report.rows:
        node = producer.get(row.values[0]) if row.values else None
        role = _role(node) if node is not None else row.op
        if role is None:
            continue
        entry = groups[role]
        entry[0] += 1
        entry[1] += row.seconds
        entry[2] += row.bytes
    total_time = sum(e[1] for e in groups.values())
    total_bytes = sum(e[2] for e in groups.values())
    lines = [f"native step {report.total * 1e3:.1f} ms; memory-bound kernels "
             f"{total_time * 1e3:.1f} ms for {total_bytes / 1e6:.0f} MB "
             f"({total_bytes / rate * 1e3:.1f} ms at the copy's {rate / 1e9:.1f} GB/s)", "",
             "| kernels | count | time | MB | GB/s | at copy speed | excess |",
             "|---|---|---|---|---|---|---|"]
    ranked = sorted(groups.items(), key=lambda kv: -(kv[1][1] - kv[1][2] / rate))
    for name, (count, seconds, nbytes) in ranked[:limit]:
        floor = nbytes / rate
        lines.append(f"| {name[:70]} | {count} | {seconds * 1e3:.2f} ms | {nbytes / 1e6:.0f} | "
                     f"{nbytes / seconds / 1e9 if seconds else 0:.1f} | {floor * 1e3:.2f} ms | "
                     f"{(seconds - floor) * 1e3:.2f} ms |")
    return "\n".join(lines)


def resnet18_step():
    """(the training step function, its arguments) of the model_steps ResNet-18 (batch 32)."""
    import graphc
    from benchmarks import model_steps, models

    shape = model_steps.FULL["resnet18"]
    model = model_steps.build(graphc, "resnet18", shape)
    x, y = model_steps.batch_of("resnet18", shape)
    return models.graphc_step(model), (graphc.tensor(x), graphc.tensor(y))


def compare_steps(names, variant, rounds: int, profile_rounds: int = 3) -> str:
    """The ResNet-18 step's variants in one process (harness.step_ab; `variant(name)` a
    context manager): each one's median CPU time per step and its memory-bound kernels'
    time by op list (medians over `profile_rounds` profiles of 5 runs), as text."""
    from benchmarks.harness import step_ab

    times, profiled = step_ab(names, variant, resnet18_step, rounds, profile_rounds, repeat=5)
    lines = []
    for name in profiled:
        rows, seconds = profiled[name]
        ops: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for row in rows:
            if not row.op.startswith(("conv2d", "matmul", "fused(conv2d")):
                ops[row.op][0] += 1
                ops[row.op][1] += seconds[row.step]
        ordered = sorted(times[name])
        lines.append(f"{name}: step {statistics.median(ordered) * 1e3:.1f} ms (median of "
                     f"{rounds}, quartiles {ordered[len(ordered) // 4] * 1e3:.1f}-"
                     f"{ordered[(3 * len(ordered)) // 4] * 1e3:.1f}); kernels "
                     f"{sum(seconds.values()) * 1e3:.1f} ms, memory-bound "
                     f"{sum(t for _, t in ops.values()) * 1e3:.1f} ms")
        for op, (count, total) in sorted(ops.items(), key=lambda kv: -kv[1][1])[:8]:
            lines.append(f"    {op[:60]:<60} {count:4d} kernels {total * 1e3:7.2f} ms")
    return "\n".join(lines)


@contextmanager
def changed(root: str, name: str, settings: list[str]):
    """Under variant `name` ("default" or "changed": `settings` applied, each
    "package.module.NAME=literal"), with the variant's own GRAPHC_CACHE_DIR."""
    from benchmarks.harness import switched

    switches = {}
    for setting in settings:
        target, value = setting.split("=", 1)
        module_name, attr = target.rsplit(".", 1)
        switches[importlib.import_module(module_name), attr] = ast.literal_eval(value)
    with switched(root, name, switches, name == "changed"):
        yield


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="profiled runs (5)")
    parser.add_argument("--limit", type=int, default=30, help="rows shown (30)")
    parser.add_argument("--ab", nargs="+", metavar="MODULE.NAME=VALUE",
                        help="an in-process step A/B: default against these settings")
    parser.add_argument("--rounds", type=int, default=9, help="A/B rounds (9)")
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP/OpenBLAS threads (1); CPU time then counts every thread's")
    parser.add_argument("--set", nargs="+", default=[], metavar="MODULE.NAME=VALUE",
                        help="the table of the step compiled with these settings")
    args = parser.parse_args(argv)
    from benchmarks.harness import cache_root, run_with_threads

    run_with_threads("benchmarks.resnet18_bytes", args.threads,
                     sys.argv[1:] if argv is None else argv)
    print(f"threads: {args.threads}; load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))
    if args.ab:
        with cache_root("resnet18_bytes.") as root:
            print(compare_steps(("default", "changed"),
                                lambda name: changed(root, name, args.ab), args.rounds))
        print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))
        return
    rate = copy_rate()
    with cache_root("resnet18_bytes.") as root, changed(root, "changed", args.set):
        print(byte_table(args.repeat, args.limit, rate), flush=True)
    print(f"copy anchor again: {copy_rate() / 1e9:.1f} GB/s")
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
