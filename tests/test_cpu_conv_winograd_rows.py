"""The Winograd kernels' input transform on large planes, 16 tiles a vector along tile rows
(graphc.backends.cpu.winograd_transforms.rows_by_vectors: ResNet-18's 32x32 and 16x16
stages): the forward and both gradients bit for bit equal to the tile loop through the
padded plane (ROW_VECTORS off), equal to the interpreter within float32 rounding and within
2x eager's distance from a float64 run; parts of tile rows, partial blocks, unequal
padding, strided views; what it declines."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import conv_winograd, winograd_transforms  # noqa: E402
from tests.test_cpu_backend import compare  # noqa: E402
from tests.test_cpu_conv_paths import _graphs  # noqa: E402
from tests.test_cpu_conv_winograd import check_winograd  # noqa: E402

# (input, padding): each takes rows_by_vectors in some pass
LARGE_PLANES = [
    ((1, 16, 32, 32), (1, 1)),  # one tile row of 16 tiles a vector (ResNet-18's 64 stage)
    ((2, 16, 16, 16), (1, 1)),  # two tile rows of 8 (its 128 stage)
    ((1, 16, 8, 30), (1, 2)),  # unequal padding, input rows 30 wide, 32 outputs
    ((3, 16, 12, 16), (0, 1)),  # padding 0 in height: no padded row; 3 images
    ((1, 16, 30, 16), (2, 1)),  # padding 2 in height; 8 tiles a row, 16 tile rows
]


@pytest.fixture
def taken(monkeypatch, tmp_path):
    """How often the lowering emitted rows_by_vectors (each test lowers in its own cache)."""
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    emit = winograd_transforms.rows_by_vectors

    def recording(*args):
        calls.append(args[3])  # the part
        return emit(*args)

    monkeypatch.setattr(winograd_transforms, "rows_by_vectors", recording)
    return calls


def _bits_against_tile_loop(xs, ws, padding, monkeypatch, tmp_path, seed):
    """Each pass compiled with ROW_VECTORS on and off: the same bits."""
    rng = np.random.default_rng(seed)
    gs, _ = _graphs(xs, ws, (1, 1), padding, 1)
    for kind, shapes in {"fwd": [xs, ws], "gx": [gs, ws], "gw": [gs, xs]}.items():
        arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        outs = []
        for on in (True, False):
            monkeypatch.setattr(winograd_transforms, "ROW_VECTORS", on)
            monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"{kind}-{on}"))
            graph = _graphs(xs, ws, (1, 1), padding, 1)[1][kind]
            outs.append(compare(graph, arrays, rtol=1e-4).run(*arrays)[0])
        np.testing.assert_array_equal(outs[0], outs[1], err_msg=kind)
    monkeypatch.setattr(winograd_transforms, "ROW_VECTORS", True)
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "after"))


@pytest.mark.parametrize("case", range(len(LARGE_PLANES)))
def test_large_planes_by_row_vectors(case, taken, monkeypatch, tmp_path):
    xs, padding = LARGE_PLANES[case]
    ws = (16, 16, 3, 3)
    check_winograd(xs, ws, (1, 1), padding, 1)
    assert taken, "rows_by_vectors not taken"
    _bits_against_tile_loop(xs, ws, padding, monkeypatch, tmp_path, case)


def test_parts_of_tile_rows_and_a_partial_block(taken, monkeypatch, tmp_path):
    # 8 x 16 tiles an image, blocks want 32: parts of 2 tile rows (a loop over the parts);
    # then blocks of 3 images of 4 x 8 tiles with a partial last block (5 images)
    monkeypatch.setattr(conv_winograd, "BLOCK_TILES", 16)
    monkeypatch.setattr(conv_winograd, "WEIGHT_GRAD_TILES", 16)
    xs = (2, 16, 16, 32)
    check_winograd(xs, (16, 16, 3, 3), (1, 1), (1, 1), 1)
    assert any(not isinstance(part.ty0, int) for part in taken), "no loop over parts"
    _bits_against_tile_loop(xs, (16, 16, 3, 3), (1, 1), monkeypatch, tmp_path, 7)
    monkeypatch.setattr(conv_winograd, "BLOCK_TILES", 96)
    monkeypatch.setattr(conv_winograd, "WEIGHT_GRAD_TILES", 96)
    taken.clear()
    check_winograd((5, 16, 8, 16), (24, 16, 3, 3), (1, 1), (1, 1), 1)
    assert any(part.count == 3 for part in taken) and any(part.count == 2 for part in taken)


def test_row_prefetches_keep_the_bits(taken, monkeypatch, tmp_path):
    # rows_by_vectors asks for its rows ROW_PREFETCH planes ahead (past the last channel's
    # plane too, which never faults): the same bits as without, each pass
    xs, ws = (2, 24, 16, 16), (16, 24, 3, 3)
    rng = np.random.default_rng(5)
    gs, _ = _graphs(xs, ws, (1, 1), (1, 1), 1)
    for kind, shapes in {"fwd": [xs, ws], "gx": [gs, ws], "gw": [gs, xs]}.items():
        arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        outs, prefetches = [], []
        for ahead in (0, 3):
            monkeypatch.setattr(winograd_transforms, "ROW_PREFETCH", ahead)
            monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"{kind}-{ahead}"))
            exe = compare(_graphs(xs, ws, (1, 1), (1, 1), 1)[1][kind], arrays, rtol=1e-4)
            prefetches.append(exe.lowered.ir_text.count('call void @"llvm.prefetch'))
            outs.append(exe.run(*arrays)[0])
        assert prefetches[1] > prefetches[0], (kind, prefetches)  # (the GEMMs' own too)
        np.testing.assert_array_equal(outs[0], outs[1], err_msg=kind)
    assert taken, "rows_by_vectors not taken"


def test_strided_views(monkeypatch, tmp_path):
    # rows apart by more than their width take it; a transposed view (columns apart) not
    import graphc
    from graphc.passes.fuse import fuse

    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 16, 16, 20)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    for view, rows in ((lambda t: t[:, :, :, 2:18], True), (lambda t: t.transpose(2, 3), False)):
        calls = []
        emit = winograd_transforms.rows_by_vectors

        def recording(*args, emit=emit, calls=calls):
            calls.append(args)
            return emit(*args)

        monkeypatch.setattr(winograd_transforms, "rows_by_vectors", recording)
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"view-{rows}"))
        g = fuse(graphc.trace(lambda x, w: graphc.conv2d(view(x), w, padding=1).relu(),
                              graphc.tensor(x), graphc.tensor(w)))
        exe = compare(g, [x, w], rtol=1e-4)
        assert "conv2d_winograd" in exe.lowered.ir_text
        assert bool(calls) == rows, "rows_by_vectors taken" if calls else "not taken"


def test_declines():
    parts = winograd_transforms.Tiles
    f32 = np.dtype("float32")

    class Dt:
        name = f32.name

    contiguous = (None, None, 32, 1)
    apply = winograd_transforms.rows_by_vectors_apply
    assert apply(Dt, parts(0, 1, 0, 4, 16, 64), contiguous, (32, 32))
    assert not apply(Dt, parts(0, 1, 0, 4, 12, 48), contiguous, (24, 24))  # 12 tiles a row
    assert not apply(Dt, parts(0, 1, 0, 3, 8, 24), contiguous, (16, 16))  # odd tile rows
    assert not apply(Dt, parts(0, 1, 0, 4, 16, 64), (None, None, 1, 32), (32, 32))  # columns
    assert not apply(Dt, parts(0, 1, 0, 1, 16, 16), contiguous, (2, 66))  # rows too long

    class F64:
        name = "float64"

    assert not apply(F64, parts(0, 1, 0, 4, 16, 64), contiguous, (32, 32))
