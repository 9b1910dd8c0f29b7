"""CudaExecutable: a planned graph run as a fixed launch list over one device allocation.

`CudaExecutable(graph, options)` plans the graph if it has no `memory_plan` yet, lowers it
(graphc.backends.cuda.lowering: generated kernels and library calls, every address fixed),
compiles and loads the generated source (graphc.backends.cuda.compile, cached on disk),
allocates ONE device buffer of `lowered.device_bytes` ([plan arena | inputs | scratch]) and
binds every launch and call to absolute addresses. `run(*arrays)`:
host -> device copies of the inputs, the steps in order, device -> host copies of the outputs
and update values, and a check of the error words (a bad index or NLL target raises
IndexOutOfRangeError naming the op); the contract of graphc.backends holds: outputs, then
one value per update, and an update written into its input array (as the CPU executable).

Invariants: copies between host and device happen only at these boundaries; calls on one
executable are serialised by a lock (they share the device buffer); the device buffer and
the module live as long as the executable (freed in `close()` / on collection).
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from graphc.backends.common import planned
from graphc.backends.cuda import rt as rtmod
from graphc.backends.cuda.compile import load_module
from graphc.backends.cuda.cudagen import BLOCK
from graphc.backends.cuda.lowering import Addr, Call, Launch, lower
from graphc.errors import ArgumentError, IndexOutOfRangeError
from graphc.ir.graph import Graph
from graphc.ir.verifier import verify


class CudaExecutable:
    """Executable of the "cuda" backend (see graphc.backends for the contract)."""

    backend = "cuda"

    def __init__(self, graph: Graph, options: dict | None = None) -> None:
        self.graph = verify(graph)
        self.rt = rtmod.runtime_library()
        self.memory_plan = plan = planned(graph)
        self.lowered = low = lower(graph)
        self.module = load_module(self.rt, low.source, graph.name or "graph") \
            if low.kernels else None
        self._base = ctypes.c_void_p()
        self.rt.gc_malloc(ctypes.byref(self._base), max(low.device_bytes, 256))
        base = self._base.value
        self._steps = [self._bind(step, base) for step in low.steps]
        self._input_ptrs = [base + o for o in low.input_offsets]
        self._in_types = [(v.type.shape, np.dtype(v.type.dtype.np)) for v in graph.inputs]
        index = {v.name: i for i, v in enumerate(graph.inputs)}
        results = list(graph.outputs) + [v for _, v in graph.updates]
        self._results = []  # (device address, type, input index or None)
        for k, (v, layout) in enumerate(zip(results, low.result_layouts)):
            target = None
            if k >= len(graph.outputs) and v.name in plan.in_input:
                target = index[plan.in_input[v.name]]
            self._results.append((base + layout.offset, v.type, target))
        self._errors_ptr = base + low.errors_offset
        self._lock = threading.Lock()

    def _bind(self, step, base: int):
        def resolve(a):
            return ctypes.c_void_p(base + a.offset) if isinstance(a, Addr) else a

        if isinstance(step, Launch):
            fn = self.module.function(step.function)
            values = [ctypes.c_void_p(base + a.offset) for a in step.args]
            args = (ctypes.c_void_p * max(len(values), 1))(
                *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
            grid = (ctypes.c_int64 * 3)(-(-step.threads // BLOCK), 1, 1)
            block = (ctypes.c_int64 * 3)(BLOCK, 1, 1)
            call = self.rt.gc_launch
            return call, (fn, grid, block, 0, args, None), (values,)
        assert isinstance(step, Call)
        return getattr(self.rt, step.function), tuple(resolve(a) for a in step.args), step.keep

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]:
        g = self.graph
        if len(arrays) != len(self._in_types):
            raise ArgumentError(f"graph @{g.name} takes {len(self._in_types)} inputs, got "
                                f"{len(arrays)}")
        bound = []
        for i, (a, (shape, dtype)) in enumerate(zip(arrays, self._in_types)):
            a = np.asarray(a)
            if a.shape != shape or a.dtype != dtype:
                raise ArgumentError(f"graph @{g.name}: input %{g.inputs[i].name} expects "
                                    f"{g.inputs[i].type}, got {a.dtype}{list(a.shape)}")
            bound.append(np.ascontiguousarray(a))
        rt = self.rt
        n_errors = len(self.lowered.errors)
        errors = np.zeros(max(n_errors, 1), np.int64)
        with self._lock:
            for a, ptr in zip(bound, self._input_ptrs):
                if a.nbytes:
                    rt.gc_memcpy_h2d(ptr, a.ctypes.data, a.nbytes, None)
            if n_errors:
                rt.gc_memset(self._errors_ptr, 0, 8 * n_errors, None)
            for fn, args, _ in self._steps:
                fn(*args)
            outs = []
            for ptr, t, target in self._results:
                if target is not None and arrays[target].flags.writeable and \
                        isinstance(arrays[target], np.ndarray) and \
                        arrays[target].flags.c_contiguous:
                    out = arrays[target]
                else:
                    out = np.empty(t.shape, t.dtype.np)
                if out.nbytes:
                    rt.gc_memcpy_d2h(out.ctypes.data, ptr, out.nbytes, None)
                outs.append(out)
            if n_errors:
                rt.gc_memcpy_d2h(errors.ctypes.data, self._errors_ptr, 8 * n_errors, None)
            rt.gc_device_synchronize()
        for k in np.flatnonzero(errors[:n_errors]):
            raise IndexOutOfRangeError(f"cuda backend: graph @{g.name} failed: "
                                       f"{self.lowered.errors[k]}")
        return outs

    def close(self) -> None:
        base, self._base = getattr(self, "_base", None), None
        if base is not None and base.value:
            self.rt.gc_free(base)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass
