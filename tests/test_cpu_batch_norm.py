"""The cpu backend's batch_norm kernel (graphc.backends.cpu.batch_norm): its one-pass shifted
statistics on inputs that defeat unshifted sums, its walk in memory order against the
channel-by-channel kernel of before, and its split over the cores (test_cpu_conv_threads)."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.backends.cpu import batch_norm
from graphc.backends.cpu.executable import CpuExecutable
from graphc.ops.registry import REGISTRY
from graphc.passes.plan import plan_buffers
from graphc.testing.rounding import assert_rounding_within
from tests.test_cpu_backend import one_op_graph


def _compiled(shape, training: bool = True, dtype: str = "float32"):
    c = shape[1]
    graph = one_op_graph("batch_norm", [(shape, dtype)] + [((c,), dtype)] * 4,
                         training=training, eps=1e-5)
    plan_buffers(graph)
    return CpuExecutable(graph)


def _float64_run(x, weight, bias):
    axes = (0,) + tuple(range(2, x.ndim))
    bshape = (1, -1) + (1,) * (x.ndim - 2)
    xd = x.astype(np.float64)
    mean = xd.mean(axis=axes)
    var = ((xd - mean.reshape(bshape)) ** 2).mean(axis=axes)
    invstd = 1.0 / np.sqrt(var + 1e-5)
    out = (xd - mean.reshape(bshape)) * (invstd * weight).reshape(bshape) + bias.reshape(bshape)
    return out, mean, invstd


HOSTILE = {
    "mean 1e4, deviation 1e-2": lambda z: 1e4 + 1e-2 * z,
    "mean 1e5, deviation 1e-1": lambda z: 1e5 + 1e-1 * z,
    "mean -3e3, deviation 1": lambda z: -3e3 + z,
    "first element an outlier": lambda z: np.where(np.arange(z.shape[-1]) == 0, 1e3, z),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("shape", [(8, 3, 6, 5), (16, 4), (4, 2, 16)])
def test_training_statistics_stay_within_twice_eager_rounding(kind, shape):
    """A large mean over a small spread: sums of x and x^2 would cancel every digit of the
    variance; the kernel's shift by the channel's first element keeps the output, the mean
    and invstd within 2x eager graphc's distance from a float64 run."""
    rng = np.random.default_rng(abs(hash((kind, shape))) % 2**32)
    c = shape[1]
    x = HOSTILE[kind](rng.standard_normal(shape)).astype(np.float32)
    args = [x, rng.uniform(0.5, 2, c).astype(np.float32),
            rng.uniform(-1, 1, c).astype(np.float32), np.zeros(c, np.float32),
            np.ones(c, np.float32)]
    got = _compiled(shape).run(*args)
    eager = REGISTRY["batch_norm"].kernel(*args, training=True, eps=1e-5)
    for g, e, want, name in zip(got, eager, _float64_run(*args[:3]), ("out", "mean", "invstd")):
        assert g.dtype == np.float32, name
        assert_rounding_within(g, e, want)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", [(32, 64, 4, 4), (3, 5, 7, 9), (5, 6)])
def test_memory_order_walk_equals_the_channel_by_channel_kernel(training, shape, monkeypatch):
    """IMAGE_ORDER (the default) and the kernel before it agree within float32 rounding
    (both compute in float64), in training and eval, with and without prefetching."""
    rng = np.random.default_rng(sum(shape) + training)
    c = shape[1]
    args = [rng.uniform(-2, 5, shape).astype(np.float32)] + \
        [rng.uniform(0.5, 2, c).astype(np.float32) for _ in range(4)]
    results = []
    for order, prefetch in ((False, True), (True, False), (True, True)):
        monkeypatch.setattr(batch_norm, "IMAGE_ORDER", order)
        monkeypatch.setattr(batch_norm, "PREFETCH", prefetch)
        results.append(_compiled(shape, training).run(*[a.copy() for a in args]))
    for other in results[1:]:
        for got, want in zip(other, results[0]):
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def test_the_statistics_of_a_constant_channel_are_exact():
    """A constant channel: every shifted value is 0, so the variance is exactly 0 (never a
    tiny negative number from cancellation) and invstd is 1/sqrt(eps)."""
    shape = (4, 3, 5)
    x = np.full(shape, 123.25, np.float32)
    c = shape[1]
    args = [x, np.ones(c, np.float32), np.zeros(c, np.float32), np.zeros(c, np.float32),
            np.ones(c, np.float32)]
    out, mean, invstd = _compiled(shape).run(*args)
    np.testing.assert_array_equal(mean, np.full(c, 123.25, np.float32))
    np.testing.assert_array_equal(out, np.zeros(shape, np.float32))
    np.testing.assert_array_equal(invstd, np.full(c, 1 / np.sqrt(1e-5), np.float32))


@pytest.mark.parametrize("training, momentum", [(True, 0.1), (True, 0.5), (False, 0.1)])
def test_compiled_batch_norm_steps_match_pytorch(training, momentum):
    """Three compiled forward + backward steps of BatchNorm2d (the batch-norm kernel and the
    backward's sums, with a ReLU after it as in ResNet) against PyTorch: loss, input and
    parameter gradients, running statistics. (momentum=None does not compile: the module
    reads num_batches_tracked.item() for its cumulative average.)"""
    import graphc
    from graphc import nn
    from tests.conftest import torch_or_skip

    torch = torch_or_skip()
    rng = np.random.default_rng(3 + training + (momentum is None))
    c = 6
    g_bn = nn.BatchNorm2d(c, momentum=momentum)
    t_bn = torch.nn.BatchNorm2d(c, momentum=momentum)
    weight, bias = rng.uniform(0.5, 2, c), rng.uniform(-1, 1, c)
    with torch.no_grad():
        t_bn.weight.copy_(torch.tensor(weight))
        t_bn.bias.copy_(torch.tensor(bias))
    g_bn.weight.data = graphc.tensor(weight.astype(np.float32))
    g_bn.bias.data = graphc.tensor(bias.astype(np.float32))
    g_bn.train(training)
    t_bn.train(training)

    def g_step(x, w):
        loss = (g_bn(x).relu() * w).sum()
        loss.backward()
        return loss

    step = graphc.compile(g_step, backend="cpu")
    for k in range(3):
        x = (3.0 + rng.standard_normal((4, c, 5, 7))).astype(np.float32)
        w = rng.standard_normal((4, c, 5, 7)).astype(np.float32)
        g_bn.zero_grad()
        gx = graphc.tensor(x, requires_grad=True)
        loss = step(gx, graphc.tensor(w))
        tx = torch.tensor(x, requires_grad=True)
        t_bn.zero_grad()
        t_loss = (t_bn(tx).relu() * torch.tensor(w)).sum()
        t_loss.backward()
        np.testing.assert_allclose(loss.numpy(), t_loss.item(), rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
        for name in ("weight", "bias"):
            np.testing.assert_allclose(getattr(g_bn, name).grad.numpy(),
                                       getattr(t_bn, name).grad.numpy(), rtol=1e-4, atol=1e-4)
        for name in ("running_mean", "running_var"):
            np.testing.assert_allclose(getattr(g_bn, name).numpy(),
                                       getattr(t_bn, name).numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name} after step {k}")


@pytest.mark.parametrize("op", ["batch_norm", "batch_norm_relu"])
@pytest.mark.parametrize("channels_a_block", [1, 2, 3, 7])
def test_channel_blocks_give_the_one_block_bits(op, channels_a_block, monkeypatch):
    """CHANNEL_BLOCK_BYTES: each block of channels' statistics walk, then its output walk; a
    channel's sums are added in the same order (image by image) whatever the blocks, so the
    result is one block's (the two walks over all of x) bit for bit, a partial last block
    included."""
    shape = (3, 7, 5, 4)
    plane_bytes = shape[0] * 5 * 4 * 4  # a channel's N planes of float32
    rng = np.random.default_rng(channels_a_block)
    args = [rng.uniform(-2, 5, shape).astype(np.float32)] + \
        [rng.uniform(0.5, 2, 7).astype(np.float32) for _ in range(4)]
    types = [(shape, "float32")] + [((7,), "float32")] * 4
    if op == "batch_norm_relu":
        args.append(rng.standard_normal(shape).astype(np.float32))
        types.append((shape, "float32"))
    results = []
    for block_bytes in (None, channels_a_block * plane_bytes):
        monkeypatch.setattr(batch_norm, "CHANNEL_BLOCK_BYTES", block_bytes)
        graph = one_op_graph(op, types, training=True, eps=1e-5)
        plan_buffers(graph)
        exe = CpuExecutable(graph)
        results.append(exe.run(*[a.copy() for a in args]))
        blocked = "block.head" in exe.lowered.ir_text
        assert blocked == (block_bytes is not None and channels_a_block < 7)
    for got, want in zip(*results):
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
