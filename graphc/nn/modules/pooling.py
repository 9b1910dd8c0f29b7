"""Pooling layers: `MaxPool2d`, `AvgPool2d` and the adaptive `AdaptiveAvgPool1d/2d`,
`AdaptiveMaxPool1d/2d` over N, C, ... (or unbatched) inputs."""

from __future__ import annotations

from graphc.nn import functional as F
from graphc.nn.module import Module


class MaxPool2d(Module):
    """Maximum over kernel windows; `stride` defaults to `kernel_size`.

    >>> import graphc.nn as nn
    >>> nn.MaxPool2d(2)
    MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 return_indices: bool = False, ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.return_indices = return_indices
        self.ceil_mode = ceil_mode

    def forward(self, input):  # noqa: A002
        return F.max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation,
                            ceil_mode=self.ceil_mode, return_indices=self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    """Mean over kernel windows; `stride` defaults to `kernel_size`.

    >>> import graphc.nn as nn
    >>> nn.AvgPool2d(2)
    AvgPool2d(kernel_size=2, stride=2, padding=0)
    """

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override=None) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input):  # noqa: A002
        return F.avg_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class _AdaptivePool(Module):
    """Pooling to a fixed output size whatever the input size (None keeps that dim)."""

    def __init__(self, output_size, return_indices: bool = False) -> None:
        super().__init__()
        self.output_size = output_size
        self.return_indices = return_indices

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_AdaptivePool):
    """Mean over windows of the last dim giving `output_size` entries."""

    def __init__(self, output_size) -> None:
        super().__init__(output_size)

    def forward(self, input):  # noqa: A002
        return F.adaptive_avg_pool1d(input, self.output_size)


class AdaptiveAvgPool2d(_AdaptivePool):
    """Mean over windows of the last two dims giving an `output_size` map (ResNet's head).

    >>> import graphc, graphc.nn as nn
    >>> nn.AdaptiveAvgPool2d((1, 1))(graphc.ones(2, 8, 5, 7)).shape
    graphc.Size([2, 8, 1, 1])
    """

    def __init__(self, output_size) -> None:
        super().__init__(output_size)

    def forward(self, input):  # noqa: A002
        return F.adaptive_avg_pool2d(input, self.output_size)


class AdaptiveMaxPool1d(_AdaptivePool):
    """Maximum over windows of the last dim giving `output_size` entries."""

    def forward(self, input):  # noqa: A002
        return F.adaptive_max_pool1d(input, self.output_size, self.return_indices)


class AdaptiveMaxPool2d(_AdaptivePool):
    """Maximum over windows of the last two dims giving an `output_size` map."""

    def forward(self, input):  # noqa: A002
        return F.adaptive_max_pool2d(input, self.output_size, self.return_indices)
