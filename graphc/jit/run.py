"""Running a compiled entry's executable: the native run, then its updates written back into
their tensors, with Ctrl-C held so that a step is never half applied.

`run_and_write_back(executable, arrays, targets)` runs the executable (values another
executable keeps on its device fetched first: graphc.backends.residency), writes each update
into its target tensor (copying first any value that shares memory with a call array, so no
write changes a value still to be written), bumps the targets' version counters, and returns
the outputs. `HeldInterrupts` (`with interrupts_held():`) holds SIGINT around a step and
delivers it after.
"""

from __future__ import annotations

import operator
import signal
import threading

import numpy as np

from graphc.backends import Executable, residency
from graphc.jit import nan_check
from graphc.tensor import Tensor

__all__ = ["HeldInterrupts", "as_array", "as_tensor", "interrupts_held", "run_and_write_back",
           "write_back"]

_ARRAY = operator.attrgetter("_array")
_VERSION_COUNTER = operator.attrgetter("_version_counter")

# signal.signal is a Python wrapper that converts handlers to and from enums (5 us of a
# compiled call's two calls); its C function does the same work without that
try:
    from _signal import signal as _set_handler
except ImportError:  # pragma: no cover (another Python implementation)
    _set_handler = signal.signal


class HeldInterrupts:
    """Hold SIGINT (Ctrl-C) for the duration of the block and deliver it when the block ends:
    a compiled step runs natively and then writes its updates back, and an interrupt between
    the two would leave parameters moved but optimizer state or `.grad`s not. So the step
    completes, then the KeyboardInterrupt (or the program's own SIGINT handler) follows.
    Only the main thread receives signals; elsewhere this does nothing. (A class, not a
    generator context manager: a compiled call enters it every time.)"""

    __slots__ = ("held", "previous", "active")

    def __enter__(self) -> None:
        self.active = False
        if threading.get_ident() != threading.main_thread().ident:
            return
        self.held = held = []
        try:
            self.previous = _set_handler(signal.SIGINT, lambda signum, frame: held.append(frame))
        except ValueError:  # not the main interpreter
            return
        self.active = True

    def __exit__(self, *exc) -> None:
        if not self.active:
            return
        previous = self.previous
        _set_handler(signal.SIGINT, previous)
        if self.held:  # delivered even when the step failed (the failure becomes its context)
            if callable(previous):
                previous(signal.SIGINT, self.held[0])
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt


def interrupts_held() -> HeldInterrupts:
    """`with interrupts_held():` holds Ctrl-C over the block (`HeldInterrupts`)."""
    return HeldInterrupts()


def run_and_write_back(executable: Executable, arrays: list, targets: list,
                        check: nan_check.Check | None = None, n_checked: int | None = None
                        ) -> list:
    """Run an executable; write its updates into `targets` (the tensors of graph.updates'
    targets, in order); return its outputs.
    With a `check` (GRAPHC_CHECK_NANS=1), its first `n_checked` outputs (default: all) and its
    updates must be finite, else graphc.jit.nan_check raises before anything is written back."""
    n_out = len(executable.graph.outputs)
    # values another executable keeps on its device are fetched first; with a check every
    # one is (the check runs on private copies)
    if residency.stale:
        residency.fresh_all(arrays, keep=executable if check is None else None)
    results = executable.run(*arrays) if check is None else nan_check.run_checked(
        executable, arrays, check, n_out if n_checked is None else n_checked)
    outputs, updates = results[:n_out], results[n_out:]
    write_back(executable, arrays, targets, updates)
    return outputs


def write_back(executable: Executable, arrays: list, targets: list, updates: list) -> None:
    """Write a run's `updates` into their `targets` (tensors) and bump the targets' version
    counters (`run_and_write_back`'s second half; `arrays`: the call's input arrays)."""
    # `_array`: fresh_all before the run fetched every value another device held
    current = list(map(_ARRAY, targets))
    if all(map(operator.is_, updates, current)):  # every update computed in place: no writes
        for counter in map(_VERSION_COUNTER, targets):
            counter.bump()
        return
    # A value the backend computed straight into its target needs no write. Any other value
    # that shares memory with a call array is copied first: writing one target must never
    # change a value still to be written. A backend with `fresh_results` returns call arrays
    # only as their own targets' values, so only those are looked for.
    if getattr(executable, "fresh_results", False):
        call_arrays = {id(a) for a in arrays}
        new_values = [u if u is c or id(u) not in call_arrays else np.array(u, copy=True)
                      for c, u in zip(current, updates)]
    else:
        new_values = [u if u is c else
                      np.array(u, copy=True) if any(np.may_share_memory(u, a) for a in arrays)
                      else u for c, u in zip(current, updates)]
    for t, c, value in zip(targets, current, new_values):
        if value is not c:
            np.copyto(c, value)
        t._version_counter.bump()


def as_array(output) -> np.ndarray:
    """An executable's output as an array (a CompiledFunction output is a tensor)."""
    return output._data if isinstance(output, Tensor) else np.asarray(output)


def as_tensor(output) -> Tensor:
    """An executable's output array as a tensor (a CompiledFunction output already is one)."""
    return output if isinstance(output, Tensor) else Tensor._wrap(np.asarray(output))
