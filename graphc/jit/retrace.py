"""What a compiled callable does for a call no entry serves: trace it, compile it, add the entry.

`SignatureTracer` is a mixin of `graphc.jit.compiler.Compiled` (its state: `fn`, `backend`,
`passes`, `dynamic`, `_entries`, `_recompile_reasons`, `_auto_dynamic`, `_static_dims`; its
`_run` and `_mark_shadowed`). A new signature traces again, abstractly (graphc.jit.tracer: no
kernel runs and no tensor changes), and that call's result then comes from running the new
executable, as torch.compile does: its side effects (parameter and optimizer-state updates,
`.grad`s, random draws) happen once, in the compiled run; optimizer state the call creates
lazily gets its values from that run too (`TraceResult.escaped`). Where an optimizer's first
step is its steady update on zero state, that state (and stand-in `.grad`s) is made before the
trace (graphc.jit.first_step), so the one trace is the steady graph; otherwise the call runs on
the interpreter, is traced again at once on the state it left, and only that steady graph is
compiled (`_warm_up`). With GRAPHC_LOG=recompiles each retrace logs which fields changed, and
after the recompile limit the call raises `RecompileLimitError` listing them.

Dynamic shapes (`_dynamic_dims`, `_trace_once`, `_keep_static`): the argument dims a trace makes
symbolic, and those that stay static because the traced code needed one size.
"""

from __future__ import annotations

import sys

from graphc import config
from graphc.errors import GraphcError
from graphc.ir.printer import format_graph
from graphc.ir.specialize import pin
from graphc.jit import nan_check
from graphc.jit.bindings import ArgBinding, TensorBinding, TraceResult
from graphc.jit.compiled_autograd import GradientPlan, outputs_needing_grad, partition
from graphc.jit.dynamic import ConstraintViolationError, marked_dims
from graphc.jit.entry import Entry
from graphc.jit.first_step import FirstStep
from graphc.jit.guards import (
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
from graphc.jit.pipeline import compiled as _compiled
from graphc.jit.pipeline import symbolic as _symbolic
from graphc.jit.pytree import at, flatten
from graphc.jit.tracer import arg_names, trace_call
from graphc.passes import default_passes
from graphc.tensor import Tensor

__all__ = ["RecompileLimitError", "SignatureTracer"]


class RecompileLimitError(GraphcError, RuntimeError):
    """A compiled callable traced more often than its limit allows."""


def _log(message: str) -> None:
    if "recompiles" in config.log_topics():
        print(f"graphc: {message}", file=sys.stderr)


class SignatureTracer:
    """The tracing half of `Compiled` (see the module docstring)."""

    def _limit(self) -> int:
        return self.recompile_limit if self.recompile_limit is not None \
            else config.recompile_limit()

    def _trace(self, sig: dict, guard: Guard, args: tuple, kwargs: dict, modules,
               stale: list[str]):
        noted = bool(self._entries)  # a recompile's reason noted, dropped if it is refused
        if noted:
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
                self._recompile_reasons.pop()  # refused: the next call's listing is the same
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
            if noted:  # nor a recompile reason: the reasons are those of the entries made
                self._recompile_reasons.pop()
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
            if noted:
                self._recompile_reasons.pop()
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
                if noted:
                    self._recompile_reasons.pop()
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
            elif self.dynamic is None:  # the dims seen to change that this call's tensor has
                dims |= {d for p, d in self._auto_dynamic if p == path and d < t.ndim}
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
            traced = trace_call(self.fn, args, kwargs, dynamic=dynamic,
                                apart=frozenset(self._apart_dims))
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
        if self._split_duck_sizes(traced, pinned, names):
            traced.restore()
            return self._trace_once(args, kwargs, dynamic)
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

    def _split_duck_sizes(self, traced: TraceResult, pinned: dict, names: list[str]) -> bool:
        """Whether the call must be traced again with dims apart: duck sizing gave dims of
        equal size one symbol (a batch of 6 over 6x6 images), and the traced code pinned it
        (a strided convolution specialises its spatial size), which would keep every one of
        them static, the batch too. Traced again with each of those dims a symbol of its own
        (`_apart_dims`, kept for later traces), only the dims the code needs at one size
        stay static."""
        dims_of: dict[str, list[tuple]] = {}
        for path, d, name in traced.symbols:
            if name in pinned:
                dims_of.setdefault(name, []).append((path, d))
        shared = {dim for dims in dims_of.values() if len(set(dims)) > 1 for dim in dims}
        if not shared - self._apart_dims:
            return False
        self._apart_dims |= shared
        labels = ", ".join(dim_label(path, d, names) for path, d in sorted(shared, key=str))
        _log(f"{self.__name__}: traced again with {labels} apart: equal at this call, they "
             "shared one symbol, which the traced code needs at one size; apart, only the "
             "dims it needs stay static")
        return True

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

