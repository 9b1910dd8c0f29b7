"""Linear layers: `Linear` (y = x W^T + b), `Identity`, and PyTorch's default initialisation."""

from __future__ import annotations

import math

import graphc
from graphc.nn import functional as F
from graphc.nn import init
from graphc.nn.module import Module
from graphc.nn.parameter import Parameter


def _factory(dtype):
    return {"dtype": dtype} if dtype is not None else {}


class Identity(Module):
    """Returns its input; ignores any constructor arguments (as PyTorch)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def forward(self, input):  # noqa: A002
        return input


class Linear(Module):
    """y = x @ weight.T + bias, with weight (out_features, in_features).

    >>> import graphc
    >>> import graphc.nn as nn
    >>> nn.Linear(4, 3)
    Linear(in_features=4, out_features=3, bias=True)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(graphc.empty(out_features, in_features, **_factory(dtype)))
        if bias:
            self.bias = Parameter(graphc.empty(out_features, **_factory(dtype)))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # PyTorch's default: kaiming_uniform_(a=sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input):  # noqa: A002
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")
