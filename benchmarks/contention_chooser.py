"""What each executable's thread chooser did during a benchmarks.run: picks, trials, gate samples.

    python -m benchmarks.contention_chooser -- --only conv2d --only lenet5_b64 --repeat 7
    python -m benchmarks.contention_chooser --realtime --free-cores 1 -- --only conv2d

Runs `benchmarks.run` in this process with every new executable's `ThreadChooser`
(graphc/backends/cpu/threads.py) replaced by a logging subclass, then prints per executable
that chose (most threads > 1): its calls as one line of characters (`1` a call on one thread,
`2` on all cores, `t`/`T` a trial call on one thread / all cores, `.` a call of a trial
that the gate refused: none, the gate only delays), each trial's per-call milliseconds and
verdict, and each look of the free-core gate: what `cores_free()` read and how many of this
process's own threads were runnable at that instant (/proc/self/task/*/stat), so a gate
closed by the process's own threads (PyTorch's or libgomp's spinning workers) shows.

`--realtime` runs the process under SCHED_FIFO (root), as benchmarks.few_channel_threads
does: its threads take the cores whenever they are runnable, as on an idle machine. The
tasks it starves still count as runnable in /proc/loadavg, so pair it with `--free-cores N`,
which makes the gate read N (the log still shows what `cores_free()` read). Keep such runs
short: SCHED_FIFO leaves the machine's other work 5% of each second.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from graphc.backends.cpu import threads


def own_runnable() -> int:
    """This process's threads in state R right now (the caller among them)."""
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                count += f.read().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            continue
    return count


class LoggedChooser(threads.ThreadChooser):
    """A ThreadChooser that keeps a log of its calls, trials and gate looks."""

    made: list[LoggedChooser] = []
    injected: int | None = None

    def __init__(self, most: int, fixed: int | None = None, free_cores=None) -> None:
        super().__init__(most, fixed, free_cores=self._look)
        self.calls: list[str] = []  # one character a call
        self.trials: list[tuple[int, int, list[float], bool]] = []  # start, n, ms, won
        self.looks: list[tuple[int, int | None, int]] = []  # call, cores_free, own runnable
        self._trial_start = 0
        LoggedChooser.made.append(self)

    def _look(self) -> int | None:
        read = threads.cores_free()
        self.looks.append((len(self.calls), read, own_runnable()))
        return read if self.injected is None else self.injected

    def record(self, n: int, seconds: float) -> None:
        trying, before = self.trying, self.current
        if trying and not self.trial:
            self._trial_start = len(self.calls)
        trial = list(self.trial) + [seconds] if trying == n else None
        super().record(n, seconds)
        if trial is None:
            self.calls.append(str(n))
            return
        self.calls.append("T" if n > 1 else "t")
        if not self.trying:  # decided
            self.trials.append((self._trial_start, n, [s * 1e3 for s in trial],
                                self.current != before))

    def report(self) -> str:
        line = "".join(self.calls)
        picked = {c: line.count(c) for c in "12tT"}
        lines = [f"calls {len(line)}: one thread {picked['1']}, all cores {picked['2']}, "
                 f"trial calls {picked['t']} on one / {picked['T']} on all cores; "
                 f"now {self.current}, backoff {self.backoff}, next trial after "
                 f"{self.due_seconds * 1e3:.1f} ms of calls", "  " + line]
        for start, n, ms, won in self.trials:
            lines.append(f"  trial at call {start} on {n}: "
                         + " ".join(f"{m:.3f}" for m in ms)
                         + f" ms ({'won' if won else 'lost'})")
        if self.looks:
            reads = [r for _, r, _ in self.looks]
            own = [o for _, _, o in self.looks]
            lines.append(f"  gate looks {len(self.looks)}: cores_free read "
                         f"{statistics.median([r for r in reads if r is not None] or [0])} "
                         f"(median; {sum(1 for r in reads if r is not None and r < 1)} below 1)"
                         f", own runnable threads {min(own)}-{max(own)} "
                         f"({sum(1 for o in own if o > 1)} looks with more than the caller)")
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--realtime", action="store_true", help="SCHED_FIFO (root)")
    parser.add_argument("--free-cores", type=int, default=None,
                        help="what the chooser's gate reads (default: cores_free())")
    parser.add_argument("run_args", nargs="*", help="benchmarks.run's arguments, after --")
    args = parser.parse_args(argv)
    if args.realtime:  # before any thread exists: the threads inherit the policy
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        except (PermissionError, AttributeError) as error:
            raise SystemExit(f"benchmarks/contention_chooser.py: --realtime needs SCHED_FIFO "
                             f"(root or CAP_SYS_NICE on Linux): {error}") from None
    LoggedChooser.injected = args.free_cores
    from benchmarks import run

    chooser = threads.ThreadChooser
    threads.ThreadChooser = LoggedChooser  # the executables make theirs through the module
    try:
        status = run.main(args.run_args)
    finally:  # executables made after this call choose as before
        threads.ThreadChooser = chooser
    for k, chooser in enumerate(LoggedChooser.made):
        if chooser.explores and chooser.calls:
            print(f"executable {k}: " + chooser.report())
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return status


if __name__ == "__main__":
    sys.exit(main())
