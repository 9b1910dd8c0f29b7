"""graphc.nn.functional's vision functions (graphc/nn/functional_vision.py) against PyTorch:
forward values and input (and weight) gradients in float64, error wording, and a compiled
(cpu) run of the decompositions against eager."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
from tests.conftest import torch_or_skip

torch = torch_or_skip()
TF = torch.nn.functional


def compare(rng, name, shapes, *args, g_fn=None, t_fn=None, rtol=1e-10, atol=1e-12, **kwargs):
    """Run F.<name> and torch's on the same float64 inputs; compare outputs and gradients."""
    g_fn = g_fn or getattr(F, name)
    t_fn = t_fn or getattr(TF, name)
    arrays = [rng.standard_normal(s) for s in shapes]
    g_in = [graphc.tensor(a, requires_grad=True) for a in arrays]
    t_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    g_out = g_fn(*g_in, *args, **kwargs)
    t_out = t_fn(*t_in, *args, **kwargs)
    assert tuple(g_out.shape) == tuple(t_out.shape)
    np.testing.assert_allclose(g_out.detach().numpy(), t_out.detach().numpy(), rtol=rtol,
                               atol=atol, err_msg=f"{name} forward")
    seed = rng.standard_normal(tuple(t_out.shape))
    g_out.backward(graphc.tensor(seed))
    t_out.backward(torch.tensor(seed))
    for k, (g, t) in enumerate(zip(g_in, t_in)):
        np.testing.assert_allclose(g.grad.numpy(), t.grad.numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"{name} gradient of input {k}")


ACTIVATIONS = [
    ("relu6", {}), ("hardtanh", {}), ("hardtanh", {"min_val": -0.5, "max_val": 2.0}),
    ("hardswish", {}), ("hardsigmoid", {}), ("silu", {}), ("mish", {}), ("elu", {}),
    ("elu", {"alpha": 0.3}), ("softplus", {}), ("softplus", {"beta": 2.0, "threshold": 1.0}),
]


@pytest.mark.parametrize("name,kwargs", ACTIVATIONS, ids=[f"{n}-{k}" for n, k in ACTIVATIONS])
def test_activations(rng, name, kwargs):
    def scaled(fn):
        return lambda x, **kw: fn(x * 4, **kw)  # reach every branch (|x| > 3, > 6, > 20/beta)

    # torch's float64 hardsigmoid/hardswish kernels scale by a float32 1/6 (rounding 3e-8)
    rtol = 1e-7 if name.startswith("hard") else 1e-10
    compare(rng, name, [(3, 4, 5)], g_fn=scaled(getattr(F, name)),
            t_fn=scaled(getattr(TF, name)), rtol=rtol, **kwargs)


@pytest.mark.parametrize("name", ["relu6", "hardtanh", "hardswish", "hardsigmoid", "elu"])
def test_activation_gradients_at_the_kinks(name):
    points = [-3.0, -1.0, 0.0, 1.0, 3.0, 6.0]
    g = graphc.tensor(points, dtype=graphc.float64, requires_grad=True)
    t = torch.tensor(points, dtype=torch.float64, requires_grad=True)
    getattr(F, name)(g).sum().backward()
    getattr(TF, name)(t).sum().backward()
    np.testing.assert_allclose(g.grad.numpy(), t.grad.numpy(), err_msg=name)


@pytest.mark.parametrize("name", ["relu6", "hardswish", "silu", "elu", "mish", "hardsigmoid"])
def test_inplace_activations(rng, name):
    x = rng.standard_normal((4, 5)) * 4
    g, t = graphc.tensor(x), torch.tensor(x)
    out = getattr(F, name)(g, inplace=True)
    getattr(TF, name)(t, inplace=True)
    assert out is g
    np.testing.assert_allclose(g.numpy(), t.numpy(), rtol=1e-12)


@pytest.mark.parametrize("channels,shape", [(1, (2, 3, 4)), (3, (2, 3, 4, 4)), (1, (5,))])
def test_prelu(rng, channels, shape):
    compare(rng, "prelu", [shape, (channels,)])


@pytest.mark.parametrize("name", ["adaptive_avg_pool2d", "adaptive_max_pool2d"])
@pytest.mark.parametrize("shape,size", [((2, 3, 8, 8), 1), ((2, 3, 8, 6), (4, 3)),
                                        ((2, 3, 7, 5), (3, 2)), ((3, 7, 9), (4, None)),
                                        ((1, 2, 5, 5), (7, 5))])
def test_adaptive_pool2d(rng, name, shape, size):
    compare(rng, name, [shape], size)


@pytest.mark.parametrize("name", ["adaptive_avg_pool1d", "adaptive_max_pool1d"])
def test_adaptive_pool1d(rng, name):
    compare(rng, name, [(2, 3, 10)], 4)


@pytest.mark.parametrize("shape,size", [((2, 3, 8, 6), (4, 3)), ((2, 3, 7, 5), (3, 2)),
                                        ((3, 7, 9), (4, None)), ((1, 2, 5, 5), (7, 5)),
                                        ((2, 3, 10), 4), ((2, 3, 10), 3)])
def test_adaptive_max_pool_indices(rng, shape, size):
    """Indices as PyTorch's (ties included: rounded inputs repeat values) and the gradient
    routed to the chosen position only."""
    name = "adaptive_max_pool1d" if len(shape) == 3 and not isinstance(size, tuple) \
        else "adaptive_max_pool2d"
    x = np.round(rng.standard_normal(shape))
    g_x, t_x = graphc.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    g_values, g_indices = getattr(F, name)(g_x, size, return_indices=True)
    t_values, t_indices = getattr(TF, name)(t_x, size, return_indices=True)
    np.testing.assert_array_equal(g_indices.numpy(), t_indices.numpy())
    np.testing.assert_array_equal(g_values.detach().numpy(), t_values.detach().numpy())
    seed = rng.standard_normal(tuple(t_values.shape))
    g_values.backward(graphc.tensor(seed))
    t_values.backward(torch.tensor(seed))
    np.testing.assert_allclose(g_x.grad.numpy(), t_x.grad.numpy(), rtol=1e-12)
    assert nn.AdaptiveMaxPool2d(2, return_indices=True)(graphc.ones(1, 4, 4))[1].dtype \
        == graphc.int64


CONV_T = [
    dict(), dict(stride=2), dict(stride=2, padding=1, output_padding=1),
    dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2)), dict(groups=2),
    dict(dilation=2, padding=2), dict(stride=2, dilation=3, output_padding=2),
]


@pytest.mark.parametrize("kwargs", CONV_T, ids=[str(k) for k in CONV_T])
def test_conv_transpose2d(rng, kwargs):
    groups = kwargs.get("groups", 1)
    compare(rng, "conv_transpose2d", [(2, 4, 5, 4), (4, 6 // groups, 3, 3), (6,)], **kwargs)
    compare(rng, "conv_transpose2d", [(4, 5, 4), (4, 6 // groups, 3, 2)], **kwargs)


@pytest.mark.parametrize("kwargs", [dict(), dict(stride=2, padding=1), dict(groups=2),
                                    dict(padding="same", dilation=2), dict(dilation=2)])
def test_conv1d(rng, kwargs):
    groups = kwargs.get("groups", 1)
    compare(rng, "conv1d", [(2, 4, 11), (6, 4 // groups, 3), (6,)], **kwargs)
    compare(rng, "conv1d", [(4, 11), (6, 4 // groups, 3)], **kwargs)


def test_conv_transpose1d(rng):
    compare(rng, "conv_transpose1d", [(2, 4, 7), (4, 3, 3), (3,)], stride=2, padding=1,
            output_padding=1)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("shape,pads", [((2, 3, 5), (2, 1)), ((2, 3, 5, 6), (1, 2, 3, 0)),
                                        ((3, 5, 6), (2, 2, 1, 1)),
                                        ((1, 2, 3, 4, 5), (1, 1, 0, 2, 2, 1)),
                                        ((2, 3, 5), (-1, 2)), ((2, 3, 5, 6), (2, -1, -2, 1))])
def test_pad_modes(rng, mode, shape, pads):
    compare(rng, "pad", [shape], pads, mode=mode)


def test_pad_errors():
    with pytest.raises(graphc.ArgumentError, match="Padding size should be less than"):
        F.pad(graphc.ones(1, 1, 3, 3), (3, 3, 0, 0), mode="reflect")
    with pytest.raises(graphc.ArgumentError, match="Padding size 2 is not supported for 4D"):
        F.pad(graphc.ones(1, 1, 3, 3), (1, 1), mode="reflect")
    with pytest.raises(graphc.ArgumentError, match="wrapping around more than once"):
        F.pad(graphc.ones(1, 1, 3, 3), (4, 4, 0, 0), mode="circular")
    with pytest.raises(graphc.ArgumentError, match="Padding length must be divisible by 2"):
        F.pad(graphc.ones(1, 1, 3, 3), (1,), mode="replicate")
    F.pad(graphc.ones(1, 1, 3, 3), (1, 1), value=2.0)  # constant mode is unchanged


INTERP = [
    dict(scale_factor=2), dict(size=(5, 7)), dict(scale_factor=(1.5, 0.5)),
    dict(scale_factor=2, mode="bilinear"), dict(size=(5, 9), mode="bilinear"),
    dict(scale_factor=2, mode="bilinear", align_corners=True),
    dict(size=(3, 2), mode="bilinear", align_corners=True), dict(size=(3, 2), mode="area"),
    dict(scale_factor=1.7, mode="nearest-exact"),
    dict(scale_factor=2, mode="bicubic"), dict(size=(3, 9), mode="bicubic"),
    dict(size=(7, 4), mode="bicubic", align_corners=True),
    dict(scale_factor=(0.6, 1.5), mode="bicubic"),
]


@pytest.mark.parametrize("kwargs", INTERP, ids=[str(k) for k in INTERP])
def test_interpolate(rng, kwargs):
    compare(rng, "interpolate", [(2, 3, 4, 6)], **kwargs)


def test_interpolate_linear_1d(rng):
    compare(rng, "interpolate", [(2, 3, 5)], scale_factor=3, mode="linear")
    compare(rng, "interpolate", [(2, 3, 5)], size=8, mode="linear", align_corners=True)


def test_interpolate_trilinear(rng):
    compare(rng, "interpolate", [(1, 2, 3, 4, 5)], scale_factor=2, mode="trilinear")
    compare(rng, "interpolate", [(1, 2, 3, 4, 5)], size=(2, 7, 3), mode="trilinear",
            align_corners=True)
    with pytest.raises(graphc.ArgumentError, match="trilinear mode needs 5D input"):
        F.interpolate(graphc.ones(1, 1, 3, 3), scale_factor=2, mode="trilinear")


def test_dropout2d_zeroes_whole_channels():
    graphc.manual_seed(0)
    x = graphc.ones(8, 16, 3, 3)
    y = F.dropout2d(x, 0.5).numpy()
    per_channel = y.reshape(8, 16, 9)
    assert np.all((per_channel == 0).all(-1) | (per_channel == 2).all(-1))
    assert 0 < (per_channel == 0).all(-1).sum() < 8 * 16
    assert F.dropout2d(x, 0.5, training=False) is x
    with pytest.raises(graphc.ArgumentError, match="between 0 and 1"):
        F.dropout2d(x, 1.5)


def test_compiled_matches_eager(rng):
    """The decompositions trace into graphs the cpu backend compiles, forward and backward."""
    w = graphc.tensor(rng.standard_normal((3, 4, 3, 3)), requires_grad=True)

    def f(x):
        y = F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1)
        y = F.hardswish(F.pad(y, (1, 1, 2, 0), mode="reflect"))
        y = F.interpolate(F.adaptive_avg_pool2d(y, (3, 5)), scale_factor=2, mode="bilinear")
        y = F.mish(F.silu(F.relu6(y))) + F.elu(y) + F.softplus(y)
        return F.adaptive_max_pool2d(y, 1).sum() + F.interpolate(y, size=(4, 4)).sum()

    x = rng.standard_normal((2, 3, 5, 6))
    gx = graphc.tensor(x, requires_grad=True)
    eager = f(gx)
    eager.backward()
    want_x, want_w = gx.grad.numpy().copy(), w.grad.numpy().copy()
    w.grad = None

    def step(x):
        loss = f(x)
        loss.backward()
        return loss

    cx = graphc.tensor(x, requires_grad=True)
    got = graphc.compile(step, backend="cpu")(cx)
    np.testing.assert_allclose(got.item(), eager.item(), rtol=1e-5)
    np.testing.assert_allclose(cx.grad.numpy(), want_x, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w.grad.numpy(), want_w, rtol=1e-4, atol=1e-5)
