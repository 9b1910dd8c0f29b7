"""Review of the fourteenth session's stride-2 polyphase Winograd changes, at their edges.

- conv_polyphase_filters (h2): the 16 distinct U matrices of the 25 positions (SHARED_U),
  the GEMM calls that share one, the filter transform and the weight gradient's weight_out
  16 filters a vector (winograd_filters.FILTER_VECTORS): input channels a whole number of
  vectors or not (the one-by-one rest), output channels off a multiple of 16 (the
  transposed walk's rest), the input gradient (U transposed), a batch of one block (the
  filter kernel forked over output channels, the transforms forked over channels), a batch
  in several blocks with a partial last one;
- conv_polyphase_grad.FORKED_TRANSFORMS (h5, on main): channel counts that split unevenly
  over two threads, input channels not a whole number of vectors.

Each against the interpreter and within 2x eager graphc's distance from float64; the same
bits at one and two threads and with each switch off (the modules promise both).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import (  # noqa: E402
    conv_polyphase,
    conv_polyphase_grad,
    kernels,
    threads,
    winograd_filters,
    winograd_gemm,
)
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.ir import parse  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.conftest import cpu_executable_on  # noqa: E402
from tests.test_cpu_conv_paths import _graphs  # noqa: E402

resolve_blas()
TWO = min(2, threads.most_threads())
needs_kernel = pytest.mark.skipif(not winograd_gemm.available(), reason="the polyphase path "
                                  "needs winograd_gemm's generated GEMM (an AVX-512 host)")
MARKER = {"fwd": "conv2d_polyphase", "gx": "conv2d_polyphase", "gw": "conv2d_polyphase_weight"}


def _filters_module():
    """h2's conv_polyphase_filters, or None before that branch."""
    try:
        return importlib.import_module("graphc.backends.cpu.conv_polyphase_filters")
    except ImportError:
        return None


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))


def _case(kind: str, xs, ws, seed: int):
    rng = np.random.default_rng(seed)
    gs, graphs = _graphs(xs, ws, (2, 2), (1, 1), 1)
    x, w, gy = (rng.standard_normal(s).astype(np.float32) for s in (xs, ws, gs))
    args = {"fwd": [x, w], "gx": [gy, w], "gw": [gy, x]}[kind]
    eager = interpret(graphs[kind], *[a.copy() for a in args])[0]
    wide = _graphs(xs, ws, (2, 2), (1, 1), 1, "float64")[1][kind]
    reference = interpret(wide, *[a.astype(np.float64) for a in args])[0]
    return graphs[kind], args, eager, reference


# (x's shape, w's shape, the kinds the polyphase path takes): 16 / 24 / 40 / 48 channels
# either side (24 and 40: not whole vectors of 16; the weight gradient takes whole ones
# only), a batch of one block (16 tiles an image), several blocks with a partial last one
# (5 images of 16 tiles in blocks of 32; 6 images of 8 tiles in blocks of 32 and 16), a
# rectangular plane (16x8 -> 8x4: 4x2 blocks)
CASES = [
    ((1, 24, 16, 16), (40, 24, 3, 3), ("fwd", "gx")),
    ((5, 40, 16, 16), (24, 40, 3, 3), ("fwd", "gx")),
    ((4, 48, 8, 8), (32, 48, 3, 3), ("fwd", "gx", "gw")),
    ((6, 16, 16, 8), (48, 16, 3, 3), ("fwd", "gx", "gw")),
    ((5, 32, 16, 16), (24, 32, 3, 3), ("gw",)),
]
KINDED = [(case, kind) for case, (_, _, kinds) in enumerate(CASES) for kind in kinds]


@needs_kernel
@pytest.mark.parametrize(("case", "kind"), KINDED)
def test_polyphase_at_the_edges(case, kind, monkeypatch):
    xs, ws, _ = CASES[case]
    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1)  # small shapes fork too
    monkeypatch.setattr(conv_polyphase, "BLOCK_TILES", 32)
    monkeypatch.setattr(conv_polyphase_grad, "BLOCK_TILES", 32)
    monkeypatch.setattr(conv_polyphase, "GRAD_MIN_OUT_CHANNELS", 16)  # the input gradient
    monkeypatch.setattr(conv_polyphase, "GRAD_MIN_TILES", 1)  # taken at these sizes
    graph, args, eager, reference = _case(kind, xs, ws, seed=case * 3 + len(kind))
    filters = _filters_module()
    variants = [(None, 1), (None, TWO)]
    if kind == "gw" or case == 0:  # (the filter transform's vectors: h2's own tests too)
        variants.append(((winograd_filters, "FILTER_VECTORS", False), 1))
    if filters is not None:
        variants.append(((filters, "SHARED_U", False), 1))
    results = []
    for switch, count in variants:
        with monkeypatch.context() as m:
            if switch is not None:
                m.setattr(*switch)
            exe = cpu_executable_on(graph, count)
            assert MARKER[kind] in exe.lowered.ir_text, f"{kind} {xs} {ws}: not polyphase"
            got = exe.run(*[a.copy() for a in args])[0]
        assert_rounding_within(got, eager, reference)
        results.append(got)
    # the weight gradient of several blocks split over the cores sums each share's dU apart:
    # the same bits across thread counts promised for one block only (so on main already)
    blocks = -(-xs[0] * (xs[2] // 4) * (xs[3] // 4) // 32)
    for (switch, count), got in zip(variants, results):
        if count == 1 or kind != "gw" or blocks == 1:
            np.testing.assert_array_equal(got, results[0], err_msg=f"{switch}, {count} threads")


@needs_kernel
@pytest.mark.parametrize("forked", [True, False])
@pytest.mark.parametrize("shapes", [((4, 48, 8, 8), (24, 48, 3, 3)),
                                    ((8, 32, 8, 8), (56, 32, 3, 3))])
def test_weight_grad_forked_transforms_uneven_channels(shapes, forked, monkeypatch):
    """h5's one-block weight gradient on two threads, x's and gy's transforms forked over
    channels: 48 input channels (three vectors over two threads), 56 and 24 output channels; the
    same bits at one and two threads, and against the interpreter."""
    xs, ws = shapes
    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1)
    monkeypatch.setattr(conv_polyphase_grad, "FORKED_TRANSFORMS", forked)
    graph, args, eager, reference = _case("gw", xs, ws, seed=sum(xs) + sum(ws))
    got = []
    for count in sorted({1, TWO}):
        exe = cpu_executable_on(graph, count)
        assert MARKER["gw"] in exe.lowered.ir_text
        got.append(exe.run(*[a.copy() for a in args])[0])
        assert_rounding_within(got[-1], eager, reference)
    np.testing.assert_array_equal(got[-1], got[0])


def test_shared_u_slots_cover_every_position_once():
    """u_slots / gemm_calls (h2): every position in exactly one call, each call's positions
    reading matrices that hold their own (G rows equal along both axes), for the forward's
    and the input gradient's phases, SHARED_U on and off."""
    filters = _filters_module()
    if filters is None:
        pytest.skip("before h2's branch: one U matrix a position")
    for phases in (conv_polyphase.PHASES, conv_polyphase.GRAD_PHASES):
        keys = [(ph, r, c) for ph, (rows, cols) in enumerate(phases)
                for r in rows[2] for c in cols[2]]
        assert len(keys) == conv_polyphase.POSITIONS
        for shared in (True, False):
            filters.SHARED_U, before = shared, filters.SHARED_U
            try:
                slots, count = filters.u_slots(phases)
                calls = filters.gemm_calls(slots)
            finally:
                filters.SHARED_U = before
            assert count == (len(set(keys)) if shared else conv_polyphase.POSITIONS)
            seen = []
            for first, slot, products, step, slot_step in calls:
                for j in range(products):
                    xi = first + j * step
                    assert slots[xi] == slot + j * slot_step
                    seen.append(xi)
            assert sorted(seen) == list(range(conv_polyphase.POSITIONS))
            for xi, yi in ((a, b) for a in range(len(keys)) for b in range(len(keys))):
                assert (slots[xi] == slots[yi]) == (keys[xi] == keys[yi] if shared
                                                    else xi == yi)


# conv2d_channel_sums at stride 2 (the polyphase forward's output transform adds the batch
# norm's per-image sums): 2x2 outputs (a plane of one block: 4 values), 4x4 (4 blocks), 8x8
# (16 blocks: a plane one vector), 16x16 (the tile loop); batches of one block and several
STRIDE2_SUMS = [
    {"n": 16, "c": 32, "o": 48, "hw": 4},
    {"n": 4, "c": 16, "o": 32, "hw": 8},
    {"n": 20, "c": 16, "o": 16, "hw": 8},
    {"n": 2, "c": 16, "o": 24, "hw": 16},
    {"n": 2, "c": 16, "o": 24, "hw": 32},
]


def _outputs_module():
    """h7's conv_polyphase_outputs (SUMS_BEHIND, VECTOR_SUMS), or None before that branch."""
    try:
        return importlib.import_module("graphc.backends.cpu.conv_polyphase_outputs")
    except ImportError:
        return None


@needs_kernel
@pytest.mark.parametrize("shape", STRIDE2_SUMS, ids=lambda s: "-".join(f"{k}{v}"
                                                                       for k, v in s.items()))
def test_stride2_channel_sums(shape, monkeypatch):
    """The sums against image_sums of the compiled output (K exact, the rest to float64
    rounding), the outputs within 2x eager's distance from float64; the same output bits
    and sums at one and two threads and with the output transforms' switches off."""
    from graphc.ops.batch_norm_relu import image_sums
    from graphc.passes.conv_channel_sums import fuse_conv_channel_sums
    from tests.test_conv_channel_sums import _arrays, _eager, _float64_run, _graph
    from tests.test_review_s14_winograd import _with_sums

    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1)
    graph = _with_sums(fuse_conv_channel_sums(parse(_graph(**shape, stride=2,
                                                           residual=True))))
    assert graph.nodes[0].op == "conv2d_channel_sums"
    arrays = _arrays(**shape, stride=2, seed=sum(shape.values()))
    outputs = _outputs_module()
    switches = [None] + ([] if outputs is None else
                         [(outputs, "SUMS_BEHIND", False), (outputs, "VECTOR_SUMS", False)])
    runs = {}
    for switch in switches:
        with monkeypatch.context() as m:
            if switch is not None:
                m.setattr(*switch)
            for count in sorted({1, TWO}):
                exe = cpu_executable_on(graph, count)
                assert "conv2d_polyphase" in exe.lowered.ir_text
                runs[(switch and switch[1], count)] = exe.run(*[a.copy() for a in arrays])
    base = runs[(None, 1)]
    want = image_sums(base[-1])
    np.testing.assert_array_equal(base[0][:, 0], want[:, 0])
    np.testing.assert_allclose(base[0], want, rtol=1e-12, atol=1e-9)
    eager = _eager(arrays, residual=True, stride=2)
    reference = _float64_run(arrays, residual=True, stride=2)
    for g, e, r in zip([base[1], base[3], base[4], base[5]], eager, reference, strict=True):
        assert_rounding_within(g, e, r)
    for key, got in runs.items():
        np.testing.assert_allclose(got[0], base[0], rtol=1e-13, atol=1e-10, err_msg=str(key))
        for k, (g, b) in enumerate(zip(got[1:], base[1:], strict=True)):
            np.testing.assert_array_equal(g, b, err_msg=f"{key}: output {k + 1}")
