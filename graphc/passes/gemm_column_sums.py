"""fuse_gemm_column_sums: a bias gradient's column sum joins the GEMM epilogue that makes its input.

A Linear layer's bias gradient is `reduce_sum(g, axes=(0, 1))` over the [B, T, C] gradient
g of its output. When g is computed by a GEMM with an epilogue (the GPT's linear1: dX of
linear2 times the GELU derivative, `fused(matmul, mul)`), the sum is a separate kernel that
reads all of g again after other kernels pushed it out of cache (80 us of the GPT step's
[16, 64, 512] per layer at one thread, 2 MB from memory). Appended to the epilogue as the
body's ending reduction, it accumulates each element while the epilogue holds it in a
register (graphc.backends.cpu.codegen: a fused GEMM epilogue ending in a reduction is the
GEMM, then one reduction kernel that also stores the epilogue's outputs).

The rewrite: `%s = reduce_sum[axes](%g)` where %g is an output of a `fused` node whose body
has a GEMM anchor and no ending, every output of that node has %g's shape (the reduction
kernel walks %g's domain and stores them all there) and %s's dtype is %g's. The fused node
gains the reduce_sum as its last instruction and %s as its last output; the reduce_sum node
goes. The numbers are the same: the sum adds the same values in the same order (over the
domain, row by row), reading them from a register instead of memory.

Run after the fusion passes (`fuse`, `fuse_rows`) and before `lay_out_gemm_outputs` and
`plan_buffers`; cpu pipeline only (its backend lowers a reducing epilogue). Needs: a verified
graph. Guarantees: the same values; each merged node sits where its GEMM node was, which is
before every reader of %s; the result verifies; the input graph is left unchanged.

>>> from graphc.ir import parse
>>> epilogue = '(("matmul", (0, 1), ()), ("mul", (3, 2), ()))'
>>> g = fuse_gemm_column_sums(parse(f'''graph @f(%x: f32[4,8,16], %w: f32[16,32],
...     %d: f32[4,8,32]) -> (f32[4,8,32], f32[32]) {{
...   %0: f32[4,8,32] = fused[body={epilogue}, outputs=(4,)](%x, %w, %d)
...   %1: f32[32] = reduce_sum[axes=(0, 1), keepdim=false](%0)
...   return (%0, %1)
... }}'''))
>>> [n.op for n in g.nodes], g.nodes[0].attrs["outputs"]
(['fused'], (4, 5))
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node
from graphc.ir.verifier import verify
from graphc.ops.fused import FusedBody

__all__ = ["fuse_gemm_column_sums"]


def fuse_gemm_column_sums(graph: Graph) -> Graph:
    """Move each column sum of a GEMM epilogue's output into that epilogue (see the module
    docstring). Returns a new graph, or the same one when nothing changed."""
    producer = graph.producers()
    merged: dict[int, Node] = {}  # id(original fused node) -> its node with the sums
    dropped: set[int] = set()
    for node in graph.nodes:
        if node.op != "reduce_sum" or len(node.inputs) != 1:
            continue
        g = node.inputs[0]
        gemm = producer.get(g)
        if gemm is None or gemm.op != "fused":
            continue
        current = merged.get(id(gemm), gemm)
        joined = _joined(current, g, node)
        if joined is not None:
            merged[id(gemm)] = joined
            dropped.add(id(node))
    if not merged:
        return graph
    nodes = [merged.get(id(n), n) for n in graph.nodes if id(n) not in dropped]
    out = Graph(graph.name, list(graph.inputs), nodes, list(graph.outputs), list(graph.updates))
    out.meta = dict(graph.meta)
    verify(out)
    return out


def _joined(gemm: Node, g, column_sum: Node) -> Node | None:
    """`gemm` with `column_sum` (a reduce_sum of its output g) as its body's ending, or None
    where the rule does not apply (see the module docstring)."""
    body = FusedBody.of_node(gemm)
    if body.anchor is None or body.ending is not None or \
            column_sum.outputs[0].type.dtype != g.type.dtype:
        return None
    if any(tuple(v.type.shape) != tuple(g.type.shape) for v in gemm.outputs):
        return None
    source = body.outputs[gemm.outputs.index(g)]
    instructions = tuple(gemm.attrs["body"]) + \
        (("reduce_sum", (source,), tuple(column_sum.attrs.items())),)
    outputs = tuple(gemm.attrs["outputs"]) + (body.ref(len(body)),)
    return Node("fused", list(gemm.inputs), {"body": instructions, "outputs": outputs},
                list(gemm.outputs) + list(column_sum.outputs), gemm.loc)
