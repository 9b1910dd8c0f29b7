"""Review of the eleventh session's cuda host path (h6: a cuda entry takes the jit's first
try; a steady call, every state input the array the last call marked in its slot, looks at
the true inputs alone and keeps the state's marks), as a seeded fuzzer of what a user does
between calls: edits a parameter in place, copies new values in, loads a state dict, reads
parameters, gradients and the optimizer's momentum, sets .grad to None, puts a new
Parameter in a layer and the optimizer, changes the learning rate, changes the batch
size, switches train/eval (a second executable on the same state), and calls a compiled
evaluation on the same parameters. Every step's loss, and the parameters and momentum
buffers at the end of each round, equal an eager twin's that did the same.

Runs on the emulation (tests/cuda_support.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
from graphc import optim

pytestmark = pytest.mark.usefixtures("cuda_runtime_built", "cuda_backend")


def _twin(compiled: bool):
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.0),
                          nn.Linear(8, 4))
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    def evaluate(x):
        with graphc.no_grad():
            return model(x).sum(1)

    if compiled:
        step, evaluate = graphc.compile(step, backend="cuda"), graphc.compile(evaluate,
                                                                               backend="cuda")
    return model, opt, step, evaluate


def _momenta(model, opt):
    return [opt.state[p]["momentum_buffer"].numpy() for p in model.parameters()
            if p in opt.state and "momentum_buffer" in opt.state[p]]


def _close(a, b, what):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5, err_msg=what)


ACTIONS = ("edit in place", "copy in", "load state dict", "read", "grad to None",
           "eval and back", "evaluate", "other batch", "new parameter", "learning rate")


def _act(action, rng, twins, batch):
    """Do `action` on both twins (model, opt, step, evaluate); returns the batch size next."""
    if action == "edit in place":
        k = int(rng.integers(4))
        for model, *_ in twins:
            with graphc.no_grad():
                list(model.parameters())[k].mul_(0.9).add_(0.01)
    elif action == "copy in":
        k = int(rng.integers(4))
        shape = tuple(list(twins[0][0].parameters())[k].shape)
        new = rng.standard_normal(shape).astype(np.float32) * 0.3
        for model, *_ in twins:
            with graphc.no_grad():
                list(model.parameters())[k].copy_(graphc.tensor(new))
    elif action == "load state dict":
        state = {name: graphc.tensor(t.numpy() * 0.5 + 0.01)
                 for name, t in twins[1][0].state_dict().items()
                 if t.dtype != graphc.int64}
        for model, *_ in twins:
            model.load_state_dict(state, strict=False)
    elif action == "read":
        for (m0, o0, *_), (m1, o1, *_) in [twins]:
            for p, q in zip(m0.parameters(), m1.parameters()):
                _close(p.detach().numpy(), q.detach().numpy(), "a read between calls")
            for a, b in zip(_momenta(m0, o0), _momenta(m1, o1)):
                _close(a, b, "momentum read between calls")
    elif action == "grad to None":
        for model, *_ in twins:
            for p in model.parameters():
                p.grad = None
    elif action == "eval and back":
        x = graphc.tensor(rng.standard_normal((batch, 6)).astype(np.float32))
        y = graphc.tensor(rng.integers(0, 4, batch))
        losses = []
        for model, _, step, _ in twins:
            model.eval()
            losses.append(step(x, y).numpy())  # eval-mode training step: running stats kept
            model.train()
        _close(losses[0], losses[1], "a step in eval mode")
    elif action == "evaluate":
        x = graphc.tensor(rng.standard_normal((batch, 6)).astype(np.float32))
        _close(twins[0][3](x).numpy(), twins[1][3](x).numpy(), "a compiled evaluation")
    elif action == "new parameter":  # a new Parameter object in the optimizer's place too
        new = rng.standard_normal((4,)).astype(np.float32)
        for model, opt, *_ in twins:
            old = model[4].bias
            model[4].bias = nn.Parameter(graphc.tensor(new))
            group = opt.param_groups[0]["params"]
            group[[id(p) for p in group].index(id(old))] = model[4].bias
    elif action == "learning rate":
        lr = float(rng.choice([0.01, 0.1]))
        for _, opt, *_ in twins:
            opt.param_groups[0]["lr"] = lr
    elif action == "other batch":
        return int(rng.choice([3, 5, 8]))
    return batch


@pytest.mark.parametrize("seed", range(3))
def test_host_actions_between_cuda_calls_match_eager(seed):
    rng = np.random.default_rng(seed)
    twins = [_twin(True), _twin(False)]
    batch = 8
    for round_ in range(6):
        action = ACTIONS[int(rng.integers(len(ACTIONS)))]
        batch = _act(action, rng, twins, batch)
        for _ in range(2):
            x = graphc.tensor(rng.standard_normal((batch, 6)).astype(np.float32))
            y = graphc.tensor(rng.integers(0, 4, batch))
            _close(twins[0][2](x, y).numpy(), twins[1][2](x, y).numpy(),
                   f"round {round_} after {action!r}: loss")
        (m0, o0, *_), (m1, o1, *_) = twins
        for (name, a), b in zip(m0.state_dict().items(), m1.state_dict().values()):
            _close(a.numpy(), b.numpy(), f"round {round_} after {action!r}: {name}")
        for a, b in zip(_momenta(m0, o0), _momenta(m1, o1)):
            _close(a, b, f"round {round_} after {action!r}: momentum")
