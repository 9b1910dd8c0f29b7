"""The user's OpenBLAS as the thread-count tests reach it: numpy's library through ctypes, its
own setter and getter (`OpenBLAS`), and a fixture that gives the count back after a test; and
whether the BLAS graphc calls gives the same bits on one thread and on two
(`blas_keeps_bits_across_threads`)."""

import ctypes
import functools

import numpy as np
import pytest

from graphc.backends.cpu import blas, threads

SETTERS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
           "scipy_openblas_set_num_threads", "openblas_set_num_threads")
GETTERS = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
           "scipy_openblas_get_num_threads", "openblas_get_num_threads")


class OpenBLAS:
    """numpy's OpenBLAS as its user reaches it: its own setter and getter, through ctypes."""

    def __init__(self) -> None:
        found = blas.resolve_blas()
        if threads.most_threads() < 2:
            pytest.skip("one core: graphc never sets a thread count")
        library = ctypes.CDLL(found.path)
        setter = next((getattr(library, n) for n in SETTERS if hasattr(library, n)), None)
        getter = next((getattr(library, n) for n in GETTERS if hasattr(library, n)), None)
        if setter is None or getter is None or threads.blas_threads() is None:
            pytest.skip(f"not an OpenBLAS whose count graphc reads: {threads.policy()}")
        setter.argtypes, setter.restype = [ctypes.c_int], None
        getter.argtypes, getter.restype = [], ctypes.c_int
        self.set, self.get = setter, getter


@pytest.fixture
def openblas():
    library = OpenBLAS()
    before = library.get()
    yield library
    library.set(before)


@functools.cache
def blas_keeps_bits_across_threads() -> bool:
    """Whether the BLAS graphc calls (blas.resolve_blas: its cblas_sgemm, through ctypes)
    gives the same bits for a [120,48] @ [48,192] product (the FFN of
    tests/test_review_s12_gpt_steps_fuzz's case 1) on one thread and on two (threads.use).
    Not everywhere: numpy's OpenBLAS 0.3.31 runs its Haswell kernels on an AMD Zen 5 (the
    thirteenth session's host), where 3,693 of the 23,040 elements round otherwise on two
    threads, so a test that promises a step the same bits on any thread count can hold it
    only where this is true. The BLAS is called directly: which products graphc hands it
    depends on graphc's own GEMM rules."""
    if threads.most_threads() < 2:
        return True
    found = blas.resolve_blas()
    size = ctypes.c_int64 if found.ilp64 else ctypes.c_int
    sgemm = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, size, size, size,
                             ctypes.c_float, ctypes.c_void_p, size, ctypes.c_void_p, size,
                             ctypes.c_float, ctypes.c_void_p, size)(found.sgemm)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((120, 48), (48, 192)))
    results = []
    for count in (1, 2):
        c = np.zeros((120, 192), np.float32)
        given = threads.use(count, openmp=False)
        try:  # row major (101), neither transposed (111)
            sgemm(101, 111, 111, 120, 192, 48, 1.0, a.ctypes.data, 48, b.ctypes.data, 192,
                  0.0, c.ctypes.data, 192)
        finally:
            if given is not None:
                threads.restore(given)
        results.append(c)
    return bool(np.array_equal(*results))


def assert_same_bits_across_threads(got, want, err_msg: str = "") -> None:
    """`got` (a run on two threads) has `want`'s (one thread's) bits, where the BLAS keeps
    them (`blas_keeps_bits_across_threads`); elsewhere `got` is within float32 rounding of a
    sum taken in another order (rtol 1e-4, atol 1e-5 of the magnitude), NaN-free."""
    if blas_keeps_bits_across_threads():
        np.testing.assert_array_equal(got, want, err_msg=err_msg)
        return
    want = np.asarray(want)
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale, err_msg=err_msg)
