"""Gradients through compiled callables: one joint graph, split into forward and backward.

When a compiled callable is called with grad mode on and its outputs depend on tensors that
require grad (a model's parameters, an input), `graphc.compile` does what torch.compile does:
- `derive_backward` joins the traced forward graph and its backward into one joint graph,
  differentiating with respect to every graph input bound to a tensor that requires grad;
- `partition` splits the joint graph: the forward part computes the outputs (and the
  updates, e.g. BatchNorm's running stats) plus the *saved* values the backward reads; the
  backward part takes the saved values and one gradient seed per differentiable output and
  returns the gradients. A node that only the backward needs (a transpose of a weight, a
  mask) stays in the backward, so the forward saves as little as it can;
- both parts go through the pass pipeline and the backend;
- at a call, `CompiledFunction` (an autograd.Function) runs the forward executable and
  returns outputs that carry a grad_fn; `loss.backward()` in eager code then runs the
  backward executable on the saved values, and eager autograd accumulates the gradients into
  the tensors' `.grad` as usual.
`outputs_needing_grad` decides, after a trace, which outputs need a grad_fn (and refuses a
call that also ran backward() inside while returning an output that requires grad).
Saved graph inputs are the bound tensors themselves, version-checked by autograd like any
saved tensor (changing a parameter in place between forward and backward is an error, as in
PyTorch), except inputs the forward updates in place, which are saved as copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphc.autograd.function import Function
from graphc.autograd.grad_mode import is_grad_enabled
from graphc.errors import AutogradError, GraphcError
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.verifier import verify
from graphc.jit.bindings import TraceResult
from graphc.jit.pytree import flatten
from graphc.tensor import Tensor


@dataclass
class Partition:
    """The two graphs of a joint graph and how they connect."""

    forward: Graph  # inputs: the joint's forward inputs; outputs: forward outputs + saved
    backward: Graph  # inputs: saved values (in `saved` order), then the seeds
    saved: list[Value]  # joint values handed from forward to backward, in backward-input order
    saved_inputs: list[int]  # for each saved value, its forward-input index, or -1 (an output)
    seed_outputs: list[int]  # the forward output each seed belongs to
    n_outputs: int  # forward outputs of the user's function


def _needed(nodes: list[Node], roots: set[Value]) -> list[Node]:
    """The nodes that `roots` depend on, in their original order."""
    producer = {v: n for n in nodes for v in n.outputs}
    keep: set[int] = set()
    stack = [producer[v] for v in roots if v in producer]
    while stack:
        node = stack.pop()
        if id(node) in keep:
            continue
        keep.add(id(node))
        stack.extend(producer[v] for v in node.inputs if v in producer)
    return [n for n in nodes if id(n) in keep]


def partition(joint: Graph) -> Partition:
    """Split a `derive_backward` result into forward and backward graphs (module docstring)."""
    meta = joint.meta["autodiff"]
    n_out = meta["forward_outputs"]
    n_seeds = len(meta["seeds"])
    n_in = len(joint.inputs) - n_seeds
    fwd_inputs, seeds = joint.inputs[:n_in], joint.inputs[n_in:]
    fwd_roots = set(joint.outputs[:n_out]) | {value for _, value in joint.updates}
    fwd_nodes = _needed(joint.nodes, fwd_roots)
    in_forward = {id(n) for n in fwd_nodes}
    bwd_nodes = [n for n in _needed(joint.nodes, set(joint.outputs[n_out:]))
                 if id(n) not in in_forward]
    fwd_values = set(fwd_inputs) | {v for n in fwd_nodes for v in n.outputs}
    saved: list[Value] = []
    for value in [v for n in bwd_nodes for v in n.inputs] + joint.outputs[n_out:]:
        if value in fwd_values and value not in saved:
            saved.append(value)
    position = {v: i for i, v in enumerate(fwd_inputs)}
    forward = Graph(f"{joint.name}_forward", list(fwd_inputs), fwd_nodes,
                    joint.outputs[:n_out] + [v for v in saved if v not in position],
                    list(joint.updates))
    backward = Graph(f"{joint.name}_backward", saved + list(seeds), bwd_nodes,
                     joint.outputs[n_out:])
    return Partition(verify(forward), verify(backward), saved,
                     [position.get(v, -1) for v in saved], list(meta["seed_outputs"]), n_out)


@dataclass
class GradientPlan:
    """What a compiled entry needs to return outputs with a grad_fn."""

    partition: Partition
    forward: object  # Executable of partition.forward
    backward: object  # Executable of partition.backward
    wrt: list[int]  # forward-input indices of the tensors gradients flow to


class CompiledFunction(Function):
    """The autograd node of one call of a compiled forward graph.

    apply(plan, run_forward, arrays, bound, updated, *wrt_tensors): `run_forward(arrays)`
    runs the forward executable (and writes the updates back); its outputs are the user's
    outputs followed by the saved values the backward needs. `bound[i]` is the tensor bound to
    forward input i (None for rng and constant inputs); `updated` the inputs the forward
    writes. Saved inputs are saved as tensors (version-checked), updated ones as copies; a
    saved intermediate that is a view of a bound tensor (a transposed weight) saves that
    tensor too, so changing it in place before backward is the same error as in eager mode.
    """

    @staticmethod
    def forward(ctx, plan: GradientPlan, run_forward, arrays, bound, updated, *wrt_tensors):
        part = plan.partition
        as_tensor = {i for i in part.saved_inputs
                     if i >= 0 and bound[i] is not None and i not in updated}
        copies = {i: np.array(arrays[i], copy=True) for i in part.saved_inputs
                  if i >= 0 and i not in as_tensor}
        results = run_forward(arrays)
        outputs, extra = results[:part.n_outputs], iter(results[part.n_outputs:])
        ctx.plan = plan
        ctx.saved_arrays = [None if i in as_tensor else copies[i] if i >= 0 else
                            np.asarray(next(extra)) for i in part.saved_inputs]
        watched = [t for t in bound if t is not None and any(
            a is not None and np.shares_memory(a, t._data) for a in ctx.saved_arrays)]
        ctx.n_watched = len(watched)
        ctx.save_for_backward(*(bound[i] if i in as_tensor else None
                                for i in part.saved_inputs), *watched)
        ctx.output_types = [np.asarray(o).dtype for o in outputs]
        return tuple(Tensor._wrap(np.array(o, copy=True)) for o in outputs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        if is_grad_enabled():
            raise AutogradError(
                "backward(create_graph=True) through a compiled callable: its backward graph "
                "runs as compiled code and has no autograd history of its own. Take higher "
                "derivatives in eager mode, or derive them on the IR with "
                "graphc.passes.autodiff.derive_backward."
            )
        part = ctx.plan.partition
        tensors = ctx.saved_tensors  # unpacking checks every saved tensor's version
        saved = [t._data if t is not None else a for t, a in zip(tensors, ctx.saved_arrays)]
        seeds = []
        for index in part.seed_outputs:
            g = grad_outputs[index]
            seeds.append(np.asarray(g._data, dtype=ctx.output_types[index], order="C"))
        grads = ctx.plan.backward.run(*saved, *seeds)
        return (None,) * 5 + tuple(Tensor._wrap(np.array(g, copy=True)) for g in grads)


_NO_GRADS = ("a compiled call cannot mix the two: return loss.detach() from a training step, "
             "or call backward() outside the compiled function.")


def _history_consumed(t: Tensor) -> bool:
    """Whether a backward() inside the traced call already ran through `t`'s history (freed
    saved tensors in it): calling backward on it again would fail in eager code too, so the
    compiled call may return it as a plain value (the loss of a training step)."""
    from graphc.autograd.graph import SavedTensor

    stack, seen = [t.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        saved = list(getattr(node, "saved_inputs", {}).values())
        saved += list(getattr(node, "saved_outputs", {}).values())
        ctx = getattr(node, "ctx", None)
        saved += [x for x in getattr(ctx, "_saved", ()) if isinstance(x, SavedTensor)]
        if any(x.freed for x in saved):
            return True
        stack.extend(child for child, _ in node.next_functions)
    return False


def outputs_needing_grad(name: str, traced: TraceResult, args: tuple,
                          kwargs: dict) -> list[str]:
    """After the trace: the outputs that need a grad_fn (they require grad, are not input
    tensors returned as themselves, and no backward inside the call consumed their history).
    They get one through a derived backward graph, unless the function also ran a backward
    inside (a training step returning an undetached loss), which is refused; so is a `.grad`
    with history (backward(create_graph=True) inside the call)."""
    if not is_grad_enabled():
        return []
    flat = list(flatten(traced.result))
    outputs: dict[int, int] = {}
    for _path, t in flat:
        outputs.setdefault(id(t), len(outputs))
    needing = []
    for path, t in flat:
        if not t.requires_grad or outputs[id(t)] in traced.output_aliases:
            continue
        if t.grad_fn is not None and _history_consumed(t):
            continue
        where = "".join(f"[{p!r}]" for p in path) or ""
        if traced.grad_outputs:
            raise GraphcError(
                f"graphc.compile({name}): output{where} requires grad, and the function also "
                f"ran backward() inside; {_NO_GRADS} (A training step that ran "
                "backward(retain_graph=True) inside can return loss.detach().)"
            )
        needing.append(f"output{where}")
    for go in traced.grad_outputs:
        g = go.resolve(args, kwargs)._grad
        if g is not None and g.requires_grad:
            raise GraphcError(
                f"graphc.compile({name}): backward(create_graph=True) inside the compiled "
                f"function left a .grad with history, and {_NO_GRADS}"
            )
    return needing
