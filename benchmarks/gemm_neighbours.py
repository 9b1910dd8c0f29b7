"""A training step with and without the cpu pipeline's GEMM-neighbour passes, in one process.

    python -m benchmarks.gemm_neighbours               # the GPT, 30 interleaved rounds
    python -m benchmarks.gemm_neighbours --step mlp_b64 --step lstm --step vae --step resnet18
    python -m benchmarks.gemm_neighbours --rounds 10 --quick

Both variants are compiled in one process from the same weights (the GPT of
benchmarks/model_steps.py, n_embd 128, 4 layers, context 64, batch 16, `--quick` its smoke
size; or the MLP 784-256-256-10 batch 64, the LSTM, VAE or ResNet-18 CIFAR batch 32 steps of
the benchmarks), each with its own GRAPHC_CACHE_DIR: "without" is the cpu pipeline without
`fuse_gemm_column_sums` and `lay_out_gemm_outputs`, its schedules leaving column sums where
they fall (graphc.passes.plan.HOIST_REDUCTION_RATIO = 0 while it compiles), "with" the
default cpu pipeline. A step
whose planned graph is the same both ways is reported as such and not timed. Otherwise it
prints each variant's median step time over interleaved rounds (CPU clock, one thread for
OpenMP and OpenBLAS), its kernel count, and from `graphc.profile` the time of the kernels
around the GEMMs: copies (reshape/permute/copy/concat) and lone column sums (reduce_sum)
(docs/performance.md, "GPT's GEMM neighbours").
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchmarks.harness import cache_root, run_with_threads

NEIGHBOURS = ("reshape", "permute", "copy", "concat", "reduce_sum")


CHANGES = ("fuse_gemm_column_sums", "lay_out_gemm_outputs")


def _step(name: str, quick: bool):
    """(graphc training step, its arguments as graphc tensors) of `name`, from seed 0."""
    import graphc
    from benchmarks import model_steps, models

    graphc.manual_seed(0)
    if name in ("gpt", "resnet18"):
        shape = (model_steps.QUICK if quick else model_steps.FULL)[name]
        model = model_steps.build(graphc, name, shape)
        step, args = models.graphc_step(model), model_steps.batch_of(name, shape)
    elif name == "mlp_b64":
        step = models.graphc_step(models.graphc_model("mlp"))
        args = models.batch("mlp", 8 if quick else 64)
    else:  # lstm, vae: the compile-only families' steps
        step, args = model_steps.training_step(name, model_steps.COMPILE_ONLY[name])
    return step, tuple(graphc.tensor(a) for a in args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds (30)")
    parser.add_argument("--quick", action="store_true", help="the GPT's smoke size")
    parser.add_argument("--step", action="append", choices=("gpt", "mlp_b64", "lstm", "vae",
                                                             "resnet18"),
                        help="the training step(s) compared (default: gpt)")
    args = parser.parse_args(argv)
    # one thread for OpenMP and OpenBLAS, set before they load: numpy (imported with the
    # harness) has loaded OpenBLAS already, so the process starts again with them set (set
    # here, its GEMMs had run on two threads, CPU time counting both)
    run_with_threads("benchmarks.gemm_neighbours", 1, sys.argv[1:] if argv is None else argv)
    for name in args.step or ["gpt"]:
        with cache_root("gemm_neighbours.") as root:
            _compare(name, args.rounds, args.quick, root)
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


def _compare(model_name: str, rounds: int, quick: bool, root: str) -> None:
    import numpy as np

    import graphc
    from graphc.ir.printer import format_graph
    from graphc.passes import default_passes, plan

    steps, arguments = {}, {}
    for name in ("without", "with"):
        os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, name)  # read at each use
        train, args = _step(model_name, quick)
        passes = [p for p in default_passes(None, "cpu")
                  if name == "with" or p.__name__ not in CHANGES]
        step = graphc.compile(train, backend="cpu", passes=passes)
        ratio = plan.HOIST_REDUCTION_RATIO
        if name == "without":  # the plan's schedules as they were: column sums not hoisted
            plan.HOIST_REDUCTION_RATIO = 0
        try:
            for _ in range(3):  # the first calls trace and create the optimizer's state
                step(*args)
        finally:
            plan.HOIST_REDUCTION_RATIO = ratio
        steps[name], arguments[name] = step, args
    same = format_graph(steps["with"].optimized_graph) == \
        format_graph(steps["without"].optimized_graph)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(rounds if not same else 0):
        for name in (list(steps) if r % 2 else list(steps)[::-1]):
            start, calls = time.process_time(), 0
            while time.process_time() - start < 0.05:
                steps[name](*arguments[name])
                calls += 1
            times[name].append((time.process_time() - start) / calls)
    if same:
        print(f"{model_name}: the same planned graph with and without the changes")
        return
    by_op: dict[str, dict[str, float]] = {}
    for name, step in steps.items():
        report = graphc.profile(step, *arguments[name], repeat=21)
        for row in report.rows:
            by_op.setdefault(row.op[:40], {}).setdefault(name, 0.0)
            by_op[row.op[:40]][name] += row.seconds
        kinds: dict[str, list] = {}
        for row in report.rows:
            if row.op in NEIGHBOURS:
                kind = kinds.setdefault(f"{row.op} {row.shape}", [0.0, 0])
                kind[0] += row.seconds
                kind[1] += 1
        near = sum(seconds for seconds, _ in kinds.values())
        total = sum(row.seconds for row in report.rows)
        print(f"{model_name} {name} the changes: step "
              f"{np.median(times[name]) * 1e3:.3f} ms (median of {rounds}), "
              f"{len(report.rows)} kernels summing to {total * 1e3:.2f} ms; copies and "
              f"column sums {near * 1e3:.2f} ms in {sum(n for _, n in kinds.values())} kernels")
        for op, (seconds, n) in sorted(kinds.items(), key=lambda kv: -kv[1][0])[:8]:
            print(f"  {seconds * 1e6:9.1f} us {n:3d}x {op}")
    change = {op: t.get("with", 0.0) - t.get("without", 0.0) for op, t in by_op.items()}
    print("kernel time by op, with - without (the largest changes):")
    for op, delta in sorted(change.items(), key=lambda kv: -abs(kv[1]))[:10]:
        print(f"  {delta * 1e6:+9.1f} us  {op}")


if __name__ == "__main__":
    main()
