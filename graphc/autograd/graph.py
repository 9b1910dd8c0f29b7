"""The autograd graph: nodes (`grad_fn`), edges, saved tensors and hooks.

A `Node` turns the gradients of its outputs into gradients of its inputs. Its
`next_functions` are the edges to the nodes that produced those inputs: `(node, output_nr)`
pairs, with an `AccumulateGrad` node for a leaf that requires grad and `None` for an input
that does not. `OpBackward` runs a registry op's VJP; `graphc.autograd.function` adds the
node of a user Function. Saved tensors remember the version counter of the tensor they saved,
so a later in-place change is caught when the backward unpacks them (PyTorch's check).
"""

from __future__ import annotations

import itertools
import sys
from collections import OrderedDict
from collections.abc import Callable
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from graphc.errors import AutogradError, ShapeError
from graphc.refcounts import COUNTS_ARE_EXACT

if TYPE_CHECKING:
    from graphc.tensor import Tensor

_FREED = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward."
)


class RemovableHandle:
    """Returned by every register_*hook; `remove()` takes the hook out again."""

    _next_id = 0

    def __init__(self, hooks: dict) -> None:
        self._hooks = hooks
        self.id = RemovableHandle._next_id
        RemovableHandle._next_id += 1

    def remove(self) -> None:
        self._hooks.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def add_hook(hooks: OrderedDict, fn: Callable) -> RemovableHandle:
    handle = RemovableHandle(hooks)
    hooks[handle.id] = fn
    return handle


def gradient_edge(t: Tensor) -> tuple[Node | None, int]:
    """Where a gradient for `t` goes: its grad_fn slot, its leaf accumulator, or nowhere."""
    if t.grad_fn is not None:
        return (t.grad_fn, t._output_nr)
    if t.requires_grad:
        return (t._grad_accumulator(), 0)
    return (None, 0)


class SavedTensor:
    """A tensor saved for backward plus the version it had when saved.

    It also remembers which node produced the saved value (`owner`, `output_nr`; None for a
    leaf), so the in-place error names that node as PyTorch does even after an in-place op has
    moved the tensor's history on. A saved output is owned by the node that saves it: pass
    `owner` explicitly, as its grad_fn is not set yet when the node is built.
    """

    __slots__ = ("freed", "output_nr", "owner", "tensor", "version")

    def __init__(self, tensor: Tensor, owner: Node | None = None, output_nr: int | None = None):
        self.tensor = tensor
        self.version = tensor._version_counter.value
        self.owner = tensor.grad_fn if owner is None else owner
        self.output_nr = tensor._output_nr if output_nr is None else output_nr
        self.freed = False

    def unpack(self, needed_by: str) -> Tensor:
        if self.freed:
            raise AutogradError(_FREED)
        t = self.tensor
        now = t._version_counter.value
        if now != self.version:
            produced = ""
            if self.owner is not None:
                produced = f", which is output {self.output_nr} of {self.owner.name()},"
            raise AutogradError(
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: [{t.type_name()} {list(t.shape)}]{produced} is at version "
                f"{now}; expected version {self.version} instead. Hint: {needed_by} saved this "
                "tensor for its backward; clone() it before changing it in place, or use the "
                "out-of-place op."
            )
        return t

    def free(self) -> None:
        self.tensor = None
        self.owner = None
        self.freed = True


_sequence = itertools.count()


class _MadeOnFirstUse:
    """A per-instance attribute made by `factory()` when first read, then stored on the
    instance (a non-data descriptor, so the stored value shadows it from then on)."""

    def __init__(self, factory: Callable) -> None:
        self.factory = factory

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = self.factory()
        instance.__dict__[self.name] = value
        return value


class Node:
    """A backward function. Subclasses implement `backward(grads) -> grads per input`.

    `sequence_nr` grows with creation order; among nodes ready to run, the engine runs the
    most recently created first (PyTorch's order, which hooks observe).
    """

    def __init__(self, next_functions: tuple, input_meta: tuple) -> None:
        # input_meta: (shape, dtype) per input, or None for non-tensor inputs.
        self.sequence_nr = next(_sequence)
        self.next_functions = next_functions
        self.input_meta = input_meta

    # The hook tables are made on first use: most nodes never get a hook, and eager mode
    # makes one node per op.
    tensor_pre_hooks = _MadeOnFirstUse(dict)  # output_nr -> that output's hooks
    retains_grad = _MadeOnFirstUse(dict)  # output_nr -> callback keeping the grad
    pre_hooks = _MadeOnFirstUse(OrderedDict)
    post_hooks = _MadeOnFirstUse(OrderedDict)

    def name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        return f"<{self.name()} object at {id(self):#x}>"

    def register_hook(self, fn: Callable) -> RemovableHandle:
        """fn(grad_inputs, grad_outputs) -> None or replacement grad_inputs, after backward."""
        return add_hook(self.post_hooks, fn)

    def register_prehook(self, fn: Callable) -> RemovableHandle:
        """fn(grad_outputs) -> None or replacement grad_outputs, before backward."""
        return add_hook(self.pre_hooks, fn)

    def add_tensor_hook(self, output_nr: int, fn: Callable) -> RemovableHandle:
        return add_hook(self.tensor_pre_hooks.setdefault(output_nr, OrderedDict()), fn)

    def backward(self, grads: tuple) -> tuple:
        raise AutogradError(f"{self.name()} defines no backward")

    def release(self) -> None:
        """Free saved tensors (after a backward without retain_graph)."""

    def __call__(self, grads: tuple) -> tuple:
        return self.backward(grads)

    def check_grads(self, grads_in: tuple) -> tuple:
        """Check the count and shapes of computed input gradients; sum broadcast ones down."""
        if len(grads_in) != len(self.next_functions):
            raise AutogradError(
                f"function {self.name()} returned an incorrect number of gradients "
                f"(expected {len(self.next_functions)}, got {len(grads_in)})"
            )
        out = []
        for i, (g, meta) in enumerate(zip(grads_in, self.input_meta)):
            if g is None or meta is None:
                out.append(None)
                continue
            shape, dtype = meta
            if tuple(g.shape) != tuple(shape):
                g = _sum_to_or_fail(self, i, g, shape)
            if g.dtype is not dtype and dtype.is_floating:
                g = g.to(dtype)
            out.append(g)
        return tuple(out)


def _sum_to_or_fail(node: Node, index: int, grad: Tensor, shape: tuple) -> Tensor:
    from graphc.ops.grad_utils import can_sum_to, sum_to

    if not can_sum_to(tuple(grad.shape), tuple(shape)):
        raise ShapeError(
            f"Function {node.name()} returned an invalid gradient at index {index} - got "
            f"{list(grad.shape)} but expected shape compatible with {list(shape)}"
        )
    return sum_to(grad, tuple(shape))


class AccumulateGrad(Node):
    """The node of a leaf that requires grad: adds incoming gradients into `leaf.grad`."""

    def __init__(self, variable: Tensor) -> None:
        super().__init__((), ())
        self.sequence_nr = 1 << 62  # as PyTorch: accumulate as soon as a leaf's grad is ready
        self.variable = variable
        self.post_accumulate_hooks: OrderedDict = OrderedDict()

    def name(self) -> str:
        return "AccumulateGrad"

    def accumulate(self, grad: Tensor, create_graph: bool, handed_over: bool = False) -> None:
        """Add `grad` into the leaf's `.grad`, as PyTorch's AccumulateGrad.

        The first gradient is stored as a fresh tensor (never aliased with another leaf's
        gradient or with the engine's buffers); later ones are added in place, unless either
        side has history (create_graph), where a new tensor with history replaces `.grad`.
        `handed_over`: the caller (the engine) holds `grad` in one place only, its buffer
        list; then a gradient nothing else can reach becomes `.grad` itself, uncopied, as
        PyTorch steals an unshared gradient (`_adoptable`).
        """
        from graphc.autograd.grad_mode import no_grad
        from graphc.ops.registry import call

        var = self.variable
        if handed_over and var._grad is None and _adoptable(grad, var):
            var._grad = grad
            for hook in list(self.post_accumulate_hooks.values()):
                hook(var)
            return
        if grad.requires_grad:
            grad = call("cast", grad, dtype=var.dtype.name)  # a copy that keeps the history
        else:
            with no_grad():  # ops, not raw numpy, so that a trace records the accumulation
                same = grad.dtype is var.dtype
                grad = call("copy", grad) if same else call("cast", grad, dtype=var.dtype.name)
        old = var._grad
        if old is None:
            var._grad = grad
        elif old.requires_grad or grad.requires_grad:
            var._grad = old + grad
        else:
            with no_grad():
                old.add_(grad)
        for hook in list(self.post_accumulate_hooks.values()):
            hook(var)


def _adoptable(grad: Tensor, var: Tensor) -> bool:
    """Whether `grad`, handed over by the engine, may become `var.grad` without a copy: in
    eager mode, of var's dtype, without history, and reachable from nowhere else. Counted
    references (each count includes getrefcount's own): the tensor is held by the engine's
    buffer, `accumulate`'s argument and this function's (4); its array by the tensor and a
    local (3), and, where it views a whole buffer (a transposed matmul result, as the weight
    gradient of a Linear), that buffer and the tensor it is a view of are held only by this
    view (a view of the memory would hold them too). Anything else is copied, as before; an
    adopted view is cut from its source, so `.grad` is a tensor of its own. Where reference
    counts cannot tell (graphc.refcounts), nothing is adopted."""
    from graphc.dispatch import current_tracer, is_abstract

    if (not COUNTS_ARE_EXACT or grad._requires_grad or grad._dtype is not var._dtype
            or sys.getrefcount(grad) != 4
            or current_tracer() is not None or is_abstract()):
        return False
    array = grad._array
    if (type(array) is not np.ndarray or not array.flags.c_contiguous
            or sys.getrefcount(array) != 3):  # (a copy would be C-contiguous)
        return False
    if array.base is None:
        return grad._base is None
    source, memory = grad._base, array.base
    if (source is None or grad._view_of is None or grad._view_of[0] is not source
            or source._base is not None or source._requires_grad
            or source._array is not memory or type(memory) is not np.ndarray
            or memory.base is not None or memory.size != array.size):
        return False
    # source: grad._base, grad._view_of, the local, the argument; memory: array.base,
    # source._array, the local, the argument
    if sys.getrefcount(source) != 4 or sys.getrefcount(memory) != 4:
        return False
    grad._base = grad._view_of = None
    return True


# Registry ops whose PyTorch backward node has another name than "<Op>Backward0".
_TORCH_NODE_NAMES = {
    "cast": "ToCopyBackward0",
    "reduce_sum": "SumBackward1",
    "reduce_mean": "MeanBackward1",
    "clamp": "ClampBackward1",
    "broadcast_to": "ExpandBackward0",
    "reshape": "ViewBackward0",
}


_NOTHING_SAVED = MappingProxyType({})  # the saved tensors of a node that saves none (read-only)


class OpBackward(Node):
    """Backward of one registry op: runs the op's VJP over its saved tensors."""

    def __init__(self, opdef, inputs, outputs, attrs, next_functions, types=None,
                 input_meta=None) -> None:
        """`types`, when the caller knows them: (input TensorTypes, output TensorTypes);
        `input_meta` likewise: (shape, dtype) per input. (Eager mode makes one node per op
        that records, so this sets the attributes itself instead of calling Node.__init__.)"""
        self.sequence_nr = next(_sequence)
        self.next_functions = next_functions
        if input_meta is None:
            input_meta = tuple([(t._data.shape, t._dtype) for t in inputs])
        self.input_meta = input_meta
        self.opdef = opdef
        self.attrs = attrs
        if types is None:
            types = (tuple(t.type for t in inputs), tuple(t.type for t in outputs))
        self.input_types, self.output_types = types
        # (loops, not comprehensions: a comprehension is one more call per node)
        self.saved_inputs = saved = {} if opdef.saved_inputs else _NOTHING_SAVED
        for i in opdef.saved_inputs:
            saved[i] = SavedTensor(inputs[i])
        self.saved_outputs = saved = {} if opdef.saved_outputs else _NOTHING_SAVED
        for i in opdef.saved_outputs:
            saved[i] = SavedTensor(outputs[i], self, i)

    @property
    def needs_input_grad(self) -> tuple[bool, ...]:
        """Whether each input gets a gradient (it has an edge)."""
        return tuple([fn is not None for fn, _ in self.next_functions])

    def name(self) -> str:
        """PyTorch's node name (`MulBackward0`) where it differs from the op name, else ours."""
        if self.opdef.name in _TORCH_NODE_NAMES:
            return _TORCH_NODE_NAMES[self.opdef.name]
        return "".join(p.capitalize() for p in self.opdef.name.split("_")) + "Backward0"

    def backward(self, grads: tuple) -> tuple:
        ctx = VJPContext(self)
        result = self.opdef.vjp(ctx, *grads)
        if not isinstance(result, tuple):
            result = (result,)
        return result

    def release(self) -> None:
        for saved in (*self.saved_inputs.values(), *self.saved_outputs.values()):
            saved.free()


class VJPContext:
    """What a VJP rule sees: saved tensors, types, attributes and which inputs need grads."""

    def __init__(self, node: OpBackward) -> None:
        name = node.name()
        n_in, n_out = len(node.input_types), len(node.output_types)
        self.inputs = [None] * n_in
        self.outputs = [None] * n_out
        for i, saved in node.saved_inputs.items():
            self.inputs[i] = saved.unpack(name)
        for i, saved in node.saved_outputs.items():
            self.outputs[i] = saved.unpack(name)
        self.input_types = node.input_types
        self.output_types = node.output_types
        self.attrs = node.attrs
        self.needs_input_grad = node.needs_input_grad
