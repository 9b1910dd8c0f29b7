"""graphc.passes.fuse_rows (row programs: a LayerNorm forward or backward, a softmax backward
as one fused node), graphc.passes.row_recompute (readers recompute a LayerNorm's centred
and normalised values) and their cpu lowering (graphc.backends.cpu.rows.lower_row_program).

IR in, IR out for the passes; compiled against the interpreter and, for training steps,
within rounding of a float64 run (docs/performance.md, `## Rounding`: the row sums are
vectorised, so they reassociate)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
import graphc.optim as optim
from graphc.backends import compile as compile_graph
from graphc.ir import parse
from graphc.ops.fused import FusedBody
from graphc.passes import default_passes, run_pipeline
from graphc.passes.fuse import fuse
from graphc.passes.fuse_rows import fuse_rows, is_row_program
from graphc.passes.row_recompute import recompute_row_values
from graphc.testing import assert_rounding_within

LAYER_NORM = '''graph @ln(%x: f32[6,5,16], %w: f32[16], %b: f32[16])
    -> (f32[6,5,16], f32[6,5,16], f32[6,5,1]) {
  %0: f32[6,5,1] = reduce_mean[axes=(2,), keepdim=true](%x)
  %1: f32[6,5,16] = sub(%x, %0)
  %2: f32[6,5,16] = mul(%1, %1)
  %3: f32[6,5,1] = reduce_mean[axes=(2,), keepdim=true](%2)
  %4: f32[] = full[shape=(), value=1e-05, dtype="float32"]()
  %5: f32[6,5,1] = add(%3, %4)
  %6: f32[6,5,1] = rsqrt(%5)
  %7: f32[6,5,16] = mul(%1, %6)
  %8: f32[6,5,16] = mul(%7, %w)
  %9: f32[6,5,16] = add(%8, %b)
  return (%9, %1, %6)
}'''

SOFTMAX_BACKWARD = '''graph @sb(%g: f32[3,4,8,8], %y: f32[3,4,8,8], %keep: bool[8,8])
    -> (f32[3,4,8,8]) {
  %0: f32[3,4,8,8] = mul(%g, %y)
  %1: f32[3,4,8,1] = reduce_sum[axes=(3,), keepdim=true](%0)
  %2: f32[3,4,8,8] = sub(%g, %1)
  %3: f32[3,4,8,8] = mul(%y, %2)
  %4: f32[] = full[shape=(), value=0.0, dtype="float32"]()
  %5: f32[3,4,8,8] = where(%keep, %3, %4)
  return (%5)
}'''

# a LayerNorm backward's row part and its weight and bias gradients (column sums)
LAYER_NORM_BACKWARD = '''graph @lnb(%g: f32[12,16], %w: f32[16], %xhat: f32[12,16], %r: f32[12,1])
    -> (f32[12,16], f32[16], f32[16]) {
  %0: f32[12,16] = mul(%g, %w)
  %1: f32[12,1] = reduce_mean[axes=(1,), keepdim=true](%0)
  %2: f32[12,16] = mul(%0, %xhat)
  %3: f32[12,1] = reduce_mean[axes=(1,), keepdim=true](%2)
  %4: f32[12,16] = sub(%0, %1)
  %5: f32[12,16] = mul(%xhat, %3)
  %6: f32[12,16] = sub(%4, %5)
  %7: f32[12,16] = mul(%6, %r)
  %8: f32[12,16] = mul(%g, %xhat)
  %9: f32[16] = reduce_sum[axes=(0,), keepdim=false](%8)
  %10: f32[16] = reduce_sum[axes=(0,), keepdim=false](%g)
  return (%7, %9, %10)
}'''


def _arrays(graph, rng):
    out = []
    for v in graph.inputs:
        shape = tuple(v.type.shape)
        if v.type.dtype.name == "bool":
            out.append(rng.random(shape) < 0.7)
        else:
            out.append(rng.standard_normal(shape).astype(np.float32))
    return out


def _row_programs(graph):
    return [n for n in graph.nodes if n.op == "fused" and is_row_program(FusedBody.of_node(n))]


@pytest.mark.parametrize("text", [LAYER_NORM, SOFTMAX_BACKWARD, LAYER_NORM_BACKWARD],
                         ids=["layer_norm", "softmax_backward", "layer_norm_backward"])
def test_one_row_program_matches_the_interpreter(text, rng):
    graph = parse(text)
    rows = fuse_rows(fuse(graph))
    assert len(_row_programs(rows)) == 1
    assert [n.op for n in rows.nodes if n.op not in ("full",)] == ["fused"]
    assert rows.meta["fuse_rows"][0]["members"] >= 2
    assert parse(str(rows)) == rows  # the IR text round-trips
    args = _arrays(graph, rng)
    expected = compile_graph(graph, "interp").run(*args)
    for backend in ("interp", "cpu"):
        got = compile_graph(rows, backend).run(*args)
        for a, e in zip(got, expected):
            np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-6)


def test_the_layer_norm_forward_keeps_its_outputs_by_name():
    graph = parse(LAYER_NORM)
    rows = fuse_rows(fuse(graph))
    (program,) = _row_programs(rows)
    assert {v.name for v in program.outputs} == {"9", "1", "6"}
    ops = [op for op, _, _ in program.attrs["body"]]
    assert ops.count("reduce_mean") == 2 and ops[-1] == "add"


def test_a_merge_that_would_make_a_cycle_is_refused(rng):
    """The add reads the centred values directly and through a matmul of them (a GEMM
    without an epilogue: its result has two readers): joining the row group would make the
    group read its own output through the matmul."""
    graph = parse('''graph @c(%x: f32[8,8]) -> (f32[8,8], f32[8,8]) {
  %0: f32[8,1] = reduce_sum[axes=(1,), keepdim=true](%x)
  %1: f32[8,8] = sub(%x, %0)
  %2: f32[8,8] = matmul(%1, %x)
  %3: f32[8,8] = add(%1, %2)
  %4: f32[8,8] = mul(%2, %2)
  return (%3, %4)
}''')
    rows = fuse_rows(fuse(graph))
    (program,) = _row_programs(rows)
    assert [op for op, _, _ in program.attrs["body"]] == ["reduce_sum", "sub"]
    ops = [n.op for n in rows.nodes]
    assert ops.index("matmul") > ops.index("fused") and len(ops) == 4
    args = _arrays(graph, rng)
    for a, e in zip(compile_graph(rows, "cpu").run(*args),
                    compile_graph(graph, "interp").run(*args)):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


def test_a_broadcast_read_outside_stays_a_view():
    graph = parse('''graph @v(%x: f32[4,8]) -> (f32[4,8], f32[4,8]) {
  %0: f32[4,1] = reduce_mean[axes=(1,), keepdim=true](%x)
  %1: f32[4,8] = broadcast_to[shape=(4, 8)](%0)
  %2: f32[4,8] = sub(%x, %1)
  return (%2, %1)
}''')
    rows = fuse_rows(fuse(graph))
    (program,) = _row_programs(rows)
    assert sorted(str(v.type) for v in program.outputs) == ["f32[4,1]", "f32[4,8]"]
    assert rows.nodes[-1].op == "broadcast_to" and rows.nodes[-1].outputs[0].name == "1"


def test_readers_recompute_the_centred_values():
    """The backward reads x and the row mean instead of the centred values, which the
    forward no longer writes."""
    graph = parse('''graph @r(%x: f32[4,8], %g: f32[8,8]) -> (f32[4,8], f32[8]) {
  %0: f32[4,1] = reduce_mean[axes=(1,), keepdim=true](%x)
  %1: f32[4,8] = sub(%x, %0)
  %2: f32[4,8] = mul(%1, %1)
  %3: f32[4,1] = reduce_mean[axes=(1,), keepdim=true](%2)
  %4: f32[4,8] = mul(%1, %3)
  %5: f32[4,8] = matmul(%4, %g)
  %6: f32[4,8] = mul(%5, %1)
  %7: f32[8] = reduce_sum[axes=(0,), keepdim=false](%6)
  return (%4, %7)
}''')
    rows = fuse_rows(fuse(graph))
    (forward,) = _row_programs(rows)
    assert "1" in {v.name for v in forward.outputs}
    out = recompute_row_values(rows)
    (forward,) = _row_programs(out)
    assert "1" not in {v.name for v in forward.outputs}
    assert not any(v.name == "1" for n in out.nodes for v in n.inputs)
    (epilogue,) = [n for n in out.nodes if n is not forward and "x" in
                   {v.name for v in n.inputs}]  # the GEMM epilogue: mul(x @ g, x - mean)
    assert FusedBody.of_node(epilogue).anchor.op == "matmul"
    args = _arrays(graph, np.random.default_rng(3))
    for a, e in zip(compile_graph(out, "cpu").run(*args),
                    compile_graph(rows, "cpu").run(*args)):
        # the same operations on the same inputs, but a recomputed product may be contracted
        # into the FMA of the sum that reads it (one rounding fewer)
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


def test_symbolic_rows_are_left_alone():
    graph = parse('''graph @s(%x: f32[s0,8]) -> (f32[s0,8]) {
  %0: f32[s0,1] = reduce_mean[axes=(1,), keepdim=true](%x)
  %1: f32[s0,8] = sub(%x, %0)
  return (%1)
}''')
    assert not _row_programs(fuse_rows(fuse(graph)))


def test_integer_rows_are_left_alone():
    graph = parse('''graph @i(%x: i64[4,8]) -> (i64[4,8]) {
  %0: i64[4,1] = reduce_sum[axes=(1,), keepdim=true](%x)
  %1: i64[4,8] = sub(%x, %0)
  return (%1)
}''')
    assert not _row_programs(fuse_rows(fuse(graph)))


class _Block(nn.Module):
    """Pre-norm attention and MLP, with nn.LayerNorm or F.layer_norm."""

    def __init__(self, functional: bool, dtype) -> None:
        super().__init__()
        self.functional = functional
        self.norm1, self.norm2 = nn.LayerNorm(16), nn.LayerNorm(16)
        self.qkv, self.proj = nn.Linear(16, 48), nn.Linear(16, 16)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.head = nn.Linear(16, 7)
        self.to(dtype)

    def norm(self, module, x):
        if self.functional:
            return F.layer_norm(x, (16,), module.weight, module.bias, 1e-5)
        return module(x)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm(self.norm1, x)).split(c, dim=-1)
        heads = [z.reshape(b, t, 2, 8).transpose(1, 2) for z in (q, k, v)]
        att = F.scaled_dot_product_attention(*heads, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        x = x + self.mlp(self.norm(self.norm2, x))
        return self.head(x).reshape(-1, 7)


@pytest.mark.parametrize("functional", [False, True], ids=["nn.LayerNorm", "F.layer_norm"])
def test_a_transformer_step_within_rounding_of_float64(functional, rng):
    """Three SGD-momentum steps: losses, weights and .grads of the compiled step (row
    programs in its graph) are as close to a float64 run as eager graphc's."""
    x = rng.standard_normal((4, 12, 16))
    y = rng.integers(0, 7, 48)
    results, graphs = {}, []
    for name, dtype, compiled in (("eager", graphc.float32, False),
                                  ("compiled", graphc.float32, True),
                                  ("reference", graphc.float64, False)):
        graphc.manual_seed(0)
        model = _Block(functional, dtype)
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
            graphs.append(fn.executable.graph)
        results[name] = [np.array(losses)] + [p.detach().numpy().copy()
                                              for p in model.parameters()] + \
            [p.grad.numpy().copy() for p in model.parameters()]
    programs = _row_programs(graphs[0])
    assert len(programs) >= 5  # two LayerNorms forward and backward, a softmax backward
    for got, eager, reference in zip(results["compiled"], results["eager"],
                                     results["reference"]):
        assert_rounding_within(got, eager, reference)


def test_only_the_cpu_pipeline_makes_row_programs():
    names = [p.__name__ for p in default_passes(None, "cpu")]
    assert names.index("fuse") < names.index("fuse_rows") < names.index("plan_buffers")
    assert "fuse_rows" not in [p.__name__ for p in default_passes(None, "cuda")]
    assert "fuse_rows" not in [p.__name__ for p in default_passes(None)]


def test_a_strided_input_row_program(rng):
    """F.layer_norm of a transposed view: the row program reads its input with strides."""
    w, b = graphc.randn(8), graphc.randn(8)

    def f(x):
        return F.layer_norm(x.transpose(0, 1), (8,), w, b) * 2.0

    x = graphc.tensor(rng.standard_normal((5, 3, 8)).astype(np.float32))
    got = graphc.compile(f, backend="cpu")(x).numpy()
    np.testing.assert_allclose(got, f(x).numpy(), rtol=1e-5, atol=1e-5)


def test_run_pipeline_verifies_every_stage_of_a_layer_norm_step(rng):
    graph = parse(LAYER_NORM)
    out, report = run_pipeline(graph, default_passes(graph, "cpu"))
    assert [r.name for r in report.records][-11:] == ["fuse", "fuse_batch_norm_relu",
                                                       "fuse_conv_channel_sums", "fuse_rows",
                                                       "recompute_row_values", "fuse_rows",
                                                       "merge_sibling_sums",
                                                       "fuse_batch_norm_backward",
                                                       "fuse_gemm_column_sums",
                                                       "lay_out_gemm_outputs", "plan_buffers"]
    args = _arrays(graph, rng)
    expected = compile_graph(graph, "interp").run(*args)
    for a, e in zip(compile_graph(out, "cpu").run(*args), expected):
        np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-6)


def test_two_threads_split_the_rows_and_give_the_same_values(rng):
    """A row program without column sums is split over the threads by rows: each row is
    computed by the same code, so two threads give one thread's values bit for bit."""
    from graphc.backends.cpu import threads
    from graphc.backends.cpu.threads import ThreadChooser

    if threads.most_threads() < 2:
        pytest.skip("one core: the kernels never run on two threads")
    w, b = graphc.randn(64), graphc.randn(64)

    def f(x):
        return F.layer_norm(x, (64,), w, b)

    compiled = graphc.compile(f, backend="cpu")
    x = graphc.tensor(rng.standard_normal((2048, 64)).astype(np.float32))  # past
    compiled(x)  # graphc.backends.cpu.kernels.PARALLEL_MIN_ELEMENTS: a parallel kernel
    assert _row_programs(compiled.executable.graph)
    assert ".omp" in compiled.executable.lowered.ir_text
    results = []
    for fixed in (1, 2):
        compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=fixed)
        results.append(compiled(x).numpy())
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_allclose(results[0], f(x).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm", ["rms_norm", "group_norm"])
def test_other_norms_make_row_programs_within_rounding(norm, rng):
    """F.rms_norm and F.group_norm (a row of C/G * H * W elements per group), forward and
    backward: the compiled gradients are as close to float64 as eager graphc's."""
    x = rng.standard_normal((4, 8, 5, 6))
    results, graphs = {}, []
    for name, dtype, compiled in (("eager", graphc.float32, False),
                                  ("compiled", graphc.float32, True),
                                  ("reference", graphc.float64, False)):
        np_dtype = np.float64 if dtype is graphc.float64 else np.float32
        w = graphc.tensor(np.linspace(0.5, 1.5, 8 if norm == "group_norm" else 6)
                          .astype(np_dtype), requires_grad=True)
        xs = graphc.tensor(x.astype(np_dtype), requires_grad=True)

        def step(xs, w):
            if norm == "group_norm":
                y = F.group_norm(xs, 2, w, None, 1e-5)
            else:
                y = F.rms_norm(xs, (6,), w, 1e-6)
            loss = (y * y.tanh()).sum()
            loss.backward()
            return loss.detach()

        fn = graphc.compile(step, backend="cpu") if compiled else step
        for _ in range(2):
            xs.grad = w.grad = None
            loss = fn(xs, w)
        if compiled:
            graphs.append(fn.executable.graph)
        results[name] = [loss.numpy(), xs.grad.numpy().copy(), w.grad.numpy().copy()]
    assert _row_programs(graphs[0])
    for got, eager, reference in zip(results["compiled"], results["eager"],
                                     results["reference"]):
        assert_rounding_within(got, eager, reference)


def test_a_gemm_epilogue_stops_writing_what_the_row_program_can_recompute(rng):
    """A LayerNorm backward whose first products landed in the GEMM epilogue (g * w,
    x-hat, g * w * x-hat): the row program recomputes them from g, x and the per-row
    scalars, so the epilogue writes g alone."""
    graph = parse('''graph @e(%a: f32[8,16], %w2: f32[16,16], %x: f32[8,16], %w: f32[16],
        %mean: f32[8,1], %rstd: f32[8,1]) -> (f32[8,16], f32[8,16]) {
  %0: f32[8,16] = matmul(%a, %w2)
  %1: f32[8,16] = add(%0, %x)
  %2: f32[8,16] = sub(%x, %mean)
  %3: f32[8,16] = mul(%2, %rstd)
  %4: f32[8,16] = mul(%1, %w)
  %5: f32[8,16] = mul(%4, %3)
  %6: f32[8,1] = reduce_sum[axes=(1,), keepdim=true](%5)
  %7: f32[8,16] = mul(%3, %6)
  %8: f32[8,16] = sub(%4, %7)
  return (%1, %8)
}''')
    before = fuse_rows(fuse(graph))
    (epilogue,) = [n for n in before.nodes if n.op == "fused"
                   and FusedBody.of_node(n).anchor is not None]
    assert len(epilogue.outputs) > 1
    out = recompute_row_values(before)
    (epilogue,) = [n for n in out.nodes if n.op == "fused"
                   and FusedBody.of_node(n).anchor is not None]
    assert [v.name for v in epilogue.outputs] == ["1"]
    args = _arrays(graph, rng)
    for got, want in zip(compile_graph(out, "cpu").run(*args),
                         compile_graph(before, "cpu").run(*args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_producer_its_readers_wholly_recompute_is_dropped(rng):
    """A scaled bias read only by a GEMM epilogue (`gelu(x @ w.t() + b.reshape(4, 1, 1) *
    0.1)`): the epilogue recomputes it, and the producer, left with no output, goes (it
    once stayed as a node with no outputs, and lowering it raised IndexError)."""
    graph = parse('''graph @g(%x: f32[4,8,16], %w: f32[16,16], %b: f32[4]) -> (f32[4,8,16]) {
  %0: f32[4,8,16] = matmul(%x, %w)
  %1: f32[4,1,1] = reshape[shape=(4, 1, 1)](%b)
  %2: f32[] = full[shape=(), value=0.1, dtype="float32"]()
  %3: f32[4,1,1] = mul(%1, %2)
  %4: f32[4,8,16] = add(%0, %3)
  %5: f32[4,8,16] = gelu[approximate="none"](%4)
  return (%5)
}''')
    before = fuse_rows(fuse(graph))
    out = recompute_row_values(before)
    assert all(n.outputs for n in out.nodes)
    assert len(out.nodes) == len(before.nodes) - 1
    args = _arrays(graph, rng)
    (got,) = compile_graph(out, "cpu").run(*args)
    (want,) = compile_graph(graph, "interp").run(*args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_module_whose_scaled_bias_feeds_a_gelu_compiles(rng):
    x = graphc.tensor(rng.standard_normal((4, 8, 16)).astype(np.float32))
    w = graphc.tensor(rng.standard_normal((16, 16)).astype(np.float32))
    b = graphc.tensor(rng.standard_normal(4).astype(np.float32))

    def f(x, w, b):
        return F.gelu(x @ w.t() + b.reshape(4, 1, 1) * 0.1)

    np.testing.assert_allclose(graphc.compile(f)(x, w, b).numpy(), f(x, w, b).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_a_column_sum_the_group_reads_does_not_join_it(rng):
    """`y = (x - mean) * sum(x, 0)`: the column sum reads x, as the row group does, but the
    group reads the sum, which is complete only after the last row: it stays apart."""
    graph = parse('''graph @s(%x: f32[6,8]) -> (f32[6,8]) {
  %0: f32[8] = reduce_sum[axes=(0,), keepdim=false](%x)
  %1: f32[6,1] = reduce_mean[axes=(1,), keepdim=true](%x)
  %2: f32[6,8] = sub(%x, %1)
  %3: f32[6,8] = mul(%2, %0)
  return (%3)
}''')
    rows = fuse_rows(fuse(graph))
    (program,) = _row_programs(rows)
    assert "reduce_sum" not in [op for op, _, _ in program.attrs["body"]]
    args = _arrays(graph, rng)
    np.testing.assert_allclose(compile_graph(rows, "cpu").run(*args)[0],
                               compile_graph(graph, "interp").run(*args)[0], rtol=1e-5,
                               atol=1e-5)


def test_two_groups_do_not_merge_when_one_reads_the_others_column_sum(rng):
    """The last add reads both row groups (the one of z first), but the group of z reads
    the column sum of x's: merged, it would read that sum half made: the groups stay two."""
    graph = parse('''graph @t(%x: f32[6,8], %z: f32[6,8]) -> (f32[6,1], f32[8]) {
  %0: f32[6,1] = reduce_mean[axes=(1,), keepdim=true](%x)
  %1: f32[6,8] = sub(%x, %0)
  %2: f32[8] = reduce_sum[axes=(0,), keepdim=false](%1)
  %3: f32[6,1] = reduce_mean[axes=(1,), keepdim=true](%z)
  %4: f32[6,8] = sub(%z, %3)
  %5: f32[6,8] = mul(%4, %2)
  %7: f32[6,1] = reduce_mean[axes=(1,), keepdim=true](%5)
  %8: f32[6,8] = mul(%1, %1)
  %9: f32[6,1] = reduce_mean[axes=(1,), keepdim=true](%8)
  %6: f32[6,1] = add(%7, %9)
  return (%6, %2)
}''')
    rows = fuse_rows(fuse(graph))
    assert len(_row_programs(rows)) == 2
    args = _arrays(graph, rng)
    for got, want in zip(compile_graph(rows, "cpu").run(*args),
                         compile_graph(graph, "interp").run(*args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_output_planned_in_place_of_an_input(rng):
    """The row program writes %5 over %0's buffer (a GEMM's result that dies there); %6
    still reads %0 at the same element after %5 is computed: every element of a row is read
    before any is written."""
    graph = parse('''graph @p(%a: f32[8,16], %w: f32[16,32], %z: f32[8,32], %v: f32[32,4])
    -> (f32[8,4], f32[8,4]) {
  %0: f32[8,32] = matmul(%a, %w)
  %1: f32[8,1] = reduce_mean[axes=(1,), keepdim=true](%0)
  %5: f32[8,32] = mul(%z, %1)
  %6: f32[8,32] = sub(%0, %1)
  %7: f32[8,4] = matmul(%5, %v)
  %8: f32[8,4] = matmul(%6, %v)
  return (%7, %8)
}''')
    rows = fuse_rows(fuse(graph))
    (program,) = _row_programs(rows)
    assert [v.name for v in program.inputs] == ["0", "z"]
    assert [v.name for v in program.outputs] == ["5", "6"]
    from graphc.passes.plan import plan_buffers

    planned = plan_buffers(rows)
    assert planned.meta["memory_plan"].inplace.get("5") == "0"
    args = _arrays(graph, rng)
    for got, want in zip(compile_graph(planned, "cpu").run(*args),
                         compile_graph(graph, "interp").run(*args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
