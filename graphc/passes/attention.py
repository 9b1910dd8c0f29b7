"""attention: softmax(q k^T * scale [+ mask]) v made one `attention` node when its scores are big.

`scaled_dot_product_attention` and `MultiheadAttention` trace into matmul, scale, mask,
softmax, matmul, and autograd adds the softmax's backward after them; both keep the
[..., L, S] score and probability matrices in memory. At long contexts (L = S = 1024: 4 MiB
per batch and head) the step is bound by moving them. `fuse_attention` replaces the chain by
`attention` (graphc/ops/attention.py), which the cpu backend runs as a blocked kernel with an
online softmax, saving only each row's logsumexp; and, in a training graph, the backward chain
(dV = P^T dO, dP = dO V^T, the softmax's backward, the mask, the scale, dQ = dS K,
dK = dS^T Q) by one `attention_backward` node that recomputes P block by block.

Recognised forward, after simplify:

    s  = matmul(q, permute_T(k))          # permute_T swaps the last two dims
    s' = mul(s, c)                        # optional: c a scalar `full` constant
    s''= where(hide, -inf, s') | add(s', mask) | where(hide, -inf, add(s', mask)) | s'
    p  = softmax[dim=last](s'')
    o  = matmul(p, v)

where `hide` is a constant bool mask equal to the causal triangle (j > i) and `mask` an
additive float mask broadcastable to the scores that is not computed from them. A scale on q
(MultiheadAttention with need_weights) is part of q here, the attention's scale being 1.
Every intermediate must be read only by the chain (or by the recognised backward), so
nothing else needs the scores.

Needs: a graph that verifies; the cpu pipeline runs it after transpose_weight_products and
before fuse (it works on unfused nodes). Guarantees: a graph that verifies; results equal up
to float rounding (the blocked kernels sum in another order: docs/performance.md, Rounding);
a chain whose score matrix per (batch, head) holds at most MIN_SCORE_BYTES is left as it is
(it fits in cache, where the unfused kernels are as fast) unless one block holds it
(`ONE_BLOCK_MAX`: T and S at most 64, fused for the cpu backend's one-block kernels), as is
any chain the pattern does not match exactly. The interpreter and the cuda backend never
see these nodes unless someone runs this pass for them: the interpreter runs them
(graphc/ops/attention.py), the cuda backend refuses them with its reason.
"""

from __future__ import annotations

import math

import numpy as np

from graphc.ir.graph import Graph, Node, Value
from graphc.ops.registry import REGISTRY
from graphc.types import TensorType

# the score matrix of one (batch, head), in bytes, above which the chain is fused: half of a
# Zen 3/4 core's 512 KiB L2 (256 x 256 float32 scores stay as they are)
MIN_SCORE_BYTES = 256 * 1024
# ...or where one block holds each head's scores (T and S from ONE_BLOCK_MIN to ONE_BLOCK_MAX,
# S a multiple of ONE_BLOCK_MIN): the cpu backend's one-block kernels (graphc.backends.cpu.
# attention_small) keep them in L1, where the chain writes and reads them back 5 times a layer
# (GPT at context 64: its attention kernels 5.7 -> 4.0 ms, the step -3%; docs/performance.md
# "GPT's heads and weight gradients"). Head sizes they do not take run in the blocked kernels.
ONE_BLOCK_MIN = 16
ONE_BLOCK_MAX = 64


def _one_block(rows: int, cols: int) -> bool:
    return ONE_BLOCK_MIN <= rows <= ONE_BLOCK_MAX and ONE_BLOCK_MIN <= cols <= ONE_BLOCK_MAX \
        and cols % ONE_BLOCK_MIN == 0


def _swaps_last_two(node: Node) -> bool:
    rank = node.outputs[0].type.ndim
    return node.op == "permute" and rank >= 2 and \
        tuple(node.attrs["dims"]) == tuple(range(rank - 2)) + (rank - 1, rank - 2)


def _scalar_constant(producer: dict, v: Value) -> float | None:
    """The value of a scalar `full` constant `v`, or None."""
    node = producer.get(v)
    if node is None or node.op != "full" or v.type.shape != ():
        return None
    return float(node.attrs["value"])


def _constant(producer: dict, v: Value, memo: dict) -> np.ndarray | None:
    """`v` computed from constants alone (full, arange, reshape, comparisons...), or None
    when it reads a graph input or a random op."""
    if v in memo:
        return memo[v]
    node = producer.get(v)
    result = None
    if node is not None and not REGISTRY[node.op].effectful and node.op != "fused" and \
            len(node.outputs) == 1 and v.type.numel <= (1 << 24):
        args = [_constant(producer, x, memo) for x in node.inputs]
        if all(a is not None for a in args):
            result = np.asarray(REGISTRY[node.op].kernel(*args, **node.attrs))
    memo[v] = result
    return result


def _is_causal_hide(producer: dict, cond: Value, scores: TensorType, memo: dict) -> bool:
    """Whether bool `cond` hides exactly key j > query i of every [L, S] score matrix."""
    hide = _constant(producer, cond, memo)
    if hide is None or hide.dtype != np.bool_:
        return False
    length, source = scores.shape[-2:]
    if hide.ndim < 2 or hide.ndim > scores.ndim:
        return False  # (a 1-D mask hides the same keys from every query: not causal)
    want = np.arange(source)[None, :] > np.arange(length)[:, None]
    try:  # every leading index of the mask (batch dims sized 1 or not) holds the triangle
        return bool(np.all(np.broadcast_to(hide, hide.shape[:-2] + (length, source)) == want))
    except ValueError:
        return False


def _view(producer: dict, v: Value) -> tuple:
    """(root, dims): `v` is permute(root, dims) through any chain of permutes (dims the
    identity when `v` is no permute)."""
    dims = tuple(range(v.type.ndim))
    node = producer.get(v)
    while node is not None and node.op == "permute":
        inner = tuple(node.attrs["dims"])
        dims = tuple(inner[d] for d in dims)
        v = node.inputs[0]
        node = producer.get(v)
    return v, dims


def _swapped(view: tuple) -> tuple:
    root, dims = view
    return root, dims[:-2] + (dims[-1], dims[-2])


def _same(producer: dict, v: Value, target: tuple) -> bool:
    """Whether `v` is the permute `target` ((root, dims), `_view`) of a root value."""
    return _view(producer, v) == target


class _Match:
    """One recognised chain: what the new nodes read and which values they replace."""

    def __init__(self) -> None:
        self.removed: list[Node] = []  # the forward chain's nodes (o's matmul last)
        self.backward: list[Node] = []  # the backward chain's nodes
        self.q = self.k = self.v = self.o = None
        self.k_view: tuple = ()
        self.v_view: tuple = ()  # v as a permute of its root, when out is dead
        self.v_type: TensorType | None = None
        self.mask: Value | None = None
        self.scale, self.causal = 1.0, False
        self.grad_out = self.dq = self.dk = self.dv = None
        self.dk_t: Value | None = None  # dK^T, when the graph computes that instead of dK


def _match_forward(graph: Graph, producer: dict, users: dict, uses: dict,
                   softmax: Node, memo: dict) -> _Match | None:
    m = _Match()
    p = softmax.outputs[0]
    if softmax.attrs["dim"] != p.type.ndim - 1 or p.type.ndim < 2:
        return None
    x = softmax.inputs[0]
    chain = [softmax]
    node = producer.get(x)
    if node is not None and node.op == "where" and \
            _scalar_constant(producer, node.inputs[1]) == -math.inf and \
            node.inputs[2].type == x.type and \
            _is_causal_hide(producer, node.inputs[0], x.type, memo):
        m.causal = True
        chain.append(node)
        x = node.inputs[2]
        node = producer.get(x)  # is_causal with a mask: the mask's add under the triangle
    if node is not None and node.op == "add":
        for scores, mask in (node.inputs, node.inputs[::-1]):
            made = producer.get(scores)
            if scores.type == x.type and made is not None and made.op in ("mul", "matmul") \
                    and mask.type.dtype is x.type.dtype and mask is not scores:
                m.mask = mask
                chain.append(node)
                x = scores
                break
    node = producer.get(x)
    if node is not None and node.op == "mul":
        for scores, c in (node.inputs, node.inputs[::-1]):
            value = _scalar_constant(producer, c)
            if value is not None and scores.type == x.type:
                m.scale = value
                chain.append(node)
                x = scores
                break
    node = producer.get(x)
    if node is None or node.op != "matmul":
        return None
    chain.append(node)
    m.q, kt = node.inputs
    kt_node = producer.get(kt)
    if kt_node is None or kt_node.op != "permute" or kt.type.ndim < 2:
        return None
    m.k_view = _swapped(_view(producer, kt))  # k, as a permute of its root
    m.k = kt_node.inputs[0] if _swaps_last_two(kt_node) else None  # None: made by the pass
    readers = [n for n in users.get(p, []) if n.op == "matmul" and n.inputs[0] is p]
    if len(readers) > 1:
        return None
    if readers:
        m.v, m.o = readers[0].inputs[1], readers[0].outputs[0]
    else:  # out is dead (a loss whose gradient needs no out): v comes from the backward
        m.v_view = _backward_v(producer, users, p)
        if m.v_view is None:
            return None
        root, dims = m.v_view
        m.v_type = TensorType(tuple(root.type.shape[d] for d in dims), root.type.dtype)
    m.v_type = m.v.type if m.v is not None else m.v_type
    t, k_type = m.q.type, TensorType(tuple(reversed(kt.type.shape[-2:])), kt.type.dtype)
    k_type = TensorType(kt.type.shape[:-2] + k_type.shape, kt.type.dtype)
    if t.ndim < 2 or k_type.ndim != t.ndim or m.v_type.ndim != t.ndim or \
            t.shape[:-2] != k_type.shape[:-2] or t.shape[:-2] != m.v_type.shape[:-2] or \
            t.dtype.name != "float32" or p.type.shape != t.shape[:-1] + (k_type.shape[-2],):
        return None
    if m.v_type.shape[-2] != k_type.shape[-2]:
        return None
    if m.mask is not None and (m.mask.type.ndim > p.type.ndim or any(
            a not in (1, b) for a, b in zip(m.mask.type.shape[::-1], p.type.shape[::-1]))):
        return None
    if any(uses.get(n.outputs[0], 0) != 1 for n in chain[1:]):
        return None  # something else reads the scores
    m.removed = chain[::-1] + readers
    return m


def _backward_v(producer: dict, users: dict, p: Value) -> tuple | None:
    """v's view (`_view`) read by the backward's dP = dO v^T, found from p's rowsum reader."""
    for node in users.get(p, []):
        if node.op != "mul":
            continue
        other = producer.get(node.inputs[1] if node.inputs[0] is p else node.inputs[0])
        if other is not None and other.op == "matmul" and \
                producer.get(other.inputs[1]) is not None and \
                producer[other.inputs[1]].op == "permute":
            return _swapped(_view(producer, other.inputs[1]))
    return None


def _one_reader(users: dict, uses: dict, v: Value) -> Node | None:
    readers = users.get(v, [])
    return readers[0] if len(readers) == 1 and uses.get(v, 0) == 1 else None


def _match_backward(producer: dict, users: dict, uses: dict, m: _Match, p: Value) -> bool:
    """Recognise the softmax chain's backward (see the module docstring); fill m.backward."""
    readers = [n for n in users.get(p, []) if n is not m.removed[-1]]
    if not readers:  # a forward graph (with out dead, nothing to do); p must be read by
        # out's matmul alone: a forward part that saves p for a backward outside (autograd's
        # split graph) returns it, and the fused node does not make it
        return m.o is not None and uses.get(p) == 1
    if sorted(n.op for n in readers) != ["mul", "mul", "permute"] or \
            uses.get(p) != len(readers) + (m.o is not None):
        return False
    pt = next(n for n in readers if n.op == "permute")
    dv_node = _one_reader(users, uses, pt.outputs[0])
    if not _swaps_last_two(pt) or dv_node is None or dv_node.op != "matmul" or \
            dv_node.inputs[0] is not pt.outputs[0]:
        return False
    m.grad_out, m.dv = dv_node.inputs[1], dv_node.outputs[0]
    first, last = None, None
    # one mul multiplies by dP (for the rowsum), the other by dP - rowsum
    for node in (n for n in readers if n.op == "mul"):
        other = node.inputs[1] if node.inputs[0] is p else node.inputs[0]
        made = producer.get(other)
        if made is not None and made.op == "matmul":
            first, dp_node = node, made
        elif made is not None and made.op == "sub":
            last, sub = node, made
    if first is None or last is None:
        return False
    v_view = m.v_view if m.v is None else _view(producer, m.v)
    if dp_node.inputs[0] is not m.grad_out or \
            not _same(producer, dp_node.inputs[1], _swapped(v_view)):
        return False
    dp = dp_node.outputs[0]
    rowsum = _one_reader(users, uses, first.outputs[0])
    if rowsum is None or rowsum.op != "reduce_sum" or not rowsum.attrs["keepdim"] or \
            tuple(rowsum.attrs["axes"]) != (p.type.ndim - 1,):
        return False
    if sub.inputs[0] is not dp or sub.inputs[1] is not rowsum.outputs[0] or \
            uses.get(dp) != 2 or uses.get(rowsum.outputs[0]) != 1 or \
            uses.get(sub.outputs[0]) != 1:
        return False
    chain = [dp_node, dv_node, first, rowsum, sub, last]
    ds = last.outputs[0]
    node = _one_reader(users, uses, ds)
    if m.causal:  # where(hide, 0, ds): the hidden scores get no gradient
        if node is None or node.op != "where" or node.inputs[2] is not ds or \
                producer.get(node.inputs[1]) is None or \
                producer[node.inputs[1]].op != "full" or \
                float(producer[node.inputs[1]].attrs["value"]) != 0.0:
            return False
        chain.append(node)
        ds = node.outputs[0]
        node = _one_reader(users, uses, ds)
    if m.scale != 1.0:  # simplify drops a multiply by 1
        if node is None or node.op != "mul":
            return False
        c = node.inputs[1] if node.inputs[0] is ds else node.inputs[0]
        if _scalar_constant(producer, c) != m.scale:
            return False
        chain.append(node)
        ds = node.outputs[0]
    return _match_ds_readers(producer, users, uses, m, ds, chain)


def _match_ds_readers(producer, users, uses, m: _Match, ds: Value, chain: list) -> bool:
    """dS (the scores' gradient) read only by dQ = dS K and dK = dS^T Q (or (Q^T dS)^T)."""
    readers = users.get(ds, [])
    if uses.get(ds) != len(readers):
        return False
    for node in readers:
        if node.op == "matmul" and node.inputs[0] is ds and m.dq is None and \
                _same(producer, node.inputs[1], m.k_view):
            m.dq = node.outputs[0]
            chain.append(node)
            continue
        if node.op == "matmul" and node.inputs[1] is ds and m.dk is None and \
                m.dk_t is None and _same(producer, node.inputs[0],
                                         _swapped(_view(producer, m.q))):
            m.dk_t = node.outputs[0]  # (Q^T dS) = dK^T: a permute of the new dK
            chain.append(node)
            continue
        if node.op != "permute" or not _swaps_last_two(node):
            return False
        mm = _one_reader(users, uses, node.outputs[0])
        if mm is None or mm.op != "matmul" or mm.inputs[0] is not node.outputs[0] or \
                not _same(producer, mm.inputs[1], _view(producer, m.q)) or m.dk is not None \
                or m.dk_t is not None:
            return False
        m.dk = mm.outputs[0]
        chain += [node, mm]
    if m.dq is None or (m.dk is None) == (m.dk_t is None):
        return False
    m.backward = chain
    return True


def _inputs_ready(graph: Graph, producer: dict, m: _Match) -> bool:
    """With out dead, the attention node goes before the backward: v's root must exist."""
    if m.v is not None:
        return True
    position = {id(n): k for k, n in enumerate(graph.nodes)}
    made = producer.get(m.v_view[0])
    first = min(position[id(n)] for n in m.backward if m.grad_out in n.inputs)
    return made is None or position[id(made)] < first


def _fresh_names(graph: Graph):
    taken = {v.name for v in graph.inputs} | {v.name for n in graph.nodes for v in n.outputs}
    counter = [1 + max((int(n) for n in taken if n.isdigit()), default=-1)]

    def fresh(type_: TensorType) -> Value:
        while str(counter[0]) in taken:
            counter[0] += 1
        taken.add(str(counter[0]))
        return Value(str(counter[0]), type_)

    return fresh


def fuse_attention(graph: Graph) -> Graph:
    """Replace each big softmax(q k^T * scale + mask) v chain, and its backward when the graph
    has one, by `attention` / `attention_backward` nodes (see the module docstring).

    >>> from graphc.ir.parser import parse
    >>> g = parse('''graph @f(%q: f32[2,8,4], %k: f32[2,8,4], %v: f32[2,8,4]) -> (f32[2,8,4]) {
    ...   %0: f32[2,4,8] = permute[dims=(0, 2, 1)](%k)
    ...   %1: f32[2,8,8] = matmul(%q, %0)
    ...   %2: f32[2,8,8] = softmax[dim=2](%1)
    ...   %3: f32[2,8,4] = matmul(%2, %v)
    ...   return (%3)
    ... }''')
    >>> [n.op for n in fuse_attention(g).nodes]  # 8 x 8 scores: small, left alone
    ['permute', 'matmul', 'softmax', 'matmul']
    """
    producer = graph.producers()
    users = graph.users()
    uses: dict[Value, int] = {}
    for v in [x for n in graph.nodes for x in n.inputs] + list(graph.outputs) + \
            [value for _, value in graph.updates]:
        uses[v] = uses.get(v, 0) + 1
    memo: dict = {}
    matches = []
    for node in graph.nodes:
        if node.op != "softmax":
            continue
        scores = node.outputs[0].type
        rows_cols = scores.shape[-2:]
        if len(rows_cols) < 2 or not all(isinstance(n, int) for n in rows_cols) or \
                (rows_cols[0] * rows_cols[1] * scores.dtype.itemsize <= MIN_SCORE_BYTES
                 and not _one_block(*rows_cols)):
            continue
        m = _match_forward(graph, producer, users, uses, node, memo)
        if m is not None and _match_backward(producer, users, uses, m, node.outputs[0]) and \
                _inputs_ready(graph, producer, m):
            matches.append(m)
    if not matches:
        return graph
    fresh = _fresh_names(graph)
    position = {id(n): k for k, n in enumerate(graph.nodes)}
    placed: dict[int, list[Node]] = {}
    dropped: set[int] = set()
    for m in matches:
        mask = m.mask
        extra = []
        if mask is None:
            mask = fresh(TensorType((), m.q.type.dtype))
            extra.append(Node("full", [], {"shape": (), "value": 0.0, "dtype": "float32"},
                              [mask], m.removed[-1].loc))
        if m.k is None:  # k as one permute of its root (a view, as the traced ones)
            root, dims = m.k_view
            m.k = fresh(TensorType(tuple(root.type.shape[d] for d in dims), root.type.dtype))
            extra.append(Node("permute", [root], {"dims": dims}, [m.k], m.removed[0].loc))
        if m.v is None:
            root, dims = m.v_view
            m.v = fresh(m.v_type)
            extra.append(Node("permute", [root], {"dims": dims}, [m.v], m.removed[0].loc))
            m.o = fresh(TensorType(m.q.type.shape[:-1] + (m.v_type.shape[-1],),
                                   m.q.type.dtype))
        lse = fresh(TensorType(m.q.type.shape[:-1], m.q.type.dtype))
        attrs = {"scale": float(m.scale), "causal": m.causal}
        at = min(position[id(n)] for n in m.backward if m.grad_out in n.inputs) \
            if m.backward else 0
        last = m.removed[-1]  # out's matmul; the softmax when out is dead (placed with
        where = position[id(last)] if last.op == "matmul" else at  # the backward, v its input)
        placed.setdefault(where, []).extend(
            extra + [Node("attention", [m.q, m.k, m.v, mask], dict(attrs), [m.o, lse],
                          last.loc)])
        dropped |= {id(n) for n in m.removed}
        if m.backward:
            after = []
            if m.dk is None:
                m.dk = fresh(m.k.type)
                rank = m.k.type.ndim
                after.append(Node("permute", [m.dk], {"dims": tuple(range(rank - 2)) + (
                    rank - 1, rank - 2)}, [m.dk_t], m.backward[0].loc))
            placed.setdefault(at, []).extend([Node(
                "attention_backward", [m.q, m.k, m.v, mask, m.o, lse, m.grad_out],
                dict(attrs), [m.dq, m.dk, m.dv], m.backward[0].loc)] + after)
            dropped |= {id(n) for n in m.backward}
    nodes: list[Node] = []
    for k, node in enumerate(graph.nodes):
        nodes += placed.get(k, [])
        if id(node) not in dropped:
            nodes.append(node)
    from graphc.passes.simplify import eliminate_dead_code

    return eliminate_dead_code(Graph(graph.name, list(graph.inputs), nodes,
                                     list(graph.outputs), list(graph.updates)))


__all__ = ["MIN_SCORE_BYTES", "fuse_attention"]
