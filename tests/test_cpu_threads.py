"""One owner of the cores (graphc.backends.cpu.threads): the BLAS runs its jobs on libgomp's
team, results do not change, forked children and concurrent callers keep working, and the
per-executable thread chooser keeps the faster thread count."""

import multiprocessing
import threading

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
from graphc.backends.cpu import blas, threads  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402


def _shared() -> bool:
    return any(p.startswith("shared") for p in threads.policy().values())


def test_the_blas_is_handed_to_the_one_pool_and_gives_the_same_numbers():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 200)).astype(np.float32)
    b = rng.standard_normal((200, 400)).astype(np.float32)
    before = a.astype(np.float64) @ b.astype(np.float64)
    found = blas.resolve_blas()
    assert found.path in threads.policy()
    if threads.most_threads() > 1 and not _shared():
        pytest.skip(f"this BLAS keeps its own threads: {threads.policy()}")
    f = graphc.compile(lambda x, y: x @ y, backend="cpu")
    got = f(graphc.tensor(a), graphc.tensor(b)).numpy()
    # numpy's own matmul now runs on the same pool too
    np.testing.assert_allclose(got, before, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(a @ b, before, rtol=1e-4, atol=1e-3)


def test_concurrent_gemms_from_python_threads_all_finish():
    blas.resolve_blas()
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    want = a @ a
    errors = []

    def work():
        for _ in range(20):
            if not np.array_equal(a @ a, want):
                errors.append("a GEMM gave other numbers")

    workers = [threading.Thread(target=work) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers), "a GEMM never returned"
    assert errors == []


def _child_matmul(queue):
    a = np.ones((512, 512), np.float32)
    queue.put(float((a @ a)[0, 0]))


def test_a_forked_child_can_still_multiply():
    blas.resolve_blas()
    a = np.ones((512, 512), np.float32)
    a @ a  # the parent's pool has run
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_matmul, args=(queue,))
    child.start()
    child.join(timeout=120)
    if child.is_alive():
        child.kill()
        pytest.fail("a GEMM in a forked child hung")
    assert child.exitcode == 0 and queue.get(timeout=5) == 512.0


def test_the_threads_setting_is_checked(monkeypatch):
    from graphc import config
    from graphc.errors import ArgumentError

    monkeypatch.setenv("GRAPHC_BLAS_THREADS", "many")
    with pytest.raises(ArgumentError, match="GRAPHC_BLAS_THREADS: expected 'shared' or "
                                            "'native', got 'many'"):
        config.blas_threads()


# ---- the chooser -------------------------------------------------------------------------------
class _Clock:
    """Fake time: advances by each call's cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _chooser(most: int, fixed=None):
    clock = _Clock()
    return ThreadChooser(most, fixed=fixed, clock=clock), clock


def _drive(chooser: ThreadChooser, clock: _Clock, cost: dict[int, float], calls: int,
           ) -> list[int]:
    used = []
    for _ in range(calls):
        n = chooser.pick()
        used.append(n)
        clock.now += cost[n]
        chooser.record(n, cost[n])
    return used


MS = 1e-3


def test_the_chooser_keeps_all_threads_while_they_are_faster():
    chooser, clock = _chooser(2)
    used = _drive(chooser, clock, {2: 1.0 * MS, 1: 1.8 * MS}, 20000)
    assert chooser.current == 2
    assert used.count(1) < 0.01 * len(used)  # trials of one thread are rare


def test_the_chooser_moves_to_one_thread_under_load_and_back_when_it_lifts():
    chooser, clock = _chooser(2)
    _drive(chooser, clock, {2: 1.0 * MS, 1: 1.8 * MS}, 500)
    loaded = _drive(chooser, clock, {2: 60 * MS, 1: 1.9 * MS}, 20000)  # a core taken
    assert chooser.current == 1
    slow = loaded.count(2)
    assert slow * 60 * MS < 0.05 * (len(loaded) - slow) * 1.9 * MS  # < 5% of the time lost
    _drive(chooser, clock, {2: 1.0 * MS, 1: 1.8 * MS}, 40000)  # the load is gone
    assert chooser.current == 2


def test_the_chooser_weighs_the_slow_calls_of_a_bimodal_count():
    """Under load two threads run most calls fast and some very slow: the mean decides."""
    chooser, clock = _chooser(2)
    chooser.current = 1
    spiky = iter([0.7 * MS, 0.7 * MS, 6.0 * MS] * 20000)
    for _ in range(5000):
        n = chooser.pick()
        cost = next(spiky) if n == 2 else 1.3 * MS
        clock.now += cost
        chooser.record(n, cost)
    assert chooser.current == 1


def test_the_first_calls_try_both_counts_so_a_loaded_machine_costs_two_slow_calls():
    chooser, clock = _chooser(2)
    used = _drive(chooser, clock, {2: 50 * MS, 1: 1 * MS}, 10)
    assert used[:4] == [2, 2, 1, 1] and used[4:] == [1] * 6


def test_a_hopeless_trial_stops_after_one_call():
    chooser, clock = _chooser(2)
    _drive(chooser, clock, {2: 50 * MS, 1: 1 * MS}, 4)  # settled on one thread
    clock.now += 10.0  # long after: a trial is due once MIN_CALLS calls have run
    used = _drive(chooser, clock, {2: 50 * MS, 1: 1 * MS}, ThreadChooser.MIN_CALLS + 10)
    assert used.count(2) == 1 and used[ThreadChooser.MIN_CALLS] == 2


def test_a_fixed_chooser_never_explores():
    chooser, clock = _chooser(2, fixed=1)
    assert _drive(chooser, clock, {2: 1 * MS, 1: 5 * MS}, 40) == [1] * 40


def test_one_thread_machines_never_switch():
    chooser, clock = _chooser(1)
    assert _drive(chooser, clock, {1: 1 * MS}, 50) == [1] * 50
