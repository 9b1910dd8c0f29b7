"""batch_norm_relu: batch norm, an optional residual add and a ReLU as one op, with the ReLU's
mask; made only by the cpu pipeline's `fuse_batch_norm_relu` pass (graphc/passes/
batch_norm_relu.py), never called by users. Also conv2d_channel_sums, the convolution that
hands it its statistics (below).

    batch_norm_relu[training, eps](input, weight, bias, running_mean, running_var, *residual)
        -> (out, positive, save_mean, save_invstd)

with y = batch_norm(input, ...)'s first output (rounded to the input's dtype), z = y, or
y + residual (one residual of input's type, added in that dtype); `out = relu(z)`, `positive =
out > 0` (bool: what the ReLU's backward reads), and save_mean, save_invstd batch_norm's. The
reference kernel runs the registry's own kernels in that order (batch_norm, add, relu, gt), so
the op means exactly the nodes it replaces and the interpreter needs nothing special. It has no
VJP: the pass runs after the backward graph is derived.

With `sums=true` (made by graphc.passes.conv_channel_sums) the input after running_var is the
per-image shifted sums of x that `conv2d_channel_sums` returned with x, and the training
statistics come from them instead of a walk over x:

    batch_norm_relu[training=true, eps, sums=true](input, weight, bias, running_mean,
                                                   running_var, sums, *residual)

    conv2d_channel_sums[stride, padding, dilation, groups](input, weight) -> (out, sums)

out is conv2d's; sums (float64 [N, 3, C]) holds, for image n and output channel c, the shift
K = out[n, c, 0, 0] and the sums of d = out[n, c] - K and of d^2 (in float64). The channel's
mean and variance are the images' (K + S1/S, (S2 - S1^2/S)/S) merged in image order by Chan's
parallel-variance update, in float64 (`merged_statistics`, which the cpu kernel follows step
for step); with one shift per image, no thread sees another's shift, and the order of the
images fixes the bits whatever the thread count. The rounding: docs/performance.md,
"statistics computed where the convolution writes its output".

Its backward, with the ReLU's mask and the residual's gradient (made by graphc.passes.
batch_norm_backward from the two fused nodes autodiff and the row passes leave):

    batch_norm_relu_backward[relu_grad](grad, positive, input, weight, save_mean, save_invstd,
                                        *residual_grad)
        -> (grad_input, grad_weight, grad_bias[, g])

g = where(positive, grad [+ residual_grad], 0) (the gradient at the ReLU's input), xhat =
(input - save_mean) * save_invstd, grad_bias = sum(g) and grad_weight = sum(g * xhat) over
every axis but the channels', and grad_input = weight * save_invstd * (g - grad_bias / m - xhat
* grad_weight / m) (m = N * H * W): batch_norm's VJP in training. With relu_grad=true g is an
output too (a residual block's shortcut reads it). The reference kernel runs the registry's
kernels in the order the replaced nodes ran them; the cpu kernel adds its planes' sums in
float64 (docs/performance.md, "batch norm + ReLU backward as one node, twelfth session").
"""

from __future__ import annotations

import numpy as np

from graphc.errors import DTypeError, ShapeError
from graphc.ops.registry import CONTRACTION, NORM, REGISTRY, OpDef, register
from graphc.types import TensorType, bool_, float64

__all__: list[str] = []
PUBLIC: tuple[str, ...] = ()  # made by cpu pipeline passes, never called by users


SUM_ROWS = 3  # a sums tensor's rows: the shift K, sum(x - K), sum((x - K)^2)


def sums_type(x: TensorType) -> TensorType:
    """The type of the per-image sums of an (N, C, ...) tensor x: float64 [N, 3, C]."""
    return TensorType((x.shape[0], SUM_ROWS, x.shape[1]), float64)


def _infer(x: TensorType, weight: TensorType, bias: TensorType, running_mean: TensorType,
           running_var: TensorType, *rest: TensorType, training: bool, eps: float,
           sums: bool = False):
    out, mean, invstd = REGISTRY["batch_norm"].infer(x, weight, bias, running_mean, running_var,
                                                     training=training, eps=eps)
    residual = rest
    if sums:
        if not training or not rest or rest[0] != sums_type(x):
            got = rest[0] if rest else "nothing"
            raise ShapeError(f"batch_norm_relu: with sums=true expected training=true and, "
                             f"after running_var, the per-image sums {sums_type(x)} of the "
                             f"input {x} (conv2d_channel_sums' second output), got "
                             f"training={training} and {got}; drop sums=true to compute the "
                             "statistics from the input")
        residual = rest[1:]
    if len(residual) > 1 or any(r != x for r in residual):
        got = ", ".join(str(r) for r in residual)
        raise ShapeError(f"batch_norm_relu: expected at most one residual of the input's type "
                         f"{x}, got ({got}); the residual is added to the normalised input "
                         "before the ReLU, so it must match it exactly")
    return out, TensorType(x.shape, bool_), mean, invstd


def _kernel(x, weight, bias, running_mean, running_var, *rest, training: bool, eps: float,
            sums: bool = False):
    residual = rest[1:] if sums else rest
    if sums:
        y, mean, invstd = _normalised(x, weight, bias, *merged_statistics(rest[0], x[0, 0].size),
                                      eps)
    else:
        y, mean, invstd = REGISTRY["batch_norm"].kernel(x, weight, bias, running_mean,
                                                        running_var, training=training, eps=eps)
    if residual:
        y = REGISTRY["add"].kernel(y, residual[0])
    out = REGISTRY["relu"].kernel(y)
    positive = REGISTRY["gt"].kernel(out, np.zeros((), out.dtype))
    return out, positive, mean, invstd


def merged_statistics(sums: np.ndarray, plane: int) -> tuple[np.ndarray, np.ndarray]:
    """Each channel's mean and biased variance (float64) from per-image shifted sums (float64
    [N, 3, C]; `plane` elements an image and channel): image n's mean K + S1/S and squared
    deviations M2 = S2 - S1 * S1/S, merged in image order by Chan's update (with m images
    merged, delta = mean_n - mean; mean += delta / (m + 1); M2 += M2_n + delta^2 * S * m /
    (m + 1)); var = M2 / (N * S), negative rounding residue clamped to 0."""
    s = float(plane)
    shift, s1, s2 = sums[:, 0], sums[:, 1], sums[:, 2]
    means = shift + s1 / s
    squares = s2 - s1 * (s1 / s)
    mean, m2 = means[0].copy(), squares[0].copy()
    for m in range(1, sums.shape[0]):
        delta = means[m] - mean
        mean = mean + delta / (m + 1)
        m2 = m2 + (squares[m] + delta * delta * (s * m / (m + 1)))
    var = m2 / (s * sums.shape[0])
    return mean, np.where(var < 0, 0.0, var)


def _normalised(x, weight, bias, mean, var, eps: float):
    """batch_norm's output, mean and invstd (graphc.ops.nn_ops) from given float64 statistics."""
    bshape = (1, -1) + (1,) * (x.ndim - 2)
    invstd = 1.0 / np.sqrt(var + eps)
    scale = invstd * weight
    out = (x.astype(np.float64) - mean.reshape(bshape)) * scale.reshape(bshape) + \
        bias.reshape(bshape)
    return out.astype(x.dtype), mean.astype(x.dtype), invstd.astype(x.dtype)


register(OpDef("batch_norm_relu", NORM,
               ("input", "weight", "bias", "running_mean", "running_var", "*residual"),
               _infer, _kernel, attrs={"training": bool, "eps": float, "sums": bool},
               doc="relu(batch_norm(x) [+ residual]) and its mask, one op (cpu pipeline only)"))


# ---- conv2d_channel_sums ---------------------------------------------------------------------
# conv2d's attributes (graphc.ops.conv registers later: this module is imported first)
CONV_ATTRS = {"stride": tuple, "padding": tuple, "dilation": tuple, "groups": int}


def _sums_infer(x: TensorType, w: TensorType, **attrs):
    out = REGISTRY["conv2d"].infer(x, w, **attrs)
    if out.ndim != 4:
        raise ShapeError(f"conv2d_channel_sums: expected a batched (4-D) input, got {x}; the "
                         "sums are per image, so an unbatched conv2d keeps the plain op")
    if out.dtype.name not in ("float32", "float64"):
        raise DTypeError(f"conv2d_channel_sums: expected float32 or float64, got {out}")
    return out, sums_type(out)


def image_sums(out: np.ndarray) -> np.ndarray:
    """The per-image shifted sums (float64 [N, 3, C]) of an (N, C, H, W) tensor: K =
    out[n, c, 0, 0], sum(d) and sum(d^2) for d = out[n, c] - K in float64."""
    wide = out.astype(np.float64)
    shift = wide[:, :, 0, 0]
    d = wide - shift[:, :, None, None]
    return np.stack([shift, d.sum(axis=(2, 3)), (d * d).sum(axis=(2, 3))], axis=1)


def _sums_kernel(x, w, **attrs):
    out = REGISTRY["conv2d"].kernel(x, w, **attrs)
    return out, image_sums(out)


register(OpDef("conv2d_channel_sums", CONTRACTION, ("input", "weight"), _sums_infer,
               _sums_kernel, attrs=CONV_ATTRS,
               doc="conv2d and its output's per-image shifted sums (cpu pipeline only)"))


# ---- batch_norm_relu_backward -----------------------------------------------------------------
def _backward_infer(grad: TensorType, positive: TensorType, x: TensorType, weight: TensorType,
                    save_mean: TensorType, save_invstd: TensorType, *residual: TensorType,
                    relu_grad: bool):
    op = "batch_norm_relu_backward"
    if x.ndim < 2 or x.dtype.name not in ("float32", "float64"):
        raise DTypeError(f"{op}: expected a float32 or float64 input of 2 or more dimensions "
                         f"(N, C, ...), got {x}; the pass makes this op only for such inputs")
    wrong = [(name, t) for name, t in (("grad", grad), *(("residual_grad", r) for r in residual))
             if t != x]
    if positive != TensorType(x.shape, bool_):
        wrong.append(("positive", positive))
    stat = TensorType((x.shape[1],), x.dtype)
    wrong += [(name, t) for name, t in (("weight", weight), ("save_mean", save_mean),
                                        ("save_invstd", save_invstd)) if t != stat]
    if len(residual) > 1:
        wrong.append(("residual_grad", residual[1]))
    if wrong:
        got = ", ".join(f"{name} {t}" for name, t in wrong)
        raise ShapeError(f"{op}: expected grad and at most one residual_grad of the input's type "
                         f"{x}, positive {TensorType(x.shape, bool_)} and weight, save_mean, "
                         f"save_invstd {stat}; got {got}: pass the values batch_norm_relu "
                         "made and read, unreshaped")
    return (x, stat, stat) + ((x,) if relu_grad else ())


def _backward_kernel(grad, positive, x, weight, save_mean, save_invstd, *residual,
                     relu_grad: bool):
    def k(op, *args, **attrs):
        return REGISTRY[op].kernel(*args, **attrs)

    axes = (0,) + tuple(range(2, x.ndim))
    channel = (1, -1) + (1,) * (x.ndim - 2)
    dy = k("add", grad, residual[0]) if residual else grad
    g = k("where", positive, dy, np.zeros(x.shape, x.dtype))
    xhat = k("mul", k("sub", x, save_mean.reshape(channel)), save_invstd.reshape(channel))
    grad_bias = k("reduce_sum", g, axes=axes, keepdim=False)
    grad_weight = k("reduce_sum", k("mul", g, xhat), axes=axes, keepdim=False)
    m = np.asarray(x.size // x.shape[1], x.dtype)
    centred = k("sub", g, k("div", grad_bias.reshape(channel), m))
    tilt = k("div", k("mul", xhat, grad_weight.reshape(channel)), m)
    scale = k("mul", weight.reshape(channel), save_invstd.reshape(channel))
    grad_input = k("mul", scale, k("sub", centred, tilt))
    return (grad_input, grad_weight, grad_bias) + ((g,) if relu_grad else ())


register(OpDef("batch_norm_relu_backward", NORM,
               ("grad", "positive", "input", "weight", "save_mean", "save_invstd",
                "*residual_grad"),
               _backward_infer, _backward_kernel, attrs={"relu_grad": bool},
               doc="batch norm's training backward after a ReLU (and a residual's gradient "
                   "added), one op (cpu pipeline only)"))
