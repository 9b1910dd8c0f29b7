"""benchmarks/mlp_threads.py: "before" keeps the MLP step's forward row chunks serial and
puts kernels.gemm_work back afterwards; one block of each variant and count runs, with a
line per count, PyTorch eager's step alongside and the per-kernel profile; bad counts are
refused with a message."""

from __future__ import annotations

import pytest

pytest.importorskip("llvmlite")

from benchmarks import mlp_threads  # noqa: E402
from graphc.backends.cpu import kernels, small_gemm, threads  # noqa: E402


def test_before_weighs_outputs_only_and_puts_the_rule_back(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))  # the variant sets it: put back
    rule = kernels.gemm_work
    with mlp_threads.variant("before", str(tmp_path)):
        assert kernels.gemm_work(2, 128, 64, 784) < kernels.PARALLEL_MIN_ELEMENTS
    assert kernels.gemm_work is rule
    assert kernels.gemm_work(2, 128, 64, 784) >= kernels.PARALLEL_MIN_ELEMENTS


@pytest.mark.skipif(threads.most_threads() < 2, reason="one thread here: nothing to compare")
@pytest.mark.skipif(small_gemm.lanes() != 16, reason="medium products are AVX-512 only")
def test_one_block_of_each_variant_and_count(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    # the counts below are of a BLAS with AVX-512 kernels: one without (small_gemm.
    # large_products) hands the MLP's other products to generated kernels too
    monkeypatch.setattr(small_gemm, "LARGE_PRODUCTS", "off")
    mlp_threads.main(["--blocks", "1", "--calls", "2", "--profile", "--torch"])
    out = capsys.readouterr().out
    assert "before: 1 loops of generated GEMMs fork" in out  # the weight gradient's chunks
    assert "after: 3 loops of generated GEMMs fork" in out  # and W1 @ x^T, W2 @ h^T
    for name in mlp_threads.VARIANTS:
        for count in mlp_threads.COUNTS:
            assert f"{name:<7} {count:>6}: median " in out
    assert out.count("native call ") == len(mlp_threads.VARIANTS)
    for count in ("1t", "2t"):
        assert f"torch   {count:>6}: median " in out
    assert out.count(" / torch eager: 1t ") == len(mlp_threads.VARIANTS)
    assert "at the end: load average" in out


@pytest.mark.parametrize("flag", ["--blocks", "--calls"])
def test_no_timed_calls_is_refused_clearly(flag, capsys):
    with pytest.raises(SystemExit):
        mlp_threads.main([flag, "0"])
    assert f"{flag} must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.skipif(threads.most_threads() < 2, reason="one thread here: nothing to compare")
def test_the_fork_costs_run_every_gap(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    least = kernels.PARALLEL_MIN_ELEMENTS
    mlp_threads.main(["--fork", "--calls", "2"])
    out = capsys.readouterr().out
    assert kernels.PARALLEL_MIN_ELEMENTS == least  # put back after compiling
    for gap in mlp_threads.GAPS_US:
        assert f"{gap:5d} us | " in out


@pytest.mark.skipif(threads.most_threads() < 2, reason="one thread here: nothing to compare")
def test_realtime_puts_every_thread_back_to_the_normal_policy(capsys, tmp_path, monkeypatch):
    """Each timed block runs under SCHED_FIFO (root); afterwards no thread of the process,
    libgomp's team included, keeps it. Without the right to it: a clear exit."""
    import os

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    try:
        mlp_threads.main(["--fork", "--calls", "1", "--realtime"])
    except SystemExit as error:
        assert "--realtime needs SCHED_FIFO" in str(error)
        return
    for tid in os.listdir("/proc/self/task"):
        assert os.sched_getscheduler(int(tid)) == os.SCHED_OTHER, tid


def test_realtime_refused_is_a_clear_exit(monkeypatch):
    import os

    def refuse(*args):
        raise PermissionError("Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse, raising=False)
    with pytest.raises(SystemExit, match="--realtime needs SCHED_FIFO"):
        mlp_threads.main(["--fork", "--realtime"])
