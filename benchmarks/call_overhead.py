"""The Python cost of a compiled call: the whole call next to its native run, per case.

    python -m benchmarks.call_overhead --threads 1 --clock cpu
    python -m benchmarks.call_overhead --profile mlp_b1     # cProfile of one case's calls
    python -m benchmarks.call_overhead --clock cpu --tags   # guards' dict version tags off/on
    python -m benchmarks.call_overhead --threads 2 --counts # what use + restore cost a call

For each case (medians over ROUNDS rounds, each of enough calls to last ~20 ms):
- *call*: the compiled callable called as a user calls it (`f(x)`, `step(x, y)`): guards,
  binding the arguments, parameters, optimizer state and `.grad`s, the executable's checks,
  output arrays and pointer tables, the native run, writing updates back, assigning `.grad`s,
  wrapping the outputs;
- *native*: the time spent inside the generated code's entry point during those calls (the
  executable's ctypes function, timed by a wrapper: `NativeTimer`);
- *overhead*: the median over rounds of call - native: what a compiled call adds around its
  native work, caches included (the Python after a large native run starts on caches the run
  filled with its own data, so it is slower than the same Python on its own);
- *python*: the call with the native entry point replaced by a no-op (the Python alone, on warm
  caches: the steadiest figure to compare changes to the call path by);
- *guard*: the guard of the entry the call runs, alone (graphc.jit.guards: the part of
  *python* that checks nothing changed since the trace);
- *in call*: the same guard inside the calls with their native runs (`GuardTimer`): the first
  Python after the previous call's native run, on caches that run filled, so several times
  *guard*.
The performance issue's targets are <= 10 us of Python for a one-input function and <= 25 us
for the MLP training step. The cases: `tiny` (`x * 2` on 16 floats), `sgemm_256` (`a @ b`, no_grad),
`mlp_b1` and `mlp_b64` (MLP 784-256-256-10 SGD-momentum training steps: benchmarks.models),
`lenet5_b64` (LeNet-5's); the `_dynamic` cases are the same steps compiled with dynamic=True
(a symbolic batch served by the runtime-sized executable, graphc.backends.cpu.runtime_sizes;
at batch 1 the size is specialised and the entry keeps a shape guard).

`--threads N` (default 1) sets OMP_NUM_THREADS / OPENBLAS_NUM_THREADS, restarting the process
so the libraries read them (above one thread, the calls of an executable with parallel work,
an OpenMP region or a BLAS call, also run its thread chooser's bookkeeping, which *python*
then includes: docs/performance.md, "SGEMM 256 on two threads"); `--clock cpu` times by this
process's CPU time (steadier on a shared machine). Replacing CpuExecutable's private `_run`
is deliberate: the native figure needs the raw entry point.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
from typing import NamedTuple

import numpy as np

if __package__ in (None, ""):  # `python benchmarks/call_overhead.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import graphc  # noqa: E402
from benchmarks import models  # noqa: E402
from benchmarks.harness import now, run_with_threads, set_clock  # noqa: E402
from graphc.jit import dict_versions  # noqa: E402

ROUNDS = 9
ROUND_SECONDS = 0.02
CASES = ("tiny", "sgemm_256", "mlp_b1", "mlp_b64", "lenet5_b64", "mlp_b1_dynamic",
         "mlp_b64_dynamic", "lenet5_b64_dynamic")
TARGETS_US = {"tiny": 10.0, "mlp_b1": 25.0, "mlp_b64": 25.0}


def _times_two(x):
    return x * 2


def _matmul(a, b):
    return a @ b


def build(name: str):
    """(call, guard, compiled) of a case: `call()` makes one compiled call, warmed up;
    `guard()` runs only the guard of the entry it runs (reading the compiled callable's
    private `_entries`, as `NativeTimer` replaces the executable's `_run`)."""
    if name == "tiny":
        compiled = graphc.compile(_times_two, backend="cpu")
        args = (graphc.tensor(np.arange(16, dtype=np.float32)),)
        no_grad = False
    elif name == "sgemm_256":
        rng = np.random.default_rng(3)
        args = tuple(graphc.tensor(rng.standard_normal((256, 256)).astype(np.float32))
                     for _ in range(2))
        compiled = graphc.compile(_matmul, backend="cpu")
        no_grad = True
    elif name.removesuffix("_dynamic") in ("mlp_b1", "mlp_b64", "lenet5_b64"):
        model_name = name.split("_")[0]
        model = models.graphc_model(model_name)
        x, y = models.batch(model_name, 1 if name.startswith("mlp_b1") else 64)
        args = (graphc.tensor(x), graphc.tensor(y))
        compiled = graphc.compile(models.graphc_step(model), backend="cpu",
                                  dynamic=name.endswith("_dynamic"))
        no_grad = False
    else:
        raise SystemExit(f"benchmarks.call_overhead: unknown case {name!r}; the cases are "
                         + ", ".join(CASES))

    def call():  # as a user calls it: no context manager where the case needs none
        if no_grad:
            with graphc.no_grad():
                return compiled(*args)
        return compiled(*args)

    def guard():
        if no_grad:
            with graphc.no_grad():
                return compiled._entries[-1].guard.holds(args, {})
        return compiled._entries[-1].guard.holds(args, {})

    for _ in range(5):
        call()
    if not guard():
        raise SystemExit(f"benchmarks.call_overhead: {name}'s guard fails on its own call")
    return call, guard, compiled


class NativeTimer:
    """Wraps an executable's native entry point (`_run`, a ctypes function) to add up the
    time spent inside it, read from the same clock as the calls."""

    def __init__(self, executable) -> None:
        self.native, self.spent = executable._run, 0.0
        executable._run = self

    def __call__(self, *arguments):
        start = now()
        status = self.native(*arguments)
        self.spent += now() - start
        return status


def _round(fn, number: int) -> float:
    """Seconds per call of `fn` over one round of `number` calls."""
    start = now()
    for _ in range(number):
        fn()
    return (now() - start) / number


def _per_call(fn, number: int) -> float:
    """The median over ROUNDS rounds of seconds per call of `fn`, `number` calls a round."""
    return statistics.median(_round(fn, number) for _ in range(ROUNDS))


class Figures(NamedTuple):
    """Seconds per call, medians (see the module docstring)."""

    call: float
    native: float
    overhead: float
    python: float
    guard: float
    guard_in_call: float


class GuardTimer:
    """Stands in for an entry's guard (the compiled callable's fast path calls its `checks`,
    `Compiled._guarded` asks it `holds` and `implies_types`) and adds up the time its checks
    take inside real calls. Put in place and taken out by `_set_guard`."""

    def __init__(self, guard) -> None:
        self.guard, self.spent = guard, 0.0

    def holds(self, args: tuple, kwargs: dict) -> bool:
        start = now()
        held = self.guard.holds(args, kwargs)
        self.spent += now() - start
        return held

    @property
    def checks(self):
        return self._timed_checks

    def _timed_checks(self, args: tuple, kwargs: dict) -> bool:
        start = now()
        try:
            return self.guard.checks(args, kwargs)
        finally:
            self.spent += now() - start

    def __getattr__(self, name: str):
        return getattr(self.guard, name)


def _set_guard(compiled, entry, guard) -> None:
    """Give `entry` another guard (a `GuardTimer` or the guard back), and drop the compiled
    callable's fast path (graphc.jit.compiler keeps the guard's checks there) so that the
    next call makes it from this one."""
    entry.guard = guard
    compiled._fast = None


def measure(name: str) -> Figures:
    """The case's figures: its compiled call, the native run inside it, their difference,
    the call without its native run, its guard alone and its guard inside the calls (see
    the module docstring)."""
    call, guard, compiled = build(name)
    executable = compiled.executable
    # a symbolic graph's one executable for every size (graphc.backends.specializing)
    executable = getattr(executable, "_generic", None) or executable
    timer = NativeTimer(executable)
    start = now()
    call()
    number = max(1, int(ROUND_SECONDS / max(now() - start, 1e-7)))
    calls, natives = [], []
    for _ in range(ROUNDS):
        timer.spent = 0.0
        start = now()
        for _ in range(number):
            call()
        calls.append((now() - start) / number)
        natives.append(timer.spent / number)
    overheads = [c - n for c, n in zip(calls, natives)]
    entry = compiled._entries[-1]
    guard_timer = GuardTimer(entry.guard)  # more rounds, the guard timed
    _set_guard(compiled, entry, guard_timer)
    in_call = []
    for _ in range(ROUNDS):
        guard_timer.spent = 0.0
        _round(call, number)
        in_call.append(guard_timer.spent / number)
    _set_guard(compiled, entry, guard_timer.guard)
    executable._run = _no_op  # the same call, without the native run: the Python alone
    python = _per_call(call, number)
    return Figures(statistics.median(calls), statistics.median(natives),
                   statistics.median(overheads), python, _per_call(guard, number),
                   statistics.median(in_call))


def _no_op(*arguments) -> int:
    return 0


def compare_tags(name: str) -> dict[str, list[float]]:
    """The case's call, its guard inside the calls and its guard alone with the guards' dict
    version tags off and on, in one process, alternating round by round
    (graphc.jit.dict_versions; off is what a Python without them runs): seconds per call, a
    list of ROUNDS per variant. The guard is timed by a `GuardTimer` throughout, so both
    variants' figures include its two clock reads (~1 us)."""
    call, guard, compiled = build(name)
    entry = compiled._entries[-1]
    timer = GuardTimer(entry.guard)
    _set_guard(compiled, entry, timer)
    start = now()
    call()
    number = max(1, int(ROUND_SECONDS / max(now() - start, 1e-7)))
    times: dict[str, list[float]] = {f"{what} {variant}": [] for what in ("call", "in call",
                                                                           "guard")
                                     for variant in ("off", "on")}
    available = dict_versions.AVAILABLE
    try:
        for _ in range(ROUNDS):
            for variant, on in (("off", False), ("on", True)):
                dict_versions.AVAILABLE = on
                timer.guard._checks = None  # compiled again, with or without tags
                compiled._fast = None  # the fast path's copy of them too
                call()
                timer.spent = 0.0
                times[f"call {variant}"].append(_round(call, number))
                times[f"in call {variant}"].append(timer.spent / number)
                times[f"guard {variant}"].append(_round(guard, number))
    finally:
        dict_versions.AVAILABLE = available
        timer.guard._checks = None
        _set_guard(compiled, entry, timer.guard)
    return times


def profile(name: str, calls: int = 2000) -> str:
    """The top of cProfile over `calls` compiled calls of the case."""
    call, _, _ = build(name)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=CASES, help="run only this case")
    parser.add_argument("--threads", type=int, default=1, metavar="N",
                        help="threads for OpenMP and OpenBLAS (default 1)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--profile", choices=CASES, help="print cProfile of this case's calls")
    parser.add_argument("--counts", action="store_true",
                        help="time what a compiled call's thread counts cost: threads.use + "
                             "threads.restore, per count and kind of module")
    parser.add_argument("--tags", action="store_true",
                        help="compare each case's call and guard with the guards' dict version "
                             "tags off and on, alternating in one process")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    run_with_threads("benchmarks.call_overhead", args.threads, argv)
    set_clock(args.clock)
    if args.profile:
        print(profile(args.profile))
        return 0
    if args.tags:
        return _print_tags(args)
    if args.counts:
        return _print_counts(args)
    print(f"threads {args.threads}, clock {args.clock}; microseconds per call (medians)")
    print(f"{'case':<18} {'call':>9} {'native':>9} {'overhead':>9} {'python':>9} {'guard':>8} "
          f"{'in call':>8} {'target':>8}")
    for name in args.only or CASES:
        f = Figures(*(s * 1e6 for s in measure(name)))
        target = TARGETS_US.get(name)
        print(f"{name:<18} {f.call:9.1f} {f.native:9.1f} {f.overhead:9.1f} {f.python:9.1f} "
              f"{f.guard:8.1f} {f.guard_in_call:8.1f} {'<= %g' % target if target else '':>8}",
              flush=True)
    load = os.getloadavg()
    print(f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


def _print_counts(args, calls: int = 20000) -> int:
    """`threads.use(n, openmp)` + `threads.restore` per call, as `CpuExecutable._native`
    runs them around a native run: the user's counts are the process's (`--threads`)."""
    from graphc.backends.cpu import blas, threads

    blas.resolve_blas()
    print(f"threads {args.threads}, clock {args.clock}; use + restore, microseconds per call "
          f"(medians of {ROUNDS} rounds of {calls}); BLAS count now {threads.blas_threads()}")
    for openmp, kind in ((False, "GEMM-only module"), (True, "module with OpenMP regions")):
        for n in sorted({1, threads.most_threads()}):
            rounds = []
            for _ in range(ROUNDS):
                start = now()
                for _ in range(calls):
                    changed = threads.use(n, openmp)
                    if changed is not None:
                        threads.restore(changed)
                rounds.append((now() - start) / calls * 1e6)
            print(f"{kind:<28} on {n} thread(s): {statistics.median(rounds):6.2f}", flush=True)
    load = os.getloadavg()
    print(f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


def _print_tags(args) -> int:
    if not dict_versions.AVAILABLE:
        print(f"benchmarks.call_overhead --tags: this Python ({sys.version.split()[0]}) has no "
              "dict version tags the guards read (CPython 3.11 only); nothing to compare")
        return 1
    print(f"threads {args.threads}, clock {args.clock}; microseconds per call (medians of "
          f"{ROUNDS} alternating rounds), dict version tags off / on")
    columns = ("call off", "call on", "in call off", "in call on", "guard off", "guard on")
    print(f"{'case':<10} " + " ".join(f"{c:>11}" for c in columns))
    for name in args.only or CASES:
        t = {k: statistics.median(v) * 1e6 for k, v in compare_tags(name).items()}
        print(f"{name:<10} " + " ".join(f"{t[c]:11.1f}" for c in columns), flush=True)
    load = os.getloadavg()
    print(f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
