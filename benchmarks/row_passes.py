"""The GPT training step with and without the cpu pipeline's row passes, in one process.

    python -m benchmarks.row_passes                 # 30 interleaved rounds, 1 thread, CPU time
    python -m benchmarks.row_passes --rounds 10 --quick

Both variants are compiled from the same weights (benchmarks/model_steps.py's GPT, n_embd
128, 4 layers, context 64, batch 16; `--quick`: its smoke size): one with the cpu backend's
default passes, one without `share_reshape_copies`, `fuse_rows` and `recompute_row_values`
(docs/passes.md, "Row programs (cpu)"). It prints each variant's median step time over
interleaved rounds (CPU clock, one thread for OpenMP and OpenBLAS), its kernel count, and
its non-GEMM kernel time from `graphc.profile`, kernel by kernel
(docs/performance.md, "GPT's non-GEMM kernels").
"""

from __future__ import annotations

import argparse
import os
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds (30)")
    parser.add_argument("--quick", action="store_true", help="the GPT's smoke size")
    parser.add_argument("--top", type=int, default=14, help="non-GEMM kernel kinds listed")
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
    row_passes = ("share_reshape_copies", "fuse_rows", "recompute_row_values")
    steps = {}
    for name in ("without", "with"):
        graphc.manual_seed(0)
        model = model_steps.gpt(graphc, **shape)
        passes = [p for p in default_passes(None, "cpu")
                  if name == "with" or p.__name__ not in row_passes]
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
            if not row.flops:
                kind = kinds.setdefault(row.op if len(row.op) < 48 else row.op[:47] + "...",
                                        [0.0, 0])
                kind[0] += row.seconds
                kind[1] += 1
        rest = sum(seconds for seconds, _ in kinds.values())
        print(f"{name} the row passes: step {np.median(times[name]) * 1e3:.2f} ms (median of "
              f"{args.rounds}), {len(report.rows)} kernels, non-GEMM {rest * 1e3:.2f} ms in "
              f"{sum(n for _, n in kinds.values())} kernels")
        for op, (seconds, n) in sorted(kinds.items(), key=lambda kv: -kv[1][0])[:args.top]:
            print(f"  {seconds * 1e6:9.1f} us {n:3d}x {op}")
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
