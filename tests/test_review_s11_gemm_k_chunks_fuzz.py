"""Review of the eleventh session's weight gradients summed in chunks of k (h4: graphc.
backends.cpu.gemm_k_chunks, small_gemm `k_chunks`; partial products in a scratch that every
node of the same type shares, merged in order after), as a seeded fuzzer over what its tests
leave out: random m (odd, under and over a tile's rows), n up to K_CHUNK_MAX_N and k of 2 to
10 blocks; two weight gradients of one shape in one graph (one shared scratch) whose results
an elementwise tail and a residual read; and a 3-d Linear's training step (tokens = batch x
context) against PyTorch in float64.

Each case: the merge kernel is there where `k_chunks` says; the results are the same bits on
2 threads as on 1; within 2x eager graphc's distance from a float64 run.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
from graphc.backends.cpu import small_gemm, threads  # noqa: E402
from graphc.backends.cpu.small_gemm_tile import K_BLOCK  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402

needs_avx512 = pytest.mark.skipif(small_gemm.lanes() != 16,
                                  reason="the k-outer weight gradients are AVX-512 only")


@pytest.fixture(autouse=True)
def _shared_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _two_gradients(x1, dy1, x2, dy2, r):
    """Two weight gradients of one shape, an elementwise tail on one, a residual on both."""
    g1 = x1.t() @ dy1
    g2 = x2.t() @ dy2
    return (g1 * 0.5 + r).tanh(), g2 + g1


def _on_threads(compiled, make_inputs):
    """The compiled results at 1 and at every core's threads (the same bits asserted), each
    call on fresh inputs from `make_inputs()` (gradients accumulate in leaves)."""
    compiled(*make_inputs())
    results = []
    for count in sorted({1, threads.most_threads()}):
        compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        results.append([t.numpy() for t in compiled(*make_inputs())])
    for got in results[1:]:
        for a, b in zip(got, results[0]):
            np.testing.assert_array_equal(a, b, err_msg="1 vs 2 threads")
    return results[0]


@needs_avx512
@pytest.mark.parametrize("seed", range(3))
def test_two_chunked_weight_gradients_share_a_scratch_within_rounding(seed):
    rng = np.random.default_rng(seed)
    for _ in range(2):
        m = int(rng.choice([17, 33, 48, 100, 256, 511]))
        n = int(rng.choice([32, 48, 64, 96, 112, 128]))
        k = K_BLOCK * small_gemm.K_CHUNKS * int(rng.integers(1, 6))
        arrays = [rng.standard_normal(s).astype(np.float32)
                  for s in ((k, m), (k, n), (k, m), (k, n), (m, n))]
        compiled = graphc.compile(_two_gradients, backend="cpu")
        inputs = [graphc.tensor(a) for a in arrays]
        got = _on_threads(compiled, lambda: inputs)
        text = compiled.executable.lowered.ir_text
        assert ("gemm_k_merge" in text) == (m < 2 * small_gemm.K_OUTER_ROW_CHUNK), \
            f"m {m} n {n} k {k}"
        eager = [t.numpy() for t in _two_gradients(*inputs)]
        wide = [t.numpy() for t in _two_gradients(*[graphc.tensor(a.astype(np.float64))
                                                     for a in arrays])]
        for g, e, w in zip(got, eager, wide):
            assert_rounding_within(g, e, w)


@needs_avx512
@pytest.mark.parametrize("shape", [(8, 64, 96, 128), (4, 128, 64, 48), (2, 512, 128, 32)],
                         ids=lambda s: "x".join(map(str, s)))
def test_a_linear_training_step_over_tokens_as_pytorch_float64(shape):
    torch = pytest.importorskip("torch", reason="PyTorch 2.13 CPU is the reference")
    batch, context, features_in, features_out = shape
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal((batch, context, features_in)).astype(np.float32)
    w = (rng.standard_normal((features_out, features_in)) / 8).astype(np.float32)
    b = rng.standard_normal(features_out).astype(np.float32)

    def step(x, w, b):
        y = (x @ w.t() + b).relu()
        (y * y).sum().backward()
        return w.grad, b.grad, x.grad

    def tensors(lib, dtype):
        return [lib.tensor(a.astype(dtype), requires_grad=True) for a in (x, w, b)]

    compiled = graphc.compile(step, backend="cpu")
    got = _on_threads(compiled, lambda: tensors(graphc, np.float32))
    assert "gemm_k_merge" in compiled.executable.lowered.ir_text
    eager = [t.numpy() for t in step(*tensors(graphc, np.float32))]
    wide = [t.detach().numpy() for t in step(*tensors(torch, np.float64))]
    for g, e, want in zip(got, eager, wide):
        assert_rounding_within(g, e, want)
