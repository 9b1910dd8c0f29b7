"""SGD with momentum, dampening, Nesterov, weight decay and maximize: PyTorch's update.

Per parameter, in the order of `torch.optim.sgd._single_tensor_sgd`:

    g = -grad if maximize else grad
    g = g + weight_decay * p                          (if weight_decay != 0)
    buf = clone(g) on the first step, else buf * momentum + (1 - dampening) * g
          (graphc.compile may make a zero buffer ahead of the first step instead, where
          that is exact: dampening 0, see `SGD.initial_state`)
    g = g + momentum * buf if nesterov else buf       (if momentum != 0)
    p = p - lr * g

Every line is a graphc op (in-place methods on `p` and the buffer), so a trace records it.
In eager mode the same lines run as numpy calls over the group (graphc.optim.foreach, PyTorch's
`foreach` default; `foreach=False` keeps the ops), with the same results bit for bit.
"""

from __future__ import annotations

from typing import Any

from graphc.optim import foreach as multi_tensor
from graphc.optim.optimizer import (
    Optimizer,
    add_scaled_,
    check_lr,
    check_weight_decay,
    checkable,
    clone,
    zeros_state,
)
from graphc.tensor import Tensor


class SGD(Optimizer):
    """Stochastic gradient descent (optionally with momentum), as `torch.optim.SGD`.

    >>> import graphc
    >>> from graphc.optim import SGD
    >>> w = graphc.tensor([1.0], requires_grad=True)
    >>> opt = SGD([w], lr=0.1, momentum=0.9)
    >>> (w * w).sum().backward()
    >>> opt.step()
    >>> w
    tensor([0.8000], requires_grad=True)
    """

    _STATE_KEYS = ("momentum_buffer",)

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None) -> None:
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "maximize": maximize,
            "foreach": foreach,
        }
        self._validate(defaults)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_lr(group["lr"])
        momentum = checkable(group["momentum"])  # a tensor: a runtime input (OneCycleLR)
        if momentum is not None and momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum} (momentum must be >= 0)")
        check_weight_decay(group["weight_decay"])
        if group["nesterov"] and ((momentum is not None and momentum <= 0)
                                  or group["dampening"] != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

    def initial_state(self, group: dict[str, Any], p: Tensor) -> dict[str, Any] | None:
        """A zero momentum buffer where momentum is on and `p` has none yet, when that is
        exact: the first update sets buf = clone(g), the steady one buf * momentum +
        (1 - dampening) * g, which from zero is g only with dampening 0 (bit for bit, but
        for the sign of a zero: 0 + -0.0 is 0.0); with dampening, None."""
        momentum = group["momentum"]
        if not isinstance(momentum, Tensor) and momentum == 0:
            return {}
        if "momentum_buffer" in self.state.get(p, {}):
            return {}
        if group["dampening"] != 0:
            return None
        return {"momentum_buffer": zeros_state(p)}

    def _update_group(self, group: dict[str, Any], params: list, grads: list) -> None:
        lr, momentum = group["lr"], group["momentum"]
        dampening, weight_decay = group["dampening"], group["weight_decay"]
        foreach = multi_tensor.usable(group, lr, momentum, dampening, weight_decay)
        scratch = multi_tensor.scratch_of(self) if foreach else None
        for p, grad in zip(params, grads):
            if foreach:  # the numpy update, once a momentum buffer exists where one is needed
                buf = self.state[p].get("momentum_buffer") if momentum != 0 else None
                if (momentum == 0 or buf is not None) \
                        and multi_tensor.sgd(p, grad, buf, group, scratch):
                    continue
            g = -grad if group["maximize"] else grad
            if weight_decay != 0:
                g = g.add(p, alpha=weight_decay)
            if isinstance(momentum, Tensor) or momentum != 0:
                m = momentum.to(p.dtype) if isinstance(momentum, Tensor) else momentum
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = clone(g)
                    state["momentum_buffer"] = buf
                else:
                    buf.mul_(m).add_(g, alpha=1 - dampening)
                g = g + buf * m if group["nesterov"] else buf
            add_scaled_(p, g, -lr)
