"""Convolution layers with PyTorch's arguments, parameter shapes and init: `Conv1d`, `Conv2d`
and the transposed `ConvTranspose1d`, `ConvTranspose2d` (one `ConvNd` base holds the checks,
the padding bookkeeping and the init; the subclasses pick the functional)."""

from __future__ import annotations

import math

import graphc
from graphc.errors import ArgumentError
from graphc.nn import functional as F
from graphc.nn import init
from graphc.nn.module import Module
from graphc.nn.parameter import Parameter

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _ntuple(x, n: int) -> tuple:
    if isinstance(x, (tuple, list)):
        return tuple(x) if len(x) != 1 else tuple(x) * n
    return (x,) * n


def _pair(x) -> tuple:
    return _ntuple(x, 2)


class ConvNd(Module):
    """What every convolution layer shares: argument checks, `weight` and `bias` with PyTorch's
    shapes and kaiming-uniform init, padding bookkeeping and the repr."""

    _dims = 2
    _transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device=None, dtype=None, output_padding=0) -> None:
        super().__init__()
        n = self._dims
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
            if padding == "same" and any(s != 1 for s in _ntuple(stride, n)):
                raise ArgumentError("padding='same' is not supported for strided convolutions")
        if padding_mode not in _PADDING_MODES:
            raise ArgumentError(f"padding_mode must be one of {list(_PADDING_MODES)}, but got "
                                f"padding_mode='{padding_mode}'")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _ntuple(kernel_size, n)
        self.stride = _ntuple(stride, n)
        self.padding = padding if isinstance(padding, str) else _ntuple(padding, n)
        self.dilation = _ntuple(dilation, n)
        self.transposed = self._transposed
        self.output_padding = _ntuple(output_padding, n)
        self.groups = groups
        self.padding_mode = padding_mode
        if isinstance(self.padding, str):
            self._reversed_padding_repeated_twice = [0, 0] * n
            if self.padding == "same":
                for d, k, i in zip(self.dilation, self.kernel_size, range(n - 1, -1, -1)):
                    total = d * (k - 1)
                    left = total // 2
                    self._reversed_padding_repeated_twice[2 * i] = left
                    self._reversed_padding_repeated_twice[2 * i + 1] = total - left
        else:
            self._reversed_padding_repeated_twice = [p for p in reversed(self.padding)
                                                     for _ in range(2)]
        kw = {"dtype": dtype} if dtype is not None else {}
        if self.transposed:
            shape = (in_channels, out_channels // groups)
        else:
            shape = (out_channels, in_channels // groups)
        self.weight = Parameter(graphc.empty(*shape, *self.kernel_size, **kw))
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
        """The convolution of `input`, padded first by `padding_mode` when it is not zeros
        (`_conv` is the subclass's functional)."""
        if self.padding_mode != "zeros":
            padded = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return self._conv(padded, weight, bias, self.stride, (0,) * self._dims,
                              self.dilation, self.groups)
        return self._conv(input, weight, bias, self.stride, self.padding, self.dilation,
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


class Conv2d(ConvNd):
    """Cross-correlation of an (N, C_in, H, W) input with (C_out, C_in/groups, kH, kW) kernels.

    >>> import graphc.nn as nn
    >>> nn.Conv2d(3, 8, 3, padding=1)
    Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))
    """

    def _conv(self, *args):
        return F.conv2d(*args)


class Conv1d(ConvNd):
    """Cross-correlation of an (N, C_in, L) input with (C_out, C_in/groups, k) kernels.

    >>> import graphc.nn as nn
    >>> nn.Conv1d(3, 8, 5, padding=2)
    Conv1d(3, 8, kernel_size=(5,), stride=(1,), padding=(2,))
    """

    _dims = 1

    def _conv(self, *args):
        return F.conv1d(*args)


class _ConvTransposeNd(ConvNd):
    """Transposed convolution: weight (C_in, C_out/groups, *kernel); forward takes an optional
    `output_size` that picks output_padding, as PyTorch."""

    _transposed = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1,
                 padding_mode: str = "zeros", device=None, dtype=None) -> None:
        if padding_mode != "zeros":
            raise ArgumentError(f'Only "zeros" padding mode is supported for '
                                f"{type(self).__name__}")
        if isinstance(padding, str):
            raise ArgumentError(f"padding={padding!r} is not supported by "
                                f"{type(self).__name__}; give the padding as ints")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype, output_padding)

    def _output_padding(self, input, output_size) -> tuple:  # noqa: A002
        """output_padding for `output_size` (PyTorch's _ConvTransposeNd._output_padding)."""
        if output_size is None:
            return self.output_padding
        n = self._dims
        output_size = list(output_size)
        if len(output_size) == n + 2 or (input.ndim == n + 1 and len(output_size) == n + 1):
            output_size = output_size[-n:]
        if len(output_size) != n:
            raise ArgumentError(f"ConvTranspose{n}D: for {input.ndim}D input, output_size must "
                                f"have {n} or {n + 2} elements (got {len(output_size)})")
        result = []
        for d in range(n):
            size = input.shape[input.ndim - n + d]
            smallest = ((size - 1) * self.stride[d] - 2 * self.padding[d]
                        + self.dilation[d] * (self.kernel_size[d] - 1) + 1)
            largest = smallest + self.stride[d] - 1
            if not smallest <= output_size[d] <= largest:
                raise ArgumentError(f"requested an output size of {output_size}, but valid "
                                    f"sizes range from {smallest} to {largest} (for an input "
                                    f"of {list(input.shape[2:])})")
            result.append(output_size[d] - smallest)
        return tuple(result)


class ConvTranspose2d(_ConvTransposeNd):
    """Transposed 2-d convolution (the gradient of Conv2d w.r.t. its input), as used by
    decoders and GAN generators.

    >>> import graphc.nn as nn
    >>> nn.ConvTranspose2d(8, 3, 4, stride=2, padding=1)
    ConvTranspose2d(8, 3, kernel_size=(4, 4), stride=(2, 2), padding=(1, 1))
    """

    def forward(self, input, output_size=None):  # noqa: A002
        output_padding = self._output_padding(input, output_size)
        return F.conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding,
                                  output_padding, self.groups, self.dilation)


class ConvTranspose1d(_ConvTransposeNd):
    """Transposed 1-d convolution over (N, C_in, L) inputs."""

    _dims = 1

    def forward(self, input, output_size=None):  # noqa: A002
        output_padding = self._output_padding(input, output_size)
        return F.conv_transpose1d(input, self.weight, self.bias, self.stride, self.padding,
                                  output_padding, self.groups, self.dilation)
