"""threads: one owner of the cores for the CPU backend.

Two thread pools on two cores lose to one thread: libgomp's team (graphc's parallel loops)
and OpenBLAS's own pthreads pool (its GEMMs) both spin after their work, each taking the
cores from the other. PERF_NOTES measured a compiled MLP step at 7.6-16 ms with both pools
against 2.3 ms with one thread. So graphc makes libgomp the only pool in the process that
graphc drives:

- Parallel loops of generated code fork with `GOMP_parallel` (graphc.backends.cpu.kernels).
- OpenBLAS keeps choosing how to split a GEMM (its thresholds decide whether a product is
  big enough to go parallel, and into how many jobs), but runs the jobs on libgomp's team:
  `install(library)` hands OpenBLAS a caller-managed threading callback
  (`openblas_set_threads_callback_function`, OpenBLAS 0.3.27 and later), which forks one
  libgomp thread per job. OpenBLAS's own pool is then never woken again.
- Waiting: libgomp's threads spin briefly after a parallel region, then sleep
  (GOMP_SPINCOUNT = graphc.backends.cpu.llvm.SPIN_COUNT, set before libgomp loads unless the
  user set it).

The callback is native code generated here (LLVM IR, compiled once and cached like any
module): `graphc_blas_threads(sync, dojob, numjobs, elsize, jobdata, dojob_data)` runs
`dojob(i, jobdata + i * elsize, dojob_data)` for every job i, all jobs at once (OpenBLAS's
level-3 jobs wait on each other, so they must run concurrently: one thread per job), on the
calling thread alone when there is one job.

Invariants:
- `install` is idempotent and thread-safe; it raises only for a bad GRAPHC_BLAS_THREADS: a
  library without the callback
  entry point (an older OpenBLAS, another BLAS) is held to one thread instead
  (`openblas_set_num_threads(1)`), and one without either is left alone. What was done is
  `policy()`, shown by `graphc cache info`-style reports and docs/performance.md.
- generated code never calls BLAS inside one of its own parallel regions (a nested
  `GOMP_parallel` gets a team of one, and OpenBLAS's jobs would wait on each other forever).
- a forked child process gets OpenBLAS's own pool back (`os.register_at_fork`): libgomp's
  team does not survive a fork.
- GRAPHC_BLAS_THREADS=native (graphc.config) leaves OpenBLAS's threading untouched.

Load: on a machine where other work holds a core, every join of a 2-thread region waits for
a thread the OS has parked for a time slice (4 ms here), and OpenBLAS's jobs wait on each
other the same way: a 256^3 SGEMM took 8-16 ms on two threads against 0.3 ms on one, with
OpenBLAS's own pool as with libgomp's. No thread count is right for every moment, so each
executable measures instead of guessing: a `ThreadChooser` times its native calls under the
current thread count and now and then tries the other one (all cores, or one), keeping the
faster; `use(n)` applies a count to libgomp (this thread's `omp_set_num_threads`) and to the
BLAS.
"""

from __future__ import annotations

import ctypes
import functools
import os
import statistics
import threading
import time
from collections import deque

from graphc import config
from graphc.backends.cpu import llvm

__all__ = ["ThreadChooser", "install", "most_threads", "policy", "use"]

# Where each OpenBLAS build exports the callback setter and the thread-count setter.
_CALLBACK_SETTERS = ("scipy_openblas_set_threads_callback_function64_",
                     "openblas_set_threads_callback_function64_",
                     "scipy_openblas_set_threads_callback_function",
                     "openblas_set_threads_callback_function")
_THREAD_SETTERS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                   "scipy_openblas_set_num_threads", "openblas_set_num_threads")

_CALLBACK_IR = """\
%jobs = type { ptr, i32, i64, ptr, i32 }  ; dojob, numjobs, elsize, jobdata, dojob_data

declare void @GOMP_parallel(ptr, ptr, i32, i32)
declare i32 @omp_get_thread_num()
declare i32 @omp_get_num_threads()

; thread t of n runs jobs t, t + n, ... (n == numjobs when forked: one job per thread)
define internal void @graphc_blas_jobs(ptr %c) nounwind {
entry:
  %t = call i32 @omp_get_thread_num()
  %n = call i32 @omp_get_num_threads()
  %p0 = getelementptr %jobs, ptr %c, i32 0, i32 0
  %dojob = load ptr, ptr %p0
  %p1 = getelementptr %jobs, ptr %c, i32 0, i32 1
  %numjobs = load i32, ptr %p1
  %p2 = getelementptr %jobs, ptr %c, i32 0, i32 2
  %elsize = load i64, ptr %p2
  %p3 = getelementptr %jobs, ptr %c, i32 0, i32 3
  %jobdata = load ptr, ptr %p3
  %p4 = getelementptr %jobs, ptr %c, i32 0, i32 4
  %data = load i32, ptr %p4
  br label %head
head:
  %i = phi i32 [%t, %entry], [%next, %body]
  %more = icmp slt i32 %i, %numjobs
  br i1 %more, label %body, label %done
body:
  %wide = sext i32 %i to i64
  %offset = mul i64 %wide, %elsize
  %job = getelementptr i8, ptr %jobdata, i64 %offset
  call void %dojob(i32 %i, ptr %job, i32 %data)
  %next = add i32 %i, %n
  br label %head
done:
  ret void
}

define void @graphc_blas_threads(i32 %sync, ptr %dojob, i32 %numjobs, i64 %elsize,
                                 ptr %jobdata, i32 %data) nounwind {
entry:
  %c = alloca %jobs
  %p0 = getelementptr %jobs, ptr %c, i32 0, i32 0
  store ptr %dojob, ptr %p0
  %p1 = getelementptr %jobs, ptr %c, i32 0, i32 1
  store i32 %numjobs, ptr %p1
  %p2 = getelementptr %jobs, ptr %c, i32 0, i32 2
  store i64 %elsize, ptr %p2
  %p3 = getelementptr %jobs, ptr %c, i32 0, i32 3
  store ptr %jobdata, ptr %p3
  %p4 = getelementptr %jobs, ptr %c, i32 0, i32 4
  store i32 %data, ptr %p4
  %alone = icmp sle i32 %numjobs, 1
  br i1 %alone, label %serial, label %fork
serial:
  call void @graphc_blas_jobs(ptr %c)
  ret void
fork:
  call void @GOMP_parallel(ptr @graphc_blas_jobs, ptr %c, i32 %numjobs, i32 0)
  ret void
}
"""

_lock = threading.Lock()
_installed: dict[str, str] = {}  # library path -> what was done to it
_libraries: list = []  # the callbacks' compiled code: alive for the process
_setters: list = []  # the callback setters installed into, reset in a forked child
_fork_hook = False
_thread_setters: list = []  # the BLAS's set_num_threads, where the callback was installed
_applied = threading.local()  # the thread count this Python thread's OpenMP ICV holds
_blas_threads = [0]  # the count last given to the BLAS (process-wide in OpenBLAS)


def _find(library: ctypes.CDLL, names: tuple[str, ...]):
    for name in names:
        function = getattr(library, name, None)
        if function is not None:
            return function
    return None


def install(library: ctypes.CDLL, path: str) -> str:
    """Make the BLAS `library` (loaded from `path`) run its parallel jobs on libgomp's team;
    returns what was done (see `policy`). Idempotent; never raises."""
    with _lock:
        if path not in _installed:
            _installed[path] = _install(library)
        return _installed[path]


def _install(library: ctypes.CDLL) -> str:
    global _fork_hook
    if config.blas_threads() == "native":
        return "native: GRAPHC_BLAS_THREADS=native leaves the BLAS's own threads"
    setter = _find(library, _CALLBACK_SETTERS)
    openmp = llvm.load_openmp()
    code = None
    if setter is not None and openmp is not None:
        try:
            code = llvm.compile_module(_CALLBACK_IR, "graphc_blas_threads")
        except llvm.LLVMCompileError:  # e.g. a libgomp without GOMP_parallel: one thread
            code = None
    if code is not None:
        setter.argtypes, setter.restype = [ctypes.c_void_p], None
        setter(code.address("graphc_blas_threads"))
        _libraries.append(code)
        _setters.append(setter)
        threads = _find(library, _THREAD_SETTERS)
        if threads is not None:
            threads.argtypes, threads.restype = [ctypes.c_int], None
            _thread_setters.append(threads)
        if not _fork_hook:
            os.register_at_fork(after_in_child=_native_in_child)
            _fork_hook = True
        return "shared: the BLAS's jobs run on libgomp's team (one pool)"
    threads = _find(library, _THREAD_SETTERS)
    if threads is not None:
        threads.argtypes, threads.restype = [ctypes.c_int], None
        threads(1)
        return ("one thread: this BLAS has no threading callback, so it is held to one "
                "thread and graphc's own loops use the cores")
    return "untouched: this BLAS exposes neither a threading callback nor a thread count"


def _native_in_child() -> None:
    """After fork: libgomp's team is gone in the child, so OpenBLAS gets its own pool back."""
    for setter in _setters:
        setter(None)


def policy() -> dict[str, str]:
    """What `install` did, per BLAS library path."""
    with _lock:
        return dict(_installed)


# ---- how many threads: measured per executable ------------------------------------------------
@functools.lru_cache(maxsize=None)
def _openmp() -> ctypes.CDLL | None:
    path = llvm.load_openmp()
    return ctypes.CDLL(path) if path else None


@functools.lru_cache(maxsize=None)
def most_threads() -> int:
    """The most threads graphc's calls use: libgomp's default team size (OMP_NUM_THREADS, else
    every core this process may run on), 1 without libgomp or with GRAPHC_BLAS_THREADS=native
    (graphc then leaves every thread count alone)."""
    openmp = _openmp()
    if openmp is None or config.blas_threads() == "native":
        return 1
    return max(1, min(openmp.omp_get_max_threads(), len(os.sched_getaffinity(0))))


def use(n: int) -> None:
    """Run the calling thread's next parallel regions, and the BLAS's GEMMs, on `n` threads."""
    if getattr(_applied, "n", None) != n:
        _openmp().omp_set_num_threads(n)
        _applied.n = n
    if _blas_threads[0] != n:
        for setter in _thread_setters:
            setter(n)
        _blas_threads[0] = n


class ThreadChooser:
    """How many threads one executable's calls use: `most` (all cores) or 1, whichever its
    recent calls ran faster with.

    `pick()` gives the count for the next call and `record(n, seconds)` its time. The first
    FIRST_TRIAL calls run on `most` threads and the next FIRST_TRIAL on one; the faster count
    is kept. After that the chooser runs the current count and, once FIRST_WAIT seconds and
    at least MIN_CALLS calls have passed, tries the other count for up to TRIAL calls; it
    switches when the trial's mean beats the mean of the current count's last WINDOW calls
    by 10%. A trial call slower than twice that mean ends the trial at once: on a loaded
    machine one call on two threads can cost 50 times one on a single thread (a parked
    thread at every barrier), so trials must be rare and short. A trial that loses doubles
    the wait (up to MAX_WAIT seconds); a switch resets it. Means, not medians: under load two
    threads run most calls fast and some very slow, and a training loop pays the mean.
    `fixed=n` always picks n (e.g. a profiling copy of an executable that already chose);
    `clock` is for tests.
    """

    FIRST_TRIAL = 2
    TRIAL = 2
    WINDOW = 9
    MIN_CALLS = 8
    FIRST_WAIT = 0.25  # seconds
    MAX_WAIT = 30.0

    def __init__(self, most: int, fixed: int | None = None, clock=time.monotonic) -> None:
        self.most = most if fixed is None else 1
        self.current = most if fixed is None else fixed
        self.samples = {most: deque(maxlen=self.WINDOW), 1: deque(maxlen=self.WINDOW)}
        self.clock = clock
        self.wait = self.FIRST_WAIT
        self.next_trial = clock()  # the first trial right after the first FIRST_TRIAL calls
        self.calls_left = self.FIRST_TRIAL
        self.trial_left = 0

    def _other(self) -> int:
        return 1 if self.current == self.most else self.most

    def pick(self) -> int:
        if self.most == 1:
            return self.current
        if not self.trial_left and self.calls_left <= 0 and self.clock() >= self.next_trial:
            self.trial_left = self.TRIAL if self.samples[self._other()] else self.FIRST_TRIAL
        return self._other() if self.trial_left else self.current

    def record(self, n: int, seconds: float) -> None:
        if self.most == 1:
            return
        if n == self.current:
            self.samples[n].append(seconds)
            self.calls_left -= 1
            return
        self.samples[n].append(seconds)
        self.trial_left -= 1
        if seconds > 2 * statistics.fmean(self.samples[self.current]):
            self.trial_left = 0  # hopeless: stop paying for it now
        if self.trial_left <= 0:
            self._decide()

    def _decide(self) -> None:
        other = self._other()
        trial = statistics.fmean(list(self.samples[other])[-self.TRIAL:])
        if trial < 0.9 * statistics.fmean(self.samples[self.current]):
            self.current = other
            self.wait = self.FIRST_WAIT
        else:
            self.wait = min(2 * self.wait, self.MAX_WAIT)
        self.trial_left = 0
        self.calls_left = self.MIN_CALLS
        self.next_trial = self.clock() + self.wait
