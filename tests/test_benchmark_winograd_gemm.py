"""benchmarks/winograd_gemm.py and resnet18_kernels.py: counts below 1 are refused before
anything compiles, and one block shape runs end to end (the generated function equal to
the 16 BLAS calls it is timed against)."""

from __future__ import annotations

import pytest

pytest.importorskip("llvmlite", reason="the benchmark compiles LLVM functions")

from benchmarks import resnet18_kernels, winograd_gemm  # noqa: E402
from graphc.backends.cpu.small_gemm import lanes  # noqa: E402


@pytest.mark.parametrize("main, flag", [(winograd_gemm.main, "--rounds"),
                                        (resnet18_kernels.main, "--rounds"),
                                        (resnet18_kernels.main, "--repeat")])
def test_a_count_below_one_is_refused_clearly(main, flag, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # main sets both: put them back after
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    with pytest.raises(SystemExit):
        main([flag, "0"])
    assert f"{flag} must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.skipif(lanes() != 16, reason="no AVX-512: no generated function")
@pytest.mark.parametrize("kind", ["fwd", "gw"])
def test_one_block_kernel_equals_the_blas_calls(kind):
    import numpy as np

    shape = winograd_gemm.block_shape(kind, 32, 32)
    [contenders] = winograd_gemm.build([shape], None, [None])
    assert set(contenders) == {"blas", "kernel"}
    rng = np.random.default_rng(0)
    kernel, blas = contenders["kernel"], contenders["blas"]
    assert winograd_gemm.largest_difference(shape, kernel, blas, rng) <= 1e-4


def test_a_node_of_two_kernels_counts_its_flops_once():
    """resnet18_kernels' classes: a Winograd forward is two kernels (its filter transform's
    and its own); the class's GFLOP/s must count the convolution's flops once, not per row."""
    from types import SimpleNamespace

    from tests.test_cpu_conv_paths import _graphs

    graph = _graphs((2, 16, 8, 8), (16, 16, 3, 3), (1, 1), (1, 1), 1)[1]["fwd"]
    out = graph.nodes[-1].outputs[0].name
    rows = [SimpleNamespace(values=[out], op="conv2d", seconds=s) for s in (1e-3, 2e-3)]
    classes = resnet18_kernels._classify(SimpleNamespace(graph=graph, rows=rows))
    count, seconds, flops = classes["conv2d 3x3 stride 1"]
    assert (count, seconds) == (2, pytest.approx(3e-3))
    assert flops == 2 * 2 * 16 * 16 * 9 * 8 * 8


@pytest.mark.skipif(lanes() != 16, reason="no AVX-512: no generated function")
def test_switched_builds_one_kernel_per_value():
    # --switch ROWS_OVER_PANELS --values 0 2: two kernels for a block of two panels, labelled
    # by value, the same bits (either loop order sums alike), the constant put back
    import ctypes

    import numpy as np

    from graphc.backends.cpu import winograd_gemm as generated

    kept = generated.ROWS_OVER_PANELS
    shape = winograd_gemm.block_shape("fwd", 32, 128)
    [contenders] = winograd_gemm.switched_builds([shape], None, None, "ROWS_OVER_PANELS",
                                                 ["0", "2"])
    assert set(contenders) == {"blas", "ROWS_OVER_PANELS=0", "ROWS_OVER_PANELS=2"}
    assert generated.ROWS_OVER_PANELS == kept
    a, b, c = winograd_gemm.operands(shape, np.random.default_rng(3))
    results = []
    for label in ("ROWS_OVER_PANELS=0", "ROWS_OVER_PANELS=2"):
        out = c.copy()
        contenders[label](a.ctypes.data, b.ctypes.data, out.ctypes.data, ctypes.c_float(0.0))
        results.append(out)
    np.testing.assert_array_equal(results[0], results[1])
    assert not np.array_equal(results[0], c)
    # a constant that changes the sums (k = 32 in blocks of 16, or one block): other bits
    [blocks] = winograd_gemm.switched_builds([shape], None, None, "K_BLOCK", ["16", "32"])
    sums = []
    for label in ("K_BLOCK=16", "K_BLOCK=32"):
        out = c.copy()
        blocks[label](a.ctypes.data, b.ctypes.data, out.ctypes.data, ctypes.c_float(0.0))
        sums.append(out)
    assert not np.array_equal(sums[0], sums[1])
    np.testing.assert_allclose(sums[0], sums[1], rtol=1e-4, atol=1e-4)
    with pytest.raises(AttributeError):
        winograd_gemm.switched_builds([shape], None, None, "NO_SUCH_SWITCH", ["0"])
