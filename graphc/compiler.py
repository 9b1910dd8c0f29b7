"""`graphc.compile`: trace once per signature, then run the executable on every call.

A compiled callable keys its executables by a *signature* of the call: every tensor
argument's shape, dtype and requires_grad, every other argument's type and value (objects by
identity), grad mode, the identity and type of tensors the function captures (closure cells,
globals, attributes of its `self`), and the state of the modules it can reach (training flags,
plain attributes such as `p` or `eps`, parameter and buffer identity and types, hook ids). A
call whose signature has an executable runs it: arguments and captured tensors (parameters,
buffers, closure tensors) are bound by pointer, the graph runs, in-place updates are written
back, and an output that is an input tensor comes back as that tensor. A new signature traces
again (the tracing call runs eagerly and its result is returned); with GRAPHC_LOG=recompiles
each retrace logs which fields changed, and after the recompile limit the call raises
`RecompileLimitError` listing them. A stale executable is never replayed: captured tensors
are checked against the graph's types, and storage sharing among the call's tensors against
the trace's (`f(x, x)` traced one input), on every call.

Called inside another trace, a compiled callable runs its function inline, so the outer
trace records its ops.
"""

from __future__ import annotations

import functools
import os
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from graphc import config
from graphc.autograd.grad_mode import is_grad_enabled
from graphc.backends import Executable, check_backend
from graphc.backends import compile as compile_graph
from graphc.dispatch import current_tracer
from graphc.errors import GraphcError
from graphc.ir.printer import format_graph
from graphc.tensor import Tensor
from graphc.tracing import (
    ConstantBinding,
    RngBinding,
    TensorBinding,
    TraceResult,
    _at,
    _flatten,
    captured_roots,
    graph_name,
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


# ---- the signature of a call -----------------------------------------------------------------
def _tensor_key(t: Tensor, identity: bool) -> tuple:
    key = ("tensor", tuple(t.shape), t.dtype.name, t.requires_grad)
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


_LITERALS = (bool, int, float, str, type(None), np.generic)


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
    """(modules, captured) the call can reach: the Modules, and a description of the Tensors
    (identity and type) and Python values (type and value) among `fn`'s captured roots
    (itself, its `self`, closure cells, globals), one level into plain objects, containers
    and helper functions, and the same for the arguments (a Module or an object holding one
    passed in). Names are for the recompile diff."""
    modules: list[tuple[str, Any]] = []
    captured: dict[str, Any] = {}
    seen: set[int] = set()

    def visit(name: str, obj, depth: int) -> None:
        if isinstance(obj, _LITERALS):  # a global SCALE = 2.0 is baked into the graph
            captured[name] = _describe(obj)
            return
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType)):
            return
        seen.add(id(obj))
        if _is_module(obj):
            modules.append((name, obj))
        elif isinstance(obj, Tensor):
            captured[name] = _tensor_key(obj, identity=True)
        elif depth >= 2:
            return
        elif isinstance(obj, (types.FunctionType, types.MethodType)):
            for sub, item in captured_roots(obj):
                visit(f"{name}.{sub}" if sub != "self" else f"{name}.__self__", item, depth + 1)
        elif isinstance(obj, (list, tuple)) and len(obj) <= 64:
            for i, item in enumerate(obj):
                visit(f"{name}[{i}]", item, depth + 1)
        elif isinstance(obj, dict) and len(obj) <= 64:
            for k, item in obj.items():
                visit(f"{name}[{k!r}]", item, depth + 1)
        elif hasattr(obj, "__dict__") and not callable(obj):
            for attr, item in list(vars(obj).items())[:64]:
                visit(f"{name}.{attr}", item, depth + 1)

    for name, obj in captured_roots(fn):
        visit(name, obj, 0)
    for path, arg in _flat_leaves((args, kwargs or {})):
        if not isinstance(arg, (Tensor,) + _LITERALS):  # those are described as arguments
            visit(_path_name(path), arg, 1)
    return modules, captured


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


# ---- the compiled callable -------------------------------------------------------------------
class Compiled:
    """The callable graphc.compile returns (see the module docstring)."""

    def __init__(self, fn: Callable, backend: str, recompile_limit: int | None) -> None:
        check_backend(backend)
        self.fn = fn
        self.backend = backend
        self.recompile_limit = recompile_limit
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
        """The graph of the most recent trace."""
        if not self._entries:
            raise GraphcError("this compiled callable has not been called yet: no graph")
        return self._entries[-1].executable.graph

    @property
    def graphs(self) -> list:
        return [e.executable.graph for e in self._entries]

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
        modules, captured = reachable_state(self.fn, args, kwargs)
        sig = signature_of(self.fn, modules, args, kwargs, captured)
        stale: list[str] = []
        for entry in reversed(self._entries):
            if entry.signature == sig:
                stale = self._stale(entry, args, kwargs)
                if not stale:
                    return self._run(entry, args, kwargs)
        return self._trace(sig, args, kwargs, modules, stale)

    def _limit(self) -> int:
        return self.recompile_limit if self.recompile_limit is not None \
            else config.recompile_limit()

    def _trace(self, sig: dict, args: tuple, kwargs: dict, modules, stale: list[str]):
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
        _refuse_gradients(self.__name__, modules, args, kwargs)
        traced = trace_call(self.fn, args, kwargs)
        _refuse_grad_outputs(self.__name__, traced)
        executable = compile_graph(traced.graph, self.backend)
        self._entries.append(_Entry(sig, traced, executable, _aliasing(traced, args, kwargs)))
        _dump(traced.graph)
        return traced.result

    def _stale(self, entry: _Entry, args: tuple, kwargs: dict) -> list[str]:
        """Why the entry's graph no longer fits this call (empty when it does): a captured
        tensor changed its type, or tensors that shared storage at the trace no longer do."""
        reasons = []
        for b, v in zip(entry.traced.bindings, entry.executable.graph.inputs):
            if isinstance(b, TensorBinding):
                t = b.tensor
                if tuple(t._data.shape) != v.type.shape or t.dtype is not v.type.dtype:
                    reasons.append(f"captured %{v.name} {v.type} -> {t.type}")
        if _aliasing(entry.traced, args, kwargs) != entry.aliasing:
            reasons.append("which argument tensors share storage (e.g. f(x, x) -> f(x, y))")
        return reasons

    def _run(self, entry: _Entry, args: tuple, kwargs: dict):
        traced = entry.traced
        graph = entry.executable.graph
        arrays, bound = [], {}
        for b, v in zip(traced.bindings, graph.inputs):
            if isinstance(b, RngBinding):
                seed, offset = b.traced_state if b.transient else b.generator._take(b.counters)
                arrays.append(np.array([seed, offset], np.uint64).view(np.int64))
                continue
            if isinstance(b, ConstantBinding):  # a copy: an output may be a view of it
                arrays.append(b.array.copy())
                continue
            t = b.tensor if isinstance(b, TensorBinding) else _at((args, kwargs), b.path)
            bound[id(v)] = t
            arrays.append(t._data)
        results = entry.executable.run(*arrays)
        n_out = len(graph.outputs)
        outputs, updates = results[:n_out], results[n_out:]
        new_values = [np.array(u, copy=True) for u in updates]  # never alias a written input
        for (target, _), value in zip(graph.updates, new_values):
            t = bound[id(target)]
            np.copyto(t._data, value)
            t._version_counter.bump()
        wrapped = []
        for i, o in enumerate(outputs):
            j = traced.output_aliases.get(i)
            wrapped.append(bound[id(graph.inputs[j])] if j is not None
                           else Tensor._wrap(np.asarray(o)))
        return unflatten(traced.out_spec, wrapped)


def _flat_leaves(obj, path=()):
    """(path, leaf) for every non-container leaf of nested tuples, lists and dicts."""
    if isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            yield from _flat_leaves(item, path + (i,))
    elif isinstance(obj, dict):
        for k, item in obj.items():
            yield from _flat_leaves(item, path + (k,))
    else:
        yield path, obj


def _path_name(path: tuple) -> str:
    head = f"arg {path[1]}" if path[0] == 0 else f"kwarg {path[1]}"
    return head + "".join(f"[{p!r}]" for p in path[2:])


def _is_module(obj) -> bool:
    from graphc.nn.module import Module

    return isinstance(obj, Module)


_NO_GRADS = ("compiled callables do not return gradients yet (that comes with "
             "derive_backward). Call it under `with graphc.no_grad():` (inference), or set "
             "requires_grad=False / model.eval() with no_grad, or keep this part in eager mode.")


def _refuse_gradients(name: str, modules, args: tuple, kwargs: dict) -> None:
    if not is_grad_enabled():
        return
    needs = [f"argument {_path_name(path)}"
             for path, t in _flatten((args, kwargs)) if t.requires_grad]
    needs += [f"parameter {prefix + '.' if prefix else ''}{n}" for prefix, m in modules
              for n, p in m.named_parameters() if p.requires_grad]
    if needs:
        raise GraphcError(f"graphc.compile({name}): {needs[0]} requires grad, and {_NO_GRADS}")


def _refuse_grad_outputs(name: str, traced: TraceResult) -> None:
    """After the trace: an output with history (from a captured tensor that requires grad, or
    one made inside) would have gradients on this call and none on the replays."""
    if not is_grad_enabled():
        return
    for path, t in _flatten(traced.result):
        if t.requires_grad:
            where = "".join(f"[{p!r}]" for p in path) or ""
            raise GraphcError(
                f"graphc.compile({name}): output{where} requires grad (it depends on a tensor "
                f"that requires grad, e.g. a captured one), and {_NO_GRADS}"
            )


_dump_counts: dict[str, int] = {}


def _dump(graph) -> None:
    """With GRAPHC_DUMP=<dir>: write the traced graph to <dir>/<name>.<n>.traced.gir, where n
    counts the graphs of that name traced in this process (so none overwrites another)."""
    directory = config.dump_dir()
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    index = _dump_counts[graph.name] = _dump_counts.get(graph.name, 0) + 1
    path = os.path.join(directory, f"{graph.name}.{index}.traced.gir")
    with open(path, "w") as f:
        f.write(format_graph(graph) + "\n")


def compile(fn: Callable | None = None, *, backend: str = "interp",  # noqa: A001
            recompile_limit: int | None = None):
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
        return functools.partial(compile, backend=backend, recompile_limit=recompile_limit)
    return Compiled(fn, backend, recompile_limit)


__all__ = ["Compiled", "RecompileLimitError", "compile", "reachable_state", "signature_of"]
