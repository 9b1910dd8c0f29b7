"""The model, training step and error of `graphc demo` (graphc.tools.demo).

`graphc.tools.demo` runs the demo, `demo_bench` times the same step eagerly and
`demo_outputs` writes the output folder; all three import what they share from here, and
this module imports none of them.
"""

from __future__ import annotations

from typing import Callable

import graphc
import graphc.nn as nn
import graphc.optim as optim

MODEL_TEXT = ("conv 1->16 3x3, relu, maxpool 2, conv 16->32 3x3, relu, maxpool 2, "
              "linear 128->10")


class DemoError(Exception):
    """Something the user can fix; `str` is one line, `exit_code` what `graphc demo` returns
    (2 for bad options, 1 when the demo cannot run here)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def build_model() -> nn.Sequential:
    """The CNN (MODEL_TEXT): 8x8 -> 16x4x4 -> 32x2x2 -> 10 logits."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128, 10))


def make_step(model: nn.Module, optimizer: optim.Optimizer) -> Callable:
    """The training step the demo compiles: one batch in, the loss out."""
    loss_fn = nn.CrossEntropyLoss()

    def step(images: graphc.Tensor, labels: graphc.Tensor) -> graphc.Tensor:
        optimizer.zero_grad()
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss

    return step
