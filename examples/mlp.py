"""An MLP trained with its whole training step compiled into one native call.

    python examples/mlp.py [--steps 200] [--backend cpu]

The step (zero_grad, forward, loss, backward, SGD update) is traced once by graphc.compile,
then replayed: parameters and momentum buffers are updated in place by the compiled graph.
The data is a fixed random "teacher" network's labels, so the loss must fall.
"""

from __future__ import annotations

import argparse

import numpy as np

import graphc
import graphc.nn as nn
import graphc.optim as optim


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--backend", default="cpu")
    args = parser.parse_args(argv)

    graphc.manual_seed(0)
    rng = np.random.default_rng(0)
    x = graphc.tensor(rng.standard_normal((256, 20)).astype(np.float32))
    teacher = rng.standard_normal((20, 4)).astype(np.float32)
    y = graphc.tensor((x.numpy() @ teacher).argmax(axis=1))

    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 4))
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    @graphc.compile(backend=args.backend)
    def step(inputs, labels):
        opt.zero_grad()
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        opt.step()
        return loss.detach()

    first = float(step(x, y))
    for _ in range(args.steps - 1):
        last = float(step(x, y))
    with graphc.no_grad():
        accuracy = float((model(x).argmax(dim=1) == y).float().mean())
    print(f"loss {first:.3f} -> {last:.3f}, training accuracy {accuracy:.1%} "
          f"({args.steps} compiled steps on {args.backend})")
    return last


if __name__ == "__main__":
    main()
