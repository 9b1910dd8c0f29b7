"""Review of the tenth session's asynchronous cuda calls (graphc/backends/cuda/executable.py,
"Asynchronous calls") as a user drives them: reads from another thread while calls run, a
compiled evaluation sharing the training step's parameters, batch sizes that retrace into a
second executable, and `close()` after a call whose kernels recorded an index error.

Fixed here: `close()` after an asynchronous call that failed raised the failure from the
first value it fetched and freed the device state with the other values still marked, so
every later read of the model's parameters failed ("stream ... is not a live gc_stream").
close() now waits for the call first, fetches every value, then raises the failure.

Fixed here too: a read that raised an earlier call's failure (the array stays marked) made
the executable forget which array its state slot held, so a later call passing another array
in that slot overwrote the value without fetching it first: the first array then read the
second's value. The slot forgets its holder only once a fetch succeeded.

Fixed here too: a read from one thread while another called the executable lost updates
(two threads making 30 calls of `w.add_(1)` and a reader left w at 40-46 of 52):
graphc.backends.residency dropped the mark before the owner's fetch waited for the call in
progress, so that call found its state array unmarked and uploaded the host's old value.
The mark now stays until the owner has written the value (`residency.fetched`, under the
executable's lock).

Fixed here too: two executables, each taking the other's state device to device, called
from two threads lost updates and, once marks stayed until fetched, hung (each held its own
lock and waited for the other's). A call now takes its lock and those of the executables it
takes values from in one order for the process.
Runs on the emulation (tests/cuda_support.py).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
from graphc.backends import residency
from graphc.errors import IndexOutOfRangeError
from tests.conftest import sgd_training_step

pytestmark = pytest.mark.usefixtures("cuda_runtime_built", "cuda_backend")


def _model_and_functions(backend: str | None):
    """(model, step, evaluate): an SGD-momentum training step and a no-grad evaluation over
    the same parameters, compiled for `backend` (None: eager, the reference)."""
    model, step = sgd_training_step(
        lambda: nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4)), lr=0.1)

    def evaluate(x):
        with graphc.no_grad():
            return model(x).sum(1)

    if backend is None:
        return model, step, evaluate
    return model, graphc.compile(step, backend=backend), graphc.compile(evaluate,
                                                                        backend=backend)


def _batches(rng, sizes):
    return [(graphc.tensor(rng.standard_normal((n, 6)).astype(np.float32)),
             graphc.tensor(rng.integers(0, 4, n))) for n in sizes]


def test_close_after_a_failed_asynchronous_call_fetches_every_value_then_raises():
    rng = np.random.default_rng(0)
    model, step, _ = _model_and_functions("cuda")
    for x, y in _batches(rng, [4, 4, 4]):
        step(x, y).item()
    x, y = _batches(rng, [4])[0]
    y = graphc.tensor(np.array([0, 9, 2, 3]))
    loss = step(x, y)  # returns before the device ran it: the failure is not known yet
    executable = step.executable
    with pytest.raises(IndexOutOfRangeError, match="failed in an earlier call"):
        executable.close()
    assert residency.count_marks(executable) == 0
    for p in model.parameters():  # readable, not "not a live gc_stream"
        assert np.isfinite(p.detach().numpy()).all()
    assert np.isfinite(loss.item())


def test_calls_with_retraced_batches_a_shared_evaluation_and_a_reading_thread_match_eager():
    """Steps at batch sizes 8, 5, 1, 7, 3 (a second executable after the first change, then a
    symbolic one) interleaved with a compiled evaluation on the same parameters, while another
    thread reads a weight in a loop: losses, evaluations, weights and .grads equal eager's."""
    rng = np.random.default_rng(5)
    batches = _batches(rng, [8, 8, 5, 8, 1, 5, 7, 8, 3, 8])
    model, step, evaluate = _model_and_functions("cuda")
    ref_model, ref_step, ref_evaluate = _model_and_functions(None)
    stop = threading.Event()

    def read_in_a_loop():
        while not stop.is_set():
            model[0].weight.detach().numpy().sum()

    reader = threading.Thread(target=read_in_a_loop)
    reader.start()
    try:
        losses, want, evaluations = [], [], []
        for k, (x, y) in enumerate(batches):
            losses.append(step(x, y))
            want.append(ref_step(x, y).item())
            if k % 3 == 2:
                evaluations.append((evaluate(x), ref_evaluate(x).numpy()))
    finally:
        stop.set()
        reader.join()
    np.testing.assert_allclose([loss.item() for loss in losses], want, rtol=1e-4, atol=1e-5)
    for got, expected in evaluations:
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4,
                                   atol=1e-5)
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-4, atol=1e-5)


def _add_one_in_place(w, x, y):
    loss = F.cross_entropy(x @ w, y)
    with graphc.no_grad():
        w.add_(1.0)
    return loss.detach()


def test_a_failed_read_then_a_call_with_another_state_array_keeps_the_first_ones_value():
    """A read that reports an earlier call's failure leaves the array marked; the slot must
    still know it holds that array's value, so a call passing another array there fetches it
    first (it dropped that, and the first array read the second's value)."""
    step = graphc.compile(_add_one_in_place, backend="cuda")
    rng = np.random.default_rng(2)
    x = graphc.tensor(rng.standard_normal((4, 6)).astype(np.float32))
    labels = graphc.tensor(np.array([0, 1, 2, 3]))
    first = graphc.tensor(np.zeros((6, 4), np.float32))
    second = graphc.tensor(np.full((6, 4), 100.0, np.float32))
    for _ in range(3):
        step(first, x, labels).item()
    step(first, x, graphc.tensor(np.array([0, 9, 2, 3])))  # first: 4 on the device
    with pytest.raises(IndexOutOfRangeError, match="failed in an earlier call"):
        first.numpy()
    step(second, x, labels)
    step(second, x, labels)
    assert len(step._entries) == 1  # the one executable: `second` takes `first`'s slot
    np.testing.assert_array_equal(first.numpy(), np.full((6, 4), 4.0, np.float32))
    np.testing.assert_array_equal(second.numpy(), np.full((6, 4), 102.0, np.float32))


def _count_in_place(w, x):
    with graphc.no_grad():
        w.add_(1.0)
    return (x * w.sum()).sum()


def test_a_call_while_another_thread_reads_the_state_keeps_every_update():
    """A read from another thread that is waiting for the executable (a call runs) must not
    let the next call upload the host array's old value: the mark was dropped before the
    value came, so the call found the array unmarked and lost the device's updates."""
    step = graphc.compile(_count_in_place, backend="cuda")
    w = graphc.tensor(np.zeros(8, np.float32))
    x = graphc.tensor(np.ones(3, np.float32))
    step(w, x)
    step(w, x)  # w = 2 on the device only
    executable = step.executable
    with executable._lock:  # as a call in progress on another thread
        reader = threading.Thread(target=lambda: w.numpy())
        reader.start()
        reader.join(0.3)  # the reader waits for the executable
        step(w, x)  # w = 3
    reader.join()
    np.testing.assert_array_equal(w.numpy(), np.full(8, 3.0, np.float32))


def test_calls_from_two_threads_and_a_reader_lose_no_update():
    step = graphc.compile(_count_in_place, backend="cuda")
    w = graphc.tensor(np.zeros(16, np.float32))
    x = graphc.tensor(np.ones(3, np.float32))
    step(w, x)
    step(w, x)
    losses, stop = [], threading.Event()

    def call():
        for _ in range(15):
            losses.append(step(w, x))

    def read():
        while not stop.is_set():
            w.numpy().sum()

    threads = [threading.Thread(target=call) for _ in range(2)] + [threading.Thread(
        target=read)]
    for thread in threads:
        thread.start()
    for thread in threads[:2]:
        thread.join()
    stop.set()
    threads[2].join()
    np.testing.assert_array_equal(w.numpy(), np.full(16, 32.0, np.float32))
    assert sorted(loss.item() for loss in losses) == [3.0 * 16 * k for k in range(3, 33)]


def test_two_threads_reading_one_loss_while_the_executable_is_busy_both_get_its_value():
    step = graphc.compile(_count_in_place, backend="cuda")
    w = graphc.tensor(np.zeros(8, np.float32))
    x = graphc.tensor(np.ones(3, np.float32))
    for _ in range(3):
        loss = step(w, x)  # the third: 3 * 8 * 3 = 72, on the device until read
    got = []
    with step.executable._lock:  # as a call in progress on another thread
        readers = [threading.Thread(target=lambda: got.append(loss.item())) for _ in range(2)]
        for reader in readers:
            reader.start()
            reader.join(0.3)  # the first waits for the executable; the second must too
        assert got == [] or got == [72.0], got
    for reader in readers:
        reader.join()
    assert got == [72.0, 72.0]


def _add_one_reading(mine, theirs):
    with graphc.no_grad():
        mine.add_(theirs.sum() * 0 + 1)
    return mine.sum()


def test_two_executables_taking_each_others_state_from_two_threads_neither_hang_nor_lose():
    """Each step updates its own state and reads the other's (device to device from the
    executable holding it). Each held its own lock and waited for the other's (a hang), or,
    before the marks stayed until fetched, uploaded an out-of-date host copy (lost updates).
    The locks of the executables a call takes from are now acquired in one order."""
    first_step = graphc.compile(_add_one_reading, backend="cuda")
    second_step = graphc.compile(_add_one_reading, backend="cuda")
    a = graphc.tensor(np.zeros(16, np.float32))
    b = graphc.tensor(np.zeros(16, np.float32))
    for _ in range(2):
        first_step(a, b)
        second_step(b, a)

    def calls(step, mine, theirs):
        for _ in range(400):
            step(mine, theirs)

    threads = [threading.Thread(target=calls, args=(first_step, a, b), daemon=True),
               threading.Thread(target=calls, args=(second_step, b, a), daemon=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "the two calls wait on each other"
    np.testing.assert_array_equal(a.numpy(), np.full(16, 402.0, np.float32))
    np.testing.assert_array_equal(b.numpy(), np.full(16, 402.0, np.float32))
