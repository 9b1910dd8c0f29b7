"""common: the lowering plumbing every backend shares, written once.

- `LoweringError`: what a backend raises for an op (or a form of it) it has no lowering for,
  with one wording: `<backend> backend: no lowering for <what> (node <node> at <loc>);
  compile this graph with backend="..."`. Each backend subclasses it (CpuLoweringError,
  CudaLoweringError) and names the backends to use instead.
- `planned(graph)`: the graph's memory plan, made once by `plan_buffers` when the graph has
  none (every backend lowers a planned graph; none calls the planner its own way).
- The lowering table contract: each backend declares one module-level `LOWERINGS` dict from
  op name to `lower(lowerer, node)`, like tinygrad's `code_for_op`, and a `SCALAR_LOWERINGS`
  dict from scalar op name (an OpDef's `scalar`) to the code of one element; an elementwise
  op with a scalar rule the backend renders needs no `LOWERINGS` entry of its own.
  `REFUSALS` maps the ops a backend declines on purpose to the reason. `find_lowering` picks
  the entry of a node; `lower_node` is the shared prologue every scheduled node goes
  through (place its outputs, skip what needs no code, dispatch or refuse).
- Strides: `contiguous_strides`, `element_strides` / `byte_strides`, `broadcast_strides` (an
  operand read over a larger domain) and `view_of` (a view op's offset and strides from its
  OpDef's pure `view_strides` rule, never from numpy run on a stand-in buffer).
"""

from __future__ import annotations

from typing import Any, Callable

from graphc.errors import GraphcError
from graphc.ir.graph import Graph, Node
from graphc.ir.printer import format_node
from graphc.ops.registry import ELEMENTWISE, REGISTRY
from graphc.ops.shapes import contiguous_element_strides

Lowering = Callable[[Any, Node], None]

# The ops that still write an output when another of their outputs is empty: nll_loss's
# total weight is a scalar even when there are no losses (it is 0 then).
_WRITES_WHEN_EMPTY = ("nll_loss",)


class LoweringError(GraphcError, NotImplementedError):
    """An op (or a form of it) a backend has no lowering for. Subclasses set `backend` and
    `instead` (the backends that compile the graph instead)."""

    backend = "a"
    instead: tuple[str, ...] = ("interp",)

    @classmethod
    def at(cls, node: Node, what: str) -> "LoweringError":
        """The error for `what` (e.g. "the op 'foo'", "conv2d on float64") at `node`."""
        where = f" at {node.loc}" if node.loc else ""
        others = " or ".join(f'backend="{name}"' for name in cls.instead)
        return cls(f"{cls.backend} backend: no lowering for {what} (node {format_node(node)}"
                   f"{where}); compile this graph with {others}")


def planned(graph: Graph):
    """The graph's memory plan (`graph.meta["memory_plan"]`), planned now if it has none."""
    if "memory_plan" not in graph.meta:
        from graphc.passes.plan import plan_buffers

        plan_buffers(graph)
    return graph.meta["memory_plan"]


# ---- lowering tables ------------------------------------------------------------------------
def find_lowering(op: str, lowerings: dict[str, Lowering], scalar_lowerings: dict,
                  elementwise: Lowering) -> Lowering | None:
    """The lowering of `op`: its own table entry, else `elementwise` for an elementwise op
    whose scalar rule the backend renders, else None."""
    if op in lowerings:
        return lowerings[op]
    opdef = REGISTRY.get(op)
    if opdef is not None and opdef.kind == ELEMENTWISE and opdef.scalar in scalar_lowerings:
        return elementwise
    return None


def needs_no_code(node: Node, plan) -> bool:
    """A view the plan keeps as a view (its location says where it is), or a node with an
    empty output (nothing to compute; nll_loss excepted, see _WRITES_WHEN_EMPTY)."""
    opdef = REGISTRY.get(node.op)
    if opdef is not None and opdef.view and all(v.name in plan.views for v in node.outputs):
        return True
    return any(v.type.numel == 0 for v in node.outputs) and node.op not in _WRITES_WHEN_EMPTY


def lower_node(lowerer, node: Node, lowering: Lowering | None,
               error: type[LoweringError]) -> None:
    """The prologue every scheduled node goes through: `lowerer.place(node)` places its
    outputs; a node that needs no code stops there; otherwise `lowering(lowerer, node)`
    appends its code, and a node with no lowering raises `error`."""
    lowerer.place(node)
    if needs_no_code(node, lowerer.plan):
        return
    if lowering is None:
        raise error.at(node, f"the op {node.op!r}")
    lowering(lowerer, node)


def coverage(lowerings: dict[str, Lowering], scalar_lowerings: dict,
             refusals: dict[str, str]) -> dict[str, str]:
    """For every registry op, how a backend handles it: "lowered", "scalar <name>" (an
    elementwise op through its scalar rule), "refused: <reason>", or "missing"."""
    out = {}
    for name, opdef in sorted(REGISTRY.items()):
        if name in lowerings:
            out[name] = "lowered"
        elif opdef.kind == ELEMENTWISE and opdef.scalar in scalar_lowerings:
            out[name] = f"scalar {opdef.scalar}"
        elif name in refusals:
            out[name] = f"refused: {refusals[name]}"
        else:
            out[name] = "missing"
    return out


# ---- strides ------------------------------------------------------------------------------
def contiguous_strides(shape, itemsize: int = 1) -> tuple[int, ...]:
    """Row-major strides of `shape` in units of `itemsize` (1: elements)."""
    return byte_strides(contiguous_element_strides(tuple(shape)), itemsize)


def element_strides(byte_strides: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    return tuple(s // itemsize for s in byte_strides)


def byte_strides(element_strides: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    return tuple(s * itemsize for s in element_strides)


def broadcast_strides(shape, strides, domain) -> tuple[int, ...]:
    """Strides of a tensor of `shape` read at every index of `domain` (right-aligned): 0 along
    the dims it is broadcast over."""
    pad = len(domain) - len(shape)
    return tuple(0 if d < pad or shape[d - pad] == 1 else strides[d - pad]
                 for d in range(len(domain)))


def view_of(node: Node, shape: tuple[int, ...],
            strides: tuple[int, ...]) -> tuple[int, tuple[int, ...]] | None:
    """(element offset, element strides) of the view op `node`'s output over a source of
    `shape` and element `strides`, from its OpDef's `view_strides` rule; None where the op's
    kernel would copy."""
    return REGISTRY[node.op].view_strides(tuple(shape), tuple(strides), **node.attrs)


__all__ = ["LoweringError", "broadcast_strides", "byte_strides", "contiguous_strides", "coverage",
           "element_strides", "find_lowering", "lower_node", "needs_no_code", "planned",
           "view_of"]
