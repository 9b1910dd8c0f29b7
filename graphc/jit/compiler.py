"""`graphc.compile`: trace once per signature, then run the executable on every call.

A compiled callable keys its executables by a *signature* of the call: the arguments' types
and Python values, grad mode, and the state of the tensors, modules, optimizers and `.grad`s
the function can reach (graphc.jit.guards says exactly which fields). A call whose signature has
an executable runs it: arguments and captured tensors (parameters, buffers, closure tensors,
optimizer state, `.grad`s read: see graphc.jit.tracer) are bound by pointer, the graph runs,
in-place updates are written back, fresh `.grad`s are assigned (`GradOutput`), and an output
that is an input tensor comes back as that tensor. So a whole training step (zero_grad,
forward, backward, optimizer step) runs as one graph. A new signature traces
again, abstractly (graphc.jit.tracer: no kernel runs and no tensor changes), and that call's
result then comes from running the new executable, as torch.compile does: its side effects
(parameter and optimizer-state updates, `.grad`s, random draws) happen once, in the compiled
run; optimizer state the call creates lazily gets its values from that run too
(`TraceResult.escaped`). A call that creates state the next call reads (a training step's
first call: optimizer moments, momentum buffers, `.grad`s that were None) would make the
next call trace again. Where an optimizer's first step is its steady update on zero state,
that state (and stand-in `.grad`s) is made before the trace (graphc.jit.first_step), so the
one trace is the steady graph and the first call runs it compiled; otherwise the call runs
on the interpreter, is traced again at once on the state it left, and only that steady graph
is compiled (`_warm_up`): one compile per training step either way, and the second call
replays it. Before the passes, a traced graph is looked up in the pipeline cache
(graphc.jit.pipeline_cache): a graph an earlier process compiled skips the passes, the
lowering and LLVM. With GRAPHC_LOG=recompiles
each retrace logs which fields changed, and after the recompile limit the call raises
`RecompileLimitError` listing them. A stale executable is never replayed: captured tensors
are checked against the graph's types, and storage sharing among the call's tensors against
the trace's (`f(x, x)` traced one input), on every call.

The fast path: each entry also keeps a `graphc.jit.guards.Guard`, cheap checks tried first on
every call that imply the full signature is unchanged (see graphc.jit.guards for what they
check and why that is sound). A cpu entry then runs through its `graphc.jit.call_plan.CallPlan`
where it has one (bindings, `.grad`s and outputs laid out when the entry is made), outside
`residency.raw_reads` (the plan reads `Tensor._array`, the executable fetches what another
device holds); every other entry, and every entry under GRAPHC_CHECK_NANS, runs `_run_now`.
The first try of a call runs the newest entry's compiled guard checks and its plan in the
call's own frame (`_fast_path`: where that entry needs no other per-call check); where its
guard fails, the guards of the older entries are tried as before.
Where no guard holds, the full signature decides, and refreshes the guard of the entry it
picks. An entry whose signature equals a newer entry's (traced again because it was stale) is
`shadowed`: the fast path never takes it, so both paths pick the same entry. The stale checks
and the storage-sharing check run on every call, fast path or not; retrace decisions and the
recompile reasons are the full signature's.

Outputs that need a `grad_fn` (they require grad, are not an input returned as itself, and no
backward inside the call consumed their history) get one: the traced graph's backward is
derived on the IR (custom autograd.Functions run their own backward), partitioned into a
forward and a backward graph (graphc.jit.compiled_autograd), and both are compiled; eager
`backward()` then runs the compiled backward graph.

Called inside another trace, a compiled callable runs its function inline, so the outer
trace records its ops.

The backend: the native one unless the call names another (`default_backend`): "cuda" where a
GPU is usable, else "cpu", as torch.compile compiles for the device by default. "interp" (the
numpy interpreter, the reference every backend is tested against) stays available by name.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from typing import Callable

import numpy as np

from graphc import config
from graphc.autograd.grad_mode import is_grad_enabled
from graphc.backends import Executable, check_backend, residency
from graphc.dispatch import current_tracer, is_abstract
from graphc.dispatch import state as dispatch_state
from graphc.errors import ArgumentError, GraphcError
from graphc.ir.printer import format_graph
from graphc.ir.specialize import pin
from graphc.jit import nan_check
from graphc.jit.bindings import ArgBinding, GradBinding, RngBinding, TensorBinding, TraceResult
from graphc.jit.call_plan import MISFIT
from graphc.jit.compiled_autograd import (
    CompiledFunction,
    GradientPlan,
    outputs_needing_grad,
    partition,
)
from graphc.jit.dynamic import ConstraintViolationError, mark_dynamic, marked_dims
from graphc.jit.entry import Entry, same_sharing
from graphc.jit.first_step import FirstStep
from graphc.jit.guards import (
    CHECK_ERRORS,
    Guard,
    ShapeGuard,
    aliasing,
    diff_signatures,
    dim_label,
    mask_signature,
    reachable_state,
    signature_of,
)
from graphc.jit.pipeline import backend_compile as _backend_compile
from graphc.jit.pipeline import collector_paused as _collector_paused
from graphc.jit.pipeline import compiled as _compiled
from graphc.jit.pipeline import symbolic as _symbolic
from graphc.jit.pytree import at, flatten, unflatten
from graphc.jit.run import as_array, as_tensor, interrupts_held, run_and_write_back
from graphc.jit.tracer import arg_names, graph_name, trace_call
from graphc.passes import default_passes
from graphc.tensor import Tensor


class RecompileLimitError(GraphcError, RuntimeError):
    """A compiled callable traced more often than its limit allows."""


def _log(message: str) -> None:
    if "recompiles" in config.log_topics():
        print(f"graphc: {message}", file=sys.stderr)


_UNGUARDED = object()  # `Compiled._call`'s entry argument: the guards were not tried yet


# ---- the compiled callable -------------------------------------------------------------------
class Compiled:
    """The callable graphc.compile returns (see the module docstring)."""

    def __init__(self, fn: Callable, backend: str, recompile_limit: int | None,
                 passes=None, dynamic: bool | None = None) -> None:
        check_backend(backend)
        if not callable(fn):
            raise ArgumentError(
                f"graphc.compile: expected a function or an nn.Module to compile, got "
                f"{type(fn).__name__} {fn!r}; pass the callable itself (graphc.compile(model), "
                "not graphc.compile(model(x)))")
        self.fn = fn
        self.backend = backend
        self.recompile_limit = recompile_limit
        self.passes = passes  # None: graphc.passes.default_passes(graph, backend); [] none
        # dynamic shapes (see `compile`): None automatic, True every dim, False none
        self.dynamic = dynamic
        self._auto_dynamic: set[tuple] = set()  # (path, dim) seen to change: symbolic now
        self._static_dims: set[tuple] = set()  # ... that the traced code specialised
        self.report = None  # the PipelineReport of the latest trace
        self._entries: list[Entry] = []
        self._fast: tuple | None = None  # `_fast_path()`, None until a call makes it
        # the full-signature path (tracing, compiling) runs one thread at a time; a thread's
        # own nested call of the same callable re-enters it
        self._slow_path = threading.RLock()
        self._recompile_reasons: list[list[str]] = []
        functools.update_wrapper(self, fn, updated=())
        self.__name__ = graph_name(fn)

    def __get__(self, obj, objtype=None):
        """`@graphc.compile` on a method: bind `self` as the first argument."""
        return self if obj is None else functools.partial(self, obj)

    # ---- introspection -----------------------------------------------------------------------
    @property
    def graph(self):
        """The traced graph of the most recent trace (what the passes started from)."""
        if not self._entries:
            raise GraphcError("this compiled callable has not been called yet: no graph")
        return self._entries[-1].traced.graph

    @property
    def graphs(self) -> list:
        """The traced graph of every trace, oldest first."""
        return [e.traced.graph for e in self._entries]

    @property
    def optimized_graph(self):
        """The graph the backend runs for the most recent trace (after the passes), with its
        `meta["memory_plan"]` (an executable from the pipeline cache plans it on demand)."""
        executable = self.executable
        getattr(executable, "memory_plan", None)
        return executable.graph

    @property
    def executable(self) -> Executable:
        if not self._entries:
            raise GraphcError("this compiled callable has not been called yet")
        return self._entries[-1].executable

    @property
    def recompile_reasons(self) -> list[list[str]]:
        """For each retrace, the guard fields that changed (what GRAPHC_LOG=recompiles logs)."""
        return [list(r) for r in self._recompile_reasons]

    # ---- calling -----------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        fast = self._fast
        if fast and dispatch_state.tracer is None and not dispatch_state.abstract \
                and not config.check_nans():  # outside a trace, no NaN check
            # the newest entry's guard and plan, in this frame (see `_fast_path`)
            checks, run, entry = fast
            try:
                holds = checks(args, kwargs)
            except CHECK_ERRORS:  # as Guard.holds: the guard fails
                holds = False
            if holds:
                result = run(args, kwargs)
                if result is not MISFIT:
                    return result
                with residency.raw_reads():
                    return self._call(args, kwargs, entry)
            return self._call_unguarded(args, kwargs, tried=entry)
        return self._call_unguarded(args, kwargs)

    def _call_unguarded(self, args: tuple, kwargs: dict, tried: Entry | None = None):
        """A call the fast path did not run (`tried`: the entry whose guard it tried and saw
        fail, not tried again): inside a trace the function runs inline; else the guards
        pick the entry, and a cpu entry with a plan runs it outside raw_reads."""
        if current_tracer() is not None or is_abstract():  # inside a trace: inline it
            return self.fn(*args, **kwargs)
        if self.backend == "cpu":
            # the plan reads `Tensor._array` and the cpu executable fetches what another
            # device holds, so the fast path needs no raw_reads (the cpu executable does not
            # ask `in_raw_reads`); the guard reads `_array` too, or `_data` (a fetch) for
            # arguments it describes in full
            entry = self._guarded(args, kwargs, tried)
            if entry is not None and entry.plan is not None and not config.check_nans():
                # under the lock the entries change under (else a trace between the read
                # and the store left an older entry as the first try); busy: a later call
                if self._fast is None and self._slow_path.acquire(blocking=False):
                    try:
                        self._fast = self._fast_path()
                    finally:
                        self._slow_path.release()
                result = entry.plan.run(args, kwargs)
                if result is not MISFIT:
                    return result
        else:
            entry = _UNGUARDED
        # arrays are bound as they are; an executable fetches what another device holds
        # (graphc.backends.residency), so binding a parameter kept on the device copies nothing
        with residency.raw_reads():
            return self._call(args, kwargs, entry)

    def _fast_path(self) -> tuple:
        """(checks, run, entry) for `__call__`'s first try, or (): the newest entry's guard
        checks (`Guard.checks`) and plan run, where that entry is what `_guarded` picks
        whenever its guard holds and needs no other check: it has a plan, no ShapeGuard, and
        its guard implies its captured tensors' types (the newest is never shadowed). Three
        frames then run the guard, the plan and the executable: after a short native run each
        frame is a cache miss (docs/performance.md, "SGEMM 256"). Reset to None wherever an
        entry is added, removed or given a new guard; made by the next planned call."""
        entry = self._entries[-1] if self._entries and self.backend == "cpu" else None
        if entry is None or entry.guard is None or entry.plan is None \
                or entry.shapes is not None or not entry.guard.implies_types(entry.typed):
            return ()
        plan = entry.plan
        run = plan.stepping or plan.run if not plan.reads_only else \
            plan.reading or plan.run_reading
        return entry.guard.checks, run, entry

    def _guarded(self, args: tuple, kwargs: dict, tried=None) -> Entry | None:
        """The entry the fast path runs for this call, or None: the newest entry whose guard
        (and shape guard) holds, when it is not shadowed and its captured tensors still have
        the graph's types (the storage-sharing check is the caller's). `tried`: an entry
        whose guard was just seen to fail (`__call__`'s first try), not checked again."""
        for entry in reversed(self._entries):
            if entry is tried:
                continue
            if entry.guard is not None and entry.guard.holds(args, kwargs) and (
                    entry.shapes is None or entry.shapes.holds(args, kwargs)):
                if not entry.shadowed and (
                        entry.guard.implies_types(entry.typed)
                        or next(self._misfits(entry, args, kwargs), None) is None):
                    return entry
                return None
        return None

    def _call(self, args: tuple, kwargs: dict, entry=_UNGUARDED):
        """The call under raw_reads: the fast path's entry (`entry`, or `_guarded` again when
        it is `_UNGUARDED`), else the full signature."""
        if entry is _UNGUARDED:
            entry = self._guarded(args, kwargs)
        if entry is not None and same_sharing(entry, args, kwargs):
            return self._run(entry, args, kwargs)
        # threads making a first call at once: one traces, the rest find its entry
        with self._slow_path, _collector_paused():
            guard = Guard(self.fn, args, kwargs)  # same state as the signature
            modules, captured = reachable_state(self.fn, args, kwargs)
            sig = signature_of(self.fn, modules, args, kwargs, captured)
            stale: list[str] = []
            for entry in reversed(self._entries):
                if entry.signature == mask_signature(sig, entry.dynamic) and (
                        entry.shapes is None or entry.shapes.holds(args, kwargs)):
                    stale = self._stale(entry, args, kwargs)
                    if not stale:
                        guard.set_dynamic(entry.dynamic)
                        entry.guard = guard
                        self._fast = None  # made again from the new guard
                        return self._run(entry, args, kwargs)
            return self._trace(sig, guard, args, kwargs, modules, stale)

    def _limit(self) -> int:
        return self.recompile_limit if self.recompile_limit is not None \
            else config.recompile_limit()

    def _trace(self, sig: dict, guard: Guard, args: tuple, kwargs: dict, modules,
               stale: list[str]):
        if self._entries:
            last = self._entries[-1]
            reasons = stale or (last.shapes.failures(args, kwargs) if last.shapes is not None
                                and mask_signature(sig, last.dynamic) == last.signature
                                else []) \
                or diff_signatures(last.signature, mask_signature(sig, last.dynamic)) or [
                "an earlier signature came back but its graph no longer fits"]
            self._recompile_reasons.append(reasons)
            if "recompiles" in config.log_topics():
                print(f"graphc: recompiling {self.__name__}: " + "; ".join(reasons),
                      file=sys.stderr)
            if len(self._entries) >= self._limit():
                listing = "\n".join(f"  recompile {i + 1}: " + "; ".join(r)
                                    for i, r in enumerate(self._recompile_reasons))
                raise RecompileLimitError(
                    f"graphc.compile({self.__name__}): traced {len(self._entries) + 1} times, "
                    f"over the limit of {self._limit()} (raise it with "
                    "graphc.compile(..., recompile_limit=N) or GRAPHC_RECOMPILE_LIMIT). "
                    f"What changed between calls:\n{listing}\nKeep shapes and Python "
                    "arguments stable across calls, or compile separate functions."
                )
        lazy_state = nan_check.LazyState(self.fn, args, kwargs)  # undoes state made lazily
        dynamic = self._dynamic_dims(args, kwargs)
        first = None
        try:
            # the next call's state, made ahead; not for the interpreter, which compiles
            # nothing: it traces each call as it comes (the reference)
            first = FirstStep(self.fn, args, kwargs, enabled=self.backend != "interp")
            traced = self._trace_once(args, kwargs, dynamic)
            if first.reads_stand_ins(traced):
                # the graph reads .grads from before the call: trace what this call sees
                _log(f"{self.__name__}: traced again without stand-in .grads: the graph reads "
                     "the .grads from before the call (accumulated across calls?)")
                traced.restore()
                first.drop_stand_ins()
                traced = self._trace_once(args, kwargs, dynamic)
            first.settle(traced)
        except BaseException:
            if first is not None:
                first.undo()
            lazy_state.drop_new()  # a failed trace leaves no optimizer state behind
            raise
        try:
            with _symbolic(traced):
                needs_grad = outputs_needing_grad(self.__name__, traced, args, kwargs)
                prefix = _dump(traced.graph)
                passes = self._passes(traced.graph)
                warm_up = [] if needs_grad or self.backend == "interp" else \
                    first.unseen_state(traced, guard.grads, args, kwargs)
                if warm_up:
                    _log(f"{self.__name__}: the first call runs on the interpreter, then the "
                         f"call is traced again on the state it left: {'; '.join(warm_up)}")
                    return self._warm_up(sig, guard, traced, args, kwargs, lazy_state,
                                         dynamic)
                executable, self.report = _compiled(traced.graph, passes, self.backend,
                                                    prefix)
                gradient = self._gradient_plan(traced, args, kwargs, passes, needs_grad) \
                    if needs_grad else None
        except BaseException:
            traced.restore()  # the refused call leaves no trace of its run
            lazy_state.drop_new()
            raise
        self._entries.append(self._entry(sig, traced, executable, args, kwargs, gradient,
                                         guard))
        self._mark_shadowed()
        # The trace ran abstractly: it wrote no tensor, and the compiled run makes this call's
        # effects, once. Undo what it did set (.grads, generator draws) before that run.
        traced.restore()
        changed = first.changes_state(traced)
        try:
            result = self._run(self._entries[-1], args, kwargs, escaped=traced.escaped)
        except Exception as err:
            if isinstance(err, nan_check.NonFiniteError) or first.made:
                # refused like a failed trace: no entry, no state made for it
                self._entries.pop()
                self._mark_shadowed()
                lazy_state.drop_new()
            raise
        except BaseException:  # a Ctrl-C, held until the step was complete: it stands
            if changed:
                self._sign_steady(self._entries[-1], args, kwargs)
            raise
        if changed:
            self._sign_steady(self._entries[-1], args, kwargs)
        return result

    def _sign_steady(self, entry: Entry, args: tuple, kwargs: dict) -> None:
        """The entry's signature and guard from the state the first call left (optimizer
        state and .grads it made): the state every later call comes with."""
        guard = Guard(self.fn, args, kwargs)
        modules, captured = reachable_state(self.fn, args, kwargs)
        guard.set_dynamic(entry.dynamic)
        entry.signature = mask_signature(signature_of(self.fn, modules, args, kwargs, captured),
                                         entry.dynamic)
        entry.guard = guard
        self._mark_shadowed()

    def _warm_up(self, sig: dict, guard: Guard, traced: TraceResult, args: tuple,
                 kwargs: dict, lazy_state, dynamic: dict):
        """The first call of a step that creates state (optimizer moments, momentum buffers,
        `.grad`s that were None): the next call would see that state and trace again, so
        compiling this graph would be wasted. Run this call's graph on the interpreter (its
        results and effects, once), then trace the call again on the state it left (an
        abstract trace: no kernel, no effect) and compile only that graph, the one every
        later call replays: one compile per training step. The interpreter runs the traced
        graph as it is: the passes would cost more than they save it."""
        first = Entry(sig, traced, _backend_compile(traced.graph, "interp"),
                      aliasing(traced, args, kwargs), None, guard)
        traced.restore()
        try:
            result = self._run(first, args, kwargs, escaped=traced.escaped)
        except nan_check.NonFiniteError:
            lazy_state.drop_new()
            raise
        try:
            guard = Guard(self.fn, args, kwargs)
            modules, captured = reachable_state(self.fn, args, kwargs)
            steady = signature_of(self.fn, modules, args, kwargs, captured)
            traced = self._trace_once(args, kwargs, dynamic)
            traced.restore()
            if traced.escaped:
                # it still creates state, so it is no steady graph: the next call traces as
                # it would have
                return result
            with _symbolic(traced):
                executable, self.report = _compiled(traced.graph, self._passes(traced.graph),
                                                    self.backend, _dump(traced.graph))
            entry = self._entry(steady, traced, executable, args, kwargs, None, guard)
        except GraphcError:  # the steady graph could not be made now: the same
            return result
        # the interpreter's entry is never kept: its signature (no state yet) is not seen again
        # unless the state is dropped, and then that call traces and compiles afresh
        self._entries.append(entry)
        self._mark_shadowed()
        return result

    # ---- dynamic shapes ----------------------------------------------------------------------
    def _dynamic_dims(self, args: tuple, kwargs: dict) -> dict[tuple, set[int]]:
        """The argument dimensions the next trace makes symbolic ({path: dims}): those marked
        with `mark_dynamic`; with `dynamic=True` every one; with `dynamic=None` those seen to
        change between the calls that traced (automatic dynamic shapes, as torch.compile:
        the first trace is static, a dim that changes is symbolic from the next on)."""
        out: dict[tuple, set[int]] = {}
        names = arg_names(self.fn, args)
        for path, t in flatten((args, kwargs)):
            dims = set(marked_dims(t))
            if self.dynamic is True:
                dims |= set(range(t.ndim))
            elif self.dynamic is None:
                dims |= {d for p, d in self._auto_dynamic if p == path}
                for entry in self._entries:
                    before = entry.arg_shapes.get(path)
                    if before is None or len(before) != t.ndim:
                        continue
                    for d, (a, b) in enumerate(zip(before, t._data.shape)):
                        if a != b and (path, d) not in self._auto_dynamic \
                                and (path, d) not in self._static_dims:
                            self._auto_dynamic.add((path, d))
                            dims.add(d)
                            _log(f"{self.__name__}: {dim_label(path, d, names)} is dynamic from "
                                 f"now on: it was {a} when traced, now {b} (dynamic=None "
                                 "makes a dimension symbolic once it changes)")
            dims -= {d for p, d in self._static_dims if p == path and d not in marked_dims(t)}
            if dims:
                out[path] = dims
        return out

    def _trace_once(self, args: tuple, kwargs: dict, dynamic: dict) -> TraceResult:
        """Trace the call, with the `dynamic` argument dims symbolic; refuse a trace that
        needed a dimension the user marked dynamic to be one size (mark_dynamic)."""
        names = arg_names(self.fn, args)
        try:
            traced = trace_call(self.fn, args, kwargs, dynamic=dynamic)
        except GraphcError as err:
            if not dynamic:
                raise
            # the eager error, with this call's sizes (the trace again, static); or, where
            # only the symbolic trace failed (a rule that cannot take a symbolic size), the
            # static graph: those dims stay static
            traced = trace_call(self.fn, args, kwargs)
            for path, dims in dynamic.items():
                t = at((args, kwargs), path)
                if marked_dims(t) & dims:
                    traced.restore()
                    raise ConstraintViolationError(
                        f"graphc.compile({self.__name__}): graphc.mark_dynamic marked "
                        f"{dim_label(path, min(marked_dims(t) & dims), names)} dynamic, but "
                        f"the code cannot be traced with a symbolic size there: {err}") from err
                for d in dims:
                    self._static_dims.add((path, d))
            _log(f"{self.__name__}: traced with static sizes: the symbolic trace failed "
                 f"({type(err).__name__}: {err})")
            return traced
        if traced.shape_env is None:
            return traced
        pinned = traced.shape_env.specialised()
        self._keep_static(traced, pinned, args, kwargs, names)
        pin(traced.graph, pinned)  # a specialised symbol is its size in the graph
        for path, t in flatten((args, kwargs)):
            for d in marked_dims(t):
                if d < t.ndim and t._data.shape[d] < 2:
                    raise ConstraintViolationError(
                        f"graphc.compile({self.__name__}): graphc.mark_dynamic marked "
                        f"{dim_label(path, d, names)} dynamic, but it is "
                        f"{t._data.shape[d]}: sizes 0 and 1 are always specialised, as in "
                        "PyTorch; mark a dimension whose size is at least 2")
        return traced

    def _keep_static(self, traced: TraceResult, pinned: dict, args: tuple, kwargs: dict,
                     names: list[str]) -> None:
        """The argument dims whose symbol a guard pinned to one size (the traced code, or a
        pass, needed that size) stay static from now on; a dim marked dynamic is refused."""
        for path, d, name in traced.symbols:
            if name not in pinned:
                continue
            t = at((args, kwargs), path)
            label = dim_label(path, d, names)
            if d in marked_dims(t):
                traced.restore()
                where = traced.shape_env.guard_location(name)
                raise ConstraintViolationError(
                    f"graphc.compile({self.__name__}): graphc.mark_dynamic marked {label} "
                    f"dynamic, but the traced code needs it to be {pinned[name]}"
                    f"{' (at ' + where + ')' if where else ''}: it specialised the symbol "
                    f"{name}. Remove the mark, or make the code work for any size there "
                    "(no int() of a size, no Python branch on it).")
            if (path, d) not in self._static_dims:
                self._static_dims.add((path, d))
                _log(f"{self.__name__}: {label} stays static: the traced code needs it to be "
                     f"{pinned[name]} (it specialised the symbol {name})")

    def _entry(self, sig: dict, traced: TraceResult, executable, args: tuple, kwargs: dict,
               gradient, guard: Guard) -> Entry:
        """An entry for a trace; a symbolic one leaves its dims out of its signature and
        checks them with a ShapeGuard."""
        shapes, dynamic = None, frozenset()
        if traced.symbols:
            names = arg_names(self.fn, args)
            pinned = traced.shape_env.specialised()
            self._keep_static(traced, pinned, args, kwargs, names)  # pinned by a pass too
            dynamic = frozenset((path, d) for path, d, name in traced.symbols
                                if name not in pinned)
            labels: dict[str, str] = {}
            for path, d, name in traced.symbols:
                labels.setdefault(name, dim_label(path, d, names))
            shapes = ShapeGuard(traced.symbols, traced.shape_env.relations, labels)
            shapes.dim_labels = {(path, d): dim_label(path, d, names)
                                 for path, d, _ in traced.symbols}
            guard.set_dynamic(dynamic)
        arg_shapes = {path: t._data.shape for path, t in flatten((args, kwargs))}
        return Entry(mask_signature(sig, dynamic), traced, executable,
                     aliasing(traced, args, kwargs), gradient, guard, dynamic=dynamic,
                     shapes=shapes, arg_shapes=arg_shapes,
                     call=(len(args), tuple(kwargs), list(arg_shapes)))

    def _passes(self, graph=None) -> list:
        return default_passes(graph, self.backend) if self.passes is None \
            else list(self.passes)

    def _mark_shadowed(self) -> None:
        """An entry whose signature a newer entry also has is left to the full signature.
        (Called wherever the entries or a guard change: the fast path is made anew.)"""
        self._fast = None
        for i, entry in enumerate(self._entries):
            entry.shadowed = any(e.signature == entry.signature for e in self._entries[i + 1:])

    def _gradient_plan(self, traced: TraceResult, args: tuple, kwargs: dict, passes,
                       needs_grad: list[str]) -> GradientPlan:
        """Derive, partition and compile the backward of a graph whose outputs need grad.
        Custom autograd.Functions keep their own backward: derive_backward calls it on the
        traced graph (and refuses, with the reason, one whose backward reads tensor values)."""
        from graphc.passes.autodiff import derive_backward

        wrt = [i for i, b in enumerate(traced.bindings)
               if isinstance(b, (ArgBinding, TensorBinding))
               and _bound_tensor(b, args, kwargs).requires_grad]
        try:
            joint = derive_backward(traced.graph, wrt=wrt)
        except GraphcError as err:
            raise GraphcError(
                f"graphc.compile({self.__name__}): {needs_grad[0]} requires grad, and the "
                f"backward of the traced graph could not be derived: {err}"
            ) from err
        part = partition(joint)
        return GradientPlan(part, _compiled(part.forward, passes, self.backend)[0],
                            _compiled(part.backward, passes, self.backend)[0], wrt)

    @staticmethod
    def _misfits(entry: Entry, args: tuple, kwargs: dict):
        """(binding, graph value, tensor or None) for each captured tensor or `.grad` that no
        longer has the type the entry's graph was traced with."""
        for b, v, shape, dtype in entry.typed:
            t = b.tensor if isinstance(b, TensorBinding) else b.resolve(args, kwargs)._grad
            if t is None or t._data.shape != shape or t._dtype is not dtype:
                yield b, v, t

    def _stale(self, entry: Entry, args: tuple, kwargs: dict) -> list[str]:
        """Why the entry's graph no longer fits this call (empty when it does): a captured
        tensor changed its type, or tensors that shared storage at the trace no longer do."""
        reasons = [f"{'captured ' if isinstance(b, TensorBinding) else ''}%{v.name} {v.type} -> "
                   f"{'None' if t is None else t.type}"
                   for b, v, t in self._misfits(entry, args, kwargs)]
        if not same_sharing(entry, args, kwargs):
            reasons.append("which argument tensors share storage (e.g. f(x, x) -> f(x, y))")
        return reasons

    def _run(self, entry: Entry, args: tuple, kwargs: dict, escaped: list = ()):
        """Run the entry's executable for this call. `escaped`: (output index, tensor) pairs
        of the traced call (`TraceResult.escaped`), given values by this, its first, run.
        A Ctrl-C during the run is held until the step is complete (updates, `.grad`s,
        state all written), then raised: never a half-applied step (`interrupts_held`)."""
        with interrupts_held():
            return self._run_now(entry, args, kwargs, escaped)

    def _run_now(self, entry: Entry, args: tuple, kwargs: dict, escaped: list):
        traced = entry.traced
        check = nan_check.Check(self.__name__, traced.graph, [
            b.generator for b in traced.bindings if isinstance(b, RngBinding)
            and not b.transient]) if config.check_nans() else None
        arrays, tensors = [], []  # per graph input: its array, its tensor (None: rng/constant)
        for b, _ in entry.feeds:
            if isinstance(b, TensorBinding):
                t = b.tensor
            elif isinstance(b, ArgBinding):
                t = at((args, kwargs), b.path)
            elif isinstance(b, GradBinding):  # the holder's .grad as it is now
                t = b.resolve(args, kwargs)._grad
            elif isinstance(b, RngBinding):
                seed, offset = b.traced_state if b.transient else b.generator._take(b.counters)
                arrays.append(np.array([seed, offset], np.uint64).view(np.int64))
                tensors.append(None)
                continue
            else:  # a ConstantBinding: a copy, an output may be a view of it
                arrays.append(b.array.copy())
                tensors.append(None)
                continue
            tensors.append(t)
            arrays.append(t._data)
        if entry.gradient is not None and is_grad_enabled():
            outputs = self._run_with_gradient(entry, arrays, tensors, check)
            fresh = False
        else:
            outputs = run_and_write_back(entry.executable, arrays,
                                          [tensors[i] for i in entry.update_inputs], check)
            fresh = entry.fresh
        grads = self._assign_grads(traced, outputs, arrays, args, kwargs, fresh)
        for index, t in escaped:  # a copy: a tensor of state owns its memory
            t._data = np.array(as_array(outputs[index]), copy=True)
        wrapped = [tensors[j] if j is not None else grads[k] if k is not None
                   else as_tensor(o) for (j, k), o in zip(entry.wraps, outputs)]
        return unflatten(traced.out_spec, wrapped)

    @staticmethod
    def _run_with_gradient(entry: Entry, arrays: list, by_index: list,
                           check: nan_check.Check | None = None) -> list:
        """Run the forward part under a CompiledFunction node: outputs carry a grad_fn.
        `by_index[i]` is the tensor bound to graph input i (None for rng/constant inputs)."""
        plan = entry.gradient
        inputs = plan.forward.graph.inputs
        bound = {id(v): t for v, t in zip(inputs, by_index) if t is not None}
        updated = {inputs.index(target) for target, _ in plan.forward.graph.updates}

        targets = [bound[id(target)] for target, _ in plan.forward.graph.updates]

        def run_forward(forward_arrays):
            return run_and_write_back(plan.forward, forward_arrays, targets, check,
                                       plan.partition.n_outputs)

        wrt = [by_index[i] for i in plan.wrt]
        return list(CompiledFunction.apply(plan, run_forward, arrays, by_index, updated, *wrt))

    @staticmethod
    def _assign_grads(traced: TraceResult, outputs: list, inputs: list, args: tuple,
                      kwargs: dict, fresh: bool = False) -> list:
        """Assign each GradOutput's value (a fresh tensor, or None) to its holder's `.grad`,
        after the updates (a `.grad` accumulated in place and then set to None gets both);
        returns the assigned tensors in grad_outputs order (None where it set None).
        `fresh`: every output is an array of its own (`fresh_results`), so only an output
        assigned twice needs a copy."""
        assigned, taken, used = [], list(inputs), set()
        for go in traced.grad_outputs:
            holder = go.resolve(args, kwargs)
            if go.index is None:
                holder._grad = None
                assigned.append(None)
                continue
            array = np.asarray(outputs[go.index])
            shared = (go.index in used) if fresh else \
                any(np.may_share_memory(array, other) for other in taken)
            if shared:
                array = array.copy()  # a .grad never shares memory with another tensor
            used.add(go.index)
            taken.append(array)
            holder._grad = Tensor._wrap(array)
            assigned.append(holder._grad)
        return assigned


def _bound_tensor(binding, args: tuple, kwargs: dict) -> Tensor:
    return binding.tensor if isinstance(binding, TensorBinding) else at((args, kwargs),
                                                                         binding.path)


_dump_counts: dict[str, int] = {}


def _dump(graph) -> str | None:
    """With GRAPHC_DUMP=<dir>: write the traced graph to <dir>/<name>.<n>.0.traced.gir, where
    n counts the graphs of that name traced in this process (so none overwrites another);
    the passes then write <name>.<n>.<stage>.<pass>.gir. Returns the `<name>.<n>` prefix."""
    directory = config.dump_dir()
    if not directory or not config.dumps("ir"):
        return None
    index = _dump_counts[graph.name] = _dump_counts.get(graph.name, 0) + 1
    prefix = f"{graph.name}.{index}"
    config.write_dump_file(directory, f"{prefix}.0.traced.gir", format_graph(graph) + "\n")
    return prefix


@functools.cache
def default_backend() -> str:
    """The backend `graphc.compile` uses when none is named: "cuda" where a GPU is usable (a
    CUDA driver, at least one device, and the runtime library already built, as by
    `graphc build-runtime`: compiling never builds it), else "cpu". GRAPHC_CUDA=emu selects
    an emulation, not a GPU: "cpu". Decided once per process, at the first compile that
    needs it, never when graphc is imported."""
    if config.cuda_kind() != "cuda":
        return "cpu"
    from graphc.backends.cuda import rt  # ctypes and the library only here (import-linter)

    if not os.path.exists(rt.library_path("cuda")):
        return "cpu"
    try:
        rt.runtime_library("cuda")
    except (GraphcError, OSError):  # no driver, no device, a library that does not load
        return "cpu"
    return "cuda"


def compile(fn: Callable | None = None, *, backend: str | None = None,  # noqa: A001
            recompile_limit: int | None = None, passes=None, fullgraph: bool = False,
            dynamic: bool | None = None, mode: str | None = None,
            options: dict | None = None, disable: bool = False):
    """Compile a function or Module: trace on the first call, then run the executable.

    Usable directly (`graphc.compile(model)`) or as a decorator (`@graphc.compile` or
    `@graphc.compile(backend="interp")`). `backend`: "cpu", "cuda" or "interp"; by default
    the native one (`default_backend()`: "cuda" where a GPU is usable, else "cpu").

    torch.compile's keywords are accepted so its programs run unchanged: `fullgraph` (graphc
    always captures the whole call: a graph break is a TraceError), `mode` (one of
    torch.compile's modes; graphc has one way of compiling), `disable=True` (returns `fn`
    itself). `options` must be empty.

    `dynamic` (torch.compile's): None (the default) compiles the first call for its shapes,
    and a later call that changes a dimension of an argument recompiles once with that
    dimension symbolic (`f32[s0,784]`), which then serves every size; True makes every
    argument dimension symbolic from the first call; False specialises every shape (each new
    shape traces again). `graphc.mark_dynamic(x, 0)` makes one dimension symbolic from the
    first trace on. Sizes 0 and 1 are always specialised, as in PyTorch. The relations the
    graph assumed about its symbols are guarded at every call (docs/tracing.md);
    GRAPHC_LOG=recompiles says which dimension became dynamic and why.

    >>> import graphc
    >>> @graphc.compile
    ... def f(x):
    ...     return (x * 2).relu()
    >>> f(graphc.tensor([-1.0, 3.0]))
    tensor([0., 6.])
    >>> f(graphc.tensor([2.0, -5.0]))
    tensor([4., 0.])
    """
    if dynamic not in (None, True, False):
        raise ArgumentError(f"graphc.compile: dynamic={dynamic!r}; expected None (automatic: "
                            "a dimension that changes becomes symbolic), True or False")
    if mode not in (None, "default", "reduce-overhead", "max-autotune",
                    "max-autotune-no-cudagraphs"):
        raise ArgumentError(f"graphc.compile: unknown mode {mode!r}; torch.compile's modes "
                            "are accepted (graphc compiles one way for all of them)")
    if options:
        raise ArgumentError(f"graphc.compile: options={options!r} are torch.compile backend "
                            "options graphc does not have; leave them out")
    if fn is not None and disable:
        return fn
    if backend is None:
        backend = default_backend()
    if fn is None:
        return functools.partial(compile, backend=backend, recompile_limit=recompile_limit,
                                 passes=passes, fullgraph=fullgraph, dynamic=dynamic,
                                 mode=mode, options=options, disable=disable)
    return Compiled(fn, backend, recompile_limit, passes, dynamic)


__all__ = ["Compiled", "ConstraintViolationError", "RecompileLimitError", "compile",
           "default_backend", "mark_dynamic", "marked_dims", "reachable_state", "signature_of"]
