"""Normalisation layers over features: `LayerNorm`, `RMSNorm`, `GroupNorm`, as torch.nn.

Each forwards to its functional (graphc.nn.functional.layer_norm, rms_norm, group_norm), a
decomposition into mean, rsqrt and elementwise ops, so it traces and compiles on every
backend. Parameters, their names (`weight`, `bias`), their initial values (ones and zeros)
and the reprs are PyTorch's, so state_dicts interchange.

>>> import graphc
>>> import graphc.nn as nn
>>> nn.LayerNorm(8)
LayerNorm((8,), eps=1e-05, elementwise_affine=True, bias=True)
"""

from __future__ import annotations

import graphc
from graphc.nn import functional as F
from graphc.nn import init
from graphc.nn.module import Module
from graphc.nn.parameter import Parameter


def _shape(normalized_shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    return tuple(int(n) for n in normalized_shape)


def _factory(dtype) -> dict:
    return {"dtype": dtype} if dtype is not None else {}


def _affine(module: Module, shape: tuple[int, ...], weight: bool, bias: bool, dtype) -> None:
    """Register `weight` (ones) and `bias` (zeros) of `shape`, or None in their place, as
    the three layers' PyTorch counterparts do."""
    for name, wanted in (("weight", weight), ("bias", weight and bias)):
        if wanted:
            setattr(module, name, Parameter(graphc.empty(*shape, **_factory(dtype))))
        else:
            module.register_parameter(name, None)


def _reset_affine(module: Module) -> None:
    if module.weight is not None:
        init.ones_(module.weight)
    if getattr(module, "bias", None) is not None:
        init.zeros_(module.bias)


class LayerNorm(Module):
    """Normalise over the trailing `normalized_shape` dims, then scale and shift."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        _affine(self, self.normalized_shape, elementwise_affine, bias, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_affine(self)

    def forward(self, input):  # noqa: A002
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}, "
                f"bias={self.elementwise_affine and self.bias is not None}")


class RMSNorm(Module):
    """Divide by the root mean square over the trailing dims, then scale (eps=None: the
    dtype's machine epsilon)."""

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        # PyTorch's RMSNorm has a weight and no bias (no bias parameter at all)
        if elementwise_affine:
            self.weight = Parameter(graphc.empty(*self.normalized_shape, **_factory(dtype)))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_affine(self)

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class GroupNorm(Module):
    """Normalise (N, C, *) over groups of channels, then scale and shift per channel."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, device=None, dtype=None, *, bias: bool = True) -> None:
        super().__init__()
        if num_channels % num_groups != 0:
            raise ValueError("num_channels must be divisible by num_groups")
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        _affine(self, (num_channels,), affine, bias, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_affine(self)

    def forward(self, input):  # noqa: A002
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
                f"bias={self.affine and self.bias is not None}")
