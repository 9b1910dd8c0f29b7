"""Module hook plumbing: removable handles and the full backward hook (PyTorch's way).

A full backward hook `hook(module, grad_input, grad_output)` must run once the gradients with
respect to the module's inputs are known, and may replace them. As in PyTorch
(`torch.utils.hooks.BackwardHook`), `Module.__call__` routes the module's tensor inputs through
one identity `BackwardHookFunction` application before `forward`, and its tensor outputs through
another after the forward hooks:

- the output identity node gets a pre-hook: it sees the gradients of the outputs first and keeps
  them (backward pre-hooks may replace them here);
- the input identity node gets a post-hook: it runs last, sees the gradients of the inputs,
  calls the user hooks with `(module, grad_input, grad_output)` and lets them replace
  `grad_input` before it flows on to whatever produced the inputs.

If no input requires grad, the user hooks run from the output node with `grad_input` all None.
The identity Function is made of no ops, so it needs no trace support beyond Function's own.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict

from graphc.autograd.function import Function
from graphc.autograd.grad_mode import is_grad_enabled
from graphc.autograd.graph import RemovableHandle
from graphc.tensor import Tensor


class ModuleHookHandle(RemovableHandle):
    """A RemovableHandle that also removes its id from companion dicts (e.g. with_kwargs)."""

    def __init__(self, hooks: OrderedDict, *extra: dict) -> None:
        super().__init__(hooks)
        self._extra = extra

    def remove(self) -> None:
        super().remove()
        for d in self._extra:
            if isinstance(d, set):
                d.discard(self.id)
            else:
                d.pop(self.id, None)


def add_module_hook(hooks: OrderedDict, fn, prepend: bool = False, *extra) -> ModuleHookHandle:
    handle = ModuleHookHandle(hooks, *extra)
    hooks[handle.id] = fn
    if prepend:
        hooks.move_to_end(handle.id, last=False)
    return handle


class WithModule:
    """Calls `hook(module, *args)`: public load_state_dict pre-hooks receive the module."""

    def __init__(self, module, hook) -> None:
        self.module, self.hook = module, hook

    def __call__(self, *args):
        return self.hook(self.module, *args)


class BackwardHookFunction(Function):
    """Identity on its tensor arguments; its backward node is where module hooks attach."""

    @staticmethod
    def forward(ctx, *args):
        ctx.mark_non_differentiable(*[a for a in args if not a.requires_grad])
        return args

    @staticmethod
    def backward(ctx, *grads):
        # Inputs that need no grad get the materialised zeros, as PyTorch's hooks see them.
        return grads


def _pack_with_none(indices, values, size) -> tuple:
    res = [None] * size
    for idx, val in zip(indices, values):
        res[idx] = val
    return tuple(res)


def _unpack_none(indices, values) -> tuple:
    return tuple(values[idx] for idx in indices)


class BackwardHook:
    """The state of one module call's full backward hooks (see the module docstring)."""

    def __init__(self, module, user_hooks: list, user_pre_hooks: list) -> None:
        self.module = module
        self.user_hooks = user_hooks
        self.user_pre_hooks = user_pre_hooks
        self.grad_outputs = None
        self.n_inputs = self.n_outputs = 0
        self.input_tensors_index = self.output_tensors_index = None

    def _apply_on_tensors(self, register, args: tuple):
        tensors_idx = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        tensors = [args[i] for i in tensors_idx]
        if not (is_grad_enabled() and any(t.requires_grad for t in tensors)):
            return args, None
        new_tensors = BackwardHookFunction.apply(*tensors)
        if not isinstance(new_tensors, tuple):
            new_tensors = (new_tensors,)
        grad_fns = [t.grad_fn for t in new_tensors if t.grad_fn is not None
                    and t.grad_fn.name() == "BackwardHookFunctionBackward"]
        if not grad_fns:
            raise RuntimeError("Error while setting up backward hooks: no hook node was made")
        register(grad_fns[0])
        arg_list = list(args)
        for idx, val in zip(tensors_idx, new_tensors):
            arg_list[idx] = val
        return tuple(arg_list), tensors_idx

    # ---- inputs: the post-hook of the input identity node calls the user hooks -----------
    def setup_input_hook(self, args: tuple) -> tuple:
        res, idx = self._apply_on_tensors(self._set_user_hook, args)
        self.n_inputs = len(args)
        self.input_tensors_index = idx
        return res

    def _set_user_hook(self, grad_fn) -> None:
        def hook(grad_input, _grad_output):
            if self.grad_outputs is None:
                # The gradient reached the inputs without passing through the outputs (e.g.
                # double backward): PyTorch skips the user hooks then.
                return None
            res = _pack_with_none(self.input_tensors_index, grad_input, self.n_inputs)
            for user_hook in self.user_hooks:
                out = user_hook(self.module, res, self.grad_outputs)
                if out is None:
                    continue
                if not isinstance(out, tuple):
                    out = (out,)
                if len(out) != len(res):
                    raise RuntimeError(
                        "Backward hook returned an invalid number of grad_input, "
                        f"got {len(out)}, but expected {len(res)}"
                    )
                res = out
            self.grad_outputs = None
            return _unpack_none(self.input_tensors_index, res)

        grad_fn.register_hook(hook)

    # ---- outputs: the pre-hook of the output identity node keeps grad_output -------------
    def setup_output_hook(self, result):
        is_tuple = isinstance(result, tuple)
        args = result if is_tuple else (result,)
        res, idx = self._apply_on_tensors(self._set_output_hook, args)
        self.n_outputs = len(args)
        self.output_tensors_index = idx
        return res if is_tuple else res[0]

    def _set_output_hook(self, grad_fn) -> None:
        def hook(grad_output):
            self.grad_outputs = _pack_with_none(self.output_tensors_index, grad_output,
                                                self.n_outputs)
            for pre_hook in self.user_pre_hooks:
                new = pre_hook(self.module, self.grad_outputs)
                if new is None:
                    continue
                if not isinstance(new, tuple):
                    new = (new,)
                if len(new) != len(self.grad_outputs):
                    raise RuntimeError(
                        "Backward pre hook returned an invalid number of grad_output, "
                        f"got {len(new)}, but expected {len(self.grad_outputs)}"
                    )
                self.grad_outputs = new
            local = self.grad_outputs
            if self.input_tensors_index is None:  # no input requires grad: call hooks now
                warnings.warn(
                    "Full backward hook is firing when gradients are computed with respect to "
                    "module outputs since no inputs require gradients.", stacklevel=5)
                grad_inputs = _pack_with_none([], [], self.n_inputs)
                for user_hook in self.user_hooks:
                    out = user_hook(self.module, grad_inputs, self.grad_outputs)
                    if out is not None and not (
                        isinstance(out, tuple) and all(el is None for el in out)
                    ):
                        raise RuntimeError(
                            "Backward hook for Modules where no input requires gradient should "
                            "always return None or None for all gradients."
                        )
                self.grad_outputs = None
            return _unpack_none(self.output_tensors_index, local)

        grad_fn.register_prehook(hook)


def warn_if_not_tensor_output(result) -> None:
    if not isinstance(result, (Tensor, tuple)):
        warnings.warn(
            "For backward hooks to be called, module output should be a Tensor or a tuple of "
            f"Tensors but received {type(result)}",
            stacklevel=3,
        )
