"""More activation layers, as torch.nn: ReLU6, Hardtanh, Hardswish, Hardsigmoid, SiLU, Mish,
ELU, Softplus and PReLU (the one with a parameter). Each forwards to its functional in
graphc.nn.functional (graphc/nn/functional_vision.py), so modules and functionals agree."""

from __future__ import annotations

import graphc
from graphc.errors import ArgumentError
from graphc.nn import functional as F
from graphc.nn.module import Module
from graphc.nn.parameter import Parameter


class _InplaceActivation(Module):
    """A parameter-free activation with PyTorch's `inplace` flag."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Hardtanh(Module):
    """clamp(x, min_val, max_val).

    >>> import graphc.nn as nn
    >>> nn.Hardtanh(-2.0, 2.0)
    Hardtanh(min_val=-2.0, max_val=2.0)
    """

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.min_val = min_val
        self.max_val = max_val
        self.inplace = inplace
        if self.max_val <= self.min_val:
            raise ArgumentError("max_val must be greater than min_val")

    def forward(self, input):  # noqa: A002
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        inplace = ", inplace=True" if self.inplace else ""
        return f"min_val={self.min_val}, max_val={self.max_val}{inplace}"


class ReLU6(Hardtanh):
    """min(max(x, 0), 6).

    >>> import graphc.nn as nn
    >>> nn.ReLU6()
    ReLU6()
    """

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Hardswish(_InplaceActivation):
    """x * relu6(x + 3) / 6 (MobileNetV3)."""

    def forward(self, input):  # noqa: A002
        return F.hardswish(input, self.inplace)


class Hardsigmoid(_InplaceActivation):
    """relu6(x + 3) / 6."""

    def forward(self, input):  # noqa: A002
        return F.hardsigmoid(input, self.inplace)


class SiLU(_InplaceActivation):
    """x * sigmoid(x) (swish)."""

    def forward(self, input):  # noqa: A002
        return F.silu(input, inplace=self.inplace)


class Mish(_InplaceActivation):
    """x * tanh(softplus(x))."""

    def forward(self, input):  # noqa: A002
        return F.mish(input, inplace=self.inplace)


class ELU(Module):
    """x where x > 0, alpha * (exp(x) - 1) elsewhere."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return F.elu(input, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class Softplus(Module):
    """log(1 + exp(beta * x)) / beta, linear above `threshold`."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, input):  # noqa: A002
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class PReLU(Module):
    """x where x > 0, a * x elsewhere, with a learned `a` (one, or one per channel).

    >>> import graphc.nn as nn
    >>> nn.PReLU(3).weight.shape
    graphc.Size([3])
    """

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.num_parameters = num_parameters
        self.init = init
        kw = {"dtype": dtype} if dtype is not None else {}
        self.weight = Parameter(graphc.empty(num_parameters, **kw))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with graphc.no_grad():
            self.weight.fill_(self.init)

    def forward(self, input):  # noqa: A002
        return F.prelu(input, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


__all__ = ["ELU", "Hardsigmoid", "Hardswish", "Hardtanh", "Mish", "PReLU", "ReLU6", "SiLU",
           "Softplus"]
