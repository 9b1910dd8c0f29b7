"""Review of the ninth session's third wave: the user's BLAS thread count around compiled
calls (graphc.backends.cpu.threads, `use`/`restore`, thread_ir.COUNTS_IR) as a hostile
user drives it.

Fixed here: a count the user set while another thread's compiled call was in flight was
lost: the last call out put back the count from before the first call in (`@user`), so
`openblas_set_num_threads(4)` on the main thread during a worker's call read back as the old
count after it. The native side now remembers the count graphc itself last set (`@ours`):
a count found different from it, at a call's entry or at the last one's exit, is the user's.

Fixed here too: a child forked after the parent ran a compiled call on two threads hung in
its first compiled call with a parallel loop (libgomp's team did not survive the fork, and
libgomp waits for it); a forked child's compiled calls now run on one thread.
"""

import multiprocessing
import threading

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
from graphc.backends.cpu import threads  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from tests import blas_threads_support  # noqa: E402

openblas = blas_threads_support.openblas  # the fixture: numpy's OpenBLAS, count given back


def _held_gemm(fixed: int):
    """A compiled GEMM on `fixed` threads whose native run waits for `release`."""
    a = np.random.default_rng(fixed).standard_normal((64, 64)).astype(np.float32)
    f = graphc.compile(lambda x, y: x @ y, backend="cpu")
    x = graphc.tensor(a)
    f(x, x)
    f.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=fixed)
    inside, release = threading.Event(), threading.Event()
    run = f.executable._run

    def held(*args):
        inside.set()
        assert release.wait(60)
        return run(*args)

    f.executable._run = held
    results = []
    caller = threading.Thread(target=lambda: results.append(f(x, x).numpy()), daemon=True)
    return caller, inside, release, results, a @ a


@pytest.mark.parametrize("users_new", [1, 3])
def test_a_count_set_while_another_threads_call_is_in_flight_is_kept(openblas, users_new):
    set_count, get_count = openblas.set, openblas.get
    set_count(1)
    caller, inside, release, results, want = _held_gemm(2)
    caller.start()
    try:
        assert inside.wait(60)
        assert get_count() == 2  # the call in flight runs on its own count
        set_count(users_new)  # the user's new wish, on the main thread
    finally:
        release.set()
        caller.join(timeout=60)
    assert not caller.is_alive()
    np.testing.assert_allclose(results[0], want, rtol=1e-4, atol=1e-4)
    assert get_count() == users_new
    assert threads.blas_threads() == users_new


def test_the_users_count_still_comes_back_after_overlapping_calls(openblas):
    """Two calls in flight on different counts, the user setting nothing: the last one out
    gives back the count from before the first one in."""
    set_count, get_count = openblas.set, openblas.get
    set_count(1)
    first, inside1, release1, results1, want = _held_gemm(2)
    second, inside2, release2, results2, _ = _held_gemm(2)
    first.start()
    second.start()
    try:
        assert inside1.wait(60) and inside2.wait(60)
        assert get_count() == 2
        release1.set()
        first.join(timeout=60)
        assert get_count() == 2  # the second call is still in flight
    finally:
        release1.set()
        release2.set()
        first.join(timeout=60)
        second.join(timeout=60)
    assert get_count() == 1
    for got in results1 + results2:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_count_set_during_a_call_then_a_second_call_still_ends_on_it(openblas):
    """The user's count set during the first call; a second call enters (and sets its own)
    and leaves last: the user's new count comes back, not the one from before the first."""
    set_count, get_count = openblas.set, openblas.get
    set_count(1)
    first, inside1, release1, _, _ = _held_gemm(2)
    second, inside2, release2, results2, want = _held_gemm(2)
    first.start()
    try:
        assert inside1.wait(60)
        set_count(3)
        second.start()
        assert inside2.wait(60)
        assert get_count() == 2
        release1.set()
        first.join(timeout=60)
    finally:
        release1.set()
        release2.set()
        first.join(timeout=60)
        second.join(timeout=60)
    np.testing.assert_allclose(results2[0], want, rtol=1e-4, atol=1e-4)
    assert get_count() == 3


def _child_call(queue, f, x, want):
    got = f(x, x).numpy()
    queue.put(float(np.abs(got - want).max()))


def test_a_child_forked_after_a_two_thread_call_runs_compiled_calls():
    """The parent's elementwise kernel forked libgomp's team; the child's same call must
    finish (it hung in GOMP_parallel) with the same values."""
    if threads.most_threads() < 2:
        pytest.skip("one core: graphc never forks a team")
    f = graphc.compile(lambda x, y: (x * 2.0).relu() + y, backend="cpu")
    a = np.random.default_rng(5).standard_normal((512, 512)).astype(np.float32)
    x = graphc.tensor(a)
    f(x, x)
    assert threads.reads_openmp_count(f.executable.lowered.ir_text)
    f.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=2)
    want = f(x, x).numpy().copy()  # on two threads: the team exists now
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_call, args=(queue, f, x, want))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child hung in its compiled call")
    assert child.exitcode == 0 and queue.get(timeout=5) == 0.0
