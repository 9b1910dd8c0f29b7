"""The MLP 784-256-256-10 batch-64 SGD step on one thread and on two, wall clock, per call,
with and without its forward products' row chunks forked, in one process.

    python -m benchmarks.mlp_threads                    # 12 interleaved blocks of 100 calls
    python -m benchmarks.mlp_threads --blocks 4 --calls 30 --profile
    python -m benchmarks.mlp_threads --fork             # what a fork and join costs
    python -m benchmarks.mlp_threads --realtime         # each timed block under SCHED_FIFO
    python -m benchmarks.mlp_threads --torch            # PyTorch eager's step alongside

Variants, each compiled with its own GRAPHC_CACHE_DIR (benchmarks.harness.compiled_variants):
- "before": a loop of generated GEMMs weighs only its outputs against
  kernels.PARALLEL_MIN_ELEMENTS (main before the ninth session; for this step the same
  decisions as its rule, which weighed column chunks by k): W1 @ x^T and W2 @ h^T, two row
  chunks of 128 x 64 each, run serially;
- "after": the default, `kernels.gemm_work` (multiply-adds over GEMM_MACS_PER_ELEMENT): both
  fork.
Each variant runs in blocks of `--calls` timed calls on a forced count (`ThreadChooser(
fixed=n)`: "1t", "2t") and on a fresh chooser ("chosen", as benchmarks.run gets it), the
blocks of all variants and counts interleaved, the order rotating. Each block starts with
untimed calls (the team wakes or parks). Per variant and count it prints the median over
blocks of each block's median and 20th percentile (the calls no other task interrupted),
the calling process's CPU time per call on one thread (the work itself), and for "chosen"
how many calls ran on each count. `--torch`: PyTorch eager's step of the same model and
weights joins the blocks on one thread and on two (`torch.set_num_threads`), and each
variant's figures over its are printed (the issue's target is <= 0.6x). `--profile`: each
kernel's time at one and two threads, from a profiling build run back to back (`_profiles`;
docs/performance.md, "The MLP b64 step on two threads (ninth session)"). `--fork`: a forked
kernel of 64 floats called after busy gaps of the calling thread (the serial kernels between
two forked ones), at one and two threads: what a fork and join costs while the team spins
and once it has gone to sleep.

Two threads wait for a core the OS gives to other work: read the load average printed at
the start and the end (docs/performance.md, "Threads: one owner of the cores"). `--realtime`
(root) puts every thread of the process under SCHED_FIFO for each timed block only (tens of
milliseconds; Linux keeps 5% of every second for the other tasks), as if the machine were
idle, and tells the "chosen" chooser a core is free (the starved tasks still count as
runnable in /proc/loadavg, its gate).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import time

import numpy as np

from benchmarks.harness import cache_root, compiled_variants, keep_freed_memory, switched

VARIANTS = ("before", "after")
TORCH = "torch"  # PyTorch eager's step (`--torch`): one thread and two, no chooser
COUNTS = ("1t", "2t", "chosen")


def outputs_only(products, m, n, k):
    """The rule before the ninth session (for this step's loops): outputs, not their k."""
    return products * m * n


@contextlib.contextmanager
def variant(name: str, root: str):
    """While compiling (or profiling) variant `name`: its cache dir and GEMM-loop weight."""
    from graphc.backends.cpu import kernels

    with switched(root, name, {(kernels, "gemm_work"): outputs_only}, name == "before"):
        yield


def load() -> str:
    with open("/proc/loadavg") as f:
        fields = f.read().split()
    return f"load average {' '.join(fields[:3])}, runnable {fields[3]}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=12, help="interleaved blocks (12)")
    parser.add_argument("--calls", type=int, default=100, help="timed calls a block (100)")
    parser.add_argument("--profile", action="store_true",
                        help="also each kernel's time at one and two threads")
    parser.add_argument("--fork", action="store_true",
                        help="only the cost of a fork and join after busy gaps")
    parser.add_argument("--realtime", action="store_true",
                        help="SCHED_FIFO while timing each block (root)")
    parser.add_argument("--torch", action="store_true",
                        help="also PyTorch eager's step, on one thread and on two")
    args = parser.parse_args(argv)
    import graphc
    from benchmarks import models

    most = two_thread_setup(parser, "mlp_threads", "", args.realtime,
                            blocks=args.blocks, calls=args.calls)
    if args.fork:
        with cache_root("mlp_threads.") as root:
            _fork_costs(most, root, args.calls, args.realtime)
        print(f"at the end: {load()}")
        return
    x, y = models.batch("mlp", 64)
    with cache_root("mlp_threads.") as root:
        steps, arguments = compiled_variants(
            VARIANTS, lambda name: variant(name, root),
            lambda: (models.graphc_step(models.graphc_model("mlp")),
                     (graphc.tensor(x), graphc.tensor(y))))
        for name in VARIANTS:
            forked = len(re.findall(r'define[^@]*@"?\w*small_gemm\.omp',
                                    steps[name].executable.lowered.ir_text))
            print(f"{name}: {forked} loops of generated GEMMs fork", flush=True)
        graphc_steps = dict(steps)
        if args.torch:
            steps[TORCH], arguments[TORCH] = _torch_step(x, y)
        results = _blocks(steps, arguments, most, args.blocks, args.calls, args.realtime)
        _report(results, most)
        if args.profile:
            _profiles(graphc_steps, arguments, most, root, args.realtime)
    print(f"at the end: {load()}")


def two_thread_setup(parser, script: str, label: str, fifo: bool, **counts: int) -> int:
    """What a two-thread benchmark checks before it compiles: every count (`--name`) at least
    1 (else no call is timed, and every figure is the median of nothing), freed memory kept,
    at least two threads (returned), and SCHED_FIFO allowed when `fifo` (refused now, not
    after compiling)."""
    for name, value in counts.items():
        if value < 1:
            parser.error(f"--{name} must be at least 1, got {value}")
    from graphc.backends.cpu import threads

    keep_freed_memory()
    most = threads.most_threads()
    print(f"{label}most threads {most}; {load()}", flush=True)
    if most < 2:
        raise SystemExit(f"benchmarks/{script}.py: one thread only here (OMP_NUM_THREADS, "
                         "affinity or GRAPHC_BLAS_THREADS=native): nothing to compare")
    if fifo:
        with realtime(True):
            pass
    return most


@contextlib.contextmanager
def realtime(on: bool):
    """While on: every thread of this process (the caller and libgomp's team) under
    SCHED_FIFO, put back to SCHED_OTHER afterwards; SystemExit where it is not allowed."""
    if not on:
        yield
        return
    done = []
    try:
        for tid in sorted(int(t) for t in os.listdir("/proc/self/task")):
            try:
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(10))
            except ProcessLookupError:  # a thread that ended meanwhile
                continue
            done.append(tid)
    except (PermissionError, AttributeError) as error:
        _normal(done)
        raise SystemExit(f"benchmarks/mlp_threads.py: --realtime needs SCHED_FIFO (root or "
                         f"CAP_SYS_NICE on Linux): {error}") from None
    try:
        yield
    finally:  # every thread, those made meanwhile too (they inherit the policy)
        _normal(int(t) for t in os.listdir("/proc/self/task"))


def _normal(tids) -> None:
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


def _torch_step(x, y):
    """PyTorch eager's step of the same MLP (the same weights), and its arguments."""
    import torch

    from benchmarks import models

    model = models.torch_copy(models.graphc_model("mlp"), "mlp")
    step = models.torch_step(model)
    arguments = (torch.from_numpy(x), torch.from_numpy(y))
    for _ in range(3):
        step(*arguments)
    return step, arguments


def _blocks(steps: dict, arguments: dict, most: int, blocks: int, calls: int,
            fifo: bool = False) -> dict:
    from graphc.backends.cpu import threads

    free = (lambda: most - 1) if fifo else threads.cores_free
    choosers = {name: threads.ThreadChooser(most, free_cores=free) for name in steps}
    picked = {name: {1: 0, most: 0} for name in steps}
    order = [(name, count) for name in steps for count in COUNTS
             if name != TORCH or count != "chosen"]
    results = {key: {"median": [], "p20": [], "cpu": []} for key in order}
    for block in range(blocks):
        shift = block % len(order)
        for name, count in order[shift:] + order[:shift]:
            if name == TORCH:
                import torch

                torch.set_num_threads(1 if count == "1t" else most)
            elif count == "chosen":
                steps[name].executable.thread_chooser = choosers[name]
            else:
                steps[name].executable.thread_chooser = threads.ThreadChooser(
                    most, fixed=1 if count == "1t" else most)
            seconds = []
            with realtime(fifo):
                for _ in range(3):  # wake or park the team; not timed
                    steps[name](*arguments[name])
                cpu = time.process_time()
                for _ in range(calls):
                    if count == "chosen":
                        chooser = choosers[name]
                        picked[name][chooser.trying or chooser.current] += 1
                    start = time.perf_counter()
                    steps[name](*arguments[name])
                    seconds.append(time.perf_counter() - start)
                cpu = (time.process_time() - cpu) / calls
            entry = results[(name, count)]
            entry["median"].append(float(np.median(seconds)))
            entry["p20"].append(float(np.percentile(seconds, 20)))
            entry["cpu"].append(cpu)
    for name in steps:
        if name != TORCH:
            results[(name, "chosen")]["picked"] = picked[name]
    return results


def _report(results: dict, most: int) -> None:
    one = {name: np.median(r["median"]) for (name, count), r in results.items()
           if count == "1t"}
    for (name, count), r in results.items():
        median, p20 = np.median(r["median"]) * 1e3, np.median(r["p20"]) * 1e3
        line = (f"{name:<7} {count:>6}: median {median:.3f} ms, p20 {p20:.3f} ms "
                f"({median / (one[name] * 1e3):.2f}x its one thread's median)")
        if count == "1t":
            line += f"; CPU {np.median(r['cpu']) * 1e3:.3f} ms a call"
        if "picked" in r:
            line += f"; calls on 1 / {most} threads: {r['picked'][1]} / {r['picked'][most]}"
        print(line, flush=True)
    if (TORCH, "2t") in results:
        anchor = {count: np.median(results[(TORCH, count)]["median"]) for count in ("1t", "2t")}
        for name in VARIANTS:
            print(f"{name} / torch eager: " + ", ".join(
                f"{count} {np.median(results[(name, count)]['median']) / anchor[count]:.2f}x"
                for count in ("1t", "2t")) + f", chosen / torch 2t "
                f"{np.median(results[(name, 'chosen')]['median']) / anchor['2t']:.2f}x")


class _Captured(Exception):
    """Stops a call once the arrays it binds are caught (`bound_arrays`)."""


def bound_arrays(step, arguments) -> list[np.ndarray]:
    """Copies of the arrays a call of `step` binds (inputs, parameters, optimizer state),
    caught before it runs, as graphc.profile catches them."""
    executable, captured = step.executable, []

    def capture(*arrays):
        captured.extend(np.array(a, copy=True) for a in arrays)
        raise _Captured

    executable.run = capture  # an instance attribute shadows the method for one call
    try:
        step(*arguments)
    except _Captured:
        pass
    finally:
        del executable.run
    return captured


def _profiles(steps: dict, arguments: dict, most: int, root: str, fifo: bool = False,
              runs: int = 200) -> None:
    """Each kernel's median time at one and at `most` threads, from a profiling build of the
    step (the driver stamps the clock around every kernel, as graphc.profile's) run `runs`
    times back to back on the same arrays: graphc.profile copies the arrays before every
    run, long enough for the team to fall asleep, so its first forked kernel would carry
    the wake-up that a loop of steps does not pay."""
    from graphc.backends.cpu import threads
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.tools.profile import kernel_label

    for name in steps:
        with variant(name, root):
            timed = CpuExecutable(steps[name].executable.graph, {"profile": True})
        arrays = bound_arrays(steps[name], arguments[name])
        stamps: dict[int, list] = {1: [], most: []}
        for count in (1, most, 1, most):
            timed.thread_chooser = threads.ThreadChooser(most, fixed=count)
            with realtime(fifo):
                for _ in range(5):
                    timed.run(*arrays)
                for _ in range(runs // 2):
                    timed.run(*arrays)
                    stamps[count].append(np.diff(timed.last_stamps) / 1e3)
        medians = {count: np.median(np.array(v), axis=0) for count, v in stamps.items()}
        print(f"{name}: kernels over 5 us, us at 1 / {most} threads (medians of {runs} "
              f"runs back to back)")
        for step, node in enumerate(timed.lowered.kernel_nodes):
            one, all_cores = medians[1][step], medians[most][step]
            if max(one, all_cores) > 5:
                label = kernel_label(node) if node is not None else "output copy"
                shape = "" if node is None else ", ".join(str(v.type) for v in node.outputs)
                print(f"    {step:3d} {one:7.1f} {all_cores:7.1f}  {label[:30]:<30} "
                      f"{shape[:34]}")
        print(f"    native call {medians[1].sum():.1f} / {medians[most].sum():.1f} us")


GAPS_US = (0, 50, 100, 200, 300, 500, 1000, 2000)


def _fork_costs(most: int, root: str, calls: int, fifo: bool = False) -> None:
    """Median wall time of a call of relu over 64 floats, forked (PARALLEL_MIN_ELEMENTS 1
    while compiling), after a busy gap of the calling thread, at one and `most` threads."""
    from graphc.backends import compile as compile_graph
    from graphc.backends.cpu import kernels, threads
    from graphc.ir import parse

    text = """graph @f(%a: f32[64]) -> (f32[64]) {
  %1: f32[64] = relu(%a)
  return (%1)
}"""
    os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, "fork")
    least, kernels.PARALLEL_MIN_ELEMENTS = kernels.PARALLEL_MIN_ELEMENTS, 1
    try:
        executable = compile_graph(parse(text), "cpu")
    finally:
        kernels.PARALLEL_MIN_ELEMENTS = least
    a = np.ones(64, np.float32)
    print(f"a forked kernel of 64 floats, median us a call ({calls} calls a block, blocks "
          f"alternating): gap | 1 thread | {most} threads")
    for gap in GAPS_US:
        seconds: dict[int, list] = {1: [], most: []}
        for count in (1, most, 1, most):
            executable.thread_chooser = threads.ThreadChooser(most, fixed=count)
            with realtime(fifo):
                for _ in range(3):
                    executable.run(a)
                for _ in range(calls):
                    start = time.perf_counter()
                    while time.perf_counter() - start < gap * 1e-6:
                        pass  # the caller busy, as in the serial kernels between two forks
                    start = time.perf_counter()
                    executable.run(a)
                    seconds[count].append(time.perf_counter() - start)
        print(f"    {gap:5d} us | {np.median(seconds[1]) * 1e6:7.1f} | "
              f"{np.median(seconds[most]) * 1e6:7.1f}", flush=True)


if __name__ == "__main__":
    main()
