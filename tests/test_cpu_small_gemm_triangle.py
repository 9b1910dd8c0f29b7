"""small_gemm's `triangle`: a causal head's P (or dS) times b, each row block summing only
the k its rows can see (graphc/backends/cpu/small_gemm.py, used by attention_small). The
kernel is built alone, called through ctypes on a triangular a, and compared with numpy."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

pytest.importorskip("llvmlite")

from llvmlite import ir  # noqa: E402

from graphc.backends.cpu import llvm, small_gemm  # noqa: E402
from graphc.backends.cpu.small_gemm import SmallGemm  # noqa: E402

if not small_gemm.lanes():
    pytest.skip("no AVX2/FMA: small_gemm generates no kernels", allow_module_level=True)


class _Module:
    """What small_gemm.function needs of a code generator: a module."""

    def __init__(self) -> None:
        self.module = ir.Module("triangle_test")


def _kernel(g: SmallGemm):
    """g's kernel compiled alone: fn(a, b, c) with the operands' addresses."""
    cg = _Module()
    small_gemm.function(cg, g)
    library = llvm.compile_module(str(cg.module), "triangle_test", use_cache=False)
    p = ctypes.c_void_p
    return library.ctypes_function(g.name, None, [p, p, p])


@pytest.mark.parametrize("triangle", ["lower", "upper"])
@pytest.mark.parametrize("m,depth,n", [(64, 64, 32), (48, 64, 16), (64, 48, 32)])
def test_a_triangular_a_gives_the_full_product(rng, triangle, m, depth, n):
    width = small_gemm.lanes()
    vectors = 2 if (n // width) % 2 == 0 else 1
    g = SmallGemm(m, n, depth, depth, 1, n, small_gemm.tile_rows(m, vectors, width), vectors,
                  width, triangle=triangle)
    fn = _kernel(g)
    a = rng.standard_normal((m, depth)).astype(np.float32)
    i, k = np.indices((m, depth))
    a[(k > i) if triangle == "lower" else (k < i)] = 0.0  # zeros past the diagonal
    b = rng.standard_normal((depth, n)).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)
    fn(a.ctypes.data, b.ctypes.data, c.ctypes.data)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_a_triangle_needs_k_in_one_block():
    g = SmallGemm(64, 32, 512, 512, 1, 32, 11, 2, small_gemm.lanes(), triangle="lower")
    with pytest.raises(ValueError, match="triangular a is for the row-ordered kernel"):
        small_gemm.function(_Module(), g)


def test_lower_c_computes_every_element_on_and_below_the_diagonal(rng):
    """`lower_c` (a causal head's scores): row blocks wholly above a panel are skipped, so
    c's upper right holds what it held; every element with j <= i is the product."""
    width = small_gemm.lanes()
    m = n = 64
    depth = 32
    g = SmallGemm(m, n, depth, depth, 1, n, small_gemm.tile_rows(m, 2, width), 2, width,
                  lower_c=True)
    fn = _kernel(g)
    a = rng.standard_normal((m, depth)).astype(np.float32)
    b = rng.standard_normal((depth, n)).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)
    fn(a.ctypes.data, b.ctypes.data, c.ctypes.data)
    i, j = np.indices((m, n))
    expected = a.astype(np.float64) @ b
    np.testing.assert_allclose(c[j <= i], expected[j <= i], rtol=1e-4, atol=1e-4)
    assert np.isnan(c[:g.rows, 2 * width:]).all()  # the first row block, in the second panel
