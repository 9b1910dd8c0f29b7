"""OpInfo entries for issue 12's vision composites (graphc.nn.functional_vision): 1-d and
transposed convolution, interpolation in every mode, adaptive pooling (with indices), padding
modes and activations. What each entry checks, and the shared helpers, are described in
tests/opinfos/nn_composites.py."""

from __future__ import annotations

import numpy as np

import graphc.nn.functional as F
from graphc.errors import ArgumentError
from tests.opinfo import OpInfo, Sample, arr
from tests.opinfos.nn_composites import _F, _err, _kinked


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


OP_INFOS: list[OpInfo] = [
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
