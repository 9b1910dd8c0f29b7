"""Review of the ninth session's second wave: fused attention (graphc.passes.attention, the
cpu backend's one-block kernels, graphc.backends.cpu.attention_small) as a user drives it.

Fixed here: a compiled function whose attention output requires grad, its backward run
outside the compiled code (autograd's split graph: the forward part returns the softmax's
probabilities for the backward), failed to compile with VerifyError "output %16 is never
defined": fuse_attention replaced the chain although the graph returned p, which the fused
node does not make. The forward-only match now needs p read by out's matmul alone.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn.functional as F
from graphc.testing import assert_rounding_within

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")


def _heads(rng, shape, dtype):
    return [graphc.tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)
            for _ in range(3)]


def _attend(causal: bool):
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return attend


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("length", [32, 512])  # one block a head; the blocked kernels' size
def test_backward_outside_the_compiled_attention(causal, length):
    """The output requires grad and the loss's backward runs eagerly after the compiled call:
    the gradients through the split graph's saved values, within rounding of float64."""
    shape = (1, 2, length, 16)
    results = []
    for dtype, compiled in ((np.float32, True), (np.float32, False), (np.float64, False)):
        q, k, v = _heads(np.random.default_rng(length + causal), shape, dtype)
        fn = graphc.compile(_attend(causal), backend="cpu") if compiled else _attend(causal)
        out = fn(q, k, v)
        assert out.requires_grad
        (out * out.sin()).sum().backward()
        results.append([out.detach().numpy(), q.grad.numpy(), k.grad.numpy(),
                        v.grad.numpy()])
    for got, eager, reference in zip(*results):
        assert_rounding_within(got, eager, reference)
