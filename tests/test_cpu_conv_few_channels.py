"""The register-tiled forward for convolutions with few input channels
(graphc.backends.cpu.conv_few_channels): row segments with tails of every vector width,
row blocks, output-channel tiles with a remainder, padding, dilation, unbatched and strided
inputs, a bias added in registers or another fused epilogue, one thread and all cores;
checked against the interpreter and within 2x eager's distance from a float64 run; the
convolutions it does not serve keep their paths."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
from graphc.backends.cpu import conv_few_channels, conv_threads, small_gemm, threads  # noqa: E402
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.backends.cpu.conv_im2col import Geometry  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.passes.fuse import fuse  # noqa: E402
from graphc.passes.plan import plan_buffers  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from graphc.types import float32, float64  # noqa: E402
from tests.conftest import torch_or_skip  # noqa: E402
from tests.test_cpu_backend import compare  # noqa: E402
from tests.test_cpu_conv_paths import _graphs  # noqa: E402

resolve_blas()  # hands the BLAS's thread count to generated code (threads.install)
COUNTS = sorted({1, threads.image_threads()})  # one thread, and all cores where they split
MARKER = "conv2d_few_channels"
needs_vectors = pytest.mark.skipif(not small_gemm.lanes(),
                                   reason="the host has no AVX2/AVX-512: the path is off")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _geometry(xs, ws, padding=(1, 1), stride=(1, 1), groups=1, dilation=(1, 1)):
    ho = xs[-2] + 2 * padding[0] - dilation[0] * (ws[2] - 1)
    wo = xs[-1] + 2 * padding[1] - dilation[1] * (ws[3] - 1)
    return Geometry(xs[0], xs[-3], xs[-2], xs[-1], ws[0], groups, ws[2], ws[3], ho, wo,
                    stride, padding, dilation)


def test_row_pieces_cover_the_row_in_halving_widths():
    assert conv_few_channels.pieces(32, 16) == [16, 16]
    assert conv_few_channels.pieces(28, 16) == [16, 8, 4]
    assert conv_few_channels.pieces(31, 8) == [8, 8, 8, 4, 2, 1]
    assert conv_few_channels.pieces(3, 16) == [2, 1]


@needs_vectors
def test_tilings():
    lanes = small_gemm.lanes()
    budget = conv_few_channels.accumulators(lanes)
    # the conv2d case: one segment of two vectors (AVX-512), even channel tiles
    t = conv_few_channels.tiling_for(_geometry((64, 3, 32, 32), (64, 3, 3, 3)), float32)
    assert t.full and t.rows == 1 and t.channels * len(t.full) <= budget
    assert -(-64 // t.channels) * t.channels - 64 < -(-64 // t.channels)  # even tiles
    # few output channels: several rows a tile
    t = conv_few_channels.tiling_for(_geometry((2, 1, 6, 6), (2, 1, 3, 3)), float32)
    assert t.channels == 2 and t.rows > 1
    for refused in [_geometry((2, 9, 8, 8), (4, 9, 3, 3)),  # 9 input channels
                    _geometry((2, 3, 8, 8), (4, 3, 3, 3), stride=(2, 2)),
                    _geometry((2, 4, 8, 8), (4, 2, 3, 3), groups=2),
                    _geometry((2, 3, 14, 14), (32, 3, 3, 3))]:  # 14 of 32 lanes (8+4+2)
        assert conv_few_channels.tiling_for(refused, float32) is None
    # ... unless the alternative is the few-rows loops (fewer than 16 output channels)
    assert conv_few_channels.tiling_for(_geometry((2, 3, 14, 14), (6, 3, 3, 3)), float32)
    assert conv_few_channels.tiling_for(_geometry((2, 3, 8, 8), (4, 3, 3, 3)), float64) \
        is None


# (input, weight, padding, dilation): what each exercises
CASES = [
    ((3, 3, 10, 32), (20, 3, 3, 3), (1, 1), (1, 1)),  # one full segment; channel remainder
    ((2, 1, 12, 28), (6, 1, 5, 5), (2, 2), (1, 1)),  # LeNet's row: 16 + 8 + 4
    ((2, 2, 7, 71), (5, 2, 3, 3), (1, 1), (1, 1)),  # segments loop + a tail 4 + 2 + 1
    ((2, 4, 9, 5), (3, 4, 3, 2), (0, 1), (1, 1)),  # rows per tile with a row remainder
    ((1, 3, 11, 13), (7, 3, 3, 3), (2, 1), (2, 2)),  # dilation, uneven padding
    ((3, 6, 6), (9, 3, 1, 1), (0, 0), (1, 1)),  # unbatched, 1x1
    ((2, 4, 6, 6), (4, 4, 5, 5), (2, 2), (1, 1)),  # 100 taps (MAX_TAPS)
    ((2, 8, 5, 16), (17, 8, 3, 3), (1, 1), (1, 1)),  # 8 input channels (MAX_CHANNELS)
]


@needs_vectors
@pytest.mark.parametrize("case", range(len(CASES)))
def test_few_channels_forward(case):
    """Equal to the interpreter within float32 rounding, within 2x eager's distance from
    float64 (the taps are summed in another order), lowered through this path."""
    xs, ws, padding, dilation = CASES[case]
    rng = np.random.default_rng(sum(xs) + 7 * sum(ws))
    _, graphs = _graphs(xs, ws, (1, 1), padding, 1, dilation=dilation)
    _, wide = _graphs(xs, ws, (1, 1), padding, 1, "float64", dilation)
    args = [rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)]
    exe = compare(graphs["fwd"], args, rtol=1e-4)
    got = exe.run(*args)[0]
    eager = interpret(graphs["fwd"], *args)[0]
    reference = interpret(wide["fwd"], *[a.astype(np.float64) for a in args])[0]
    assert_rounding_within(got, eager, reference)
    assert MARKER in exe.lowered.ir_text


@needs_vectors
@pytest.mark.parametrize("shape", [((2, 9, 8, 8), (4, 9, 3, 3), (1, 1), 1),  # 9 channels
                                   ((2, 3, 9, 9), (4, 3, 3, 3), (2, 2), 1),  # stride 2
                                   ((2, 4, 8, 8), (4, 2, 3, 3), (1, 1), 2)])  # groups
def test_others_keep_their_paths(shape):
    xs, ws, stride, groups = shape
    _, graphs = _graphs(xs, ws, stride, (1, 1), groups)
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in (xs, ws)]
    assert MARKER not in compare(graphs["fwd"], arrays, rtol=1e-4).lowered.ir_text


def _fused_run(f, arrays, count):
    graph = fuse(graphc.trace(f, *[graphc.tensor(a) for a in arrays]))
    assert any(n.op == "fused" and n.attrs["body"][0][0] == "conv2d" for n in graph.nodes)
    want = interpret(graph, *arrays)
    plan_buffers(graph)
    exe = CpuExecutable(graph)
    exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
    return exe, want, exe.run(*[a.copy() for a in arrays])


@needs_vectors
@pytest.mark.parametrize("count", COUNTS)
def test_bias_in_registers(count, monkeypatch):
    """conv2d + bias (the benchmark's case): one kernel, no epilogue pass, the output
    stored once; the sum is conv + bias as the separate add rounds it."""
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    rng = np.random.default_rng(count)
    arrays = [rng.standard_normal(s).astype(np.float32)
              for s in ((5, 3, 9, 20), (18, 3, 3, 3), (18,))]
    exe, want, got = _fused_run(lambda x, w, b: graphc.conv2d(x, w, b, padding=1), arrays,
                                count)
    assert len(exe.lowered.kernels) == 1 and MARKER in exe.lowered.kernels[0]
    assert (".split" in exe.lowered.ir_text) == (COUNTS[-1] > 1)  # split over images
    assert "eo.head" not in exe.lowered.ir_text  # no per-image epilogue loop
    wide = [a.astype(np.float64) for a in arrays]
    reference = interpret(fuse(graphc.trace(
        lambda x, w, b: graphc.conv2d(x, w, b, padding=1),
        *[graphc.tensor(a) for a in wide])), *wide)[0]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert_rounding_within(got[0], want[0], reference)


@needs_vectors
@pytest.mark.parametrize("count", COUNTS)
def test_other_epilogues_run_per_image(count, monkeypatch):
    """LeNet's first layer: conv + bias, relu and the relu mask (a bool output): the
    epilogue runs per image inside the kernel."""
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    rng = np.random.default_rng(7 + count)
    arrays = [rng.standard_normal(s).astype(np.float32)
              for s in ((3, 1, 12, 12), (6, 1, 5, 5), (6,))]

    def f(x, w, b):
        y = graphc.conv2d(x, w, b, padding=2)
        return y.relu(), y > 0

    exe, want, got = _fused_run(f, arrays, count)
    assert len(exe.lowered.kernels) == 1 and MARKER in exe.lowered.kernels[0]
    assert "eo.head" in exe.lowered.ir_text
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])


@needs_vectors
def test_strided_input_view():
    rng = np.random.default_rng(2)
    x = graphc.tensor(rng.standard_normal((2, 3, 9, 8)).astype(np.float32))
    w = graphc.tensor(rng.standard_normal((5, 3, 3, 3)).astype(np.float32))
    graph = graphc.trace(lambda x, w: graphc.conv2d(x.permute(0, 1, 3, 2), w, padding=1), x, w)
    want = interpret(graph, x.numpy(), w.numpy())[0]
    plan_buffers(graph)
    exe = CpuExecutable(graph)
    np.testing.assert_allclose(exe.run(x.numpy(), w.numpy())[0], want, rtol=1e-5, atol=1e-5)
    assert MARKER in exe.lowered.ir_text


@needs_vectors
@pytest.mark.parametrize("case", [0, 1, 2])
def test_eight_lane_tiles(case, monkeypatch):
    """The AVX2 tiling (8 floats a vector, 12 accumulators), built on this host too: a
    host with AVX-512 runs 8-float vectors as well."""
    monkeypatch.setattr(small_gemm, "lanes", lambda: 8)
    t = conv_few_channels.tiling_for(_geometry(*CASES[case][:2], CASES[case][2]), float32)
    assert t.lanes == 8 and t.channels * t.rows * max(len(t.full), len(t.tail)) <= 12
    test_few_channels_forward(case)


# ---- the weight gradient (graphc.backends.cpu.conv_few_channels_grad) -----------------------
GRAD_MARKER = "conv2d_few_channels_weight_grad"


GRAD_CASES = CASES + [((3, 6, 9, 9), (5, 6, 5, 5), (0, 0), (1, 1))]  # 150 taps, 5 wide


@needs_vectors
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("case", range(len(GRAD_CASES)))
def test_few_channels_weight_grad(case, count, monkeypatch):
    """Output-channel tiles (a remainder tile in case 0), kernel rows of 1-5 taps, flat
    rows with tails, dilation, unbatched; on one thread and split over the tiles: the
    interpreter's result within float32 rounding, within 2x eager's distance from float64."""
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    xs, ws, padding, dilation = GRAD_CASES[case]
    rng = np.random.default_rng(case)
    gs, graphs = _graphs(xs, ws, (1, 1), padding, 1, dilation=dilation)
    _, wide = _graphs(xs, ws, (1, 1), padding, 1, "float64", dilation)
    args = [rng.standard_normal(gs).astype(np.float32), rng.standard_normal(xs).astype(np.float32)]
    eager = interpret(graphs["gw"], *args)[0]
    reference = interpret(wide["gw"], *[a.astype(np.float64) for a in args])[0]
    plan_buffers(graphs["gw"])
    exe = CpuExecutable(graphs["gw"])
    exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
    got = exe.run(*[a.copy() for a in args])[0]
    np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4 * float(np.abs(eager).max()))
    assert_rounding_within(got, eager, reference)
    assert GRAD_MARKER in exe.lowered.ir_text


# (input, weight, padding, where the inf goes): every one of them reaches taps through the
# zeros past W_out (and past the last row) of the flat output-gradient rows
NON_FINITE_CASES = [((2, 3, 8, 8), (4, 3, 3, 3), (1, 1), (1, 1, 7, 7)),  # last row and column
                    ((2, 3, 8, 8), (4, 3, 3, 3), (1, 1), (0, 2, 4, 0)),  # a first column
                    ((2, 1, 12, 28), (6, 1, 5, 5), (2, 2), (0, 0, 5, 27))]  # LeNet's row


@needs_vectors
@pytest.mark.parametrize("lanes", sorted({8, small_gemm.lanes()}))
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("case", range(len(NON_FINITE_CASES)))
def test_weight_grad_of_an_infinite_input_matches_pytorch(case, count, lanes, monkeypatch):
    """No product of a padded output-gradient position counts: with one inf in the input,
    the same taps as PyTorch's are infinite and none is NaN (it was 8 NaN taps of 108 in
    the first case, 0 * inf), the finite taps equal PyTorch's within float32 rounding; with
    16 lanes (masked fused multiply-adds) and 8 (the AVX2 code, zeroed inputs)."""
    torch = torch_or_skip()
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(small_gemm, "lanes", lambda: lanes)
    xs, ws, padding, where = NON_FINITE_CASES[case]
    rng = np.random.default_rng(case)
    gs, graphs = _graphs(xs, ws, (1, 1), padding, 1)
    x = rng.standard_normal(xs).astype(np.float32)
    x[where] = np.inf
    gy = rng.standard_normal(gs).astype(np.float32)
    plan_buffers(graphs["gw"])
    exe = CpuExecutable(graphs["gw"])
    assert GRAD_MARKER in exe.lowered.ir_text
    exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
    got = exe.run(gy, x)[0]
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.zeros(ws, requires_grad=True)
    torch.nn.functional.conv2d(tx, tw, padding=padding).backward(torch.from_numpy(gy))
    want = tw.grad.numpy()
    assert np.isinf(want).any() and not np.isnan(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4,
                               atol=1e-4 * float(np.abs(want[finite]).max()))


def _function_text(ir_text: str, suffix: str) -> str:
    """The text of the one function whose name ends with `suffix` (e.g. the kernel's name)."""
    found = [f for f in ir_text.split("\ndefine ") if f.split("(")[0].endswith(f'{suffix}"')]
    assert len(found) == 1, f"{len(found)} functions named *{suffix} in the module"
    return found[0]


@needs_vectors
@pytest.mark.parametrize("lanes", sorted({8, small_gemm.lanes()}))
def test_weight_grad_kernel_stays_compact(lanes, monkeypatch):
    """The lanes of the tile's partial sums are added in a loop over its channels x taps,
    not unrolled per tap: LeNet-5's 6->16 5x5 gradient (4 tiles of 4 channels x 150 taps)
    was 1.19 MB of LLVM IR and 3.3 s of LLVM (eighth session), and a kernel's text must not
    grow with its taps (150 taps against 25)."""
    monkeypatch.setattr(small_gemm, "lanes", lambda: lanes)
    sizes = []
    for xs, ws, padding in (((2, 6, 14, 14), (16, 6, 5, 5), (0, 0)),
                            ((2, 1, 28, 28), (6, 1, 5, 5), (2, 2))):
        _, graphs = _graphs(xs, ws, (1, 1), padding, 1)
        plan_buffers(graphs["gw"])
        text = CpuExecutable(graphs["gw"]).lowered.ir_text
        sizes.append(len(_function_text(text, GRAD_MARKER)))
    assert max(sizes) < 64_000, f"weight-gradient kernels of {sizes} characters of LLVM IR"
    assert sizes[0] < 2 * sizes[1], f"150 taps: {sizes[0]} characters, 25 taps: {sizes[1]}"


CHANNEL_CASES = [  # (input, weight, padding): conv_channel_lanes' tiles, what each exercises
    ((3, 6, 14, 14), (16, 6, 5, 5), (0, 0)),  # LeNet's second layer: 2 rows x 10 a tile
    ((2, 3, 9, 13), (32, 3, 3, 3), (1, 1)),  # 2 vectors a position: 12 + 1 columns
    ((2, 2, 7, 30), (64, 2, 3, 3), (0, 1)),  # 4 vectors: 6 columns a tile, rows one by one
    ((1, 5, 14), (16, 1, 3, 3), (1, 1)),  # unbatched, one input channel
]


@needs_vectors
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("case", range(len(CHANNEL_CASES)))
def test_channel_lanes_forward(case, count, monkeypatch):
    """Rows too narrow for the lanes with O a multiple of 16: the output channels in the
    lanes (conv_channel_lanes), + bias in registers, then relu and its mask per image; within
    2x eager's distance from float64, every output written (scaled inputs)."""
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    if small_gemm.lanes() != 16:
        pytest.skip("the channel tiles are AVX-512's (16 lanes)")
    xs, ws, padding = CHANNEL_CASES[case]
    rng = np.random.default_rng(case + 10 * count)
    arrays = [(rng.standard_normal(s) * 100).astype(np.float32) for s in (xs, ws, ws[:1])]

    def conv(x, w, b):
        return graphc.conv2d(x, w, b, padding=padding)

    def conv_relu(x, w, b):
        y = conv(x, w, b)
        return y.relu(), y > 0

    for f in (conv, conv_relu):
        exe, want, got = _fused_run(f, arrays, count)
        assert "ctaps.body" in exe.lowered.ir_text
        wide = [a.astype(np.float64) for a in arrays]
        reference = interpret(fuse(graphc.trace(f, *[graphc.tensor(a) for a in wide])),
                              *wide)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-1)
        assert_rounding_within(got[0], want[0], reference[0])
