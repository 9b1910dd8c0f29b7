"""Convolution kernels split over the cores (graphc.backends.cpu.conv_threads): forward,
input gradient and weight gradient, compiled with their image loop split, run on one thread
and on all cores, equal to the interpreter, and within the float64-distance rule of
docs/performance.md ("Rounding"; the weight gradient's shares sum their images apart).
Small shapes are split too here (MIN_SPLIT_MACS patched to 0) so the tests stay fast."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import (  # noqa: E402
    conv_blocks,
    conv_direct,
    conv_threads,
    kernels,
    small_gemm,
    threads,
)
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.passes.plan import plan_buffers  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.test_cpu_conv_paths import _graphs  # noqa: E402

resolve_blas()  # hands the BLAS's thread count to generated code (threads.install)
ALL_CORES = threads.image_threads()
needs_cores = pytest.mark.skipif(
    ALL_CORES < 2, reason="one core (or a BLAS whose thread count cannot be held): "
    "convolution kernels are never split")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture
def split_small(monkeypatch):
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(conv_direct, "FEW_ROWS", 0)  # few output channels: keep im2col


def _run(graph, args, count: int):
    exe = CpuExecutable(graph)
    exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
    return exe, exe.run(*[np.array(a, copy=True) for a in args])[0]


def check_split(xs, ws, stride=(1, 1), padding=(1, 1), groups=1, split=True):
    """Each kernel on one thread and on all cores: the interpreter's result within float32
    rounding, within 2x eager's distance from float64; `split`: the module has the split."""
    rng = np.random.default_rng(sum(xs) + 3 * sum(ws) + groups)
    gs, graphs = _graphs(xs, ws, stride, padding, groups)
    _, wide = _graphs(xs, ws, stride, padding, groups, "float64")
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    gy = rng.standard_normal(gs).astype(np.float32)
    args = {"fwd": [x, w], "gx": [gy, w], "gw": [gy, x]}
    for kind, graph in graphs.items():
        eager = interpret(graph, *args[kind])[0]
        reference = interpret(wide[kind], *[a.astype(np.float64) for a in args[kind]])[0]
        plan_buffers(graph)
        for count in (1, ALL_CORES):
            exe, got = _run(graph, args[kind], count)
            scale = float(np.abs(eager).max())
            np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4 * scale,
                                       err_msg=f"{kind} on {count} threads")
            assert_rounding_within(got, eager, reference)
        assert (".split" in exe.lowered.ir_text) == split, kind


# (input, weight, stride, padding, groups): one GEMM per image, several images per share
PER_IMAGE = [
    ((5, 3, 10, 10), (16, 3, 3, 3), (1, 1), (1, 1), 1),  # 5 images over 2 shares
    ((4, 8, 11, 11), (12, 4, 3, 3), (1, 1), (0, 0), 2),  # groups, no padding
    ((3, 4, 17, 16), (8, 4, 3, 3), (2, 2), (1, 1), 1),  # stride 2, odd height
    ((6, 4, 8, 8), (160, 4, 1, 1), (1, 1), (0, 0), 1),  # pointwise; gw not transposed
    ((2, 6, 12, 12), (8, 6, 5, 5), (1, 1), (2, 2), 1),  # 5x5, two images: one each
]


@needs_cores
@pytest.mark.parametrize("case", range(len(PER_IMAGE)))
def test_per_image_kernels_split_equal_the_interpreter(case, split_small):
    check_split(*PER_IMAGE[case])


# output planes under THIN_COLUMNS positions: blocks of images, a partial last block
BLOCKED = [
    ((7, 8, 4, 4), (16, 8, 3, 3), (1, 1), (1, 1), 1),  # 3 blocks of 2-3 images
    ((9, 6, 6, 6), (8, 3, 3, 3), (2, 2), (1, 1), 2),  # stride 2, groups
    ((5, 8, 5, 5), (140, 8, 1, 1), (1, 1), (0, 0), 1),  # pointwise blocked, gw not transposed
]


@needs_cores
@pytest.mark.parametrize("case", range(len(BLOCKED)))
def test_blocked_kernels_split_equal_the_interpreter(case, split_small, monkeypatch):
    monkeypatch.setattr(conv_blocks, "BLOCK_COLUMNS", 40)
    check_split(*BLOCKED[case])


@needs_cores
def test_one_image_is_not_split(split_small):
    check_split((1, 3, 12, 12), (8, 3, 3, 3), split=False)


def test_small_kernels_and_one_thread_machines_stay_serial(monkeypatch):
    monkeypatch.setattr(conv_direct, "FEW_ROWS", 0)
    check_split((4, 3, 8, 8), (8, 3, 3, 3), split=False)  # under MIN_SPLIT_MACS
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(threads, "image_threads", lambda: 1)
    check_split((4, 3, 8, 8), (8, 3, 3, 3), split=False)


@needs_cores
def test_a_split_weight_gradient_is_the_same_every_call(split_small):
    """The shares' partial sums are added in share order: a given thread count gives the
    same bits every call, whichever thread ran which share."""
    gs, graphs = _graphs((8, 4, 9, 9), (6, 4, 3, 3), (1, 1), (1, 1), 1)
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(gs).astype(np.float32),
            rng.standard_normal((8, 4, 9, 9)).astype(np.float32)]
    graph = graphs["gw"]
    plan_buffers(graph)
    exe, first = _run(graph, args, ALL_CORES)
    for _ in range(20):
        np.testing.assert_array_equal(exe.run(*args)[0], first)


@needs_cores
def test_the_blas_thread_count_is_given_back(split_small):
    """The BLAS runs on one thread inside a split kernel and on the call's count after."""
    gs, graphs = _graphs((5, 3, 10, 10), (16, 3, 3, 3), (1, 1), (1, 1), 1)
    graph = graphs["fwd"]
    plan_buffers(graph)
    rng = np.random.default_rng(1)
    args = [rng.standard_normal((5, 3, 10, 10)).astype(np.float32),
            rng.standard_normal((16, 3, 3, 3)).astype(np.float32)]
    exe, _ = _run(graph, args, ALL_CORES)
    assert ".split" in exe.lowered.ir_text
    assert threads.blas_threads() == ALL_CORES


# Winograd F(2x2, 3x3) forward and input gradient: the filter transform once, before the
# shares; a partial last block (8x8 planes go 4 images a block), and parts of tile rows
WINOGRAD = [
    ((10, 16, 8, 8), (16, 16, 3, 3), (1, 1), (1, 1), 1),
    ((3, 16, 16, 16), (24, 16, 3, 3), (1, 1), (1, 1), 1),
    ((3, 16, 34, 34), (16, 16, 3, 3), (1, 1), (0, 0), 1),  # no padding; gx padded by 2
]


@needs_cores
@pytest.mark.parametrize("case", range(len(WINOGRAD)))
def test_winograd_kernels_split_equal_the_interpreter(case, split_small):
    check_split(*WINOGRAD[case])


# direct loops: depthwise (forward, both input-gradient forms, weight gradient split over
# the output channels) and few output channels per group (LeNet-5's first layer)
DIRECT = [
    ((4, 8, 10, 10), (8, 1, 3, 3), (1, 1), (1, 1), 8),
    ((3, 8, 11, 11), (8, 1, 3, 3), (2, 2), (1, 1), 8),  # stride 2: the scatter gradient
    ((5, 1, 12, 12), (6, 1, 5, 5), (1, 1), (0, 0), 1),
    ((3, 4, 9, 9), (8, 2, 3, 3), (1, 1), (1, 1), 2),  # few rows in groups
]


@needs_cores
@pytest.mark.parametrize("case", range(len(DIRECT)))
def test_direct_kernels_split_equal_the_interpreter(case, monkeypatch):
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    check_split(*DIRECT[case])


@needs_cores
def test_split_calls_on_two_python_threads_at_once(split_small):
    """Two executables whose convolutions split, called at the same time from two Python
    threads (each call sets the BLAS's count, each split region holds it to one thread):
    every result right, no region left waiting, the count given back at the end."""
    import threading

    rng = np.random.default_rng(2)
    work = []
    # GEMMs big enough for OpenBLAS to split them on more than one thread
    for xs, ws in (((4, 3, 32, 32), (64, 3, 3, 3)), ((4, 8, 24, 24), (32, 8, 3, 3))):
        gs, graphs = _graphs(xs, ws, (1, 1), (1, 1), 1)
        args = [rng.standard_normal(xs).astype(np.float32),
                rng.standard_normal(ws).astype(np.float32)]
        plan_buffers(graphs["fwd"])
        exe, want = _run(graphs["fwd"], args, ALL_CORES)
        work.append((exe, args, want))
    failures = []

    def calls(exe, args, want):
        try:
            for _ in range(40):
                np.testing.assert_array_equal(exe.run(*args)[0], want)
        except Exception as error:  # noqa: BLE001 (reported below)
            failures.append(error)

    runners = [threading.Thread(target=calls, args=w, daemon=True) for w in work]
    for runner in runners:
        runner.start()
    for runner in runners:
        runner.join(timeout=300)
    assert not any(r.is_alive() for r in runners), "a split call never returned"
    assert not failures, failures
    assert threads.blas_threads() == ALL_CORES


# pooling forward: the images split from POOL_MIN_SPLIT_TAPS taps on (patched to 0 here)
POOLS = [  # (op, input shape, attributes)
    ("max_pool2d", (5, 3, 8, 8), dict(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0),
                                      dilation=(1, 1), ceil_mode=False)),
    ("max_pool2d", (3, 2, 7, 7), dict(kernel_size=(3, 3), stride=(2, 2), padding=(1, 1),
                                      dilation=(1, 1), ceil_mode=True)),
    ("avg_pool2d", (5, 3, 9, 9), dict(kernel_size=(3, 3), stride=(2, 2), padding=(1, 1),
                                      ceil_mode=False, count_include_pad=False,
                                      divisor_override=None)),
]


@needs_cores
@pytest.mark.parametrize("case", range(len(POOLS)))
def test_pooling_split_equals_the_interpreter(case, monkeypatch):
    from graphc.backends.cpu import pool
    from tests.test_cpu_backend import one_op_graph

    monkeypatch.setattr(pool, "POOL_MIN_SPLIT_TAPS", 0)
    op, shape, attrs = POOLS[case]
    graph = one_op_graph(op, [(shape, "float32")], **attrs)
    x = np.random.default_rng(case).standard_normal(shape).astype(np.float32)
    want = interpret(graph, x)
    plan_buffers(graph)
    for count in (1, ALL_CORES):
        exe = CpuExecutable(graph)
        exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        for got, expected in zip(exe.run(x.copy()), want):
            np.testing.assert_array_equal(got, expected)  # pooling sums in the same order
    assert ".split" in exe.lowered.ir_text


def _max_pool2d_grad(shape, kernel, stride, padding):
    """(graph, gradient, indices) of max_pool2d_grad with max_pool2d's own indices."""
    from graphc.ops.registry import REGISTRY
    from tests.test_cpu_backend import one_op_graph

    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    attrs = dict(kernel_size=kernel, stride=stride, padding=padding, dilation=(1, 1),
                 ceil_mode=False)
    _, indices = REGISTRY["max_pool2d"].kernel(x, **attrs)
    g = rng.standard_normal(indices.shape).astype(np.float32)
    graph = one_op_graph("max_pool2d_grad", [(g.shape, "float32"), (g.shape, "int64")],
                         input_hw=shape[-2:])
    return graph, g, indices


@needs_cores
@pytest.mark.parametrize("case", [((5, 3, 8, 8), (2, 2), (2, 2), (0, 0)),  # LeNet's pools
                                  ((3, 2, 7, 7), (3, 3), (2, 2), (1, 1))])  # windows overlap
def test_max_pool2d_grad_split_equals_the_interpreter(case, monkeypatch):
    """The gradient's images split over the cores (a status kernel: the split wrapper
    returns the shares' status): each share zeroes and scatters into its own images."""
    from graphc.backends.cpu import pool

    monkeypatch.setattr(pool, "POOL_MIN_SPLIT_TAPS", 0)
    graph, g, indices = _max_pool2d_grad(*case)
    want = interpret(graph, g, indices)[0]
    plan_buffers(graph)
    for count in (1, ALL_CORES):
        exe = CpuExecutable(graph)
        exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        np.testing.assert_array_equal(exe.run(g, indices)[0], want)  # the same sums
    assert ".split" in exe.lowered.ir_text


@needs_cores
@pytest.mark.parametrize("image", [0, 4])  # in the first share, in the last
def test_a_split_max_pool2d_grad_reports_a_bad_index_from_any_share(image, monkeypatch):
    from graphc.backends.cpu import pool
    from graphc.errors import GraphcError

    monkeypatch.setattr(pool, "POOL_MIN_SPLIT_TAPS", 0)
    graph, g, indices = _max_pool2d_grad((5, 3, 8, 8), (2, 2), (2, 2), (0, 0))
    indices[image, 1, 2, 3] = 64
    plan_buffers(graph)
    for count in (1, ALL_CORES):
        exe = CpuExecutable(graph)
        exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        with pytest.raises(GraphcError, match="out of the 8x8 plane"):
            exe.run(g, indices)
        indices[image, 1, 2, 3] = 0
        exe.run(g, indices)  # the status of the failed call does not stick
        indices[image, 1, 2, 3] = 64


# ---- a fused epilogue applied per image inside the im2col kernel (conv.fused_conv2d) ---------
EPILOGUES = [  # (input, weight, blocks of images: BLOCK_COLUMNS)
    ((5, 3, 10, 10), (16, 3, 3, 3), None),  # one GEMM per image
    ((7, 8, 4, 4), (18, 8, 3, 3), 40),  # blocks of images, a partial last block
]


@pytest.mark.parametrize("case", range(len(EPILOGUES)))
def test_a_fused_epilogue_runs_in_the_convolution_kernel(case, split_small, monkeypatch):
    """conv2d + bias, a residual add, relu and the relu mask (LeNet's `gt`, a bool output):
    one kernel, no second pass over the output; equal to the interpreter on one thread and
    all cores."""
    import graphc
    from graphc.passes.fuse import fuse

    xs, ws, block_columns = EPILOGUES[case]
    if block_columns:
        monkeypatch.setattr(conv_blocks, "BLOCK_COLUMNS", block_columns)
    rng = np.random.default_rng(case)

    def f(x, w, bias, r):
        y = graphc.conv2d(x, w, bias, padding=1) + r
        return y.relu(), y > 0

    ys = (xs[0], ws[0]) + xs[2:]
    arrays = [rng.standard_normal(s).astype(np.float32) for s in (xs, ws, (ws[0],), ys)]
    graph = fuse(graphc.trace(f, *[graphc.tensor(a) for a in arrays]))
    want = interpret(graph, *arrays)
    plan_buffers(graph)
    for count in (1, ALL_CORES):
        exe = CpuExecutable(graph)
        exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        got = exe.run(*[a.copy() for a in arrays])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[1], want[1])
    assert len(exe.lowered.kernels) == 1, exe.lowered.kernels


@needs_cores
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_split_over_channels_equals_one_thread(training, monkeypatch):
    """batch_norm's channels split over the cores: each channel's statistics are summed by
    one thread in the same order, so the result is the one-thread result bit for bit."""
    from graphc.backends.cpu import pool
    from tests.test_cpu_backend import one_op_graph

    monkeypatch.setattr(pool, "POOL_MIN_SPLIT_TAPS", 0)
    shape = (4, 5, 6, 7)
    rng = np.random.default_rng(11)
    arrays = [rng.uniform(-2, 5, shape).astype(np.float32)] + \
        [rng.uniform(0.5, 2, (5,)).astype(np.float32) for _ in range(4)]
    graph = one_op_graph("batch_norm", [(shape, "float32")] + [((5,), "float32")] * 4,
                         training=training, eps=1e-5)
    want = interpret(graph, *arrays)
    plan_buffers(graph)
    results = []
    for count in (1, ALL_CORES):
        exe = CpuExecutable(graph)
        exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        results.append(exe.run(*[a.copy() for a in arrays]))
    assert ".split" in exe.lowered.ir_text
    for one, all_cores, expected in zip(*results, want):
        np.testing.assert_array_equal(all_cores, one)
        np.testing.assert_allclose(one, expected, rtol=1e-5, atol=1e-5)


# ---- a whole training step ----------------------------------------------------------------------
@needs_cores
def test_a_small_cnn_training_step_on_all_cores_tracks_one_thread(split_small, monkeypatch):
    """Three SGD-momentum steps of a small CNN (convolutions with bias and relu, max pooling,
    a blocked 4x4 stage, a linear head), compiled twice from the same weights: on all cores
    (every convolution kernel split) and on one thread; the losses and weights agree within
    float32 rounding of the reordered sums."""
    import graphc
    from graphc import nn, optim
    from graphc.backends.cpu import pool

    monkeypatch.setattr(pool, "POOL_MIN_SPLIT_TAPS", 0)

    def model():
        graphc.manual_seed(3)
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
                             nn.Linear(16 * 4 * 4, 10))

    def step_of(net):
        opt = optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()

        def step(x, y):
            opt.zero_grad()
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        return graphc.compile(step, backend="cpu")

    rng = np.random.default_rng(7)
    x = graphc.tensor(rng.standard_normal((6, 3, 16, 16)).astype(np.float32))
    y = graphc.tensor(rng.integers(0, 10, 6))
    runs = []
    for count in (1, ALL_CORES):
        net = model()
        step = step_of(net)
        losses = [float(step(x, y).numpy())]
        step.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        losses += [float(step(x, y).numpy()) for _ in range(2)]
        runs.append((losses, [p.detach().numpy().copy() for p in net.parameters()]))
        assert ".split" in step.executable.lowered.ir_text
    (losses1, weights1), (losses2, weights2) = runs
    np.testing.assert_allclose(losses2, losses1, rtol=1e-5)
    for w1, w2 in zip(weights1, weights2):
        np.testing.assert_allclose(w2, w1, rtol=1e-4, atol=1e-5)


def test_a_status_kernel_with_a_reduce_kernel_is_refused_clearly():
    from graphc.backends.cpu.kernels import Kernel
    from graphc.backends.cpu.values import CpuLoweringError

    split = conv_threads.Split(2, 2, 64, [], None, [])
    with pytest.raises(CpuLoweringError, match="k returns a status.*build that kernel serial"):
        split.call(None, Kernel("k", status=True), reduce=Kernel("r"))


@needs_cores
@pytest.mark.skipif(small_gemm.lanes() != 16,
                    reason="no AVX-512 on this host: the BLAS serves every Winograd block")
@pytest.mark.parametrize("images", [4, 40])
def test_winograd_filter_transform_and_block_gemms_fork(images, split_small, monkeypatch):
    """A Winograd kernel whose batch is one block (4 images of 4 tiles: ResNet-18's
    512-channel layers) is not split over images; its filter transform forks in a kernel of
    its own called first, and its 16 block GEMMs fork (winograd_gemm.function(forked=True)).
    A split kernel (40 images, 3 blocks) forks its filter transform (the prelude) and keeps
    its GEMMs serial inside the shares. Either way: the same bits on one thread and on all
    cores, the interpreter's result. Small here: every loop forks (PARALLEL_MIN_ELEMENTS 0)."""
    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 0)
    xs, ws = (images, 32, 4, 4), (32, 32, 3, 3)
    rng = np.random.default_rng(11)
    gs, graphs = _graphs(xs, ws, (1, 1), (1, 1), 1)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    gy = rng.standard_normal(gs).astype(np.float32)
    for kind, args in (("fwd", [x, w]), ("gx", [gy, w])):
        graph = graphs[kind]
        eager = interpret(graph, *args)[0]
        plan_buffers(graph)
        one_exe, one = _run(graph, args, 1)
        _, every = _run(graph, args, ALL_CORES)
        text = one_exe.lowered.ir_text
        assert "conv2d_winograd_filter" in text and '_filter.omp"' in text, kind
        assert (".forked" in text) == (images == 4), kind
        assert (".split" in text) == (images == 40), kind
        np.testing.assert_array_equal(every, one, err_msg=kind)
        np.testing.assert_allclose(one, eager, rtol=1e-4, atol=1e-4 * np.abs(eager).max(),
                                   err_msg=kind)


def test_unsplit_winograd_gemms_stay_serial_below_the_threshold():
    """The same kernel at the real thresholds: 16 x 32 x 16 x 32 multiply-adds are far below
    a fork's worth (kernels.gemm_work), and so are the filter's 16 x 32 x 32 elements: the
    block GEMM is the serial function, the filter transformed inside the kernel."""
    xs, ws = (4, 32, 4, 4), (32, 32, 3, 3)
    _, graphs = _graphs(xs, ws, (1, 1), (1, 1), 1)
    graph = graphs["fwd"]
    plan_buffers(graph)
    text = CpuExecutable(graph).lowered.ir_text
    assert ".forked" not in text and "conv2d_winograd_filter" not in text
