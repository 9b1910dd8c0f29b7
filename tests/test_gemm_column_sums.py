"""fuse_gemm_column_sums (graphc/passes/gemm_column_sums.py): a bias gradient's column sum
joins the GEMM epilogue that computes its input. IR in, IR out; the merged node computes
what the two did (interpreter and cpu); an MLP training step with biases is within the
float64 rounding rule (docs/performance.md) and has no lone column sum left."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.optim as optim
from graphc.backends import compile as compile_graph
from graphc.ir import parse
from graphc.passes import default_passes
from graphc.passes.gemm_column_sums import fuse_gemm_column_sums
from graphc.testing import assert_rounding_within

EPILOGUE_SUM = '''graph @f(%x: f32[4,8,16], %w: f32[16,32], %d: f32[4,8,32]) -> (f32[4,8,32], f32[32]) {
  %0: f32[4,8,32] = fused[body=(("matmul", (0, 1), ()), ("mul", (3, 2), ())), outputs=(4,)](%x, %w, %d)
  %1: f32[32] = reduce_sum[axes=(0, 1), keepdim=false](%0)
  return (%0, %1)
}'''  # noqa: E501

MERGED = '''graph @f(%x: f32[4,8,16], %w: f32[16,32], %d: f32[4,8,32]) -> (f32[4,8,32], f32[32]) {
  %0: f32[4,8,32], %1: f32[32] = fused[body=(("matmul", (0, 1), ()), ("mul", (3, 2), ()), ("reduce_sum", (4,), (("axes", (0, 1)), ("keepdim", false)))), outputs=(4, 5)](%x, %w, %d)
  return (%0, %1)
}'''  # noqa: E501


def _arrays(graph, rng):
    return [rng.standard_normal(tuple(v.type.shape)).astype(np.float32) for v in graph.inputs]


def test_the_column_sum_joins_the_epilogue(rng):
    graph = parse(EPILOGUE_SUM)
    merged = fuse_gemm_column_sums(graph)
    assert merged == parse(MERGED)
    assert graph == parse(EPILOGUE_SUM)  # the input graph is left unchanged
    args = _arrays(graph, rng)
    expected = compile_graph(graph, "interp").run(*args)
    for backend in ("interp", "cpu"):
        for got, e in zip(compile_graph(merged, backend).run(*args), expected):
            np.testing.assert_allclose(got, e, rtol=2e-5, atol=2e-5)
    # the same additions in the same order as the lone reduce_sum kernel's
    lone = compile_graph(graph, "cpu").run(*args)
    for got, e in zip(compile_graph(merged, "cpu").run(*args), lone):
        np.testing.assert_array_equal(got, e)


@pytest.mark.parametrize("change", ["plain matmul", "other output shape", "has an ending",
                                    "another dtype"])
def test_what_stays_a_lone_column_sum(change):
    text = EPILOGUE_SUM
    if change == "plain matmul":
        text = text.replace('fused[body=(("matmul", (0, 1), ()), ("mul", (3, 2), ())), '
                            'outputs=(4,)](%x, %w, %d)', "matmul(%x, %w)")
    elif change == "other output shape":  # a second output of another shape
        text = text.replace("outputs=(4,)](%x, %w, %d)", "outputs=(4, 5)](%x, %w, %d)")
        text = text.replace('("mul", (3, 2), ())), ', '("mul", (3, 2), ()), ("reduce_sum", '
                            '(4,), (("axes", (0,)), ("keepdim", false)))), ')
        text = text.replace("%0: f32[4,8,32] = fused", "%0: f32[4,8,32], %5: f32[8,32] = fused")
    elif change == "has an ending":
        text = text.replace('("mul", (3, 2), ())), outputs=(4,)', '("mul", (3, 2), ()), '
                            '("softmax", (4,), (("dim", 2),))), outputs=(5,)')
    else:
        text = text.replace("%1: f32[32] = reduce_sum[axes=(0, 1), keepdim=false](%0)",
                            "%2: f64[4,8,32] = cast[dtype=\"float64\"](%0)\n"
                            "  %1: f64[32] = reduce_sum[axes=(0, 1), keepdim=false](%2)")
        text = text.replace("-> (f32[4,8,32], f32[32])", "-> (f32[4,8,32], f64[32])")
    graph = parse(text)
    assert fuse_gemm_column_sums(graph) is graph


def test_only_the_cpu_pipeline_sums_in_epilogues():
    names = [p.__name__ for p in default_passes(None, "cpu")]
    assert names.index("fuse_gemm_column_sums") > names.index("fuse")
    assert "fuse_gemm_column_sums" not in [p.__name__ for p in default_passes(None, "cuda")]


def test_an_mlp_step_within_rounding_of_float64(rng):
    """Three SGD-momentum steps of a 3-layer MLP with biases: losses, weights and .grads are
    as close to a float64 run as eager graphc's; the hidden layers' bias gradients are
    summed in their epilogues."""
    x = rng.standard_normal((32, 20))
    y = rng.integers(0, 5, 32)
    results, graphs = {}, []
    for name, dtype, compiled in (("eager", graphc.float32, False),
                                  ("compiled", graphc.float32, True),
                                  ("reference", graphc.float64, False)):
        graphc.manual_seed(0)
        model = nn.Sequential(nn.Linear(20, 48), nn.ReLU(), nn.Linear(48, 40), nn.ReLU(),
                              nn.Linear(40, 5)).to(dtype)
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x, y):
            opt.zero_grad()
            loss = nn.CrossEntropyLoss()(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        fn = graphc.compile(step, backend="cpu") if compiled else step
        xs = graphc.tensor(x.astype(np.float64 if dtype is graphc.float64 else np.float32))
        losses = [fn(xs, graphc.tensor(y)).numpy() for _ in range(3)]
        if compiled:
            graphs.append(fn.optimized_graph)
        results[name] = [np.array(losses)] + [p.detach().numpy().copy()
                                              for p in model.parameters()] + \
            [p.grad.numpy().copy() for p in model.parameters()]
    summed = [n for n in graphs[0].nodes if n.op == "fused"
              and n.attrs["body"][0][0] == "matmul" and n.attrs["body"][-1][0] == "reduce_sum"]
    assert len(summed) == 2  # the two hidden layers' bias gradients
    for got, eager, reference in zip(results["compiled"], results["eager"],
                                     results["reference"]):
        assert_rounding_within(got, eager, reference)


# a column sum read through a view, written after another GEMM in program order
LATE_SUM = '''graph @f(%x: f32[64,32], %w: f32[32,32], %v: f32[32,32]) -> (f32[64,32], f32[32]) {
  %0: f32[64,32] = matmul(%x, %w)
  %1: f32[64,32] = matmul(%0, %v)
  %2: f32[2,32,32] = reshape[shape=(2, 32, 32)](%0)
  %3: f32[32] = reduce_sum[axes=(0, 1), keepdim=false](%2)
  return (%1, %3)
}'''


@pytest.mark.parametrize("ratio", [16, 0])
def test_a_small_reduction_runs_right_after_what_it_reads(ratio, monkeypatch, rng):
    """plan_buffers' schedules hoist the column sum (and the view it reads through) to just
    after the GEMM that wrote its input, while that is still in cache; ratio 0 turns it off."""
    from graphc.passes import plan

    monkeypatch.setattr(plan, "HOIST_REDUCTION_RATIO", ratio)
    graph = plan.plan_buffers(parse(LATE_SUM))
    plan.check_plan(graph)
    order = [n.outputs[0].name for n in graph.nodes]
    assert order == (["0", "2", "3", "1"] if ratio else ["0", "1", "2", "3"])
    args = _arrays(graph, rng)
    expected = compile_graph(parse(LATE_SUM), "interp").run(*args)
    for got, e in zip(compile_graph(graph, "cpu").run(*args), expected):
        np.testing.assert_allclose(got, e, rtol=2e-5, atol=2e-5)
