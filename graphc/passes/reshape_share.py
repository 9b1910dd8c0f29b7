"""share_reshape_copies: several reshapes of one value read the first one's result.

An attention layer merges its heads with `permute` then `reshape` (B, H, T, E) ->
(B, T, H*E); the permuted value is not contiguous, so the reshape is a copy. The backward
reshapes the same permuted value again, to (B*T, H*E) for a weight gradient's GEMM: a second
copy of the same bytes (two per head merge, 28 in the 4-layer GPT step). Since
`reshape(x, s2)` equals `reshape(reshape(x, s1), s2)` for any shapes of the same size
(row-major order both ways), every later reshape of x is rewritten to reshape the first
one's result, which is contiguous when it was a copy: the later ones become views.

Run after `simplify` (whose `reshape(reshape(x))` rule would undo this) and before `fuse`.
Needs: a verified graph. Guarantees: the same values (a reshape only renames the elements'
positions); every rewritten reshape still comes after the one it reads; the result verifies.

>>> from graphc.ir import parse
>>> g = share_reshape_copies(parse('''graph @f(%x: f32[2,3,4]) -> (f32[3,8], f32[6,4]) {
...   %0: f32[3,2,4] = permute[dims=(1, 0, 2)](%x)
...   %1: f32[3,8] = reshape[shape=(3, 8)](%0)
...   %2: f32[6,4] = reshape[shape=(6, 4)](%0)
...   return (%1, %2)
... }'''))
>>> g.nodes[2].inputs[0].name
'1'
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node, Value
from graphc.ir.verifier import verify

__all__ = ["share_reshape_copies"]


def share_reshape_copies(graph: Graph) -> Graph:
    """Rewrite each later reshape of a value to reshape the first reshape's result (see the
    module docstring). The input graph is left unchanged."""
    first: dict[Value, Value] = {}
    nodes: list[Node] = []
    changed = False
    for node in graph.nodes:
        if node.op == "reshape":
            source = node.inputs[0]
            earlier = first.get(source)
            if earlier is None:
                first[source] = node.outputs[0]
            elif tuple(earlier.type.shape) != tuple(node.outputs[0].type.shape):
                node = Node("reshape", [earlier], dict(node.attrs), list(node.outputs),
                            node.loc)
                changed = True
        nodes.append(node)
    if not changed:
        return graph
    out = Graph(graph.name, list(graph.inputs), nodes, list(graph.outputs), list(graph.updates))
    out.meta = dict(graph.meta)
    verify(out)
    return out
