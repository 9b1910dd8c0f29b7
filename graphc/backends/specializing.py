"""Symbolic graphs on backends that compile static graphs: one executable per call's sizes.

A backend that can lower a symbolic graph once for every size passes `generic` (the cpu
backend: graphc.backends.cpu.runtime_sizes): its executable serves every call whose sizes
meet the guards its lowering assumed, and only the others are compiled per size as below.
A call reads only the dims its symbols come from, and a size seen before is one dict lookup
away from its executable's `run_arrays` (every other dim is that executable's check).

A graph with symbolic sizes (`f32[s0,784]`) runs on the interpreter as it is (it binds the
sizes per call). A compiling backend that cannot take sizes at run time gets it through
`SpecializingExecutable`: each call binds the symbols from its inputs' shapes
(`graphc.symbolic.bind`), and the graph specialised to those sizes
(`graphc.ir.specialize`) is planned and compiled once per distinct sizes and kept. The
trace and its guards are shared by every size: a new size costs a backend compile (and the
backend's disk cache serves sizes seen before), never a retrace. This is the CUDA backend's
way for now (docs/backends.md); graphc.backends.compile picks it for any backend whose
factory does not declare `takes_symbolic_sizes`.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from graphc.errors import GraphcError
from graphc.ir.graph import Graph
from graphc.ir.specialize import specialize
from graphc.symbolic import Sym, SymbolicShapeError, bind, current_env, free_symbols


class SpecializingExecutable:
    """Executable over per-size executables of a symbolic graph (see the module docstring)."""

    fresh_results = False

    def __init__(self, graph: Graph, backend: str,
                 factory: Callable[[Graph, dict], object], options: dict,
                 generic: Callable | None = None) -> None:
        self.graph = graph
        self.backend = backend
        self.memory_plan = graph.meta.get("memory_plan")
        self._factory = factory
        self._options = options
        self._by_size: dict[tuple, object] = {}
        self._lock = threading.Lock()
        symbolic = [i for i, v in enumerate(graph.inputs) if v.type.is_symbolic]
        self._symbolic = symbolic  # only these are bound per call; the rest the inner checks
        self._declared = [graph.inputs[i].type.shape for i in symbolic]
        self._names = [f"%{graph.inputs[i].name}" for i in symbolic]
        # per call: each symbol's size read from the first input dim that is that symbol;
        # every other dim is checked by the specialised executable (its types are static)
        self._reads: list[tuple[int, int, str]] = []
        seen: set[str] = set()
        for i in symbolic:
            for d, size in enumerate(graph.inputs[i].type.shape):
                if type(size) is Sym and size.is_symbol() and size.name not in seen:
                    seen.add(size.name)
                    self._reads.append((i, d, size.name))
        self._complete = seen == free_symbols(tuple(self._declared))
        # one symbol (a batch): its (input, dim), and its size alone is the key
        self._first = self._reads[0][:2] if len(self._reads) == 1 else None
        # the sizes read from `_reads` (the size alone for one symbol) -> `run(arrays)` of
        # the executable at those sizes
        self._by_key: dict[object, Callable] = {}
        # compiled now for the trace's sizes where a trace is on (graphc.jit compiles under
        # its ShapeEnv): the first call runs at once, and the results contract is known
        env = current_env()
        names = free_symbols(tuple(self._declared))
        # the backend's one executable for every size, where it has one (generic(graph,
        # options, hints) -> executable with accepts(values) and at(values), or None)
        self._generic = None
        if generic is not None:
            self._generic = generic(graph, options, None if env is None else env.hints)
        if env is not None and names <= env.hints.keys():
            first = self.executable_for({n: env.hints[n] for n in names})
            self.fresh_results = getattr(first, "fresh_results", False)

    def executable_for(self, values: dict[str, int]):
        """The backend's executable of the graph at these sizes (compiled on first use)."""
        key = tuple(sorted(values.items()))
        found = self._by_size.get(key)
        if found is None:
            with self._lock:
                found = self._by_size.get(key)
                if found is None and self._generic is not None and \
                        self._generic.accepts(values):
                    found = self._by_size[key] = self._generic.at(values)
                if found is None:
                    graph = specialize(self.graph, values)
                    plan = self.memory_plan
                    if plan is not None and getattr(plan, "symbolic", False):
                        # the symbolic plan laid out for these sizes: no planning per size
                        graph.meta["memory_plan"] = plan.specialized(values, graph)
                    found = self._by_size[key] = self._factory(graph, self._options)
        return found

    @property
    def compiled_sizes(self) -> list[dict[str, int]]:
        """The sizes compiled on their own (not served by the generic executable)."""
        return [dict(k) for k, e in self._by_size.items() if not getattr(e, "generic", False)]

    @property
    def runs_generic(self) -> bool:
        """Whether one executable serves every size (graphc.backends.cpu.runtime_sizes)."""
        return self._generic is not None

    @property
    def updates_in_place(self) -> tuple | None:
        """Per update, whether the run returns its target's own array (graphc.jit.call_plan):
        the executable for every size's, where there is one (a per-size one made for sizes
        it does not serve may answer otherwise: the call plan then finds the array is not
        its target's, and writes it back)."""
        return getattr(self._generic, "updates_in_place", None)

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]:
        if self._complete:
            try:  # the sizes of the dims the symbols were read from: the size's executable
                found = self._by_key.get(arrays[self._first[0]].shape[self._first[1]]
                                         if self._first else
                                         tuple([arrays[i].shape[d] for i, d, _ in self._reads]))
            except (AttributeError, IndexError, TypeError):  # not arrays, or another rank
                found = None
            if found is not None and len(arrays) == len(self.graph.inputs):
                # every dim but those, and every input's dtype, is the executable's check
                return found(arrays)
        if len(arrays) != len(self.graph.inputs):
            raise GraphcError(f"graph @{self.graph.name} takes {len(self.graph.inputs)} "
                              f"inputs, got {len(arrays)}")
        try:
            values = bind(self._declared, [np.shape(arrays[i]) for i in self._symbolic],
                          self._names)
        except SymbolicShapeError as err:
            raise GraphcError(f"graph @{self.graph.name} on {self.backend}: {err}") from None
        found = self.executable_for(values)
        if self._complete:
            key = tuple(values[name] for _, _, name in self._reads)
            self._by_key[key[0] if self._first else key] = getattr(
                found, "run_arrays", None) or _ArraysRun(found)
        return found.run(*arrays)


class _ArraysRun:
    """An executable's `run` called with the arrays as one tuple (`run_arrays`, where the
    executable has none of its own)."""

    __slots__ = ("run",)

    def __init__(self, executable) -> None:
        self.run = executable.run

    def __call__(self, arrays: tuple) -> list[np.ndarray]:
        return self.run(*arrays)


__all__ = ["SpecializingExecutable"]
