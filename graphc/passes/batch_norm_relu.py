"""fuse_batch_norm_relu: a training batch norm whose output only a fused ReLU reads (with a
residual add before it, or not) becomes one `batch_norm_relu` node, so the normalised tensor is
never written and read back.

In a ResNet step, `fuse` leaves `batch_norm` (its own kernel: two walks over x) and, after it,
`fused[relu, gt](y)` or `fused[add, relu, gt](y, r)`: the ReLU and its mask `relu(z) > 0` for
the backward. That second kernel reads y (and r) and writes relu(z) and the mask: ~13-17 bytes
an element of the largest tensors of the step. As one node the batch norm's output walk writes
relu(z) and the mask directly (graphc.backends.cpu.batch_norm); y is not written at all.

The rewrite, for a `batch_norm` node B with output y, when
- y is read by one node F only (not a graph output or update), a `fused` node whose body is
  exactly: an optional `add` of y and one other input r (either order), a `relu` of y (or of
  the add), a 0-d `full` of 0, and `gt(relu, 0)`, F's outputs being the relu and the gt;
- r, if any, has y's type and does not depend on B;
- x is float32 or float64 (what the cpu kernel lowers);
B becomes `batch_norm_relu[training, eps](x, weight, bias, running_mean, running_var[, r])`
with outputs (F's relu, F's gt, B's save_mean, B's save_invstd), and F goes. The node stands at
B's place when r is a graph input or made before B; otherwise at F's place, the nodes between B
and F that read B's statistics (the running-statistics updates) moving right after it. So of a
downsample block's two batch norms, relu(bn2(conv2(h)) + bn_s(conv_s(x))), the first in order
(the body's, after a 3x3 convolution whose sums fuse_conv_channel_sums hands over) takes the
add and the ReLU, the shortcut's staying a `batch_norm`.
Both orders of the add give the same bits (IEEE addition commutes), and the op's reference
kernel runs batch_norm, add, relu and gt in that order, so the interpreter computes what the
two nodes computed.

Run after `fuse` (it reads the fused ReLU) and before `plan_buffers`; cpu pipeline only (the
cuda backend refuses the op). A batch norm in eval mode with no mask read (inference) is left
as it is. Guarantees: the same values; every value read outside keeps its name; nodes in a
topological order; the result verifies; the input graph is left unchanged.

>>> from graphc.ir import parse
>>> g = fuse_batch_norm_relu(parse('''graph @f(%x: f32[2,3,4], %w: f32[3], %b: f32[3],
...     %m: f32[3], %v: f32[3]) -> (f32[2,3,4], bool[2,3,4], f32[3], f32[3]) {
...   %0: f32[2,3,4], %1: f32[3], %2: f32[3] = batch_norm[training=true, eps=1e-05](%x, %w,
...       %b, %m, %v)
...   %3: f32[2,3,4], %4: bool[2,3,4] = fused[body=(("relu", (0,), ()), ("full", (),
...       (("shape", ()), ("value", 0.0), ("dtype", "float32"))), ("gt", (1, 2), ())),
...       outputs=(1, 3)](%0)
...   return (%3, %4, %1, %2)
... }'''))
>>> [node.op for node in g.nodes], [v.name for v in g.nodes[0].outputs]
(['batch_norm_relu'], ['3', '4', '1', '2'])
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node, Value
from graphc.ir.verifier import verify
from graphc.ops.fused import FusedBody
from graphc.types import float32, float64

__all__ = ["fuse_batch_norm_relu"]

FUSE = True  # False: the pass leaves every graph as it is (benchmarks' A/B)
# False: a residual made after the batch norm leaves it apart, the other batch norm of a
# downsample block taking the ReLU (the tenth session's rule; benchmarks' A/B)
AT_THE_RELU = True


def fuse_batch_norm_relu(graph: Graph) -> Graph:
    """Fuse each batch norm with the ReLU after it (see the module docstring). Returns a new
    graph, or the same one when nothing changed."""
    if not FUSE:
        return graph
    escaping = set(graph.outputs) | {v for _, v in graph.updates}
    readers: dict[Value, list[Node]] = {}
    for node in graph.nodes:
        for v in dict.fromkeys(node.inputs):
            readers.setdefault(v, []).append(node)
    position = {id(node): k for k, node in enumerate(graph.nodes)}
    maker = graph.producers()
    replaced: dict[int, Node] = {}
    dropped: set[int] = set()
    after: dict[int, list[Node]] = {}  # id(F) -> the fused node and the nodes moved behind it
    moved: set[int] = set()
    for node in graph.nodes:
        if (node.op != "batch_norm" or node.inputs[0].type.dtype not in (float32, float64)
                or id(node) in moved):
            continue
        y = node.outputs[0]
        users = readers.get(y, [])
        if (y in escaping or len(users) != 1 or users[0].op != "fused"
                or id(users[0]) in dropped  # a block's two batch norms added: one takes it
                or id(users[0]) in moved):
            continue
        residual = _relu_of(users[0], y)
        if residual is None:
            continue
        extra = [] if residual is True else [residual]
        if extra and (extra[0].type != y.type or id(maker.get(extra[0])) in moved):
            continue
        relu_v, mask_v = users[0].outputs
        fused = Node("batch_norm_relu", [*node.inputs, *extra], dict(node.attrs),
                     [relu_v, mask_v, *node.outputs[1:]], node.loc)
        if not extra or extra[0] not in maker or position[id(maker[extra[0]])] < position[
                id(node)]:
            replaced[id(node)] = fused
        elif not AT_THE_RELU:
            continue
        else:
            behind = _dependents_between(node, users[0], readers, position)
            if (extra[0] in {v for n in behind for v in n.outputs}
                    or any(n.op == "batch_norm" or id(n) in moved or id(n) in dropped
                           for n in behind)):
                continue  # r depends on B, or the nodes to move are others' to rewrite
            after[id(users[0])] = [fused, *behind]
            moved.update({id(node), *(id(n) for n in behind)})
        dropped.add(id(users[0]))
    if not dropped:
        return graph
    nodes: list[Node] = []
    for n in graph.nodes:
        if id(n) in after:
            nodes += after[id(n)]
        elif id(n) not in dropped and id(n) not in moved:
            nodes.append(replaced.get(id(n), n))
    out = Graph(graph.name, list(graph.inputs), nodes, list(graph.outputs), list(graph.updates))
    out.meta = dict(graph.meta)
    verify(out)
    return out


def _dependents_between(bn: Node, relu: Node, readers: dict[Value, list[Node]],
                        position: dict[int, int]) -> list[Node]:
    """The nodes after `bn` and before `relu` that read bn's outputs, directly or through one
    another, in order (`relu` reads bn's first output only, so it is never among them)."""
    end = position[id(relu)]
    found: dict[int, Node] = {}
    todo = list(bn.outputs[1:])
    while todo:
        for reader in readers.get(todo.pop(), []):
            if id(reader) in found:
                continue
            if position[id(reader)] >= end:
                continue  # read after the relu: the node at the relu's place comes first
            found[id(reader)] = reader
            todo += reader.outputs
    return sorted(found.values(), key=lambda n: position[id(n)])


def _relu_of(fused: Node, y: Value) -> Value | bool | None:
    """True when `fused` computes exactly (relu(y), relu(y) > 0); its other input r when it
    computes (relu(y + r), relu(y + r) > 0) (or r + y); None otherwise."""
    fb = FusedBody.of_node(fused)
    ops = [i.op for i in fb.instructions]
    if sorted(ops) not in (["full", "gt", "relu"], ["add", "full", "gt", "relu"]):
        return None
    by_op = {i.op: (fb.ref(k), i) for k, i in enumerate(fb.instructions)}
    relu_ref, relu = by_op["relu"]
    full_ref, full = by_op["full"]
    gt_ref, gt = by_op["gt"]
    if (full.attrs.get("shape") != () or full.attrs.get("value") != 0.0
            or full.attrs.get("dtype") != y.type.dtype.name or gt.args != (relu_ref, full_ref)
            or tuple(fb.outputs) != (relu_ref, gt_ref)):
        return None
    y_refs = [k for k, v in enumerate(fused.inputs) if v == y]
    if "add" not in by_op:
        return True if len(fused.inputs) == 1 and relu.args == (0,) and y_refs == [0] else None
    add_ref, add = by_op["add"]
    if (len(fused.inputs) != 2 or len(y_refs) != 1 or relu.args != (add_ref,)
            or sorted(add.args) != [0, 1]):
        return None
    return fused.inputs[1 - y_refs[0]]
