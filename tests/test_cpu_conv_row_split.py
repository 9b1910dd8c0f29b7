"""One image's im2col GEMM in one generated call (graphc.backends.cpu.conv_row_split; in
slabs of rows where SLABS asks): the stride-2 3x3 and 1x1 convolutions' forward and input
gradient where the plan takes them, equal to the interpreter within float32 rounding and
within 2x eager's distance from a float64 run (graphc.testing.assert_rounding_within), at
one and two threads; slab counts against numpy and one another; the products the plan must
leave to the BLAS."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import (  # noqa: E402
    conv_pointwise,
    conv_polyphase_grad,
    conv_row_split,
    conv_threads,
    threads,
    winograd_gemm,
)
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.passes.plan import plan_buffers  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from graphc.types import float32, float64  # noqa: E402
from tests.test_cpu_conv_paths import _graphs  # noqa: E402

resolve_blas()  # hands the BLAS's thread count to generated code (threads.install)
SLABS_NAME = "graphc_winograd_gemm_"  # the generated function's name prefix in the module


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    # the 1x1 stride-2 cases test the im2col path's products, which conv_pointwise now takes
    monkeypatch.setattr(conv_pointwise, "ENABLED", False)


def _check(xs, ws, stride, padding, slabs_expected: bool, counts=(1, 2), kinds=("fwd", "gx")):
    """Forward and input gradient (or `kinds`) on each thread count: the interpreter's
    result within float32 rounding, within 2x eager's distance from float64; the generated
    function in the module or not."""
    rng = np.random.default_rng(sum(xs) + 7 * sum(ws))
    gs, graphs = _graphs(xs, ws, stride, padding, 1)
    _, wide = _graphs(xs, ws, stride, padding, 1, "float64")
    x = np.maximum(rng.standard_normal(xs), 0).astype(np.float32)  # after a ReLU
    w = rng.standard_normal(ws).astype(np.float32)
    gy = rng.standard_normal(gs).astype(np.float32)
    arguments = {"fwd": [x, w], "gx": [gy, w], "gw": [gy, x]}
    for kind, args in ((kind, arguments[kind]) for kind in kinds):
        graph = graphs[kind]
        eager = interpret(graph, *args)[0]
        reference = interpret(wide[kind], *[a.astype(np.float64) for a in args])[0]
        plan_buffers(graph)
        for count in counts:
            exe = CpuExecutable(graph)
            exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
            got = exe.run(*[np.array(a, copy=True) for a in args])[0]
            scale = float(np.abs(eager).max())
            np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4 * scale,
                                       err_msg=f"{kind} on {count} threads")
            assert_rounding_within(got, eager, reference)
            assert (SLABS_NAME in exe.lowered.ir_text) == slabs_expected, kind


needs_kernel = pytest.mark.skipif(not winograd_gemm.available(),
                                  reason="winograd_gemm's kernel needs an AVX-512 host")


@needs_kernel
@pytest.mark.parametrize("case", [
    ((2, 64, 16, 16), (128, 64, 1, 1), (2, 2), (0, 0)),   # 1x1 stride 2, 8x8 out
    ((2, 32, 16, 16), (64, 32, 3, 3), (2, 2), (1, 1)),    # 3x3 stride 2, 8x8 out
    ((3, 128, 16, 16), (256, 128, 1, 1), (2, 2), (0, 0)),  # ResNet's 128 -> 256 shortcut
])
def test_stride_two_products_in_slabs(case, monkeypatch):
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)  # two threads split the images
    _check(*case, slabs_expected=True)


@needs_kernel
@pytest.mark.parametrize("case", [
    ((2, 64, 16, 16), (128, 64, 1, 1), (2, 2), (0, 0)),   # 1x1 stride 2, 8x8 out
    ((3, 32, 16, 16), (64, 32, 3, 3), (2, 2), (1, 1)),    # 3x3 stride 2: K = 288 > O
    ((2, 16, 16, 16), (96, 16, 3, 3), (2, 2), (1, 1)),    # K = 144 > O = 96
    ((2, 64, 16, 16), (96, 64, 1, 1), (2, 2), (0, 0)),    # K = 64 < O
    ((2, 32, 18, 18), (64, 32, 3, 3), (2, 2), (1, 1)),    # P = 81: gy^T element by element
])
def test_stride_two_weight_grads(case, monkeypatch):
    # gw^T += cols @ gy^T, gy^T copied per image (16 x 16 squares in vector registers where
    # O and P are whole squares); two threads sum their shares' gw^T. The 3x3 ones are
    # conv_polyphase_grad's where it serves: the switch keeps them here
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(conv_polyphase_grad, "ENABLED", False)
    _check(*case, slabs_expected=True, kinds=("gw",))


@needs_kernel
def test_weight_grad_switch_keeps_the_blas(monkeypatch):
    monkeypatch.setattr(conv_row_split, "WEIGHT_GRAD", False)
    _check((2, 64, 16, 16), (128, 64, 1, 1), (2, 2), (0, 0), slabs_expected=False,
           kinds=("gw",))


@needs_kernel
def test_disabled_keeps_the_blas(monkeypatch):
    monkeypatch.setattr(conv_row_split, "ENABLED", False)
    _check((2, 64, 16, 16), (128, 64, 1, 1), (2, 2), (0, 0), slabs_expected=False,
           kinds=("fwd", "gx", "gw"))


def test_plan_declines(monkeypatch):
    # float64, rows not a whole number of slabs, slabs too thin, k or b too large
    assert conv_row_split.plan(float64, 128, 64, 64, 64, 1, 64, 64) is None
    monkeypatch.setattr(conv_row_split, "SLABS", 16)
    assert conv_row_split.plan(float32, 120, 64, 64, 64, 1, 64, 64) is None
    assert conv_row_split.plan(float32, 32, 64, 64, 64, 1, 64, 64) is None
    monkeypatch.setattr(conv_row_split, "SLABS", 1)
    assert conv_row_split.plan(float32, 3, 64, 64, 64, 1, 64, 64) is None
    assert conv_row_split.plan(float32, 256, 64, 2304, 2304, 1, 64, 64) is None
    assert conv_row_split.plan(float32, 128, 512, 576, 576, 1, 512, 512) is None  # 1.2 MB
    assert conv_row_split.plan(float32, 576, 256, 128, 1, 576, 256, 256, max_n=64) is None
    if winograd_gemm.available():
        g = conv_row_split.plan(float32, 120, 64, 64, 64, 1, 64, 64)  # one product: any rows
        assert (g.m, g.products) == (120, 1)
        monkeypatch.setattr(conv_row_split, "SLABS", 16)
        g = conv_row_split.plan(float32, 256, 64, 1152, 1152, 1, 64, 64)
        assert (g.m, g.n, g.k, g.a_step, g.b_step, g.c_step) == (16, 64, 1152, 16 * 1152, 0,
                                                                  16 * 64)
        assert g.products == 16


@needs_kernel
@pytest.mark.parametrize("slabs", [1, 2, 16])
def test_slabs_equal_numpy_and_one_another(slabs, monkeypatch):
    # the product as `slabs` slabs of rows (a's and c's rows stepped, b shared): c = a @ b,
    # the same bits for every slab count (each element's sums the same)
    from tests.test_cpu_winograd_gemm import _compiled

    m, n, k = 96, 128, 150
    rng = np.random.default_rng(slabs)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n)))
    got = {}
    for count in (slabs, 1):
        monkeypatch.setattr(conv_row_split, "SLABS", count)
        gemm = conv_row_split.plan(float32, m, n, k, k, 1, n, n)
        assert gemm is not None and gemm.products == count
        c = np.full((m, n), np.nan, np.float32)
        _compiled(gemm)(a.ctypes.data, b.ctypes.data, c.ctypes.data, 0.0)
        got[count] = c
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got[slabs], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    np.testing.assert_array_equal(got[slabs], got[1])
