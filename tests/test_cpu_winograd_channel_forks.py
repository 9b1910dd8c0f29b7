"""A Winograd kernel whose batch is one block (ResNet-18's 512-channel layers: nothing to
split over images) forks its input transform over the input channels and its output
transform (with conv2d_channel_sums' sums) over the output channels, each a kernel of its
own (graphc.backends.cpu.conv_threads.channel_kernel, conv_winograd.FORKED_TRANSFORMS):
the same bits on one thread and on all cores as the kernel with both transforms inside."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends import compile as compile_graph  # noqa: E402
from graphc.backends.cpu import conv_winograd, threads  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from tests.test_cpu_backend import one_op_graph  # noqa: E402

ALL_CORES = threads.most_threads()
ATTRS = {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 1}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))


def _graph(op: str, n: int, c: int, hw: int):
    types = [((n, c, hw, hw), "float32"), ((c, c, 3, 3), "float32")]
    extra = {"input_hw": (hw, hw)} if op == "conv2d_input_grad" else {}
    return one_op_graph(op, types, **extra, **ATTRS)


def _omp_kernels(exe) -> list[str]:
    text = exe.lowered.ir_text
    return [k for k in exe.lowered.kernels if f'@"{k}.omp"' in text or f"@{k}.omp(" in text]


def _runs(graph, args, forked: bool, monkeypatch, tmp_path) -> tuple:
    """(the executable, its results on one thread and on all cores)."""
    monkeypatch.setattr(conv_winograd, "FORKED_TRANSFORMS", forked)
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"cache_{forked}"))
    exe = compile_graph(graph, "cpu")
    results = []
    for count in (1, ALL_CORES):
        exe.thread_chooser = ThreadChooser(ALL_CORES, fixed=count)
        results.append([np.array(r) for r in exe.run(*[a.copy() for a in args])])
    return exe, results


# 128 channels at 4x4, batch 8: one block of 32 tiles (BLOCK_TILES 64), each transform
# writes 16 x 128 x 32 = 65,536 elements (kernels.PARALLEL_MIN_ELEMENTS: it forks)
@pytest.mark.parametrize("op", ["conv2d_channel_sums", "conv2d_input_grad"])
def test_one_block_kernel_forks_its_transforms_with_the_same_bits(op, monkeypatch, tmp_path):
    rng = np.random.default_rng(len(op))
    n, c, hw = 8, 128, 4
    args = [rng.standard_normal((n, c, hw, hw)).astype(np.float32),
            rng.standard_normal((c, c, 3, 3)).astype(np.float32)]
    graph = _graph(op, n, c, hw)
    exe, (one, every) = _runs(graph, args, True, monkeypatch, tmp_path)
    names = [k.split("_", 1)[1] for k in exe.lowered.kernels]
    # the transforms fork only where a second thread can take a share
    assert names == (["conv2d_winograd_filter", "conv2d_winograd_input", "conv2d_winograd",
                      "conv2d_winograd_output"] if ALL_CORES > 1 else
                     ["conv2d_winograd_filter", "conv2d_winograd"]), names
    before_exe, (before, before_every) = _runs(_graph(op, n, c, hw), args, False, monkeypatch,
                                               tmp_path)
    assert [k.split("_", 1)[1] for k in before_exe.lowered.kernels] == \
        ["conv2d_winograd_filter", "conv2d_winograd"]
    if ALL_CORES > 1:
        forked = [k.split("_", 1)[1] for k in _omp_kernels(exe)]
        assert {"conv2d_winograd_input", "conv2d_winograd_output"} <= set(forked), forked
    want = compile_graph(_graph(op, n, c, hw), "interp").run(*args)
    assert len(one) == len(want) == (2 if op == "conv2d_channel_sums" else 1)
    for k, (got, same, old, old_every, ref) in enumerate(zip(one, every, before,
                                                             before_every, want)):
        np.testing.assert_array_equal(same, got, err_msg=f"{op} output {k}: all cores")
        np.testing.assert_array_equal(old, got, err_msg=f"{op} output {k}: transforms inside")
        np.testing.assert_array_equal(old_every, got, err_msg=f"{op} output {k}: inside, "
                                      "all cores")
        scale = float(np.max(np.abs(ref)))
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * scale, err_msg=op)
    # an input of its own (x scaled: an output element left unwritten, holding a freed
    # array's values, cannot pass), on all cores, against the interpreter
    probe = [args[0] * -3.0, args[1]]
    exe.thread_chooser = ThreadChooser(ALL_CORES, fixed=ALL_CORES)
    got = [np.array(r) for r in exe.run(*[a.copy() for a in probe])]
    for k, (mine, ref) in enumerate(zip(got, compile_graph(_graph(op, n, c, hw), "interp")
                                        .run(*probe))):
        np.testing.assert_allclose(mine, ref, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(ref))),
                                   err_msg=f"{op} output {k}: a scaled input")


def test_several_blocks_keep_the_transforms_inside(monkeypatch, tmp_path):
    # batch 32 at 4x4 and 128 channels: two blocks of 64 tiles, split over the images
    rng = np.random.default_rng(3)
    args = [rng.standard_normal((32, 128, 4, 4)).astype(np.float32),
            rng.standard_normal((128, 128, 3, 3)).astype(np.float32)]
    exe, _ = _runs(_graph("conv2d_channel_sums", 32, 128, 4), args, True, monkeypatch,
                   tmp_path)
    names = [k.split("_", 1)[1] for k in exe.lowered.kernels]
    assert "conv2d_winograd_input" not in names and "conv2d_winograd_output" not in names
