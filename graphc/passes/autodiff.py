"""Reverse-mode autodiff on the IR (`derive_backward`) and rematerialisation (`rematerialize`).

`derive_backward(graph, wrt=None, seeds="inputs")` joins a forward graph and its backward into
one graph. It needs a graph that verifies and holds registry ops only (run it before `fuse`).
`wrt` names the inputs to differentiate (names, Values or positions; default: every floating
input, so buffers such as BatchNorm's running stats get zero gradients).
It replays the forward nodes through the dispatch point under a `graphc.tracing.Tracer`, on
placeholder tensors of the input types (zeros for int and bool inputs, so index kernels stay in
range; values in [0.1, 1) for floats), with the `wrt` inputs made leaves that require grad, and
calls `graphc.autograd.grad` on the outputs with one seed per differentiable output. Every VJP
then runs through the dispatch point and is recorded as IR, so the result is built from the
registry's VJP rules by the same engine as eager autograd: gradients only for values on a path
from a `wrt` input to an output, accumulation (`add`) where a value fans out, the same casts
and broadcast reductions (`check_grads`). The result:
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

import functools

import numpy as np

from graphc.autograd import grad as autograd_grad
from graphc.autograd.function import FunctionBackward, FunctionCtx, connect
from graphc.autograd.grad_mode import is_grad_enabled, no_grad
from graphc.dispatch import apply, current_tracer, set_tracer
from graphc.errors import GraphcError, TraceError
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.printer import MISSING, FunctionRegion, Opaque
from graphc.ir.verifier import verify
from graphc.jit.bindings import ArgBinding
from graphc.jit.tracer import Tracer
from graphc.ops.registry import ELEMENTWISE, REGISTRY, call
from graphc.tensor import Tensor
from graphc.types import TensorType


class AutodiffError(GraphcError, ValueError):
    """The graph cannot be differentiated as asked (bad `wrt`, an op without a VJP, ...)."""


class _Recorder(Tracer):
    """A Tracer that stamps every node it records with `self.loc` instead of the Python frame
    (the replay runs inside this module, so the frame would name the caller, not the model)."""

    def __init__(self, name: str) -> None:
        super().__init__(name, {})
        self.loc: str | None = None
        self._stamped = 0
        self.function: FunctionRegion | None = None  # whose backward runs now, if custom

    def _stamp(self) -> None:
        for node in self.graph.nodes[self._stamped:]:
            node.loc = self.loc
        self._stamped = len(self.graph.nodes)

    def record(self, opdef, inputs, attrs, outputs) -> None:
        super().record(opdef, inputs, attrs, outputs)
        self._stamp()

    def value_of(self, t: Tensor) -> Value:
        v = super().value_of(t)
        self._stamp()  # a constant turned into a `full` node
        return v

    def function_location(self) -> str | None:
        return self.loc  # a Function applied inside a backward: the line being derived


def _set_loc(recorder: _Recorder, loc: str | None, grads: tuple,
             function: FunctionRegion | None = None) -> None:
    """Pre-hook of a forward node's grad_fn: what its VJP records is its backward."""
    recorder.loc = loc
    recorder.function = function


def _placeholder(ty: TensorType, rng: np.random.Generator) -> np.ndarray:
    if ty.dtype.is_floating:
        return rng.uniform(0.1, 1.0, ty.shape).astype(ty.dtype.np)
    return np.zeros(ty.shape, ty.dtype.np)


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
    if current_tracer() is not None:
        raise AutodiffError("derive_backward cannot run inside graphc.trace")
    verify(graph)
    wrt_values = _resolve_wrt(graph, wrt)
    rec = _Recorder(graph.name)
    rng = np.random.default_rng(0)
    env: dict[Value, Tensor] = {}
    for i, v in enumerate(graph.inputs):
        t = Tensor._wrap(_placeholder(v.type, rng), requires_grad=v in wrt_values)
        env[v] = t
        rec.add_input(t, v.name, ArgBinding((0, i)))
    previous = set_tracer(rec)
    try:
        _replay_forward(graph, rec, env)
        roots, seed_tensors, seed_names, seed_outputs = [], [], [], []
        for index, out in enumerate(graph.outputs):
            t = env[out]
            if not (t.dtype.is_floating and t.requires_grad):
                continue
            roots.append(t)
            seed_outputs.append(index)
            rec.loc = f"seed of %{out.name}"
            if seeds == "inputs":
                seed = Tensor._wrap(np.ones(out.type.shape, out.type.dtype.np))
                seed_names.append(rec.add_input(seed, f"grad_{out.name}", ArgBinding(())).name)
            else:
                seed = call("full", shape=out.type.shape, value=1.0, dtype=out.type.dtype.name)
            seed_tensors.append(seed)
        rec.loc = "(backward)"
        # create_graph: VJPs run with grad mode on, exactly as in an eager double backward
        try:
            grads = autograd_grad(roots, [env[w] for w in wrt_values],
                                  grad_outputs=seed_tensors, create_graph=True,
                                  allow_unused=True) if roots else (None,) * len(wrt_values)
        except TraceError as err:
            if rec.function is None:
                raise
            raise AutodiffError(
                f"derive_backward of @{graph.name}: {_describe(rec.function)}: its backward "
                f"reads tensor values ({err}). A derived backward is a graph that runs again "
                "for other values, so the backward must be written with graphc ops only "
                "(graphc.where for data-dependent choices); otherwise keep this Function in "
                "eager code") from err
        for k, (w, g) in enumerate(zip(wrt_values, grads)):
            if g is None:  # no output depends on w
                rec.loc = f"zero gradient: no output depends on %{w.name}"
                grads = grads[:k] + (call("full", shape=w.type.shape, value=0.0,
                                          dtype=w.type.dtype.name),) + grads[k + 1:]
        result = rec.graph
        result.outputs = [rec.value_of(env[v]) for v in graph.outputs] + \
            [rec.value_of(g) for g in grads]
    finally:
        set_tracer(previous)
    n_inputs = len(graph.inputs) + len(seed_names)
    if len(result.inputs) != n_inputs:
        extra = [v.name for v in result.inputs if v.name not in seed_names][len(graph.inputs):]
        raise AutodiffError(f"derive_backward of @{graph.name}: a VJP read tensors that are not "
                            f"values of the graph (made from raw data): {extra}")
    by_input = dict(zip(graph.inputs, result.inputs))
    result.updates = [(by_input[target], rec.value_of(env[value]))
                      for target, value in graph.updates]
    result.meta["autodiff"] = {"wrt": [w.name for w in wrt_values], "seeds": seed_names,
                               "seed_outputs": seed_outputs,
                               "forward_outputs": len(graph.outputs)}
    return verify(result)


def _replay_forward(graph: Graph, rec: _Recorder, env: dict[Value, Tensor]) -> None:
    """Run each forward node through the dispatch point (recorded, with autograd history);
    custom Function regions as eager `apply` runs them (see the module docstring)."""
    regions_at: dict[int, list[FunctionRegion]] = {}
    inside: set[int] = set()
    for region in graph.meta.get("functions", ()):
        _check_region(graph, region)
        regions_at.setdefault(region.end, []).append(region)
        inside.update(range(region.end - region.nodes, region.end))
    for i, node in enumerate(graph.nodes):
        for region in regions_at.get(i, ()):
            _apply_region(region, rec, env)
        opdef = REGISTRY.get(node.op)
        where = f"{node.op} at {node.loc or 'unknown location'}"
        if opdef is None or opdef.kind == "fused":
            raise AutodiffError(f"derive_backward: {where}: {node.op!r} is not a registry op "
                                "with a VJP; differentiate before fuse")
        args = [env[v] for v in node.inputs]
        rec.loc = node.loc
        if i in inside:  # a Function's forward: no history, as under apply's no_grad
            with no_grad():
                result = apply(opdef, *args, **node.attrs)
        else:
            result = apply(opdef, *args, **node.attrs)
        results = (result,) if len(node.outputs) == 1 else tuple(result)
        floats = any(v.type.dtype.is_floating for v in node.outputs)
        if opdef.vjp is None and floats and any(t.requires_grad for t in args) \
                and i not in inside:
            raise AutodiffError(f"derive_backward: {where}: {node.op} has no VJP, but its "
                                "input depends on a differentiated input")
        for v, t in zip(node.outputs, results):
            env[v] = t
        fn = results[0].grad_fn
        if fn is not None and getattr(fn, "opdef", None) is opdef:
            loc = f"{node.loc} (backward)" if node.loc else f"backward of %{node.outputs[0].name}"
            fn.register_prehook(functools.partial(_set_loc, rec, loc))
    for region in regions_at.get(len(graph.nodes), ()):
        _apply_region(region, rec, env)


# ---- custom autograd.Functions ----------------------------------------------------------------
def _describe(region: FunctionRegion) -> str:
    at = f" applied at {region.loc}" if region.loc else ""
    return f"custom autograd.Function {region.name}{at}"


def _check_region(graph: Graph, region: FunctionRegion) -> None:
    """Refuse a region derive_backward cannot honour (see the module docstring)."""
    what = f"derive_backward of @{graph.name}: {_describe(region)}"
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


def _apply_region(region: FunctionRegion, rec: _Recorder, env: dict[Value, Tensor]) -> None:
    """Connect a replayed Function application to its own backward (module docstring), and
    record the region in the result at its new position."""
    try:
        cls = region.function_class()
    except LookupError as err:
        raise AutodiffError(f"derive_backward: {_describe(region)}: {err}") from None

    def live(item):
        if isinstance(item, Value):
            return env[item]
        if isinstance(item, tuple):
            return tuple(live(x) for x in item)
        if isinstance(item, Opaque):
            if item.value is MISSING:
                raise AutodiffError(
                    f"derive_backward: {_describe(region)}: it holds a {item.type_name} object "
                    "that IR text cannot keep (opaque); derive the backward on the traced "
                    "graph in memory, or pass that value as an IR literal")
            return item.value
        return item

    args, outs = live(region.args), live(region.outputs)
    ctx = FunctionCtx()
    ctx._node_name = f"{cls.__name__}Backward"
    ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
    ctx.materialize_grads = region.materialize_grads
    ctx._saved = live(region.saved)
    ctx._non_differentiable = {id(outs[k]) for k in region.non_differentiable}
    for name, item in region.ctx.items():
        setattr(ctx, name, live(item))
    placed = FunctionRegion(
        region.class_path, _mapped(region.args, rec, env), _mapped(region.outputs, rec, env),
        len(rec.graph.nodes), region.nodes, saved=_mapped(region.saved, rec, env),
        ctx={k: _mapped(v, rec, env) for k, v in region.ctx.items()},
        non_differentiable=region.non_differentiable, materialize_grads=region.materialize_grads,
        loc=region.loc, cls=cls)
    rec.graph.meta.setdefault("functions", []).append(placed)
    if not (is_grad_enabled() and any(ctx.needs_input_grad)):
        return
    wrapped = connect(cls, ctx, args, outs)
    for out, t in zip(region.outputs, wrapped):
        if isinstance(out, Value):
            env[out] = t
    node = next(t.grad_fn for t in wrapped if isinstance(t, Tensor)
                and isinstance(t.grad_fn, FunctionBackward))
    loc = f"{region.loc} (backward of {region.name})" if region.loc else \
        f"backward of {region.name}"
    node.register_prehook(functools.partial(_set_loc, rec, loc, function=region))


def _mapped(item, rec: _Recorder, env: dict[Value, Tensor]):
    """A region item with the forward graph's values replaced by the result's."""
    if isinstance(item, Value):
        return rec.value_of(env[item])
    if isinstance(item, tuple):
        return tuple(_mapped(x, rec, env) for x in item)
    return item


# ---- memory: liveness and rematerialisation --------------------------------------------------
_CHEAP_OTHER = ("reshape", "broadcast_to", "permute", "full")  # data movement or a fill
MAX_CHAIN = 4  # nodes recomputed for one value, at most


def _nbytes(v: Value) -> int:
    return int(np.prod(v.type.shape, dtype=np.int64)) * np.dtype(v.type.dtype.np).itemsize


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


__all__ = ["AutodiffError", "derive_backward", "live_profile", "peak_bytes", "rematerialize"]
