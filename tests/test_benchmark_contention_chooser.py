"""benchmarks/contention_chooser.py: its logging chooser's log matches what the chooser did;
--realtime without the right to it is a clear exit, not a traceback."""

import os

import pytest

from benchmarks import contention_chooser
from benchmarks.contention_chooser import LoggedChooser, own_runnable
from graphc.backends.cpu.threads import ThreadChooser

MS = 1e-3


def test_the_log_shows_each_call_each_trial_and_each_gate_look(monkeypatch):
    monkeypatch.setattr(LoggedChooser, "injected", 1)
    chooser = LoggedChooser(2)
    for _ in range(40):
        n = chooser.pick()
        chooser.record(n, 1.0 * MS if n == 1 else 0.5 * MS)
    line = "".join(chooser.calls)
    first = ThreadChooser.WARMUP + ThreadChooser.MIN_GAP
    trial = ThreadChooser.TRIAL + ThreadChooser.WAKE
    assert line[:first + trial] == "1" * first + "T" * trial
    assert chooser.current == 2 and line[first + trial] == "2"
    start, n, ms, won = chooser.trials[0]
    assert (start, n, won) == (first, 2, True) and ms == [0.5] * trial
    assert chooser.looks and chooser.looks[0][0] == first and chooser.looks[0][2] >= 1
    report = chooser.report()
    assert "trial at call 10 on 2: 0.500 0.500 0.500 0.500 ms (won)" in report


def test_own_runnable_counts_the_calling_thread():
    assert own_runnable() >= 1


def test_realtime_refused_is_a_clear_exit(monkeypatch):
    def refuse(*args):
        raise PermissionError("Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse, raising=False)
    with pytest.raises(SystemExit, match="--realtime needs SCHED_FIFO"):
        contention_chooser.main(["--realtime", "--", "--only", "conv2d"])


def test_main_puts_the_chooser_back(monkeypatch):
    """Executables made after main (later tests in the same process) choose with the
    project's ThreadChooser, not the logging one."""
    from benchmarks import run
    from graphc.backends.cpu import threads

    original = threads.ThreadChooser
    seen = []
    monkeypatch.setattr(run, "main", lambda args: seen.append(threads.ThreadChooser) or 0)
    assert contention_chooser.main(["--", "--only", "conv2d"]) == 0
    assert seen == [LoggedChooser]
    assert threads.ThreadChooser is original
