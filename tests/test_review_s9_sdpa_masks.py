"""Review of the ninth session's third wave: scaled_dot_product_attention's bool masks and
is_causal with attn_mask, against PyTorch 2.13 CPU (the installed reference).

Fixed here: is_causal=True with an attn_mask combined the two for every 4-d query, key and
value of one head size, where PyTorch 2.13 raises for key or value broadcast over the batch
or the heads (without enable_gqa), a key of another head size, a mask that requires grad or
one broadcast into q's batch from a size other than 1 (its flash kernel's checks,
sdp_utils_cpp; the math kernel then raises).

Fixed in the tenth session: a query row whose every key is hidden gave NaN where PyTorch 2.13
gives 0 and no gradient (its flash kernel and the math kernel's _safe_softmax); checked here
eager, interpreted, compiled for cpu (the unfused chain, the one-block and the blocked
attention kernels) and for cuda (the emulation here), forward and backward.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn.functional as F

torch = pytest.importorskip("torch", reason="PyTorch is the reference")


def _both(shapes, mask_shape, *, gqa=False, mask_grad=False, seed=0):
    """PyTorch's result (or its exception type) and graphc's eager one, causal with a mask."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    mask = rng.standard_normal(mask_shape).astype(np.float32)
    results = []
    for lib, fn in ((torch, torch.nn.functional.scaled_dot_product_attention),
                    (graphc, F.scaled_dot_product_attention)):
        args = [lib.tensor(a) for a in (q, k, v)]
        m = lib.tensor(mask, requires_grad=mask_grad)
        try:
            out = fn(*args, attn_mask=m, is_causal=True, enable_gqa=gqa)
            results.append(out.detach().numpy())
        except Exception as error:  # noqa: BLE001 (its type is compared)
            results.append(error)
    return results


COMBINED = {  # q, k, v shapes, mask shape, enable_gqa
    "one batch, heads": (((2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8)), (4, 5), False),
    "mask broadcast rows": (((2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8)), (1, 5), False),
    "mask 4-d, heads 1": (((2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8)), (2, 1, 4, 5), False),
    "grouped heads": (((2, 4, 4, 8), (2, 2, 5, 8), (2, 2, 5, 8)), (4, 5), True),
    "one kv head, grouped": (((2, 3, 4, 8), (2, 1, 5, 8), (2, 1, 5, 8)), (4, 5), True),
}
REFUSED = {
    "key batch broadcast": (((2, 3, 4, 8), (1, 3, 5, 8), (1, 3, 5, 8)), (4, 5), False),
    "value batch broadcast": (((2, 3, 4, 8), (2, 3, 5, 8), (1, 3, 5, 8)), (4, 5), False),
    "query batch broadcast": (((1, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8)), (4, 5), False),
    "kv heads broadcast, no gqa": (((2, 3, 4, 8), (2, 1, 5, 8), (2, 1, 5, 8)), (4, 5), False),
    "key and value heads differ": (((2, 4, 4, 8), (2, 2, 5, 8), (2, 1, 5, 8)), (4, 5), True),
    "mask 3-d": (((2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8)), (3, 4, 5), False),
}


@pytest.mark.parametrize("name", list(COMBINED))
def test_is_causal_with_a_mask_combines_where_pytorch_does(name):
    shapes, mask_shape, gqa = COMBINED[name]
    reference, got = _both(shapes, mask_shape, gqa=gqa)
    assert not isinstance(reference, Exception), reference
    assert not isinstance(got, Exception), got
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(REFUSED))
def test_is_causal_with_a_mask_raises_where_pytorch_does(name):
    shapes, mask_shape, gqa = REFUSED[name]
    reference, got = _both(shapes, mask_shape, gqa=gqa)
    assert isinstance(reference, RuntimeError) and "Explicit attn_mask" in str(reference)
    assert isinstance(got, RuntimeError), got
    assert "Explicit attn_mask should not be set when is_causal=True" in str(got)


def test_a_mask_that_requires_grad_is_not_combined_with_is_causal():
    shapes = ((2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8))
    reference, got = _both(shapes, (4, 5), mask_grad=True)
    assert isinstance(reference, RuntimeError)
    assert isinstance(got, RuntimeError) and "Explicit attn_mask" in str(got)


def _hidden_rows(lib, fn, causal):
    rng = np.random.default_rng(7)
    q, k, v = (lib.tensor(rng.standard_normal((1, 2, 3, 4)).astype(np.float32))
               for _ in range(3))
    keep = np.array([[False, False, False], [True, False, True], [True, True, True]])
    return fn(q, k, v, attn_mask=lib.tensor(keep), is_causal=causal).numpy()


@pytest.mark.parametrize("causal", [False, True])
def test_a_row_with_every_key_hidden_gives_zeros_as_pytorch(causal):
    reference = _hidden_rows(torch, torch.nn.functional.scaled_dot_product_attention, causal)
    assert np.array_equal(reference[0, :, 0], np.zeros((2, 4), np.float32))
    got = _hidden_rows(graphc, F.scaled_dot_product_attention, causal)
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-6)
    assert np.array_equal(got[0, :, 0], np.zeros((2, 4), np.float32))


def _keep(shape, kind: str, rng):
    """A bool keep-mask of `kind` for query, key and value all of `shape` [B, H, L, E]:
    "rows" [L, L] with rows 0 and 3 hidden whole (the others hiding some keys), "padding"
    [B, 1, 1, L] with batch 1's keys all hidden."""
    batch, _, length, _ = shape
    source = length
    if kind == "rows":
        keep = rng.random((length, source)) < 0.6
        keep[:, 0] = True
        keep[[0, 3]] = False
        return keep
    keep = np.ones((batch, 1, 1, source), bool)
    keep[0, ..., -3:] = False
    keep[1] = False
    return keep


def _step(lib, fn, arrays, mask, causal: bool, mask_grad: bool = False):
    """out and the gradients of q, k, v (and of a float mask that requires grad) through a
    loss reading out by sin, as numpy arrays."""
    q, k, v = (lib.tensor(a, requires_grad=True) for a in arrays)
    m = lib.tensor(mask, requires_grad=mask_grad)
    out = fn(q, k, v, attn_mask=m, is_causal=causal)
    (out * out.sin()).sum().backward()
    grads = [q.grad, k.grad, v.grad] + ([m.grad] if mask_grad else [])
    return [out.detach().numpy()] + [g.numpy() for g in grads]


def _as_float(keep):
    return np.where(keep, 0.0, -np.inf).astype(np.float32)


EAGER = {  # shape, mask kind, mask as float, causal, mask requires grad
    "bool rows": ((2, 2, 6, 5), "rows", False, False, False),
    "float rows": ((2, 2, 6, 5), "rows", True, False, False),
    "bool rows, causal": ((2, 2, 6, 5), "rows", False, True, False),
    "float padding, causal": ((2, 2, 6, 5), "padding", True, True, False),
    "float rows, mask grad": ((2, 2, 6, 5), "rows", True, False, True),
}


@pytest.mark.parametrize("name", list(EAGER))
def test_hidden_rows_forward_and_backward_as_pytorch_eager(name):
    shape, kind, as_float, causal, mask_grad = EAGER[name]
    rng = np.random.default_rng(11)
    arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    keep = _keep(shape, kind, rng)
    mask = _as_float(keep) if as_float else keep
    reference = _step(torch, torch.nn.functional.scaled_dot_product_attention, arrays, mask,
                      causal, mask_grad)
    got = _step(graphc, F.scaled_dot_product_attention, arrays, mask, causal, mask_grad)
    for g, r in zip(got, reference):
        assert not np.isnan(g).any()
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def _compiled_step(arrays, mask, causal: bool, backend: str):
    def step(q, k, v, m):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal)
        (out * out.sin()).sum().backward()
        return out, q.grad, k.grad, v.grad

    fn = graphc.compile(step, backend=backend)
    tensors = [graphc.tensor(a, requires_grad=True) for a in arrays] + [graphc.tensor(mask)]
    return [r.detach().numpy() for r in fn(*tensors)], fn


COMPILED = {  # backend, fuse every size, shape (L = S over 64: the blocked kernels)
    "interpreter": ("interp", False, (2, 2, 8, 8)),
    "cpu, unfused chain": ("cpu", False, (2, 2, 8, 8)),
    "cpu, one-block kernels": ("cpu", True, (2, 2, 32, 16)),
    "cpu, blocked kernels": ("cpu", True, (2, 2, 80, 16)),
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["rows", "padding"])
@pytest.mark.parametrize("name", list(COMPILED))
def test_hidden_rows_compiled_as_pytorch(name, kind, causal, monkeypatch, tmp_path):
    backend, fuse_all, shape = COMPILED[name]
    if backend == "cpu":
        pytest.importorskip("llvmlite")
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    from graphc.passes import attention as attention_pass

    if fuse_all:
        monkeypatch.setattr(attention_pass, "MIN_SCORE_BYTES", 0)
    rng = np.random.default_rng(13)
    arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    keep = _keep(shape, kind, rng)
    reference = _step(torch, torch.nn.functional.scaled_dot_product_attention, arrays, keep,
                      causal)
    got, fn = _compiled_step(arrays, keep, causal, backend)
    if fuse_all:
        ops = [n.op for n in fn.optimized_graph.nodes]
        assert "attention" in ops and "attention_backward" in ops, ops
    hidden = ~keep.any(-1) if kind == "rows" else np.array([False, True])
    for g, r in zip(got, reference):
        assert not np.isnan(g).any()
        np.testing.assert_allclose(g, r, rtol=2e-4, atol=2e-5)
    out, grad_q = got[0], got[1]
    if kind == "rows":
        assert np.array_equal(out[:, :, hidden], np.zeros_like(out[:, :, hidden]))
        assert np.array_equal(grad_q[:, :, hidden], np.zeros_like(grad_q[:, :, hidden]))
    else:
        assert not out[1].any() and not grad_q[1].any()


@pytest.mark.usefixtures("cuda_runtime_built", "cuda_backend")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["rows", "padding"])
def test_hidden_rows_compiled_for_cuda_as_pytorch(kind, causal):
    shape = (2, 2, 8, 8)
    rng = np.random.default_rng(17)
    arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    keep = _keep(shape, kind, rng)
    reference = _step(torch, torch.nn.functional.scaled_dot_product_attention, arrays, keep,
                      causal)
    got, _ = _compiled_step(arrays, keep, causal, "cuda")
    for g, r in zip(got, reference):
        assert not np.isnan(g).any()
        np.testing.assert_allclose(g, r, rtol=2e-4, atol=2e-5)
