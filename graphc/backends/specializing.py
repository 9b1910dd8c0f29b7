"""Symbolic graphs on backends that compile static graphs: one executable per call's sizes.

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
from graphc.symbolic import SymbolicShapeError, bind


class SpecializingExecutable:
    """Executable over per-size executables of a symbolic graph (see the module docstring)."""

    fresh_results = False

    def __init__(self, graph: Graph, backend: str,
                 factory: Callable[[Graph, dict], object], options: dict) -> None:
        self.graph = graph
        self.backend = backend
        self.memory_plan = graph.meta.get("memory_plan")
        self._factory = factory
        self._options = options
        self._by_size: dict[tuple, object] = {}
        self._lock = threading.Lock()
        self._declared = [v.type.shape for v in graph.inputs]
        self._names = [f"%{v.name}" for v in graph.inputs]

    def executable_for(self, values: dict[str, int]):
        """The backend's executable of the graph at these sizes (compiled on first use)."""
        key = tuple(sorted(values.items()))
        found = self._by_size.get(key)
        if found is None:
            with self._lock:
                found = self._by_size.get(key)
                if found is None:
                    found = self._by_size[key] = self._factory(
                        specialize(self.graph, values), self._options)
        return found

    @property
    def compiled_sizes(self) -> list[dict[str, int]]:
        return [dict(k) for k in self._by_size]

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]:
        try:
            values = bind(self._declared, [np.shape(a) for a in arrays], self._names)
        except SymbolicShapeError as err:
            raise GraphcError(f"graph @{self.graph.name} on {self.backend}: {err}") from None
        return self.executable_for(values).run(*arrays)


__all__ = ["SpecializingExecutable"]
