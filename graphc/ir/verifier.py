"""The IR verifier: def-before-use, single definition, types against each op's rule, attrs.

`verify(graph)` raises `VerifyError` naming the node, its text line and what was expected and
what came; it returns the graph so passes can write `return verify(g)` in debug mode. Ops the
registry does not know (backend-level ops such as fused groups) must be declared in
`EXTRA_OPS` with their own checker.
"""

from __future__ import annotations

from typing import Callable

from graphc.errors import GraphcError
from graphc.ir.graph import Graph, Node
from graphc.ir.printer import format_node
from graphc.ops.registry import REGISTRY
from graphc.symbolic import Sym
from graphc.types import TensorType

# op name -> checker(node) that raises VerifyError; for ops outside the registry.
EXTRA_OPS: dict[str, Callable[[Node], None]] = {}

_ATTR_TYPES = {int: (int, Sym), float: (int, float, Sym), bool: (bool,), str: (str,),
               tuple: (tuple,)}


class VerifyError(GraphcError, RuntimeError):
    """The graph breaks an IR invariant."""


def _fail(node: Node, message: str) -> None:
    raise VerifyError(f"{node.op} at {node.loc or 'unknown location'}: {message}\n"
                      f"  in: {format_node(node)}")


def _check_attrs(node: Node, schema: dict) -> None:
    for key, value in node.attrs.items():
        if key not in schema:
            _fail(node, f"unknown attribute {key!r}; {node.op} takes {sorted(schema)}")
        allowed = _ATTR_TYPES.get(schema[key])
        if value is not None and allowed and not isinstance(value, allowed):
            _fail(node, f"attribute {key}={value!r} should be {schema[key].__name__}")
        if isinstance(value, bool) and schema[key] in (int, float):
            _fail(node, f"attribute {key}={value!r} should be {schema[key].__name__}")


def _check_types(node: Node) -> None:
    opdef = REGISTRY[node.op]
    if not opdef.variadic and len(node.inputs) != len(opdef.inputs):
        _fail(node, f"takes {len(opdef.inputs)} inputs {opdef.inputs}, got {len(node.inputs)}")
    if opdef.attrs:
        _check_attrs(node, opdef.attrs)
    try:
        inferred = opdef.infer(*(v.type for v in node.inputs), **node.attrs)
    except (GraphcError, TypeError) as err:
        _fail(node, f"the op's shape rule rejects the inputs: {err}")
    except Exception as err:  # IR text from anyone: an attribute a rule cannot read at all
        detail = f"{type(err).__name__}: {err}"[:300]
        _fail(node, f"the op's shape rule rejects the attributes: {detail}")
    if isinstance(inferred, TensorType):
        inferred = (inferred,)
    got = tuple(v.type for v in node.outputs)
    if tuple(inferred) != got:
        _fail(node, f"output types {[str(t) for t in got]} differ from the op's rule: "
                    f"{[str(t) for t in inferred]}")


def verify(graph: Graph) -> Graph:
    defined = set()
    for v in graph.inputs:
        if v in defined:
            raise VerifyError(f"graph @{graph.name}: input %{v.name} appears twice")
        defined.add(v)
    names = {v.name for v in graph.inputs}
    for node in graph.nodes:
        for v in node.inputs:
            if v not in defined:
                _fail(node, f"%{v.name} is used before it is defined")
        for v in node.outputs:
            if v in defined or v.name in names:
                _fail(node, f"%{v.name} is defined twice")
            defined.add(v)
            names.add(v.name)
        if node.op in EXTRA_OPS:
            EXTRA_OPS[node.op](node)
        elif node.op in REGISTRY:
            _check_types(node)
        else:
            _fail(node, f"unknown op {node.op!r} (not in the registry)")
    for v in graph.outputs:
        if v not in defined:
            raise VerifyError(f"graph @{graph.name}: output %{v.name} is never defined")
    _check_updates(graph, defined)
    return graph


def _check_updates(graph: Graph, defined: set) -> None:
    inputs, seen = set(graph.inputs), set()
    for target, value in graph.updates:
        where = f"graph @{graph.name}: update %{target.name} <- %{value.name}"
        if target not in inputs:
            raise VerifyError(f"{where}: only graph inputs can be updated in place")
        if target in seen:
            raise VerifyError(f"{where}: %{target.name} is updated twice")
        if value not in defined:
            raise VerifyError(f"{where}: %{value.name} is never defined")
        if value.type != target.type:
            raise VerifyError(f"{where}: the new value is {value.type}, the input {target.type}")
        seen.add(target)
