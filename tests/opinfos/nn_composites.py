"""OpInfo entries for issue 12's nn composites (graphc.nn.functional, graphc.utils.composites):
normalisation and attention, einsum/tril/triu/masked_fill/cumsum/topk, and losses; the vision
composites are in tests/opinfos/nn_vision.py, on the helpers at the top of this module.

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
from tests.opinfo import ErrorInput, OpInfo, Sample, arr, away_from, positive


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


def _kinked(rng, *shape, low=-4.0, high=4.0, kinks=()):
    """Random values at least 0.1 from each kink (where the gradient jumps)."""
    x = rng.uniform(low, high, size=shape)
    for k in kinks:
        x = np.where(np.abs(x - k) < 0.1, x + 0.2 * np.sign(x - k + 1e-12), x)
    return x.astype(np.float32)


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


def _sdpa_errors(rng):
    q = arr(rng, 1, 4, 3, 2)
    return [_err([q, arr(rng, 1, 3, 3, 2), arr(rng, 1, 3, 3, 2)], RuntimeError,
                 "Number of heads in key and value must divide the number of heads in ",
                 enable_gqa=True),
            _err([q, q, q, np.ones((3, 3), np.int64)], RuntimeError,
                 "Expected attn_mask dtype to be bool or float or to match query dtype, but got "
                 "attn_mask.dtype: long int and  query.dtype: float instead.")]


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
           torch_fn=_F("scaled_dot_product_attention"), error_inputs=_sdpa_errors),
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


# ---- losses ----------------------------------------------------------------------------------
def _np_bce(x, t, weight=None, reduction="mean"):
    loss = -(t * np.maximum(np.log(x), -100) + (1 - t) * np.maximum(np.log1p(-x), -100))
    return _reduce(loss * weight if weight is not None else loss, reduction)


def _np_l1(x, t, reduction="mean"):
    return _reduce(np.abs(x - t), reduction)


def _np_smooth_l1(x, t, reduction="mean", beta=1.0):
    d = np.abs(x - t)
    loss = d if beta == 0 else np.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)
    return _reduce(loss, reduction)


def _np_huber(x, t, reduction="mean", delta=1.0):
    d = np.abs(x - t)
    return _reduce(np.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), reduction)


def _np_kl_div(x, t, reduction="mean", log_target=False):
    if log_target:
        loss = np.exp(t) * (t - x)
    else:
        loss = np.where(t > 0, t * np.log(np.where(t > 0, t, 1)), 0) - t * x
    return loss.sum() / x.shape[0] if reduction == "batchmean" else _reduce(loss, reduction)


def _unit(rng, *shape):
    return rng.uniform(0.05, 0.95, size=shape).astype(np.float32)


def _bce_samples(rng):
    return [Sample((_unit(rng, 3, 4), _unit(rng, 3, 4)), desc="mean"),
            Sample((_unit(rng, 3, 4), _unit(rng, 3, 4), positive(rng, 4)), {"reduction": "sum"},
                   grad_args=(0, 1), desc="sum, weight"),  # weight: no grad in PyTorch
            Sample((_unit(rng, 5), np.array([0, 1, 1, 0, 1], np.float32)), {"reduction": "none"},
                   desc="none, hard targets")]


def _pair_samples(kwargs=()):
    """One sample per reduction (none, mean, sum) with each of `kwargs` in turn; the pairs are
    kept 0.1 from |d| = 0 and from the kink each keyword sets."""
    def samples(rng):
        out = []
        extra = [dict(kw) for kw in kwargs] or [{}]
        for k, reduction in enumerate(("none", "mean", "sum")):
            kw = extra[k % len(extra)]
            kink = next(iter(kw.values()), 1.0)
            t = arr(rng, 3, 4)
            d = _kinked(rng, 3, 4, low=-3, high=3, kinks=(0, kink, -kink))
            out.append(Sample((t + d, t), {"reduction": reduction, **kw},
                              desc=", ".join([reduction] + [f"{a}={b}" for a, b in kw.items()])))
        return out

    return samples


def _kl_samples(rng):
    t = _unit(rng, 3, 4)
    t[0, 1] = 0.0  # a zero target contributes 0 (not nan): no gradient check for it there
    return [Sample((np.log(_unit(rng, 3, 4)), t), {"reduction": "batchmean"}, grad_args=(0,),
                   desc="batchmean, a zero target"),
            Sample((np.log(_unit(rng, 3, 4)), _unit(rng, 3, 4)), {"reduction": "sum"},
                   desc="sum"),
            Sample((np.log(_unit(rng, 3, 4)), np.log(_unit(rng, 3, 4))),
                   {"reduction": "none", "log_target": True}, desc="none, log_target"),
            Sample((np.log(_unit(rng, 2, 3)), np.log(_unit(rng, 2, 3))),
                   {"log_target": True}, desc="mean (warns), log_target")]


def _bad_reduction(rng):
    x = _unit(rng, 4, 5)  # in (0, 1): binary_cross_entropy checks its range first
    return _err([x, x], ValueError, "bad is not a valid value for reduction", reduction="bad")


def _bce_errors(rng):
    # PyTorch raises RuntimeError for the range; graphc an ArgumentError (a ValueError)
    return [_err([_unit(rng, 4, 5), _unit(rng, 4, 4)], ValueError,
                 "Using a target size (graphc.Size([4, 4])) that is different to the input "
                 "size (graphc.Size([4, 5])) is deprecated. Please ensure they have the same "
                 "size."),
            _err([3 * _unit(rng, 4, 5), _unit(rng, 4, 5)], ArgumentError,
                 "all elements of input should be between 0 and 1"),
            _bad_reduction(rng)]


def _smooth_l1_errors(rng):
    x = arr(rng, 4, 5)
    # PyTorch raises RuntimeError for beta and delta; graphc an ArgumentError (a ValueError)
    return [_err([x, x], ArgumentError, "smooth_l1_loss does not support negative values for "
                 "beta.", beta=-1.0), _bad_reduction(rng)]


def _huber_errors(rng):
    x = arr(rng, 4, 5)
    return [_err([x, x], ArgumentError, "huber_loss does not support non-positive values for "
                 "delta.", delta=0.0), _bad_reduction(rng)]


def _reduction_errors(rng):
    return [_bad_reduction(rng)]


OP_INFOS += [
    OpInfo("binary_cross_entropy", F.binary_cross_entropy, _np_bce, _bce_samples,
           ("log", "clamp", "mul"), torch_fn=_F("binary_cross_entropy"),
           error_inputs=_bce_errors),
    OpInfo("l1_loss", F.l1_loss, _np_l1, _pair_samples(), ("abs", "reduce_mean", "reduce_sum"),
           torch_fn=_F("l1_loss"), error_inputs=_reduction_errors),
    OpInfo("smooth_l1_loss", F.smooth_l1_loss, _np_smooth_l1,
           _pair_samples(({"beta": 0.5}, {"beta": 1.0}, {"beta": 0.0})), ("abs", "where"),
           torch_fn=_F("smooth_l1_loss"), error_inputs=_smooth_l1_errors),
    OpInfo("huber_loss", F.huber_loss, _np_huber,
           _pair_samples(({"delta": 0.5}, {"delta": 1.0}, {"delta": 2.0})), ("abs", "where"),
           torch_fn=_F("huber_loss"), error_inputs=_huber_errors),
    OpInfo("kl_div", F.kl_div, _np_kl_div, _kl_samples, ("log", "exp", "where"),
           torch_fn=_F("kl_div"), error_inputs=_reduction_errors),
]
