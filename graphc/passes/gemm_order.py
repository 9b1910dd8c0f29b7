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

Thin products that share a weight (a recurrent layer's steps: `h @ W_hh.T` with a batch
of at most THIN_ROWS rows, once per time step, all reading one `permute(W_hh)` after
`simplify`'s CSE) take another form: they read one contiguous copy of the transposed
weight, made once per call,

    matmul(h_t, permute(w)) for every t  ->  wt = copy(permute(w)); matmul(h_t, wt)

so each step is an untransposed [m, k] @ [k, n] product, the form the cpu backend's
generated small GEMM (graphc.backends.cpu.small_gemm) reads without packing, its result
laid out [m, n] for the bias and gate epilogue that `fuse` groups after it. The (W @ h.T).T
order copied h.T for the generated kernel every step (~2 us) and its epilogue read the
product transposed (2.0 us against 0.9): the CharLSTM step (batch 16, hidden 128, seq 32)
7.95 -> 7.36 ms (in-process A/B, each variant compiled afresh, 1 thread, CPU time, load
3.5); the two copies of W_hh.T cost ~22 us each. Exact: the copy moves values, the
products are the same sums.

It runs after `simplify`, whose `transpose_matmul_results` rewrites the opposite way (a
transposed matmul result computed in the transposed order), and before `fuse`
(graphc.passes.default_passes).
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node, Value
from graphc.types import TensorType

MIN_ROWS = 16  # below: a thin GEMM (batch 1 is a GEMV), where the order matters little
MIN_COLUMNS = 64  # below: a narrow output (a classifier's 10 logits), measured no faster
THIN_ROWS = 16  # thin products (graphc.backends.cpu.small_gemm.MAX_THIN): 2..16 rows
MIN_SHARED = 2  # thin products reading one transposed weight before it is copied once


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


def _thin_shared(graph: Graph, producer: dict) -> dict[Value, list[Node]]:
    """Transposed weights `permute(w)` read as the second operand of MIN_SHARED or more
    thin 2-D matmuls (2..THIN_ROWS static rows, static sizes): value -> those matmuls."""
    users: dict[Value, list[Node]] = {}
    for node in graph.nodes:
        if node.op != "matmul" or node.attrs or len(node.outputs) != 1:
            continue
        a, b = node.inputs
        if a.type.ndim != 2 or b.type.ndim != 2 or a.type.is_symbolic or b.type.is_symbolic:
            continue
        if 2 <= a.type.shape[0] <= THIN_ROWS and _transposed_source(b, producer) is not None:
            users.setdefault(b, []).append(node)
    return {b: nodes for b, nodes in users.items() if len(nodes) >= MIN_SHARED}


def _copy_shared_weights(graph: Graph, producer: dict, names) -> list[Node]:
    """The nodes with every thin product of `_thin_shared` reading one contiguous copy of
    its transposed weight, made right after the transposing view."""
    shared = _thin_shared(graph, producer)
    copies = {b: names.value(b.type) for b in shared}
    thin = {id(node): copies[b] for b, users in shared.items() for node in users}
    nodes: list[Node] = []
    for node in graph.nodes:
        if id(node) in thin:
            node = Node("matmul", [node.inputs[0], thin[id(node)]], {}, node.outputs, node.loc)
        nodes.append(node)
        for v in node.outputs:
            if v in copies:
                nodes.append(Node("copy", [v], {}, [copies[v]], node.loc))
    return nodes


def transpose_weight_products(graph: Graph) -> Graph:
    """Rewrite `matmul(a, permute(w))` as `permute(matmul(w, permute(a)))` (see the module
    docstring).

    Needs: a graph that verifies. First, thin products sharing a transposed weight (see
    the module docstring) read one copy of it instead. Then rewrites only 2-D matmuls whose
    second operand is a transposed view of static sizes and whose first is not, with at
    least MIN_COLUMNS columns and MIN_ROWS rows (or rows known per call: a symbolic batch).
    Guarantees: the matmul's output value is now the outer permute's, at the matmul's
    place, with its location; values equal up to float rounding of the GEMM (the copies:
    equal).
    """
    from graphc.passes.simplify import _Names, _rebuild

    producer = graph.producers()
    names = _Names(graph)
    if _thin_shared(graph, producer):
        graph = _rebuild(graph, _copy_shared_weights(graph, producer, names))
        producer = graph.producers()
    if not any(_rewrites(n, producer) is not None for n in graph.nodes):
        return graph
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


__all__ = ["MIN_COLUMNS", "MIN_ROWS", "MIN_SHARED", "THIN_ROWS", "transpose_weight_products"]
