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
    if mask.dtype != np.bool_:
        mask = mask.astype(dtype)
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


def _bool_mask(rng, shape):
    mask = rng.random(shape) > 0.3
    mask[..., 0] = True  # every query sees a key (no row of NaN)
    return mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length,mask_shape", [(32, (32, 32)), (512, (1, 2, 512, 512)),
                                               (512, (512, 512))])
def test_bool_masks_fuse_and_match_pytorch(causal, length, mask_shape):
    """A bool mask (True takes part), alone or with is_causal (4-d heads, 2-d or 4-d mask:
    PyTorch takes both): fused as a float mask is (one block a head at 32, the blocked kernels
    at 512), compiled for cpu and interp and eager against PyTorch, forward and gradients."""
    rng = np.random.default_rng(length + causal)
    arrays = [rng.standard_normal((1, 2, length, 16)) for _ in range(3)]
    mask = _bool_mask(rng, mask_shape)
    step = _step(causal, True)
    reference = _torch(arrays, mask, causal, True)
    got, fn = _run(step, arrays, mask, np.float32, backend="cpu")
    assert "attention" in _ops(fn) and "attention_backward" in _ops(fn)
    interp, _ = _run(step, arrays, mask, np.float32, backend="interp")
    eager, _ = _run(step, arrays, mask, np.float32)
    f32 = [r.astype(np.float32) for r in _torch([a.astype(np.float32) for a in arrays], mask,
                                                causal, True)]
    for a, b, c, d, t32 in zip(got, interp, eager, reference, f32):
        assert_rounding_within(a, t32, d)
        assert_rounding_within(b, t32, d)
        assert_rounding_within(c, t32, d)


def test_a_float_mask_under_the_causal_triangle_fuses():
    """is_causal with a float mask: both hide (the float mask's -inf and the triangle)."""
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal((1, 2, 512, 16)) for _ in range(3)]
    mask = rng.standard_normal((1, 1, 512, 512))
    mask[..., 1:, 1] = -np.inf
    reference = _torch(arrays, mask, True, True)
    got, fn = _run(_step(True, True), arrays, mask, np.float32, backend="cpu")
    assert "attention_backward" in _ops(fn)
    eager, _ = _run(_step(True, True), arrays, mask, np.float32)
    for a, b, c in zip(got, eager, reference):
        assert_rounding_within(a, b, c)


CAUSAL_WITH_MASK = {  # query shape, value shape, mask shape, dropout_p
    "3-d mask": ((1, 2, 5, 8), (1, 2, 5, 8), (1, 5, 5), 0.0),
    "3-d heads": ((2, 5, 8), (2, 5, 8), (5, 5), 0.0),
    "5-d heads": ((2, 2, 1, 5, 8), (2, 2, 1, 5, 8), (5, 5), 0.0),
    "another value size": ((1, 2, 5, 8), (1, 2, 5, 4), (5, 5), 0.0),
    "dropout": ((1, 2, 5, 8), (1, 2, 5, 8), (5, 5), 0.5),
    "2-d mask": ((1, 2, 3, 8), (1, 2, 5, 8), (3, 5), 0.0),
    "4-d mask": ((1, 2, 5, 8), (1, 2, 5, 8), (1, 2, 5, 5), 0.0),
    "a key row": ((1, 2, 5, 8), (1, 2, 5, 8), (1, 5), 0.0),
}


@pytest.mark.parametrize("name", list(CAUSAL_WITH_MASK))
def test_causal_with_a_mask_as_pytorch(name):
    """PyTorch 2.13 CPU raises RuntimeError or hides what either hides; graphc does the same:
    the same error type and wording, or the same values."""
    query, value, mask_shape, dropout_p = CAUSAL_WITH_MASK[name]
    rng = np.random.default_rng(len(name))
    q = rng.standard_normal(query).astype(np.float32)
    k = rng.standard_normal(query[:-2] + value[-2:-1] + query[-1:]).astype(np.float32)
    v = rng.standard_normal(value).astype(np.float32)
    mask = _bool_mask(rng, mask_shape)
    try:
        expected = torch.nn.functional.scaled_dot_product_attention(
            *map(torch.tensor, (q, k, v, mask)), dropout_p=dropout_p, is_causal=True).numpy()
    except RuntimeError as error:
        with pytest.raises(RuntimeError, match=str(error)):
            F.scaled_dot_product_attention(*map(graphc.tensor, (q, k, v, mask)),
                                           dropout_p=dropout_p, is_causal=True)
        return
    assert dropout_p == 0.0
    got = F.scaled_dot_product_attention(*map(graphc.tensor, (q, k, v, mask)), is_causal=True)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-6)
