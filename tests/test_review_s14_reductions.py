"""Review of the fourteenth session's reduction changes (h4, on main): prefetch.blocked_rows
(REDUCED_ROW_BLOCK: reduced rows longer than 256 elements summed a block at a time, in
graphc.backends.cpu.reductions and sibling_sums) at its edges.

Rows at and around the thresholds (256: not cut; 512 and 768: cut, 4096 float32 and 2048
float64: the longest cut, PREFETCH_ROW_MAX_BYTES; 4352: past it; 1000: not a multiple of
256), float32 and float64, sums and means (the count), a body that reads its element's
index (arange), a reduction forked over its kept rows; the batch-norm backward's sibling
sums on planes of 24x32 and 32x32 (768, 1024) and 17x15 (not cut), with and without the
residual. Against the interpreter (float32 within 2x its distance from float64, float64
within 1e-12), the same bits on one and two threads, and with REDUCED_ROW_BLOCK None
rounding within the same rule.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from graphc.backends.cpu import kernels, pool, prefetch, threads  # noqa: E402
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.ir import parse  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.conftest import cpu_executable_on  # noqa: E402
from tests.test_batch_norm_backward import backward_graph, backward_inputs  # noqa: E402

resolve_blas()
TWO = min(2, threads.most_threads())


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))


def _reduction_graph(rows: int, n: int, dt: str) -> str:
    """Three reductions over the last axis of x [rows, n]: sum(x * x + 1), mean(x), and
    sum(x * index), the index an arange along the row (a body that reads where it is)."""
    t, r = f"{dt}[{rows},{n}]", f"{dt}[{rows}]"
    name = "float32" if dt == "f32" else "float64"
    arange = f'("arange", (), (("start", 0), ("end", {n}), ("step", 1), ("dtype", "{name}")))'
    one = f'("full", (), (("shape", ()), ("value", 1.0), ("dtype", "{name}")))'
    total = '("reduce_sum", (3,), (("axes", (1,)), ("keepdim", false)))'
    return f"""graph @f(%x: {t}) -> ({r}, {r}, {r}) {{
  %0: {r} = fused[body=(("mul", (0, 0), ()), {one}, ("add", (1, 2), ()), {total}), outputs=(4,)](%x)
  %1: {r} = reduce_mean[axes=(1,), keepdim=false](%x)
  %2: {r} = fused[body=({arange}, ("broadcast_to", (1,), (("shape", ({rows}, {n})),)), ("mul", (0, 2), ()), {total}), outputs=(4,)](%x)
  return (%0, %1, %2)
}}"""  # noqa: E501


ROWS = [256, 512, 768, 1000, 4096, 4352]


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("n", ROWS)
def test_reduced_rows_at_the_block_edges(n, dt, monkeypatch):
    if dt == "f64" and n == 4096:
        n = 2048  # float64's longest cut row (PREFETCH_ROW_MAX_BYTES)
    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1 << 10)  # fork over the rows
    np_dt = np.float32 if dt == "f32" else np.float64
    rows = 7
    x = (np.random.default_rng(n).standard_normal((rows, n)) + 0.25).astype(np_dt)
    graph = parse(_reduction_graph(rows, n, dt))
    eager = interpret(graph, x.copy())
    reference = interpret(parse(_reduction_graph(rows, n, "f64")), x.astype(np.float64))
    runs = {}
    for block in (prefetch.REDUCED_ROW_BLOCK, None):
        monkeypatch.setattr(prefetch, "REDUCED_ROW_BLOCK", block)
        for count in sorted({1, TWO}):
            runs[(block, count)] = cpu_executable_on(graph, count).run(x.copy())
    for key, got in runs.items():
        for k, (g, e, r) in enumerate(zip(got, eager, reference, strict=True)):
            assert g.shape == e.shape and g.dtype == e.dtype
            if dt == "f32":
                try:
                    assert_rounding_within(g, e, r)
                except AssertionError as err:
                    raise AssertionError(f"{key} output {k}: {err}") from None
            else:
                np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-9 * n,
                                           err_msg=f"{key} output {k}")
        one = runs[(key[0], 1)]
        for g, w in zip(got, one, strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"{key}: against one thread")


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("shape", [(3, 5, 24, 32), (2, 3, 32, 32), (4, 6, 17, 15)])
def test_batch_norm_backward_sums_at_the_block_edges(shape, residual, monkeypatch):
    """The batch-norm backward's sums node (sibling sums) and apply node as the cpu
    pipeline compiles them: within 2x eager graphc's distance from float64, the same bits on
    one and two threads (split over channels)."""
    monkeypatch.setattr(pool, "POOL_MIN_SPLIT_TAPS", 0)  # small shapes split too
    graph = parse(backward_graph(shape, residual))
    arrays = backward_inputs(shape, residual, seed=sum(shape) + residual)
    eager = interpret(graph, *[a.copy() for a in arrays])
    reference = interpret(parse(backward_graph(shape, residual, "f64")),
                          *[a.astype(np.float64) if a.dtype != bool else a for a in arrays])
    runs = [cpu_executable_on(graph, count).run(*[a.copy() for a in arrays])
            for count in sorted({1, TWO})]
    for got in runs:
        for k, (g, e, r) in enumerate(zip(got, eager, reference, strict=True)):
            try:
                assert_rounding_within(g, e, r)
            except AssertionError as err:
                raise AssertionError(f"output {k}: {err}") from None
    for g, w in zip(runs[-1], runs[0], strict=True):
        np.testing.assert_array_equal(g, w, err_msg="two threads against one")
