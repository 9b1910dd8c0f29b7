"""A compiled entry's call, laid out once: what its fast path does with no walk and no search.

`graphc.jit.compiler` runs an entry whose guard held (graphc.jit.guards) either through its
general path (`graphc.jit.general_path.run_entry`: per binding, a type test and a lookup) or,
where the entry allows, through a `CallPlan` made when the entry is: every graph input's
tensor comes from one *pool* tuple, `(*args, *kwargs.values(), *captured tensors, *captured
holders' .grads, a stand-in)`, picked in graph-input order by one itemgetter; arrays are read
with one attrgetter map; the storage-sharing check is one set over those arrays; update
targets, `.grad` holders and output wrappers are precomputed index lists. The run itself is
the general path's: `run_and_write_back`, Ctrl-C held (`HeldInterrupts`) from the first binding (a
random generator advanced) to the last `.grad` assigned; a call that only reads (no update,
no random state, no `.grad`: `reads_only`) has nothing to leave half done, and runs the
executable with nothing held (`run_reading`; written out for the plan as one function,
`reading`, where its inputs are positional arguments and captured tensors). A call that
writes (a training step) is written out the same way (`stepping`: the same steps as `run`,
Ctrl-C held, each update found in place bumped, or copied from the fresh array the executable
says it made (`updates_in_place`), or handed to `write_back`; each `.grad` assigned by name).

A plan is made only where its shortcuts are exact (`CallPlan.of` returns None otherwise,
and the general path runs): the executable returns `fresh_results` (every output an array
of its own, so `.grad`s need no overlap checks beyond one output assigned twice); the entry
has no gradient plan (outputs needing a grad_fn run under a CompiledFunction); every
argument binding, `.grad` holder and argument tensor of the traced call is top-level
(`args[i]` or `kwargs[name]`: the guard checked the call's structure, its number of
arguments and keyword names included, so those positions hold the same kinds of values);
and the NaN check is off (the caller checks `config.check_nans()`). It reads arrays through
`Tensor._array`, never the fetching `_data`: `run_and_write_back` fetches every array
another device holds before the run (graphc.backends.residency).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from graphc.backends import residency
from graphc.jit.bindings import (
    ArgBinding,
    ConstantBinding,
    GradBinding,
    RngBinding,
    TensorBinding,
    TraceResult,
)
from graphc.jit.pytree import unflatten
from graphc.jit.run import HeldInterrupts, run_and_write_back, write_back
from graphc.tensor import Tensor

__all__ = ["MISFIT", "CallPlan"]

MISFIT = object()  # `CallPlan.run`'s answer when the call's tensors share storage otherwise

_ARRAY = operator.attrgetter("_array")
_GRAD = operator.attrgetter("_grad")


class _NoTensor:
    """The pool's stand-in at inputs no tensor feeds (random state, constants)."""

    _array = None


_NO_TENSOR = _NoTensor()


class CallPlan:
    """How one entry's call binds, runs and wraps (see the module docstring)."""

    __slots__ = ("executable", "out_spec", "captured", "holders", "inputs", "specials",
                 "targets", "shared", "n_shared", "grads", "plain_grads", "returns_grads",
                 "wraps", "direct", "reads_only", "reading", "stepping")

    @classmethod
    def of(cls, traced: TraceResult, executable, update_inputs: list[int], wraps: list,
           call: tuple, distinct: bool) -> CallPlan | None:
        """The plan of an entry (`graphc.jit.entry.Entry`'s fields), or None where it
        would not be exact. `call`: (number of positional arguments, keyword names in
        order, paths of the tensors in `flatten` order) of the traced call."""
        if not getattr(executable, "fresh_results", False) or not distinct:
            return None
        try:
            return cls(traced, executable, update_inputs, wraps, call)
        except _NotPlanned:
            return None

    def __init__(self, traced: TraceResult, executable, update_inputs: list[int],
                 wraps: list, call: tuple) -> None:
        n_args, kwarg_names, arg_paths = call
        self.executable = executable
        self.out_spec = traced.out_spec
        self.captured = tuple(b.tensor for b in traced.bindings
                              if isinstance(b, TensorBinding))
        self.holders = tuple(b.holder for b in traced.bindings
                             if isinstance(b, GradBinding) and b.path is None)
        # the pool: args, kwargs' values, captured tensors, holders' .grads, the stand-in
        first_captured = n_args + len(kwarg_names)
        first_grad = first_captured + len(self.captured)
        stand_in = first_grad + len(self.holders)

        def argument(path: tuple) -> int:
            if len(path) != 2:
                raise _NotPlanned
            if path[0] == 0:
                return path[1]
            if path[1] not in kwarg_names:
                raise _NotPlanned
            return n_args + kwarg_names.index(path[1])

        inputs: list[int] = []
        self.specials: list[tuple[int, Any]] = []
        k_captured = k_holder = 0
        for i, b in enumerate(traced.bindings):
            if isinstance(b, ArgBinding):
                inputs.append(argument(b.path))
            elif isinstance(b, TensorBinding):
                inputs.append(first_captured + k_captured)
                k_captured += 1
            elif isinstance(b, GradBinding) and b.path is None:
                inputs.append(first_grad + k_holder)
                k_holder += 1
            elif isinstance(b, (RngBinding, ConstantBinding)):
                inputs.append(stand_in)
                self.specials.append((i, b))
            else:  # the .grad of an argument: the general path
                raise _NotPlanned
        self.inputs = _indices_getter(inputs)
        self.targets = _indices_getter(update_inputs)
        # the storage-sharing check: every argument tensor and captured tensor distinct
        shared = [argument(path) for path in arg_paths] + list(
            range(first_captured, first_grad))
        self.n_shared = len(shared)
        if sorted(shared) == sorted(p for p in inputs if p != stand_in):
            # they are the inputs' own tensors: the check counts the inputs' arrays (the
            # stand-ins' None counted once)
            self.shared = None
            self.n_shared += bool(self.specials)
        else:
            self.shared = _indices_getter(shared)
        graph = executable.graph
        # .grad outputs: (holder, or its argument's pool position; output index or None;
        # the output's dtype; whether an earlier .grad took that output: then a copy)
        self.grads: list[tuple[Any, int | None, Any, bool]] = []
        used: set[int] = set()
        for go in traced.grad_outputs:
            holder = go.holder if go.path is None else argument(go.path)
            dtype = None if go.index is None else graph.outputs[go.index].type.dtype
            self.grads.append((holder, go.index, dtype, go.index in used))
            used.add(go.index)
        # the common case on its own: each .grad a captured holder's, of an output of its own
        self.plain_grads = [(holder, index, dtype) for holder, index, dtype, copy in self.grads
                            if type(holder) is not int and index is not None and not copy]
        if len(self.plain_grads) == len(self.grads):
            self.grads = None
        self.returns_grads = any(grad is not None for _, grad in wraps)
        # the function's own outputs: an input tensor itself, an assigned .grad, or new
        self.wraps = [("input", alias, None) if alias is not None
                      else ("grad", grad, None) if grad is not None
                      else ("new", k, graph.outputs[k].type.dtype)
                      for k, (alias, grad) in enumerate(wraps)]
        spec = self.out_spec
        self.direct = spec[1] if type(spec) is tuple and len(spec) == 2 and \
            spec[0] == "out" else None
        # a call that writes nothing back, advances no generator and assigns no .grad: an
        # interrupt anywhere leaves nothing half done, so `run` holds none and skips the
        # write-back (two sigactions and ~10 us of cold-cache Python after a GEMM of 0.2 ms:
        # docs/performance.md, "SGEMM 256")
        self.reads_only = not update_inputs and not self.specials and not self.holders \
            and not traced.grad_outputs
        self.reading = _reading_function(self, inputs, n_args, len(kwarg_names)) \
            if self.reads_only else None
        # a step (updates, random state, .grads) written out too, or None
        self.stepping = None if self.reads_only else _stepping_function(
            self, inputs, update_inputs, n_args, len(kwarg_names))

    def run(self, args: tuple, kwargs: dict):
        """The call's result, or MISFIT when its tensors share storage other than at the
        trace (the general path then decides)."""
        if self.reads_only:
            return self.run_reading(args, kwargs)
        pool = (*args, *kwargs.values(), *self.captured, *map(_GRAD, self.holders),
                _NO_TENSOR) if self.holders else (*args, *kwargs.values(), *self.captured,
                                                  _NO_TENSOR)
        with HeldInterrupts():
            tensors = self.inputs(pool)
            arrays = list(map(_ARRAY, tensors))
            if self.n_shared > 1 and len(set(map(id, arrays if self.shared is None else map(
                    _ARRAY, self.shared(pool))))) != self.n_shared:
                return MISFIT
            for i, b in self.specials:
                arrays[i] = special_array(b)
            outputs = run_and_write_back(self.executable, arrays, self.targets(tensors))
            if self.grads is None:
                for holder, index, dtype in self.plain_grads:
                    holder._grad = Tensor._result(outputs[index], dtype)
                grads = [holder._grad for holder, _, _ in self.plain_grads] \
                    if self.returns_grads else ()
            else:
                grads = self._assign_grads(pool, outputs)
            wrapped = [tensors[index] if kind == "input" else grads[index] if kind == "grad"
                       else Tensor._result(outputs[index], dtype)
                       for kind, index, dtype in self.wraps]
        if self.direct is not None:
            return wrapped[self.direct]
        return unflatten(self.out_spec, wrapped)

    def run_reading(self, args: tuple, kwargs: dict):
        """`run` for a plan that only reads (`reads_only`): bind, run, wrap. (The compiled
        callable's fast path calls it directly: one frame less after a short native run.)"""
        pool = (*args, *kwargs.values(), *self.captured)  # no holders, no stand-in
        tensors = self.inputs(pool)
        arrays = list(map(_ARRAY, tensors))
        if self.n_shared > 1 and len(set(map(id, arrays if self.shared is None else map(
                _ARRAY, self.shared(pool))))) != self.n_shared:
            return MISFIT
        if residency.stale:  # as run_and_write_back: what another device holds, fetched
            residency.fresh_all(arrays, keep=self.executable)
        outputs = self.executable.run(*arrays)
        if self.direct is not None:  # one output returned: only it is wrapped
            kind, index, dtype = self.wraps[self.direct]
            return tensors[index] if kind == "input" else Tensor._result(outputs[index], dtype)
        return unflatten(self.out_spec, [
            tensors[index] if kind == "input" else Tensor._result(outputs[index], dtype)
            for kind, index, dtype in self.wraps])

    def _assign_grads(self, pool: tuple, outputs: list) -> list:
        """Assign every `.grad` output (`self.grads`); returns them in grad_outputs order."""
        grads = []
        for holder, index, dtype, copy in self.grads:
            if type(holder) is int:
                holder = pool[holder]
            if index is None:
                holder._grad = None
                grads.append(None)
                continue
            array = outputs[index]
            if copy:
                array = array.copy()  # a .grad never shares memory with another tensor
            holder._grad = grad = Tensor._result(array, dtype)
            grads.append(grad)
        return grads


def _reading_function(plan: CallPlan, inputs: list[int], n_args: int, n_kwargs: int):
    """`run_reading` written out for one plan, as `graphc.jit.guards.compile_checks` writes a
    guard: each input's tensor read by name (`args[i]`, or a captured tensor as a constant of
    the function), its array by one attribute, the sharing check one comparison, the
    executable run with the arrays as arguments, the outputs wrapped by name. The same steps
    in the same order, with no pool, itemgetter or map between them: after a short native run
    each is a cache miss (docs/performance.md, "SGEMM 256, eighth session"). None where an
    input is a keyword argument or the sharing check reads other tensors than the inputs
    (`run_reading` then). Its text is its `__doc__`; it holds the plan's executable and
    captured tensors, not the plan. `inputs`: each graph input's position in the pool (see
    `CallPlan.run`) of a call with `n_args` positional and `n_kwargs` keyword arguments."""
    first_captured = n_args + n_kwargs
    if plan.shared is not None or any(
            n_args <= p < first_captured or p >= first_captured + len(plan.captured)
            for p in inputs):
        return None
    names: dict[str, Any] = {"MISFIT": MISFIT, "residency": residency, "Tensor": Tensor,
                             "unflatten": unflatten, "EX": plan.executable,
                             "SPEC": plan.out_spec}
    lines = []
    for i, p in enumerate(inputs):
        if p < n_args:
            lines.append(f"t{i} = args[{p}]")
        else:
            k = p - first_captured
            names[f"CAPTURED{k}"] = plan.captured[k]
            lines.append(f"t{i} = CAPTURED{k}")
    arrays = [f"t{i}._array" for i in range(len(inputs))]
    lines += [f"a{i} = {a}" for i, a in enumerate(arrays)]
    listed = ", ".join(f"a{i}" for i in range(len(inputs)))
    if plan.n_shared == 2:
        lines.append("if a0 is a1:")
        lines.append("    return MISFIT")
    elif plan.n_shared > 2:
        lines.append(f"if len({{{', '.join(f'id(a{i})' for i in range(len(inputs)))}}}) "
                     f"!= {plan.n_shared}:")
        lines.append("    return MISFIT")
    lines += ["if residency.stale:  # what another device holds, fetched",
              f"    residency.fresh_all(({listed}{',' if len(inputs) == 1 else ''}), keep=EX)",
              f"outputs = EX.run({listed})"]
    wrapped = _wrapped_results(plan, names, "outputs")
    if plan.direct is not None:
        lines.append(f"return {wrapped[plan.direct]}")
    else:
        lines.append(f"return unflatten(SPEC, [{', '.join(wrapped)}])")
    source = "def reading(args, kwargs):\n" + "".join(f"    {line}\n" for line in lines)
    exec(compile(source, "<graphc call plan>", "exec"), names)  # noqa: S102 (our own text)
    reading = names["reading"]
    reading.__doc__ = source
    return reading


def _stepping_function(plan: CallPlan, inputs: list[int], update_inputs: list[int],
                       n_args: int, n_kwargs: int):
    """`run` written out for one plan that writes (a training step), as `_reading_function`
    writes `run_reading`: the same steps in the same order (Ctrl-C held, each input's tensor
    and array read by name, the sharing check one comparison, the random states and
    constants, the executable run, the updates found computed in place (a version bump each)
    or written back by `write_back`, the `.grad`s assigned, the outputs wrapped), with no
    pool, itemgetter or map between them (docs/performance.md, "Training steps take the
    steady call"). None where `run_reading`'s function is (a keyword input, a sharing check
    over other tensors than the inputs: so also a step that reads a holder's `.grad`, as one
    accumulating gradients does, whose check leaves that `.grad` out), or a `.grad` is not a
    captured holder's own output (`plan.grads`). Its text is its `__doc__`."""
    first_captured = n_args + n_kwargs
    first_grad = first_captured + len(plan.captured)
    specials = dict(plan.specials)
    # a holder's .grad read as an input (a step accumulating gradients) is left to `run`:
    # its sharing check leaves that .grad out (`plan.shared` is then a list of its own)
    if plan.shared is not None or plan.holders or plan.grads is not None or any(
            n_args <= p < first_captured for p in inputs) or any(
            i in specials for i in update_inputs):
        return None
    executable = plan.executable
    names: dict[str, Any] = {"MISFIT": MISFIT, "residency": residency, "Tensor": Tensor,
                             "unflatten": unflatten, "EX": executable, "SPEC": plan.out_spec,
                             "HeldInterrupts": HeldInterrupts, "write_back": write_back,
                             "special_array": special_array, "np": np}
    outer, lines = [], []
    for i, p in enumerate(inputs):
        if p < n_args:
            outer.append(f"t{i} = args[{p}]")
        elif p < first_grad:
            k = p - first_captured
            names[f"CAPTURED{k}"] = plan.captured[k]
            outer.append(f"t{i} = CAPTURED{k}")
    lines += [f"a{i} = None" if i in specials else f"a{i} = t{i}._array"
              for i in range(len(inputs))]
    listed = ", ".join(f"a{i}" for i in range(len(inputs)))
    if plan.n_shared > 1:
        ids = ", ".join(f"id(a{i})" for i in range(len(inputs)))
        lines += [f"if len({{{ids}}}) != {plan.n_shared}:", "    return MISFIT"]
    for i, b in plan.specials:
        names[f"SPECIAL{i}"] = b
        lines.append(f"a{i} = special_array(SPECIAL{i})")
    one = "," if len(inputs) == 1 else ""
    lines += ["if residency.stale:  # what another device holds, fetched",
              f"    residency.fresh_all(({listed}{one}), keep=EX)",
              f"results = EX.run({listed})"]
    n_out = len(executable.graph.outputs)
    targets = [f"t{i}" for i in update_inputs]
    if targets:
        # `write_back`'s work where the executable says which updates it computes in place
        # (`updates_in_place`): those found in place need a bump, a fresh array (never a
        # call array: `fresh_results`) is copied into its target; else `write_back` itself
        in_place = getattr(executable, "updates_in_place", None) or (True,) * len(targets)
        updates = [f"results[{n_out + j}]" for j in range(len(targets))]
        same = [f"{u} is {t}._array" for u, t, kept in zip(updates, targets, in_place) if kept]
        lines.append("if (" + "\n        and ".join(same or ["True"]) + "):")
        for u, t, kept in zip(updates, targets, in_place):
            if not kept:
                lines.append(f"    np.copyto({t}._array, {u})")
            lines.append(f"    {t}._version_counter.bump()")
        lines += ["else:",
                  f"    write_back(EX, [{listed}], [{', '.join(targets)}], results[{n_out}:])"]
    for k, (holder, index, dtype) in enumerate(plan.plain_grads):
        names[f"GRAD_HOLDER{k}"] = holder
        names[f"GRAD_DTYPE{k}"] = dtype
        lines.append(f"GRAD_HOLDER{k}._grad = Tensor._result(results[{index}], GRAD_DTYPE{k})")
    wrapped = _wrapped_results(plan, names, "results")
    if plan.direct is not None:
        lines.append(f"result = {wrapped[plan.direct]}")
    else:
        lines.append(f"result = [{', '.join(wrapped)}]")
    body = outer + ["with HeldInterrupts():"] + [f"    {line}" for line in lines]
    body.append("return result" if plan.direct is not None else "return unflatten(SPEC, result)")
    source = "def stepping(args, kwargs):\n" + "".join(f"    {line}\n" for line in body)
    exec(compile(source, "<graphc call plan step>", "exec"), names)  # noqa: S102 (our text)
    stepping = names["stepping"]
    stepping.__doc__ = source
    return stepping


def special_array(b: RngBinding | ConstantBinding) -> np.ndarray:
    """The array a call passes for a random generator's state (advanced: this call's seed and
    offset) or a constant (a copy: an output may be a view of it)."""
    if isinstance(b, RngBinding):
        seed, offset = b.traced_state if b.transient else b.generator._take(b.counters)
        return np.array([seed, offset], np.uint64).view(np.int64)
    return b.array.copy()


class _NotPlanned(Exception):
    """A binding the plan has no shortcut for (CallPlan.of then returns None)."""


def _indices_getter(indices: list[int]):
    """A function from a sequence to the tuple of its items at `indices` (itemgetter gives
    a bare item for one index)."""
    if len(indices) == 1:
        return _OneItem(indices[0])
    return operator.itemgetter(*indices) if indices else _no_items


class _OneItem:
    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __call__(self, items) -> tuple:
        return (items[self.i],)


def _no_items(items) -> tuple:
    return ()


def _wrapped_results(plan, names: dict, results: str) -> list[str]:
    """The written-out expressions of what the call returns, in `plan.wraps`' order: an input
    tensor by its local, a `.grad` by its holder (bound as GRAD_HOLDER<k> by the step), an
    output array of the list named `results` wrapped as a tensor of its dtype (bound in
    `names` as DTYPE<index>)."""
    wrapped = []
    for kind, index, dtype in plan.wraps:
        if kind == "input":
            wrapped.append(f"t{index}")
        elif kind == "grad":
            wrapped.append(f"GRAD_HOLDER{index}._grad")
        else:
            names[f"DTYPE{index}"] = dtype
            wrapped.append(f"Tensor._result({results}[{index}], DTYPE{index})")
    return wrapped
