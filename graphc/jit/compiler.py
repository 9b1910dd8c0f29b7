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
device holds); a cuda entry's first try runs its guard and plan under `raw_reads` (its
executable keeps values on the device only there); every other entry, and every entry under
GRAPHC_CHECK_NANS, runs the general path (graphc.jit.general_path.run_entry).
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

This module holds the call (the guards, the first try, the full signature's pick); a new
signature's trace, compile and recompile limit, and the dynamic dims, are graphc.jit.retrace's
(`SignatureTracer`, a mixin of `Compiled`); the general path's binding and wrapping is
graphc.jit.general_path's.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Callable

from graphc import config
from graphc.backends import Executable, check_backend, residency
from graphc.dispatch import current_tracer, is_abstract
from graphc.dispatch import state as dispatch_state
from graphc.errors import ArgumentError, GraphcError
from graphc.jit.bindings import TensorBinding
from graphc.jit.call_plan import MISFIT
from graphc.jit.dynamic import ConstraintViolationError, mark_dynamic, marked_dims
from graphc.jit.entry import Entry, same_sharing
from graphc.jit.general_path import run_entry
from graphc.jit.guards import (
    CHECK_ERRORS,
    Guard,
    mask_signature,
    reachable_state,
    signature_of,
)
from graphc.jit.pipeline import collector_paused as _collector_paused
from graphc.jit.retrace import RecompileLimitError, SignatureTracer
from graphc.jit.run import interrupts_held
from graphc.jit.shape_checks import fast_checks
from graphc.jit.tracer import graph_name

_UNGUARDED = object()  # `Compiled._call`'s entry argument: the guards were not tried yet


# ---- the compiled callable -------------------------------------------------------------------
class Compiled(SignatureTracer):
    """The callable graphc.compile returns (see the module docstring); what it does for a new
    signature (trace, compile, add the entry) is `SignatureTracer`'s (graphc.jit.retrace)."""

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
        self._apart_dims: set[tuple] = set()  # (path, dim) kept out of duck sizing
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
            # the first try, made as the cpu branch makes it (its checks and plan run under
            # raw_reads: `_fast_path`); busy or no entry yet: a later call
            if self._fast is None and self._entries and self._slow_path.acquire(blocking=False):
                try:
                    self._fast = self._fast_path()
                finally:
                    self._slow_path.release()
        # arrays are bound as they are; an executable fetches what another device holds
        # (graphc.backends.residency), so binding a parameter kept on the device copies nothing
        with residency.raw_reads():
            return self._call(args, kwargs, entry)

    def _fast_path(self) -> tuple:
        """(checks, run, entry) for `__call__`'s first try, or (): the newest entry's guard
        checks (`Guard.checks`) and plan run, where that entry is what `_guarded` picks
        whenever its guard holds (and its ShapeGuard, for a symbolic entry: graphc.jit.shape_checks)
        and needs no other check: it has a plan, and its guard implies its captured tensors'
        types (the newest is never shadowed). Three
        frames then run the guard, the plan and the executable: after a short native run each
        frame is a cache miss (docs/performance.md, "SGEMM 256"). Reset to None wherever an
        entry is added, removed or given a new guard; made by the next planned call."""
        entry = self._entries[-1] if self._entries else None
        if entry is None or entry.guard is None or entry.plan is None \
                or not entry.guard.implies_types(entry.typed):
            return ()
        plan = entry.plan
        run = plan.stepping or plan.run if not plan.reads_only else \
            plan.reading or plan.run_reading
        checks = entry.guard.checks
        if entry.shapes is not None:  # a symbolic entry: its ShapeGuard after the guard
            checks = fast_checks(checks, entry.shapes)
        if self.backend == "cpu":
            return checks, run, entry
        # another backend (cuda) keeps values on its device only for a call under raw_reads
        # and binds arrays as they are (its executable fetches what another device holds),
        # as `_call` does
        return _under_raw_reads(checks), _under_raw_reads(run), entry

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

    def _mark_shadowed(self) -> None:
        """An entry whose signature a newer entry also has is left to the full signature.
        (Called wherever the entries or a guard change: the fast path is made anew.)"""
        self._fast = None
        for i, entry in enumerate(self._entries):
            entry.shadowed = any(e.signature == entry.signature for e in self._entries[i + 1:])

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
            return run_entry(self.__name__, entry, args, kwargs, escaped)



def _under_raw_reads(fn: Callable) -> Callable:
    """`fn` called under `residency.raw_reads()` (the first try of a non-cpu entry)."""
    def under_raw_reads(*args):
        with residency.raw_reads():
            return fn(*args)
    return under_raw_reads


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
