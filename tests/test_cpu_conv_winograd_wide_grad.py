"""The Winograd weight gradient of wide layers on small planes (graphc.backends.cpu.
conv_winograd_wide_grad): against the interpreter and within 2x eager's distance from a
float64 run on the shapes it takes (ResNet-18's 512 x 512 layer at 4x4, and narrow stand-ins
with WIDE_CHANNELS lowered: paddings 0-2, rectangular planes, one tile an image, blocks with
a partial last one, odd batches), the same bits on a rerun and on one thread and all cores,
a batch known per call, and the shapes it leaves to conv_winograd."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import (  # noqa: E402
    conv_winograd_wide_grad,
    kernels,
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

pytestmark = pytest.mark.skipif(not winograd_gemm.available(), reason="the kernel needs "
                                "winograd_gemm's generated GEMM (an AVX-512 host)")
resolve_blas()  # hands the BLAS's thread count to generated code (threads.install)
ALL_CORES = threads.image_threads()
KERNEL = "conv2d_winograd_wide_weight_grad"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _inputs(xs, ws, padding, dtype=np.float32):
    rng = np.random.default_rng(sum(xs) + 3 * sum(ws) + padding[0])
    gs, _ = _graphs(xs, ws, (1, 1), padding, 1)
    x = np.maximum(rng.standard_normal(xs), 0).astype(dtype)  # after a ReLU, as in a step
    return [rng.standard_normal(gs).astype(dtype), x]


def _compiled(xs, ws, padding, dtype="float32", count=1):
    graph = _graphs(xs, ws, (1, 1), padding, 1, dtype)[1]["gw"]
    plan_buffers(graph)
    exe = CpuExecutable(graph)
    exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
    return exe


def check(xs, ws, padding=(1, 1), taken=True):
    """gw on one thread and on all cores: the interpreter's within float32 rounding, within
    2x eager's distance from float64, the same bits on every count and on a rerun."""
    args = _inputs(xs, ws, padding)
    graph = _graphs(xs, ws, (1, 1), padding, 1)[1]["gw"]
    wide = _graphs(xs, ws, (1, 1), padding, 1, "float64")[1]["gw"]
    eager = interpret(graph, *args)[0]
    reference = interpret(wide, *[a.astype(np.float64) for a in args])[0]
    results = []
    for count in sorted({1, ALL_CORES}):
        exe = _compiled(xs, ws, padding, count=count)
        assert (KERNEL in exe.lowered.ir_text) == taken
        got = exe.run(*args)[0]
        np.testing.assert_allclose(got, eager, rtol=1e-4,
                                   atol=1e-4 * float(np.abs(eager).max()))
        assert_rounding_within(got, eager, reference)
        np.testing.assert_array_equal(exe.run(*args)[0], got, err_msg="a rerun")
        results.append(got)
    np.testing.assert_array_equal(results[0], results[-1], err_msg="one thread, all cores")


@pytest.fixture
def narrow(monkeypatch):
    """Narrow layers take the kernel, and its 16 GEMMs and last transform fork on all cores
    at these sizes."""
    monkeypatch.setattr(conv_winograd_wide_grad, "WIDE_CHANNELS", 32)
    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1)


def test_resnet18_512_channel_layer():
    check((9, 512, 4, 4), (512, 512, 3, 3))


# (input, weight, padding): 4x4 outputs from paddings 0-2, a rectangular plane (8 tiles), one
# tile an image, more output channels than input channels and fewer
NARROW = [
    ((5, 32, 4, 4), (48, 32, 3, 3), (1, 1)),
    ((3, 32, 6, 6), (32, 32, 3, 3), (0, 0)),
    ((3, 32, 2, 2), (32, 32, 3, 3), (2, 2)),
    ((3, 32, 4, 8), (16, 32, 3, 3), (1, 1)),
    ((7, 48, 2, 2), (32, 48, 3, 3), (1, 1)),
]


@pytest.mark.parametrize("case", range(len(NARROW)))
def test_narrow_stand_ins(case, narrow):
    check(*NARROW[case])


def test_blocks_with_a_partial_last_block(narrow, monkeypatch):
    # 8 tiles a block: 2 images of 4 tiles, 7 images in blocks of 2, 2, 2 and 1
    monkeypatch.setattr(conv_winograd_wide_grad, "BLOCK_TILES", 8)
    check((7, 32, 4, 4), (32, 32, 3, 3))


# left to conv_winograd: input channels not a whole number of vectors, planes of more than
# MAX_IMAGE_TILES tiles, fewer channels than WIDE_CHANNELS
LEFT = [
    ((2, 40, 4, 4), (32, 40, 3, 3), (1, 1)),
    ((2, 32, 10, 10), (32, 32, 3, 3), (1, 1)),
    ((2, 16, 4, 4), (16, 16, 3, 3), (1, 1)),
]


@pytest.mark.parametrize("case", range(len(LEFT)))
def test_shapes_left_to_conv_winograd(case, narrow):
    check(*LEFT[case], taken=False)


def test_float64_and_the_switch_leave_it(narrow, monkeypatch):
    xs, ws = (3, 32, 4, 4), (32, 32, 3, 3)
    assert KERNEL not in _compiled(xs, ws, (1, 1), "float64").lowered.ir_text
    monkeypatch.setattr(conv_winograd_wide_grad, "WIDE_GRAD", False)
    check(xs, ws, taken=False)


def test_a_batch_known_per_call(narrow, monkeypatch):
    import graphc
    import graphc.nn as nn
    from tests.conftest import square_loss_gradients

    monkeypatch.setattr(conv_winograd_wide_grad, "BLOCK_TILES", 8)  # whole blocks, then 1s

    def model():
        graphc.manual_seed(0)
        return nn.Sequential(nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.ReLU(),
                             nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.Flatten(),
                             nn.Linear(32 * 4 * 4, 3))  # the planes' size stays static

    symbolic = graphc.compile(square_loss_gradients(model()), backend="cpu")
    reference = graphc.compile(square_loss_gradients(model()), backend="interp",
                               dynamic=False, recompile_limit=8)
    rng = np.random.default_rng(4)
    for batch in (6, 3, 5, 13, 2):  # (1 is always specialised)
        x = graphc.tensor(rng.standard_normal((batch, 32, 4, 4)).astype(np.float32))
        graphc.mark_dynamic(x, 0)
        for got, want in zip(symbolic(x), reference(x)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4,
                                       err_msg=f"batch {batch}")
    assert str(symbolic.graphs[0].inputs[0].type) == "f32[s0,32,4,4]"
    generic = symbolic._entries[0].executable.executable_for({"s0": 6}).executable
    assert KERNEL in generic.lowered.ir_text


# (input, weight, padding, vectors, panels): Vt's transform 16 channels a vector from whole
# planes (a 2x2 plane widened to 16 lanes) or channel by channel (planes of more than 16
# elements, channels not a whole number of vectors), Vt in panels of 64 channels or in rows
LAYOUTS = [
    ((3, 64, 4, 4), (32, 64, 3, 3), (1, 1), True, True),
    ((5, 64, 2, 2), (32, 64, 3, 3), (2, 2), True, True),
    ((3, 32, 4, 8), (16, 32, 3, 3), (1, 1), False, False),
    ((3, 48, 4, 4), (32, 48, 3, 3), (0, 0), True, False),
]


@pytest.mark.parametrize("case", range(len(LAYOUTS)))
def test_vt_by_channel_vectors_and_panels_bit_for_bit(case, narrow, monkeypatch, tmp_path):
    """CHANNEL_VECTORS and VT_PANELS on (where the shape takes them) give the bits of both
    off; each also against the interpreter, float64 and all cores (check)."""
    xs, ws, padding, vectors, panels = LAYOUTS[case]
    taken = {"vectors": [], "panels": []}
    emit, gemm = (conv_winograd_wide_grad._input_tiles_by_channel_vectors,
                  conv_winograd_wide_grad._gemm)

    def by_vectors(*args):
        taken["vectors"].append(True)
        return emit(*args)

    def planned(*args):
        found = gemm(*args)
        taken["panels"].append(found.b_panel != 0)
        return found

    monkeypatch.setattr(conv_winograd_wide_grad, "_input_tiles_by_channel_vectors", by_vectors)
    monkeypatch.setattr(conv_winograd_wide_grad, "_gemm", planned)
    args = _inputs(xs, ws, padding)
    outs = []
    for on in (True, False):
        monkeypatch.setattr(conv_winograd_wide_grad, "CHANNEL_VECTORS", on)
        monkeypatch.setattr(conv_winograd_wide_grad, "VT_PANELS", on)
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"layout-{on}"))
        if on:
            check(xs, ws, padding)
            assert bool(taken["vectors"]) == vectors
            assert any(taken["panels"]) == panels
        outs.append(_compiled(xs, ws, padding).run(*args)[0])
    np.testing.assert_array_equal(outs[0], outs[1])


def _kernel_names(exe) -> list[str]:
    return [k.split("_", 1)[1] for k in exe.lowered.kernels]


def _forking(exe) -> set[str]:
    """The kernels of `exe` that fork (their worker `<name>.omp` is defined)."""
    text = exe.lowered.ir_text
    return {k.split("_", 1)[1] for k in exe.lowered.kernels
            if f'@"{k}.omp"' in text or f"@{k}.omp(" in text}


# (input, weight, padding): one block each, Vt by channel vectors in panels, by vectors of
# 2x2 planes, channel by channel (8-tile planes), more input channels than output ones
ONE_BLOCK = [LAYOUTS[0][:3], LAYOUTS[1][:3], LAYOUTS[2][:3], NARROW[4]]


@pytest.mark.parametrize("case", range(len(ONE_BLOCK)))
def test_one_block_forks_its_transforms_with_the_same_bits(case, narrow, monkeypatch,
                                                           tmp_path):
    """A batch of one block: Vt's and Y's transforms in kernels of their own before the
    GEMMs', forked over the channels on all cores (FORKED_TRANSFORMS), give the bits of
    both inside the GEMMs' kernel, on one thread and on all cores."""
    xs, ws, padding = ONE_BLOCK[case]
    args = _inputs(xs, ws, padding)
    outs = {}
    for on in (False, True):
        monkeypatch.setattr(conv_winograd_wide_grad, "FORKED_TRANSFORMS", on)
        for count in sorted({1, ALL_CORES}):
            monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"forks-{on}-{count}"))
            exe = _compiled(xs, ws, padding, count=count)
            names = _kernel_names(exe)
            own = ["conv2d_winograd_wide_input", "conv2d_winograd_wide_output_grad"]
            if _panel_y_taken(ws):  # Y's transform inside the panels' kernel
                own = own[:1]
            if on and ALL_CORES > 1:
                assert names[:3] == own + [KERNEL], names
                assert set(own) <= _forking(exe), _forking(exe)
            else:
                assert not set(own) & set(names), names
            outs[on, count] = exe.run(*[a.copy() for a in args])[0]
    first = outs[True, 1]
    for key, got in outs.items():
        np.testing.assert_array_equal(got, first, err_msg=f"forked {key[0]}, {key[1]} threads")
    check(xs, ws, padding)  # the forked kernels: the interpreter, float64, a rerun


# (input, weight, padding, panel channels): ResNet-18's layer at batch 9 in panels of 16,
# narrow one-block stand-ins in panels of 8 and 16 (several panels a thread), one panel of
# all output channels, and output channels not a whole number of panels (PANELS not taken)
PANEL_CASES = [
    ((9, 512, 4, 4), (512, 512, 3, 3), (1, 1), 16),
    (LAYOUTS[0][0], LAYOUTS[0][1], (1, 1), 8),
    (NARROW[0][0], NARROW[0][1], (1, 1), 16),
    (NARROW[4][0], NARROW[4][1], (1, 1), 32),
    (NARROW[0][0], NARROW[0][1], (1, 1), 32),
]


def _panel_y_taken(ws) -> bool:
    m = conv_winograd_wide_grad
    return m.PANELS and m.PANEL_Y and ws[0] % m.PANEL_CHANNELS == 0


@pytest.mark.parametrize("case", range(len(PANEL_CASES)))
def test_panels_give_the_whole_products_bits(case, narrow, monkeypatch, tmp_path):
    """dU and gw by panels of output channels (PANELS), with Y's transform in the panels
    (PANEL_Y) or before them, on one thread and forked over the panels on two cores, give
    the bits of the whole products then weight_out's kernel; the panels' kernel is the only
    one after the transforms."""
    xs, ws, padding, panel = PANEL_CASES[case]
    monkeypatch.setattr(conv_winograd_wide_grad, "PANEL_CHANNELS", panel)
    args = _inputs(xs, ws, padding)
    outs = {}
    for on, panel_y in ((False, False), (True, False), (True, True)):
        monkeypatch.setattr(conv_winograd_wide_grad, "PANELS", on)
        monkeypatch.setattr(conv_winograd_wide_grad, "PANEL_Y", panel_y)
        for count in sorted({1, 2, ALL_CORES}):  # (2 forks where image_threads says 1)
            monkeypatch.setenv("GRAPHC_CACHE_DIR",
                               str(tmp_path / f"panels-{on}-{panel_y}-{count}"))
            exe = _compiled(xs, ws, padding, count=count)
            names = _kernel_names(exe)
            taken = on and ws[0] % panel == 0
            assert ("conv2d_winograd_wide_weight_out" in names) != taken, names
            if taken and count > 1:
                assert KERNEL in _forking(exe), _forking(exe)
                assert ("conv2d_winograd_wide_output_grad" in names) != panel_y, names
            outs[on, panel_y, count] = exe.run(*[a.copy() for a in args])[0]
    first = outs[False, False, 1]
    for key, got in outs.items():
        np.testing.assert_array_equal(got, first, err_msg=f"panels, Y in them, threads {key}")
    check(xs, ws, padding)
