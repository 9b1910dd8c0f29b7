"""GRAPHC_POISON: a CPU executable that poisons what its driver is to write, before each run.

A CpuExecutable's outputs and arena come from np.empty, and a large output array is reused
once its caller drops it (graphc.backends.cpu.executable, `_outputs`), so an element a kernel
never writes holds whatever was there: often the right value, left by the last call or by an
array freed before it. A test that compares bits with a cached run, or the same executable's
earlier result, then passes on a kernel that skips elements. With GRAPHC_POISON=1
(graphc.config.poison) the executable's driver is wrapped by `poisoned`, which before every
native run fills

- each output array (not an update computed into its own input, not a DDP window view, which
  other ranks share) with NaN where it is floating, its dtype's smallest integer where it is
  an integer, and True where it is bool (a skipped element then differs from every finite
  result and from any index a kernel could write);
- the whole arena, the planned intermediates and the backend's scratch alike (im2col
  columns, Winograd tiles, GEMM panels, a split kernel's per-thread copies), with 0xFF bytes:
  NaN in float16, float32 and float64 alike, -1 in every integer width, an invalid bool.

An element read before it is written then carries a NaN (or an impossible integer) into the
results, where a comparison with the interpreter or PyTorch sees it. Nothing is poisoned
between the kernels of one run: the driver's own reuse of an arena region within a run is
still unchecked. Poisoning costs a write of the arena per call (ResNet-18's step: ~0.2 GB);
it is for tests and debugging, off by default. The switch is read when an executable is
made (CpuExecutable._finish, RuntimeSizedExecutable), so an executable keeps the setting it
was made under.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Callable

import numpy as np

__all__ = ["ARENA_BYTE", "poisoned", "sentinel"]

ARENA_BYTE = 0xFF


def sentinel(dtype: np.dtype):
    """The value an output of `dtype` is filled with before a run: NaN, the smallest
    integer, or True."""
    if dtype.kind == "f":
        return np.nan
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return True


def _fill(address: int, shape: tuple, dtype: np.dtype) -> None:
    """Fill the `shape`/`dtype` array at `address` with its sentinel."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes:
        memory = (ctypes.c_char * nbytes).from_address(address)
        np.frombuffer(memory, dtype).fill(sentinel(dtype))


def poisoned(driver: Callable, executable) -> Callable:
    """`driver` (the module's `run(inputs, outputs, arena, ...)`) wrapped to poison its
    outputs and arena first (see the module docstring). `executable.written_layout(tail)`
    gives, for the driver's arguments after the pointer tables, the output types ((shape,
    dtype, kept) each), the output slots not to poison (window views) and the arena's bytes.
    The wrapper is stored on the executable, so it holds it weakly (no reference cycle: an
    executable dropped goes at once, as without poisoning)."""
    owner = weakref.ref(executable)

    def run(in_ptrs, out_ptrs, *tail):
        out_types, spared, arena_bytes = owner().written_layout(tail)
        for k, (shape, dtype, _) in enumerate(out_types):
            if k not in spared:
                _fill(out_ptrs[k], shape, dtype)
        ctypes.memset(tail[0], ARENA_BYTE, arena_bytes)
        return driver(in_ptrs, out_ptrs, *tail)

    return run
