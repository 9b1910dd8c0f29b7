"""In-place changes with autograd: PyTorch's rebase of history, version counters, CopySlices.

`apply_inplace(target, op_name, compute, operands, op)` changes `target` to `compute(old)`,
where `old` stands for its current value: `compute` builds the new value with ordinary
(out-of-place) ops, so the autograd history is the ordinary one; the result is written into
the target's memory, the target's version counter is bumped (shared with its views, so a
node that saved any of them sees the change when it unpacks), and the target's history moves
onto the node that computed the new value. A view's change goes through its base
(`_write_through_view`, PyTorch's CopySlices). Leaves that require grad, shape changes and
casts PyTorch refuses are refused with PyTorch's messages.

`old` is a snapshot: a copy of the current value that keeps the target's history, because
the node of `compute` may save it for its backward while the target's memory is overwritten.
Where the caller names the one registry op `compute` applies (`op`, as `x.add_(y)` does), eager
mode takes a shorter path that copies only when that op saves its first input
(`OpDef.saved_inputs`): `add_`, `sub_` and the unary ops whose VJP reads their output take
no snapshot at all. graphc.dispatch installs `apply_inplace` as the registry's in-place
dispatcher (graphc.ops.registry.inplace).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from graphc import dispatch
from graphc.autograd import grad_mode
from graphc.autograd.graph import Node, OpBackward
from graphc.errors import AutogradError, DTypeError, ShapeError, TraceError, where
from graphc.ops import registry
from graphc.tensor import AbstractArray, Tensor
from graphc.types import TensorType

_grad_mode = grad_mode.state  # this thread's grad mode


_TORCH_TYPE_NAMES = {"float32": "Float", "float64": "Double", "int64": "Long", "bool": "Bool"}


def _castable(src, dst) -> bool:
    """PyTorch's rule for writing a result into an existing tensor (no float -> int etc.)."""
    if src.is_floating and not dst.is_floating:
        return False
    return not (dst.name == "bool" and src.name != "bool")


class OverwriteBackward(Node):
    """History of a tensor overwritten by a value that does not depend on its old value.

    `zero_`, `fill_` and `copy_` from a constant on a tensor with history keep it in the graph
    as PyTorch does (`ZeroBackward0`, `FillBackward0`): gradients flowing back through it are
    zero for the old value, so `backward` still works and reaches no leaf with a non-zero
    contribution.
    """

    def __init__(self, op_name: str, old_edge: tuple, old_type: TensorType) -> None:
        super().__init__((old_edge,), ((old_type.shape, old_type.dtype),))
        self._name = "".join(p.capitalize() for p in op_name.rstrip("_").split("_"))
        self.old_type = old_type

    def name(self) -> str:
        return f"{self._name}Backward0"

    def backward(self, grads: tuple) -> tuple:
        return (call_full(self.old_type),)


def call_full(ty: TensorType):
    return registry.call("full", shape=tuple(ty.shape), value=0, dtype=ty.dtype.name)


def apply_inplace(target, op_name: str, compute: Callable, operands: tuple | None = None,
                  op: str | None = None):
    """Change `target` in place to `compute(old)`, where `old` stands for its current value.

    `compute` builds the new value from `old` with ordinary (out-of-place) graphc calls, so
    the autograd history is the ordinary one; this function then writes the result into the
    target's memory, bumps its version counter and moves the target's history onto the result
    (PyTorch's "rebase"). A result of a wider dtype is cast back with history; one that cannot
    be cast (float into int) is refused with PyTorch's message, as is a shape change.

    `operands`, when the caller knows them: every other value `compute` reads. If neither they
    nor the target (nor its base) require grad, nothing can be recorded, so `old` is the target
    itself rather than a snapshot copy (as with grad mode off).

    `op`, when the caller knows it: the one registry op that `compute` applies to
    `(old, *operands)` (`compute` may then be None). An elementwise one on a tensor that is no
    view, in eager mode, takes `_apply_op_in_place` (the same semantics, fewer steps, a
    snapshot only where needed).
    """
    if op is not None and target._base is None and dispatch.current_tracer() is None \
            and not dispatch.is_abstract():
        opdef = registry.get(op)
        if opdef.kind == "elementwise":
            done = _apply_op_in_place(target, op_name, opdef, operands)
            if done is not None:
                return done
    if compute is None:
        compute = _applying(op, operands)
    grad_mode = _grad_mode.enabled
    base = target._base
    tracer = dispatch.current_tracer()
    abstract_eval = dispatch.is_abstract()
    needs_grad = target._requires_grad or (base is not None and base._requires_grad)
    if grad_mode and target._requires_grad and target.grad_fn is None:  # a leaf
        raise AutogradError(
            f"{where(op_name)}: a leaf Variable that requires grad is being used in an in-place "
            "operation. Wrap the update in `with graphc.no_grad():`, or work on a clone()."
        )
    if grad_mode and base is not None and base._requires_grad and base.grad_fn is None:
        raise AutogradError(
            f"{where(op_name)}: a view of a leaf Variable that requires grad is being used in an "
            "in-place operation. Wrap the update in `with graphc.no_grad():`, or work on a "
            "clone()."
        )
    if grad_mode and (needs_grad or tracer is not None or abstract_eval
                      or not _reads_no_grad(operands)):
        old = target._detached_copy_with_history(abstract_eval)
        if tracer is not None:
            tracer.alias(old, target)  # the snapshot holds the target's current IR value
        result = compute(old)
    else:  # grad mode is off (the caller's no_grad is in force), or nothing can record
        result = compute(target)
    _check_result(op_name, target, result)
    records = grad_mode and (result._requires_grad or needs_grad)
    chain = _view_chain(target) if records and base is not None else None
    if records and base is not None and chain is None:
        raise AutogradError(
            f"{where(op_name)}: in-place change of a tensor that shares memory with another "
            "one (e.g. a detached view) while autograd is recording; clone() it first, or use "
            "the out-of-place op"
        )
    abstract = abstract_eval or type(target._array) is AbstractArray
    if abstract and tracer is None and not target.is_abstract:
        raise TraceError(
            f"{where(op_name)}: an in-place change of a concrete tensor under abstract "
            "evaluation (graphc.dispatch.abstract_eval) would change no data; work on a clone(), "
            "or leave abstract evaluation first")
    destination = None if abstract else target._data
    if not abstract and not destination.flags.writeable:
        _refuse_overlapping(op_name)
    if records and result._dtype is not target._dtype:
        result = registry.call("cast", result, dtype=target.dtype.name)
    if (tracer is not None or abstract) and base is not None:
        raise TraceError(
            f"{where(op_name)}: in-place change of a view (a slice, reshape or transpose of "
            "another tensor) inside a traced function is not supported yet; clone() the view "
            "first, or build the new value with out-of-place ops (graphc.where, slicing, cat)"
        )
    if chain is not None:
        _write_through_view(target, base, chain, result)
        return target
    if not abstract:  # abstract: no data to write, the tracer's rebinding below is the write
        if tracer is not None:
            tracer.before_write(target)
        destination[...] = result._data  # np.copyto(..., casting="unsafe"), in half the time
    target._version_counter.bump()
    if tracer is not None:
        tracer.rebind(target, result)
    if records:
        _rebase_history(target, result, op_name)
    return target


def _apply_op_in_place(target, op_name: str, opdef, operands: tuple):
    """`apply_inplace` of `compute(old) = opdef(old, *operands)` (an elementwise op) on a tensor
    that is no view, in eager mode: the same checks in the same order, the same history, the
    same write. `old` is a snapshot only where the op's node saves its first input
    (`OpDef.saved_inputs`); otherwise the op reads the target itself, whose history is then
    still the old one: its node takes the same edge and never reads the value again (an
    output it saves is the op's fresh result). None where the general path must run: it
    raises the error of a leaf that requires grad."""
    grad_on = _grad_mode.enabled
    requires = target._requires_grad
    if grad_on and requires and target.grad_fn is None:
        return None
    destination = target._data
    if type(destination) is not np.ndarray:
        return None
    if grad_on and 0 in opdef.saved_inputs and (requires or not _reads_no_grad(operands)):
        old = target._detached_copy_with_history(False)
    else:  # nothing can record, or the node will not read its first input: no snapshot
        old = target
    result = dispatch.apply(opdef, old, *operands)
    _check_result(op_name, target, result)
    if not destination.flags.writeable:
        _refuse_overlapping(op_name)
    records = grad_on and (result._requires_grad or requires)
    if records and result._dtype is not target._dtype:
        result = registry.call("cast", result, dtype=target.dtype.name)
    destination[...] = result._array  # np.copyto(..., casting="unsafe"), in half the time
    target._version_counter.bump()
    if records:
        _rebase_history(target, result, op_name)
    return target


def _applying(op: str, operands: tuple) -> Callable:
    """compute(old) = op(old, *operands)."""
    def compute(old):
        return registry.call(op, old, *operands)
    return compute


def _check_result(op_name: str, target, result) -> None:
    """PyTorch's refusals of an in-place result: another shape, a dtype it will not cast."""
    if result._array.shape != target._array.shape:
        raise ShapeError(
            f"{where(op_name)}: output with shape {list(target.shape)} doesn't match the "
            f"broadcast shape {list(result.shape)}"
        )
    if result._dtype is not target._dtype and not _castable(result._dtype, target._dtype):
        raise DTypeError(
            f"{where(op_name)}: result type {_TORCH_TYPE_NAMES[result.dtype.name]} can't be cast "
            f"to the desired output type {_TORCH_TYPE_NAMES[target.dtype.name]}"
        )


def _refuse_overlapping(op_name: str):
    raise ShapeError(
        f"{where(op_name)}: unsupported operation: more than one element of the written-to "
        "tensor refers to a single memory location. Please clone() the tensor before "
        "performing the operation."
    )


def _reads_no_grad(operands: tuple | None) -> bool:
    """Whether `operands` are known and none is a tensor that requires grad: tensors, numbers,
    strings and None are known; anything else (a list of tensors, say) may hide one."""
    if operands is None:
        return False
    for o in operands:
        if isinstance(o, Tensor):
            if o._requires_grad:
                return False
        elif not isinstance(o, _KNOWN_OPERANDS):
            return False
    return True


_KNOWN_OPERANDS = (bool, int, float, str, type(None), np.number, np.bool_)


def _view_chain(target):
    """[(view tensor, op name, attrs), ...] from the base down to `target`, or None if unknown."""
    chain = []
    t = target
    while t._view_of is not None:
        parent, name, attrs = t._view_of
        chain.append((t, name, attrs))
        t = parent
    if t is not target._base:
        return None
    return chain[::-1]


def _write_through_view(target, base, chain, new_view) -> None:
    """In-place change of a view with autograd (PyTorch's CopySlices, written with ops).

    The base's new value is `where(mask, F^T(new_view), base)`, where F is the chain of view ops
    from base to target, F^T its adjoint (scatter) computed by differentiating F, and mask
    marks the base elements the view covers. The base takes that history; the view (and the
    views between them) take the history of replaying F on the new base.
    """
    from graphc.autograd import grad

    def replay(t):
        for _, name, attrs in chain:
            t = registry.call(name, t, **attrs)
        return t

    probe = Tensor._wrap(np.zeros(base.shape, dtype=base.dtype.np), requires_grad=True)
    probed = replay(probe)
    ones = Tensor._wrap(np.ones(probed.shape, dtype=base.dtype.np))
    (mask,) = grad(probed, probe, ones, retain_graph=True)
    (scattered,) = grad(probed, probe, new_view, create_graph=new_view.requires_grad)
    old_base = base._detached_copy_with_history(dispatch.is_abstract())
    new_base = registry.call("where", Tensor._wrap(mask._data != 0), scattered, old_base)
    np.copyto(base._data, new_base._data, casting="unsafe")
    base._version_counter.bump()
    if not new_base.requires_grad:
        return
    base._set_history(new_base.grad_fn, new_base._output_nr)
    t = base
    for view, name, attrs in chain:
        t = registry.call(name, t, **attrs)
        if view._retains_grad:
            view.grad_fn.retains_grad.pop(view._output_nr, None)
        retained, view._retains_grad = view._retains_grad, False
        view._set_history(t.grad_fn, t._output_nr)
        if retained:
            view.retain_grad()


def _rebase_history(target, result, op_name: str) -> None:
    """Move target's autograd history onto the node that computed its new value."""
    retained = target._retains_grad
    old_node, old_nr = target.grad_fn, target._output_nr
    if result._requires_grad:
        node, nr = result.grad_fn, result._output_nr
        if node is None:  # a leaf result (e.g. `copy_` of a leaf that requires grad)
            node = registry.call("cast", result, dtype=result.dtype.name).grad_fn
            nr = 0
        if isinstance(node, OpBackward):  # the node saved `result`: it now lives in target
            for saved in node.saved_outputs.values():
                if saved.tensor is result:
                    saved.tensor = target
                    saved.version = target._version_counter.value
    else:
        node = OverwriteBackward(op_name, (old_node, old_nr), target.type)
        nr = 0
    target._set_history(node, nr)
    if retained and old_node is not None:
        old_node.retains_grad.pop(old_nr, None)
        target._retains_grad = False
        target.retain_grad()
