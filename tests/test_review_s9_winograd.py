"""Review of the ninth session's Winograd block GEMM (graphc.backends.cpu.winograd_gemm, called
by conv_winograd, the input gradient's U stored transposed): the forward and both gradients
at each channel rule (16, 48, 64, 128, 256, 512 = WIDE_CHANNELS, 520 > MAX_K, unequal in and
out), odd images, padding 0, 1 and 2, a batch of one, one and two threads; convolutions next
to other kernels of the same module, static and dynamic batches; against PyTorch and within
rounding of a float64 run.

Fixed here: winograd_gemm._prefetch_rows declared `llvm.prefetch.p0` on the module itself, past
the code generator's declaration table (`Codegen.declare`); a large elementwise loop lowered
after the convolution (graphc.backends.cpu.prefetch, 64K elements or more, or any dynamic size)
then declared it again, and llvmlite raised DuplicatedNameError while lowering.
`Codegen.declare` now takes a declaration already on the module.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
from graphc.backends.cpu import threads, winograd_gemm  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402

needs_block_gemm = pytest.mark.skipif(
    not winograd_gemm.available(), reason="no AVX-512 on this host: the BLAS serves every block")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _weight(co: int, ci: int, seed: int) -> graphc.Tensor:
    rng = np.random.default_rng(seed)
    return graphc.tensor((rng.standard_normal((co, ci, 3, 3)) / np.sqrt(9 * ci))
                         .astype(np.float32))


def _images(shape, seed: int) -> graphc.Tensor:
    return graphc.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _torch_conv(x, w, pad, dtype):
    torch = pytest.importorskip("torch")
    return torch.nn.functional.conv2d(torch.from_numpy(x.numpy()).to(dtype),
                                      torch.from_numpy(w.numpy()).to(dtype),
                                      padding=pad).numpy()


@needs_block_gemm
def test_a_large_elementwise_loop_after_the_block_gemm_compiles():
    torch = pytest.importorskip("torch")
    w = _weight(64, 64, 0)
    x = _images((4, 64, 16, 16), 1)
    big = _images((1 << 17,), 2)  # past PREFETCH_MIN_ELEMENTS: its loop prefetches

    def f(x, big):
        return F.conv2d(x, w, padding=1), big * 2.0 + 1.0

    y, z = graphc.compile(f, backend="cpu")(x, big)
    assert_rounding_within(y.numpy(), _torch_conv(x, w, 1, torch.float32),
                           _torch_conv(x, w, 1, torch.float64))
    np.testing.assert_array_equal(z.numpy(), big.numpy() * np.float32(2) + np.float32(1))


@needs_block_gemm
def test_a_dynamic_batch_through_the_block_gemm():
    """A symbolic batch makes the ReLU's loop a prefetching one (its size is unknown)."""
    torch = pytest.importorskip("torch")
    w = _weight(64, 64, 3)

    def f(x):
        return F.relu(F.conv2d(x, w, padding=1))

    compiled = graphc.compile(f, backend="cpu", dynamic=True)
    for batch in (2, 1, 0, 3):
        x = _images((batch, 64, 8, 8), batch)
        got = compiled(x).numpy()
        want = np.maximum(_torch_conv(x, w, 1, torch.float32), 0)
        assert got.shape == want.shape
        if batch:
            assert_rounding_within(got, want,
                                   np.maximum(_torch_conv(x, w, 1, torch.float64), 0))


def _step(pad):
    def step(x, w, gy):
        y = F.conv2d(x, w, padding=pad)
        (y * gy).sum().backward()
        return y
    return step


def _torch_step(x, w, gy, pad, dtype):
    torch = pytest.importorskip("torch")
    tx, tw = (torch.tensor(a.detach().numpy(), dtype=dtype, requires_grad=True)
              for a in (x, w))
    y = torch.nn.functional.conv2d(tx, tw, padding=pad)
    (y * torch.tensor(gy.numpy(), dtype=dtype)).sum().backward()
    return [y.detach().numpy(), tx.grad.numpy(), tw.grad.numpy()]


# (batch, in channels, out channels, image side, padding, threads, the generated GEMM serves)
CONVOLUTIONS = [
    (1, 16, 16, 8, 1, 1, True),  # a batch of one, MIN_CHANNELS
    (2, 48, 64, 10, 0, 2, True),  # no padding (an odd image, 3x3, stride 1: never Winograd)
    (3, 64, 48, 10, 2, 1, True),  # padding 2: the input gradient pads by 0
    (2, 128, 128, 6, 1, 2, True),  # 3 x 3 tiles an image: the forward's 18 columns on the BLAS
    (4, 256, 256, 8, 1, 1, True),
    (8, 512, 512, 4, 1, 2, True),  # WIDE_CHANNELS: U transposed where the GEMM serves
    (8, 520, 520, 4, 1, 1, False),  # past MAX_K: the BLAS on U transposed
    (4, 512, 64, 4, 1, 2, True),
]


@pytest.mark.parametrize("case", CONVOLUTIONS,
                         ids=["x".join(map(str, c[:6])) for c in CONVOLUTIONS])
def test_forward_and_gradients_at_each_channel_rule(case):
    torch = pytest.importorskip("torch")
    n, ci, co, side, pad, count, generated = case
    seed = n * 1000 + ci + co + side
    w = _weight(co, ci, seed)
    x = _images((n, ci, side, side), seed + 1)
    out = side + 2 * pad - 2
    gy = _images((n, co, out, out), seed + 2)
    x.requires_grad_()
    w.requires_grad_()
    compiled = graphc.compile(_step(pad), backend="cpu")
    compiled(x, w, gy)
    x.grad = w.grad = None
    compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
    y = compiled(x, w, gy)
    got = [y.detach().numpy(), x.grad.numpy(), w.grad.numpy()]
    eager = _torch_step(x, w, gy, pad, torch.float32)
    exact = _torch_step(x, w, gy, pad, torch.float64)
    for name, g, e, r in zip(("output", "input gradient", "weight gradient"), got, eager, exact):
        assert g.shape == r.shape, name
        assert_rounding_within(g, e, r, factor=4.0)  # Winograd rounds more than direct sums
    if winograd_gemm.available():
        assert ("graphc_winograd_gemm_" in compiled.executable.lowered.ir_text) == generated
