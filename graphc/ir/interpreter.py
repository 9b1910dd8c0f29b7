"""The numpy interpreter: runs any graph with the registry's kernels; the oracle of backends.

`run(graph, *arrays)` binds the inputs, runs each node's kernel in order, frees every value
after its last use, and returns the outputs followed by the new value of each updated input
(in `graph.updates` order). A failing kernel is reported with the node
("while executing %7 = matmul(%3, %w) at model.py:12"). `Interpreter` can be subclassed to
observe or override single nodes (`run_node`).
"""

from __future__ import annotations

import threading

import numpy as np

from graphc.errors import GraphcError, traced_location
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.printer import format_node
from graphc.ops.registry import REGISTRY
from graphc.symbolic import SymbolicShapeError, bind, evaluate, free_symbols


class InterpreterError(GraphcError, RuntimeError):
    """A kernel failed or an input did not match the graph's declared type."""


def last_uses(graph: Graph) -> dict[int, list[Value]]:
    """node index -> values whose last reader is that node (graph outputs are never freed)."""
    last: dict[Value, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last[v] = i
    keep = set(graph.outputs) | {value for _, value in graph.updates}
    out: dict[int, list[Value]] = {}
    for v, i in last.items():
        if v not in keep:
            out.setdefault(i, []).append(v)
    return out


class Interpreter:
    """Runs a graph (see the module docstring). A symbolic graph (`f32[s0,784]`) binds its
    symbols from the inputs' shapes on every call (`graphc.symbolic.bind`), and a node whose
    attributes hold symbolic sizes (`reshape[shape=(s0,784)]`) gets them evaluated."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._frees = last_uses(graph)
        self._symbolic = any(v.type.is_symbolic for v in graph.inputs)
        self._sym_attrs = {id(n) for n in graph.nodes if free_symbols(tuple(n.attrs.values()))}
        self._sizes = threading.local()  # this call's symbol sizes (calls may overlap)

    def attrs(self, node: Node) -> dict:
        """The node's attributes with symbolic sizes evaluated for this call."""
        if id(node) not in self._sym_attrs:
            return node.attrs
        values = self._sizes.values
        return {k: evaluate(v, values) for k, v in node.attrs.items()}

    def run_node(self, node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
        opdef = REGISTRY[node.op]
        with np.errstate(all="ignore"), traced_location(node.loc):
            result = opdef.kernel(*args, **self.attrs(node))
        results = [result] if len(node.outputs) == 1 else list(result)
        return [np.asarray(r).astype(v.type.dtype.np, copy=False)
                for r, v in zip(results, node.outputs)]

    def run(self, *inputs) -> list[np.ndarray]:
        g = self.graph
        if len(inputs) != len(g.inputs):
            raise InterpreterError(f"graph @{g.name} takes {len(g.inputs)} inputs, got "
                                   f"{len(inputs)}")
        env: dict[Value, np.ndarray] = {}
        if self._symbolic:
            inputs = [np.asarray(a) for a in inputs]
            try:
                self._sizes.values = bind([v.type.shape for v in g.inputs],
                                          [a.shape for a in inputs],
                                          [f"%{v.name}" for v in g.inputs])
            except SymbolicShapeError as err:
                raise InterpreterError(f"graph @{g.name}: {err}") from None
        for v, a in zip(g.inputs, inputs):
            a = np.asarray(a)
            if a.dtype != v.type.dtype.np or (not self._symbolic and a.shape != v.type.shape):
                raise InterpreterError(
                    f"graph @{g.name}: input %{v.name} expects {v.type}, got "
                    f"{a.dtype}{list(a.shape)}")
            env[v] = a
        for i, node in enumerate(g.nodes):
            try:
                results = self.run_node(node, [env[v] for v in node.inputs])
            except GraphcError:
                raise
            except Exception as err:
                raise InterpreterError(f"while executing {format_node(node)}: "
                                       f"{type(err).__name__}: {err}") from err
            for v, r in zip(node.outputs, results):
                env[v] = r
            for v in self._frees.get(i, ()):
                env.pop(v, None)
        return [env[v] for v in g.outputs] + [env[v] for _, v in g.updates]


def run(graph: Graph, *inputs) -> list[np.ndarray]:
    """Run `graph` on numpy arrays; returns the outputs, then the updated inputs' values."""
    return Interpreter(graph).run(*inputs)
