"""The user's thread counts (graphc.backends.cpu.threads, `use`/`restore`): a compiled call
runs on the count its ThreadChooser picks, and after it the user's numpy sees the BLAS count
it had before (OpenBLAS's count is process-wide), and the calling thread its OpenMP count:
after a normal call, after an exception in the native run, with several Python threads
calling at once, in a forked child, and where the user set the count between calls (through
ctypes or threadpoolctl)."""

import ctypes
import multiprocessing
import threading

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
from graphc.backends.cpu import blas, llvm, threads  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from tests import blas_threads_support  # noqa: E402

openblas = blas_threads_support.openblas  # the fixture: numpy's OpenBLAS, count given back


def _gemm(fixed: int):
    """A compiled GEMM (no OpenMP region of its own) held to `fixed` threads, and its
    inputs."""
    rng = np.random.default_rng(fixed)
    a, b = (rng.standard_normal((128, 128)).astype(np.float32) for _ in range(2))
    f = graphc.compile(lambda x, y: x @ y, backend="cpu")
    x, y = graphc.tensor(a), graphc.tensor(b)
    f(x, y)
    f.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=fixed)
    return f, (x, y), a @ b


def _spy(executable, seen: list, fail: bool = False) -> None:
    """Note the BLAS's count inside each native run (and raise there, with `fail`)."""
    run = executable._run

    def spied(*args):
        seen.append(threads.blas_threads())
        if fail:
            raise KeyboardInterrupt("stand-in for an interrupt in the native run")
        return run(*args)

    executable._run = spied


@pytest.mark.parametrize("users", [1, 2])
def test_numpy_finds_the_users_blas_count_after_a_compiled_call(openblas, users):
    """The call runs on the chooser's count (the other one); numpy's next GEMM on the user's."""
    ours = 3 - users
    openblas.set(users)
    f, args, want = _gemm(ours)
    seen = []
    _spy(f.executable, seen)
    for _ in range(3):
        np.testing.assert_allclose(f(*args).numpy(), want, rtol=1e-4, atol=1e-4)
        assert openblas.get() == users
    assert seen == [ours] * 3


@pytest.mark.parametrize("users", [1, 2])
def test_the_users_counts_come_back_after_an_exception_in_the_native_run(openblas, users):
    openmp_path = llvm.load_openmp()
    f = graphc.compile(lambda x: (x * 2.0).relu(), backend="cpu")
    x = graphc.tensor(np.ones(1 << 17, np.float32))
    f(x)
    assert threads.reads_openmp_count(f.executable.lowered.ir_text)
    openmp = ctypes.CDLL(openmp_path)
    openmp.omp_set_num_threads(users)
    openblas.set(users)
    f.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=3 - users)
    seen = []
    _spy(f.executable, seen, fail=True)
    with pytest.raises(KeyboardInterrupt, match="stand-in"):
        f(x)
    assert seen == [3 - users]
    assert openblas.get() == users and openmp.omp_get_max_threads() == users
    openmp.omp_set_num_threads(threads.most_threads())


def test_a_count_the_user_sets_between_calls_is_honoured(openblas):
    """graphc remembers no count: what the user set last is what numpy runs on after the next
    call, and what the call finds when the chooser's count is the same."""
    f, args, want = _gemm(2)
    seen = []
    _spy(f.executable, seen)
    for users in (1, 2, 1, 1, 2):
        openblas.set(users)
        np.testing.assert_allclose(f(*args).numpy(), want, rtol=1e-4, atol=1e-4)
        assert openblas.get() == users
    assert seen == [2] * 5
    threadpoolctl = pytest.importorskip("threadpoolctl", reason="threadpoolctl not installed")
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        f(*args)
        assert openblas.get() == 1
    assert openblas.get() == 2


def test_concurrent_calls_from_python_threads_end_on_the_users_count(openblas):
    """Two executables on different counts called from three threads at once: each call's
    count is process-wide, so they see each other's, but the last one out gives the user's
    back."""
    openblas.set(1)
    work = [_gemm(2), _gemm(1), _gemm(2)]
    failures = []

    def calls(f, args, want):
        try:
            for _ in range(30):
                np.testing.assert_allclose(f(*args).numpy(), want, rtol=1e-4, atol=1e-4)
        except Exception as error:  # noqa: BLE001 (reported below)
            failures.append(error)

    runners = [threading.Thread(target=calls, args=w, daemon=True) for w in work]
    for runner in runners:
        runner.start()
    for runner in runners:
        runner.join(timeout=300)
    assert not any(r.is_alive() for r in runners), "a compiled call never returned"
    assert not failures, failures
    assert openblas.get() == 1


def _child_count(queue, getter_name, path):
    library = ctypes.CDLL(path)
    getter = getattr(library, getter_name)
    getter.restype = ctypes.c_int
    a = np.ones((256, 256), np.float32)
    queue.put((getter(), float((a @ a)[0, 0])))


def test_a_child_forked_during_a_call_gets_the_users_count(openblas):
    """Another thread is inside a compiled call (its count set) when the process forks: in
    the child that call never ends, so the fork hook gives the child the user's count."""
    openblas.set(1)
    f, args, want = _gemm(2)
    inside, release = threading.Event(), threading.Event()
    run = f.executable._run

    def held(*a):
        inside.set()
        release.wait(60)
        return run(*a)

    f.executable._run = held
    caller = threading.Thread(target=lambda: f(*args), daemon=True)
    caller.start()
    try:
        assert inside.wait(60)
        assert openblas.get() == 2  # the call in flight runs on its own count
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_child_count,
                                args=(queue, openblas.get.__name__, blas.resolve_blas().path))
        child.start()
        child.join(timeout=120)
        if child.is_alive():
            child.kill()
            pytest.fail("the forked child hung")
        assert child.exitcode == 0 and queue.get(timeout=5) == (1, 256.0)
    finally:
        release.set()
        caller.join(timeout=60)
    assert openblas.get() == 1
