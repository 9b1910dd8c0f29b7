"""The step-time comparison of `graphc demo`: the same training step in eager graphc and in
PyTorch eager, on the same model, weights and batch as the compiled step.

Invariants:
- Nothing here changes the trained model: eager graphc steps run on a deep copy and PyTorch
  on a copy of its weights, each with a fresh Adam whose state the warm-up steps create.
- Each timing is the median of several steps after the warm-up, within a small time budget,
  so a slow path (graphc eager runs numpy kernels op by op) cannot stall the demo.
- PyTorch is optional: without it the comparison says "torch not installed".
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Callable

import numpy as np

import graphc
import graphc.optim as optim
from graphc.tools.demo_model import make_step

WARMUP_STEPS = 2
MAX_STEPS = 30
BUDGET_SECONDS = 1.0  # per timing, after the warm-up


def median_step_seconds(step: Callable[[], object]) -> float:
    """The median wall time of `step()`, after the warm-up, within the budget."""
    for _ in range(WARMUP_STEPS):
        step()
    times: list[float] = []
    budget_end = time.perf_counter() + BUDGET_SECONDS
    while len(times) < MAX_STEPS and (len(times) < 3 or time.perf_counter() < budget_end):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def graphc_eager_step_seconds(model, images: np.ndarray, labels: np.ndarray, lr: float) -> float:
    """The median time of the demo's training step run eagerly by graphc."""

    model = copy.deepcopy(model)
    step = make_step(model, optim.Adam(model.parameters(), lr=lr))
    x, y = graphc.tensor(images), graphc.tensor(labels)
    return median_step_seconds(lambda: step(x, y))


def torch_model(model):
    """The demo's CNN in PyTorch, with `model`'s weights (same layer indices and names)."""
    import torch

    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(128, 10))
    weights = {name: torch.from_numpy(t.numpy().copy()) for name, t in
               model.state_dict().items()}
    net.load_state_dict(weights)
    return net


def torch_eager_step_seconds(model, images: np.ndarray, labels: np.ndarray,
                             lr: float) -> tuple[float, int]:
    """(median seconds, threads) of the same training step in PyTorch eager mode: with its
    default thread count and with one thread, the faster of the two (steps this small gain
    nothing from threads, and on a busy machine spinning threads can slow them tenfold)."""
    import torch

    default = torch.get_num_threads()
    timings = []
    try:
        for threads in sorted({default, 1}, reverse=True):
            torch.set_num_threads(threads)
            timings.append((_torch_step_seconds(model, images, labels, lr), threads))
    finally:
        torch.set_num_threads(default)
    return min(timings)


def _torch_step_seconds(model, images: np.ndarray, labels: np.ndarray, lr: float) -> float:
    import torch

    net = torch_model(model)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = torch.from_numpy(images.copy()), torch.from_numpy(labels.copy())

    def step():
        optimizer.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return median_step_seconds(step)


def step_timings(model, data, batch_size: int, lr: float) -> dict[str, float | str]:
    """label -> median seconds per step (or why there is no number), on the first batch."""
    images, labels = data.x_train[:batch_size], data.y_train[:batch_size]
    timings: dict[str, float | str] = {
        "graphc eager": graphc_eager_step_seconds(model, images, labels, lr)}
    try:
        import torch  # noqa: F401
    except ImportError:
        timings["PyTorch eager"] = "torch not installed"
    else:
        seconds, threads = torch_eager_step_seconds(model, images, labels, lr)
        timings[f"PyTorch eager ({threads} thread{'s' * (threads != 1)})"] = seconds
    return timings
