"""nn.utils.rnn (pad_sequence, pack_padded_sequence, pack_sequence, pad_packed_sequence) and
the recurrent layers on PackedSequences, against PyTorch: packed data, batch sizes, indices,
outputs, final states of each sequence, and gradients."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from graphc.nn.utils import rnn
from tests.conftest import torch_or_skip

torch = torch_or_skip()
trnn = torch.nn.utils.rnn


def _close(got, want, **kw):
    np.testing.assert_allclose(np.asarray(got.detach().numpy()), want.detach().numpy(),
                               rtol=kw.get("rtol", 1e-10), atol=1e-12)


@pytest.mark.parametrize("enforce_sorted,lengths", [(True, [4, 3, 1]), (False, [2, 4, 1]),
                                                    (False, [3, 3, 2])])
@pytest.mark.parametrize("batch_first", [False, True])
def test_pack_and_pad_match_torch(rng, enforce_sorted, lengths, batch_first):
    x = rng.standard_normal((3, 4, 2) if batch_first else (4, 3, 2))
    g_x, t_x = graphc.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    g = rnn.pack_padded_sequence(g_x, lengths, batch_first, enforce_sorted)
    t = trnn.pack_padded_sequence(t_x, torch.tensor(lengths), batch_first, enforce_sorted)
    _close(g.data, t.data)
    assert g.batch_sizes.tolist() == t.batch_sizes.tolist()
    for a, b in ((g.sorted_indices, t.sorted_indices), (g.unsorted_indices, t.unsorted_indices)):
        assert (a is None) == (b is None) and (a is None or a.tolist() == b.tolist())
    g_pad, g_len = rnn.pad_packed_sequence(g, batch_first, padding_value=-1.0, total_length=5)
    t_pad, t_len = trnn.pad_packed_sequence(t, batch_first, padding_value=-1.0, total_length=5)
    _close(g_pad, t_pad)
    assert g_len.tolist() == t_len.tolist()
    seed = rng.standard_normal(tuple(t_pad.shape))
    (g_pad * graphc.tensor(seed)).sum().backward()
    (t_pad * torch.tensor(seed)).sum().backward()
    _close(g_x.grad, t_x.grad)


@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_and_pack_sequence_match_torch(rng, side):
    arrays = [rng.standard_normal((n, 2)) for n in (3, 5, 1)]
    g = rnn.pad_sequence([graphc.tensor(a) for a in arrays], True, 7.0, side)
    t = trnn.pad_sequence([torch.tensor(a) for a in arrays], True, 7.0, side)
    _close(g, t)
    g = rnn.pack_sequence([graphc.tensor(a) for a in arrays], enforce_sorted=False)
    t = trnn.pack_sequence([torch.tensor(a) for a in arrays], enforce_sorted=False)
    _close(g.data, t.data)


LAYERS = [("LSTM", {}), ("GRU", {"num_layers": 2}), ("RNN", {"bidirectional": True}),
          ("LSTM", {"bidirectional": True, "num_layers": 2, "proj_size": 2})]


@pytest.mark.parametrize("name,kwargs", LAYERS, ids=[f"{n}-{k}" for n, k in LAYERS])
@pytest.mark.parametrize("with_state", [False, True])
def test_recurrent_layers_on_packed_sequences(rng, name, kwargs, with_state):
    t_layer = getattr(torch.nn, name)(3, 4, **kwargs).double()
    g_layer = getattr(nn, name)(3, 4, **kwargs).double()
    g_layer.load_state_dict({k: graphc.tensor(v.detach().numpy())
                             for k, v in t_layer.state_dict().items()})
    lengths = [3, 5, 2, 5]
    x = rng.standard_normal((5, 4, 3))
    g_x, t_x = graphc.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    g_in = rnn.pack_padded_sequence(g_x, lengths, enforce_sorted=False)
    t_in = trnn.pack_padded_sequence(t_x, torch.tensor(lengths), enforce_sorted=False)
    g_args, t_args = [g_in], [t_in]
    if with_state:
        layers = t_layer.num_layers * (2 if t_layer.bidirectional else 1)
        sizes = [t_layer.proj_size or 4] + ([4] if name == "LSTM" else [])
        states = [rng.standard_normal((layers, 4, size)) for size in sizes]
        g_state = [graphc.tensor(s, requires_grad=True) for s in states]
        t_state = [torch.tensor(s, requires_grad=True) for s in states]
        g_args.append(tuple(g_state) if name == "LSTM" else g_state[0])
        t_args.append(tuple(t_state) if name == "LSTM" else t_state[0])
    g_out, g_h = g_layer(*g_args)
    t_out, t_h = t_layer(*t_args)
    assert isinstance(g_out, rnn.PackedSequence)
    g_flat = [g_out.data, *(g_h if name == "LSTM" else (g_h,))]
    t_flat = [t_out.data, *(t_h if name == "LSTM" else (t_h,))]
    loss_g = loss_t = 0
    for a, b in zip(g_flat, t_flat):
        _close(a, b, rtol=1e-9)
        w = rng.standard_normal(tuple(b.shape))
        loss_g = loss_g + (a * graphc.tensor(w)).sum()
        loss_t = loss_t + (b * torch.tensor(w)).sum()
    loss_g.backward()
    loss_t.backward()
    _close(g_x.grad, t_x.grad, rtol=1e-9)
    if with_state:
        for a, b in zip(g_state, t_state):
            _close(a.grad, b.grad, rtol=1e-9)
    for a, b in zip(g_layer.parameters(), t_layer.parameters()):
        _close(a.grad, b.grad, rtol=1e-9)


def test_packing_errors():
    x = graphc.zeros(4, 3, 2)
    with pytest.raises(graphc.ArgumentError, match="must be sorted in decreasing order"):
        rnn.pack_padded_sequence(x, [2, 4, 1])
    with pytest.raises(graphc.ArgumentError, match="has to be greater than 0"):
        rnn.pack_padded_sequence(x, [2, 0, 1], enforce_sorted=False)
    with pytest.raises(graphc.ShapeError, match="longer than the 4 steps"):
        rnn.pack_padded_sequence(x, [5, 2, 1])
    with pytest.raises(graphc.ArgumentError, match="padding_side"):
        rnn.pad_sequence([graphc.ones(2)], padding_side="middle")


def test_packed_lstm_training_step_compiles(rng):
    """Packing inside a compiled step: the lengths are Python data, so the trace fixes them;
    the compiled step gives the eager step's loss and gradients."""
    x = graphc.tensor(rng.standard_normal((6, 3, 2)).astype(np.float32))

    def make():
        graphc.manual_seed(0)
        return nn.LSTM(2, 5)

    def step(layer, x):
        out, (h, _) = layer(rnn.pack_padded_sequence(x, [4, 6, 1], enforce_sorted=False))
        loss = (out.data * out.data).mean() + h.sum()
        loss.backward()
        return loss

    eager_layer, compiled_layer = make(), make()
    want = step(eager_layer, x)
    got = graphc.compile(step)(compiled_layer, x)
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-5)
    for (k, a), (_, b) in zip(compiled_layer.named_parameters(), eager_layer.named_parameters()):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=k)
