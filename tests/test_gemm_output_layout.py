"""lay_out_gemm_outputs (graphc/passes/gemm_output_layout.py): a matmul result merged by
permute + reshape is laid out so that the reshape is a view, and the cpu GEMM writes it
there (rows ldc apart, or transposed as c^T = b^T @ a^T). IR in, layout out; the planned
graph has no copy for the merge; the compiled numbers match the interpreter's, and a
transformer training step is within the float64 rounding rule (docs/performance.md)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
import graphc.optim as optim
from graphc.backends import compile as compile_graph
from graphc.ir import parse
from graphc.passes import default_passes, run_pipeline
from graphc.passes.gemm_output_layout import gemm_writable, lay_out_gemm_outputs
from graphc.passes.plan import PlanError, check_plan, plan_buffers
from graphc.testing import assert_rounding_within

# P @ V per head, merged to (B, T, H*E): the GEMM writes rows H*E apart
HEAD_MERGE = '''graph @merge(%p: f32[2,4,8,8], %v: f32[2,4,8,16], %w: f32[64,5]) -> (f32[2,8,5]) {
  %0: f32[2,4,8,16] = matmul(%p, %v)
  %1: f32[2,8,4,16] = permute[dims=(0, 2, 1, 3)](%0)
  %2: f32[2,8,64] = reshape[shape=(2, 8, 64)](%1)
  %3: f32[2,8,5] = matmul(%2, %w)
  return (%3)
}'''

# a K gradient as (B, H, E, T), merged by permute (0, 3, 1, 2): the GEMM writes columns
K_MERGE = '''graph @kmerge(%q: f32[2,4,16,8], %s: f32[2,4,8,8], %w: f32[64,5]) -> (f32[16,5]) {
  %0: f32[2,4,16,8] = matmul(%q, %s)
  %1: f32[2,8,4,16] = permute[dims=(0, 3, 1, 2)](%0)
  %2: f32[2,8,64] = reshape[shape=(2, 8, 64)](%1)
  %3: f32[16,64] = reshape[shape=(16, 64)](%2)
  %4: f32[16,5] = matmul(%3, %w)
  return (%4)
}'''


# autodiff's dK, (B, H, T, E) transposed to (B, H, E, T) then merged by permute (0, 3, 1, 2):
# laid out for the last permute of the chain, as the head merge's
CHAIN_MERGE = '''graph @chain(%p: f32[2,4,8,8], %v: f32[2,4,8,16], %w: f32[64,5]) -> (f32[2,8,5]) {
  %0: f32[2,4,8,16] = matmul(%p, %v)
  %1: f32[2,4,16,8] = permute[dims=(0, 1, 3, 2)](%0)
  %2: f32[2,8,4,16] = permute[dims=(0, 3, 1, 2)](%1)
  %3: f32[2,8,64] = reshape[shape=(2, 8, 64)](%2)
  %4: f32[2,8,5] = matmul(%3, %w)
  return (%4)
}'''


def _arrays(graph, rng):
    return [rng.standard_normal(tuple(v.type.shape)).astype(np.float32) for v in graph.inputs]


def _copies(graph):
    plan = graph.meta["memory_plan"]
    return [n for n in graph.nodes if n.op in ("reshape", "permute", "copy")
            and n.outputs[0].name not in plan.views]


@pytest.mark.parametrize("text, strides", [(HEAD_MERGE, (512, 16, 64, 1)),
                                           (K_MERGE, (512, 16, 1, 64)),
                                           (CHAIN_MERGE, (512, 16, 64, 1))],
                         ids=["rows", "transposed", "two permutes"])
def test_a_merged_matmul_result_is_laid_out_and_its_reshape_is_a_view(text, strides, rng):
    graph = parse(text)
    laid = plan_buffers(lay_out_gemm_outputs(parse(text)))
    assert laid.meta["root_strides"] == {"0": strides}
    check_plan(laid)
    assert laid.meta["memory_plan"].strides == {"0": strides}
    assert _copies(laid) == []
    assert len(_copies(plan_buffers(parse(text)))) == 1  # row-major: the reshape copies
    args = _arrays(graph, rng)
    expected = compile_graph(graph, "interp").run(*args)
    got = compile_graph(laid, "cpu").run(*args)
    for a, e in zip(got, expected):
        np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("change", ["second reader", "view already", "graph output",
                                    "vector operand"])
def test_what_is_left_row_major(change):
    text = HEAD_MERGE
    if change == "second reader":  # the matmul result is also read as it is
        text = text.replace("  return (%3)", "  %4: f32[2,4,8,16] = neg(%0)\n  return (%3, %4)")
        text = text.replace("-> (f32[2,8,5])", "-> (f32[2,8,5], f32[2,4,8,16])")
    elif change == "view already":  # a permute whose reshape is a view of row-major
        text = text.replace("permute[dims=(0, 2, 1, 3)](%0)", "permute[dims=(0, 1, 2, 3)](%0)")
        text = text.replace("%1: f32[2,8,4,16]", "%1: f32[2,4,8,16]")
    elif change == "graph output":
        text = text.replace("  return (%3)", "  return (%3, %0)")
        text = text.replace("-> (f32[2,8,5])", "-> (f32[2,8,5], f32[2,4,8,16])")
    else:
        text = '''graph @f(%p: f32[2,3,8], %v: f32[8]) -> (f32[6]) {
  %0: f32[2,3] = matmul(%p, %v)
  %1: f32[3,2] = permute[dims=(1, 0)](%0)
  %2: f32[6] = reshape[shape=(6,)](%1)
  return (%2)
}'''
    assert lay_out_gemm_outputs(parse(text)).meta["root_strides"] == {}


def test_gemm_writable():
    assert gemm_writable((4, 8, 16), (512, 64, 1))
    assert gemm_writable((4, 8, 16), (512, 1, 64))
    assert not gemm_writable((4, 8, 16), (512, 32, 2))
    assert not gemm_writable((4, 8, 16), (512, 8, 1))  # rows would overlap


def test_the_plan_refuses_a_layout_that_is_not_dense():
    graph = lay_out_gemm_outputs(parse(HEAD_MERGE))
    graph.meta["root_strides"] = {"0": (512, 16, 32, 1)}
    with pytest.raises(PlanError, match="no dense layout"):
        plan_buffers(graph)


def test_only_the_cpu_pipeline_lays_out_gemm_results():
    names = [p.__name__ for p in default_passes(None, "cpu")]
    assert names[-2:] == ["lay_out_gemm_outputs", "plan_buffers"]
    assert "lay_out_gemm_outputs" not in [p.__name__ for p in default_passes(None, "cuda")]


class _Attention(nn.Module):
    """Self-attention with a causal mask, then a head: every merge of the step is laid out."""

    def __init__(self, dtype) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 7)
        self.to(dtype)

    def forward(self, x, mask):
        y, _ = self.attn(x, x, x, attn_mask=mask, need_weights=False)
        return self.head(F.gelu(y + x)).reshape(-1, 7)


@pytest.mark.parametrize("tokens", [12, 16, 272], ids=["unfused", "one block", "blocked"])
def test_an_attention_training_step_within_rounding_of_float64(rng, tokens):
    """Three SGD-momentum steps: losses, weights and .grads are as close to a float64 run as
    eager graphc's, and the compiled step's head merges are laid out (no copies left). From
    16 tokens attention is fused (graphc.passes.attention: the one-block kernels; at 272
    the blocked ones): its dq, dk and dv are laid out, dk's through its two permutes
    (autodiff's K^T gradient, then the merge)."""
    x = rng.standard_normal((4, tokens, 16))
    y = rng.integers(0, 7, 4 * tokens)
    mask = np.triu(np.full((tokens, tokens), -np.inf), 1)
    results, graphs = {}, []
    for name, dtype, compiled in (("eager", graphc.float32, False),
                                  ("compiled", graphc.float32, True),
                                  ("reference", graphc.float64, False)):
        graphc.manual_seed(0)
        model = _Attention(dtype)
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x, mask, y):
            opt.zero_grad()
            loss = nn.CrossEntropyLoss()(model(x, mask), y)
            loss.backward()
            opt.step()
            return loss.detach()

        fn = graphc.compile(step, backend="cpu") if compiled else step
        np_dtype = np.float64 if dtype is graphc.float64 else np.float32
        args = (graphc.tensor(x.astype(np_dtype)), graphc.tensor(mask.astype(np_dtype)),
                graphc.tensor(y))
        losses = [fn(*args).numpy() for _ in range(3)]
        if compiled:
            graphs.append(fn.optimized_graph)
        results[name] = [np.array(losses)] + [p.detach().numpy().copy()
                                              for p in model.parameters()] + \
            [p.grad.numpy().copy() for p in model.parameters()]
    plan = graphs[0].meta["memory_plan"]
    fused = [n for n in graphs[0].nodes if n.op.startswith("attention")]
    if tokens > 12:  # dq, dk and dv laid out (out is read by a masking `where` first)
        assert [n.op for n in fused] == ["attention", "attention_backward"]
        assert {v.name for v in fused[1].outputs} <= set(plan.strides)
    else:  # P @ V forward, and at least two of dQ, dK, dV
        assert not fused and len(plan.strides) >= 3
    for got, eager, reference in zip(results["compiled"], results["eager"],
                                     results["reference"]):
        assert_rounding_within(got, eager, reference)


def test_a_plan_made_again_from_the_pipeline_cache_keeps_the_layouts(tmp_path, monkeypatch,
                                                                      rng):
    """An executable read back from the pipeline cache plans its graph again on demand
    (graphc.profile, memory_plan): the layouts its code was made with come back with it."""
    from graphc.backends import cache
    from graphc.backends.cpu.executable import CpuExecutable

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("GRAPHC_DUMP", raising=False)
    graph = run_pipeline(parse(HEAD_MERGE), default_passes(None, "cpu"))[0]
    made = CpuExecutable(graph)
    stored = made.sections()
    back = CpuExecutable.from_sections(cache.unpack_sections(cache.pack_sections(stored)))
    assert back.memory_plan.strides == made.memory_plan.strides == {"0": (512, 16, 64, 1)}
    args = _arrays(graph, rng)
    np.testing.assert_array_equal(back.run(*args)[0], made.run(*args)[0])


def test_the_benchmark_runs(capsys, monkeypatch):
    """benchmarks/gemm_neighbours.py at the GPT's smoke size, one round: both variants are
    reported, and the head merges' copies are gone from the "with" one."""
    from benchmarks import gemm_neighbours

    monkeypatch.setenv("GRAPHC_CACHE_DIR", "/nonexistent/before")
    gemm_neighbours.main(["--rounds", "1", "--quick"])
    assert os.environ["GRAPHC_CACHE_DIR"] == "/nonexistent/before"  # one per variant, then back
    out = capsys.readouterr().out
    assert "gpt without the changes: step" in out and "gpt with the changes: step" in out
    with_part = out.split("gpt with the changes")[1].split("kernel time by op")[0]
    assert "reshape" not in with_part
