"""Data-parallel training of a small CNN on scikit-learn's digits, on several MPI ranks.

    graphc launch -n 2 examples/ddp_digits.py [--epochs 3] [--compile]
    mpirun -n 2 python examples/ddp_digits.py

The natural PyTorch DDP program with graphc in place of torch: init_process_group, a
DistributedSampler giving each rank its share of every epoch, DistributedDataParallel
averaging the gradients, and with --compile the whole step (forward, backward, gradient
averaging, update) compiled into one native call per rank. Rank 0 prints the loss and the
test accuracy after every epoch.
"""

from __future__ import annotations

import argparse

import numpy as np

import graphc
import graphc.distributed as dist
import graphc.nn as nn
import graphc.nn.functional as F
from graphc.nn.parallel import DistributedDataParallel
from graphc.utils.data import DataLoader, DistributedSampler, TensorDataset


def digits():
    """scikit-learn's 8x8 digits as (N, 1, 8, 8) floats in [0, 1], split 4:1."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None]
    y = data.target.astype(np.int64)
    split = len(x) * 4 // 5
    return (TensorDataset(graphc.tensor(x[:split]), graphc.tensor(y[:split])),
            graphc.tensor(x[split:]), graphc.tensor(y[split:]))


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 2 * 2, 10))


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args(argv)

    dist.init_process_group(backend="mpi")
    rank = dist.get_rank()
    train, x_test, y_test = digits()
    graphc.manual_seed(0)
    model = DistributedDataParallel(cnn())
    opt = graphc.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = DistributedSampler(train, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    run = graphc.compile(step, backend="cpu") if args.compile else step
    accuracies = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        losses = [run(x, y).item() for x, y in loader]
        with graphc.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        accuracies.append(accuracy)
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {np.mean(losses):.3f}, test accuracy "
                  f"{accuracy:.1%}", flush=True)
    dist.destroy_process_group()
    return accuracies


if __name__ == "__main__":
    main()
