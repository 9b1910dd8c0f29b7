"""Thin float32 products (a recurrent step's [16 x 128] @ [128 x 512] and its gradient), and
small blocks whose b is read transposed (attention's Q K^T per head), medium products and
weight gradients with a long k (x^T @ dy over the tokens, k-outer, in column chunks) run in
graphc.backends.cpu.small_gemm's generated kernels instead of the BLAS: every layout of the
operands they take (transposed views, batches, row counts that leave a smaller last tile)
agrees with the interpreter, within float32 rounding judged by distance from a float64 run
(docs/performance.md, "Rounding"), and a batch of them forks over the cores; other products
keep the BLAS call."""

import re

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
from graphc.backends import compile as compile_graph  # noqa: E402
from graphc.backends.cpu import llvm, small_gemm, threads  # noqa: E402
from graphc.backends.cpu.small_gemm_tile import K_BLOCK  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.ir import parse  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402

if not small_gemm.lanes():
    pytest.skip("the host has neither AVX-512 nor AVX2 with FMA: no generated small GEMM",
                allow_module_level=True)


def _matmul(a, b):
    return a @ b


def _a_transposed(a, b):
    return a.t() @ b


def _b_transposed(a, b):  # a Linear layer's forward product: a BLAS "T" flag, packed first
    return a @ b.t()


def _weight_first(a, b):  # graphc.passes.gemm_order's order: W [n, k] @ x.T, n rows
    return b @ a.t()


def _bias_tanh(a, b):  # a GEMM with a fused epilogue reading the kernel's result
    return (a @ b + 0.5).tanh()


def _scores(q, k):  # attention's Q K^T per (batch, head): b read transposed, a small block
    return q @ k.transpose(-2, -1)


THIN = [  # (f, a shape, b shape): every one takes the generated kernel
    (_matmul, (16, 128), (128, 512)),
    (_matmul, (16, 512), (512, 128)),
    (_matmul, (5, 48), (48, 32)),  # rows that leave a smaller last tile
    (_matmul, (40, 64), (64, 16)),  # many rows, one vector of columns
    (_matmul, (6, 1000), (1000, 32)),  # k in blocks: the first, a loop of two, the rest
    (_matmul, (2, 7, 32), (32, 64)),  # a batch, folded into 14 rows
    (_matmul, (3, 6, 32), (3, 32, 48)),  # a batch with a b per element: a loop of kernels
    (_a_transposed, (64, 16), (64, 128)),
    (_b_transposed, (16, 128), (512, 128)),
    (_weight_first, (16, 128), (512, 128)),
    (_bias_tanh, (16, 96), (96, 64)),
    (_b_transposed, (64, 32), (64, 32)),  # not thin, but b transposed and 64 x 64
    (_scores, (2, 3, 64, 32), (2, 3, 48, 32)),  # heads: a loop of kernels over the cores
    (_scores, (2, 40, 32), (2, 64, 32)),  # rows that leave a smaller last tile
    (_scores, (2, 64, 24), (2, 48, 24)),  # b's panels copied element by element (k 24)
    (_b_transposed, (16, 300), (32, 300)),  # k above PANEL_COPY_MAX_K: b^T copied first
]
MEDIUM = [  # on AVX-512 hosts: a read row by row, n <= MEDIUM_N, k <= MEDIUM_K
    (_matmul, (1024, 128), (128, 128)),  # a projection's input gradient: 8 row chunks
    (_b_transposed, (4, 64, 512), (128, 512)),  # a Linear forward, k in two blocks, b packed
    (_bias_tanh, (2, 128, 96), (96, 64)),  # 256 rows folded from a batch, an epilogue
    (_matmul, (384, 32), (32, 16)),  # thin and medium: one chunk a call
    (_matmul, (300, 64), (64, 32)),  # rows not in whole chunks: one call
]
if small_gemm.lanes() == 16:
    THIN += MEDIUM


@pytest.mark.parametrize("f, a_shape, b_shape", THIN,
                         ids=[f"{f.__name__}-{a}x{b}" for f, a, b in THIN])
def test_thin_products_run_the_generated_kernel_within_rounding(f, a_shape, b_shape):
    rng = np.random.default_rng(sum(a_shape) * 31 + sum(b_shape))
    a = graphc.tensor(rng.standard_normal(a_shape).astype(np.float32))
    b = graphc.tensor(rng.standard_normal(b_shape).astype(np.float32))
    compiled = graphc.compile(f, backend="cpu")
    got = compiled(a, b).numpy()
    want = graphc.compile(f, backend="interp")(a, b).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert_rounding_within(got, f(a, b).numpy(), f(a.double(), b.double()).numpy())
    assert "graphc_small_sgemm_" in compiled.executable.lowered.ir_text


def test_a_weight_gradient_with_a_short_k_keeps_the_blas(monkeypatch):
    """x^T @ dy over 256 tokens (k below LONG_K_MIN) reads a by columns, broadcasts k rows
    apart: a BLAS with AVX-512 kernels is faster there (one without: small_gemm.copies_a)."""
    monkeypatch.setattr(small_gemm, "LARGE_PRODUCTS", "off")
    rng = np.random.default_rng(7)
    x, dy = (graphc.tensor(rng.standard_normal((256, 128)).astype(np.float32))
             for _ in range(2))
    compiled = graphc.compile(_a_transposed, backend="cpu")
    np.testing.assert_allclose(compiled(x, dy).numpy(), (x.t() @ dy).numpy(), rtol=1e-4,
                               atol=1e-4)
    assert "graphc_small_sgemm_" not in compiled.executable.lowered.ir_text


@pytest.mark.skipif(small_gemm.lanes() != 16, reason="medium products are AVX-512 only")
def test_a_medium_product_splits_its_rows_between_the_cores():
    rng = np.random.default_rng(1024)
    a = graphc.tensor(rng.standard_normal((1024, 128)).astype(np.float32))
    b = graphc.tensor(rng.standard_normal((128, 128)).astype(np.float32))
    compiled = graphc.compile(_matmul, backend="cpu")
    compiled(a, b)
    text = compiled.executable.lowered.ir_text
    chunk = small_gemm.ROW_CHUNK
    assert f"graphc_small_sgemm_{chunk}x128x128" in text  # one chunk's kernel
    assert re.search(r'define[^@]*@"?\w*small_gemm\.omp', text), "no forked loop of chunks"
    for count in sorted({1, threads.most_threads()}):
        compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        got = compiled(a, b).numpy()
        np.testing.assert_allclose(got, graphc.compile(_matmul, backend="interp")(a, b).numpy(),
                                   rtol=1e-4, atol=1e-4)
        assert_rounding_within(got, _matmul(a, b).numpy(), _matmul(a.double(), b.double()).numpy())


def test_a_batch_of_generated_products_forks_over_the_cores():
    """GPT's scores, [16, 4, 64, 32] @ [16, 4, 32, 64]: one generated kernel per head, the
    loop over heads split between the threads (each head's code as at one thread)."""
    rng = np.random.default_rng(64)
    q, k = (graphc.tensor(rng.standard_normal((16, 4, 64, 32)).astype(np.float32))
            for _ in range(2))
    compiled = graphc.compile(_scores, backend="cpu")
    compiled(q, k)
    text = compiled.executable.lowered.ir_text
    assert re.search(r'define[^@]*@"?\w*small_gemm\.omp', text), "no forked loop of heads"
    assert "gemm_pack" not in text  # k^T's panels are copied inside the kernel
    for count in sorted({1, threads.most_threads()}):
        compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        got = compiled(q, k).numpy()
        np.testing.assert_allclose(got, graphc.compile(_scores, backend="interp")(q, k).numpy(),
                                   rtol=1e-4, atol=1e-4)
        assert_rounding_within(got, _scores(q, k).numpy(),
                               _scores(q.double(), k.double()).numpy())


WIDE = [  # (a shape, b shape, dtype): the BLAS keeps these
    ((64, 256), (256, 256), np.float32),  # not thin (both sides above MAX_THIN), not medium
    ((64, 64), (64, 32), np.float32),  # a small block, but b read as laid out
    ((1024, 128), (128, 1024), np.float32),  # medium but for n above MEDIUM_N
    ((1000, 520), (520, 128), np.float32),  # k above MEDIUM_K, rows not in whole chunks
    ((16, 128), (128, 10), np.float32),  # 10 columns: not a whole vector
    ((1, 128), (128, 64), np.float32),  # one row: the GEMV
    ((16, 8), (8, 64), np.float32),  # k below MIN_K
    ((16, 128), (128, 64), np.float64),  # float64
]


@pytest.mark.parametrize("a_shape, b_shape, dtype", WIDE)
def test_other_products_keep_the_blas(a_shape, b_shape, dtype, monkeypatch):
    # a BLAS that uses the host's AVX-512 (here forced): large products stay on it too
    monkeypatch.setattr(small_gemm, "LARGE_PRODUCTS", "off")
    rng = np.random.default_rng(len(a_shape) + b_shape[-1])
    a = graphc.tensor(rng.standard_normal(a_shape).astype(dtype))
    b = graphc.tensor(rng.standard_normal(b_shape).astype(dtype))
    compiled = graphc.compile(_matmul, backend="cpu")
    np.testing.assert_allclose(compiled(a, b).numpy(), (a @ b).numpy(), rtol=1e-4, atol=1e-4)
    assert "graphc_small_sgemm_" not in compiled.executable.lowered.ir_text


def test_tiles_split_the_rows_evenly_and_hold_the_sums_in_registers():
    width = small_gemm.lanes()
    registers = 24 if width == 16 else 12
    for m, n, k in [(16, 32 * width, 128), (16, 8 * width, 512), (512, width, 128),
                    (5, 2 * width, 64), (13, 3 * width, 32)]:
        tile = small_gemm.tile_for(m, n, k, k, 1, n)
        assert tile is not None and tile.rows * tile.vectors <= registers
        blocks = -(-m // tile.rows)
        assert m - (blocks - 1) * tile.rows <= tile.rows  # the last tile is the smaller
        assert tile.rows * blocks - m < blocks  # evenly: no block shorter by more than one
    assert small_gemm.tile_for(17, 17 * width, 64, 64, 1, 17 * width) is None  # not thin
    block = small_gemm.MAX_TRANSPOSED_BLOCK
    assert small_gemm.tile_for(block, block, 32, 32, 1, block, b_transposed=True) is not None
    assert small_gemm.tile_for(block, block, 32, 32, 1, block) is None
    assert small_gemm.tile_for(block + 1, block, 32, 32, 1, block, b_transposed=True) is None


def test_an_lstm_training_step_matches_eager_within_rounding():
    """The recurrent step's products (forward in gemm_order's order, with a packed
    transposed operand; backward's input gradient) in a whole Adam step."""
    def build(dtype):
        graphc.manual_seed(7)
        lstm = graphc.nn.LSTM(16, 32, batch_first=True).to(dtype)
        return lstm, graphc.optim.Adam(lstm.parameters(), lr=1e-2)

    def step_of(lstm, opt):
        def step(x):
            opt.zero_grad()
            out, _ = lstm(x)
            loss = (out * out).mean()
            loss.backward()
            opt.step()
            return loss.detach()
        return step

    rng = np.random.default_rng(11)
    x = rng.standard_normal((16, 6, 16)).astype(np.float32)
    results = {}
    for name, dtype, compile_it in [("compiled", graphc.float32, True),
                                    ("eager", graphc.float32, False),
                                    ("reference", graphc.float64, False)]:
        lstm, opt = build(dtype)
        step = step_of(lstm, opt)
        if compile_it:
            step = graphc.compile(step, backend="cpu")
        xs = graphc.tensor(x).to(dtype)
        losses = [float(step(xs).item()) for _ in range(3)]
        results[name] = (np.array(losses), lstm.weight_hh_l0.detach().numpy().copy())
        if compile_it:
            assert "graphc_small_sgemm_" in step.executable.lowered.ir_text
    for k in range(2):
        assert_rounding_within(results["compiled"][k], results["eager"][k],
                               results["reference"][k])


@pytest.mark.parametrize("width", [8, 16])
def test_both_vector_widths_agree_with_numpy(monkeypatch, width):
    """AVX2 hosts get 8-lane tiles (12 sums in 16 registers), AVX-512 hosts 16-lane ones:
    both generated on this host where it has the instructions."""
    features = llvm.host_target()
    if width == 16 and not features.has_feature("avx512f"):
        pytest.skip("the host has no AVX-512: 16-lane tiles cannot run here")
    monkeypatch.setattr(small_gemm, "lanes", lambda: width)
    text = '''graph @f(%a: f32[13,96], %w: f32[48,96]) -> (f32[13,48], f32[13,96]) {
  %0: f32[96,48] = permute[dims=(1, 0)](%w)
  %1: f32[13,48] = matmul(%a, %0)
  %2: f32[13,96] = matmul(%1, %w)
  return (%1, %2)
}'''
    g = parse(text)
    rng = np.random.default_rng(width)
    a, w = (rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs)
    executable = compile_graph(g, "cpu")
    tiles = set(re.findall(r'define[^@]*@"?graphc_small_sgemm_\w+_t\d+x\d+x(\d+)',
                           executable.lowered.ir_text))
    assert tiles == {str(width)}
    got1, got2 = executable.run(a, w)
    np.testing.assert_allclose(got1, a @ w.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got2, (a @ w.T) @ w, rtol=1e-4, atol=1e-4)


WEIGHT_GRADIENTS = [  # (x shape, dy shape): x^T @ dy, a read transposed, k = the tokens
    ((1024, 128), (1024, 128)),  # GPT's projections: two chunks of k, merged in order
    ((1024, 128), (1024, 512)),  # GPT's second Linear: eight column chunks
    ((600, 37), (600, 96)),  # k: 256, one more block, 88 left; rows leave a last tile of 7
    ((512, 48), (512, 48)),  # one vector a panel (48 columns: three panels), no chunks
    ((777, 20), (777, 256)),  # rows under a tile's, k not a multiple of the lanes
    ((1024, 512), (1024, 128)),  # GPT's first Linear: 512 rows of a (a prefetched), in
    # two chunks of K_OUTER_ROW_CHUNK rows, not of columns
]


@pytest.mark.skipif(small_gemm.lanes() != 16, reason="weight gradients are AVX-512 only")
@pytest.mark.parametrize("x_shape, dy_shape", WEIGHT_GRADIENTS,
                         ids=[f"{x}x{dy}" for x, dy in WEIGHT_GRADIENTS])
def test_weight_gradients_with_a_long_k_run_the_k_outer_kernel(x_shape, dy_shape):
    rng = np.random.default_rng(sum(x_shape) * 7 + dy_shape[1])
    x = graphc.tensor(rng.standard_normal(x_shape).astype(np.float32))
    dy = graphc.tensor(rng.standard_normal(dy_shape).astype(np.float32))
    compiled = graphc.compile(_a_transposed, backend="cpu")
    compiled(x, dy)
    text = compiled.executable.lowered.ir_text
    assert re.search(r"graphc_small_sgemm_\w+_ko", text), "no k-outer kernel"
    rows = x_shape[1] >= 2 * small_gemm.K_OUTER_ROW_CHUNK
    tokens = small_gemm.K_CHUNKS >= 2 and not rows and dy_shape[1] <= small_gemm.K_CHUNK_MAX_N \
        and x_shape[0] % (small_gemm.K_CHUNKS * K_BLOCK) == 0
    chunked = dy_shape[1] >= 2 * small_gemm.COLUMN_CHUNK and not rows and not tokens
    assert (f"_c{dy_shape[1]}" in text) == chunked  # chunks of c's columns, rows ldc apart
    assert ("gemm_k_merge" in text) == tokens  # chunks of k, their partials merged after
    if chunked or rows or tokens:  # even two chunks of 128 x 64 fork: each sums k products
        assert re.search(r'define[^@]*@"?\w*small_gemm\.omp', text), "no forked chunks"
    want = graphc.compile(_a_transposed, backend="interp")(x, dy).numpy()
    results = []
    for count in sorted({1, threads.most_threads()}):
        compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        got = compiled(x, dy).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        assert_rounding_within(got, _a_transposed(x, dy).numpy(),
                               _a_transposed(x.double(), dy.double()).numpy())
        results.append(got)
    for got in results[1:]:  # chunks of columns or of k: the same sums on any thread count
        np.testing.assert_array_equal(got, results[0])


@pytest.mark.skipif(small_gemm.lanes() != 16, reason="weight gradients are AVX-512 only")
@pytest.mark.parametrize("count", [2, 4])
def test_a_weight_gradient_in_chunks_of_k_adds_its_partials_in_order(monkeypatch, count):
    """K_CHUNKS: each chunk of tokens sums its k blocks as the k-outer kernel does on that
    chunk alone, and c is ((p0 + p1) + p2) + ... in chunk order: the same bits as the chunks'
    products, each from the k-outer kernel, added in order (4 chunks: another order of the
    adds gives other bits); within the float64 rule."""
    monkeypatch.setattr(small_gemm, "K_CHUNKS", count)
    rng = np.random.default_rng(100 + count)
    x = rng.standard_normal((1024, 128)).astype(np.float32)
    dy = rng.standard_normal((1024, 128)).astype(np.float32)
    compiled = graphc.compile(_a_transposed, backend="cpu")
    got = compiled(graphc.tensor(x), graphc.tensor(dy)).numpy()
    assert f"graphc_gemm_k_merge_{count}x" in compiled.executable.lowered.ir_text
    tokens = 1024 // count
    monkeypatch.setattr(small_gemm, "K_CHUNKS", 0)  # each chunk alone, through the same kernel
    monkeypatch.setattr(small_gemm, "LONG_K_MIN", tokens)
    alone = graphc.compile(_a_transposed, backend="cpu")
    partials = [alone(graphc.tensor(x[j * tokens:(j + 1) * tokens]),
                      graphc.tensor(dy[j * tokens:(j + 1) * tokens])).numpy()
                for j in range(count)]
    assert re.search(r"graphc_small_sgemm_\w+_ko", alone.executable.lowered.ir_text)
    want = partials[0]
    for p in partials[1:]:
        want = want + p
    np.testing.assert_array_equal(got, want)
    assert_rounding_within(got, x.T @ dy, x.T.astype(np.float64) @ dy.astype(np.float64))


def test_only_weight_gradients_in_its_bounds_take_the_k_outer_kernel(monkeypatch):
    monkeypatch.setattr(small_gemm, "lanes", lambda: 16)
    k = small_gemm.LONG_K_MIN
    m, n = small_gemm.LONG_K_MAX_M, small_gemm.LONG_K_MAX_N
    assert small_gemm.tile_for(m, n, k, 1, m, n).k_outer
    assert small_gemm.tile_for(m, n, k - 1, 1, m, n) is None  # a short k
    assert small_gemm.tile_for(m + 16, n, k, 1, m + 16, n) is None  # past linear1's 512 rows
    assert small_gemm.tile_for(m, n + 16, k, 1, m, n + 16) is None
    assert small_gemm.tile_for(m, n, k, k, 1, n) is None  # a read row by row
    assert small_gemm.tile_for(m, 24, k, 1, m, 24) is None  # not a whole vector of columns
    monkeypatch.setattr(small_gemm, "lanes", lambda: 8)  # AVX2 hosts keep the BLAS: untimed
    assert small_gemm.tile_for(m, n, k, 1, m, n) is None


@pytest.mark.skipif(small_gemm.lanes() != 16, reason="weight gradients are AVX-512 only")
def test_the_k_outer_kernel_prefetches_a_without_changing_a_bit(monkeypatch):
    """PREFETCH_A_K: each k step prefetches a line of a ahead (llvm.prefetch in the kernel);
    the sums are the same instructions, so the same bits as without it."""
    rng = np.random.default_rng(14)
    x = graphc.tensor(rng.standard_normal((1024, 128)).astype(np.float32))
    dy = graphc.tensor(rng.standard_normal((1024, 128)).astype(np.float32))
    results = {}
    for ahead in (None, small_gemm.PREFETCH_A_K or 32):
        monkeypatch.setattr(small_gemm, "PREFETCH_A_K", ahead)
        assert (small_gemm.tile_for(128, 128, 1024, 1, 128, 128).prefetch_a is None) \
            == (ahead is None)
        compiled = graphc.compile(_a_transposed, backend="cpu")
        results[ahead] = compiled(x, dy).numpy()
        text = compiled.executable.lowered.ir_text
        kernel = re.search(r'define[^@]*@"?graphc_small_sgemm_\w+_ko\w*"?\([^)]*\)[^{]*\{'
                           r'(.*?)\n\}', text, re.S)
        assert kernel, "no k-outer kernel"
        assert ("llvm.prefetch" in kernel.group(1)) == (ahead is not None)
    first, second = results.values()
    np.testing.assert_array_equal(first, second)
