"""fuse_batch_norm_backward: a training batch norm's backward after a ReLU (and a residual's
gradient added) becomes one `batch_norm_relu_backward` node, whose cpu kernel reads each
input once from memory (graphc.backends.cpu.batch_norm_backward).

After autodiff, `fuse` and the row passes (recompute_row_values, merge_sibling_sums), the
backward of `relu(batch_norm(x) [+ r])` is two fused nodes over [N, C, H, W]:
- S, the sums: g = where(positive, dy [+ dr], 0), then sum(g) and sum(g * xhat) over every
  axis but the channels' (xhat = (x - mean) * invstd), writing g too when dr is added (the
  shortcut reads it);
- A, the apply: weight * invstd * (g - sum(g) / m - xhat * sum(g * xhat) / m), reading the
  sums reshaped to [C, 1, 1] and g (or dy and the mask again, recomputing g).
Each walks its inputs from memory: S reads dy, dr, the mask and x; A reads g (or dy and the
mask) and x again. As one node the kernel walks a block of channels twice, the second walk
finding the block's planes in L2.

The match is on the fused bodies' expression trees (`_tree`, with add and mul commutative):
S's outputs are the two sums of one g (and g itself), A's output the apply of the same g, x,
mean and invstd (each a [C] value reshaped to [C, 1, 1]), m the reduced element count. The
new node stands at S's place (every input it reads is made before S) or else at A's (when
nothing between them reads S's outputs); it keeps the names of S's sums, of A's output and
of g; the reshapes of the sums, weight, mean and invstd no one else reads are dropped.
Anything else (a strided block's two batch norms summed in one walk, an eval batch norm, a
symbolic size) is left as it is.

Run after merge_sibling_sums and before plan_buffers; cpu pipeline only (the cuda backend
refuses the op). Off by default (FUSE: it did not pay in the step, see FUSE's comment).
Guarantees: the same values (the op's reference kernel runs the replaced nodes' kernels in
their order; the cpu kernel adds its planes' sums in float64); every value read outside keeps
its name; nodes in a topological order; the result verifies; the input graph is unchanged.
"""

from __future__ import annotations

import itertools
import math

from graphc.ir.graph import Graph, Node, Value
from graphc.ir.verifier import verify
from graphc.ops.fused import FusedBody
from graphc.types import TensorType, bool_, float32, float64

__all__ = ["fuse_batch_norm_backward"]

# Off: the one node's kernel is 15-30% faster than the two nodes' alone, but ResNet-18's step and
# a residual block's were no faster with it at one thread and slower at two (docs/performance.md,
# "batch norm + ReLU backward as one node, twelfth session"); True: the pass runs (A/B, tests).
FUSE = False
COMMUTATIVE = frozenset({"add", "mul"})

# the templates: nested tuples (op, attrs the instruction must have, arguments...); a "$NAME"
# string binds a leaf (a node input) or an attribute value
ZERO = ("full", {"value": 0.0})
COUNT = ("full", {"value": "$m"})
XHAT = ("mul", {}, ("sub", {}, "$X", "$MEAN"), "$INV")
G_RELU = ("where", {}, "$P", "$D", ZERO)
G_RESIDUAL = ("where", {}, "$P", ("add", {}, "$D", "$R"), ZERO)


def _sums(g) -> tuple:
    """The templates of sum(g) and sum(g * xhat)."""
    axes = {"axes": "$axes", "keepdim": False}
    return ("reduce_sum", axes, g), ("reduce_sum", axes, ("mul", {}, g, XHAT))


def _apply(g) -> tuple:
    """The template of the input gradient, the sums read as leaves $SG and $SGX."""
    return ("mul", {}, ("mul", {}, "$W", "$INV"),
            ("sub", {}, ("sub", {}, g, ("div", {}, "$SG", COUNT)),
             ("div", {}, ("mul", {}, XHAT, "$SGX"), COUNT)))


def fuse_batch_norm_backward(graph: Graph) -> Graph:
    """Fuse each batch norm + ReLU backward pair (see the module docstring). Returns a new
    graph, or the same one when nothing matched."""
    if not FUSE:
        return graph
    escaping = set(graph.outputs) | {v for _, v in graph.updates}
    readers: dict[Value, list[Node]] = {}
    for node in graph.nodes:
        for v in dict.fromkeys(node.inputs):
            readers.setdefault(v, []).append(node)
    maker = graph.producers()
    position = {id(node): k for k, node in enumerate(graph.nodes)}
    placed: dict[int, Node] = {}  # id(S or A) -> the new node at its place
    gone: set[int] = set()
    for node in graph.nodes:
        if node.op != "fused" or id(node) in gone:
            continue
        found = _match(node, readers, maker, position, escaping)
        if found is None or id(found[1]) in gone:
            continue
        fused, apply_node, at, dead = found
        placed[id(at)] = fused
        gone.update({id(node), id(apply_node), *(id(n) for n in dead)})
    if not placed:
        return graph
    nodes = [placed.get(id(n), n) for n in graph.nodes
             if id(n) not in gone or id(n) in placed]
    out = Graph(graph.name, list(graph.inputs), nodes, list(graph.outputs), list(graph.updates))
    out.meta = dict(graph.meta)
    verify(out)
    return out


def _match(sums: Node, readers, maker, position, escaping):
    """(the new node, the apply node A, the node whose place it takes, the reshapes left
    unread) when `sums` is a backward's S (see the module docstring); else None."""
    fb = FusedBody.of_node(sums)
    if fb.anchor is not None or len(fb.outputs) not in (2, 3):
        return None
    trees = [_tree(fb, sums, ref) for ref in fb.outputs]
    residual = len(trees) == 3
    g = G_RESIDUAL if residual else G_RELU
    roles = (g, *_sums(g)) if residual else _sums(g)
    for order in itertools.permutations(range(len(trees))):
        bound = _unify_all(roles, [trees[k] for k in order])
        if bound is not None:
            break
    else:
        return None
    outputs = [sums.outputs[k] for k in order]
    g_value = outputs[0] if residual else None
    sum_g, sum_gx = outputs[-2:]
    x = bound["$X"]
    if not _plain(x.type) or bound["$axes"] != (0, *range(2, x.type.ndim)):
        return None
    for node in _readers_of(sum_g, readers):
        if node.op != "reshape":
            continue
        for apply_node in _readers_of(node.outputs[0], readers):
            if apply_node.op != "fused" or position[id(apply_node)] < position[id(sums)]:
                continue
            found = _apply_match(sums, apply_node, bound, g_value, sum_g, sum_gx, readers,
                                 maker, position, escaping)
            if found is not None:
                return found
    return None


def _apply_match(sums, apply_node, bound, g_value, sum_g, sum_gx, readers, maker, position,
                 escaping):
    """The rewrite of (sums, apply_node) when apply_node is its A; else None."""
    fb = FusedBody.of_node(apply_node)
    if fb.anchor is not None or len(fb.outputs) != 1:
        return None
    template = _apply(G_RELU if g_value is None else ("$G"))
    applied = _unify(template, _tree(fb, apply_node, fb.outputs[0]), {})
    if applied is None or (g_value is not None and applied["$G"] is not g_value):
        return None
    x = bound["$X"]
    c = x.type.shape[1]
    channel = {}
    for name in ("$MEAN", "$INV"):
        channel[name] = _channel_source(bound[name], c, maker)
        if channel[name] is None or _channel_source(applied[name], c, maker) is not channel[name]:
            return None
    weight = _channel_source(applied["$W"], c, maker)
    sources = {"$SG": sum_g, "$SGX": sum_gx}
    if (weight is None or applied["$X"] is not x
            or any(_channel_source(applied[k], c, maker) is not v for k, v in sources.items())
            or applied["$m"] != float(math.prod(x.type.shape) // c)):
        return None
    if g_value is None and (applied["$P"] is not bound["$P"] or applied["$D"] is not bound["$D"]):
        return None
    grads = [bound["$D"]] + ([bound["$R"]] if "$R" in bound else [])
    if (any(v.type != x.type for v in grads) or bound["$P"].type != TensorType(x.type.shape, bool_)
            or any(v.type != TensorType((c,), x.type.dtype)
                   for v in (weight, *channel.values()))):
        return None
    dx = apply_node.outputs[0]
    # g written only when someone besides A reads it
    relu_grad = g_value is not None and (g_value in escaping or any(
        n is not apply_node for n in _readers_of(g_value, readers)))
    inputs = [bound["$D"], bound["$P"], x, weight, channel["$MEAN"], channel["$INV"], *grads[1:]]
    outputs = [dx, sum_gx, sum_g] + ([g_value] if relu_grad else [])
    fused = Node("batch_norm_relu_backward", inputs, {"relu_grad": relu_grad}, outputs,
                 apply_node.loc)
    within = {id(sums), id(apply_node)}
    dead = [n for n in _reshapes_read(sums, apply_node, maker=maker)
            if n.outputs[0] not in inputs
            and not any(id(r) not in within for v in n.outputs for r in readers.get(v, []))
            and not any(v in escaping for v in n.outputs)]
    dead_ids = {id(n) for n in dead}
    first = position[id(sums)]
    if all(v not in maker or position[id(maker[v])] < first for v in inputs):
        at = sums
    elif not any(first < position[id(r)] < position[id(apply_node)] and id(r) not in dead_ids
                 for v in sums.outputs for r in readers.get(v, [])):
        at = apply_node
    else:
        return None
    return fused, apply_node, at, dead


def _readers_of(v: Value, readers) -> list[Node]:
    return readers.get(v, [])


def _plain(t: TensorType) -> bool:
    """A static float32/float64 (N, C, ...) type with at least one element per channel."""
    return (t.dtype in (float32, float64) and t.ndim >= 2 and not t.is_symbolic
            and math.prod(t.shape) > 0)


def _channel_source(v: Value, c: int, maker) -> Value | None:
    """The [C] value that `v` ([C, 1, ...], a reshape) reshapes; None for anything else."""
    node = maker.get(v)
    if node is None or node.op != "reshape" or node.inputs[0].type.shape != (c,):
        return None
    return node.inputs[0]


def _reshapes_read(*nodes: Node, maker) -> list[Node]:
    """The reshape nodes whose outputs `nodes` read (each once)."""
    found: dict[int, Node] = {}
    for node in nodes:
        for v in node.inputs:
            made = maker.get(v)
            if made is not None and made.op == "reshape":
                found[id(made)] = made
    return list(found.values())


def _tree(fb: FusedBody, node: Node, ref: int):
    """The expression of `ref` in `node`'s body: a node input as itself (a Value), an
    instruction as (op, attrs, argument trees...)."""
    if ref < fb.n_inputs:
        return node.inputs[ref]
    ins = fb.instructions[ref - fb.n_inputs]
    return (ins.op, ins.attrs, *(_tree(fb, node, a) for a in ins.args))


def _unify_all(templates, trees) -> dict | None:
    bound: dict | None = {}
    for template, tree in zip(templates, trees):
        bound = _unify(template, tree, bound)
        if bound is None:
            return None
    return bound


def _unify(template, tree, bound: dict) -> dict | None:
    """`bound` extended so that `template` means `tree`, or None (add and mul commute)."""
    if isinstance(template, str):  # a leaf: a node input
        if not isinstance(tree, Value):
            return None
        if template in bound:
            return bound if bound[template] is tree else None
        return {**bound, template: tree}
    if isinstance(tree, Value) or template[0] != tree[0] or len(template) != len(tree):
        return None
    op, want, *args = template
    _, attrs, *children = tree
    for key, value in want.items():
        if key not in attrs:
            return None
        if isinstance(value, str) and value.startswith("$"):
            if value in bound and bound[value] != attrs[key]:
                return None
            bound = {**bound, value: _frozen(attrs[key])}
        elif attrs[key] != value:
            return None
    orders = [children] + ([children[::-1]] if op in COMMUTATIVE and len(children) == 2 else [])
    for order in orders:
        result: dict | None = bound
        for sub_template, sub_tree in zip(args, order):
            result = _unify(sub_template, sub_tree, result)
            if result is None:
                break
        if result is not None:
            return result
    return None


def _frozen(value):
    return tuple(value) if isinstance(value, list) else value
