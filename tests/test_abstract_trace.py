"""Tracing is abstract: no kernel runs, the first compiled call's results and side effects come
from the executable (once), and what needs values is still a TraceError."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.optim as optim
from graphc.errors import TraceError
from graphc.jit.tracer import trace_call
from graphc.ops.registry import OpDef


def _mlp(seed: int = 0):
    graphc.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Dropout(0.25), nn.Linear(5, 3))


def _step_of(model, opt):
    loss_fn = nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _data(rng):
    return (graphc.tensor(rng.standard_normal((4, 6)).astype(np.float32)),
            graphc.tensor(rng.integers(0, 3, 4)))


def _refuse(*args, **kwargs):
    raise AssertionError("a kernel ran")


def test_a_trace_runs_no_kernel(monkeypatch):
    model = _mlp()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = _data(np.random.default_rng(0))
    monkeypatch.setattr(OpDef, "kernel", property(lambda self: _refuse), raising=False)
    traced = trace_call(_step_of(model, opt), (x, y))
    ops = {node.op for node in traced.graph.nodes}
    assert {"matmul", "dropout"} <= ops and traced.result.is_abstract


@pytest.mark.parametrize("make_opt", [
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: optim.Adam(ps, lr=0.01),
], ids=["sgd_momentum", "adam"])
def test_each_compiled_call_updates_once_like_eager(make_opt, rng):
    """The first call traces (abstractly) and runs the executable: parameters, optimizer state
    created lazily, and dropout's draws match the eager steps, call after call."""
    eager_model, compiled_model = _mlp(), _mlp()
    eager = _step_of(eager_model, make_opt(eager_model.parameters()))
    opt = make_opt(compiled_model.parameters())
    compiled = graphc.compile(_step_of(compiled_model, opt), backend="interp")
    batches = [_data(rng) for _ in range(3)]
    graphc.manual_seed(7)
    want = [eager(x, y).item() for x, y in batches]
    graphc.manual_seed(7)
    got = [compiled(x, y).item() for x, y in batches]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for p, q in zip(compiled_model.parameters(), eager_model.parameters()):
        np.testing.assert_allclose(p.numpy(force=True), q.numpy(force=True),
                                   rtol=1e-5, atol=1e-6)
    for state in opt.state.values():
        assert state and not any(isinstance(v, graphc.Tensor) and v.is_abstract
                                 for v in state.values())


def test_the_first_call_returns_the_executables_results():
    def f(x):
        return (x * 2).relu(), x.sum()

    x = graphc.tensor([-1.0, 3.0])
    out, total = graphc.compile(f, backend="interp")(x)
    assert not out.is_abstract and out.tolist() == [0.0, 6.0] and total.item() == 2.0


def test_graphc_trace_leaves_no_effect(rng):
    model = _mlp()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = [p.numpy(force=True).copy() for p in model.parameters()]
    state = graphc.default_generator.get_state().tolist()
    graph = graphc.trace(_step_of(model, opt), *_data(rng))
    assert graph.updates  # the parameters' updates are in the graph, not in the model
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(force=True), b)
        assert p.grad is None
    assert not opt.state and graphc.default_generator.get_state().tolist() == state


def test_values_in_a_trace_are_still_a_trace_error_and_leave_no_state(rng):
    model = _mlp()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    inner = _step_of(model, opt)

    def step(x, y):
        loss = inner(x, y)
        if loss > 0:  # needs the loss's value
            return loss
        return -loss

    with pytest.raises(TraceError, match=r"test_abstract_trace.py:\d+: bool\(tensor\)"):
        graphc.compile(step, backend="interp")(*_data(rng))
    assert not opt.state and all(p.grad is None for p in model.parameters())


def test_graphc_tensor_of_an_abstract_tensor_says_what_to_do():
    def f(x):
        return graphc.tensor(x * 2)

    with pytest.raises(TraceError, match="use t.clone"):
        graphc.trace(f, graphc.ones(2))
