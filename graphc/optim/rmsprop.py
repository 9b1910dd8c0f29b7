"""RMSprop: PyTorch's update, line for line (`torch.optim.rmsprop._single_tensor_rmsprop`).

Per parameter:

    step += 1
    g = -grad if maximize else grad
    g = g + weight_decay * p                          (if weight_decay != 0)
    square_avg = alpha * square_avg + (1 - alpha) * g * g
    grad_avg = lerp(grad_avg, g, 1 - alpha)           (centered)
    avg = sqrt(square_avg - grad_avg^2) if centered else sqrt(square_avg), then + eps
    buf = momentum * buf + g / avg; p -= lr * buf     (momentum > 0)
    p -= lr * g / avg                                 (otherwise)
"""

from __future__ import annotations

from typing import Any

from graphc.ops.registry import call
from graphc.optim.adam import lerp_
from graphc.optim.optimizer import (
    Optimizer,
    add_scaled_,
    check_lr,
    check_weight_decay,
    checkable,
    zeros_state,
)
from graphc.tensor import Tensor


class RMSprop(Optimizer):
    """RMSprop (Hinton), optionally centered and with momentum, as `torch.optim.RMSprop`.

    >>> import graphc
    >>> from graphc.optim import RMSprop
    >>> w = graphc.tensor([1.0], requires_grad=True)
    >>> opt = RMSprop([w], lr=0.01)
    >>> (w * w).sum().backward()
    >>> opt.step()
    >>> w
    tensor([0.9000], requires_grad=True)
    """

    _STATE_KEYS = ("square_avg", "momentum_buffer", "grad_avg")

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0, momentum: float = 0, centered: bool = False,
                 capturable: bool = False, foreach=None, maximize: bool = False,
                 differentiable: bool = False) -> None:
        defaults = {"lr": lr, "alpha": alpha, "eps": eps, "weight_decay": weight_decay,
                    "momentum": momentum, "centered": centered, "maximize": maximize}
        self._validate(defaults)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_lr(group["lr"])
        if not 0.0 <= group["eps"]:
            raise ValueError(f"Invalid epsilon value: {group['eps']}")
        momentum = checkable(group["momentum"])  # a tensor: a runtime input (OneCycleLR)
        if momentum is not None and not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        check_weight_decay(group["weight_decay"])
        if not 0.0 <= group["alpha"]:
            raise ValueError(f"Invalid alpha value: {group['alpha']}")

    def initial_state(self, group: dict[str, Any], p: Tensor) -> dict[str, Any]:
        """PyTorch's lazy initialisation (a `step` of 0.0, zero averages, a zero momentum
        buffer when momentum is on), exact ahead of the first update: that update is the
        steady one applied to zero state."""
        state = self.state.get(p, {})
        momentum = group["momentum"]
        uses_momentum = isinstance(momentum, Tensor) or momentum > 0
        if len(state) == 0:
            new = {"step": call("full", shape=(), value=0.0, dtype="float32"),
                   "square_avg": zeros_state(p)}
            if uses_momentum:
                new["momentum_buffer"] = zeros_state(p)
            if group["centered"]:
                new["grad_avg"] = zeros_state(p)
            return new
        if uses_momentum and "momentum_buffer" not in state:
            return {"momentum_buffer": zeros_state(p)}  # momentum switched on after some steps
        return {}

    def _update_group(self, group: dict[str, Any], params: list, grads: list) -> None:
        lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
        weight_decay, momentum = group["weight_decay"], group["momentum"]
        uses_momentum = isinstance(momentum, Tensor) or momentum > 0
        for p, grad in zip(params, grads):
            state = self.state[p]
            state.update(self.initial_state(group, p))  # lazy initialisation, as PyTorch
            state["step"].add_(1)
            g = -grad if group["maximize"] else grad
            if weight_decay != 0:
                g = g.add(p, alpha=weight_decay)
            square_avg = state["square_avg"]
            square_avg.mul_(alpha).add_(g * g * (1 - alpha))
            if group["centered"]:
                grad_avg = state["grad_avg"]
                lerp_(grad_avg, g, 1 - alpha)
                avg = (square_avg - grad_avg * grad_avg).sqrt_()
            else:
                avg = square_avg.sqrt()
            avg = avg.add_(eps)
            if uses_momentum:
                buf = state["momentum_buffer"]
                m = momentum.to(p.dtype) if isinstance(momentum, Tensor) else momentum
                buf.mul_(m).add_(g / avg)
                add_scaled_(p, buf, -lr)
            else:
                add_scaled_(p, g / avg, -lr)
