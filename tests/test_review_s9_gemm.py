"""Review of the ninth session's medium products (graphc.backends.cpu.small_gemm with b copied
panel-major by gemm_panels, n up to 512) and of the fused epilogue run in their row chunks
(gemm_epilogue), at the edges of their rules: rows around ROW_CHUNK and MEDIUM_A_BYTES, n
around MEDIUM_N and not whole panels, k over K_BLOCK with a remainder and not whole
lanes x lanes squares (a b read transposed), epilogue operands broadcast from every side,
outputs of other dtypes, the product also a graph output, one and two threads, two Python
threads on one executable. Each result is judged against the interpreter and within
rounding of a float64 run (graphc.testing.assert_rounding_within)."""

from __future__ import annotations

import threading
import zlib

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
from graphc.backends.cpu import threads  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.blas_threads_support import assert_same_bits_across_threads  # noqa: E402


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _tensors(shapes, seed: int) -> list[graphc.Tensor]:
    rng = np.random.default_rng(seed)
    return [graphc.tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes]


def _as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def _check(f, args, counts=(1, 2)) -> graphc.jit.compiler.Compiled:
    """f compiled for the CPU: the same bits on each thread count, as the interpreter's up
    to rounding, and within 2x eager's distance from float64."""
    compiled = graphc.compile(f, backend="cpu")
    compiled(*args)
    runs = []
    for count in sorted({min(c, threads.most_threads()) for c in counts}):
        compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        runs.append([r.numpy() for r in _as_tuple(compiled(*args))])
    interp = [r.numpy() for r in _as_tuple(graphc.compile(f, backend="interp")(*args))]
    eager = [r.numpy() for r in _as_tuple(f(*args))]
    exact = [r.numpy() for r in _as_tuple(f(*(a.double() for a in args)))]
    for k, got in enumerate(runs[0]):
        assert got.shape == interp[k].shape and got.dtype == interp[k].dtype
        for other in runs[1:]:
            assert_same_bits_across_threads(other[k], got)  # the same instructions per element
        if got.dtype == np.bool_:
            mismatched = np.mean(got != interp[k])  # a comparison at the rounding's edge
            assert mismatched < 1e-3, f"output {k}: {mismatched:.2%} of the flags differ"
            continue
        np.testing.assert_allclose(got, interp[k], rtol=2e-4, atol=2e-4)
        assert_rounding_within(got, eager[k], exact[k])
    return compiled


def _gelu_linear(x, w, b):
    return F.gelu(x @ w.t() + b, approximate="tanh")


def _relu_scaled(x, w, b):
    return F.relu(x @ w + b) * 0.5


# (x's shape, n, b transposed): rows at ROW_CHUNK's edges (255: the BLAS; 257 and 300:
# medium, not whole chunks, one call; 256, 384: two and three chunks, the epilogue in them)
# and past MEDIUM_A_BYTES (640 x 512: the BLAS); n at MEDIUM_N's edges and in odd panels (48,
# 96, 480); k of one K_BLOCK and a remainder (257, 1000), k not whole squares of lanes for
# the transposing copy (40, 100). x is batched: as [m, k], graphc.passes.gemm_order turns
# x @ W^T around (W @ x^T, its epilogue then its own kernel)
SHAPES = [
    ((5, 51, 128), 512, True), ((2, 128, 128), 512, True), ((1, 257, 128), 512, True),
    ((2, 192, 100), 496, True), ((2, 128, 64), 528, True), ((3, 128, 40), 48, True),
    ((2, 128, 257), 96, False), ((2, 320, 512), 480, False), ((1, 300, 256), 32, True),
    ((4, 64, 1000), 64, False),
]


@pytest.mark.parametrize("x_shape, n, b_transposed", SHAPES,
                         ids=[f"{x}-{n}{'-bt' if t else ''}" for x, n, t in SHAPES])
def test_medium_products_at_the_edges_of_their_rules(x_shape, n, b_transposed):
    f = _gelu_linear if b_transposed else _relu_scaled
    k = x_shape[-1]
    w_shape = (n, k) if b_transposed else (k, n)
    _check(f, _tensors([x_shape, w_shape, (n,)], zlib.crc32(f"{x_shape}x{n}".encode())))


def _row_bias(x, w, b):  # [m, 1]: one value a row
    return F.gelu(x @ w + b)


def _scalar_bias(x, w, b):
    return F.relu(x @ w - b)


def _transposed_residual(x, w, r):  # an [n, m] residual read transposed: (1, m) strides
    return F.gelu(x @ w + r.t())


def _per_image_bias(x, w, b):  # [4, 1, 1] over [4, 64, n]: rows do not fold, own kernel
    return F.gelu(x @ w + b)


def _per_row_of_batch(x, w, b):  # [4, 64, 1] over [4, 64, n]: folds to one per row
    return F.gelu(x @ w + b)


def _product_also_returned(x, w, b):
    h = x @ w
    return h, F.gelu(h + b)


def _flags(x, w, b):
    return (x @ w + b) > 0


def _to_float64(x, w, b):
    return F.silu(x @ w + b).double()


def _where(x, w, b):
    h = x @ w
    return graphc.where(h > b, h, b * 2.0)


EPILOGUES = [
    (_row_bias, [(256, 96), (96, 128), (256, 1)]),
    (_scalar_bias, [(384, 96), (96, 128), ()]),
    (_transposed_residual, [(256, 96), (96, 128), (128, 256)]),
    (_per_image_bias, [(4, 64, 96), (96, 128), (4, 1, 1)]),
    (_per_row_of_batch, [(4, 64, 96), (96, 128), (4, 64, 1)]),
    (_product_also_returned, [(256, 96), (96, 128), (128,)]),
    (_flags, [(256, 96), (96, 128), (128,)]),
    (_to_float64, [(384, 96), (96, 256), (256,)]),
    (_where, [(256, 128), (128, 64), (64,)]),
]


@pytest.mark.parametrize("f, shapes", EPILOGUES, ids=[f.__name__ for f, _ in EPILOGUES])
def test_epilogues_broadcast_from_every_side(f, shapes):
    _check(f, _tensors(shapes, zlib.crc32(f.__name__.encode())))


def test_two_python_threads_share_one_executable():
    """The chunks' epilogue and b's panels live in the executable's scratch: calls from two
    threads at once must not see each other's (the executable's lock serialises them)."""
    (w,) = _tensors([(512, 128)], 5)
    inputs = _tensors([(4, 64, 128)] * 4, 6)

    def f(x):
        return F.gelu(x @ w.t())

    compiled = graphc.compile(f, backend="cpu")
    compiled(inputs[0])
    assert "_bp_" in compiled.executable.lowered.ir_text, "no medium kernel on b's panels"
    wanted = [compiled(x).numpy().copy() for x in inputs]
    wrong: list[int] = []

    def calls(i: int) -> None:
        for _ in range(10):
            if not np.array_equal(compiled(inputs[i]).numpy(), wanted[i]):
                wrong.append(i)

    workers = [threading.Thread(target=calls, args=(i,)) for i in range(len(inputs))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert wrong == []


def test_a_batch_of_one_runs_its_epilogue_in_the_row_chunks_too():
    """[1, 256, 128] @ W^T: the same rows as [2, 128, 128], whose GELU runs in the chunks."""
    kernels = []
    for x_shape in ((2, 128, 128), (1, 256, 128)):
        compiled = _check(_gelu_linear, _tensors([x_shape, (512, 128), (512,)], 8), counts=(1,))
        kernels.append(sorted(k.split("_", 1)[1] for k in compiled.executable.lowered.kernels))
    assert kernels[0] == ["gemm_pack", "small_gemm"]  # the epilogue in the GEMM's kernel
    assert kernels[1] == kernels[0]
