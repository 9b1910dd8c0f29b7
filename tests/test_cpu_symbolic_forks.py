"""Parallel loops whose sizes are known only per call (graphc.backends.cpu.runtime_sizes)
fork where the static graph of the same sizes does: a kernel's per-call check weighs the
work `KernelBuilder.begin` weighed (a loop of generated GEMMs: its multiply-adds,
kernels.gemm_work), not its domain's element count, and a loop over a symbolic batch of
generated products may fork at all (it stayed serial at every batch before). Results are
the same bits on one thread and on all cores, and the same as the static graph's
(docs/performance.md, "The MLP b64 step on two threads (ninth session)")."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends import compile as compile_graph  # noqa: E402
from graphc.backends.cpu import kernels, small_gemm, threads  # noqa: E402
from graphc.backends.cpu.runtime_sizes import RuntimeSizedExecutable  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.ir import parse  # noqa: E402
from graphc.symbolic import Sym  # noqa: E402

ALL_CORES = threads.most_threads()
FORKED = re.compile(r'define[^@]*@"?\w*small_gemm\.omp')
# 4 heads a batch row of 16 x 64 x 64 products: 262,144 multiply-adds a row, 16,384
# elements' worth; four rows (16 heads) are PARALLEL_MIN_ELEMENTS' worth
HEADS, M, N, K = 4, 16, 64, 64


def _heads(batch) -> str:
    return f"""graph @f(%q: f32[{batch},{HEADS},{M},{K}], %k: f32[{batch},{HEADS},{K},{N}]) \
-> (f32[{batch},{HEADS},{M},{N}]) {{
  %0: f32[{batch},{HEADS},{M},{N}] = matmul(%q, %k)
  return (%0)
}}"""


def _kernel_body(ir_text: str, name: str) -> str:
    found = re.search(r'define[^@]*@"?%s"?\(ptr[^{]*\{(.*?)\n\}' % re.escape(name), ir_text,
                      re.S)
    assert found, f"no function {name} in the module"
    return found.group(1)


@pytest.mark.parametrize("products,m,n,k", [(4, 16, 64, 64), (3, 17, 16, 16), (1, 128, 64, 784)])
def test_a_symbolic_count_of_gemms_weighs_what_a_static_one_does(products, m, n, k):
    """gemm_work of a symbolic batch: its multiply-adds, checked per call against
    PARALLEL_MIN_ELEMENTS * GEMM_MACS_PER_ELEMENT, which decides as the static count's
    floor division does at every size (counts that do not divide by 16 included)."""
    s0 = Sym.symbol("s0")
    work = kernels.gemm_work(s0 * products, m, n, k)
    assert isinstance(work, kernels.WorkPerCall)
    for size in range(1, 40):
        static = kernels.gemm_work(size * products, m, n, k)
        per_call = work.units.evaluate({"s0": size}) >= work.least_units
        assert per_call == (static >= kernels.PARALLEL_MIN_ELEMENTS), size


def test_a_symbolic_domain_weighs_its_elements():
    """Without an explicit work, a symbolic domain's per-call work is its element count."""
    s0 = Sym.symbol("s0")
    work = kernels.WorkPerCall(s0 * 256)
    assert work.least_units == kernels.PARALLEL_MIN_ELEMENTS


@pytest.mark.skipif(not small_gemm.lanes(), reason="no generated GEMMs on this host (AVX2/FMA)")
def test_a_symbolic_batch_of_heads_forks_where_the_static_batch_does():
    """The static graph forks its loop of heads from batch 4 (16 heads); the symbolic one is
    built parallel and its kernel checks, per call, the loop's multiply-adds (s0 * 262,144)
    against 16 * 65,536, not its 4 * s0 heads against 65,536 (never true at any batch a
    real model uses)."""
    assert not FORKED.search(compile_graph(parse(_heads(1)), "cpu").lowered.ir_text)
    assert FORKED.search(compile_graph(parse(_heads(4)), "cpu").lowered.ir_text)
    ir_text = RuntimeSizedExecutable(parse(_heads("s0"))).lowered.ir_text
    assert FORKED.search(ir_text), "the symbolic batch of heads was built serial"
    name = re.search(r'define[^@]*@"?(k\d+_small_gemm)\.omp', ir_text).group(1)
    body = _kernel_body(ir_text, name)
    macs = HEADS * M * N * K
    least = kernels.PARALLEL_MIN_ELEMENTS * kernels.GEMM_MACS_PER_ELEMENT
    assert re.search(rf"mul i64 %\S+, {macs}\n\s*%\S+ = icmp slt i64 %\S+, {least}\n", body), \
        body


@pytest.mark.skipif(not small_gemm.lanes(), reason="no generated GEMMs on this host (AVX2/FMA)")
def test_a_symbolic_batch_of_heads_keeps_its_bits_on_every_thread_count():
    """Below and above the per-call threshold (batch 1-3 serial, 4 and 7 forked): the same
    bits on one thread and on all cores, and as the static graph of that batch."""
    symbolic = RuntimeSizedExecutable(parse(_heads("s0")))
    for batch in (1, 3, 4, 7):
        rng = np.random.default_rng(batch)
        q = rng.standard_normal((batch, HEADS, M, K)).astype(np.float32)
        k = rng.standard_normal((batch, HEADS, K, N)).astype(np.float32)
        static = compile_graph(parse(_heads(batch)), "cpu")
        want = np.asarray(compile_graph(parse(_heads(batch)), "interp").run(q, k)[0])
        results = []
        for count in sorted({1, ALL_CORES}):
            for executable in (symbolic, static):
                executable.thread_chooser = ThreadChooser(ALL_CORES, fixed=count)
            bound = symbolic.at({"s0": batch})
            results.append(np.asarray(bound.run(q, k)[0]).copy())
            results.append(np.asarray(static.run(q, k)[0]).copy())
        np.testing.assert_allclose(results[0], want, rtol=1e-4, atol=1e-4)
        for got in results[1:]:
            np.testing.assert_array_equal(got, results[0])
