"""The CPU backend's image ops (graphc.backends.cpu.conv): conv2d and its two gradients,
max/avg pooling and their gradients, batch_norm, each compiled and compared with the
interpreter over strides, padding, dilation, groups, ceil_mode, the divisor rules and
unbatched inputs; fused conv epilogues; strided views; the LeNet-5 (BatchNorm2d) training
step compiled for the cpu backend against the interpreter."""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
from graphc import nn  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.errors import GraphcError  # noqa: E402
from graphc.ops.conv import conv_output_hw  # noqa: E402
from graphc.ops.registry import REGISTRY  # noqa: E402
from graphc.passes.fuse import fuse  # noqa: E402
from tests.conftest import sgd_training_step  # noqa: E402
from tests.test_cpu_backend import compare, one_op_graph, sample  # noqa: E402


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


DTYPES = ["float32", "float64"]

# ---- convolution -----------------------------------------------------------------------------
# (input shape, weight shape, stride, padding, dilation, groups)
CONVS = [
    ((2, 3, 7, 8), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((2, 4, 9, 7), (6, 2, 3, 2), (2, 1), (1, 0), (1, 2), 2),
    ((3, 5, 6), (4, 3, 2, 2), (2, 2), (0, 0), (1, 1), 1),  # unbatched
    ((2, 4, 5, 5), (6, 2, 1, 1), (1, 1), (0, 0), (1, 1), 2),  # pointwise: no im2col
    ((2, 4, 6, 5), (3, 4, 1, 1), (2, 2), (0, 0), (1, 1), 1),  # 1x1 with a stride
    ((2, 4, 6, 6), (4, 1, 3, 3), (1, 1), (1, 1), (1, 1), 4),  # depthwise
    ((1, 2, 4, 4), (3, 2, 3, 3), (1, 2), (2, 2), (2, 2), 1),  # more padding than input
    ((6, 7, 6), (4, 3, 5, 3), (3, 1), (2, 1), (1, 1), 2),  # unbatched, groups
]


def _conv_attrs(stride, padding, dilation, groups):
    return dict(stride=stride, padding=padding, dilation=dilation, groups=groups)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CONVS)))
def test_conv2d_and_its_gradients_match_the_interpreter(case, dtype, rng):
    xs, ws, stride, padding, dilation, groups = CONVS[case]
    attrs = _conv_attrs(stride, padding, dilation, groups)
    out_hw = conv_output_hw(xs[-2:], ws[2:], stride, padding, dilation)
    gs = xs[:-3] + (ws[0],) + out_hw
    x, w, gy = sample(rng, xs, dtype), sample(rng, ws, dtype), sample(rng, gs, dtype)
    compare(one_op_graph("conv2d", [(xs, dtype), (ws, dtype)], **attrs), [x, w])
    compare(one_op_graph("conv2d_input_grad", [(gs, dtype), (ws, dtype)],
                         input_hw=xs[-2:], **attrs), [gy, w])
    compare(one_op_graph("conv2d_weight_grad", [(gs, dtype), (xs, dtype)],
                         kernel_size=ws[2:], **attrs), [gy, x])


def test_conv2d_weight_grad_of_an_empty_batch_is_zero(rng):
    attrs = _conv_attrs((1, 1), (1, 1), (1, 1), 1)
    g = one_op_graph("conv2d_weight_grad", [((0, 4, 5, 5), "float32"),
                                            ((0, 3, 5, 5), "float32")],
                     kernel_size=(3, 3), **attrs)
    exe = compare(g, [np.zeros((0, 4, 5, 5), np.float32), np.zeros((0, 3, 5, 5), np.float32)])
    assert exe.run(np.zeros((0, 4, 5, 5), np.float32),
                   np.zeros((0, 3, 5, 5), np.float32))[0].shape == (4, 3, 3, 3)


def test_conv_with_fused_bias_relu_and_strided_views(rng):
    def f(x, w, bias, w2):
        y = graphc.conv2d(x.permute(0, 1, 3, 2), w, bias, padding=1).relu()
        z = graphc.conv2d(x[:, :, ::2, 1:], w2, stride=(1, 2))
        return y, z, graphc.max_pool2d(x[:, 1:, :, ::2], 2, ceil_mode=True)

    x = graphc.tensor(sample(rng, (2, 3, 9, 8), "float32"))
    w = graphc.tensor(sample(rng, (5, 3, 3, 3), "float32"))
    bias = graphc.tensor(sample(rng, (5,), "float32"))
    w2 = graphc.tensor(sample(rng, (4, 3, 2, 2), "float32"))
    g = fuse(graphc.trace(f, x, w, bias, w2))
    assert any(n.op == "fused" and n.attrs["body"][0][0] == "conv2d" for n in g.nodes)
    compare(g, [t.numpy() for t in (x, w, bias, w2)])


# ---- pooling ---------------------------------------------------------------------------------
# (input shape, kernel, stride, padding, dilation, ceil_mode)
MAX_POOLS = [
    ((2, 3, 8, 8), (2, 2), (2, 2), (0, 0), (1, 1), False),
    ((2, 3, 9, 7), (3, 3), (2, 2), (1, 1), (1, 1), True),
    ((3, 10, 9), (3, 2), (1, 2), (1, 1), (2, 1), True),  # unbatched, dilation
    ((1, 2, 5, 5), (2, 2), (3, 3), (0, 0), (1, 1), True),  # partial last windows
    ((2, 2, 7, 6), (3, 3), (1, 1), (1, 1), (1, 1), False),  # overlapping windows
]


def _pool_input(rng, shape, dtype):
    """Few distinct values (ties), with NaN and -inf sprinkled in for floats."""
    x = rng.integers(-3, 4, shape).astype(dtype)
    if dtype != "int64":
        flat = x.reshape(-1)
        flat[rng.random(flat.size) < 0.05] = np.nan
        flat[rng.random(flat.size) < 0.1] = -np.inf
    return x


@pytest.mark.parametrize("dtype", DTYPES + ["int64"])
@pytest.mark.parametrize("case", range(len(MAX_POOLS)))
def test_max_pool2d_values_and_indices_match_exactly(case, dtype, rng):
    shape, k, s, p, d, ceil = MAX_POOLS[case]
    attrs = dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil)
    x = _pool_input(rng, shape, dtype)
    exe = compare(one_op_graph("max_pool2d", [(shape, dtype)], **attrs), [x])
    values, indices = exe.run(x)
    want_v, want_i = REGISTRY["max_pool2d"].kernel(x, **attrs)
    np.testing.assert_array_equal(indices, want_i)  # ties: the first maximum; NaN wins
    np.testing.assert_array_equal(values, want_v)
    if dtype == "int64":
        return
    # the gradient: scatter-add by the indices (windows overlap: indices repeat)
    g = sample(rng, want_i.shape, dtype)
    compare(one_op_graph("max_pool2d_grad", [(want_i.shape, dtype), (want_i.shape, "int64")],
                         input_hw=shape[-2:]), [g, want_i])


def test_max_pool2d_grad_refuses_an_index_outside_the_plane(rng):
    g = one_op_graph("max_pool2d_grad", [((1, 2, 2, 2), "float32"), ((1, 2, 2, 2), "int64")],
                     input_hw=(4, 4))
    exe = CpuExecutable(g)
    idx = np.zeros((1, 2, 2, 2), np.int64)
    idx[0, 1, 1, 0] = 16
    with pytest.raises(GraphcError, match="out of the 4x4 plane"):
        exe.run(np.ones((1, 2, 2, 2), np.float32), idx)


# (input shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
AVG_POOLS = [
    ((2, 3, 8, 8), (2, 2), (2, 2), (0, 0), False, True, None),
    ((2, 3, 9, 7), (3, 3), (2, 2), (1, 1), True, False, None),
    ((2, 3, 9, 7), (3, 3), (2, 2), (1, 1), True, True, None),
    ((3, 10, 9), (3, 2), (1, 2), (1, 1), False, True, 5),  # unbatched, override
    ((1, 2, 5, 5), (2, 2), (3, 3), (0, 0), True, True, None),  # windows past the input
    ((2, 2, 7, 6), (3, 3), (1, 1), (1, 1), False, False, None),  # overlapping windows
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(AVG_POOLS)))
def test_avg_pool2d_and_its_gradient_match_the_interpreter(case, dtype, rng):
    shape, k, s, p, ceil, cip, div = AVG_POOLS[case]
    attrs = dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil, count_include_pad=cip,
                 divisor_override=div)
    x = sample(rng, shape, dtype)
    exe = compare(one_op_graph("avg_pool2d", [(shape, dtype)], **attrs), [x])
    out_shape = exe.run(x)[0].shape
    g = sample(rng, out_shape, dtype)
    compare(one_op_graph("avg_pool2d_grad", [(out_shape, dtype)], input_hw=shape[-2:],
                         **attrs), [g])


# ---- batch_norm ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_forward_matches_the_interpreter(training, dtype, rng):
    for shape in ((4, 3, 5, 6), (6, 4), (2, 3, 7)):
        c = shape[1]
        x = sample(rng, shape, dtype, -2, 5)
        w, b, rm = (sample(rng, (c,), dtype) for _ in range(3))
        rv = sample(rng, (c,), dtype, 0.5, 2)
        g = one_op_graph("batch_norm", [(shape, dtype)] + [((c,), dtype)] * 4,
                         training=training, eps=1e-5)
        compare(g, [x, w, b, rm, rv])


# ---- LeNet-5 training step -------------------------------------------------------------------
def lenet5_bn():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10))


def _median_ms(fn, repeat=15) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def test_lenet5_training_step_tracks_the_interpreter(rng):
    def make():
        return sgd_training_step(lenet5_bn)

    (m_cpu, s_cpu), (m_ref, s_ref) = make(), make()
    s_cpu, s_ref = graphc.compile(s_cpu, backend="cpu"), graphc.compile(s_ref, backend="interp")
    data = [(graphc.tensor(sample(rng, (64, 1, 28, 28), "float32")),
             graphc.tensor(rng.integers(0, 10, 64))) for _ in range(5)]
    for x, y in data:
        np.testing.assert_allclose(s_cpu(x, y).detach().numpy(), s_ref(x, y).detach().numpy(),
                                   rtol=1e-5)
    assert isinstance(s_cpu.executable, CpuExecutable)
    for a, b in zip(m_cpu.parameters(), m_ref.parameters()):
        a, b = a.detach().numpy(), b.detach().numpy()
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()))
    for a, b in zip(m_cpu.buffers(), m_ref.buffers()):  # BatchNorm's running statistics
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)

    x, y = data[0]
    m_cpu.eval()
    m_ref.eval()
    f_cpu = graphc.compile(m_cpu, backend="cpu")
    f_ref = graphc.compile(m_ref, backend="interp")
    with graphc.no_grad():
        np.testing.assert_allclose(f_cpu(x).numpy(), f_ref(x).numpy(), rtol=1e-5, atol=1e-5)
        fwd_cpu = _median_ms(lambda: f_cpu(x))
        fwd_ref = _median_ms(lambda: f_ref(x), 5)
    m_cpu.train()
    m_ref.train()
    step_cpu = _median_ms(lambda: s_cpu(x, y))  # the models part ways from here
    step_ref = _median_ms(lambda: s_ref(x, y), 5)
    print(f"\nLeNet-5 (BatchNorm2d) b64, medians: training step cpu {step_cpu:.2f} ms vs "
          f"interp {step_ref:.2f} ms ({step_ref / step_cpu:.1f}x); forward (eval) cpu "
          f"{fwd_cpu:.2f} ms vs interp {fwd_ref:.2f} ms ({fwd_ref / fwd_cpu:.1f}x)")
