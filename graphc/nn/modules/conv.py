"""`Conv2d`: 2-D convolution over NCHW (or CHW) inputs, with PyTorch's arguments and init."""

from __future__ import annotations

import math

import graphc
from graphc.errors import ArgumentError
from graphc.nn import functional as F
from graphc.nn import init
from graphc.nn.module import Module
from graphc.nn.parameter import Parameter

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _pair(x) -> tuple:
    if isinstance(x, (tuple, list)):
        return tuple(x) if len(x) != 1 else (x[0], x[0])
    return (x, x)


class Conv2d(Module):
    """Cross-correlation of an (N, C_in, H, W) input with (C_out, C_in/groups, kH, kW) kernels.

    >>> import graphc.nn as nn
    >>> nn.Conv2d(3, 8, 3, padding=1)
    Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device=None, dtype=None) -> None:
        super().__init__()
        if groups <= 0:
            raise ArgumentError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ArgumentError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ArgumentError("out_channels must be divisible by groups")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ArgumentError(f"Invalid padding string {padding!r}, should be one of "
                                    "{'valid', 'same'}")
            if padding == "same" and any(s != 1 for s in _pair(stride)):
                raise ArgumentError("padding='same' is not supported for strided convolutions")
        if padding_mode not in _PADDING_MODES:
            raise ArgumentError(f"padding_mode must be one of {list(_PADDING_MODES)}, but got "
                                f"padding_mode='{padding_mode}'")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = padding if isinstance(padding, str) else _pair(padding)
        self.dilation = _pair(dilation)
        self.transposed = False
        self.output_padding = (0, 0)
        self.groups = groups
        self.padding_mode = padding_mode
        if isinstance(self.padding, str):
            self._reversed_padding_repeated_twice = [0, 0] * 2
            if self.padding == "same":
                for d, k, i in zip(self.dilation, self.kernel_size, range(1, -1, -1)):
                    total = d * (k - 1)
                    left = total // 2
                    self._reversed_padding_repeated_twice[2 * i] = left
                    self._reversed_padding_repeated_twice[2 * i + 1] = total - left
        else:
            self._reversed_padding_repeated_twice = [p for p in reversed(self.padding)
                                                     for _ in range(2)]
        kw = {"dtype": dtype} if dtype is not None else {}
        self.weight = Parameter(graphc.empty(out_channels, in_channels // groups,
                                             *self.kernel_size, **kw))
        if bias:
            self.bias = Parameter(graphc.empty(out_channels, **kw))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def _conv_forward(self, input, weight, bias):  # noqa: A002
        if self.padding_mode != "zeros":
            padded = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return F.conv2d(padded, weight, bias, self.stride, (0, 0), self.dilation,
                            self.groups)
        return F.conv2d(input, weight, bias, self.stride, self.padding, self.dilation,
                        self.groups)

    def forward(self, input):  # noqa: A002
        return self._conv_forward(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0,) * len(self.padding):
            s += f", padding={self.padding}"
        if self.dilation != (1,) * len(self.dilation):
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * len(self.output_padding):
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s
