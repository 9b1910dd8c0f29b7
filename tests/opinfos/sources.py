"""OpInfo entries for the source ops (full, arange) and their public functions."""

from __future__ import annotations

import numpy as np

import graphc
from graphc.errors import ArgumentError
from tests.opinfo import ErrorInput, OpInfo, Sample


def _full_samples(rng):
    return [Sample(((2, 3), 1.5), desc="float"), Sample(((4,), 7), desc="int"),
            Sample(((), True), desc="bool scalar")]


def _np_full(size, value):
    return np.full(size, value)


def _torch_full(size, value):
    import torch

    return torch.full(size, value)


def _full_errors(rng):
    return [ErrorInput(Sample(((2, -1), 0.0)), ArgumentError,
                       "Trying to create tensor with negative dimension")]


def _arange_samples(rng):
    return [Sample((5,), desc="end"), Sample((1, 7, 2), desc="start end step"),
            Sample((0.0, 1.0, 0.25), desc="float steps"), Sample((5, 0, -1), desc="negative")]


def _np_arange(*args):
    out = np.arange(*args)
    return out if all(isinstance(a, int) for a in args) else out.astype(np.float32)


def _torch_arange(*args):
    import torch

    return torch.arange(*args)


def _arange_errors(rng):
    return [ErrorInput(Sample((0, 5, -1)), ArgumentError, "inconsistent with step sign"),
            ErrorInput(Sample((0, 5, 0)), ArgumentError, "step must be nonzero")]


def _zeros_ones_samples(rng):
    return [Sample((2, 3), desc="varargs"), Sample(((4,),), desc="tuple")]


def _np_zeros(*size):
    return np.zeros(size[0] if len(size) == 1 and isinstance(size[0], tuple) else size)


def _np_ones(*size):
    return np.ones(size[0] if len(size) == 1 and isinstance(size[0], tuple) else size)


def _torch_zeros(*size):
    import torch

    return torch.zeros(*size)


def _torch_ones(*size):
    import torch

    return torch.ones(*size)


OP_INFOS: list[OpInfo] = [
    OpInfo("full", graphc.full, _np_full, _full_samples, ("full",), torch_fn=_torch_full,
           differentiable=False, exact=True, error_inputs=_full_errors),
    OpInfo("zeros", graphc.zeros, _np_zeros, _zeros_ones_samples, ("full",),
           torch_fn=_torch_zeros, differentiable=False, exact=True),
    OpInfo("ones", graphc.ones, _np_ones, _zeros_ones_samples, ("full",),
           torch_fn=_torch_ones, differentiable=False, exact=True),
    OpInfo("arange", graphc.arange, _np_arange, _arange_samples, ("arange",),
           torch_fn=_torch_arange, differentiable=False, error_inputs=_arange_errors),
]
