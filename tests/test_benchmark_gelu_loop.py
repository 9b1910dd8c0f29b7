"""Smoke run of benchmarks/gelu_loop.py: the variants compile, count their vector loop (each
with fewer instructions than the one before), run, the first two agree bit for bit, and
mathlib's switches are put back."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("llvmlite")

from benchmarks import gelu_loop  # noqa: E402
from graphc.backends.cpu import mathlib  # noqa: E402


def test_gelu_loop_benchmark_smoke(capsys):
    selects, after_gelu = mathlib.TAIL_SELECTS_COEFFICIENTS, mathlib.ERF_AFTER_GELU
    gelu_loop.main(["--rounds", "1"])
    out = capsys.readouterr().out
    counts = {name: int(re.search(rf"{name}: (\d+) instructions", out).group(1))
              for name in gelu_loop.VARIANTS}
    assert counts["erf from gelu"] < counts["whole polynomials"] < counts["coefficient selects"]
    assert "same bits: True" in out and "load average:" in out
    assert mathlib.TAIL_SELECTS_COEFFICIENTS is selects and mathlib.ERF_AFTER_GELU is after_gelu
