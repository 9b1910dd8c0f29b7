"""benchmarks/dynamic_profile.py: a quick run profiles the static and the symbolic MLP step
(graphc.profile of a symbolic graph) and prints both, by kernel class and side by side."""

from __future__ import annotations

import pytest

pytest.importorskip("llvmlite", reason="graphc.profile times the cpu backend's kernels")

from benchmarks import dynamic_profile  # noqa: E402


def test_a_quick_run_profiles_both_variants(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    dynamic_profile.main(["--quick", "--limit", "2"])
    out = capsys.readouterr().out
    assert "static: " in out and "(f32[64,784])" in out
    assert "symbolic: " in out and "(f32[s0,784])" in out
    assert "matmul (and its epilogue)" in out
    assert "the largest differences (symbolic - static)" in out
    assert "at the end: load average" in out
