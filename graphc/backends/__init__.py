"""Backends: `compile(graph, backend=...) -> Executable`.

An Executable is what a backend makes of one graph: `run(*arrays)` takes one numpy array per
graph input and returns the outputs followed by the new value of each updated input (the
graph's `updates`, in order). It exposes `graph`, and `memory_plan` (None until the planning
pass exists). The compiled callable of graphc.compile binds tensors to inputs and writes the
updates back; backends only compute.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from graphc.errors import ArgumentError
from graphc.ir.graph import Graph

BACKENDS = ("interp",)


class Executable(Protocol):
    graph: Graph
    memory_plan: object | None

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]: ...


def compile(graph: Graph, backend: str = "interp", options: dict | None = None) -> Executable:  # noqa: A001
    """Make an executable of `graph` with the named backend."""
    if backend == "interp":
        from graphc.backends.interp import InterpExecutable

        return InterpExecutable(graph)
    raise ArgumentError(
        f"graphc.compile: unknown backend {backend!r}; available: {', '.join(BACKENDS)}"
    )
