"""graphc.passes.gemm_order: a Linear layer's forward product `x @ W.T` computed as
`(W @ x.T).T` at batch sizes where BLAS runs that order faster; judged by distance from a
float64 run (docs/performance.md, `## Rounding`)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.optim as optim
from graphc.backends import compile as compile_graph
from graphc.ir import parse
from graphc.jit import trace_call
from graphc.passes import default_passes, run_pipeline
from graphc.passes.gemm_order import transpose_weight_products
from graphc.testing import assert_rounding_within

FORWARD = '''graph @f(%x: f32[32,20], %w: f32[64,20], %b: f32[64]) -> (f32[32,64]) {
  %0: f32[20,64] = permute[dims=(1, 0)](%w)
  %1: f32[32,64] = matmul(%x, %0)
  %2: f32[32,64] = add(%1, %b)
  %3: f32[32,64] = relu(%2)
  return (%3)
}'''


def test_the_forward_product_is_computed_transposed(rng):
    g = parse(FORWARD)
    out = transpose_weight_products(g)
    ops = [n.op for n in out.nodes]
    assert ops == ["permute", "permute", "matmul", "permute", "add", "relu"]
    matmul = out.nodes[2]
    assert matmul.inputs[0] is g.inputs[1]  # the weight itself, not a view
    assert matmul.outputs[0].type.shape == (64, 32)
    args = [rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs]
    x, w, b = args
    reference = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + b, 0)
    eager = np.maximum(x @ w.T + b, 0)
    for backend in ("interp", "cpu"):
        got = compile_graph(out, backend).run(*args)[0]
        assert_rounding_within(got, eager, reference)


@pytest.mark.parametrize("text", [
    # a thin product (batch 1 is a GEMV): left alone
    '''graph @f(%x: f32[1,20], %w: f32[64,20]) -> (f32[1,64]) {
  %0: f32[20,64] = permute[dims=(1, 0)](%w)
  %1: f32[1,64] = matmul(%x, %0)
  return (%1)
}''',
    # a narrow output (a classifier's logits): left alone
    '''graph @f(%x: f32[32,20], %w: f32[10,20]) -> (f32[32,10]) {
  %0: f32[20,10] = permute[dims=(1, 0)](%w)
  %1: f32[32,10] = matmul(%x, %0)
  return (%1)
}''',
    # both operands transposed views (a weight gradient's form): left alone
    '''graph @f(%x: f32[20,32], %w: f32[64,20]) -> (f32[32,64]) {
  %0: f32[32,20] = permute[dims=(1, 0)](%x)
  %1: f32[20,64] = permute[dims=(1, 0)](%w)
  %2: f32[32,64] = matmul(%0, %1)
  return (%2)
}''',
    # a second operand that is no transposed view: left alone
    '''graph @f(%x: f32[32,20], %w: f32[20,64]) -> (f32[32,64]) {
  %0: f32[32,64] = matmul(%x, %w)
  return (%0)
}''',
])
def test_left_alone(text):
    g = parse(text)
    assert transpose_weight_products(g) is g


def _mlp_step(dtype, compiled: bool):
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 96), nn.ReLU(), nn.Linear(96, 64), nn.ReLU(),
                          nn.Linear(64, 5)).to(dtype=dtype)
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = nn.CrossEntropyLoss()(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return (graphc.compile(step, backend="cpu") if compiled else step), model


def test_in_the_cpu_backends_default_pipeline(rng):
    step, _ = _mlp_step(graphc.float32, compiled=False)
    x = graphc.tensor(rng.standard_normal((32, 40)).astype(np.float32))
    y = graphc.tensor(rng.integers(0, 5, 32))
    traced = trace_call(step, (x, y), {})
    traced.restore()
    assert transpose_weight_products not in default_passes(traced.graph)  # interp's
    optimized, _ = run_pipeline(traced.graph, default_passes(traced.graph, "cpu"))
    products = [n for n in optimized.nodes if n.op == "matmul" or n.op == "fused"
                and "matmul" in str(n.attrs)]
    transposed = [n for n in products if n.outputs[0].type.shape in ((96, 32), (64, 32))]
    assert len(transposed) == 2  # both hidden layers; the 5-logit layer is left alone


def test_a_compiled_training_step_within_rounding_of_float64(rng):
    """Three SGD-momentum steps of an MLP whose hidden layers' forward products the pass
    rewrites: the compiled weights, .grads and losses are as close to a float64 run of the
    same steps as eager graphc's."""
    x = rng.standard_normal((32, 40))
    y = rng.integers(0, 5, 32)
    results = {}
    for name, dtype, compiled in (("eager", graphc.float32, False),
                                  ("compiled", graphc.float32, True),
                                  ("reference", graphc.float64, False)):
        step, model = _mlp_step(dtype, compiled)
        xs = graphc.tensor(x.astype(np.float64 if dtype is graphc.float64 else np.float32))
        losses = [step(xs, graphc.tensor(y)).numpy() for _ in range(3)]
        results[name] = [np.array(losses)] + [p.detach().numpy().copy()
                                              for p in model.parameters()] + \
            [p.grad.numpy().copy() for p in model.parameters()]
    for got, eager, reference in zip(results["compiled"], results["eager"],
                                     results["reference"]):
        assert_rounding_within(got, eager, reference)


def test_a_symbolic_batch_takes_the_order_without_guarding_its_size():
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 96), nn.ReLU(), nn.Linear(96, 5))
    f = graphc.compile(model, backend="cpu", dynamic=True)
    with graphc.no_grad():
        for n in (2, 40, 7):  # on both sides of MIN_ROWS: one graph serves them all
            x = graphc.randn(n, 40)
            np.testing.assert_allclose(f(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)
    assert [str(g.inputs[0].type) for g in f.graphs] == ["f32[s0,40]"]  # no guard on s0
    rewritten = transpose_weight_products(f.graphs[0])
    products = [str(n.outputs[0].type) for n in rewritten.nodes if n.op == "matmul"]
    assert products == ["f32[96,s0]", "f32[s0,5]"]  # W @ x.T at any batch; 5 logits: kept


STEPS = "graph @f(%h: f32[16,20], %g: f32[16,20], %w: f32[64,20]) -> " \
    "(f32[16,64], f32[16,64]) {\n"  # two steps of a recurrent layer

SHARED_THIN = STEPS + '''  %0: f32[20,64] = permute[dims=(1, 0)](%w)
  %1: f32[16,64] = matmul(%h, %0)
  %2: f32[16,64] = tanh(%1)
  %3: f32[16,64] = matmul(%g, %0)
  return (%2, %3)
}'''

SHARED_THIN_COPIED = STEPS + '''  %0: f32[20,64] = permute[dims=(1, 0)](%w)
  %4: f32[20,64] = copy(%0)
  %1: f32[16,64] = matmul(%h, %4)
  %2: f32[16,64] = tanh(%1)
  %3: f32[16,64] = matmul(%g, %4)
  return (%2, %3)
}'''


def test_thin_products_sharing_a_weight_read_one_copy_of_it(rng):
    """A recurrent layer's steps: every thin product reads one contiguous copy of the
    transposed weight, made once, instead of the (W @ h.T).T order; the copy moves values
    only, so the results equal the interpreter's on the original graph."""
    g = parse(SHARED_THIN)
    out = transpose_weight_products(g)
    assert str(out) == str(parse(SHARED_THIN_COPIED))
    args = [rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs]
    want = compile_graph(g, "interp").run(*args)
    for got, expected in zip(compile_graph(out, "cpu").run(*args), want):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, users", [(16, 1), (1, 2), (17, 2)])
def test_a_lone_or_not_thin_product_keeps_the_transposed_order(rows, users):
    """One thin product (nothing to share), single rows (GEMV) and products above
    THIN_ROWS rows are not copied: m >= MIN_ROWS take the (W @ x.T).T order as before."""
    products = "\n".join(f"  %{k + 1}: f32[{rows},64] = matmul(%h, %0)" for k in range(users))
    results = ", ".join(f"f32[{rows},64]" for _ in range(users))
    text = (f"graph @f(%h: f32[{rows},20], %w: f32[64,20]) -> ({results}) {{\n"
            f"  %0: f32[20,64] = permute[dims=(1, 0)](%w)\n{products}\n"
            f"  return ({', '.join(f'%{k + 1}' for k in range(users))})\n}}")
    out = transpose_weight_products(parse(text))
    assert "copy" not in [n.op for n in out.nodes]
    matmuls = [n for n in out.nodes if n.op == "matmul"]
    assert all((n.outputs[0].type.shape == (64, rows)) is (rows >= 16) for n in matmuls)
