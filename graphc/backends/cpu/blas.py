"""blas: the BLAS the CPU backend's generated code calls for GEMM and GEMV.

`resolve_blas()` finds cblas_sgemm/cblas_dgemm (and ?gemv) once per process: in Intel MKL's
libmkl_rt (ILP64, `cblas_sgemm_64`) where the `mkl` wheel is installed and GRAPHC_BLAS
(graphc.config.blas_choice) allows it, else in numpy's bundled OpenBLAS (ILP64,
`scipy_cblas_sgemm64_`), else scipy's (LP64, `scipy_cblas_sgemm`), else a system
libopenblas/libcblas. MKL comes first because the benchmark steps ran faster on it (GPT
0.86x, ResNet-18 0.8-0.93x; docs/performance.md, "The BLAS: MKL where installed"), and the
`mkl` wheel is there only when someone installed it (the `graphc[mkl]` extra). It registers
them with the llvm layer as `graphc_blas_sgemm`/`graphc_blas_dgemm` (and `..gemv`), and
hands the library's threads to graphc's one pool (graphc.backends.cpu.threads). A graph that
needs GEMM where no BLAS is found is refused with a GraphcError that says what was tried and
what to do.

`avx512_unused(blas)`: the host has AVX-512 but the BLAS is an OpenBLAS whose kernels (its
`openblas_get_corename()`, kept as `Blas.core`) use none, as numpy's OpenBLAS 0.3.31 picks
Haswell's AVX2 kernels on an AMD Zen 5 it does not know: SGEMM at ~130 GFLOP/s a core where
graphc's generated kernels run ~230 (docs/performance.md, "thirteenth session: graphc's own
GEMM"). graphc.backends.cpu.small_gemm then takes large float32 products too. An OpenBLAS
with AVX-512 kernels (SkylakeX, Cooperlake, SapphireRapids) or MKL (no core name) keeps them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import importlib.metadata
import os
from dataclasses import dataclass
from typing import Iterator

from graphc import config
from graphc.backends.cpu import llvm, threads
from graphc.errors import GraphcError

__all__ = ["AVX512_CORES", "Blas", "avx512_unused", "blas_libraries", "mkl_library",
           "resolve_blas"]


@dataclass(frozen=True)
class Blas:
    """CBLAS GEMM entry points: the library, the functions' addresses, integer width."""

    path: str
    sgemm: int
    dgemm: int
    ilp64: bool  # 64-bit integer arguments
    sgemv: int = 0  # 0 where the library has no cblas_?gemv: GEMM serves single rows too
    dgemv: int = 0
    core: str = ""  # OpenBLAS's kernel family (openblas_get_corename); "" for other BLAS

    def symbol(self, dtype: str, routine: str = "gemm") -> str | None:
        if routine == "gemv" and not self.sgemv:
            return None
        return f"graphc_blas_{'s' if dtype == 'float32' else 'd'}{routine}"


# (symbol of sgemm, symbol of dgemm, ilp64) tried in each library, in order
_SYMBOLS = (("cblas_sgemm_64", "cblas_dgemm_64", True),  # MKL's ILP64 names
            ("scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_", True),
            ("cblas_sgemm64_", "cblas_dgemm64_", True),
            ("scipy_cblas_sgemm", "scipy_cblas_dgemm", False),
            ("cblas_sgemm", "cblas_dgemm", False))


# OpenBLAS's core names (lower case) whose SGEMM kernels use AVX-512
AVX512_CORES = frozenset({"skylakex", "cooperlake", "sapphirerapids"})
# where an OpenBLAS says which kernels it runs: the plain name, then numpy's and scipy's
# renamed builds (ILP64, LP64)
_CORENAME_SYMBOLS = ("openblas_get_corename", "scipy_openblas_get_corename64_",
                     "scipy_openblas_get_corename")


def avx512_unused(blas: Blas | None) -> bool:
    """True where the host has AVX-512 and `blas` is an OpenBLAS running kernels without
    it (see the module docstring); False for MKL, an AVX-512 core, or a host without it."""
    if blas is None or not blas.core or blas.core.lower() in AVX512_CORES:
        return False
    return llvm.host_target().has_feature("avx512f")


def _core_name(lib: ctypes.CDLL) -> str:
    """OpenBLAS's name of the kernels it picked for this host, or "" (not an OpenBLAS)."""
    for symbol in _CORENAME_SYMBOLS:
        corename = getattr(lib, symbol, None)
        if corename is not None:
            corename.restype = ctypes.c_char_p
            return (corename() or b"").decode(errors="replace")
    return ""


def mkl_library() -> str | None:
    """The path of libmkl_rt from the installed `mkl` wheel (pip install mkl), or None."""
    try:
        files = importlib.metadata.files("mkl") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name.startswith("libmkl_rt.so"):
            path = os.path.realpath(file.locate())
            if os.path.exists(path):
                return path
    return None


def blas_libraries() -> Iterator[str]:
    """Candidate shared libraries, in order: MKL's libmkl_rt (GRAPHC_BLAS=auto or mkl, where
    the `mkl` wheel is installed), numpy's bundled OpenBLAS, scipy's, the system's.
    Each is looked for only when the one before did not serve (`resolve_blas` stops at the
    first that does): scipy's import and `ctypes.util.find_library`, which runs ldconfig
    (~20 ms of wall time per name), are paid only where numpy has no OpenBLAS.
    GRAPHC_BLAS=mkl yields MKL alone (so a missing MKL is an error, not a silent OpenBLAS)."""
    choice = config.blas_choice()
    if choice in ("auto", "mkl"):
        mkl = mkl_library()
        if mkl is not None:
            yield mkl
        if choice == "mkl":
            return
    try:
        import numpy

        root = os.path.dirname(os.path.dirname(numpy.__file__))
        yield from sorted(glob.glob(os.path.join(root, "numpy.libs", "*openblas*.so*")))
        yield from sorted(glob.glob(os.path.join(os.path.dirname(numpy.__file__), ".dylibs",
                                                 "*openblas*")))
    except ImportError:  # pragma: no cover
        pass
    try:
        import scipy

        root = os.path.dirname(os.path.dirname(scipy.__file__))
        yield from sorted(glob.glob(os.path.join(root, "scipy.libs", "*openblas*.so*")))
    except ImportError:
        pass
    for name in ("openblas", "cblas", "blas"):
        found = ctypes.util.find_library(name)
        if found:
            yield found


_HANDLES: list = []


@functools.lru_cache(maxsize=None)
def resolve_blas() -> Blas:
    """Find sgemm/dgemm once and register them with the llvm layer (see module docstring)."""
    tried = []
    for path in blas_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            tried.append(f"{path} (does not load)")
            continue
        for s, d, ilp64 in _SYMBOLS:
            try:
                sgemm, dgemm = getattr(lib, s), getattr(lib, d)
            except AttributeError:
                continue
            gemv = [getattr(lib, n.replace("gemm", "gemv"), None) for n in (s, d)]
            sgemv, dgemv = (ctypes.cast(f, ctypes.c_void_p).value if f is not None and
                            all(gemv) else 0 for f in gemv)
            blas = Blas(path, ctypes.cast(sgemm, ctypes.c_void_p).value,
                        ctypes.cast(dgemm, ctypes.c_void_p).value, ilp64, sgemv, dgemv,
                        _core_name(lib))
            addresses = {("float32", "gemm"): blas.sgemm, ("float64", "gemm"): blas.dgemm,
                         ("float32", "gemv"): blas.sgemv, ("float64", "gemv"): blas.dgemv}
            for (dtype, routine), address in addresses.items():
                if address:
                    llvm.register_symbol(blas.symbol(dtype, routine), address)
            _HANDLES.append(lib)  # the library stays open for the process
            threads.install(lib, path)  # its parallel jobs run on libgomp's team
            return blas
        tried.append(f"{path} (no cblas_sgemm/cblas_dgemm)")
    raise GraphcError(
        "cpu backend: no BLAS with cblas_sgemm/cblas_dgemm found (tried: "
        f"{', '.join(tried) or 'nothing: no numpy/scipy OpenBLAS, no system libopenblas'}); "
        + ("GRAPHC_BLAS=mkl asks for MKL alone: pip install mkl, or unset GRAPHC_BLAS"
           if config.blas_choice() == "mkl" else
           "install numpy or scipy wheels (they bundle OpenBLAS) or libopenblas, or compile "
           "with backend=\"interp\""))
