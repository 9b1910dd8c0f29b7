"""The IR data structures: `Value`, `Node`, `Graph`.

A graph is typed SSA: every `Value` is defined once (as a graph input or a node output) and
carries a `TensorType`. A `Node` applies one registry op (or a backend-level op such as a
fused group) to input values with literal attributes and defines output values; it remembers
the user's source line it was traced from. A `Graph` has named inputs, nodes in a valid
execution order, and outputs. Equality is structural (names, types, ops, attributes), so
`parse(print(g)) == g` is a meaningful test.

`updates` lists in-place writes to graph inputs as (input, new value) pairs: a module buffer
or parameter that the traced code changed in place (BatchNorm's running stats, an optimizer
step). An executable writes each new value back into the tensor bound to that input after
the run, so the graph itself stays pure SSA.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from graphc.types import TensorType


@dataclass(eq=False)
class Value:
    """A typed SSA value. Identity matters inside a graph; `name` is for printing."""

    name: str
    type: TensorType

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


@dataclass(eq=False)
class Node:
    """One op application: `outputs = op[attrs](inputs)`, traced from `loc`."""

    op: str
    inputs: list[Value]
    attrs: dict[str, Any]
    outputs: list[Value]
    loc: str | None = None

    def __repr__(self) -> str:
        from graphc.ir.printer import format_node

        return format_node(self)


@dataclass(eq=False)
class Graph:
    """Inputs, nodes in execution order, outputs. See the module docstring."""

    name: str
    inputs: list[Value] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    updates: list[tuple[Value, Value]] = field(default_factory=list)
    # Analysis results passes leave for later stages (e.g. "memory_plan" from plan_buffers).
    # Not part of the text form or of equality; a pass that changes the graph drops stale keys.
    meta: dict[str, Any] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __str__(self) -> str:
        from graphc.ir.printer import format_graph

        return format_graph(self)

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return structural_key(self) == structural_key(other)

    __hash__ = None  # mutable

    def users(self) -> dict[Value, list[Node]]:
        """For each value, the nodes that read it (in execution order)."""
        out: dict[Value, list[Node]] = {v: [] for v in self.inputs}
        for node in self.nodes:
            for v in node.outputs:
                out.setdefault(v, [])
            for v in node.inputs:
                out.setdefault(v, []).append(node)
        return out

    def producers(self) -> dict[Value, Node]:
        return {v: node for node in self.nodes for v in node.outputs}


def structural_key(g: Graph) -> tuple:
    """A hashable description of the graph independent of Value object identity."""
    index: dict[Value, int] = {}

    def ref(v: Value) -> tuple:
        return (index.setdefault(v, len(index)), v.name, v.type)

    inputs = tuple(ref(v) for v in g.inputs)
    nodes = tuple(
        (n.op, tuple(ref(v) for v in n.inputs), _freeze(n.attrs),
         tuple(ref(v) for v in n.outputs), n.loc)
        for n in g.nodes
    )
    outputs = tuple(ref(v) for v in g.outputs)
    updates = tuple((ref(a), ref(b)) for a, b in g.updates)
    return (g.name, inputs, nodes, outputs, updates)


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, float) and value != value:
        return ("nan",)
    return (type(value).__name__, value)
