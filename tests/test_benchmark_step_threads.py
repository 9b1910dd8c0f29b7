"""benchmarks/step_threads.py: how a kernel runs on two threads is read from the module's
text; at smoke sizes, both models' kernel tables and the step's A/B print a line each; "before"
turns the tenth session's forks off while compiling and puts kernels.forks back; bad counts
are refused with a message."""

from __future__ import annotations

import pytest

pytest.importorskip("llvmlite")

from benchmarks import step_threads  # noqa: E402
from graphc.backends.cpu import kernels, threads  # noqa: E402

TEXT = '''define void @k1_fused(ptr %a) {
  call void @GOMP_parallel(ptr @"k1_fused.omp", ptr %t, i32 0, i32 0)
}
define void @k2_gemm(ptr %a) {
  call void @cblas_sgemm(i32 101)
}
define void @k3_conv2d_winograd(ptr %a) {
  call void @"graphc_winograd_gemm_x.forked"(ptr %a, ptr %b, ptr %c, float 0.0)
}
define void @k4_copy(ptr %a) {
  ret void
}
'''


def test_how_a_kernel_runs_is_read_from_the_module():
    assert step_threads.how_it_runs("k1_fused", TEXT) == "omp"
    assert step_threads.how_it_runs("k2_gemm", TEXT) == "blas"
    assert step_threads.how_it_runs("k3_conv2d_winograd", TEXT) == "forked"
    assert step_threads.how_it_runs("k4_copy", TEXT) == "serial"
    assert step_threads.how_it_runs("k5_conv2d.split", TEXT) == "split"


def test_before_turns_the_forks_off_and_puts_them_back(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))  # the variant sets it: put back
    with step_threads.variant("before", str(tmp_path)):
        assert not kernels.forks(True, 1 << 30)
    assert kernels.forks(True, 1 << 30)


def test_column_parts_switch_turns_the_row_parts_off_and_back(tmp_path, monkeypatch):
    from graphc.backends.cpu import column_parts

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    with step_threads.variant("before", str(tmp_path), "column_parts"):
        assert column_parts.SPLIT is False
        assert kernels.forks(True, 1 << 30)  # only the named switch
    assert column_parts.SPLIT is True


@pytest.mark.skipif(threads.most_threads() < 2, reason="one thread here: nothing to compare")
@pytest.mark.parametrize("model", ["gpt", "resnet18"])
def test_smoke_sizes_print_every_part(model, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    step_threads.main(["--model", model, "--quick", "--ab", "--runs", "1", "--rounds", "2",
                       "--blocks", "1", "--calls", "1", "--top", "3",
                       "--json", str(tmp_path / "kernels.json")])
    out = capsys.readouterr().out
    assert "native call (sum of kernels): " in out
    assert "by op and how it runs" in out
    for name in step_threads.VARIANTS:
        for count in (1, 2):
            assert f"{name}: step on {count} thread(s): median " in out
    assert (tmp_path / "kernels.json").read_text().startswith("[")
    assert "at the end: load average" in out


def test_bad_counts_are_refused(capsys):
    with pytest.raises(SystemExit):
        step_threads.main(["--model", "gpt", "--runs", "0"])
    assert "--runs must be at least 1, got 0" in capsys.readouterr().err
