"""transpose: a transposed matmul result computed in the transposed order instead.

Reverse-mode autodiff of `y = x @ W.T` (every Linear layer) gives W's gradient as
`permute(x.T @ dy)`: a GEMM writing [in, out], then a transposed view of it, which the
`.grad` output copies into [out, in]. PyTorch computes `dy.T @ x` instead, writing the
gradient in its own layout. `transpose_matmul_results` rewrites the first form into the
second, by (A B)^T = B^T A^T:

    permute[last two dims swapped](matmul(a, b))  ->  matmul(permute(b), permute(a))

The operand permutes are views, which the backends pass to BLAS as transposed operands, and
a permute of a permute composes (`x.T.T` is `x`), so the rewritten GEMM reads the same
memory and writes the transposed result straight into a contiguous buffer; the copy after it
then reads a fresh buffer nothing else reads, and `simplify_algebra` drops it (this pass runs
inside `simplify`'s fixed point). Each output
element is the same sum of the same products, in whatever order the GEMM adds them: float32
results move by rounding only (judged by distance from float64, docs/performance.md).
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node, Value
from graphc.types import TensorType


def _swaps_last_two(dims: tuple, rank: int) -> bool:
    return rank >= 2 and tuple(dims) == tuple(range(rank - 2)) + (rank - 1, rank - 2)


def _transposed(v: Value, names, loc: str | None, out: list[Node]) -> Value:
    rank = v.type.ndim
    dims = tuple(range(rank - 2)) + (rank - 1, rank - 2)
    shape = v.type.shape[:-2] + (v.type.shape[-1], v.type.shape[-2])
    t = names.value(TensorType(shape, v.type.dtype))
    out.append(Node("permute", [v], {"dims": dims}, [t], loc))
    return t


def transpose_matmul_results(graph: Graph) -> Graph:
    """Rewrite `permute(matmul(a, b))` that swaps the last two dims as
    `matmul(permute(b), permute(a))` (see the module docstring), then drop the copies and
    double permutes that leaves (simplify_algebra, eliminate_dead_code).

    Needs: a graph that verifies. Rewrites only when a and b have the same rank ≥ 2 (no
    1-D or rank-broadcast operand, whose matmul rules differ) and the matmul's result is read
    by that permute alone and is no graph output or update (so the GEMM is not computed
    twice). Guarantees: the permute's output value is now the new matmul's output, at the
    permute's place, with its location; values equal up to float rounding of the GEMM.
    It is one of simplify's passes (graphc.passes.simplify.PASSES), whose helpers it uses.
    """
    from graphc.passes.simplify import _Names, _rebuild, _use_counts

    producer = graph.producers()
    uses = _use_counts(graph)
    names = _Names(graph)
    nodes: list[Node] = []
    changed = False
    for node in graph.nodes:
        src = producer.get(node.inputs[0]) if node.op == "permute" else None
        if (src is not None and src.op == "matmul" and uses.get(src.outputs[0]) == 1
                and _swaps_last_two(node.attrs["dims"], node.outputs[0].type.ndim)):
            a, b = src.inputs
            if a.type.ndim == b.type.ndim >= 2:
                bt = _transposed(b, names, node.loc, nodes)
                at = _transposed(a, names, node.loc, nodes)
                nodes.append(Node("matmul", [bt, at], dict(src.attrs), [node.outputs[0]],
                                  node.loc))
                changed = True
                continue
        nodes.append(node)
    if not changed:
        return graph
    return _rebuild(graph, nodes)


__all__ = ["transpose_matmul_results"]
