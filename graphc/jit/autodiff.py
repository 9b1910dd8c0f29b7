"""The engine behind `graphc.passes.autodiff.derive_backward`: eager autograd, traced abstractly.

`derive_backward` (a pass: `Graph -> Graph`, documented there) cannot itself build the backward
without the front end, since VJP rules compute with tensors; this module, which sits above the
front end, installs `differentiate` into it (`set_differentiator`, as graphc.dispatch installs
the dispatch point into the op registry), so passes never import the front end.

`differentiate` replays the forward nodes through the dispatch point under a `_Recorder` (a
`Tracer`) in abstract evaluation (`graphc.dispatch.abstract_eval`): every input is an abstract
tensor of its graph type (shape and dtype, no data), the `wrt` inputs are leaves that require
grad, and no kernel runs, so the cost follows the graph's size, not its tensors'. It then
calls `graphc.autograd.grad` on the outputs with one seed per differentiable output. Every VJP
runs through the dispatch point and is recorded as IR, so the backward comes from the
registry's VJP rules by the same engine as eager autograd. Each forward node's grad_fn gets a
pre-hook that stamps what its VJP records with the node's location plus " (backward)".

Custom Function regions are applied as eager `apply` runs them: the region's nodes with grad
mode off, then its outputs are connected to a `<Function>Backward` node
(`graphc.autograd.function.connect`) whose ctx holds the replayed values of what the forward
saved, the ctx attributes it set, and `needs_input_grad` from the replay; autograd then calls
the Function's own `backward` under the recorder.
"""

from __future__ import annotations

import functools

from graphc.autograd import grad as autograd_grad
from graphc.autograd.function import FunctionBackward, FunctionCtx, connect
from graphc.autograd.grad_mode import is_grad_enabled, no_grad
from graphc.dispatch import abstract_eval, apply, current_tracer, set_tracer
from graphc.errors import TraceError
from graphc.ir.graph import Graph, Value
from graphc.ir.printer import MISSING, FunctionRegion, Opaque
from graphc.jit.bindings import ArgBinding
from graphc.jit.tracer import Tracer
from graphc.ops.registry import REGISTRY, call
from graphc.passes.autodiff import AutodiffError, describe_region, set_differentiator
from graphc.tensor import Tensor


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


def differentiate(graph: Graph, wrt_values: list[Value], seeds: str) -> Graph:
    """The joint graph of `derive_backward` (checked arguments; see the module docstring)."""
    if current_tracer() is not None:
        raise AutodiffError("derive_backward cannot run inside graphc.trace")
    rec = _Recorder(graph.name)
    env: dict[Value, Tensor] = {}
    for i, v in enumerate(graph.inputs):
        t = Tensor._abstract(v.type, requires_grad=v in wrt_values)
        env[v] = t
        rec.add_input(t, v.name, ArgBinding((0, i)))
    previous = set_tracer(rec)
    try:
        with abstract_eval():
            _replay_forward(graph, rec, env)
            seed_names, seed_outputs, grads = _backward(graph, rec, env, wrt_values, seeds)
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
    return result


def _backward(graph: Graph, rec: _Recorder, env: dict[Value, Tensor], wrt_values: list[Value],
              seeds: str) -> tuple[list[str], list[int], tuple]:
    """Seed the differentiable outputs and run autograd under the recorder: (seed input
    names, the output each seed belongs to, one gradient per `wrt` input)."""
    roots, seed_tensors, seed_names, seed_outputs = [], [], [], []
    for index, out in enumerate(graph.outputs):
        t = env[out]
        if not (t.dtype.is_floating and t.requires_grad):
            continue
        roots.append(t)
        seed_outputs.append(index)
        rec.loc = f"seed of %{out.name}"
        if seeds == "inputs":
            seed = Tensor._abstract(out.type)
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
            f"derive_backward of @{graph.name}: {describe_region(rec.function)}: its backward "
            f"reads tensor values ({err}). A derived backward is a graph that runs again "
            "for other values, so the backward must be written with graphc ops only "
            "(graphc.where for data-dependent choices); otherwise keep this Function in "
            "eager code") from err
    grads = list(grads)
    for k, (w, g) in enumerate(zip(wrt_values, grads)):
        if g is None:  # no output depends on w
            rec.loc = f"zero gradient: no output depends on %{w.name}"
            grads[k] = call("full", shape=w.type.shape, value=0.0, dtype=w.type.dtype.name)
    return seed_names, seed_outputs, tuple(grads)


def _replay_forward(graph: Graph, rec: _Recorder, env: dict[Value, Tensor]) -> None:
    """Run each forward node through the dispatch point (recorded, with autograd history);
    custom Function regions as eager `apply` runs them (see the module docstring)."""
    regions_at: dict[int, list[FunctionRegion]] = {}
    inside: set[int] = set()
    for region in graph.meta.get("functions", ()):
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


def _apply_region(region: FunctionRegion, rec: _Recorder, env: dict[Value, Tensor]) -> None:
    """Connect a replayed Function application to its own backward (module docstring), and
    record the region in the result at its new position."""
    try:
        cls = region.function_class()
    except LookupError as err:
        raise AutodiffError(f"derive_backward: {describe_region(region)}: {err}") from None

    def live(item):
        if isinstance(item, Value):
            return env[item]
        if isinstance(item, tuple):
            return tuple(live(x) for x in item)
        if isinstance(item, Opaque):
            if item.value is MISSING:
                raise AutodiffError(
                    f"derive_backward: {describe_region(region)}: it holds a {item.type_name} "
                    "object that IR text cannot keep (opaque); derive the backward on the "
                    "traced graph in memory, or pass that value as an IR literal")
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


set_differentiator(differentiate)

__all__ = ["differentiate"]
