"""The im2col path's im2col and col2im one input row at a time (graphc.backends.cpu.
conv_im2col, `Conv._im2col_rows`, `_col2im_rows`): forward, input and weight gradients bit
for bit the scalar loops' results (BY_ROWS off) and the interpreter's within float32
rounding, on strides 1 and 2, paddings 0-2, kernels 1x1 to 3x3 and 5x5, a dilated height,
groups, blocks of small images, float64, a strided input view; what it declines."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import (  # noqa: E402
    conv_im2col,
    conv_pointwise,
    conv_polyphase,
    conv_polyphase_grad,
)
from tests.test_cpu_backend import compare  # noqa: E402
from tests.test_cpu_conv_paths import _graphs  # noqa: E402

# (input, weight, stride, padding, groups, dilation, dtype): each takes the im2col input
# gradient (not Winograd, direct or few-channel paths)
CASES = [
    ((2, 16, 16, 16), (32, 16, 3, 3), (2, 2), (1, 1), 1, (1, 1), "float32"),  # ResNet's
    ((2, 16, 16, 16), (32, 16, 1, 1), (2, 2), (0, 0), 1, (1, 1), "float32"),  # shortcut
    ((2, 16, 15, 13), (24, 16, 3, 3), (2, 2), (0, 2), 1, (1, 1), "float32"),  # odd, pad 2
    ((1, 16, 9, 20), (24, 16, 2, 3), (1, 3), (1, 1), 1, (1, 1), "float32"),  # stride 3
    ((2, 16, 12, 12), (24, 16, 3, 3), (1, 1), (2, 1), 1, (2, 1), "float32"),  # dilated rows
    ((2, 16, 10, 10), (32, 8, 3, 3), (2, 2), (1, 1), 2, (1, 1), "float32"),  # groups
    ((6, 16, 6, 6), (32, 16, 3, 3), (2, 2), (1, 1), 1, (1, 1), "float32"),  # blocks
    ((2, 16, 12, 12), (24, 16, 3, 3), (2, 2), (1, 1), 1, (1, 1), "float64"),
    ((1, 8, 11, 11), (16, 8, 5, 5), (2, 2), (2, 2), 1, (1, 1), "float32"),  # 25 taps: not
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_im2col_by_rows_bit_for_bit(case, monkeypatch, tmp_path):
    # the forward and the weight gradient read their columns from im2col
    xs, ws, stride, padding, groups, dilation, dtype = CASES[case]
    gs, _ = _graphs(xs, ws, stride, padding, groups, dtype, dilation)
    rng = np.random.default_rng(case)
    taken = []
    emit = conv_im2col.Conv._im2col_rows

    def recording(self, *rest):
        taken.append(True)
        return emit(self, *rest)

    monkeypatch.setattr(conv_im2col.Conv, "_im2col_rows", recording)
    monkeypatch.setattr(conv_polyphase, "ENABLED", False)  # ResNet's forward: im2col here
    monkeypatch.setattr(conv_polyphase_grad, "ENABLED", False)  # and its weight gradient
    monkeypatch.setattr(conv_pointwise, "ENABLED", False)  # ResNet's shortcut: im2col here
    for kind, shapes in (("fwd", (xs, ws)), ("gw", (gs, xs))):
        args = [rng.standard_normal(s).astype(dtype) for s in shapes]
        outs = []
        for on in (True, False):
            taken.clear()
            monkeypatch.setattr(conv_im2col, "BY_ROWS", on)
            monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"{kind}-{on}"))
            graph = _graphs(xs, ws, stride, padding, groups, dtype, dilation)[1][kind]
            exe = compare(graph, args, rtol=1e-4 if dtype == "float32" else 1e-12)
            outs.append(exe.run(*args)[0])
            if on and kind == "fwd":  # (a weight gradient may take conv_direct)
                assert bool(taken) == (ws[2] * ws[3] <= conv_im2col.ROW_TAPS), taken
        np.testing.assert_array_equal(outs[0], outs[1], err_msg=kind)


def test_im2col_by_rows_of_a_strided_view(monkeypatch, tmp_path):
    import graphc

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 16, 12, 20)).astype(np.float32)
    w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
    outs = []
    for on in (True, False):
        monkeypatch.setattr(conv_im2col, "BY_ROWS", on)
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / str(on)))
        g = graphc.trace(lambda x, w: graphc.conv2d(x[:, :, :, 3:17], w, stride=2, padding=1),
                         graphc.tensor(x), graphc.tensor(w))
        outs.append(compare(g, [x, w], rtol=1e-4).run(x, w)[0])
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("case", range(len(CASES)))
def test_col2im_by_rows_bit_for_bit(case, monkeypatch, tmp_path):
    xs, ws, stride, padding, groups, dilation, dtype = CASES[case]
    gs, _ = _graphs(xs, ws, stride, padding, groups, dtype, dilation)
    rng = np.random.default_rng(case)
    args = [rng.standard_normal(s).astype(dtype) for s in (gs, ws)]
    taken, outs = [], []
    emit = conv_im2col.Conv._col2im_rows

    def recording(self, *rest):
        taken.append(True)
        return emit(self, *rest)

    monkeypatch.setattr(conv_im2col.Conv, "_col2im_rows", recording)
    monkeypatch.setattr(conv_pointwise, "ENABLED", False)  # ResNet's shortcut: col2im here
    for on in (True, False):
        monkeypatch.setattr(conv_im2col, "BY_ROWS", on)
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / str(on)))
        graph = _graphs(xs, ws, stride, padding, groups, dtype, dilation)[1]["gx"]
        exe = compare(graph, args, rtol=1e-4 if dtype == "float32" else 1e-12)
        assert "conv2d_input_grad" in exe.lowered.ir_text
        outs.append(exe.run(*args)[0])
        if on:
            assert bool(taken) == (ws[2] * ws[3] <= conv_im2col.ROW_TAPS), taken
    np.testing.assert_array_equal(outs[0], outs[1])


def test_declines_long_rows_and_dilated_columns(monkeypatch, tmp_path):
    taken = []
    emit = conv_im2col.Conv._col2im_rows

    def recording(self, *rest):
        taken.append(self.g)
        return emit(self, *rest)

    monkeypatch.setattr(conv_im2col.Conv, "_col2im_rows", recording)
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(1)
    for xs, dilation in (((1, 16, 4, conv_im2col.ROW_LANES + 2), (1, 1)),
                         ((1, 16, 10, 10), (1, 2))):
        ws = (24, 16, 3, 3)
        gs, graphs = _graphs(xs, ws, (2, 2), (1, 1), 1, dilation=dilation)
        args = [rng.standard_normal(s).astype(np.float32) for s in (gs, ws)]
        compare(graphs["gx"], args, rtol=1e-4)
    assert not taken
