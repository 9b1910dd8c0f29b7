"""OpInfo entries for the 'nn_ops' op group: softmax, losses, batch_norm, embedding."""

from __future__ import annotations

import re

import numpy as np

from graphc.errors import ArgumentError, DTypeError, ShapeError
from graphc.ops import nn_ops
from graphc.ops.registry import call
from tests.opinfo import ErrorInput, OpInfo, Sample, arr


def _F(name):
    def fn(*args, **kwargs):
        import torch.nn.functional as F

        return getattr(F, name)(*args, **kwargs)

    fn.__name__ = f"torch_F_{name}"
    return fn


def _err(args, error, message, **kwargs):
    return ErrorInput(Sample(tuple(args), kwargs), error, re.escape(message))


def _targets(rng, n_classes, *shape, ignore=None):
    t = rng.integers(0, n_classes, size=shape).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    return t


# ---- numpy references (float64) ----------------------------------------------------------------
def _np_log_softmax(x, dim):
    s = x - x.max(axis=dim, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=dim, keepdims=True))


def _np_softmax(x, dim):
    return np.exp(_np_log_softmax(x, dim))


def _np_reduce(loss, reduction):
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.mean()


def _np_nll(x, target, weight=None, ignore_index=-100, reduction="mean"):
    c_dim = 0 if x.ndim == 1 else 1
    n_classes = x.shape[c_dim]
    weight = np.ones(n_classes) if weight is None else weight
    mask = target != ignore_index
    safe = np.where(mask, target, 0)
    if x.ndim == 1:
        picked = x[safe]
    else:
        picked = np.take_along_axis(x, np.expand_dims(safe, 1), axis=1).squeeze(1)
    w = np.where(mask, weight[safe], 0.0)
    loss = -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / w.sum()


def _np_cross_entropy(x, target, weight=None, ignore_index=-100, reduction="mean",
                      label_smoothing=0.0):
    c_dim = 0 if x.ndim == 1 else 1
    n_classes = x.shape[c_dim]
    logp = _np_log_softmax(x, c_dim)
    wshape = [1] * x.ndim
    wshape[c_dim] = n_classes
    wb = 1.0 if weight is None else weight.reshape(wshape)
    if np.issubdtype(target.dtype, np.floating):
        t = target * (1 - label_smoothing) + label_smoothing / n_classes
        per = -(logp * t * wb).sum(axis=c_dim)
        if reduction == "none":
            return per
        return per.sum() if reduction == "sum" else per.sum() / (x.size / n_classes)
    nll = _np_nll(logp, target, weight, ignore_index, reduction)
    smooth = np.where(target == ignore_index, 0.0, -(logp * wb).sum(axis=c_dim))
    if reduction == "mean":
        w = np.ones(n_classes) if weight is None else weight
        mask = target != ignore_index
        smooth = smooth.sum() / np.where(mask, w[np.where(mask, target, 0)], 0.0).sum()
    elif reduction == "sum":
        smooth = smooth.sum()
    return (1 - label_smoothing) * nll + smooth * label_smoothing / n_classes


def _np_mse(x, t, reduction="mean"):
    return _np_reduce((x - t) ** 2, reduction)


def _np_bce_logits(x, t, weight=None, reduction="mean", pos_weight=None):
    log_sig = np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x)))
    if pos_weight is not None:
        log_sig = log_sig * (1 + (pos_weight - 1) * t)
    loss = (1 - t) * x - log_sig
    if weight is not None:
        loss = loss * weight
    return _np_reduce(loss, reduction)


def _np_batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False,
                   momentum=0.1, eps=1e-5):
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if training:
        mean, var = x.mean(axis=axes), x.var(axis=axes)
    else:
        mean, var = running_mean, running_var
    out = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


def _np_embedding(indices, weight, padding_idx=None):
    return weight[indices]


# ---- softmax, log_softmax, log1p ---------------------------------------------------------------
def _softmax_samples(rng):
    return [
        Sample((arr(rng, 3, 4),), {"dim": 1}, desc="rows"),
        Sample((arr(rng, 3, 4),), {"dim": 0}, desc="columns"),
        Sample((arr(rng, 2, 3, 4),), {"dim": -1}, desc="3-d last dim"),
        Sample((arr(rng, 5, low=-50, high=50),), {"dim": 0}, desc="large logits"),
    ]


def _softmax_errors(rng):
    return [
        _err([arr(rng, 3, 4)], ArgumentError,
             "Dimension out of range (expected to be in range of [-2, 1], but got 2)", dim=2),
        _err([np.array([1, 2])], DTypeError, "expected a floating point input", dim=0),
    ]


def _torch_softmax(x, dim):
    import torch

    return torch.softmax(x, dim=dim)


def _torch_log_softmax(x, dim):
    import torch

    return torch.log_softmax(x, dim=dim)


def _torch_log1p(x):
    import torch

    return torch.log1p(x)


def _log1p_samples(rng):
    return [
        Sample((arr(rng, 3, 4, low=-0.9, high=3.0),), desc="3x4"),
        Sample((arr(rng, low=-0.5, high=0.5),), desc="0-d"),
        Sample((np.array([1e-9, -1e-9, 1e-6], dtype=np.float32),), desc="near zero"),
    ]


# ---- nll_loss ------------------------------------------------------------------------------------
def _nll_samples(rng):
    out = []
    for reduction in ("mean", "sum", "none"):
        out.append(Sample((arr(rng, 4, 5), _targets(rng, 5, 4)), {"reduction": reduction},
                          desc=f"(N,C) {reduction}"))
        out.append(Sample((arr(rng, 4, 5), _targets(rng, 5, 4), arr(rng, 5, low=0.2, high=2)),
                          {"reduction": reduction, "ignore_index": 2}, grad_args=(0,),
                          desc=f"weights + ignore_index {reduction}"))
        out.append(Sample((arr(rng, 2, 3, 2, 2), _targets(rng, 3, 2, 2, 2, ignore=-100)),
                          {"reduction": reduction}, desc=f"K-dim {reduction}"))
    out.append(Sample((arr(rng, 5), np.array(3, dtype=np.int64)), desc="unbatched (C,)"))
    out.append(Sample((arr(rng, 5), np.array(1, dtype=np.int64), arr(rng, 5, low=0.2, high=2)),
                      {"reduction": "sum"}, grad_args=(0,), desc="unbatched weighted"))
    return out


def _nll_errors(rng):
    x = arr(rng, 4, 5)
    return [
        _err([x, np.array([0, 1, 7, 2])], IndexError, "Target 7 is out of bounds."),
        _err([x, np.array([0, 1, -3, 2])], IndexError, "Target -3 is out of bounds."),
        _err([x, np.array([0.0, 1.0, 2.0, 2.0], dtype=np.float32)], DTypeError,
             "expected target dtype to be Long, but got Float"),
        _err([x, np.array([0, 1, 2])], ValueError,
             "Expected input batch_size (4) to match target batch_size (3)."),
        _err([x, np.array([0, 1, 2, 1])], ValueError, "foo is not a valid value for reduction",
             reduction="foo"),
        _err([x, np.array([0, 1, 2, 1]), np.ones(3, dtype=np.float32)], ShapeError,
             "weight tensor should be defined either for all 5 classes or no classes but got "
             "weight tensor of shape: [3]"),
        _err([arr(rng, 4, 5, 3), np.zeros((4, 2), dtype=np.int64)], ShapeError,
             "Expected target size [4, 3], got [4, 2]"),
        _err([x, np.zeros((4, 2), dtype=np.int64)], ShapeError,
             "0D or 1D target tensor expected, multi-target not supported"),
    ]


def _nll_backward_op(g, target, weight, ignore_index=-100, reduction="mean", input_shape=()):
    """The backward op on its own (the gradcheck of it is nll_loss's grad-of-grad)."""
    x = call("full", shape=tuple(input_shape), value=0.0, dtype=g.dtype.name)
    _, total_weight = call("nll_loss", x, target, weight, ignore_index=ignore_index,
                           reduction=reduction)
    return call("nll_loss_backward", g, target, weight, total_weight, ignore_index=ignore_index,
                reduction=reduction, input_shape=tuple(input_shape))


def _np_nll_backward(g, target, weight, ignore_index=-100, reduction="mean", input_shape=()):
    x = np.zeros(input_shape)
    mask = target != ignore_index
    safe = np.where(mask, target, 0)
    w = np.where(mask, weight[safe], 0.0)
    scale = g / w.sum() if reduction == "mean" else g
    vals = np.where(mask, -w * scale, 0.0)
    if x.ndim == 1:
        x[safe] = vals
    else:
        np.put_along_axis(x, np.expand_dims(safe, 1), np.expand_dims(vals, 1), axis=1)
    return x


def _torch_nll_backward(g, target, weight, ignore_index=-100, reduction="mean", input_shape=()):
    import torch
    import torch.nn.functional as F

    x = torch.zeros(input_shape, dtype=g.dtype, requires_grad=True)
    loss = F.nll_loss(x, target, weight, ignore_index=ignore_index, reduction=reduction)
    (gx,) = torch.autograd.grad(loss, x, g, create_graph=True)
    return gx


def _nll_backward_samples(rng):
    out = []
    for reduction in ("mean", "sum", "none"):
        gshape = (4,) if reduction == "none" else ()
        out.append(Sample((arr(rng, *gshape), _targets(rng, 5, 4, ignore=-100),
                           arr(rng, 5, low=0.2, high=2)),
                          {"reduction": reduction, "input_shape": (4, 5)}, grad_args=(0,),
                          desc=f"(N,C) {reduction}"))
    out.append(Sample((arr(rng, 2, 2), _targets(rng, 3, 2, 2), arr(rng, 3, low=0.2, high=2)),
                      {"reduction": "none", "input_shape": (2, 3, 2)}, grad_args=(0,),
                      desc="K-dim none"))
    return out


# ---- cross_entropy ---------------------------------------------------------------------------
def _probs(rng, *shape):
    p = rng.uniform(0.1, 1.0, size=shape)
    return (p / p.sum(axis=1 if len(shape) > 1 else 0, keepdims=True)).astype(np.float32)


def _ce_samples(rng):
    out = []
    for reduction in ("mean", "sum", "none"):
        out.append(Sample((arr(rng, 4, 5), _targets(rng, 5, 4)), {"reduction": reduction},
                          desc=f"indices {reduction}"))
        out.append(Sample((arr(rng, 4, 5), _targets(rng, 5, 4), arr(rng, 5, low=0.2, high=2)),
                          {"reduction": reduction, "ignore_index": 1, "label_smoothing": 0.2},
                          grad_args=(0,), desc=f"weights+ignore+smoothing {reduction}"))
        out.append(Sample((arr(rng, 3, 4), _probs(rng, 3, 4)),
                          {"reduction": reduction, "label_smoothing": 0.1},
                          desc=f"probabilities {reduction}"))
    out.append(Sample((arr(rng, 2, 3, 2), _targets(rng, 3, 2, 2, ignore=-100)),
                      {"label_smoothing": 0.3}, desc="K-dim smoothing"))
    out.append(Sample((arr(rng, 2, 3, 2), _probs(rng, 2, 3, 2), arr(rng, 3, low=0.2, high=2)),
                      {}, grad_args=(0, 1), desc="K-dim probabilities weighted"))
    out.append(Sample((arr(rng, 5), np.array(2, dtype=np.int64)), desc="unbatched"))
    return out


def _ce_errors(rng):
    x = arr(rng, 4, 5)
    return [
        _err([x, np.array([0, 1, 7, 2])], IndexError, "Target 7 is out of bounds."),
        _err([x, _probs(rng, 4, 5)], ValueError,
             "label_smoothing must be between 0.0 and 1.0. Got: 1.5", label_smoothing=1.5),
        _err([x, _probs(rng, 4, 5)], ValueError,
             "ignore_index is not supported for floating point target", ignore_index=2),
        _err([x, _probs(rng, 3, 5)], ValueError,
             "Expected input batch_size (4) to match target batch_size (3)."),
        _err([x, np.array([0, 1, 2, 1])], ValueError, "bad is not a valid value for reduction",
             reduction="bad"),
    ]


# ---- mse, bce with logits --------------------------------------------------------------------
def _mse_samples(rng):
    return [Sample((arr(rng, 3, 4), arr(rng, 3, 4)), {"reduction": r}, desc=r)
            for r in ("mean", "sum", "none")] + [
        Sample((arr(rng, 5), arr(rng, 5)), desc="vector default")]


def _bce_samples(rng):
    out = []
    for reduction in ("mean", "sum", "none"):
        out.append(Sample((arr(rng, 3, 4, low=-4, high=4), arr(rng, 3, 4, low=0, high=1)),
                          {"reduction": reduction}, desc=reduction))
    out.append(Sample((arr(rng, 3, 4), arr(rng, 3, 4, low=0, high=1), arr(rng, 4, low=0.5, high=2)),
                      grad_args=(0, 1), desc="weight"))  # weight: no grad in PyTorch
    out.append(Sample((np.array([-100.0, -30.0, 30.0, 100.0], dtype=np.float32),
                       np.array([1.0, 0.0, 1.0, 0.0], dtype=np.float32)),
                      {"reduction": "none"}, desc="huge logits stay finite"))
    return out


def _bce_pos_weight(x, t, pos_weight, reduction="mean"):
    return nn_ops.binary_cross_entropy_with_logits(x, t, reduction=reduction,
                                                   pos_weight=pos_weight)


def _np_bce_pos_weight(x, t, pos_weight, reduction="mean"):
    return _np_bce_logits(x, t, reduction=reduction, pos_weight=pos_weight)


def _torch_bce_pos_weight(x, t, pos_weight, reduction="mean"):
    import torch.nn.functional as F

    return F.binary_cross_entropy_with_logits(x, t, reduction=reduction, pos_weight=pos_weight)


def _bce_pw_samples(rng):
    return [Sample((arr(rng, 3, 4), arr(rng, 3, 4, low=0, high=1), arr(rng, 4, low=0.5, high=3)),
                   {"reduction": r}, grad_args=(0, 1), desc=r)  # pos_weight: no grad in PyTorch
            for r in ("mean", "sum", "none")]


def _bce_errors(rng):
    x = arr(rng, 4, 5)
    return [
        _err([x, arr(rng, 4, 4)], ValueError,
             "Target size (graphc.Size([4, 4])) must be the same as input size "
             "(graphc.Size([4, 5]))"),
        _err([x, x], ValueError, "bad is not a valid value for reduction", reduction="bad"),
    ]


def _mse_errors(rng):
    x = arr(rng, 4, 5)
    return [_err([x, x], ValueError, "foo is not a valid value for reduction", reduction="foo")]


# ---- batch_norm ------------------------------------------------------------------------------
def _bn_samples(rng):
    out = []
    for shape, desc in (((4, 3), "(N,C)"), ((2, 3, 4), "(N,C,L)"), ((2, 3, 2, 2), "(N,C,H,W)")):
        c = shape[1]
        stats = (arr(rng, c, low=-0.5, high=0.5), arr(rng, c, low=0.5, high=2.0))
        affine = (arr(rng, c, low=0.5, high=2.0), arr(rng, c))
        out.append(Sample((arr(rng, *shape), *stats, *affine), {"training": True},
                          grad_args=(0, 3, 4), desc=f"train {desc}"))
        out.append(Sample((arr(rng, *shape), *stats, *affine), {"training": False},
                          grad_args=(0, 3, 4), desc=f"eval {desc}"))
    out.append(Sample((arr(rng, 3, 2, 2), arr(rng, 2), arr(rng, 2, low=0.5, high=2.0)),
                      {"training": True, "eps": 1e-3, "momentum": 0.3}, grad_args=(0,),
                      desc="no affine"))
    return out


def _bn_errors(rng):
    return [
        _err([arr(rng, 1, 4), np.zeros(4, np.float32), np.ones(4, np.float32)], ValueError,
             "Expected more than 1 value per channel when training, got input size [1, 4]",
             training=True),
        _err([arr(rng, 2, 4), np.zeros(3, np.float32), np.ones(4, np.float32)], ShapeError,
             "running_mean should contain 4 elements not 3", training=True),
        _err([arr(rng, 2, 4), np.zeros(4, np.float32), np.ones(4, np.float32),
              np.ones(3, np.float32)], ShapeError, "weight should contain 4 elements not 3"),
        _err([arr(rng, 2, 4), None, None], ValueError,
             "running_mean must be defined in evaluation mode"),
    ]


# ---- embedding -------------------------------------------------------------------------------
def _emb_samples(rng):
    return [
        Sample((np.array([0, 2, 2, 4]), arr(rng, 5, 3)), desc="repeated rows"),
        Sample((rng.integers(0, 6, size=(2, 3)), arr(rng, 6, 2)), desc="2-d indices"),
        # The padding row's gradient is zero by definition, so finite differences disagree
        # there (as in PyTorch): no gradient checks here; tests/test_losses.py compares the
        # padding gradients with PyTorch's.
        Sample((np.array([[1, 0], [0, 3]]), arr(rng, 4, 3)), {"padding_idx": 0}, grad_args=(),
               desc="padding_idx"),
        Sample((np.array([1, 3, 3]), arr(rng, 4, 2)), {"padding_idx": -1}, grad_args=(),
               desc="negative padding_idx"),
        Sample((np.array(2), arr(rng, 4, 2)), desc="0-d index"),
    ]


def _emb_errors(rng):
    return [
        _err([np.array([0, 9]), arr(rng, 5, 3)], IndexError, "index out of range in self"),
        _err([np.array([0, -1]), arr(rng, 5, 3)], IndexError, "index out of range in self"),
        _err([np.array([0.0, 1.0], dtype=np.float32), arr(rng, 5, 3)], DTypeError,
             "Expected tensor for argument #1 'indices' to have one of the following scalar "
             "types: Long"),
        _err([np.array([0, 1]), arr(rng, 5)], ShapeError, "'weight' must be 2-D"),
        _err([np.array([0, 1]), arr(rng, 5, 3)], ValueError,
             "Padding_idx must be within num_embeddings", padding_idx=7),
    ]


def _embedding_backward_op(g, indices, num_weights=0, padding_idx=None):
    return call("embedding_backward", g, indices, num_weights=num_weights,
                padding_idx=padding_idx)


def _np_embedding_backward(g, indices, num_weights=0, padding_idx=None):
    out = np.zeros((num_weights, g.shape[-1]))
    np.add.at(out, indices.reshape(-1), g.reshape(-1, g.shape[-1]))
    if padding_idx is not None:
        out[padding_idx] = 0
    return out


def _torch_embedding_backward(g, indices, num_weights=0, padding_idx=None):
    import torch

    pad = -1 if padding_idx is None else padding_idx
    return torch.ops.aten.embedding_dense_backward(g, indices, num_weights, pad, False)


def _emb_backward_samples(rng):
    return [
        Sample((arr(rng, 4, 3), np.array([0, 2, 2, 4])), {"num_weights": 5}, grad_args=(0,),
               desc="repeated rows"),
        Sample((arr(rng, 2, 2, 3), np.array([[1, 0], [0, 3]])),
               {"num_weights": 4, "padding_idx": 0}, grad_args=(0,), desc="padding_idx"),
    ]


OP_INFOS: list[OpInfo] = [
    OpInfo("softmax", nn_ops.softmax, _np_softmax, _softmax_samples, ("softmax",),
           torch_fn=_torch_softmax, error_inputs=_softmax_errors),
    OpInfo("log_softmax", nn_ops.log_softmax, _np_log_softmax, _softmax_samples,
           ("log_softmax",), torch_fn=_torch_log_softmax, error_inputs=_softmax_errors),
    OpInfo("log1p", nn_ops.log1p, np.log1p, _log1p_samples, ("log1p",), torch_fn=_torch_log1p),
    OpInfo("nll_loss", nn_ops.nll_loss, _np_nll, _nll_samples, ("nll_loss", "nll_loss_backward"),
           torch_fn=_F("nll_loss"), error_inputs=_nll_errors),
    OpInfo("nll_loss_backward", _nll_backward_op, _np_nll_backward, _nll_backward_samples,
           ("nll_loss_backward", "nll_loss"), torch_fn=_torch_nll_backward),
    OpInfo("cross_entropy", nn_ops.cross_entropy, _np_cross_entropy, _ce_samples,
           ("log_softmax", "nll_loss", "nll_loss_backward"), torch_fn=_F("cross_entropy"),
           error_inputs=_ce_errors),
    OpInfo("mse_loss", nn_ops.mse_loss, _np_mse, _mse_samples, (), torch_fn=_F("mse_loss"),
           error_inputs=_mse_errors),
    OpInfo("binary_cross_entropy_with_logits", nn_ops.binary_cross_entropy_with_logits,
           _np_bce_logits, _bce_samples, ("log1p",),
           torch_fn=_F("binary_cross_entropy_with_logits"), error_inputs=_bce_errors),
    OpInfo("binary_cross_entropy_with_logits_pos_weight", _bce_pos_weight, _np_bce_pos_weight,
           _bce_pw_samples, ("log1p",), torch_fn=_torch_bce_pos_weight),
    OpInfo("batch_norm", nn_ops.batch_norm, _np_batch_norm, _bn_samples, ("batch_norm",),
           torch_fn=_F("batch_norm"), error_inputs=_bn_errors, atol=1e-5, rtol=1e-4),
    OpInfo("embedding", nn_ops.embedding, _np_embedding, _emb_samples,
           ("embedding", "embedding_backward"), torch_fn=_F("embedding"),
           error_inputs=_emb_errors),
    OpInfo("embedding_backward", _embedding_backward_op, _np_embedding_backward,
           _emb_backward_samples, ("embedding_backward", "embedding"),
           torch_fn=_torch_embedding_backward),
]
