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


VECTOR_CASES = [  # (input shape, dtype): 2x2 windows, rows of 14, 5, 3 and 1 outputs
    ((2, 3, 28, 28), "float32"),  # LeNet's first pool: vectors of 8 at 0 and 6 (overlapping)
    ((2, 4, 10, 10), "float32"),  # its second: vectors of 4 at 0 and 1
    ((3, 6, 7), "float64"),  # unbatched, 7 wide: the last column unread; the scatter
    ((1, 2, 2, 34), "float32"),  # one row of 17: vectors of 16 at 0 and 1
]


@pytest.mark.parametrize("case", range(len(VECTOR_CASES)))
def test_max_pool2d_vector_rows_and_gradient(case):
    """pool_vectors' rows: values and indices (ties, NaNs, -0.0) as the interpreter's; the
    gradient, fed those indices (the gathers) and indices outside their blocks (the plane's
    scatter again), on a scaled gradient so that an unwritten element cannot pass."""
    shape, dtype = VECTOR_CASES[case]
    rng = np.random.default_rng(case)
    x = rng.integers(-2, 3, shape).astype(dtype)
    x[rng.random(shape) < 0.1] = np.nan
    x[rng.random(shape) < 0.1] = -0.0
    window = dict(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0), dilation=(1, 1),
                  ceil_mode=False)
    forward = one_op_graph("max_pool2d", [(shape, dtype)], **window)
    values, indices = compare(forward, [x]).run(x)
    g = (rng.standard_normal(values.shape) * 1e3).astype(dtype)
    g.flat[::7] = -0.0  # the scatter-add writes 0.0 + g: +0.0
    backward = one_op_graph("max_pool2d_grad", [(values.shape, dtype), (values.shape, "int64")],
                            input_hw=shape[-2:])
    got = compare(backward, [g, indices]).run(g, indices)[0]
    assert not np.signbit(got[got == 0]).any()
    moved = indices.copy()  # a few windows point into a neighbour's block, or at its own
    moved.flat[::5] = (moved.flat[::5] + shape[-1] + 1) % (shape[-2] * shape[-1])
    compare(backward, [g, moved])
