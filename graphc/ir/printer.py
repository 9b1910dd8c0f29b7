"""The IR text form (see STYLE.md): typed, compact, and parseable back by graphc.ir.parser.

    graph @mlp(%x: f32[32,784], %w: f32[784,10]) -> (f32[32,10]) {
      %0: f32[32,10] = matmul(%x, %w)                       # model.py:14
      %1: f32[32,10] = relu(%0)                             # model.py:15
      %w <- %2
      return (%1)
    }

`%w <- %2` records that the graph writes %2 back into its input %w (an in-place update).

Attributes print in brackets after the op name as literals: ints, floats (always with a '.'
or an exponent, `inf`, `-inf`, `nan`), `true`/`false`, `none`, double-quoted strings and
parenthesised tuples (`(1,)` for one element).
"""

from __future__ import annotations

import json
import math
from typing import Any

from graphc.ir.graph import Graph, Node, Value

COMMENT_COLUMN = 56


def format_literal(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (tuple, list)):
        items = [format_literal(v) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    raise TypeError(f"IR attributes must be literals, got {type(value).__name__}: {value!r}")


def format_value(v: Value) -> str:
    return f"%{v.name}"


def format_attrs(attrs: dict) -> str:
    if not attrs:
        return ""
    return "[" + ", ".join(f"{k}={format_literal(v)}" for k, v in attrs.items()) + "]"


def format_node(node: Node) -> str:
    outs = ", ".join(f"%{v.name}: {v.type}" for v in node.outputs)
    args = ", ".join(format_value(v) for v in node.inputs)
    text = f"{outs} = {node.op}{format_attrs(node.attrs)}({args})"
    if node.loc:
        text = text.ljust(COMMENT_COLUMN - 2) + f"  # {node.loc}"
    return text


def format_graph(g: Graph) -> str:
    params = ", ".join(f"%{v.name}: {v.type}" for v in g.inputs)
    results = ", ".join(str(v.type) for v in g.outputs)
    lines = [f"graph @{g.name}({params}) -> ({results}) {{"]
    lines += ["  " + format_node(n) for n in g.nodes]
    lines += [f"  %{target.name} <- %{value.name}" for target, value in g.updates]
    lines.append("  return (" + ", ".join(format_value(v) for v in g.outputs) + ")")
    lines.append("}")
    return "\n".join(lines)
