"""Each path of the CPU backend's convolution lowering (graphc.backends.cpu.conv and
conv_direct), forward and both gradients, on shapes that take it, against the interpreter;
summation orders that differ from numpy's are judged by distance from a float64 run
(graphc.testing.assert_rounding_within, docs/performance.md "Rounding"). The IR text shows
which path a node took: `block.head`/`img.head` loops for images in blocks of one GEMM."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import conv_blocks, conv_direct, conv_few_channels  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.ops.conv import conv_output_hw  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.test_cpu_backend import compare, one_op_graph  # noqa: E402


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _graphs(xs, ws, stride, padding, groups, dtype="float32", dilation=(1, 1)):
    attrs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    gs = xs[:-3] + (ws[0],) + conv_output_hw(xs[-2:], ws[2:], stride, padding, dilation)
    return gs, {
        "fwd": one_op_graph("conv2d", [(xs, dtype), (ws, dtype)], **attrs),
        "gx": one_op_graph("conv2d_input_grad", [(gs, dtype), (ws, dtype)],
                           input_hw=xs[-2:], **attrs),
        "gw": one_op_graph("conv2d_weight_grad", [(gs, dtype), (xs, dtype)],
                           kernel_size=ws[2:], **attrs)}


def check_paths(xs, ws, stride, padding, groups, marker, gx_marker=None, dilation=(1, 1)):
    """Forward and both gradients: equal to the interpreter within float32 rounding, within
    2x eager's distance from float64, and lowered through the path `marker` names."""
    rng = np.random.default_rng(sum(xs) + 7 * sum(ws))
    gs, graphs = _graphs(xs, ws, stride, padding, groups, dilation=dilation)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    gy = rng.standard_normal(gs).astype(np.float32)
    args = {"fwd": [x, w], "gx": [gy, w], "gw": [gy, x]}
    for kind, graph in graphs.items():
        exe = compare(graph, args[kind], rtol=1e-4)
        got = exe.run(*args[kind])[0]
        eager = interpret(graph, *args[kind])[0]
        _, wide = _graphs(xs, ws, stride, padding, groups, "float64", dilation)
        reference = interpret(wide[kind], *[a.astype(np.float64) for a in args[kind]])[0]
        assert_rounding_within(got, eager, reference)
        want = gx_marker if kind == "gx" and gx_marker else marker
        assert want in exe.lowered.ir_text, f"{kind}: no {want!r} in the module"


# (input, weight, stride, padding, groups): output planes under THIN_COLUMNS positions, so
# images go in blocks of one GEMM; batches that leave a partial last block.
BLOCKED = [
    ((5, 8, 4, 4), (16, 8, 3, 3), (1, 1), (1, 1), 1),  # 4x4 planes, 5 images
    ((7, 6, 6, 6), (8, 3, 3, 3), (2, 2), (1, 1), 2),  # stride 2, groups
    ((9, 8, 5, 5), (12, 8, 1, 1), (1, 1), (0, 0), 1),  # pointwise, blocked
    ((6, 8, 6, 6), (12, 8, 1, 1), (2, 2), (0, 0), 1),  # a 1x1 shortcut with stride 2
]


@pytest.mark.parametrize("case", range(len(BLOCKED)))
def test_images_in_blocks_of_one_gemm(case, monkeypatch):
    monkeypatch.setattr(conv_blocks, "BLOCK_COLUMNS", 40)  # blocks of 2-3 images, partial tails
    monkeypatch.setattr(conv_direct, "FEW_ROWS", 0)  # these few rows would take direct loops
    # and <= 8 input channels at stride 1 register tiles (test_cpu_conv_few_channels.py)
    monkeypatch.setattr(conv_few_channels, "MAX_CHANNELS", 0)
    check_paths(*BLOCKED[case], marker="img.head")


def test_one_block_per_batch(monkeypatch):
    monkeypatch.setattr(conv_few_channels, "MAX_CHANNELS", 0)  # as above
    check_paths((3, 8, 4, 4), (16, 8, 3, 3), (1, 1), (1, 1), 1, marker="img.head")


def test_large_planes_keep_one_gemm_per_image():
    rng = np.random.default_rng(0)
    _, graphs = _graphs((2, 4, 10, 10), (6, 4, 3, 3), (1, 1), (1, 1), 1)
    x = rng.standard_normal((2, 4, 10, 10)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    exe = compare(graphs["fwd"], [x, w])
    assert "img.head" not in exe.lowered.ir_text


# depthwise: groups == C_in == C_out (direct loops, graphc.backends.cpu.conv_direct)
DEPTHWISE = [
    ((3, 6, 7, 6), (6, 1, 3, 3), (1, 1), (1, 1), 6),
    ((2, 4, 9, 8), (4, 1, 3, 3), (2, 2), (1, 1), 4),  # stride 2
    ((2, 5, 6, 7), (5, 1, 5, 3), (1, 2), (2, 0), 5),  # rectangular kernel, no column padding
    ((4, 7, 7), (4, 1, 3, 3), (1, 1), (3, 3), 4),  # unbatched, padding past the kernel
]


@pytest.mark.parametrize("case", range(len(DEPTHWISE)))
def test_depthwise_direct(case):
    check_paths(*DEPTHWISE[case], marker="conv2d_depthwise")


def test_depthwise_direct_with_dilation():
    check_paths((2, 3, 9, 9), (3, 1, 3, 3), (1, 1), (2, 2), 3, marker="conv2d_depthwise",
                dilation=(2, 2))


def test_depthwise_conv_with_a_fused_bias_and_relu():
    import graphc
    from graphc.passes.fuse import fuse

    rng = np.random.default_rng(5)
    x = graphc.tensor(rng.standard_normal((2, 4, 6, 6)).astype(np.float32))
    w = graphc.tensor(rng.standard_normal((4, 1, 3, 3)).astype(np.float32))
    bias = graphc.tensor(rng.standard_normal(4).astype(np.float32))
    g = fuse(graphc.trace(lambda x, w, b: graphc.conv2d(x, w, b, padding=1, groups=4).relu(),
                          x, w, bias))
    assert any(n.op == "fused" and n.attrs["body"][0][0] == "conv2d" for n in g.nodes)
    exe = compare(g, [t.numpy() for t in (x, w, bias)], rtol=1e-4)
    assert "conv2d_depthwise" in exe.lowered.ir_text
