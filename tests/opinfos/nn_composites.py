"""OpInfo entries for issue 12's nn composites (graphc.nn.functional, functional_vision,
graphc.utils.composites): normalisation and attention, vision (1-d and transposed convolution,
interpolation, adaptive pooling, padding modes, activations) and losses.

Each is a decomposition into registry primitives, so these entries check its forward against a
float64 numpy reference and PyTorch, its gradient, its error inputs (PyTorch's class and
wording), and, through tests/compile_opinfo.py, its traced and compiled form. Already covered
elsewhere: softmax, log_softmax, cross_entropy, mse_loss, binary_cross_entropy_with_logits
(nn_ops.py), gelu, leaky_relu (elementwise.py) and constant pad (movement.py).

The module runs past 800 lines on purpose: it is issue 12's one group, in three sections
(normalisation and attention, vision, losses) that share the helpers at the top."""

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


# ---- 1-d and transposed convolution ----------------------------------------------------------
def _pair(v, n=2):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


def _np_conv1d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    xp = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(padding, padding)])
    k = w.shape[-1]
    n_out = (xp.shape[-1] - dilation * (k - 1) - 1) // stride + 1
    taps = np.stack([xp[..., j * dilation:j * dilation + stride * (n_out - 1) + 1:stride]
                     for j in range(k)], -1)  # (..., C, L_out, k)
    cin, cout = w.shape[1], w.shape[0] // groups
    out = np.concatenate([np.einsum("...clk,ock->...ol", taps[..., g * cin:(g + 1) * cin, :, :],
                                    w[g * cout:(g + 1) * cout]) for g in range(groups)], -2)
    return out + b[:, None] if b is not None else out


def _np_conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1,
                         dilation=1):
    """Each input pixel scatters its kernel-weighted copy into the output, then the
    padding is cropped."""
    s, p, o, d = (_pair(v) for v in (stride, padding, output_padding, dilation))
    (h, wd), (kh, kw) = x.shape[-2:], w.shape[2:]
    cin, cout = x.shape[-3] // groups, w.shape[1]
    full = [(n - 1) * s[a] + d[a] * (k - 1) + 1 + o[a] for a, (n, k) in enumerate(((h, kh),
                                                                                   (wd, kw)))]
    out = np.zeros(x.shape[:-3] + (cout * groups, *full))
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                out[..., g * cout:(g + 1) * cout,
                    i * d[0]:i * d[0] + (h - 1) * s[0] + 1:s[0],
                    j * d[1]:j * d[1] + (wd - 1) * s[1] + 1:s[1]] += np.einsum(
                        "...chw,co->...ohw", x[..., g * cin:(g + 1) * cin, :, :],
                        w[g * cin:(g + 1) * cin, :, i, j])
    out = out[..., p[0]:full[0] - p[0], p[1]:full[1] - p[1]]
    return out + b[:, None, None] if b is not None else out


def _np_conv_transpose1d(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1,
                         dilation=1):
    out = _np_conv_transpose2d(x[..., None, :], w[..., None, :], b, (1, stride), (0, padding),
                               (0, output_padding), groups, (1, dilation))
    return out[..., 0, :]


def _conv1d_samples(rng):
    return [Sample((arr(rng, 2, 3, 7), arr(rng, 4, 3, 3)), desc="default"),
            Sample((arr(rng, 4, 8), arr(rng, 4, 2, 2), arr(rng, 4)),
                   {"stride": 2, "padding": 1, "dilation": 2, "groups": 2},
                   desc="unbatched, bias, stride, padding, dilation, groups")]


def _conv_transpose1d_samples(rng):
    return [Sample((arr(rng, 2, 3, 5), arr(rng, 3, 2, 3)), desc="default"),
            Sample((arr(rng, 1, 4, 4), arr(rng, 4, 3, 3), arr(rng, 6)),
                   {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2,
                    "dilation": 2}, desc="bias, stride, padding, output_padding, groups, "
                                         "dilation")]


def _conv_transpose2d_samples(rng):
    return [Sample((arr(rng, 1, 2, 3, 3), arr(rng, 2, 3, 3, 3)), desc="default"),
            Sample((arr(rng, 2, 2, 3, 4), arr(rng, 2, 2, 3, 2), arr(rng, 2)),
                   {"stride": 2, "padding": 1, "output_padding": 1},
                   desc="bias, stride, padding, output_padding"),
            Sample((arr(rng, 4, 3, 3), arr(rng, 4, 1, 2, 2)),
                   {"stride": (2, 1), "groups": 2, "dilation": 2, "output_padding": (1, 0)},
                   desc="unbatched, groups, dilation, output_padding below dilation")]


def _conv1d_errors(rng):
    return [_err([arr(rng, 2, 3, 4, 5), arr(rng, 4, 3, 3)], RuntimeError,
                 "Expected 2D (unbatched) or 3D (batched) input to conv1d, but got input of "
                 "size: [2, 3, 4, 5]")]


def _conv_transpose1d_errors(rng):
    # PyTorch raises RuntimeError for output_padding; graphc an ArgumentError (a ValueError)
    return [_err([arr(rng, 1, 2, 3), arr(rng, 2, 4, 3)], ArgumentError,
                 "output padding must be smaller than either stride or dilation, but got "
                 "output_padding_height: 0 output_padding_width: 2 stride_height: 1 "
                 "stride_width: 2 dilation_height: 1 dilation_width: 1", stride=2,
                 output_padding=2)]


def _conv_transpose2d_errors(rng):
    return [_err([arr(rng, 1, 2, 3, 3), arr(rng, 3, 4, 3, 3)], RuntimeError,
                 "Given transposed=1, weight of size [3, 4, 3, 3], expected input[1, 2, 3, 3] "
                 "to have 3 channels, but got 2 channels instead")]


OP_INFOS += [
    OpInfo("conv1d", F.conv1d, _np_conv1d, _conv1d_samples, ("conv2d", "reshape"),
           torch_fn=_F("conv1d"), error_inputs=_conv1d_errors),
    OpInfo("conv_transpose1d", F.conv_transpose1d, _np_conv_transpose1d,
           _conv_transpose1d_samples, ("conv2d_input_grad", "reshape"),
           torch_fn=_F("conv_transpose1d"), error_inputs=_conv_transpose1d_errors),
    OpInfo("conv_transpose2d", F.conv_transpose2d, _np_conv_transpose2d,
           _conv_transpose2d_samples, ("conv2d_input_grad", "conv2d_weight_grad", "pad"),
           torch_fn=_F("conv_transpose2d"), error_inputs=_conv_transpose2d_errors),
]


# ---- interpolation and adaptive pooling -----------------------------------------------------
def _windows(n, out):
    return [((i * n) // out, -(-(i + 1) * n // out)) for i in range(out)]


def _resize_matrix(n, out, mode, align_corners, scale):
    """(out, n): row i holds the weights output i takes from each input along one axis."""
    m, dst = np.zeros((out, n)), np.arange(out)
    ratio = 1 / scale if scale else n / out
    if mode == "area":
        for i, (lo, hi) in enumerate(_windows(n, out)):
            m[i, lo:hi] = 1 / (hi - lo)
        return m
    if mode in ("nearest", "nearest-exact"):
        shift = 0.5 if mode == "nearest-exact" else 0.0
        m[dst, np.minimum(np.floor((dst + shift) * ratio).astype(int), n - 1)] = 1
        return m
    if align_corners:
        src = dst * ((n - 1) / (out - 1)) if out > 1 else 0.0 * dst
    else:
        src = (dst + 0.5) * ratio - 0.5
        src = src if mode == "bicubic" else np.maximum(src, 0)
    base = np.floor(src).astype(int)
    t = src - base
    if mode == "bicubic":  # Keys' kernel, A = -0.75
        a = -0.75
        near = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1  # noqa: E731
        far = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a  # noqa: E731
        taps = zip((-1, 0, 1, 2), (far(t + 1), near(t), near(1 - t), far(2 - t)))
    else:
        taps = zip((0, 1), (1 - t, t))
    for offset, weight in taps:
        np.add.at(m, (dst, np.clip(base + offset, 0, n - 1)), weight)
    return m


def _np_interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None):
    dims = x.ndim - 2
    scales = _pair(scale_factor, dims) if scale_factor is not None else (None,) * dims
    sizes = _pair(size, dims) if size is not None else tuple(
        int(np.floor(n * s)) for n, s in zip(x.shape[2:], scales))
    for axis, (n_out, scale) in enumerate(zip(sizes, scales), 2):
        m = _resize_matrix(x.shape[axis], n_out, mode, align_corners,
                           None if align_corners else scale)
        x = np.moveaxis(np.tensordot(x, m, axes=([axis], [1])), -1, axis)
    return x


def _interp_nearest_samples(rng):
    return [Sample((arr(rng, 1, 2, 3, 4),), {"scale_factor": 2}, desc="nearest x2"),
            Sample((arr(rng, 1, 2, 4, 3),), {"size": (3, 5), "mode": "nearest-exact"},
                   desc="nearest-exact"),
            Sample((arr(rng, 2, 1, 4, 5),), {"size": (2, 3), "mode": "area"}, desc="area")]


def _interp_linear_samples(rng):
    return [Sample((arr(rng, 1, 2, 3, 4),), {"size": (5, 6), "mode": "bilinear"},
                   desc="bilinear"),
            Sample((arr(rng, 1, 2, 3, 3),), {"scale_factor": 1.5, "mode": "bilinear",
                                             "align_corners": True},
                   desc="bilinear align_corners"),
            Sample((arr(rng, 2, 2, 3),), {"scale_factor": 1.5, "mode": "linear"},
                   desc="linear, non-integer scale"),
            Sample((arr(rng, 1, 1, 2, 3, 3),), {"size": (3, 4, 2), "mode": "trilinear"},
                   desc="trilinear")]


def _interp_bicubic_samples(rng):
    return [Sample((arr(rng, 1, 2, 3, 4),), {"size": (5, 3), "mode": "bicubic"},
                   desc="bicubic"),
            Sample((arr(rng, 1, 1, 4, 4),), {"scale_factor": 1.5, "mode": "bicubic",
                                             "align_corners": True},
                   desc="bicubic align_corners")]


def _interp_errors(rng):
    x = arr(rng, 1, 1, 4, 4)
    # PyTorch raises NotImplementedError for a mode's rank; graphc an ArgumentError
    return [_err([x], ArgumentError, "Got 4D input, but linear mode needs 3D input", size=3,
                 mode="linear"),
            _err([x], ValueError, "only one of size or scale_factor should be defined", size=3,
                 scale_factor=2.0),
            _err([x], ValueError, "align_corners option can only be set with the interpolating "
                 "modes: linear | bilinear | bicubic | trilinear", size=3, align_corners=True),
            _err([x], ValueError, "Input and output must have the same number of spatial "
                 "dimensions, but got input with spatial dimensions of [4, 4] and output size "
                 "of (3, 3, 3).", size=(3, 3, 3))]


def _np_adaptive(x, output_size, dims, reduce):
    sizes = _pair(output_size, dims)
    for axis, out in enumerate(sizes, x.ndim - dims):
        if out is not None:
            x = np.concatenate([reduce(x.take(range(lo, hi), axis), axis, keepdims=True)
                                for lo, hi in _windows(x.shape[axis], out)], axis)
    return x


def _np_adaptive_avg_pool1d(x, output_size):
    return _np_adaptive(x, output_size, 1, np.mean)


def _np_adaptive_avg_pool2d(x, output_size):
    return _np_adaptive(x, output_size, 2, np.mean)


def _np_adaptive_max_pool1d(x, output_size):
    return _np_adaptive(x, output_size, 1, np.max)


def _np_adaptive_max_pool2d(x, output_size):
    return _np_adaptive(x, output_size, 2, np.max)


def _adaptive1d_samples(rng):
    return [Sample((arr(rng, 2, 3, 7), 3), desc="uneven windows"),
            Sample((arr(rng, 3, 6), 2), desc="unbatched, even windows")]


def _adaptive2d_samples(rng):
    return [Sample((arr(rng, 1, 2, 5, 7), (3, 4)), desc="uneven windows"),
            Sample((arr(rng, 2, 4, 6), (2, None)), desc="unbatched, None keeps a size"),
            Sample((arr(rng, 1, 2, 4, 4), 2), desc="even windows")]


def _adaptive_errors(name, dims):
    def errors(rng):
        if dims == 1:
            return [_err([arr(rng, 4), 2], RuntimeError,
                         f"Expected 2 to 3 dimensions, but got 1-dimensional tensor for argument "
                         f"#1 'self' (while checking arguments for {name})")]
        colon = ":" if "max" in name else ""
        return [_err([arr(rng, 4, 4), 2], RuntimeError,
                     f"{name}(): Expected 3D or 4D tensor, but got{colon} [4, 4]")]

    return errors


def _np_adaptive_max_indices(x, output_size, dims):
    """Flat position in each input plane of each window's first maximum (row-major)."""
    spatial = x.shape[-dims:]
    sizes = tuple(n if o is None else o for n, o in zip(spatial, _pair(output_size, dims)))
    out = np.zeros(x.shape[:-dims] + sizes, np.int64)
    for at in np.ndindex(*sizes):
        box = [slice(*_windows(n, o)[i]) for n, o, i in zip(spatial, sizes, at)]
        window = x[(..., *box)]
        first = window.reshape(window.shape[:-dims] + (-1,)).argmax(-1)
        local = np.unravel_index(first, window.shape[-dims:])
        out[(..., *at)] = np.ravel_multi_index([b.start + k for b, k in zip(box, local)],
                                               spatial)
    return out


def _np_adaptive_max_pool1d_indices(x, output_size):
    return _np_adaptive_max_indices(x, output_size, 1)


def _np_adaptive_max_pool2d_indices(x, output_size):
    return _np_adaptive_max_indices(x, output_size, 2)


def _adaptive_max_pool1d_indices(x, output_size):
    return F.adaptive_max_pool1d(x, output_size, return_indices=True)[1]


def _adaptive_max_pool2d_indices(x, output_size):
    return F.adaptive_max_pool2d(x, output_size, return_indices=True)[1]


def _torch_adaptive_max_pool1d_indices(x, output_size):
    import torch.nn.functional as tF

    return tF.adaptive_max_pool1d(x, output_size, return_indices=True)[1]


def _torch_adaptive_max_pool2d_indices(x, output_size):
    import torch.nn.functional as tF

    return tF.adaptive_max_pool2d(x, output_size, return_indices=True)[1]


def _ties(rng, *shape):
    return rng.integers(0, 3, size=shape).astype(np.float32)


def _indices1d_samples(rng):
    return [Sample((arr(rng, 2, 3, 7), 3), desc="uneven windows"),
            Sample((_ties(rng, 3, 6), 4), desc="unbatched, ties")]


def _indices2d_samples(rng):
    return [Sample((arr(rng, 1, 2, 5, 7), (3, 4)), desc="uneven windows"),
            Sample((_ties(rng, 2, 4, 6), (3, None)), desc="unbatched, ties"),
            Sample((_ties(rng, 1, 2, 4, 4), 2), desc="even windows, ties")]


OP_INFOS += [
    OpInfo("interpolate", F.interpolate, _np_interpolate, _interp_nearest_samples,
           ("take", "reduce_mean"), torch_fn=_F("interpolate"), error_inputs=_interp_errors),
    OpInfo("interpolate_linear", F.interpolate, _np_interpolate, _interp_linear_samples,
           ("take", "mul", "add"), torch_fn=_F("interpolate")),
    OpInfo("interpolate_bicubic", F.interpolate, _np_interpolate, _interp_bicubic_samples,
           ("take", "mul", "add"), torch_fn=_F("interpolate")),
    OpInfo("adaptive_avg_pool1d", F.adaptive_avg_pool1d, _np_adaptive_avg_pool1d,
           _adaptive1d_samples, ("reduce_mean", "slice", "concat"),
           torch_fn=_F("adaptive_avg_pool1d"),
           error_inputs=_adaptive_errors("adaptive_avg_pool1d", 1)),
    OpInfo("adaptive_avg_pool2d", F.adaptive_avg_pool2d, _np_adaptive_avg_pool2d,
           _adaptive2d_samples, ("reduce_mean", "slice", "concat"),
           torch_fn=_F("adaptive_avg_pool2d"),
           error_inputs=_adaptive_errors("adaptive_avg_pool2d", 2)),
    OpInfo("adaptive_max_pool1d", F.adaptive_max_pool1d, _np_adaptive_max_pool1d,
           _adaptive1d_samples, ("max_pool2d", "argmax", "gather"),
           torch_fn=_F("adaptive_max_pool1d"),
           error_inputs=_adaptive_errors("adaptive_max_pool1d", 1)),
    OpInfo("adaptive_max_pool2d", F.adaptive_max_pool2d, _np_adaptive_max_pool2d,
           _adaptive2d_samples, ("max_pool2d", "argmax", "gather"),
           torch_fn=_F("adaptive_max_pool2d"),
           error_inputs=_adaptive_errors("adaptive_max_pool2d", 2)),
    OpInfo("adaptive_max_pool1d_indices", _adaptive_max_pool1d_indices,
           _np_adaptive_max_pool1d_indices, _indices1d_samples, ("argmax", "gather"),
           torch_fn=_torch_adaptive_max_pool1d_indices, differentiable=False, exact=True),
    OpInfo("adaptive_max_pool2d_indices", _adaptive_max_pool2d_indices,
           _np_adaptive_max_pool2d_indices, _indices2d_samples, ("max_pool2d", "argmax"),
           torch_fn=_torch_adaptive_max_pool2d_indices, differentiable=False, exact=True),
]


# ---- padding modes ---------------------------------------------------------------------------
def _np_pad(x, pad, mode="constant", value=None):
    widths = [(0, 0)] * (x.ndim - len(pad) // 2) + [
        (pad[2 * k], pad[2 * k + 1]) for k in reversed(range(len(pad) // 2))]
    return np.pad(x, widths, mode={"reflect": "reflect", "replicate": "edge",
                                   "circular": "wrap"}[mode])


def _pad_samples(rng):
    return [Sample((arr(rng, 1, 2, 5), (2, 1), "reflect"), desc="reflect 1-d"),
            Sample((arr(rng, 2, 3, 4), (1, 2, 2, 0), "reflect"), desc="reflect 2-d unbatched"),
            Sample((arr(rng, 1, 2, 3, 4), (1, 2, 2, 0), "replicate"), desc="replicate 2-d"),
            Sample((arr(rng, 1, 1, 2, 3, 3), (1, 1, 2, 0, 0, 1), "circular"),
                   desc="circular 3-d")]


def _pad_errors(rng):
    # PyTorch raises RuntimeError (NotImplementedError for the rank); graphc an ArgumentError
    return [_err([arr(rng, 1, 2, 3), (3, 3), "reflect"], ArgumentError,
                 "Argument #4: Padding size should be less than the corresponding input "
                 "dimension, but got: padding (3, 3) at dimension 2 of input [1, 2, 3]"),
            _err([arr(rng, 1, 2, 3), (4, 0), "circular"], ArgumentError,
                 "Padding value causes wrapping around more than once."),
            _err([arr(rng, 3), (1, 1), "replicate"], ArgumentError,
                 "Padding size 2 is not supported for 1D input tensor.")]


OP_INFOS += [
    OpInfo("pad_modes", F.pad, _np_pad, _pad_samples, ("concat", "slice", "flip",
                                                        "broadcast_to"),
           torch_fn=_F("pad"), error_inputs=_pad_errors),
]


# ---- activations -----------------------------------------------------------------------------
def _kinked(rng, *shape, low=-4.0, high=4.0, kinks=()):
    """Random values at least 0.1 from each kink (where the gradient jumps)."""
    x = rng.uniform(low, high, size=shape)
    for k in kinks:
        x = np.where(np.abs(x - k) < 0.1, x + 0.2 * np.sign(x - k + 1e-12), x)
    return x.astype(np.float32)


def _np_hardtanh(x, min_val=-1.0, max_val=1.0):
    return np.clip(x, min_val, max_val)


def _np_relu6(x):
    return np.clip(x, 0, 6)


def _np_hardsigmoid(x):
    return np.clip(x + 3, 0, 6) / 6


def _np_hardswish(x):
    return x * np.clip(x + 3, 0, 6) / 6


def _np_silu(x):
    return x / (1 + np.exp(-x))


def _np_mish(x):
    return x * np.tanh(np.log1p(np.exp(x)))


def _np_elu(x, alpha=1.0):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def _np_softplus(x, beta=1.0, threshold=20.0):
    return np.where(beta * x > threshold, x, np.log1p(np.exp(np.minimum(beta * x, threshold)))
                    / beta)


def _np_prelu(x, weight):
    w = weight.reshape((-1,) + (1,) * (x.ndim - 2)) if x.ndim >= 2 else weight
    return np.where(x > 0, x, w * x)


def _unary(kinks=(), low=-4.0, high=4.0, kwargs=None):
    def samples(rng):
        out = [Sample((_kinked(rng, 3, 4, low=low, high=high, kinks=kinks),), desc="default")]
        if kwargs:
            out.append(Sample((_kinked(rng, 2, 5, low=low, high=high, kinks=kinks),),
                              dict(kwargs), desc=", ".join(f"{k}={v}" for k, v in kwargs.items())))
        return out

    return samples


def _hardtanh_samples(rng):
    return [Sample((_kinked(rng, 3, 4, kinks=(-1, 1)),), desc="default"),
            Sample((_kinked(rng, 2, 5, kinks=(-0.5, 2)), -0.5, 2.0), desc="min_val, max_val")]


def _softplus_samples(rng):
    return [Sample((arr(rng, 3, 4, low=-4, high=4),), desc="default"),
            Sample((_kinked(rng, 2, 5, kinks=(1.5,)),), {"beta": 2.0, "threshold": 3.0},
                   desc="beta, threshold")]


def _prelu_samples(rng):
    return [Sample((_kinked(rng, 2, 3, 4, kinks=(0,)), arr(rng, 1)), desc="one weight"),
            Sample((_kinked(rng, 2, 3, 2, 2, kinks=(0,)), arr(rng, 3)), desc="per channel")]


def _hardtanh_errors(rng):
    return [_err([arr(rng, 3), 2.0, 1.0], ValueError, "min_val cannot be greater than max_val")]


def _prelu_errors(rng):
    return [_err([arr(rng, 2, 3, 5), np.ones(2, np.float32)], RuntimeError,
                 "Mismatch of parameter numbers and input channel size. Found parameter "
                 "numbers = 2 and channel size = 3."),
            _err([arr(rng, 2, 3, 5), np.ones((1, 3), np.float32)], RuntimeError,
                 "prelu: Expected `weight` to be a scalar or 1D tensor, but got: ndim = 2")]


OP_INFOS += [
    OpInfo("hardtanh", F.hardtanh, _np_hardtanh, _hardtanh_samples, ("where", "le", "ge"),
           torch_fn=_F("hardtanh"), error_inputs=_hardtanh_errors),
    OpInfo("relu6", F.relu6, _np_relu6, _unary((0, 6), low=-3, high=8), ("where",),
           torch_fn=_F("relu6")),
    OpInfo("hardsigmoid", F.hardsigmoid, _np_hardsigmoid, _unary((-3, 3), low=-5, high=5),
           ("where", "div"), torch_fn=_F("hardsigmoid")),
    OpInfo("hardswish", F.hardswish, _np_hardswish, _unary((-3, 3), low=-5, high=5),
           ("where", "mul"), torch_fn=_F("hardswish")),
    OpInfo("silu", F.silu, _np_silu, _unary(), ("sigmoid", "mul"), torch_fn=_F("silu")),
    OpInfo("mish", F.mish, _np_mish, _unary(), ("tanh", "exp", "log1p"), torch_fn=_F("mish")),
    OpInfo("elu", F.elu, _np_elu, _unary((0,), kwargs={"alpha": 0.5}), ("exp", "where"),
           torch_fn=_F("elu")),
    OpInfo("softplus", F.softplus, _np_softplus, _softplus_samples,
           ("exp", "log1p", "clamp", "where"), torch_fn=_F("softplus")),
    OpInfo("prelu", F.prelu, _np_prelu, _prelu_samples, ("where", "mul"), torch_fn=_F("prelu"),
           error_inputs=_prelu_errors),
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
