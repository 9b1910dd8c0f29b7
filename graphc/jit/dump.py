"""`graphc.dump`: the IR text of a graph, of a compiled callable, or of tracing a function.

One entry point for "show me the graph" in bug reports and notebooks. It accepts:
- an `ir.Graph`: printed as is;
- a compiled callable (`graphc.compile(...)`): its most recent graph, or, given example
  inputs, the graph of tracing the wrapped function on them (the callable's cache is left
  untouched);
- any function or Module with example inputs: traced once (`graphc.trace`), then printed.

The text is what `graphc.ir.parse` reads back, and what `graphc dump` and `GRAPHC_DUMP` write.

>>> import graphc
>>> from graphc.jit.dump import dump, ir_text
>>> dump(lambda x: x.exp(), graphc.ones(2))  # doctest: +ELLIPSIS
graph @_lambda_(%x: f32[2]) -> (f32[2]) {
  %0: f32[2] = exp(%x)                                    # <doctest ...>:1
  return (%0)
}
>>> graphc.ir.parse(ir_text(lambda x: x.exp(), graphc.ones(2))).nodes[0].op
'exp'
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any

from graphc.errors import ArgumentError
from graphc.ir.graph import Graph
from graphc.ir.printer import format_graph


def graph_of(obj: Any, *example_inputs) -> Graph:
    """The graph `dump` prints for `obj` (see the module docstring)."""
    from graphc.jit.compiler import Compiled
    from graphc.jit.tracer import trace

    if isinstance(obj, Graph):
        if example_inputs:
            raise ArgumentError("graphc.dump: a Graph takes no example inputs")
        return obj
    if isinstance(obj, Compiled):
        return trace(obj.fn, *example_inputs) if example_inputs else obj.graph
    if callable(obj):
        if not example_inputs:
            raise ArgumentError(
                f"graphc.dump: tracing {type(obj).__name__} needs example inputs: "
                "graphc.dump(fn, x, ...)"
            )
        return trace(obj, *example_inputs)
    raise ArgumentError(
        "graphc.dump: expected an ir.Graph, a compiled callable or a function/Module with "
        f"example inputs, got {type(obj).__name__}"
    )


def ir_text(obj: Any, *example_inputs) -> str:
    """The IR text `dump` prints, as a string (no trailing newline)."""
    return format_graph(graph_of(obj, *example_inputs))


def dump(obj: Any, *example_inputs, file: str | os.PathLike | IO[str] | None = None) -> None:
    """Print the IR text of `obj` (see the module docstring), one newline at the end.

    `file=None` prints to stdout; a path writes (overwrites) that file; an open text file
    is written to. `ir_text` returns the same text as a string.
    """
    text = ir_text(obj, *example_inputs)
    if file is None:
        print(text, file=sys.stdout)
    elif isinstance(file, (str, os.PathLike)):
        with open(file, "w") as f:
            f.write(text + "\n")
    else:
        file.write(text + "\n")


__all__ = ["dump", "graph_of", "ir_text"]
