"""Review of the eleventh session's dynamic shapes (h7: a mean's divisor symbolic through
graphc.ops.grad_utils.size_value in reduce_mean's gradient, the losses' reduction="mean",
var/std and kl_div's "batchmean"; duck-sized dims that the trace pins traced again apart),
as a seeded fuzzer over what its tests leave out: two symbolic dims at once (batch and
tokens, a mean over both: the divisor a product of symbols), a batch of 1 (var/std with
correction 1 divide by 0: nan, as eagerly), a correction larger than the count, cross
entropy over [N, C, d] with soft targets (the count numel // C), the interpreter and the cpu
backend, and a batch equal to the feature count first (duck sizing: the Linear pins it).

Each case runs a training step compiled with dynamic=True and the same step eagerly on a
twin model, over a random sequence of sizes: the losses and the parameters after agree, NaN
where eager has NaN, and the step is traced for symbolic sizes only.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
from tests.conftest import sgd_training_step


@pytest.fixture(autouse=True)
def _shared_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


LOSSES = {  # (out [b, t, 3], y [b, t, 3]) -> a scalar
    "mean of all": lambda out, y: ((out - y) ** 2).mean(),
    "mean over batch and tokens": lambda out, y: (out - y).abs().mean((0, 1)).sum(),
    "mse_loss": F.mse_loss,
    "var over batch": lambda out, y: (out - y).var(0).sum(),
    "std, correction 2": lambda out, y: (out - y).std(0, correction=2).sum(),
    "var of all": lambda out, y: (out - y).var(),
    "cross_entropy soft [N, C, d]": lambda out, y: F.cross_entropy(
        out.transpose(1, 2), y.softmax(-1).transpose(1, 2)),
    "kl_div batchmean": lambda out, y: F.kl_div(out.log_softmax(-1), y.softmax(-1),
                                                reduction="batchmean"),
    "smooth_l1_loss": lambda out, y: F.smooth_l1_loss(out, y, beta=0.5),
}


def _model_and_step(loss_fn, features):
    return sgd_training_step(
        lambda: nn.Sequential(nn.Linear(features, 5), nn.Tanh(), nn.Linear(5, 3)), lr=0.05,
        momentum=0.0, loss_fn=loss_fn)


def _assert_same(got, want, what):
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=3e-5, atol=1e-6,
                               err_msg=what)


@pytest.mark.parametrize("backend", ["interp", "cpu"])
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_symbolic_counts_over_random_sizes_match_eager(loss, backend):
    if backend == "cpu":
        pytest.importorskip("llvmlite", reason="the cpu backend generates code with llvmlite")
    rng = np.random.default_rng(sorted(LOSSES).index(loss))
    features = 4
    m1, step1 = _model_and_step(LOSSES[loss], features)
    m2, eager = _model_and_step(LOSSES[loss], features)
    compiled = graphc.compile(step1, backend=backend, dynamic=True)
    sizes = [(int(rng.choice([2, 3, 5, 7])), int(rng.choice([2, 3, 6]))) for _ in range(3)]
    sizes.insert(int(rng.integers(1, 3)), (1, int(rng.choice([2, 5]))))  # a batch of 1
    for b, t in sizes:
        x = graphc.tensor(rng.standard_normal((b, t, features)).astype(np.float32))
        y = graphc.tensor(rng.standard_normal((b, t, 3)).astype(np.float32))
        what = f"{loss}, batch {b}, tokens {t}"
        _assert_same(compiled(x, y).numpy(), eager(x, y).numpy(), what)
        for p1, p2 in zip(m1.parameters(), m2.parameters()):
            _assert_same(p1.detach().numpy(), p2.detach().numpy(), what + ": parameters")
        if np.isnan(m2[0].weight.detach().numpy()).any():
            break  # a nan loss's gradient (var of one row): both models nan from here
    assert all("s" in str(g.inputs[0].type) for g in compiled.graphs), \
        [str(g.inputs[0].type) for g in compiled.graphs]


@pytest.mark.parametrize("backend", ["interp", "cpu"])
@pytest.mark.parametrize("first", [(4, 3), (4, 4), (3, 4)], ids=["b=f", "b=t=f", "t=f"])
def test_sizes_equal_to_the_feature_count_first_stay_symbolic(backend, first):
    """Duck sizing: the first call's batch and/or tokens equal the feature count (4), so the
    dims share one symbol that the Linear pins; traced again apart, the batch and tokens
    stay symbolic and later sizes reuse that trace."""
    if backend == "cpu":
        pytest.importorskip("llvmlite", reason="the cpu backend generates code with llvmlite")
    rng = np.random.default_rng(first[0] * 10 + first[1])
    m1, step1 = _model_and_step(LOSSES["mean of all"], 4)
    m2, eager = _model_and_step(LOSSES["mean of all"], 4)
    compiled = graphc.compile(step1, backend=backend, dynamic=True)
    for b, t in [first, (5, 2), (4, 4), (2, 7)]:
        x = graphc.tensor(rng.standard_normal((b, t, 4)).astype(np.float32))
        y = graphc.tensor(rng.standard_normal((b, t, 3)).astype(np.float32))
        _assert_same(compiled(x, y).numpy(), eager(x, y).numpy(), f"batch {b}, tokens {t}")
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        _assert_same(p1.detach().numpy(), p2.detach().numpy(), "parameters")
    types = {str(g.inputs[0].type) for g in compiled.graphs}
    assert types == {"f32[s0,s1,4]"}, types
