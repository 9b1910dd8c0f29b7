"""The user's OpenBLAS as the thread-count tests reach it: numpy's library through ctypes, its
own setter and getter (`OpenBLAS`), and a fixture that gives the count back after a test."""

import ctypes

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
