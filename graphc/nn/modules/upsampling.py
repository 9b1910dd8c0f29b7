"""Resizing layers: `Upsample`, `UpsamplingNearest2d`, `UpsamplingBilinear2d` (over
graphc.nn.functional.interpolate), and the channel-dropout layers `Dropout1d`, `Dropout2d`."""

from __future__ import annotations

from graphc.nn import functional as F
from graphc.nn.module import Module
from graphc.nn.modules.misc import DropoutNd


class Upsample(Module):
    """Resize the spatial dims to `size` or by `scale_factor` (modes as F.interpolate).

    >>> import graphc, graphc.nn as nn
    >>> nn.Upsample(scale_factor=2, mode="bilinear")(graphc.ones(1, 1, 3, 3)).shape
    graphc.Size([1, 1, 6, 6])
    """

    def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                 recompute_scale_factor=None) -> None:
        super().__init__()
        self.name = type(self).__name__
        self.size = size
        if isinstance(scale_factor, tuple):
            self.scale_factor = tuple(float(f) for f in scale_factor)
        else:
            self.scale_factor = float(scale_factor) if scale_factor else None
        self.mode = mode
        self.align_corners = align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, input):  # noqa: A002
        return F.interpolate(input, self.size, self.scale_factor, self.mode, self.align_corners,
                             recompute_scale_factor=self.recompute_scale_factor)

    def extra_repr(self) -> str:
        if self.scale_factor is not None:
            info = "scale_factor=" + repr(self.scale_factor)
        else:
            info = "size=" + repr(self.size)
        return info + ", mode=" + repr(self.mode)


class UpsamplingNearest2d(Upsample):
    """Nearest-neighbour upsampling of (N, C, H, W) inputs."""

    def __init__(self, size=None, scale_factor=None) -> None:
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    """Bilinear upsampling with align_corners=True (this layer's historical behaviour)."""

    def __init__(self, size=None, scale_factor=None) -> None:
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)


class Dropout1d(DropoutNd):
    """In training, zeroes whole channels of (N, C, L) inputs with probability p."""

    def forward(self, input):  # noqa: A002
        return F.dropout1d(input, self.p, self.training, self.inplace)


class Dropout2d(DropoutNd):
    """In training, zeroes whole channels (feature maps) of (N, C, H, W) inputs with
    probability p and scales the rest by 1/(1-p)."""

    def forward(self, input):  # noqa: A002
        return F.dropout2d(input, self.p, self.training, self.inplace)


__all__ = ["Dropout1d", "Dropout2d", "Upsample", "UpsamplingBilinear2d", "UpsamplingNearest2d"]
