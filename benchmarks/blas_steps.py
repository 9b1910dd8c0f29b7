"""graphc's compiled training steps on OpenBLAS against MKL, in alternating child processes.

    python -m benchmarks.blas_steps --step gpt_b16 --rounds 3 --calls 10

A process resolves its BLAS once (graphc.backends.cpu.blas), so the two cannot share one
process as `benchmarks.run`'s contenders do; instead each round runs one child per library
(GRAPHC_BLAS=openblas, GRAPHC_BLAS=mkl), in an order that alternates between rounds, and
each child times `--calls` compiled steps on one thread with its CPU clock (after 3 warm-up
calls; the compiled code comes from the disk cache, whose key names the BLAS). The figure
is the median over rounds of each child's median, and the ratio is taken per round (mkl /
openblas of the same round) so that a machine that slows down between rounds counts less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

STEPS = ("mlp_b64", "lenet5_b64", "gpt_b16", "resnet18_b32")


def _compiled_step(name: str):
    import graphc
    from benchmarks import model_steps, models

    if name in ("mlp_b64", "lenet5_b64"):
        family = name.split("_")[0]
        x, y = models.batch(family, 64)
        model = models.graphc_model(family)
    else:
        family = name.split("_")[0]
        shape = model_steps.FULL[family]
        graphc.manual_seed(0)
        model = model_steps.build(graphc, family, shape)
        x, y = model_steps.batch_of(family, shape)
    step = graphc.compile(models.graphc_step(model), backend="cpu")
    gx, gy = graphc.tensor(x), graphc.tensor(y)
    return lambda: step(gx, gy)


def _child(step: str, calls: int) -> None:
    run = _compiled_step(step)
    for _ in range(3):
        run()
    times = []
    for _ in range(calls):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    print(json.dumps(statistics.median(times)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--step", action="append", choices=STEPS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args.step[0], args.calls)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for step in args.step or STEPS:
        figures: dict[str, list[float]] = {"openblas": [], "mkl": []}
        for round_ in range(args.rounds):
            order = ("openblas", "mkl") if round_ % 2 == 0 else ("mkl", "openblas")
            for library in order:
                done = subprocess.run(
                    [sys.executable, "-m", "benchmarks.blas_steps", "--child", "--step", step,
                     "--calls", str(args.calls)], env=dict(env, GRAPHC_BLAS=library),
                    capture_output=True, text=True, check=True)
                figures[library].append(json.loads(done.stdout.strip().splitlines()[-1]))
        ratios = [m / o for m, o in zip(figures["mkl"], figures["openblas"])]
        print(f"{step:<13} openblas {statistics.median(figures['openblas']) * 1e3:8.2f} ms  "
              f"mkl {statistics.median(figures['mkl']) * 1e3:8.2f} ms  mkl/openblas "
              f"{statistics.median(ratios):.2f} (rounds: "
              f"{', '.join(f'{r:.2f}' for r in ratios)})", flush=True)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
