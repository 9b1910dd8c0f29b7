"""Activation layers: ReLU, LeakyReLU, Tanh, Sigmoid, GELU, Softmax, LogSoftmax."""

from __future__ import annotations

from graphc.errors import ArgumentError
from graphc.nn import functional as F
from graphc.nn.module import Module


class ReLU(Module):
    """max(x, 0) elementwise; `inplace=True` overwrites the input."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return F.relu(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class LeakyReLU(Module):
    """x where x >= 0, negative_slope * x elsewhere."""

    def __init__(self, negative_slope: float = 1e-2, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace
                                                          else "")


class Tanh(Module):
    def forward(self, input):  # noqa: A002
        return F.tanh(input)


class Sigmoid(Module):
    def forward(self, input):  # noqa: A002
        return F.sigmoid(input)


class GELU(Module):
    """x * Phi(x); approximate='tanh' uses the tanh formula."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ArgumentError(f"approximate argument must be either none or tanh, got "
                                f"{approximate!r}")
        self.approximate = approximate

    def forward(self, input):  # noqa: A002
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class _AlongDim(Module):
    """A module applying one function along `dim` (Softmax, LogSoftmax)."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if not hasattr(self, "dim"):
            self.dim = None

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmax(_AlongDim):
    """exp(x) / sum(exp(x)) along `dim`."""

    def forward(self, input):  # noqa: A002
        return F.softmax(input, self.dim, _stacklevel=5)


class LogSoftmax(_AlongDim):
    """log(softmax(x)) along `dim`, computed stably."""

    def forward(self, input):  # noqa: A002
        return F.log_softmax(input, self.dim, _stacklevel=5)
