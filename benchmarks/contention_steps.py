"""In one process: each training step's graphc call with one core busy against its own
1-thread figure, the load switched on and off between samples.

`python -m benchmarks.contention_steps [--rounds N] [--only NAME ...]` builds every
training step of benchmarks.contention.TRAINING_STEPS (graphc compiled only, no PyTorch in
the process) and times it under these conditions, in rounds whose order rotates, so that the
machine's other load falls on every condition alike:

- `1t CPU`: one thread (`ThreadChooser(fixed=1)`), no busy core, the calling thread's CPU
  time per call: the "own 1-thread figure" (what `--threads 1 --clock cpu` measures);
- `1t idle`, `auto idle`: wall clock per call, no busy core, one thread / the executable's
  own chooser;
- `auto busy`: wall, a busy process on one core (benchmarks.contention's spinner, resumed
  with SIGCONT), a chooser that only ever runs under it (as in `benchmarks.run
  --contention`); and `auto busy CPU`, the calling thread's CPU time in the same condition
  (all of a call's CPU while the chooser keeps one thread: the last column says whether it
  did), which tells a call that waits for a core from one that runs slower;
- `auto load comes and goes`: one more chooser that runs one idle and one busy sample every
  round (its busy samples are reported): a load that arrives while the chooser is on all
  cores;
- `1t busy` (median and mean), `2t busy`: wall, busy core, one thread / all cores forced
  (the floor that the machine's other load sets, and what a parallel step costs when it
  does not back off).

Each figure is the median over every call of its condition (and the mean for the
choosers: a loop pays the mean). The interesting ratio is `auto busy` over `1t CPU`
(the runtime-speed issue allows 1.2x); `1t busy` over `1t CPU` is what the machine's other
load alone costs. The last column counts, per chooser, the calls it ran on all cores out of
all its calls (in the load-comes-and-goes column: its idle samples' calls too).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

import numpy as np

import graphc
from benchmarks.contention import TRAINING_STEPS
from graphc.backends.cpu import threads

SAMPLE_SECONDS = 0.08  # each sample runs calls for at least this long ...
SAMPLE_CALLS = 4  # ... and at least this many (one for a forced 2-thread call under load)


class Spinner:
    """A process spinning on the last core this one may use; `busy(True/False)` resumes or
    stops it (SIGCONT/SIGSTOP)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", "while True:\n    pass\n"])
        os.sched_setaffinity(self.process.pid, {sorted(os.sched_getaffinity(0))[-1]})
        self.busy(False)

    def busy(self, on: bool) -> None:
        os.kill(self.process.pid, signal.SIGCONT if on else signal.SIGSTOP)
        time.sleep(0.01)  # let the scheduler see it

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def build(name: str):
    """(model, training step, its graphc arguments) of the training step `name`."""
    from benchmarks import family_steps, model_steps, models

    family, batch = name.rsplit("_b", 1)
    graphc.manual_seed(0)
    if family in ("mlp", "lenet5"):
        model = models.graphc_model(family)
        x, y = models.batch(family, int(batch))
        return model, models.graphc_step(model), (graphc.tensor(x), graphc.tensor(y))
    if family in ("gpt", "resnet18"):
        shape = model_steps.FULL[family]
        model = model_steps.build(graphc, family, shape)
        x, y = model_steps.batch_of(family, shape)
        return model, models.graphc_step(model), (graphc.tensor(x), graphc.tensor(y))
    shape = family_steps.FULL[family]
    model, step = family_steps.build(graphc, family, shape)
    return model, step, tuple(graphc.tensor(a) for a in family_steps.batch(family, shape))


def state_arrays(model, step) -> list:
    """The arrays `step` changes: the parameters and its optimizers' state (`step.optimizer`,
    else the optimizers its closure holds: benchmarks/family_steps.py's Adam steps). Put
    back before every sample: thousands of steps on one batch drive momentum into subnormal
    floats (MLP b1 0.4 -> 1.1-1.4 ms; benchmarks/cases.py)."""
    from benchmarks import models

    optimizers = [step.optimizer] if hasattr(step, "optimizer") else [
        cell.cell_contents for cell in step.__closure__ or ()
        if hasattr(cell.cell_contents, "param_groups")]
    arrays = [p.detach().numpy() for p in model.parameters()]
    for optimizer in optimizers:
        arrays += models.state_arrays(model, optimizer)[len(arrays):]
    return arrays


def _sample(step, args, clock, calls_at_least: int) -> list[float]:
    times, spent = [], 0.0
    while len(times) < calls_at_least or spent < SAMPLE_SECONDS:
        start = clock()
        step(*args)
        times.append(clock() - start)
        spent += times[-1]
        if calls_at_least == 1 and spent > SAMPLE_SECONDS:
            break
    return times


def measure(name: str, rounds: int, spinner: Spinner) -> dict[str, list[float]]:
    """Per-call seconds of `name` under every condition (see the module docstring)."""
    model, raw_step, args = build(name)
    step = graphc.compile(raw_step, backend="cpu")
    for _ in range(3):  # traces twice (momentum buffers), then the native code
        step(*args)
    executable = step.executable
    arrays = state_arrays(model, raw_step)
    saved = [a.copy() for a in arrays]
    most = threads.most_threads()
    choosers = {"auto idle": threads.ThreadChooser(most),
                "auto busy": threads.ThreadChooser(most),
                "auto load comes and goes": threads.ThreadChooser(most),
                "1t": threads.ThreadChooser(most, fixed=1),
                "2t": threads.ThreadChooser(most, fixed=most)}
    conditions = [("1t CPU", "1t", False, time.thread_time, SAMPLE_CALLS),
                  ("1t idle", "1t", False, time.perf_counter, SAMPLE_CALLS),
                  ("auto idle", "auto idle", False, time.perf_counter, SAMPLE_CALLS),
                  ("auto busy", "auto busy", True, time.perf_counter, SAMPLE_CALLS),
                  ("auto busy CPU", "auto busy", True, time.thread_time, SAMPLE_CALLS),
                  ("auto load comes and goes (idle)", "auto load comes and goes", False,
                   time.perf_counter, SAMPLE_CALLS),
                  ("auto load comes and goes", "auto load comes and goes", True,
                   time.perf_counter, SAMPLE_CALLS),
                  ("1t busy", "1t", True, time.perf_counter, SAMPLE_CALLS),
                  ("2t busy", "2t", True, time.perf_counter, 1)]
    found: dict[str, list[float]] = {label: [] for label, *_ in conditions}
    wide = {name: [0] for name in choosers}  # calls each chooser ran on more than one thread
    for name, chooser in choosers.items():
        chooser.record = _counting(chooser.record, wide[name])
    for r in range(rounds):
        shift = r % len(conditions)
        order = conditions[shift:] + conditions[:shift]
        # the alternating chooser sees its idle sample right before its busy one
        order.sort(key=lambda c: c[0] == "auto load comes and goes")
        for label, chooser, busy, clock, least in order:
            executable.thread_chooser = choosers[chooser]
            for array, value in zip(arrays, saved):
                np.copyto(array, value)
            spinner.busy(busy)
            found[label] += _sample(step, args, clock, least)
    spinner.busy(False)
    found["calls on all cores"] = [wide["auto idle"][0], wide["auto busy"][0],
                                   wide["auto load comes and goes"][0]]
    return found


def _counting(record, tally: list[int]):
    def counted(n: int, seconds: float) -> None:
        tally[0] += n > 1
        record(n, seconds)
    return counted


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def row(name: str, found: dict[str, list[float]]) -> str:
    wide = found.pop("calls on all cores")
    calls = [len(found["auto idle"]), len(found["auto busy"]) + len(found["auto busy CPU"]),
             len(found["auto load comes and goes"]) + len(found["auto load comes and goes "
                                                                "(idle)"])]
    med = {k: statistics.median(v) for k, v in found.items()}
    mean = {k: statistics.fmean(v) for k, v in found.items()}
    cells = [_ms(med["1t CPU"]), _ms(med["1t idle"]),
             f"{_ms(med['auto idle'])} ({_ms(mean['auto idle'])})",
             f"{_ms(med['auto busy'])} ({_ms(mean['auto busy'])})",
             _ms(med["auto busy CPU"]),
             f"{_ms(med['auto load comes and goes'])} "
             f"({_ms(mean['auto load comes and goes'])})",
             f"{_ms(med['1t busy'])} ({_ms(mean['1t busy'])})", _ms(med["2t busy"]),
             f"{med['auto busy'] / med['1t CPU']:.2f}x / "
             f"{mean['auto busy'] / med['1t CPU']:.2f}x",
             f"{med['1t busy'] / med['1t CPU']:.2f}x",
             " / ".join(f"{w}/{c}" for w, c in zip(wide, calls))]
    return f"| {name} | " + " | ".join(cells) + " |"


HEADER = ("| step | 1t CPU | 1t idle | auto idle: median (mean) | auto busy | auto busy CPU "
          "| auto, load comes and goes: busy samples | 1t busy | 2t busy "
          "| auto busy / 1t CPU (median / mean) "
          "| 1t busy / 1t CPU | calls on all cores: auto idle / busy / comes and goes |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="only these training steps (repeatable): " + ", ".join(
                            TRAINING_STEPS))
    args = parser.parse_args(argv)
    names = [n for n in TRAINING_STEPS if not args.only or any(
        n.startswith(o) for o in args.only)]
    spinner = Spinner()
    try:
        print(f"ms per call; {args.rounds} rounds; load average at the start "
              f"{os.getloadavg()}", flush=True)
        print(HEADER, flush=True)
        for name in names:
            found = measure(name, args.rounds, spinner)
            print(row(name, found) + f"  <!-- load {os.getloadavg()[0]:.2f} -->", flush=True)
    finally:
        spinner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
