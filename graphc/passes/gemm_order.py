"""gemm_order: a Linear layer's forward product computed as the transposed product of the
weight and the transposed activations, where BLAS runs that order faster.

A Linear layer computes `x @ W.T` with W stored [out, in]: in BLAS terms a GEMM whose second
operand is read transposed (column-major "TN"). OpenBLAS 0.3.31's SkylakeX kernels run that
form 20-30% slower than the same product in the other order, `(W @ x.T).T` (measured with
numpy, one thread, 2026-11-25: 64x784 by 784x256 250 -> 196 us, 64x256 by 256x256 83 ->
67 us; MKL, PyTorch's BLAS, runs the first in 174 us). `transpose_weight_products` rewrites

    matmul(a, permute(w))  ->  permute(matmul(w, permute(a)))

where `a` is [m, k] with m >= MIN_ROWS and the result [m, n] has n >= MIN_COLUMNS: the GEMM
writes the result transposed ([n, m], contiguous) and its readers (the bias, activation and
mask epilogue `fuse` groups after it) read a transposed view of it. Both permutes are views:
nothing is copied but the epilogue's strided reads, ~5 us at 64x256.

Rounding: each output element is the same sum of the same products, added in the order the
other GEMM kernel adds them, so float32 results move by rounding only (judged by distance
from a float64 run, docs/performance.md `## Rounding`).

It runs after `simplify`, whose `transpose_matmul_results` rewrites the opposite way (a
transposed matmul result computed in the transposed order), and before `fuse`
(graphc.passes.default_passes).
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node, Value
from graphc.types import TensorType

MIN_ROWS = 16  # below: a thin GEMM (batch 1 is a GEMV), where the order matters little
MIN_COLUMNS = 64  # below: a narrow output (a classifier's 10 logits), measured no faster


def _transposed_source(v: Value, producer: dict) -> Value | None:
    """x when v is `permute[dims=(1, 0)](x)` of a 2-D x, else None."""
    node = producer.get(v)
    if node is not None and node.op == "permute" and tuple(node.attrs["dims"]) == (1, 0):
        return node.inputs[0]
    return None


def _rewrites(node: Node, producer: dict) -> Value | None:
    """The weight `w` of a `matmul(a, permute(w))` this pass rewrites, else None."""
    if node.op != "matmul" or node.attrs or len(node.outputs) != 1:
        return None
    a, b = node.inputs
    if a.type.ndim != 2 or b.type.ndim != 2 or b.type.is_symbolic or \
            type(a.type.shape[1]) is not int:
        return None
    m, n = node.outputs[0].type.shape
    # a batch known per call (a symbolic m) takes the order whatever its size: comparing it
    # with MIN_ROWS would guard the graph to one side of 16 (thin GEMMs care little)
    if (type(m) is int and m < MIN_ROWS) or n < MIN_COLUMNS or \
            _transposed_source(a, producer) is not None:
        return None
    return _transposed_source(b, producer)


def transpose_weight_products(graph: Graph) -> Graph:
    """Rewrite `matmul(a, permute(w))` as `permute(matmul(w, permute(a)))` (see the module
    docstring).

    Needs: a graph that verifies. Rewrites only 2-D matmuls whose second operand is a
    transposed view of static sizes and whose first is not, with at least MIN_COLUMNS
    columns and MIN_ROWS rows (or rows known per call: a symbolic batch). Guarantees: the
    matmul's output value is now the outer permute's, at the matmul's place, with its
    location; values equal up to float rounding of the GEMM.
    """
    from graphc.passes.simplify import _Names, _rebuild

    producer = graph.producers()
    if not any(_rewrites(n, producer) is not None for n in graph.nodes):
        return graph
    names = _Names(graph)
    nodes: list[Node] = []
    for node in graph.nodes:
        w = _rewrites(node, producer)
        if w is None:
            nodes.append(node)
            continue
        a, out = node.inputs[0], node.outputs[0]
        (m, k), (n, _) = a.type.shape, w.type.shape
        a_t = names.value(TensorType((k, m), a.type.dtype))
        product = names.value(TensorType((n, m), out.type.dtype))
        nodes += [Node("permute", [a], {"dims": (1, 0)}, [a_t], node.loc),
                  Node("matmul", [w, a_t], {}, [product], node.loc),
                  Node("permute", [product], {"dims": (1, 0)}, [out], node.loc)]
    return _rebuild(graph, nodes)


__all__ = ["MIN_COLUMNS", "MIN_ROWS", "transpose_weight_products"]
