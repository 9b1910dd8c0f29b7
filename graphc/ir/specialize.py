"""Substitute sizes for symbols: a symbolic graph (`f32[s0,784]`) made static for one call's
sizes, or with some symbols pinned to the value a guard fixed.

`specialize(graph, values)` returns a new graph whose types and attributes have every symbol
named in `values` replaced by its size (expressions evaluated where all their symbols are
given); the original graph is untouched. Backends that cannot take runtime sizes for a graph
compile the specialised graph per shape (graphc.backends.specializing), and graphc.jit pins
the symbols a trace specialised (`int(size)` in user code, a guard `s1 == 784`).
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node, Value
from graphc.symbolic import Sym
from graphc.types import TensorType


def _dim(d, values: dict[str, int]):
    if type(d) is not Sym:
        return d
    if d.free_symbols <= values.keys():
        return d.evaluate(values)
    partial = 0
    for m, c in d.terms:  # substitute the known symbols, keep the rest symbolic
        term = c
        for name in m:
            term = term * (values[name] if name in values else Sym.symbol(name))
        partial = partial + term
    return partial


def _attr(x, values: dict[str, int]):
    if type(x) is Sym:
        return _dim(x, values)
    if isinstance(x, tuple):
        return tuple(_attr(v, values) for v in x)
    if isinstance(x, list):
        return [_attr(v, values) for v in x]
    return x


def specialize_type(t: TensorType, values: dict[str, int]) -> TensorType:
    if not t.is_symbolic:
        return t
    return TensorType(tuple(_dim(d, values) for d in t.shape), t.dtype)


def specialize(graph: Graph, values: dict[str, int]) -> Graph:
    """A copy of `graph` with the symbols in `values` replaced by their sizes (see the module
    docstring). Analysis results in `meta` are dropped (they were made for other sizes)."""
    new: dict[Value, Value] = {}

    def value(v: Value) -> Value:
        out = new.get(v)
        if out is None:
            out = new[v] = Value(v.name, specialize_type(v.type, values))
        return out

    g = Graph(graph.name)
    g.inputs = [value(v) for v in graph.inputs]
    g.nodes = [Node(n.op, [value(v) for v in n.inputs],
                    {k: _attr(a, values) for k, a in n.attrs.items()},
                    [value(v) for v in n.outputs], n.loc) for n in graph.nodes]
    g.outputs = [value(v) for v in graph.outputs]
    g.updates = [(value(a), value(b)) for a, b in graph.updates]
    return g


def pin(graph: Graph, values: dict[str, int]) -> Graph:
    """Replace the symbols in `values` in place (types and attributes of `graph` itself): for
    a freshly traced graph whose trace specialised them; returns the graph."""
    if not values:
        return graph
    for v in graph.inputs:
        v.type = specialize_type(v.type, values)
    for n in graph.nodes:
        n.attrs = {k: _attr(a, values) for k, a in n.attrs.items()}
        for v in n.outputs:
            v.type = specialize_type(v.type, values)
    return graph


__all__ = ["pin", "specialize", "specialize_type"]
