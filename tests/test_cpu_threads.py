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


# ---- the thread count of the calling thread ---------------------------------------------------
def _openmp():
    import ctypes

    from graphc.backends.cpu import llvm

    path = llvm.load_openmp()
    if path is None:
        pytest.skip("no libgomp: graphc's loops and GEMMs run on one thread")
    return ctypes.CDLL(path)


def _mkl() -> bool:
    return any("MKL" in what or "mkl" in path for path, what in threads.policy().items())


def test_use_reapplies_a_count_another_library_changed_and_restore_gives_it_back():
    openmp = _openmp()
    openmp.omp_set_num_threads(3)
    first = threads.use(1)
    assert first[0] == 3 and openmp.omp_get_max_threads() == 1
    openmp.omp_set_num_threads(2)  # e.g. torch.set_num_threads(2) on this thread
    second = threads.use(1)
    assert second[0] == 2 and openmp.omp_get_max_threads() == 1
    third = threads.use(1)
    assert third is None or third[0] is None  # this thread's count: nothing to give back
    for given in (third, second, first):  # innermost first, as nested calls end
        if given is not None:
            threads.restore(given)
    assert openmp.omp_get_max_threads() == 3
    openmp.omp_set_num_threads(threads.most_threads())


def test_use_without_openmp_sets_the_blas_count_and_leaves_the_threads_own():
    """`use(n, openmp=False)`: a module that forks no OpenMP region of its own needs only the
    BLAS's count; the calling thread's OpenMP count is neither read nor set (where MKL forks
    libgomp's team, which may read it, it is set as before). The BLAS's count is read back,
    never remembered: this test once failed in an xdist worker, where a count set behind
    graphc's back made its remembered count stale (`use` then skipped the setter), or a split
    convolution on another thread held the raw count at one (`blas_threads()` now reads the
    count the split holds aside); docs/performance.md, "The user's thread counts"."""
    openmp = _openmp()
    blas.resolve_blas()
    if threads.blas_threads() is None:
        pytest.skip(f"this BLAS's thread count cannot be read: {threads.policy()}")
    if _mkl():
        pytest.skip("MKL on libgomp's team: the OpenMP count is always set")
    users = threads.blas_threads()
    openmp.omp_set_num_threads(3)
    try:
        for n in (1, 2, 1):
            given = threads.use(n, openmp=False)
            try:
                assert given is None or given[0] is None
                assert openmp.omp_get_max_threads() == 3 and threads.blas_threads() == n
            finally:
                if given is not None:
                    threads.restore(given)
            assert threads.blas_threads() == users
    finally:
        openmp.omp_set_num_threads(threads.most_threads())


def test_only_a_module_that_forks_openmp_regions_reads_the_openmp_count(monkeypatch):
    """A GEMM-only executable sets only the BLAS's count per call; one with a parallel
    elementwise kernel sets the OpenMP count as well; both give numpy's numbers on every
    count."""
    if threads.most_threads() < 2:
        pytest.skip("one core: graphc never sets a thread count")
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal((96, 96)).astype(np.float32) for _ in range(2))
    big = rng.standard_normal(1 << 17).astype(np.float32)
    gemm = graphc.compile(lambda x, y: x @ y, backend="cpu")
    scale = graphc.compile(lambda x: (x * 2.0).relu(), backend="cpu")
    gemm(graphc.tensor(a), graphc.tensor(b))
    scale(graphc.tensor(big))
    assert not threads.reads_openmp_count(gemm.executable.lowered.ir_text)
    assert threads.reads_openmp_count(scale.executable.lowered.ir_text)
    asked = []
    real_use = threads.use

    def use(n, openmp=True):
        asked.append(openmp)
        return real_use(n, openmp)

    monkeypatch.setattr(threads, "use", use)
    for fixed in (1, 2):
        for f in (gemm, scale):
            f.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=fixed)
        np.testing.assert_allclose(gemm(graphc.tensor(a), graphc.tensor(b)).numpy(), a @ b,
                                   rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(scale(graphc.tensor(big)).numpy(),
                                      np.maximum(big * 2.0, 0))
    assert asked == [False, True, False, True]


def test_a_module_with_no_parallel_work_runs_without_the_chooser(monkeypatch):
    """A small elementwise kernel forks no OpenMP region and calls no BLAS: no thread count
    changes what it does, so its calls run on one thread with no thread bookkeeping (a chooser
    of one thread, `use` never called); a GEMM's executable keeps its chooser."""
    if threads.most_threads() < 2:
        pytest.skip("one core: every chooser has one thread")
    small = graphc.compile(lambda x: (x * 2.0).relu(), backend="cpu")
    x = graphc.tensor(np.arange(-4, 4, dtype=np.float32))
    small(x)
    assert small.executable.thread_chooser.most == 1
    assert not small.executable.thread_chooser.explores
    gemm = graphc.compile(lambda a, b: a @ b, backend="cpu")
    a = graphc.tensor(np.eye(8, dtype=np.float32))
    gemm(a, a)
    assert gemm.executable.thread_chooser.most == threads.most_threads()
    asked = []
    monkeypatch.setattr(threads, "use", lambda *a: asked.append(a))
    for _ in range(3):
        np.testing.assert_array_equal(small(x).numpy(), np.maximum(np.arange(-4, 4) * 2.0, 0))
    assert asked == []


def test_a_compiled_call_leaves_the_callers_openmp_count_as_it_found_it():
    openmp = _openmp()
    if threads.most_threads() < 2:
        pytest.skip("one core: graphc never sets a thread count")
    f = graphc.compile(lambda x: (x * 2.0).relu(), backend="cpu")
    x = graphc.tensor(np.arange(-4, 4, dtype=np.float32))
    f(x)
    f.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=1)
    openmp.omp_set_num_threads(5)
    np.testing.assert_array_equal(f(x).numpy(), np.maximum(np.arange(-4, 4) * 2.0, 0))
    assert openmp.omp_get_max_threads() == 5
    openmp.omp_set_num_threads(threads.most_threads())


def test_a_fixed_count_is_applied_to_the_call(monkeypatch):
    """A profiling copy of an executable runs on the count the original chose, not on
    whatever count the calling thread happens to hold."""
    if threads.most_threads() < 2:
        pytest.skip("one core: graphc never sets a thread count")
    f = graphc.compile(lambda x: x + 1.0, backend="cpu")
    x = graphc.tensor(np.zeros(4, np.float32))
    f(x)
    applied = []
    real_use = threads.use

    def use(n, openmp=True):
        applied.append(n)
        return real_use(n, openmp)

    monkeypatch.setattr(threads, "use", use)
    for fixed in (1, 2):
        f.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=fixed)
        f(x)
    assert applied == [1, 2]


def test_cores_free_reads_the_runnable_tasks():
    import os

    free = threads.cores_free()
    if free is None:
        pytest.skip("no /proc/loadavg on this system: trials of all cores are not gated")
    assert free <= (os.cpu_count() or 1) - 1  # the caller itself is running


# ---- waiting: GOMP_SPINCOUNT before libgomp loads ----------------------------------------------
def _fresh_python(code: str, **env: str) -> str:
    import os
    import subprocess
    import sys

    clean = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


_REPORT = ("import os, graphc; print(os.environ.get('GOMP_SPINCOUNT'), '|', "
           "graphc.config.set_openmp_waiting())")


def test_import_graphc_sets_the_spin_count_before_libgomp_loads():
    assert _fresh_python(_REPORT) == "20000 | graphc's GOMP_SPINCOUNT=20000"
    assert _fresh_python(_REPORT, GOMP_SPINCOUNT="7") == "7 | the user's GOMP_SPINCOUNT=7"


def test_a_libgomp_loaded_before_graphc_is_reported_not_changed():
    _openmp()
    got = _fresh_python("import ctypes; ctypes.CDLL('libgomp.so.1'); " + _REPORT)
    assert got.startswith("None | libgomp's own default") and "import torch" in got


# ---- the chooser -------------------------------------------------------------------------------
MS = 1e-3


def _drive(chooser: ThreadChooser, cost, calls: int) -> list[int]:
    """`calls` calls; `cost[n]` is a call's seconds on n threads, or a callable of the call's
    index giving them."""
    used = []
    for i in range(calls):
        n = chooser.pick()
        used.append(n)
        seconds = cost[n](i) if callable(cost[n]) else cost[n]
        chooser.record(n, seconds)
    return used


def _idle(cores: int = 1):
    return lambda: cores


def _time_lost(used: list[int], cost: dict, best: int) -> float:
    """The share of the time spent beyond running every call on `best` threads."""
    spent = sum(cost[n] for n in used)
    return spent / (len(used) * cost[best]) - 1


def test_the_chooser_starts_on_one_thread_and_moves_to_all_cores_when_they_are_faster():
    chooser = ThreadChooser(2, free_cores=_idle())
    cost = {2: 1.0 * MS, 1: 1.8 * MS}
    used = _drive(chooser, cost, 20000)
    assert used[:ThreadChooser.WARMUP + ThreadChooser.MIN_GAP] == [1] * (
        ThreadChooser.WARMUP + ThreadChooser.MIN_GAP)
    assert chooser.current == 2
    assert used[-10000:].count(1) < 0.01 * 10000  # trials of one thread are rare
    assert _time_lost(used, cost, 2) < 0.03


def test_the_chooser_never_tries_all_cores_while_no_core_is_free():
    asked = []

    def busy():
        asked.append(1)
        return 0

    chooser = ThreadChooser(2, free_cores=busy)
    assert _drive(chooser, {2: 50 * MS, 1: 1 * MS}, 5000) == [1] * 5000
    assert asked  # it did look


def test_trials_that_lose_cost_a_bounded_share_of_the_time():
    """Under load a call on two threads costs 50 calls on one: trials stay within budget."""
    chooser = ThreadChooser(2, free_cores=_idle())  # the load is invisible to the gate
    cost = {2: 50 * MS, 1: 1 * MS}
    used = _drive(chooser, cost, 50000)
    assert chooser.current == 1
    assert used.count(2) < 10  # each trial was one call: hopeless at once
    assert _time_lost(used, cost, 1) < 2 * ThreadChooser.BUDGET


def test_the_chooser_moves_to_one_thread_under_load_and_back_when_it_lifts():
    chooser = ThreadChooser(2, free_cores=_idle())
    idle = {2: 1.0 * MS, 1: 1.8 * MS}
    _drive(chooser, idle, 2000)
    assert chooser.current == 2
    loaded = {2: 60 * MS, 1: 1.9 * MS}
    used = _drive(chooser, loaded, 20000)
    assert chooser.current == 1
    assert used[:30].count(2) <= ThreadChooser.MIN_GAP + 2  # it noticed within a few calls
    assert _time_lost(used, loaded, 1) < 0.05
    _drive(chooser, idle, 100000)  # the load is gone
    assert chooser.current == 2


def test_the_chooser_weighs_the_slow_calls_of_a_bimodal_count():
    """Under load two threads run most calls fast and some very slow: one thread stays."""
    chooser = ThreadChooser(2, free_cores=_idle())

    def spiky(i):
        return 6.0 * MS if i % 3 == 2 else 0.7 * MS

    _drive(chooser, {2: spiky, 1: 1.3 * MS}, 5000)
    assert chooser.current == 1


def test_a_single_parked_call_on_one_thread_does_not_send_the_chooser_to_all_cores():
    chooser = ThreadChooser(2, free_cores=_idle())

    def parked(i):
        return 40 * MS if i % 7 == 0 else 1.0 * MS

    used = _drive(chooser, {2: 1.1 * MS, 1: parked}, 3000)
    assert chooser.current == 1 and used.count(2) < 0.05 * len(used)


def test_a_hopeless_trial_stops_after_one_call():
    chooser = ThreadChooser(2, free_cores=_idle())
    used = _drive(chooser, {2: 50 * MS, 1: 1 * MS}, 40)
    first = ThreadChooser.WARMUP + ThreadChooser.MIN_GAP
    assert used[first] == 2 and used.count(2) == 1


def test_a_fixed_chooser_never_explores():
    chooser = ThreadChooser(2, fixed=1, free_cores=_idle())
    assert _drive(chooser, {2: 1 * MS, 1: 5 * MS}, 40) == [1] * 40


def test_one_thread_machines_never_switch():
    chooser = ThreadChooser(1, free_cores=_idle())
    assert _drive(chooser, {1: 1 * MS}, 50) == [1] * 50


def test_slow_calls_try_all_cores_after_a_few_calls_not_after_min_gap():
    """A 0.5 s step (ResNet-18's) tries all cores after MIN_GAP_CALLS calls that took
    MIN_GAP_SECONDS, not after MIN_GAP of them, and keeps them when they pay."""
    chooser = ThreadChooser(2, free_cores=_idle())
    used = _drive(chooser, {2: 0.3, 1: 0.5}, 20)
    first = ThreadChooser.WARMUP + ThreadChooser.MIN_GAP_CALLS
    assert used[:first] == [1] * first and used[first] == 2
    assert chooser.current == 2 and used[-5:] == [2] * 5


def test_one_slow_call_on_all_cores_sends_the_next_calls_to_one_thread():
    """Load arrives while the chooser is on all cores: a parallel call now waits for a
    parked thread (50x). Only the call that showed it runs on all cores; the next ones try
    one thread and keep it."""
    idle = {2: 1.0 * MS, 1: 1.8 * MS}
    for switched_calls_ago in (ThreadChooser.TRIAL, ThreadChooser.TRIAL + 2, 500):
        chooser = ThreadChooser(2, free_cores=_idle())
        while chooser.current != 2:
            _drive(chooser, idle, 1)
        _drive(chooser, idle, switched_calls_ago)  # within MIN_GAP of the switch, or long after
        used = _drive(chooser, {2: 50 * MS, 1: 2.0 * MS}, ThreadChooser.MIN_GAP)
        assert used == [2] + [1] * (ThreadChooser.MIN_GAP - 1) and chooser.current == 1


def test_a_one_off_slow_call_on_an_idle_machine_keeps_all_cores():
    """A single slow call (a page fault storm, another process's blip) on all cores costs a
    short trial of one thread at most, and all cores stay."""
    chooser = ThreadChooser(2, free_cores=_idle())
    _drive(chooser, {2: 1.0 * MS, 1: 1.8 * MS}, 2000)

    def blip(i):
        return 3.5 * MS if i == 0 else 1.0 * MS

    used = _drive(chooser, {2: blip, 1: 1.8 * MS}, 200)
    assert chooser.current == 2 and used.count(1) <= ThreadChooser.TRIAL


def test_slow_calls_on_all_cores_every_few_calls_cost_a_bounded_share():
    """A machine whose other load comes and goes every few calls: the quick fall-backs to
    one thread are paid from the same budget as the trials."""
    chooser = ThreadChooser(2, free_cores=_idle())

    def bursty(i):
        return 4.0 * MS if i % 5 == 0 else 1.0 * MS

    cost = {2: bursty, 1: 1.8 * MS}
    used = _drive(chooser, cost, 20000)
    mean_all_cores = (4.0 + 4 * 1.0) / 5 * MS
    spent = sum(cost[n](i) if n == 2 else cost[n] for i, n in enumerate(used))
    assert spent / (len(used) * mean_all_cores) - 1 < 0.05


def _drive_waking(chooser: ThreadChooser, one: float, steady: float, wake: float,
                  calls: int) -> list[int]:
    """`calls` calls of a step that takes `one` seconds on one thread and `steady` on all
    cores, plus `wake` for a call on all cores right after a call on one thread (the team's
    threads slept, the other core's caches are cold)."""
    used: list[int] = []
    for _ in range(calls):
        n = chooser.pick()
        seconds = one if n == 1 else steady + (wake if not used or used[-1] == 1 else 0.0)
        used.append(n)
        chooser.record(n, seconds)
    return used


def test_a_trial_of_all_cores_is_not_judged_by_the_call_that_wakes_the_team():
    """Two threads 1.3x faster, but the first call after one-thread calls pays a wake-up of
    half a call: judged with that call, every trial lost (mean 0.94 of one thread's) and the
    step stayed on one thread; the wake-up call is now left out of the verdict."""
    chooser = ThreadChooser(2, free_cores=_idle())
    used = _drive_waking(chooser, one=1.0 * MS, steady=0.77 * MS, wake=0.5 * MS, calls=2000)
    assert chooser.current == 2
    assert used[-1000:].count(1) < 0.01 * 1000


def test_a_lossy_trial_after_close_ones_waits_its_own_excess_only():
    """All cores were about as fast as one thread (close trials, which cost nothing), then
    one trial met a one-off slow call, then all cores became twice as fast: the next trial
    comes after that one trial's excess, not after it multiplied by a backoff that every
    close trial had doubled before."""
    chooser = ThreadChooser(2, free_cores=_idle())
    _drive(chooser, {2: 0.95 * MS, 1: 1.0 * MS}, 1000)
    assert chooser.current == 1 and chooser.backoff == 1
    calls_on_all_cores = []

    def faster_after_a_blip(i):
        calls_on_all_cores.append(i)
        return 5.0 * MS if len(calls_on_all_cores) == 1 else 0.5 * MS  # the first: hopeless

    used = _drive(chooser, {2: faster_after_a_blip, 1: 1.0 * MS}, 1000)
    assert chooser.current == 2
    second_trial = calls_on_all_cores[1]
    assert second_trial - calls_on_all_cores[0] < 300  # 4 ms of excess / 2%: 200 ms of calls
    assert used[second_trial:].count(1) < 0.03 * len(used[second_trial:])


def test_an_all_cores_trial_that_loses_under_load_still_ends_after_one_call():
    """The wake-up call is left out of the verdict, not out of the hopeless rule."""
    chooser = ThreadChooser(2, free_cores=_idle())
    used = _drive_waking(chooser, one=1.0 * MS, steady=50 * MS, wake=0.5 * MS, calls=200)
    assert chooser.current == 1
    assert all(used[k + 1] == 1 for k, n in enumerate(used[:-1]) if n == 2)
