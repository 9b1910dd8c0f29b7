"""The Winograd weight gradient's Y = A gy A^T in vectors of output channels
(graphc.backends.cpu.winograd_transforms.grad_tiles_by_channels: the NN form's tile-major Y,
taps transposed in registers): bit for bit equal to the element loop (CHANNEL_VECTORS off),
equal to the interpreter within float32 rounding and within 2x eager's distance from a
float64 run; parts of tile rows, partial blocks, split over the cores; the register
transpose alone; what it declines."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import conv_winograd, winograd_transforms  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.test_cpu_backend import compare  # noqa: E402
from tests.test_cpu_conv_paths import _graphs  # noqa: E402

# (input, output channels, padding): each takes grad_tiles_by_channels
SHAPES = [
    ((1, 16, 32, 32), 16, (1, 1)),  # ResNet-18's 64 stage: parts of 4 tile rows, 4 chunks
    ((2, 16, 16, 16), 32, (1, 1)),  # its 128 stage (2 chunks a tile row), 2 channel vectors
    ((5, 24, 8, 8), 16, (1, 1)),  # its 256 stage: 4 images a block, a partial last block
    ((2, 16, 6, 24), 48, (0, 1)),  # 3 chunks a tile row, padding 0 in height, 3 vectors
]


@pytest.fixture
def taken(monkeypatch, tmp_path):
    """The parts the lowering emitted grad_tiles_by_channels for (a cache of its own)."""
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    emit = winograd_transforms.grad_tiles_by_channels

    def recording(*args):
        calls.append(args[3])  # the part
        return emit(*args)

    monkeypatch.setattr(conv_winograd, "grad_tiles_by_channels", recording)
    return calls


def _weight_grads(xs, ws, padding, monkeypatch, tmp_path, seed, x_view=None):
    """The weight gradient compiled with CHANNEL_VECTORS on and off (checked against the
    interpreter and float64 each); returns both results."""
    rng = np.random.default_rng(seed)
    gs, graphs = _graphs(xs, ws, (1, 1), padding, 1)
    _, wide = _graphs(xs, ws, (1, 1), padding, 1, "float64")
    gy = rng.standard_normal(gs).astype(np.float32)
    x = np.maximum(rng.standard_normal(xs), 0).astype(np.float32)
    eager = interpret(graphs["gw"], gy, x)[0]
    reference = interpret(wide["gw"], gy.astype(np.float64), x.astype(np.float64))[0]
    outs = []
    for on in (True, False):
        monkeypatch.setattr(winograd_transforms, "CHANNEL_VECTORS", on)
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"gw-{on}"))
        graph = _graphs(xs, ws, (1, 1), padding, 1)[1]["gw"]
        exe = compare(graph, [gy, x], rtol=1e-4)
        assert "conv2d_winograd_weight_grad" in exe.lowered.ir_text
        outs.append(exe.run(gy, x)[0])
        assert_rounding_within(outs[-1], eager, reference)
    monkeypatch.setattr(winograd_transforms, "CHANNEL_VECTORS", True)
    return outs


@pytest.mark.parametrize("case", range(len(SHAPES)))
def test_weight_grad_by_channel_vectors_bit_for_bit(case, taken, monkeypatch, tmp_path):
    xs, co, padding = SHAPES[case]
    vectors, loop = _weight_grads(xs, (co, xs[1], 3, 3), padding, monkeypatch, tmp_path, case)
    assert taken, "grad_tiles_by_channels not taken"
    np.testing.assert_array_equal(vectors, loop)


def test_parts_of_tile_rows_as_a_loop(taken, monkeypatch, tmp_path):
    # 8 x 16 tiles an image, blocks of 16 tiles: parts of one tile row, their first a loop value
    monkeypatch.setattr(conv_winograd, "WEIGHT_GRAD_TILES", 16)
    xs, ws = (2, 16, 16, 32), (16, 16, 3, 3)
    vectors, loop = _weight_grads(xs, ws, (1, 1), monkeypatch, tmp_path, 9)
    assert any(not isinstance(part.ty0, int) for part in taken), "no loop over parts"
    np.testing.assert_array_equal(vectors, loop)


def test_split_over_the_cores(monkeypatch):
    # each share's parts take it; the reduce kernel adds the shares' dU as before
    from graphc.backends.cpu import conv_direct, conv_threads
    from tests.test_cpu_conv_threads import ALL_CORES, check_split

    if ALL_CORES < 2:
        pytest.skip("one core (or a BLAS whose thread count cannot be held): not split")
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(conv_direct, "FEW_ROWS", 0)
    check_split((3, 16, 16, 16), (32, 16, 3, 3))


def test_transposed_registers():
    # the register transpose alone, as LLVM runs it: lane l of result i is lane i of input l
    import ctypes

    from llvmlite import ir

    from graphc.backends.cpu import llvm, values
    from graphc.backends.cpu.values import F32, PTR

    n = 16
    module = ir.Module(name="transpose_test")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR]), "transpose16")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vec = ir.VectorType(F32, n)
    rows = [b.load(b.gep(fn.args[0], [ir.Constant(ir.IntType(64), i * n)], source_etype=F32),
                   typ=vec, align=4) for i in range(n)]
    for i, v in enumerate(values.square_transposed(b, rows)):
        b.store(v, b.gep(fn.args[1], [ir.Constant(ir.IntType(64), i * n)], source_etype=F32),
                align=4)
    b.ret_void()
    library = llvm.compile_module(str(module), "transpose_test", use_cache=False)
    call = library.ctypes_function("transpose16", None, (ctypes.c_void_p, ctypes.c_void_p))
    a = np.arange(n * n, dtype=np.float32).reshape(n, n)
    out = np.zeros_like(a)
    call(a.ctypes.data, out.ctypes.data)
    np.testing.assert_array_equal(out, a.T)


def test_declines():
    part = winograd_transforms.Tiles(0, 1, 0, 4, 16, 64)
    apply = winograd_transforms.grad_tiles_by_channels_apply
    contiguous = (None, None, 32, 1)

    class F32:
        name = "float32"

    class F64:
        name = "float64"

    assert apply(F32, part, contiguous, (32, 32), 64)
    assert not apply(F32, part, contiguous, (32, 32), 40)  # not whole vectors of channels
    assert not apply(F32, part, contiguous, (12, 12), 64)  # rows not whole chunks of 8
    assert apply(F32, part, (None, None, 40, 1), (32, 32), 64)  # rows apart by more
    assert not apply(F32, part, (None, None, 1, 32), (32, 32), 64)  # columns apart
    assert not apply(F64, part, contiguous, (32, 32), 64)
