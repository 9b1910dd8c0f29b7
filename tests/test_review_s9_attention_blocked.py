"""Review of the ninth session's fused attention, part three: the blocked kernels' backward
(graphc.backends.cpu.attention) and the mask arguments of scaled_dot_product_attention.

- A causal head's first query sees one key: its probability is exactly 1 and its dQ row
  exactly 0 in the unfused chain (D = rowsum(P * dP) = dP). The blocked backward took D as
  FlashAttention-2's rowsum(dO * O): equal, but summed in another order, so that row was
  rounding noise growing with the head size (the one-block kernels had the same defect,
  fixed in tests/test_review_s9_attention.py).
- A bool attn_mask (True takes part) fuses where a float mask does.
- is_causal=True with attn_mask: PyTorch 2.13 CPU hides what either hides where its flash
  kernel takes the call (4-d q, k, v of one head size, a 2-d or 4-d mask, dropout_p=0) and
  raises RuntimeError "Explicit attn_mask should not be set when is_causal=True" elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn.functional as F
from graphc.testing import assert_rounding_within

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")
torch = pytest.importorskip("torch", reason="PyTorch is the parity reference")


def _step(causal: bool, with_mask: bool):
    def step(q, k, v, mask):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask if with_mask else None,
                                             is_causal=causal)
        (out * out.sin()).sum().backward()
        return out.detach(), q.grad, k.grad, v.grad
    return step


def _run(step, arrays, mask, dtype, backend=None):
    tensors = [graphc.tensor(a.astype(dtype), requires_grad=True) for a in arrays]
    fn = graphc.compile(step, backend=backend) if backend else step
    results = fn(*tensors, graphc.tensor(mask))
    return [r.detach().numpy() for r in results], fn


def _ops(fn) -> list[str]:
    return [n.op for n in fn.optimized_graph.nodes]


def _torch(arrays, mask, causal: bool, with_mask: bool):
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = torch.nn.functional.scaled_dot_product_attention(
        *tensors, attn_mask=torch.tensor(mask) if with_mask else None, is_causal=causal)
    (out * out.sin()).sum().backward()
    return [out.detach().numpy()] + [t.grad.numpy() for t in tensors]


@pytest.mark.parametrize("length,size", [(128, 32), (192, 48), (256, 64), (320, 96),
                                         (512, 128)])
def test_blocked_causal_first_query_gradient_is_zero(monkeypatch, tmp_path, length, size):
    """Causal heads too big for one block: dQ's first row exactly 0, as unfused, and every
    result within rounding of a float64 run. (Scores of 128 and 192 keys fit the cache and
    stay unfused unless MIN_SCORE_BYTES is lowered.)"""
    from graphc.passes import attention

    monkeypatch.setattr(attention, "MIN_SCORE_BYTES", 0)
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))  # lowered here, not from a cache
    rng = np.random.default_rng(length + size)
    arrays = [rng.standard_normal((1, 2, length, size)) for _ in range(3)]
    step, mask = _step(True, False), np.zeros(())
    got, fn = _run(step, arrays, mask, np.float32, backend="cpu")
    assert "attention_backward" in _ops(fn)  # the blocked kernels, not the chain
    eager, _ = _run(step, arrays, mask, np.float32)
    reference, _ = _run(step, arrays, mask, np.float64)
    assert not eager[1][..., 0, :].any()
    assert not got[1][..., 0, :].any()
    for a, b, c in zip(got, eager, reference):
        assert_rounding_within(a, b, c)
