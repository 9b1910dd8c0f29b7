"""Recurrent layers, as torch.nn: `RNN`, `LSTM`, `GRU` (num_layers, bias, batch_first, dropout,
bidirectional, initial states; LSTM's proj_size) and the single-step `RNNCell`, `LSTMCell`,
`GRUCell`.

Parameter names, shapes, order and init are PyTorch's (`weight_ih_l0`, `weight_hh_l0`,
`bias_ih_l0`, `bias_hh_l0`, `weight_hr_l0` with proj_size, then `..._reverse` for the backward
direction; every tensor uniform in [-1/sqrt(hidden_size), 1/sqrt(hidden_size)]), so
state_dicts interchange.

The layers are Python loops over time of `linear` + sigmoid/tanh: eagerly they run op by op,
and traced they unroll into one static graph (its size grows with the sequence length, which a
trace fixes like any other shape). The input projection of a whole sequence is one matmul
before the loop, as in PyTorch's CPU kernels; only the hidden projection runs per step.
Gates are ordered as PyTorch's: LSTM (input, forget, cell, output), GRU (reset, update, new).

>>> import graphc, graphc.nn as nn
>>> lstm = nn.LSTM(4, 8, num_layers=2, batch_first=True)
>>> out, (h, c) = lstm(graphc.randn(3, 5, 4))
>>> out.shape, h.shape
(graphc.Size([3, 5, 8]), graphc.Size([2, 3, 8]))
"""

from __future__ import annotations

import math

import graphc
from graphc.errors import ArgumentError, ShapeError
from graphc.nn import functional as F
from graphc.nn import init
from graphc.nn.module import Module
from graphc.nn.parameter import Parameter
from graphc.nn.utils.rnn import PackedSequence, _layout, _padded_sorted
from graphc.tensor import Tensor

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


# ---- one time step, shared by the layers and the cells --------------------------------------
def _rnn_step(gi, h, w_hh, b_hh, relu: bool):
    """Elman step: act(x W_ih^T + b_ih + h W_hh^T + b_hh); gi is the input part."""
    pre = gi + F.linear(h, w_hh, b_hh)
    return F.relu(pre) if relu else graphc.tanh(pre)


def _lstm_step(gi, h, c, w_hh, b_hh, w_hr=None):
    """LSTM step: gates (i, f, g, o) from the input part gi and h; returns (h', c'). With a
    projection (proj_size > 0), h' is projected by w_hr, as PyTorch's LSTM with projections."""
    gates = gi + F.linear(h, w_hh, b_hh)
    i, f, g, o = gates.chunk(4, -1)
    c = graphc.sigmoid(f) * c + graphc.sigmoid(i) * graphc.tanh(g)
    h = graphc.sigmoid(o) * graphc.tanh(c)
    return (h if w_hr is None else F.linear(h, w_hr)), c


def _gru_step(gi, h, w_hh, b_hh):
    """GRU step: r, z from input and hidden parts; n = tanh(i_n + r * (W_hn h + b_hn))."""
    gh = F.linear(h, w_hh, b_hh)
    i_r, i_z, i_n = gi.chunk(3, -1)
    h_r, h_z, h_n = gh.chunk(3, -1)
    r = graphc.sigmoid(i_r + h_r)
    z = graphc.sigmoid(i_z + h_z)
    n = graphc.tanh(i_n + r * h_n)
    return (1 - z) * n + z * h


def _step(mode: str, gi, state, w_hh, b_hh, w_hr=None):
    """One step of `mode`; state is h, or (h, c) for LSTM; returns the new state."""
    if mode == "LSTM":
        return _lstm_step(gi, state[0], state[1], w_hh, b_hh, w_hr)
    if mode == "GRU":
        return _gru_step(gi, state, w_hh, b_hh)
    return _rnn_step(gi, state, w_hh, b_hh, mode == "RNN_RELU")


# ---- the multi-layer layers -----------------------------------------------------------------
class RNNBase(Module):
    """The shared body of RNN, LSTM and GRU: parameters, init, and the loop over layers,
    directions and time."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device=None,
                 dtype=None) -> None:
        super().__init__()
        if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or \
                not 0 <= dropout <= 1:
            raise ArgumentError("dropout should be a number in range [0, 1] representing the "
                                "probability of an element being zeroed")
        if dropout > 0 and num_layers == 1:
            import warnings
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so "
                          "non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}", stacklevel=3)
        if not isinstance(hidden_size, int) or isinstance(hidden_size, bool):
            raise TypeError(f"hidden_size should be of type int, got: "
                            f"{type(hidden_size).__name__}")
        if hidden_size <= 0:
            raise ArgumentError("hidden_size must be greater than zero")
        if num_layers <= 0:
            raise ArgumentError("num_layers must be greater than zero")
        if not isinstance(proj_size, int) or isinstance(proj_size, bool) or proj_size < 0:
            raise ArgumentError("proj_size should be a positive integer or zero to disable "
                                "projections")
        if proj_size >= hidden_size:
            raise ArgumentError("proj_size has to be smaller than hidden_size")
        if proj_size and mode != "LSTM":
            raise ArgumentError("proj_size argument is only supported for LSTM, not RNN or GRU")
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        gate_size = _GATES[mode] * hidden_size
        real_hidden = proj_size or hidden_size  # the size of h: projected when proj_size > 0
        kw = {"dtype": dtype} if dtype is not None else {}
        self._flat_weights_names = []
        for layer in range(num_layers):
            for direction in range(self.num_directions):
                layer_input = input_size if layer == 0 else real_hidden * self.num_directions
                suffix = f"_l{layer}" + ("_reverse" if direction == 1 else "")
                shapes = {"weight_ih": (gate_size, layer_input),
                          "weight_hh": (gate_size, real_hidden)}
                if bias:
                    shapes.update(bias_ih=(gate_size,), bias_hh=(gate_size,))
                if proj_size:
                    shapes.update(weight_hr=(proj_size, hidden_size))
                for name, shape in shapes.items():
                    setattr(self, name + suffix, Parameter(graphc.empty(*shape, **kw)))
                    self._flat_weights_names.append(name + suffix)
        self.reset_parameters()

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def _weights(self, layer: int, direction: int):
        """(weight_ih, weight_hh, bias_ih, bias_hh, weight_hr) of one layer and direction,
        None for those the layer does not have."""
        suffix = f"_l{layer}" + ("_reverse" if direction == 1 else "")
        bias = (getattr(self, "bias_ih" + suffix), getattr(self, "bias_hh" + suffix)) \
            if self.bias else (None, None)
        w_hr = getattr(self, "weight_hr" + suffix) if self.proj_size else None
        return (getattr(self, "weight_ih" + suffix), getattr(self, "weight_hh" + suffix),
                *bias, w_hr)

    def _check_input(self, input):  # noqa: A002
        if input.ndim not in (2, 3):
            raise ShapeError(f"{type(self).__name__}: Expected input to be 2D or 3D, got "
                             f"{input.ndim}D instead")
        if input.shape[-1] != self.input_size:
            raise ShapeError(f"input.size(-1) must be equal to input_size. Expected "
                             f"{self.input_size}, got {input.shape[-1]}")

    def _check_hidden(self, hx, batch: int | None, what: str = "hidden") -> None:
        size = self.proj_size if what == "hidden" and self.proj_size else self.hidden_size
        want = (self.num_layers * self.num_directions,) + \
            ((batch,) if batch is not None else ()) + (size,)
        if tuple(hx.shape) != want:
            raise ShapeError(f"Expected {what} size {want}, got {list(hx.shape)}")

    def _initial_state(self, input, hx, batch, unbatched):  # noqa: A002
        """(h0, c0 or None), each (layers * directions, N, H), batched."""
        zeros_shape = (self.num_layers * self.num_directions, batch, self.hidden_size)
        if hx is None:
            c0 = graphc.zeros(*zeros_shape, dtype=input.dtype)
            if not self.proj_size:
                return (c0, c0) if self.mode == "LSTM" else (c0, None)
            h0 = graphc.zeros(*zeros_shape[:2], self.proj_size, dtype=input.dtype)
            return h0, c0
        if self.mode == "LSTM":
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise ArgumentError("LSTM: expected hx to be a tuple (h_0, c_0)")
            h0, c0 = hx
        else:
            h0, c0 = hx, None
        for t, what in ((h0, "hidden"), (c0, "cell")):
            if t is not None:
                if unbatched and t.ndim != 2:
                    raise ShapeError(f"For unbatched 2-D input, hx should also be 2-D but got "
                                     f"{t.ndim}-D tensor")
                if not unbatched and t.ndim != 3:
                    raise ShapeError(f"For batched 3-D input, hx should also be 3-D but got "
                                     f"{t.ndim}-D tensor")
                self._check_hidden(t, None if unbatched else batch, what)
        if unbatched:
            h0 = h0.unsqueeze(1)
            c0 = c0.unsqueeze(1) if c0 is not None else None
        return h0, c0

    def _run_direction(self, gi_steps, state, w_hh, b_hh, w_hr, reverse: bool, running):
        """Apply the step over time (backwards when reverse); outputs in time order.

        `running[t]` (packed input): a (B, 1) bool tensor of the sequences still running at
        step t; the others keep their state, so each ends with its last valid step's state
        and the reverse direction of a short sequence starts at its own last step."""
        outputs = [None] * len(gi_steps)
        order = range(len(gi_steps) - 1, -1, -1) if reverse else range(len(gi_steps))
        for t in order:
            new = _step(self.mode, gi_steps[t], state, w_hh, b_hh, w_hr)
            if running is not None:
                new = tuple(graphc.where(running[t], n, o) for n, o in zip(new, state)) \
                    if self.mode == "LSTM" else graphc.where(running[t], new, state)
            state = new
            outputs[t] = state[0] if self.mode == "LSTM" else state
        return outputs, state

    def forward(self, input, hx=None):  # noqa: A002
        if isinstance(input, PackedSequence):
            return self._forward_packed(input, hx)
        return self._forward(input, hx)

    def _forward_packed(self, packed: PackedSequence, hx):
        """A PackedSequence in and out: the layers run over the padded, sorted batch with the
        finished sequences' states held; h_n in the caller's order."""
        padded, lengths = _padded_sorted(packed)
        running = [Tensor._wrap((lengths > t)[:, None]) for t in range(padded.shape[0])]
        if hx is not None and packed.sorted_indices is not None:
            hx = tuple(h.index_select(1, packed.sorted_indices) for h in hx) \
                if self.mode == "LSTM" else hx.index_select(1, packed.sorted_indices)
        batch_first, self.batch_first = self.batch_first, False
        try:
            output, state = self._forward(padded, hx, running)
        finally:
            self.batch_first = batch_first
        sizes = _layout(packed.batch_sizes)
        data = graphc.cat([output[t, :int(n)] for t, n in enumerate(sizes)], 0)
        if packed.unsorted_indices is not None:
            state = tuple(h.index_select(1, packed.unsorted_indices) for h in state) \
                if self.mode == "LSTM" else state.index_select(1, packed.unsorted_indices)
        return PackedSequence(data, packed.batch_sizes, packed.sorted_indices,
                              packed.unsorted_indices), state

    def _forward(self, input, hx=None, running=None):  # noqa: A002
        self._check_input(input)
        unbatched = input.ndim == 2
        x = input.unsqueeze(1) if unbatched else (input.transpose(0, 1) if self.batch_first
                                                  else input)
        batch = x.shape[1]
        h0, c0 = self._initial_state(input, hx, batch, unbatched)
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outs = []
            for direction in range(self.num_directions):
                w_ih, w_hh, b_ih, b_hh, w_hr = self._weights(layer, direction)
                k = layer * self.num_directions + direction
                gi = F.linear(x, w_ih, b_ih)  # every step's input projection in one matmul
                state = (h0[k], c0[k]) if self.mode == "LSTM" else h0[k]
                out, state = self._run_direction(gi.unbind(0), state, w_hh, b_hh, w_hr,
                                                 direction == 1, running)
                outs.append(graphc.stack(out, 0))
                if self.mode == "LSTM":
                    h_n.append(state[0])
                    c_n.append(state[1])
                else:
                    h_n.append(state)
            x = outs[0] if len(outs) == 1 else graphc.cat(outs, -1)
            if self.dropout > 0 and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, self.training)
        output = x.squeeze(1) if unbatched else (x.transpose(0, 1) if self.batch_first else x)
        h_n = graphc.stack(h_n, 0)
        c_n = graphc.stack(c_n, 0) if self.mode == "LSTM" else None
        if unbatched:
            h_n = h_n.squeeze(1)
            c_n = c_n.squeeze(1) if c_n is not None else None
        return (output, (h_n, c_n)) if self.mode == "LSTM" else (output, h_n)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s


_BASE_ARGS = ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout",
              "bidirectional", "proj_size", "device", "dtype")
_RNN_ARGS = ("input_size", "hidden_size", "num_layers", "nonlinearity", "bias", "batch_first",
             "dropout", "bidirectional", "device", "dtype")


def _keywords(name: str, names: tuple, args: tuple, kwargs: dict) -> dict:
    """PyTorch's `*args, **kwargs` constructors: positional arguments named as `names`."""
    if len(args) > len(names):
        raise TypeError(f"{name}.__init__() takes at most {len(names)} positional arguments "
                        f"({len(args)} given)")
    kwargs = dict(kwargs)
    for key, value in zip(names, args):
        if key in kwargs:
            raise TypeError(f"{name}.__init__() got multiple values for argument '{key}'")
        kwargs[key] = value
    return kwargs


class RNN(RNNBase):
    """Elman RNN: h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh), act tanh or relu.

    RNN(input_size, hidden_size, num_layers=1, nonlinearity='tanh', bias=True,
    batch_first=False, dropout=0.0, bidirectional=False); forward(input, h_0=None) ->
    (output, h_n).
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs = _keywords("RNN", _RNN_ARGS, args, kwargs)
        nonlinearity = kwargs.pop("nonlinearity", "tanh")
        modes = {"tanh": "RNN_TANH", "relu": "RNN_RELU"}
        if nonlinearity not in modes:
            raise ArgumentError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or "
                                "'relu'.")
        super().__init__(modes[nonlinearity], **kwargs)
        self.nonlinearity = nonlinearity  # not in the repr, as PyTorch's RNN


class LSTM(RNNBase):
    """Long short-term memory: forward(input, (h_0, c_0)=None) -> (output, (h_n, c_n))."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__("LSTM", **_keywords("LSTM", _BASE_ARGS, args, kwargs))


class GRU(RNNBase):
    """Gated recurrent unit: forward(input, h_0=None) -> (output, h_n)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__("GRU", **_keywords("GRU", _BASE_ARGS, args, kwargs))


# ---- the cells ------------------------------------------------------------------------------
class RNNCellBase(Module):
    """One step of a recurrent layer: weight_ih, weight_hh, bias_ih, bias_hh (PyTorch's names)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        kw = {"dtype": dtype} if dtype is not None else {}
        self.weight_ih = Parameter(graphc.empty(num_chunks * hidden_size, input_size, **kw))
        self.weight_hh = Parameter(graphc.empty(num_chunks * hidden_size, hidden_size, **kw))
        if bias:
            self.bias_ih = Parameter(graphc.empty(num_chunks * hidden_size, **kw))
            self.bias_hh = Parameter(graphc.empty(num_chunks * hidden_size, **kw))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def _prepare(self, input, hx):  # noqa: A002
        """(batched input, batched hx or zeros, whether the input was unbatched)."""
        name = type(self).__name__
        if input.ndim not in (1, 2):
            raise ShapeError(f"{name}: Expected input to be 1D or 2D, got {input.ndim}D "
                             "instead")
        if input.shape[-1] != self.input_size:
            raise ShapeError(f"input has inconsistent input_size: got {input.shape[-1]} "
                             f"expected {self.input_size}")
        unbatched = input.ndim == 1
        x = input.unsqueeze(0) if unbatched else input
        if hx is None:
            return x, None, unbatched
        hs = hx if isinstance(hx, (tuple, list)) else (hx,)
        for h in hs:
            if h.ndim != input.ndim:
                raise ShapeError(f"{name}: Expected hidden to be {input.ndim}D, got "
                                 f"{h.ndim}D instead")
        hs = tuple(h.unsqueeze(0) if unbatched else h for h in hs)
        return x, hs if isinstance(hx, (tuple, list)) else hs[0], unbatched

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        nonlinearity = getattr(self, "nonlinearity", "tanh")
        if nonlinearity != "tanh":
            s += f", nonlinearity={nonlinearity}"
        return s


class RNNCell(RNNCellBase):
    """h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh), act tanh or relu."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)
        if nonlinearity not in ("tanh", "relu"):
            raise ArgumentError(f"Unknown nonlinearity: {nonlinearity}")
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):  # noqa: A002
        x, h, unbatched = self._prepare(input, hx)
        if h is None:
            h = graphc.zeros(x.shape[0], self.hidden_size, dtype=x.dtype)
        gi = F.linear(x, self.weight_ih, self.bias_ih)
        out = _rnn_step(gi, h, self.weight_hh, self.bias_hh, self.nonlinearity == "relu")
        return out.squeeze(0) if unbatched else out


class LSTMCell(RNNCellBase):
    """One LSTM step: forward(input, (h, c)=None) -> (h', c').

    >>> import graphc, graphc.nn as nn
    >>> h, c = nn.LSTMCell(4, 6)(graphc.randn(2, 4))
    >>> h.shape
    graphc.Size([2, 6])
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input, hx=None):  # noqa: A002
        x, state, unbatched = self._prepare(input, hx)
        if state is None:
            zeros = graphc.zeros(x.shape[0], self.hidden_size, dtype=x.dtype)
            state = (zeros, zeros)
        gi = F.linear(x, self.weight_ih, self.bias_ih)
        h, c = _lstm_step(gi, state[0], state[1], self.weight_hh, self.bias_hh)
        return (h.squeeze(0), c.squeeze(0)) if unbatched else (h, c)


class GRUCell(RNNCellBase):
    """One GRU step: forward(input, h=None) -> h'."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input, hx=None):  # noqa: A002
        x, h, unbatched = self._prepare(input, hx)
        if h is None:
            h = graphc.zeros(x.shape[0], self.hidden_size, dtype=x.dtype)
        gi = F.linear(x, self.weight_ih, self.bias_ih)
        out = _gru_step(gi, h, self.weight_hh, self.bias_hh)
        return out.squeeze(0) if unbatched else out


__all__ = ["GRU", "GRUCell", "LSTM", "LSTMCell", "RNN", "RNNBase", "RNNCell", "RNNCellBase"]
