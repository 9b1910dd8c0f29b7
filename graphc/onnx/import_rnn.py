"""Import table, part 5: ONNX's recurrent ops RNN, GRU and LSTM, unrolled over time.

Each time step is the ONNX equations written with matmul and elementwise registry ops (the
trace holds one copy of the cell per step, as graphc's own nn.LSTM does). Both layouts,
forward, reverse and bidirectional directions, initial states, LSTM peepholes and
input_forget, GRU's linear_before_reset and `clip` are mapped; the activations are the
default ones or any of Tanh, Sigmoid, Relu, HardSigmoid, LeakyRelu, Affine, ThresholdedRelu,
ScaledTanh, Elu, Softsign, Softplus. `sequence_lens` shorter than the sequence is refused.
"""

from __future__ import annotations

import numpy as np

from graphc.ops.registry import call


def _scalar(x, value):
    return call("full", shape=(), value=float(value), dtype=x.dtype.name)


def _activation(name: str, alpha, beta):
    """One ONNX RNN activation as a function of a tensor (alpha/beta where it takes them)."""
    def run(x):
        if name == "Tanh":
            return call("tanh", x)
        if name == "Sigmoid":
            return call("sigmoid", x)
        if name == "Relu":
            return call("relu", x)
        if name == "HardSigmoid":
            y = call("add", call("mul", x, _scalar(x, alpha)), _scalar(x, beta))
            return call("clamp", y, min=0.0, max=1.0)
        if name == "LeakyRelu":
            return call("leaky_relu", x, negative_slope=float(alpha))
        if name == "Affine":
            return call("add", call("mul", x, _scalar(x, alpha)), _scalar(x, beta))
        if name == "ThresholdedRelu":
            return call("where", call("gt", x, _scalar(x, alpha)), x, _scalar(x, 0))
        if name == "ScaledTanh":
            return call("mul", call("tanh", call("mul", x, _scalar(x, beta))), _scalar(x, alpha))
        if name == "Elu":
            neg = call("mul", call("sub", call("exp", x), _scalar(x, 1)), _scalar(x, alpha))
            return call("where", call("gt", x, _scalar(x, 0)), x, neg)
        if name == "Softsign":
            return call("div", x, call("add", call("abs", x), _scalar(x, 1)))
        y = call("log1p", call("exp", call("neg", call("abs", x))))  # Softplus
        return call("add", call("relu", x), y)

    return run


_KNOWN = {"Tanh", "Sigmoid", "Relu", "HardSigmoid", "LeakyRelu", "Affine", "ThresholdedRelu",
          "ScaledTanh", "Elu", "Softsign", "Softplus"}
_DEFAULT_ALPHA = {"HardSigmoid": 0.2, "LeakyRelu": 0.01, "Affine": 1.0, "ThresholdedRelu": 1.0,
                  "ScaledTanh": 1.0, "Elu": 1.0}
_DEFAULT_BETA = {"HardSigmoid": 0.5, "Affine": 0.0, "ScaledTanh": 1.0}


def _activations(ctx, defaults: list[str], directions: int):
    names = list(ctx.attr("activations", defaults * directions))
    alphas = list(ctx.attr("activation_alpha", []))
    betas = list(ctx.attr("activation_beta", []))
    fns = []
    for i, name in enumerate(names):
        if name not in _KNOWN:
            raise ctx.refuse(f"activation {name!r}")
        alpha = alphas[i] if i < len(alphas) else _DEFAULT_ALPHA.get(name, 0.0)
        beta = betas[i] if i < len(betas) else _DEFAULT_BETA.get(name, 0.0)
        fns.append(_activation(name, alpha, beta))
    per = len(defaults)
    return [fns[d * per:(d + 1) * per] for d in range(directions)]


def _row(t, d, start, stop):
    """t[d, start:stop] of a (directions, n, ...) tensor, without the direction axis."""
    starts = (d, start) + (0,) * (t.ndim - 2)
    stops = (d + 1, stop) + tuple(t.shape[2:])
    part = call("slice", t, starts=starts, stops=stops, steps=(1,) * t.ndim)
    return call("reshape", part, shape=(stop - start, *t.shape[2:]))


def _linear(x, w):
    return call("matmul", x, call("permute", w, dims=(1, 0)))


def _clipped(ctx, x):
    clip = ctx.attr("clip", None)
    return x if clip is None else call("clamp", x, min=-float(clip), max=float(clip))


def _step_input(x, t):
    part = call("slice", x, starts=(t, 0, 0), stops=(t + 1, *x.shape[1:]), steps=(1, 1, 1))
    return call("reshape", part, shape=tuple(x.shape[1:]))


def _run(ctx, kind, x, w, r, b, lengths, h0, c0, p):
    x, w, r = ctx.tensor(x), ctx.tensor(w), ctx.tensor(r)
    layout = ctx.attr("layout", 0)
    if layout:
        x = call("permute", x, dims=(1, 0, 2))
    steps, batch, _ = x.shape
    if lengths is not None and np.any(ctx.static(lengths, "sequence_lens") != steps):
        raise ctx.refuse("sequence_lens shorter than the sequence")
    direction = ctx.attr("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    hidden = ctx.attr("hidden_size", w.shape[1] // gates)
    defaults = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"],
                "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[kind]
    acts = _activations(ctx, defaults, dirs)
    zeros = call("full", shape=(batch, hidden), value=0.0, dtype=x.dtype.name)
    ys, finals, cells = [], [], []
    for d in range(dirs):
        wd, rd = _row(w, d, 0, w.shape[1]), _row(r, d, 0, r.shape[1])
        bias = (None if b is None else ctx.tensor(b))
        h = zeros if h0 is None else _row(ctx.tensor(h0), d, 0, batch)
        c = zeros if c0 is None else _row(ctx.tensor(c0), d, 0, batch)
        reverse = direction == "reverse" or d == 1
        order = range(steps - 1, -1, -1) if reverse else range(steps)
        outs = [None] * steps
        for t in order:
            xt = _step_input(x, t)
            h, c = _cell(ctx, kind, xt, h, c, wd, rd, bias, d, hidden, acts[d], p)
            outs[t] = h
        ys.append(call("concat", *(call("reshape", o, shape=(1, 1, batch, hidden))
                                   for o in outs), axis=0))
        finals.append(call("reshape", h, shape=(1, batch, hidden)))
        cells.append(call("reshape", c, shape=(1, batch, hidden)))
    y = call("concat", *ys, axis=1) if dirs > 1 else ys[0]
    y_h = call("concat", *finals, axis=0) if dirs > 1 else finals[0]
    y_c = call("concat", *cells, axis=0) if dirs > 1 else cells[0]
    if layout:
        y = call("permute", y, dims=(2, 0, 1, 3))
        y_h, y_c = (call("permute", v, dims=(1, 0, 2)) for v in (y_h, y_c))
    outputs = (y, y_h, y_c) if kind == "LSTM" else (y, y_h)
    return outputs[:max(ctx.num_outputs, 1)]


def _gate(ctx, xt, h, wd, rd, bias, d, hidden, g, recurrent=True):
    """x W_g^T (+ h R_g^T) + Wb_g (+ Rb_g) for gate number g."""
    lo, hi = g * hidden, (g + 1) * hidden
    w_part = call("slice", wd, starts=(lo, 0), stops=(hi, wd.shape[1]), steps=(1, 1))
    r_part = call("slice", rd, starts=(lo, 0), stops=(hi, rd.shape[1]), steps=(1, 1))
    out = _linear(xt, w_part)
    if recurrent:
        out = call("add", out, _linear(h, r_part))
    if bias is not None:
        total = bias.shape[1] // 2
        out = call("add", out, _row(bias, d, lo, hi))
        if recurrent:
            out = call("add", out, _row(bias, d, total + lo, total + hi))
    return out


def _cell(ctx, kind, xt, h, c, wd, rd, bias, d, hidden, acts, p):
    if kind == "RNN":
        return acts[0](_clipped(ctx, _gate(ctx, xt, h, wd, rd, bias, d, hidden, 0))), c
    if kind == "GRU":
        f, g = acts
        z = f(_clipped(ctx, _gate(ctx, xt, h, wd, rd, bias, d, hidden, 0)))
        r = f(_clipped(ctx, _gate(ctx, xt, h, wd, rd, bias, d, hidden, 1)))
        lo, hi = 2 * hidden, 3 * hidden
        rh = call("slice", rd, starts=(lo, 0), stops=(hi, rd.shape[1]), steps=(1, 1))
        rb = None if bias is None else _row(bias, d, bias.shape[1] // 2 + lo,
                                            bias.shape[1] // 2 + hi)
        x_part = _gate(ctx, xt, h, wd, rd, bias, d, hidden, 2, recurrent=False)
        if ctx.attr("linear_before_reset", 0):
            hr = _linear(h, rh) if rb is None else call("add", _linear(h, rh), rb)
            pre = call("add", x_part, call("mul", r, hr))
        else:
            hr = _linear(call("mul", r, h), rh)
            pre = call("add", x_part, hr if rb is None else call("add", hr, rb))
        cand = g(_clipped(ctx, pre))
        one = _scalar(z, 1)
        return call("add", call("mul", call("sub", one, z), cand), call("mul", z, h)), c
    f, g, hact = acts  # LSTM: gates i, o, f, c
    peep = None if p is None else ctx.tensor(p)

    def peephole(pre, k, state):
        if peep is None:
            return pre
        return call("add", pre, call("mul", _row(peep, d, k * hidden, (k + 1) * hidden), state))

    i = f(_clipped(ctx, peephole(_gate(ctx, xt, h, wd, rd, bias, d, hidden, 0), 0, c)))
    if ctx.attr("input_forget", 0):
        fg = call("sub", _scalar(i, 1), i)
    else:
        fg = f(_clipped(ctx, peephole(_gate(ctx, xt, h, wd, rd, bias, d, hidden, 2), 2, c)))
    cand = g(_clipped(ctx, _gate(ctx, xt, h, wd, rd, bias, d, hidden, 3)))
    c = call("add", call("mul", fg, c), call("mul", i, cand))
    o = f(_clipped(ctx, peephole(_gate(ctx, xt, h, wd, rd, bias, d, hidden, 1), 1, c)))
    return call("mul", o, hact(c)), c


def import_rnn(ctx, x, w, r, b=None, lengths=None, h0=None):
    return _run(ctx, "RNN", x, w, r, b, lengths, h0, None, None)


def import_gru(ctx, x, w, r, b=None, lengths=None, h0=None):
    return _run(ctx, "GRU", x, w, r, b, lengths, h0, None, None)


def import_lstm(ctx, x, w, r, b=None, lengths=None, h0=None, c0=None, p=None):
    return _run(ctx, "LSTM", x, w, r, b, lengths, h0, c0, p)


RNN_IMPORTERS = {"RNN": import_rnn, "GRU": import_gru, "LSTM": import_lstm}
