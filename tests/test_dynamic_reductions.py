"""A training step whose loss divides by a count of elements (`.mean()`, the losses' default
reduction="mean", var/std, kl_div's "batchmean") keeps its batch symbolic under
graphc.compile(dynamic=True): the divisor is the symbolic size per call (a `full` of it,
graphc.ops.grad_utils.size_value), not a number the trace took at its first batch, so one
trace serves every batch size; losses, parameters and gradients equal eager graphc's."""

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
from tests.conftest import sgd_training_step

BATCHES = (5, 7, 3, 12, 5)

LOSSES = {
    "mean": lambda out, y: ((out - y) ** 2).mean(),
    "mean_over_batch": lambda out, y: ((out - y) ** 2).mean(0).sum(),
    "mse_loss": F.mse_loss,
    "l1_loss": F.l1_loss,
    "smooth_l1_loss": F.smooth_l1_loss,
    "bce_with_logits": lambda out, y: F.binary_cross_entropy_with_logits(out, y.sigmoid()),
    "cross_entropy_soft": lambda out, y: F.cross_entropy(out, y.softmax(-1)),
    "var": lambda out, y: (out - y).var(),
    "std_over_batch": lambda out, y: (out - y).std(0).sum(),
    "kl_div_batchmean": lambda out, y: F.kl_div(out.log_softmax(-1), y.softmax(-1),
                                                reduction="batchmean"),
}


def _twin_steps(loss_fn):
    """(model, step) twice over: identical models, each with its own SGD."""
    return [_model_and_step(loss_fn), _model_and_step(loss_fn)]


def _model_and_step(loss_fn):
    return sgd_training_step(
        lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)), lr=0.1, momentum=0.0,
        loss_fn=loss_fn)


@pytest.mark.parametrize("backend", ["interp", "cpu"])
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_one_trace_serves_every_batch(loss, backend):
    if backend == "cpu":
        pytest.importorskip("llvmlite", reason="the cpu backend generates code with llvmlite")
    (m1, step1), (m2, eager) = _twin_steps(LOSSES[loss])
    compiled = graphc.compile(step1, backend=backend, dynamic=True)
    for b in BATCHES:
        x, y = graphc.randn(b, 4), graphc.randn(b, 3)
        np.testing.assert_allclose(compiled(x, y).numpy(), eager(x, y).numpy(),
                                   rtol=2e-5, atol=1e-6)
    # every trace symbolic; the interpreter traces the first call's state too (no .grads
    # yet: graphc.jit.first_step makes none for it), a compiling backend traces once
    assert {str(g.inputs[0].type) for g in compiled.graphs} == {"f32[s0,4]"}
    assert len(compiled.graphs) == (2 if backend == "interp" else 1)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        np.testing.assert_allclose(p1.detach().numpy(), p2.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_mean_gradient_divides_by_the_symbolic_count():
    """The backward of reduce_mean over a symbolic dim divides by a `full` of the symbol
    (no guard pins it), and the gradient is 1/n at each n."""
    def grad_of_mean(x):
        x = x.detach().requires_grad_()
        x.mean().backward()
        return x.grad

    f = graphc.compile(grad_of_mean, backend="interp", dynamic=True)
    for n in (4, 9, 2):
        np.testing.assert_allclose(f(graphc.ones(n, 3)).numpy(), np.full((n, 3), 1 / (3 * n)),
                                   rtol=1e-6)
    assert len(f.graphs) == 1
    assert "full[" in str(f.graphs[0]) and "s0" in str(f.graphs[0].inputs[0].type)


def test_emulated_cuda_serves_every_batch_from_one_trace(monkeypatch, tmp_path):
    """cuda compiles the symbolic graph per size (graphc.backends.specializing): the mean's
    `full` of the symbol takes each call's value; one trace still serves every batch."""
    monkeypatch.setenv("GRAPHC_CUDA", "emu")
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    try:
        from tests.cuda_support import runtime_library

        runtime_library("emu")
    except Exception as error:  # noqa: BLE001 (no g++, a failing build: say why)
        pytest.skip(f"the cuda emulation runtime does not build here: {error}")
    (_, step1), (_, eager) = _twin_steps(LOSSES["mean"])
    compiled = graphc.compile(step1, backend="cuda", dynamic=True)
    for b in (5, 7, 5):
        x, y = graphc.randn(b, 4), graphc.randn(b, 3)
        np.testing.assert_allclose(compiled(x, y).numpy(), eager(x, y).numpy(), rtol=1e-5)
    assert [str(g.inputs[0].type) for g in compiled.graphs] == ["f32[s0,4]"]
