"""merge_sibling_sums: fused sums over the same axes of one domain that read the same tensors
become one fused node, walking those tensors once.

A batch-norm backward sums g and g * xhat over every dim but the channel: `fuse` makes two
kernels (a reduction ends its group), the first summing g = where(relu mask, dy, 0) (or, after
a residual add, writing g while it sums it), the second summing where(mask, dy, 0) * (x -
mean) * invstd. Both read dy and the mask; in ResNet-18 each of the two walks an [N, C, H, W]
tensor from memory. As one node, a *sibling-sums* body (elementwise instructions, then two or
more reduce_sums over the same axes of arguments of one shape, none read in the body: see
`trailing_sums`), they read dy and the mask once; a D-shaped value the first one wrote only
for the second is no longer written at all.

The rewrite: for fused nodes A before B, each a sibling-sums body or an ordinary one ending in
one reduce_sum (no contraction anchor, nothing effectful), with the same reduced axes, keepdim
and argument shape, when
- B reads a tensor A reads or a D-shaped output of A (they share bytes), and not A's sums;
- every other input of B is a graph input or made by a node before A;
the merged node stands at A's place: A's inputs, then B's other inputs; A's elementwise
instructions, B's (reading A's values for A's outputs), A's sums, B's sums; the outputs of
both, less A's D-shaped outputs that only B read (not graph outputs or updates). Nodes are
visited in order, and a merged node may take another sibling later (a strided block's two
batch norms read the same g).

Run after the fusion passes (`fuse`, `fuse_rows`, `recompute_row_values`: the recomputed
where(mask, dy, 0) is what makes the two sums read the same tensors) and before
`plan_buffers`; cpu pipeline only (graphc.backends.cpu.sibling_sums lowers the bodies; to the
interpreter a body is its instructions in order). Guarantees: the same values (each sum adds
the same elements; the cpu kernel's order within a row may differ by reassociation); every
value read outside stays an output under its
name; nodes in a topological order; the result verifies; the input graph is left unchanged.

>>> from graphc.ir import parse
>>> g = merge_sibling_sums(parse('''graph @f(%x: f32[4,3,8], %y: f32[4,3,8])
...     -> (f32[3], f32[3]) {
...   %0: f32[3] = fused[body=(("relu", (0,), ()), ("reduce_sum", (1,), (("axes", (0, 2)),
...       ("keepdim", false)))), outputs=(2,)](%x)
...   %1: f32[3] = fused[body=(("mul", (0, 1), ()), ("reduce_sum", (2,), (("axes", (0, 2)),
...       ("keepdim", false)))), outputs=(3,)](%x, %y)
...   return (%0, %1)
... }'''))
>>> [op for op, _, _ in g.nodes[0].attrs["body"]], len(g.nodes)
(['relu', 'mul', 'reduce_sum', 'reduce_sum'], 1)
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node
from graphc.ir.verifier import verify
from graphc.ops.fused import FusedBody, effectful
from graphc.ops.registry import REGISTRY

__all__ = ["is_sibling_sums", "merge_sibling_sums", "trailing_sums"]

MERGE = True  # False: the pass leaves every graph as it is (benchmarks' A/B)


def trailing_sums(fb: FusedBody) -> list[int] | None:
    """The instruction indices of the body's trailing reduce_sums when they all reduce the
    same axes (keepdim alike) of arguments of one shape and nothing in the body reads them,
    no other instruction ends a group and there is no contraction anchor; else None."""
    if fb.anchor is not None:
        return None
    k = len(fb.instructions)
    while k and fb.instructions[k - 1].op == "reduce_sum":
        k -= 1
    sums = list(range(k, len(fb.instructions)))
    if not sums:
        return None
    refs = {fb.n_inputs + s for s in sums}
    first = fb.instructions[sums[0]]
    shape = tuple(fb.types[first.args[0]].shape)
    for s in sums:
        ins = fb.instructions[s]
        if (ins.attrs != first.attrs or tuple(fb.types[ins.args[0]].shape) != shape
                or ins.args[0] in refs):
            return None
    for ins in fb.instructions[:k]:
        if REGISTRY[ins.op].ends_fused_group or any(a in refs for a in ins.args):
            return None
    return sums


def is_sibling_sums(fb: FusedBody) -> bool:
    """Whether a fused body ends in two sums or more over one domain (`trailing_sums`)."""
    sums = trailing_sums(fb)
    return sums is not None and len(sums) >= 2


def _summing(node: Node) -> tuple | None:
    """(body, sum indices, (axes attrs, argument shape)) of a node this pass may merge."""
    if node.op != "fused" or effectful(node):
        return None
    fb = FusedBody.of_node(node)
    sums = trailing_sums(fb)
    if sums is None:
        return None
    first = fb.instructions[sums[0]]
    shape = tuple(fb.types[first.args[0]].shape)
    if not shape or any(type(n) is not int for n in shape):
        return None
    return fb, sums, (tuple(sorted(first.attrs.items())), shape)


def _merged(a: Node, b: Node, keep: set) -> Node:
    """One node computing `a` and `b` (see the module docstring); `keep`: values read
    outside the pair (or escaping) that must stay outputs."""
    fa, sa, _ = _summing(a)
    fb, sb, _ = _summing(b)
    a_out = dict(zip(a.outputs, fa.outputs))  # value -> a's ref
    inputs = list(a.inputs) + [v for v in dict.fromkeys(b.inputs)
                               if v not in a.inputs and v not in a_out]
    n = len(inputs)
    ea, eb = sa[0], sb[0]  # elementwise instruction counts
    where_a = {fa.n_inputs + k: n + k for k in range(ea)}
    where_a.update({fa.n_inputs + s: n + ea + eb + j for j, s in enumerate(sa)})
    where_b = {fb.n_inputs + k: n + ea + k for k in range(eb)}
    where_b.update({fb.n_inputs + s: n + ea + eb + len(sa) + j for j, s in enumerate(sb)})

    def ref_a(r: int) -> int:
        return inputs.index(a.inputs[r]) if r < fa.n_inputs else where_a[r]

    def ref_b(r: int) -> int:
        if r >= fb.n_inputs:
            return where_b[r]
        v = b.inputs[r]
        return ref_a(a_out[v]) if v in a_out else inputs.index(v)

    def rendered(ins, ref):
        return (ins.op, tuple(ref(x) for x in ins.args), tuple(ins.attrs.items()))

    body = [rendered(i, ref_a) for i in fa.instructions[:ea]]
    body += [rendered(i, ref_b) for i in fb.instructions[:eb]]
    body += [rendered(fa.instructions[s], ref_a) for s in sa]
    body += [rendered(fb.instructions[s], ref_b) for s in sb]
    outs = [(ref_a(r), v) for r, v in zip(fa.outputs, a.outputs)
            if v in keep or r - fa.n_inputs in sa]
    outs += [(ref_b(r), v) for r, v in zip(fb.outputs, b.outputs)]
    return Node("fused", inputs, {"body": tuple(body), "outputs": tuple(r for r, _ in outs)},
                [v for _, v in outs], a.loc)


def merge_sibling_sums(graph: Graph) -> Graph:
    """Merge sibling sums (see the module docstring). Returns a new graph, or the same one
    when nothing changed."""
    if not MERGE:
        return graph
    nodes = list(graph.nodes)
    escaping = set(graph.outputs) | {v for _, v in graph.updates}
    changed = False
    k = 0
    while k < len(nodes):
        info = _summing(nodes[k])
        found = None if info is None else _partner(nodes, k, info)
        if found is None:
            k += 1
            continue
        j, moved = found
        a, b = nodes[k], nodes[j]
        readers = {v for n in nodes if n is not a and n is not b for v in n.inputs}
        merged = _merged(a, b, readers | escaping)
        between = [n for n in nodes[k + 1:j] if id(n) not in moved]
        later = [n for n in nodes[k + 1:j] if id(n) in moved]
        nodes = nodes[:k] + between + [merged] + later + nodes[j + 1:]
        k = k + len(between)  # the merged node may take another sibling
        changed = True
    if not changed:
        return graph
    out = Graph(graph.name, list(graph.inputs), nodes, list(graph.outputs),
                list(graph.updates))
    out.meta = dict(graph.meta)
    verify(out)
    return out


def _partner(nodes: list[Node], i: int, info) -> tuple[int, set[int]] | None:
    """(j, ids of the nodes between i and j that read A's values) for the first node B =
    nodes[j] after A = nodes[i] that A may merge with, or None. The merged node stands at
    B's place; the nodes between that read A's values (directly or through each other) move
    after it, which needs none of them to be effectful or to feed B."""
    a = nodes[i]
    fa, sums, key = info
    a_sums = {v for r, v in zip(fa.outputs, a.outputs) if r - fa.n_inputs in sums}
    reached = set(a.outputs)  # values that depend on A
    moved: set[int] = set()
    for j in range(i + 1, len(nodes)):
        b = nodes[j]
        other = _summing(b)
        if (other is not None and other[2] == key and _shares(a, b, key[1])
                and not any(v in a_sums for v in b.inputs)
                and not any(v in reached and v not in a.outputs for v in b.inputs)
                and not any(effectful(nodes[m]) for m in range(i + 1, j)
                            if id(nodes[m]) in moved)):
            return j, moved
        if any(v in reached for v in b.inputs):
            moved.add(id(b))
            reached.update(b.outputs)
    return None
def _shares(a: Node, b: Node, shape: tuple) -> bool:
    """Whether B reads a tensor of the sums' domain that A reads or makes (bytes one walk
    can share)."""
    return any(tuple(v.type.shape) == shape and (v in a.inputs or v in a.outputs)
               for v in b.inputs)
