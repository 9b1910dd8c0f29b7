"""A fused GEMM whose epilogue only adds a bias and residuals (a Linear layer, a transformer
block's `x + proj(h)`) adds them in small_gemm's generated kernel's stores
(graphc.backends.cpu.gemm_addends): the same bits as with the elementwise epilogue, at one
and two threads, and within rounding of a float64 run; other epilogues, and products the
kernel does not take, keep the elementwise kernel."""

import re

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
from graphc.backends.cpu import gemm_addends, gemm_epilogue, small_gemm, threads  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402

if not small_gemm.lanes():
    pytest.skip("the host has neither AVX-512 nor AVX2 with FMA: no generated small GEMM",
                allow_module_level=True)


def _bias(x, w, bias, residual):
    return x @ w + bias


def _bias_residual(x, w, bias, residual):
    return residual + (x @ w + bias)


def _residual_first(x, w, bias, residual):  # another order: (x @ w + residual) + b
    return (x @ w + residual) + bias


def _two_residuals(x, w, bias, residual):
    return (x @ w + residual) + residual * 2.0


def _linear_residual(x, w, bias, residual):  # a transformer block: x + (h @ W^T + b)
    return residual + (x @ w.t() + bias)


FOLDED = [  # (f, x shape, n): the generated kernel adds the operands in its stores
    (_bias, (16, 96), 64),  # thin: tiles of 8 rows, k in one block
    (_bias, (13, 300), 32),  # thin, k in two blocks (the last one short), a last tile of 5
    (_bias_residual, (16, 512), 128),  # k in two full blocks: the last one peeled off
    (_residual_first, (16, 128), 48),
]
MEDIUM = [  # AVX-512: GPT's projections, 1024 rows in chunks the cores share
    (_bias, (16, 64, 128), 128),
    (_linear_residual, (16, 64, 128), 128),  # W^T copied (packed) first
    (_linear_residual, (4, 64, 512), 128),  # linear2: k 512, two blocks
    (_bias_residual, (2, 7, 64), 32),  # 14 rows folded from a batch, one call
]
if small_gemm.lanes() == 16:
    FOLDED += MEDIUM


def _inputs(f, x_shape, n, seed):
    rng = np.random.default_rng(seed)
    k = x_shape[-1]
    w_shape = (n, k) if f is _linear_residual else (k, n)
    arrays = (rng.standard_normal(x_shape), rng.standard_normal(w_shape) / np.sqrt(k),
              rng.standard_normal(n), rng.standard_normal(x_shape[:-1] + (n,)))
    return [graphc.tensor(a.astype(np.float32)) for a in arrays]


def _run(f, args, fold: bool, thread_counts):
    """(the module's IR text, its count of kernels, the results at each thread count)."""
    saved = gemm_addends.FOLD, gemm_epilogue.FOLD
    gemm_addends.FOLD = gemm_epilogue.FOLD = fold  # unfolded: the elementwise kernel
    try:
        compiled = graphc.compile(f, backend="cpu")
        compiled(*args)
    finally:
        gemm_addends.FOLD, gemm_epilogue.FOLD = saved
    results = []
    for count in thread_counts:
        compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        results.append(compiled(*args).numpy())
    lowered = compiled.executable.lowered
    return lowered.ir_text, len(lowered.kernel_nodes), results


@pytest.mark.parametrize("f, x_shape, n", FOLDED,
                         ids=[f"{f.__name__}-{x}-{n}" for f, x, n in FOLDED])
def test_bias_and_residual_adds_fold_into_the_kernel_with_the_same_bits(f, x_shape, n):
    args = _inputs(f, x_shape, n, sum(x_shape) * 13 + n)
    counts = sorted({1, threads.most_threads()})
    text, kernels, folded = _run(f, args, True, counts)
    assert re.search(r"graphc_small_sgemm_\w+_(row|full)", text), "no kernel with addends"
    if re.search(r"graphc_small_sgemm_\w+_full", text):  # a residual, asked for ahead (the
        assert re.search(r"graphc_small_sgemm_\w+_full\w*_pfadd", text)  # same bits: below)
    unfused_text, unfused_kernels, unfused = _run(f, args, False, counts[:1])
    assert not re.search(r"graphc_small_sgemm_\w+_(row|full)", unfused_text)
    assert kernels == unfused_kernels - 1  # the epilogue's kernel, and one product in each
    for got in folded:  # the same additions in the same order, on any number of threads
        np.testing.assert_array_equal(got, unfused[0])
    want = graphc.compile(f, backend="interp")(*args).numpy()
    np.testing.assert_allclose(folded[0], want, rtol=1e-4, atol=1e-4)
    assert_rounding_within(folded[0], f(*args).numpy(),
                           f(*(a.double() for a in args)).numpy())


KEPT = [  # (f, x shape, n): the elementwise epilogue stays
    (_two_residuals, (16, 96), 64),  # a multiply in the chain
    (_bias, (16, 96), 40),  # 40 columns: not a whole vector, the BLAS's product
    (_bias, (2, 3, 16, 32), 64),  # a batch of products with a b each: not folded rows
]


@pytest.mark.parametrize("f, x_shape, n", KEPT, ids=[f"{f.__name__}-{x}-{n}" for f, x, n in KEPT])
def test_other_epilogues_keep_the_elementwise_kernel(f, x_shape, n):
    args = _inputs(f, x_shape, n, n)
    if len(x_shape) == 4:  # a weight per batch element
        args[1] = graphc.tensor(np.ones(x_shape[:2] + (x_shape[-1], n), np.float32) / 8)
    text, kernels, (got,) = _run(f, args, True, [1])
    assert not re.search(r"graphc_small_sgemm_\w+_(row|full)", text)
    assert kernels == _run(f, args, False, [1])[1]  # the product once, then the epilogue
    np.testing.assert_allclose(got, graphc.compile(f, backend="interp")(*args).numpy(),
                               rtol=1e-4, atol=1e-4)
