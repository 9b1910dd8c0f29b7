"""fuse_waits: a bucket's wait joins the elementwise update that reads its gradient.

After bucket_allreduce, a bucket of one gradient ends in

    %58: f32[256,784] = all_reduce_wait[op="avg", shapes=((256, 784),)](%bucket5)
    %62: f32[256,784], %65: f32[256,784] = fused[body=(("mul", (0, 3), ()), ...),
                                                  outputs=(...)](%m, %58, %w)

and a backend runs them as two passes over memory: the sum over the ranks writes %58, the
optimizer update reads it back. This pass makes them one node whose body starts with the
wait (the wait is an `epilogue_anchor`, as a GEMM is for its bias and activation):

    %62, %65, %58 = fused[body=(("all_reduce_wait", (0,), (("op", "avg"),
                              ("shapes", ((256, 784),)))), ("mul", (1, 3), ()), ...),
                          outputs=(..., 3)](%bucket5, %m, %w)

so the cpu backend sums the ranks' windows and updates the parameter and its state in the
same loop, writing the averaged gradient (the `.grad` the user sees) without reading it back
(graphc.backends.cpu.collective_shm); on the MPI path it still waits, then runs the update.

A wait is fused when it has one output, read by exactly one node (besides graph outputs and
updates), an elementwise one (a lone elementwise op, or a fused group without a GEMM anchor
or an ending reduction) whose outputs all have the gradient's shape (one loop nest over
it). The merged node stands where the update stood; it keeps the wait's result as an
output when the graph returns or updates it. Results are the same bits: the update reads
the same reduced value, from a register instead of memory.

Needs: a verified graph after bucket_allreduce (before plan_buffers). Guarantees: a
verified graph with the same inputs, outputs and updates, computing the same values; every
value keeps its name; a fused node holding a wait is effectful (graphc.ops.fused.effectful)
and keeps its order among the other effectful nodes.
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node, Value
from graphc.ops.fused import FusedBody
from graphc.ops.registry import ELEMENTWISE, REGISTRY


def fuse_waits(graph: Graph) -> Graph:
    """Merge each one-gradient all_reduce_wait into the elementwise node that reads it (see
    the module docstring).

    >>> from graphc.ir import parse
    >>> from graphc.ir.printer import format_graph
    >>> g = fuse_waits(parse('''graph @f(%g: f32[4], %w: f32[4]) -> (f32[4]) {
    ...   %b: f32[4] = all_reduce_start[op="avg"](%g)
    ...   %0: f32[4] = all_reduce_wait[op="avg", shapes=((4,),)](%b)
    ...   %1: f32[4] = sub(%w, %0)
    ...   %w <- %1
    ...   return (%0)
    ... }'''))
    >>> merged = g.nodes[1]
    >>> [n.op for n in g.nodes], merged.attrs["body"][0][0], [v.name for v in merged.outputs]
    (['all_reduce_start', 'fused'], 'all_reduce_wait', ['1', '0'])
    """
    readers: dict[Value, list[Node]] = {}
    for node in graph.nodes:
        for v in set(node.inputs):
            readers.setdefault(v, []).append(node)
    kept = set(graph.outputs) | {v for pair in graph.updates for v in pair}
    merged: dict[int, Node] = {}  # id of the update node -> the merged node
    dropped: set[int] = set()  # ids of the waits merged away
    for wait in graph.nodes:
        if wait.op != "all_reduce_wait" or len(wait.outputs) != 1:
            continue
        gradient = wait.outputs[0]
        users = readers.get(gradient, [])
        if len(users) != 1 or id(users[0]) in merged or not _fusible(users[0], gradient):
            continue
        merged[id(users[0])] = _merge(wait, users[0], gradient in kept)
        dropped.add(id(wait))
    if merged:
        graph.nodes = [merged.get(id(n), n) for n in graph.nodes if id(n) not in dropped]
        graph.meta.pop("memory_plan", None)
    return graph


def _fusible(node: Node, gradient: Value) -> bool:
    """An elementwise node (lone, or a fused group with neither anchor nor ending) whose
    outputs all have the gradient's shape."""
    opdef = REGISTRY.get(node.op)
    if opdef is None or (opdef.kind != ELEMENTWISE and node.op != "fused") or opdef.effectful:
        return False
    body = FusedBody.of_node(node)
    if body.anchor is not None or body.ending is not None:
        return False
    shape = tuple(gradient.type.shape)
    return all(tuple(v.type.shape) == shape for v in node.outputs)


def _merge(wait: Node, update: Node, keep_gradient: bool) -> Node:
    """One fused node: the wait as instruction 0, then `update`'s body reading its result."""
    gradient = wait.outputs[0]
    body = FusedBody.of_node(update)
    inputs = [wait.inputs[0]] + [v for v in update.inputs if v is not gradient]
    n = len(inputs)
    refs: dict[int, int] = {}  # the update's refs -> the merged body's
    position = 1
    for r, v in enumerate(update.inputs):
        if v is gradient:
            refs[r] = n
        else:
            refs[r] = position
            position += 1
    for k in range(len(body.instructions)):
        refs[body.ref(k)] = n + 1 + k
    instructions = [("all_reduce_wait", (0,), tuple(wait.attrs.items()))]
    for op, args, attrs in body.instructions:
        instructions.append((op, tuple(refs[a] for a in args), tuple(attrs.items())))
    outputs = [refs[r] for r in body.outputs]
    values = list(update.outputs)
    if keep_gradient:
        outputs.append(n)
        values.append(gradient)
    return Node("fused", inputs, {"body": tuple(instructions), "outputs": tuple(outputs)},
                values, update.loc)


def wait_bucket(node: Node) -> Value | None:
    """The bucket a node waits for: an all_reduce_wait's input, or a fused node's whose
    body starts with the wait; None for other nodes."""
    if node.op == "all_reduce_wait":
        return node.inputs[0]
    if node.op == "fused" and node.attrs["body"][0][0] == "all_reduce_wait":
        return node.inputs[node.attrs["body"][0][1][0]]
    return None


__all__ = ["fuse_waits", "wait_bucket"]
