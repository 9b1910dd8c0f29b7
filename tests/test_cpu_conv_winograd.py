"""The CPU backend's Winograd F(2x2, 3x3) convolutions (graphc.backends.cpu.conv_winograd):
the transform matrices against a direct correlation, then the forward and both gradients on
shapes that take the path (padding 0-2, blocks of images with a partial last block,
unbatched, strided inputs) and shapes that must not (odd outputs, stride 2, groups,
dilation, few channels), against the interpreter and within 2x eager's distance from a
float64 run (graphc.testing.assert_rounding_within)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import conv_winograd  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.test_cpu_backend import compare  # noqa: E402
from tests.test_cpu_conv_paths import _graphs  # noqa: E402


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def check_winograd(xs, ws, stride, padding, groups):
    """Forward and both gradients: equal to the interpreter within float32 rounding, within
    2x eager's distance from float64, and lowered by conv_winograd."""
    rng = np.random.default_rng(sum(xs) + 7 * sum(ws))
    gs, graphs = _graphs(xs, ws, stride, padding, groups)
    _, wide = _graphs(xs, ws, stride, padding, groups, "float64")
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    gy = rng.standard_normal(gs).astype(np.float32)
    for kind, args in (("fwd", [x, w]), ("gx", [gy, w]), ("gw", [gy, x])):
        exe = compare(graphs[kind], args, rtol=1e-4)
        got = exe.run(*args)[0]
        eager = interpret(graphs[kind], *args)[0]
        reference = interpret(wide[kind], *[a.astype(np.float64) for a in args])[0]
        assert_rounding_within(got, eager, reference)
        assert "conv2d_winograd" in exe.lowered.ir_text, kind


def test_transforms_compute_the_correlation():
    rng = np.random.default_rng(3)
    bt, g, at = (np.array(m, dtype=np.float64) for m in
                 (conv_winograd.BT, conv_winograd.G, conv_winograd.AT))
    d, f = rng.standard_normal((4, 4)), rng.standard_normal((3, 3))
    want = np.array([[(d[i:i + 3, j:j + 3] * f).sum() for j in range(2)] for i in range(2)])
    got = at @ ((g @ f @ g.T) * (bt @ d @ bt.T)) @ at.T
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_weight_grad_transforms_compute_the_filter_gradient():
    # the gradient of sum(gy * correlation(d, f)) over f, for one 4x4 tile and 2x2 block
    rng = np.random.default_rng(5)
    bt, g = (np.array(m, dtype=np.float64) for m in (conv_winograd.BT, conv_winograd.G))
    a, gt = (np.array(m, dtype=np.float64) for m in (conv_winograd.A, conv_winograd.GT))
    d, gy = rng.standard_normal((4, 4)), rng.standard_normal((2, 2))
    want = np.array([[(gy * d[r:r + 2, s:s + 2]).sum() for s in range(3)] for r in range(3)])
    got = gt @ ((a @ gy @ a.T) * (bt @ d @ bt.T)) @ gt.T
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# (input, weight, stride, padding, groups)
TAKEN = [
    ((2, 16, 6, 6), (16, 16, 3, 3), (1, 1), (1, 1), 1),
    ((3, 16, 4, 4), (24, 16, 3, 3), (1, 1), (1, 1), 1),  # 4 tiles an image: blocks
    ((2, 20, 8, 6), (16, 20, 3, 3), (1, 1), (0, 0), 1),  # no padding, rectangular
    ((1, 16, 4, 6), (16, 16, 3, 3), (1, 1), (2, 2), 1),  # padding 2: gx padded by 0
    ((16, 6, 4), (16, 16, 3, 3), (1, 1), (1, 2), 1),  # unbatched, unequal padding
]


@pytest.mark.parametrize("case", range(len(TAKEN)))
def test_winograd_forward_and_input_grad(case):
    check_winograd(*TAKEN[case])


def test_blocks_with_a_partial_last_block(monkeypatch):
    monkeypatch.setattr(conv_winograd, "BLOCK_TILES", 8)  # 2 images a block, 5 images
    check_winograd((5, 16, 4, 4), (16, 16, 3, 3), (1, 1), (1, 1), 1)


def test_nodes_of_one_geometry_share_the_weight_grad_kernel():
    # the second node calls the first one's kernel, and nothing else (no im2col after it)
    from graphc.ir.graph import Graph, Node, Value
    from graphc.types import TensorType, float32

    rng = np.random.default_rng(8)
    gs, xs = (4, 16, 4, 4), (4, 16, 4, 4)
    ins = [Value(f"x{i}", TensorType(s, float32)) for i, s in enumerate((gs, xs, gs, xs))]
    attrs = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1, kernel_size=(3, 3))
    outs = [Value(f"gw{i}", TensorType((16, 16, 3, 3), float32)) for i in range(2)]
    nodes = [Node("conv2d_weight_grad", ins[2 * i:2 * i + 2], attrs, [outs[i]])
             for i in range(2)]
    graph = Graph("two_grads", ins, nodes, outs)
    args = [rng.standard_normal(v.type.shape).astype(np.float32) for v in ins]
    exe = compare(graph, args, rtol=1e-4)
    assert len(exe.lowered.kernel_nodes) == 2
    assert "conv2d_winograd_weight_grad" in exe.lowered.ir_text


def test_strided_input_view():
    import graphc
    from graphc.passes.fuse import fuse

    rng = np.random.default_rng(11)
    x = graphc.tensor(rng.standard_normal((2, 16, 8, 8)).astype(np.float32))
    w = graphc.tensor(rng.standard_normal((16, 16, 3, 3)).astype(np.float32))
    g = fuse(graphc.trace(
        lambda x, w: graphc.conv2d(x.transpose(2, 3), w, padding=1).relu(), x, w))
    exe = compare(g, [x.numpy(), w.numpy()], rtol=1e-4)
    assert "conv2d_winograd" in exe.lowered.ir_text


NOT_TAKEN = [
    ((2, 16, 7, 7), (16, 16, 3, 3), (1, 1), (1, 1), 1),  # odd output plane
    ((2, 16, 8, 8), (16, 16, 3, 3), (2, 2), (1, 1), 1),  # stride 2
    ((2, 16, 6, 6), (16, 8, 3, 3), (1, 1), (1, 1), 2),  # groups
    ((2, 4, 6, 6), (16, 4, 3, 3), (1, 1), (1, 1), 1),  # few input channels
    ((2, 16, 6, 6), (16, 16, 5, 5), (1, 1), (2, 2), 1),  # 5x5
]


@pytest.mark.parametrize("case", range(len(NOT_TAKEN)))
def test_other_convolutions_keep_im2col(case):
    xs, ws, stride, padding, groups = NOT_TAKEN[case]
    rng = np.random.default_rng(case)
    gs, graphs = _graphs(xs, ws, stride, padding, groups)
    args = {"fwd": [xs, ws], "gx": [gs, ws], "gw": [gs, xs]}
    for kind in ("fwd", "gx", "gw"):
        arrays = [rng.standard_normal(s).astype(np.float32) for s in args[kind]]
        exe = compare(graphs[kind], arrays, rtol=1e-4)
        assert "conv2d_winograd" not in exe.lowered.ir_text, kind


def test_dilated_convolution_keeps_im2col():
    rng = np.random.default_rng(2)
    _, graphs = _graphs((2, 16, 8, 8), (16, 16, 3, 3), (1, 1), (2, 2), 1, dilation=(2, 2))
    x = rng.standard_normal((2, 16, 8, 8)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    exe = compare(graphs["fwd"], [x, w], rtol=1e-4)
    assert "conv2d_winograd" not in exe.lowered.ir_text


def test_input_grad_with_padding_past_two_keeps_im2col():
    rng = np.random.default_rng(4)
    gs, graphs = _graphs((1, 16, 4, 4), (16, 16, 3, 3), (1, 1), (3, 3), 1)
    gy = rng.standard_normal(gs).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    exe = compare(graphs["gx"], [gy, w], rtol=1e-4)
    assert "conv2d_winograd" not in exe.lowered.ir_text


def test_float64():
    rng = np.random.default_rng(6)
    gs, graphs = _graphs((2, 16, 6, 6), (16, 16, 3, 3), (1, 1), (1, 1), 1, "float64")
    x, w = rng.standard_normal((2, 16, 6, 6)), rng.standard_normal((16, 16, 3, 3))
    gy = rng.standard_normal(gs)
    for kind, args in (("fwd", [x, w]), ("gx", [gy, w]), ("gw", [gy, x])):
        exe = compare(graphs[kind], args, rtol=1e-12)
        assert "conv2d_winograd" in exe.lowered.ir_text, kind


@pytest.mark.parametrize("padding", [(1, 1), (0, 2), (2, 0)])
def test_images_in_parts_of_tile_rows(padding, monkeypatch):
    # 5 x 3 tiles an image, blocks want 6: parts of 2, 2 and 1 tile rows
    monkeypatch.setattr(conv_winograd, "BLOCK_TILES", 6)
    h = 10 + 2 - 2 * padding[0]
    w = 6 + 2 - 2 * padding[1]
    check_winograd((2, 16, h, w), (16, 16, 3, 3), (1, 1), padding, 1)


def _gemm_forms(monkeypatch) -> list:
    """Records (trans_a, trans_b, m, n) of every GEMM conv_winograd emits."""
    from graphc.backends.cpu import conv_im2col

    forms, emit = [], conv_im2col.Conv.gemm

    def recording(self, b, kb, trans_a, trans_b, m, n, *rest):
        forms.append((trans_a, trans_b, m, n))
        return emit(self, b, kb, trans_a, trans_b, m, n, *rest)

    monkeypatch.setattr(conv_im2col.Conv, "gemm", recording)
    return forms


# (nn, WIDE_CHANNELS): the weight gradient's GEMM form, V @ Y^T into a transposed dU (NN)
# below WIDE_CHANNELS, Y @ V^T (NT) at and above it or with WEIGHT_GRAD_NN off
@pytest.mark.parametrize("nn, wide", [(True, 512), (True, 40), (False, 512)])
def test_weight_grad_gemm_forms(nn, wide, monkeypatch):
    from graphc.backends.cpu.conv_im2col import NOTRANS, TRANS

    monkeypatch.setattr(conv_winograd, "WEIGHT_GRAD_NN", nn)
    monkeypatch.setattr(conv_winograd, "WIDE_CHANNELS", wide)
    monkeypatch.setattr(conv_winograd, "WEIGHT_GRAD_TILES", 6)  # parts: beta 0, then 1
    forms = _gemm_forms(monkeypatch)
    # 20 -> 40 channels: the last transform's squares of 16 end in partial ones (4 and 8)
    xs, ws = (3, 20, 6, 8), (40, 20, 3, 3)
    rng = np.random.default_rng(40)
    gs, graphs = _graphs(xs, ws, (1, 1), (1, 1), 1)
    _, wide_graphs = _graphs(xs, ws, (1, 1), (1, 1), 1, "float64")
    gy = rng.standard_normal(gs).astype(np.float32)
    x = np.maximum(rng.standard_normal(xs), 0).astype(np.float32)
    exe = compare(graphs["gw"], [gy, x], rtol=1e-4)
    eager = interpret(graphs["gw"], gy, x)[0]
    reference = interpret(wide_graphs["gw"], gy.astype(np.float64), x.astype(np.float64))[0]
    assert_rounding_within(exe.run(gy, x)[0], eager, reference)
    assert "conv2d_winograd_weight_grad" in exe.lowered.ir_text
    want = (NOTRANS, NOTRANS, 20, 40) if nn and wide > 40 else (NOTRANS, TRANS, 40, 20)
    assert forms and set(forms) == {want}, forms


def test_split_weight_grad_in_both_forms(monkeypatch):
    # one thread and all cores: the reduce kernel adds the shares' dU, transposed or not
    from graphc.backends.cpu import conv_direct, conv_threads
    from tests.test_cpu_conv_threads import ALL_CORES, check_split

    if ALL_CORES < 2:
        pytest.skip("one core (or a BLAS whose thread count cannot be held): not split")
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(conv_direct, "FEW_ROWS", 0)
    for wide in (512, 16):  # NN, then NT
        monkeypatch.setattr(conv_winograd, "WIDE_CHANNELS", wide)
        check_split((3, 16, 16, 16), (40, 16, 3, 3))


# small planes whose input and output transforms run in vectors of 16 tiles
# (winograd_transforms.planes_by_vectors, output_planes_by_vectors): (input, padding); each
# case takes both in some pass
SMALL_PLANES = [
    ((4, 16, 4, 4), (1, 1)),  # 4 tiles an image: 4 images a vector (ResNet-18's 512 stage)
    ((2, 16, 8, 8), (1, 1)),  # 16 tiles: one image a vector (its 256 stage)
    ((16, 16, 2, 2), (1, 1)),  # 1 tile: 16 images a vector
    ((4, 16, 4, 2), (1, 2)),  # unequal padding, a rectangular plane
    ((4, 16, 2, 2), (2, 2)),  # padding 2 (the input gradient, padded by 0, does not take it)
]


@pytest.mark.parametrize("case", range(len(SMALL_PLANES)))
def test_small_planes_by_vectors_bit_for_bit(case, monkeypatch, tmp_path):
    from graphc.backends.cpu import winograd_transforms

    xs, padding = SMALL_PLANES[case]
    ws = (16, 16, 3, 3)
    taken = []

    def recorded(name):
        emit = getattr(winograd_transforms, name)

        def recording(*args):
            taken.append(name)
            return emit(*args)

        return recording

    for name in ("planes_by_vectors", "output_planes_by_vectors"):  # input and output
        monkeypatch.setattr(winograd_transforms, name, recorded(name))
    check_winograd(xs, ws, (1, 1), padding, 1)
    assert set(taken) == {"planes_by_vectors", "output_planes_by_vectors"}, taken
    # the same bits as the tile loop through the padded plane
    rng = np.random.default_rng(case)
    gs, graphs = _graphs(xs, ws, (1, 1), padding, 1)
    args = {"fwd": [xs, ws], "gx": [gs, ws], "gw": [gs, xs]}
    for kind, shapes in args.items():
        arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        outs = []
        for on in (True, False):
            monkeypatch.setattr(winograd_transforms, "PLANE_VECTORS", on)
            monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"{kind}-{on}"))
            outs.append(compare(_graphs(xs, ws, (1, 1), padding, 1)[1][kind], arrays,
                                rtol=1e-4).run(*arrays)[0])
        np.testing.assert_array_equal(outs[0], outs[1], err_msg=kind)


def test_weight_grad_nt_form_small_planes_by_vectors(monkeypatch, tmp_path):
    # wide layers' NT form: Y[xi][o][t] of small planes by planes_by_vectors with A
    from graphc.backends.cpu import winograd_transforms

    monkeypatch.setattr(conv_winograd, "WIDE_CHANNELS", 16)
    mats = []
    vectors = winograd_transforms.planes_by_vectors

    def recording(*args):
        mats.append(args[11] if len(args) > 11 else "BT")
        return vectors(*args)

    monkeypatch.setattr(winograd_transforms, "planes_by_vectors", recording)
    monkeypatch.setattr(conv_winograd, "planes_by_vectors", recording)
    xs, ws = (8, 16, 4, 4), (24, 16, 3, 3)
    check_winograd(xs, ws, (1, 1), (1, 1), 1)
    assert conv_winograd.A in mats
    rng = np.random.default_rng(9)
    gs, _ = _graphs(xs, ws, (1, 1), (1, 1), 1)
    gy = rng.standard_normal(gs).astype(np.float32)
    x = rng.standard_normal(xs).astype(np.float32)
    outs = []
    for on in (True, False):
        monkeypatch.setattr(winograd_transforms, "PLANE_VECTORS", on)
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"gw-{on}"))
        graph = _graphs(xs, ws, (1, 1), (1, 1), 1)[1]["gw"]
        outs.append(compare(graph, [gy, x], rtol=1e-4).run(gy, x)[0])
    np.testing.assert_array_equal(outs[0], outs[1])
