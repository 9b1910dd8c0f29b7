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
    [contenders] = winograd_gemm.build([shape], None, None)
    assert set(contenders) == {"blas", "kernel"}
    rng = np.random.default_rng(0)
    kernel, blas = contenders["kernel"], contenders["blas"]
    assert winograd_gemm.largest_difference(shape, kernel, blas, rng) <= 1e-4
