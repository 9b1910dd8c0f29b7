"""Adam and AdamW: PyTorch's update, line for line.

Per parameter, in the order of `torch.optim.adam._single_tensor_adam`:

    step += 1
    g = -grad if maximize else grad
    p = p * (1 - lr * weight_decay)                 (AdamW: decoupled decay)
    g = g + weight_decay * p                        (Adam: L2 penalty in the gradient)
    m = lerp(m, g, 1 - beta1)
    v = v * beta2 + (1 - beta2) * g * g
    v_max = maximum(v_max, v)                       (amsgrad; v_max replaces v below)
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = lr / bias_correction1
    denom = sqrt(v) / bias_correction2 ** 0.5 + eps
    p = p + (-step_size * m) / denom

`step` is a 0-d float32 tensor (as PyTorch keeps it), and the bias corrections are computed
from it with graphc ops in float64, where PyTorch computes them in Python floats, then cast to
the parameter's dtype as PyTorch casts a Python scalar at the op. So the update is graph ops
end to end (a trace records it, step counter included) and the numbers are PyTorch's. In
eager mode the same lines run as numpy calls (graphc.optim.foreach, PyTorch's `foreach`
default; `foreach=False` keeps the ops), with the same results bit for bit.
"""

from __future__ import annotations

from typing import Any

from graphc.ops.elementwise import cast, maximum, sqrt, where
from graphc.ops.registry import call
from graphc.optim import foreach as multi_tensor
from graphc.optim.optimizer import (
    Optimizer,
    check_lr,
    check_weight_decay,
    checkable,
    zeros_state,
)
from graphc.tensor import Tensor
from graphc.types import float32, float64

_STEP_DTYPE = float32  # PyTorch's `_get_scalar_dtype()` under the default dtype


def lerp_(start, end, weight):
    """start.lerp_(end, weight) with ATen's two formulas (exact at weight 0 and 1); `weight`
    a Python number or a 0-d tensor (a runtime input: both formulas, chosen by `where`)."""
    if isinstance(weight, Tensor):
        w = cast(weight, start.dtype)
        diff = end - start
        return start.copy_(where(w.abs() < 0.5, start + diff * w, end - diff * (1 - w)))
    if abs(weight) < 0.5:
        return start.add_((end - start).mul(weight))
    one_minus = 1 - call("full", shape=(), value=weight, dtype=start.dtype.name)
    return start.copy_(end - (end - start) * one_minus)


class Adam(Optimizer):
    """Adam (Kingma & Ba), optionally AMSGrad, as `torch.optim.Adam`.

    >>> import graphc
    >>> from graphc.optim import Adam
    >>> w = graphc.tensor([1.0, -1.0], requires_grad=True)
    >>> opt = Adam([w], lr=0.1)
    >>> (w * w).sum().backward()
    >>> opt.step()
    >>> w
    tensor([ 0.9000, -0.9000], requires_grad=True)
    """

    _STATE_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, amsgrad: bool = False, *,
                 maximize: bool = False, decoupled_weight_decay: bool = False,
                 foreach: bool | None = None) -> None:
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
            "maximize": maximize,
            "decoupled_weight_decay": decoupled_weight_decay,
            "foreach": foreach,
        }
        self._validate(defaults)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_lr(group["lr"])
        eps, betas = group["eps"], group["betas"]
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps} (eps must be >= 0)")
        if len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas}")
        for i, beta in enumerate(map(checkable, betas)):  # a tensor beta1: OneCycleLR's
            if beta is not None and not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {beta} (must be in "
                                 "[0, 1))")
        check_weight_decay(group["weight_decay"])

    def _check_state(self, p) -> None:
        super()._check_state(p)
        state = self.state.get(p)
        if state:
            missing = [k for k in ("step", "exp_avg", "exp_avg_sq") if k not in state]
            if missing:
                raise KeyError(f"{type(self).__name__}: the state of a parameter lacks {missing}")

    def initial_state(self, group: dict[str, Any], p: Tensor) -> dict[str, Any]:
        """PyTorch's lazy initialisation (a `step` of 0.0 and zero moments), exact ahead of
        the first update: that update is the steady one applied to zero state."""
        state = self.state.get(p, {})
        if len(state) == 0:
            new = {"step": call("full", shape=(), value=0.0, dtype=_STEP_DTYPE.name),
                   "exp_avg": zeros_state(p), "exp_avg_sq": zeros_state(p)}
            if group["amsgrad"]:
                new["max_exp_avg_sq"] = zeros_state(p)
            return new
        if group["amsgrad"] and "max_exp_avg_sq" not in state:
            # amsgrad switched on after some steps: start the running max from zero
            return {"max_exp_avg_sq": zeros_state(p)}
        return {}

    def _update_group(self, group: dict[str, Any], params: list, grads: list) -> None:
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        weight_decay, amsgrad = group["weight_decay"], group["amsgrad"]
        foreach = multi_tensor.usable(group, lr, beta1, beta2, eps, weight_decay)
        scratch = multi_tensor.scratch_of(self) if foreach else None
        for p, grad in zip(params, grads):
            state = self.state[p]
            state.update(self.initial_state(group, p))  # lazy initialisation, as PyTorch
            if foreach and multi_tensor.adam(p, grad, state, group, scratch):
                continue  # the same lines in numpy (graphc.optim.foreach)
            step_t, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]

            step_t.add_(1)
            g = -grad if group["maximize"] else grad
            if weight_decay != 0:
                if group["decoupled_weight_decay"]:
                    p.mul_(1 - lr * weight_decay)
                else:
                    g = g.add(p, alpha=weight_decay)
            lerp_(exp_avg, g, 1 - beta1)
            exp_avg_sq.mul_(beta2).add_(g.mul(1 - beta2).mul(g))

            step = cast(step_t, float64)
            bias_correction1 = 1 - call("pow", beta1, step)
            bias_correction2 = 1 - call("pow", beta2, step)
            step_size = cast(lr / bias_correction1, p.dtype)
            bias_correction2_sqrt = cast(call("pow", bias_correction2, 0.5), p.dtype)
            if amsgrad:
                max_exp_avg_sq = state["max_exp_avg_sq"]
                max_exp_avg_sq.copy_(maximum(max_exp_avg_sq, exp_avg_sq))
                denom = (sqrt(max_exp_avg_sq) / bias_correction2_sqrt).add_(eps)
            else:
                denom = (sqrt(exp_avg_sq) / bias_correction2_sqrt).add_(eps)
            p.add_((-step_size).mul(exp_avg).div(denom))


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as `torch.optim.AdamW`.

    >>> import graphc
    >>> from graphc.optim import AdamW
    >>> w = graphc.tensor([1.0], requires_grad=True)
    >>> opt = AdamW([w], lr=0.1, weight_decay=0.5)
    >>> (w * w).sum().backward()
    >>> opt.step()
    >>> w
    tensor([0.8500], requires_grad=True)
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         decoupled_weight_decay=True, foreach=foreach)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for group in self.param_groups:  # AdamW always decays decoupled (as PyTorch)
            group["decoupled_weight_decay"] = True
