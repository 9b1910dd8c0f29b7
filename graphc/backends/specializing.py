"""Symbolic graphs on backends that compile static graphs: one executable per call's sizes.

A backend that can lower a symbolic graph once for every size passes `generic` (the cpu
backend: graphc.backends.cpu.runtime_sizes): its executable serves every call whose sizes
meet the guards its lowering assumed, and only the others are compiled per size as below.

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
        self._by_key: dict[tuple, object] = {}
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

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]:
        if len(arrays) != len(self.graph.inputs):
            raise GraphcError(f"graph @{self.graph.name} takes {len(self.graph.inputs)} "
                              f"inputs, got {len(arrays)}")
        if self._complete:
            key = tuple(np.shape(arrays[i])[d] for i, d, _ in self._reads)
            found = self._by_key.get(key)
            if found is not None:
                return found.run(*arrays)
        try:
            values = bind(self._declared, [np.shape(arrays[i]) for i in self._symbolic],
                          self._names)
        except SymbolicShapeError as err:
            raise GraphcError(f"graph @{self.graph.name} on {self.backend}: {err}") from None
        found = self.executable_for(values)
        if self._complete:
            self._by_key[tuple(values[name] for _, _, name in self._reads)] = found
        return found.run(*arrays)


__all__ = ["SpecializingExecutable"]
