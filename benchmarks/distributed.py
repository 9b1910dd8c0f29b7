"""Data-parallel throughput on MPI: compiled DDP steps on N ranks against one rank.

    graphc launch -n 1 benchmarks/distributed.py      # one rank (the baseline)
    graphc launch -n 2 benchmarks/distributed.py      # two ranks
    python -m benchmarks.distributed                  # runs both and prints the table

Each rank runs one thread (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = 1, set by the driver)
and trains the compiled MLP 784-256-256-10 or LeNet-5 step at batch 64 per rank (SGD
momentum, DDP averaging in the graph: graphc.ops.collective). Throughput is samples per
second over all ranks, median of 5 timed rounds of 30 steps. The driver also measures the
alpha (latency) and beta (seconds per byte) of an MPI allreduce on this machine and
projects a ring allreduce of ResNet-18's and the GPT's gradients to 8, 64 and 512 ranks:
2 (p - 1) alpha + 2 (p - 1) / p * bytes * beta.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

STEPS, ROUNDS = 30, 5
PARAMS = {"ResNet-18 (CIFAR)": 11_173_962, "GPT (n_embd 128, 4 layers)": 816_128}


def rank_main() -> None:
    """One rank: time the compiled DDP steps; rank 0 prints one JSON line."""
    import numpy as np

    import graphc
    import graphc.distributed as dist
    from benchmarks import models
    from graphc.nn.parallel import DistributedDataParallel

    dist.init_process_group("mpi")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {"world": world}
    for name in ("mlp", "lenet5"):
        model = DistributedDataParallel(models.graphc_model(name))
        compiled = graphc.compile(models.graphc_step(model), backend="cpu")
        x, y = models.batch(name, 64, models.MlpSizes())
        gx, gy = graphc.tensor(x), graphc.tensor(y)
        for _ in range(5):
            compiled(gx, gy)
        rates = []
        for _ in range(ROUNDS):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(STEPS):
                compiled(gx, gy)
            dist.barrier()
            rates.append(STEPS * 64 * world / (time.perf_counter() - start))
        results[name] = statistics.median(rates)
    if world > 1:
        results["alpha"], results["beta"] = _alpha_beta(dist, np)
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


def _alpha_beta(dist, np) -> tuple[float, float]:
    """Median allreduce seconds of 8 bytes (alpha) and the slope per byte up to 16 MB."""
    import graphc

    def seconds(n: int) -> float:
        t = graphc.zeros(n)
        samples = []
        for _ in range(15):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            samples.append(time.perf_counter() - start)
        return statistics.median(samples)

    small, big = seconds(2), seconds(4 * 2**20)
    return small, (big - small) / (16 * 2**20)


def main() -> int:
    from graphc.tools.launch import find_mpiexec

    mpiexec = find_mpiexec()
    if mpiexec is None:
        print("benchmarks.distributed: no mpiexec (pip install 'graphc[distributed]')")
        return 1
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    found = {}
    for n in (1, 2):
        done = subprocess.run([mpiexec, "-n", str(n), sys.executable, __file__, "--rank"],
                              capture_output=True, text=True, env=env, timeout=900)
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(done.stdout, done.stderr, sep="\n")
            return 1
        found[n] = json.loads(line[len("RESULT "):])
    load = os.getloadavg()[0]
    print(f"command: `python -m benchmarks.distributed`; load average {load:.2f}\n")
    print("| step (batch 64 per rank, 1 thread per rank) | 1 rank | 2 ranks | speed-up |")
    print("|---|---|---|---|")
    for name, label in (("mlp", "MLP 784-256-256-10"), ("lenet5", "LeNet-5")):
        one, two = found[1][name], found[2][name]
        print(f"| {label} | {one:,.0f} samples/s | {two:,.0f} samples/s | {two / one:.2f}x |")
    alpha, beta = found[2]["alpha"], found[2]["beta"]
    print(f"\nallreduce on this machine: alpha {alpha * 1e6:.1f} us, beta "
          f"{beta * 1e9:.3f} ns/byte ({1 / beta / 1e9:.1f} GB/s)\n")
    print("| gradients (float32) | 8 ranks | 64 ranks | 512 ranks |")
    print("|---|---|---|---|")
    for label, params in PARAMS.items():
        size = 4 * params
        cells = [2 * (p - 1) * alpha + 2 * (p - 1) / p * size * beta for p in (8, 64, 512)]
        print(f"| {label}, {size / 2**20:.1f} MiB | " +
              " | ".join(f"{c * 1e3:.1f} ms" for c in cells) + " |")
    return 0


if __name__ == "__main__":
    if "--rank" in sys.argv:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        rank_main()
    else:
        sys.exit(main())
