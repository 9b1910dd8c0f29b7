"""graphc.passes.outer_product: a matmul over an inner dimension of one becomes a broadcast
multiply, bit for bit, which fuse then groups with the elementwise ops that read it (at
batch 1, a Linear weight's gradient with its optimizer update)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.optim as optim
from graphc.backends import compile as compile_graph
from graphc.ir import parse
from graphc.passes import default_passes, run_pipeline
from graphc.passes.outer_product import multiply_outer_products
from graphc.passes.simplify import simplify

OUTER = '''graph @f(%dy: f32[1,3], %x: f32[1,5]) -> (f32[3,5]) {
  %0: f32[3,1] = permute[dims=(1, 0)](%dy)
  %1: f32[3,5] = matmul(%0, %x)
  return (%1)
}'''


def test_an_outer_product_is_a_multiply_with_the_same_bits(rng):
    g = parse(OUTER)
    out = multiply_outer_products(g)
    assert [n.op for n in out.nodes] == ["permute", "mul"]
    assert out.outputs[0] is g.outputs[0]  # the same value, now the mul's
    dy = rng.standard_normal((1, 3)).astype(np.float32)
    x = rng.standard_normal((1, 5)).astype(np.float32)
    for backend in ("interp", "cpu"):
        before = compile_graph(g, backend).run(dy, x)[0]
        after = compile_graph(out, backend).run(dy, x)[0]
        np.testing.assert_array_equal(after, before)
        np.testing.assert_array_equal(after, dy.T * x)


@pytest.mark.parametrize("text", [
    # an inner dimension of two: a real sum, left to the GEMM
    '''graph @f(%a: f32[3,2], %b: f32[2,5]) -> (f32[3,5]) {
  %0: f32[3,5] = matmul(%a, %b)
  return (%0)
}''',
    # batched operands: matmul's broadcasting rules, left alone
    '''graph @f(%a: f32[2,3,1], %b: f32[2,1,5]) -> (f32[2,3,5]) {
  %0: f32[2,3,5] = matmul(%a, %b)
  return (%0)
}''',
    # a matrix-vector product: rank 1, left alone
    '''graph @f(%a: f32[3,1], %b: f32[1]) -> (f32[3]) {
  %0: f32[3] = matmul(%a, %b)
  return (%0)
}''',
])
def test_other_matmuls_are_left_alone(text):
    g = parse(text)
    assert multiply_outer_products(g) is g


def test_simplify_runs_it():
    assert "matmul" not in [n.op for n in simplify(parse(OUTER)).nodes]


def _batch_one_step(backend: str):
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Linear(7, 6), nn.ReLU(), nn.Linear(6, 3))
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = nn.CrossEntropyLoss()(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return graphc.compile(step, backend=backend), model


def test_a_batch_one_training_step_fuses_each_weight_gradient_with_its_update(rng):
    x = graphc.tensor(rng.standard_normal((1, 7)).astype(np.float32))
    y = graphc.tensor(np.array([2]))
    results = {}
    for backend in ("interp", "cpu"):
        step, model = _batch_one_step(backend)
        for _ in range(4):
            loss = step(x, y)
        results[backend] = [loss.numpy()] + [p.detach().numpy().copy()
                                             for p in model.parameters()] + \
            [p.grad.numpy().copy() for p in model.parameters()]
        if backend == "cpu":
            graph, _ = run_pipeline(step.graph, default_passes(step.graph))
            fused = [n for n in graph.nodes if n.op == "fused"
                     and n.outputs[0].type.shape == (6, 7)]
            assert "matmul" not in [n.op for n in graph.nodes]
            assert len(fused) == 1 and len(fused[0].outputs) == 3  # .grad, momentum, weight
    for a, b in zip(results["interp"], results["cpu"]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
