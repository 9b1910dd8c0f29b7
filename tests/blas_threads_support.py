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
    """Whether a float32 GEMM graphc hands to the BLAS ([120,48] @ [48,192], the FFN of
    tests/test_review_s12_gpt_steps_fuzz's case 1) gives the same bits on one thread and on
    two. Not everywhere: numpy's OpenBLAS 0.3.31 runs its
    Haswell kernels on an AMD Zen 5 (the thirteenth session's host), where 3,693 of this
    product's 23,040 elements round otherwise on two threads, so a test that promises a model
    step the same bits on any thread count can hold it only where this is true."""
    from graphc.backends import compile as backend_compile
    from graphc.ir import parse

    if threads.most_threads() < 2:
        return True
    executable = backend_compile(parse('''graph @blas_bits(%a: f32[120,48], %b: f32[48,192])
      -> (f32[120,192]) {
      %0: f32[120,192] = matmul(%a, %b)
      return (%0)
    }'''), "cpu")
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((120, 48), (48, 192)))
    results = []
    for count in (1, 2):
        executable.thread_chooser = threads.ThreadChooser(2, fixed=count)
        results.append(executable.run(a, b)[0])
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
