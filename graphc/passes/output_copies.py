"""drop_output_copies: a graph output that is a copy of a value the graph computes is that
value itself.

Autograd accumulates a parameter's gradient with `copy(g)` when `g` is shared (a batch
norm's weight gradient is also read by its input gradient: PyTorch's AccumulateGrad clones
such a gradient too), so a training step returns `.grad` values that are copies of values
it still holds: one small kernel each (26 in the ResNet-18 step, most of them a launch of
their own on a GPU, where every launch costs microseconds). In SSA form the copy equals its
source, so the output can be the source; the executables return every output as a new
array, so no two results share memory.

A copy is dropped when its output is a graph output and no update value, and its source is
computed by a node that is not a view (so it owns its buffer), is no graph output itself
and is copied only once; readers of the copy read the source instead. The cuda pipeline runs
it before fuse (graphc.passes.default_passes).
Needs: a verified graph. Guarantees: the same outputs, values and updates; the result
verifies.

>>> from graphc.ir import parse
>>> g = drop_output_copies(parse('''graph @f(%x: f32[3]) -> (f32[3], f32[3]) {
...   %0: f32[3] = exp(%x)
...   %1: f32[3] = copy(%0)
...   %2: f32[3] = neg(%0)
...   return (%1, %2)
... }'''))
>>> [n.op for n in g.nodes], [v.name for v in g.outputs]
(['exp', 'neg'], ['0', '2'])
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node, Value
from graphc.ir.verifier import verify
from graphc.ops.registry import REGISTRY

__all__ = ["drop_output_copies"]


def drop_output_copies(graph: Graph) -> Graph:
    """Drop the copies whose output is a graph output and whose source the graph computes
    (see the module docstring). The input graph is left unchanged."""
    producer: dict[Value, Node] = {v: n for n in graph.nodes for v in n.outputs}
    outputs = set(graph.outputs)
    updated = {v for _, v in graph.updates} | {t for t, _ in graph.updates}
    copies: dict[Value, int] = {}
    for node in graph.nodes:
        if node.op == "copy":
            copies[node.inputs[0]] = copies.get(node.inputs[0], 0) + 1
    replaced: dict[Value, Value] = {}
    for node in graph.nodes:
        if node.op != "copy":
            continue
        (src,), (out,) = node.inputs, node.outputs
        source = producer.get(src)
        if (out in outputs and out not in updated and src not in outputs
                and src not in updated and source is not None
                and not REGISTRY[source.op].view and copies[src] == 1
                and src.type == out.type):
            replaced[out] = src
    if not replaced:
        return graph

    def new(v: Value) -> Value:
        return replaced.get(v, v)

    nodes = [n if not any(v in replaced for v in n.inputs) else
             Node(n.op, [new(v) for v in n.inputs], dict(n.attrs), list(n.outputs), n.loc)
             for n in graph.nodes if not (n.op == "copy" and n.outputs[0] in replaced)]
    out = Graph(graph.name, list(graph.inputs), nodes, [new(v) for v in graph.outputs],
                [(t, new(v)) for t, v in graph.updates])
    out.meta = dict(graph.meta)
    verify(out)
    return out
