"""OpInfo entries for issue 12's nn composites (graphc.nn.functional, functional_vision,
graphc.utils.composites): normalisation and attention, vision (1-d and transposed convolution,
interpolation, adaptive pooling, padding modes, activations) and losses.

Each is a decomposition into registry primitives, so these entries check its forward against a
float64 numpy reference and PyTorch, its gradient, its error inputs (PyTorch's class and
wording), and, through tests/compile_opinfo.py, its traced and compiled form. Already covered
elsewhere: softmax, log_softmax, cross_entropy, mse_loss, binary_cross_entropy_with_logits
(nn_ops.py), gelu, leaky_relu (elementwise.py) and constant pad (movement.py)."""

from __future__ import annotations

import re

import numpy as np

import graphc
import graphc.nn.functional as F
from graphc.errors import ArgumentError
from tests.opinfo import ErrorInput, OpInfo, Sample, arr, away_from


def _F(name):
    def fn(*args, **kwargs):
        import torch.nn.functional as tF

        return getattr(tF, name)(*args, **kwargs)

    fn.__name__ = f"torch_F_{name}"
    return fn


def _torch(name):
    def fn(*args, **kwargs):
        import torch

        return getattr(torch, name)(*args, **kwargs)

    fn.__name__ = f"torch_{name}"
    return fn


def _err(args, error, message, **kwargs):
    return ErrorInput(Sample(tuple(args), kwargs), error, re.escape(message))


def _reduce(loss, reduction):
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.mean()


# ---- normalisation and attention -------------------------------------------------------------
def _np_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    out = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)
    out = out * weight if weight is not None else out
    return out + bias if bias is not None else out


def _np_rms_norm(x, normalized_shape, weight=None, eps=None):
    eps = np.finfo(np.float32).eps if eps is None else eps
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    out = x / np.sqrt((x * x).mean(axes, keepdims=True) + eps)
    return out * weight if weight is not None else out


def _np_group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    g = x.reshape(x.shape[0], num_groups, -1)
    out = ((g - g.mean(2, keepdims=True)) / np.sqrt(g.var(2, keepdims=True) + eps))
    out = out.reshape(x.shape)
    per_channel = (1, -1) + (1,) * (x.ndim - 2)
    out = out * weight.reshape(per_channel) if weight is not None else out
    return out + bias.reshape(per_channel) if bias is not None else out


def _np_sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if is_causal:
        attn_mask = np.tril(np.ones(s.shape[-2:], dtype=bool))
    if attn_mask is not None and attn_mask.dtype == bool:
        s = np.where(attn_mask, s, -np.inf)
    elif attn_mask is not None:
        s = s + attn_mask
    w = np.exp(s - s.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True) @ v


def _layer_norm_samples(rng):
    return [Sample((arr(rng, 3, 5), (5,)), desc="default"),
            Sample((arr(rng, 2, 3, 4), (3, 4), arr(rng, 3, 4), arr(rng, 3, 4)),
                   {"eps": 1e-3}, desc="2 dims, affine, eps")]


def _rms_norm_samples(rng):
    return [Sample((arr(rng, 3, 5), (5,)), desc="default eps"),
            Sample((arr(rng, 2, 3, 4), [3, 4], arr(rng, 3, 4)), {"eps": 1e-4},
                   desc="2 dims, weight, eps")]


def _group_norm_samples(rng):
    return [Sample((arr(rng, 2, 6, 3), 3), desc="no affine"),
            Sample((arr(rng, 2, 4, 2, 3), 2, arr(rng, 4), arr(rng, 4)), {"eps": 1e-3},
                   desc="4-d, affine")]


def _sdpa_samples(rng):
    bool_mask = rng.uniform(size=(3, 4)) < 0.6
    bool_mask[:, 0] = True  # no query row is masked entirely
    return [Sample((arr(rng, 2, 3, 4), arr(rng, 2, 4, 4), arr(rng, 2, 4, 5)), desc="default"),
            Sample((arr(rng, 1, 2, 3, 4), arr(rng, 1, 2, 4, 4), arr(rng, 1, 2, 4, 3), bool_mask),
                   desc="bool mask"),
            Sample((arr(rng, 2, 3, 4), arr(rng, 2, 3, 4), arr(rng, 2, 3, 4), arr(rng, 3, 3)),
                   {"scale": 0.3}, desc="float mask, scale"),
            Sample((arr(rng, 2, 4, 4), arr(rng, 2, 4, 4), arr(rng, 2, 4, 4)),
                   {"is_causal": True}, desc="is_causal")]


def _norm_errors(rng):
    return [_err([arr(rng, 3, 4), (5,)], RuntimeError,
                 "Given normalized_shape=[5], expected input with shape [*, 5], but got input "
                 "of size[3, 4]")]


def _rms_norm_errors(rng):
    return [_err([arr(rng, 3, 4), (5,)], RuntimeError,
                 "Given normalized_shape=[5], expected input with shape [*5], but got input "
                 "of size[3, 4]")]


def _group_norm_errors(rng):
    return [_err([arr(rng, 2, 6, 3), 4], RuntimeError,
                 "Expected number of channels in input to be divisible by num_groups, but got "
                 "input of shape [2, 6, 3] and num_groups=4"),
            _err([arr(rng, 6), 2], RuntimeError,
                 "Expected at least 2 dimensions for input tensor but received 1")]


OP_INFOS: list[OpInfo] = [
    OpInfo("layer_norm", F.layer_norm, _np_layer_norm, _layer_norm_samples,
           ("reduce_mean", "rsqrt"), torch_fn=_F("layer_norm"), error_inputs=_norm_errors),
    OpInfo("rms_norm", F.rms_norm, _np_rms_norm, _rms_norm_samples, ("reduce_mean", "rsqrt"),
           torch_fn=_F("rms_norm"), error_inputs=_rms_norm_errors),
    OpInfo("group_norm", F.group_norm, _np_group_norm, _group_norm_samples,
           ("reshape", "reduce_mean", "rsqrt"), torch_fn=_F("group_norm"),
           error_inputs=_group_norm_errors),
    OpInfo("scaled_dot_product_attention", F.scaled_dot_product_attention, _np_sdpa,
           _sdpa_samples, ("matmul", "softmax", "where"),
           torch_fn=_F("scaled_dot_product_attention")),
]


# ---- einsum, tril/triu, masked_fill, cumsum, topk --------------------------------------------
def _einsum_samples(rng):
    return [Sample(("ij,jk->ik", arr(rng, 3, 4), arr(rng, 4, 2)), desc="matmul"),
            Sample(("bij,bkj->bik", arr(rng, 2, 3, 4), arr(rng, 2, 5, 4)), desc="batched"),
            Sample(("...ij,jk", arr(rng, 2, 3, 4), arr(rng, 4, 2)), desc="ellipsis, implicit"),
            Sample(("ii->i", arr(rng, 3, 3)), desc="diagonal"),
            Sample(("i,j,j->i", arr(rng, 3), arr(rng, 4), arr(rng, 4)), desc="three operands")]


def _einsum_errors(rng):
    x = arr(rng, 3, 4)
    # PyTorch raises RuntimeError for the operand count; graphc an ArgumentError (a ValueError)
    return [_err(["ij,jk->ik", x], ArgumentError,
                 "einsum(): fewer operands were provided than specified in the equation"),
            _err(["ijk->ij", x], RuntimeError,
                 "einsum(): the number of subscripts in the equation (3) does not match the "
                 "number of dimensions (2) for operand 0 and no ellipsis was given"),
            _err(["ii->i", x], RuntimeError,
                 "einsum(): subscript i is repeated for operand 0 but the sizes don't match, "
                 "4 != 3")]


def _triangle_samples(rng):
    return [Sample((arr(rng, 3, 4),), desc="default"),
            Sample((arr(rng, 2, 4, 3), 1), desc="batched, diagonal 1"),
            Sample((arr(rng, 3, 5), -2), desc="diagonal -2")]


def _triangle_errors(name):
    def errors(rng):
        return [_err([arr(rng, 3)], RuntimeError,
                     f"{name}: input tensor must have at least 2 dimensions")]

    return errors


def _np_masked_fill(x, mask, value):
    return np.where(mask, value, x)


def _masked_fill_samples(rng):
    return [Sample((arr(rng, 3, 4), rng.uniform(size=(3, 4)) < 0.5, -1.5), desc="scalar"),
            Sample((arr(rng, 2, 3, 4), rng.uniform(size=(4,)) < 0.5, arr(rng)),
                   desc="broadcast mask, 0-d tensor value")]


def _masked_fill_errors(rng):
    x = arr(rng, 3, 4)
    return [_err([x, arr(rng, 3, 4), 1.0], RuntimeError,
                 "masked_fill_ only supports boolean masks, but got mask with dtype float"),
            _err([x, np.ones((3, 4), bool), arr(rng, 2)], RuntimeError,
                 "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                 "1 dimension(s).")]


def _np_cumsum(x, dim, dtype=None):
    return np.cumsum(x, axis=dim)


def _cumsum_samples(rng):
    return [Sample((arr(rng, 3, 5), 1), desc="dim 1"),
            Sample((arr(rng, 6, 2), 0), desc="dim 0"),
            Sample((arr(rng, 2, 9, 1), -2), desc="dim -2, length not a power of 2")]


def _cumsum_errors(rng):
    return [_err([arr(rng, 3, 4), 2], IndexError,
                 "Dimension out of range (expected to be in range of [-2, 1], but got 2)")]


def _np_topk(x, k, dim=-1, largest=True):
    order = np.argsort(-x if largest else x, axis=dim, kind="stable")
    index = np.take(order, np.arange(k), axis=dim)
    return np.take_along_axis(x, index, axis=dim), index


def _np_topk_values(x, k, dim=-1, largest=True):
    return _np_topk(x, k, dim, largest)[0]


def _np_topk_indices(x, k, dim=-1, largest=True):
    return _np_topk(x, k, dim, largest)[1]


def _topk_values(x, k, dim=-1, largest=True):
    return graphc.topk(x, k, dim, largest).values


def _topk_indices(x, k, dim=-1, largest=True):
    return graphc.topk(x, k, dim, largest).indices


def _torch_topk_values(x, k, dim=-1, largest=True):
    import torch

    return torch.topk(x, k, dim, largest).values


def _torch_topk_indices(x, k, dim=-1, largest=True):
    import torch

    return torch.topk(x, k, dim, largest).indices


def _topk_samples(rng):  # distinct values: the order of ties is PyTorch's to choose
    return [Sample((away_from(rng, 3, 5, points=()), 2), desc="k=2"),
            Sample((away_from(rng, 4, 3, points=()), 3, 0), desc="dim 0, k = n"),
            Sample((away_from(rng, 2, 6, points=()), 2, 1, False), desc="smallest")]


def _topk_errors(rng):
    # PyTorch raises RuntimeError for k; graphc an ArgumentError (a ValueError)
    return [_err([arr(rng, 3, 4), 5], ArgumentError, "selected index k out of range"),
            _err([arr(rng, 3, 4), 2, 3], IndexError,
                 "Dimension out of range (expected to be in range of [-2, 1], but got 3)")]


OP_INFOS += [
    OpInfo("einsum", graphc.einsum, np.einsum, _einsum_samples,
           ("matmul", "permute", "reshape", "reduce_sum"), torch_fn=_torch("einsum"),
           error_inputs=_einsum_errors),
    OpInfo("tril", graphc.tril, np.tril, _triangle_samples, ("arange", "where"),
           torch_fn=_torch("tril"), error_inputs=_triangle_errors("tril")),
    OpInfo("triu", graphc.triu, np.triu, _triangle_samples, ("arange", "where"),
           torch_fn=_torch("triu"), error_inputs=_triangle_errors("triu")),
    OpInfo("masked_fill", graphc.masked_fill, _np_masked_fill, _masked_fill_samples,
           ("where", "cast"), torch_fn=_torch("masked_fill"), error_inputs=_masked_fill_errors),
    OpInfo("cumsum", graphc.cumsum, _np_cumsum, _cumsum_samples, ("pad", "slice", "add"),
           torch_fn=_torch("cumsum"), error_inputs=_cumsum_errors),
    OpInfo("topk", _topk_values, _np_topk_values, _topk_samples, ("gather", "argmax"),
           torch_fn=_torch_topk_values, error_inputs=_topk_errors),
    OpInfo("topk_indices", _topk_indices, _np_topk_indices, _topk_samples,
           ("argmax", "argmin", "where"), torch_fn=_torch_topk_indices, differentiable=False,
           exact=True),
]
