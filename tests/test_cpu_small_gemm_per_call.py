"""A batch known only per call (a symbolic size: graphc.compile(dynamic=True), mark_dynamic,
a retrace) as a product's m, n or k takes graphc.backends.cpu.small_gemm's generated kernel
where the trace's size would (`per_call_tile`), in the one executable that serves every size
(graphc.backends.cpu.runtime_sizes): results agree with the interpreter at batch sizes below,
at and above the tile's rows and K_BLOCK (1, primes, 255-257), gradients too, and each test
checks which kernel ran, so a silent fall back to the BLAS or to a compile per size fails."""

import re

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
import graphc.nn as nn  # noqa: E402
from graphc.backends.cpu import small_gemm  # noqa: E402
from graphc.symbolic import Sym  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.conftest import square_loss_gradients  # noqa: E402

if not small_gemm.lanes():
    pytest.skip("the host has neither AVX-512 nor AVX2 with FMA: no generated small GEMM",
                allow_module_level=True)

WIDE = small_gemm.lanes() == 16  # the k-outer weight gradient is for AVX-512 hosts
# after the traced batch: 1 (a static graph of its own), below a tile of rows, primes, a
# tile's rows and one past, K_BLOCK - 1, K_BLOCK and K_BLOCK + 1, several blocks of k
BATCHES = (1, 2, 3, 7, 12, 13, 24, 25, 29, 97, 255, 256, 257, 600)
BLAS_CALL = re.compile(r'call void @"?graphc_blas_sgemm')


def _matmul(x, w):
    return x @ w


def _matmul_bias(x, w, bias):  # a fused add: the row-ordered kernel adds it in its stores
    return x @ w + bias


def _weight_gradient(x, dy):  # x^T @ dy: the batch is k
    return x.t() @ dy


def _weight_gradient_bias(x, dy, bias):
    return x.t() @ dy + bias


def _weight_first(x, w):  # a Linear's W @ x^T (graphc.passes.gemm_order): the batch is n
    return w @ x.t()


def _generic_ir(f) -> str:
    """The module text of f's executable for every size (graphc.backends.cpu.runtime_sizes);
    fails where the symbolic graph was compiled per size instead."""
    entries = [e.executable for e in f._entries if hasattr(e.executable, "executable_for")]
    assert len(entries) == 1, "no symbolic graph was compiled"
    ex = entries[0]
    assert ex.runs_generic and not ex.compiled_sizes, "compiled per size, not once"
    graph = next(g for g in f.graphs if any(type(d) is Sym for d in g.inputs[0].type.shape))
    values = {d.name: 5 for v in graph.inputs for d in v.type.shape if type(d) is Sym}
    return ex.executable_for(values).executable.lowered.ir_text


def _kernels(text: str) -> list[str]:
    return sorted(set(re.findall(r'define[^@]*@"?(graphc_small_sgemm_\w+)', text)))


CASES = [  # (f, traced batch, a shape, other shapes (None: the batch), expected kernel)
    (_matmul, 9, (64,), [(64, 16)], r"graphc_small_sgemm_Mx16x64_"),
    (_matmul, 9, (600,), [(600, 32)], r"graphc_small_sgemm_Mx32x600_"),  # k in 3 blocks
    (_matmul_bias, 9, (48,), [(48, 32), (32,)], r"graphc_small_sgemm_Mx32x48_.*_row$"),
    (_weight_gradient, 64, (10,), [(None, 256)], r"graphc_small_sgemm_10x256xK_"),
    (_weight_gradient_bias, 64, (16,), [(None, 64), (64,)],
     r"graphc_small_sgemm_16x64xK_.*_row$"),
]
CASES.append((_weight_first, 32, (48,), [(16, 48)], r"graphc_small_sgemm_16xNx48_.*_bp_"))
if WIDE:  # a medium product in row chunks: the MLP's first Linear
    CASES.append((_weight_first, 64, (784,), [(256, 784)], r"graphc_small_sgemm_128xNx784_"))
    CASES.append((_weight_gradient, 64, (256,), [(None, 256)],
                  r"graphc_small_sgemm_256x64xK_.*_ko_c256"))  # k-outer, column chunks


@pytest.mark.parametrize("f, traced, a_tail, others, kernel", CASES,
                         ids=[f"{c[0].__name__}-{c[2]}-{c[3]}" for c in CASES])
def test_a_batch_known_per_call_runs_the_generated_kernel(f, traced, a_tail, others, kernel):
    rng = np.random.default_rng(sum(a_tail) * 7 + len(others))
    statics = {i: rng.standard_normal(s).astype(np.float32)
               for i, s in enumerate(others) if s[0] is not None}

    def arguments(batch: int) -> list:
        out = [rng.standard_normal((batch,) + a_tail).astype(np.float32)]
        for i, s in enumerate(others):
            out.append(statics[i] if i in statics else
                       rng.standard_normal((batch,) + s[1:]).astype(np.float32))
        return [graphc.tensor(x) for x in out]

    compiled = graphc.compile(f, backend="cpu")
    reference = graphc.compile(f, backend="interp")
    for i, batch in enumerate((traced,) + BATCHES):
        args = arguments(batch)
        if i == 0:  # the batch dims symbolic from the first trace on
            for x, s in zip(args, [(None,)] + list(others)):
                if s[0] is None:
                    graphc.mark_dynamic(x, 0)
        got = compiled(*args).numpy()
        np.testing.assert_allclose(got, reference(*args).numpy(), rtol=1e-4, atol=1e-4,
                                   err_msg=f"batch {batch}")
        assert_rounding_within(got, f(*args).numpy(), f(*(x.double() for x in args)).numpy())
    assert [str(g.inputs[0].type).split(",")[0] for g in compiled.graphs] == ["f32[s0", "f32[1"]
    text = _generic_ir(compiled)
    assert [k for k in _kernels(text) if re.match(kernel, k)], _kernels(text)
    assert not BLAS_CALL.search(text), "a product still calls the BLAS"


def test_the_kernel_is_chosen_at_the_traced_size_without_a_guard():
    """A symbolic m takes the tile the trace's size takes (and records no guard, so every
    size keeps the one executable); two sizes per call, or n known per call with b read in
    place, keep the BLAS."""
    from graphc.symbolic import ShapeEnv

    s0, s1, s2 = Sym.symbol("s0"), Sym.symbol("s1"), Sym.symbol("s2")
    env = ShapeEnv(hints={"s0": 9, "s1": 40, "s2": 32})
    with env.active():
        tile = small_gemm.tile_for(s0, 16, 64, 64, 1, 16)
        assert tile is not None and tile.m is s0 and tile.per_call == ("m",)
        assert tile.name.startswith("graphc_small_sgemm_Mx16x64_")
        assert small_gemm.tile_for(9, 16, 64, 64, 1, 16).vectors == tile.vectors
        assert small_gemm.tile_for(s0, 16, s1, 64, 1, 16) is None  # two sizes per call
        assert small_gemm.tile_for(s1, 64, 64, 64, 1, 64) is None  # not thin at 40 rows
        columns = small_gemm.tile_for(16, s2, 48, 48, 1, s2, b_transposed=True)
        assert columns is not None and columns.per_call == ("n",)
        assert small_gemm.tile_for(16, s2, 48, 48, 1, s2) is None  # b in place, ldb per call
        # the traced n not a whole number of vectors: the BLAS, as the static graph there
        assert small_gemm.tile_for(16, s1, 48, 48, 1, s1, b_transposed=True) is None
    assert env.guards == []
    assert small_gemm.tile_for(s0, 16, 64, 64, 1, 16) is None  # no trace's size to choose at


def test_gradients_with_a_batch_known_per_call_equal_the_interpreter():
    """A Linear-ReLU-Linear's loss and weight gradients: the forward's thin product has the
    batch as m, the weight gradients as k (dy^T @ h, and on AVX-512 hosts dh^T @ x k-outer)."""

    def model():
        graphc.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 16))

    compiled = graphc.compile(square_loss_gradients(model()), backend="cpu", dynamic=True)
    reference = graphc.compile(square_loss_gradients(model()), backend="interp", dynamic=True)
    rng = np.random.default_rng(3)
    for batch in (64,) + BATCHES:
        x = graphc.tensor(rng.standard_normal((batch, 32)).astype(np.float32))
        for got, want in zip(compiled(x), reference(x)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5,
                                       err_msg=f"batch {batch}")
    kernels = _kernels(_generic_ir(compiled))
    assert any(re.match(r"graphc_small_sgemm_Mx16x256_", k) for k in kernels), kernels
    assert any(re.match(r"graphc_small_sgemm_16x256xK_", k) for k in kernels), kernels
    if WIDE:
        assert any(re.match(r"graphc_small_sgemm_256x32xK_.*_ko", k) for k in kernels), kernels


@pytest.mark.skipif(not WIDE, reason="medium products are AVX-512 only")
def test_a_medium_product_with_m_per_call_splits_its_rows_into_chunks_counted_per_call():
    """As the static build at the traced 512 rows, the rows go in chunks of ROW_CHUNK that
    the cores share (a forked loop); their count comes per call (traced_sizes.chunks) and
    the last chunk computes the rows left (2, 13, 300, 513: one short chunk, a chunk and a
    bit), on one thread and on all cores."""
    from graphc.backends.cpu import threads
    from graphc.backends.cpu.threads import ThreadChooser

    rng = np.random.default_rng(512)
    w = graphc.tensor(rng.standard_normal((128, 128)).astype(np.float32))
    compiled = graphc.compile(_matmul, backend="cpu")
    x = graphc.tensor(rng.standard_normal((512, 128)).astype(np.float32))
    graphc.mark_dynamic(x, 0)
    compiled(x, w)
    text = _generic_ir(compiled)
    chunk = small_gemm.ROW_CHUNK
    assert f"graphc_small_sgemm_M{chunk}x128x128_" in " ".join(_kernels(text)), _kernels(text)
    assert re.search(r'define[^@]*@"?\w*small_gemm\.omp', text), "no forked loop of chunks"
    assert not BLAS_CALL.search(text)
    generic = next(e.executable for e in compiled._entries
                   if hasattr(e.executable, "executable_for"))
    for count in sorted({1, threads.most_threads()}):
        generic.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        for batch in (512, 2, 13, 127, 128, 129, 300, 513, 1024):
            x = graphc.tensor(rng.standard_normal((batch, 128)).astype(np.float32))
            np.testing.assert_allclose(compiled(x, w).numpy(), x.numpy() @ w.numpy(),
                                       rtol=1e-4, atol=1e-3, err_msg=f"batch {batch}")
