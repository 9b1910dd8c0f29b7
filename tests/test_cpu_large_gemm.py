"""Large float32 products in graphc's generated panel GEMM (small_gemm.LARGE_PRODUCTS, taken
where the BLAS leaves the host's AVX-512 unused: blas.avx512_unused) and on the BLAS, both
paths forced: against numpy in float64 for odd sizes, transposed, strided and batched
operands, and the rule that picks them."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
from graphc.backends.cpu import blas, small_gemm, threads  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402

needs_avx512 = pytest.mark.skipif(small_gemm.lanes() != 16,
                                  reason="medium and large products are AVX-512 only")

# (a's shape as stored, b's, a read transposed, b read transposed, a's columns used): n past
# MEDIUM_N in odd panels (528, 33 vectors); k past MEDIUM_K with a remainder of K_BLOCK and
# not whole squares of lanes for the transposing copy (1100); rows not whole ROW_CHUNKs
# (300); a read transposed (copied first, small_gemm.copies_a); a batch folded into the rows
# (2 x 200); a strided a (its rows 320 floats apart, 300 used)
PRODUCTS = [
    ((256, 64), (64, 528), False, False, None),
    ((384, 1100), (512, 1100), False, True, None),
    ((300, 520), (520, 640), False, False, None),
    ((300, 640), (300, 576), True, False, None),
    ((2, 200, 300), (300, 1040), False, False, None),
    ((256, 320), (300, 1024), False, False, 300),
]
IDS = ["n528", "k1100-bt", "m300", "at", "batch", "strided-a"]


def _product(a_t: bool, b_t: bool, columns):
    def product(a, b):
        a = a[..., :columns] if columns else a
        return (a.transpose(-1, -2) if a_t else a) @ (b.transpose(-1, -2) if b_t else b)
    return product


@needs_avx512
@pytest.mark.parametrize("mode", ["on", "off"])
@pytest.mark.parametrize("a_shape, b_shape, a_t, b_t, columns", PRODUCTS, ids=IDS)
def test_large_products_match_float64(a_shape, b_shape, a_t, b_t, columns, mode,
                                      monkeypatch):
    monkeypatch.setattr(small_gemm, "LARGE_PRODUCTS", mode)
    rng = np.random.default_rng(sum(a_shape) + len(mode))
    arrays = [rng.standard_normal(s).astype(np.float32) for s in (a_shape, b_shape)]
    a, b = (graphc.tensor(x) for x in arrays)
    product = _product(a_t, b_t, columns)
    compiled = graphc.compile(product, backend="cpu")
    with graphc.no_grad():
        compiled(a, b)
        text = compiled.executable.lowered.ir_text
        assert ("graphc_small_sgemm_" in text) == (mode == "on")
        exact = product(*(graphc.tensor(x.astype(np.float64)) for x in arrays)).numpy()
        eager = product(a, b).numpy()
        runs = []
        for count in sorted({1, threads.most_threads()}):
            compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(),
                                                               fixed=count)
            runs.append(compiled(a, b).numpy())
    assert runs[0].shape == exact.shape
    assert_rounding_within(runs[0], eager, exact)
    if mode == "on":  # row chunks forked or not: the same instructions per element
        for other in runs[1:]:
            np.testing.assert_array_equal(other, runs[0])


@needs_avx512
def test_float64_and_small_products_keep_their_paths(monkeypatch):
    monkeypatch.setattr(small_gemm, "LARGE_PRODUCTS", "on")
    rng = np.random.default_rng(7)
    a = graphc.tensor(rng.standard_normal((512, 600)))  # float64: the BLAS's dgemm
    b = graphc.tensor(rng.standard_normal((600, 1024)))
    compiled = graphc.compile(lambda x, y: x @ y, backend="cpu")
    with graphc.no_grad():
        np.testing.assert_allclose(compiled(a, b).numpy(), a.numpy() @ b.numpy(), rtol=1e-12)
    assert "graphc_small_sgemm_" not in compiled.executable.lowered.ir_text
    assert small_gemm.tile_for(31, 1024, 1024, 1024, 1, 1024, large=True) is None  # 31 rows
    assert small_gemm.tile_for(256, 1000, 1024, 1024, 1, 1000, large=True) is None  # n % 16


class _Host:
    def __init__(self, avx512: bool) -> None:
        self.avx512 = avx512

    def has_feature(self, name: str) -> bool:
        return self.avx512 and name == "avx512f"


@pytest.mark.parametrize("core, avx512, unused", [
    ("Haswell", True, True),  # numpy's OpenBLAS 0.3.31 on AMD Zen 5
    ("Zen", True, True),
    ("SkylakeX", True, False),
    ("SapphireRapids", True, False),
    ("Haswell", False, False),  # an AVX2 host: nothing left unused
    ("", True, False),  # MKL: no core name
])
def test_the_rule_reads_openblas_core_and_the_host(core, avx512, unused, monkeypatch):
    monkeypatch.setattr(blas.llvm, "host_target", lambda: _Host(avx512))
    library = blas.Blas("libopenblas.so", 1, 2, True, core=core)
    assert blas.avx512_unused(library) is unused
    for mode, expected in (("auto", unused), ("on", True), ("off", False)):
        monkeypatch.setattr(small_gemm, "LARGE_PRODUCTS", mode)
        assert small_gemm.large_products(library) is expected
    monkeypatch.setattr(small_gemm, "LARGE_PRODUCTS", "yes")
    with pytest.raises(ValueError, match="LARGE_PRODUCTS"):
        small_gemm.large_products(library)


def test_the_resolved_blas_names_its_core():
    resolved = blas.resolve_blas()
    if "openblas" in resolved.path.lower():
        assert resolved.core  # OpenBLAS says which kernels it runs


# (input, weight, stride, padding, the kinds lowered through im2col): convolutions whose
# GEMMs (forward NN, input gradient TN, weight gradient NT: Conv.gemm) take small_gemm.
# in_place's kernel where "on": 5x5 kernels (16 x 16 planes, 256 columns an image: k = 800;
# 12 x 12 planes, 144 columns: 9 one-vector panels; its forward takes another path), a 1x1
# one (its weight gradient gy @ x^T: b read transposed, copied by squares onto the stack,
# beta 1 after the first image)
CONVS = [((3, 32, 16, 16), (64, 32, 5, 5), (1, 1), (2, 2), ("fwd", "gx")),
         ((2, 24, 12, 12), (48, 24, 5, 5), (1, 1), (2, 2), ("gx",)),
         ((3, 32, 16, 16), (64, 32, 1, 1), (1, 1), (0, 0), ("fwd", "gx", "gw"))]


@needs_avx512
@pytest.mark.parametrize("mode", ["on", "off"])
@pytest.mark.parametrize("xs, ws, stride, padding, im2col", CONVS,
                         ids=["5x5-16", "5x5-12", "1x1"])
def test_im2col_convolutions_match_float64(xs, ws, stride, padding, im2col, mode,
                                           monkeypatch, tmp_path):
    from graphc.ir.interpreter import run as interpret
    from graphc.ops.conv import conv_output_hw
    from tests.test_cpu_backend import compare, one_op_graph

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(small_gemm, "LARGE_PRODUCTS", mode)
    attrs = dict(stride=stride, padding=padding, dilation=(1, 1), groups=1)
    gs = (xs[0], ws[0]) + conv_output_hw(xs[-2:], ws[2:], stride, padding, (1, 1))

    def graphs(dtype):
        return {"fwd": one_op_graph("conv2d", [(xs, dtype), (ws, dtype)], **attrs),
                "gx": one_op_graph("conv2d_input_grad", [(gs, dtype), (ws, dtype)],
                                   input_hw=xs[-2:], **attrs),
                "gw": one_op_graph("conv2d_weight_grad", [(gs, dtype), (xs, dtype)],
                                   kernel_size=ws[2:], **attrs)}

    rng = np.random.default_rng(sum(xs) + len(mode))
    x, w, gy = (rng.standard_normal(s).astype(np.float32) for s in (xs, ws, gs))
    args = {"fwd": [x, w], "gx": [gy, w], "gw": [gy, x]}
    wide = graphs("float64")
    for kind, graph in graphs("float32").items():
        exe = compare(graph, args[kind], rtol=1e-4)
        reference = interpret(wide[kind], *[a.astype(np.float64) for a in args[kind]])[0]
        assert_rounding_within(exe.run(*args[kind])[0], interpret(graph, *args[kind])[0],
                               reference)
        generated = "graphc_small_sgemm_" in exe.lowered.ir_text
        assert generated == (mode == "on" and kind in im2col), f"{kind}: {generated}"
