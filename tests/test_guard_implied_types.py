"""The fast path skips the per-call misfit check only where the entry's guard implies it
(graphc.jit.guards.Guard.implies_types): a guard that checks every captured tensor's shape and
dtype, recorded as the graph's types. A binding the guard does not check, or records with
another type, keeps the misfit check."""

from __future__ import annotations

import numpy as np

import graphc
import graphc.nn as nn
import graphc.optim as optim
from graphc.jit.bindings import TensorBinding


def _compiled_step(backend: str = "interp"):
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    rng = np.random.default_rng(0)
    args = (graphc.tensor(rng.standard_normal((5, 3)).astype(np.float32)),
            graphc.tensor(rng.standard_normal((5, 2)).astype(np.float32)))
    compiled = graphc.compile(step, backend=backend)
    for _ in range(3):
        compiled(*args)
    return compiled, model, args


def test_a_guard_over_every_captured_tensor_implies_their_types():
    compiled, _, _ = _compiled_step()
    entry = compiled._entries[-1]
    assert any(isinstance(b, TensorBinding) for b, *_ in entry.typed)
    assert entry.guard.implies_types(entry.typed)


def test_a_binding_the_guard_does_not_check_keeps_the_misfit_check():
    compiled, _, _ = _compiled_step()
    entry = compiled._entries[-1]
    stranger = TensorBinding(graphc.zeros(4))  # a tensor the guard never saw
    value = entry.typed[0][1]
    assert not entry.guard.implies_types([(stranger, value, (4,), graphc.float32)])


def test_a_recorded_type_other_than_the_graphs_keeps_the_misfit_check():
    compiled, _, _ = _compiled_step()
    entry = compiled._entries[-1]
    b, v, shape, dtype = next(t for t in entry.typed if isinstance(t[0], TensorBinding))
    assert not entry.guard.implies_types([(b, v, tuple(shape) + (1,), dtype)])


def test_a_parameter_of_another_dtype_never_runs_the_old_executable():
    compiled, model, args = _compiled_step("cpu")
    old = compiled._entries[-1].executable
    ran = []
    real_run = old.run
    old.run = lambda *arrays: ran.append(1) or real_run(*arrays)
    compiled(*args)
    assert ran == [1]  # the fast path runs the executable
    model[2].weight.data = graphc.zeros(2, 4, dtype=graphc.float64)
    try:
        compiled(*args)
    except graphc.GraphcError:
        pass  # refusing the mixed-dtype model is fine; running the float32 graph is not
    assert ran == [1]
