"""Timing and reporting for the benchmark suite: interleaved medians, agreement checks, the
markdown table.

These 2-core machines are shared and noisy, so a case never times its contenders one after
another. `interleaved_medians` warms every contender up, calibrates how many calls make one
sample (a sample lasts at least `SAMPLE_SECONDS`, so sub-millisecond calls are not timer
noise), then runs rounds in which every contender takes one sample, the order rotating from
round to round; the result is each contender's median seconds per call over the rounds.
Before every sample the contender primes itself: untimed calls of its own for at least
`PRIME_SECONDS` (at least one call), so a sample times the contender's steady state, as a
loop of its calls runs, and never the cache and page-table state another contender's sample
left behind (on 2026-11-26 graphc's conv2d read 4.4-4.8 ms right after PyTorch's sample,
which faults in 32 MB per call, and 3.4 ms in its own loop; PyTorch read 16.4 ms after
graphc's and 15.8 ms in its own loop: docs/performance.md, Harness fairness). A contender's
`reset`, when it has one, runs untimed after the priming calls, just before its sample
(training steps put their weights and optimizer state back, so every sample times the same
steps). Every result is dropped as soon as it is made (the timed loop never holds one), so a
contender that can reuse a dropped result's memory does, as in a user's loop.
Samples are read from the clock `set_clock` chose: "wall" (time.perf_counter, the default)
or "cpu" (time.process_time: CPU seconds of this process, all threads). With one thread per
library (`run.py --threads 1`), CPU time is the work itself and stays put while other
processes take the cores; with several threads it also counts spin-waiting.

Invariants:
- A contender is timed only after `check_agreement` compared its result with the anchor's
  (the first contender that produced one): a contender that disagrees, or failed to run,
  keeps its reason in `Contender.status` and is never timed.
- `CaseResult.ratio` is always graphc's figure over the anchor's, in the direction the target
  is written (time ratio, or throughput ratio for SGEMM); `met` compares it with the target.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

SAMPLE_SECONDS = 1e-3  # a sample is at least this long (several calls for tiny steps)
WARMUP_SECONDS = 0.3  # untimed calls per contender: at least this long (and `warmup` calls)
WARMUP_CALLS_MAX = 50
PRIME_SECONDS = 0.03  # untimed calls of a contender's own right before each of its samples
PRIME_CALLS_MAX = 200
CASE_SECONDS = 60.0  # a case stops adding rounds after this long (at least MIN_ROUNDS)
MIN_ROUNDS = 5
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = {"name": "wall"}


# glibc's mallopt parameters (malloc.h) and the values `keep_freed_memory` sets
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest allowed value on 64-bit
TRIM_THRESHOLD_BYTES = 1 << 30


def keep_freed_memory() -> str:
    """Make glibc keep freed blocks of up to 32 MiB in its heap instead of returning their
    pages to the kernel, for every contender alike; say what was done (for the report).

    By default glibc maps a large block afresh and unmaps it on free, or trims the heap's
    top once it passes a threshold that moves with the sizes freed so far, so whether a call
    that allocates 16 MB pays ~4,000 page faults depended on what the process allocated
    before: PyTorch's conv2d read 16.6 ms in one case and 3.3-4.7 ms in the next in the same
    process (2026-11-26, 1 thread). graphc reuses its large outputs and is not affected."""
    path = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(path) if path else None
        done = libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) \
            and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    except (OSError, AttributeError):  # not glibc
        done = False
    if not done:
        return "malloc: the C library's defaults (no mallopt)"
    return (f"malloc: freed blocks under {MMAP_THRESHOLD_BYTES >> 20} MiB kept "
            f"(mallopt M_MMAP_THRESHOLD, M_TRIM_THRESHOLD {TRIM_THRESHOLD_BYTES >> 30} GiB)")


def run_with_threads(module: str, threads: int | None, argv: list[str]) -> None:
    """Start `python -m module argv` again with OMP_NUM_THREADS and OPENBLAS_NUM_THREADS set to
    `threads` (the runtimes read them once, at load), unless they are already that; returns
    when nothing needs to change (threads None, or this process already has them), and when
    `module` is not this process's main program: a caller that runs a benchmark's `main` in
    its own process (a test under pytest) keeps its process and its threads."""
    if threads is None or os.environ.get("OMP_NUM_THREADS") == str(threads):
        return
    if not _is_main_program(module):
        return
    os.environ.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.execv(sys.executable, [sys.executable, "-m", module, *argv])


def _is_main_program(module: str) -> bool:
    """Whether this process runs `module` as its program (`python -m module` or its path)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        return spec.name == module
    path = getattr(main, "__file__", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return path is not None and os.path.abspath(path) == os.path.join(
        root, *module.split(".")) + ".py"


@contextlib.contextmanager
def cache_root(prefix: str):
    """A temporary directory for in-process A/Bs whose variants each set GRAPHC_CACHE_DIR to a
    folder of their own under it (the pipeline cache keys on graphc's source, the same for
    every variant); GRAPHC_CACHE_DIR is put back as it was afterwards."""
    previous = os.environ.get("GRAPHC_CACHE_DIR")
    try:
        with tempfile.TemporaryDirectory(prefix=prefix) as root:
            yield root
    finally:
        if previous is None:
            os.environ.pop("GRAPHC_CACHE_DIR", None)
        else:
            os.environ["GRAPHC_CACHE_DIR"] = previous


@contextlib.contextmanager
def switched(root: str, name: str, switches: dict, on: bool):
    """While compiling (or running) A/B variant `name`: GRAPHC_CACHE_DIR is its own folder
    under `root` (`cache_root`), and where `on`, each module attribute of `switches`
    ({(module, attribute name): value}) holds its value, put back afterwards."""
    os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, name)  # read at each use
    kept = {key: getattr(*key) for key in switches} if on else {}
    try:
        for (module, attr), value in (switches.items() if on else ()):
            setattr(module, attr, value)
        yield
    finally:
        for (module, attr), value in kept.items():
            setattr(module, attr, value)


def set_clock(name: str) -> None:
    """Time samples with CLOCKS[name] from now on."""
    if name not in CLOCKS:
        raise ValueError(f"set_clock: expected one of {sorted(CLOCKS)}, got {name!r}")
    _clock["name"] = name


def now() -> float:
    """The current reading of the chosen clock, in seconds."""
    return CLOCKS[_clock["name"]]()


@dataclass
class Contender:
    """One implementation of a case: `run()` does the timed work once; `result()` returns the
    array compared with the anchor's (called after the warm-up steps `prepare` runs)."""

    name: str
    run: Callable[[], object]
    result: Callable[[], np.ndarray] | None = None
    prepare: Callable[[], None] | None = None  # warm-up outside the timed loop (compiles)
    # untimed, before every sample (and before calibrating): puts back state the calls
    # change, so every sample times the same calls (training steps: weights, momentum)
    reset: Callable[[], None] | None = None
    status: str = "ok"  # "ok", or why it was not timed
    error: float | None = None  # relative difference from the anchor's result
    seconds: float | None = None  # median seconds per call
    rounds: int = 0


@dataclass
class CaseResult:
    """A row of the table: the case, its contenders, and graphc's ratio against the anchor."""

    name: str
    description: str
    graphc: str  # the contender whose figure is compared
    anchor: str | None  # None: the target bounds graphc's own figure (seconds)
    target: tuple[str, float]  # ("<=", 0.6): graphc / anchor <= 0.6
    contenders: list[Contender]
    unit: str = "ms"  # "ms" (time per call, lower is better) or "GFLOP/s"
    flops: float | None = None  # per call, for GFLOP/s
    note: str = ""
    extra: dict = field(default_factory=dict)  # case-specific figures (compile breakdowns)

    def by_name(self, name: str) -> Contender:
        return next(c for c in self.contenders if c.name == name)

    def figure(self, c: Contender) -> float | None:
        if c.seconds is None:
            return None
        return self.flops / c.seconds / 1e9 if self.unit == "GFLOP/s" else c.seconds * 1e3

    @property
    def ratio(self) -> float | None:
        """graphc's figure over the anchor's (graphc's seconds when there is no anchor)."""
        mine = self.by_name(self.graphc).seconds
        if self.anchor is None or mine is None:
            return mine
        anchor = self.figure(self.by_name(self.anchor))
        return None if anchor is None else self.figure(self.by_name(self.graphc)) / anchor

    @property
    def target_text(self) -> str:
        op, bound = self.target
        return f"{op} {bound:g} s" if self.anchor is None else f"{op} {bound:g}x"

    @property
    def met(self) -> bool | None:
        if self.ratio is None:
            return None
        op, bound = self.target
        return self.ratio <= bound if op == "<=" else self.ratio >= bound

    @property
    def agreed(self) -> bool:
        """Every contender ran and matched the anchor, or was skipped for a stated reason."""
        return all(c.status == "ok" or c.status.startswith("skipped") for c in self.contenders)


# ---- agreement ------------------------------------------------------------------------------
def relative_error(value: np.ndarray, reference: np.ndarray) -> float:
    """max |value - reference| / max(|reference|, tiny): one number per comparison."""
    value, reference = np.asarray(value, np.float64), np.asarray(reference, np.float64)
    if value.shape != reference.shape:
        raise ValueError(f"shapes differ: {value.shape} vs reference {reference.shape}")
    scale = max(float(np.max(np.abs(reference))), 1e-30)
    return float(np.max(np.abs(value - reference))) / scale


def check_agreement(contenders: list[Contender], tolerance: float) -> None:
    """Run every contender's warm-up and compare its result with the first one's; record the
    error, or why the contender cannot be timed (it raised, or it disagrees)."""
    reference = None
    for c in contenders:
        if c.status != "ok":
            continue
        try:
            if c.prepare is not None:
                c.prepare()
            value = c.result() if c.result is not None else None
        except Exception as err:  # a contender that fails is reported, not fatal
            c.status = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:160]}"
            continue
        if value is None:
            continue
        if reference is None:
            reference, c.error = value, 0.0
            continue
        c.error = relative_error(value, reference)
        if not c.error <= tolerance:
            c.status = f"disagrees: rel. error {c.error:.1e} > {tolerance:.0e}"


# ---- timing ---------------------------------------------------------------------------------
def _calls_per_sample(run: Callable[[], object]) -> int:
    start = now()
    run()
    once = max(now() - start, 1e-7)
    return max(1, math.ceil(SAMPLE_SECONDS / once))


def _prime(run: Callable[[], object], seconds: float) -> None:
    """Untimed calls of `run` (at least one, at most PRIME_CALLS_MAX) for `seconds`: what the
    previous sample (another contender's) left in the caches, the TLB and malloc's free
    lists is replaced by this contender's own working set before it is timed."""
    start, calls = time.perf_counter(), 0
    while calls < 1 or (time.perf_counter() - start < seconds and calls < PRIME_CALLS_MAX):
        run()
        calls += 1


def interleaved_medians(contenders: list[Contender], repeat: int, warmup: int = 2,
                        warmup_seconds: float = WARMUP_SECONDS) -> None:
    """Time the contenders whose status is ok: untimed calls (at least `warmup`, and at least
    `warmup_seconds` unless that takes over WARMUP_CALLS_MAX calls) each, then up to
    `repeat` rounds (fewer when the case passes CASE_SECONDS, never under MIN_ROUNDS) of one
    sample per contender in rotating order, each right after the contender's own priming
    calls (`_prime`, for min(PRIME_SECONDS, warmup_seconds)) and its reset; store the median
    seconds per call."""
    live = [c for c in contenders if c.status == "ok"]
    for c in live:  # PyTorch's first steps are slow (allocator, thread pool): warm up by time
        start, calls = time.perf_counter(), 0
        while calls < warmup or (time.perf_counter() - start < warmup_seconds
                                 and calls < WARMUP_CALLS_MAX):
            c.run()
            calls += 1
    for c in live:
        if c.reset is not None:
            c.reset()
    numbers = [_calls_per_sample(c.run) for c in live]
    samples: list[list[float]] = [[] for _ in live]
    started = time.perf_counter()
    for r in range(repeat):
        for k in range(len(live)):
            i = (k + r) % len(live)
            run, number = live[i].run, numbers[i]
            _prime(run, min(PRIME_SECONDS, warmup_seconds))
            if live[i].reset is not None:
                live[i].reset()
            start = now()
            for _ in range(number):
                run()
            samples[i].append((now() - start) / number)
        if r + 1 >= MIN_ROUNDS and time.perf_counter() - started > CASE_SECONDS:
            break
    for c, s in zip(live, samples):
        c.seconds, c.rounds = float(np.median(s)), len(s)


# ---- the table ------------------------------------------------------------------------------
def _fmt_figure(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "GFLOP/s":
        return f"{value:.1f} GFLOP/s"
    return f"{value:.3f} ms" if value < 1 else f"{value:.2f} ms" if value < 100 else \
        f"{value:.0f} ms"


def _cell(case: CaseResult, c: Contender) -> str:
    if c.status != "ok":
        return f"{c.name}: {c.status}"
    text = f"{c.name} {_fmt_figure(case.figure(c), case.unit)}"
    return text + (f" (err {c.error:.0e})" if c.error else "")


def markdown_table(cases: list[CaseResult]) -> str:
    """The results as one markdown table: a row per case."""
    lines = ["| case | contenders (median per call; err = rel. difference from the first) | "
             "graphc / anchor | target | met |", "|---|---|---|---|---|"]
    for case in cases:
        cells = "<br>".join(_cell(case, c) for c in case.contenders)
        ratio = "-" if case.ratio is None else f"{case.ratio:.2f} s" if case.anchor is None \
            else f"{case.ratio:.2f}x {case.anchor}"
        met = {True: "met", False: "**missed**", None: "n/a"}[case.met]
        lines.append(f"| {case.description} | {cells} | {ratio} | {case.target_text} | {met} |")
    notes = [f"- {case.description}: {case.note}" for case in cases if case.note]
    return "\n".join(lines + ([""] + notes if notes else []))


def as_json(cases: list[CaseResult]) -> list[dict]:
    """The results as plain data (for tests and tools)."""
    return [{"name": case.name, "description": case.description, "graphc": case.graphc,
             "anchor": case.anchor, "target": case.target_text, "unit": case.unit,
             "ratio": case.ratio, "met": case.met, "agreed": case.agreed, "note": case.note,
             "extra": case.extra,
             "contenders": [{"name": c.name, "status": c.status, "error": c.error,
                             "seconds": c.seconds, "rounds": c.rounds,
                             "figure": case.figure(c)} for c in case.contenders]}
            for case in cases]


def interleaved_process_times(calls: dict, rounds: int, seconds: float = 0.1,
                              clock=time.process_time) -> dict[str, list[float]]:
    """{name: CPU seconds per call, one sample a round} for in-process A/Bs: each round runs
    every call in a loop for `seconds` of this process's CPU time, the order alternating
    each round so neither variant always follows the other. `clock`: another clock's
    seconds (time.perf_counter: wall time, for steps on several threads)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds):
        for name in (list(calls) if r % 2 else list(calls)[::-1]):
            start, count = clock(), 0
            while clock() - start < seconds:
                calls[name]()
                count += 1
            times[name].append((clock() - start) / count)
    return times


def interleaved_profiles(steps: dict, arguments: dict, rounds: int, variant, repeat: int):
    """{name: (rows in schedule order, {step: median seconds over the rounds})}: each
    compiled step profiled `rounds` times (graphc.profile, `repeat` runs each), the variants
    in alternating order, each under `variant(name)` (a context manager: profiling lowers
    the graph again, so the variant's settings must hold)."""
    import graphc

    reports: dict[str, list] = {name: [] for name in steps}
    for r in range(rounds):
        for name in (list(steps) if r % 2 else list(steps)[::-1]):
            with variant(name):
                reports[name].append(graphc.profile(steps[name], *arguments[name],
                                                    repeat=repeat))
    result = {}
    for name, runs in reports.items():
        rows = sorted(runs[0].rows, key=lambda row: row.step)
        result[name] = (rows, {row.step: statistics.median(
            [next(q.seconds for q in run.rows if q.step == row.step) for run in runs])
            for row in rows})
    return result


def compiled_variants(names, variant, make, warmup: int = 3) -> tuple[dict, dict]:
    """({name: compiled step}, {name: its arguments}) for in-process A/Bs: under each
    `variant(name)` (a context manager), graphc seeded with 0, `make()` gives (training step
    function, arguments), compiled on the cpu backend and called `warmup` times (the first
    calls trace, compile and create the optimizer state)."""
    import graphc

    steps, arguments = {}, {}
    for name in names:
        with variant(name):
            graphc.manual_seed(0)
            train, batch = make()
            step = graphc.compile(train, backend="cpu")
            for _ in range(warmup):
                step(*batch)
        steps[name], arguments[name] = step, batch
    return steps, arguments


def step_ab(names, variant, make, rounds: int, profile_rounds: int, repeat: int,
            seconds: float = 0.1) -> tuple[dict, dict]:
    """An in-process A/B of a training step's variants: (their CPU seconds per call, one
    sample a round, from `interleaved_process_times`; their kernels' profiles, from
    `interleaved_profiles`), the variants built by `compiled_variants(names, variant, make)`."""
    steps, arguments = compiled_variants(names, variant, make)
    times = interleaved_process_times(
        {name: lambda n=name: steps[n](*arguments[n]) for name in steps}, rounds, seconds)
    return times, interleaved_profiles(steps, arguments, profile_rounds, variant, repeat)
