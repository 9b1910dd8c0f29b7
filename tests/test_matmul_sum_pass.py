"""graphc.passes.matmul_sum: a sum of thin matrix products (a weight's gradient summed over
the steps of a loop) becomes one product over the concatenated inner dimension; results move
by rounding only, judged by distance from float64."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from graphc.backends import compile as compile_graph
from graphc.ir import parse
from graphc.passes.matmul_sum import concat_summed_matmuls
from graphc.passes.simplify import simplify
from graphc.testing import assert_rounding_within

# three products with odd inner sizes (3, 1, 2), the first two of transposed views (dy^T @ x)
THIN = '''graph @f(%d1: f32[3,7], %x1: f32[3,5], %d2: f32[1,7], %x2: f32[1,5], %a3: f32[7,2],
          %b3: f32[2,5]) -> (f32[7,5]) {
  %0: f32[7,3] = permute[dims=(1, 0)](%d1)
  %1: f32[7,5] = matmul(%0, %x1)
  %2: f32[7,1] = permute[dims=(1, 0)](%d2)
  %3: f32[7,5] = matmul(%2, %x2)
  %4: f32[7,5] = add(%1, %3)
  %5: f32[7,5] = matmul(%a3, %b3)
  %6: f32[7,5] = add(%4, %5)
  return (%6)
}'''
SHAPES = ((3, 7), (3, 5), (1, 7), (1, 5), (7, 2), (2, 5))


@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_thin_products_become_one_gemm(rng, backend):
    g = parse(THIN)
    out = simplify(g)
    ops = [n.op for n in out.nodes]
    assert ops.count("matmul") == 1 and "add" not in ops, ops
    gemm = out.nodes[-1]
    assert gemm.op == "matmul" and gemm.inputs[0].type.shape == (7, 6)
    assert gemm.inputs[1].type.shape == (6, 5)
    args = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    want = sum(a.astype(np.float64) @ b.astype(np.float64)
               for a, b in ((args[0].T, args[1]), (args[2].T, args[3]), (args[4], args[5])))
    eager = _run(g, "interp", *args)[0]
    assert_rounding_within(compile_graph(out, backend).run(*args)[0], eager, want)


def _run(graph, backend, *args):
    return compile_graph(graph, backend).run(*args)


def test_all_transposed_operands_concatenate_before_the_transpose():
    g = parse('''graph @f(%d1: f32[1,6], %x1: f32[1,3], %d2: f32[1,6], %x2: f32[1,3])
          -> (f32[6,3]) {
  %0: f32[6,1] = permute[dims=(1, 0)](%d1)
  %1: f32[6,3] = matmul(%0, %x1)
  %2: f32[6,1] = permute[dims=(1, 0)](%d2)
  %3: f32[6,3] = matmul(%2, %x2)
  %4: f32[6,3] = add(%1, %3)
  return (%4)
}''')
    out = concat_summed_matmuls(g)
    lhs = out.producers()[out.nodes[-1].inputs[0]]
    assert lhs.op == "permute"
    inner = out.producers()[lhs.inputs[0]]
    assert inner.op == "concat" and inner.attrs["axis"] == 0 and inner.inputs == g.inputs[::2]


@pytest.mark.parametrize("text", [
    # a product read twice: it would be computed twice
    '''graph @f(%a: f32[8,1], %b: f32[1,8], %c: f32[8,1], %d: f32[1,8]) -> (f32[8,8], f32[8,8]) {
  %0: f32[8,8] = matmul(%a, %b)
  %1: f32[8,8] = matmul(%c, %d)
  %2: f32[8,8] = add(%0, %1)
  return (%2, %0)
}''',
    # wide products of a small batch (x @ W1 + h @ W2): the concat would copy the weights
    '''graph @f(%x: f32[2,16], %w1: f32[16,16], %h: f32[2,16], %w2: f32[16,16]) -> (f32[2,16]) {
  %0: f32[2,16] = matmul(%x, %w1)
  %1: f32[2,16] = matmul(%h, %w2)
  %2: f32[2,16] = add(%0, %1)
  return (%2)
}''',
    # batched products (rank 3): left alone
    '''graph @f(%a: f32[2,8,1], %b: f32[2,1,8], %c: f32[2,8,1], %d: f32[2,1,8]) -> (f32[2,8,8]) {
  %0: f32[2,8,8] = matmul(%a, %b)
  %1: f32[2,8,8] = matmul(%c, %d)
  %2: f32[2,8,8] = add(%0, %1)
  return (%2)
}''',
])
def test_left_alone(text):
    g = parse(text)
    assert concat_summed_matmuls(g) is g


def test_lstm_weight_gradients_within_rounding_of_float64(rng):
    """A traced LSTM step: the hidden-to-hidden weight's gradient is one GEMM, and the
    compiled gradients are as close to a float64 run as eager graphc's."""
    x = rng.standard_normal((3, 9, 4))

    def run(dtype, compiled):
        graphc.manual_seed(0)
        model = nn.LSTM(4, 6, num_layers=2, batch_first=True).to(dtype=dtype)
        inputs = graphc.tensor(x.astype(np.float64 if dtype == graphc.float64 else np.float32))

        def step(x):
            model.zero_grad()
            out, _ = model(x)
            loss = (out ** 2).sum()
            loss.backward()
            return loss.detach()

        fn = graphc.compile(step, backend="cpu") if compiled else step
        for _ in range(2):
            fn(inputs)
        grads = [p.grad.numpy().copy() for p in model.parameters()]
        return grads, fn

    eager, _ = run(graphc.float32, False)
    compiled, fn = run(graphc.float32, True)
    exact, _ = run(graphc.float64, False)
    matmuls = [n for n in fn.optimized_graph.nodes if "matmul" in str(n.attrs) or
               n.op == "matmul"]
    assert len(matmuls) < 9 * 2 * 3  # far fewer than one weight-gradient GEMM per step
    for got, ref, want in zip(compiled, eager, exact):
        assert_rounding_within(got, ref, want)
