"""Convolutions with few output channels per group (graphc.backends.cpu.conv_direct's
FEW_ROWS: LeNet-5's first layer, depthwise with a channel multiplier) take direct loops in
the forward and the weight gradient, and im2col + GEMM in the input gradient; checked against
the interpreter and within 2x eager's distance from a float64 run, on odd shapes, strides,
padding, dilation and groups. Larger ones keep the GEMM."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import conv_few_channels  # noqa: E402
from tests.test_cpu_backend import compare  # noqa: E402
from tests.test_cpu_conv_paths import (
    _graphs,  # noqa: E402
    check_paths,  # noqa: E402
)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    # <= 8 input channels at stride 1 take conv_few_channels' tiles, forward and weight
    # gradient (tested in test_cpu_conv_few_channels.py); the direct loops still serve the
    # others (groups, strides, more input channels), so these cases keep testing them
    monkeypatch.setattr(conv_few_channels, "MAX_CHANNELS", 0)


# (input, weight, stride, padding, groups)
FEW_ROWS = [
    ((3, 1, 12, 12), (6, 1, 5, 5), (1, 1), (2, 2), 1),  # LeNet-5's first layer, smaller
    ((2, 3, 9, 7), (5, 3, 3, 3), (2, 2), (1, 0), 1),  # stride 2, odd sizes, uneven padding
    ((2, 4, 8, 8), (6, 2, 3, 3), (1, 1), (1, 1), 2),  # groups, 3 outputs each
    ((2, 3, 7, 7), (6, 1, 3, 3), (1, 1), (1, 1), 3),  # depthwise with multiplier 2
    ((5, 6, 6), (4, 5, 1, 3), (1, 2), (0, 1), 1),  # unbatched, 1x3 kernel
]


@pytest.mark.parametrize("case", range(len(FEW_ROWS)))
def test_few_rows_take_direct_loops(case):
    check_paths(*FEW_ROWS[case], marker="conv2d_direct", gx_marker="conv2d_input_grad")


def test_few_rows_with_dilation():
    check_paths((2, 2, 9, 9), (4, 2, 3, 3), (1, 1), (2, 2), 1, marker="conv2d_direct",
                gx_marker="conv2d_input_grad", dilation=(2, 2))


@pytest.mark.parametrize("shape", [((2, 4, 6, 6), (16, 4, 3, 3)),  # 16 rows: a GEMM
                                   ((2, 8, 6, 6), (4, 8, 3, 3))])  # 72 taps: a GEMM
def test_others_keep_the_gemm(shape):
    xs, ws = shape
    rng = np.random.default_rng(1)
    _, graphs = _graphs(xs, ws, (1, 1), (1, 1), 1)
    for kind, shapes in (("fwd", [xs, ws]), ("gw", [graphs["gw"].inputs[0].type.shape, xs])):
        arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        exe = compare(graphs[kind], arrays, rtol=1e-4)
        assert "conv2d_direct" not in exe.lowered.ir_text, kind
