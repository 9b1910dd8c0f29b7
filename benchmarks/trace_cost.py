"""Trace cost against batch size: tracing + passes (no backend) of one MLP training step.

Tracing runs the step abstractly (graphc.dispatch.abstract_eval: shapes and dtypes, no
kernel), so its cost follows the graph's size, not the tensors'; this benchmark checks that
claim. For each batch size it builds the benchmark MLP (784-256-256-10, SGD momentum, the
step of benchmarks.models), runs one eager step so the momentum buffers exist (the trace of
a steady-state step), then times `trace_call` plus `run_pipeline(default_passes())`
(simplify, fuse, plan_buffers; the verifier off, as graphc.compile's second graph) and
reports the fastest of `--repeat` runs (as timeit does: on a shared machine the other runs
measure the neighbours too), with the median beside it. The eager trace (`abstract=False`:
every kernel runs, as before abstract tracing) is timed alongside for comparison. The target:
the abstract cost at batch 8,192 is at most 1.3x the cost at batch 8.

    python -m benchmarks.trace_cost                   # batches 8 and 8192, a table
    python -m benchmarks.trace_cost --batches 8 64 8192 --repeat 9 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import graphc
from benchmarks.models import MlpSizes, batch, graphc_model, graphc_step
from graphc.jit.tracer import trace_call
from graphc.passes import default_passes, run_pipeline

TARGET_RATIO = 1.3


def _step_for(size: int):
    model = graphc_model("mlp", MlpSizes())
    step = graphc_step(model)
    x, y = batch("mlp", size)
    args = (graphc.tensor(x), graphc.tensor(y))
    step(*args)  # eager: the optimizer's momentum buffers exist from here on
    return step, args


def trace_and_passes(step, args: tuple, abstract: bool) -> tuple[float, int]:
    """Seconds to trace `step(*args)` and run the default passes on it; the node count."""
    start = time.perf_counter()
    traced = trace_call(step, args, abstract=abstract)
    graph, _ = run_pipeline(traced.graph, default_passes())
    seconds = time.perf_counter() - start
    traced.restore()  # leave the model as it was (an eager trace wrote into it)
    return seconds, len(graph.nodes)


def measure(sizes: list[int], repeat: int) -> list[dict]:
    """Per batch size: the fastest and the median abstract trace + passes time, and the
    fastest eager one. The sizes take turns within each repetition, so drifts of the machine
    fall on all of them alike."""
    steps = [_step_for(size) for size in sizes]
    for step, args in steps:
        trace_and_passes(step, args, True)  # warm-up: imports, first-use set-up
    abstract: list[list[float]] = [[] for _ in sizes]
    eager: list[list[float]] = [[] for _ in sizes]
    nodes = [0] * len(sizes)
    for r in range(repeat):
        for k, (step, args) in enumerate(steps):
            seconds, nodes[k] = trace_and_passes(step, args, True)
            abstract[k].append(seconds)
            if r < max(1, repeat // 3):
                eager[k].append(trace_and_passes(step, args, False)[0])
    return [{"batch": size, "nodes": nodes[k], "abstract_s": min(abstract[k]),
             "abstract_median_s": statistics.median(abstract[k]), "eager_s": min(eager[k])}
            for k, size in enumerate(sizes)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 8192])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", help="also write the rows to this file")
    options = parser.parse_args(argv)
    rows = measure(options.batches, options.repeat)
    base = rows[0]["abstract_s"]
    print(f"{'batch':>7} {'nodes':>6} {'abstract ms':>12} {'(median)':>9} {'vs first':>9} "
          f"{'eager ms':>10}")
    for row in rows:
        row["ratio"] = row["abstract_s"] / base
        print(f"{row['batch']:>7} {row['nodes']:>6} {1e3 * row['abstract_s']:>12.2f} "
              f"{1e3 * row['abstract_median_s']:>9.2f} {row['ratio']:>8.2f}x "
              f"{1e3 * row['eager_s']:>10.2f}")
    ratio = rows[-1]["abstract_s"] / rows[0]["abstract_s"]
    verdict = "meets" if ratio <= TARGET_RATIO else "misses"
    print(f"abstract trace + passes, batch {rows[-1]['batch']} / batch {rows[0]['batch']}: "
          f"{ratio:.2f}x ({verdict} the {TARGET_RATIO}x target); eager trace: "
          f"{rows[-1]['eager_s'] / rows[0]['eager_s']:.1f}x")
    if options.json:
        with open(options.json, "w") as f:
            json.dump({"rows": rows, "target_ratio": TARGET_RATIO}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
