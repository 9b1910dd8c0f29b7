"""A gradient penalty (grad of grad, create_graph=True), compiled and checked.

    python examples/gradient_penalty.py

A WGAN-GP style critic loss: the critic's output plus lambda * (||d critic / d x|| - 1)^2.
The penalty differentiates through a gradient, so the step's backward is a second-order
derivative. The compiled step's parameter gradients are compared with eager graphc's, and the
double-backward of a small function with graphc.autograd.gradgradcheck in float64.
"""

from __future__ import annotations

import numpy as np

import graphc
import graphc.nn as nn
from graphc.autograd import grad, gradgradcheck


def penalty_step(critic: nn.Module, lam: float = 10.0):
    def step(x):
        x = x.detach().requires_grad_(True)
        score = critic(x).sum()
        (gx,) = grad(score, x, create_graph=True)
        norm = (gx * gx).sum(dim=1).sqrt()
        loss = score + lam * ((norm - 1.0) ** 2).mean()
        params = list(critic.parameters())
        grads = grad(loss, params)
        return (loss.detach(),) + tuple(g.detach() for g in grads)

    return step


def main() -> float:
    graphc.manual_seed(0)
    critic = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    x = graphc.tensor(np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32))

    eager = penalty_step(critic)(x)
    compiled = graphc.compile(penalty_step(critic), backend="cpu")
    compiled(x)  # traces
    got = compiled(x)  # runs the compiled graph
    worst = max(float((a - b).abs().max()) / max(1.0, float(b.abs().max()))
                for a, b in zip(got, eager))
    print(f"loss {float(got[0]):.5f}; compiled vs eager gradients: max relative difference "
          f"{worst:.2e}")
    assert worst < 1e-4

    w = graphc.tensor(np.random.default_rng(1).standard_normal((3, 4)), requires_grad=True)
    v = graphc.tensor(np.random.default_rng(2).standard_normal((5, 3)), requires_grad=True)
    assert gradgradcheck(lambda w, v: (v @ w).tanh().sum(dim=1), (w, v))
    print("gradgradcheck (float64): ok")
    return worst


if __name__ == "__main__":
    main()
