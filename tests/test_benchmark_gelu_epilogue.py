"""Smoke run of benchmarks/gelu_epilogue.py at the GPT's smoke size: it compiles its
variants, puts mathlib and gemm_epilogue back as it found them, and prints one line per
variant."""

from __future__ import annotations

import pytest

pytest.importorskip("llvmlite")

from benchmarks import gelu_epilogue  # noqa: E402
from graphc.backends.cpu import gemm_epilogue, mathlib, scalars  # noqa: E402


def test_gelu_epilogue_benchmark_smoke(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    wide = scalars.WIDE_VECTOR_FUNCTIONS
    after_gelu, fold = mathlib.ERF_AFTER_GELU, gemm_epilogue.FOLD
    gelu_epilogue.main(["--rounds", "1", "--quick"])
    out = capsys.readouterr().out
    for name in gelu_epilogue.VARIANTS:
        assert f"gpt {name}: step" in out
    assert "load average:" in out
    assert scalars.WIDE_VECTOR_FUNCTIONS is wide
    assert mathlib.ERF_AFTER_GELU is after_gelu and gemm_epilogue.FOLD is fold
