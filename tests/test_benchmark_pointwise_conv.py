"""benchmarks/pointwise_conv.py: bad counts and --step with --threads are refused before
anything compiles, and the table runs end to end at batch 1 (each pass's two kernels
agreeing within float32 rounding)."""

from __future__ import annotations

import pytest

pytest.importorskip("llvmlite", reason="the benchmark compiles LLVM functions")

from benchmarks import pointwise_conv  # noqa: E402
from graphc.backends.cpu import conv_pointwise  # noqa: E402


@pytest.fixture(autouse=True)
def _threads_put_back(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # main sets both: put them back after
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")


@pytest.mark.parametrize("flag", ["--rounds", "--threads", "--repeat"])
def test_a_count_below_one_is_refused_clearly(flag, capsys):
    with pytest.raises(SystemExit):
        pointwise_conv.main([flag, "0"])
    assert f"{flag} must be at least 1, got 0" in capsys.readouterr().err


def test_step_with_threads_is_refused(capsys):
    with pytest.raises(SystemExit):
        pointwise_conv.main(["--step", "--threads", "2"])
    assert "--step runs one thread" in capsys.readouterr().err


@pytest.mark.skipif(not conv_pointwise.winograd_gemm.available(),
                    reason="no AVX-512: conv_pointwise declines every shape")
def test_the_table_at_batch_one(capsys):
    pointwise_conv.main(["--rounds", "1", "--batch", "1"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and " out |" in line]
    assert len(rows) == 9, out
    assert all(row.rstrip().endswith("| yes |") for row in rows), out
    assert "| all nine |" in out
