"""`graphc.compile`: trace once per signature, then run the executable on every call.

A compiled callable keys its executables by a *signature* of the call: every tensor
argument's shape, dtype and requires_grad, every other argument's type and value (objects by
identity), grad mode, the identity and type of tensors the function captures (closure cells,
globals, attributes of its `self`), the state of the modules it can reach (training flags,
plain attributes such as `p` or `eps`, parameter and buffer identity and types, hook ids),
of the optimizers it can reach (hyperparameters, parameters, and per parameter the state keys
and state tensors' identity and type: state made lazily by a first step means a new graph),
and whether each `.grad` it may touch is None (else its type). A call whose signature has an
executable runs it: arguments and captured tensors (parameters, buffers, closure tensors,
optimizer state, `.grad`s read: see graphc.tracing) are bound by pointer, the graph runs,
in-place updates are written back, fresh `.grad`s are assigned (`GradOutput`), and an output
that is an input tensor comes back as that tensor. So a whole training step (zero_grad,
forward, backward, optimizer step) runs as one graph. A new signature traces
again (the tracing call runs eagerly and its result is returned); with GRAPHC_LOG=recompiles
each retrace logs which fields changed, and after the recompile limit the call raises
`RecompileLimitError` listing them. A stale executable is never replayed: captured tensors
are checked against the graph's types, and storage sharing among the call's tensors against
the trace's (`f(x, x)` traced one input), on every call.

The fast path: computing the full signature walks every reachable module, optimizer and `.grad`
(hundreds of microseconds for an MLP), so each entry also keeps a `_Guard`, built from the same
state at the same moment as a signature it equals (at the trace, and again whenever the full
signature picks the entry): cheap checks, run first on every call, that together imply the full
signature is unchanged. By identity, everything the signature reads through: the function's
`__code__`/`__closure__`/`__globals__` and its closure cells and named globals, the keys and
items of every container `graphc.tracing.reachable` looks into, each module's `__dict__` (keys
in order, every value: training flag, parameter/buffer/child tables, hook dicts, public
attributes) and its tables and hook dicts, each optimizer's param_groups (every hyperparameter
object), params and per-parameter state dicts; Python literals are immutable, so identity
implies the same value. By type: every guarded tensor (shape, dtype, requires_grad, is_leaf)
and every `.grad` the signature describes (None, or shape, dtype, requires_grad), the arguments
(their full description, as in the signature), grad mode, and which argument tensors are
`.grad` holders. A check may fail where the signature would be equal (a hyperparameter set
again to an equal new float): the full signature then decides, and refreshes the entry's guard.
A guard never holds where the signature differs; the one assumption is that no guarded object
changes its `__class__`. An entry whose signature equals a newer entry's (traced again because
it was stale) is never taken by the fast path, so both paths pick the same entry. A guard
holds the objects it checks, so no id it compares is reused while it lives. The stale
checks and the storage-sharing check run on every call, fast path or not; retrace decisions and
the recompile reasons are the full signature's.

Outputs that would need a `grad_fn` are refused (after the tracing run) until compiled
backward graphs exist: an output that requires grad, unless it is an input tensor returned as
itself or a backward inside the call already consumed its history (a training step's loss).

Called inside another trace, a compiled callable runs its function inline, so the outer
trace records its ops.
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from graphc import config, nan_check
from graphc.autograd.grad_mode import is_grad_enabled
from graphc.backends import Executable, check_backend
from graphc.backends import compile as compile_graph
from graphc.compiled_autograd import CompiledFunction, GradientPlan, partition
from graphc.dispatch import current_tracer
from graphc.errors import ArgumentError, GraphcError
from graphc.ir.printer import format_graph
from graphc.passes import default_passes, run_pipeline
from graphc.tensor import Tensor
from graphc.tracing import (
    _LITERALS,
    ArgBinding,
    GradBinding,
    RngBinding,
    TensorBinding,
    TraceResult,
    _at,
    _flat_leaves,
    _flatten,
    grad_holders,
    graph_name,
    optimizer_params,
    reachable,
    trace_call,
    unflatten,
)


class RecompileLimitError(GraphcError, RuntimeError):
    """A compiled callable traced more often than its limit allows."""


@dataclass
class _Entry:
    signature: dict[str, Any]
    traced: TraceResult
    executable: Executable
    aliasing: tuple  # which call tensors shared storage when it was traced (see _aliasing)
    gradient: GradientPlan | None = None  # forward/backward executables when outputs need grad
    guard: _Guard | None = None  # the fast path's checks (see the module docstring)
    shadowed: bool = False  # a newer entry has the same signature: only the full one decides

    def __post_init__(self) -> None:
        """What every call of this entry needs and no call changes."""
        graph, traced = self.executable.graph, self.traced
        position = {id(v): i for i, v in enumerate(graph.inputs)}
        self.update_inputs = [position[id(target)] for target, _ in graph.updates]
        self.feeds = list(zip(traced.bindings, graph.inputs))
        self.typed = [(b, v, v.type.shape, v.type.dtype) for b, v in self.feeds
                      if isinstance(b, (TensorBinding, GradBinding))]
        self.captured = [b.tensor for b in traced.bindings if isinstance(b, TensorBinding)]
        self.distinct = self.aliasing == tuple(range(len(self.aliasing)))
        self.fresh = getattr(self.executable, "fresh_results", False)
        n_own = len(graph.outputs) - sum(go.index is not None for go in traced.grad_outputs)
        self.wraps = [(traced.output_aliases.get(i), traced.output_grads.get(i))
                      for i in range(n_own)]


# ---- the signature of a call -----------------------------------------------------------------
def _tensor_key(t: Tensor, identity: bool) -> tuple:
    key = ("tensor", t._data.shape, t._dtype.name, t._requires_grad)  # t.shape is _data's
    return key + (id(t),) if identity else key


def _describe(value) -> Any:
    """A comparable description of an argument: a tensor's type, a Python value with its type
    (1, 1.0 and True trace differently), an object's identity."""
    if isinstance(value, Tensor):
        return _tensor_key(value, identity=False)
    if isinstance(value, float):
        return ("py", "float", repr(value))  # repr: nan equals nan, -0.0 differs from 0.0
    if isinstance(value, (bool, int, str, type(None), np.generic)):
        return ("py", type(value).__name__, repr(value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__,) + tuple(_describe(v) for v in value)
    if isinstance(value, dict):
        return ("dict",) + tuple((k, _describe(v)) for k, v in value.items())
    return ("object", type(value).__qualname__, id(value))


def _module_state(modules: list[tuple[str, Any]]) -> dict[str, Any]:
    """Training flags, hooks, plain attributes (p, eps, momentum..., tensors that are neither
    parameters nor buffers) and the identity and type of every parameter and buffer of the
    modules a call can reach."""
    state: dict[str, Any] = {}
    for prefix, module in modules:
        for name, m in module.named_modules():
            key = ".".join(p for p in (prefix, name) if p) or "module"
            state[f"{key} training"] = m.training
            hooks = (m._forward_pre_hooks, m._forward_hooks, m._backward_hooks,
                     getattr(m, "_backward_pre_hooks", {}))
            state[f"{key} hooks"] = tuple(tuple(h.keys()) for h in hooks)
            for attr, v in vars(m).items():
                if attr.startswith("_") or attr == "training":
                    continue
                if isinstance(v, _LITERALS):
                    state[f"{key}.{attr}"] = _describe(v)
                elif isinstance(v, Tensor):
                    state[f"{key}.{attr}"] = _tensor_key(v, identity=True)
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            state[".".join(p for p in (prefix, name) if p)] = _tensor_key(t, identity=True)
    return state


def reachable_state(fn, args: tuple = (), kwargs: dict | None = None):
    """(modules, captured) the call can reach (see `graphc.tracing.reachable`): the Modules,
    and a description of the Tensors (identity and type), Python values (type and value) and
    Optimizers (hyperparameters, parameters, state: see `_optimizer_state`) among them, plus
    the presence and type of the `.grad` of every tensor whose gradient the call may read or
    write (`grad_holders`). Names are for the recompile diff."""
    from graphc.optim.optimizer import Optimizer

    modules: list[tuple[str, Any]] = []
    optimizers: list[tuple[str, Any]] = []
    captured: dict[str, Any] = {}
    found = reachable(fn, args, kwargs)
    for name, obj in found:
        if isinstance(obj, _LITERALS):
            captured[name] = _describe(obj)
        elif _is_module(obj):
            modules.append((name, obj))
        elif isinstance(obj, Tensor):
            captured[name] = _tensor_key(obj, identity=True)
        elif isinstance(obj, Optimizer):
            optimizers.append((name, obj))
    names = {id(p): ".".join(x for x in (prefix, n) if x) for prefix, m in modules
             for n, p in m.named_parameters()}
    for name, opt in optimizers:
        captured.update(_optimizer_state(name, opt, names))
    for name, t, _ in grad_holders(fn, args, kwargs, found):
        captured[f"{name}.grad"] = None if t._grad is None else \
            _tensor_key(t._grad, identity=False)
    return modules, captured


def _optimizer_state(name: str, opt, param_names: dict[int, str]) -> dict[str, Any]:
    """Guard fields of an optimizer: every group's hyperparameters (baked into the graph as
    literals), the identity and type of each parameter, and per parameter each state entry
    (a tensor's identity and type, another value's type and value), the parameter named after
    its module where one holds it. State is created lazily by the first step (momentum
    buffers, Adam's moments and step count), so the call after it traces again."""
    fields: dict[str, Any] = {}
    for g, group in enumerate(opt.param_groups):
        for key, value in group.items():
            if key not in ("params", "param_names"):
                fields[f"{name}.param_groups[{g}][{key!r}]"] = _describe(value)
    for label, p in optimizer_params(opt):
        label = param_names.get(id(p), label)
        fields[f"{name}.params[{label}]"] = _tensor_key(p, identity=True)
        for key, value in opt.state.get(p, {}).items():
            fields[f"{name}.state[{label}].{key}"] = _tensor_key(value, identity=True) \
                if isinstance(value, Tensor) else _describe(value)
    return fields


def signature_of(fn, modules, args: tuple, kwargs: dict, captured=None) -> dict[str, Any]:
    """The guard fields of one call (see the module docstring)."""
    sig: dict[str, Any] = {"grad mode": is_grad_enabled()}
    for i, a in enumerate(args):
        sig[f"arg {i}"] = _describe(a)
    for k, v in kwargs.items():
        sig[f"kwarg {k}"] = _describe(v)
    sig.update(_module_state(modules))
    for name, description in (captured or {}).items():
        sig[f"captured {name}"] = description
    return sig


def _aliasing(traced: TraceResult, args: tuple, kwargs: dict) -> tuple:
    """For each tensor of the call and each captured tensor, the first one with its storage:
    a graph traced with `f(x, x)` (one input) must not run for `f(x, y)`."""
    flat = [t for _, t in _flatten((args, kwargs))]
    flat += [b.tensor for b in traced.bindings if isinstance(b, TensorBinding)]
    first: dict[int, int] = {}
    return tuple(first.setdefault(id(t._data), i) for i, t in enumerate(flat))


def _same_sharing(entry: _Entry, args: tuple, kwargs: dict) -> bool:
    """Whether the call's tensors share storage as at the trace (`_aliasing`): when none did,
    it is enough that none does."""
    if not entry.distinct:
        return _aliasing(entry.traced, args, kwargs) == entry.aliasing
    ids = [id(t._data) for _, t in _flatten((args, kwargs))]
    ids += [id(t._data) for t in entry.captured]
    return len(ids) == len(entry.aliasing) == len(set(ids))


def _diff(old: dict, new: dict) -> list[str]:
    rows = []
    for key in dict.fromkeys(list(old) + list(new)):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if a == b:
            continue
        if _is_tensor_key(a) and _is_tensor_key(b):
            for label, x, y in (("shape", a[1], b[1]), ("dtype", a[2], b[2]),
                                ("requires_grad", a[3], b[3])):
                if x != y:
                    rows.append(f"{key} {label} {_fmt(x)} -> {_fmt(y)}")
            if len(a) > 4 and a[4] != b[4]:
                rows.append(f"{key} replaced by another tensor")
        else:
            rows.append(f"{key}: {_fmt(a)} -> {_fmt(b)}")
    return rows


def _is_tensor_key(x) -> bool:
    return isinstance(x, tuple) and x[:1] == ("tensor",)


def _fmt(x) -> str:
    if isinstance(x, tuple) and x[:1] == ("py",):
        return x[2]
    if isinstance(x, tuple) and x[:1] == ("object",):
        return f"<{x[1]} object at {x[2]:#x}>"
    if _is_tensor_key(x):
        return f"tensor{_fmt(x[1])} {x[2]}"
    if isinstance(x, tuple) and x and all(isinstance(i, int) for i in x):
        return "(" + ",".join(str(i) for i in x) + ")"
    if isinstance(x, tuple) and x[:1] in (("tuple",), ("list",), ("dict",)):
        return x[0] + "(" + ", ".join(_fmt(i) for i in x[1:]) + ")"
    return repr(x)


# ---- the fast guard --------------------------------------------------------------------------
_ABSENT = object()  # an attribute, global, cell or dict entry that is not there


class _Guard:
    """Cheap checks that, when they all hold, imply the call's full signature equals the one
    computed at the same moment as the guard was built (see "The fast path" in the module
    docstring). They may fail where the signature is equal (then the full signature decides);
    they never hold where it differs."""

    __slots__ = ("grad_mode", "call", "attrs", "cells", "lookups", "empty",
                 "dicts", "seqs", "big", "tensors", "grads", "holder_ids", "arg_holders")

    def __init__(self, fn, args: tuple, kwargs: dict) -> None:
        self.grad_mode = is_grad_enabled()
        self.call = _describe_call(args, kwargs)
        self.attrs: list = []  # (object, attribute, value or _ABSENT): getattr is value
        self.cells: list = []  # (closure cell, contents or _ABSENT)
        self.lookups: list = []  # (dict, keys, values or _ABSENT): d.get(key) is value
        self.empty: list = []  # containers that are empty
        self.dicts: list = []  # (dict, keys in order, values): same keys, same objects
        self.seqs: list = []  # (list or tuple, items): same length, same objects
        self.big: list = []  # containers reachable() does not look into (more than 64 items)
        self.tensors: list = []  # (tensor, shape, dtype, requires_grad, is_leaf)
        self.grads: list = []  # (holder, None or (shape, dtype, requires_grad) of its .grad)
        _GuardBuilder(self).build(fn, args, kwargs)

    def holds(self, args: tuple, kwargs: dict) -> bool:
        try:
            return self._holds(args, kwargs)
        except (AttributeError, KeyError, TypeError, ValueError):  # let the signature say
            return False

    def _holds(self, args: tuple, kwargs: dict) -> bool:
        if is_grad_enabled() != self.grad_mode or _describe_call(args, kwargs) != self.call:
            return False
        for obj, attr, value in self.attrs:
            if getattr(obj, attr, _ABSENT) is not value:
                return False
        for cell, value in self.cells:
            if _cell_contents(cell) is not value:
                return False
        for d, keys, values in self.lookups:
            if not all(map(operator.is_, map(d.get, keys, itertools.repeat(_ABSENT)), values)):
                return False
        if any(map(len, self.empty)):
            return False
        for d, keys, values in self.dicts:
            if len(d) != len(keys) or tuple(d) != keys or not all(map(
                    operator.is_, d.values(), values)):
                return False
        for seq, items in self.seqs:
            if len(seq) != len(items) or not all(map(operator.is_, seq, items)):
                return False
        for container in self.big:
            if len(container) <= 64:
                return False
        for t, shape, dtype, requires_grad, leaf in self.tensors:
            if (t._data.shape != shape or t._dtype is not dtype
                    or t._requires_grad is not requires_grad or (t.grad_fn is None) is not leaf):
                return False
        for t, key in self.grads:
            g = t._grad
            if g is None or key is None:
                if g is not key:
                    return False
            elif (g._data.shape != key[0] or g._dtype is not key[1]
                  or g._requires_grad is not key[2]):
                return False
        return self.arg_holders is None or \
            _arg_holders(args, kwargs, self.holder_ids) == self.arg_holders


def _describe_call(args: tuple, kwargs: dict) -> tuple:
    return tuple(map(_describe, args)), tuple((k, _describe(v)) for k, v in kwargs.items())


def _cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _ABSENT


def _grad_type(g):
    return None if g is None else (g._data.shape, g._dtype, g._requires_grad)


def _arg_holders(args: tuple, kwargs: dict, captured_ids: frozenset) -> tuple:
    """The argument tensors whose `.grad` the signature describes (`grad_holders`): for each,
    once, its path, its `.grad`'s type, and whether it is also a captured holder (which then
    goes undescribed under its own name)."""
    seen: set[int] = set()
    out = []
    for path, t in _flatten((args, kwargs)):
        if t._requires_grad and t.grad_fn is None and id(t) not in seen:
            seen.add(id(t))
            out.append((path, _grad_type(t._grad), id(t) in captured_ids))
    return tuple(out)


class _GuardBuilder:
    """Fills a _Guard by walking what `reachable_state` walks: `graphc.tracing.reachable`
    (captured_roots, one level into plain objects, containers and functions), the modules'
    `_module_state`, the optimizers' `_optimizer_state` and the `grad_holders`. It records every
    container it reads, so a change to any of them fails the guard."""

    def __init__(self, guard: _Guard) -> None:
        self.g = guard
        self.seen: set[int] = set()
        self.found: list = []
        self.modules_seen: set[int] = set()

    def build(self, fn, args: tuple, kwargs: dict) -> None:
        from graphc.nn.module import Module
        from graphc.optim.optimizer import Optimizer

        for obj in self._roots(fn):
            self._visit(obj, 0)
        for _, arg in _flat_leaves((args, kwargs)):
            if not isinstance(arg, (Tensor,) + _LITERALS):
                self._visit(arg, 1)
        holders: list[Tensor] = []
        for obj in self.found:
            if isinstance(obj, Module):
                holders += self._module(obj)
        for obj in self.found:
            if isinstance(obj, Optimizer):
                holders += self._optimizer(obj)
            elif isinstance(obj, Tensor):
                self._tensor(obj)
                if obj.requires_grad and obj.is_leaf:
                    holders.append(obj)
        unique = {id(t): t for t in holders}
        self.g.grads = [(t, _grad_type(t._grad)) for t in unique.values()]
        self.g.holder_ids = frozenset(unique)
        needs_grad = any(t.requires_grad for _, t in _flatten((args, kwargs)))
        self.g.arg_holders = _arg_holders(args, kwargs, self.g.holder_ids) if needs_grad \
            else None  # none requires grad: the arguments' description says so for the call

    def _roots(self, fn) -> list:
        """What `graphc.tracing.captured_roots` returns, each read recorded."""
        if _is_module(fn):
            return [fn]
        g = self.g
        target = getattr(fn, "__func__", fn)
        roots = []
        owner = getattr(fn, "__self__", None)
        if isinstance(fn, types.FunctionType):  # __func__, __self__: only set in its __dict__
            self._dict(fn.__dict__)
            g.attrs.append((fn, "__code__", fn.__code__))  # the one writable one
        elif not isinstance(fn, types.MethodType):  # a method's attributes are read-only
            g.attrs += [(fn, a, getattr(fn, a, _ABSENT)) for a in ("__func__", "__self__")]
        if target is not fn:
            g.attrs += [(target, a, getattr(target, a, _ABSENT))
                        for a in ("__code__", "__closure__", "__globals__")]
        if owner is not None:
            roots.append(owner)
        code = getattr(target, "__code__", None)
        closure = getattr(target, "__closure__", None)
        glb = getattr(target, "__globals__", {})
        if code is not None:
            for cell in dict(zip(code.co_freevars, closure or ())).values():
                value = _cell_contents(cell)
                g.cells.append((cell, value))
                if value is not _ABSENT:
                    roots.append(value)
            values = tuple(glb.get(name, _ABSENT) for name in code.co_names)
            g.lookups.append((glb, code.co_names, values))
            roots += [value for value in values if value is not _ABSENT]
        return roots

    def _visit(self, obj, depth: int) -> None:
        """`graphc.tracing.reachable`'s visit, recording the containers it reads."""
        from graphc.nn.module import Module
        from graphc.optim.optimizer import Optimizer

        if isinstance(obj, _LITERALS):
            self.found.append(obj)
            return
        if id(obj) in self.seen or isinstance(obj, (type, types.ModuleType)):
            return
        self.seen.add(id(obj))
        if isinstance(obj, (Module, Tensor, Optimizer)):
            self.found.append(obj)
        elif depth >= 2:
            return
        elif isinstance(obj, (types.FunctionType, types.MethodType)):
            for item in self._roots(obj):
                self._visit(item, depth + 1)
        elif isinstance(obj, (list, tuple)) and len(obj) <= 64:
            self.g.seqs.append((obj, tuple(obj)))
            for item in obj:
                self._visit(item, depth + 1)
        elif isinstance(obj, dict) and len(obj) <= 64:
            self._dict(obj)
            for item in obj.values():
                self._visit(item, depth + 1)
        else:
            if isinstance(obj, (list, tuple, dict)):
                self.g.big.append(obj)
            if hasattr(obj, "__dict__") and not callable(obj):
                d = vars(obj)
                self.g.attrs.append((obj, "__dict__", d))
                self._dict(d)
                for item in list(d.values())[:64]:
                    self._visit(item, depth + 1)

    def _dict(self, d: dict) -> None:
        if d:
            self.g.dicts.append((d, tuple(d), tuple(d.values())))
        else:
            self.g.empty.append(d)

    def _tensor(self, t: Tensor) -> None:
        self.g.tensors.append((t, t._data.shape, t._dtype, t._requires_grad, t.grad_fn is None))

    def _module(self, module) -> list[Tensor]:
        """Guard `_module_state` of `module` and every module below it; returns its
        parameters (they hold `.grad`s)."""
        if id(module) in self.modules_seen:
            return []
        self.modules_seen.add(id(module))
        g = self.g
        d = vars(module)
        g.attrs.append((module, "__dict__", d))
        self._dict(d)  # its keys in order, every value by identity
        for key, value in d.items():
            if isinstance(value, Tensor) and not key.startswith("_"):
                self._tensor(value)
        for name in _HOOK_DICTS:
            hooks = d[name] if name in d else getattr(module, name, _ABSENT)
            if name not in d:
                g.attrs.append((module, name, hooks))
            if isinstance(hooks, dict):
                self._dict(hooks)
        params = module._parameters
        for table in (params, module._buffers, module._modules):
            self._dict(table)
        for t in list(params.values()) + list(module._buffers.values()):
            if t is not None:
                self._tensor(t)
        params = [p for p in params.values() if p is not None]
        for child in module._modules.values():
            if child is not None:
                params += self._module(child)
        return params

    def _optimizer(self, opt) -> list[Tensor]:
        """Guard `_optimizer_state`; returns the optimizer's parameters."""
        g = self.g
        groups, state = opt.param_groups, opt.state
        g.attrs += [(opt, "param_groups", groups), (opt, "state", state)]
        g.seqs.append((groups, tuple(groups)))
        params = []
        for group in groups:
            self._dict(group)
            g.seqs.append((group["params"], tuple(group["params"])))
            params += group["params"]
        entries = tuple(state.get(p, _ABSENT) for p in params)
        g.lookups.append((state, tuple(params), entries))
        for p, entry in zip(params, entries):
            self._tensor(p)
            if entry is not _ABSENT:
                self._dict(entry)
                for value in entry.values():
                    if isinstance(value, Tensor):
                        self._tensor(value)
        return params


_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")


# ---- the compiled callable -------------------------------------------------------------------
class Compiled:
    """The callable graphc.compile returns (see the module docstring)."""

    def __init__(self, fn: Callable, backend: str, recompile_limit: int | None,
                 passes=None) -> None:
        check_backend(backend)
        if not callable(fn):
            raise ArgumentError(
                f"graphc.compile: expected a function or an nn.Module to compile, got "
                f"{type(fn).__name__} {fn!r}; pass the callable itself (graphc.compile(model), "
                "not graphc.compile(model(x)))")
        self.fn = fn
        self.backend = backend
        self.recompile_limit = recompile_limit
        self.passes = passes  # None: graphc.passes.default_passes(); [] runs the traced graph
        self.report = None  # the PipelineReport of the latest trace
        self._entries: list[_Entry] = []
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
        """The graph the backend runs for the most recent trace (after the passes)."""
        return self.executable.graph

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
        if current_tracer() is not None:  # called inside another trace: inline it
            return self.fn(*args, **kwargs)
        for entry in reversed(self._entries):  # the fast path
            if entry.guard is not None and entry.guard.holds(args, kwargs):
                if not entry.shadowed and self._fits(entry, args, kwargs):
                    return self._run(entry, args, kwargs)
                break
        guard = _Guard(self.fn, args, kwargs)  # the same state as the signature below
        modules, captured = reachable_state(self.fn, args, kwargs)
        sig = signature_of(self.fn, modules, args, kwargs, captured)
        stale: list[str] = []
        for entry in reversed(self._entries):
            if entry.signature == sig:
                stale = self._stale(entry, args, kwargs)
                if not stale:
                    entry.guard = guard
                    return self._run(entry, args, kwargs)
        return self._trace(sig, guard, args, kwargs, modules, stale)

    def _limit(self) -> int:
        return self.recompile_limit if self.recompile_limit is not None \
            else config.recompile_limit()

    def _trace(self, sig: dict, guard: _Guard, args: tuple, kwargs: dict, modules,
               stale: list[str]):
        if self._entries:
            reasons = stale or _diff(self._entries[-1].signature, sig) or [
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
        lazy_state = nan_check.LazyState(self.fn, args, kwargs) if config.check_nans() else None
        traced = trace_call(self.fn, args, kwargs)
        try:
            needs_grad = _outputs_needing_grad(self.__name__, traced, args, kwargs)
            prefix = _dump(traced.graph)
            passes = default_passes() if self.passes is None else list(self.passes)
            optimized, self.report = run_pipeline(traced.graph, passes, verify=True,
                                                  dump_prefix=prefix)
            executable = compile_graph(optimized, self.backend)
            gradient = self._gradient_plan(traced, args, kwargs, passes, needs_grad) \
                if needs_grad else None
        except BaseException:
            traced.restore()  # the refused call leaves no trace of its eager run
            raise
        self._entries.append(_Entry(sig, traced, executable, _aliasing(traced, args, kwargs),
                                    gradient, guard))
        self._mark_shadowed()
        if lazy_state is not None:  # undo the eager run; the checked compiled run replaces it
            traced.restore()
            try:
                return self._run(self._entries[-1], args, kwargs)
            except nan_check.NonFiniteError:  # refused like a failed trace: no entry, no state
                self._entries.pop()
                self._mark_shadowed()
                lazy_state.drop_new()
                raise
        return traced.result

    def _mark_shadowed(self) -> None:
        """An entry whose signature a newer entry also has is left to the full signature."""
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
        forward, _ = run_pipeline(part.forward, passes)
        backward, _ = run_pipeline(part.backward, passes)
        return GradientPlan(part, compile_graph(forward, self.backend),
                            compile_graph(backward, self.backend), wrt)

    def _stale(self, entry: _Entry, args: tuple, kwargs: dict) -> list[str]:
        """Why the entry's graph no longer fits this call (empty when it does): a captured
        tensor changed its type, or tensors that shared storage at the trace no longer do."""
        reasons = []
        for b, v, shape, dtype in entry.typed:
            if isinstance(b, TensorBinding):
                t = b.tensor
                if tuple(t._data.shape) != shape or t.dtype is not dtype:
                    reasons.append(f"captured %{v.name} {v.type} -> {t.type}")
            else:
                g = b.resolve(args, kwargs)._grad
                if g is None:
                    reasons.append(f"%{v.name} {v.type} -> None")
                elif tuple(g._data.shape) != shape or g.dtype is not dtype:
                    reasons.append(f"%{v.name} {v.type} -> {g.type}")
        if not _same_sharing(entry, args, kwargs):
            reasons.append("which argument tensors share storage (e.g. f(x, x) -> f(x, y))")
        return reasons

    @staticmethod
    def _fits(entry: _Entry, args: tuple, kwargs: dict) -> bool:
        """`not _stale(entry, ...)`, without building the reasons."""
        for b, _, shape, dtype in entry.typed:
            t = b.tensor if isinstance(b, TensorBinding) else b.resolve(args, kwargs)._grad
            if t is None or t._data.shape != shape or t._dtype is not dtype:
                return False
        return _same_sharing(entry, args, kwargs)

    def _run(self, entry: _Entry, args: tuple, kwargs: dict):
        traced = entry.traced
        check = nan_check.Check(self.__name__, traced.graph, [
            b.generator for b in traced.bindings if isinstance(b, RngBinding)
            and not b.transient]) if config.check_nans() else None
        arrays, tensors = [], []  # per graph input: its array, its tensor (None: rng/constant)
        for b, _ in entry.feeds:
            if isinstance(b, TensorBinding):
                t = b.tensor
            elif isinstance(b, ArgBinding):
                t = _at((args, kwargs), b.path)
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
            outputs = _run_and_write_back(entry.executable, arrays,
                                          [tensors[i] for i in entry.update_inputs], check)
            fresh = entry.fresh
        grads = self._assign_grads(traced, outputs, arrays, args, kwargs, fresh)
        wrapped = [tensors[j] if j is not None else grads[k] if k is not None
                   else _as_tensor(o) for (j, k), o in zip(entry.wraps, outputs)]
        return unflatten(traced.out_spec, wrapped)

    @staticmethod
    def _run_with_gradient(entry: _Entry, arrays: list, by_index: list,
                           check: nan_check.Check | None = None) -> list:
        """Run the forward part under a CompiledFunction node: outputs carry a grad_fn.
        `by_index[i]` is the tensor bound to graph input i (None for rng/constant inputs)."""
        plan = entry.gradient
        inputs = plan.forward.graph.inputs
        bound = {id(v): t for v, t in zip(inputs, by_index) if t is not None}
        updated = {inputs.index(target) for target, _ in plan.forward.graph.updates}

        targets = [bound[id(target)] for target, _ in plan.forward.graph.updates]

        def run_forward(forward_arrays):
            return _run_and_write_back(plan.forward, forward_arrays, targets, check,
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
            if go.index in used if fresh else any(np.may_share_memory(array, other)
                                                  for other in taken):
                array = array.copy()  # a .grad never shares memory with another tensor
            used.add(go.index)
            taken.append(array)
            holder._grad = Tensor._wrap(array)
            assigned.append(holder._grad)
        return assigned


def _run_and_write_back(executable: Executable, arrays: list, targets: list,
                        check: nan_check.Check | None = None, n_checked: int | None = None
                        ) -> list:
    """Run an executable; write its updates into `targets` (the tensors of graph.updates'
    targets, in order); return its outputs.
    With a `check` (GRAPHC_CHECK_NANS=1), its first `n_checked` outputs (default: all) and its
    updates must be finite, else graphc.nan_check raises before anything is written back."""
    n_out = len(executable.graph.outputs)
    results = executable.run(*arrays) if check is None else nan_check.run_checked(
        executable, arrays, check, n_out if n_checked is None else n_checked)
    outputs, updates = results[:n_out], results[n_out:]
    # A value the backend computed straight into its target needs no write. Any other value
    # that shares memory with a call array is copied first: writing one target must never
    # change a value still to be written. A backend with `fresh_results` returns call arrays
    # only as their own targets' values, so only those are looked for.
    if getattr(executable, "fresh_results", False):
        call_arrays = {id(a) for a in arrays}
        new_values = [u if u is t._data or id(u) not in call_arrays else np.array(u, copy=True)
                      for t, u in zip(targets, updates)]
    else:
        new_values = [u if u is t._data else
                      np.array(u, copy=True) if any(np.may_share_memory(u, a) for a in arrays)
                      else u for t, u in zip(targets, updates)]
    for t, value in zip(targets, new_values):
        if value is not t._data:
            np.copyto(t._data, value)
        t._version_counter.bump()
    return outputs


def _as_tensor(output) -> Tensor:
    """An executable's output array as a tensor (a CompiledFunction output already is one)."""
    return output if isinstance(output, Tensor) else Tensor._wrap(np.asarray(output))


def _bound_tensor(binding, args: tuple, kwargs: dict) -> Tensor:
    return binding.tensor if isinstance(binding, TensorBinding) else _at((args, kwargs),
                                                                         binding.path)


def _is_module(obj) -> bool:
    from graphc.nn.module import Module

    return isinstance(obj, Module)


_NO_GRADS = ("a compiled call cannot mix the two: return loss.detach() from a training step, "
             "or call backward() outside the compiled function.")


def _history_consumed(t: Tensor) -> bool:
    """Whether a backward() inside the traced call already ran through `t`'s history (freed
    saved tensors in it): calling backward on it again would fail in eager code too, so the
    compiled call may return it as a plain value (the loss of a training step)."""
    from graphc.autograd.graph import SavedTensor

    stack, seen = [t.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        saved = list(getattr(node, "saved_inputs", {}).values())
        saved += list(getattr(node, "saved_outputs", {}).values())
        ctx = getattr(node, "ctx", None)
        saved += [x for x in getattr(ctx, "_saved", ()) if isinstance(x, SavedTensor)]
        if any(x.freed for x in saved):
            return True
        stack.extend(child for child, _ in node.next_functions)
    return False


def _outputs_needing_grad(name: str, traced: TraceResult, args: tuple,
                          kwargs: dict) -> list[str]:
    """After the trace: the outputs that need a grad_fn (they require grad, are not input
    tensors returned as themselves, and no backward inside the call consumed their history).
    They get one through a derived backward graph, unless the function also ran a backward
    inside (a training step returning an undetached loss), which is refused; so is a `.grad`
    with history (backward(create_graph=True) inside the call)."""
    if not is_grad_enabled():
        return []
    flat = list(_flatten(traced.result))
    outputs: dict[int, int] = {}
    for _path, t in flat:
        outputs.setdefault(id(t), len(outputs))
    needing = []
    for path, t in flat:
        if not t.requires_grad or outputs[id(t)] in traced.output_aliases:
            continue
        if t.grad_fn is not None and _history_consumed(t):
            continue
        where = "".join(f"[{p!r}]" for p in path) or ""
        if traced.grad_outputs:
            raise GraphcError(
                f"graphc.compile({name}): output{where} requires grad, and the function also "
                f"ran backward() inside; {_NO_GRADS} (A training step that ran "
                "backward(retain_graph=True) inside can return loss.detach().)"
            )
        needing.append(f"output{where}")
    for go in traced.grad_outputs:
        g = go.resolve(args, kwargs)._grad
        if g is not None and g.requires_grad:
            raise GraphcError(
                f"graphc.compile({name}): backward(create_graph=True) inside the compiled "
                f"function left a .grad with history, and {_NO_GRADS}"
            )
    return needing


_dump_counts: dict[str, int] = {}


def _dump(graph) -> str | None:
    """With GRAPHC_DUMP=<dir>: write the traced graph to <dir>/<name>.<n>.0.traced.gir, where
    n counts the graphs of that name traced in this process (so none overwrites another);
    the passes then write <name>.<n>.<stage>.<pass>.gir. Returns the `<name>.<n>` prefix."""
    directory = config.dump_dir()
    if not directory or not config.dumps("ir"):
        return None
    os.makedirs(directory, exist_ok=True)
    index = _dump_counts[graph.name] = _dump_counts.get(graph.name, 0) + 1
    prefix = f"{graph.name}.{index}"
    with open(os.path.join(directory, f"{prefix}.0.traced.gir"), "w") as f:
        f.write(format_graph(graph) + "\n")
    return prefix


def compile(fn: Callable | None = None, *, backend: str = "interp",  # noqa: A001
            recompile_limit: int | None = None, passes=None):
    """Compile a function or Module: trace on the first call, then run the executable.

    Usable directly (`graphc.compile(model)`) or as a decorator (`@graphc.compile` or
    `@graphc.compile(backend="interp")`).

    >>> import graphc
    >>> @graphc.compile
    ... def f(x):
    ...     return (x * 2).relu()
    >>> f(graphc.tensor([-1.0, 3.0]))
    tensor([0., 6.])
    >>> f(graphc.tensor([2.0, -5.0]))
    tensor([4., 0.])
    """
    if fn is None:
        return functools.partial(compile, backend=backend, recompile_limit=recompile_limit,
                                 passes=passes)
    return Compiled(fn, backend, recompile_limit, passes)


__all__ = ["Compiled", "RecompileLimitError", "compile", "reachable_state", "signature_of"]
