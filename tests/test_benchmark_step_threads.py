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


def test_channel_forks_switch_keeps_the_transforms_inside_and_back(tmp_path, monkeypatch):
    from graphc.backends.cpu import conv_winograd

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    with step_threads.variant("before", str(tmp_path), "channel_forks"):
        assert conv_winograd.FORKED_TRANSFORMS is False
    assert conv_winograd.FORKED_TRANSFORMS is True


def test_wide_grad_forks_switch_keeps_its_transforms_inside_and_back(tmp_path, monkeypatch):
    from graphc.backends.cpu import conv_winograd, conv_winograd_wide_grad

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    with step_threads.variant("before", str(tmp_path), "wide_grad_forks"):
        assert conv_winograd_wide_grad.FORKED_TRANSFORMS is False
        assert conv_winograd.FORKED_TRANSFORMS is True  # only the named switch
    assert conv_winograd_wide_grad.FORKED_TRANSFORMS is True


def test_more_channel_forks_switch_turns_off_both_and_back(tmp_path, monkeypatch):
    from graphc.backends.cpu import conv_polyphase, conv_winograd_wide_grad

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    with step_threads.variant("before", str(tmp_path), "polyphase_forks"):
        assert conv_polyphase.FORKED_TRANSFORMS is False
        assert conv_winograd_wide_grad.FORKED_TRANSFORMS is True
    with step_threads.variant("before", str(tmp_path), "more_channel_forks"):
        assert conv_polyphase.FORKED_TRANSFORMS is False
        assert conv_winograd_wide_grad.FORKED_TRANSFORMS is False
    assert conv_polyphase.FORKED_TRANSFORMS is True
    assert conv_winograd_wide_grad.FORKED_TRANSFORMS is True


def test_kernel_classes_name_pass_geometry_and_channels():
    from graphc.ir import parse

    graph = parse('''graph @f(%x: f32[2,16,8,8], %w: f32[32,16,3,3], %g: f32[2,32,8,8]) -> (f32[2,32,8,8], f32[32,16,3,3], f32[2,32,8,8]) {
  %0: f32[2,32,8,8] = conv2d[stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1](%x, %w)
  %1: f32[32,16,3,3] = conv2d_weight_grad[stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1, kernel_size=(3, 3)](%g, %x)
  %2: f32[2,32,8,8] = relu(%0)
  return (%0, %1, %2)
}''')  # noqa: E501
    conv, grad, relu = graph.nodes
    assert step_threads.kernel_class(conv) == "conv2d 3x3 s1 32x16"
    assert step_threads.kernel_class(grad) == "conv2d_weight_grad 3x3 s1 32x16"
    assert step_threads.kernel_class(relu) == "relu"
    assert step_threads.kernel_class(None) == "output copy"
    # rows as kernel_table makes them: (lost, us at 1, us at 2, label, shape, how, kernel)
    rows = [(0, 300.0, 200.0, "", "", "", 0), (0, 100.0, 50.0, "", "", "", 1),
            (0, 100.0, 50.0, "", "", "", 2)]
    table = step_threads.class_table(rows, [conv, conv, relu], 2).splitlines()
    assert table[2] == "| conv2d 3x3 s1 32x16 | 2 | 0.40 / 0.25 | 1.60x | 0.05 |"
    assert table[3] == "| relu | 1 | 0.10 / 0.05 | 2.00x | 0.00 |"


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
    assert "| kernel class | kernels | ms at 1 / 2 threads | speed-up | lost ms |" in out
    for name in step_threads.VARIANTS:
        for count in (1, 2):
            assert f"{name}: step on {count} thread(s): median " in out
    assert (tmp_path / "kernels.json").read_text().startswith("[")
    import numpy as np

    runs = np.load(tmp_path / "kernels.json.npz")  # every run's kernel times, each count
    assert runs["us_1"].shape == runs["us_2"].shape == (1, len(runs["kernels"]))
    assert "at the end: load average" in out


def test_bad_counts_are_refused(capsys):
    with pytest.raises(SystemExit):
        step_threads.main(["--model", "gpt", "--runs", "0"])
    assert "--runs must be at least 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        step_threads.main(["--model", "gpt", "--quantile", "1.5"])
    assert "--quantile must be in [0, 1], got 1.5" in capsys.readouterr().err


def test_a_fifo_stretch_is_followed_by_a_pause_as_long(monkeypatch):
    import contextlib

    entered, slept = [], []
    clock = iter([10.0, 10.25, 20.0, 20.5])  # the first stretch: 0.25 s

    @contextlib.contextmanager
    def fake_realtime(on):
        entered.append(on)
        yield

    monkeypatch.setattr(step_threads, "realtime", fake_realtime)
    monkeypatch.setattr(step_threads.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(step_threads.time, "sleep", slept.append)
    with step_threads.fifo_stretch(True):
        pass
    assert entered == [True] and slept == [0.25]
    with step_threads.fifo_stretch(False):  # no SCHED_FIFO: no pause
        pass
    assert entered == [True, False] and slept == [0.25]


@pytest.mark.skipif(threads.most_threads() < 2, reason="one thread here: nothing to compare")
def test_kernels_of_both_variants_with_ab(capsys, tmp_path, monkeypatch):
    from graphc.backends.cpu import conv_winograd

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    profiled = step_threads.kernel_table
    switch_seen = []  # each profiling build is compiled with its variant's switch

    def recording(*args, **kwargs):
        switch_seen.append(conv_winograd.FORKED_TRANSFORMS)
        return profiled(*args, **kwargs)

    monkeypatch.setattr(step_threads, "kernel_table", recording)
    step_threads.main(["--model", "gpt", "--quick", "--ab", "channel_forks", "--only",
                       "kernels", "--runs", "1", "--rounds", "2", "--top", "2"])
    assert switch_seen == [False, True]
    out = capsys.readouterr().out
    assert out.count("native call (sum of kernels): ") == 2
    assert out.index("before:") < out.index("after:")
    assert "step on" not in out
