"""Padding layers, as torch.nn: `ZeroPad1d/2d`, `ConstantPad1d/2d`, `ReflectionPad1d/2d`,
`ReplicationPad1d/2d`, `CircularPad1d/2d`; each is F.pad with its mode. An int pads every side
equally; a tuple is (left, right[, top, bottom])."""

from __future__ import annotations

from graphc.nn import functional as F
from graphc.nn.module import Module


class _PadNd(Module):
    _dims = 2
    _mode = "constant"

    def __init__(self, padding, value: float = 0.0) -> None:
        super().__init__()
        if isinstance(padding, int):
            padding = (padding,) * (2 * self._dims)
        self.padding = tuple(padding)
        self.value = value

    def forward(self, input):  # noqa: A002
        if self._mode == "constant":
            return F.pad(input, self.padding, "constant", self.value)
        return F.pad(input, self.padding, self._mode)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class _ConstantPad(_PadNd):
    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


class ConstantPad1d(_ConstantPad):
    """Pad the last dim with `value`."""

    _dims = 1


class ConstantPad2d(_ConstantPad):
    """Pad the last two dims with `value`."""


class ZeroPad1d(_PadNd):
    """Pad the last dim with zeros."""

    _dims = 1

    def __init__(self, padding) -> None:
        super().__init__(padding, 0.0)


class ZeroPad2d(_PadNd):
    """Pad the last two dims with zeros.

    >>> import graphc, graphc.nn as nn
    >>> nn.ZeroPad2d((1, 2, 0, 1))(graphc.ones(1, 3, 3)).shape
    graphc.Size([1, 4, 6])
    """

    def __init__(self, padding) -> None:
        super().__init__(padding, 0.0)


class ReflectionPad1d(_PadNd):
    """Mirror the last dim at its edges (the edge itself not repeated)."""

    _dims = 1
    _mode = "reflect"


class ReflectionPad2d(_PadNd):
    """Mirror the last two dims at their edges."""

    _mode = "reflect"


class ReplicationPad1d(_PadNd):
    """Repeat the edge values of the last dim."""

    _dims = 1
    _mode = "replicate"


class ReplicationPad2d(_PadNd):
    """Repeat the edge values of the last two dims."""

    _mode = "replicate"


class CircularPad1d(_PadNd):
    """Wrap the last dim around."""

    _dims = 1
    _mode = "circular"


class CircularPad2d(_PadNd):
    """Wrap the last two dims around."""

    _mode = "circular"


__all__ = ["CircularPad1d", "CircularPad2d", "ConstantPad1d", "ConstantPad2d", "ReflectionPad1d",
           "ReflectionPad2d", "ReplicationPad1d", "ReplicationPad2d", "ZeroPad1d", "ZeroPad2d"]
