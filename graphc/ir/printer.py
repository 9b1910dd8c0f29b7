"""The IR text form (see STYLE.md): typed, compact, and parseable back by graphc.ir.parser.

    graph @mlp(%x: f32[32,784], %w: f32[784,10]) -> (f32[32,10]) {
      %0: f32[32,10] = matmul(%x, %w)                       # model.py:14
      %1: f32[32,10] = relu(%0)                             # model.py:15
      %w <- %2
      return (%1)
    }

`%w <- %2` records that the graph writes %2 back into its input %w (an in-place update).

A custom `autograd.Function` the traced code applied is a `function` line right after the last
node its forward recorded (`FunctionRegion`, kept in `graph.meta["functions"]`):

      function Clip[class="model:Clip", nodes=2, saved=(%x,), ctx.low=-1.0](%x, -1.0) -> (%1)

says that the 2 nodes above it are the forward of `model.Clip` applied to (%x, -1.0), that its
output is %1, that it saved %x with `ctx.save_for_backward` and set `ctx.low = -1.0`;
`derive_backward` calls `Clip.backward` there instead of differentiating those nodes.

IR text never imports code. `class="model:Clip"` names a class that must already be
registered: every `autograd.Function` subclass registers itself under "module:qualname" when
its class statement runs (`register_function_class`), so the user's code imports `model`
before parsing. Reading a name that is not registered is a ParseError that says so.

Attributes print in brackets after the op name as literals: ints, floats (always with a '.'
or an exponent, `inf`, `-inf`, `nan`), `true`/`false`, `none`, double-quoted strings and
parenthesised tuples (`(1,)` for one element).
"""

from __future__ import annotations

import json
import math
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from graphc.ir.graph import Graph, Node, Value
from graphc.symbolic import Sym

COMMENT_COLUMN = 56


def format_literal(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, Sym)):  # a symbolic size prints as its expression (s0*784)
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


@dataclass(eq=False)
class Opaque:
    """A Function argument or ctx attribute that is no IR literal (a dtype object, a module).
    `value` is the object itself in memory; IR text keeps only its type name, so a parsed
    graph has `value=MISSING`."""

    type_name: str
    value: Any = None


MISSING = object()  # the value of an Opaque read back from text


@dataclass(eq=False)
class FunctionRegion:
    """One application of a custom `autograd.Function` in a graph (see the module docstring).

    Items (`args`, `outputs`, `saved`, `ctx` values) are graph Values (tensors), literals,
    tuples of items, or `Opaque`. The region's forward is the `nodes` nodes before position
    `end` of `graph.nodes`; `end` is where the `function` line prints. `cls` is the Function
    class in memory (None after parsing: `function_class()` finds it in the registry).
    """

    class_path: str  # "module:qualname"
    args: tuple
    outputs: tuple
    end: int
    nodes: int
    saved: tuple = ()
    ctx: dict[str, Any] = field(default_factory=dict)
    non_differentiable: tuple[int, ...] = ()
    dirty: tuple[int, ...] = ()
    materialize_grads: bool = True
    loc: str | None = None
    cls: Any = None

    @property
    def name(self) -> str:
        return self.class_path.rsplit(":", 1)[-1].rsplit(".", 1)[-1]

    def values(self) -> list[Value]:
        """Every graph Value the region refers to."""
        found: list[Value] = []
        _collect(self.args + self.outputs + self.saved + tuple(self.ctx.values()), found)
        return found

    def function_class(self) -> type:
        """The Function class: `cls`, or the registered class named by `class_path`
        (LookupError, saying what to do, if there is none). Never imports anything."""
        if self.cls is None:
            return registered_function_class(self.class_path)
        return self.cls


# ---- the Function classes IR text may name ---------------------------------------------------
# "module:qualname" -> class; weak, so a registered class can still be collected.
_FUNCTION_CLASSES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_FUNCTION_CLASSES_LOCK = threading.Lock()


def function_class_path(cls: type) -> str:
    """The name a `function` line gives `cls`: "module:qualname"."""
    return f"{cls.__module__}:{cls.__qualname__}"


def register_function_class(cls: type) -> None:
    """Let IR text name `cls` (an `autograd.Function` subclass) by its `function_class_path`.

    `autograd.Function.__init_subclass__` calls it for every subclass, so defining the class
    (importing its module) is what registers it. A class defined inside a function is not
    registered: its path does not name one class. A later class with the same path (a module
    imported again) replaces the earlier one.
    """
    path = function_class_path(cls)
    if "<locals>" not in path:
        with _FUNCTION_CLASSES_LOCK:
            _FUNCTION_CLASSES[path] = cls


def registered_function_class(path: str) -> type:
    """The class registered under `path` ("module:qualname"); LookupError with the reason and
    what to do if there is none. IR text never imports a module to find one."""
    if "<locals>" in path:
        raise LookupError(
            f"custom autograd.Function {path} was defined inside a function, so IR text "
            "cannot name it; derive the backward on the traced graph in memory, or define the "
            "Function at module level")
    with _FUNCTION_CLASSES_LOCK:
        cls = _FUNCTION_CLASSES.get(path)
    if cls is None:
        module = path.partition(":")[0]
        raise LookupError(
            f"custom autograd.Function {path} is not registered (IR text never imports code): "
            f"import the module that defines it ({module}) before reading this text")
    return cls


def _collect(item, found: list[Value]) -> None:
    if isinstance(item, Value):
        found.append(item)
    elif isinstance(item, tuple):
        for x in item:
            _collect(x, found)


def format_item(item: Any) -> str:
    """A function line's item: a value (`%x`), an opaque object, or a literal (of items)."""
    if isinstance(item, Value):
        return format_value(item)
    if isinstance(item, Opaque):
        return f"opaque({format_literal(item.type_name)})"
    if isinstance(item, tuple):
        parts = [format_item(x) for x in item]
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    return format_literal(item)


def _items(items: tuple) -> str:
    return ", ".join(format_item(x) for x in items)


def format_region(region: FunctionRegion) -> str:
    attrs: dict[str, Any] = {"class": region.class_path, "nodes": region.nodes}
    if region.saved:
        attrs["saved"] = region.saved
    if region.non_differentiable:
        attrs["non_differentiable"] = region.non_differentiable
    if region.dirty:
        attrs["dirty"] = region.dirty
    if not region.materialize_grads:
        attrs["materialize_grads"] = False
    attrs.update({f"ctx.{k}": v for k, v in region.ctx.items()})
    text = (f"function {region.name}["
            + ", ".join(f"{k}={format_item(v)}" for k, v in attrs.items())
            + f"]({_items(region.args)}) -> ({_items(region.outputs)})")
    if region.loc:
        text = text.ljust(COMMENT_COLUMN - 2) + f"  # {region.loc}"
    return text


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
    regions: dict[int, list[FunctionRegion]] = {}
    for region in g.meta.get("functions", ()):
        regions.setdefault(min(region.end, len(g.nodes)), []).append(region)
    lines += ["  " + format_region(r) for r in regions.get(0, ())]
    for i, node in enumerate(g.nodes):
        lines.append("  " + format_node(node))
        lines += ["  " + format_region(r) for r in regions.get(i + 1, ())]
    lines += [f"  %{target.name} <- %{value.name}" for target, value in g.updates]
    lines.append("  return (" + ", ".join(format_value(v) for v in g.outputs) + ")")
    lines.append("}")
    return "\n".join(lines)
