"""recompute_row_values with producers that end in a reduction (graphc.passes.row_recompute):
a batch-norm backward after a ReLU, as `fuse` leaves it, writes g = where(mask, dy, 0) while it
sums g, and xhat = (x - mean) * invstd while it sums g * xhat; the readers now recompute both,
so neither tensor is written, and the results stay the compiled ones."""

from __future__ import annotations

import numpy as np

from graphc.backends import compile as compile_graph
from graphc.ir import parse
from graphc.ops.fused import FusedBody
from graphc.passes import row_recompute
from graphc.passes.fuse import fuse
from graphc.passes.row_recompute import recompute_row_values

# sum(g), sum(g * xhat) and the input gradient of batch_norm, g = where(relu mask, dy, 0)
BN_BACKWARD = '''graph @bnb(%dy: f32[4,3,5,6], %mask: bool[4,3,5,6], %x: f32[4,3,5,6],
                   %mean: f32[1,3,1,1], %invstd: f32[1,3,1,1], %scale: f32[1,3,1,1])
    -> (f32[4,3,5,6], f32[3], f32[3]) {
  %0: f32[] = full[shape=(), value=0.0, dtype="float32"]()
  %1: f32[4,3,5,6] = where(%mask, %dy, %0)
  %2: f32[3] = reduce_sum[axes=(0, 2, 3), keepdim=false](%1)
  %3: f32[4,3,5,6] = sub(%x, %mean)
  %4: f32[4,3,5,6] = mul(%3, %invstd)
  %5: f32[4,3,5,6] = mul(%1, %4)
  %6: f32[3] = reduce_sum[axes=(0, 2, 3), keepdim=false](%5)
  %7: f32[1,3,1,1] = reshape[shape=(1, 3, 1, 1)](%2)
  %8: f32[1,3,1,1] = reshape[shape=(1, 3, 1, 1)](%6)
  %9: f32[] = full[shape=(), value=120.0, dtype="float32"]()
  %10: f32[1,3,1,1] = div(%7, %9)
  %11: f32[4,3,5,6] = sub(%1, %10)
  %12: f32[1,3,1,1] = div(%8, %9)
  %13: f32[4,3,5,6] = mul(%4, %12)
  %14: f32[4,3,5,6] = sub(%11, %13)
  %15: f32[4,3,5,6] = mul(%14, %scale)
  return (%15, %2, %6)
}'''


def _arrays(rng):
    shape, channel = (4, 3, 5, 6), (1, 3, 1, 1)
    return [rng.standard_normal(shape).astype(np.float32), rng.random(shape) < 0.6,
            (2 + rng.standard_normal(shape)).astype(np.float32),
            np.full(channel, 2.0, np.float32), rng.uniform(0.5, 2, channel).astype(np.float32),
            rng.uniform(0.5, 2, channel).astype(np.float32)]


def _big_outputs(graph) -> set[str]:
    """Names of the [4,3,5,6] tensors the graph's nodes write."""
    return {v.name for n in graph.nodes for v in n.outputs
            if tuple(v.type.shape) == (4, 3, 5, 6)}


def test_g_and_xhat_are_recomputed_by_their_readers(monkeypatch):
    fused = fuse(parse(BN_BACKWARD))
    reductions = [n for n in fused.nodes if n.op == "fused"
                  and FusedBody.of_node(n).ending is not None]
    assert len(reductions) == 2
    assert {"1", "4"} <= _big_outputs(fused)  # g and xhat written while summed
    out = recompute_row_values(fused)
    assert _big_outputs(out) == {"15"}  # only the input gradient is written
    monkeypatch.setattr(row_recompute, "REDUCTION_PRODUCERS", False)
    assert {"1", "4"} <= _big_outputs(recompute_row_values(fused))
    args = _arrays(np.random.default_rng(5))
    for a, e in zip(compile_graph(out, "cpu").run(*args),
                    compile_graph(fused, "cpu").run(*args)):
        # the same operations on the same inputs (a recomputed product may be contracted into
        # the FMA of the sum that reads it)
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


def test_a_value_that_costs_more_to_recompute_stays_written():
    """g = where(mask, dy + dz, 0), a residual's gradient: each of its two readers would read
    dy, dz and the mask anew (9 bytes an element against g's 4), more than the 4 bytes its
    producer no longer writes: g stays written (xhat is still recomputed)."""
    text = BN_BACKWARD.replace("%dy: f32[4,3,5,6], %mask",
                               "%dy: f32[4,3,5,6], %dz: f32[4,3,5,6], %mask")
    text = text.replace("  %1: f32[4,3,5,6] = where(%mask, %dy, %0)",
                        "  %16: f32[4,3,5,6] = add(%dy, %dz)\n"
                        "  %1: f32[4,3,5,6] = where(%mask, %16, %0)")
    out = recompute_row_values(fuse(parse(text)))
    assert _big_outputs(out) == {"1", "15"}
