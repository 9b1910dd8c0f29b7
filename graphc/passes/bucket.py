"""bucket_allreduce: gradient all_reduces grouped into buckets, each split into a start
placed as soon as the backward has produced the bucket and a wait placed as late as the
consumers allow, so the reduction overlaps the rest of the backward.

As PyTorch's DistributedDataParallel (Reducer: ~25 MB buckets, the first one 1 MiB) and
Horovod's tensor fusion, but planned on the whole step's graph instead of from autograd
hooks at run time. For a bucket of `all_reduce(x_i, op)` nodes with outputs o_i:

    %b  = all_reduce_start(%x_1, ..., %x_k)[op]    # right after the last x_i is produced
    ...                                            # the rest of the backward
    %o_1, ..., %o_k = all_reduce_wait(%b)[op, shapes]   # before the first reader of any o_i

- Buckets: the all_reduces in graph order (the order the backward produces the gradients),
  one open bucket per (dtype, op, bucket_view); a node joins its bucket, which closes once
  it holds at least its cap (as PyTorch's `compute_bucket_assignment_by_size`: the first
  bucket of each kind 1 MiB, the others the node's `bucket_cap` attribute, default 25 MiB;
  DDP's `bucket_cap_mb`). A cap of 0 puts each gradient in a bucket of its own. A node also
  starts a new bucket when joining would need the start after a reader of the bucket (an
  all_reduce whose result is read before the next one's input exists: a loss averaged
  mid-step). Then a kind's last bucket under 64 KiB joins the bucket before it when that
  one's cap is 64 KiB or more (a trailing bias gradient is not worth a collective of its
  own: it would cost at least the latency and one more wait for the other rank).
- Placement: a start follows the node that produced the bucket's last input; a wait comes
  no earlier than the bucket's first reader needs it (an optimizer update, or the end of the
  graph). After the last start, the buckets are waited for in the order they started, each
  only when nothing else can run without it, so the last bucket's reduction overlaps the
  updates the earlier ones feed (other effectful ops there, random draws, keep their
  order). Starts and waits are effectful and plan_buffers keeps
  effectful ops in program order (and data dependences), so the schedule it picks keeps the
  backward's remaining compute between a bucket's start and its wait, and every rank starts
  its buckets in the same order.
- Memory: the start's value is the buffer MPI reduces in place, and the wait reads it, so
  the buffer is live (never reused) while its request is in flight. The wait's outputs are
  the members' results themselves (the bucket split back by `shapes`), not views of the
  buffer: a reduced gradient the step returns (a `.grad`) is then a graph output the plan
  can place in its output array, so the wait writes it there and no copy out of the arena
  follows.
- `bucket_view` (DDP's `gradient_as_bucket_view`): all_reduces that carry it form buckets
  of their own, whose start carries it too: the backend may leave the reduced gradients in
  the bucket's memory and return them from there (graphc.backends.cpu.collective_shm).
- Left as they are: all_reduces with symbolic or empty shapes, and an all_reduce of another
  all_reduce's result.

New values are named `bucket<k>` (with `bucket_` and so on where a name of the graph already
starts with `bucket`).

Needs: a verified graph (after fuse, before plan_buffers). Guarantees: a verified graph with
the same inputs, outputs and updates, computing the same values (the o_i keep their names).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphc.ir.graph import Graph, Node, Value
from graphc.ops.registry import RANDOM, REGISTRY

DEFAULT_BUCKET_CAP = 25 * 2**20  # bytes: PyTorch DDP's bucket_cap_mb=25
FIRST_BUCKET_CAP = 2**20  # PyTorch's _DEFAULT_FIRST_BUCKET_BYTES
SMALL_TAIL = 64 * 2**10  # a kind's last bucket under this joins the previous one


@dataclass
class _Bucket:
    key: tuple
    cap: int
    members: list[Node] = field(default_factory=list)
    nbytes: int = 0
    ready: int = -1  # position of the node producing the last input (-1: graph inputs only)
    first_read: int = 0  # position of the first reader of any member's result


def has_collectives(graph: Graph) -> bool:
    """Whether the graph holds an all_reduce for this pass to bucket."""
    return any(node.op == "all_reduce" for node in graph.nodes)


def _bucketable(node: Node, producers: dict[Value, Node]) -> bool:
    """An all_reduce of a static, non-empty tensor that no all_reduce produced."""
    if node.op != "all_reduce":
        return False
    t = node.inputs[0].type
    made_by = producers.get(node.inputs[0])
    return not t.is_symbolic and t.numel > 0 and (made_by is None or made_by.op != "all_reduce")


def _assign(graph: Graph) -> list[_Bucket]:
    producer = {v: i for i, n in enumerate(graph.nodes) for v in n.outputs}
    producers = {v: n for n in graph.nodes for v in n.outputs}
    end = len(graph.nodes)
    first_read: dict[Value, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            first_read.setdefault(v, i)
    for v in list(graph.outputs) + [v for pair in graph.updates for v in pair]:
        first_read.setdefault(v, end)
    buckets: list[_Bucket] = []
    open_: dict[tuple, _Bucket] = {}
    for node in graph.nodes:
        if not _bucketable(node, producers):
            continue
        x, out = node.inputs[0], node.outputs[0]
        key = (x.type.dtype.name, node.attrs["op"], bool(node.attrs.get("bucket_view")))
        ready, read = producer.get(x, -1), first_read.get(out, end)
        bucket = open_.get(key)
        if bucket is not None and not (ready < bucket.first_read and bucket.ready < read):
            bucket = None  # one start for both would come after a reader of the bucket
        if bucket is None:
            cap = node.attrs.get("bucket_cap")
            cap = DEFAULT_BUCKET_CAP if cap is None else cap
            if not any(b.key == key for b in buckets):
                cap = min(cap, FIRST_BUCKET_CAP)
            bucket = open_[key] = _Bucket(key, cap, first_read=read)
            buckets.append(bucket)
        bucket.members.append(node)
        bucket.nbytes += x.type.nbytes
        bucket.ready = max(bucket.ready, ready)
        bucket.first_read = min(bucket.first_read, read)
        if bucket.nbytes >= bucket.cap:
            del open_[key]
    return _merge_small_tails(buckets)


def _merge_small_tails(buckets: list[_Bucket]) -> list[_Bucket]:
    """A kind's last bucket under SMALL_TAIL bytes joins the one before it (whose cap is no
    smaller) when the order allows: a whole collective for a few gradients costs more than
    starting the previous bucket a few nodes later."""
    for key in {b.key for b in buckets}:
        mine = [b for b in buckets if b.key == key]
        if len(mine) < 2:
            continue
        last, before = mine[-1], mine[-2]
        if last.nbytes < SMALL_TAIL <= before.cap and last.ready < before.first_read and \
                before.ready < last.first_read:
            before.members += last.members
            before.nbytes += last.nbytes
            before.ready = max(before.ready, last.ready)
            before.first_read = min(before.first_read, last.first_read)
            buckets.remove(last)
    return buckets


def _prefix(graph: Graph) -> str:
    """"bucket", or "bucket_", "bucket__", ... where some value's name starts with it."""
    names = [v.name for v in graph.inputs] + [v.name for n in graph.nodes for v in n.outputs]
    prefix = "bucket"
    while any(name.startswith(prefix) for name in names):
        prefix += "_"
    return prefix


def _split(bucket: _Bucket, name: str) -> tuple[list[Node], list[Node]]:
    """The start node (its value named `name`) and the wait, whose outputs are the members'
    own results, split back out of the bucket (`shapes`)."""
    op, view = bucket.key[1], bucket.key[2]
    loc = bucket.members[-1].loc
    flat = Value(name, _flat_type(bucket))
    attrs = {"op": op, "bucket_view": True} if view else {"op": op}
    start = Node("all_reduce_start", [m.inputs[0] for m in bucket.members], attrs, [flat], loc)
    outs = [m.outputs[0] for m in bucket.members]
    shapes = tuple(tuple(out.type.shape) for out in outs)
    wait = Node("all_reduce_wait", [flat], {"op": op, "shapes": shapes}, outs, loc)
    return [start], [wait]


def _flat_type(bucket: _Bucket):
    t = bucket.members[0].inputs[0].type
    return type(t)((sum(m.inputs[0].type.numel for m in bucket.members),), t.dtype)


def bucket_allreduce(graph: Graph) -> Graph:
    """Group the graph's all_reduces into buckets of non-blocking reductions (see the module
    docstring for what it needs and guarantees).

    >>> from graphc.ir import parse
    >>> from graphc.ir.printer import format_graph
    >>> g = bucket_allreduce(parse('''graph @f(%a: f32[4,2], %b: f32[3]) -> (f32[4,2], f32[3]) {
    ...   %0: f32[4,2] = all_reduce[op="avg"](%a)
    ...   %1: f32[3] = all_reduce[op="avg"](%b)
    ...   return (%0, %1)
    ... }'''))
    >>> print(format_graph(g))
    graph @f(%a: f32[4,2], %b: f32[3]) -> (f32[4,2], f32[3]) {
      %bucket0: f32[11] = all_reduce_start[op="avg"](%a, %b)
      %0: f32[4,2], %1: f32[3] = all_reduce_wait[op="avg", shapes=((4, 2), (3,))](%bucket0)
      return (%0, %1)
    }
    """
    buckets = _assign(graph)
    if not buckets:
        return graph
    bucketed = {id(m) for b in buckets for m in b.members}
    starts_after: dict[int, list[Node]] = {}
    waits_before: dict[int, list[Node]] = {}
    prefix = _prefix(graph)
    for index, bucket in enumerate(buckets):
        start, after = _split(bucket, f"{prefix}{index}")
        starts_after.setdefault(bucket.ready, []).extend(start)
        waits_before.setdefault(bucket.first_read, []).extend(after)
    nodes = list(starts_after.get(-1, []))
    for i, node in enumerate(graph.nodes):
        nodes += waits_before.get(i, [])
        if id(node) not in bucketed:
            nodes.append(node)
        nodes += starts_after.get(i, [])
    nodes += waits_before.get(len(graph.nodes), [])
    graph.nodes = _waits_in_start_order(nodes)
    return graph


def _effectful(node: Node) -> bool:
    opdef = REGISTRY.get(node.op)
    return opdef is not None and (opdef.effectful or opdef.kind == RANDOM)


def _waits_in_start_order(nodes: list[Node]) -> list[Node]:
    """After the last start, wait for the buckets in the order they started, each when
    nothing else can run without it, so the one started last is waited for last (after the
    updates the earlier buckets feed), as PyTorch's Reducer finalizes bucket by bucket."""
    last = max(i for i, n in enumerate(nodes) if n.op == "all_reduce_start")
    head, tail = nodes[:last + 1], nodes[last + 1:]
    started = {n.outputs[0]: i for i, n in enumerate(head) if n.op == "all_reduce_start"}
    position = {id(n): i for i, n in enumerate(tail)}
    made_in_tail = {v: n for n in tail for v in n.outputs}
    pending = {id(n): sum(v in made_in_tail for v in n.inputs) for n in tail}
    readers: dict[Value, list[Node]] = {}
    for n in tail:
        for v in n.inputs:
            if v in made_in_tail:
                readers.setdefault(v, []).append(n)
    previous = None  # other effectful ops (random draws, unbucketed collectives) keep order
    for n in tail:
        if n.op != "all_reduce_wait" and _effectful(n):
            if previous is not None:
                readers.setdefault(previous.outputs[0], []).append(n)
                pending[id(n)] += 1
            previous = n
    ready = [n for n in tail if not pending[id(n)]]
    order: list[Node] = []
    while ready:
        runnable = [n for n in ready if n.op != "all_reduce_wait"]
        node = runnable[0] if runnable else \
            min(ready, key=lambda n: started.get(n.inputs[0], len(head)))
        ready.remove(node)
        order.append(node)
        for v in node.outputs:
            for r in readers.get(v, ()):
                pending[id(r)] -= 1
                if not pending[id(r)]:
                    ready.append(r)
        ready.sort(key=lambda n: position[id(n)])
    return head + order


__all__ = ["DEFAULT_BUCKET_CAP", "FIRST_BUCKET_CAP", "SMALL_TAIL", "bucket_allreduce",
           "has_collectives"]
