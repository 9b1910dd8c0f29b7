"""Data-parallel throughput on MPI: compiled DDP steps on N ranks against one rank.

    graphc launch -n 1 benchmarks/distributed.py      # one rank (the baseline)
    graphc launch -n 2 benchmarks/distributed.py      # two ranks
    python -m benchmarks.distributed [--repeat K]     # runs all three jobs (K times: medians)

Each rank runs one thread (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = 1, set by the driver)
and trains the compiled MLP 784-256-256-10 or LeNet-5 step at batch 64 per rank (SGD
momentum). Variants (see `rank_main`): DDP with blocking per-gradient allreduces (the
pipeline without the bucketing pass), DDP bucketed and overlapped (the default pipeline:
with every rank on this machine, its buckets, one per gradient, are written by the backward
into the node's shared-memory window and reduced there, each in one loop with the optimizer
update that reads it, graphc.backends.cpu.collective_shm), the same with
`gradient_as_bucket_view=True` (each bucket averaged in place in the window, the `.grad`s
views of it: no `.grad` copy), and the plain model without communication (the ranks only
share the machine). A third job, `--rank --no-window`, runs the bucketed variant
with the window off (pg_options node_window_bytes=0: buckets through MPI_Iallreduce), as
before the window. Throughput is
samples per second over all ranks, median of 5 alternating rounds of 30 steps; the speed-up
is against one process without DDP. On 2 ranks graphc.profile times the collective nodes'
kernels of the DDP variants (the allreduce time the step does not hide). The driver also
measures the alpha (latency) and beta (seconds per byte) of an MPI allreduce on this machine
and projects a ring allreduce of ResNet-18's and the GPT's gradients to 8, 64 and 512 ranks:
2 (p - 1) alpha + 2 (p - 1) / p * bytes * beta. Last, it says which setting of
gradient_as_bucket_view reaches the 1.8x goal on each model.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

STEPS, ROUNDS = 30, 5
GOAL = 1.8  # issue 17: 2 ranks x 1 thread against 1 rank x 1 thread
PARAMS = {"ResNet-18 (CIFAR)": 11_173_962, "GPT (n_embd 128, 4 layers)": 816_128}


VARIANTS = ("blocking", "bucketed", "view", "no-comm")


def rank_main(window: bool = True) -> None:
    """One rank: time the compiled steps of every variant; rank 0 prints one JSON line.

    blocking: DDP with a blocking MPI_Allreduce per gradient where the backward produced it
    (the pipeline without graphc.passes.bucket, as before the pass); bucketed: DDP through the
    default pipeline (buckets, MPI_Iallreduce started early, MPI_Wait before the update);
    view: bucketed with gradient_as_bucket_view=True (on the window, each bucket averaged in
    place in this rank's window bytes, the `.grad`s views of them: no `.grad` copy);
    no-comm: the plain model, no DDP (the ranks only share the machine): the bound on what
    any communication scheme can reach here. Rounds of the variants alternate."""
    import graphc
    import graphc.distributed as dist
    from benchmarks import models
    from graphc.nn.parallel import DistributedDataParallel
    from graphc.passes.fuse import fuse
    from graphc.passes.plan import plan_buffers
    from graphc.passes.simplify import simplify

    dist.init_process_group("mpi", pg_options=None if window else {"node_window_bytes": 0})
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {"world": world}
    variants = VARIANTS if window else ("bucketed",)
    for name in ("mlp", "lenet5"):
        steps = {}
        for variant in variants:
            model = models.graphc_model(name)
            if variant != "no-comm":
                model = DistributedDataParallel(
                    model, gradient_as_bucket_view=variant == "view")
            passes = [simplify, fuse, plan_buffers] if variant == "blocking" else None
            steps[variant] = graphc.compile(models.graphc_step(model), backend="cpu",
                                            passes=passes)
        x, y = models.batch(name, 64, models.MlpSizes())
        gx, gy = graphc.tensor(x), graphc.tensor(y)
        for compiled in steps.values():
            for _ in range(5):
                compiled(gx, gy)
        rates = {variant: [] for variant in variants}
        for _ in range(ROUNDS):
            for variant, compiled in steps.items():
                dist.barrier()
                start = time.perf_counter()
                for _ in range(STEPS):
                    compiled(gx, gy)
                dist.barrier()
                rates[variant].append(STEPS * 64 * world / (time.perf_counter() - start))
        for variant in variants:
            results[f"{name}/{variant}"] = statistics.median(rates[variant])
        if world > 1:
            for variant in ("blocking", "bucketed", "view") if window else ("bucketed",):
                results[f"{name}/{variant}/comm"] = _collective_seconds(steps[variant], gx, gy)
    if world > 1 and window:
        results["alpha"], results["beta"] = _alpha_beta(dist)
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


def _collective_seconds(compiled, x, y) -> float:
    """Seconds per step in the collective nodes' kernels (graphc.profile's per-kernel
    medians): the allreduce time the step does not hide (the MPI wait or the blocking
    MPI_Allreduce; on the window, the meeting and the sum), plus the bucket packing and
    averaging copies. On the window a bucket's wait is fused with the optimizer update that
    reads it (graphc.passes.fuse_waits), so its kernels, counted here, include that update.
    graphc.profile gives each run fresh output arrays, so a wait that writes straight into
    the .grad outputs (the window path) also pays their first-touch page faults here, which
    real calls do not."""
    import graphc

    report = graphc.profile(compiled, x, y, repeat=30)
    return sum(row.seconds for row in report.rows
               if row.op.startswith(("all_reduce", "fused(all_reduce_wait")))


def _alpha_beta(dist) -> tuple[float, float]:
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
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 1
    jobs = {1: (1, []), 2: (2, []), "mpi": (2, ["--no-window"])}
    runs: dict = {job: [] for job in jobs}
    for _ in range(repeat):  # the three jobs, `repeat` times: medians of each figure
        for job, (n, extra) in jobs.items():
            done = subprocess.run([mpiexec, "-n", str(n), sys.executable, __file__, "--rank",
                                   *extra], capture_output=True, text=True, env=env,
                                  timeout=900)
            line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")),
                        None)
            if line is None:
                print(done.stdout, done.stderr, sep="\n")
                return 1
            runs[job].append(json.loads(line[len("RESULT "):]))
    found = {job: {key: statistics.median(r[key] for r in results) for key in results[0]}
             for job, results in runs.items()}
    load = os.getloadavg()
    command = "python -m benchmarks.distributed" + (f" --repeat {repeat}" if repeat > 1 else "")
    print(f"command: `{command}`; load average {load[0]:.2f} (1 min), {load[1]:.2f} (5 min), "
          f"{load[2]:.2f} (15 min)\n")
    print("| step (batch 64 per rank, 1 thread per rank) | 1 rank, no DDP | 2 ranks, blocking "
          "allreduces | 2 ranks, bucketed, MPI_Iallreduce | 2 ranks, bucketed, shared-memory "
          "window | 2 ranks, window, gradient_as_bucket_view | 2 ranks, no communication |")
    print("|---|---|---|---|---|---|---|")
    for name, label in (("mlp", "MLP 784-256-256-10"), ("lenet5", "LeNet-5")):
        one = found[1][f"{name}/no-comm"]
        rates = [found[2][f"{name}/blocking"], found["mpi"][f"{name}/bucketed"],
                 found[2][f"{name}/bucketed"], found[2][f"{name}/view"],
                 found[2][f"{name}/no-comm"]]
        cells = [f"{rate:,.0f} samples/s ({rate / one:.2f}x)" for rate in rates]
        print(f"| {label} | {one:,.0f} samples/s | " + " | ".join(cells) + " |")
    for name, label in (("mlp", "MLP"), ("lenet5", "LeNet-5")):
        one = found[1][f"{name}/no-comm"]
        reached = [what for what, key in (("default", "bucketed"), ("view", "view"))
                   if found[2][f"{name}/{key}"] / one >= GOAL]
        print(f"\n{label}: the {GOAL}x goal on the window is reached by "
              f"{' and '.join(reached) or 'neither setting'} (default: "
              f"gradient_as_bucket_view=False; view: True)", end="")
    print()
    print("\n| step | collective kernels per step, blocking | bucketed, MPI_Iallreduce | "
          "bucketed, window | window, bucket views | hidden (MPI_Iallreduce) |")
    print("|---|---|---|---|---|---|")
    for name, label in (("mlp", "MLP"), ("lenet5", "LeNet-5")):
        blocking, bucketed, view = (found[2][f"{name}/{v}/comm"]
                                    for v in ("blocking", "bucketed", "view"))
        mpi = found["mpi"][f"{name}/bucketed/comm"]
        print(f"| {label} | {blocking * 1e6:.0f} us | {mpi * 1e6:.0f} us | "
              f"{bucketed * 1e6:.0f} us | {view * 1e6:.0f} us | {1 - mpi / blocking:.0%} |")
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
        rank_main(window="--no-window" not in sys.argv)
    else:
        sys.exit(main())
