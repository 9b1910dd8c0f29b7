"""graphc.passes.transpose: a transposed matmul result becomes the matmul of transposed
operands (a Linear layer's weight gradient written in its own layout, no copy)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from graphc.backends import compile as compile_graph
from graphc.ir import parse
from graphc.jit import trace_call
from graphc.passes import default_passes, run_pipeline
from graphc.passes.simplify import simplify
from graphc.passes.transpose import transpose_matmul_results
from graphc.testing import assert_rounding_within

WEIGHT_GRAD = '''graph @f(%x: f32[6,5], %g: f32[6,3]) -> (f32[3,5]) {
  %0: f32[5,6] = permute[dims=(1, 0)](%x)
  %1: f32[5,3] = matmul(%0, %g)
  %2: f32[3,5] = permute[dims=(1, 0)](%1)
  %3: f32[3,5] = copy(%2)
  return (%3)
}'''


def _run(graph, *args):
    return compile_graph(graph, "interp").run(*args)


def test_weight_gradient_is_one_gemm_in_its_own_layout(rng):
    g = parse(WEIGHT_GRAD)
    assert [n.op for n in transpose_matmul_results(g).nodes].count("copy") == 1  # for simplify
    out = simplify(g)  # the pass inside simplify's fixed point: the copy goes too
    assert [n.op for n in out.nodes] == ["permute", "matmul"]
    matmul = out.nodes[-1]
    assert matmul.inputs[1] is g.inputs[0]  # x itself: x.T.T composed away
    assert out.outputs[0].type.shape == (3, 5)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    dy = rng.standard_normal((6, 3)).astype(np.float32)
    got = _run(out, x, dy)[0]
    np.testing.assert_allclose(got, (x.T @ dy).T, rtol=1e-6, atol=1e-6)


def test_batched_transpose_of_last_two_dims(rng):
    g = parse('''graph @f(%a: f32[2,4,3], %b: f32[2,3,5]) -> (f32[2,5,4]) {
  %0: f32[2,4,5] = matmul(%a, %b)
  %1: f32[2,5,4] = permute[dims=(0, 2, 1)](%0)
  return (%1)
}''')
    out = simplify(g)
    assert [n.op for n in out.nodes].count("matmul") == 1
    assert "permute" not in [n.op for n in out.nodes if n.outputs[0] is out.outputs[0]]
    a = rng.standard_normal((2, 4, 3)).astype(np.float32)
    b = rng.standard_normal((2, 3, 5)).astype(np.float32)
    np.testing.assert_allclose(_run(out, a, b)[0], np.swapaxes(a @ b, 1, 2), rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("text", [
    # the matmul result is read twice: rewriting would compute the GEMM twice
    '''graph @f(%a: f32[4,3], %b: f32[3,5]) -> (f32[5,4], f32[4,5]) {
  %0: f32[4,5] = matmul(%a, %b)
  %1: f32[5,4] = permute[dims=(1, 0)](%0)
  return (%1, %0)
}''',
    # a permute that is no transpose of the last two dims
    '''graph @f(%a: f32[2,4,3], %b: f32[2,3,5]) -> (f32[4,2,5]) {
  %0: f32[2,4,5] = matmul(%a, %b)
  %1: f32[4,2,5] = permute[dims=(1, 0, 2)](%0)
  return (%1)
}''',
    # operands of different ranks (broadcast batch): matmul's rules differ, left alone
    '''graph @f(%a: f32[2,4,3], %b: f32[3,5]) -> (f32[2,5,4]) {
  %0: f32[2,4,5] = matmul(%a, %b)
  %1: f32[2,5,4] = permute[dims=(0, 2, 1)](%0)
  return (%1)
}''',
])
def test_left_alone(text):
    g = parse(text)
    assert transpose_matmul_results(g) is g


def test_in_the_default_pipeline_and_linear_weight_grads_need_no_copy():
    model = nn.Linear(7, 3)
    x = graphc.randn(5, 7)

    def step(x):
        model.zero_grad()
        loss = model(x).sum()
        loss.backward()
        return loss

    traced = trace_call(step, (x,), {})
    traced.restore()
    optimized, _ = run_pipeline(traced.graph, default_passes(traced.graph))
    assert "copy" not in [n.op for n in optimized.nodes]


def test_compiled_linear_gradients_within_rounding_of_float64(rng):
    """A two-layer MLP step: compiled weight gradients (now dy.T @ x) are as close to a
    float64 run of the same step as eager graphc's (docs/performance.md's criterion)."""
    x = rng.standard_normal((16, 20)).astype(np.float32)

    def build(dtype):
        graphc.manual_seed(0)
        m = nn.Sequential(nn.Linear(20, 12), nn.ReLU(), nn.Linear(12, 4))
        return m.to(dtype=dtype)

    def step(model, x):
        model.zero_grad()
        loss = (model(x) ** 2).mean()
        loss.backward()
        return loss

    grads = {}
    for name, dtype, compiled in (("eager", graphc.float32, False),
                                  ("compiled", graphc.float32, True),
                                  ("reference", graphc.float64, False)):
        model = build(dtype)
        fn = graphc.compile(lambda x: step(model, x), backend="cpu") if compiled \
            else (lambda x: step(model, x))
        fn(graphc.from_numpy(x.astype(np.float64 if dtype is graphc.float64 else np.float32)))
        grads[name] = [p.grad.numpy() for p in model.parameters()]
    for got, eager, reference in zip(grads["compiled"], grads["eager"], grads["reference"]):
        assert_rounding_within(got, eager, reference)
