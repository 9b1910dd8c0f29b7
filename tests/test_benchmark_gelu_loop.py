"""Smoke run of benchmarks/gelu_loop.py: both variants compile, count their vector loop (the
whole polynomials with fewer instructions than the coefficient selects), run and agree bit for
bit, and mathlib's switch is put back."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("llvmlite")

from benchmarks import gelu_loop  # noqa: E402
from graphc.backends.cpu import mathlib  # noqa: E402


def test_gelu_loop_benchmark_smoke(capsys):
    selects = mathlib.TAIL_SELECTS_COEFFICIENTS
    gelu_loop.main(["--rounds", "1"])
    out = capsys.readouterr().out
    counts = {name: int(re.search(rf"{name}: (\d+) instructions", out).group(1))
              for name in gelu_loop.VARIANTS}
    assert counts["whole polynomials"] < counts["coefficient selects"], out
    assert "same bits: True" in out and "load average:" in out
    assert mathlib.TAIL_SELECTS_COEFFICIENTS is selects
