"""What feeds each input of a traced graph, and the result of a trace.

`graphc.jit.tracer` makes one binding per graph input, in order: an argument of the call
(`ArgBinding`), a tensor the traced code captured (`TensorBinding`), data it made without an op
(`ConstantBinding`), the `.grad` of a tensor that requires grad (`GradBinding`), or the
[seed, offset] of a random generator (`RngBinding`). `graphc.jit.compiler` and
`graphc.testing` read them to call the graph again with new arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphc.ir.graph import Graph
from graphc.jit.pytree import at
from graphc.tensor import Tensor


@dataclass
class ArgBinding:
    """A graph input fed by the tensor at `path` in the call's (args, kwargs)."""

    path: tuple


@dataclass
class TensorBinding:
    """A graph input bound to a tensor captured by the traced code (a parameter, a buffer)."""

    tensor: Tensor


@dataclass
class ConstantBinding:
    """A graph input fed with (a fresh copy of) data the traced code created, not from an op."""

    array: np.ndarray


@dataclass
class GradBinding:
    """A graph input fed by the `.grad` of a tensor that requires grad (its *holder*), read at
    every call: `holder` is a captured tensor, or the argument at `path` when `holder` is None.
    """

    holder: Tensor | None = None
    path: tuple | None = None

    def resolve(self, args: tuple, kwargs: dict) -> Tensor:
        return self.holder if self.path is None else at((args, kwargs), self.path)


@dataclass
class GradOutput:
    """After every run, the holder's `.grad` becomes graph output `index` (a fresh tensor), or
    None when `index` is None. The holder as in GradBinding."""

    holder: Tensor | None
    path: tuple | None
    index: int | None

    def resolve(self, args: tuple, kwargs: dict) -> Tensor:
        return self.holder if self.path is None else at((args, kwargs), self.path)


@dataclass
class RngBinding:
    """A graph input that holds [seed, offset] of `generator`; a call advances it by `counters`.

    `traced_state` is the (seed, offset) the trace started from. A generator the traced call
    made itself and dropped (`graphc.Generator().manual_seed(s)` inside it) is `transient`:
    every eager call makes it afresh, so every run reads `traced_state`, unadvanced, and
    `generator` is then a stand-in in the state the trace left it in.
    """

    generator: Any
    counters: int = 0
    traced_state: tuple[int, int] = (0, 0)
    transient: bool = False


@dataclass
class TraceResult:
    """A traced graph plus what is needed to call it again with new arguments."""

    graph: Graph
    # one ArgBinding / TensorBinding / GradBinding / ConstantBinding / RngBinding per graph
    # input, in order
    bindings: list
    out_spec: Any  # the output structure with tensors replaced by their output index
    result: Any = None  # what the tracing call returned (abstract tensors, unless it ran eagerly)
    # output index -> graph input index, for outputs that ARE an input tensor (`return x`,
    # `return self.weight`): a compiled call returns that very tensor, as the eager call does
    output_aliases: dict[int, int] = field(default_factory=dict)
    # the .grad write-backs; their outputs follow the function's own in graph.outputs
    grad_outputs: list[GradOutput] = field(default_factory=list)
    # output index -> position in grad_outputs, for an output that IS a holder's new .grad
    # (`return w.grad`): a compiled call returns the tensor it assigned to `.grad`
    output_grads: dict[int, int] = field(default_factory=dict)
    restore: Any = None  # undoes the tracing run's effects (Tracer.restore), for refusals
    # (output index, tensor) for each abstract tensor the call made and left in state it can
    # reach (optimizer state created lazily, a module attribute): its output follows the
    # .grad outputs, and the first compiled run gives the tensor that output's value
    escaped: list[tuple[int, Tensor]] = field(default_factory=list)
    # a symbolic trace (graphc.symbolic): (argument path, dim, symbol name) for each argument
    # dimension that was traced as a symbol, and the ShapeEnv holding their hints and guards
    symbols: list[tuple[tuple, int, str]] = field(default_factory=list)
    shape_env: Any = None

