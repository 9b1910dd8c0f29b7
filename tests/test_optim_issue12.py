"""RMSprop, Adagrad, SGD nesterov, Adam amsgrad and the lr schedulers against PyTorch
(float64, same starting weights), schedulers' learning rates bit for bit, and a compiled
training step whose learning rate a scheduler changes every step without a retrace."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from graphc import optim
from tests.torch_parity import torch

OPTIMIZERS = [
    ("RMSprop", {"lr": 0.01}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9, "centered": True, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.01, "maximize": True}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.5}),
    ("Adagrad", {"lr": 0.1}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.1,
                 "initial_accumulator_value": 0.5}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    ("Adam", {"lr": 0.01, "amsgrad": True}),
]


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((4, 3)), rng.standard_normal((6, 3)), rng.standard_normal((6, 4))


def _run(lib, opt_name, kwargs, steps=5, scheduler=None):
    w0, x, y = _problem()
    mod = graphc if lib == "graphc" else torch
    optim_mod = optim if lib == "graphc" else torch.optim
    w = mod.tensor(w0.copy(), requires_grad=True)
    opt = getattr(optim_mod, opt_name)([w], **kwargs)
    sched = scheduler(optim_mod.lr_scheduler, opt) if scheduler else None
    xs, ys = mod.tensor(x), mod.tensor(y)
    lrs = []
    for _ in range(steps):
        opt.zero_grad()
        ((xs @ w.T - ys) ** 2).sum().backward()
        opt.step()
        if sched is not None:
            sched.step()
            lrs.append(sched.get_last_lr())
    return w.detach().numpy(), lrs


@pytest.mark.parametrize("case", range(len(OPTIMIZERS)))
def test_optimizer_matches_pytorch(case):
    name, kwargs = OPTIMIZERS[case]
    got, _ = _run("graphc", name, kwargs)
    want, _ = _run("torch", name, kwargs)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


SCHEDULERS = {
    "step": lambda s, o: s.StepLR(o, step_size=2, gamma=0.5),
    "multistep": lambda s, o: s.MultiStepLR(o, milestones=[1, 3, 3], gamma=0.3),
    "exponential": lambda s, o: s.ExponentialLR(o, gamma=0.9),
    "cosine": lambda s, o: s.CosineAnnealingLR(o, T_max=3, eta_min=0.001),
    "linear": lambda s, o: s.LinearLR(o, start_factor=0.25, total_iters=4),
    "lambda": lambda s, o: s.LambdaLR(o, lambda k: 1.0 / (k + 1)),
    "onecycle": lambda s, o: s.OneCycleLR(o, max_lr=0.5, total_steps=10),
    "onecycle_linear": lambda s, o: s.OneCycleLR(o, max_lr=0.5, total_steps=10,
                                                  anneal_strategy="linear", three_phase=True),
    "sequential": lambda s, o: s.SequentialLR(o, [s.LinearLR(o, start_factor=0.1,
                                                             total_iters=3),
                                                  s.CosineAnnealingLR(o, T_max=5)],
                                              milestones=[3]),
}


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
@pytest.mark.parametrize("opt_name,kwargs", [("SGD", {"lr": 0.1, "momentum": 0.9}),
                                             ("SGD", {"lr": 0.1, "momentum": 0.9,
                                                      "nesterov": True}),
                                             ("RMSprop", {"lr": 0.01, "momentum": 0.5}),
                                             ("Adam", {"lr": 0.05})])
def test_scheduler_matches_pytorch(name, opt_name, kwargs):
    got, got_lrs = _run("graphc", opt_name, kwargs, steps=9, scheduler=SCHEDULERS[name])
    want, want_lrs = _run("torch", opt_name, kwargs, steps=9, scheduler=SCHEDULERS[name])
    assert got_lrs == [[float(v) for v in lrs] for lrs in want_lrs]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("opt_name,schedule", [
    ("SGD", "cosine"), ("Adam", "cosine"), ("RMSprop", "cosine"), ("Adagrad", "cosine"),
    ("SGD", "onecycle"), ("Adam", "onecycle"), ("RMSprop", "onecycle")])
def test_scheduled_lr_is_a_runtime_input_of_the_compiled_step(opt_name, schedule):
    """The lr (and, for OneCycleLR, the momentum or beta1) changes every step: the compiled
    step follows eager without tracing again."""
    graphc.manual_seed(0)
    model, twin = nn.Linear(3, 2), nn.Linear(3, 2)
    twin.load_state_dict(model.state_dict())
    x, y = graphc.randn(8, 3), graphc.randn(8, 2)

    def make(m):
        kwargs = {"momentum": 0.5} if opt_name in ("SGD", "RMSprop") else {}
        opt = getattr(optim, opt_name)(m.parameters(), lr=0.1, **kwargs)
        if schedule == "cosine":
            sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)
        else:
            sched = optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=8)

        def step(x, y):
            opt.zero_grad()
            loss = ((m(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            return loss
        return step, sched

    eager, eager_sched = make(model)
    step, sched = make(twin)
    compiled = graphc.compile(step, backend="cpu")
    traces = []
    for _ in range(6):
        np.testing.assert_allclose(eager(x, y).item(), compiled(x, y).item(), rtol=1e-5)
        eager_sched.step()
        sched.step()
        traces.append(len(compiled.graphs))
    # the second call traces again for the `.grad`s (and lazy optimizer state) the first call
    # created; from then on the changing learning rate never retraces
    assert traces[1:] == [traces[1]] * 5, compiled.recompile_reasons
    assert not any("lr" in r for rs in compiled.recompile_reasons for r in rs)
    for p, q in zip(model.parameters(), twin.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_scheduler_keeps_pytorch_conventions():
    w = graphc.zeros(2, requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    sched = optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    assert opt.param_groups[0]["initial_lr"] == 0.1
    assert isinstance(sched.get_last_lr()[0], float)
    assert float(opt.param_groups[0]["lr"]) == 0.1
    state = sched.state_dict()
    assert "optimizer" not in state and state["last_epoch"] == 0
    with pytest.raises(ValueError, match="Starting multiplicative factor"):
        optim.lr_scheduler.LinearLR(opt, start_factor=0)
    with pytest.raises(KeyError, match="initial_lr"):
        optim.lr_scheduler.StepLR(optim.SGD([graphc.zeros(1, requires_grad=True)], lr=0.1), 1,
                                  last_epoch=3)
