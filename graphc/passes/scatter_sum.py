"""scatter_sum: a sum of slices scattered into zeros, built as one concat instead.

Reverse-mode autodiff of `x[t]` or `x.chunk(k)` gives each piece's gradient as
`slice_scatter(zeros, g, region)`, a full-size tensor that is zero outside the region, and
sums those tensors: an LSTM over T steps scatters each step's gate gradient into a zero
[T, B, 4H] tensor and adds the T of them (T full-size writes and a T-input add, O(T^2) memory
traffic; 26 ms of a 32-step LSTM step's ~70 ms), and splits each step's gates the same way.
When the regions are disjoint slabs along one axis, the sum is their concatenation along that
axis, with zeros in the gaps:

    add(slice_scatter(Z, a, [s_a, e_a)), slice_scatter(Z, b, [s_b, e_b)))  ->
        concat(<zeros>, a, <zeros>, b, <zeros>)      (Z a `full` of 0.0; gaps as `full` 0.0)

and a chain or tree of such adds becomes one concat. Every element is the one piece that
covers it, or zero: the same value as the sum (x + 0 is x exactly in floating point, up to
the sign of a zero), so this is no reassociation.
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node, Value
from graphc.types import TensorType

# value -> (axis, [(start, stop, source)]) for values that are zeros but for disjoint slabs
Slabs = tuple[int, list[tuple[int, int, Value]]]


def _zero_fill(node: Node | None) -> bool:
    return node is not None and node.op == "full" and node.attrs["value"] == 0


def _slab(node: Node, producer: dict[Value, Node]) -> Slabs | None:
    """(axis, [(start, stop, source)]) when `node` scatters its source into zeros over
    [start, stop) of one axis and every element of the other axes; else None."""
    base, source = node.inputs
    shape = tuple(node.outputs[0].type.shape)
    starts, stops, steps = node.attrs["starts"], node.attrs["stops"], node.attrs["steps"]
    if not all(isinstance(d, int) for d in shape + tuple(starts) + tuple(stops) + tuple(steps)):
        return None  # symbolic sizes: whether slabs meet is not known at compile time
    if not _zero_fill(producer.get(base)) or any(s != 1 for s in steps):
        return None
    partial = [d for d, (lo, hi, n) in enumerate(zip(starts, stops, shape))
               if (lo, hi) != (0, n)]
    if len(partial) != 1:
        return None
    axis = partial[0]
    region = shape[:axis] + (stops[axis] - starts[axis],) + shape[axis + 1:]
    if tuple(source.type.shape) != region or source.type.dtype != node.outputs[0].type.dtype:
        return None
    return axis, [(starts[axis], stops[axis], source)]


def _merged(a: Slabs | None, b: Slabs | None) -> Slabs | None:
    """The slabs of a + b when both are slabs along the same axis and none overlap."""
    if a is None or b is None or a[0] != b[0]:
        return None
    pieces = sorted(a[1] + b[1], key=lambda p: p[0])
    if any(prev[1] > nxt[0] for prev, nxt in zip(pieces, pieces[1:])):
        return None
    return a[0], pieces


def _concat_nodes(out: Value, slabs: Slabs, names, loc: str | None) -> list[Node]:
    """Nodes computing `out` as the concat of the slabs and zero gaps between them."""
    axis, pieces = slabs
    shape, dtype = tuple(out.type.shape), out.type.dtype
    nodes: list[Node] = []
    parts: list[Value] = []

    def gap(lo: int, hi: int) -> None:
        if hi <= lo:
            return
        zeros = names.value(TensorType(shape[:axis] + (hi - lo,) + shape[axis + 1:], dtype))
        attrs = {"shape": tuple(zeros.type.shape), "value": 0.0 if dtype.is_floating else 0,
                 "dtype": dtype.name}
        nodes.append(Node("full", [], attrs, [zeros], loc))
        parts.append(zeros)

    at = 0
    for start, stop, source in pieces:
        gap(at, start)
        parts.append(source)
        at = stop
    gap(at, shape[axis])
    nodes.append(Node("concat", parts, {"axis": axis}, [out], loc))
    return nodes


def concat_disjoint_scatters(graph: Graph) -> Graph:
    """Rewrite every `add` of two values that are zeros but for disjoint slabs along one axis
    (slice_scatters into a zero `full`, or such adds) as a `concat` of the slabs and zero
    gaps (see the module docstring); the scatters and adds it no longer reads are left to
    eliminate_dead_code.

    Needs: a graph that verifies. Rewrites only an add whose operands and result have one
    type (no broadcasting), of slabs with unit steps whose sources have the slab's shape and
    dtype. Guarantees: the add's output value is now the concat's, at the add's place, with
    its location; values equal to the sum's (up to the sign of zeros). It is one of
    simplify's passes (graphc.passes.simplify.PASSES), whose helpers it uses.
    """
    from graphc.passes.simplify import _Names, _rebuild

    producer = graph.producers()
    names = _Names(graph)
    slabs: dict[Value, Slabs] = {}
    nodes: list[Node] = []
    changed = False
    for node in graph.nodes:
        if node.op == "slice_scatter":
            found = _slab(node, producer)
            if found is not None:
                slabs[node.outputs[0]] = found
        elif node.op == "add" and node.inputs[0].type == node.inputs[1].type == \
                node.outputs[0].type:
            found = _merged(slabs.get(node.inputs[0]), slabs.get(node.inputs[1]))
            if found is not None:
                slabs[node.outputs[0]] = found
                nodes += _concat_nodes(node.outputs[0], found, names, node.loc)
                changed = True
                continue
        nodes.append(node)
    if not changed:
        return graph
    return _rebuild(graph, nodes)


__all__ = ["concat_disjoint_scatters"]
