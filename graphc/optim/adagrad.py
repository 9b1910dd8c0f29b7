"""Adagrad: PyTorch's update (`torch.optim.adagrad._single_tensor_adagrad`).

Per parameter (state made at construction, as PyTorch: step 0, sum = initial value; for a
parameter added later by `add_param_group`, at its first update, from the defaults' initial
value, as PyTorch's `_init_group`):

    step += 1
    g = -grad if maximize else grad
    g = g + weight_decay * p                  (if weight_decay != 0)
    clr = lr / (1 + (step - 1) * lr_decay)
    sum = sum + g * g
    p = p - clr * g / (sqrt(sum) + eps)

`clr` is computed from the step tensor with graph ops in float64 (PyTorch computes it in
Python floats from the step's value), so the update is graph ops end to end.
"""

from __future__ import annotations

from typing import Any

from graphc.ops.elementwise import cast
from graphc.ops.registry import call
from graphc.optim.optimizer import Optimizer, check_lr, check_weight_decay
from graphc.tensor import Tensor
from graphc.types import float64


class Adagrad(Optimizer):
    """Adagrad (Duchi et al.), as `torch.optim.Adagrad`.

    >>> import graphc
    >>> from graphc.optim import Adagrad
    >>> w = graphc.tensor([1.0], requires_grad=True)
    >>> opt = Adagrad([w], lr=0.5)
    >>> (w * w).sum().backward()
    >>> opt.step()
    >>> w
    tensor([0.5000], requires_grad=True)
    """

    _STATE_KEYS = ("sum",)

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
                 initial_accumulator_value: float = 0, eps: float = 1e-10, foreach=None, *,
                 maximize: bool = False, differentiable: bool = False, fused=None) -> None:
        defaults = {"lr": lr, "lr_decay": lr_decay, "eps": eps, "weight_decay": weight_decay,
                    "initial_accumulator_value": initial_accumulator_value,
                    "maximize": maximize}
        self._validate(defaults)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p].update(self._fresh_state(p, group["initial_accumulator_value"]))

    @staticmethod
    def _fresh_state(p: Tensor, initial_accumulator_value) -> dict[str, Any]:
        return {"step": call("full", shape=(), value=0.0, dtype="float32"),
                "sum": call("full", shape=tuple(p.shape), value=float(initial_accumulator_value),
                            dtype=p.dtype.name)}

    def initial_state(self, group: dict[str, Any], p: Tensor) -> dict[str, Any]:
        """The state of a parameter added after construction (`add_param_group`), made as
        PyTorch's `_init_group` makes it, from the *defaults'* initial_accumulator_value;
        exact ahead of the first update, which is the steady one applied to it. Parameters
        given at construction have their state from `__init__`: {}."""
        if len(self.state.get(p, {})) != 0:
            return {}
        return self._fresh_state(p, self.defaults["initial_accumulator_value"])

    def _check_group(self, group: dict[str, Any]) -> None:
        check_lr(group["lr"])
        if not 0.0 <= group["lr_decay"]:
            raise ValueError(f"Invalid lr_decay value: {group['lr_decay']}")
        check_weight_decay(group["weight_decay"])
        if not 0.0 <= group["initial_accumulator_value"]:
            raise ValueError(f"Invalid initial_accumulator_value value: "
                             f"{group['initial_accumulator_value']}")
        if not 0.0 <= group["eps"]:
            raise ValueError(f"Invalid epsilon value: {group['eps']}")

    def _update_group(self, group: dict[str, Any], params: list, grads: list) -> None:
        lr, lr_decay, eps = group["lr"], group["lr_decay"], group["eps"]
        weight_decay = group["weight_decay"]
        for p, grad in zip(params, grads):
            state = self.state[p]
            state.update(self.initial_state(group, p))  # a parameter added later, as PyTorch
            step_t = state["step"]
            step_t.add_(1)
            g = -grad if group["maximize"] else grad
            if weight_decay != 0:
                g = g.add(p, alpha=weight_decay)
            lr64 = cast(lr, float64) if isinstance(lr, Tensor) else lr
            clr = lr64 / ((cast(step_t, float64) - 1) * lr_decay + 1)
            state["sum"].add_(g * g)
            std = state["sum"].sqrt().add_(eps)
            p.add_(g / std * cast(-clr, p.dtype))
