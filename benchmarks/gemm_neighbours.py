"""The GPT training step with and without the cpu pipeline's GEMM-neighbour changes.

    python -m benchmarks.gemm_neighbours               # 30 interleaved rounds, 1 thread, CPU
    python -m benchmarks.gemm_neighbours --rounds 10 --quick

Both variants are compiled in one process from the same weights (benchmarks/model_steps.py's
GPT, n_embd 128, 4 layers, context 64, batch 16; `--quick`: its smoke size), each with its
own GRAPHC_CACHE_DIR: "without" is the cpu pipeline without `lay_out_gemm_outputs` (the head
merges copied after their GEMM), "with" the default cpu pipeline. It prints each variant's
median step time over interleaved rounds (CPU clock, one thread for OpenMP and OpenBLAS), its
kernel count, and from `graphc.profile` the time of the kernels around the GEMMs: copies
(reshape/permute/copy/concat) and column sums (reduce_sum), and each kernel's total
(docs/performance.md, "GPT's GEMM neighbours").
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

NEIGHBOURS = ("reshape", "permute", "copy", "concat", "reduce_sum")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds (30)")
    parser.add_argument("--quick", action="store_true", help="the GPT's smoke size")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import numpy as np

    import graphc
    from benchmarks import model_steps, models
    from graphc.passes import default_passes

    shape = (model_steps.QUICK if args.quick else model_steps.FULL)["gpt"]
    x, y = model_steps.batch_of("gpt", shape)
    gx, gy = graphc.tensor(x), graphc.tensor(y)
    steps = {}
    root = tempfile.mkdtemp(prefix="gemm_neighbours.")
    for name in ("without", "with"):
        os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, name)  # read at each use
        graphc.manual_seed(0)
        model = model_steps.gpt(graphc, **shape)
        passes = [p for p in default_passes(None, "cpu")
                  if name == "with" or p.__name__ != "lay_out_gemm_outputs"]
        step = graphc.compile(models.graphc_step(model), backend="cpu", passes=passes)
        for _ in range(3):  # the first calls trace and create the momentum buffers
            step(gx, gy)
        steps[name] = step
    times: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(args.rounds):
        for name in (list(steps) if r % 2 else list(steps)[::-1]):
            start, calls = time.process_time(), 0
            while time.process_time() - start < 0.05:
                steps[name](gx, gy)
                calls += 1
            times[name].append((time.process_time() - start) / calls)
    for name, step in steps.items():
        report = graphc.profile(step, gx, gy, repeat=21)
        kinds: dict[str, list] = {}
        for row in report.rows:
            if row.op in NEIGHBOURS:
                kind = kinds.setdefault(f"{row.op} {row.shape}", [0.0, 0])
                kind[0] += row.seconds
                kind[1] += 1
        near = sum(seconds for seconds, _ in kinds.values())
        total = sum(row.seconds for row in report.rows)
        print(f"{name} lay_out_gemm_outputs: step {np.median(times[name]) * 1e3:.2f} ms "
              f"(median of {args.rounds}), {len(report.rows)} kernels summing to "
              f"{total * 1e3:.2f} ms; copies and column sums {near * 1e3:.2f} ms in "
              f"{sum(n for _, n in kinds.values())} kernels")
        for op, (seconds, n) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
            print(f"  {seconds * 1e6:9.1f} us {n:3d}x {op}")
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
