"""The models and training steps the benchmarks time, in graphc and in PyTorch, with the same
initial weights.

A training step is zero_grad, forward, cross-entropy, backward, SGD-momentum update, and
returns the detached loss. `graphc_model(name, sizes)` builds a graphc model with weights
from a seeded generator; `torch_copy(model, name, sizes)` builds the PyTorch model of the
same architecture holding a copy of those weights (graphc's Linear and Conv2d store weights
in PyTorch's layouts), so every contender of a case starts from the same state and the
agreement check can compare losses and weights after a few steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import graphc
import graphc.nn as gnn
import graphc.optim as goptim

LR, MOMENTUM = 0.01, 0.9


@dataclass(frozen=True)
class MlpSizes:
    features: int = 784
    hidden: int = 256
    classes: int = 10


def mlp(sizes: MlpSizes = MlpSizes(), nn=gnn):
    """MLP features-hidden-hidden-classes with ReLUs (784-256-256-10 by default), built from
    `nn` (graphc.nn, or torch.nn: the two share these layers' signatures)."""
    return nn.Sequential(nn.Linear(sizes.features, sizes.hidden), nn.ReLU(),
                         nn.Linear(sizes.hidden, sizes.hidden), nn.ReLU(),
                         nn.Linear(sizes.hidden, sizes.classes))


def lenet5(nn=gnn):
    """LeNet-5 on 1x28x28 inputs (the first convolution pads by 2, as for MNIST), from `nn`."""
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                         nn.Linear(84, 10))


def torch_mlp(sizes: MlpSizes = MlpSizes()):
    import torch.nn as tnn

    return mlp(sizes, tnn)


def torch_lenet5():
    import torch.nn as tnn

    return lenet5(tnn)


def graphc_model(name: str, sizes: MlpSizes = MlpSizes(), seed: int = 0):
    graphc.manual_seed(seed)
    return mlp(sizes) if name == "mlp" else lenet5()


def copy_graphc_model(model, name: str, sizes: MlpSizes = MlpSizes()):
    """A second graphc model of the same architecture with a copy of `model`'s weights."""
    other = mlp(sizes) if name == "mlp" else lenet5()
    for p, q in zip(other.parameters(), model.parameters()):
        p.detach().numpy()[...] = q.detach().numpy()
    return other


def torch_copy(model, name: str, sizes: MlpSizes = MlpSizes()):
    """The PyTorch model of the same architecture holding a copy of `model`'s weights."""
    import torch

    other = torch_mlp(sizes) if name == "mlp" else torch_lenet5()
    with torch.no_grad():
        for p, q in zip(other.parameters(), model.parameters()):
            p.copy_(torch.from_numpy(q.detach().numpy().copy()))
    return other


def graphc_step(model):
    """The graphc training step of `model` (a fresh SGD-momentum optimizer)."""
    opt = goptim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = gnn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    step.optimizer = opt  # for the benchmarks' state resets (benchmarks/cases.py)
    return step


def torch_step(model):
    """The PyTorch training step of `model` (a fresh SGD-momentum optimizer)."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    step.optimizer = opt
    return step


def first_weight(model) -> np.ndarray:
    """The first parameter of a graphc or PyTorch model as a numpy array (for agreement)."""
    p = next(iter(model.parameters()))
    return p.detach().numpy().copy()


def batch(name: str, size: int, sizes: MlpSizes = MlpSizes(), seed: int = 1):
    """(x, y) as numpy arrays: standard-normal inputs and integer class labels."""
    rng = np.random.default_rng(seed)
    shape = (size, sizes.features) if name == "mlp" else (size, 1, 28, 28)
    classes = sizes.classes if name == "mlp" else 10
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, classes, size)


def batches(name: str, size: int, count: int, sizes: MlpSizes = MlpSizes()) -> list[tuple]:
    """`count` batches as `batch` makes them (seeds 1, 2, ...): the first is `batch(...)`."""
    return [batch(name, size, sizes, seed=1 + k) for k in range(count)]


def state_arrays(model, optimizer) -> list[np.ndarray]:
    """The arrays a training step changes, as numpy views of the tensors' memory (a graphc or
    PyTorch model): every parameter and every tensor of the optimizer's state."""
    arrays = [p.detach().numpy() for p in model.parameters()]
    for entry in optimizer.state.values():
        arrays += [v.detach().numpy() for v in entry.values() if hasattr(v, "detach")]
    return arrays
