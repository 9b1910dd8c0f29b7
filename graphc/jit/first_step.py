"""The first call of a compiled training step, traced in the state of every later call.

A training step's first call creates state that the next call reads: optimizer state made
lazily (Adam's moments and `step`, SGD's momentum buffers, RMSprop's averages) and the
`.grad`s that were None. Traced as it is, that call gives a graph the next call cannot
replay. Where the first step is exactly the steady step applied to zero-initialised state
(`Optimizer.initial_state`: Adam/AdamW with amsgrad, RMSprop centered or with momentum,
Adagrad's later parameters, SGD momentum with dampening 0), `FirstStep` makes that state
*before* the trace, so the one abstract trace already sees the steady state, and
graphc.compile compiles once and runs the first call on the compiled graph.

`.grad`s: before the trace, every captured tensor that requires grad and has no `.grad` gets
a *stand-in* `.grad` (an abstract tensor of its type), as the next call will find one there.
A graph that never reads a stand-in (the step starts with `zero_grad()`, or never touches
that `.grad`) is valid both for this call (no `.grad` yet) and for the next (a `.grad`
there); the stand-ins are removed after the trace and after every `restore()` of it. A graph
that reads one (gradients accumulated across calls, `zero_grad()` at the end of the step)
depends on the `.grad` before the call: `reads_stand_ins` says so, and graphc.compile traces
again without stand-ins and keeps its interpreter warm-up for that call. Argument tensors
get no stand-in: the next call brings its own.

State made ahead for a parameter that then gets no gradient in the step (a frozen branch,
an unused layer) is not read by the graph: `settle` removes it again, as PyTorch makes state
only for parameters with a gradient. Everything made here is also undone on failure, with
`undo` (and graphc.jit.nan_check.LazyState, taken before, drops the state).
"""

from __future__ import annotations

from graphc.jit.bindings import GradBinding, TensorBinding, TraceResult
from graphc.jit.reach import grad_holders, reachable
from graphc.tensor import Tensor


class FirstStep:
    """The state made ahead of one traced call (see the module docstring)."""

    def __init__(self, fn, args: tuple, kwargs: dict, enabled: bool = True) -> None:
        """Make the state ahead (nothing when not `enabled`)."""
        from graphc.optim.optimizer import Optimizer

        # (optimizer, parameter, key) of each state entry made here; the optimizers whose
        # first step is not exact (their state is still made by the step: the warm-up)
        self.made: list[tuple[object, Tensor, str]] = []
        self.inexact: list[str] = []
        self.stand_ins: list[tuple[Tensor, Tensor]] = []  # (holder, its stand-in .grad)
        self.stand_ins_read = False
        if not enabled:
            return
        found = reachable(fn, args, kwargs)
        for _, opt in found:
            if not isinstance(opt, Optimizer):
                continue
            made = opt.make_first_step_state()
            if made is None:
                self.inexact.append(type(opt).__name__)
            else:
                self.made += [(opt, p, key) for p, key in made]
        for _, holder, path in grad_holders(fn, args, kwargs, found):
            if path is None and holder._grad is None and holder._requires_grad:
                stand_in = Tensor._abstract(holder.type)
                holder._grad = stand_in
                self.stand_ins.append((holder, stand_in))

    def drop_stand_ins(self) -> None:
        """The graph read the stand-ins: the call is traced again without them."""
        self.remove_stand_ins()
        self.stand_ins = []
        self.stand_ins_read = True

    def remove_stand_ins(self) -> None:
        """Every holder whose `.grad` is its stand-in has None again."""
        for holder, stand_in in self.stand_ins:
            if holder._grad is stand_in:
                holder._grad = None

    def reads_stand_ins(self, traced: TraceResult) -> bool:
        """Whether the traced graph reads (or writes in place) a `.grad` that existed before
        the call where only a stand-in was: it then depends on the `.grad` before the call."""
        holders = {id(h) for h, _ in self.stand_ins}
        return any(isinstance(b, GradBinding) and b.path is None and id(b.holder) in holders
                   for b in traced.bindings)

    def settle(self, traced: TraceResult) -> None:
        """After the trace the call will run: the stand-ins go (now and after every
        `traced.restore()`), and state made for a parameter the graph does not read."""
        self.remove_stand_ins()
        restore = traced.restore

        def restore_without_stand_ins() -> None:
            restore()
            self.remove_stand_ins()

        traced.restore = restore_without_stand_ins
        read = {id(b.tensor) for b in traced.bindings if isinstance(b, TensorBinding)}
        kept = []
        for opt, p, key in self.made:
            state = opt.state.get(p)
            if state is None or key not in state:
                continue
            if id(state[key]) in read:
                kept.append((opt, p, key))
                continue
            del state[key]
            if not state:
                del opt.state[p]
        self.made = kept

    def changes_state(self, traced: TraceResult) -> bool:
        """Whether the call leaves state its trace began without: state made here and read,
        or a `.grad` assigned where only a stand-in was (the next call's signature)."""
        holders = {id(h) for h, _ in self.stand_ins}
        return bool(self.made) or any(go.index is not None and go.path is None
                                      and id(go.holder) in holders
                                      for go in traced.grad_outputs)

    def unseen_state(self, traced: TraceResult, grads_before, args: tuple, kwargs: dict
                     ) -> list[str]:
        """What the call makes that the next call will read and the trace did not see (why
        graphc.compile must warm up; empty when nothing): state created lazily (`escaped`:
        optimizer state whose first step is not exact, a tensor attribute set in the call),
        or a `.grad` that was None before the call (`grads_before`: (holder, None or its
        type)), is assigned by it and had no stand-in (an argument's, or all when the graph
        reads the `.grad`s from before the call)."""
        reasons = []
        if traced.escaped:
            inexact = f" ({', '.join(self.inexact)}: its first step is not its steady update " \
                "on zero state)" if self.inexact else ""
            reasons.append(f"it creates {len(traced.escaped)} state tensor(s){inexact}")
        stood_in = {id(h) for h, _ in self.stand_ins}
        was_none = {id(t) for t, key in grads_before if key is None} - stood_in
        assigned = sum(go.index is not None and id(go.resolve(args, kwargs)) in was_none
                       for go in traced.grad_outputs)
        if assigned:
            reasons.append(f"it assigns {assigned} .grad(s) that were None"
                           + (" and its graph reads the .grads from before the call (gradients "
                              "accumulated across calls?)" if self.stand_ins_read else ""))
        return reasons

    def undo(self) -> None:
        """The call failed: the stand-ins go (the state made goes with LazyState.drop_new)."""
        self.remove_stand_ins()
