"""attention_small: the one-block kernels of `attention` and `attention_backward`
(graphc/backends/cpu/attention_small.py), used where a head's query rows and keys fit one
block of at most SMALL_MAX.

Compiled results are judged by distance from a float64 run (docs/performance.md, Rounding):
the kernels sum in another order than the unfused chain. The pass's threshold is lowered so
these small shapes take the fused path; `fits` is checked to be what decides, so the tests
fail if the one-block kernels stop being chosen.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import graphc
from graphc.passes import attention as attention_pass
from graphc.testing import assert_rounding_within
from tests.attention_support import attend, gpt_steps_within_rounding, run

pytest.importorskip("llvmlite")

from graphc.backends.cpu import attention_small, small_gemm  # noqa: E402

needs_kernels = pytest.mark.skipif(not small_gemm.lanes(),
                                   reason="no AVX2/FMA: small_gemm generates no kernels")


@pytest.fixture
def fuse_everything(monkeypatch):
    monkeypatch.setattr(attention_pass, "MIN_SCORE_BYTES", 0)


CASES = [("causal", (2, 4, 64, 32), ()), ("causal", (1, 2, 48, 16), ()),
         ("none", (2, 2, 32, 16), ()),
         ("additive", (1, 2, 64, 32), (64, 64)),
         ("additive", (2, 2, 64, 16), (2, 1, 1, 64))]  # a key-padding style mask


@needs_kernels
@pytest.mark.parametrize("mode,shape,mask_shape", CASES)
def test_one_block_heads_within_rounding_of_float64(fuse_everything, monkeypatch, tmp_path,
                                                    rng, mode, shape, mask_shape):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))  # lowered here, not from a cache
    chosen = []
    fits = attention_small.fits
    monkeypatch.setattr(attention_small, "fits", lambda *a: chosen.append(fits(*a)) or
                        chosen[-1])
    arrays = [rng.standard_normal(shape) for _ in range(3)]
    mask = rng.standard_normal(mask_shape) if mask_shape else np.zeros(())
    if mask_shape:
        mask[..., -5:] = -np.inf  # hidden keys, as a padding mask
    arrays.append(mask)
    step = attend(mode)
    got, compiled = run(step, arrays, np.float32, compiled=True)
    ops = [n.op for n in compiled.optimized_graph.nodes]
    assert "attention" in ops and "attention_backward" in ops
    assert chosen == [True, True]  # forward and backward both took the one-block kernels
    eager, _ = run(step, arrays, np.float32, compiled=False)
    reference, _ = run(step, arrays, np.float64, compiled=False)
    for g, e, r in zip(got, eager, reference):
        assert_rounding_within(g, e, r)


@needs_kernels
@pytest.mark.parametrize("mode,shape", [("causal", (2, 2, 64, 16)), ("none", (1, 2, 40, 8))])
def test_eight_lane_vectors_as_on_avx2_hosts(fuse_everything, monkeypatch, tmp_path, rng,
                                             mode, shape):
    """The kernels with 8-lane vectors and tiles (an AVX2 host's), generated and run here."""
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(small_gemm, "lanes", lambda: 8)
    chosen = []
    fits = attention_small.fits
    monkeypatch.setattr(attention_small, "fits", lambda *a: chosen.append(fits(*a)) or
                        chosen[-1])
    arrays = [rng.standard_normal(shape) for _ in range(3)] + [np.zeros(())]
    step = attend(mode)
    got, _ = run(step, arrays, np.float32, compiled=True)
    assert chosen == [True, True]
    eager, _ = run(step, arrays, np.float32, compiled=False)
    reference, _ = run(step, arrays, np.float64, compiled=False)
    for g, e, r in zip(got, eager, reference):
        assert_rounding_within(g, e, r)


@needs_kernels
@pytest.mark.parametrize("mode", ["none", "causal"])
def test_query_rows_not_a_whole_vector(fuse_everything, rng, mode):
    """40 query rows against 48 keys: the last rows' logsumexp one by one, their row sums
    reduced as a group of fewer rows than lanes."""
    arrays = [rng.standard_normal(shape) for shape in ((2, 2, 40, 16), (2, 2, 48, 16),
                                                       (2, 2, 48, 16))] + [np.zeros(())]
    step = attend(mode)
    got, compiled = run(step, arrays, np.float32, compiled=True)
    assert "attention_backward" in [n.op for n in compiled.optimized_graph.nodes]
    eager, _ = run(step, arrays, np.float32, compiled=False)
    reference, _ = run(step, arrays, np.float64, compiled=False)
    for g, e, r in zip(got, eager, reference):
        assert_rounding_within(g, e, r)


@needs_kernels
def test_the_heads_fork_over_the_cores_with_the_same_bits(fuse_everything, monkeypatch,
                                                           tmp_path, rng):
    """The loop over (batch, head) is split between the threads; each head's code is the
    same on any number of them, so the results are the same bits."""
    from graphc.backends.cpu import threads
    from graphc.backends.cpu.threads import ThreadChooser

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    arrays = [rng.standard_normal((4, 4, 64, 32)).astype(np.float32) for _ in range(3)]
    tensors = [graphc.tensor(a, requires_grad=True) for a in arrays] + \
        [graphc.tensor(np.zeros((), np.float32))]
    compiled = graphc.compile(attend("causal"), backend="cpu")
    compiled(*tensors)
    text = compiled.executable.lowered.ir_text
    assert re.search(r'define[^@]*@"?\w*_attention\.omp', text), "no forked loop of heads"
    assert re.search(r'define[^@]*@"?\w*_attention_backward\.omp', text)
    results = []
    for count in sorted({1, threads.most_threads()}):
        compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        for t in tensors[:3]:
            t.grad = None  # else the gradients add up from call to call
        results.append([r.detach().numpy().copy() for r in compiled(*tensors)])
    for got in results[1:]:
        for a, b in zip(results[0], got):
            np.testing.assert_array_equal(a, b)


def test_what_fits_one_block():
    width = small_gemm.lanes() or 16
    contiguous = [(1,)]
    assert attention_small.fits(64, 64, 32, 32, (64, 1), contiguous) == bool(small_gemm.lanes())
    assert not attention_small.fits(65, 64, 32, 32, (64, 1), contiguous)  # over SMALL_MAX
    assert not attention_small.fits(64, 64 - width // 2, 32, 32, (0, 0), contiguous)
    assert not attention_small.fits(64, 64, 32, 32, (1, 64), contiguous)  # mask along rows
    assert not attention_small.fits(64, 64, 32, 32, (0, 0), [(2,)])  # output's rows strided


@needs_kernels
def test_a_gpt_training_step_at_context_64_within_rounding_of_float64(fuse_everything, rng):
    """benchmarks/model_steps.py's GPT at context 64 (one block a head), two SGD steps:
    compiled losses, weights and gradients as close to a float64 run as eager graphc's."""
    from benchmarks import model_steps

    block = 64
    x = rng.integers(0, model_steps.VOCAB, (2, block))
    y = rng.integers(0, model_steps.VOCAB, 2 * block)

    def make_model(dtype):
        graphc.manual_seed(0)
        return model_steps.gpt(graphc, embed=32, layers=1, heads=2, block=block).to(dtype=dtype)

    gpt_steps_within_rounding(make_model, x, y, ["attention_backward"])


def test_fused_attention_writes_its_heads_in_the_merged_layout():
    """graphc.passes.gemm_output_layout lays out attention's out (and the backward's dq, dk,
    dv) as the head merge reads them, so the merge's reshape is a view, not a copy; out is
    read by the backward too (a graph's outputs keep their row-major layout)."""
    from graphc.ir import parse
    from graphc.passes.gemm_output_layout import lay_out_gemm_outputs

    g = lay_out_gemm_outputs(parse('''graph @f(%q: f32[2,4,8,16], %k: f32[2,4,8,16],
        %v: f32[2,4,8,16]) -> (f32[2,8,64], f32[2,4,8,16], f32[2,4,8,16], f32[2,4,8,16]) {
      %m: f32[] = full[shape=(), value=0.0, dtype="float32"]()
      %o: f32[2,4,8,16], %l: f32[2,4,8] = attention[scale=0.25, causal=true](%q, %k, %v, %m)
      %1: f32[2,8,4,16] = permute[dims=(0, 2, 1, 3)](%o)
      %2: f32[2,8,64] = reshape[shape=(2, 8, 64)](%1)
      %g: f32[2,4,8,16] = full[shape=(2, 4, 8, 16), value=1.0, dtype="float32"]()
      %dq: f32[2,4,8,16], %dk: f32[2,4,8,16], %dv: f32[2,4,8,16] = attention_backward[
        scale=0.25, causal=true](%q, %k, %v, %m, %o, %l, %g)
      return (%2, %dq, %dk, %dv)
    }'''))
    assert g.meta["root_strides"] == {"o": (512, 16, 64, 1)}
