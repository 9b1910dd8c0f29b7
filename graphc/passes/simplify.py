"""simplify: dead code, common subexpressions, constant folding, algebraic identities,
folding eval-mode BatchNorm into the convolution or linear layer before it, transposed
matmul results computed in the transposed order (graphc.passes.transpose), and sums of slices
scattered into zeros built as one concat (graphc.passes.scatter_sum), sums of thin
matrix products as one product (graphc.passes.matmul_sum), and products over an inner
dimension of one as broadcast multiplies (graphc.passes.outer_product).

Every pass here is a function `Graph -> Graph` that never changes the graph it is given: it
returns that same object when it finds nothing to do, and otherwise a new Graph that shares
the untouched Node and Value objects. All passes keep:
- the graph's inputs (even unused ones: they are the calling convention), its outputs and its
  `updates` (a replaced value is replaced there too; the types never change);
- each surviving node's source location; a node a rewrite creates takes the location of the
  node it stands for;
- the verifier's invariants (types, def-before-use), given a graph that verifies;
- `graph.meta` only when the graph is returned unchanged: every key there is an analysis of
  the old graph, so a changed graph starts with an empty `meta`.

`simplify(graph)` runs them all to a fixed point.

>>> from graphc.ir import parse
>>> g = parse('''graph @f(%x: f32[3]) -> (f32[3]) {
...   %0: f32[] = full[shape=(), value=1.0, dtype="float32"]()
...   %1: f32[3] = mul(%x, %0)
...   %2: f32[3] = exp(%1)
...   %3: f32[3] = exp(%x)
...   %4: f32[3] = add(%2, %3)
...   return (%4)
... }''')
>>> print(simplify(g))
graph @f(%x: f32[3]) -> (f32[3]) {
  %2: f32[3] = exp(%x)
  %4: f32[3] = add(%2, %2)
  return (%4)
}
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.ir.graph import Graph, Node, Value
from graphc.ops.registry import ELEMENTWISE, RANDOM, REGISTRY, SOURCE
from graphc.passes.matmul_sum import concat_summed_matmuls
from graphc.passes.outer_product import multiply_outer_products
from graphc.passes.scatter_sum import concat_disjoint_scatters
from graphc.passes.transpose import transpose_matmul_results
from graphc.symbolic import Sym
from graphc.types import TensorType

# Non-uniform constants with at most this many elements are computed at compile time, so a
# constant chain through them can still fold when its end is uniform (e.g. `arange * 0`).
FOLD_LIMIT = 1 << 16
# Movement ops that only rearrange elements: applied to a uniform tensor, the result is that
# same uniform value in the output's shape, whatever the size.
_VALUE_PRESERVING = ("reshape", "permute", "broadcast_to", "slice", "flip", "copy")
_MAX_ROUNDS = 20


# ---- helpers ----------------------------------------------------------------------------------
def _effectful(node: Node) -> bool:
    opdef = REGISTRY.get(node.op)
    return opdef is not None and (opdef.effectful or opdef.kind == RANDOM)


def _resolve(v: Value, replace: dict[Value, Value]) -> Value:
    while v in replace:
        v = replace[v]
    return v


def _substituted(node: Node, replace: dict[Value, Value]) -> Node:
    """`node` reading replaced values in their stead (a copy only when something changed)."""
    for v in node.inputs:
        if v in replace:
            break
    else:
        return node
    inputs = [_resolve(v, replace) for v in node.inputs]
    return Node(node.op, inputs, dict(node.attrs), list(node.outputs), node.loc)


def _rebuild(graph: Graph, nodes: list[Node], replace: dict[Value, Value] | None = None) -> Graph:
    """A new graph with `nodes`, outputs and update values mapped through `replace`, and an
    empty `meta` (see the module docstring)."""
    replace = replace or {}
    if replace:
        nodes = [_substituted(n, replace) for n in nodes]
    return Graph(graph.name, list(graph.inputs), nodes,
                 [_resolve(v, replace) for v in graph.outputs],
                 [(t, _resolve(v, replace)) for t, v in graph.updates])


def _same_nodes(graph: Graph, nodes: list[Node]) -> bool:
    return len(nodes) == len(graph.nodes) and all(a is b for a, b in zip(nodes, graph.nodes))


class _Names:
    """Fresh value names for nodes a rewrite creates: the next integers after the largest
    integer name in use, so new values print like traced ones."""

    def __init__(self, graph: Graph) -> None:
        self.taken = {v.name for v in graph.inputs} | {v.name for n in graph for v in n.outputs}
        self.next = 1 + max((int(n) for n in self.taken if n.isdigit()), default=-1)

    def value(self, type_: TensorType) -> Value:
        while str(self.next) in self.taken:
            self.next += 1
        self.taken.add(str(self.next))
        return Value(str(self.next), type_)


def _literal_key(value: Any) -> Any:
    """Attribute literals as a hashable key that tells -0.0 from 0.0, 1 from 1.0 and True,
    and treats nan as equal to itself."""
    if isinstance(value, (tuple, list)):
        return tuple(_literal_key(v) for v in value)
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


def _full_value(node: Node | None) -> float | None:
    """The fill value when `node` is a `full`, else None."""
    return node.attrs["value"] if node is not None and node.op == "full" else None


# ---- dead code --------------------------------------------------------------------------------
def eliminate_dead_code(graph: Graph) -> Graph:
    """Drop nodes none of whose outputs is used.

    Needs: a graph that verifies. Guarantees: every remaining node has an output that a later
    node, a graph output or an update value reads; graph inputs stay even when unused.

    Random ops (effectful) are kept whenever a result of theirs is used, and dropped when none
    is. Dropping one is safe: each random op reads its own `[seed, offset]` input, built in the
    graph as the rng input plus a constant offset the trace assigned (`add(%rng, arange...)`),
    so the words a surviving op draws do not depend on whether another op runs; how far the
    generator advances per call is recorded with the trace's rng binding, not derived from the
    nodes, so later calls see the same stream too. Only the unused values disappear.
    """
    used = set(graph.outputs) | {v for _, v in graph.updates}
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if any(v in used for v in node.outputs):
            kept.append(node)
            used.update(node.inputs)
    kept.reverse()
    if _same_nodes(graph, kept):
        return graph
    return _rebuild(graph, kept)


# ---- common subexpressions --------------------------------------------------------------------
def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """Merge nodes that apply the same op with the same attributes to the same inputs.

    Needs: a graph that verifies. Guarantees: of each set of equal pure nodes only the first
    (in execution order, with its source location) remains, and every use of a later one's
    outputs reads the first one's. Random ops (an OpDef that is `effectful` or of kind RANDOM)
    are never merged: two dropouts of the same tensor draw two masks by contract, even when a
    graph happens to hand them the same seed value. Attribute values are compared as literals
    (0.0 and -0.0, 1 and 1.0 differ).
    """
    seen: dict[tuple, Node] = {}
    replace: dict[Value, Value] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        node = _substituted(node, replace)
        if not _effectful(node):
            key = (node.op, tuple(id(v) for v in node.inputs),
                   tuple(sorted((k, _literal_key(v)) for k, v in node.attrs.items())))
            first = seen.setdefault(key, node)
            if first is not node:
                replace.update(zip(node.outputs, first.outputs))
                continue
        nodes.append(node)
    if not replace:
        return graph
    return _rebuild(graph, nodes, replace)


# ---- constant folding -------------------------------------------------------------------------
def _is_uniform(a: np.ndarray) -> bool:
    if a.size <= 1:
        return True
    flat = a.reshape(-1)
    first = flat[0]
    if a.dtype.kind == "f":
        if np.isnan(first):
            return bool(np.isnan(flat).all())
        return bool((flat == first).all() and (np.signbit(flat) == np.signbit(first)).all())
    return bool((flat == first).all())


def _fill_literal(a: np.ndarray) -> float | int:
    """The fill value of a uniform array as the `full` op's literal (ints stay exact)."""
    first = a.reshape(-1)[0] if a.size else np.zeros((), a.dtype)
    return int(first) if a.dtype.kind in "iu" else float(first)


def _full_node(value: Value, fill: float | int, loc: str | None) -> Node:
    attrs = {"shape": tuple(value.type.shape), "value": fill, "dtype": value.type.dtype.name}
    return Node("full", [], attrs, [value], loc)


def _arange_node(value: Value, a: np.ndarray, loc: str | None) -> Node | None:
    """An `arange` that reproduces the 1-D constant `a` exactly, or None."""
    if a.ndim != 1 or a.size < 2 or a.dtype.kind not in "fi":
        return None
    start, step = float(a[0]), float(a[1]) - float(a[0])
    if step == 0:
        return None
    attrs = {"start": start, "end": start + step * a.size, "step": step,
             "dtype": value.type.dtype.name}
    opdef = REGISTRY["arange"]
    try:
        again, declared = opdef.kernel(**attrs), opdef.infer(**attrs)
    except Exception:  # noqa: BLE001  (a literal the op refuses: do not fold)
        return None
    if declared != value.type or again.shape != a.shape or not np.array_equal(again, a):
        return None
    return Node("arange", [], attrs, [value], loc)


def _constant_results(node: Node, known: dict[Value, np.ndarray]) -> list[np.ndarray] | None:
    """The node's outputs computed with its registry kernel from constant inputs, or None.

    A uniform input is held as a 0-d array; elementwise and value-preserving movement ops on
    uniform inputs compute one element, whatever the output size. Anything else runs the
    kernel on materialised inputs, but only when inputs and outputs are small.
    """
    opdef = REGISTRY[node.op]
    args = [known[v] for v in node.inputs]
    all_scalar = all(a.ndim == 0 for a in args)
    if all_scalar and node.op in _VALUE_PRESERVING:
        return [args[0]]
    if all_scalar and opdef.kind == ELEMENTWISE and len(node.outputs) == 1:
        with np.errstate(all="ignore"):
            result = opdef.kernel(*args, **node.attrs)
        return [np.asarray(result).astype(node.outputs[0].type.dtype.np).reshape(())]
    sizes = [v.type.numel for v in node.inputs + node.outputs]
    if any(type(n) is not int for n in sizes) or max(sizes, default=0) > FOLD_LIMIT:
        return None  # too big, or a symbolic size (known per call only)
    full_args = [np.broadcast_to(a, v.type.shape).copy() for a, v in zip(args, node.inputs)]
    with np.errstate(all="ignore"):
        result = opdef.kernel(*full_args, **node.attrs)
    results = [result] if len(node.outputs) == 1 else list(result)
    return [np.asarray(r).astype(v.type.dtype.np) for r, v in zip(results, node.outputs)]


def fold_constants(graph: Graph) -> Graph:
    """Compute, at compile time, nodes whose inputs are all constants.

    Constants are the outputs of `full` and `arange` nodes and of nodes folded here. Each
    node with only constant inputs (random ops excepted) runs its registry kernel (the
    interpreter's semantics, dtype included):
    - a uniform result (every element the same, sign of zero and nan included) replaces the
      node by a `full` of the output's type, keeping the output value and the location;
    - a non-uniform result stays unfolded, since attributes are literals and a graph must not
      embed arrays; the one exception is a 1-D result that an `arange` literal reproduces
      bit for bit, which becomes that `arange`. Its value still counts as a constant (when
      it has at most FOLD_LIMIT elements), so a chain through it can fold further on.
    A multi-output node folds only when all its outputs are uniform. A kernel that raises
    (e.g. an index out of range) leaves the node for the runtime to report.
    Needs: a graph that verifies. Guarantees: same types; the values the registry kernels give,
    as in the interpreter (an elementwise op on uniform inputs is computed on one element).
    """
    known: dict[Value, np.ndarray] = {}
    nodes: list[Node] = []
    changed = False
    for node in graph.nodes:
        opdef = REGISTRY.get(node.op)
        if node.op == "full" and type(node.attrs["value"]) is not Sym:  # Sym: per call
            known[node.outputs[0]] = np.asarray(node.attrs["value"],
                                                node.outputs[0].type.dtype.np)
        elif node.op == "arange" and type(node.outputs[0].type.numel) is int \
                and node.outputs[0].type.numel <= FOLD_LIMIT:
            known[node.outputs[0]] = opdef.kernel(**node.attrs)
        if (opdef is None or opdef.kind in (SOURCE, RANDOM) or opdef.effectful
                or not all(v in known for v in node.inputs)):
            nodes.append(node)
            continue
        try:
            results = _constant_results(node, known)
        except Exception:  # noqa: BLE001  (the runtime reports it, with the node)
            results = None
        if results is None:
            nodes.append(node)
            continue
        uniform = [_is_uniform(r) for r in results]
        if all(uniform):
            for v, r in zip(node.outputs, results):
                known[v] = np.asarray(r.reshape(-1)[0] if r.size else np.zeros((), r.dtype))
                nodes.append(_full_node(v, _fill_literal(r), node.loc))
            changed = True
            continue
        arange = _arange_node(node.outputs[0], results[0], node.loc) \
            if len(results) == 1 else None
        nodes.append(arange or node)
        changed |= arange is not None
        for v, r in zip(node.outputs, results):
            if r.size <= FOLD_LIMIT:
                known[v] = r
    return _rebuild(graph, nodes) if changed else graph


# ---- algebraic identities ---------------------------------------------------------------------
# (op, which operand is the constant, the neutral value)
_NEUTRAL = (("mul", 1, 1.0), ("mul", 0, 1.0), ("add", 1, 0.0), ("add", 0, 0.0),
            ("sub", 1, 0.0), ("div", 1, 1.0))


def _dropped(shape: tuple, reduction: Node) -> tuple:
    """`shape` (a keepdim reduction's result) without the reduced axes."""
    return tuple(n for i, n in enumerate(shape) if i not in reduction.attrs["axes"])


def _compose_permute(inner: tuple, outer: tuple) -> tuple:
    """dims of permute(permute(x, inner), outer) as one permute of x."""
    return tuple(inner[d] for d in outer)


def _is_reduction(node: Node) -> bool:
    """Whether `node` is a registry reduction (reduce_sum/mean/max/min/prod: axes, keepdim)."""
    opdef = REGISTRY.get(node.op)
    return opdef is not None and opdef.reduction is not None


def _fresh(node: Node | None) -> bool:
    """Whether `node` writes new buffers (it is not a view op and not a graph input)."""
    opdef = REGISTRY.get(node.op) if node is not None else None
    return opdef is not None and not opdef.view


def _algebra_rewrite(node: Node, producer: dict[Value, Node],
                     uses: dict[Value, int]) -> Value | Node | None:
    """The value `node`'s single output equals, a node to compute it instead, or None."""
    op, out = node.op, node.outputs[0]
    x = node.inputs[0] if node.inputs else None
    src = producer.get(x) if x is not None else None
    for name, const_at, neutral in _NEUTRAL:
        if op == name:
            other = node.inputs[1 - const_at]
            if (_full_value(producer.get(node.inputs[const_at])) == neutral
                    and other.type == out.type):
                return other
    if op in ("reshape", "broadcast_to", "permute") and x.type == out.type and (
            op != "permute" or node.attrs["dims"] == tuple(range(out.type.ndim))):
        return x
    if op == "cast" and node.attrs["dtype"] == x.type.dtype.name:
        return x
    if src is None:
        return None
    if op == "copy" and uses.get(x) == 1 and _fresh(src):
        return x  # the copy's input is a fresh buffer nothing else reads
    if (op == "reshape" and _is_reduction(src) and src.attrs["keepdim"]
            and uses.get(x) == 1 and out.type.shape == _dropped(x.type.shape, src)):
        return Node(src.op, list(src.inputs), {**src.attrs, "keepdim": False}, [out], node.loc)
    if op == "neg" and src.op == "neg":
        return src.inputs[0]
    if op in ("reshape", "broadcast_to") and src.op == op:
        inner = src.inputs[0]
        if inner.type == out.type:
            return inner
        return Node(op, [inner], dict(node.attrs), [out], node.loc)
    if op == "permute" and src.op == "permute":
        dims = _compose_permute(src.attrs["dims"], node.attrs["dims"])
        if dims == tuple(range(len(dims))):
            return src.inputs[0]
        return Node(op, [src.inputs[0]], {"dims": dims}, [out], node.loc)
    if op == "broadcast_to" and src.op == "full":
        return _full_node(out, src.attrs["value"], node.loc)
    return None


def simplify_algebra(graph: Graph) -> Graph:
    """Apply algebraic identities.

    - `x*1`, `1*x`, `x+0`, `0+x`, `x-0`, `x/1` become `x`, where the constant is a `full` of
      that value, and only when the result's type equals x's (so broadcasting or dtype
      promotion by the constant is never lost). `x+0` turns a -0.0 element into +0.0, so
      this one rewrite may flip the sign of a zero, as the same rule does in XLA and LLVM
      (fast-math); no other rule changes a bit.
    - `reshape(reshape(x))` is one reshape; `broadcast_to(broadcast_to(x))` one broadcast;
      `permute(permute(x))` one permute with composed dims; a reshape, broadcast or permute
      that changes nothing (same type; identity dims) is dropped.
    - `broadcast_to(full)` is a `full` of the target shape.
    - `cast` to the dtype x already has is dropped; `neg(neg(x))` is `x`.
    - `copy(x)` is `x` when x is a fresh buffer (made by a non-view op) read only there.
    - `reshape(reduce(x, keepdim=True))` that only drops the kept axes is
      `reduce(x, keepdim=False)` (when the keepdim result is read only there).
    Needs: a graph that verifies. Guarantees: same values, same types; the intermediate node a
    rewrite bypasses stays until eliminate_dead_code drops it (it may have other users).
    """
    producer: dict[Value, Node] = {}
    replace: dict[Value, Value] = {}
    nodes: list[Node] = []
    uses = _use_counts(graph)
    for node in graph.nodes:
        node = _substituted(node, replace)
        rewrite = _algebra_rewrite(node, producer, uses) if len(node.outputs) == 1 else None
        if isinstance(rewrite, Value):
            replace[node.outputs[0]] = rewrite
            uses[rewrite] = uses.get(rewrite, 0) + uses.get(node.outputs[0], 0)
            continue
        node = rewrite or node
        producer.update((v, node) for v in node.outputs)
        nodes.append(node)
    if not replace and _same_nodes(graph, nodes):
        return graph
    return _rebuild(graph, nodes, replace)


def _use_counts(graph: Graph) -> dict[Value, int]:
    """How many times each value is read: by nodes, as an output, as an update's value."""
    uses: dict[Value, int] = {}
    reads = [v for n in graph.nodes for v in n.inputs] + list(graph.outputs)
    for v in reads + [value for _, value in graph.updates]:
        uses[v] = uses.get(v, 0) + 1
    return uses


# ---- BatchNorm folding ------------------------------------------------------------------------
class _Builder:
    """Appends new nodes (all at one location) and names their outputs."""

    def __init__(self, names: _Names, loc: str | None) -> None:
        self.names, self.loc, self.nodes = names, loc, []

    def __call__(self, op: str, *inputs: Value, out: Value | None = None, **attrs) -> Value:
        inferred = REGISTRY[op].infer(*(v.type for v in inputs), **attrs)
        out = out or self.names.value(inferred)
        self.nodes.append(Node(op, list(inputs), attrs, [out], self.loc))
        return out


def _per_channel(bias: Value, out_type: TensorType) -> bool:
    """Whether `bias` broadcast against `out_type` varies along dim 1 only (one per channel)."""
    shape, rank = bias.type.shape, out_type.ndim
    if len(shape) > rank:
        return False
    aligned = (1,) * (rank - len(shape)) + tuple(shape)
    return all(d == (out_type.shape[1] if i == 1 else 1) for i, d in enumerate(aligned))


def _match_batchnorm(bn: Node, producer: dict[Value, Node], users: dict[Value, list[Node]],
                     graph: Graph, roots: set[Value]
                     ) -> tuple[Node, Node | None, Value | None] | None:
    """(conv2d or matmul node, its bias-add node or None, the bias operand) for a foldable
    batch_norm, or None."""
    if bn.attrs.get("training") is not False or len(bn.outputs) != 3:
        return None
    if any(users[v] for v in bn.outputs[1:]) or set(bn.outputs[1:]) & roots:
        return None
    for v in bn.inputs[1:]:
        made_by = producer.get(v)
        if v not in graph.inputs and (made_by is None or made_by.op != "full"):
            return None

    def only_feeds(v: Value, node: Node) -> bool:
        return users[v] == [node] and v not in roots

    x = bn.inputs[0]
    add, bias, prev = None, None, producer.get(x)
    if prev is not None and prev.op == "add" and only_feeds(x, bn):
        for i in (0, 1):
            candidate = producer.get(prev.inputs[i])
            other = prev.inputs[1 - i]
            if (candidate is not None and candidate.op in ("conv2d", "matmul")
                    and _per_channel(other, x.type)):
                add, bias, prev, x = prev, other, candidate, prev.inputs[i]
                break
    if prev is None or prev.op not in ("conv2d", "matmul") or not only_feeds(x, add or bn):
        return None
    if x.type != bn.inputs[0].type or (prev.op == "matmul" and x.type.ndim != 2):
        return None  # the add broadcast, or a batched matmul whose dim 1 is not the channel
    return prev, add, bias


def fold_batchnorm(graph: Graph) -> Graph:
    """Rewrite `batch_norm[training=false](conv2d(x, W) [+ b])` as `conv2d(x, W') + b'`, and
    the same for a linear layer `matmul(x, Wt) [+ b]` with a 2-D output (BatchNorm1d).

    The rewrite, with s = gamma * rsqrt(running_var + eps) per output channel:
        W'  = W * s (along conv2d's output-channel dim 0, or Wt's last dim for matmul)
        b'  = (b - running_mean) * s + beta       (b = 0 when there is no bias add)
    is built from graph ops on the live inputs, so W' and b' are recomputed from whatever
    parameters and statistics the graph is called with (a later update of them stays valid).
    It matches batch_norm to float32 rounding (batch_norm computes in float64).

    Needs: a graph that verifies. Folds a batch_norm only when it is in eval mode
    (`training=false`), its weight, bias and running statistics are graph inputs (parameters,
    buffers) or `full` constants, its save_mean/save_invstd outputs are unused, and the conv or
    matmul output (and the bias add's) is read by nothing else and is no graph output or
    update, so the old nodes are dropped with it (and the traced Conv2d's reshape of its bias
    vector, when only that add reads it). Guarantees: the batch_norm's output value is
    defined by the new bias add, at the batch_norm's place; the new nodes carry the
    batch_norm's location, the new conv2d/matmul the original's.
    """
    producer, users = graph.producers(), graph.users()
    roots = set(graph.outputs) | {v for _, v in graph.updates}
    names = _Names(graph)
    dropped: set[int] = set()
    at: dict[int, list[Node]] = {}
    for node in graph.nodes:
        if node.op != "batch_norm":
            continue
        match = _match_batchnorm(node, producer, users, graph, roots)
        if match is None:
            continue
        lin, add, bias = match
        reshaped = producer.get(bias) if bias is not None else None
        channels = node.outputs[0].type.shape[1:2]
        if (reshaped is not None and reshaped.op == "reshape" and users[bias] == [add]
                and bias not in roots and reshaped.inputs[0].type.shape == channels):
            dropped.add(id(reshaped))  # the traced Conv2d's bias view: fold the vector itself
            bias = reshaped.inputs[0]
        at[id(node)] = _folded(node, lin, bias, names)
        dropped.update(id(n) for n in (node, lin, add) if n is not None)
    if not at:
        return graph
    nodes: list[Node] = []
    for node in graph.nodes:
        if id(node) in at:
            nodes.extend(at[id(node)])
        elif id(node) not in dropped:
            nodes.append(node)
    return _rebuild(graph, nodes)


def _folded(bn: Node, lin: Node, bias: Value | None, names: _Names) -> list[Node]:
    _, gamma, beta, mean, var = bn.inputs
    out, c, dtype = bn.outputs[0], bn.outputs[0].type.shape[1], bn.outputs[0].type.dtype.name
    b = _Builder(names, bn.loc)
    eps = b("full", shape=(), value=float(bn.attrs["eps"]), dtype=dtype)
    scale = b("mul", gamma, b("rsqrt", b("add", var, eps)))
    x, w = lin.inputs
    if lin.op == "conv2d":
        w_scale = b("reshape", scale, shape=(c,) + (1,) * (w.type.ndim - 1))
    else:
        w_scale = scale  # Wt is [in, C]: s broadcasts along its last dim
    folded_w = b("mul", w, w_scale)
    lin_out = names.value(out.type)
    b.nodes.append(Node(lin.op, [x, folded_w], dict(lin.attrs), [lin_out], lin.loc))
    if bias is None:
        shift = b("sub", beta, b("mul", mean, scale))
    else:
        vec = bias if bias.type.shape == (c,) else b("reshape", bias, shape=(c,))
        shift = b("add", b("mul", b("sub", vec, mean), scale), beta)
    bias_shape = (c,) + (1,) * (out.type.ndim - 2)  # per channel, broadcast along dim 1
    if bias_shape != (c,):
        shift = b("reshape", shift, shape=bias_shape)
    b("add", lin_out, shift, out=out)
    return b.nodes


# ---- the fixed point --------------------------------------------------------------------------
PASSES = (fold_batchnorm, fold_constants, simplify_algebra, transpose_matmul_results,
          concat_disjoint_scatters, concat_summed_matmuls, multiply_outer_products,
          eliminate_common_subexpressions, eliminate_dead_code)


def simplify(graph: Graph) -> Graph:
    """Run fold_batchnorm, fold_constants, simplify_algebra, transpose_matmul_results,
    concat_disjoint_scatters, concat_summed_matmuls, multiply_outer_products,
    eliminate_common_subexpressions and eliminate_dead_code in turn until a whole round
    changes nothing.

    Needs: a graph that verifies. Guarantees: what each pass guarantees; the input graph is
    not modified; the result is a fixed point of every pass (at most 20 rounds: a folded
    batch_norm is gone for good and every other pass only removes nodes or replaces one by a
    simpler one, so a few rounds suffice).
    """
    for _ in range(_MAX_ROUNDS):
        start = graph
        for fn in PASSES:
            graph = fn(graph)
        if graph is start:
            break
    return graph


__all__ = ["eliminate_common_subexpressions", "eliminate_dead_code", "fold_batchnorm",
           "fold_constants", "simplify", "simplify_algebra"]
