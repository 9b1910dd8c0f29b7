"""A compiled callable's entry: one trace, its executable, and what each call of it needs.

graphc.jit.compiler keeps one `Entry` per trace of a compiled callable, newest last; the
fast path (its guard and `CallPlan`) and the full signature both pick entries from that list.
Everything an `Entry` computes in `__post_init__` is fixed for its life; its `guard` and
`shadowed` flag are replaced by the compiler as the full signature decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graphc.backends import Executable
from graphc.jit.bindings import GradBinding, TensorBinding, TraceResult
from graphc.jit.call_plan import CallPlan
from graphc.jit.compiled_autograd import GradientPlan
from graphc.jit.guards import Guard, ShapeGuard, aliasing
from graphc.jit.pytree import flatten

__all__ = ["Entry", "same_sharing"]


@dataclass
class Entry:
    """One trace of a compiled callable: its signature, graph and executable, the guards
    that pick it, and what every call of it needs (see graphc.jit.compiler)."""

    signature: dict[str, Any]
    traced: TraceResult
    executable: Executable
    aliasing: tuple  # which call tensors shared storage when it was traced (see aliasing)
    gradient: GradientPlan | None = None  # forward/backward executables when outputs need grad
    guard: Guard | None = None  # the fast path's checks (see graphc.jit.guards)
    shadowed: bool = False  # a newer entry has the same signature: only the full one decides
    # a symbolic entry: the argument dims ((path, dim)) its signature leaves out, and the
    # ShapeGuard that checks them; the argument shapes of the call that traced it
    dynamic: frozenset = frozenset()
    shapes: ShapeGuard | None = None
    arg_shapes: dict = field(default_factory=dict)
    # the traced call's (number of positional arguments, keyword names, tensor paths): the
    # CallPlan's pool layout; empty: no plan
    call: tuple = ()

    def __post_init__(self) -> None:
        """What every call of this entry needs and no call changes."""
        graph, traced = self.executable.graph, self.traced
        position = {id(v): i for i, v in enumerate(graph.inputs)}
        self.update_inputs = [position[id(target)] for target, _ in graph.updates]
        self.feeds = list(zip(traced.bindings, graph.inputs))
        self.typed = [(b, v, v.type.shape, v.type.dtype) for b, v in self.feeds
                      if isinstance(b, (TensorBinding, GradBinding))
                      and not v.type.is_symbolic]  # the ShapeGuard checks symbolic ones
        self.captured = [b.tensor for b in traced.bindings if isinstance(b, TensorBinding)]
        self.distinct = self.aliasing == tuple(range(len(self.aliasing)))
        self.fresh = getattr(self.executable, "fresh_results", False)
        n_own = len(graph.outputs) - sum(go.index is not None for go in traced.grad_outputs) \
            - len(traced.escaped)
        self.wraps = [(traced.output_aliases.get(i), traced.output_grads.get(i))
                      for i in range(n_own)]
        self.plan = CallPlan.of(traced, self.executable, self.update_inputs, self.wraps,
                                self.call, self.distinct) \
            if self.call and self.gradient is None else None


def same_sharing(entry: Entry, args: tuple, kwargs: dict) -> bool:
    """Whether the call's tensors share storage as at the trace (`aliasing`): when none did,
    it is enough that none does."""
    if not entry.distinct:
        return aliasing(entry.traced, args, kwargs) == entry.aliasing
    # `_array`, not the fetching `_data`: only identities matter here, and a fetch (cuda
    # residency) writes into the same array
    ids = [id(t._array) for _, t in flatten((args, kwargs))]
    ids += [id(t._array) for t in entry.captured]
    return len(ids) == len(entry.aliasing) == len(set(ids))
