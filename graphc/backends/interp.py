"""The interpreter backend: runs the graph with the registry's numpy kernels.

It is the reference every other backend is compared against, and the backend that works
everywhere.
"""

from __future__ import annotations

import numpy as np

from graphc.ir.graph import Graph
from graphc.ir.interpreter import Interpreter
from graphc.ir.verifier import verify


class InterpExecutable:
    """Executable over graphc.ir.Interpreter (see graphc.backends for the contract)."""

    backend = "interp"

    def __init__(self, graph: Graph) -> None:
        self.graph = verify(graph)
        self.memory_plan = graph.meta.get("memory_plan")  # set by plan_buffers, if it ran
        self._interpreter = Interpreter(graph)

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]:
        return self._interpreter.run(*arrays)
