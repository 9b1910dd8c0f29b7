"""`graphc.compile`: trace once per signature, then run the executable on every call.

A compiled callable keys its executables by a *signature* of the call: every tensor
argument's shape, dtype and requires_grad, every other argument's value, grad mode, and the
state of the modules it uses (training flags, parameter and buffer identity and types, hook
versions). A call whose signature has an executable runs it: arguments and captured tensors
(parameters, buffers, closure tensors) are bound by pointer, the graph runs, in-place updates
are written back. A new signature traces again (the tracing call runs eagerly and its result
is returned); with GRAPHC_LOG=recompiles each retrace logs which fields changed, and after
the recompile limit the call raises `RecompileLimitError` listing them. A stale executable is
never replayed: captured tensors are checked against the graph's types on every call.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from graphc import config
from graphc.autograd.grad_mode import is_grad_enabled
from graphc.backends import Executable, check_backend
from graphc.backends import compile as compile_graph
from graphc.errors import GraphcError
from graphc.ir.printer import format_graph
from graphc.tensor import Tensor
from graphc.tracing import (
    RngBinding,
    TensorBinding,
    TraceResult,
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


def _describe(value) -> Any:
    if isinstance(value, Tensor):
        return ("tensor", tuple(value.shape), value.dtype.name, value.requires_grad)
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_describe(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _describe(v)) for k, v in value.items())
    return (type(value).__qualname__, id(value))


def _field_text(key: str, value) -> str:
    if isinstance(value, tuple) and value[:1] == ("tensor",):
        shape = "(" + ",".join(str(s) for s in value[1]) + ")"
        return f"{key} shape {shape} dtype {value[2]} requires_grad {value[3]}"
    return f"{key} {value!r}"


def _module_state(modules: list[tuple[str, Any]]) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for prefix, module in modules:
        for name, m in module.named_modules():
            key = f"{prefix}.{name}".strip(".") or prefix or "module"
            state[f"{key} training"] = m.training
            hooks = (m._forward_pre_hooks, m._forward_hooks, m._backward_hooks,
                     getattr(m, "_backward_pre_hooks", {}))
            state[f"{key} hooks"] = tuple(tuple(h.keys()) for h in hooks)
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            key = f"{prefix}.{name}".strip(".")
            state[f"{key}"] = (id(t), tuple(t.shape), t.dtype.name, t.requires_grad)
    return state


def signature_of(fn, modules, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The guard fields of one call (see the module docstring)."""
    sig: dict[str, Any] = {"grad mode": is_grad_enabled()}
    for i, a in enumerate(args):
        sig[f"arg {i}"] = _describe(a)
    for k, v in kwargs.items():
        sig[f"kwarg {k}"] = _describe(v)
    sig.update(_module_state(modules))
    return sig


def _diff(old: dict, new: dict) -> list[str]:
    rows = []
    for key in dict.fromkeys(list(old) + list(new)):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if a != b:
            if isinstance(a, tuple) and a[:1] == ("tensor",) and isinstance(b, tuple) \
                    and b[:1] == ("tensor",):
                for label, x, y in (("shape", a[1], b[1]), ("dtype", a[2], b[2]),
                                    ("requires_grad", a[3], b[3])):
                    if x != y:
                        rows.append(f"{key} {label} {_fmt(x)} -> {_fmt(y)}")
            else:
                rows.append(f"{key}: {_fmt(a)} -> {_fmt(b)}")
    return rows


def _fmt(x) -> str:
    if isinstance(x, tuple) and all(isinstance(i, int) for i in x):
        return "(" + ",".join(str(i) for i in x) + ")"
    return repr(x)


class Compiled:
    """The callable graphc.compile returns (see the module docstring)."""

    def __init__(self, fn: Callable, backend: str, recompile_limit: int | None) -> None:
        check_backend(backend)
        self.fn = fn
        self.backend = backend
        self.recompile_limit = recompile_limit
        self._entries: list[_Entry] = []
        self._recompile_reasons: list[list[str]] = []
        self._modules = [(n, m) for n, m in captured_roots(fn) if _is_module(m)]
        functools.update_wrapper(self, fn, updated=())
        self.__name__ = graph_name(fn)

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

    # ---- calling -----------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        sig = signature_of(self.fn, self._modules, args, kwargs)
        for entry in reversed(self._entries):
            if entry.signature == sig and self._bindings_fit(entry):
                return self._run(entry, args, kwargs)
        return self._trace(sig, args, kwargs)

    def _limit(self) -> int:
        return self.recompile_limit if self.recompile_limit is not None \
            else config.recompile_limit()

    def _trace(self, sig: dict, args: tuple, kwargs: dict):
        if self._entries:
            reasons = _diff(self._entries[-1].signature, sig) or [
                "a captured tensor changed its shape or dtype"]
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
        _refuse_gradients(self.__name__, self._modules, args, kwargs)
        traced = trace_call(self.fn, args, kwargs)
        executable = compile_graph(traced.graph, self.backend)
        self._entries.append(_Entry(sig, traced, executable))
        _dump(traced.graph, len(self._entries))
        return traced.result

    def _bindings_fit(self, entry: _Entry) -> bool:
        """Captured tensors still have the types the graph was traced with."""
        for b, v in zip(entry.traced.bindings, entry.executable.graph.inputs):
            if isinstance(b, TensorBinding):
                t = b.tensor
                if tuple(t._data.shape) != v.type.shape or t.dtype is not v.type.dtype:
                    return False
        return True

    def _run(self, entry: _Entry, args: tuple, kwargs: dict):
        traced = entry.traced
        graph = entry.executable.graph
        arrays, bound = [], {}
        for b, v in zip(traced.bindings, graph.inputs):
            if isinstance(b, RngBinding):
                seed, offset = b.generator._take(b.counters)
                arrays.append(np.array([seed, offset], np.uint64).view(np.int64))
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
        wrapped = [Tensor._wrap(np.asarray(o)) for o in outputs]
        return unflatten(traced.out_spec, wrapped)


def _at(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def _is_module(obj) -> bool:
    from graphc.nn.module import Module

    return isinstance(obj, Module)


def _refuse_gradients(name: str, modules, args: tuple, kwargs: dict) -> None:
    if not is_grad_enabled():
        return
    needs = [f"argument {'.'.join(str(p) for p in path[1:])}"
             for path, t in _flatten((args, kwargs)) if t.requires_grad]
    needs += [f"parameter {prefix + '.' if prefix else ''}{n}" for prefix, m in modules
              for n, p in m.named_parameters() if p.requires_grad]
    if needs:
        raise GraphcError(
            f"graphc.compile({name}): {needs[0]} requires grad, and compiled callables do not "
            "return gradients yet (that comes with derive_backward). Call it under "
            "`with graphc.no_grad():` (inference), or set requires_grad=False / model.eval() "
            "with no_grad, or keep this part in eager mode."
        )


def _dump(graph, index: int) -> None:
    directory = config.dump_dir()
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
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


__all__ = ["Compiled", "RecompileLimitError", "compile", "signature_of"]
