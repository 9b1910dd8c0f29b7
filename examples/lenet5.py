"""LeNet-5 on random 28x28 images: eager vs compiled training steps side by side.

    python examples/lenet5.py [--steps 5] [--batch-size 16]

Two copies of one model start from the same weights; one is trained eagerly, the other with
its whole training step compiled for the CPU backend. After every step their losses agree to
float32 rounding, which the script checks and prints.
"""

from __future__ import annotations

import argparse
import copy

import numpy as np

import graphc
import graphc.nn as nn
import graphc.optim as optim


def lenet5() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10))


def training_step(model: nn.Module):
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step(images, labels):
        opt.zero_grad()
        loss = loss_fn(model(images), labels)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def main(argv: list[str] | None = None) -> list[tuple[float, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)

    graphc.manual_seed(0)
    rng = np.random.default_rng(0)
    images = graphc.tensor(rng.standard_normal((args.batch_size, 1, 28, 28)).astype(np.float32))
    labels = graphc.tensor(rng.integers(0, 10, args.batch_size))
    eager_model = lenet5()
    compiled_model = copy.deepcopy(eager_model)
    eager_step = training_step(eager_model)
    compiled_step = graphc.compile(training_step(compiled_model), backend="cpu")

    losses = []
    for i in range(args.steps):
        eager_loss, compiled_loss = float(eager_step(images, labels)), \
            float(compiled_step(images, labels))
        losses.append((eager_loss, compiled_loss))
        print(f"step {i}: eager loss {eager_loss:.6f}  compiled loss {compiled_loss:.6f}")
        assert abs(eager_loss - compiled_loss) <= 1e-4 * max(1.0, abs(eager_loss))
    return losses


if __name__ == "__main__":
    main()
