"""graphc.profile of a compiled callable with symbolic sizes (graphc.compile(dynamic=True),
or a dimension made dynamic after a recompile): it profiles the executable that serves the
call at that call's sizes (the runtime-sized one, or the graph specialised to the sizes where
the cpu backend compiles per size), with the rows' shapes, bytes and GFLOP/s at those sizes;
the model does not move and nothing traces again."""

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="graphc.profile times the cpu backend's kernels")

import graphc  # noqa: E402
import graphc.backends  # noqa: E402
import graphc.nn as nn  # noqa: E402
from tests.conftest import sgd_training_step  # noqa: E402


def _dynamic_step():
    model, step = sgd_training_step(
        lambda: nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4)), lr=0.1)
    return model, graphc.compile(step, backend="cpu", dynamic=True)


def _batch(n: int):
    return graphc.randn(n, 12), graphc.randint(0, 4, (n,))


def _check_report(report, model, step, batch: int, before) -> None:
    after = [p.detach().numpy() for p in model.parameters()]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert len(step.graphs) == 1 and "s0" in str(step.graphs[0].inputs[0].type)
    assert report.total > 0 and report.rows
    first_gemm = [r for r in report.rows if r.op.startswith("fused(matmul,add,relu")]
    assert first_gemm and first_gemm[0].shape.startswith(f"f32[{batch},16]")
    assert first_gemm[0].flops == 2 * batch * 12 * 16
    assert first_gemm[0].bytes >= 4 * (batch * 12 + 16 * 12 + batch * 16)
    assert all("s0" not in r.shape for r in report.rows)


@pytest.mark.parametrize("batch", [8, 21])
def test_a_dynamic_step_profiles_at_the_sizes_of_its_call(batch):
    model, step = _dynamic_step()
    step(*_batch(8))  # traced and compiled at 8; the profiled call may bring another size
    assert step.executable.runs_generic  # one runtime-sized executable serves every size
    before = [p.detach().numpy().copy() for p in model.parameters()]
    report = graphc.profile(step, *_batch(batch), repeat=3)
    _check_report(report, model, step, batch, before)
    assert len(report.rows) == len(step.executable.executable_for(
        {"s0": batch}).executable.lowered.kernels)


def test_a_step_compiled_per_size_profiles_the_graph_at_its_sizes(monkeypatch):
    """Where the cpu backend cannot lower the graph once for every size, each size has its
    own executable: the profile is that of the graph specialised to the call's sizes."""
    monkeypatch.setitem(graphc.backends.GENERIC_FACTORIES, "cpu", lambda g, o, h: None)
    model, step = _dynamic_step()
    step(*_batch(8))
    assert not step.executable.runs_generic
    before = [p.detach().numpy().copy() for p in model.parameters()]
    report = graphc.profile(step, *_batch(13), repeat=3)
    _check_report(report, model, step, 13, before)
