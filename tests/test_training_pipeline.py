"""Issue 4's acceptance, measured on compiled LeNet-5 and MLP 784-256-256-10 training steps
at batch 64: the interpreter backend runs the simplified, fused and planned graph.

- the planned arena is at most 1.10 x the max-live lower bound and at most 0.5 x the naive sum
  of all intermediates;
- the fused graph has at most half as many kernels (nodes that are not views) as the traced
  graph has ops;
- ten compiled steps track ten eager steps within 1e-5 relative on every parameter and on
  the optimizer state.
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


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b) / (np.abs(b) + 1e-6))) if a.size else 0.0


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_compiled_training_step_meets_the_issue_targets(model_name, opt_name):
    graphc.manual_seed(0)
    model = MODELS[model_name]()
    reference = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS[opt_name](model.parameters()), OPTIMIZERS[opt_name](
        reference.parameters())
    loss_fn = nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def eager_step(x, y):
        ref_opt.zero_grad()
        loss = loss_fn(reference(x), y)
        loss.backward()
        ref_opt.step()
        return loss

    compiled = graphc.compile(step, backend="interp")
    x, y = graphc.randn(64, 1, 28, 28), graphc.randint(0, 10, (64,))
    for _ in range(10):
        got, want = compiled(x, y), eager_step(x, y)
        assert _rel(got.detach().numpy(), want.detach().numpy()) <= 1e-5
    assert len(compiled.graphs) == 2  # the first step creates optimizer state: one retrace

    for p, q in zip(model.parameters(), reference.parameters()):
        assert _rel(p.detach().numpy(), q.detach().numpy()) <= 1e-5
    for b, c in zip(model.buffers(), reference.buffers()):
        assert _rel(b.numpy().astype(np.float64), c.numpy().astype(np.float64)) <= 1e-5
    for p, q in zip(model.parameters(), reference.parameters()):
        for key, value in opt.state[p].items():
            assert _rel(value.numpy(), ref_opt.state[q][key].numpy()) <= 1e-5, key

    optimized = compiled.optimized_graph
    ops = len(compiled.graph.nodes)
    kernels = sum(1 for n in optimized.nodes if not REGISTRY[n.op].view)
    assert kernels <= ops / 2, (kernels, ops)
    plan = optimized.meta["memory_plan"]
    assert compiled.executable.memory_plan is plan
    assert plan.arena_bytes <= 1.10 * plan.max_live_bytes, plan.report
    assert plan.arena_bytes <= 0.5 * plan.naive_bytes, plan.report
    assert [r.name for r in compiled.report.records] == ["simplify", "fuse", "plan_buffers"]
