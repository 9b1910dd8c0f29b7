"""The weight gradient of 3x3 stride-2 convolutions by polyphase Winograd (graphc.backends.
cpu.conv_polyphase_grad): its transforms against a direct strided correlation in float64,
then the kernel on the shapes it takes (ResNet-18's three stride-2 layers at small batches,
odd input sizes, rectangular planes, partial last blocks, blocks split over the cores, one
block forking its products) against the interpreter, within 2x eager's distance from
float64 and the same bits on a rerun, at one thread and all cores; a model's gradients
(the weight gradients among them, a batch fixed and one known per call) against the
interpreter's; the shapes it leaves to the other paths."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import (  # noqa: E402
    conv_polyphase,
    conv_polyphase_grad,
    conv_threads,
    threads,
    winograd_gemm,
)
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.passes.plan import plan_buffers  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.test_cpu_conv_paths import _graphs  # noqa: E402
from tests.test_cpu_conv_polyphase import switched_bits  # noqa: E402

resolve_blas()  # hands the BLAS's thread count to generated code (threads.install)
ALL_CORES = threads.image_threads()
KERNEL = "conv2d_polyphase_weight_grad"
needs_kernel = pytest.mark.skipif(not winograd_gemm.available(), reason="the path needs "
                                  "winograd_gemm's generated GEMM (an AVX-512 host)")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def test_transforms_compute_the_strided_weight_gradient():
    # one 2x2 block of gy against its 5x5 input patch, in float64: gw[r, s] = sum over the
    # block's outputs (i, j) of gy[i, j] * d[2i + r, 2j + s]
    rng = np.random.default_rng(4)
    d, gy = rng.standard_normal((5, 5)), rng.standard_normal((2, 2))
    want = np.array([[sum(gy[i, j] * d[2 * i + r, 2 * j + s] for i in range(2)
                          for j in range(2)) for s in range(3)] for r in range(3)])
    (ya, yb), = conv_polyphase_grad.Y_PHASES
    y = np.array(ya[1], float) @ gy @ np.array(yb[1], float).T  # Y's 9 values, [kr][kc]
    got = np.zeros((3, 3))
    xi = 0
    for rows, cols in conv_polyphase.phase_matrices():
        (ro, rbt, rg, rtaps, _), (co, cbt, cg, ctaps, _) = \
            ((np.array(offsets), np.array(bt, float), np.array(g, float), np.array(taps),
              at) for offsets, bt, g, taps, at in (rows, cols))
        v = rbt @ d[np.ix_(ro, co)] @ cbt.T
        du = np.zeros(v.shape)
        for i in range(v.shape[0]):
            for j in range(v.shape[1]):
                du[i, j] = y.flat[conv_polyphase_grad.PAIRED[xi]] * v[i, j]
                xi += 1
        got[np.ix_(rtaps, ctaps)] += rg.T @ du @ cg
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert xi == conv_polyphase.POSITIONS
    assert conv_polyphase_grad.WIDTHS == (4, 4, 4, 4, 2, 2, 2, 2, 1)


def test_layout_gives_every_position_its_own_columns():
    layout = conv_polyphase_grad._Layout(32, 48, 64)
    for place, rows in ((layout.vt, 64), (layout.du, 48)):
        columns = set()
        for xi in range(conv_polyphase.POSITIONS):
            start, row = place(xi)
            for r in (0, rows - 1):
                span = range(start + r * row, start + r * row + 32)
                assert columns.isdisjoint(span)
                columns.update(span)
        assert max(columns) < layout.starts(rows)[-1]


def _compiled(graph, count):
    plan_buffers(graph)
    exe = CpuExecutable(graph)
    exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
    return exe


def check(xs, ws, taken=True, dtype="float32"):
    """The weight gradient on one thread and on all cores: the interpreter's within float32
    rounding, within 2x eager's distance from float64, the same bits on a rerun."""
    rng = np.random.default_rng(sum(xs) + 7 * sum(ws))
    gs, _ = _graphs(xs, ws, (2, 2), (1, 1), 1)
    args = [rng.standard_normal(gs).astype(dtype),
            np.maximum(rng.standard_normal(xs), 0).astype(dtype)]
    eager = interpret(_graphs(xs, ws, (2, 2), (1, 1), 1, dtype)[1]["gw"], *args)[0]
    reference = interpret(_graphs(xs, ws, (2, 2), (1, 1), 1, "float64")[1]["gw"],
                          *[a.astype(np.float64) for a in args])[0]
    for count in sorted({1, ALL_CORES}):
        exe = _compiled(_graphs(xs, ws, (2, 2), (1, 1), 1, dtype)[1]["gw"], count)
        assert (KERNEL in exe.lowered.ir_text) == taken
        got = exe.run(*args)[0]
        np.testing.assert_allclose(got, eager, rtol=1e-4,
                                   atol=1e-4 * float(np.abs(eager).max()))
        assert_rounding_within(got, eager, reference)
        np.testing.assert_array_equal(exe.run(*args)[0], got, err_msg="a rerun")


# (input, weight): ResNet-18's stride-2 layers at small batches (4x4 gy planes: 4 output
# blocks an image, a partial last block of 1 image), an odd input (its last row and column
# read by no tap), rectangular planes, more and fewer output channels
TAKEN = [
    ((3, 64, 32, 32), (128, 64, 3, 3)),
    ((4, 128, 16, 16), (256, 128, 3, 3)),
    ((9, 256, 8, 8), (512, 256, 3, 3)),
    ((4, 16, 7, 7), (32, 16, 3, 3)),
    ((6, 32, 8, 16), (16, 32, 3, 3)),
    ((4, 48, 16, 12), (64, 48, 3, 3)),
]


@needs_kernel
@pytest.mark.parametrize("case", range(len(TAKEN)))
def test_polyphase_weight_grad(case):
    check(*TAKEN[case])


@needs_kernel
def test_blocks_split_over_the_cores_with_a_partial_last_block(monkeypatch):
    # 16 output blocks a GEMM: one image of 16 blocks each, 5 images over the shares (their
    # dU summed by the reduce kernel); then 4 blocks an image, 4 images a block, 11 images
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(conv_polyphase_grad, "BLOCK_TILES", 16)
    check((5, 16, 16, 16), (16, 16, 3, 3))
    check((11, 32, 8, 8), (32, 32, 3, 3))


@needs_kernel
def test_one_block_forks_its_products(monkeypatch):
    from graphc.backends.cpu import kernels

    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1)
    check((8, 32, 8, 8), (32, 32, 3, 3))  # 4 blocks an image, 8 images: one block


@needs_kernel
@pytest.mark.skipif(ALL_CORES < 2, reason="one thread here: the transforms stay inside")
@pytest.mark.parametrize("forked", [True, False])
def test_one_block_forks_its_transforms_over_channels(monkeypatch, forked):
    # x's and gy's transforms in kernels of their own, forked over channels: the same bits on
    # one thread and on all cores (each channel by the same code); the switch keeps them in
    from graphc.backends.cpu import kernels

    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1)
    monkeypatch.setattr(conv_polyphase_grad, "FORKED_TRANSFORMS", forked)
    xs, ws = (8, 32, 8, 8), (32, 32, 3, 3)
    check(xs, ws)
    rng = np.random.default_rng(3)
    gs, _ = _graphs(xs, ws, (2, 2), (1, 1), 1)
    args = [rng.standard_normal(gs).astype(np.float32),
            rng.standard_normal(xs).astype(np.float32)]
    got = []
    for count in (1, ALL_CORES):
        exe = _compiled(_graphs(xs, ws, (2, 2), (1, 1), 1)[1]["gw"], count)
        for step in ("_x", "_y"):
            assert (f"{KERNEL}{step}" in exe.lowered.ir_text) == forked
        got.append(exe.run(*args)[0])
    np.testing.assert_array_equal(got[0], got[1], err_msg="one thread against all cores")


# left to the other paths: input channels not a whole number of vectors, few channels,
# stride 1, padding 0, groups, an odd output, float64
LEFT = [
    ((2, 24, 8, 8), (32, 24, 3, 3), "float32"),
    ((2, 8, 8, 8), (16, 8, 3, 3), "float32"),
    ((2, 16, 10, 10), (16, 16, 3, 3), "float32"),
    ((2, 16, 8, 8), (16, 16, 3, 3), "float64"),
]


@pytest.mark.parametrize("case", range(len(LEFT)))
def test_other_weight_gradients_keep_their_paths(case):
    xs, ws, dtype = LEFT[case]
    check(xs, ws, taken=False, dtype=dtype)


@pytest.mark.parametrize("stride, padding, groups", [((1, 1), (1, 1), 1), ((2, 2), (0, 0), 1),
                                                     ((2, 2), (1, 1), 2)])
def test_other_geometries_keep_their_paths(stride, padding, groups):
    xs, ws = (2, 32, 8, 8), (32, 32 // groups, 3, 3)
    exe = _compiled(_graphs(xs, ws, stride, padding, groups)[1]["gw"], 1)
    assert KERNEL not in exe.lowered.ir_text


@needs_kernel
def test_the_switch_keeps_im2col(monkeypatch):
    monkeypatch.setattr(conv_polyphase_grad, "ENABLED", False)
    check((4, 16, 8, 8), (16, 16, 3, 3), taken=False)


def _model():
    import graphc
    import graphc.nn as nn

    graphc.manual_seed(0)
    return nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False), nn.ReLU(),
                         nn.Flatten(), nn.Linear(64 * 4 * 4, 3))


@needs_kernel
def test_a_models_gradients_against_the_interpreter():
    import graphc
    from graphc.backends.cpu.threads import ThreadChooser
    from tests.conftest import square_loss_gradients

    compiled = graphc.compile(square_loss_gradients(_model()), backend="cpu")
    reference = graphc.compile(square_loss_gradients(_model()), backend="interp")
    x = graphc.tensor(np.random.default_rng(8).standard_normal((6, 16, 16, 16))
                      .astype(np.float32))
    want = [w.numpy() for w in reference(x)]
    compiled(x)
    text = compiled.executable.lowered.ir_text
    kernels = set(re.findall(rf'define void @"(k\d+_{KERNEL})"\(', text))
    assert len(kernels) == 2, kernels  # both layers' weight gradients
    for count in sorted({1, ALL_CORES}):
        compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        for got, w in zip(compiled(x), want):
            np.testing.assert_allclose(got.numpy(), w, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{count} threads")


@needs_kernel
def test_a_batch_known_per_call():
    import graphc
    from tests.conftest import square_loss_gradients

    compiled = graphc.compile(square_loss_gradients(_model()), backend="cpu")
    reference = graphc.compile(square_loss_gradients(_model()), backend="interp",
                               dynamic=False, recompile_limit=8)
    rng = np.random.default_rng(9)
    for batch in (8, 3, 5, 2):
        x = graphc.tensor(rng.standard_normal((batch, 16, 16, 16)).astype(np.float32))
        graphc.mark_dynamic(x, 0)
        for got, want in zip(compiled(x), reference(x)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4,
                                       err_msg=f"batch {batch}")
    generic = compiled._entries[0].executable.executable_for({"s0": 8}).executable
    assert KERNEL in generic.lowered.ir_text


@needs_kernel
@pytest.mark.parametrize("xs, ws", [((2, 16, 16, 16), (40, 16, 3, 3)),
                                    ((8, 32, 8, 8), (24, 32, 3, 3))])
def test_weight_out_by_vectors_bit_for_bit(xs, ws, monkeypatch, tmp_path):
    # gw = G^T dU G 16 filters a vector (winograd_filters.store_filter_taps) against one by
    # one, on one thread and all cores (the forked output kernel, and the reduce kernel of
    # a split one: shares of output channels that are not whole vectors)
    from graphc.backends.cpu import kernels, winograd_filters

    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1)
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(conv_polyphase_grad, "BLOCK_TILES", 16)
    switched_bits(monkeypatch, tmp_path, winograd_filters, "FILTER_VECTORS", xs, ws, "gw",
                  sum(xs),
                  kernel=KERNEL)
