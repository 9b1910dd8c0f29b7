"""Smoke run of benchmarks/few_channel_threads.py at its quick sizes: both cases, a line per
thread count, the chooser's calls counted; --realtime without the right to it is a clear
exit, not a traceback."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("llvmlite")

from benchmarks import few_channel_threads  # noqa: E402


def test_few_channel_threads_smoke(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    few_channel_threads.main(["--quick", "--blocks", "1", "--calls", "2"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    for case in ("conv2d N=4 3->64", "LeNet-5 training step b4"):
        for count in ("1 thread(s)", "2 thread(s)", "chosen thread(s)"):
            assert any(line.startswith(case) and f" {count}: p5 " in line for line in lines)
    assert out.count("calls on 1 / ") == 2
    assert "load average at the end" in out


def test_realtime_refused_is_a_clear_exit(monkeypatch):
    def refuse(*args):
        raise PermissionError("Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse, raising=False)
    with pytest.raises(SystemExit, match="--realtime needs SCHED_FIFO"):
        few_channel_threads.main(["--quick", "--realtime"])


@pytest.mark.parametrize("flag", ["--blocks", "--calls"])
def test_no_timed_calls_is_refused_clearly(flag, capsys):
    with pytest.raises(SystemExit):
        few_channel_threads.main(["--quick", flag, "0"])
    assert f"{flag} must be at least 1, got 0" in capsys.readouterr().err
