"""The issue-12 layers (activations, conv, adaptive pooling, padding, resizing, channel dropout,
recurrent layers and cells) against torch.nn: same state_dict keys and shapes, forward values,
input and parameter gradients in float64 (weights copied from the torch layer), and a compiled
(cpu) LSTM/GRU training step against eager."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from tests.conftest import torch_or_skip
from tests.test_layers import check_layer

torch = torch_or_skip()


def pair(name, *args, **kwargs):
    torch.manual_seed(0)
    return getattr(nn, name)(*args, **kwargs), getattr(torch.nn, name)(*args, **kwargs)


LAYERS = [
    ("ReLU6", (), {}, (2, 3, 4)), ("Hardtanh", (-0.5, 0.5), {}, (2, 5)),
    ("Hardswish", (), {}, (2, 3, 4)), ("Hardsigmoid", (), {}, (2, 3, 4)), ("SiLU", (), {}, (3, 4)),
    ("Mish", (), {}, (3, 4)), ("ELU", (), {"alpha": 0.5}, (3, 4)), ("Softplus", (), {}, (3, 4)),
    ("PReLU", (), {}, (2, 3, 4)), ("PReLU", (3,), {}, (2, 3, 4, 4)),
    ("Conv1d", (3, 4, 3), {"padding": 1}, (2, 3, 9)),
    ("Conv1d", (4, 4, 3), {"groups": 2, "stride": 2, "padding_mode": "reflect", "padding": 1},
     (2, 4, 9)),
    ("Conv2d", (3, 4, 3), {"padding": 1, "padding_mode": "circular"}, (2, 3, 5, 5)),
    ("Conv2d", (3, 4, 3), {"padding": "same", "padding_mode": "replicate"}, (2, 3, 5, 5)),
    ("ConvTranspose2d", (4, 3, 4), {"stride": 2, "padding": 1}, (2, 4, 3, 3)),
    ("ConvTranspose2d", (4, 6, 3), {"stride": 2, "groups": 2, "output_padding": 1,
                                    "bias": False}, (2, 4, 3, 3)),
    ("ConvTranspose1d", (4, 3, 3), {"stride": 2}, (2, 4, 5)),
    ("AdaptiveAvgPool2d", ((1, 1),), {}, (2, 3, 5, 5)),
    ("AdaptiveAvgPool2d", (3,), {}, (2, 3, 7, 5)),
    ("AdaptiveMaxPool2d", ((2, None),), {}, (2, 3, 6, 5)),
    ("AdaptiveAvgPool1d", (2,), {}, (2, 3, 7)),
    ("ReflectionPad2d", ((1, 2, 0, 1),), {}, (2, 3, 4, 4)),
    ("ReplicationPad1d", (2,), {}, (2, 3, 4)),
    ("CircularPad2d", (1,), {}, (1, 2, 3, 3)), ("ZeroPad2d", ((1, 0, 2, 1),), {}, (1, 2, 3, 3)),
    ("ConstantPad1d", (2, 1.5), {}, (2, 3)),
    ("Upsample", (), {"scale_factor": 2}, (1, 2, 3, 3)),
    ("Upsample", (), {"size": (5, 4), "mode": "bilinear"}, (1, 2, 3, 3)),
    ("UpsamplingBilinear2d", (), {"scale_factor": 2}, (1, 2, 3, 3)),
    ("UpsamplingNearest2d", (), {"size": 5}, (1, 2, 3, 3)),
]


@pytest.mark.parametrize("name,args,kwargs,shape", LAYERS,
                         ids=[f"{n}-{a}-{k}" for n, a, k, _ in LAYERS])
def test_layer_matches_torch(rng, name, args, kwargs, shape):
    g, t = pair(name, *args, **kwargs)
    assert repr(g) == repr(t)
    assert {k: tuple(v.shape) for k, v in g.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in t.state_dict().items()}
    check_layer(rng, g, t, rng.standard_normal(shape) * 3)


def test_conv_transpose_output_size(rng):
    g, t = pair("ConvTranspose2d", 2, 3, 3, stride=2, padding=1)
    g.load_state_dict(t.state_dict())
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    got = g(graphc.tensor(x), output_size=(8, 8))
    want = t(torch.tensor(x), output_size=(8, 8))
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(graphc.ArgumentError, match="valid sizes range from 7 to 8"):
        g(graphc.tensor(x), output_size=(9, 9))


def test_default_init_within_torch_bounds():
    graphc.manual_seed(0)
    for g in (nn.ConvTranspose2d(8, 4, 3), nn.Conv1d(8, 4, 3), nn.LSTM(5, 6), nn.GRUCell(5, 6)):
        for name, p in g.named_parameters():
            if isinstance(g, (nn.LSTM, nn.GRUCell)):
                bound = 1 / np.sqrt(6)
            elif name == "weight":
                bound = 1 / np.sqrt(p[0].numel())
            else:
                bound = 1 / np.sqrt(g.weight[0].numel())
            assert np.abs(p.detach().numpy()).max() <= bound + 1e-7, name
            if p.numel() >= 16:  # the spread of 4 uniform draws can be anything
                assert p.detach().numpy().std() > bound / 4, name


def test_dropout2d_module():
    g = nn.Dropout2d(0.5)
    x = graphc.ones(4, 8, 2, 2)
    y = g(x).numpy().reshape(4, 8, 4)
    assert np.all((y == 0).all(-1) | (y == 2).all(-1))
    g.eval()
    assert g(x) is x


RNNS = [
    ("LSTM", (3, 5), {}), ("LSTM", (3, 5, 2), {"batch_first": True}),
    ("LSTM", (3, 5), {"bidirectional": True, "num_layers": 2}), ("LSTM", (3, 5), {"bias": False}),
    ("LSTM", (3, 5), {"proj_size": 2}),
    ("LSTM", (3, 5, 2), {"proj_size": 3, "bidirectional": True, "batch_first": True}),
    ("GRU", (3, 5, 2), {"bidirectional": True}), ("GRU", (3, 5), {"batch_first": True}),
    ("RNN", (3, 5), {"nonlinearity": "relu"}), ("RNN", (3, 5, 2, "tanh", True, True), {}),
]


@pytest.mark.parametrize("name,args,kwargs", RNNS, ids=[f"{n}-{a}-{k}" for n, a, k in RNNS])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("unbatched", [False, True])
def test_recurrent_layers_match_torch(rng, name, args, kwargs, with_state, unbatched):
    g, t = pair(name, *args, **kwargs)
    assert list(g.state_dict()) == list(t.state_dict())
    assert repr(g) == repr(t)
    g.load_state_dict(t.state_dict())
    g.double()
    t.double()
    batch_first = t.batch_first
    shape = (4, 3) if unbatched else ((2, 4, 3) if batch_first else (4, 2, 3))
    x = rng.standard_normal(shape)
    gx, tx = graphc.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    g_args, t_args = [gx], [tx]
    if with_state:
        layers = t.num_layers * (2 if t.bidirectional else 1)
        sizes = [t.proj_size or 5] + ([5] if name == "LSTM" else [])  # h (projected), c
        states = [rng.standard_normal((layers, size) if unbatched else (layers, 2, size))
                  for size in sizes]
        g_state = [graphc.tensor(s, requires_grad=True) for s in states]
        t_state = [torch.tensor(s, requires_grad=True) for s in states]
        g_args.append(tuple(g_state) if name == "LSTM" else g_state[0])
        t_args.append(tuple(t_state) if name == "LSTM" else t_state[0])
    g_out, g_h = g(*g_args)
    t_out, t_h = t(*t_args)
    g_flat = [g_out, *(g_h if name == "LSTM" else (g_h,))]
    t_flat = [t_out, *(t_h if name == "LSTM" else (t_h,))]
    loss_g, loss_t = 0, 0
    for a, b in zip(g_flat, t_flat):
        assert tuple(a.shape) == tuple(b.shape)
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10,
                                   atol=1e-12)
        w = rng.standard_normal(tuple(b.shape))
        loss_g = loss_g + (a * graphc.tensor(w)).sum()
        loss_t = loss_t + (b * torch.tensor(w)).sum()
    loss_g.backward()
    loss_t.backward()
    np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy(), rtol=1e-9, atol=1e-12)
    if with_state:
        for a, b in zip(g_state, t_state):
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-9, atol=1e-12)
    for (k, a), (_, b) in zip(g.named_parameters(), t.named_parameters()):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=k)


@pytest.mark.parametrize("name,kwargs", [("LSTMCell", {}), ("GRUCell", {}), ("RNNCell", {}),
                                         ("RNNCell", {"nonlinearity": "relu", "bias": False})])
@pytest.mark.parametrize("unbatched", [False, True])
def test_cells_match_torch(rng, name, kwargs, unbatched):
    g, t = pair(name, 3, 4, **kwargs)
    assert list(g.state_dict()) == list(t.state_dict())
    shape = (3,) if unbatched else (2, 3)
    hshape = (4,) if unbatched else (2, 4)
    g.load_state_dict(t.state_dict())
    g.double()
    t.double()
    x = rng.standard_normal(shape)
    states = [rng.standard_normal(hshape) for _ in range(2 if name == "LSTMCell" else 1)]
    for hx in (None, states):
        gx, tx = graphc.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        g_hx = t_hx = None
        if hx is not None:
            g_hx = tuple(graphc.tensor(s) for s in hx)
            t_hx = tuple(torch.tensor(s) for s in hx)
            if name != "LSTMCell":
                g_hx, t_hx = g_hx[0], t_hx[0]
        g_out, t_out = g(gx, g_hx), t(tx, t_hx)
        g_out = g_out if name == "LSTMCell" else (g_out,)
        t_out = t_out if name == "LSTMCell" else (t_out,)
        for a, b in zip(g_out, t_out):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10)
        sum(o.sum() for o in g_out).backward()
        sum(o.sum() for o in t_out).backward()
        np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_rnn_errors_match_torch():
    with pytest.raises(graphc.ShapeError, match="input.size\\(-1\\) must be equal to input_size"):
        nn.LSTM(3, 4)(graphc.ones(5, 2, 2))
    with pytest.raises(graphc.ShapeError, match="Expected hidden size"):
        nn.GRU(3, 4)(graphc.ones(5, 2, 3), graphc.zeros(1, 3, 4))
    with pytest.raises(graphc.ArgumentError, match="Unknown nonlinearity"):
        nn.RNN(3, 4, nonlinearity="gelu")
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        nn.LSTM(3, 4, dropout=0.5)
    for name, proj, message in [("GRU", 2, "only supported for LSTM"),
                                ("LSTM", 4, "has to be smaller than hidden_size"),
                                ("LSTM", -1, "positive integer or zero")]:
        with pytest.raises(graphc.ArgumentError, match=message):
            getattr(nn, name)(3, 4, proj_size=proj)
        with pytest.raises(ValueError, match=message):
            getattr(torch.nn, name)(3, 4, proj_size=proj)


@pytest.mark.parametrize("name", ["LSTM", "GRU"])
def test_compiled_recurrent_step_matches_eager(rng, name):
    """A whole training step of a 2-layer recurrent net traces (unrolled) and compiles on cpu."""
    x = graphc.tensor(rng.standard_normal((6, 3, 4)).astype(np.float32))

    def make():
        graphc.manual_seed(0)
        net = getattr(nn, name)(4, 8, num_layers=2)
        opt = graphc.optim.SGD(net.parameters(), lr=0.1)

        def step(x):
            opt.zero_grad()
            out, _ = net(x)
            loss = (out ** 2).mean()
            loss.backward()
            opt.step()
            return loss

        return net, step

    eager_net, eager_step = make()
    comp_net, comp_step = make()
    comp_step = graphc.compile(comp_step, backend="cpu")
    for _ in range(3):
        want, got = eager_step(x), comp_step(x)
        np.testing.assert_allclose(got.item(), want.item(), rtol=1e-5)
    for (k, a), (_, b) in zip(eager_net.named_parameters(), comp_net.named_parameters()):
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-4,
                                   atol=1e-6, err_msg=k)
