"""Standalone repros: a graph as a `.gir` text file plus its inputs as an `.npz` archive,
and the bisection that finds which node of a graph a backend computes wrong.

A repro is what `graphc.testing.assert_compiled_matches` writes when a backend diverges from
the interpreter: the smallest sub-graph around the first divergent node, with that node's
inputs as graph inputs, and the interpreter's values of those inputs. Anyone can then rerun
it on any backend, without the model or the code that traced it:

    graphc run FILE.gir --inputs FILE.npz [--backend NAME]       (the command line)
    graphc.testing.run_repro("FILE.gir", "FILE.npz", backend="NAME")

Format: the `.gir` file is `format_graph(graph)` (STYLE.md's IR text, source lines kept as
comments) and parses back with `graphc.ir.parse`. The `.npz` holds one array per graph input,
stored under the input's name without the `%` (`x`, `fc1.weight`, `12`), readable with
`numpy.load`; extra arrays are ignored. Inputs are matched by name, never by position.

Bisection (`first_divergent_node`) takes the interpreter's value of every graph value
(`record_values`) as the oracle. It first runs the graph on the backend with every node
output made a graph output and returns the first node, in order, whose output differs. A
backend that only goes wrong when values stay internal (a bad fused kernel) hides that way;
then it binary-searches graph prefixes (outputs: the last node's and every value still
needed after it), assuming that a divergence, once there, stays visible.
"""

from __future__ import annotations

import os
import zipfile
from typing import Callable

import numpy as np

from graphc.backends import compile as compile_graph
from graphc.errors import ArgumentError
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.interpreter import Interpreter
from graphc.ir.parser import parse
from graphc.ir.printer import format_graph
from graphc.ir.verifier import verify


def save_repro(graph: Graph, arrays, path_stem: str) -> tuple[str, str]:
    """Write `path_stem.gir` and `path_stem.npz` (one array per graph input, in order).

    Returns the two paths. The archive is written entry by entry, so any input name works
    (numpy.savez would reject a value named `file`).
    """
    arrays = list(arrays)
    if len(arrays) != len(graph.inputs):
        raise ArgumentError(f"save_repro: graph @{graph.name} has {len(graph.inputs)} inputs, "
                            f"got {len(arrays)} arrays")
    os.makedirs(os.path.dirname(os.path.abspath(path_stem)), exist_ok=True)
    gir_path, npz_path = path_stem + ".gir", path_stem + ".npz"
    with open(gir_path, "w") as f:
        f.write(format_graph(graph) + "\n")
    with zipfile.ZipFile(npz_path, "w") as archive:
        for value, array in zip(graph.inputs, arrays):
            with archive.open(value.name + ".npy", "w") as entry:
                np.lib.format.write_array(entry, np.ascontiguousarray(array),
                                          allow_pickle=False)
    return gir_path, npz_path


def load_repro(gir_path: str, npz_path: str) -> tuple[Graph, list[np.ndarray]]:
    """Parse and verify the graph; return it with one array per graph input, in input order."""
    with open(gir_path) as f:
        graph = verify(parse(f.read(), require_registered=False))  # runs, never differentiates
    with np.load(npz_path, allow_pickle=False) as archive:
        missing = [v.name for v in graph.inputs if v.name not in archive.files]
        if missing:
            raise ArgumentError(
                f"{npz_path}: no array for graph input(s) "
                f"{', '.join('%' + n for n in missing)} of {gir_path}; the archive holds "
                f"{sorted(archive.files)}")
        arrays = [archive[v.name] for v in graph.inputs]
    return graph, arrays


def run_repro(gir_path: str, npz_path: str, backend: str = "interp") -> list[np.ndarray]:
    """Run a saved repro on the named backend: its outputs, then its updated inputs' values.

    >>> import os, tempfile, numpy as np
    >>> from graphc.ir import parse
    >>> g = parse('''graph @f(%x: f32[2]) -> (f32[2]) {
    ...   %0: f32[2] = relu(%x)
    ...   return (%0)
    ... }''')
    >>> stem = os.path.join(tempfile.mkdtemp(), "f")
    >>> gir, npz = save_repro(g, [np.array([-1.0, 2.0], np.float32)], stem)
    >>> run_repro(gir, npz)[0].tolist()
    [0.0, 2.0]
    """
    graph, arrays = load_repro(gir_path, npz_path)
    return list(compile_graph(graph, backend).run(*arrays))


# ---- sub-graphs and bisection ----------------------------------------------------------------
# differs(value, got, expected) -> None when they agree, else an error description
Differs = Callable[[Value, np.ndarray, np.ndarray], object]


class _Recorder(Interpreter):
    """The interpreter, keeping every node output by value name."""

    def __init__(self, graph: Graph, values: dict) -> None:
        super().__init__(graph)
        self.values = values

    def run_node(self, node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
        results = super().run_node(node, args)
        self.values.update((v.name, r) for v, r in zip(node.outputs, results))
        return results


def record_values(graph: Graph, arrays) -> dict[str, np.ndarray]:
    """The interpreter's value of every graph input and node output, by value name."""
    values = {v.name: np.asarray(a) for v, a in zip(graph.inputs, arrays)}
    _Recorder(graph, values).run(*arrays)
    return values


def subgraph(nodes: list[Node], outputs: list[Value], name: str) -> Graph:
    """`nodes` (in order) returning `outputs`; every value they read and do not define
    becomes a graph input, in order of first use."""
    defined = {v for n in nodes for v in n.outputs}
    inputs = dict.fromkeys(v for n in nodes for v in n.inputs if v not in defined)
    return Graph(name, list(inputs), list(nodes), list(dict.fromkeys(outputs)))


def diverging_output(sub: Graph, backend: str, values: dict, differs: Differs):
    """(value, error) of the first output of `sub` that `backend` computes differently from
    `values`, or None."""
    got = compile_graph(sub, backend).run(*(values[v.name] for v in sub.inputs))
    for v, array in zip(sub.outputs, got):
        err = differs(v, array, values[v.name])
        if err is not None:
            return v, err
    return None


def first_divergent_node(graph: Graph, backend: str, values: dict, differs: Differs):
    """(node index, error) of the first node whose output `backend` gets wrong, or None (see
    the module docstring)."""
    nodes = graph.nodes
    if not nodes:
        return None
    everything = subgraph(nodes, [v for n in nodes for v in n.outputs], graph.name + "_all")
    found = diverging_output(everything, backend, values, differs)
    if found is not None:
        return nodes.index(graph.producers()[found[0]]), found[1]
    users, position = graph.users(), {n: i for i, n in enumerate(nodes)}
    keep = set(graph.outputs) | {v for _, v in graph.updates}

    def prefix(k: int):
        live = [v for n in nodes[:k + 1] for v in n.outputs
                if v in keep or any(position[u] > k for u in users.get(v, ()))]
        sub = subgraph(nodes[:k + 1], list(nodes[k].outputs) + live, f"{graph.name}_{k}")
        return diverging_output(sub, backend, values, differs)

    lo, hi = 0, len(nodes) - 1
    if prefix(hi) is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if prefix(mid) is not None else (mid + 1, hi)
    return lo, prefix(lo)[1]


def write_node_repro(graph: Graph, index: int, backend: str, values: dict, differs: Differs,
                     path_stem: str) -> tuple[str, str, bool]:
    """Save the repro of node `index`: the node alone with its inputs as graph inputs, or,
    when that alone runs right on `backend`, the nodes up to it that it depends on. Returns the
    `.gir` and `.npz` paths and whether the node alone diverges."""
    node = graph.nodes[index]
    sub = subgraph([node], list(node.outputs), f"{graph.name}_node{index}")
    isolated = diverging_output(sub, backend, values, differs) is not None
    if not isolated:
        needed, kept = set(node.outputs), []
        for n in reversed(graph.nodes[:index + 1]):  # only what the node depends on
            if needed.intersection(n.outputs):
                kept.append(n)
                needed.update(n.inputs)
        sub = subgraph(kept[::-1], list(node.outputs), f"{graph.name}_prefix{index}")
    gir, npz = save_repro(sub, [values[v.name] for v in sub.inputs],
                          f"{path_stem}_node{index}")
    return gir, npz, isolated


__all__ = ["first_divergent_node", "load_repro", "record_values", "run_repro", "save_repro",
           "subgraph", "write_node_repro"]
