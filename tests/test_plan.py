"""plan_buffers: schedule, liveness, views, in-place reuse, arena packing, report and picture.

IR text in, plan facts out for the rules; the LeNet-5 and MLP 784-256-256-10 batch-64 joint
forward+backward graphs (gradients as outputs) and training steps (SGD with momentum, updates
written back) for the invariants, the acceptance numbers of issue 4 and a run of every graph
in an arena laid out exactly as planned (a wrong offset or lifetime corrupts the results).
"""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import graphc
import graphc.nn.functional as F
from graphc import nn
from graphc.ir import Interpreter, VerifyError, parse, run
from graphc.jit.tracer import trace_call
from graphc.passes import run_pipeline
from graphc.passes.fuse import fuse
from graphc.passes.plan import ALIGN, PlanError, check_plan, plan_buffers
from graphc.tools.memory_viz import render_memory


def planned(text: str):
    g = plan_buffers(parse(text))
    return g, g.meta["memory_plan"]


# ---- the rules, IR text in ------------------------------------------------------------------
CHAIN = """graph @f(%x: f32[8,16], %b: f32[16]) -> (f32[16,8]) {
  %0: f32[8,16] = exp(%x)
  %1: f32[8,16] = add(%0, %b)
  %2: f32[16,8] = permute[dims=(1, 0)](%1)
  %3: f32[16,8] = relu(%2)
  return (%3)
}"""


def test_views_alias_their_input_and_elementwise_outputs_reuse_dying_inputs():
    g, plan = planned(CHAIN)
    assert plan.views == {"2": "1"}
    assert plan.inplace == {"1": "0"}  # %0 dies at the add, same shape: written in place
    assert plan.buffer_of["1"] == plan.buffer_of["2"] == "0"
    # relu reads a transposed view: element order differs, so it gets a buffer of its own
    assert plan.buffer_of["3"] == "3" and "3" not in plan.inplace
    assert plan.lifetimes["0"] == (0, 3)  # kept alive by the view until the relu reads it
    assert plan.arena_bytes == 2 * 512 == plan.max_live_bytes
    assert plan.naive_bytes == 3 * 512  # the view needs no space, even in the naive sum
    check_plan(g)


def test_a_reshape_that_must_copy_gets_its_own_buffer():
    g, plan = planned("""graph @f(%x: f32[4,6]) -> (f32[24], f32[24]) {
  %0: f32[4,6] = exp(%x)
  %1: f32[6,4] = permute[dims=(1, 0)](%0)
  %2: f32[24] = reshape[shape=(24,)](%1)
  %3: f32[24] = reshape[shape=(24,)](%0)
  return (%2, %3)
}""")
    assert plan.views == {"1": "0", "3": "0"}  # a transposed array cannot be flattened as a view
    assert plan.buffer_of["2"] == "2" and plan.buffer_of["3"] == "0"
    check_plan(g)


@pytest.mark.parametrize("body, why", [
    ("%1: f32[8,16] = add(%0, %b)\n  %2: f32[8,16] = mul(%1, %0)", "read later"),
    ("%1: f32[8,16] = add(%x, %b)\n  %2: f32[8,16] = mul(%1, %0)", "input is a graph input"),
    ("%1: bool[8,16] = gt(%0, %b)\n  %2: bool[8,16] = logical_not(%1)", "element size differs"),
    ("%1: f32[8,16] = add(%0, %b)\n  %2: f32[8,16] = exp(%1)", "output: never overwritten"),
])
def test_no_inplace_where_it_would_be_unsafe(body, why):
    outputs = "%2, %0" if "output" in why else "%2"
    types = "bool[8,16]" if "bool" in body else "f32[8,16]"
    text = (f"graph @f(%x: f32[8,16], %b: f32[16]) -> ({types}"
            f"{', f32[8,16]' if 'output' in why else ''}) {{\n"
            f"  %0: f32[8,16] = exp(%x)\n  {body}\n  return ({outputs})\n}}")
    g, plan = planned(text)
    assert "1" not in plan.inplace, why
    check_plan(g)


def test_no_inplace_through_another_alias_of_the_dying_input():
    g, plan = planned("""graph @f(%x: f32[8,8]) -> (f32[8,8]) {
  %0: f32[8,8] = exp(%x)
  %1: f32[8,8] = permute[dims=(1, 0)](%0)
  %2: f32[8,8] = add(%0, %1)
  return (%2)
}""")
    assert plan.inplace == {}  # out[i,j] = x[i,j] + x[j,i]: writing in place would be wrong
    check_plan(g)


def test_fused_elementwise_body_reuses_in_place_but_a_reduction_does_not():
    g, plan = planned("""graph @f(%x: f32[8,16], %b: f32[16]) -> (f32[8,16], f32[8,1]) {
  %0: f32[8,16] = exp(%x)
  %1: f32[8,16] = fused[body=(("add", (0, 1), ()), ("relu", (2,), ())), outputs=(3,)](%0, %b)
  %2: f32[8,16] = exp(%1)
  %3: f32[8,16], %4: f32[8,1] = fused[body=(("neg", (0,), ()), ("reduce_sum", (1,), (("axes", (1,)), ("keepdim", true)))), outputs=(1, 2)](%2)
  return (%3, %4)
}""")  # noqa: E501
    assert plan.inplace == {"1": "0", "2": "1"}  # exp is elementwise too: one buffer for all
    assert plan.buffer_of["2"] == "0" and "3" not in plan.inplace
    check_plan(g)


UPDATE = """graph @sgd(%w: f32[64], %g: f32[64]) -> (f32[]) {
  %0: f32[64] = exp(%g)
  %1: f32[64] = sub(%w, %0)
  %2: f32[] = reduce_sum[axes=(0,), keepdim=false](%0)
  %w <- %1
  return (%2)
}"""


def test_an_update_is_computed_into_its_input_when_that_is_read_last_there():
    g, plan = planned(UPDATE)
    assert plan.in_input == {"1": "w"} and "1" not in plan.buffer_of
    check_plan(g)
    later = UPDATE.replace("(%0)\n", "(%w)\n")  # the sum now reads %w after the sub
    g, plan = planned(later)
    assert plan.in_input == {} and "1" in plan.buffer_of  # in the arena (in place into %0)
    check_plan(g)
    returned = UPDATE.replace("-> (f32[])", "-> (f32[], f32[64])").replace("(%2)\n", "(%2, %1)\n")
    assert planned(returned)[1].in_input == {}  # an output must not alias the input


def test_effectful_ops_keep_their_order_and_the_schedule_is_topological():
    def f(x):
        a = F.dropout(x * 3, 0.5, training=True)
        b = F.dropout(x * 2, 0.3, training=True)
        return (a + b).relu()

    g0 = graphc.trace(f, graphc.randn(4, 8))
    g = plan_buffers(parse(str(g0)))
    order = [n.attrs["p"] for n in g.nodes if n.op == "dropout"]
    assert order == [0.5, 0.3]
    check_plan(g)


# ---- the models -------------------------------------------------------------------------------
def lenet5():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(),
                         nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


@functools.cache
def model_text(model: str, kind: str) -> str:
    """IR text of a joint forward+backward graph ("joint") or an SGD-momentum step ("step")."""
    graphc.manual_seed(0)
    net = {"lenet": lenet5, "mlp": mlp}[model]()
    params = list(net.parameters())
    momenta = [graphc.zeros_like(p) for p in params]

    def joint(x, y):
        loss = F.cross_entropy(net(x), y)
        return (loss, *graphc.autograd.grad(loss, params))

    def step(x, y):
        loss = F.cross_entropy(net(x), y)
        grads = graphc.autograd.grad(loss, params)
        with graphc.no_grad():
            for p, m, g in zip(params, momenta, grads):
                m.mul_(0.9).add_(g)
                p.sub_(m * 0.05)
        return loss

    x, y = graphc.randn(64, 1, 28, 28), graphc.randint(0, 10, (64,))
    return str(trace_call(joint if kind == "joint" else step, (x, y)).graph)


def example_inputs(graph, rng) -> list[np.ndarray]:
    out = []
    for v in graph.inputs:
        if v.type.dtype.name == "int64":
            out.append(rng.integers(0, 10, v.type.shape).astype(np.int64))
        else:
            out.append(rng.standard_normal(v.type.shape).astype(v.type.dtype.np) * 0.1)
    return out


GRAPHS = [(m, k, f) for m in ("mlp", "lenet") for k in ("joint", "step") for f in (0, 1)]
IDS = [f"{m}-{k}{'-fused' if f else ''}" for m, k, f in GRAPHS]


def plan_model(model: str, kind: str, fused: bool):
    graph, _ = run_pipeline(parse(model_text(model, kind)),
                            [fuse, plan_buffers] if fused else [plan_buffers])
    return graph, graph.meta["memory_plan"]


@pytest.mark.parametrize("model, kind, fused", GRAPHS, ids=IDS)
def test_model_plans_keep_every_invariant(model, kind, fused):
    g, plan = plan_model(model, kind, fused)
    check_plan(g)
    # and once more here, from scratch: all pairs of buffers live at a common step
    step = {v: s for s, n in enumerate(g.nodes) for v in n.outputs}
    assert all(step[v] < s for s, n in enumerate(g.nodes) for v in n.inputs if v in step)
    bufs = list(plan.buffers.values())
    for b in bufs:
        assert b.offset % ALIGN == 0 and b.offset + b.size <= plan.arena_bytes
    for i, a in enumerate(bufs):
        for b in bufs[i + 1:]:
            if a.start <= b.end and b.start <= a.end:
                assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset, \
                    (a, b)
    assert plan.views and (plan.inplace or fused)


@pytest.mark.parametrize("model, kind, fused", GRAPHS, ids=IDS)
def test_model_arena_against_the_bounds(model, kind, fused):
    g, plan = plan_model(model, kind, fused)
    arena, live, naive = plan.arena_bytes, plan.max_live_bytes, plan.naive_bytes
    assert live <= arena <= 1.10 * live, plan.report
    if (model, kind) == ("mlp", "joint"):
        # the gradients are outputs, live to the end, and are most of what the graph makes:
        # no arena can be half the naive sum here (the training steps below do reach it)
        kept = sum(b.size for b in plan.buffers.values() if b.kept)
        assert kept > 0.5 * naive, plan.report
    else:
        assert arena <= 0.5 * naive, plan.report


def test_planning_is_deterministic_and_fast():
    import time

    start = time.perf_counter()
    a = plan_model("lenet", "step", False)[1]
    seconds = time.perf_counter() - start
    b = plan_model("lenet", "step", False)[1]
    assert [n.outputs[0].name for n in a.schedule] == [n.outputs[0].name for n in b.schedule]
    assert a.offsets == b.offsets and a.arena_bytes == b.arena_bytes
    assert seconds < 2.0


def run_in_arena(graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run `graph` with every intermediate stored where the plan puts it, in one arena."""
    plan = graph.meta["memory_plan"]
    arena = np.full(plan.arena_bytes, 0xFF, np.uint8)  # NaN wherever nothing was written
    env = {v: a.copy() for v, a in zip(graph.inputs, inputs)}
    by_name = {v.name: v for v in graph.inputs}
    interp = Interpreter(graph)
    for node in graph.nodes:
        results = interp.run_node(node, [env[v] for v in node.inputs])
        for v, r in zip(node.outputs, results):
            if v.name in plan.views:
                assert np.shares_memory(r, env[node.inputs[0]]), f"%{v.name} is no view"
                env[v] = r
                continue
            if v.name in plan.in_input:
                slot = env[by_name[plan.in_input[v.name]]]
            else:
                off = plan.offset(v.name)
                slot = arena[off:off + v.type.nbytes].view(v.type.dtype.np).reshape(
                    v.type.shape)
            slot[...] = r
            env[v] = slot
    return [env[v].copy() for v in graph.outputs] + [env[v].copy() for _, v in graph.updates]


@pytest.mark.parametrize("model, kind, fused", GRAPHS, ids=IDS)
def test_model_runs_the_same_in_the_planned_schedule_and_arena(model, kind, fused, rng):
    original = parse(model_text(model, kind))
    g, plan = plan_model(model, kind, fused)
    inputs = example_inputs(original, rng)
    expected = run(original, *inputs)
    scheduled = run(g, *inputs)  # the interpreter in the planned order
    in_arena = run_in_arena(g, inputs)
    for e, s, a in zip(expected, scheduled, in_arena):
        np.testing.assert_allclose(s, e, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(a, s)


def test_check_plan_catches_a_broken_plan():
    g, plan = planned(CHAIN)
    plan.buffers["3"].offset = plan.buffers["0"].offset  # live together at step 3
    with pytest.raises(PlanError, match="live together and overlap"):
        check_plan(g)
    g, plan = planned(CHAIN)
    plan.buffers["3"].offset += 8
    with pytest.raises(PlanError, match="misaligned"):
        check_plan(g)
    g, plan = planned(CHAIN)
    plan.buffers["0"].end = 2  # the relu still reads the view at step 3
    with pytest.raises(PlanError, match="outside its buffer"):
        check_plan(g)
    g, plan = planned("""graph @f(%x: f32[8]) -> (f32[8]) {
  %0: f32[8] = exp(%x)
  %1: f32[8] = neg(%0)
  %2: f32[8] = mul(%1, %0)
  return (%2)
}""")
    plan.inplace["1"] = "0"  # pretend %1 overwrote %0, which the mul still reads
    plan.buffer_of["1"] = "0"
    with pytest.raises(PlanError, match="not read last"):
        check_plan(g)


# ---- report, table and picture ------------------------------------------------------------
def test_report_and_lifetime_table():
    g, plan = plan_model("mlp", "step", True)
    assert f"Arena {plan.arena_bytes / 1024:.1f} KiB" in plan.report
    assert "max-live lower bound" in plan.report and "naive sum" in plan.report
    rows = plan.table.splitlines()
    assert len([r for r in rows if r.startswith("%")]) == len(plan.buffers)
    assert "computed into their inputs" in rows[-1]
    assert str(plan).startswith(plan.report)


def test_memory_picture_is_written_as_png_and_svg(tmp_path):
    _, plan = plan_model("lenet", "joint", False)
    render_memory(plan, tmp_path / "mem.png")
    assert (tmp_path / "mem.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    render_memory(plan, tmp_path / "mem.svg")
    root = ET.fromstring((tmp_path / "mem.svg").read_text())
    assert root.tag.endswith("svg")
    assert "memory plan @" in (tmp_path / "mem.svg").read_text()
    with pytest.raises(ValueError, match="png or .svg"):
        render_memory(plan, tmp_path / "mem.jpg")


# ---- bad IR is rejected before planning -----------------------------------------------------
@pytest.mark.parametrize("old, new, message", [
    ("%1: f32[8,16] = add(%0, %b)", "%1: f32[8,8] = add(%0, %b)", r"add at .*output types"),
    ("%1: f32[8,16] = add(%0, %b)", "%1: f32[8,16] = add(%9, %b)", r"%9 is used before"),
    ("  return (%3)", "  %x <- %0\n  %x <- %1\n  return (%3)", r"updated twice"),
])
def test_bad_ir_is_rejected_by_the_pipeline_verifier(old, new, message):
    with pytest.raises((VerifyError, Exception), match=message):
        run_pipeline(parse(CHAIN.replace(old, new)), [plan_buffers])
