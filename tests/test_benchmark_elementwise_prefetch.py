"""Smoke run of benchmarks/elementwise_prefetch.py on a small array: it compiles its four
variants of each expression, finds their results equal, puts scalars and prefetch back as it
found them, and prints one line per expression."""

from __future__ import annotations

import pytest

pytest.importorskip("llvmlite")

from benchmarks import elementwise_prefetch  # noqa: E402
from graphc.backends.cpu import prefetch, scalars  # noqa: E402


def test_elementwise_prefetch_benchmark_smoke(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    wide, least = scalars.WIDE_VECTOR_FUNCTIONS, prefetch.PREFETCH_MIN_ELEMENTS
    elementwise_prefetch.main(["--elements", str(least + 3), "--rounds", "1",
                               "--only", "chain", "--only", "relu"])
    out = capsys.readouterr().out
    for expression in ("chain", "relu"):
        line = next(row for row in out.splitlines() if row.startswith(f"{expression} over"))
        for name in elementwise_prefetch.VARIANTS:
            assert f"{name} " in line and "ns/el" in line
    assert "load average:" in out
    assert scalars.WIDE_VECTOR_FUNCTIONS is wide and prefetch.PREFETCH_MIN_ELEMENTS == least
