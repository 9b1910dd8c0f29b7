"""benchmarks/model_compile.py's training steps build and train: each of issue 12's families
added there (LSTM, VAE, DCGAN, MobileNet, benchmarks/model_steps.COMPILE_ONLY) runs two eager
steps, at its benchmark widths on a small batch, with a finite loss and changed weights (their
compile times are a benchmark, not a test)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from benchmarks import model_steps


@pytest.mark.parametrize("name", sorted(model_steps.COMPILE_ONLY))
def test_benchmark_step_trains_eagerly(name):
    graphc.manual_seed(0)
    shape = {**model_steps.COMPILE_ONLY[name], "batch": 2}
    shape.update({"seq": 4} if name == "lstm" else {"size": 16} if name == "mobilenet" else {})
    step, arrays = model_steps.training_step(name, shape)
    args = tuple(graphc.tensor(a) for a in arrays)
    weights = [p for cell in step.__closure__ for p in _parameters(cell.cell_contents)]
    assert weights, f"{name}: the step's closure holds no parameters"
    before = [p.detach().numpy().copy() for p in weights]
    for _ in range(2):
        losses = step(*args)
        losses = losses if isinstance(losses, tuple) else (losses,)
        assert all(np.isfinite(float(loss)) for loss in losses), (name, losses)
    assert any(not np.array_equal(b, p.detach().numpy()) for b, p in zip(before, weights))


def _parameters(obj):
    """The parameters of a module, or of an optimizer's groups, found in a closure cell."""
    if isinstance(obj, graphc.nn.Module):
        return list(obj.parameters())
    groups = getattr(obj, "param_groups", None)
    return [p for g in groups for p in g["params"]] if groups else []
