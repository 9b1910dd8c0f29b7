"""What the fused-attention tests share: a training step through scaled_dot_product_attention
(causal, unmasked or with a mask) and its results run eagerly or compiled."""

from __future__ import annotations

import graphc
import graphc.nn.functional as F


def attend(mode: str):
    """A step: attention of `mode` ("causal", "none" or "mask"), a loss reading out through
    sin, every gradient."""
    def step(q, k, v, mask):
        if mode == "causal":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif mode == "none":
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        (out * out.sin()).sum().backward()
        return out, q.grad, k.grad, v.grad
    return step


def run(step, arrays, dtype, compiled: bool):
    """(the step's results as arrays, the callable) with q, k, v (arrays[:3]) requiring grad."""
    tensors = [graphc.tensor(a.astype(dtype), requires_grad=i < 3) for i, a in enumerate(arrays)]
    fn = graphc.compile(step, backend="cpu") if compiled else step
    return [r.detach().numpy() for r in fn(*tensors)], fn
