"""Smoke run of benchmarks/gelu_loop.py: both variants compile, count their vector loop (the
derivative's erf taken from gelu: over 10 instructions fewer), run, gelu's values agree bit
for bit, and mathlib's switch is put back."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("llvmlite")

from benchmarks import gelu_loop  # noqa: E402
from graphc.backends.cpu import mathlib  # noqa: E402


def test_gelu_loop_benchmark_smoke(capsys):
    after_gelu = mathlib.ERF_AFTER_GELU
    gelu_loop.main(["--rounds", "1"])
    out = capsys.readouterr().out
    counts = {name: int(re.search(rf"{name}: (\d+) instructions", out).group(1))
              for name in gelu_loop.VARIANTS}
    assert counts["erf from gelu"] < counts["own erf"] - 10, out
    assert "gelu same bits: True" in out and "load average:" in out
    assert mathlib.ERF_AFTER_GELU is after_gelu


def test_gelu_loop_against_a_revision(capsys):
    """--against HEAD: the committed mathlib.py compiled as a variant of its own; the
    package's mathlib is put back."""
    import graphc.backends.cpu as cpu

    gelu_loop.main(["--rounds", "1", "--against", "HEAD"])
    out = capsys.readouterr().out
    assert re.search(r"HEAD: \d+ instructions", out), out
    assert "gelu against HEAD: at most" in out and "derivative against HEAD" in out
    assert cpu.mathlib is mathlib
    with pytest.raises(SystemExit, match="no mathlib.py"):
        gelu_loop.main(["--rounds", "1", "--against", "no-such-revision"])
