"""The CPU backend's max_pool2d paths (graphc.backends.cpu.pool): windows that are all inside
(every tap in registers, selects) and windows that need bounds (padding, ceil_mode), on ties
(the first maximum in row-major order) and NaNs (a NaN wins, the last one), values and
indices equal to the interpreter's."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from tests.test_cpu_backend import compare, one_op_graph  # noqa: E402


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


CASES = [  # (input shape, kernel, stride, padding, dilation, ceil_mode)
    ((2, 3, 8, 8), (2, 2), (2, 2), (0, 0), (1, 1), False),  # LeNet's
    ((2, 3, 9, 7), (3, 3), (1, 1), (0, 0), (1, 1), False),  # overlapping windows, odd sizes
    ((3, 7, 9), (3, 2), (2, 1), (0, 0), (2, 1), False),  # unbatched, dilation
    ((2, 2, 7, 7), (3, 3), (2, 2), (1, 1), (1, 1), True),  # padding and ceil_mode: bounds
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("values", ["ties", "nans"])
def test_max_pool2d_ties_and_nans(case, values):
    shape, kernel, stride, padding, dilation, ceil_mode = CASES[case]
    rng = np.random.default_rng(case)
    x = rng.integers(0, 3, shape).astype(np.float32)  # many ties
    if values == "nans":
        x[rng.random(shape) < 0.15] = np.nan
    g = one_op_graph("max_pool2d", [(shape, "float32")], kernel_size=kernel, stride=stride,
                     padding=padding, dilation=dilation, ceil_mode=ceil_mode)
    compare(g, [x])  # values (NaNs in place) and int64 indices exactly
