"""graphc.passes.simplify: dead code, CSE, constant folding, algebra, BatchNorm folding.

IR text in, IR text out: every `tests/fixtures/simplify/<pass>.<case>.in.gir` run through
`<pass>` equals the matching `.out.gir` (parsed, so names, types, attributes and source
locations all count), the result is a fixed point of the pass, and the interpreter gives the
same outputs on both. Traced models (an MLP with BatchNorm1d, LeNet-5 with BatchNorm2d, in eval
mode; a training-mode graph with in-place updates; dropout) keep their outputs; random ops never
merge; bad IR handed to the pipeline is rejected with the node and its line.
"""

from __future__ import annotations

import pathlib
import zlib

import numpy as np
import pytest

import graphc
from graphc import nn
from graphc.ir import Graph, VerifyError, format_graph, parse, run, verify
from graphc.jit.bindings import ArgBinding, ConstantBinding, RngBinding, TensorBinding
from graphc.jit.tracer import trace_call
from graphc.ops.registry import RANDOM, REGISTRY
from graphc.passes import run_pipeline
from graphc.passes import simplify as passes
from graphc.passes.simplify import (
    eliminate_common_subexpressions,
    eliminate_dead_code,
    fold_batchnorm,
    fold_constants,
    simplify,
    simplify_algebra,
)

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "simplify"
CASES = sorted(p.name[: -len(".in.gir")] for p in FIXTURES.glob("*.in.gir"))


def rng_for(request) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def random_inputs(graph: Graph, rng: np.random.Generator) -> list[np.ndarray]:
    """Positive floats (BatchNorm variances stay valid), small ints, [seed, offset] for %rng."""
    out = []
    for v in graph.inputs:
        shape, dt = v.type.shape, v.type.dtype.np
        if v.name == "rng":
            out.append(np.array([1234, 10], dtype=np.int64))
        elif v.type.dtype.is_floating:
            out.append(rng.uniform(0.5, 2.0, shape).astype(dt))
        elif dt == np.bool_:
            out.append(rng.random(shape) < 0.5)
        else:
            out.append(rng.integers(-5, 5, shape).astype(dt))
    return out


def assert_same_results(before: Graph, after: Graph, arrays, exact: bool) -> None:
    expected, got = run(before, *arrays), run(after, *arrays)
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        assert e.shape == g.shape and e.dtype == g.dtype
        if exact:
            np.testing.assert_array_equal(g, e)
        else:
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


# ---- IR text in, IR text out ------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_fixture(case):
    before = parse((FIXTURES / f"{case}.in.gir").read_text())
    expected = parse((FIXTURES / f"{case}.out.gir").read_text())
    fn = getattr(passes, case.split(".")[0])
    text_before = format_graph(before)
    after = fn(before)
    verify(after)
    assert after == expected, f"{case}: got\n{format_graph(after)}"
    assert format_graph(before) == text_before, "a pass must not change the graph it is given"
    assert fn(after) is after, "the result is a fixed point (returned as is)"


@pytest.mark.parametrize("case", CASES)
def test_fixture_keeps_results(case, request):
    before = parse((FIXTURES / f"{case}.in.gir").read_text())
    after = parse((FIXTURES / f"{case}.out.gir").read_text())
    arrays = random_inputs(before, rng_for(request))
    assert_same_results(before, after, arrays, exact=not case.startswith("fold_batchnorm"))


@pytest.mark.parametrize("case", CASES)
def test_simplify_keeps_fixture_results(case, request):
    before = parse((FIXTURES / f"{case}.in.gir").read_text())
    after, report = run_pipeline(before, [simplify])
    assert simplify(after) is after
    assert len(after) <= len(before) or case.startswith("fold_batchnorm")
    arrays = random_inputs(before, rng_for(request))
    assert_same_results(before, after, arrays, exact=not case.startswith("fold_batchnorm"))


def test_meta_dropped_on_change_and_kept_otherwise():
    text = (FIXTURES / "eliminate_dead_code.basic.in.gir").read_text()
    g = parse(text)
    g.meta["memory_plan"] = "stale"
    out = eliminate_dead_code(g)
    assert out is not g and out.meta == {} and g.meta == {"memory_plan": "stale"}
    out.meta["memory_plan"] = "fresh"
    for fn in (eliminate_dead_code, eliminate_common_subexpressions, fold_constants,
               simplify_algebra, fold_batchnorm, simplify):
        assert fn(out) is out and out.meta == {"memory_plan": "fresh"}


def test_updates_inputs_and_outputs_are_preserved():
    g = parse((FIXTURES / "simplify.mixed.in.gir").read_text())
    out = simplify(g)
    assert [v.name for v in out.inputs] == [v.name for v in g.inputs]
    assert [(t.name, v.type) for t, v in out.updates] == [("step", g.updates[0][1].type)]
    assert [v.type for v in out.outputs] == [v.type for v in g.outputs]


# ---- random ops -------------------------------------------------------------------------------
RANDOM_NODES = {
    "uniform": ('uniform[shape=(4,), dtype="float32"](%rng)', "f32[4]"),
    "normal": ('normal[shape=(4,), dtype="float32"](%rng)', "f32[4]"),
    "dropout": ("dropout[p=0.5](%x, %rng)", "f32[4]"),
    "bernoulli": ("bernoulli(%x, %rng)", "f32[4]"),
    "randint": ("randint[low=0, high=9, shape=(4,)](%rng)", "i64[4]"),
    "randperm": ("randperm[n=4](%rng)", "i64[4]"),
    # not random, but effectful the same way: two all_reduces are two collectives
    "all_reduce": ('all_reduce[op="sum"](%x)', "f32[4]"),
    "all_reduce_start": ('all_reduce_start[op="sum"](%x)', "f32[4]"),
    "all_reduce_wait": ('all_reduce_wait[op="sum"](%x)', "f32[4]"),
}


def test_every_random_op_is_covered():
    effectful = {name for name, op in REGISTRY.items() if op.effectful or op.kind == RANDOM}
    assert effectful == set(RANDOM_NODES)


@pytest.mark.parametrize("op", sorted(RANDOM_NODES))
def test_cse_never_merges_random_ops(op):
    call, ty = RANDOM_NODES[op]
    g = parse(f"""graph @r(%x: f32[4], %rng: i64[2]) -> ({ty}, {ty}) {{
      %0: {ty} = {call}   # m.py:1
      %1: {ty} = {call}   # m.py:2
      return (%0, %1)
    }}""")
    assert eliminate_common_subexpressions(g) is g
    out = simplify(g)
    assert [n.op for n in out.nodes] == [op, op]


def test_traced_dropouts_and_rand_stay_apart_and_draw_the_same_words():
    def f(x):
        a = nn.functional.dropout(x, 0.5, training=True)
        b = nn.functional.dropout(x, 0.5, training=True)
        graphc.rand(3)  # unused, dropped: the other random ops keep their offsets
        c = graphc.rand(4, 6)
        return a + b + c * 1.0 + 0.0

    x = graphc.randn(4, 6)
    result = trace_call(f, (x,))
    g = result.graph
    out = simplify(g)
    assert sum(n.op == "uniform" for n in g.nodes) == 2
    assert sorted(n.op for n in out.nodes if REGISTRY[n.op].kind == RANDOM) == \
        ["dropout", "dropout", "uniform"]
    arrays = [x.numpy(), np.array(result.bindings[1].traced_state, dtype=np.int64)]
    assert_same_results(g, out, arrays, exact=True)


# ---- traced models ----------------------------------------------------------------------------
def mlp():
    return nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 16),
                         nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 5))


def lenet():
    """LeNet-5 on 28x28 with BatchNorm after each conv and after the first linear layer."""
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(400, 120), nn.BatchNorm1d(120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10),
    )


def with_running_stats(model, rng):
    """Running statistics and affine parameters far from their defaults, so folding matters."""
    for module in model.modules():
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            c = module.running_mean.shape[0]
            module.running_mean._data[...] = rng.standard_normal(c)
            module.running_var._data[...] = rng.uniform(0.2, 3.0, c)
            module.weight._data[...] = rng.uniform(0.5, 1.5, c)
            module.bias._data[...] = rng.standard_normal(c)
    return model


def traced(model, x):
    """The traced graph and the arrays its inputs are bound to."""
    with graphc.no_grad():
        result = trace_call(model, (x,))
    arrays = []
    for b in result.bindings:
        if isinstance(b, ArgBinding):
            arrays.append(x.numpy())
        elif isinstance(b, TensorBinding):
            arrays.append(b.tensor.detach().numpy().copy())
        elif isinstance(b, RngBinding):
            arrays.append(np.array(b.traced_state, dtype=np.int64))
        else:
            assert isinstance(b, ConstantBinding)
            arrays.append(b.array)
    return result.graph, arrays


def data_path(graph: Graph) -> list:
    """Nodes that depend on the first graph input (the activations, not the parameters)."""
    live, nodes = {graph.inputs[0]}, []
    for n in graph.nodes:
        if any(v in live for v in n.inputs):
            live.update(n.outputs)
            nodes.append(n)
    return nodes


@pytest.mark.parametrize("build, shape", [(mlp, (8, 12)), (lenet, (4, 1, 28, 28))],
                         ids=["mlp", "lenet5"])
def test_eval_model_folds_batchnorm_and_keeps_results(build, shape, request):
    rng = rng_for(request)
    model = with_running_stats(build(), rng).eval()
    x = graphc.tensor(rng.standard_normal(shape).astype(np.float32))
    g, arrays = traced(model, x)
    out, report = run_pipeline(g, [simplify])
    assert not any(n.op == "batch_norm" for n in out.nodes)
    assert all(n.loc for n in out.nodes), "every node keeps (or inherits) a source location"
    before, after = data_path(g), data_path(out)
    assert len(after) < len(before)
    assert [n.op for n in after if n.op in ("conv2d", "matmul")] == \
        [n.op for n in before if n.op in ("conv2d", "matmul")]
    assert_same_results(g, out, arrays, exact=False)
    (expected,) = run(g, *arrays)
    np.testing.assert_allclose(model(x).detach().numpy(), expected, rtol=1e-5, atol=1e-6)
    # The folded weights are computed in the graph: new parameter values still match.
    fresh = [a if i == 0 else (np.abs(a) + 0.1) * 1.5 for i, a in enumerate(arrays)]
    assert_same_results(g, out, fresh, exact=False)


def test_lenet5_node_counts():
    model = with_running_stats(lenet(), np.random.default_rng(0)).eval()
    g, _ = traced(model, graphc.randn(4, 1, 28, 28))
    out = simplify(g)
    # The activation path loses its 3 batch_norms (20 -> 17 nodes). The parameter path gains
    # the per-channel scale and shift: one shared eps, 9 nodes per conv BatchNorm and 7 for the
    # linear one, less the 2 conv-bias reshapes folded away (25 - 5 + 26 = 46 in all).
    assert (len(g), len(data_path(g))) == (25, 20)
    assert (len(out), len(data_path(out))) == (46, 17)
    assert sum(n.op == "batch_norm" for n in g.nodes) == 3


def test_training_graph_keeps_updates_and_results(request):
    rng = rng_for(request)
    model = mlp().train()
    x = graphc.tensor(rng.standard_normal((8, 12)).astype(np.float32))
    g, arrays = traced(model, x)
    assert g.updates, "BatchNorm's running statistics are updated in place"
    out = run_pipeline(g, [simplify])[0]
    assert [(t.name, v.type) for t, v in out.updates] == [(t.name, v.type) for t, v in g.updates]
    assert sum(n.op == "batch_norm" for n in out.nodes) == 2  # training mode: not folded
    assert_same_results(g, out, arrays, exact=True)


def test_node_count_drops_on_redundant_code():
    def f(x):
        a = (x * 1.0 + 0.0).exp()
        b = (x * 1).exp()
        c = x.reshape(6, 4).reshape(24).reshape(4, 6).t().t()
        return a + b + c.neg().neg() - (graphc.ones(4, 6) * 0.0)

    x = graphc.randn(4, 6)
    g = trace_call(f, (x,)).graph
    out = simplify(g)
    assert [n.op for n in out.nodes] == ["exp", "add", "add"]  # y - ones * 0.0 is y
    assert_same_results(g, out, [x.numpy()], exact=True)


# ---- bad IR -----------------------------------------------------------------------------------
GOOD = """graph @f(%x: f32[4], %w: f32[4]) -> (f32[4]) {
  %0: f32[4] = exp(%x)           # m.py:2
  %1: f32[4] = relu(%0)          # m.py:3
  %2: f32[4] = tanh(%x)          # m.py:4
  %w <- %1
  return (%1)
}"""


def test_bad_type_is_rejected_with_node_and_line():
    bad = parse(GOOD.replace("%2: f32[4] = tanh", "%2: f32[5] = tanh"))
    # eliminate_dead_code alone would drop the broken (unused) node: the pipeline must not
    # let it "fix" the graph silently.
    with pytest.raises(VerifyError, match=r"tanh at m\.py:4: output types \['f32\[5\]'\]"):
        run_pipeline(bad, [eliminate_dead_code])


def test_use_before_def_is_rejected_with_node_and_line():
    bad = parse(GOOD)
    bad.nodes[0], bad.nodes[1] = bad.nodes[1], bad.nodes[0]
    with pytest.raises(VerifyError, match=r"relu at m\.py:3: %0 is used before it is defined"):
        run_pipeline(bad, [simplify])


def test_alias_conflict_is_rejected():
    bad = parse(GOOD.replace("%w <- %1", "%w <- %1\n  %w <- %0"))
    with pytest.raises(VerifyError, match=r"update %w <- %0: %w is updated twice"):
        run_pipeline(bad, [simplify])
    bad = parse(GOOD.replace("%w <- %1", "%x <- %1\n  %w <- %1"))
    bad.updates[0] = (bad.nodes[0].outputs[0], bad.nodes[1].outputs[0])
    with pytest.raises(VerifyError, match=r"only graph inputs can be updated in place"):
        run_pipeline(bad, [simplify])


def test_pipeline_records_each_pass():
    g = parse((FIXTURES / "simplify.mixed.in.gir").read_text())
    out, report = run_pipeline(g, list(passes.PASSES))
    assert [r.name for r in report.records] == [fn.__name__ for fn in passes.PASSES]
    assert report.records[0].nodes_before == len(g) and report.records[-1].nodes_after == len(out)
