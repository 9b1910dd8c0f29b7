"""Reductions over a channel's planes prefetch each short row at its start (cpu backend,
graphc.backends.cpu.prefetch.row_prefetcher, called by reductions.py): the kernels that ask
and the ones that do not, and results bit for bit those of the kernel without the hints."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.backends.cpu import prefetch, reductions
from graphc.backends.cpu.executable import CpuExecutable
from graphc.ir import parse
from graphc.passes.plan import plan_buffers

# batch-norm backward's sum(g * xhat), storing xhat on the way, as the fuse pass leaves it
GRAPH = """graph @red(%x: f32[{n},{c},{h},{w}], %m: f32[1,{c},1,1], %i: f32[1,{c},1,1],
                      %g: f32[{n},{c},{h},{w}]) -> (f32[{n},{c},{h},{w}], f32[{c}]) {{
  %0: f32[{n},{c},{h},{w}], %1: f32[{c}] = fused[body=(("sub", (0, 1), ()), ("mul", (4, 2), ()),
      ("mul", (3, 5), ()), ("reduce_sum", (6,), (("axes", (0, 2, 3)), ("keepdim", false)))),
      outputs=(5, 7)](%x, %m, %i, %g)
  return (%0, %1)
}}"""


def _build(n, c, h, w, monkeypatch, rows: bool):
    monkeypatch.setattr(reductions, "PREFETCH_ROWS", rows)
    graph = parse(GRAPH.format(n=n, c=c, h=h, w=w))
    plan_buffers(graph)
    return CpuExecutable(graph)


@pytest.mark.parametrize("shape", [(32, 64, 8, 8), (16, 8, 32, 32), (64, 512, 4, 4)])
def test_channel_reductions_prefetch_and_keep_their_results(shape, monkeypatch):
    rng = np.random.default_rng(sum(shape))
    n, c, h, w = shape
    args = [rng.standard_normal(shape).astype(np.float32),
            rng.standard_normal((1, c, 1, 1)).astype(np.float32),
            rng.uniform(0.5, 2, (1, c, 1, 1)).astype(np.float32),
            rng.standard_normal(shape).astype(np.float32)]
    hinted, plain = (_build(*shape, monkeypatch, rows) for rows in (True, False))
    assert "llvm.prefetch" in hinted.lowered.ir_text
    assert "llvm.prefetch" not in plain.lowered.ir_text
    for got, want in zip(hinted.run(*args), plain.run(*args)):
        np.testing.assert_array_equal(got, want)
    xhat = (args[0] - args[1]) * args[2]
    np.testing.assert_allclose(hinted.run(*args)[1], (xhat * args[3]).sum(axis=(0, 2, 3)),
                               rtol=1e-4, atol=1e-3)


def test_small_domains_and_short_or_long_rows_are_left_to_the_hardware(monkeypatch):
    """Below PREFETCH_MIN_ELEMENTS, or with rows shorter than a cache line or longer than
    PREFETCH_ROW_MAX_BYTES, no hints."""
    small = _build(2, 4, 8, 8, monkeypatch, True)
    assert 2 * 4 * 8 * 8 < prefetch.PREFETCH_MIN_ELEMENTS
    assert "llvm.prefetch" not in small.lowered.ir_text
    short_rows = _build(64, 512, 2, 2, monkeypatch, True)  # 16 bytes
    assert "llvm.prefetch" not in short_rows.lowered.ir_text
    side = 128  # rows of 128 x 128 float32: 64 KiB
    assert side * side * 4 > prefetch.PREFETCH_ROW_MAX_BYTES
    long_rows = _build(2, 2, side, side, monkeypatch, True)
    assert "llvm.prefetch" not in long_rows.lowered.ir_text
