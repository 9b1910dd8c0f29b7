"""Regression: fuse on a value shared by two elementwise consumers whose shapes have no common
broadcast domain (issue 12: `c = s.sum() * 2; return a * c, b * c` with a (8, 4), b (3, 8)
crashed in `_split_mixed`; gradient clipping by a global norm hits it on every model)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.ir import parse, run, verify
from graphc.passes.fuse import fuse

SHARED_SCALAR = """graph @f(%s: f32[5], %a: f32[8,4], %b: f32[3,8]) -> (f32[8,4], f32[3,8]) {
  %0: f32[] = reduce_sum[axes=(0,), keepdim=false](%s)
  %1: f32[] = mul(%0, %0)
  %2: f32[8,4] = mul(%a, %1)
  %3: f32[3,8] = mul(%b, %1)
  return (%2, %3)
}"""


def test_fuse_keeps_differently_shaped_consumers_of_a_scalar_apart():
    graph = parse(SHARED_SCALAR)
    fused = fuse(graph)
    verify(fused)
    rng = np.random.default_rng(12)
    inputs = [rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs]
    for got, want in zip(run(fused, *inputs), run(graph, *inputs)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_compiled_shared_scalar_two_shapes(backend):
    def f(s, a, b):
        c = s.sum() * 2
        return a * c, b * c

    graphc.manual_seed(0)
    s, a, b = graphc.randn(5), graphc.randn(8, 4), graphc.randn(3, 8)
    got = graphc.compile(f, backend=backend)(s, a, b)
    for g, w in zip(got, f(s, a, b)):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-6)
