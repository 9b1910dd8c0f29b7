"""attention and attention_backward: softmax(q k^T * scale + mask) v as one op, and its gradient.

Nobody writes these ops: the cpu pipeline's `fuse_attention` pass (graphc/passes/attention.py)
makes them out of the matmul, scale, mask, softmax, matmul chain that
`scaled_dot_product_attention` and `MultiheadAttention` trace into, when the score matrix of
one (batch, head) is too big for the cache. The cpu backend lowers them as blocked kernels
that never hold the whole [L, S] score matrix (graphc/backends/cpu/attention.py); these numpy
kernels are the reference the interpreter runs, and they do materialise it.

- `attention(query, key, value, mask, scale, causal) -> (out, lse)`: query [..., L, E], key
  [..., S, E], value [..., S, Ev] with the same batch dims, `mask` an additive float mask
  broadcastable to [..., L, S] (a scalar 0 for none). With `causal`, key j is hidden from
  query i when j > i (PyTorch's `is_causal`, the top-left triangle). `lse` [..., L] is each
  query row's logsumexp of its scaled, masked scores: what the backward needs besides the
  inputs and `out`.
- `attention_backward(query, key, value, mask, out, lse, grad_out, scale, causal)
  -> (grad_query, grad_key, grad_value)`: FlashAttention-2's backward, the probabilities
  recomputed from q, k and lse: P = exp(s - lse), dV = P^T dO, dP = dO V^T,
  dS = P * (dP - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q. The mask gets no
  gradient (the pass leaves a mask that needs one alone).

A row whose every key is masked has lse = -inf and NaN results, as the unfused chain (and
PyTorch's softmax). `scaled_dot_product_attention` never hands such a row over: it gives them
0, as PyTorch 2.13 CPU, by unmasking them and zeroing their output (graphc.nn.functional).
"""

from __future__ import annotations

import numpy as np

from graphc.errors import DTypeError, ShapeError
from graphc.ops.registry import CONTRACTION, OpDef, call, register
from graphc.types import TensorType


def _check(op: str, q: TensorType, k: TensorType, v: TensorType, mask: TensorType) -> None:
    for name, t in (("query", q), ("key", k), ("value", v), ("mask", mask)):
        if not t.dtype.is_floating or t.dtype is not q.dtype:
            raise DTypeError(f"{op}: expected {name} of query's floating dtype "
                             f"{q.dtype.name}, got {t.dtype.name}; cast it first")
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ShapeError(f"{op}: expected query, key and value of one rank >= 2, got "
                         f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    if q.shape[:-2] != k.shape[:-2] or q.shape[:-2] != v.shape[:-2] or \
            q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ShapeError(f"{op}: expected query [..., L, E], key [..., S, E] and value "
                         f"[..., S, Ev] with the same batch dims, got {list(q.shape)}, "
                         f"{list(k.shape)}, {list(v.shape)}")
    scores = q.shape[:-1] + (k.shape[-2],)
    if mask.ndim > len(scores) or any(m not in (1, s) for m, s in
                                      zip(mask.shape[::-1], scores[::-1])):
        raise ShapeError(f"{op}: expected a mask broadcastable to the scores "
                         f"{list(scores)}, got {list(mask.shape)}")


def _attention_infer(q: TensorType, k: TensorType, v: TensorType, mask: TensorType,
                     scale: float, causal: bool) -> tuple[TensorType, TensorType]:
    _check("attention", q, k, v, mask)
    return (TensorType(q.shape[:-1] + (v.shape[-1],), q.dtype),
            TensorType(q.shape[:-1], q.dtype))


def _scores(q, k, mask, scale: float, causal: bool):
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * q.dtype.type(scale) + mask
    if causal:
        length, source = s.shape[-2:]
        hidden = np.arange(source)[None, :] > np.arange(length)[:, None]
        s = np.where(hidden, q.dtype.type(-np.inf), s)
    return s


def _attention_kernel(q, k, v, mask, scale: float, causal: bool):
    s = _scores(q, k, mask, scale, causal)
    top = s.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):  # a fully masked row: NaN, as the unfused chain
        e = np.exp(s - top)
        total = e.sum(axis=-1, keepdims=True)
        out = np.matmul(e / total, v)
        lse = (top + np.log(total))[..., 0]
    return out.astype(q.dtype), lse.astype(q.dtype)


def _attention_vjp(ctx, g_out, g_lse=None):
    if g_out is None:
        return (None, None, None, None)
    q, k, v, mask = ctx.inputs
    out, lse = ctx.outputs
    gq, gk, gv = call("attention_backward", q, k, v, mask, out, lse, g_out, **ctx.attrs)
    return (gq, gk, gv, None)  # lse is the kernel's own record; the mask gets none


register(OpDef("attention", CONTRACTION, ("query", "key", "value", "mask"), _attention_infer,
               _attention_kernel, _attention_vjp, attrs={"scale": float, "causal": bool},
               saved_inputs=(0, 1, 2, 3), saved_outputs=(0, 1),
               doc="softmax(query key^T * scale + mask) value; out and each row's logsumexp"))


def _attention_backward_infer(q: TensorType, k: TensorType, v: TensorType, mask: TensorType,
                              out: TensorType, lse: TensorType, g: TensorType, scale: float,
                              causal: bool) -> tuple[TensorType, TensorType, TensorType]:
    _check("attention_backward", q, k, v, mask)
    want_out = TensorType(q.shape[:-1] + (v.shape[-1],), q.dtype)
    if out != want_out or g != want_out or lse != TensorType(q.shape[:-1], q.dtype):
        raise ShapeError(f"attention_backward: expected out and grad_out {want_out} and lse "
                         f"{TensorType(q.shape[:-1], q.dtype)}, got {out}, {g}, {lse}")
    return q, k, v


def _attention_backward_kernel(q, k, v, mask, out, lse, g, scale: float, causal: bool):
    s = _scores(q, k, mask, scale, causal)
    p = np.exp(s - lse[..., None])
    gv = np.matmul(np.swapaxes(p, -1, -2), g)
    gp = np.matmul(g, np.swapaxes(v, -1, -2))
    row = (g * out).sum(axis=-1, keepdims=True)
    gs = p * (gp - row) * q.dtype.type(scale)
    gq = np.matmul(gs, k)
    gk = np.matmul(np.swapaxes(gs, -1, -2), q)
    return gq.astype(q.dtype), gk.astype(q.dtype), gv.astype(q.dtype)


register(OpDef("attention_backward", CONTRACTION,
               ("query", "key", "value", "mask", "out", "lse", "grad_out"),
               _attention_backward_infer, _attention_backward_kernel,
               attrs={"scale": float, "causal": bool},
               doc="the gradients of attention's query, key and value (not differentiable)"))

PUBLIC: tuple[str, ...] = ()  # made by graphc.passes.attention, never called by users
__all__: list[str] = []
