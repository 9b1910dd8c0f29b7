"""3x3 stride-2 convolutions by Winograd on the input's four phases (graphc.backends.cpu.
conv_polyphase): the phases' transforms against a direct strided correlation (forward and
input gradient), the input gradient on ResNet-18's layers and narrow stand-ins, the input
transform by rows in vectors bit for bit the padded plane's, then the forward on shapes it
takes (ResNet-18's three stride-2 layers at small batches, odd input
sizes, partial last blocks, one thread and all cores, a batch known per call) against the
interpreter, within 2x eager's distance from float64 and the same bits on a rerun, and the
shapes it leaves to im2col."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import conv_polyphase, conv_threads, threads, winograd_gemm  # noqa: E402
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.passes.plan import plan_buffers  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.test_cpu_conv_paths import _graphs  # noqa: E402

resolve_blas()  # hands the BLAS's thread count to generated code (threads.install)
ALL_CORES = threads.image_threads()
KERNEL = "conv2d_polyphase"
needs_kernel = pytest.mark.skipif(not winograd_gemm.available(), reason="the path needs "
                                  "winograd_gemm's generated GEMM (an AVX-512 host)")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def test_phase_transforms_compute_the_strided_correlation():
    # one 2x2 block of outputs from its 5x5 input patch, in float64, phase by phase
    rng = np.random.default_rng(2)
    d, f = rng.standard_normal((5, 5)), rng.standard_normal((3, 3))
    # output (i, j) of the block reads patch rows 2i .. 2i + 2 (input rows 4ty - 1 + ...)
    want = np.array([[(d[2 * i:2 * i + 3, 2 * j:2 * j + 3] * f).sum() for j in range(2)]
                     for i in range(2)])
    got = np.zeros((2, 2))
    for rows, cols in conv_polyphase.phase_matrices():
        (ro, rbt, rg, rtaps, rat), (co, cbt, cg, ctaps, cat) = \
            ((np.array(offsets), np.array(bt, float), np.array(g, float), np.array(taps),
              np.array(at, float)) for offsets, bt, g, taps, at in (rows, cols))
        v = rbt @ d[np.ix_(ro, co)] @ cbt.T
        u = rg @ f[np.ix_(rtaps, ctaps)] @ cg.T
        got += rat @ (u * v) @ cat.T
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert conv_polyphase.POSITIONS == 25


def test_input_grad_phase_transforms_compute_the_transposed_correlation():
    # gx's 4x4 block (rows 4ty .. 4ty + 3) from gy's 3x3 patch (rows 2ty .. 2ty + 2): gy
    # row i reaches gx rows 2i - 1 + r through tap r
    rng = np.random.default_rng(3)
    gy, f = rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    full = np.zeros((7, 7))  # gx rows -1 .. 5 of the block
    for i in range(3):
        for j in range(3):
            full[2 * i:2 * i + 3, 2 * j:2 * j + 3] += gy[i, j] * f
    want = full[1:5, 1:5]
    got = np.zeros((4, 4))
    for rows, cols in conv_polyphase.phase_matrices(grad=True):
        (ro, rbt, rg, rtaps, rat), (co, cbt, cg, ctaps, cat) = \
            ((np.array(offsets), np.array(bt, float), np.array(g, float), np.array(taps),
              np.array(at, float)) for offsets, bt, g, taps, at in (rows, cols))
        v = rbt @ gy[np.ix_(ro, co)] @ cbt.T
        u = rg @ f[np.ix_(rtaps, ctaps)] @ cg.T
        pr, pc = int(len(ro) == 3), int(len(co) == 3)  # odd phases read 3 rows of gy
        got[pr::2, pc::2] = rat @ (u * v) @ cat.T
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _compiled(graph, count):
    plan_buffers(graph)
    exe = CpuExecutable(graph)
    exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
    return exe


def switched_bits(monkeypatch, tmp_path, module, name, xs, ws, kind, seed: int,
                  kernel=KERNEL, ir_check=None):
    """`kind`'s graph (tests.test_cpu_conv_paths._graphs: "fwd" on (x, w), "gx" on (gy, w),
    "gw" on (gy, x)) on standard normal arguments drawn from `seed`, compiled with
    module.NAME on and off, on one thread and on all cores: the same bits on and off at each
    count, and the one-thread result within 1e-4 of the interpreter's; `ir_check(ir, on)`
    may look at each module's IR."""
    rng = np.random.default_rng(seed)
    gs, _ = _graphs(xs, ws, (2, 2), (1, 1), 1)
    shapes = {"fwd": (xs, ws), "gx": (gs, ws), "gw": (gs, xs)}[kind]
    args = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    outs = {}
    for on in (True, False):
        monkeypatch.setattr(module, name, on)
        for count in sorted({1, ALL_CORES}):
            monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"{on}-{count}"))
            exe = _compiled(_graphs(xs, ws, (2, 2), (1, 1), 1)[1][kind], count)
            assert kernel in exe.lowered.ir_text
            if ir_check is not None:
                ir_check(exe.lowered.ir_text, on)
            outs[on, count] = exe.run(*args)[0]
    for count in sorted({1, ALL_CORES}):
        np.testing.assert_array_equal(outs[True, count], outs[False, count],
                                      err_msg=f"{count} threads")
    eager = interpret(_graphs(xs, ws, (2, 2), (1, 1), 1)[1][kind], *args)[0]
    np.testing.assert_allclose(outs[True, 1], eager, rtol=1e-4,
                               atol=1e-4 * float(np.abs(eager).max()))


def check(xs, ws, taken=True, kind="fwd", rounding=True):
    """The forward (or `kind` "gx", the input gradient) on one thread and on all cores: the
    interpreter's within float32 rounding, within 2x eager's distance from float64 (where
    `rounding`), the same bits on a rerun."""
    rng = np.random.default_rng(sum(xs) + 5 * sum(ws))
    gs, _ = _graphs(xs, ws, (2, 2), (1, 1), 1)
    first = rng.standard_normal(xs if kind == "fwd" else gs).astype(np.float32)
    args = [first, rng.standard_normal(ws).astype(np.float32)]
    eager = interpret(_graphs(xs, ws, (2, 2), (1, 1), 1)[1][kind], *args)[0]
    reference = interpret(_graphs(xs, ws, (2, 2), (1, 1), 1, "float64")[1][kind],
                          *[a.astype(np.float64) for a in args])[0]
    for count in sorted({1, ALL_CORES}):
        exe = _compiled(_graphs(xs, ws, (2, 2), (1, 1), 1)[1][kind], count)
        assert (KERNEL in exe.lowered.ir_text) == taken
        got = exe.run(*args)[0]
        np.testing.assert_allclose(got, eager, rtol=1e-4,
                                   atol=1e-4 * float(np.abs(eager).max()))
        if rounding:
            assert_rounding_within(got, eager, reference)
        np.testing.assert_array_equal(exe.run(*args)[0], got, err_msg="a rerun")


# (input, weight): ResNet-18's stride-2 layers at small batches (the 4x4 outputs: 4 images
# a vector of the output transform), an odd input (the last row and column unread past the
# padding), rectangular planes, more and fewer output channels
TAKEN = [
    ((3, 64, 32, 32), (128, 64, 3, 3)),
    ((4, 128, 16, 16), (256, 128, 3, 3)),
    ((8, 256, 8, 8), (512, 256, 3, 3)),
    ((4, 16, 7, 7), (32, 16, 3, 3)),
    ((6, 32, 8, 16), (16, 32, 3, 3)),
    ((4, 48, 16, 12), (64, 48, 3, 3)),
]


@needs_kernel
@pytest.mark.parametrize("case", range(len(TAKEN)))
def test_polyphase_forward(case):
    check(*TAKEN[case])


@needs_kernel
def test_blocks_split_over_the_cores_with_a_partial_last_block(monkeypatch):
    # 16 output blocks a GEMM: 1 image of 16 blocks each, 5 images over the shares; then
    # 4 blocks an image, 4 images a block, 12 images (3 blocks), split at any size
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(conv_polyphase, "BLOCK_TILES", 16)
    check((5, 16, 16, 16), (16, 16, 3, 3))
    check((12, 16, 8, 8), (32, 16, 3, 3))


@needs_kernel
def test_one_block_forks_its_filter_and_gemms(monkeypatch):
    from graphc.backends.cpu import kernels

    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1)
    check((8, 32, 8, 8), (32, 32, 3, 3))  # 4 blocks an image, 8 images: one block


@needs_kernel
@pytest.mark.parametrize("xs, ws", [((3, 64, 32, 32), (128, 64, 3, 3)),
                                    ((4, 128, 16, 16), (256, 128, 3, 3)),
                                    ((8, 256, 8, 8), (512, 256, 3, 3))])
def test_polyphase_input_grad_of_resnet18s_layers(xs, ws):
    check(xs, ws, kind="gx")


@needs_kernel
def test_input_grad_narrow_stand_ins(monkeypatch):
    # few output channels (their distance from float64 is past 2x eager's: not taken
    # normally), blocks of 16 output blocks, split over the cores, rectangular planes
    monkeypatch.setattr(conv_polyphase, "GRAD_MIN_OUT_CHANNELS", 16)
    monkeypatch.setattr(conv_polyphase, "BLOCK_TILES", 16)
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    check((5, 16, 16, 16), (16, 16, 3, 3), kind="gx", rounding=False)
    check((3, 32, 16, 32), (48, 32, 3, 3), kind="gx", rounding=False)
    # 4 blocks an image (gy 4x4), 8 images a block, 12 images: the last block of 4
    monkeypatch.setattr(conv_polyphase, "BLOCK_TILES", 32)
    check((12, 16, 8, 8), (32, 16, 3, 3), kind="gx", rounding=False)


# the input gradient left to im2col: few output channels, 1 block an image (gy 2x2), odd
# input sizes
@needs_kernel
@pytest.mark.parametrize("xs, ws", [((4, 64, 16, 16), (64, 64, 3, 3)),
                                    ((4, 256, 4, 4), (512, 256, 3, 3)),
                                    ((4, 64, 15, 15), (128, 64, 3, 3))])
def test_input_grads_left_to_im2col(xs, ws):
    gx = _compiled(_graphs(xs, ws, (2, 2), (1, 1), 1)[1]["gx"], 1)
    assert KERNEL not in gx.lowered.ir_text


# left to im2col: stride 1 (Winograd's), padding 0, a 5x5 kernel, few channels, groups, an
# odd output, a block of 4 x 2 = 8 output blocks (not a whole vector)
LEFT = [
    ((2, 16, 8, 8), (16, 16, 3, 3), (1, 1), (1, 1), 1),
    ((2, 16, 9, 9), (16, 16, 3, 3), (2, 2), (0, 0), 1),
    ((2, 16, 12, 12), (16, 16, 5, 5), (2, 2), (2, 2), 1),
    ((2, 8, 8, 8), (16, 8, 3, 3), (2, 2), (1, 1), 1),
    ((2, 32, 8, 8), (32, 16, 3, 3), (2, 2), (1, 1), 2),
    ((2, 16, 10, 10), (16, 16, 3, 3), (2, 2), (1, 1), 1),
    ((2, 16, 8, 8), (16, 16, 3, 3), (2, 2), (1, 1), 1),
]


@pytest.mark.parametrize("case", range(len(LEFT)))
def test_other_convolutions_keep_their_paths(case):
    xs, ws, stride, padding, groups = LEFT[case]
    exe = _compiled(_graphs(xs, ws, stride, padding, groups)[1]["fwd"], 1)
    assert KERNEL not in exe.lowered.ir_text


@needs_kernel
def test_float64_and_the_switch_keep_im2col(monkeypatch):
    xs, ws = (4, 16, 8, 8), (16, 16, 3, 3)
    exe = _compiled(_graphs(xs, ws, (2, 2), (1, 1), 1, "float64")[1]["fwd"], 1)
    assert KERNEL not in exe.lowered.ir_text
    monkeypatch.setattr(conv_polyphase, "ENABLED", False)
    check(xs, ws, taken=False)


@needs_kernel
def test_a_batch_known_per_call(monkeypatch):
    import graphc
    import graphc.nn as nn
    from tests.conftest import square_loss_gradients

    def model():
        graphc.manual_seed(0)
        return nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                             nn.Flatten(), nn.Linear(32 * 8 * 8, 3))

    compiled = graphc.compile(square_loss_gradients(model()), backend="cpu")
    reference = graphc.compile(square_loss_gradients(model()), backend="interp",
                               dynamic=False, recompile_limit=8)
    rng = np.random.default_rng(6)
    for batch in (8, 3, 5, 13, 2):  # 16 output blocks an image, 4 images a block, the rest
        x = graphc.tensor(rng.standard_normal((batch, 16, 16, 16)).astype(np.float32))
        graphc.mark_dynamic(x, 0)
        for got, want in zip(compiled(x), reference(x)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4,
                                       err_msg=f"batch {batch}")
    generic = compiled._entries[0].executable.executable_for({"s0": 8}).executable
    assert KERNEL in generic.lowered.ir_text


# the input transform with rows loaded as vectors against the padded plane's block loop:
# (input, weight, kind), vectors of 2, 4 and 8 tile rows (one image or four)
ROWS = [
    ((2, 16, 32, 32), (16, 16, 3, 3), "fwd"),
    ((4, 16, 16, 16), (32, 16, 3, 3), "fwd"),
    ((4, 16, 8, 8), (16, 16, 3, 3), "fwd"),
    ((2, 16, 32, 32), (128, 16, 3, 3), "gx"),
    ((4, 16, 16, 16), (128, 16, 3, 3), "gx"),
]


@needs_kernel
@pytest.mark.parametrize("case", range(len(ROWS)))
def test_input_rows_by_vectors_bit_for_bit(case, monkeypatch, tmp_path):
    xs, ws, kind = ROWS[case]
    taken = []
    emit = conv_polyphase._input_by_rows

    def recording(*args):
        taken.append(True)
        return emit(*args)

    monkeypatch.setattr(conv_polyphase, "_input_by_rows", recording)
    rng = np.random.default_rng(case)
    gs, _ = _graphs(xs, ws, (2, 2), (1, 1), 1)
    args = [rng.standard_normal(xs if kind == "fwd" else gs).astype(np.float32),
            rng.standard_normal(ws).astype(np.float32)]
    outs = []
    for on in (True, False):
        taken.clear()
        monkeypatch.setattr(conv_polyphase, "ROW_VECTORS", on)
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / str(on)))
        exe = _compiled(_graphs(xs, ws, (2, 2), (1, 1), 1)[1][kind], 1)
        assert KERNEL in exe.lowered.ir_text
        outs.append(exe.run(*args)[0])
        assert bool(taken) == on
    np.testing.assert_array_equal(outs[0], outs[1])


def _forking(exe) -> set[str]:
    """The kernels of `exe` that fork (their worker `<name>.omp` is defined)."""
    text = exe.lowered.ir_text
    return {k.split("_", 1)[1] for k in exe.lowered.kernels
            if f'@"{k}.omp"' in text or f"@{k}.omp(" in text}


def _one_block_graph(op, xs, ws):
    from tests.test_cpu_backend import one_op_graph

    if op != "conv2d_channel_sums":
        return _graphs(xs, ws, (2, 2), (1, 1), 1)[1][op]
    return one_op_graph(op, [(xs, "float32"), (ws, "float32")], stride=(2, 2),
                        padding=(1, 1), dilation=(1, 1), groups=1)


# (op, input, weight): batches of one block whose input transform goes by rows: the 256 ->
# 512 forward at batch 8 (4 output blocks an image), with its plane sums, and an input
# gradient of 16 blocks an image
ONE_BLOCK = [
    ("fwd", (8, 256, 8, 8), (512, 256, 3, 3), "conv2d_polyphase"),
    ("conv2d_channel_sums", (8, 256, 8, 8), (512, 256, 3, 3), "conv2d_polyphase"),
    ("gx", (2, 16, 16, 16), (128, 16, 3, 3), "conv2d_polyphase_input_grad"),
]


@needs_kernel
@pytest.mark.parametrize("case", range(len(ONE_BLOCK)))
def test_one_block_forks_its_transforms_with_the_same_bits(case, monkeypatch, tmp_path):
    """A batch of one block: its input and output transforms in kernels of their own around
    the GEMMs', forked over the channels on all cores (FORKED_TRANSFORMS), give the bits of
    both inside the GEMMs' kernel, on one thread and on all cores (every output: the plane
    sums too)."""
    from graphc.backends.cpu import kernels

    op, xs, ws, kernel = ONE_BLOCK[case]
    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1)
    rng = np.random.default_rng(case)
    gs, _ = _graphs(xs, ws, (2, 2), (1, 1), 1)
    args = [rng.standard_normal(xs if op != "gx" else gs).astype(np.float32),
            rng.standard_normal(ws).astype(np.float32)]
    own = [kernel + "_in", kernel, kernel + "_out"]
    outs = {}
    for on in (False, True):
        monkeypatch.setattr(conv_polyphase, "FORKED_TRANSFORMS", on)
        for count in sorted({1, ALL_CORES}):
            monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"forks-{on}-{count}"))
            exe = _compiled(_one_block_graph(op, xs, ws), count)
            names = [k.split("_", 1)[1] for k in exe.lowered.kernels]
            if on and ALL_CORES > 1:
                assert names[-3:] == own, names
                assert {own[0], own[2]} <= _forking(exe), _forking(exe)
            else:
                assert kernel in names and own[0] not in names and own[2] not in names, names
            outs[on, count] = [np.array(r) for r in exe.run(*[a.copy() for a in args])]
            # an input of its own (x scaled: an output element left unwritten, holding a
            # freed array's values, cannot pass): against the interpreter, run after
            probe = [args[0] * -float(len(outs)), args[1]]
            got = [np.array(r) for r in exe.run(*probe)]
            for k, (mine, ref) in enumerate(zip(got, interpret(_one_block_graph(op, xs, ws),
                                                               *probe))):
                np.testing.assert_allclose(mine, ref, rtol=1e-4,
                                           atol=1e-4 * float(np.max(np.abs(ref))),
                                           err_msg=f"output {k}: forked {on}, {count} threads")
    first = outs[False, 1]
    for key, got in outs.items():
        for k, (one, same) in enumerate(zip(first, got)):
            np.testing.assert_array_equal(same, one, err_msg=f"output {k}: forked {key[0]}, "
                                          f"{key[1]} threads")


# the filter transform 16 filters a vector (winograd_filters.filters_by_vectors) against one
# by one: (input, weight, kind): along U's rows of input channels (C_in whole vectors, and
# not: one by one), the input gradient's U^T along the output channels with a rest of 8
# (136), each on one thread and all cores with the filter kernel forked (shares of output
# channels that are not whole vectors)
FILTERS = [
    ((2, 16, 16, 16), (40, 16, 3, 3), "fwd"),
    ((2, 24, 16, 16), (32, 24, 3, 3), "fwd"),
    ((2, 16, 16, 16), (136, 16, 3, 3), "gx"),
]


@needs_kernel
@pytest.mark.parametrize("case", range(len(FILTERS)))
def test_filters_by_vectors_bit_for_bit(case, monkeypatch, tmp_path):
    from graphc.backends.cpu import kernels, winograd_filters

    xs, ws, kind = FILTERS[case]
    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1)
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    switched_bits(monkeypatch, tmp_path, winograd_filters, "FILTER_VECTORS", xs, ws, kind, case)


def test_positions_that_share_a_u_matrix_read_equal_ones():
    # U of each position from a random filter (float64): positions given one matrix by
    # u_slots have equal U; the calls of gemm_calls run every position once, with its own
    from graphc.backends.cpu import conv_polyphase_filters as filters

    f = np.random.default_rng(4).standard_normal((3, 3))
    for grad in (False, True):
        phases = conv_polyphase.phase_matrices(grad)
        u = []
        for rows, cols in phases:
            rg, cg = np.array(rows[2], float), np.array(cols[2], float)
            full = rg @ f[np.ix_(rows[3], cols[3])] @ cg.T
            u.extend(full.ravel())
        slots, count = filters.u_slots(phases)
        assert count == 16 and len(slots) == conv_polyphase.POSITIONS == len(u)
        for xi, slot in enumerate(slots):
            assert u[xi] == u[slots.index(slot)], (grad, xi)
        assert len({u[slots.index(s)] for s in range(count)}) == count  # all distinct
        seen = []
        for first, slot, products, step, slot_step in filters.gemm_calls(slots):
            for k in range(products):
                seen.append(first + k * step)
                assert slots[first + k * step] == slot + k * slot_step
        assert sorted(seen) == list(range(conv_polyphase.POSITIONS))


# (input, weight, kind): one U matrix for the positions that read equal ones against one a
# position, bit for bit, on one thread and all cores: ResNet-18's layers at small batches
# (4 images, 8 of the 256 -> 512 layer: one block, its products forked)
SHARED = [
    ((4, 64, 32, 32), (128, 64, 3, 3), "fwd"),
    ((8, 256, 8, 8), (512, 256, 3, 3), "fwd"),
    ((4, 128, 16, 16), (256, 128, 3, 3), "gx"),
    ((8, 256, 8, 8), (512, 256, 3, 3), "gx"),
]


@needs_kernel
@pytest.mark.parametrize("case", range(len(SHARED)))
def test_shared_u_matrices_bit_for_bit(case, monkeypatch, tmp_path):
    from graphc.backends.cpu import conv_polyphase_filters, kernels

    xs, ws, kind = SHARED[case]
    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1)
    def one_call_a_position_when_off(ir, on):  # 25 products in one call without sharing
        assert (ir.count("_p25") > 0) == (not on)

    switched_bits(monkeypatch, tmp_path, conv_polyphase_filters, "SHARED_U", xs, ws, kind, case,
                  ir_check=one_call_a_position_when_off)
