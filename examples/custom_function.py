"""A custom autograd.Function (a straight-through clamp) in eager mode and compiled.

    python examples/custom_function.py

`forward(ctx, ...)` and `backward(ctx, ...)` are static methods, as in PyTorch; the backward
here passes the gradient straight through where the input was clamped. A training step that
calls it compiles into one graph whose backward part is the traced custom backward.
"""

from __future__ import annotations

import numpy as np

import graphc


class StraightThroughClamp(graphc.autograd.Function):
    @staticmethod
    def forward(ctx, x, low: float, high: float):
        return x.clamp(low, high)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None, None  # the identity's gradient, not the clamp's


def loss_and_grad(x):
    y = StraightThroughClamp.apply(x, -0.5, 0.5)
    loss = (y * y).sum()
    loss.backward()
    return loss.detach(), x.grad


def main() -> tuple[np.ndarray, np.ndarray]:
    data = np.array([-2.0, -0.25, 0.0, 0.25, 2.0], np.float32)
    x = graphc.tensor(data, requires_grad=True)
    _, eager_grad = loss_and_grad(x)
    eager_grad = eager_grad.numpy().copy()

    compiled = graphc.compile(loss_and_grad, backend="cpu")
    for _ in range(2):  # the first call traces (and runs eagerly), the second runs the graph
        x.grad = None
        _, compiled_grad = compiled(x)
    assert len(compiled.graphs) == 1
    print("input        ", data)
    print("eager grad   ", eager_grad)
    print("compiled grad", compiled_grad.numpy())
    # d/dx sum(clamp(x)^2) with a straight-through backward: 2 * clamp(x), even where clamped
    np.testing.assert_allclose(eager_grad, 2 * np.clip(data, -0.5, 0.5))
    np.testing.assert_allclose(compiled_grad.numpy(), eager_grad)
    return eager_grad, compiled_grad.numpy()


if __name__ == "__main__":
    main()
