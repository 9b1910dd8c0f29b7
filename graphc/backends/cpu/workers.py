"""workers: compile the parts of a large LLVM module on several cores, in worker processes.

LLVM work holds llvmlite's lock (and one core) for the whole optimisation and code
generation of a module, so threads cannot share it out; processes can. A *worker* is a
Python process running graphc/backends/cpu/llvm_worker.py as a script (llvmlite and the
standard library only: it starts in about 0.2 s and never imports graphc or re-runs the
user's main module, which multiprocessing's spawn and forkserver do for a script without a
main guard). Workers are started on demand (`start`, which CpuExecutable calls before
lowering a large graph, so a worker boots while the module is generated), kept warm for
the next compile, and end when this process closes their stdin (at exit, or when it dies).

`split_compile(parts, name, level, n_workers)`: this process and `n_workers` workers take
parts from one queue (largest first) until none is left; each part becomes one object. A
worker that fails or dies hands its part back to this process; a part LLVM refuses makes
`split_compile` return None (the caller then compiles the whole module in one piece and
reports LLVM's message). Only modules of at least `PARALLEL_MIN_CHARS` (deduplicated) are
split: below that, starting and feeding a worker costs more than it saves.

Configuration: GRAPHC_COMPILE_WORKERS (graphc.config.compile_workers) caps the processes
(`1`: never split); the default is the cores this process may run on.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading

from graphc import config
from graphc.backends.cpu import llvm_worker

__all__ = ["PARALLEL_MIN_CHARS", "PARTS_PER_PROCESS", "processes", "split_compile", "start"]

PARALLEL_MIN_CHARS = 150_000  # module text (deduplicated) from which parts are compiled apart
PARTS_PER_PROCESS = 3  # more parts than processes: a queue evens out parts of unequal cost

_lock = threading.Lock()
_feeding = threading.Lock()
_workers: list[subprocess.Popen] = []
_owner = os.getpid()  # workers belong to the process that started them (not to a fork)


def processes() -> int:
    """How many processes may compile at once: GRAPHC_COMPILE_WORKERS, else the cores."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    wanted = config.compile_workers()
    return max(1, min(cores, wanted) if wanted is not None else cores)


def start(n: int | None = None) -> list[subprocess.Popen]:
    """Make sure `n` workers (default: processes() - 1) are running; returns them."""
    global _owner
    n = processes() - 1 if n is None else n
    with _lock:
        if _owner != os.getpid():  # a forked child: its parent's workers are not its own
            _workers.clear()
            _owner = os.getpid()
        _workers[:] = [w for w in _workers if w.poll() is None]
        while len(_workers) < n:
            try:
                _workers.append(subprocess.Popen(
                    [sys.executable, "-c", "import runpy; runpy.run_path("
                     f"{llvm_worker.__file__!r}, run_name='__main__')"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True))
            except OSError:
                break
        return list(_workers[:n])


@atexit.register
def stop() -> None:
    """End the workers (closing a worker's stdin ends it)."""
    with _lock:
        mine = _owner == os.getpid()
        for w in _workers:
            if mine:
                for stream in (w.stdin, w.stdout):
                    try:
                        stream.close()
                    except OSError:
                        pass
        if mine:
            for w in _workers:
                try:
                    w.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    w.kill()
        _workers.clear()


class _PartRefused(Exception):
    """LLVM refused a part (the message is LLVM's)."""


def _ask(worker: subprocess.Popen, text: str, name: str, level: int) -> bytes:
    """One part compiled by `worker`; OSError when the worker is gone."""
    data, label = text.encode(), name.encode()
    worker.stdin.write(llvm_worker.REQUEST.pack(level, len(label), len(data)) + label + data)
    worker.stdin.flush()
    header = worker.stdout.read(llvm_worker.ANSWER.size)
    if len(header) != llvm_worker.ANSWER.size:
        raise OSError("the compile worker ended")
    status, length = llvm_worker.ANSWER.unpack(header)
    payload = worker.stdout.read(length)
    if len(payload) != length:
        raise OSError("the compile worker ended")
    if status:
        raise _PartRefused(payload.decode(errors="replace"))
    return payload


def split_compile(parts: list[str], name: str, level: int | list[int], n_workers: int,
                  local=None) -> list[bytes] | None:
    """The object code of every part (see the module docstring), or None when LLVM refused
    one. `level`: one for all parts, or one per part (llvm_worker's levels). `local(text,
    name, level)` compiles a part in this process (default llvm_worker.object_code)."""
    local = local or llvm_worker.object_code
    levels = level if isinstance(level, list) else [level] * len(parts)
    with _feeding:  # one request at a time on a worker's pipes: one split_compile at a time
        return _split_compile(parts, name, levels, n_workers, local)


def _split_compile(parts, name, levels, n_workers, local) -> list[bytes] | None:
    order = sorted(range(len(parts)), key=lambda k: -len(parts[k]))  # largest first
    results: list[bytes | None] = [None] * len(parts)
    refused: list[str] = []
    guard = threading.Lock()

    def take() -> int | None:
        with guard:
            return order.pop(0) if order and not refused else None

    def remote(worker: subprocess.Popen) -> None:
        while (k := take()) is not None:
            try:
                results[k] = _ask(worker, parts[k], f"{name}.part{k}", levels[k])
            except _PartRefused as error:
                refused.append(str(error))
            except (OSError, ValueError):  # the worker died: its part goes back to the queue
                with guard:
                    order.append(k)
                worker.kill()
                return

    feeders = [threading.Thread(target=remote, args=(w,), daemon=True)
               for w in start(n_workers)]
    for t in feeders:
        t.start()
    try:
        while (k := take()) is not None:
            try:
                results[k] = local(parts[k], f"{name}.part{k}", levels[k])
            except llvm_worker.IRError as error:
                refused.append(str(error))
    except BaseException:
        with guard:
            order.clear()  # the feeders stop after their current part
        raise
    finally:
        for t in feeders:
            t.join()
    if refused:
        return None
    for k, code in enumerate(results):  # parts of a worker that died after the queue emptied
        if code is None:
            try:
                results[k] = local(parts[k], f"{name}.part{k}", levels[k])
            except llvm_worker.IRError:
                return None
    return results
