"""Backends: `compile(graph, backend=...) -> Executable`.

An Executable is what a backend makes of one graph: `run(*arrays)` takes one numpy array per
graph input and returns the outputs followed by the new value of each updated input (the
graph's `updates`, in order). It exposes `graph`, and `memory_plan` (None until the planning
pass exists). The compiled callable of graphc.compile binds tensors to inputs and writes the
updates back; backends only compute.
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from graphc.errors import ArgumentError
from graphc.ir.graph import Graph


class Executable(Protocol):
    graph: Graph
    memory_plan: object | None

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]: ...


def _interp(graph: Graph, options: dict) -> Executable:
    from graphc.backends.interp import InterpExecutable

    return InterpExecutable(graph)


def _cpu(graph: Graph, options: dict) -> Executable:
    from graphc.backends.cpu.executable import CpuExecutable  # loads llvmlite: only here

    return CpuExecutable(graph, options)


def _cuda(graph: Graph, options: dict) -> Executable:
    from graphc.backends.cuda.executable import CudaExecutable  # loads the runtime: only here

    return CudaExecutable(graph, options)


# name -> factory(graph, options) -> Executable
BACKENDS: dict[str, Callable[[Graph, dict], Executable]] = {
    "interp": _interp, "cpu": _cpu, "cuda": _cuda,
}


def register_backend(name: str, factory: Callable[[Graph, dict], Executable]) -> None:
    """Make `factory(graph, options)` available as `backend=name` (tests add broken ones)."""
    BACKENDS[name] = factory


def check_backend(name: str) -> None:
    if name not in BACKENDS:
        raise ArgumentError(
            f"graphc.compile: unknown backend {name!r}; available: {', '.join(BACKENDS)}"
        )


def compile(graph: Graph, backend: str = "interp", options: dict | None = None) -> Executable:  # noqa: A001
    """Make an executable of `graph` with the named backend.

    A graph with symbolic sizes (`f32[s0,784]`) goes to the backend as it is where the
    backend runs symbolic graphs (`SYMBOLIC_BACKENDS`: the interpreter); any other backend
    gets a `graphc.backends.specializing.SpecializingExecutable`, which runs the backend's
    one executable for every size where it has one (`GENERIC_FACTORIES`: cpu, whose kernels
    read sizes per call) and compiles the graph specialised to each call's sizes otherwise,
    once per distinct sizes."""
    check_backend(backend)
    factory = BACKENDS[backend]
    if backend not in SYMBOLIC_BACKENDS and any(v.type.is_symbolic for v in graph.inputs):
        from graphc.backends.specializing import SpecializingExecutable

        return SpecializingExecutable(graph, backend, factory, options or {},
                                      GENERIC_FACTORIES.get(backend))
    return factory(graph, options or {})


# backends whose executables take a symbolic graph and bind its sizes per call
SYMBOLIC_BACKENDS = {"interp"}


def _cpu_generic(graph: Graph, options: dict, hints):
    from graphc.backends.cpu.runtime_sizes import generic

    return generic(graph, options, hints)


# backends that lower a symbolic graph once for every size where its ops allow
# (graphc.backends.specializing compiles the rest per size)
GENERIC_FACTORIES = {"cpu": _cpu_generic}
