"""The vision half of `torch.nn.functional`: activations, adaptive pooling, transposed and 1-d
convolution, non-constant padding, interpolation and channel dropout.

Every function here is a decomposition into graphc's existing primitive ops (clamp, where,
sigmoid, reshape, narrow, flip, cat, take, conv2d, conv2d_input_grad, ...), so it runs eagerly,
traces into a static graph and compiles on every backend with no backend work, and its
gradient is the composition of the primitives' VJPs. Where PyTorch's hand-written backward
differs from that composition at a measure-zero point (hardtanh's gradient at exactly min_val
or max_val) the decomposition is chosen to give PyTorch's value there.

`graphc.nn.functional` re-exports everything in `__all__`; `pad` here replaces the
constant-only `pad` of that module with one that also knows reflect, replicate and circular.

>>> import graphc
>>> import graphc.nn.functional as F
>>> F.relu6(graphc.tensor([-1.0, 3.0, 7.0]))
tensor([0., 3., 6.])
>>> F.adaptive_avg_pool2d(graphc.ones(1, 2, 6, 6), 1).shape
graphc.Size([1, 2, 1, 1])
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from graphc.creation import tensor as _make_tensor
from graphc.errors import ArgumentError, ShapeError
from graphc.ops import conv as _conv
from graphc.ops import elementwise as _ew
from graphc.ops import gather as _gather
from graphc.ops import movement as _movement
from graphc.ops import random as _random
from graphc.ops import sources as _sources
from graphc.ops.registry import call as _call
from graphc.ops.registry import inplace as _inplace
from graphc.ops.shapes import format_size


def _maybe_inplace(input, inplace: bool, name: str, compute):  # noqa: A002
    """compute(input), or the same written into input when `inplace` (PyTorch's `op_`)."""
    if inplace:
        return _inplace(input, name, compute)
    return compute(input)


# ---- activations ----------------------------------------------------------------------------
def _clip_open(x, lo: float, hi: float):
    """clamp(x, lo, hi) whose gradient is 1 strictly inside (lo, hi) only, as PyTorch's
    hardtanh_backward (clamp's own gradient also passes at x == lo and x == hi)."""
    return _ew.where(x <= lo, lo, _ew.where(x >= hi, hi, x))


def hardtanh(input, min_val: float = -1.0, max_val: float = 1.0,  # noqa: A002
             inplace: bool = False):
    """clamp(x, min_val, max_val); the gradient is 1 strictly between the bounds, else 0.

    >>> import graphc
    >>> hardtanh(graphc.tensor([-2.0, 0.5, 2.0]))
    tensor([-1.0000,  0.5000,  1.0000])
    """
    if min_val > max_val:
        raise ArgumentError("min_val cannot be greater than max_val")
    return _maybe_inplace(input, inplace, "hardtanh_",
                          lambda x: _clip_open(x, float(min_val), float(max_val)))


def hardtanh_(input, min_val: float = -1.0, max_val: float = 1.0):  # noqa: A002
    """In-place hardtanh."""
    return hardtanh(input, min_val, max_val, inplace=True)


def relu6(input, inplace: bool = False):  # noqa: A002
    """min(max(x, 0), 6): hardtanh(x, 0, 6)."""
    return hardtanh(input, 0.0, 6.0, inplace)


def hardsigmoid(input, inplace: bool = False):  # noqa: A002
    """relu6(x + 3) / 6; the gradient is 1/6 strictly inside (-3, 3)."""
    return _maybe_inplace(input, inplace, "hardsigmoid_",
                          lambda x: _clip_open(x + 3.0, 0.0, 6.0) / 6.0)


def hardswish(input, inplace: bool = False):  # noqa: A002
    """x * relu6(x + 3) / 6; the gradient is (2x + 3) / 6 strictly inside (-3, 3)."""
    return _maybe_inplace(input, inplace, "hardswish_",
                          lambda x: x * _clip_open(x + 3.0, 0.0, 6.0) / 6.0)


def silu(input, inplace: bool = False):  # noqa: A002
    """x * sigmoid(x) (swish)."""
    return _maybe_inplace(input, inplace, "silu_", lambda x: x * _ew.sigmoid(x))


def softplus(input, beta: float = 1.0, threshold: float = 20.0):  # noqa: A002
    """log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold.

    The exponent is clamped at the threshold first, so the branch `where` discards never
    overflows (an inf there would turn the discarded gradient 0 * inf into nan)."""
    bx = input * beta if beta != 1.0 else input
    soft = _ew.exp(_ew.clamp(bx, None, float(threshold))).log1p()
    if beta != 1.0:
        soft = soft / beta
    return _ew.where(bx > threshold, input, soft)


def mish(input, inplace: bool = False):  # noqa: A002
    """x * tanh(softplus(x))."""
    return _maybe_inplace(input, inplace, "mish_", lambda x: x * _ew.tanh(softplus(x)))


def elu(input, alpha: float = 1.0, inplace: bool = False):  # noqa: A002
    """x where x > 0, alpha * (exp(x) - 1) elsewhere (exp of min(x, 0), so nothing overflows)."""
    def compute(x):
        negative = (_ew.exp(_ew.clamp(x, None, 0.0)) - 1.0) * alpha
        return _ew.where(x > 0, x, negative)

    return _maybe_inplace(input, inplace, "elu_", compute)


def elu_(input, alpha: float = 1.0):  # noqa: A002
    """In-place elu."""
    return elu(input, alpha, inplace=True)


def prelu(input, weight):  # noqa: A002
    """x where x > 0, weight * x elsewhere; weight has 1 or C (channel dim 1) entries."""
    if weight.ndim != 1:
        raise ShapeError(f"prelu: Expected `weight` to be a scalar or 1D tensor, but got: "
                         f"ndim = {weight.ndim}")
    n = weight.shape[0]
    if n != 1:
        if input.ndim == 0:
            raise ShapeError("prelu: Not allow zero-dim input tensor.")
        channels = input.shape[1] if input.ndim >= 2 else 1
        if channels != n:
            raise ShapeError(
                f"prelu: Mismatch of parameter numbers and input channel size. Found parameter "
                f"numbers = {n} and channel size = {channels}.")
        if input.ndim >= 2:
            weight = weight.reshape((n,) + (1,) * (input.ndim - 2))
    return _ew.where(input > 0, input, weight * input)


# ---- channel dropout ------------------------------------------------------------------------
def _check_p(p: float) -> None:
    if p < 0.0 or p > 1.0:
        raise ArgumentError(f"dropout probability has to be between 0 and 1, but got {p}")


def _channel_dropout(input, p: float, training: bool, inplace: bool, kept_dims: int):  # noqa: A002
    """Zero whole channels: one dropout draw per (N, C), broadcast over the last dims."""
    if not training or p == 0.0:
        return input
    mask_shape = tuple(input.shape[:input.ndim - kept_dims]) + (1,) * kept_dims
    mask = _random.dropout(_sources.ones(*mask_shape, dtype=input.dtype), p, True)
    return _maybe_inplace(input, inplace, "dropout_", lambda x: x * mask)


def dropout1d(input, p: float = 0.5, training: bool = True, inplace: bool = False):  # noqa: A002
    """Zero whole channels of an (N, C, L) or (C, L) input with probability p."""
    _check_p(p)
    if input.ndim not in (2, 3):
        raise ShapeError(f"dropout1d: Expected 2D or 3D input, but received a {input.ndim}D "
                         "input. Note that dropout1d exists to provide channel-wise dropout on "
                         "inputs with 1 spatial dimension, a channel dimension, and an optional "
                         "batch dimension (i.e. 2D or 3D inputs).")
    return _channel_dropout(input, p, training, inplace, 1)


def dropout2d(input, p: float = 0.5, training: bool = True, inplace: bool = False):  # noqa: A002
    """Zero whole channels (2-d feature maps) of an (N, C, H, W) input with probability p.

    As PyTorch (see pytorch#77081), a 3-d input is taken as (N, C, L), with a warning."""
    _check_p(p)
    if input.ndim not in (3, 4):
        warnings.warn(
            f"dropout2d: Received a {input.ndim}-D input to dropout2d, which is deprecated and "
            "will result in an error in a future release. To retain the behavior and silence "
            "this warning, please use dropout instead. Note that dropout2d exists to provide "
            "channel-wise dropout on inputs with 2 spatial dimensions, a channel dimension, "
            "and an optional batch dimension (i.e. 3D or 4D inputs).", stacklevel=2)
    if input.ndim == 3:
        warnings.warn(
            "dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D "
            "dropout behavior is desired - input is interpreted as shape (N, C, L), where C is "
            "the channel dim. This behavior will change in a future release to interpret the "
            "input as one without a batch dimension, i.e. shape (C, H, W). To maintain the 1D "
            "channel-wise dropout behavior, please switch to using dropout1d instead.",
            stacklevel=2)
        return _channel_dropout(input, p, training, inplace, 1)
    return _channel_dropout(input, p, training, inplace, max(input.ndim - 2, 0))


# ---- adaptive pooling -----------------------------------------------------------------------
def _adaptive_1d(x, axis: int, out: int, reduce):
    """Adaptive pooling along one axis: window i is [floor(i*n/out), ceil((i+1)*n/out))."""
    n = x.shape[axis]
    if out == n:
        return x
    if n % out == 0:  # equal windows: one reshape and one reduction
        shape = tuple(x.shape)
        split = shape[:axis] + (out, n // out) + shape[axis + 1:]
        return reduce(x.reshape(split), axis + 1, False)
    pieces = [reduce(x.narrow(axis, start, end - start), axis, True)
              for start, end in _windows(n, out)]
    return _movement.cat(pieces, axis)


def _mean(x, axis, keepdim):
    return x.mean(axis, keepdim)


def _adaptive_sizes(name: str, input, output_size, dims: int) -> tuple:  # noqa: A002
    if input.ndim not in (dims + 1, dims + 2):  # PyTorch's three wordings
        if dims == 1:
            raise ShapeError(f"Expected 2 to 3 dimensions, but got {input.ndim}-dimensional "
                             f"tensor for argument #1 'self' (while checking arguments for "
                             f"{name})")
        colon = ":" if name.startswith("adaptive_max") else ""
        raise ShapeError(f"{name}(): Expected {dims + 1}D or {dims + 2}D tensor, but got"
                         f"{colon} {format_size(input.shape)}")
    if isinstance(output_size, (tuple, list)):
        sizes = tuple(output_size)
        if len(sizes) != dims:
            raise ArgumentError(f"{name}: output_size must be {dims}")
    else:
        sizes = (output_size,) * dims
    spatial = tuple(input.shape[-dims:])
    sizes = tuple(s if o is None else int(o) for o, s in zip(sizes, spatial))
    for d in range(input.ndim - dims, input.ndim):
        if input.shape[d] == 0 and d >= input.ndim - dims:
            raise ShapeError(f"{name}(): Expected input to have non-zero size for non-batch "
                             f"dimensions, but input has sizes {format_size(input.shape)} with "
                             f"dimension {d} being empty")
    if any(s < 0 for s in sizes):
        raise ArgumentError(f"{name}: elements of output_size must be greater than or equal "
                            "to 0")
    return sizes


def _adaptive(name: str, input, output_size, dims: int, reduce):  # noqa: A002
    sizes = _adaptive_sizes(name, input, output_size, dims)
    out = input
    for k, size in enumerate(sizes):
        out = _adaptive_1d(out, input.ndim - dims + k, size, reduce)
    return out


def _windows(n: int, out: int) -> list[tuple[int, int]]:
    """Adaptive pooling's windows along one axis: [floor(i*n/out), ceil((i+1)*n/out))."""
    return [((i * n) // out, -((-(i + 1) * n) // out)) for i in range(out)]


def _adaptive_max(name: str, input, output_size, dims: int, return_indices: bool):  # noqa
    """Adaptive max pooling with PyTorch's indices (flat positions in each input plane, the
    first maximum in row-major order) and gradient (to that position only).

    Equal windows are one max_pool2d. Other windows go axis by axis: the last axis gives, per
    row, each window's maximum and its column; the row axis then picks, per window, the first
    row holding the maximum, and the column found for that row. Ties resolve to the first
    row, then the first column in it: row-major order, as PyTorch's scan."""
    sizes = _adaptive_sizes(name, input, output_size, dims)
    spatial = tuple(input.shape[-dims:])
    if all(n % out == 0 for n, out in zip(spatial, sizes)):
        plane = input if dims == 2 else input.unsqueeze(-2)
        kernel = tuple(n // out for n, out in zip(spatial, sizes))
        kernel = kernel if dims == 2 else (1,) + kernel
        values, indices = _call("max_pool2d", plane, kernel_size=kernel, stride=kernel,
                                padding=(0, 0), dilation=(1, 1), ceil_mode=False)
        if dims == 1:
            values, indices = values.squeeze(-2), indices.squeeze(-2)
        return (values, indices) if return_indices else values
    values, columns = [], []
    for start, end in _windows(spatial[-1], sizes[-1]):
        window = input.narrow(-1, start, end - start)
        best = window.argmax(-1, True)
        values.append(_gather.gather(window, -1, best))
        columns.append(best + start)
    values, indices = _movement.cat(values, -1), _movement.cat(columns, -1)
    if dims == 2:
        width, rows_values, rows_indices = spatial[-1], [], []
        for start, end in _windows(spatial[-2], sizes[-2]):
            window = values.narrow(-2, start, end - start)
            row = window.argmax(-2, True)
            rows_values.append(_gather.gather(window, -2, row))
            column = _gather.gather(indices.narrow(-2, start, end - start), -2, row)
            rows_indices.append((row + start) * width + column)
        values, indices = _movement.cat(rows_values, -2), _movement.cat(rows_indices, -2)
    return (values, indices) if return_indices else values


def adaptive_avg_pool1d(input, output_size):  # noqa: A002
    """Mean over `output_size` windows of the last dim (window i: [i*L//out, ceil((i+1)*L/out)))."""
    return _adaptive("adaptive_avg_pool1d", input, output_size, 1, _mean)


def adaptive_avg_pool2d(input, output_size):  # noqa: A002
    """Mean over output_size = (oh, ow) windows of the last two dims (None keeps that size).

    >>> import graphc
    >>> adaptive_avg_pool2d(graphc.arange(16.0).reshape(1, 1, 4, 4), (2, 1)).flatten()
    tensor([ 3.5000, 11.5000])
    """
    return _adaptive("adaptive_avg_pool2d", input, output_size, 2, _mean)


def adaptive_max_pool1d(input, output_size, return_indices: bool = False):  # noqa: A002
    """Maximum over `output_size` windows of the last dim (and its positions, with
    return_indices)."""
    return _adaptive_max("adaptive_max_pool1d", input, output_size, 1, return_indices)


def adaptive_max_pool2d(input, output_size, return_indices: bool = False):  # noqa: A002
    """Maximum over output_size = (oh, ow) windows of the last two dims (and its flat
    positions in each input plane, with return_indices).

    >>> import graphc
    >>> x = graphc.tensor([[[1.0, 5.0, 2.0], [4.0, 0.0, 6.0]]])
    >>> adaptive_max_pool2d(x, (1, 2), return_indices=True)[1].tolist()
    [[[1, 5]]]
    """
    return _adaptive_max("adaptive_max_pool2d", input, output_size, 2, return_indices)


# ---- transposed and 1-d convolution ---------------------------------------------------------
def _tuple(value, n: int, name: str, op: str) -> tuple:
    if isinstance(value, (tuple, list)):
        value = tuple(value)
        if len(value) == 1:
            value = value * n
        if len(value) == n:
            return tuple(int(v) for v in value)
        raise ArgumentError(f"{op}: expected {name} to be a single integer value or a list of "
                            f"{n} values to match the convolution dimensions, but got "
                            f"{name}={list(value)}")
    return (int(value),) * n


def _add_bias(out, bias, channels: int, spatial: int):
    if bias is None:
        return out
    if bias.ndim != 1 or bias.shape[0] != channels:
        raise ShapeError(f"Given weight with {channels} output channels, expected bias to be "
                         f"1-dimensional with {channels} elements, but got bias of size "
                         f"{format_size(bias.shape)} instead")
    return out + bias.reshape((channels,) + (1,) * spatial)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0,  # noqa: A002
                     output_padding=0, groups: int = 1, dilation=1):
    """Transposed 2-d convolution ("deconvolution"): the gradient of conv2d w.r.t. its input.

    weight is (C_in, C_out / groups, kH, kW); the output size per spatial dim is
    (H - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1.

    >>> import graphc
    >>> conv_transpose2d(graphc.ones(1, 2, 3, 3), graphc.ones(2, 4, 3, 3), stride=2).shape
    graphc.Size([1, 4, 7, 7])
    """
    op = "conv_transpose2d"
    stride = _tuple(stride, 2, "stride", op)
    padding = _tuple(padding, 2, "padding", op)
    output_padding = _tuple(output_padding, 2, "output_padding", op)
    dilation = _tuple(dilation, 2, "dilation", op)
    if input.ndim not in (3, 4):
        raise ShapeError(f"{op}: Expected 3D (unbatched) or 4D (batched) input to "
                         f"conv_transpose2d, but got input of size: {format_size(input.shape)}")
    if weight.ndim != 4:
        raise ShapeError(f"{op}: expected weight to be 4-D [in_channels, out_channels/groups, "
                         f"kH, kW], but got weight of size {format_size(weight.shape)}")
    if any(s <= 0 for s in stride) or any(d <= 0 for d in dilation) or groups <= 0:
        raise ArgumentError(f"{op}: non-positive stride, dilation or groups is not supported")
    if any(p < 0 for p in padding) or any(p < 0 for p in output_padding):
        raise ArgumentError(f"{op}: negative padding is not supported")
    for op_, s, d in zip(output_padding, stride, dilation):
        if op_ >= s and op_ >= d:
            raise ArgumentError(
                f"{op}: output padding must be smaller than either stride or dilation, but got "
                f"output_padding_height: {output_padding[0]} output_padding_width: "
                f"{output_padding[1]} stride_height: {stride[0]} stride_width: {stride[1]} "
                f"dilation_height: {dilation[0]} dilation_width: {dilation[1]}")
    channels = input.shape[-3]
    if channels != weight.shape[0]:
        raise ShapeError(f"{op}: Given transposed=1, weight of size {format_size(weight.shape)}, "
                         f"expected input{format_size(input.shape)} to have "
                         f"{weight.shape[0]} channels, but got {channels} channels instead")
    if weight.shape[0] % groups:
        raise ShapeError(f"{op}: Given groups={groups}, expected weight to be divisible by "
                         f"{groups} at dimension 0, but got weight of size "
                         f"{format_size(weight.shape)} instead")
    kernel = tuple(weight.shape[2:])
    full = tuple((n - 1) * s + d * (k - 1) + 1
                 for n, s, d, k in zip(input.shape[-2:], stride, dilation, kernel))
    out_hw = tuple(f - 2 * p + o for f, p, o in zip(full, padding, output_padding))
    if any(n <= 0 for n in out_hw):
        raise ShapeError(f"{op}: Given input size per channel: {list(input.shape[-2:])}. "
                         f"Calculated output size per channel: {list(out_hw)}. Output size is "
                         "too small")
    if all(o < s for o, s in zip(output_padding, stride)):
        out = _call("conv2d_input_grad", input, weight, stride=stride, padding=padding,
                    dilation=dilation, groups=int(groups), input_hw=out_hw)
    else:  # output_padding >= stride (allowed below dilation): the uncropped result, then crop
        out = _call("conv2d_input_grad", input, weight, stride=stride, padding=(0, 0),
                    dilation=dilation, groups=int(groups), input_hw=full)
        pads = (0, 0) * (input.ndim - 2)
        for p, o in zip(padding, output_padding):
            pads += (-p, o - p)
        out = _call("pad", out, pads=pads, value=0.0)
    return _add_bias(out, bias, weight.shape[1] * groups, 2)


def _conv1d_as_2d(input, weight):  # noqa: A002
    if input.ndim not in (2, 3):
        raise ShapeError(f"conv1d: Expected 2D (unbatched) or 3D (batched) input to conv1d, "
                         f"but got input of size: {format_size(input.shape)}")
    if weight.ndim != 3:
        raise ShapeError(f"conv1d: expected weight to be 3-D, but got weight of size "
                         f"{format_size(weight.shape)}")
    return input.unsqueeze(-2), weight.unsqueeze(-2)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1,  # noqa: A002
           groups: int = 1):
    """1-d convolution over (N, C, L) or (C, L): conv2d over a height of one.

    >>> import graphc
    >>> conv1d(graphc.ones(1, 2, 8), graphc.ones(4, 2, 3), padding=1).shape
    graphc.Size([1, 4, 8])
    """
    x, w = _conv1d_as_2d(input, weight)
    stride = (1,) + _tuple(stride, 1, "stride", "conv1d")
    dilation = (1,) + _tuple(dilation, 1, "dilation", "conv1d")
    if not isinstance(padding, str):
        padding = (0,) + _tuple(padding, 1, "padding", "conv1d")
    out = _conv.conv2d(x, w, None, stride, padding, dilation, groups)
    return _add_bias(out.squeeze(-2), bias, weight.shape[0], 1)


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0,  # noqa: A002
                     output_padding=0, groups: int = 1, dilation=1):
    """Transposed 1-d convolution: conv_transpose2d over a height of one."""
    x, w = _conv1d_as_2d(input, weight)
    out = conv_transpose2d(
        x, w, None, (1,) + _tuple(stride, 1, "stride", "conv_transpose1d"),
        (0,) + _tuple(padding, 1, "padding", "conv_transpose1d"),
        (0,) + _tuple(output_padding, 1, "output_padding", "conv_transpose1d"), groups,
        (1,) + _tuple(dilation, 1, "dilation", "conv_transpose1d"))
    return _add_bias(out.squeeze(-2), bias, weight.shape[1] * groups, 1)


# ---- padding --------------------------------------------------------------------------------
def _crop(x, axis: int, before: int, after: int):
    """x without -before leading and -after trailing entries along axis (negative pads)."""
    start, stop = max(-before, 0), x.shape[axis] - max(-after, 0)
    if start == 0 and stop == x.shape[axis]:
        return x
    return x.narrow(axis, start, stop - start)


def _edge(x, axis: int, start: int, length: int, mode: str):
    """The `length` entries that pad one side: mirrored, repeated or wrapped."""
    if mode == "replicate":
        shape = list(x.shape)
        shape[axis] = length
        return x.narrow(axis, start, 1).broadcast_to(tuple(shape))
    piece = x.narrow(axis, start, length)
    return piece.flip(axis) if mode == "reflect" else piece


def _pad_axis(x, axis: int, before: int, after: int, mode: str):
    """x padded along one axis by slices of itself (reflect, replicate, circular).

    As PyTorch: a negative pad crops, after reflect/replicate padding and before circular."""
    if mode == "circular":
        x = _crop(x, axis, before, after)
    n = x.shape[axis]
    if mode == "reflect" and (before >= n or after >= n):
        raise ArgumentError(f"pad: Argument #4: Padding size should be less than the "
                            f"corresponding input dimension, but got: padding ({before}, "
                            f"{after}) at dimension {axis} of input {format_size(x.shape)}")
    if mode == "circular" and (before > n or after > n):
        raise ArgumentError("pad: Padding value causes wrapping around more than once.")
    if mode == "replicate" and n == 0 and (before > 0 or after > 0):
        raise ArgumentError(f"pad: Expected input to have non-zero size at dimension {axis}")
    starts = {"reflect": (1, n - 1 - after), "replicate": (0, n - 1),
              "circular": (n - before, 0)}[mode]
    pieces = [x]
    if before > 0:
        pieces.insert(0, _edge(x, axis, starts[0], before, mode))
    if after > 0:
        pieces.append(_edge(x, axis, starts[1], after, mode))
    out = _movement.cat(pieces, axis) if len(pieces) > 1 else x
    return out if mode == "circular" else _crop(out, axis, before, after)


def pad(input, pad, mode: str = "constant", value=None):  # noqa: A002
    """Pad the last dims: `pad` is (left, right, top, bottom, ...) as in PyTorch.

    mode 'constant' fills with `value` (negative entries crop); 'reflect' mirrors without the
    edge, 'replicate' repeats the edge, 'circular' wraps around.

    >>> import graphc
    >>> pad(graphc.tensor([[1.0, 2.0, 3.0]]), (2, 1), mode="reflect")
    tensor([[3., 2., 1., 2., 3., 2.]])
    """
    if mode == "constant":
        return _movement.pad(input, pad, mode=mode, value=value)
    if mode not in ("reflect", "replicate", "circular"):
        raise ArgumentError(f"pad: Unrecognised padding mode {mode}")
    pad = tuple(int(p) for p in pad)
    if value is not None and value != 0:
        raise ArgumentError(f"pad: Padding mode \"{mode}\" doesn't take in value argument")
    if len(pad) % 2:
        raise ArgumentError("pad: Padding length must be divisible by 2")
    dims = len(pad) // 2
    if dims > 3 or input.ndim not in (dims + 1, dims + 2):
        raise ArgumentError(
            f"pad: Padding size {len(pad)} is not supported for {input.ndim}D input tensor.\n"
            "Supported combinations for non-constant padding:\n"
            "  - 2D or 3D input: padding size = 2 (pads last dimension)\n"
            "  - 3D or 4D input: padding size = 4 (pads last 2 dimensions)\n"
            "  - 4D or 5D input: padding size = 6 (pads last 3 dimensions)")
    out = input
    for k in range(dims):
        out = _pad_axis(out, input.ndim - 1 - k, pad[2 * k], pad[2 * k + 1], mode)
    return out


# ---- interpolation --------------------------------------------------------------------------
_MODES = ("nearest", "linear", "bilinear", "bicubic", "trilinear", "area", "nearest-exact")
_SPATIAL = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}


def _output_sizes(input, size, scale_factor, dims: int):  # noqa: A002
    """(output sizes, scales used for the source index or None) as PyTorch's interpolate."""
    if size is not None and scale_factor is not None:
        raise ArgumentError("only one of size or scale_factor should be defined")
    if size is not None:
        sizes = tuple(size) if isinstance(size, (tuple, list)) else (size,) * dims
        if len(sizes) != dims:
            raise ArgumentError(
                f"Input and output must have the same number of spatial dimensions, but got "
                f"input with spatial dimensions of {list(input.shape[2:])} and output size of "
                f"{size}. Please provide input tensor in (N, C, d1, d2, ...,dK) format "
                "and output size in (o1, o2, ...,oK) format.")
        return tuple(int(s) for s in sizes), (None,) * dims
    if scale_factor is None:
        raise ArgumentError("either size or scale_factor should be defined")
    scales = (tuple(scale_factor) if isinstance(scale_factor, (tuple, list))
              else (scale_factor,) * dims)
    if len(scales) != dims:
        raise ArgumentError(
            f"Input and scale_factor must have the same number of spatial dimensions, but got "
            f"input with spatial dimensions of {list(input.shape[2:])} and scale_factor of "
            f"shape {scale_factor}. Please provide input tensor in (N, C, d1, d2, ...,dK) "
            "format and scale_factor in (s1, s2, ...,sK) format.")
    sizes = tuple(int(math.floor(n * float(s))) for n, s in zip(input.shape[2:], scales))
    return sizes, tuple(float(s) for s in scales)


def _nearest_axis(x, axis: int, out: int, scale, exact: bool):
    n = x.shape[axis]
    if out == n and scale is None:
        return x
    # PyTorch computes the source index in float32: scale = 1/scale_factor or in/out.
    ratio = np.float32(1.0 / scale) if scale is not None and scale > 0 else \
        np.float32(n) / np.float32(out)
    dst = np.arange(out, dtype=np.float32)
    src = np.floor((dst + np.float32(0.5)) * ratio) if exact else np.floor(dst * ratio)
    index = np.minimum(src.astype(np.int64), n - 1)
    return _gather.index_select(x, axis, _make_tensor(index))


def _source_position(n: int, out: int, scale, align_corners: bool, cubic: bool):
    """Where each of `out` outputs samples an axis of `n` inputs (PyTorch's
    area_pixel_compute_source_index): corners aligned, or pixel centres scaled by
    1/scale_factor (or n/out), clamped at 0 except for cubic."""
    dst = np.arange(out, dtype=np.float64)
    if align_corners:
        return dst * ((n - 1) / (out - 1)) if out > 1 else np.zeros(out)
    ratio = 1.0 / scale if scale is not None and scale > 0 else n / out
    src = (dst + 0.5) * ratio - 0.5
    return src if cubic else np.maximum(src, 0.0)


def _resample(x, axis: int, taps):
    """sum over (index, weight) taps of x's slices at `index` along `axis`, times `weight`
    (one weight per output position)."""
    result = None
    for index, weight in taps:
        shape = (len(weight),) + (1,) * (x.ndim - 1 - axis)
        w = _make_tensor(np.asarray(weight, dtype=x.dtype.np).reshape(shape), dtype=x.dtype)
        term = _gather.index_select(x, axis, _make_tensor(index)) * w
        result = term if result is None else result + term
    return result


def _linear_axis(x, axis: int, out: int, scale, align_corners: bool):
    n = x.shape[axis]
    if out == n and (scale is None or align_corners):
        return x
    src = _source_position(n, out, scale, align_corners, cubic=False)
    lo = np.minimum(np.floor(src).astype(np.int64), n - 1)
    frac = (src - lo).astype(x.dtype.np)
    return _resample(x, axis, [(lo, 1 - frac), (np.minimum(lo + 1, n - 1), frac)])


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    """Keys' cubic convolution weights (A = -0.75, PyTorch's) of the 4 taps at offsets
    -1, 0, 1, 2 around a source position with fraction `t`."""
    a = -0.75

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _cubic_axis(x, axis: int, out: int, scale, align_corners: bool):
    """Bicubic resampling along one axis: 4 taps per output, indices clamped at the borders."""
    n = x.shape[axis]
    if out == n and (scale is None or align_corners):
        return x
    src = _source_position(n, out, scale, align_corners, cubic=True)
    base = np.floor(src).astype(np.int64)
    return _resample(x, axis, [(np.clip(base - 1 + tap, 0, n - 1), weight)
                               for tap, weight in enumerate(_cubic_weights(src - base))])


def interpolate(input, size=None, scale_factor=None, mode: str = "nearest",  # noqa: A002
                align_corners=None, recompute_scale_factor=None, antialias: bool = False):
    """Resize the spatial dims (all dims after the first two) of an (N, C, ...) input.

    Modes: 'nearest', 'nearest-exact' (any number of spatial dims), 'linear' (3-d input),
    'bilinear' and 'bicubic' (4-d input), 'trilinear' (5-d input), each with or without
    align_corners, and 'area' (adaptive average pooling). Separable: one axis at a time.

    >>> import graphc
    >>> interpolate(graphc.ones(1, 1, 2, 2), scale_factor=2).shape
    graphc.Size([1, 1, 4, 4])
    """
    if mode not in _MODES:
        raise ArgumentError(f"interpolate: mode {mode!r} is not supported by graphc yet; "
                            f"supported: {', '.join(_MODES)}")
    if antialias:
        raise ArgumentError("interpolate: antialias=True is not supported by graphc yet")
    if mode in ("nearest", "area", "nearest-exact"):
        if align_corners is not None:
            raise ArgumentError("align_corners option can only be set with the interpolating "
                                "modes: linear | bilinear | bicubic | trilinear")
    elif align_corners is None:
        align_corners = False
    dims = input.ndim - 2
    if dims < 1:
        raise ShapeError(f"interpolate: expected an (N, C, ...) input with at least one "
                         f"spatial dim, got {format_size(input.shape)}")
    if mode in _SPATIAL and _SPATIAL[mode] != dims:
        want = _SPATIAL[mode] + 2
        raise ArgumentError(f"Got {input.ndim}D input, but {mode} mode needs {want}D input")
    sizes, scales = _output_sizes(input, size, scale_factor, dims)
    if recompute_scale_factor or align_corners:
        scales = (None,) * dims
    if mode == "area":
        return _adaptive("adaptive_avg_pool", input, sizes, dims, _mean)
    out = input
    for k, (n_out, scale) in enumerate(zip(sizes, scales)):
        axis = 2 + k
        if mode in ("nearest", "nearest-exact"):
            out = _nearest_axis(out, axis, n_out, scale, mode == "nearest-exact")
        elif mode == "bicubic":
            out = _cubic_axis(out, axis, n_out, scale, align_corners)
        else:
            out = _linear_axis(out, axis, n_out, scale, align_corners)
    return out


def upsample(input, size=None, scale_factor=None, mode: str = "nearest",  # noqa: A002
             align_corners=None):
    """Deprecated alias of interpolate (as torch.nn.functional.upsample)."""
    warnings.warn("`nn.functional.upsample` is deprecated. Use `nn.functional.interpolate` "
                  "instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode, align_corners)


__all__ = [
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_max_pool1d", "adaptive_max_pool2d",
    "conv1d", "conv_transpose1d", "conv_transpose2d", "dropout1d", "dropout2d", "elu", "elu_",
    "hardsigmoid", "hardswish", "hardtanh", "hardtanh_", "interpolate", "mish", "pad", "prelu",
    "relu6", "silu", "softplus", "upsample",
]
