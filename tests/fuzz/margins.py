"""Is a fuzz case well-conditioned? Margins of every decision on the float64 reference.

A float32 run and its float64 reference may legitimately disagree where the program makes a
discrete decision on a value that rounding can move across the boundary: relu/abs/sign at 0,
a comparison of two close values, which element a max picks, a cast's truncation, a floor
division's quotient. `ill_conditioned(graph, values)` walks the float64 reference graph
(traced, before any pass, so every decision is its own node) with the interpreter's values of
every node and returns a reason when some decision is closer than `MARGIN` (relative to the
operand's magnitude, at least 1) to its boundary, or when a value is not finite or larger
than `MAX_MAGNITUDE`. The harness then draws other input values (or rejects the case): such a
case says nothing about the compiler. Exact ties (distance 0) are accepted: the float32 run
computes both sides the same way and takes the same branch.

Invariant: this module only reads the reference; it never decides that a backend is right.
"""

from __future__ import annotations

import numpy as np

from graphc.ir.graph import Graph

MARGIN = 1e-4
MAX_MAGNITUDE = 1e4

_AT_ZERO = ("relu", "abs", "sign", "leaky_relu")
_PAIRS = ("maximum", "minimum", "lt", "le", "gt", "ge", "eq", "ne")
_QUOTIENTS = ("floor_divide", "remainder")
_EXTREMA = ("reduce_max", "reduce_min", "argmax", "argmin")


def _too_close(distance: np.ndarray, operand: np.ndarray) -> bool:
    distance = np.abs(np.asarray(distance, np.float64))
    scale = max(1.0, float(np.max(np.abs(operand)))) if np.size(operand) else 1.0
    return bool(np.any((distance > 0) & (distance < MARGIN * scale)))


def _extrema_gap(x: np.ndarray, axes) -> np.ndarray:
    """Per reduced slice, the gap between the two largest and the two smallest elements
    (0-gaps from exact duplicates are kept: they count as ties)."""
    axes = tuple(range(x.ndim)) if axes is None else tuple(np.atleast_1d(axes))
    axes = tuple(a % x.ndim for a in axes) if x.ndim else ()
    if not axes or x.size == 0:
        return np.zeros(0)
    rest = [a for a in range(x.ndim) if a not in axes]
    rows = np.transpose(x, rest + list(axes)).reshape(-1, int(np.prod([x.shape[a] for a in axes])))
    if rows.shape[1] < 2:
        return np.zeros(0)
    ordered = np.sort(rows, axis=1)
    return np.concatenate([ordered[:, -1] - ordered[:, -2], ordered[:, 1] - ordered[:, 0]])


def _pool_gap(x: np.ndarray, attrs: dict) -> np.ndarray:
    """Per max_pool2d window, the gap between its two largest elements."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = (attrs["kernel_size"], attrs["stride"],
                                              attrs["padding"], attrs["dilation"])
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph + sh), (pw, pw + sw)),
                    constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(
        padded, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    windows = windows[:, :, ::sh, ::sw, ::dh, ::dw].reshape(-1, kh * kw)
    if windows.shape[1] < 2:
        return np.zeros(0)
    top = np.sort(windows, axis=1)[:, -2:]
    top = top[np.isfinite(top).all(axis=1)]  # windows reaching into the padding
    return top[:, 1] - top[:, 0]


def decision_distance(op: str, attrs: dict, inputs: list[np.ndarray]):
    """(distance to the boundary per decision, operand) for a deciding node, else None."""
    x = inputs[0] if inputs else None
    if x is None or x.dtype.kind != "f":
        return None
    if op in _AT_ZERO:
        return x, x
    if op in _PAIRS and inputs[1].dtype.kind == "f":
        a, b = np.broadcast_arrays(x, inputs[1])
        return a - b, np.concatenate([a.ravel(), b.ravel()])
    if op == "clamp":
        bounds = [v for v in (attrs.get("min"), attrs.get("max")) if v is not None]
        return np.concatenate([(x - v).ravel() for v in bounds] or [np.zeros(0)]), x
    if op in _QUOTIENTS:
        a, b = np.broadcast_arrays(x, inputs[1])
        q = a / b
        return (q - np.round(q)) * b, a
    if op == "cast":
        target = attrs["dtype"]
        if target == "int64":
            return x - np.round(x), x
        if target == "bool":
            return x, x
        return None
    if op in _EXTREMA:
        return _extrema_gap(x, attrs.get("axes", attrs.get("axis"))), x
    if op == "max_pool2d":
        return _pool_gap(x, attrs), x
    return None


def ill_conditioned(graph: Graph, values: dict[str, np.ndarray]) -> str | None:
    """Why the float64 reference (values by name) is too close to a decision boundary or too
    large to say anything about a float32 run; None when it is fine."""
    for node in graph.nodes:
        for out in node.outputs:
            v = values[out.name]
            if v.dtype.kind == "f" and v.size and not (
                    np.isfinite(v).all() and np.abs(v).max() <= MAX_MAGNITUDE):
                return f"%{out.name} ({node.op}) is not finite or above {MAX_MAGNITUDE:g}"
        found = decision_distance(node.op, node.attrs, [values[v.name] for v in node.inputs])
        if found is not None and _too_close(*found):
            return f"%{node.outputs[0].name} = {node.op}: an operand within {MARGIN:g} of a tie"
    return None
