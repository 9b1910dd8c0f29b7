"""Loops of generated GEMMs forked over the cores by their multiply-adds
(graphc.backends.cpu.kernels.gemm_work): the MLP 784-256-256-10 batch-64 step's forward
products W1 @ x^T and W2 @ h^T (two row chunks of 128 x 64 each, 16,384 outputs: serial when
only outputs were counted) now fork, give the same bits on one thread and on all cores, and
the whole step does too; loops too small for a fork stay serial
(docs/performance.md, "The MLP b64 step on two threads (ninth session)")."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
from benchmarks.mlp_gemms import weight_times_transposed  # noqa: E402
from graphc.backends import compile as compile_graph  # noqa: E402
from graphc.backends.cpu import kernels, small_gemm, threads  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.ir import parse  # noqa: E402
from tests.blas_held_support import bits_run  # noqa: E402

ALL_CORES = threads.most_threads()
FORKED = re.compile(r'define[^@]*@"?\w*small_gemm\.omp')


def _counts() -> list[int]:
    return sorted({1, ALL_CORES})


def test_a_loop_of_gemms_weighs_its_multiply_adds():
    """Two row chunks of the MLP's first Linear (128 x 64 x 784) are worth a fork; two
    16 x 16 x 16 products are not; and every loop that forked when only its outputs were
    counted still forks (k is at least small_gemm.MIN_K)."""
    least = kernels.PARALLEL_MIN_ELEMENTS
    assert kernels.gemm_work(2, 128, 64, 784) >= least
    assert kernels.gemm_work(2, 128, 64, 256) >= least  # the second Linear
    assert kernels.gemm_work(2, 16, 16, 16) < least
    for heads, m, n in [(2, 128, 256), (64, 64, 64), (4, 256, 64), (1024, 8, 8)]:
        assert heads * m * n >= least
        assert kernels.gemm_work(heads, m, n, small_gemm.MIN_K) >= least, (heads, m, n)


@pytest.mark.skipif(small_gemm.lanes() != 16, reason="medium products are AVX-512 only")
@pytest.mark.parametrize("k", [784, 256], ids=["W1_k784", "W2_k256"])
def test_the_mlp_forward_products_fork_and_keep_their_bits(k):
    """W [256 x k] @ x^T [k x 64] (x^T packed), the step's layout: two row chunks of 128,
    one per thread, each summed by the same code as on one thread."""
    text = weight_times_transposed(256, 64, k)
    executable = compile_graph(parse(text), "cpu")
    ir_text = executable.lowered.ir_text
    assert f"graphc_small_sgemm_128x64x{k}_" in ir_text  # one row chunk's kernel
    assert FORKED.search(ir_text), "the row chunks of a medium product did not fork"
    rng = np.random.default_rng(k)
    w, x = (rng.standard_normal(v.type.shape).astype(np.float32)
            for v in parse(text).inputs)
    want = np.asarray(compile_graph(parse(text), "interp").run(w, x)[0])
    results = []
    for count in _counts():
        executable.thread_chooser = ThreadChooser(ALL_CORES, fixed=count)
        results.append(np.asarray(executable.run(w, x)[0]).copy())
        np.testing.assert_allclose(results[-1], want, rtol=1e-4, atol=1e-4)
    for got in results[1:]:
        np.testing.assert_array_equal(got, results[0])


def test_a_small_loop_of_gemms_stays_serial():
    """256 x 16 x 16 in two row chunks (thin products): 65,536 multiply-adds, under a
    fork's worth (a few microseconds of work on one core)."""
    text = weight_times_transposed(256, 16, 16)
    executable = compile_graph(parse(text), "cpu")
    if "graphc_small_sgemm_" not in executable.lowered.ir_text:
        pytest.skip("no generated kernel on this host (no AVX2/FMA): nothing to fork")
    assert not FORKED.search(executable.lowered.ir_text)


@pytest.mark.skipif(small_gemm.lanes() != 16, reason="medium products are AVX-512 only")
def test_the_mlp_training_step_gives_the_same_bits_on_all_cores():
    """Three SGD-momentum steps of the MLP 784-256-256-10 batch 64 from the same weights, on
    one thread and on all cores (its row and column chunks forked, OpenBLAS's GEMMs split
    by OpenBLAS on the same team): the losses and every weight are equal, bit for bit. Where
    the BLAS rounds otherwise on two threads (numpy's OpenBLAS on a Zen 5), the all-cores
    run holds the BLAS to one thread and graphc's forked chunks are compared alone
    (tests/blas_held_support)."""
    from benchmarks import models

    x, y = models.batch("mlp", 64)
    runs = []
    with bits_run():  # the first call too: the chooser picks its count before it is fixed
        for count in _counts():
            model = models.graphc_model("mlp")
            step = graphc.compile(models.graphc_step(model), backend="cpu")
            gx, gy = graphc.tensor(x), graphc.tensor(y)
            losses = [float(step(gx, gy).item())]  # traces and compiles
            step.executable.thread_chooser = ThreadChooser(ALL_CORES, fixed=count)
            losses += [float(step(gx, gy).item()) for _ in range(2)]
            runs.append((losses, [p.detach().numpy().copy() for p in model.parameters()],
                         step.executable.lowered.ir_text))
    for _, _, ir_text in runs:
        forked = set(re.findall(r'define[^@]*@"?(k\d+_small_gemm)\.omp', ir_text))
        assert len(forked) >= 3, forked  # W1 @ x^T, W2 @ h^T, dh2^T @ h1
    (losses1, weights1, _) = runs[0]
    for losses, weights, _ in runs[1:]:
        assert losses == losses1
        for w, w1 in zip(weights, weights1):
            np.testing.assert_array_equal(w, w1)
