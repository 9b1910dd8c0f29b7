"""Issue 4's acceptance, measured on compiled LeNet-5 and MLP 784-256-256-10 training steps
at batch 64: the interpreter backend runs the simplified, fused and planned graph.

- the planned arena is at most 1.10 x the max-live lower bound and at most 0.5 x the naive sum
  of all intermediates;
- the fused graph has at most half as many kernels (nodes that are not views) as the traced
  graph has ops;
- ten compiled steps track ten eager steps on every parameter, buffer and optimizer state:
  the compiled run is as close to the same steps in float64 as eager float32 is, within 2x
  (or 1e-6 of the tensor's scale).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.optim as optim
from graphc.ops.registry import REGISTRY


def _mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256),
                         nn.ReLU(), nn.Linear(256, 10))


def _lenet(batch_norm: bool = False):
    def norm(c):
        return [nn.BatchNorm2d(c)] if batch_norm else []

    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), *norm(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), *norm(16), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))


def _lenet_bn():
    return _lenet(batch_norm=True)


OPTIMIZERS = {
    "sgd_momentum": lambda params: optim.SGD(params, lr=0.01, momentum=0.9),
    "adam": lambda params: optim.Adam(params, lr=1e-3),
}
MODELS = {"mlp": _mlp, "lenet5": _lenet, "lenet5_bn": _lenet_bn}


def _tracks(triples: list, what: str) -> None:
    """For each (compiled, eager, exact) of one kind of tensor (parameters, buffers, one
    optimizer state): the compiled value is as close to `exact` (the same steps in float64)
    as eager float32 graphc's is, within 2x, or within 1e-6 of the largest magnitude of
    that kind across the model: the criterion for float32 rounding in another operand order
    (docs/performance.md). Ten steps amplify an ulp into far more than 1e-5 of an element
    near zero, and a conv bias before batch norm has no gradient but rounding (its momentum
    and Adam moments are that rounding, ~1e-19 where the float64 run's are ~0), so neither
    float32 run can be held to the other element by element, nor such a tensor to its own
    scale."""
    arrays = [[np.asarray(a, np.float64) for a in t] for t in triples]
    scale = max((float(np.max(np.abs(exact))) for _, _, exact in arrays), default=0.0)
    for i, (got, eager, exact) in enumerate(arrays):
        error, eager_error = np.max(np.abs(got - exact)), np.max(np.abs(eager - exact))
        assert error <= 2 * eager_error + 1e-6 * scale, (what, i, error, eager_error, scale)


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_compiled_training_step_meets_the_issue_targets(model_name, opt_name):
    graphc.manual_seed(0)
    model = MODELS[model_name]()
    reference, exact = copy.deepcopy(model), copy.deepcopy(model).double()
    opt, ref_opt, exact_opt = (OPTIMIZERS[opt_name](m.parameters())
                               for m in (model, reference, exact))
    loss_fn = nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def eager_step(m, o, x, y):
        o.zero_grad()
        loss = loss_fn(m(x), y)
        loss.backward()
        o.step()
        return loss

    compiled = graphc.compile(step, backend="interp")
    x, y = graphc.randn(64, 1, 28, 28), graphc.randint(0, 10, (64,))
    losses = []
    for _ in range(10):
        got, want = compiled(x, y), eager_step(reference, ref_opt, x, y)
        losses.append((got.detach().numpy(), want.detach().numpy(),
                       eager_step(exact, exact_opt, x.double(), y).detach().numpy()))
    assert len(compiled.graphs) == 2  # the first step creates optimizer state: one retrace

    trio = list(zip(model.parameters(), reference.parameters(), exact.parameters()))
    _tracks(losses, "loss")
    _tracks([[t.detach().numpy() for t in ts] for ts in trio], "parameters")
    _tracks([[b.numpy() for b in bs] for bs in zip(model.buffers(), reference.buffers(),
                                                  exact.buffers())], "buffers")
    for key in opt.state[trio[0][0]]:
        _tracks([[o.state[t][key].numpy() for o, t in zip((opt, ref_opt, exact_opt), ts)]
                 for ts in trio], key)

    optimized = compiled.optimized_graph
    ops = len(compiled.graph.nodes)
    kernels = sum(1 for n in optimized.nodes if not REGISTRY[n.op].view)
    assert kernels <= ops / 2, (kernels, ops)
    plan = optimized.meta["memory_plan"]
    assert compiled.executable.memory_plan is plan
    assert plan.arena_bytes <= 1.10 * plan.max_live_bytes, plan.report
    assert plan.arena_bytes <= 0.5 * plan.naive_bytes, plan.report
    assert [r.name for r in compiled.report.records] == ["simplify", "fuse", "plan_buffers"]
