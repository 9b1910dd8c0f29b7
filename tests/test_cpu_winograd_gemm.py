"""The generated function for a Winograd block's 16 GEMMs (graphc.backends.cpu.winograd_gemm):
alone against numpy (c = a @ b and c += a @ b, a read as laid out or transposed, partial row
tiles, several panels, k in blocks with a shorter last), what `plan` declines, and the
convolutions that call it (forward, input gradient, weight gradient; one thread and all
cores) against the interpreter and within 2x eager's distance from a float64 run."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import conv_winograd, winograd_gemm  # noqa: E402
from graphc.backends.cpu.small_gemm import lanes  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.test_cpu_backend import compare  # noqa: E402
from tests.test_cpu_conv_paths import _graphs  # noqa: E402

needs_vectors = pytest.mark.skipif(
    lanes() != 16, reason="no AVX-512 on this host: the BLAS serves every block")
POSITIONS = winograd_gemm.POSITIONS


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _compiled(gemm):
    """The generated function for `gemm` as a ctypes callable (a, b, c, beta)."""
    from llvmlite import ir

    from graphc.backends.cpu import llvm

    module = ir.Module(name="winograd_gemm_test")
    name = winograd_gemm.function(module, gemm).name
    library = llvm.compile_module(str(module), "winograd_gemm_test", use_cache=False)
    return library.ctypes_function(name, None, (ctypes.c_void_p,) * 3 + (ctypes.c_float,))


# (m, n, k, a transposed, beta): partial row tiles (m not a multiple of the tile's rows),
# two panels, k over several blocks with a shorter last, beta 0 and 1
SHAPES = [
    (20, 64, 40, False, 0.0),
    (20, 64, 40, True, 0.0),
    (33, 128, 150, False, 1.0),
    (16, 32, 16, True, 1.0),
    (7, 16, 64, False, 0.0),
]


@needs_vectors
@pytest.mark.parametrize("case", range(len(SHAPES)))
def test_block_of_products_equals_numpy(case):
    m, n, k, transposed, beta = SHAPES[case]
    rng = np.random.default_rng(case)
    a_step, b_step, c_step = m * k + 32, k * n + 48, m * n + 16
    a_row, a_col = (1, m) if transposed else (k, 1)
    gemm = winograd_gemm.plan(m, n, k, a_row, a_col, n, n, a_step, b_step, c_step, beta != 0)
    assert gemm is not None
    a, b, c = (rng.standard_normal(POSITIONS * s).astype(np.float32)
               for s in (a_step, b_step, c_step))
    before = c.copy()
    _compiled(gemm)(a.ctypes.data, b.ctypes.data, c.ctypes.data, beta)
    for xi in range(POSITIONS):
        am = a[xi * a_step:xi * a_step + m * k].astype(np.float64)
        am = am.reshape(k, m).T if transposed else am.reshape(m, k)
        bm = b[xi * b_step:xi * b_step + k * n].reshape(k, n).astype(np.float64)
        want = am @ bm + beta * before[xi * c_step:xi * c_step + m * n].reshape(m, n)
        got = c[xi * c_step:xi * c_step + m * n].reshape(m, n)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(),
                                   err_msg=f"position {xi}")
        # the gaps between matrices are not written
        gap = slice(xi * c_step + m * n, (xi + 1) * c_step)
        np.testing.assert_array_equal(c[gap], before[gap])


@needs_vectors
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_b_stored_panel_by_panel(beta):
    # b's columns in panels of PANEL_COLUMNS, each panel's k rows a block of its own (and a
    # gap after it): the same bits as b in whole rows
    m, k, panels = 20, 70, 3
    width = winograd_gemm.PANEL_COLUMNS
    n, b_panel = panels * width, k * width + 16
    rng = np.random.default_rng(int(beta))
    a_step, c_step = m * k + 32, m * n + 16
    rows = winograd_gemm.plan(m, n, k, k, 1, n, n, a_step, k * n, c_step, beta != 0)
    by_panel = winograd_gemm.plan(m, n, k, k, 1, width, n, a_step, panels * b_panel, c_step,
                                  beta != 0, b_panel=b_panel)
    assert by_panel is not None and by_panel.name != rows.name
    a = rng.standard_normal(POSITIONS * a_step).astype(np.float32)
    whole = rng.standard_normal((POSITIONS, k, n)).astype(np.float32)
    split = np.zeros((POSITIONS, panels, b_panel), np.float32)
    for p in range(panels):
        split[:, p, :k * width] = whole[:, :, p * width:(p + 1) * width].reshape(POSITIONS, -1)
    c = rng.standard_normal(POSITIONS * c_step).astype(np.float32)
    got, want = c.copy(), c.copy()
    _compiled(rows)(a.ctypes.data, whole.ctypes.data, want.ctypes.data, beta)
    _compiled(by_panel)(a.ctypes.data, split.ctypes.data, got.ctypes.data, beta)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(want, c)
    # panels of another width than the tile's are declined
    assert winograd_gemm.plan(m, 32, k, k, 1, 32, 32, 0, 0, 0, b_panel=k * 32) is None


@needs_vectors
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_rows_over_panels_same_bits(beta, monkeypatch):
    # two panels: each row block over both panels (ROWS_OVER_PANELS), or each panel over all
    # row blocks: other code, the same sums (k in three blocks, a partial row tile)
    m, n, k = 33, 128, 150
    rng = np.random.default_rng(5 + int(beta))
    a_step, b_step, c_step = m * k + 32, k * n + 48, m * n + 16
    gemm = winograd_gemm.plan(m, n, k, k, 1, n, n, a_step, b_step, c_step, beta != 0)
    assert gemm is not None and gemm.n // (gemm.vectors * gemm.lanes) == 2
    a, b, c = (rng.standard_normal(POSITIONS * s).astype(np.float32)
               for s in (a_step, b_step, c_step))
    results, texts = [], set()
    for over in (winograd_gemm.ROWS_OVER_PANELS, 0):
        monkeypatch.setattr(winograd_gemm, "ROWS_OVER_PANELS", over)
        from llvmlite import ir

        module = ir.Module(name="winograd_gemm_test")
        winograd_gemm.function(module, gemm)
        texts.add(str(module))
        got = c.copy()
        _compiled(gemm)(a.ctypes.data, b.ctypes.data, got.ctypes.data, beta)
        results.append(got)
    assert len(texts) == 2  # the switch changed the loops
    np.testing.assert_array_equal(results[0], results[1])
    assert not np.array_equal(results[0], c)


@needs_vectors
def test_plan_declines_what_the_blas_keeps(monkeypatch):
    width = lanes()
    assert winograd_gemm.plan(64, 64, 64, 64, 1, 64, 64, 0, 0, 0) is not None
    assert winograd_gemm.plan(64, width + 4, 64, 64, 1, 64, 64, 0, 0, 0) is None  # n
    too_long = winograd_gemm.MAX_K + 1
    assert winograd_gemm.plan(64, 64, too_long, too_long, 1, 64, 64, 0, 0, 0) is None
    side = int(winograd_gemm.MAX_ACCUMULATED_C ** 0.5) * 2  # a large accumulated c
    assert winograd_gemm.plan(side, side, 64, 64, 1, side, side, 0, 0, 0, True) is None
    assert winograd_gemm.plan(side, side, 64, 64, 1, side, side, 0, 0, 0) is not None
    monkeypatch.setattr(winograd_gemm, "lanes", lambda: 8)  # AVX2: not measured, the BLAS
    assert winograd_gemm.plan(64, 64, 64, 64, 1, 64, 64, 0, 0, 0) is None
    monkeypatch.setattr(winograd_gemm, "lanes", lambda: 16)
    monkeypatch.setattr(winograd_gemm, "ENABLED", False)
    assert winograd_gemm.plan(64, 64, 64, 64, 1, 64, 64, 0, 0, 0) is None


# (input, weight): n (tiles a block, and the weight gradient's output channels) whole vectors
TAKEN = [
    ((2, 16, 8, 8), (32, 16, 3, 3)),  # 16 tiles an image, blocks of 2 images: 32 tiles
    ((1, 32, 16, 8), (16, 32, 3, 3)),  # one image, 32 tiles
    ((4, 80, 8, 8), (32, 80, 3, 3)),  # the forward's k = 80: two blocks of k (64 + 16)
]


def check_block_gemm(xs, ws) -> None:
    """Forward and both gradients through the generated block GEMM: the interpreter's
    result, within 2x eager's distance from float64."""
    rng = np.random.default_rng(sum(xs) + sum(ws))
    gs, graphs = _graphs(xs, ws, (1, 1), (1, 1), 1)
    _, wide = _graphs(xs, ws, (1, 1), (1, 1), 1, "float64")
    x = np.maximum(rng.standard_normal(xs), 0).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    gy = rng.standard_normal(gs).astype(np.float32)
    for kind, args in (("fwd", [x, w]), ("gx", [gy, w]), ("gw", [gy, x])):
        exe = compare(graphs[kind], args, rtol=1e-4)
        eager = interpret(graphs[kind], *args)[0]
        reference = interpret(wide[kind], *[a.astype(np.float64) for a in args])[0]
        assert_rounding_within(exe.run(*args)[0], eager, reference)
        assert "graphc_winograd_gemm" in exe.lowered.ir_text, kind


@needs_vectors
@pytest.mark.parametrize("case", range(len(TAKEN)))
def test_convolutions_through_the_block_gemm(case):
    check_block_gemm(*TAKEN[case])


@needs_vectors
def test_weight_grad_blocks_accumulate(monkeypatch):
    # blocks of 16 tiles: beta 0 for the first, 1 for the three after (4 images)
    monkeypatch.setattr(conv_winograd, "WEIGHT_GRAD_TILES", 16)
    check_block_gemm((4, 16, 8, 8), (16, 16, 3, 3))


def test_disabled_keeps_the_blas_calls(monkeypatch):
    monkeypatch.setattr(winograd_gemm, "ENABLED", False)
    xs, ws = TAKEN[0]
    rng = np.random.default_rng(1)
    _, graphs = _graphs(xs, ws, (1, 1), (1, 1), 1)
    args = [rng.standard_normal(s).astype(np.float32) for s in (xs, ws)]
    exe = compare(graphs["fwd"], args, rtol=1e-4)
    assert "conv2d_winograd" in exe.lowered.ir_text
    assert "graphc_winograd_gemm" not in exe.lowered.ir_text


@needs_vectors
def test_split_over_the_cores(monkeypatch):
    # one thread and all cores: each share calls the block GEMM on its own V and M (dU)
    from graphc.backends.cpu import conv_direct, conv_threads
    from tests.test_cpu_conv_threads import ALL_CORES, check_split

    if ALL_CORES < 2:
        pytest.skip("one core (or a BLAS whose thread count cannot be held): not split")
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(conv_direct, "FEW_ROWS", 0)
    monkeypatch.setattr(conv_winograd, "BLOCK_TILES", 16)
    monkeypatch.setattr(conv_winograd, "WEIGHT_GRAD_TILES", 16)
    check_split((4, 16, 8, 8), (32, 16, 3, 3))


@pytest.mark.parametrize("enabled", [True, False])
def test_wide_input_grad(enabled, monkeypatch):
    # from WIDE_CHANNELS on, the input gradient's U is transposed only for the generated
    # GEMM; without it, U keeps the forward's layout and BLAS reads it with its "T" flag
    from graphc.backends.cpu import conv_im2col
    from graphc.backends.cpu.conv_im2col import TRANS

    if enabled and lanes() != 16:
        pytest.skip("no AVX-512 on this host: the BLAS serves every block")
    monkeypatch.setattr(conv_winograd, "WIDE_CHANNELS", 16)
    monkeypatch.setattr(conv_winograd, "DOUBLED_BLOCKS", 16)  # wide layers' blocks too
    monkeypatch.setattr(winograd_gemm, "ENABLED", enabled)
    forms, emit = [], conv_im2col.Conv.gemm

    def recording(self, b, kb, trans_a, *rest):
        forms.append(trans_a)
        return emit(self, b, kb, trans_a, *rest)

    monkeypatch.setattr(conv_im2col.Conv, "gemm", recording)
    xs, ws = TAKEN[0]
    rng = np.random.default_rng(2)
    gs, graphs = _graphs(xs, ws, (1, 1), (1, 1), 1)
    _, wide = _graphs(xs, ws, (1, 1), (1, 1), 1, "float64")
    gy, w = rng.standard_normal(gs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    exe = compare(graphs["gx"], [gy, w], rtol=1e-4)
    reference = interpret(wide["gx"], gy.astype(np.float64), w.astype(np.float64))[0]
    assert_rounding_within(exe.run(gy, w)[0], interpret(graphs["gx"], gy, w)[0], reference)
    assert ("graphc_winograd_gemm" in exe.lowered.ir_text) == enabled
    assert forms == ([] if enabled else [TRANS] * POSITIONS)
