"""nn.utils.clip_grad_norm_/clip_grad_value_ against PyTorch (eager and inside a compiled
training step, where the global norm is a scalar read by differently shaped gradients: the
fuse bug of issue 12), and nn.init.trunc_normal_/orthogonal_."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from graphc.errors import ArgumentError
from tests.torch_parity import torch


def _pairs(rng):
    ws = [rng.standard_normal((3, 4)), rng.standard_normal(5), rng.standard_normal((2, 2, 2))]
    gp = [graphc.tensor(np.zeros_like(w), requires_grad=True) for w in ws]
    tp = [torch.tensor(np.zeros_like(w), requires_grad=True) for w in ws]
    for g, t, w in zip(gp, tp, ws):
        g.grad, t.grad = graphc.tensor(w), torch.tensor(w)
    return gp, tp


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grad_norm_matches_pytorch(norm_type, max_norm):
    gp, tp = _pairs(np.random.default_rng(1))
    got = nn.utils.clip_grad_norm_(gp, max_norm, norm_type)
    want = torch.nn.utils.clip_grad_norm_(tp, max_norm, norm_type)
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-12)
    for g, t in zip(gp, tp):
        np.testing.assert_allclose(g.grad.numpy(), t.grad.numpy(), rtol=1e-12)


def test_clip_grad_value_and_errors():
    gp, tp = _pairs(np.random.default_rng(2))
    nn.utils.clip_grad_value_(gp, 0.3)
    torch.nn.utils.clip_grad_value_(tp, 0.3)
    for g, t in zip(gp, tp):
        np.testing.assert_array_equal(g.grad.numpy(), t.grad.numpy())
    w = graphc.zeros(2, requires_grad=True)
    w.grad = graphc.tensor([float("inf"), 1.0])
    with pytest.raises(ArgumentError, match="non-finite"):
        nn.utils.clip_grad_norm_([w], 1.0, error_if_nonfinite=True)
    assert nn.utils.clip_grad_norm_([graphc.zeros(2, requires_grad=True)], 1.0).item() == 0.0


@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_clipping_in_a_compiled_step(backend):
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    twin = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    twin.load_state_dict(model.state_dict())
    x = graphc.randn(5, 4)

    def make(m):
        opt = graphc.optim.SGD(m.parameters(), lr=0.5)

        def step(x):
            opt.zero_grad()
            loss = (m(x) * 3).pow(2).sum()
            loss.backward()
            norm = nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            return loss, norm
        return step

    eager, compiled = make(model), graphc.compile(make(twin), backend=backend)
    for _ in range(3):
        (l1, n1), (l2, n2) = eager(x), compiled(x)
        np.testing.assert_allclose([l1.item(), n1.item()], [l2.item(), n2.item()], rtol=1e-5)
    for p, q in zip(model.parameters(), twin.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_trunc_normal_and_orthogonal():
    graphc.manual_seed(0)
    w = nn.init.trunc_normal_(graphc.empty(400, 50), std=0.02, a=-0.03, b=0.03)
    a = w.numpy()
    assert a.min() >= -0.03 and a.max() <= 0.03 and 0.012 < a.std() < 0.018
    for shape in [(3, 5), (5, 3), (6, 2, 2)]:
        q = nn.init.orthogonal_(graphc.empty(*shape), gain=2.0).numpy().reshape(shape[0], -1)
        small = min(q.shape)
        gram = q @ q.T if q.shape[0] == small else q.T @ q
        np.testing.assert_allclose(gram, 4.0 * np.eye(small), atol=1e-5)
    with pytest.raises(ArgumentError, match="2 or more dimensions"):
        nn.init.orthogonal_(graphc.empty(3))
