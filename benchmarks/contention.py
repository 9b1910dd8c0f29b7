"""`--contention`: a busy process on one core while the benchmarks run.

A user's machine is never idle. `busy_core()` starts one child process that spins in a loop,
pinned to the last core this process may use, and stops it on exit; the report's header says
so. Under it, a thread pool that waits on a thread the OS parked shows up at once (a 2-thread
SGEMM that takes 0.2 ms idle took 8-16 ms with one core busy before graphc's thread chooser,
graphc/backends/cpu/threads.py).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys


@contextlib.contextmanager
def busy_core():
    """Run a spinning process on one core for the duration of the block; yields its core."""
    cores = sorted(os.sched_getaffinity(0))
    core = cores[-1]
    spinner = subprocess.Popen([sys.executable, "-c", "while True:\n    pass\n"])
    try:
        os.sched_setaffinity(spinner.pid, {core})
        yield core
    finally:
        spinner.kill()
        spinner.wait()
