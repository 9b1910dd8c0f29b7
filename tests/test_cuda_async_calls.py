"""Compiled cuda calls return before their device work ends (graphc/backends/cuda/executable.py,
"Asynchronous calls"): what a user can observe of that is only where a failure is reported
(the next call or the next read, as with PyTorch's CUDA ops) and that every read sees the
call's values, from any thread. Runs on the emulation (tests/cuda_support.py)."""

from __future__ import annotations

import functools
import threading

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
from graphc.errors import IndexOutOfRangeError
from tests.conftest import sgd_training_step

pytestmark = pytest.mark.usefixtures("cuda_runtime_built", "cuda_backend")


def _classifier_step():
    model, step = sgd_training_step(functools.partial(nn.Linear, 6, 4), lr=0.1, momentum=0)
    return model, graphc.compile(step, backend="cuda")


def _batch(rng, labels):
    return (graphc.tensor(rng.standard_normal((len(labels), 6)).astype(np.float32)),
            graphc.tensor(np.array(labels, dtype=np.int64)))


def test_a_bad_label_in_a_later_call_is_reported_at_the_read_of_its_loss():
    rng = np.random.default_rng(0)
    _, step = _classifier_step()
    for _ in range(3):  # the first call, the capture, a replayed call: all asynchronous after 1
        step(*_batch(rng, [0, 1, 2, 3])).item()
    loss = step(*_batch(rng, [0, 9, 2, 3]))  # returns: the device has not been waited for
    with pytest.raises(IndexOutOfRangeError, match="failed in an earlier call.*GRAPHC_CUDA_SYNC"):
        loss.item()
    step(*_batch(rng, [0, 1, 2, 3])).item()  # reported once: the next call runs


def test_a_bad_label_is_reported_at_the_next_call_when_nothing_was_read():
    rng = np.random.default_rng(1)
    _, step = _classifier_step()
    for _ in range(3):
        step(*_batch(rng, [0, 1, 2, 3]))
    step(*_batch(rng, [3, 2, 1, 5]))
    with pytest.raises(IndexOutOfRangeError, match="failed in an earlier call"):
        step(*_batch(rng, [0, 1, 2, 3]))


def test_graphc_cuda_sync_reports_the_failure_at_the_failing_call(monkeypatch):
    monkeypatch.setenv("GRAPHC_CUDA_SYNC", "1")
    rng = np.random.default_rng(2)
    _, step = _classifier_step()
    for _ in range(3):
        step(*_batch(rng, [0, 1, 2, 3]))
    with pytest.raises(IndexOutOfRangeError) as caught:
        step(*_batch(rng, [0, 1, 2, 7]))
    assert "earlier call" not in str(caught.value)


def test_reads_after_asynchronous_calls_see_each_calls_values_from_any_thread():
    """Ten calls without a read, then the losses, parameters and .grads read from another
    thread: each value is its own call's (against the interpreter running the same steps)."""
    rng = np.random.default_rng(3)
    batches = [_batch(rng, list(rng.integers(0, 4, 8))) for _ in range(10)]
    model, step = _classifier_step()
    ref_model, _ = _classifier_step()
    ref_opt = graphc.optim.SGD(ref_model.parameters(), lr=0.1)
    losses = [step(x, y) for x, y in batches]
    want = []
    for x, y in batches:
        ref_opt.zero_grad()
        loss = F.cross_entropy(ref_model(x), y)
        loss.backward()
        ref_opt.step()
        want.append(loss.item())
    got = {}

    def read():
        got["losses"] = [loss.item() for loss in losses]
        got["weight"] = model.weight.detach().numpy().copy()
        got["grad"] = model.weight.grad.numpy().copy()

    reader = threading.Thread(target=read)
    reader.start()
    reader.join()
    np.testing.assert_allclose(got["losses"], want, rtol=1e-5)
    np.testing.assert_allclose(got["weight"], ref_model.weight.detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(got["grad"], ref_model.weight.grad.numpy(), rtol=1e-5,
                               atol=1e-6)
