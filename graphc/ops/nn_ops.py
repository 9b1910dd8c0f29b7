"""NN ops: softmax, log_softmax, the losses, batch normalisation and embedding.

Primitives (registry ops) are the ones a backend gains from: `softmax` / `log_softmax`
(numerically stable kernels, VJPs from the saved output), `nll_loss` with its own backward op
`nll_loss_backward` (a gather and its scatter, PyTorch's `total_weight` as a second output),
`batch_norm` (out, save_mean, save_invstd), `embedding` with its scatter-add backward
`embedding_backward` (the elementwise `log1p` lives in graphc.ops.elementwise). cross_entropy,
mse_loss and binary_cross_entropy_with_logits are compositions of those and of
elementwise/reduce ops.

Invariants:
- Every VJP is written with `call(...)` and tensor operators, so it records history under
  `create_graph` and traces. The backward ops are linear in their incoming gradient and their
  own VJPs are the forward gathers again, so gradients of any order work.
- `batch_norm`'s VJP accepts gradients for all three outputs (save_mean and save_invstd are
  functions of the input in training mode), which is what makes its double backward exact:
  the first-order gradient is written with the saved outputs.
- Argument checks, defaults and error wording follow PyTorch 2.13 (torch.nn.functional).
  Value-dependent checks (a target or index out of range) run in the kernels, as in PyTorch.
"""

from __future__ import annotations

import warnings

import numpy as np

from graphc.errors import ArgumentError, DTypeError, IndexOutOfRangeError, ShapeError
from graphc.errors import where as _where
from graphc.ops.elementwise import log1p
from graphc.ops.grad_utils import full_like, size_value
from graphc.ops.registry import (
    LOSS,
    MOVEMENT,
    NORM,
    OpDef,
    call,
    inplace,
    register,
)
from graphc.ops.shapes import normalize_axis, numel, require_float
from graphc.symbolic import Sym
from graphc.types import TensorType, as_dtype, int64

_REDUCTIONS = ("none", "mean", "sum")
_TORCH_NAMES = {"float32": "Float", "float64": "Double", "int64": "Long", "bool": "Bool"}



# ---- helpers (graph-building only) -----------------------------------------------------------
def _sum(t, axes: tuple[int, ...], keepdim: bool = False):
    """reduce_sum over `axes` (sorted, non-negative); the identity when there are none."""
    if not axes:
        return t
    return call("reduce_sum", t, axes=tuple(axes), keepdim=keepdim)


def _sum_all(t):
    return _sum(t, tuple(range(t.ndim)))


def _channel_view(v, ndim: int):
    """A (C,) vector shaped to broadcast along dim 1 of an ndim-d (N, C, ...) tensor."""
    if ndim <= 2:
        return v
    return call("reshape", v, shape=(v.shape[0],) + (1,) * (ndim - 2))


def _reduce(loss, reduction: str):
    """PyTorch's apply_loss_reduction: none / mean over all elements / sum."""
    if reduction == "none":
        return loss
    total = _sum_all(loss)
    if reduction == "mean":
        count = numel(tuple(loss.shape))  # symbolic in a dynamic trace: stays so
        return total / size_value(count, loss.dtype.name) if type(count) is Sym or count \
            else total / 0.0  # empty: nan
    return total


def _check_reduction(op: str, reduction) -> None:
    if reduction not in _REDUCTIONS:
        raise ArgumentError(f"{_where(op)}: {reduction} is not a valid value for reduction")


def _torch_name(dtype) -> str:
    return _TORCH_NAMES[dtype.name]


# ---- softmax / log_softmax -------------------------------------------------------------------
def _softmax_infer_for(op: str):
    def infer(x: TensorType, dim: int) -> TensorType:
        require_float(op, x)
        normalize_axis(op, dim, x.ndim)
        return x

    infer.__name__ = f"_{op}_infer"
    return infer


def _shifted(x, dim: int):
    """x minus its max along dim (keepdims), the stable starting point of both kernels."""
    if x.ndim == 0 or x.size == 0:
        return x - x
    return x - np.max(x, axis=dim, keepdims=True)


def _softmax_kernel(x, dim: int):
    e = np.exp(_shifted(x, dim))
    if x.ndim == 0 or x.size == 0:
        return e
    return e / np.sum(e, axis=dim, keepdims=True)


def _softmax_vjp(ctx, g):
    y = ctx.outputs[0]
    axes = (ctx.attrs["dim"],) if y.ndim else ()
    return (y * (g - _sum(g * y, axes, keepdim=True)),)


register(OpDef("softmax", NORM, ("x",), _softmax_infer_for("softmax"), _softmax_kernel,
               _softmax_vjp, attrs={"dim": int}, saved_outputs=(0,), row_wise=True))


def _log_softmax_kernel(x, dim: int):
    s = _shifted(x, dim)
    if x.ndim == 0 or x.size == 0:
        return s
    return s - np.log(np.sum(np.exp(s), axis=dim, keepdims=True))


def _log_softmax_vjp(ctx, g):
    y = ctx.outputs[0]
    axes = (ctx.attrs["dim"],) if y.ndim else ()
    return (g - call("exp", y) * _sum(g, axes, keepdim=True),)


register(OpDef("log_softmax", NORM, ("x",), _softmax_infer_for("log_softmax"),
               _log_softmax_kernel, _log_softmax_vjp, attrs={"dim": int}, saved_outputs=(0,),
               row_wise=True))


def _softmax_dim(op: str, x, dim, dtype):
    if dim is None:  # PyTorch's deprecated implicit choice
        warnings.warn(f"Implicit dimension choice for {op} has been deprecated. Change the call "
                      "to include dim=X as an argument.", UserWarning, stacklevel=3)
        dim = 0 if x.ndim in (0, 1, 3) else 1
    if dtype is not None:
        from graphc.ops.elementwise import cast

        x = cast(x, as_dtype(dtype))
    return x, normalize_axis(op, int(dim), x.ndim)


def softmax(x, dim=None, dtype=None):
    """exp(x) / sum(exp(x)) along `dim`, computed stably.

    >>> import graphc
    >>> graphc.softmax(graphc.tensor([0.0, 0.0]), dim=0)
    tensor([0.5000, 0.5000])
    """
    x, dim = _softmax_dim("softmax", x, dim, dtype)
    return call("softmax", x, dim=dim)


def log_softmax(x, dim=None, dtype=None):
    """log(softmax(x, dim)) without the overflow of the naive formula."""
    x, dim = _softmax_dim("log_softmax", x, dim, dtype)
    return call("log_softmax", x, dim=dim)


# ---- nll_loss and its backward ---------------------------------------------------------------
def _nll_check(op: str, x: TensorType, target: TensorType, weight: TensorType,
               reduction: str) -> None:
    """PyTorch's nll_loss argument checks (shapes and dtypes; target values in the kernel)."""
    require_float(op, x)
    if reduction not in _REDUCTIONS:
        raise ArgumentError(f"{_where(op)}: {reduction} is not a valid value for reduction")
    if target.dtype is not int64:
        raise DTypeError(f"{_where(op)}: expected target dtype to be Long, but got "
                         f"{_torch_name(target.dtype)}")
    if x.ndim == 0:
        raise ShapeError(f"{_where(op)}: Expected 1 or more dimensions (got 0)")
    n_classes = x.shape[0] if x.ndim == 1 else x.shape[1]
    if weight.shape != (n_classes,):
        raise ShapeError(
            f"{_where(op)}: weight tensor should be defined either for all {n_classes} classes "
            f"or no classes but got weight tensor of shape: {list(weight.shape)}"
        )
    if weight.dtype is not x.dtype:
        raise DTypeError(f"{_where(op)}: expected scalar type {_torch_name(x.dtype)} but found "
                         f"{_torch_name(weight.dtype)}")
    if x.ndim == 1:
        if target.ndim > 1 or target.numel != 1:
            raise ShapeError(f"{_where(op)}: 0D or 1D target tensor expected, multi-target not "
                             "supported")
        return
    if target.ndim == 0 or target.shape[0] != x.shape[0]:
        got = target.shape[0] if target.ndim else 1
        raise ArgumentError(f"{_where(op)}: Expected input batch_size ({x.shape[0]}) to match "
                            f"target batch_size ({got}).")
    if x.ndim == 2 and target.ndim != 1:
        raise ShapeError(f"{_where(op)}: 0D or 1D target tensor expected, multi-target not "
                         "supported")
    want = (x.shape[0],) + x.shape[2:]
    if target.shape != want:
        raise ShapeError(f"{_where(op)}: Expected target size {list(want)}, got "
                         f"{list(target.shape)}")


def _nll_loss_infer(x: TensorType, target: TensorType, weight: TensorType, ignore_index: int,
                    reduction: str) -> tuple[TensorType, TensorType]:
    _nll_check("nll_loss", x, target, weight, reduction)
    out_shape = target.shape if reduction == "none" else ()
    return TensorType(out_shape, x.dtype), TensorType((), x.dtype)


def _picked(x, target, ignore_index: int):
    """(mask of counted targets, targets made safe to index with) after the range check."""
    n_classes = x.shape[0] if x.ndim == 1 else x.shape[1]
    mask = target != ignore_index
    bad = mask & ((target < 0) | (target >= n_classes))
    if bad.any():
        first = int(target[bad].flat[0])
        raise IndexOutOfRangeError(f"{_where('nll_loss')}: Target {first} is out of bounds.")
    return mask, np.where(mask, target, 0)


def _gather_class(x, safe):
    """x[n, safe[n, ...], ...] along the class dim (dim 1, or dim 0 for a (C,) input)."""
    if x.ndim == 1:
        return x[safe.reshape(())] if safe.ndim else x[safe]
    return np.take_along_axis(x, np.expand_dims(safe, 1), axis=1).squeeze(1)


def _nll_loss_kernel(x, target, weight, ignore_index: int, reduction: str):
    mask, safe = _picked(x, target, ignore_index)
    w = np.where(mask, weight[safe], 0).astype(x.dtype)
    losses = -_gather_class(x, safe) * w
    total_weight = np.asarray(w.sum(dtype=np.float64), dtype=x.dtype)
    if reduction == "none":
        return losses.reshape(target.shape), total_weight
    total = losses.sum(dtype=np.float64)
    if reduction == "mean":
        total = total / total_weight if total_weight != 0 else np.float64("nan")
    return np.asarray(total, dtype=x.dtype), total_weight


def _nll_loss_vjp(ctx, g, g_total_weight=None):
    if g is None or not ctx.needs_input_grad[0]:
        return (None, None, None)
    _, target, weight = ctx.inputs
    gx = call("nll_loss_backward", g, target, weight, ctx.outputs[1],
              ignore_index=ctx.attrs["ignore_index"], reduction=ctx.attrs["reduction"],
              input_shape=ctx.input_types[0].shape)
    return (gx, None, None)  # target: integer; weight: not differentiable (as PyTorch)


register(OpDef("nll_loss", LOSS, ("input", "target", "weight"), _nll_loss_infer,
               _nll_loss_kernel, _nll_loss_vjp,
               attrs={"ignore_index": int, "reduction": str},
               saved_inputs=(1, 2), saved_outputs=(1,)))


def _nll_loss_backward_infer(g: TensorType, target: TensorType, weight: TensorType,
                             total_weight: TensorType, ignore_index: int, reduction: str,
                             input_shape: tuple) -> TensorType:
    x = TensorType(input_shape, g.dtype)
    _nll_check("nll_loss_backward", x, target, weight, reduction)
    want = target.shape if reduction == "none" else ()
    if g.shape != want:
        raise ShapeError(f"{_where('nll_loss_backward')}: expected a grad_output of shape "
                         f"{list(want)}, got {list(g.shape)}")
    return x


def _nll_loss_backward_kernel(g, target, weight, total_weight, ignore_index: int,
                              reduction: str, input_shape: tuple):
    x = np.zeros(input_shape, dtype=g.dtype)
    mask, safe = _picked(x, target, ignore_index)
    w = np.where(mask, weight[safe], 0).astype(g.dtype)
    scale = np.broadcast_to(g, target.shape) if reduction == "none" else g
    if reduction == "mean":
        scale = scale / total_weight
    values = np.where(mask, -w * scale, 0).astype(g.dtype)  # ignored: 0, even if 0/0
    if x.ndim == 1:
        x[safe.reshape(())] = values.reshape(())
    else:
        np.put_along_axis(x, np.expand_dims(safe, 1), np.expand_dims(values, 1), axis=1)
    return x


def _nll_loss_backward_vjp(ctx, h):
    # The backward is linear in its grad: d<h, backward(g)>/dg is the forward gather of h.
    if not ctx.needs_input_grad[0]:
        return (None, None, None, None)
    _, target, weight, _ = ctx.inputs
    gg, _ = call("nll_loss", h, target, weight, ignore_index=ctx.attrs["ignore_index"],
                 reduction=ctx.attrs["reduction"])
    return (gg, None, None, None)


register(OpDef("nll_loss_backward", LOSS, ("grad_output", "target", "weight", "total_weight"),
               _nll_loss_backward_infer, _nll_loss_backward_kernel, _nll_loss_backward_vjp,
               attrs={"ignore_index": int, "reduction": str, "input_shape": tuple},
               saved_inputs=(1, 2)))


def _weight_or_ones(x, weight):
    if weight is not None:
        return weight
    n_classes = x.shape[0] if x.ndim == 1 else (x.shape[1] if x.ndim > 1 else 1)
    return call("full", shape=(n_classes,), value=1.0, dtype=x.dtype.name)


def _nll_loss_op(x, target, weight, ignore_index: int, reduction: str):
    """(loss, total_weight) of PyTorch's nll_loss_forward."""
    _check_reduction("nll_loss", reduction)
    weight = _weight_or_ones(x, weight)
    return call("nll_loss", x, target, weight, ignore_index=int(ignore_index),
                reduction=reduction)


def nll_loss(input, target, weight=None, ignore_index: int = -100,  # noqa: A002
             reduction: str = "mean"):
    """Negative log likelihood of the class `target` under log-probabilities `input`.

    `input` is (N, C), (N, C, d1, ...) or unbatched (C,); `target` holds int64 class indices.
    With class weights, 'mean' divides by the summed weight of the counted targets.

    >>> import graphc
    >>> logp = graphc.tensor([[-0.5, -1.0], [-2.0, -0.1]])
    >>> nll_loss(logp, graphc.tensor([0, 1]), reduction="sum").item()
    0.6000000238418579
    """
    loss, _ = _nll_loss_op(input, target, weight, ignore_index, reduction)
    return loss


# ---- cross_entropy ---------------------------------------------------------------------------
def _check_smoothing(label_smoothing: float) -> float:
    if not 0.0 <= label_smoothing <= 1.0:
        raise ArgumentError(f"{_where('cross_entropy')}: label_smoothing must be between 0.0 "
                            f"and 1.0. Got: {label_smoothing}")
    return float(label_smoothing)


def _cross_entropy_probs(x, target, weight, reduction, label_smoothing, class_dim, n_classes):
    """PyTorch's cross_entropy with class-probability targets (target shaped like input)."""
    if tuple(target.shape) != tuple(x.shape):
        if x.ndim >= 1 and target.ndim >= 1 and target.shape[0] != x.shape[0]:
            raise ArgumentError(f"{_where('cross_entropy')}: Expected input batch_size "
                                f"({x.shape[0]}) to match target batch_size ({target.shape[0]}).")
        raise ShapeError(f"{_where('cross_entropy')}: Expected target size {list(x.shape)}, "
                         f"got {list(target.shape)}")
    if weight is not None and tuple(weight.shape) != (n_classes,):
        raise ShapeError(
            f"{_where('cross_entropy')}: weight tensor should be defined either for all "
            f"{n_classes} classes or no classes but got weight tensor of shape: "
            f"{list(weight.shape)}")
    logp = log_softmax(x, class_dim)
    if label_smoothing > 0.0:
        target = target * (1.0 - label_smoothing) + label_smoothing / n_classes
    prod = logp * target
    if weight is not None:
        prod = prod * _channel_view(weight, x.ndim)
    if reduction == "none":
        return -_sum(prod, (class_dim,))
    total = -_sum_all(prod)
    if reduction == "sum":
        return total
    count = numel(tuple(x.shape)) // n_classes  # symbolic in a dynamic trace: stays so
    return total / size_value(count, x.dtype.name) if type(count) is Sym or count \
        else total / 0.0


def cross_entropy(input, target, weight=None, ignore_index: int = -100,  # noqa: A002
                  reduction: str = "mean", label_smoothing: float = 0.0):
    """log_softmax over the class dim, then nll_loss (or soft targets when `target` is float).

    >>> import graphc
    >>> x = graphc.tensor([[2.0, 0.0], [0.0, 2.0]])
    >>> round(cross_entropy(x, graphc.tensor([0, 1])).item(), 4)
    0.1269
    """
    x = input
    _check_reduction("cross_entropy", reduction)
    label_smoothing = _check_smoothing(label_smoothing)
    if x.ndim == 0:
        raise ShapeError(f"{_where('cross_entropy')}: Expected 1 or more dimensions (got 0)")
    class_dim = 0 if x.ndim == 1 else 1
    n_classes = x.shape[class_dim]
    if target.dtype.is_floating:
        if ignore_index >= 0:
            raise ArgumentError(f"{_where('cross_entropy')}: ignore_index is not supported for "
                                "floating point target")
        return _cross_entropy_probs(x, target, weight, reduction, label_smoothing, class_dim,
                                    n_classes)
    logp = log_softmax(x, class_dim)
    nll, total_weight = _nll_loss_op(logp, target, weight, ignore_index, reduction)
    if label_smoothing == 0.0:
        return nll
    prod = logp if weight is None else logp * _channel_view(weight, x.ndim)
    smooth = -_sum(prod, (class_dim,))
    smooth = call("where", target == int(ignore_index), full_like(smooth, 0.0), smooth)
    if reduction == "mean":
        smooth = _sum_all(smooth) / total_weight
    elif reduction == "sum":
        smooth = _sum_all(smooth)
    return nll * (1.0 - label_smoothing) + smooth * (label_smoothing / n_classes)


# ---- mse_loss, binary_cross_entropy_with_logits ----------------------------------------------
def mse_loss(input, target, reduction: str = "mean"):  # noqa: A002
    """Mean squared error ((input - target)**2, reduced).

    >>> import graphc
    >>> mse_loss(graphc.tensor([1.0, 3.0]), graphc.tensor([0.0, 0.0])).item()
    5.0
    """
    _check_reduction("mse_loss", reduction)
    if tuple(target.shape) != tuple(input.shape):
        warnings.warn(
            f"Using a target size ({_size(target)}) that is different to the input size "
            f"({_size(input)}). This will likely lead to incorrect results due to broadcasting. "
            "Please ensure they have the same size.", UserWarning, stacklevel=2)
    d = input - target
    return _reduce(d * d, reduction)


def _size(t) -> str:
    return f"graphc.Size({list(t.shape)})"


def _log_sigmoid(x):
    """min(x, 0) - log1p(exp(-|x|)): log(sigmoid(x)) without overflow for any x."""
    return call("minimum", x, 0.0) - log1p(call("exp", -call("abs", x)))


def binary_cross_entropy_with_logits(input, target, weight=None,  # noqa: A002
                                     reduction: str = "mean", pos_weight=None):
    """Sigmoid + binary cross entropy in one stable formula.

    loss = (1 - t) * x - (1 + (pos_weight - 1) * t) * log_sigmoid(x), times `weight`.

    >>> import graphc
    >>> x = graphc.tensor([0.0])
    >>> round(binary_cross_entropy_with_logits(x, graphc.tensor([1.0])).item(), 4)
    0.6931
    """
    _check_reduction("binary_cross_entropy_with_logits", reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ArgumentError(
            f"{_where('binary_cross_entropy_with_logits')}: Target size ({_size(target)}) must "
            f"be the same as input size ({_size(input)})")
    x = input
    log_sig = _log_sigmoid(x)
    if pos_weight is not None:
        log_sig = log_sig * ((pos_weight - 1.0) * target + 1.0)
    loss = (1.0 - target) * x - log_sig
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


# ---- batch_norm ------------------------------------------------------------------------------
def _bn_infer(x: TensorType, weight: TensorType, bias: TensorType, running_mean: TensorType,
              running_var: TensorType, training: bool, eps: float):
    op = "batch_norm"
    require_float(op, x)
    if x.ndim < 2:
        raise ShapeError(f"{_where(op)}: expected 2D or more input (N, C, ...), got "
                         f"{x.ndim}D input of shape {list(x.shape)}")
    c = x.shape[1]
    for name, t in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                    ("running_var", running_var)):
        if t.numel != c:
            raise ShapeError(f"{_where(op)}: {name} should contain {c} elements not {t.numel}")
        if t.ndim != 1 or t.dtype is not x.dtype:
            raise DTypeError(f"{_where(op)}: {name} must be a 1-D {x.dtype.name} tensor, got "
                             f"{t}")
    stat = TensorType((c,), x.dtype)
    return x, stat, stat


def _bn_kernel(x, weight, bias, running_mean, running_var, training: bool, eps: float):
    axes = (0,) + tuple(range(2, x.ndim))
    bshape = (1, -1) + (1,) * (x.ndim - 2)
    xd = x.astype(np.float64)
    if training:
        mean = xd.mean(axis=axes)
        var = ((xd - mean.reshape(bshape)) ** 2).mean(axis=axes)
    else:
        mean = running_mean.astype(np.float64)
        var = running_var.astype(np.float64)
    invstd = 1.0 / np.sqrt(var + eps)
    scale = invstd * weight
    out = (xd - mean.reshape(bshape)) * scale.reshape(bshape) + bias.reshape(bshape)
    return out.astype(x.dtype), mean.astype(x.dtype), invstd.astype(x.dtype)


def _bn_vjp(ctx, g, g_mean=None, g_invstd=None):
    x, weight = ctx.inputs[0], ctx.inputs[1]
    _, mean, invstd = ctx.outputs
    nd = x.ndim
    axes = (0,) + tuple(range(2, nd))
    m = size_value(numel(x.shape) // x.shape[1], x.dtype.name)
    mean_b, invstd_b = _channel_view(mean, nd), _channel_view(invstd, nd)
    centred = x - mean_b
    xhat = centred * invstd_b
    gx = gw = gb = None
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    if g is not None:
        if need_b or (need_x and ctx.attrs["training"]):
            gb = _sum(g, axes)
        if need_w or (need_x and ctx.attrs["training"]):
            gw = _sum(g * xhat, axes)
        if need_x:
            scale = _channel_view(weight, nd) * invstd_b
            if ctx.attrs["training"]:
                gx = scale * (g - _channel_view(gb, nd) / m - xhat * _channel_view(gw, nd) / m)
            else:
                gx = g * scale
    if ctx.attrs["training"] and need_x:
        # save_mean and save_invstd are functions of x in training mode.
        if g_mean is not None:
            gm = _channel_view(g_mean, nd) / m
            gx = call("broadcast_to", gm, shape=tuple(x.shape)) if gx is None else gx + gm
        if g_invstd is not None:
            gi = _channel_view(g_invstd * invstd * invstd * invstd, nd) * centred * (-1.0 / m)
            gx = gi if gx is None else gx + gi
    if gx is None and need_x:
        gx = full_like(x, 0.0)
    return (gx, gw if need_w else None, gb if need_b else None, None, None)


register(OpDef("batch_norm", NORM, ("input", "weight", "bias", "running_mean", "running_var"),
               _bn_infer, _bn_kernel, _bn_vjp, attrs={"training": bool, "eps": float},
               saved_inputs=(0, 1), saved_outputs=(1, 2)))


def _bn_update(running, value, momentum) -> None:
    """running = running * (1 - momentum) + value * momentum, in place; `momentum` a float or
    a 0-d tensor (BatchNorm's momentum=None: 1 / num_batches_tracked, known per call)."""
    if not hasattr(momentum, "shape"):
        momentum = float(momentum)

    def updated(old):
        return old * (1.0 - momentum) + value * momentum

    inplace(running, "batch_norm", updated)


def batch_norm(input, running_mean, running_var, weight=None, bias=None,  # noqa: A002
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5):
    """Normalise over every dim but the channel dim 1, then scale and shift per channel.

    Training mode uses the batch statistics (biased variance) and updates the running
    statistics in place (the variance with the unbiased estimate, as PyTorch); eval mode uses
    the running statistics.

    >>> import graphc
    >>> x = graphc.tensor([[1.0, 2.0], [3.0, 6.0]])
    >>> rm, rv = graphc.zeros(2), graphc.ones(2)
    >>> [round(v, 4) for v in batch_norm(x, rm, rv, training=True).tolist()[0]]
    [-1.0, -1.0]
    >>> [round(v, 2) for v in rm.tolist()]  # running_mean += 0.1 * (batch mean - running_mean)
    [0.2, 0.4]
    """
    x = input
    if x.ndim < 2:
        got = running_mean.numel() if running_mean is not None else x.shape[1:2]
        raise ShapeError(f"{_where('batch_norm')}: running_mean should contain "
                         f"{x.shape[1] if x.ndim > 1 else 0} elements not {got}")
    c = x.shape[1]
    if training:
        per_channel = numel(x.shape) // c
        if per_channel <= 1:
            raise ArgumentError(f"{_where('batch_norm')}: Expected more than 1 value per "
                                f"channel when training, got input size {list(x.shape)}")
    elif running_mean is None or running_var is None:
        raise ArgumentError(f"{_where('batch_norm')}: running_mean must be defined in "
                            "evaluation mode")
    dt = x.dtype.name

    def const(value):
        return call("full", shape=(c,), value=value, dtype=dt)

    out, mean, invstd = call(
        "batch_norm", x, const(1.0) if weight is None else weight,
        const(0.0) if bias is None else bias,
        const(0.0) if running_mean is None else running_mean,
        const(1.0) if running_var is None else running_var,
        training=bool(training), eps=float(eps))
    if training and momentum is not None:
        n = numel(x.shape) // c
        from graphc.autograd.grad_mode import no_grad  # the front end's, when called

        with no_grad():  # buffers: the update records no history
            if running_mean is not None:
                _bn_update(running_mean, mean, momentum)
            if running_var is not None:
                correction = n / (n - 1) if type(n) is not Sym else \
                    size_value(n, dt) / size_value(n - 1, dt)  # n symbolic: per call
                unbiased = (1.0 / (invstd * invstd) - float(eps)) * correction
                _bn_update(running_var, unbiased, momentum)
    return out


# ---- embedding -------------------------------------------------------------------------------
def _embedding_infer(weight: TensorType, indices: TensorType, padding_idx) -> TensorType:
    op = "embedding"
    if indices.dtype is not int64:
        raise DTypeError(
            f"{_where(op)}: Expected tensor for argument #1 'indices' to have one of the "
            f"following scalar types: Long; but got {indices.dtype.name} instead (while "
            "checking arguments for embedding)")
    if weight.ndim != 2:
        raise ShapeError(f"{_where(op)}: 'weight' must be 2-D")
    return TensorType(indices.shape + (weight.shape[1],), weight.dtype)


def _check_indices(indices, n: int) -> None:
    if indices.size and (indices.min() < 0 or indices.max() >= n):
        raise IndexOutOfRangeError(f"{_where('embedding')}: index out of range in self")


def _embedding_kernel(weight, indices, padding_idx):
    _check_indices(indices, weight.shape[0])
    return weight[indices]


def _embedding_vjp(ctx, g):
    if not ctx.needs_input_grad[0]:
        return (None, None)
    n = ctx.input_types[0].shape[0]
    gw = call("embedding_backward", g, ctx.inputs[1], num_weights=n,
              padding_idx=ctx.attrs["padding_idx"])
    return (gw, None)


register(OpDef("embedding", MOVEMENT, ("weight", "indices"),
               _embedding_infer, _embedding_kernel, _embedding_vjp,
               attrs={"padding_idx": int}, saved_inputs=(1,)))


def _embedding_backward_infer(g: TensorType, indices: TensorType, num_weights: int,
                              padding_idx) -> TensorType:
    op = "embedding_backward"
    if g.shape[:-1] != indices.shape or g.ndim != indices.ndim + 1:
        raise ShapeError(f"{_where(op)}: grad of shape {list(g.shape)} does not fit indices of "
                         f"shape {list(indices.shape)}")
    return TensorType((num_weights, g.shape[-1]), g.dtype)


def _embedding_backward_kernel(g, indices, num_weights: int, padding_idx):
    _check_indices(indices, num_weights)
    out = np.zeros((num_weights, g.shape[-1]), dtype=g.dtype)
    np.add.at(out, indices.reshape(-1), g.reshape(-1, g.shape[-1]))
    if padding_idx is not None:
        out[padding_idx] = 0
    return out


def _embedding_backward_vjp(ctx, h):
    # Linear in the grad: the adjoint of a scatter-add is the gather, with the padding row
    # (whose gradient was zeroed) contributing nothing.
    if not ctx.needs_input_grad[0]:
        return (None, None)
    indices = ctx.inputs[1]
    gg = call("embedding", h, indices, padding_idx=ctx.attrs["padding_idx"])
    pad = ctx.attrs["padding_idx"]
    if pad is not None:
        keep = call("reshape", indices != pad, shape=tuple(indices.shape) + (1,))
        gg = call("where", keep, gg, full_like(gg, 0.0))
    return (gg, None)


register(OpDef("embedding_backward", MOVEMENT, ("grad_output", "indices"),
               _embedding_backward_infer, _embedding_backward_kernel, _embedding_backward_vjp,
               attrs={"num_weights": int, "padding_idx": int}, saved_inputs=(1,)))


def embedding(input, weight, padding_idx=None):  # noqa: A002
    """Rows of `weight` picked by the int64 indices in `input` (shape input.shape + (D,)).

    The `padding_idx` row gets no gradient.

    >>> import graphc
    >>> w = graphc.tensor([[0.0, 1.0], [2.0, 3.0]])
    >>> embedding(graphc.tensor([1, 1, 0]), w).tolist()
    [[2.0, 3.0], [2.0, 3.0], [0.0, 1.0]]
    """
    if padding_idx is not None:
        n = weight.shape[0]
        padding_idx = int(padding_idx)
        if not -n <= padding_idx < n:
            raise ArgumentError(f"{_where('embedding')}: Padding_idx must be within "
                                "num_embeddings")
        padding_idx %= n
    return call("embedding", weight, input, padding_idx=padding_idx)


TENSOR_METHODS = {"softmax": softmax, "log_softmax": log_softmax}

PUBLIC = ("softmax", "log_softmax")
