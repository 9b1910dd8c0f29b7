"""The input gradient of few-channel convolutions without a GEMM call
(graphc.backends.cpu.conv_input_grad_lanes): tiles of tap rows x an image's positions in
one chunk or several, with row remainders and vector remainders down to one float,
dilation, unbatched and on one thread and all cores; equal to the interpreter, within 2x
eager's distance from float64 on scaled inputs (an unwritten or twice-added element cannot
pass); the convolutions it does not serve keep the im2col path."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import conv_threads, small_gemm, threads  # noqa: E402
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.passes.plan import plan_buffers  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.test_cpu_conv_paths import _graphs  # noqa: E402

MARKER = "conv2d_input_grad_lanes"
resolve_blas()  # hands the BLAS's thread count to generated code (threads.install)
COUNTS = sorted({1, threads.image_threads()})
pytestmark = pytest.mark.skipif(small_gemm.lanes() != 16,
                                reason="the path's tiles are AVX-512's (16 lanes)")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


CASES = [  # (input, weight, dilation): what each exercises
    ((4, 6, 14, 14), (16, 6, 5, 5), (1, 1)),  # LeNet-5's: 100 positions (6 x 16 + 4), 3 rows
    ((2, 3, 9, 40), (32, 3, 3, 3), (1, 1)),  # 266 positions: chunks of 8, 8 and 2 vectors
    ((3, 2, 11, 9), (7, 2, 3, 2), (2, 1)),  # dilation; 7 x 8 positions; a row remainder
    ((2, 1, 5, 5), (16, 1, 5, 5), (1, 1)),  # one position: a scalar piece
    ((3, 7, 6), (5, 3, 2, 2), (1, 1)),  # unbatched
]


def _run(xs, ws, dilation, count, seed):
    gs, graphs = _graphs(xs, ws, (1, 1), (0, 0), 1, dilation=dilation)
    _, wide = _graphs(xs, ws, (1, 1), (0, 0), 1, "float64", dilation)
    rng = np.random.default_rng(seed)
    args = [(rng.standard_normal(gs) * 100).astype(np.float32),
            (rng.standard_normal(ws) * 100).astype(np.float32)]
    graph = graphs["gx"]
    eager = interpret(graph, *args)[0]
    reference = interpret(wide["gx"], *[a.astype(np.float64) for a in args])[0]
    plan_buffers(graph)
    exe = CpuExecutable(graph)
    exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
    return exe, exe.run(*args)[0], eager, reference


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_input_grad_lanes(case, count, monkeypatch):
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    xs, ws, dilation = CASES[case]
    exe, got, eager, reference = _run(xs, ws, dilation, count, case)
    assert MARKER in exe.lowered.ir_text
    split = COUNTS[-1] > 1 and len(xs) == 4  # over images, on hosts with two cores or more
    assert (".split" in exe.lowered.ir_text) == split
    np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4 * np.abs(eager).max())
    assert_rounding_within(got, eager, reference)


@pytest.mark.parametrize("xs, ws, padding", [((2, 3, 8, 8), (16, 3, 3, 3), (1, 1)),
                                             ((2, 3, 8, 8), (64, 3, 3, 3), (0, 0)),
                                             ((2, 9, 8, 8), (16, 9, 3, 3), (0, 0))])
def test_others_keep_the_im2col_path(xs, ws, padding):
    """Padding, more than 32 output channels (the GEMM's inner size), 9 input channels."""
    gs, graphs = _graphs(xs, ws, (1, 1), padding, 1)
    plan_buffers(graphs["gx"])
    assert MARKER not in CpuExecutable(graphs["gx"]).lowered.ir_text
