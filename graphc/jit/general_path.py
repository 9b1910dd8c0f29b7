"""The general path of a compiled call: `run_entry` binds, runs and wraps for any entry.

`graphc.jit.compiler.Compiled._run` takes it for every entry without a `CallPlan` (a non-cpu
backend, GRAPHC_CHECK_NANS, outputs that need a grad_fn, a trace's first run) and for a call its
plan refuses (`MISFIT`); graphc.jit.call_plan is the same work laid out once per entry.
`.grad`s are assigned after the updates (`assign_grads`), and a `.grad` never shares memory with
another tensor.
"""

from __future__ import annotations

import numpy as np

from graphc import config
from graphc.autograd.grad_mode import is_grad_enabled
from graphc.jit import nan_check
from graphc.jit.bindings import ArgBinding, GradBinding, RngBinding, TensorBinding, TraceResult
from graphc.jit.compiled_autograd import CompiledFunction
from graphc.jit.entry import Entry
from graphc.jit.pytree import at, unflatten
from graphc.jit.run import as_array, as_tensor, run_and_write_back
from graphc.tensor import Tensor

__all__ = ["assign_grads", "run_entry", "run_with_gradient"]


def run_entry(name: str, entry: Entry, args: tuple, kwargs: dict, escaped: list = ()):
    """The general path of a compiled call (`name`: the callable's, for the NaN check): bind
    each graph input (a type test and a lookup per binding), run the executable (the forward
    under a CompiledFunction where outputs need a grad_fn), assign the `.grad`s, give the
    escaped state its values, wrap the outputs. The caller holds Ctrl-C (`interrupts_held`)."""
    traced = entry.traced
    check = nan_check.Check(name, traced.graph, [
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
        outputs = run_with_gradient(entry, arrays, tensors, check)
        fresh = False
    else:
        outputs = run_and_write_back(entry.executable, arrays,
                                     [tensors[i] for i in entry.update_inputs], check)
        fresh = entry.fresh
    grads = assign_grads(traced, outputs, arrays, args, kwargs, fresh)
    for index, t in escaped:  # a copy: a tensor of state owns its memory
        t._data = np.array(as_array(outputs[index]), copy=True)
    wrapped = [tensors[j] if j is not None else grads[k] if k is not None
               else as_tensor(o) for (j, k), o in zip(entry.wraps, outputs)]
    return unflatten(traced.out_spec, wrapped)


def run_with_gradient(entry: Entry, arrays: list, by_index: list,
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


def assign_grads(traced: TraceResult, outputs: list, inputs: list, args: tuple,
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
