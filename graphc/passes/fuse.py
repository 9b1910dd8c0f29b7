"""The fuse pass: groups of elementwise work become one `fused` node (graphc.ops.fused).

What forms a group (nodes are visited in graph order; a node joins the groups of the nodes
that produce its inputs, and several such groups merge when it joins them all):
- elementwise: chains and DAGs of pure ELEMENTWISE ops, with broadcasting; each instruction
  of the body keeps its own type, as the registry's shape rule gives it;
- reduce: an op whose OpDef `ends_fused_group` (a `reduction`: reduce_sum/mean/max/min/prod,
  or `row_wise`: softmax/log_softmax) absorbs the elementwise group that produces
  its input, when every member's shape broadcasts into the reduction's input; the reduction
  ends the group (nothing joins it afterwards), e.g. sum of squares, an optimizer's moment
  update followed by its norm, the exp/mul/sub pieces of log_softmax's backward;
- epilogue: an `epilogue_anchor` op (matmul, conv2d) whose raw result is read by exactly one
  node, an elementwise one, and by no graph output or update, starts a group; elementwise ops
  over its result (bias add, activation, a ReLU mask) join it when their output has the
  contraction's shape and none of them is an ancestor of the contraction. The contraction is
  the FIRST instruction of the body, the rest is its epilogue ("a GEMM with an epilogue").
Everything else (movement, pooling, losses, norms, random ops) is left as it is. Random ops
are never fused: their kind is RANDOM, not ELEMENTWISE, and dropout is effectful (it reads
and advances a generator's counter), so fusing or duplicating it would change which numbers
are drawn. Constant sources (`full`, `arange`: SOURCE ops without inputs) are copied into the
body of every group that reads them (a constant costs nothing to recompute); the original
node stays only while a non-fused consumer, an output or an update still reads it.

Invariants:
- Every value a fused node materialises has its group's domain shape (see _split_mixed),
  so a backend renders an elementwise group as one loop nest over that shape.
- No cycles. A node joins a group only if no path leaves the group and comes back into it,
  checked on the grouped ("quotient") graph at each merge, so the grouping stays acyclic;
  the result is verified, and a node list in which every value is defined before it is read
  has no cycle (tests check the networkx view, graphc.ir.export.to_networkx, as well;
  importing networkx here would add 0.2 s to the first compile of every process).
- Every value a non-member, a graph output or an in-place update reads is an output of its
  fused node (materialised), under its original name and type, so nothing outside changes.
- Nodes come out in a topological order of the groups, each group at the place of its first
  member where the dependences allow; a fused node's source location is its first member's
  (the report lists them all).
- graph.meta["fuse"] is a `FuseReport` (a dict with a readable str): ops before, kernels
  after (nodes that are not registry views: reshape/permute/broadcast_to/slice are strided
  views that cost no kernel), nodes after, and one entry per fused group.

>>> import graphc
>>> from graphc.ir import parse
>>> g = fuse(parse('''graph @f(%x: f32[4], %b: f32[4]) -> (f32[4]) {
...   %0: f32[4] = add(%x, %b)
...   %1: f32[4] = relu(%0)
...   return (%1)
... }'''))
>>> [n.op for n in g.nodes], g.nodes[0].attrs["body"]
(['fused'], (('add', (0, 1), ()), ('relu', (2,), ())))
>>> g.meta["fuse"]["ops_before"], g.meta["fuse"]["kernels_after"]
(2, 1)
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from graphc.errors import GraphcError, ShapeError
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.verifier import verify
from graphc.ops.registry import ELEMENTWISE, REGISTRY, SOURCE
from graphc.ops.shapes import broadcast_many
from graphc.symbolic import same_shape

_SEARCH_BUDGET = 16  # groups _makes_cycle visits one by one before it turns to bit sets
# Roles a node can play; the kind of a group is "elementwise", "reduce", "epilogue" or "single".
ELEMENTWISE_ROLE, REDUCE_ROLE, ANCHOR_ROLE, CONSTANT_ROLE, OPAQUE_ROLE = (
    "elementwise", "reduce", "anchor", "constant", "opaque")


class FuseError(GraphcError, RuntimeError):
    """The fuse pass broke one of its own invariants (a bug in the pass, never in the input)."""


class FuseReport(dict):
    """What fuse did: a dict ("ops_before", "kernels_after", "nodes_after", "groups") whose
    str is a table, one line per fused group."""

    def __str__(self) -> str:
        lines = [f"fuse @{self['graph']}: {self['ops_before']} ops -> {self['kernels_after']} "
                 f"kernels ({self['nodes_after']} nodes, {self['views_after']} of them views), "
                 f"{len(self['groups'])} fused groups"]
        for group in self["groups"]:
            ops = "+".join(group["ops"])
            if len(ops) > 48:
                ops = ops[:47] + "\u2026"
            outs = ", ".join("%" + name for name in group["outputs"])
            lines.append(f"  {group['kind']:<11} {ops:<48} -> {outs}  # {group['loc']}")
        return "\n".join(lines)


@dataclass
class _Group:
    members: list[int]  # node indices: the anchor first, then ascending (a topological order)
    kind: str
    anchor: int | None = None  # the contraction of an epilogue group
    closed: bool = False  # nothing may join (a reduction ended it, or it is not fusible)


def _role(node: Node) -> str:
    opdef = REGISTRY.get(node.op)
    if opdef is None or opdef.effectful or len(node.outputs) != 1:
        return OPAQUE_ROLE
    if opdef.kind == ELEMENTWISE:
        return ELEMENTWISE_ROLE
    if opdef.ends_fused_group:
        return REDUCE_ROLE
    if opdef.epilogue_anchor:
        return ANCHOR_ROLE
    if opdef.kind == SOURCE and not node.inputs:
        return CONSTANT_ROLE
    return OPAQUE_ROLE


def _broadcast(*shapes) -> tuple:
    """The shapes' broadcast domain (PyTorch's rule; symbolic sizes stay symbolic: never
    numpy's, which would ask each symbolic size for a concrete value). Raises ShapeError."""
    return broadcast_many("fuse", *(tuple(s) for s in shapes))


def _broadcasts_into(shape: tuple, domain: tuple) -> bool:
    try:
        return same_shape(_broadcast(shape, domain), tuple(domain))
    except ShapeError:
        return False


def _broadcastable(shapes) -> bool:
    """Whether the shapes broadcast to one domain: (8, 4) and (3, 8), both fed by one scalar,
    do not, so their elementwise ops cannot share a loop nest."""
    try:
        _broadcast(*shapes)
    except ShapeError:
        return False
    return True


class _Grouping:
    """Greedy grouping over the graph in order; see the module docstring for the rules."""

    def __init__(self, graph: Graph) -> None:
        self.nodes = graph.nodes
        n = len(self.nodes)
        self.producer: dict[Value, int] = {v: i for i, node in enumerate(self.nodes)
                                           for v in node.outputs}
        self.preds: list[list[int]] = [
            sorted({self.producer[v] for v in node.inputs if v in self.producer})
            for node in self.nodes]
        self.succs: list[list[int]] = [[] for _ in range(n)]
        for i, preds in enumerate(self.preds):
            for p in preds:
                self.succs[p].append(i)
        self.escaping = set(graph.outputs) | {v for _, v in graph.updates}
        self.roles = [_role(node) for node in self.nodes]
        self.ancestors = [0] * n  # bit p set: node p is an ancestor of the node
        for i, preds in enumerate(self.preds):
            for p in preds:
                self.ancestors[i] |= self.ancestors[p] | (1 << p)
        self.group_of = list(range(n))
        self.groups = {i: self._initial_group(i) for i in range(n)}
        self.reach: list[int] | None = None  # bit sets of what each node reaches (_node_reach)
        self.group_reach: dict[int, tuple[int, int]] = {}  # see _group_reach
        self.merged: set[int] = set()  # the groups of several nodes

    def _initial_group(self, i: int) -> _Group:
        role = self.roles[i]
        if role == ELEMENTWISE_ROLE:
            return _Group([i], "elementwise")
        if role == REDUCE_ROLE:
            return _Group([i], "reduce", closed=True)
        if role == ANCHOR_ROLE and self._epilogue_ready(i):
            return _Group([i], "epilogue", anchor=i)
        return _Group([i], "single", closed=True)

    def _epilogue_ready(self, i: int) -> bool:
        """The contraction's raw result goes to one elementwise node and nowhere else."""
        consumers = self.succs[i]
        return (self.nodes[i].outputs[0] not in self.escaping and len(consumers) == 1
                and self.roles[consumers[0]] == ELEMENTWISE_ROLE)

    # ---- the driver ---------------------------------------------------------------------------
    def run(self) -> list[_Group]:
        for i, role in enumerate(self.roles):
            if role not in (ELEMENTWISE_ROLE, REDUCE_ROLE):
                continue
            wanted = ("elementwise", "epilogue") if role == ELEMENTWISE_ROLE else ("elementwise",)
            candidates = []
            for p in self.preds[i]:
                group = self.groups[self.group_of[p]]
                gid = self.group_of[p]
                if group.kind in wanted and not group.closed and gid not in candidates:
                    candidates.append(gid)
            # An epilogue first (the contraction gains its epilogue), then larger groups.
            candidates.sort(key=lambda g: (self.groups[g].kind != "epilogue",
                                           -len(self.groups[g].members), g))
            for gid in candidates:
                self._try_merge(gid, i)
        groups = [part for g in self.groups.values() for part in self._split_mixed(g)]
        return sorted(groups, key=lambda g: min(g.members))

    def _shape(self, m: int) -> tuple:
        return tuple(self.nodes[m].outputs[0].type.shape)

    def _split_mixed(self, group: _Group) -> list[_Group]:
        """Every value a group materialises has the group's domain shape.

        The domain is the reduction's input shape (reduce groups) or the broadcast of the
        members' shapes. A smaller member (a scalar step count, a per-row factor) may stay
        inside, recomputed per element or hoisted by a backend, only while no one outside
        reads it; otherwise it moves, with its in-group ancestors (all smaller too, as
        elementwise ops only broadcast up), to a group of its own that feeds the rest. That
        keeps the grouping acyclic: the part split off only feeds the rest, and any path
        around it would have left and re-entered the original group.
        """
        if group.kind == "epilogue" or len(group.members) == 1:
            return [group]
        members = set(group.members)
        if group.kind == "reduce":
            domain = tuple(self.nodes[group.members[-1]].inputs[0].type.shape)
        else:
            domain = _broadcast(*(self._shape(m) for m in members))
        seeds = [m for m in members if self.roles[m] == ELEMENTWISE_ROLE
                 and not same_shape(self._shape(m), domain)
                 and self._read_outside(m, members)]
        if not seeds:
            return [group]
        small = self._ancestors_within(seeds, members)
        if small == members:  # no member has the domain shape (independent parts, each
            # smaller, read outside: [B,1,1,S] and [L,S]): split one part off at a time (one
            # seed's ancestors are not all: its shape would then be the domain)
            small = self._ancestors_within(seeds[:1], members)
        rest = _Group(sorted(members - small), group.kind, closed=group.closed)
        return self._split_mixed(_Group(sorted(small), "elementwise")) + \
            self._split_mixed(rest)

    def _ancestors_within(self, start: list[int], members: set[int]) -> set[int]:
        """The nodes `start` and their ancestors among `members`."""
        found, stack = set(), list(start)
        while stack:
            n = stack.pop()
            if n not in found:
                found.add(n)
                stack.extend(p for p in self.preds[n] if p in members)
        return found

    def _read_outside(self, m: int, members: set[int]) -> bool:
        return (self.nodes[m].outputs[0] in self.escaping
                or any(c not in members for c in self.succs[m]))

    def _try_merge(self, gid: int, i: int) -> bool:
        """Merge group `gid` into the group of node i (the node being visited) if allowed."""
        mine, other = self.groups[self.group_of[i]], self.groups[gid]
        members = set(mine.members) | set(other.members)
        anchors = [g.anchor for g in (mine, other) if g.anchor is not None]
        if len(anchors) > 1:
            return False
        if anchors and not self._epilogue_fits(anchors[0], members):
            return False
        reduce = self.roles[i] == REDUCE_ROLE
        if reduce:
            domain = self.nodes[i].inputs[0].type.shape
            if not all(_broadcasts_into(self.nodes[m].outputs[0].type.shape, domain)
                       for m in members if m != i):
                return False
        elif not anchors and not _broadcastable(self.nodes[m].outputs[0].type.shape
                                                for m in members):
            return False  # siblings of a shared value whose shapes have no common domain
        if self._makes_cycle(members, i):
            return False
        kind = "reduce" if reduce else "epilogue" if anchors else "elementwise"
        keep, drop = sorted((self.group_of[i], gid))
        for m in members:
            self.group_of[m] = keep
        del self.groups[drop]
        self.group_reach.pop(keep, None)
        self.group_reach.pop(drop, None)
        self.merged.discard(drop)
        self.merged.add(keep)
        anchor = anchors[0] if anchors else None
        order = sorted(members, key=lambda m: (m != anchor, m))  # the anchor first
        self.groups[keep] = _Group(order, kind, anchor, closed=reduce)
        return True

    def _epilogue_fits(self, anchor: int, members: set[int]) -> bool:
        """Epilogue members are elementwise over the contraction's output, none before it."""
        shape = self.nodes[anchor].outputs[0].type.shape
        mask = sum(1 << m for m in members)
        if self.ancestors[anchor] & mask:
            return False
        return all(m == anchor or same_shape(self.nodes[m].outputs[0].type.shape, shape)
                   for m in members)

    def _makes_cycle(self, members: set[int], limit: int) -> bool:
        """Would a path leave `members` and come back, over the groups as they stand?

        Only nodes before `limit` (the node being visited, itself a member) can be on such a
        path: later nodes are not grouped yet and come after every member in graph order.
        A search over the groups answers most merges after a few groups; one that goes on
        past _SEARCH_BUDGET groups (a forward value read again far down the backward pass)
        is answered with bit sets instead (`_reaches_back`).
        """
        starts = [c for m in members for c in self.succs[m] if c not in members and c < limit]
        stack = list(starts)
        seen: set[int] = set()
        while stack:
            gid = self.group_of[stack.pop()]
            if gid in seen:
                continue
            seen.add(gid)
            if len(seen) > _SEARCH_BUDGET:
                return self._reaches_back(starts, members)
            for y in self.groups[gid].members:
                for c in self.succs[y]:
                    if c in members:
                        return True
                    if c < limit and self.group_of[c] not in seen:
                        stack.append(c)
        return False

    def _reaches_back(self, starts: list[int], members: set[int]) -> bool:
        """Does a node of `starts` reach `members` over the groups? The same answer as the
        search, from bit sets: everything the starts reach node by node, then, while that
        touches a group of several nodes, everything its members reach, and so on. (Nodes
        after the one being visited are not grouped: they only lead further away.)"""
        target = sum(1 << m for m in members)
        owners = {self.group_of[m] for m in members}
        reached = 0
        for c in starts:
            reached |= self._node_reach(c)
        pending = [g for g in self.merged if g not in owners]
        while not reached & target:
            grown, rest = 0, []
            for g in pending:
                mask, reach = self._group_reach(g)
                if mask & reached:
                    grown |= reach
                else:
                    rest.append(g)
            if not grown & ~reached:
                return False
            reached |= grown
            pending = rest
        return True

    def _node_reach(self, i: int) -> int:
        """Bit set of node i and every node it reaches in the graph (computed on first use)."""
        if self.reach is None:
            self.reach = [0] * len(self.nodes)
            for y in range(len(self.nodes) - 1, -1, -1):
                bits = 1 << y
                for c in self.succs[y]:
                    bits |= self.reach[c]
                self.reach[y] = bits
        return self.reach[i]

    def _group_reach(self, gid: int) -> tuple[int, int]:
        """(bit set of the group's members, of all they reach node by node), kept until the
        group changes."""
        found = self.group_reach.get(gid)
        if found is None:
            members = self.groups[gid].members
            reach = 0
            for m in members:
                reach |= self._node_reach(m)
            found = self.group_reach[gid] = (sum(1 << m for m in members), reach)
        return found


# ---- emitting the fused graph ---------------------------------------------------------------
def _group_order(grouping: _Grouping, groups: list[_Group]) -> list[_Group]:
    """A topological order of the groups, each as early as its first member allows."""
    index = {id(g): k for k, g in enumerate(groups)}
    of_node = {m: index[id(g)] for g in groups for m in g.members}
    succs: list[set[int]] = [set() for _ in groups]
    indegree = [0] * len(groups)
    for k, g in enumerate(groups):
        for m in g.members:
            for p in grouping.preds[m]:
                if _copies_constant(grouping, g, m, p):
                    continue  # the group carries its own copy of that constant
                q = of_node[p]
                if q != k and k not in succs[q]:
                    succs[q].add(k)
                    indegree[k] += 1
    ready = [(min(g.members), k) for k, g in enumerate(groups) if indegree[k] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(groups[k])
        for s in succs[k]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, (min(groups[s].members), s))
    if len(order) != len(groups):
        raise FuseError("internal: the grouping has a cycle (the merge check should prevent it)")
    return order


def _copies_constant(grouping: _Grouping, group: _Group, m: int, p: int) -> bool:
    """Does member m of `group` read constant node p through a copy in the fused body?"""
    return (grouping.roles[p] == CONSTANT_ROLE and m != group.anchor
            and (len(group.members) > 1 or group.kind == "elementwise"))


def _needed_outside(grouping: _Grouping, members: list[int]) -> list[Value]:
    inside = set(members)
    out = []
    for m in members:
        v = grouping.nodes[m].outputs[0]
        if v in grouping.escaping or any(c not in inside for c in grouping.succs[m]):
            out.append(v)
    return out or [grouping.nodes[members[-1]].outputs[0]]  # a dead group keeps its last value


def _fused_node(grouping: _Grouping, group: _Group) -> tuple[Node, dict[str, Any]] | None:
    """The fused node of a group, or None when the group is one node that stays as it is."""
    nodes = grouping.nodes
    constants = {v for m in group.members for v in nodes[m].inputs if v in grouping.producer
                 and _copies_constant(grouping, group, m, grouping.producer[v])}
    if len(group.members) == 1 and (group.kind != "elementwise" or not constants):
        return None
    inputs: list[Value] = []
    instructions: list[Node] = []
    defined: set[Value] = set()
    for m in group.members:  # the anchor first, then in graph order
        node = nodes[m]
        for v in node.inputs:
            if v in defined:
                continue
            if v in constants and m != group.anchor:
                instructions.append(nodes[grouping.producer[v]])
            else:
                inputs.append(v)
            defined.add(v)
        instructions.append(node)
        defined.add(node.outputs[0])
    ref = {v: k for k, v in enumerate(inputs)}
    for k, node in enumerate(instructions):
        ref[node.outputs[0]] = len(inputs) + k
    body = tuple((node.op, tuple(ref[v] for v in node.inputs), tuple(node.attrs.items()))
                 for node in instructions)
    outputs = _needed_outside(grouping, group.members)
    first = nodes[group.members[0]]
    fused = Node("fused", inputs, {"body": body, "outputs": tuple(ref[v] for v in outputs)},
                 outputs, first.loc)
    locs = list(dict.fromkeys(nodes[m].loc for m in group.members if nodes[m].loc))
    entry = {"kind": group.kind, "ops": tuple(node.op for node in instructions),
             "members": len(group.members), "inputs": tuple(v.name for v in inputs),
             "outputs": tuple(v.name for v in outputs), "loc": first.loc, "locs": tuple(locs)}
    return fused, entry


def _drop_unread_constants(nodes: list[Node], graph: Graph, roles: dict[int, str]) -> list[Node]:
    """Constant nodes whose every reader now carries its own copy are dropped."""
    read = {v for node in nodes for v in node.inputs} | set(graph.outputs)
    read |= {v for _, v in graph.updates}
    return [node for node in nodes
            if roles.get(id(node)) != CONSTANT_ROLE or any(v in read for v in node.outputs)]


def kernel_count(graph: Graph) -> int:
    """Nodes that run a kernel: all but registry views (strided views of their input)."""
    return sum(1 for node in graph.nodes
               if not (node.op in REGISTRY and REGISTRY[node.op].view))


def fuse(graph: Graph) -> Graph:
    """Group elementwise work into `fused` nodes (see the module docstring for the rules).

    Needs: a verified graph (run_pipeline verifies before the first pass).
    Guarantees: a new verified graph that computes the same outputs and updates (the
    interpreter gives the same values, each fused instruction running the same kernel),
    acyclic (verified def-before-use order), every value read outside its group materialised,
    nodes in a topological order; graph.meta["fuse"] is the FuseReport. The input graph is
    left unchanged. Running fuse again changes nothing (fused nodes are not fused again).
    """
    grouping = _Grouping(graph)
    groups = _group_order(grouping, grouping.run())
    roles = {id(node): role for node, role in zip(graph.nodes, grouping.roles)}
    nodes: list[Node] = []
    entries: list[dict[str, Any]] = []
    for group in groups:
        made = _fused_node(grouping, group)
        if made is None:
            nodes.extend(grouping.nodes[m] for m in group.members)
        else:
            nodes.append(made[0])
            entries.append(made[1])
    nodes = _drop_unread_constants(nodes, graph, roles)
    out = Graph(graph.name, list(graph.inputs), nodes, list(graph.outputs), list(graph.updates))
    verify(out)  # every read after its definition: no cycle
    views = len(nodes) - kernel_count(out)
    out.meta["fuse"] = FuseReport(graph=graph.name, ops_before=len(graph.nodes),
                                  kernels_after=len(nodes) - views, nodes_after=len(nodes),
                                  views_after=views, groups=entries)
    return out


__all__ = ["FuseError", "FuseReport", "fuse", "kernel_count"]
