"""A medium product's b is copied panel-major before its row chunks
(graphc.backends.cpu.gemm_panels): read as laid out or transposed (a Linear's W^T), k whole
squares of lanes or not, n up to 512; the results are the same bits as the same kernel
reading b in place, within rounding of a float64 run, at one and two threads."""

import re

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
from graphc.backends.cpu import gemm_panels, small_gemm, threads  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402

if small_gemm.lanes() != 16:
    pytest.skip("medium products are AVX-512 only", allow_module_level=True)


def _matmul(a, b):
    return a @ b


def _linear(a, w):  # b = W^T, read transposed: its panels copied through register squares
    return a @ w.t()


CASES = [  # (f, a shape, b's shape as passed)
    (_linear, (16, 64, 128), (512, 128)),  # GPT's first Linear, 16 panels
    (_matmul, (1024, 128), (128, 512)),  # its input gradient's product, b as laid out
    (_matmul, (512, 512), (512, 128)),  # k 512: two blocks of k, 64 KB panels
    (_linear, (4, 64, 72), (384, 72)),  # k 72: not whole squares of 16, element by element
    (_matmul, (300, 40), (40, 48)),  # 300 rows (one call), three one-vector panels
]


def _compiled(f, args, panels: bool):
    saved = gemm_panels.PANEL_MAJOR_B
    gemm_panels.PANEL_MAJOR_B = panels
    try:
        compiled = graphc.compile(f, backend="cpu")
        compiled(*args)
        return compiled
    finally:
        gemm_panels.PANEL_MAJOR_B = saved


@pytest.mark.parametrize("f, a_shape, b_shape", CASES,
                         ids=[f"{f.__name__}-{a}x{b}" for f, a, b in CASES])
def test_panel_major_b_gives_the_same_bits(f, a_shape, b_shape):
    rng = np.random.default_rng(sum(a_shape) * 7 + sum(b_shape))
    args = [graphc.tensor(rng.standard_normal(s).astype(np.float32)) for s in (a_shape, b_shape)]
    packed, in_place = _compiled(f, args, True), _compiled(f, args, False)
    text = packed.executable.lowered.ir_text
    assert "graphc_gemm_panels_" in text and re.search(r"graphc_small_sgemm_\w+_bp_", text)
    assert "graphc_gemm_panels_" not in in_place.executable.lowered.ir_text
    want = in_place(*args).numpy()
    for count in sorted({1, threads.most_threads()}):
        packed.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        np.testing.assert_array_equal(packed(*args).numpy(), want)  # each sum as before
    got = packed(*args).numpy()
    np.testing.assert_allclose(got, graphc.compile(f, backend="interp")(*args).numpy(),
                               rtol=1e-4, atol=1e-4)
    assert_rounding_within(got, f(*args).numpy(), f(*(a.double() for a in args)).numpy())


def test_products_of_one_size_share_one_scratch_region():
    """Two medium products with b of the same size copy their panels into the same scratch
    (each node's copy is read by its own kernel alone): the arena grows by one copy."""
    rng = np.random.default_rng(5)
    a, w1, w2 = (graphc.tensor(rng.standard_normal(s).astype(np.float32))
                 for s in ((512, 128), (128, 128), (128, 128)))

    def two(a, w1, w2):
        return (a @ w1) @ w2

    def one(a, w1, w2):
        return a @ w1

    sizes = {}
    for f in (two, one):
        compiled = graphc.compile(f, backend="cpu")
        got = compiled(a, w1, w2).numpy()
        np.testing.assert_allclose(got, f(a, w1, w2).numpy(), rtol=1e-4, atol=1e-4)
        sizes[f.__name__] = compiled.executable.lowered.arena_bytes
        assert compiled.executable.lowered.ir_text.count("_gemm_pack") >= 1
    # the second product adds its [512 x 128] output, not another 64 KB of panels
    assert sizes["two"] - sizes["one"] <= 512 * 128 * 4
