"""Review of the fourteenth session's stride-1 Winograd kernel changes, at their edges.

- winograd_filters.STREAMED_U / conv_winograd.STREAMED_GW (U or dU of STREAMED_U_BYTES or
  more stored non-temporally): the real threshold (512 x 256 channels: U exactly 8 MiB), input
  or output channels not a whole number of vectors (the unaligned 4-byte non-temporal stores
  and the one-by-one rest), the filter transform forked over output channels (shares that
  start off a multiple of 16), a batch split over the cores; against the interpreter and
  within 2x eager graphc's distance from float64, the same bits at one and two threads and
  with the switches off.
- winograd_transforms.PLANE_CHANNELS_INNER, ROW_PREFETCH, SUMS_BEHIND: the conv output and
  the batch norm's per-image sums (conv2d_channel_sums) with an image in parts of tile rows,
  small planes 16 tiles a vector, the output transform forked over channels (a batch of one
  block on two threads); the same output bits with each switch off, the sums to float64
  rounding.
- winograd_gemm.ROWS_OVER_PANELS (a row block over two panels): products of two panels,
  b stored panel by panel, a read with a column stride, several k blocks, a partial row
  tile, beta 0 and 1, the forked function; against float64 numpy and the same bits as the
  panels-outermost order.
- a whole small SGD training step through these kernels (ResNet basic blocks at 256 and
  512 channels, 2x2 planes) against the interpreter.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import (  # noqa: E402
    conv_winograd,
    kernels,
    threads,
    winograd_filters,
    winograd_gemm,
    winograd_transforms,
)
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.ir import parse  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.passes.conv_channel_sums import fuse_conv_channel_sums  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from graphc.types import float32  # noqa: E402
from tests.conftest import cpu_executable_on  # noqa: E402
from tests.test_conv_channel_sums import _arrays, _eager, _float64_run, _graph  # noqa: E402
from tests.test_cpu_conv_paths import _graphs  # noqa: E402

resolve_blas()
TWO = min(2, threads.most_threads())
needs_vectors = pytest.mark.skipif(not winograd_gemm.available(), reason="winograd_gemm's "
                                   "generated GEMM needs AVX-512")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _conv_case(kind: str, xs, ws, seed: int):
    """(the graph, its float32 arguments, the interpreter's float32 result, the float64
    one) of one convolution op."""
    rng = np.random.default_rng(seed)
    gs, graphs = _graphs(xs, ws, (1, 1), (1, 1), 1)
    x, w, gy = (rng.standard_normal(s).astype(np.float32) for s in (xs, ws, gs))
    args = {"fwd": [x, w], "gx": [gy, w], "gw": [gy, x]}[kind]
    eager = interpret(graphs[kind], *[a.copy() for a in args])[0]
    wide = _graphs(xs, ws, (1, 1), (1, 1), 1, "float64")[1][kind]
    reference = interpret(wide, *[a.astype(np.float64) for a in args])[0]
    return graphs[kind], args, eager, reference


# (output channels, input channels): U (or dU) of 16 x O x C float32 at or past 8 MiB; the
# first exactly 8 MiB (>=); then channels off a multiple of 16 on either side (511: the
# transposed walk's blocks and a rest of 15; 520: past MAX_K, the BLAS's GEMMs)
STREAMED = [(512, 256), (511, 264), (264, 520)]


@needs_vectors
@pytest.mark.parametrize("kind", ["fwd", "gx", "gw"])
@pytest.mark.parametrize("channels", STREAMED, ids=lambda c: f"{c[0]}x{c[1]}")
def test_streamed_filters_at_the_real_threshold(kind, channels, monkeypatch):
    co, ci = channels
    xs, ws = (1, ci, 4, 4), (co, ci, 3, 3)  # a batch of one block: the filter kernel forked
    graph, args, eager, reference = _conv_case(kind, xs, ws, seed=co + ci + len(kind))
    streamed = getattr(winograd_filters, "streamed", None)  # (before h1's branch: none)
    assert streamed is None or streamed(float32, co, ci), "meant to be past the threshold"
    results = []
    for on in (True, False):
        monkeypatch.setattr(winograd_filters, "STREAMED_U", on, raising=False)
        monkeypatch.setattr(conv_winograd, "STREAMED_GW", on, raising=False)
        for count in sorted({1, TWO}):
            exe = cpu_executable_on(graph, count)
            assert "conv2d_winograd" in exe.lowered.ir_text
            got = exe.run(*[a.copy() for a in args])[0]
            assert_rounding_within(got, eager, reference)
            results.append((on, count, got))
    # the same bits with the switches off; across thread counts where winograd_gemm serves
    # (past MAX_K the BLAS serves, whose bits vary with its threads: so on main already)
    served = max(co, ci) <= winograd_gemm.MAX_K
    for on, count, got in results:
        first = next(r for o, c, r in results if c == count or served)
        np.testing.assert_array_equal(got, first, err_msg=f"streamed {on}, {count} threads")


@needs_vectors
@pytest.mark.parametrize("kind", ["fwd", "gx"])
def test_streamed_u_in_a_batch_split_over_the_cores(kind, monkeypatch):
    """Several blocks split over the images: U in the split's shared region, written by the
    filter kernel run before the shares (forked over output channels)."""
    monkeypatch.setattr(conv_winograd, "BLOCK_TILES", 4)
    monkeypatch.setattr(winograd_filters, "STREAMED_U_BYTES", 16 * 40 * 48 * 4, raising=False)
    xs, ws = (5, 48, 4, 4), (40, 48, 3, 3)
    graph, args, eager, reference = _conv_case(kind, xs, ws, seed=11 + len(kind))
    got = []
    for count in sorted({1, TWO}):
        exe = cpu_executable_on(graph, count)
        assert "!nontemporal" in exe.lowered.ir_text or \
            not hasattr(winograd_filters, "STREAMED_U")
        got.append(exe.run(*[a.copy() for a in args])[0])
        assert_rounding_within(got[-1], eager, reference)
    np.testing.assert_array_equal(got[-1], got[0])


# ResNet-18's output-transform paths (test_conv_channel_sums.SHAPES' kinds): 32x32 in parts of
# tile rows, 16x16 the tile loop, 8x8 / 4x4 16 tiles a vector; odd batches
SUMS_SHAPES = [
    {"n": 3, "c": 16, "o": 24, "hw": 32},
    {"n": 3, "c": 32, "o": 48, "hw": 16},
    {"n": 5, "c": 16, "o": 40, "hw": 8},
    {"n": 1, "c": 48, "o": 80, "hw": 4},
    {"n": 4, "c": 16, "o": 16, "hw": 4},
    {"n": 3, "c": 16, "o": 24, "hw": 16, "dtype": "f64"},
    {"n": 2, "c": 16, "o": 24, "hw": 32, "dtype": "f64"},
]
SWITCHES = [("PLANE_CHANNELS_INNER", False), ("SUMS_BEHIND", False), ("ROW_PREFETCH", 0)]


def _with_sums(graph):
    """The fused graph with conv2d_channel_sums' sums returned first."""
    sums = graph.nodes[0].outputs[1]
    text = str(graph).replace("-> (", "-> (f64[{}], ".format(
        ",".join(str(d) for d in sums.type.shape)), 1)
    return parse(text.replace("return (", f"return (%{sums.name}, "))


@pytest.mark.parametrize("shape", SUMS_SHAPES, ids=lambda s: "-".join(f"{k}{v}"
                                                                     for k, v in s.items()))
def test_transforms_and_sums_the_same_with_each_switch_off(shape, monkeypatch):
    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1)  # small shapes fork too
    graph = _with_sums(fuse_conv_channel_sums(parse(_graph(**shape, residual=True))))
    assert graph.nodes[0].op == "conv2d_channel_sums"
    dims = {k: v for k, v in shape.items() if k != "dtype"}
    wide = "dtype" in shape
    arrays = _arrays(**dims, seed=sum(dims.values()), dtype=np.float64 if wide else np.float32)
    runs = {}
    for switch in [None] + SWITCHES:
        with monkeypatch.context() as m:
            if switch is not None:
                m.setattr(winograd_transforms, *switch, raising=False)
            for count in sorted({1, TWO}):
                runs[(switch, count)] = cpu_executable_on(graph, count).run(*[a.copy() for a in
                                                                         arrays])
    base = runs[(None, 1)]
    planes = base[-1].astype(np.float64).reshape(dims["n"], dims["o"], -1)
    shift = planes[:, :, :1]
    image_sums = np.stack([shift[:, :, 0], (planes - shift).sum(-1),
                           ((planes - shift) ** 2).sum(-1)], axis=1)
    np.testing.assert_array_equal(base[0][:, 0], image_sums[:, 0])
    np.testing.assert_allclose(base[0], image_sums, rtol=1e-12, atol=1e-9)
    eager, reference = _eager(arrays, residual=True), _float64_run(arrays, residual=True)
    for g, e, r in zip([base[1], base[3], base[4], base[5]], eager, reference, strict=True):
        if wide:
            np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-10)
        else:
            assert_rounding_within(g, e, r)
    for key, got in runs.items():
        for k, (g, b) in enumerate(zip(got, base)):
            if k == 0:  # the sums: the same additions, LLVM may reassociate the short ones
                np.testing.assert_allclose(g, b, rtol=1e-13, atol=1e-10, err_msg=str(key))
            else:
                np.testing.assert_array_equal(g, b, err_msg=f"{key}: output {k}")


# (m, n, k, a_row, a_col, vectors, b_panel): two panels of 64 (4 vectors) or of 16 (1
# vector), a partial row tile, k over several K_BLOCKs, a read along its columns
GEMMS = [
    (33, 128, 150, 150, 1, None, 0),
    (24, 128, 64, 64, 1, None, 64 * 64 + 16),
    (19, 32, 70, 1, 19, 1, 0),
    (50, 128, 512, 512, 1, None, 0),
]


@needs_vectors
@pytest.mark.parametrize("beta", [0.0, 1.0])
@pytest.mark.parametrize("case", range(len(GEMMS)))
def test_rows_over_panels_against_float64(case, beta, monkeypatch):
    from tests.test_cpu_winograd_gemm import _compiled

    m, n, k, a_row, a_col, vectors, b_panel = GEMMS[case]
    positions = winograd_gemm.POSITIONS
    ldb = n if not b_panel else 64
    a_step = m * k + 16
    b_step = (k * n if not b_panel else b_panel * (n // 64)) + 32
    c_step = m * n + 48
    gemm = winograd_gemm.plan(m, n, k, a_row, a_col, ldb, n, a_step, b_step, c_step,
                              beta != 0, vectors=vectors, b_panel=b_panel,
                              max_c=1 << 30)
    assert gemm is not None and gemm.n // (gemm.vectors * gemm.lanes) == 2, gemm
    rng = np.random.default_rng(case)
    a, b, c = (rng.standard_normal(positions * s).astype(np.float32)
               for s in (a_step, b_step, c_step))
    results = []
    for over in (2, 0):
        monkeypatch.setattr(winograd_gemm, "ROWS_OVER_PANELS", over, raising=False)
        got = c.copy()
        _compiled(gemm)(a.ctypes.data, b.ctypes.data, got.ctypes.data, beta)
        results.append(got)
    np.testing.assert_array_equal(results[0], results[1])
    for xi in range(positions):
        am = np.lib.stride_tricks.as_strided(
            a[xi * a_step:].astype(np.float64), (m, k), (8 * a_row, 8 * a_col))
        if b_panel:
            panels = [b[xi * b_step + p * b_panel:][:k * 64].reshape(k, 64)
                      for p in range(n // 64)]
            bm = np.concatenate(panels, axis=1).astype(np.float64)
        else:
            bm = b[xi * b_step:][:k * n].reshape(k, n).astype(np.float64)
        want = am @ bm + beta * c[xi * c_step:][:m * n].reshape(m, n)
        got = results[0][xi * c_step:][:m * n].reshape(m, n)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
        # nothing written past c's matrices (the gaps between them)
        gap = results[0][xi * c_step + m * n:(xi + 1) * c_step]
        np.testing.assert_array_equal(gap, c[xi * c_step + m * n:(xi + 1) * c_step])


@pytest.mark.parametrize("channels", [256, 512])
def test_a_training_step_of_wide_residual_blocks(channels):
    """Three SGD-momentum steps of a ResNet basic block (conv-bn-relu, conv-bn, + x, relu, a
    linear head) at `channels` on 4x4 planes, batch 8, compiled (at 512 the streamed U and
    gw and a batch of one block of 128 tiles: the two-panel GEMMs; the batch norm's sums
    from 16-tile vectors) against the same steps eager: the losses and every parameter
    after."""
    import graphc
    from tests.conftest import residual_block, sgd_training_step

    rng = np.random.default_rng(channels)
    x = rng.standard_normal((8, channels, 4, 4)).astype(np.float32)
    y = rng.integers(0, 3, 8)
    runs = []
    for compiled in (True, False):
        model, step = sgd_training_step(lambda: residual_block(channels, 4), lr=0.1)
        run = graphc.compile(step, backend="cpu") if compiled else step
        losses = [float(run(graphc.tensor(x), graphc.tensor(y)).numpy()) for _ in range(3)]
        runs.append((losses, [p.detach().numpy().copy() for p in model.parameters()]))
    (got_losses, got), (want_losses, want) = runs
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-4)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)


def test_a_batch_known_per_call_through_the_streamed_and_polyphase_kernels():
    """dynamic=True: one executable for every batch size (the symbolic batch's arena offsets
    and scratch), through a 256 -> 512 stride-1 convolution (U of 8 MiB: streamed), a 512 ->
    32 stride-2 one (polyphase) and their gradients: the forward and every gradient against
    the interpreter's at batches 2, 5 and 1 (specialised), on one thread and two."""
    import graphc
    from graphc import nn
    from tests.conftest import square_loss_gradients

    def model():
        graphc.manual_seed(0)
        return nn.Sequential(nn.Conv2d(256, 512, 3, padding=1, bias=False), nn.ReLU(),
                             nn.Conv2d(512, 32, 3, stride=2, padding=1, bias=False))

    symbolic = graphc.compile(square_loss_gradients(model()), backend="cpu", dynamic=True)
    reference = graphc.compile(square_loss_gradients(model()), backend="interp",
                               dynamic=False, recompile_limit=8)
    rng = np.random.default_rng(2)
    for batch in (2, 5, 1, 2):
        x = graphc.tensor(rng.standard_normal((batch, 256, 4, 4)).astype(np.float32))
        want = [t.numpy() for t in reference(x)]
        got = [t.numpy() for t in symbolic(x)]
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            scale = float(np.abs(w).max())
            np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5 * scale,
                                       err_msg=f"batch {batch}, output {k}")
    assert any("s0" in str(g.inputs[0].type) for g in symbolic.graphs)


@pytest.mark.parametrize("hw", [32, 16, 8, 4])
def test_strided_input_through_the_transforms_switches(hw, monkeypatch, tmp_path):
    """A convolution of every other channel of x (a view: its channel planes 2 H W apart),
    with its gradients: rows_by_vectors (32x32, 16x16, ROW_PREFETCH's hints ss[1] apart) and
    planes_by_vectors (8x8, 4x4, PLANE_CHANNELS_INNER, also the weight gradient's Y) on a
    strided source; the same bits with each switch off, and against eager graphc."""
    import graphc
    from graphc import nn
    from tests.conftest import square_loss_gradients

    class EveryOther(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(16, 32, 3, padding=1, bias=False)

        def forward(self, x):
            return self.conv(x[:, ::2]).relu()

    rng = np.random.default_rng(hw)
    x = rng.standard_normal((8, 32, hw, hw)).astype(np.float32)
    results = []
    for k, switch in enumerate([None] + SWITCHES):
        with monkeypatch.context() as m:
            m.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"cache{k}"))
            if switch is not None:
                m.setattr(winograd_transforms, *switch, raising=False)
            graphc.manual_seed(0)
            step = graphc.compile(square_loss_gradients(EveryOther()), backend="cpu")
            step(graphc.tensor(x))  # the first call traces (on the interpreter)
            results.append([t.numpy() for t in step(graphc.tensor(x))])
    graphc.manual_seed(0)
    eager = [t.numpy() for t in square_loss_gradients(EveryOther())(graphc.tensor(x))]
    for g, e in zip(results[0], eager, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4 * float(np.abs(e).max()))
    for switch, got in zip(SWITCHES, results[1:]):
        for g, b in zip(got, results[0], strict=True):
            np.testing.assert_array_equal(g, b, err_msg=f"{switch}")


def test_a_downsampling_block_step_against_torch_float64():
    """One forward and backward of a ResNet downsampling stage (a 256 -> 512 stride-2 conv:
    polyphase fwd / gx / gw with shared U; bn, relu; a 512 -> 512 conv: streamed U and gw,
    two-panel GEMMs; bn, + a 1x1 stride-2 shortcut, relu; a linear head), batch 4 of 8x8:
    the loss and every parameter's gradient, compiled, within 2x eager graphc's distance from
    PyTorch's float64 run of the same weights."""
    torch = pytest.importorskip("torch")
    import graphc
    from graphc import nn

    class Down(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(256, 512, 3, stride=2, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(512)
            self.conv2 = nn.Conv2d(512, 512, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(512)
            self.short = nn.Conv2d(256, 512, 1, stride=2, bias=False)
            self.head = nn.Linear(512 * 16, 3)

        def forward(self, x):
            y = self.bn1(self.conv1(x)).relu()
            y = (self.bn2(self.conv2(y)) + self.short(x)).relu()
            return self.head(y.reshape(x.shape[0], -1))

    def grads(model, x, y, lib):
        for p in model.parameters():
            p.grad = None
        loss = lib.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return [loss.detach()] + [p.grad for p in model.parameters()]

    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 256, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, 4)
    graphc.manual_seed(0)
    model = Down()
    weights = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    step = graphc.compile(lambda a, b: grads(model, a, b, graphc), backend="cpu")
    step(graphc.tensor(x), graphc.tensor(y))  # the first call traces
    got = [t.numpy() for t in step(graphc.tensor(x), graphc.tensor(y))]
    eager = [t.numpy() for t in grads(model, graphc.tensor(x), graphc.tensor(y), graphc)]

    t_model = torch.nn.Module()
    for name in ("conv1", "bn1", "conv2", "bn2", "short", "head"):
        setattr(t_model, name, {"conv1": torch.nn.Conv2d(256, 512, 3, 2, 1, bias=False),
                                "bn1": torch.nn.BatchNorm2d(512),
                                "conv2": torch.nn.Conv2d(512, 512, 3, 1, 1, bias=False),
                                "bn2": torch.nn.BatchNorm2d(512),
                                "short": torch.nn.Conv2d(256, 512, 1, 2, bias=False),
                                "head": torch.nn.Linear(512 * 16, 3)}[name])
    t_model = t_model.double()
    t_model.load_state_dict({k: torch.tensor(v, dtype=torch.float64 if v.dtype.kind == "f"
                                             else None) for k, v in weights.items()})
    tx = torch.tensor(x, dtype=torch.float64)
    h = t_model.bn1(t_model.conv1(tx)).relu()
    h = (t_model.bn2(t_model.conv2(h)) + t_model.short(tx)).relu()
    loss = torch.nn.functional.cross_entropy(t_model.head(h.reshape(4, -1)), torch.tensor(y))
    loss.backward()
    names = [n for n, _ in model.named_parameters()]
    t_params = dict(t_model.named_parameters())
    reference = [loss.detach().numpy()] + [t_params[n].grad.numpy() for n in names]
    for k, (g, e, r) in enumerate(zip(got, eager, reference, strict=True)):
        try:
            assert_rounding_within(g, e, r)
        except AssertionError as err:
            raise AssertionError(f"output {k} ({(['loss'] + names)[k]}): {err}") from None


# (x's shape, w's shape): the NN weight gradient's weight_out from a transposed dU, blocks
# of 16 output channels over all input channels (WEIGHT_OUT_BLOCKS): output channels a
# whole number of blocks, with a rest of 8 (one by one), a rest of 15; forked over output
# channels (shares that start off a multiple of 16); 264 x 256: past STREAMED_U_BYTES too
WEIGHT_OUT = [((4, 48, 8, 8), (40, 48, 3, 3)), ((2, 32, 4, 4), (63, 32, 3, 3)),
              ((1, 256, 4, 4), (264, 256, 3, 3))]


@pytest.mark.parametrize("case", range(len(WEIGHT_OUT)))
def test_weight_out_blocks_same_bits(case, monkeypatch):
    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1)  # weight_out forked too
    xs, ws = WEIGHT_OUT[case]
    graph, args, eager, reference = _conv_case("gw", xs, ws, seed=case)
    results = []
    for blocks in (True, False):
        monkeypatch.setattr(conv_winograd, "WEIGHT_OUT_BLOCKS", blocks, raising=False)
        for count in sorted({1, TWO}):
            exe = cpu_executable_on(graph, count)
            got = exe.run(*[a.copy() for a in args])[0]
            assert_rounding_within(got, eager, reference)
            results.append((blocks, count, got))
    for blocks, count, got in results:  # one block of images: the same sums at any count
        np.testing.assert_array_equal(got, results[0][2], err_msg=f"{blocks}, {count}")
