"""Import table, part 4: ONNX's Attention (opset 23+), Resize and the loss ops.

`Attention` follows onnx.reference's definition step by step: 3-D inputs split into heads,
the past key/value concatenated, grouped-query heads repeated, Q and K each scaled by
sqrt(scale), softcap, a bias from the mask (bool: -inf where False; float: added), the
bottom-right causal frontier and sliding window (constants built with numpy, since they
depend on shapes only), softmax with fully masked rows set to 0. Losses
(`NegativeLogLikelihoodLoss`, `SoftmaxCrossEntropyLoss`) pick the target's log-probability
with `gather`, weight it, and reduce as ONNX says (mean divides by the summed weights).
`Resize` is one matmul per resized axis with weights taken from onnx's reference Resize on
an identity (every mode, coordinate transformation, antialias and extrapolation; see
`_resize_weights`), computed once per node and shape.
"""

from __future__ import annotations

import math

import numpy as np

from graphc.ops.registry import call


def _t(ctx, x):
    return ctx.tensor(x)


def _scalar(x, value):
    return call("full", shape=(), value=float(value), dtype=x.dtype.name)


def _heads(x, heads):
    b, s, hidden = x.shape
    x = call("reshape", x, shape=(b, s, heads, hidden // heads))
    return call("permute", x, dims=(0, 2, 1, 3))


def _repeat_heads(x, reps):
    b, h, s, d = x.shape
    x = call("reshape", x, shape=(b, h, 1, s, d))
    x = call("broadcast_to", x, shape=(b, h, reps, s, d))
    return call("reshape", x, shape=(b, h * reps, s, d))


def _frontier(q_len, kv_len, offset, left, right, causal):
    """The allowed (query, key) pairs as a numpy bool array: (q, kv) or (batch, 1, q, kv)."""
    i = np.arange(q_len).reshape(q_len, 1)
    j = np.arange(kv_len).reshape(1, kv_len)
    offset = np.asarray(offset)
    if offset.ndim:
        i = i + offset.reshape(-1, 1, 1)
    else:
        i = i + int(offset)
    allowed = np.ones(np.broadcast_shapes(i.shape, j.shape), bool)
    if causal:
        allowed &= j <= i
    if left >= 0:
        allowed &= (i - j) <= left
    if right >= 0:
        allowed &= (j - i) <= right
    return allowed if allowed.ndim == 2 else allowed.reshape(allowed.shape[0], 1, q_len, kv_len)


def import_attention(ctx, q, k, v, mask=None, past_key=None, past_value=None,
                     nonpad_kv_seqlen=None):
    q, k, v = _t(ctx, q), _t(ctx, k), _t(ctx, v)
    three_d = q.ndim == 3
    if three_d:
        q = _heads(q, ctx.attr("q_num_heads"))
        k = _heads(k, ctx.attr("kv_num_heads"))
        v = _heads(v, ctx.attr("kv_num_heads"))
    scale = ctx.attr("scale", 1 / math.sqrt(q.shape[3]))
    if past_key is not None:
        k = call("concat", _t(ctx, past_key), k, axis=2)
        v = call("concat", _t(ctx, past_value), v, axis=2)
    present_key, present_value = k, v
    q_len, kv_len = q.shape[2], k.shape[2]
    if q.shape[1] != k.shape[1] and q.shape[1] % k.shape[1] == 0:
        k = _repeat_heads(k, q.shape[1] // k.shape[1])
        v = _repeat_heads(v, q.shape[1] // v.shape[1])
    root = _scalar(q, math.sqrt(scale))
    scores = call("matmul", call("mul", q, root),
                  call("permute", call("mul", k, root), dims=(0, 1, 3, 2)))
    softcap = ctx.attr("softcap", None)
    if softcap:
        scores = call("mul", call("tanh", call("div", scores, _scalar(scores, softcap))),
                      _scalar(scores, softcap))
    bias = None
    if mask is not None:
        mask = _t(ctx, mask)
        if mask.shape[-1] < kv_len:
            pads = [0] * (2 * mask.ndim)
            pads[-1] = kv_len - mask.shape[-1]
            mask = call("pad", mask, pads=tuple(pads),
                        value=0.0 if mask.dtype.name == "bool" else -math.inf)
        if mask.dtype.name == "bool":
            mask = call("where", mask, _scalar(q, 0), _scalar(q, -math.inf))
        bias = mask
    left, right = ctx.attr("left_window_size", -1), ctx.attr("right_window_size", -1)
    causal = bool(ctx.attr("is_causal", 0))
    if causal or left >= 0 or right >= 0:
        if past_key is None and nonpad_kv_seqlen is not None:
            offset = ctx.static(nonpad_kv_seqlen, "nonpad_kv_seqlen").reshape(-1) - q_len
        else:
            offset = past_key.shape[2] if past_key is not None else 0
        allowed = _frontier(q_len, kv_len, offset, left, right, causal)
        frontier = np.where(allowed, 0.0, -np.inf).astype(q.dtype.np)
        bias = _t(ctx, frontier) if bias is None else call("add", bias, _t(ctx, frontier))
    if nonpad_kv_seqlen is not None:
        lengths = ctx.static(nonpad_kv_seqlen, "nonpad_kv_seqlen").reshape(-1, 1)
        keep = (np.arange(kv_len) < lengths).reshape(-1, 1, 1, kv_len)
        padding = _t(ctx, np.where(keep, 0.0, -np.inf).astype(q.dtype.np))
        bias = padding if bias is None else call("add", bias, padding)
    with_bias = scores if bias is None else call("add", scores, bias)
    top = call("reduce_max", with_bias, axes=(3,), keepdim=True)
    top = call("where", call("eq", top, _scalar(top, -math.inf)), _scalar(top, 0), top)
    e = call("exp", call("sub", with_bias, top))
    total = call("reduce_sum", e, axes=(3,), keepdim=True)
    probs = call("div", e, call("where", call("eq", total, _scalar(total, 0)),
                                _scalar(total, 1), total))
    if bias is not None:  # rows the bias masks entirely attend to nothing
        dead = call("eq", call("reduce_max", call("broadcast_to", bias, shape=tuple(
            np.broadcast_shapes(tuple(bias.shape), tuple(with_bias.shape)))),
            axes=(bias.ndim - 1,), keepdim=True), _scalar(q, -math.inf))
        probs = call("where", dead, _scalar(probs, 0), probs)
    y = call("matmul", probs, v)
    if three_d:
        y = call("permute", y, dims=(0, 2, 1, 3))
        y = call("reshape", y, shape=(y.shape[0], y.shape[1], y.shape[2] * y.shape[3]))
    mode = ctx.attr("qk_matmul_output_mode", 0)
    qk = {2: with_bias, 3: probs}.get(mode, scores)
    return (y, present_key, present_value, qk)[:max(ctx.num_outputs, 1)]


def _nll(ctx, logp, target, weight):
    """ONNX's NegativeLogLikelihoodLoss on log-probabilities (N, C, d1, ...)."""
    target = _t(ctx, target)
    if target.dtype.name != "int64":
        target = call("cast", target, dtype="int64")
    ignore = ctx.attr("ignore_index", None)
    valid = None
    if ignore is not None:
        valid = call("ne", target, call("full", shape=(), value=ignore, dtype="int64"))
        target = call("where", valid, target, call("full", shape=(), value=0, dtype="int64"))
    shape = list(target.shape)
    shape.insert(1, 1)
    picked = call("gather", logp, call("reshape", target, shape=tuple(shape)), axis=1)
    picked = call("reshape", picked, shape=tuple(target.shape))
    w = (call("full", shape=tuple(target.shape), value=1.0, dtype=logp.dtype.name)
         if weight is None else call("take", _t(ctx, weight), target, axis=0))
    if valid is not None:
        w = call("where", valid, w, _scalar(w, 0))
    loss = call("neg", call("mul", picked, w))
    reduction = ctx.attr("reduction", "mean")
    axes = tuple(range(loss.ndim))
    if reduction == "none":
        return loss
    total = call("reduce_sum", loss, axes=axes, keepdim=False)
    if reduction == "sum":
        return total
    return call("div", total, call("reduce_sum", w, axes=axes, keepdim=False))


def import_nll_loss(ctx, logp, target, weight=None):
    return _nll(ctx, _t(ctx, logp), target, weight)


def import_softmax_cross_entropy(ctx, scores, labels, weight=None):
    logp = call("log_softmax", _t(ctx, scores), dim=1)
    loss = _nll(ctx, logp, labels, weight)
    return (loss, logp) if ctx.wants(1) else loss


_RESIZE_ATTRS = ("mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a",
                 "exclude_outside", "extrapolation_value", "antialias")


def _resize_weights(ctx, n, scale, size, roi):
    """Resize along one axis as `y = x @ w + b` (w: n x m, b: m): what onnx's reference
    Resize gives for the rows of an identity (w + b) and for zeros (b), with this node's
    interpolation attributes. Resize is linear in the data and separable, so these weights
    are exact; they depend on shapes and attributes only, never on the data."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    attrs = {k: ctx.attrs[k] for k in _RESIZE_ATTRS if k in ctx.attrs}
    inputs = [helper.make_tensor_value_info("x", 11, None)]
    names = ["x", "roi" if roi is not None else "", "scales" if size is None else ""]
    feeds = {}
    if roi is not None:
        feeds["roi"] = np.array(roi, np.float32)
    if size is None:
        feeds["scales"] = np.array([scale], np.float32)
    else:
        names.append("sizes")
        feeds["sizes"] = np.array([size], np.int64)
    node = helper.make_node("Resize", names, ["y"], axes=[1], **attrs)
    graph = helper.make_graph([node], "weights", inputs,
                              [helper.make_tensor_value_info("y", 11, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    ref = ReferenceEvaluator(model)
    b = ref.run(None, {"x": np.zeros((1, n)), **feeds})[0]
    return ref.run(None, {"x": np.eye(n), **feeds})[0] - b, b[0]


def import_resize(ctx, x, roi=None, scales=None, sizes=None):
    x = _t(ctx, x)
    scales = None if scales is None else np.ravel(ctx.static(scales, "scales"))
    sizes = None if sizes is None else np.ravel(ctx.static(sizes, "sizes"))
    scales = None if scales is not None and scales.size == 0 else scales
    sizes = None if sizes is not None and sizes.size == 0 else sizes
    roi = None if roi is None else np.ravel(ctx.static(roi, "roi")).astype(np.float64)
    roi = None if roi is not None and roi.size == 0 else roi
    axes = [a % x.ndim for a in ctx.attr("axes", range(x.ndim))]
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    if sizes is not None and policy != "stretch":
        ratios = [sizes[i] / x.shape[a] for i, a in enumerate(axes)]
        common = min(ratios) if policy == "not_larger" else max(ratios)
        wanted = [int(common * x.shape[a] + 0.5) for a in axes]
        if any(int(common * x.shape[a]) != w for a, w in zip(axes, wanted)):
            raise ctx.refuse(f"keep_aspect_ratio_policy={policy!r} with a rounded-up size")
        scales, sizes = np.full(len(axes), common), None
    y = x if x.dtype.is_floating else call("cast", x, dtype="float64")
    k = len(axes)
    for i, a in enumerate(axes):
        n = x.shape[a]
        axis_roi = None if roi is None else [roi[i], roi[k + i]]
        key = (n, None if scales is None else float(scales[i]),
               None if sizes is None else int(sizes[i]),
               None if axis_roi is None else tuple(axis_roi))
        if key not in ctx.cache:
            ctx.cache[key] = _resize_weights(ctx, *key[:3], axis_roi)
        w, b = ctx.cache[key]
        dims = tuple(d for d in range(x.ndim) if d != a) + (a,)
        moved = call("permute", y, dims=dims)
        moved = call("add", call("matmul", moved, ctx.tensor(w.astype(y.dtype.np))),
                     ctx.tensor(b.astype(y.dtype.np)))
        y = call("permute", moved, dims=tuple(int(d) for d in np.argsort(dims)))
    return y if y.dtype is x.dtype else call("cast", y, dtype=x.dtype.name)


def import_upsample(ctx, x, scales=None):
    """Upsample (deprecated): Resize with asymmetric coordinates and floor rounding."""
    if scales is None:
        scales = np.array(ctx.attr("scales"), np.float32)
    ctx.attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    ctx.attrs.pop("scales", None)
    return import_resize(ctx, x, None, scales)


def import_swiglu(ctx, a, b):
    a, b = _t(ctx, a), _t(ctx, b)
    gate = call("sigmoid", call("mul", a, _scalar(a, ctx.attr("alpha", 1.0))))
    return call("mul", call("mul", a, gate), b)


def _last_slice(x, start, stop, step=1):
    starts = (0,) * (x.ndim - 1) + (start,)
    stops = tuple(x.shape[:-1]) + (stop,)
    return call("slice", x, starts=starts, stops=stops, steps=(1,) * (x.ndim - 1) + (step,))


def import_rotary_embedding(ctx, x, cos, sin, position_ids=None):
    x, cos, sin = _t(ctx, x), _t(ctx, cos), _t(ctx, sin)
    shape = tuple(x.shape)
    if x.ndim == 4:  # (batch, heads, seq, head) -> (batch, seq, heads, head)
        x = call("permute", x, dims=(0, 2, 1, 3))
    else:
        heads = ctx.attr("num_heads")
        x = call("reshape", x, shape=(shape[0], shape[1], heads, shape[2] // heads))
    head = x.shape[3]
    dim = ctx.attr("rotary_embedding_dim", 0) or head
    if position_ids is not None:
        ids = _t(ctx, position_ids)
        cos, sin = (call("take", c, ids, axis=0) for c in (cos, sin))
    cos, sin = (call("reshape", c, shape=(*c.shape[:-1], 1, c.shape[-1])) for c in (cos, sin))
    rotate = _last_slice(x, 0, dim)
    if ctx.attr("interleaved", 0):
        x1, x2 = _last_slice(rotate, 0, dim, 2), _last_slice(rotate, 1, dim, 2)
    else:
        x1, x2 = _last_slice(rotate, 0, dim // 2), _last_slice(rotate, dim // 2, dim)
    real = call("sub", call("mul", cos, x1), call("mul", sin, x2))
    imag = call("add", call("mul", sin, x1), call("mul", cos, x2))
    if ctx.attr("interleaved", 0):
        pair = (*real.shape, 1)
        rotated = call("concat", call("reshape", real, shape=pair),
                       call("reshape", imag, shape=pair), axis=real.ndim)
        rotated = call("reshape", rotated, shape=tuple(rotate.shape))
    else:
        rotated = call("concat", real, imag, axis=3)
    if dim < head:
        rotated = call("concat", rotated, _last_slice(x, dim, head), axis=3)
    if len(shape) == 4:
        return call("permute", rotated, dims=(0, 2, 1, 3))
    return call("reshape", rotated, shape=shape)


def import_cum_prod(ctx, x, axis):
    """Running product along an axis, one multiply per position (no cumprod primitive)."""
    x = _t(ctx, x)
    dim = int(np.ravel(ctx.static(axis, "axis"))[0]) % x.ndim
    n = x.shape[dim]
    order = range(n - 1, -1, -1) if ctx.attr("reverse", 0) else range(n)
    shape = list(x.shape)
    shape[dim] = 1
    running = call("full", shape=tuple(shape), value=1.0, dtype=x.dtype.name)
    out = [None] * n
    for i in order:
        starts = tuple(i if d == dim else 0 for d in range(x.ndim))
        stops = tuple(i + 1 if d == dim else x.shape[d] for d in range(x.ndim))
        step = call("slice", x, starts=starts, stops=stops, steps=(1,) * x.ndim)
        if ctx.attr("exclusive", 0):
            out[i], running = running, call("mul", running, step)
        else:
            running = call("mul", running, step)
            out[i] = running
    return call("concat", *out, axis=dim) if n else call("copy", x)


def import_causal_conv_with_state(ctx, x, w, b=None, past=None):
    """A depthwise causal conv1d over [past state, input]; the state is the last k-1 steps."""
    x, w = _t(ctx, x), _t(ctx, w)
    n, c, length = x.shape
    k = w.shape[2]
    past = (call("full", shape=(n, c, k - 1), value=0.0, dtype=x.dtype.name) if past is None
            else _t(ctx, past))
    padded = call("concat", past, x, axis=2)
    total = padded.shape[2]
    y = call("conv2d", call("reshape", padded, shape=(n, c, 1, total)),
             call("reshape", w, shape=(c, 1, 1, k)), stride=(1, 1), padding=(0, 0),
             dilation=(1, 1), groups=c)
    y = call("reshape", y, shape=(n, c, total - k + 1))
    if b is not None:
        y = call("add", y, call("reshape", _t(ctx, b), shape=(c, 1)))
    if ctx.attr("activation", "none") in ("silu", "swish"):
        y = call("mul", y, call("sigmoid", y))
    state = call("slice", padded, starts=(0, 0, total - (k - 1)), stops=(n, c, total),
                 steps=(1, 1, 1))
    return y, state


def _step(x, t):
    """x[:, :, t:t+1, :] of a (B, H, T, D) tensor."""
    b, h, _, d = x.shape
    return call("slice", x, starts=(0, 0, t, 0), stops=(b, h, t + 1, d), steps=(1, 1, 1, 1))


def import_linear_attention(ctx, q, k, v, past=None, decay=None, beta=None):
    """Linear attention as its recurrence over time (linear, gated, delta, gated_delta):
    state <- state * exp(decay_t); v_t <- beta_t (v_t - k_t state) for the delta rules;
    state <- state + k_t^T v_t; out_t = scale * q_t state (kv heads repeated for q's)."""
    q_heads, kv_heads = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    rule = ctx.attr("update_rule", "gated_delta")
    q, k, v = (_heads(_t(ctx, z), h) for z, h in ((q, q_heads), (k, kv_heads), (v, kv_heads)))
    b, _, steps, d_k = q.shape
    d_v = v.shape[3]
    group = q_heads // kv_heads
    if decay is not None:
        decay = _t(ctx, decay)
        if decay.shape[-1] == kv_heads:
            decay = call("permute", call("reshape", decay, shape=(b, steps, kv_heads, 1)),
                         dims=(0, 2, 1, 3))
        else:
            decay = _heads(decay, kv_heads)
    if beta is not None:
        beta = _t(ctx, beta)
        beta = call("permute", call("reshape", beta, shape=(b, steps, beta.shape[-1], 1)),
                    dims=(0, 2, 1, 3))
    state = (call("full", shape=(b, kv_heads, d_k, d_v), value=0.0, dtype=q.dtype.name)
             if past is None else _t(ctx, past))
    scale = ctx.attr("scale", 0.0) or 1.0 / math.sqrt(d_k)
    outs = []
    for t in range(steps):
        k_t, v_t = _step(k, t), _step(v, t)  # (B, H, 1, d)
        if rule in ("gated", "gated_delta"):
            g = call("exp", _step(decay, t))  # (B, H, 1, 1 or d_k)
            state = call("mul", state, call("permute", g, dims=(0, 1, 3, 2)))
        if rule in ("delta", "gated_delta"):
            retrieved = call("matmul", k_t, state)
            v_t = call("mul", _step(beta, t), call("sub", v_t, retrieved))
        state = call("add", state, call("matmul", call("permute", k_t, dims=(0, 1, 3, 2)), v_t))
        read = state if group == 1 else _repeat_heads(state, group)
        outs.append(call("mul", call("matmul", _step(q, t), read), _scalar(q, scale)))
    y = call("concat", *outs, axis=2)  # (B, Hq, T, d_v)
    y = call("reshape", call("permute", y, dims=(0, 2, 1, 3)), shape=(b, steps, q_heads * d_v))
    return y, state


def import_tensor_scatter(ctx, cache, update, write_indices=None):
    """A KV-cache write: along `axis`, cache position p of batch b takes update[p - w_b]
    (modulo the cache length in circular mode) where that lies inside the update."""
    cache, update = _t(ctx, cache), _t(ctx, update)
    axis = ctx.attr("axis", -2) % cache.ndim
    length, steps = cache.shape[axis], update.shape[axis]
    ones = (1,) * cache.ndim
    shape = list(ones)
    shape[axis] = length
    positions = call("reshape", call("arange", start=0.0, end=float(length), step=1.0,
                                     dtype="int64"), shape=tuple(shape))
    if write_indices is None:
        offset = call("full", shape=(), value=0, dtype="int64")
    else:
        offset = call("reshape", _t(ctx, write_indices),
                      shape=(cache.shape[0],) + ones[1:])
    source = call("sub", positions, offset)
    if ctx.attr("mode", "linear") == "circular":
        source = call("remainder", source, call("full", shape=(), value=length, dtype="int64"))
    inside = call("logical_and", call("ge", source, call("full", shape=(), value=0,
                                                         dtype="int64")),
                  call("lt", source, call("full", shape=(), value=steps, dtype="int64")))
    safe = call("where", inside, source, call("full", shape=(), value=0, dtype="int64"))
    safe = call("broadcast_to", safe, shape=tuple(cache.shape))
    return call("where", inside, call("gather", update, safe, axis=axis), cache)


EXTRA_IMPORTERS = {
    "TensorScatter": import_tensor_scatter,
    "LinearAttention": import_linear_attention,
    "CausalConvWithState": import_causal_conv_with_state,
    "SwiGLU": import_swiglu, "RotaryEmbedding": import_rotary_embedding,
    "CumProd": import_cum_prod,
    "Resize": import_resize, "Upsample": import_upsample,
    "Attention": import_attention, "NegativeLogLikelihoodLoss": import_nll_loss,
    "SoftmaxCrossEntropyLoss": import_softmax_cross_entropy,
}
