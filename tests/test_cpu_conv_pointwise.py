"""Strided 1x1 convolutions by their own kernels (graphc.backends.cpu.conv_pointwise): the
forward, input gradient and weight gradient on the shapes it takes, equal to the interpreter
within float32 rounding and within 2x eager's distance from a float64 run
(graphc.testing.assert_rounding_within), at one and two threads, the kernel in the module;
the shapes it must leave to conv.py's im2col path; a downsample block's training step
compiled against the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import conv_pointwise, conv_threads, threads  # noqa: E402
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.passes.plan import plan_buffers  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.test_cpu_conv_paths import _graphs  # noqa: E402

resolve_blas()  # hands the BLAS's thread count to generated code (threads.install)
KERNEL = "graphc_pointwise_gemm_"  # the generated product's name prefix in the module
KINDS = ("fwd", "gx", "gw")

needs_kernel = pytest.mark.skipif(not conv_pointwise.winograd_gemm.available(),
                                  reason="the pointwise kernels need 16-float vectors "
                                  "(an AVX-512 host)")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _check(xs, ws, stride, taken, counts=(1, 2), kinds=KINDS, seed=0, split=None):
    """Each pass in `kinds` on each thread count: the interpreter's result within float32
    rounding, within 2x eager's distance from float64; `taken[kind]`: the kernel in the
    module or not (None: either); `split`: the kinds whose kernel must be split over the
    images (conv_threads)."""
    rng = np.random.default_rng(seed + sum(xs) + 7 * sum(ws))
    gs, graphs = _graphs(xs, ws, stride, (0, 0), 1)
    _, wide = _graphs(xs, ws, stride, (0, 0), 1, "float64")
    x = np.maximum(rng.standard_normal(xs), 0).astype(np.float32)  # after a ReLU
    w = rng.standard_normal(ws).astype(np.float32)
    gy = rng.standard_normal(gs).astype(np.float32)
    arguments = {"fwd": [x, w], "gx": [gy, w], "gw": [gy, x]}
    for kind in kinds:
        args, graph = arguments[kind], graphs[kind]
        eager = interpret(graph, *args)[0]
        reference = interpret(wide[kind], *[a.astype(np.float64) for a in args])[0]
        plan_buffers(graph)
        for count in counts:
            exe = CpuExecutable(graph)
            exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
            got = exe.run(*[np.array(a, copy=True) for a in args])[0]
            scale = float(np.abs(eager).max())
            np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4 * scale,
                                       err_msg=f"{kind} on {count} threads")
            assert_rounding_within(got, eager, reference)
            if taken[kind] is not None:
                assert (KERNEL in exe.lowered.ir_text) == taken[kind], (kind, count)
            if split is not None and kind in split:
                assert "_pointwise.split" in exe.lowered.ir_text, kind


# (input, weight, stride): ResNet-18's three shortcuts (batch cut), planes whose rows hold
# several vectors, one vector, or several rows a vector; a partial last block of images
TAKEN = [
    ((3, 64, 32, 32), (128, 64, 1, 1), (2, 2)),    # 16x16 out: one row a vector
    ((5, 128, 16, 16), (256, 128, 1, 1), (2, 2)),  # 8x8 out: two rows a vector
    ((9, 256, 8, 8), (512, 256, 1, 1), (2, 2)),    # 4x4 out: four rows a vector
    ((2, 16, 64, 64), (32, 16, 1, 1), (2, 2)),     # 32x32 out: two vectors a row
    ((2, 32, 12, 12), (48, 32, 1, 1), (3, 3)),     # stride 3, 4x4 out
    ((40, 16, 8, 8), (24, 16, 1, 1), (2, 2)),      # many images a block, a partial last one
    ((1, 16, 8, 8), (20, 16, 1, 1), (2, 2)),       # one image; 20 rows: a partial row tile
]


@needs_kernel
@pytest.mark.parametrize("case", TAKEN)
def test_the_three_passes(case, monkeypatch):
    with monkeypatch.context() as serial:  # kernels built for one thread: all three taken
        serial.setattr(threads, "image_threads", lambda: 1)
        _check(*case, counts=(1,), taken=dict.fromkeys(KINDS, True))
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)  # two threads split the images
    _check(*case, counts=(1, 2), taken=dict.fromkeys(KINDS, True))


@needs_kernel
@pytest.mark.parametrize("case", [
    ((9, 256, 8, 8), (512, 256, 1, 1), (2, 2)),  # 9 blocks: shares of 5 and 4
    ((4, 32, 16, 16), (64, 32, 1, 1), (2, 2)),   # gw of 2048 elements: two reduce rows
])
def test_split_over_images(case, monkeypatch):
    # blocks of one image split over two shares; the weight gradient's shares sum into
    # their own partials, added in share order by the reduce kernel
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(threads, "image_threads", lambda: 2)  # built for two shares
    monkeypatch.setattr(conv_pointwise, "BLOCK_BYTES", 1)  # of one image each
    _check(*case, counts=(1, 2), taken=dict.fromkeys(KINDS, True), split=KINDS)


@needs_kernel
def test_weight_grad_in_several_blocks(monkeypatch):
    # blocks of one image: beta 0 for the first block, 1 after, every block's k summed
    monkeypatch.setattr(conv_pointwise, "BLOCK_BYTES", 1)
    monkeypatch.setattr(threads, "image_threads", lambda: 1)
    _check((4, 32, 16, 16), (64, 32, 1, 1), (2, 2), counts=(1,), kinds=("gw", "fwd", "gx"),
           taken=dict.fromkeys(KINDS, True))


@needs_kernel
@pytest.mark.parametrize("case", [
    ((2, 16, 9, 9), (32, 16, 1, 1), (2, 2)),      # odd planes (H != 2 * H_out)
    ((2, 16, 12, 12), (32, 16, 1, 1), (2, 2)),    # 6x6 out: P = 36, not whole vectors
    ((2, 16, 8, 8), (32, 16, 1, 1), (1, 1)),      # stride 1 (the image is its own columns)
    ((2, 16, 160, 160), (32, 16, 1, 1), (2, 2)),  # rows past MAX_ROW
])
def test_declined_shapes_keep_im2col(case):
    _check(*case, counts=(1,), taken=dict.fromkeys(KINDS, False))


@needs_kernel
def test_weight_grad_channels_not_whole_vectors():
    # C = 24: the transposed pack wants squares of 16 channels; the other passes take it
    _check((2, 24, 8, 8), (32, 24, 1, 1), (2, 2), counts=(1,),
           taken={"fwd": True, "gx": True, "gw": False})


@needs_kernel
def test_disabled_keeps_im2col(monkeypatch):
    monkeypatch.setattr(conv_pointwise, "ENABLED", False)
    _check((2, 64, 16, 16), (128, 64, 1, 1), (2, 2), counts=(1,),
           taken=dict.fromkeys(KINDS, False))


def _downsample_block(channels: int, size: int):
    """A ResNet downsample block (3x3 stride-2 conv-bn-relu, 3x3 conv-bn, + the 1x1
    stride-2 shortcut's conv-bn, relu), then a linear head to 3 classes."""
    from graphc import nn

    class DownsampleBlock(nn.Module):
        def __init__(self):
            super().__init__()
            wide = 2 * channels
            self.conv1 = nn.Conv2d(channels, wide, 3, stride=2, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(wide)
            self.conv2 = nn.Conv2d(wide, wide, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(wide)
            self.short = nn.Conv2d(channels, wide, 1, stride=2, bias=False)
            self.bn_s = nn.BatchNorm2d(wide)
            self.head = nn.Linear(wide * (size // 2) ** 2, 3)

        def forward(self, x):
            y = self.bn1(self.conv1(x)).relu()
            y = (self.bn2(self.conv2(y)) + self.bn_s(self.short(x))).relu()
            return self.head(y.reshape(x.shape[0], -1))

    return DownsampleBlock()


@needs_kernel
def test_a_downsample_blocks_step_within_twice_eager_rounding_of_float64(monkeypatch,
                                                                         tmp_path):
    """The block's forward and backward compiled (its shortcut's three passes by this
    module's kernels), two calls: the loss, every gradient and the running statistics
    within 2x eager graphc's distance from the same block in PyTorch, float64."""
    import graphc
    from tests.conftest import torch_or_skip

    torch = torch_or_skip()
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    taken = []

    def spied(name: str):
        real = getattr(conv_pointwise, name)

        def spy(*args):
            out = real(*args)
            taken.extend([name] if out else [])
            return out

        return spy

    for name in ("conv2d", "conv2d_input_grad", "conv2d_weight_grad"):
        monkeypatch.setattr(conv_pointwise, name, spied(name))
    channels, size, n = 16, 16, 5
    rng = np.random.default_rng(3)
    x = (0.5 + rng.standard_normal((n, channels, size, size))).astype(np.float32)
    y = rng.integers(0, 3, n)
    graphc.manual_seed(2)
    weights = {k: v.numpy().copy() for k, v in _downsample_block(channels, size)
               .state_dict().items()}

    def graphc_run(compiled: bool):
        model = _downsample_block(channels, size)
        model.load_state_dict({k: graphc.tensor(v) for k, v in weights.items()})

        def step(xs, ys):
            loss = graphc.nn.functional.cross_entropy(model(xs), ys)
            loss.backward()
            return loss

        gx = graphc.tensor(x, requires_grad=True)
        run = graphc.compile(step, backend="cpu") if compiled else step
        run(gx, graphc.tensor(y))  # (compiled: the first call runs on the interpreter)
        loss = run(gx, graphc.tensor(y))  # gradients add up, running statistics move twice
        return [loss.detach().numpy(), gx.grad.numpy()] + \
            [p.grad.numpy() for p in model.parameters()] + \
            [b.numpy() for name, b in model.state_dict().items() if "running" in name]

    got, eager = graphc_run(True), graphc_run(False)
    assert sorted(taken) == ["conv2d", "conv2d_input_grad", "conv2d_weight_grad"], taken
    t_model = torch.nn.Module()  # the same block in PyTorch, float64
    wide = 2 * channels
    t_model.conv1 = torch.nn.Conv2d(channels, wide, 3, stride=2, padding=1, bias=False)
    t_model.bn1 = torch.nn.BatchNorm2d(wide)
    t_model.conv2 = torch.nn.Conv2d(wide, wide, 3, padding=1, bias=False)
    t_model.bn2 = torch.nn.BatchNorm2d(wide)
    t_model.short = torch.nn.Conv2d(channels, wide, 1, stride=2, bias=False)
    t_model.bn_s = torch.nn.BatchNorm2d(wide)
    t_model.head = torch.nn.Linear(wide * (size // 2) ** 2, 3)
    t_model = t_model.double()
    t_model.load_state_dict({k: torch.tensor(v, dtype=torch.float64 if v.dtype.kind == "f"
                                             else None) for k, v in weights.items()})
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        h = t_model.bn1(t_model.conv1(tx)).relu()
        h = (t_model.bn2(t_model.conv2(h)) + t_model.bn_s(t_model.short(tx))).relu()
        t_loss = torch.nn.functional.cross_entropy(t_model.head(h.reshape(n, -1)),
                                                   torch.tensor(y))
        t_loss.backward()
    want = [t_loss.detach().numpy(), tx.grad.numpy()] + \
        [p.grad.numpy() for p in t_model.parameters()] + \
        [b.numpy() for name, b in t_model.state_dict().items() if "running" in name]
    assert len(got) == len(eager) == len(want) == 2 + 11 + 6
    assert not all(np.array_equal(g, e) for g, e in zip(got, eager)), "compiled = eager?"
    for k, (g, e, r) in enumerate(zip(got, eager, want)):
        try:
            assert_rounding_within(np.asarray(g, np.float32), np.asarray(e, np.float32), r)
        except AssertionError as err:
            raise AssertionError(f"result {k}: {err}") from None
