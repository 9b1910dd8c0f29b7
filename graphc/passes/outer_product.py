"""outer_product: a matrix product over an inner dimension of one computed as a broadcast
multiply.

At batch 1, autodiff of `y = x @ W.T` gives W's gradient as `dy.T @ x`, a [out, 1] by
[1, in] product: a GEMM with an inner dimension of one, which BLAS runs as a full GEMM call
(OpenBLAS took 230 us for MLP's 256x784 one on 2026-11-25, a broadcast multiply writes it at
memory speed), and which no elementwise consumer can fuse with. The optimizer update that
reads the gradient next (SGD momentum: `buf = m * buf + g; p = p - lr * buf`) then reads the
whole [out, in] gradient back. As a broadcast multiply,

    matmul(a: [m, 1], b: [1, n])  ->  mul(a, b): [m, n]

the product is an elementwise op, which `fuse` groups with the update: one loop computes the
gradient, the momentum and the new weights, and writes the gradient once (it is still a
graph output: the `.grad`).

Exact: each output element is a sum of one product, `a[i, 0] * b[0, j]`, which is what the
multiply computes (a GEMM adds it to zero, which changes no float). Batched operands
(rank > 2) are left alone: their matmul broadcasts batch dimensions by its own rules.
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node


def _is_outer_product(node: Node) -> bool:
    """A 2-D matmul whose inner dimension is a static 1, without attributes."""
    if node.op != "matmul" or node.attrs or len(node.outputs) != 1:
        return False
    a, b = node.inputs
    return a.type.ndim == b.type.ndim == 2 and a.type.shape[1] == 1 and b.type.shape[0] == 1 \
        and a.type.dtype == b.type.dtype


def multiply_outer_products(graph: Graph) -> Graph:
    """Rewrite every `matmul(a: [m, 1], b: [1, n])` as `mul(a, b)` (see the module docstring).

    Needs: a graph that verifies. Rewrites only 2-D matmuls with a static inner dimension of 1
    and operands of one dtype. Guarantees: the matmul's output value is now the mul's, at the
    matmul's place, with its location; the same values bit for bit. It is one of simplify's
    passes (graphc.passes.simplify.PASSES), whose helpers it uses.
    """
    from graphc.passes.simplify import _rebuild

    if not any(_is_outer_product(n) for n in graph.nodes):
        return graph
    nodes = [Node("mul", list(n.inputs), {}, list(n.outputs), n.loc) if _is_outer_product(n)
             else n for n in graph.nodes]
    return _rebuild(graph, nodes)


__all__ = ["multiply_outer_products"]
