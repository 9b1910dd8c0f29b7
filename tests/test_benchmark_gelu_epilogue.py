"""Smoke run of benchmarks/gelu_epilogue.py at the GPT's smoke size: it compiles its three
variants, puts mathlib back as it found it, and prints one line per variant."""

from __future__ import annotations

import pytest

pytest.importorskip("llvmlite")

from benchmarks import gelu_epilogue  # noqa: E402
from graphc.backends.cpu import scalars  # noqa: E402


def test_gelu_epilogue_benchmark_smoke(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    wide = scalars.WIDE_VECTOR_FUNCTIONS
    gelu_epilogue.main(["--rounds", "1", "--quick"])
    out = capsys.readouterr().out
    for name in ("before", "two ranges", "after"):
        assert f"gpt {name}: step" in out
    assert "load average:" in out
    assert scalars.WIDE_VECTOR_FUNCTIONS is wide
