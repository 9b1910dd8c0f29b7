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
- Intel MKL (where graphc.backends.cpu.blas chose it) has no such callback, but a threading
  layer built on libgomp: `install` selects it (`MKL_Set_Threading_Layer(GNU)`, before any
  other MKL call), so MKL's parallel GEMMs fork the same libgomp team, and its thread count
  is `MKL_Set_Num_Threads` (process-wide, as OpenBLAS's). Without libgomp, MKL runs
  sequential. MKL's own default (Intel OpenMP, libiomp5: a second spinning pool) is kept only
  under GRAPHC_BLAS_THREADS=native.
- Waiting: libgomp's threads spin briefly after a parallel region, then sleep
  (GOMP_SPINCOUNT = graphc.config.OPENMP_SPIN_COUNT, set by `import graphc` unless the user
  set it; libgomp reads it when it loads, so a libgomp that PyTorch loaded first keeps its
  own, and `graphc.config.set_openmp_waiting()` says which holds).

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
  team does not survive a fork; and the BLAS count the user had before the compiled calls
  that other threads had in flight (they never end in the child).
- GRAPHC_BLAS_THREADS=native (graphc.config) leaves OpenBLAS's threading untouched.

Load: on a machine where other work holds a core, every join of a 2-thread region waits for
a thread the OS has parked for a time slice (4 ms here), and OpenBLAS's jobs wait on each
other the same way: a 256^3 SGEMM took 8-16 ms on two threads against 0.3 ms on one, with
OpenBLAS's own pool as with libgomp's. No thread count is right for every moment, so each
executable measures instead of guessing: a `ThreadChooser` starts on one thread, times its
native calls and now and then tries the other count (all cores only while a core is free),
keeping the faster; `use(n)` applies a count to libgomp (this thread's
`omp_set_num_threads`) and to the BLAS, and `restore` gives both back after the call: the
calling thread its own OpenMP count (PyTorch reads the same one), and the process the BLAS
count the user had, once no compiled call is in flight, so numpy's own GEMMs never run on
graphc's choice. Neither count is remembered between calls: the user may change either.
A module that forks no OpenMP region of its own (`reads_openmp_count`: only BLAS calls)
has only the BLAS's count set, and one with no parallel work at all (no OpenMP region, no
BLAS call) gets a chooser of one thread: no bookkeeping per call
(graphc.backends.cpu.executable).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import statistics
import threading
from collections import deque

from graphc import config
from graphc.backends.cpu import llvm
from graphc.backends.cpu.thread_ir import (
    BLAS_GET_THREADS,
    BLAS_SET_THREADS,
    CALLBACK_IR,
    COUNTS_IR,
    SPLIT_ENTER,
    SPLIT_EXIT,
)

__all__ = ["BLAS_GET_THREADS", "BLAS_SET_THREADS", "SPLIT_ENTER", "SPLIT_EXIT", "ThreadChooser",
           "blas_threads", "cores_free",
           "image_threads", "install", "most_threads", "policy", "reads_openmp_count",
           "restore", "use"]

# Where each OpenBLAS build exports the callback setter and the thread-count setter.
_CALLBACK_SETTERS = ("scipy_openblas_set_threads_callback_function64_",
                     "openblas_set_threads_callback_function64_",
                     "scipy_openblas_set_threads_callback_function",
                     "openblas_set_threads_callback_function")
_THREAD_SETTERS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                   "scipy_openblas_set_num_threads", "openblas_set_num_threads",
                   "MKL_Set_Num_Threads")
_THREAD_GETTERS = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                   "scipy_openblas_get_num_threads", "openblas_get_num_threads",
                   "MKL_Get_Max_Threads")
# MKL's threading layers (mkl_service.h: MKL_THREADING_INTEL, _SEQUENTIAL, _PGI, _GNU, _TBB)
MKL_THREADING_SEQUENTIAL, MKL_THREADING_GNU = 1, 3

_lock = threading.Lock()
_installed: dict[str, str] = {}  # library path -> what was done to it
_libraries: list = []  # the callbacks' compiled code: alive for the process
_setters: list = []  # the callback setters installed into, reset in a forked child
_fork_hook = False
_thread_setters: list = []  # the BLAS's set_num_threads, where the callback was installed
_mkl_setters: list = []  # MKL_Set_Num_Threads, where MKL forks libgomp's team
# the compiled calls' way to the BLAS's count (thread_ir.COUNTS_IR): enter, leave, now, after_fork
_blas_counts: list = []
# A child forked after the parent ran a parallel region waits forever in its next region of
# more than one thread (libgomp's team did not survive the fork): every compiled call there
# runs on one thread (`use`).
_forked_child = False


def _one_thread_in_child() -> None:
    global _forked_child
    _forked_child = True


os.register_at_fork(after_in_child=_one_thread_in_child)


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
    if config.blas_threads() == "native":
        return "native: GRAPHC_BLAS_THREADS=native leaves the BLAS's own threads"
    layer_setter = getattr(library, "MKL_Set_Threading_Layer", None)
    if layer_setter is not None:
        return _install_mkl(library, layer_setter)
    setter = _find(library, _CALLBACK_SETTERS)
    openmp = llvm.load_openmp()
    code = None
    if setter is not None and openmp is not None:
        try:
            code = llvm.compile_module(CALLBACK_IR, "graphc_blas_threads")
        except llvm.LLVMCompileError:  # e.g. a libgomp without GOMP_parallel: one thread
            code = None
    if code is not None:
        setter.argtypes, setter.restype = [ctypes.c_void_p], None
        setter(code.address("graphc_blas_threads"))
        _libraries.append(code)
        _setters.append(setter)
        _adopt_thread_setter(library)
        _register_counts(library)
        return "shared: the BLAS's jobs run on libgomp's team (one pool)"
    threads = _find(library, _THREAD_SETTERS)
    if threads is not None:
        threads.argtypes, threads.restype = [ctypes.c_int], None
        threads(1)
        _register_counts(library)
        return ("one thread: this BLAS has no threading callback, so it is held to one "
                "thread and graphc's own loops use the cores")
    return "untouched: this BLAS exposes neither a threading callback nor a thread count"


def _install_mkl(library: ctypes.CDLL, layer_setter) -> str:
    """MKL: its GNU OpenMP threading layer forks libgomp's team (one pool); sequential where
    graphc has no libgomp or MKL refuses the layer. Must run before any other MKL call."""
    layer_setter.argtypes, layer_setter.restype = [ctypes.c_int], ctypes.c_int
    if llvm.load_openmp() is not None and layer_setter(MKL_THREADING_GNU) == MKL_THREADING_GNU:
        setter = _adopt_thread_setter(library)
        if setter is not None:
            _mkl_setters.append(setter)
        _register_counts(library)
        return "shared: MKL's GNU threading layer forks libgomp's team (one pool)"
    layer_setter(MKL_THREADING_SEQUENTIAL)
    return "one thread: MKL's sequential layer (no libgomp to share), graphc's loops use the cores"


def _adopt_thread_setter(library: ctypes.CDLL):
    """A BLAS whose jobs run on libgomp's team: its thread-count setter (if any) joins the
    ones graphc sets, and a forked child puts it back to one thread (`_native_in_child`).
    Returns the setter (None where the library has none)."""
    threads = _find(library, _THREAD_SETTERS)
    if threads is not None:
        threads.argtypes, threads.restype = [ctypes.c_int], None
        _thread_setters.append(threads)
    _register_fork_hook()
    return threads


def _register_fork_hook() -> None:
    global _fork_hook
    if not _fork_hook:
        os.register_at_fork(after_in_child=_native_in_child)
        _fork_hook = True


def _register_counts(library: ctypes.CDLL) -> None:
    """Register the BLAS's thread-count getter and setter for generated code (once: the
    first BLAS that has both)."""
    get, put = _find(library, _THREAD_GETTERS), _find(library, _THREAD_SETTERS)
    if get is None or put is None or _blas_counts:
        return
    llvm.register_symbol(BLAS_GET_THREADS, ctypes.cast(get, ctypes.c_void_p).value)
    llvm.register_symbol(BLAS_SET_THREADS, ctypes.cast(put, ctypes.c_void_p).value)
    try:
        code = llvm.compile_module(COUNTS_IR, "graphc_blas_counts")
    except llvm.LLVMCompileError:  # pragma: no cover (then convolutions stay serial)
        return
    for name in (SPLIT_ENTER, SPLIT_EXIT):
        llvm.register_symbol(name, code.address(name))
    enter = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(code.address("graphc_blas_enter"))
    leave = ctypes.CFUNCTYPE(None)(code.address("graphc_blas_leave"))
    now = ctypes.CFUNCTYPE(ctypes.c_int)(code.address("graphc_blas_now"))
    after_fork = ctypes.CFUNCTYPE(None)(code.address("graphc_blas_after_fork"))
    _libraries.append(code)
    _blas_counts.extend((enter, leave, now, after_fork))
    _register_fork_hook()


def blas_threads() -> int | None:
    """The BLAS's thread count now, as the user's next GEMM outside a compiled call would
    find it (a convolution's split region holds the BLAS to one thread while it runs and
    gives this count back after; None where it cannot be read)."""
    with _lock:
        now = _blas_counts[2] if _blas_counts else None
    return None if now is None else now()


def image_threads() -> int:
    """How many shares a convolution kernel splits its images into
    (graphc.backends.cpu.conv_threads): `most_threads()` where generated code can hold the
    BLAS to one thread inside its parallel region, else 1 (the kernels stay serial)."""
    with _lock:
        settable = bool(_blas_counts)
    return most_threads() if settable else 1


def _native_in_child() -> None:
    """After fork: libgomp's team is gone in the child, so OpenBLAS gets its own pool back and
    MKL (which has no pool of its own in the GNU layer) runs on one thread. The compiled calls
    and split regions other threads had in flight never end in the child: it gets the BLAS
    count the user had before them."""
    for setter in _setters:
        setter(None)
    for setter in _mkl_setters:
        setter(1)
    if _blas_counts:
        _blas_counts[3]()


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
    (graphc then leaves every thread count alone). Read on a new thread, which starts from
    the defaults: the calling thread's own count may have been set by another library
    (PyTorch's `torch.set_num_threads` sets it in the one libgomp of the process)."""
    openmp = _openmp()
    if openmp is None or config.blas_threads() == "native":
        return 1
    found = []
    reader = threading.Thread(target=lambda: found.append(openmp.omp_get_max_threads()))
    reader.start()
    reader.join()
    return max(1, min(found[0], len(os.sched_getaffinity(0))))


def use(n: int, openmp: bool = True) -> tuple[int | None, bool] | None:
    """Run the calling thread's next OpenMP regions, and the BLAS's GEMMs, on `n` threads;
    returns what to give back after the call (`restore`, in a `finally`), None when nothing
    changed.

    Both counts are read back every time, never remembered: the process has one libgomp
    (PyTorch's and the system's share the name), `torch.set_num_threads` sets the same
    per-thread OpenMP count, and the user may set OpenBLAS's process-wide count between calls
    (threadpoolctl, `openblas_set_num_threads` through ctypes). The BLAS's count goes through
    `graphc_blas_enter` (thread_ir.COUNTS_IR): the first compiled call in saves the user's count and
    the last one out gives it back (or a count the user set while calls were in flight, told
    from the one they set last, `@ours`). `openmp=False`: the caller's code reads no OpenMP
    count (`reads_openmp_count`: its only parallel work is the BLAS's, whose jobs fork with
    a count of their own), so only the BLAS's count is set; not where MKL forks libgomp's
    team, which may read it. In a forked child `n` is 1 (`_forked_child`)."""
    if _forked_child:  # libgomp's team did not survive the fork (see _forked_child)
        n = 1
    previous = None
    if openmp or _mkl_setters:
        openmp_library = _openmp()
        previous = openmp_library.omp_get_max_threads()
        if previous != n:
            openmp_library.omp_set_num_threads(n)
        else:
            previous = None
    if _blas_counts:  # through the lock split convolutions hold (thread_ir.COUNTS_IR)
        entered = _blas_counts[0](n) != 0
    else:  # a BLAS whose count cannot be read (none known): set, not given back
        for setter in _thread_setters:
            setter(n)
        entered = False
    if previous is None and not entered:
        return None
    return previous, entered


_OPENMP_DECLARATION = re.compile(r'^declare [^@\n]*@"?(GOMP_|omp_)', re.MULTILINE)


def reads_openmp_count(module_text: str) -> bool:
    """Whether an LLVM module (its text) forks OpenMP regions or reads OpenMP's thread count
    itself: it declares a `GOMP_` or `omp_` function. One that does not (a module whose only
    parallel work is BLAS calls) runs the same on any OpenMP count (`use(n, openmp=False)`)."""
    return _OPENMP_DECLARATION.search(module_text) is not None


def restore(given: tuple[int | None, bool]) -> None:
    """Give back what `use` changed: the calling thread's OpenMP count, so that graphc's
    choice does not leak into another library's parallel regions on this thread (PyTorch's
    `#pragma omp parallel` reads the same setting), and the BLAS's process-wide count, once
    no other compiled call is in flight (numpy's GEMMs run on the user's count again)."""
    openmp_count, entered = given
    if entered:
        _blas_counts[1]()
    if openmp_count is not None:
        _openmp().omp_set_num_threads(openmp_count)


class _RunnableTasks:
    """How many tasks the kernel counts as runnable right now, system-wide, the caller among
    them (the fourth field of /proc/loadavg, "running/total"); None where it cannot be read.
    A pread on a descriptor kept open costs about a microsecond."""

    def __init__(self, path: str = "/proc/loadavg") -> None:
        self.path = path
        self.fd: int | None = None
        self.broken = False

    def __call__(self) -> int | None:
        if self.broken:
            return None
        try:
            if self.fd is None:
                self.fd = os.open(self.path, os.O_RDONLY)
            return int(os.pread(self.fd, 128, 0).split()[3].split(b"/")[0])
        except (OSError, IndexError, ValueError):
            self.broken = True
            return None


_runnable_tasks = _RunnableTasks()


def cores_free() -> int | None:
    """Online cores that no runnable task but the caller holds right now (None: unknown).
    A point sample: it answers "is another core idle this instant", not "will it stay so"."""
    runnable = _runnable_tasks()
    if runnable is None:
        return None
    return (os.cpu_count() or 1) - runnable


class ThreadChooser:
    """How many threads one executable's calls use: `most` (all cores) or 1, whichever its
    recent calls ran faster with.

    `pick()` gives the count for the next call and `record(n, seconds)` its time. The risks
    are lopsided, and the rules follow from that. On an idle machine two threads gain at
    most `most`x over one; with another task on a core, one call on two threads costs 10 to
    100 times a call on one (each barrier waits for a thread the OS parked for a time slice:
    the LSTM step took 750 ms against 25 ms). So:

    - Start on one thread: the first WARMUP calls (cold caches, fresh pages) are not judged.
    - Try the other count for TRIAL calls now and then. A trial is paid for by the
      executable's own time: after a trial cost `excess` seconds over what the current count
      would have taken, the next one waits until the current count has run
      `excess * backoff / BUDGET` seconds (and at least MIN_GAP calls, or MIN_GAP_CALLS that
      took MIN_GAP_SECONDS: slow calls), so exploring costs at
      most about BUDGET of the run time however slow a trial was. Each losing trial doubles
      `backoff` (up to MAX_BACKOFF); a switch resets it. Time is the executable's own, not
      the wall clock's: an executable called rarely among other work explores as rarely.
    - A trial of `most` threads waits while `cores_free` (the runnable tasks of
      /proc/loadavg) finds no free core for the extra threads: then it would cost a slow
      call and tell nothing new. A trial call slower than twice the current median ends the
      trial at once (hopeless).
    - A trial of one thread is cheap (at worst `most`x a call), so it comes early when the
      calls on `most` threads get slower than RESLOW times the mean at the last decision
      (load arrived). And at once, gap or not, after one call on `most` threads slower than
      FALLBACK times their mean at the last decision: a parked thread held a barrier (a forced
      two-thread MLP step took 27-97 ms against 1.0-1.3 ms on one thread, a core busy), and
      without this a load that arrived within MIN_GAP calls of a switch or a trial cost up
      to MIN_GAP such calls. One such quick trial per stay on `most` threads: after one
      that loses (a one-off slow call on an idle machine), the gap and budget rules again.
    - A trial of `most` threads runs WAKE calls more and leaves them out of the verdict
      (not out of its cost): after a stretch on one thread the team's threads sleep and the
      other core's caches hold none of the executable's data, so the first call pays for
      both (LeNet-5's step under SCHED_FIFO: 1.35-1.69 ms against 1.18-1.42 for the
      trial's next calls, 2.15 ms on the process's first, where the team's threads are
      made; 2.05 ms on one thread), and with it a 3-call mean can lose the 15% rule below
      for a step that two threads speed up by less than about 1.4x.
    - Deciding: one thread wins when the trial's median beats the mean of the current
      window by 10% (the mean, because under load two threads run most calls fast and some
      very slow, and a loop pays the mean); `most` threads win only when the trial's mean
      beats the current window's median by 15% (the median, because a call on one thread
      that the OS parked says nothing in favour of two threads). A trial that lost but cost
      nothing (it was faster, by less than the rule asks) leaves `backoff` as it was: close
      trials keep coming every MIN_GAP calls, and one unlucky trial later is not charged
      for all the close ones before it.

    `fixed=n` always picks n (e.g. a profiling copy of an executable that already chose; its
    `most` still tells the executable to apply the count); `free_cores` replaces `cores_free`
    (tests).
    """

    WARMUP = 2
    WINDOW = 9
    TRIAL = 3
    WAKE = 1  # a trial of `most` threads: its first calls wake the team, not judged
    MIN_GAP = 8  # calls
    # ... or fewer for slow calls: MIN_GAP_CALLS that took MIN_GAP_SECONDS (a ResNet-18 step
    # of 0.5 s waited 8 calls, 4 s, before its first trial of all cores)
    MIN_GAP_SECONDS = 0.25
    MIN_GAP_CALLS = 3
    BUDGET = 0.02  # share of the executable's own time that trials may cost
    MAX_BACKOFF = 64
    RESLOW = 1.5
    FALLBACK = 4.0  # one call on `most` threads this much slower than their reference: load

    def __init__(self, most: int, fixed: int | None = None, free_cores=cores_free) -> None:
        self.most = most
        self.current = 1 if fixed is None else fixed
        self.explores = fixed is None and most > 1
        self.window: deque[float] = deque(maxlen=self.WINDOW)  # the current count's calls
        self.trial: list[float] = []
        self.trying = 0  # the count under trial, 0 when none
        self.free_cores = free_cores
        self.warmup_left = self.WARMUP
        self.gap_calls = 0  # calls of the current count since the last trial (or switch)
        self.gap_seconds = 0.0  # ... and their time
        self.due_seconds = 0.0  # the trial waits until gap_seconds reaches this
        self.backoff = 1
        self.reference = 0.0  # the current count's mean at the last decision
        self.quick_armed = True  # a slow call on `most` threads may start a trial at once
        self.quick = False  # ... and the last one did: the next call is that trial

    def pick(self) -> int:
        # every call asks: the steady answer (the current count) is one frame, the gap's rules
        # written in line (after a short native run each extra frame is a cache miss)
        if self.trying:
            return self.trying
        if self.quick:  # a call on all cores was FALLBACK times slower: one thread now
            self.quick, self.quick_armed = False, False
            self.trying, self.trial = 1, []
            return 1
        gap_calls = self.gap_calls
        if not self.explores or self.warmup_left > 0 or gap_calls < self.MIN_GAP and (
                gap_calls < self.MIN_GAP_CALLS or self.gap_seconds < self.MIN_GAP_SECONDS):
            return self.current  # the gap since the last trial is not over
        other = 1 if self.current == self.most else self.most
        # the trial waits for its budget, unless it is one thread's and the calls on `most`
        # got slower than RESLOW times their mean at the last decision (load arrived)
        window = self.window
        if self.gap_seconds < self.due_seconds and not (
                other == 1 and self.reference
                and sum(window) > self.RESLOW * self.reference * len(window)):
            return self.current
        if other > 1:
            free = self.free_cores()
            if free is not None and free < other - 1:
                self.gap_calls = 0  # look again after MIN_GAP calls
                return self.current
        self.trying, self.trial = other, []
        return other

    def record(self, n: int, seconds: float) -> None:
        if not self.explores:
            return
        if self.warmup_left > 0:
            self.warmup_left -= 1
            return
        if n != self.trying:
            if n > 1 and self.quick_armed and seconds > self.FALLBACK * self.reference:
                self.quick = True  # (reference: a float, so the idle path stays cheap)
            self.window.append(seconds)
            self.gap_calls += 1
            self.gap_seconds += seconds
            return
        self.trial.append(seconds)
        calls = self.TRIAL if n == 1 else self.TRIAL + self.WAKE
        if len(self.trial) >= calls or seconds > 2 * statistics.median(self.window):
            self._decide()

    def _decide(self) -> None:
        other, trial, window = self.trying, self.trial, self.window
        if other == 1:
            wins = statistics.median(trial) < 0.9 * statistics.fmean(window)
        else:  # a hopeless trial may end within its wake-up calls: then all of them count
            judged = trial[self.WAKE:] if len(trial) > self.WAKE else trial
            wins = statistics.fmean(judged) < 0.85 * statistics.median(window)
            trial = judged if wins else trial
        self.trying, self.trial = 0, []
        self.gap_calls, self.gap_seconds = 0, 0.0
        if wins:
            self.current, self.backoff, self.due_seconds = other, 1, 0.0
            self.quick_armed = True
            self.window = deque(trial, maxlen=self.WINDOW)
            self.reference = statistics.fmean(trial)
            return
        excess = max(sum(trial) - len(trial) * statistics.median(window), 0.0)
        self.due_seconds = excess * self.backoff / self.BUDGET
        if excess > 0:  # a trial that cost nothing was close: no reason to wait longer
            self.backoff = min(2 * self.backoff, self.MAX_BACKOFF)
        self.reference = statistics.fmean(window)
