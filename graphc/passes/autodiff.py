"""Reverse-mode autodiff on the IR (`derive_backward`) and rematerialisation (`rematerialize`).

`derive_backward(graph, wrt=None, seeds="inputs")` joins a forward graph and its backward into
one graph. It needs a graph that verifies and holds registry ops only (run it before `fuse`).
`wrt` names the inputs to differentiate (names, Values or positions; default: every floating
input, so buffers such as BatchNorm's running stats get zero gradients).
The backward is built by the front end's own autograd, traced abstractly: the engine in
graphc.jit.autodiff (installed here with `set_differentiator`, so passes never import the
front end) replays the forward nodes through the dispatch point in abstract evaluation
(abstract tensors of the input types: shapes and dtypes, no data, no kernel runs), with the
`wrt` inputs made leaves that require grad, and calls `graphc.autograd.grad` on the outputs
with one seed per differentiable output. Every VJP runs through the dispatch point and is
recorded as IR, so the result is built from the registry's VJP rules by the same engine as
eager autograd: gradients only for values on a path from a `wrt` input to an output,
accumulation (`add`) where a value fans out, the same casts and broadcast reductions
(`check_grads`). Its cost follows the number of nodes, not the tensors' sizes.
The result:
- inputs: the forward inputs (same names and order), then one seed `grad_<out>` per
  differentiable output (a floating output that depends on a `wrt` input), in output order;
  with `seeds="ones"` no seed inputs: each seed is a `full` of ones (d sum(outputs));
- outputs: the forward outputs, then one gradient per `wrt` input (a `full` of zeros for an
  input no output depends on); updates (`%w <- %v`) are kept;
- source locations: a forward node keeps its own; a node of the backward carries the forward
  node's location plus " (backward)" (`model.py:14 (backward)`), so errors and bisection name
  the user line whose gradient it computes;
- `graph.meta["autodiff"]`: the `wrt` names, the seed names, the forward output each seed
  belongs to (`seed_outputs`, indices) and the forward output count;
  `graph.meta["functions"]`: the custom Function regions (below), at their new positions,
  then those of Functions applied inside a custom backward.
The result is an ordinary graph: `derive_backward` of it gives second derivatives (grad of
grad, e.g. a gradient penalty), because every VJP is written with differentiable registry ops.

Custom `autograd.Function`s: a traced graph holds the ops a Function's `forward` ran plus a
`FunctionRegion` per application in `graph.meta["functions"]` (printed as a `function` line;
see graphc.ir.printer). The replay runs the region's nodes with grad mode off, as eager
`apply` runs `forward`, then connects its outputs to a `<Function>Backward` node
(`graphc.autograd.function.connect`) whose ctx holds the replayed values of what the forward
saved and the ctx attributes it set, and `needs_input_grad` from the replay (the `wrt`
inputs the arguments depend on). Autograd then calls the Function's own `backward` under the
recorder, so straight-through estimators, gradient clipping or reversal come out as written,
as graph ops (located `<apply line> (backward of <Function>)`); the result differentiates
again through the backward's ops, and its forward part keeps the regions (re-positioned), so
`derive_backward` of it honours them too. Refused with an AutodiffError naming the Function
and its line: a backward that reads tensor values (`.item()`, `bool(t)`, numpy: a graph is
replayed for other values), a Function that returns an input or a pre-existing tensor
unchanged (the IR cannot tell that alias from the input), one that marks outputs dirty (an
in-place forward), and, for a graph parsed from text, a Function class that cannot be
imported or a ctx attribute that IR text could not hold (`opaque(...)`).
A forward op without a VJP on the path (a float output of a non-differentiable op) is refused
with the node and its line, never silently given a zero gradient, except inside a custom
Function's forward, whose `backward` stands in for it (a straight-through `floor_divide`).

`rematerialize(graph)` recomputes cheap values next to their late uses when that lowers the
peak of live intermediate bytes (see its docstring); `peak_bytes` is the measure.
"""

from __future__ import annotations

from typing import Callable

from graphc.errors import GraphcError
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.printer import FunctionRegion
from graphc.ir.verifier import verify
from graphc.ops.registry import ELEMENTWISE, REGISTRY
from graphc.symbolic import current_env


class AutodiffError(GraphcError, ValueError):
    """The graph cannot be differentiated as asked (bad `wrt`, an op without a VJP, ...)."""


# graph, wrt Values, seeds -> the joint graph; installed by graphc.jit.autodiff
_differentiator: Callable[[Graph, list, str], Graph] | None = None


def set_differentiator(differentiate: Callable[[Graph, list, str], Graph]) -> None:
    """Install the engine that builds the joint graph (graphc.jit.autodiff.differentiate)."""
    global _differentiator
    _differentiator = differentiate


def _resolve_wrt(graph: Graph, wrt) -> list[Value]:
    """`wrt` as graph input Values: None (all floating inputs), or names / Values / indices."""
    if wrt is None:
        return [v for v in graph.inputs if v.type.dtype.is_floating]
    by_name = {v.name: v for v in graph.inputs}
    out = []
    for w in ([wrt] if isinstance(wrt, (str, int, Value)) else list(wrt)):
        if isinstance(w, int):
            v = graph.inputs[w] if -len(graph.inputs) <= w < len(graph.inputs) else None
        elif isinstance(w, str):
            v = by_name.get(w.lstrip("%"))
        else:
            v = w if any(w is x for x in graph.inputs) else None
        if v is None:
            raise AutodiffError(f"derive_backward of @{graph.name}: wrt {w!r} is not an input "
                                f"of the graph; inputs are {[x.name for x in graph.inputs]}")
        if not v.type.dtype.is_floating:
            raise AutodiffError(f"derive_backward of @{graph.name}: wrt %{v.name} is {v.type}; "
                                "only floating inputs have gradients")
        if v not in out:
            out.append(v)
    return out


def derive_backward(graph: Graph, wrt=None, seeds: str = "inputs") -> Graph:
    """Join `graph` and its backward into one graph (see the module docstring).

    Needs: a graph that verifies, registry ops only. Guarantees: a graph that verifies, whose
    outputs are the forward outputs followed by d(seeds . outputs)/d(wrt) in `wrt` order.

    >>> from graphc.ir import parse, run
    >>> import numpy as np
    >>> g = derive_backward(parse('''
    ... graph @f(%x: f64[2]) -> (f64[2]) {
    ...   %0: f64[2] = mul(%x, %x)      # model.py:3
    ...   return (%0)
    ... }'''))
    >>> [v.name for v in g.inputs], len(g.outputs)
    (['x', 'grad_0'], 2)
    >>> run(g, np.array([1.0, 3.0]), np.ones(2))[1]
    array([2., 6.])
    """
    if seeds not in ("inputs", "ones"):
        raise AutodiffError(f"derive_backward: seeds must be 'inputs' or 'ones', got {seeds!r}")
    if _differentiator is None:
        raise GraphcError("derive_backward: graphc.jit is not loaded: import graphc first")
    verify(graph)
    wrt_values = _resolve_wrt(graph, wrt)
    for region in graph.meta.get("functions", ()):
        _check_region(graph, region)
    return verify(_differentiator(graph, wrt_values, seeds))


# ---- custom autograd.Functions ----------------------------------------------------------------
def describe_region(region: FunctionRegion) -> str:
    """How an error names a custom Function application."""
    at = f" applied at {region.loc}" if region.loc else ""
    return f"custom autograd.Function {region.name}{at}"


def _check_region(graph: Graph, region: FunctionRegion) -> None:
    """Refuse a region derive_backward cannot honour (see the module docstring)."""
    what = f"derive_backward of @{graph.name}: {describe_region(region)}"
    if not 0 <= region.nodes <= region.end <= len(graph.nodes):
        raise AutodiffError(f"{what}: its region (the {region.nodes} nodes before node "
                            f"{region.end}) does not fit the graph's {len(graph.nodes)} nodes; "
                            "graph.meta['functions'] is stale (a pass changed the nodes)")
    defined = {v: -1 for v in graph.inputs}
    for i, node in enumerate(graph.nodes[:region.end]):
        defined.update((v, i) for v in node.outputs)
    missing = [v.name for v in region.values() if v not in defined]
    if missing:
        raise AutodiffError(f"{what}: it refers to %{missing[0]}, which is not defined before "
                            "its function line")
    start = region.end - region.nodes
    for k, out in enumerate(region.outputs):
        if isinstance(out, Value) and defined[out] < start and k not in \
                region.non_differentiable and out.type.dtype.is_floating:
            raise AutodiffError(
                f"{what}: output {k} is %{out.name}, which its forward did not compute (an "
                "argument or a tensor from before the call, returned unchanged), so the IR "
                "cannot tell it from that tensor; return x.clone() (or x.view_as(x)) instead")
    if region.dirty:
        raise AutodiffError(f"{what}: its forward changes outputs {list(region.dirty)} in "
                            "place (ctx.mark_dirty), which derive_backward does not support; "
                            "return new tensors instead")


# ---- memory: liveness and rematerialisation --------------------------------------------------
_CHEAP_OTHER = ("reshape", "broadcast_to", "permute", "full")  # data movement or a fill
MAX_CHAIN = 4  # nodes recomputed for one value, at most


def _nbytes(v: Value) -> int:
    """Bytes of `v` for the memory heuristics; a symbolic size counts at its trace's hint
    (asking it for an int would specialise it: graphc.symbolic)."""
    n = v.type.nbytes
    return n if type(n) is int else n.evaluate(_hints(n))


def _hints(n) -> dict:
    env = current_env()
    return {name: env.hints.get(name, 64) if env else 64 for name in n.free_symbols}


def live_profile(graph: Graph) -> list[int]:
    """Bytes of intermediates (node outputs) alive at each node: defined at or before it and
    read at or after it; graph outputs and update values stay alive to the end. Graph inputs
    are the caller's memory and are not counted."""
    n = len(graph.nodes)
    keep = set(graph.outputs) | {value for _, value in graph.updates}
    start, end = {}, {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            end[v] = i
        for v in node.outputs:
            start[v], end[v] = i, i
    delta = [0] * (n + 1)
    for v, s in start.items():
        e = n - 1 if v in keep else end[v]
        delta[s] += _nbytes(v)
        delta[e + 1] -= _nbytes(v)
    profile, live = [], 0
    for i in range(n):
        live += delta[i]
        profile.append(live)
    return profile


def peak_bytes(graph: Graph) -> int:
    """The most intermediate bytes alive at once over the node order (see `live_profile`)."""
    return max(live_profile(graph), default=0)


def _cheap(node: Node) -> bool:
    opdef = REGISTRY.get(node.op)
    return (opdef is not None and len(node.outputs) == 1 and not opdef.effectful
            and (opdef.kind == ELEMENTWISE or node.op in _CHEAP_OTHER))


def _score(graph: Graph) -> tuple[int, int]:
    profile = live_profile(graph)
    peak = max(profile, default=0)
    return peak, profile.count(peak)


def _try_remat(graph: Graph, v: Value, tag: int) -> Graph | None:
    """A copy of `graph` where the uses of `v` after its longest idle gap read a recomputed
    copy made right before the first of them; None when the recomputation needs a value that
    is not alive there anyway (or a chain longer than MAX_CHAIN)."""
    producers = {out: i for i, node in enumerate(graph.nodes) for out in node.outputs}
    last: dict[Value, int] = {}
    uses: list[int] = []
    for i, node in enumerate(graph.nodes):
        for x in node.inputs:
            last[x] = i
            if x is v and (not uses or uses[-1] != i):
                uses.append(i)
    events = [producers[v]] + uses
    gaps = [(events[k + 1] - events[k], k) for k in range(len(events) - 1)]
    if not gaps:
        return None
    size, k = max(gaps)
    at = events[k + 1]  # insert the recomputation right before this node
    if size < 2:
        return None
    inputs = set(graph.inputs)
    chain: list[Node] = []
    clones: dict[Value, Value] = {}

    def clone(x: Value) -> Value | None:
        if x in inputs or (x is not v and last.get(x, -1) >= at):
            return x  # alive at `at` anyway
        if x in clones:
            return clones[x]
        node = graph.nodes[producers[x]]
        if not _cheap(node) or len(chain) >= MAX_CHAIN:
            return None
        args = [clone(a) for a in node.inputs]
        if any(a is None for a in args):
            return None
        out = Value(f"{x.name}_r{tag}", x.type)
        loc = f"{node.loc} (recomputed)" if node.loc else "(recomputed)"
        chain.append(Node(node.op, args, dict(node.attrs), [out], loc))
        clones[x] = out
        return out

    new_v = clone(v)
    if new_v is None:
        return None
    nodes = []
    for i, node in enumerate(graph.nodes):
        if i == at:
            nodes += chain
        if i >= at and v in node.inputs:
            node = Node(node.op, [new_v if x is v else x for x in node.inputs],
                        node.attrs, node.outputs, node.loc)
        nodes.append(node)
    if k == 0:  # no use before the gap: the original computation moves, it is not repeated
        nodes.remove(graph.nodes[producers[v]])
    meta = {k: v for k, v in graph.meta.items() if k != "functions"}  # node positions moved
    return Graph(graph.name, graph.inputs, nodes, graph.outputs, graph.updates, meta)


def rematerialize(graph: Graph) -> Graph:
    """Recompute cheap values next to their late uses where that lowers the peak live bytes.

    Needs: a graph that verifies (typically the result of `derive_backward`). Candidates are
    values made by cheap single-output nodes (elementwise, reshape, broadcast_to; never random
    or effectful ops) that are not graph outputs. For a candidate, its uses after its longest
    idle gap read a copy recomputed right before the first of them, from values that are alive
    there anyway (graph inputs, or values read at or after that point), through a chain of at
    most MAX_CHAIN cheap nodes. A change is kept when it lowers the peak of `live_profile`
    (or keeps the peak and reaches it at fewer nodes); candidates are tried largest first,
    until no change helps. If the peak did not drop in the end, the graph is returned as it
    came. Recomputed nodes repeat the same op on the same values, so every result is bit for
    bit the same. Guarantees: a graph that verifies, and
    `graph.meta["remat"] = {"peak_before", "peak_after", "recomputed"}` (bytes, node count).
    """
    verify(graph)
    before = _score(graph)
    best, score, recomputed, tag = graph, before, 0, 0
    improved = True
    while improved:
        improved = False
        users = {x for node in best.nodes for x in node.inputs}
        keep = set(best.outputs) | {value for _, value in best.updates}
        candidates = [out for node in best.nodes if _cheap(node) for out in node.outputs
                      if out in users and out not in keep]
        for v in sorted(candidates, key=_nbytes, reverse=True):
            tag += 1
            trial = _try_remat(best, v, tag)
            if trial is None:
                continue
            trial_score = _score(trial)
            if trial_score < score:
                added = len(trial.nodes) - len(best.nodes)
                best, score, recomputed, improved = trial, trial_score, recomputed + added, True
    result = best if score[0] < before[0] else graph
    result.meta["remat"] = {"peak_before": before[0], "peak_after": _score(result)[0],
                            "recomputed": recomputed if result is best else 0}
    return verify(result)


__all__ = ["AutodiffError", "derive_backward", "describe_region", "live_profile", "peak_bytes",
           "rematerialize", "set_differentiator"]
