"""`graphc.nn.functional`: PyTorch's `torch.nn.functional` signatures over graphc's ops.

Nothing here computes: each function normalises PyTorch's arguments (legacy `size_average` /
`reduce` flags, `inplace=True`, defaults) and forwards to the op modules, where the shape
rules, kernels and gradients live (graphc.ops.linalg, conv, pool, nn_ops, random, movement,
elementwise). The op modules are looked up when a function is called, so this module imports
even while an op module is still being written.

>>> import graphc
>>> import graphc.nn.functional as F
>>> F.relu(graphc.tensor([-1.0, 2.0]))
tensor([0., 2.])
"""

from __future__ import annotations

import warnings

from graphc.errors import ArgumentError
from graphc.ops import conv as _conv
from graphc.ops import elementwise as _elementwise
from graphc.ops import linalg as _linalg
from graphc.ops import movement as _movement
from graphc.ops import nn_ops as _nn_ops
from graphc.ops import pool as _pool
from graphc.ops import random as _random
from graphc.ops.registry import inplace as _inplace


def _legacy_reduction(size_average, reduce, reduction: str) -> str:
    """PyTorch's `_Reduction.legacy_get_string`: the deprecated flags win when given."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if size_average and reduce:
        ret = "mean"
    elif reduce:
        ret = "sum"
    else:
        ret = "none"
    warnings.warn(f"size_average and reduce args will be deprecated, please use "
                  f"reduction='{ret}' instead.", UserWarning, stacklevel=3)
    return ret


# ---- linear and convolution ----------------------------------------------------------------
def linear(input, weight, bias=None):  # noqa: A002 (PyTorch's names)
    """y = input @ weight.T + bias."""
    return _linalg.linear(input, weight, bias)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    return _conv.conv2d(input, weight, bias, stride, padding, dilation, groups)


# ---- pooling --------------------------------------------------------------------------------
def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
               ceil_mode=False, return_indices=False):
    return _pool.max_pool2d(input, kernel_size, stride=stride, padding=padding,
                            dilation=dilation, ceil_mode=ceil_mode,
                            return_indices=return_indices)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,  # noqa: A002
               count_include_pad=True, divisor_override=None):
    return _pool.avg_pool2d(input, kernel_size, stride=stride, padding=padding,
                            ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                            divisor_override=divisor_override)


# ---- activations ----------------------------------------------------------------------------
def relu(input, inplace: bool = False):  # noqa: A002
    if inplace:
        return _inplace(input, "relu_", _elementwise.relu)
    return _elementwise.relu(input)


def relu_(input):  # noqa: A002
    return relu(input, inplace=True)


def leaky_relu(input, negative_slope: float = 0.01, inplace: bool = False):  # noqa: A002
    if inplace:
        def leaked(old):
            return _elementwise.leaky_relu(old, negative_slope)

        return _inplace(input, "leaky_relu_", leaked)
    return _elementwise.leaky_relu(input, negative_slope)


def gelu(input, approximate: str = "none"):  # noqa: A002
    return _elementwise.gelu(input, approximate=approximate)


def tanh(input):  # noqa: A002
    return _elementwise.tanh(input)


def sigmoid(input):  # noqa: A002
    return _elementwise.sigmoid(input)


def softmax(input, dim=None, _stacklevel: int = 3, dtype=None):  # noqa: A002
    return _nn_ops.softmax(input, dim=dim, dtype=dtype)


def log_softmax(input, dim=None, _stacklevel: int = 3, dtype=None):  # noqa: A002
    return _nn_ops.log_softmax(input, dim=dim, dtype=dtype)


def dropout(input, p: float = 0.5, training: bool = True, inplace: bool = False):  # noqa: A002
    return _random.dropout(input, p, training, inplace)


# ---- normalisation and embedding ------------------------------------------------------------
def batch_norm(input, running_mean, running_var, weight=None, bias=None,  # noqa: A002
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5):
    """Normalise per channel (dim 1); in training, updates the running statistics in place."""
    return _nn_ops.batch_norm(input, running_mean, running_var, weight, bias, training,
                              momentum, eps)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type: float = 2.0,  # noqa: A002
              scale_grad_by_freq: bool = False, sparse: bool = False):
    unsupported = {"max_norm": max_norm is not None, "scale_grad_by_freq": scale_grad_by_freq,
                   "sparse": sparse}
    for name, given in unsupported.items():
        if given:
            raise ArgumentError(f"embedding: {name} is not supported by graphc yet; leave it "
                                "at its default")
    return _nn_ops.embedding(input, weight, padding_idx=padding_idx)


# ---- losses ---------------------------------------------------------------------------------
def cross_entropy(input, target, weight=None, size_average=None,  # noqa: A002
                  ignore_index: int = -100, reduce=None, reduction: str = "mean",
                  label_smoothing: float = 0.0):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return _nn_ops.cross_entropy(input, target, weight, ignore_index, reduction,
                                 label_smoothing)


def nll_loss(input, target, weight=None, size_average=None,  # noqa: A002
             ignore_index: int = -100, reduce=None, reduction: str = "mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return _nn_ops.nll_loss(input, target, weight, ignore_index, reduction)


def mse_loss(input, target, size_average=None, reduce=None,  # noqa: A002
             reduction: str = "mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return _nn_ops.mse_loss(input, target, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None,  # noqa: A002
                                     reduce=None, reduction: str = "mean", pos_weight=None):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return _nn_ops.binary_cross_entropy_with_logits(input, target, weight, reduction,
                                                    pos_weight)


# ---- shape ----------------------------------------------------------------------------------
def pad(input, pad, mode: str = "constant", value=None):  # noqa: A002
    """Pad the last dims: `pad` is (left, right, top, bottom, ...) as in PyTorch."""
    return _movement.pad(input, pad, mode=mode, value=value)


def flatten(input, start_dim: int = 0, end_dim: int = -1):  # noqa: A002
    return _movement.flatten(input, start_dim, end_dim)


__all__ = [
    "avg_pool2d", "batch_norm", "binary_cross_entropy_with_logits", "conv2d", "cross_entropy",
    "dropout", "embedding", "flatten", "gelu", "leaky_relu", "linear", "log_softmax",
    "max_pool2d", "mse_loss", "nll_loss", "pad", "relu", "relu_", "sigmoid", "softmax", "tanh",
]
from graphc.nn.functional_vision import *  # noqa: E402,F401,F403  (vision half, issue 12)
