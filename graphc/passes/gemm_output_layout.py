"""lay_out_gemm_outputs: a batched GEMM writes its result in the layout its reader copies it to.

An attention layer merges its heads with `permute` then `reshape`: (P @ V) of shape
(B, H, T, E) is permuted to (B, T, H, E) and reshaped to (B, T, H*E). Laid out row-major,
the permuted value is not contiguous and the reshape copies it (four copies per layer in a
GPT training step: the forward merge and the dQ, dK and dV merges). Laid out as that
permutation of row-major instead, element [b, h, t, e] at b*T*H*E + t*H*E + h*E + e, the
permute reads it contiguously and the reshape is a view: the GEMM writes each head's
(T, E) block at its column offset of the merged rows (BLAS ldc = H*E), and the copy is gone.
When the permutation puts the matmul's last two dims the other way round (a K gradient
computed as (B, H, E, T) and merged by permute (0, 3, 1, 2)), the columns of each block are
contiguous instead and the GEMM writes c^T = b^T @ a^T (graphc.backends.cpu.gemm_layout).

The pass chooses layouts only: it records them in `graph.meta["root_strides"]` (value name
-> element strides), which `plan_buffers` gives the value's buffer (`MemoryPlan.strides`)
and the cpu backend's `Locations` place it with. A value gets one when it is a `matmul`
node's single output of static shape with both operands of rank 2 or more (or fused
attention's out, dq, dk or dv, rows contiguous: ATTENTION_HEADS), is no graph
output or update value, is read by one node only, a `permute`, and the view ops that read
the permuted value (and their views) copy fewer times under the new layout than under
row-major (a head merge's reshape, or the (B*T, H*E) reshape after it); and the GEMM can
write the layout (unit stride along its rows or its columns). The permuted value may be
that of a chain of permutes, each the only reader of the one before: autodiff's dK comes
as (B, H, E, T) from the transpose of K^T's gradient, then the merge's permute (0, 3, 1,
2) makes it (B, T, H, E); laid out for the chain's last value, the GPT step's four dK
merges (~35 us each) are views too. The numbers are
the same: the GEMM computes the same dot products and stores them elsewhere.

Run last before `plan_buffers` (a later pass that rewrote the graph could leave the
recorded names stale; plan_buffers checks them). cpu pipeline only: the backend's GEMM
lowering is what writes a strided result. Needs: a verified graph. Guarantees: a graph
with the same nodes, values and order, and `meta["root_strides"]` set (the input graph is
left unchanged).

>>> from graphc.ir import parse
>>> g = lay_out_gemm_outputs(parse('''graph @f(%p: f32[2,4,8,8], %v: f32[2,4,8,16]) -> (
...     f32[2,8,64]) {
...   %0: f32[2,4,8,16] = matmul(%p, %v)
...   %1: f32[2,8,4,16] = permute[dims=(0, 2, 1, 3)](%0)
...   %2: f32[2,8,64] = reshape[shape=(2, 8, 64)](%1)
...   return (%2)
... }'''))
>>> g.meta["root_strides"]
{'0': (512, 16, 64, 1)}
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node, Value
from graphc.ops.registry import REGISTRY
from graphc.ops.shapes import contiguous_element_strides

__all__ = ["ATTENTION_HEADS", "gemm_writable", "lay_out_gemm_outputs"]

# fused attention's per-head outputs (graphc.backends.cpu.attention: out; dq, dk, dv), which
# its kernels write as GEMM results, rows ldc apart (the last stride 1, not c^T)
ATTENTION_HEADS = {"attention": (0,), "attention_backward": (0, 1, 2)}
# False: a permuted value is the first permute's only (the benchmarks' A/B)
PERMUTE_CHAINS = True


def lay_out_gemm_outputs(graph: Graph) -> Graph:
    """The graph with `meta["root_strides"]`: the layout of every matmul result a head-merge
    reshape would otherwise copy (see the module docstring). The input graph is unchanged."""
    readers = graph.users()
    kept = set(graph.outputs) | {v for _, v in graph.updates} | {w for w, _ in graph.updates}
    chosen: dict[str, tuple[int, ...]] = {}
    for node in graph.nodes:
        if node.op in ATTENTION_HEADS:  # its kernels write each head's rows ldc apart
            candidates = [node.outputs[i] for i in ATTENTION_HEADS[node.op]]
        elif node.op == "matmul" and len(node.outputs) == 1 and \
                all(v.type.ndim >= 2 for v in node.inputs):
            candidates = node.outputs
        else:
            continue
        for out in candidates:
            if out in kept or not all(type(d) is int for d in out.type.shape):
                continue
            # (attention's out is read by its backward too, which takes any row stride)
            users = [u for u in readers.get(out, []) if u.op != "attention_backward"]
            if len(users) != 1 or users[0].op != "permute" or users[0].inputs[0] is not out:
                continue
            strides = _merged_layout(users[0], readers, _writer(node, out))
            if strides is not None:
                chosen[out.name] = strides
    out = Graph(graph.name, list(graph.inputs), list(graph.nodes), list(graph.outputs),
                list(graph.updates))
    out.meta = {**graph.meta, "root_strides": chosen}
    return out


def _writer(node: Node, out: Value):
    """writable(strides): whether `node` can write its output `out` at these element
    strides (a GEMM: rows or columns of unit stride; fused attention's heads: rows)."""

    def writable(strides: tuple[int, ...]) -> bool:
        return gemm_writable(out.type.shape, strides) and \
            (node.op == "matmul" or strides[-1] == 1)

    return writable


def _merged_layout(permute: Node, readers: dict[Value, list[Node]],
                   writable) -> tuple[int, ...] | None:
    """Element strides of the permute's source that make a permuted value row-major, when
    the source's writer can write them (`writable(strides)`) and the view ops reading it
    (permute, reshape, ... and the views of those) copy fewer times under them than under
    row-major; else None. The permuted value is the permute's, or that of a permute reading
    it in turn (its only reader), and so on (autodiff's dK, (B, H, T, E) -> (B, H, E, T) ->
    (B, T, H, E)): the layout that copies least is taken, of equals the one that makes the
    chain's later value row-major (what the readers after the chain read)."""
    src = permute.inputs[0]
    before = _view_copies(src, contiguous_element_strides(tuple(src.type.shape)), readers)
    best, fewest = None, before
    dims = tuple(range(src.type.ndim))
    node = permute
    while True:
        dims = tuple(dims[d] for d in node.attrs["dims"])  # the chain's dims of src
        strides = _row_major_after(src, dims, node.outputs[0])
        copies = _view_copies(src, strides, readers) if writable(strides) else before
        if copies < before and copies <= fewest:
            best, fewest = strides, copies
        users = readers.get(node.outputs[0], [])
        if not PERMUTE_CHAINS or len(users) != 1 or users[0].op != "permute" or \
                users[0].inputs[0] is not node.outputs[0]:
            return best
        node = users[0]


def _row_major_after(src: Value, dims: tuple, permuted: Value) -> tuple[int, ...]:
    """src's element strides that make `permuted` (src permuted by `dims`) row-major."""
    row_major = contiguous_element_strides(tuple(permuted.type.shape))
    strides = [0] * len(dims)
    for position, dim in enumerate(dims):
        strides[dim] = row_major[position]
    return tuple(strides)


def _view_copies(value: Value, strides: tuple, readers: dict[Value, list[Node]]) -> int:
    """How many view ops reading `value` (laid out at `strides`), or reading their views in
    turn, must copy: their OpDef's `view_strides` rule finds no view (as plan_buffers asks)."""
    copies = 0
    for node in readers.get(value, []):
        opdef = REGISTRY.get(node.op)
        if opdef is None or not opdef.view or node.inputs[0] is not value:
            continue
        found = opdef.view_strides(tuple(value.type.shape), strides, **node.attrs)
        if found is None:
            copies += 1
        else:
            copies += _view_copies(node.outputs[0], tuple(found[1]), readers)
    return copies


def gemm_writable(shape: tuple, strides: tuple) -> bool:
    """Can a BLAS GEMM write a (batch..., m, n) result at these element strides? Its rows or
    its columns must have unit stride, the other stride covering the row or column."""
    m, n = shape[-2:]
    sr, sc = strides[-2:]
    return (sc == 1 and (m == 1 or sr >= n)) or (sr == 1 and (n == 1 or sc >= m))
