"""graphc's own splits compared bit for bit where the BLAS's own split is not.

numpy's OpenBLAS 0.3.31 runs its Haswell kernels on an AMD Zen 5 (the thirteenth session's
host), and there an element of a float32 GEMM rounds by where its column falls in the
kernel's blocking: a [256,256] @ [256,20] product split over two threads by OpenBLAS (the
Winograd kernel's, a batch too small to split by images) rounds otherwise than on one
(tests/blas_threads_support.blas_keeps_bits_across_threads probes it). A test that promises
graphc's own splits (image shares, row chunks of generated GEMMs, batch norm's channels) the
same bits on every thread count runs the all-cores case under `blas_on_one_thread()` where
the probe fails: graphc's code still forks on all cores, only the BLAS stays on one thread;
the BLAS's own split is then judged by its distance from float64 instead."""

from __future__ import annotations

import contextlib

from graphc.backends.cpu import threads
from tests.blas_threads_support import OpenBLAS, blas_keeps_bits_across_threads

__all__ = ["bits_run", "blas_keeps_bits_across_threads", "blas_on_one_thread"]


@contextlib.contextmanager
def blas_on_one_thread():
    """Compiled calls inside run their own parallel regions on the count they pick, the
    BLAS's GEMMs on one thread; the user's BLAS count is given back after."""
    library = OpenBLAS()
    before, given_use = library.get(), threads.use

    def use(n: int, openmp: bool = True):
        back = given_use(n, openmp)
        library.set(1)
        return back

    threads.use = use
    try:
        yield
    finally:
        threads.use = given_use
        library.set(before)


def bits_run():
    """The context for the all-cores run a test compares bit for bit with one thread's: none
    where the BLAS keeps its bits across thread counts, else `blas_on_one_thread()`."""
    if blas_keeps_bits_across_threads():
        return contextlib.nullcontext()
    return blas_on_one_thread()
