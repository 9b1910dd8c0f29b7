"""matmul_sum: a sum of matrix products computed as one product over the concatenated inner
dimension.

Reverse-mode autodiff of a weight used at every step of a loop (an LSTM's hidden-to-hidden
weight, any weight shared across T steps) gives its gradient as a sum of T thin products,
`sum_t dy_t^T @ x_t`, each with an inner dimension of one batch (16 for a batch of 16): T
GEMMs that BLAS runs at a third of its speed, T full-size [out, in] results, and a T-input
add reading them back. The sum is one GEMM over the concatenated inner dimension,

    add(matmul(a_1, b_1), matmul(a_2, b_2), ...)  ->  matmul(concat(a_t, -1), concat(b_t, -2))

(PyTorch's LSTM backward computes it this way). Operands that are transposed views
(`permute` of the last two dims, as autodiff writes `dy_t^T`) are concatenated before the
transpose, `concat(x_t^T, -1) = concat(x_t, -2)^T`, so the concat copies contiguous rows and
the GEMM reads its operand transposed. Each output element is the same sum of the same
products, added in another order: float32 results move by rounding only (judged by distance
from a float64 run, docs/performance.md).
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node, Value
from graphc.types import TensorType

Terms = list[tuple[Value, Value]]  # the (a, b) of each product in a sum


def _use_counts(graph: Graph) -> dict[Value, int]:
    from graphc.passes.simplify import _use_counts as counts

    return counts(graph)


def _transposed_source(v: Value, producer: dict[Value, Node]) -> Value | None:
    """x when v is `permute[dims=(1, 0)](x)`, else None."""
    node = producer.get(v)
    if node is not None and node.op == "permute" and tuple(node.attrs["dims"]) == (1, 0):
        return node.inputs[0]
    return None


def _concatenated(values: list[Value], axis: int, producer, names, loc, nodes) -> Value:
    """concat(values, axis) of rank-2 values, built from their transposed sources when every
    one is a transposed view (see the module docstring)."""
    sources = [_transposed_source(v, producer) for v in values]
    if all(s is not None for s in sources):
        inner = _concatenated(sources, 1 - axis, {}, names, loc, nodes)
        shape = (inner.type.shape[1], inner.type.shape[0])
        out = names.value(TensorType(shape, inner.type.dtype))
        nodes.append(Node("permute", [inner], {"dims": (1, 0)}, [out], loc))
        return out
    shape = list(values[0].type.shape)
    shape[axis] = sum(v.type.shape[axis] for v in values)
    out = names.value(TensorType(tuple(shape), values[0].type.dtype))
    nodes.append(Node("concat", list(values), {"axis": axis}, [out], loc))
    return out


def _pays(out: Value, pairs: Terms) -> bool:
    """Whether copying the operands into the concats moves fewer elements than the products
    write (and the adds read back): true for many thin products (weight gradients summed
    over steps), false for `x @ W1 + h @ W2` with large weights and a small batch, where the
    concat would copy the weights on every call."""
    dims = [out.type.shape] + [v.type.shape for pair in pairs for v in pair]
    if not all(isinstance(d, int) for shape in dims for d in shape):
        return False  # symbolic sizes: no cost to compare
    m, n = out.type.shape
    copied = sum(m * a.type.shape[1] + b.type.shape[0] * n for a, b in pairs)
    return copied <= len(pairs) * m * n


def concat_summed_matmuls(graph: Graph) -> Graph:
    """Rewrite a tree of `add`s whose leaves are `matmul`s of 2-D operands as one matmul of
    the concatenated operands (see the module docstring); the products and adds it no longer
    reads are left to eliminate_dead_code.

    Needs: a graph that verifies. Rewrites only adds whose operands and result have one type
    (no broadcasting), of products and partial sums read by that add alone (no product is
    computed twice, nothing else needs a partial sum), only at the root of such a tree, and
    only where the concats copy fewer elements than the products write (`_pays`).
    Guarantees: the root's output value is now the new matmul's, at the root's place, with
    its location; values equal up to float rounding of the sum's order. It is one of
    simplify's passes (graphc.passes.simplify.PASSES), whose helpers it uses.
    """
    from graphc.passes.simplify import _Names, _rebuild

    producer = graph.producers()
    uses = _use_counts(graph)
    terms: dict[Value, Terms] = {}
    absorbed: set[Value] = set()
    for node in graph.nodes:
        out = node.outputs[0]
        if node.op == "matmul" and len(node.outputs) == 1 and not node.attrs and \
                node.inputs[0].type.ndim == node.inputs[1].type.ndim == 2:
            terms[out] = [(node.inputs[0], node.inputs[1])]
        elif node.op == "add" and node.inputs[0].type == node.inputs[1].type == out.type:
            left, right = node.inputs
            if left is not right and left in terms and right in terms and \
                    uses.get(left) == 1 and uses.get(right) == 1:
                terms[out] = terms[left] + terms[right]
                absorbed.update((left, right))
    roots = {v for v, t in terms.items() if len(t) > 1 and v not in absorbed and _pays(v, t)}
    if not roots:
        return graph
    names = _Names(graph)
    nodes: list[Node] = []
    for node in graph.nodes:
        out = node.outputs[0]
        if out not in roots:
            nodes.append(node)
            continue
        pairs = terms[out]
        a = _concatenated([p[0] for p in pairs], 1, producer, names, node.loc, nodes)
        b = _concatenated([p[1] for p in pairs], 0, producer, names, node.loc, nodes)
        nodes.append(Node("matmul", [a, b], {}, [out], node.loc))
    return _rebuild(graph, nodes)


__all__ = ["concat_summed_matmuls"]
