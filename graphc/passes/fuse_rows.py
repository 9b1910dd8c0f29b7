"""fuse_rows: the row-wise work of a normalisation or a softmax gradient as one fused node.

After `fuse`, a reduction ends its group, so a LayerNorm forward is four kernels (the mean;
the centred values and their variance; the reciprocal deviation; the normalised, scaled and
shifted output), its backward four or five more, and a softmax backward two, each reading
and writing whole tensors that no longer fit in cache. This pass merges such neighbours into
one `fused` node, a *row program*: per row of the domain D = (..., R) (R the last dim),
the body's row reductions (reduce_sum / reduce_mean over the last dim, keepdim) are computed
in passes over the row, and everything after them (the rest of the body, per element) in a
last pass, so each input is read from memory once and each output written once; the row
stays in L1 between passes. A backend lowers it as such (graphc.backends.cpu.rows); to the
interpreter it is an ordinary fused body (each instruction's numpy kernel in order).

What may join a row group of domain D (static sizes, R >= 2):
- a node whose every value broadcasts into D, whose outputs are D-shaped, row-shaped
  (D with last dim 1: a per-row mean, a reciprocal deviation) or column sums (below), and
  whose body holds elementwise ops with a scalar rendering, `broadcast_to`, `full`, row
  reductions of D-shaped values, or column sums: reduce_sum of a D-shaped value over all
  dims but the last (a LayerNorm's weight and bias gradients), read by nothing in the body;
- a group starts at a node holding a row reduction (a seed) of floating values; a node
  joins the groups of the nodes that produce its inputs when it fits their domain, reads
  none of their column sums, and the merge makes no cycle (no path leaves the group and
  comes back, over the groups as they stand); two groups it joins merge on the same terms,
  unless one reads the other's column sums;
- then a lone column sum joins a group that reads or makes its input (a sibling: the value
  is read once), unless the group reads the sum;
- a member `broadcast_to` read outside the group stays outside as well, a view of the row
  program's row-shaped output (never a materialised D-shaped tensor);
- GEMM epilogues (a contraction anchor), views other than broadcast_to, effectful ops and
  symbolic sizes never join.
Row programs given to it (it runs again after graphc.passes.row_recompute) are nodes like
any other: they seed groups and join them.

Needs: a fused graph (run after `fuse`), for a backend that lowers row programs (cpu).
Guarantees: the same values (the interpreter runs each instruction's kernel as before);
every value read outside its group, a graph output or an update stays an output under its
name; nodes in a topological order, effectful nodes in their original order; the result
verifies; graph.meta["fuse_rows"] lists the groups made.

>>> from graphc.ir import parse
>>> g = fuse_rows(parse('''graph @f(%x: f32[4,8]) -> (f32[4,8]) {
...   %0: f32[4,1] = reduce_mean[axes=(1,), keepdim=true](%x)
...   %1: f32[4,8] = fused[body=(("sub", (0, 1), ()),), outputs=(2,)](%x, %0)
...   return (%1)
... }'''))
>>> [n.op for n in g.nodes], [op for op, _, _ in g.nodes[0].attrs["body"]]
(['fused'], ['reduce_mean', 'sub'])
"""

from __future__ import annotations

import heapq

from graphc.errors import ShapeError
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.verifier import verify
from graphc.ops.fused import FusedBody, effectful
from graphc.ops.registry import ELEMENTWISE, REGISTRY
from graphc.ops.shapes import broadcast_many
from graphc.passes.sibling_sums import is_sibling_sums

__all__ = ["column_sum", "fuse_rows", "is_row_program", "row_domain", "row_reduction"]

ROW_REDUCTIONS = ("reduce_sum", "reduce_mean")
_BODY_OPS = ("broadcast_to", "full")


def row_reduction(op: str, attrs: dict, arg_shape: tuple) -> bool:
    """A reduce_sum / reduce_mean over the last dim of its argument, keeping it (size 1)."""
    return (op in ROW_REDUCTIONS and len(arg_shape) >= 1
            and tuple(attrs.get("axes", ())) == (len(arg_shape) - 1,)
            and bool(attrs.get("keepdim")))


def column_sum(op: str, attrs: dict, arg_shape: tuple) -> bool:
    """A reduce_sum over every dim of its argument but the last (a per-column total)."""
    return (op == "reduce_sum" and len(arg_shape) >= 2
            and tuple(attrs.get("axes", ())) == tuple(range(len(arg_shape) - 1)))


def is_row_program(body: FusedBody) -> bool:
    """Whether a fused body is a row program (made by this pass): no contraction anchor and a
    reduction that is not its last instruction, or several reductions (but not sums over one
    domain alone: graphc.passes.sibling_sums)."""
    if body.anchor is not None or is_sibling_sums(body):
        return False
    reductions = [k for k, ins in enumerate(body.instructions)
                  if REGISTRY[ins.op].reduction is not None]
    return len(reductions) > 1 or (len(reductions) == 1
                                   and reductions[0] != len(body.instructions) - 1)


def row_domain(body: FusedBody) -> tuple | None:
    """A row program's domain: the argument shape of its first row reduction of static
    size (None when it has none)."""
    for ins in body.instructions:
        arg = tuple(body.types[ins.args[0]].shape) if ins.args else ()
        if row_reduction(ins.op, ins.attrs, arg) and _static(arg):
            return arg
    return None


def body_cache():
    """FusedBody.of_node memoised per node for one pass run: a body with symbolic sizes is
    decoded afresh by every FusedBody.of_node (its shape rules re-run), and a static one is
    looked up by hashing its whole body (FusedBody.decoded)."""
    bodies: dict[Node, FusedBody] = {}

    def body(node: Node) -> FusedBody:
        found = bodies.get(node)
        if found is None:
            found = bodies[node] = FusedBody.of_node(node)
        return found

    return body


def _static(shape) -> bool:
    return all(type(n) is int for n in shape)


def _broadcasts_into(shape: tuple, domain: tuple) -> bool:
    try:
        return tuple(broadcast_many("fuse_rows", tuple(shape), domain)) == domain
    except ShapeError:
        return False


class _Fit:
    """How a node fits a row domain: None where it does not (see `fit`)."""

    def __init__(self, columns: set[Value], seeds: bool) -> None:
        self.columns = columns  # outputs that are column sums
        self.seeds = seeds  # the node holds a row reduction


def _seed_domain(node: Node, bodies=FusedBody.of_node) -> tuple | None:
    """The domain of the node's first row reduction, if it has one."""
    if not _candidate_op(node):
        return None
    body = bodies(node)
    for k, ins in enumerate(body.instructions):
        arg = body.types[ins.args[0]].shape if ins.args else ()
        if (row_reduction(ins.op, ins.attrs, arg) and _static(arg) and arg and arg[-1] >= 2
                and body.types[body.ref(k)].dtype.is_floating):
            return tuple(arg)
    return None


def _candidate_op(node: Node) -> bool:
    opdef = REGISTRY.get(node.op)
    if opdef is None or effectful(node):
        return False
    return (node.op == "fused" or node.op in ROW_REDUCTIONS or node.op == "broadcast_to"
            or (opdef.kind == ELEMENTWISE and opdef.scalar is not None))


def fit(node: Node, domain: tuple, bodies=FusedBody.of_node) -> _Fit | None:
    """How `node` fits a row group of `domain`, or None when it may not join one
    (`bodies`: how to decode a node's body, e.g. a `body_cache()`)."""
    if not _candidate_op(node):
        return None
    body = bodies(node)
    if body.anchor is not None or not all(_broadcasts_into(t.shape, domain) for t in body.types):
        return None
    row_shape = domain[:-1] + (1,)
    column_refs: set[int] = set()
    seeds = False
    for k, ins in enumerate(body.instructions):
        ref = body.ref(k)
        if any(a in column_refs for a in ins.args):
            return None  # a column sum read inside the body
        opdef = REGISTRY[ins.op]
        arg = tuple(body.types[ins.args[0]].shape) if ins.args else ()
        if opdef.reduction is not None:
            if not body.types[ref].dtype.is_floating:
                return None  # integer sums are left to the reduction kernels
            if row_reduction(ins.op, ins.attrs, arg) and arg == domain:
                seeds = True
            elif column_sum(ins.op, ins.attrs, arg) and arg == domain:
                column_refs.add(ref)
            else:
                return None
        elif ins.op not in _BODY_OPS and (opdef.kind != ELEMENTWISE or opdef.scalar is None):
            return None
    columns: set[Value] = set()
    for ref, v in zip(body.outputs, node.outputs):
        shape = tuple(v.type.shape)
        if ref in column_refs:
            columns.add(v)
        elif shape not in (domain, row_shape):
            return None
    return _Fit(columns, seeds)


class _Grouping:
    """Greedy row groups over the graph in order (see the module docstring)."""

    def __init__(self, graph: Graph) -> None:
        self.nodes = graph.nodes
        self.producer = {v: i for i, node in enumerate(self.nodes) for v in node.outputs}
        self.preds = [sorted({self.producer[v] for v in node.inputs if v in self.producer})
                      for node in self.nodes]
        self.succs: list[list[int]] = [[] for _ in self.nodes]
        for i, preds in enumerate(self.preds):
            for p in preds:
                self.succs[p].append(i)
        self.group_of: dict[int, int] = {}
        self.members: dict[int, list[int]] = {}
        self.domain: dict[int, tuple] = {}
        self.columns: dict[int, set[Value]] = {}
        self.body = body_cache()

    def run(self) -> list[list[int]]:
        for i, node in enumerate(self.nodes):
            candidates = []
            for p in self.preds[i]:
                gid = self.group_of.get(p)
                if gid is not None and gid not in candidates:
                    candidates.append(gid)
            for gid in candidates:
                if gid not in self.members:  # merged away meanwhile
                    continue
                how = fit(node, self.domain[gid], self.body)
                if how is None or any(v in self.columns[gid] for v in node.inputs):
                    continue
                mine = self.group_of.get(i)
                if mine is None:
                    if not self._makes_cycle(set(self.members[gid]) | {i}, i):
                        self._join(i, gid, how)
                elif (mine != gid and self.domain[mine] == self.domain[gid]
                      and not self._reads_columns(mine, gid)
                      and not self._reads_columns(gid, mine)):
                    members = set(self.members[mine]) | set(self.members[gid])
                    if not self._makes_cycle(members, i):
                        self._merge(mine, gid)
            if i not in self.group_of:
                domain = _seed_domain(node, self.body)
                how = fit(node, domain, self.body) if domain is not None else None
                if how is not None and how.seeds:
                    self.group_of[i] = i
                    self.members[i] = [i]
                    self.domain[i] = domain
                    self.columns[i] = set(how.columns)
        self._add_column_siblings()
        return [sorted(m) for m in self.members.values() if len(m) > 1]

    def _add_column_siblings(self) -> None:
        """A lone column sum (a bias or LayerNorm weight gradient) joins a row group that
        reads or makes the same D-shaped value, so that value is read once."""
        readers: dict[Value, list[int]] = {}
        for gid, members in self.members.items():
            for m in members:
                for v in list(self.nodes[m].inputs) + list(self.nodes[m].outputs):
                    if gid not in readers.setdefault(v, []):
                        readers[v].append(gid)
        for i, node in enumerate(self.nodes):
            if i in self.group_of:
                continue
            for gid in [g for v in node.inputs for g in readers.get(v, ())]:
                if gid not in self.members:
                    continue
                how = fit(node, self.domain[gid], self.body)
                if (how is None or how.seeds or len(how.columns) != len(node.outputs)
                        or any(v in self.columns[gid] for v in node.inputs)
                        or any(v in self.nodes[m].inputs for m in self.members[gid]
                               for v in node.outputs)):
                    continue  # a member reading the sum would read it half made
                members = set(self.members[gid]) | {i}
                if not self._makes_cycle(members, self._reach_limit(max(members)) + 1):
                    self._join(i, gid, how)
                    break

    def _reads_columns(self, reader: int, gid: int) -> bool:
        """Does a member of group `reader` read a column sum group `gid` makes?"""
        return any(v in self.columns[gid] for m in self.members[reader]
                   for v in self.nodes[m].inputs)

    def _join(self, i: int, gid: int, how: _Fit) -> None:
        self.group_of[i] = gid
        self.members[gid].append(i)
        self.columns[gid] |= how.columns

    def _merge(self, keep: int, drop: int) -> None:
        for m in self.members[drop]:
            self.group_of[m] = keep
        self.members[keep].extend(self.members.pop(drop))
        self.columns[keep] |= self.columns.pop(drop)
        del self.domain[drop]

    def _reach_limit(self, last: int) -> int:
        """After grouping, the groups hold later nodes: a path from a node at or before
        `last` back to one can pass through a group's later members only if that group also
        has a member before the bound; the bound grows over such groups until none has."""
        bound, grown = last, True
        while grown:
            grown = False
            for members in self.members.values():
                if min(members) < bound < max(members):
                    bound, grown = max(members), True
        return bound

    def _makes_cycle(self, members: set[int], limit: int) -> bool:
        """Would a path leave `members` and come back, over the groups as they stand? Only
        nodes before `limit` can be on such a path (while grouping in graph order, the node
        being visited: later nodes are in no group yet)."""
        stack = [c for m in members for c in self.succs[m] if c not in members and c < limit]
        seen: set[int] = set()
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            gid = self.group_of.get(c)
            inside = self.members[gid] if gid is not None else [c]
            seen.update(inside)
            for y in inside:
                for s in self.succs[y]:
                    if s in members:
                        return True
                    if s < limit and s not in seen:
                        stack.append(s)
        return False


def _row_node(grouping: _Grouping, members: list[int],
              escaping: set[Value]) -> tuple[Node, list[Node]]:
    """One fused node computing `members` (in graph order) as one body, and the views to
    put after it: a member broadcast_to read outside stays a view of the node's row-shaped
    output (copied into the body for the readers inside), never a materialised tensor."""
    nodes = grouping.nodes
    inside = set(members)
    made = {v for m in members for v in nodes[m].outputs}
    inputs: list[Value] = []
    for m in members:
        for v in nodes[m].inputs:
            if v not in made and v not in inputs:
                inputs.append(v)
    ref = {v: k for k, v in enumerate(inputs)}
    body: list[tuple] = []
    for m in members:
        node = nodes[m]
        fb = grouping.body(node)
        local = {k: ref[v] for k, v in enumerate(node.inputs)}
        for k, ins in enumerate(fb.instructions):
            local[fb.ref(k)] = len(inputs) + len(body)
            body.append((ins.op, tuple(local[a] for a in ins.args), tuple(ins.attrs.items())))
        for r, v in zip(fb.outputs, node.outputs):
            ref[v] = local[r]
    outputs: list[Value] = []
    views: list[Node] = []
    for m in members:
        for v in nodes[m].outputs:
            if v not in escaping and not any(c not in inside and v in nodes[c].inputs
                                             for c in grouping.succs[m]):
                continue
            if nodes[m].op == "broadcast_to" and nodes[m].inputs[0] in made:
                views.append(nodes[m])
                v = nodes[m].inputs[0]
            if v not in outputs:
                outputs.append(v)
    if not outputs:
        outputs = [nodes[members[-1]].outputs[0]]
    first = nodes[members[0]]
    fused = Node("fused", inputs, {"body": tuple(body), "outputs": tuple(ref[v] for v in outputs)},
                 outputs, first.loc)
    return fused, views


def _ordered(placed: list[tuple[int, Node]]) -> list[Node]:
    """A topological order of the nodes, each as early as its priority (the graph position
    of its first member) allows; effectful nodes keep their order."""
    producer = {v: k for k, (_, node) in enumerate(placed) for v in node.outputs}
    succs: list[set[int]] = [set() for _ in placed]
    indegree = [0] * len(placed)

    def edge(a: int, b: int) -> None:
        if a != b and b not in succs[a]:
            succs[a].add(b)
            indegree[b] += 1

    for k, (_, node) in enumerate(placed):
        for v in node.inputs:
            if v in producer:
                edge(producer[v], k)
    effects = sorted((p, k) for k, (p, node) in enumerate(placed) if effectful(node))
    for (_, a), (_, b) in zip(effects, effects[1:]):
        edge(a, b)
    ready = [(placed[k][0], k) for k in range(len(placed)) if indegree[k] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(placed[k][1])
        for s in succs[k]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, (placed[s][0], s))
    if len(order) != len(placed):
        raise RuntimeError("fuse_rows: internal: the row groups make a cycle")
    return order


def fuse_rows(graph: Graph) -> Graph:
    """Merge each row reduction with its row-wise neighbours into one fused row program
    (see the module docstring). The input graph is left unchanged."""
    grouping = _Grouping(graph)
    groups = grouping.run()
    if not groups:
        return graph
    grouped = {m for g in groups for m in g}
    escaping = set(graph.outputs) | {v for _, v in graph.updates}
    placed = [(i, node) for i, node in enumerate(graph.nodes) if i not in grouped]
    report = []
    for members in groups:
        node, views = _row_node(grouping, members, escaping)
        placed.append((members[0], node))
        placed.extend((members[-1], view) for view in views)
        report.append({"members": len(members), "ops": tuple(op for op, _, _ in node.attrs["body"]),
                       "outputs": tuple(v.name for v in node.outputs), "loc": node.loc})
    out = Graph(graph.name, list(graph.inputs), _ordered(placed), list(graph.outputs),
                list(graph.updates))
    out.meta = dict(graph.meta)
    out.meta["fuse_rows"] = report
    verify(out)
    return out
