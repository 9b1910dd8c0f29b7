"""`graphc.nn.functional`: PyTorch's `torch.nn.functional` signatures over graphc's ops.

Each function normalises PyTorch's arguments (legacy `size_average` / `reduce` flags,
`inplace=True`, defaults) and forwards to the op modules, where the shape rules, kernels and
gradients live (graphc.ops.linalg, conv, pool, nn_ops, random, movement, elementwise). The
composites (layer_norm, rms_norm, group_norm, scaled_dot_product_attention, and the losses
binary_cross_entropy, l1, smooth_l1, huber, kl_div) are written here as decompositions into
those ops, so they trace and compile on every backend with no lowering of their own.

>>> import graphc
>>> import graphc.nn.functional as F
>>> F.relu(graphc.tensor([-1.0, 2.0]))
tensor([0., 2.])
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from graphc.autograd.function import Function
from graphc.autograd.grad_mode import no_grad
from graphc.dispatch import current_tracer
from graphc.errors import ArgumentError, DTypeError, IndexOutOfRangeError, ShapeError, where
from graphc.ops import conv as _conv
from graphc.ops import elementwise as _elementwise
from graphc.ops import linalg as _linalg
from graphc.ops import movement as _movement
from graphc.ops import nn_ops as _nn_ops
from graphc.ops import pool as _pool
from graphc.ops import random as _random
from graphc.ops import sources as _sources
from graphc.ops.grad_utils import size_value
from graphc.ops.registry import call as _call
from graphc.ops.registry import inplace as _inplace
from graphc.ops.shapes import broadcast_shapes as _broadcast_shapes
from graphc.utils import composites as _composites


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


def _normalized_dims(name: str, input, normalized_shape) -> tuple[int, ...]:  # noqa: A002
    """The trailing dims `normalized_shape` names, checked against input's shape."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or tuple(input.shape[input.ndim - k:]) != shape or input.ndim < k:
        # PyTorch's wording, its rms_norm's "[*5]" (no comma) included
        expected = ("" if name == "rms_norm" else ", ") + ", ".join(str(n) for n in shape)
        raise ShapeError(f"{name}: Given normalized_shape={list(shape)}, expected input with "
                         f"shape [*{expected}], but got input of size{list(input.shape)}")
    return tuple(range(input.ndim - k, input.ndim))


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):  # noqa: A002
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing `normalized_shape` dims
    (biased variance, as PyTorch).

    >>> import graphc
    >>> graphc.nn.functional.layer_norm(graphc.tensor([[1.0, 3.0]]), (2,))
    tensor([[-1.0000,  1.0000]])
    """
    dims = _normalized_dims("layer_norm", input, normalized_shape)
    centred = input - input.mean(dims, keepdim=True)
    var = (centred * centred).mean(dims, keepdim=True)
    out = centred * _elementwise.rsqrt(var + eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def rms_norm(input, normalized_shape, weight=None, eps=None):  # noqa: A002
    """x / sqrt(mean(x^2) + eps) * weight over the trailing dims; eps defaults to the dtype's
    machine epsilon, as PyTorch."""
    dims = _normalized_dims("rms_norm", input, normalized_shape)
    if eps is None:
        eps = float(np.finfo(input.dtype.np).eps)
    out = input * _elementwise.rsqrt((input * input).mean(dims, keepdim=True) + eps)
    return out * weight if weight is not None else out


def group_norm(input, num_groups: int, weight=None, bias=None,  # noqa: A002
               eps: float = 1e-5):
    """Normalise (N, C, *) over each group of C // num_groups channels and the spatial dims,
    then scale and shift per channel."""
    if input.ndim < 2:
        raise ShapeError(f"group_norm: Expected at least 2 dimensions for input tensor but "
                         f"received {input.ndim}")
    n, c = input.shape[0], input.shape[1]
    if c % num_groups != 0:
        raise ShapeError(f"group_norm: Expected number of channels in input to be divisible "
                         f"by num_groups, but got input of shape {list(input.shape)} and "
                         f"num_groups={num_groups}")
    grouped = input.reshape(n, num_groups, -1)
    centred = grouped - grouped.mean(2, keepdim=True)
    var = (centred * centred).mean(2, keepdim=True)
    out = (centred * _elementwise.rsqrt(var + eps)).reshape(tuple(input.shape))
    per_channel = (1, c) + (1,) * (input.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(per_channel)
    if bias is not None:
        out = out + bias.reshape(per_channel)
    return out


# ---- attention ------------------------------------------------------------------------------
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale=None, enable_gqa: bool = False):
    """softmax(q @ k^T * scale + mask) @ v over (..., L, E) queries and (..., S, E) keys, as
    PyTorch's math reference: a bool mask keeps where True (traced as an added 0 / -inf, so
    it fuses as a float mask does), a float mask is added, `is_causal` keeps the lower
    triangle, and with a mask too hides what either hides where PyTorch 2.13 CPU accepts both
    (`_causal_mask_combines`); dropout on the weights when dropout_p > 0. A query row whose
    every key is hidden gives 0 and no gradient, as PyTorch 2.13 CPU (`_unhide_empty_rows`).
    A mask broadcasts to the scores [..., L, S] and may not enlarge them (PyTorch adds it in
    place: RuntimeError, `_enlarges`).

    >>> import graphc
    >>> q = graphc.ones(1, 2, 3, 4)
    >>> graphc.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).shape
    graphc.Size([1, 2, 3, 4])
    """
    if attn_mask is not None and attn_mask.ndim < 2 and _takes_flash_kernel(
            query, key, value, attn_mask, dropout_p, enable_gqa) and not _empty(query, key, value):
        raise IndexOutOfRangeError(
            f"{where('scaled_dot_product_attention')}: "
            + ("Dimension specified as -2 but tensor has no dimensions" if attn_mask.ndim == 0
               else "Dimension out of range (expected to be in range of [-1, 0], but got -2)")
            + f" (PyTorch 2.13's wording): attn_mask is {attn_mask.ndim}-d, and for 4-d query, "
            "key and value with dropout_p=0 PyTorch's CPU kernel reads its dim -2, the "
            "queries'; give it one: attn_mask.reshape(1, -1) applies to every query")
    if is_causal and attn_mask is not None and not _causal_mask_combines(
            query, key, value, attn_mask, dropout_p, enable_gqa):
        raise ShapeError("_scaled_dot_product_attention: Explicit attn_mask should not be set "
                         f"when is_causal=True ({where('scaled_dot_product_attention')}; "
                         "PyTorch 2.13's wording, whole: it combines the two only for 4-d "
                         "query, key and value of one batch and head size, a 2-d or 4-d mask "
                         "that needs no grad and dropout_p=0; fold the triangle into attn_mask "
                         "instead)")
    if attn_mask is not None and attn_mask.dtype.name not in ("bool", "float32",
                                                              query.dtype.name):
        raise DTypeError(f"{where('scaled_dot_product_attention')}: Expected attn_mask dtype "
                         f"to be bool or float or to match query dtype, but got attn_mask.dtype: "
                         f"{_C_NAMES.get(attn_mask.dtype.name, attn_mask.dtype.name)} and  "
                         f"query.dtype: {_C_NAMES.get(query.dtype.name, query.dtype.name)} "
                         "instead.")  # PyTorch's wording, its C++ type names and double space
    length, source = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        key, value = _repeat_heads(key, query.shape[-3]), _repeat_heads(value, query.shape[-3])
    scores = _linalg.matmul(query, key.transpose(-2, -1)) * scale
    hidden_rows = None
    if attn_mask is not None and _enlarges(scores, attn_mask):
        if not _empty(query, key, value):
            raise ShapeError(
                f"{where('scaled_dot_product_attention')}: output with shape "
                f"{list(scores.shape)} doesn't match the broadcast shape "
                f"{list(_broadcast_shapes('add', tuple(scores.shape), tuple(attn_mask.shape)))}"
                " (PyTorch 2.13's wording: it adds attn_mask to the scores [..., L, S] in "
                "place, so the mask may not add dims or grow one); give attn_mask the scores' "
                "dims or 1s")
        attn_mask = None  # no queries or keys: PyTorch returns before reading the mask
    if attn_mask is not None:
        if attn_mask.dtype.name == "bool":  # True takes part: 0 added, -inf where False
            # (PyTorch's convert_boolean_attn_mask; added, it fuses as a float mask does)
            attn_mask = _call("full", shape=(), value=0.0, dtype=query.dtype.name).masked_fill(
                attn_mask.logical_not(), -math.inf)
        if not (type(source) is int and source == 0):  # no keys: zeros, as PyTorch's
            attn_mask, hidden_rows = _unhide_empty_rows(attn_mask, is_causal, length, source)
        scores = scores + attn_mask
    if is_causal:  # with a mask too: both hide (PyTorch 2.13's CPU kernel, see above)
        scores = scores.masked_fill(_causal_hide(length, source), -math.inf)
    weights = _nn_ops.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        weights = _random.dropout(weights, dropout_p, True, False)
    out = _linalg.matmul(weights, value)
    return out if hidden_rows is None else out.masked_fill(hidden_rows, 0.0)


def _causal_hide(length: int, source: int):
    """[L, S] bool, True where key j > query i (what is_causal hides)."""
    keep = _composites.tril(_call("full", shape=(length, source), value=True, dtype="bool"))
    return keep.logical_not()


def _unhide_empty_rows(mask, is_causal: bool, length: int, source: int):
    """(mask', hidden): a query row whose every key is hidden (the additive mask -inf at every
    key, with is_causal at every key the triangle leaves) gets output 0 and no gradient in
    PyTorch 2.13 CPU (its flash kernel, and the math kernel's _safe_softmax), where a plain
    softmax of -infs is NaN. `hidden` ([..., L or 1, 1] bool, found on the mask's own shape,
    never the scores') marks those rows; mask' is 0 along them, so their softmax stays finite
    and the chain still fuses into one attention node (graphc.passes.attention), and the
    caller zeroes their output (its gradient then zeroes theirs). A row that q k^T itself
    makes all -inf (infinite inputs) is not caught: it gives NaN, as softmax."""
    seen = mask.masked_fill(_causal_hide(length, source), -math.inf) if is_causal else mask
    hidden = seen.amax(-1, keepdim=True) == -math.inf
    return mask.masked_fill(hidden, 0.0), hidden


def _takes_flash_kernel(query, key, value, attn_mask, dropout_p: float,
                        enable_gqa: bool) -> bool:
    """Whether PyTorch 2.13 (CPU) checks attn_mask's shape for its flash kernel (sdp_utils_cpp's
    checks before check_attn_mask_shape): query, key and value 4-d and not empty, of one
    batch, key and value of one head count (the query's, or with enable_gqa a divisor of
    it), dropout_p 0 and a mask (if any) that needs no grad. That check reads the mask's dim
    -2, so there a mask of fewer than 2 dims raises IndexError, where the math kernel (any
    other case) broadcasts it."""
    if not (query.ndim == key.ndim == value.ndim == 4 and dropout_p == 0.0):
        return False
    if attn_mask is not None and attn_mask.requires_grad:
        return False
    (batch, heads), (kv_batch, kv_heads) = query.shape[:2], key.shape[:2]
    if not (kv_batch == value.shape[0] == batch and value.shape[1] == kv_heads):
        return False
    return kv_heads == heads or (enable_gqa and heads % kv_heads == 0)


def _enlarges(scores, attn_mask) -> bool:
    """Whether attn_mask broadcast with the scores has more dims or a larger one than they
    (static sizes only: a symbolic one is checked by the add's own broadcast rule)."""
    shapes = (tuple(scores.shape), tuple(attn_mask.shape))
    if not all(type(d) is int for shape in shapes for d in shape):
        return False
    return attn_mask.ndim > scores.ndim or any(
        m > s for m, s in zip(reversed(shapes[1]), reversed(shapes[0])))


def _empty(*tensors) -> bool:
    """Whether any has no elements (PyTorch's attention then returns before choosing a
    kernel, so no kernel's check runs)."""
    return any(0 in tuple(t.shape) for t in tensors)


def _causal_mask_combines(query, key, value, attn_mask, dropout_p: float,
                          enable_gqa: bool) -> bool:
    """Whether PyTorch 2.13 (CPU) takes is_causal=True with an attn_mask: its flash kernel
    does, hiding what either hides, where it takes the call (`_takes_flash_kernel`), the
    mask is 2-d or 4-d, broadcast only from size 1, and key and value have the query's head
    size (sdp_utils_cpp's checks); its math kernel, taking every other case, raises
    RuntimeError."""
    if attn_mask.ndim not in (2, 4) or not _takes_flash_kernel(
            query, key, value, attn_mask, dropout_p, enable_gqa):
        return False
    batch, heads, length, size = query.shape
    if not key.shape[-1] == value.shape[-1] == size:
        return False
    wanted = (batch, heads, length, key.shape[2])[4 - attn_mask.ndim:]
    return all(m == 1 or m == w for m, w in zip(attn_mask.shape, wanted))


_C_NAMES = {"float32": "float", "float64": "double", "int64": "long int", "int32": "int"}


def _repeat_heads(t, heads: int):
    """(..., Hkv, S, E) -> (..., heads, S, E), each kv head repeated heads // Hkv times."""
    hkv = t.shape[-3]
    if heads % hkv != 0:
        raise ShapeError(f"{where('scaled_dot_product_attention')}: Number of heads in key and "
                         f"value must divide the number of heads in query ({hkv} does not "
                         f"divide {heads})")
    lead, tail = tuple(t.shape[:-3]), tuple(t.shape[-2:])
    expanded = t.unsqueeze(-3).expand(*lead, hkv, heads // hkv, *tail)
    return expanded.reshape(lead + (heads,) + tail)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type: float = 2.0,  # noqa: A002
              scale_grad_by_freq: bool = False, sparse: bool = False):
    """Rows of `weight` picked by `input`, as torch.nn.functional.embedding.

    max_norm renormalises, in place and without gradient, each referenced row whose
    norm_type-norm exceeds it to that norm (PyTorch's embedding_renorm_, with its 1e-7);
    scale_grad_by_freq divides each row's gradient by how often the batch references it.
    """
    if sparse:
        raise ArgumentError("embedding: sparse=True is not supported by graphc (it has no "
                            "sparse tensors); leave it False")
    if max_norm is not None:
        _renorm_rows(weight, input, float(max_norm), float(norm_type))
    out = _nn_ops.embedding(input, weight, padding_idx=padding_idx)
    if scale_grad_by_freq and out.requires_grad:
        flat = input.reshape(-1)
        counts = _sources.zeros(weight.shape[0], dtype=out.dtype).index_add(
            0, flat, _sources.ones(flat.shape[0], dtype=out.dtype))
        out = _ScaleGradient.apply(out, (1.0 / counts[input]).unsqueeze(-1))
    return out


def _renorm_rows(weight, input, max_norm: float, norm_type: float) -> None:  # noqa: A002
    """weight[i] *= max_norm / (norm + 1e-7) for each referenced row i whose norm exceeds
    max_norm. A row referenced twice is written twice with the same value."""
    with no_grad():
        rows = input.reshape(-1)
        picked = weight[rows]
        norms = picked.norm(norm_type, dim=1, keepdim=True)
        scale = _elementwise.where(norms > max_norm, max_norm / (norms + 1e-7),
                                   _sources.ones_like(norms))
        weight[rows] = picked * scale


class _ScaleGradient(Function):
    """Identity forward; the incoming gradient multiplied by `scale` (scale_grad_by_freq)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(scale)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        (scale,) = ctx.saved_tensors
        return g * scale, None


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


def _reduce(name: str, loss, reduction: str):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ArgumentError(f"{name}: {reduction} is not a valid value for reduction")


def _same_size(name: str, input, target) -> None:  # noqa: A002
    if tuple(target.shape) != tuple(input.shape):
        warnings.warn(f"Using a target size ({_size(target)}) that is different to the input "
                      f"size ({_size(input)}). This will likely lead to incorrect results due "
                      "to broadcasting. Please ensure they have the same size.", UserWarning,
                      stacklevel=3)


def _size(t) -> str:
    return f"graphc.Size({list(t.shape)})"


def _eager(t) -> bool:
    return current_tracer() is None and not t.is_abstract


def binary_cross_entropy(input, target, weight=None, size_average=None,  # noqa: A002
                         reduce=None, reduction: str = "mean"):
    """-(t log x + (1 - t) log(1 - x)), each log clamped at -100 as PyTorch."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):  # a ValueError, as PyTorch's
        raise ArgumentError(f"Using a target size ({_size(target)}) that is different to the "
                         f"input size ({_size(input)}) is deprecated. Please ensure they have "
                         "the same size.")
    if _eager(input) and input.numel() and not bool(((input >= 0) & (input <= 1)).all()):
        raise ArgumentError("all elements of input should be between 0 and 1")
    log_x = _elementwise.clamp(_elementwise.log(input), -100.0, None)
    log_1mx = _elementwise.clamp(_elementwise.log(1 - input), -100.0, None)
    loss = -(target * log_x + (1 - target) * log_1mx)
    if weight is not None:
        loss = loss * weight
    return _reduce("binary_cross_entropy", loss, reduction)


def l1_loss(input, target, size_average=None, reduce=None,  # noqa: A002
            reduction: str = "mean", weight=None):
    """Mean (or sum) of |input - target|."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _same_size("l1_loss", input, target)
    loss = (input - target).abs()
    return _reduce("l1_loss", loss * weight if weight is not None else loss, reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None,  # noqa: A002
                   reduction: str = "mean", beta: float = 1.0):
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (beta = 0 is the L1 loss)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _same_size("smooth_l1_loss", input, target)
    if beta < 0:
        raise ArgumentError("smooth_l1_loss does not support negative values for beta.")
    d = (input - target).abs()
    if beta == 0.0:
        return _reduce("smooth_l1_loss", d, reduction)
    loss = _elementwise.where(d < beta, d * d * (0.5 / beta), d - 0.5 * beta)
    return _reduce("smooth_l1_loss", loss, reduction)


def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0,  # noqa: A002
               weight=None):
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta)."""
    _same_size("huber_loss", input, target)
    if delta <= 0:
        raise ArgumentError("huber_loss does not support non-positive values for delta.")
    d = (input - target).abs()
    loss = _elementwise.where(d < delta, d * d * 0.5, (d - 0.5 * delta) * delta)
    return _reduce("huber_loss", loss * weight if weight is not None else loss, reduction)


def kl_div(input, target, size_average=None, reduce=None,  # noqa: A002
           reduction: str = "mean", log_target: bool = False):
    """KL(target || exp(input)) pointwise: target (log target - input), 0 where target is 0;
    reduction "batchmean" divides the sum by the batch size."""
    if size_average is not None or reduce is not None:
        reduction = _legacy_reduction(size_average, reduce, reduction)
    elif reduction == "mean":
        warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the "
                      "support size.'batchmean' divides only by the batch size, and aligns with "
                      "the KL div math definition.'mean' will be changed to behave the same as "
                      "'batchmean' in the next major release.", UserWarning, stacklevel=2)
    if log_target:
        loss = _elementwise.exp(target) * (target - input)
    else:
        positive = target > 0
        safe = _elementwise.where(positive, target, 1.0)
        loss = _elementwise.where(positive, target * _elementwise.log(safe), 0.0) - target * input
    if reduction == "batchmean":
        return loss.sum() / size_value(input.shape[0], loss.dtype.name) if input.ndim \
            else loss.sum()  # a symbolic batch stays symbolic
    return _reduce("kl_div", loss, reduction)


# ---- shape ----------------------------------------------------------------------------------
def pad(input, pad, mode: str = "constant", value=None):  # noqa: A002
    """Pad the last dims: `pad` is (left, right, top, bottom, ...) as in PyTorch."""
    return _movement.pad(input, pad, mode=mode, value=value)


def flatten(input, start_dim: int = 0, end_dim: int = -1):  # noqa: A002
    return _movement.flatten(input, start_dim, end_dim)


__all__ = [
    "avg_pool2d", "batch_norm", "binary_cross_entropy", "binary_cross_entropy_with_logits",
    "conv2d", "cross_entropy", "dropout", "embedding", "flatten", "gelu", "group_norm",
    "huber_loss", "kl_div", "l1_loss", "layer_norm", "leaky_relu", "linear", "log_softmax",
    "max_pool2d", "mse_loss", "nll_loss", "pad", "relu", "relu_", "rms_norm",
    "scaled_dot_product_attention", "sigmoid", "smooth_l1_loss", "softmax", "tanh",
]
from graphc.nn.functional_vision import *  # noqa: E402,F401,F403  (vision half, issue 12)
