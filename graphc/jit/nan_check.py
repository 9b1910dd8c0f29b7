"""GRAPHC_CHECK_NANS=1: stop a compiled call that made a NaN or an Inf, and name the node.

With the flag set (`graphc.config.check_nans()`), graphc.compile runs every executable of a
call through `run_checked`, which
- hands the executable private copies of the inputs it updates (the CPU backend computes
  some updates straight into the input's buffer), so a failing call writes nothing into the
  bound tensors;
- looks at every floating output it is told to check and every updated value; if one holds a
  NaN or an Inf, it replays the *traced* graph (the user's ops before simplification and
  fusion, each node with the source line it was traced from) on the numpy interpreter with
  the very same input arrays, finds the first node whose output holds a NaN or an Inf (and,
  when that one only made an Inf, the first node that made a NaN), rewinds the random
  generators the call advanced, and raises `NonFiniteError` naming the node's op, its IR line
  (its text and line number in the printed graph) and the user's source line.
graphc.compile asks for the check before it binds the call's inputs, so nothing has been
written back when the error is raised: parameters, optimizer state, `.grad`s and generators
are as they were before the call, and the compiled callable stays usable. On the first call of
a signature (the tracing call, which runs eagerly) graphc.compile undoes the eager run and runs
the compiled graph through the same check; should it fail, the call leaves no executable
behind and `LazyState` drops the optimizer state the eager run created lazily, so the next call
traces afresh.

Off by default, and then free: graphc.compile does not call this module at all.

>>> import graphc, os
>>> os.environ["GRAPHC_CHECK_NANS"] = "1"
>>> @graphc.compile
... def f(x):
...     return (x - 1.0).log() * 2.0
>>> f(graphc.tensor([2.0, 3.0]))
tensor([0.0000, 1.3863])
>>> f(graphc.tensor([2.0, 0.5]))
Traceback (most recent call last):
...
graphc.jit.nan_check.NonFiniteError: graphc.compile(f): GRAPHC_CHECK_NANS=1: output 0 ... 1 NaN ...
...is op 'log' at <doctest ...>:3, IR line 4; ...
>>> del os.environ["GRAPHC_CHECK_NANS"]
"""

from __future__ import annotations

import numpy as np

from graphc.errors import GraphcError
from graphc.ir.graph import Graph, Node
from graphc.ir.interpreter import Interpreter
from graphc.ir.printer import format_node

__all__ = ["Check", "LazyState", "NonFiniteError", "run_checked"]


class NonFiniteError(GraphcError, RuntimeError):
    """A compiled call produced a NaN or an Inf while GRAPHC_CHECK_NANS=1 (nothing was written
    back). `node` is the first traced node that produced one (None when the replay found none),
    `loc` its user source line."""

    def __init__(self, message: str, node: Node | None = None) -> None:
        super().__init__(message)
        self.node = node
        self.loc = node.loc if node is not None else None


def _counts(array: np.ndarray) -> tuple[int, int]:
    """(NaNs, Infs) in a floating array; (0, 0) for other dtypes."""
    array = np.asarray(array)
    if array.dtype.kind != "f":
        return 0, 0
    return int(np.isnan(array).sum()), int(np.isinf(array).sum())


def _describe(array: np.ndarray) -> str:
    nans, infs = _counts(array)
    parts = [f"{nans} NaN" if nans else "", f"{infs} Inf" if infs else ""]
    return " and ".join(p for p in parts if p) + f" of {np.asarray(array).size} element(s)"


class Check:
    """What `run_checked` needs about one compiled call: the name to report, the traced graph
    to replay, how many leading outputs to check (the user's outputs and `.grad`s, not the
    values a forward saves for the backward) and the generators to rewind on failure."""

    def __init__(self, name: str, traced: Graph, generators=()) -> None:
        self.name = name
        self.traced = traced
        self._generators = [(g, g._seed, g._offset) for g in generators if g is not None]

    def rewind(self) -> None:
        for generator, seed, offset in self._generators:
            generator._seed, generator._offset = seed, offset


class LazyState:
    """The state keys of every optimizer a call can reach, taken before its first (tracing)
    call: when the checked compiled run of that call fails, `drop_new()` removes the state the
    undone eager run created lazily (momentum buffers, Adam's moments), which
    `TraceResult.restore` does not know about."""

    def __init__(self, fn, args: tuple, kwargs: dict) -> None:
        from graphc.jit.reach import reachable
        from graphc.optim.optimizer import Optimizer

        optimizers = [obj for _, obj in reachable(fn, args, kwargs) if isinstance(obj, Optimizer)]
        self._before = [(opt, {id(p): set(state) for p, state in opt.state.items()})
                        for opt in optimizers]

    def drop_new(self) -> None:
        for opt, before in self._before:
            for p, state in list(opt.state.items()):
                if id(p) not in before:
                    del opt.state[p]
                    continue
                for key in set(state) - before[id(p)]:
                    del state[key]


class _Found(GraphcError):
    """Stops the replay at the node that settles the search (internal)."""


class _Replay(Interpreter):
    """The interpreter, noting the first node to output a NaN or an Inf and the first NaN."""

    def __init__(self, graph: Graph) -> None:
        super().__init__(graph)
        self.first: tuple[int, Node, list, list] | None = None
        self.first_nan: tuple[int, Node, list, list] | None = None

    def run_node(self, node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
        results = super().run_node(node, args)
        counts = [_counts(r) for r in results]
        if any(n or i for n, i in counts):
            found = (self.graph.nodes.index(node), node, args, results)
            self.first = self.first or found
            if any(n for n, _ in counts):
                self.first_nan = found
                raise _Found()
        return results


def run_checked(executable, arrays: list, check: Check, n_checked: int) -> list[np.ndarray]:
    """`executable.run(*arrays)` with the updated inputs copied; raises NonFiniteError (after
    `check.rewind()`) when one of the first `n_checked` outputs or an updated value holds a NaN
    or an Inf. `arrays` are never written."""
    graph = executable.graph
    written = {graph.inputs.index(target) for target, _ in graph.updates}
    private = [np.array(a, copy=True) if i in written else a for i, a in enumerate(arrays)]
    results = executable.run(*private)
    n_out = len(graph.outputs)
    checked = [(f"output {k} ({graph.outputs[k].type})", results[k]) for k in range(n_checked)]
    checked += [(f"the update of %{target.name} ({target.type})", value)
                for (target, _), value in zip(graph.updates, results[n_out:])]
    bad = [(label, value) for label, value in checked if any(_counts(value))]
    if bad:
        check.rewind()
        raise _error(check, executable, arrays, bad)
    return results


def _error(check: Check, executable, arrays: list, bad: list) -> NonFiniteError:
    label, value = bad[0]
    more = f" (and {len(bad) - 1} more value(s))" if len(bad) > 1 else ""
    backend = getattr(executable, "backend", type(executable).__name__)
    lines = [f"graphc.compile({check.name}): GRAPHC_CHECK_NANS=1: {label} holds "
             f"{_describe(value)}{more} after the compiled call (backend {backend!r}); "
             "expected finite values."]
    replay = _Replay(check.traced)
    try:
        replay.run(*arrays)
    except _Found:
        pass
    undone = ("The call was not applied: no in-place update, .grad or generator state was "
              "written back, so the state is as it was before the call.")
    if replay.first is None:
        lines.append(
            f"Replaying the traced graph @{check.traced.name} on the interpreter with the same "
            "inputs gave finite values everywhere, so the backend computed differently from "
            "the reference: a graphc bug; please report it with the graph (GRAPHC_DUMP=<dir>) "
            f"and compile with backend=\"interp\" meanwhile. {undone}")
        return NonFiniteError("\n".join(lines))
    node = replay.first[1]
    lines.append(f"The first node of the traced graph @{check.traced.name} to produce a NaN or "
                 "an Inf (replayed on the interpreter with the same inputs) is "
                 + _node_report(*replay.first))
    if replay.first_nan is not None and replay.first_nan[1] is not node:
        lines.append("The first NaN appears later, at " + _node_report(*replay.first_nan))
    lines.append(f"{undone} Look at the values reaching that line (log or sqrt of a negative "
                 "number, 0/0, an overflow to inf, a learning rate too large) and clamp them or "
                 "add an epsilon; unset GRAPHC_CHECK_NANS to run without the check.")
    return NonFiniteError("\n".join(lines), node)


def _node_report(index: int, node: Node, args: list, results: list) -> str:
    """`op 'log' at model.py:12, IR line 6; its inputs ...; it made ...:` and the node's text."""
    where = f" at {node.loc}" if node.loc else " (no source line recorded)"
    inputs = [f"%{v.name} holds {_describe(a)}" for v, a in zip(node.inputs, args)
              if any(_counts(a))]
    came = "its inputs: " + ", ".join(inputs) if inputs else "its inputs were finite"
    made = ", ".join(f"{_describe(r)} in %{v.name}" for v, r in zip(node.outputs, results)
                     if any(_counts(r)))
    return f"op {node.op!r}{where}, IR line {index + 2}; {came}; it made {made}:\n" \
           f"    {format_node(node)}"
