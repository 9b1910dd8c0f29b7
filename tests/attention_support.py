"""What the fused-attention tests share: a training step through scaled_dot_product_attention
(causal, unmasked or with a mask) and its results run eagerly or compiled, and two SGD steps of
a GPT compiled against eager float32 and float64."""

from __future__ import annotations

import numpy as np

import graphc
import graphc.nn.functional as F
from graphc.testing import assert_rounding_within


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


def gpt_steps_within_rounding(make_model, x, y, fused_ops) -> None:
    """Two SGD steps of a GPT (`make_model(dtype)`) on tokens x, targets y: eager float32,
    compiled float32 (its optimized graph holding every op of `fused_ops`) and eager float64;
    the compiled losses, weights and gradients as close to the float64 run as eager's."""
    results = {}
    for name, dtype, compiled in (("eager", graphc.float32, False),
                                  ("compiled", graphc.float32, True),
                                  ("reference", graphc.float64, False)):
        model = make_model(dtype)
        opt = graphc.optim.SGD(model.parameters(), lr=0.05)

        def step(x, y, model=model, opt=opt):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        fn = graphc.compile(step, backend="cpu") if compiled else step
        losses = [fn(graphc.tensor(x), graphc.tensor(y)).numpy() for _ in range(2)]
        if compiled:
            ops = [n.op for n in fn.optimized_graph.nodes]
            assert all(op in ops for op in fused_ops), ops
        results[name] = [np.array(losses)] + [p.detach().numpy().copy()
                                              for p in model.parameters()] + \
            [p.grad.numpy().copy() for p in model.parameters()]
    for got, eager, reference in zip(results["compiled"], results["eager"],
                                     results["reference"]):
        assert_rounding_within(got, eager, reference)
