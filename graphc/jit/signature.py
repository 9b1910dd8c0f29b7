"""The signature of a compiled call: what `graphc.compile` keys its executables by.

A compiled callable (graphc.jit.compiler) keys its executables by a *signature* of the call
(`signature_of`, `reachable_state`): every tensor argument's shape, dtype and requires_grad,
every other argument's type and value (objects by identity), grad mode, the identity and type
of tensors the function captures (closure cells, globals, attributes of its `self`), the state
of the modules it can reach (training flags, plain attributes such as `p` or `eps`, parameter
and buffer identity and types, hook ids), of the optimizers it can reach (hyperparameters,
parameters, and per parameter the state keys and state tensors' identity and type: state made
lazily by a first step means a new graph), and whether each `.grad` it may touch is None (else
its type). A new signature traces again; `diff_signatures` names the fields that changed (the
recompile reasons). `aliasing` records which of the call's tensors share storage, so a graph traced
with `f(x, x)` (one input) never runs for `f(x, y)`.

Dynamic dimensions: an entry traced with symbolic sizes leaves them out of its signature
(`mask_signature`, `mask_call`) and checks them with a `ShapeGuard` instead. The cheap
checks a call runs first, which imply its signature is unchanged, are graphc.jit.guards'.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.autograd.grad_mode import is_grad_enabled
from graphc.jit.bindings import TensorBinding, TraceResult
from graphc.jit.pytree import LITERALS, flatten
from graphc.jit.reach import grad_holders, optimizer_params, reachable
from graphc.tensor import Tensor


# ---- the signature of a call -----------------------------------------------------------------
def _tensor_key(t: Tensor, identity: bool) -> tuple:
    key = ("tensor", t._data.shape, t._dtype.name, t._requires_grad)  # t.shape is _data's
    return key + (id(t),) if identity else key


def describe(value) -> Any:
    """A comparable description of an argument: a tensor's type, a Python value with its type
    (1, 1.0 and True trace differently), an object's identity."""
    if isinstance(value, Tensor):
        return _tensor_key(value, identity=False)
    if isinstance(value, float):
        return ("py", "float", repr(value))  # repr: nan equals nan, -0.0 differs from 0.0
    if isinstance(value, (bool, int, str, type(None), np.generic)):
        return ("py", type(value).__name__, repr(value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__,) + tuple(describe(v) for v in value)
    if isinstance(value, dict):
        return ("dict",) + tuple((k, describe(v)) for k, v in value.items())
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
            state.update(_class_state(type(m)))
            hooks = (m._forward_pre_hooks, m._forward_hooks, m._backward_hooks,
                     getattr(m, "_backward_pre_hooks", {}))
            state[f"{key} hooks"] = tuple(tuple(h.keys()) for h in hooks)
            for attr, v in vars(m).items():
                if attr.startswith("_") or attr == "training":
                    continue
                if isinstance(v, LITERALS):
                    state[f"{key}.{attr}"] = describe(v)
                elif isinstance(v, Tensor):
                    state[f"{key}.{attr}"] = _tensor_key(v, identity=True)
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            state[".".join(p for p in (prefix, name) if p)] = _tensor_key(t, identity=True)
    return state


def user_classes(cls: type) -> list[type]:
    """The classes of a module's MRO whose attributes a trace may read: all but
    graphc.nn.Module and object."""
    from graphc.nn.module import Module

    return [k for k in cls.__mro__ if k is not Module and k is not object]


def _class_state(cls: type) -> dict[str, Any]:
    """Class attributes of a module's classes: literals by value, anything else (methods,
    `forward`) by identity; a class attribute changed or a method replaced retraces."""
    state: dict[str, Any] = {}
    for klass in user_classes(cls):
        label = f"class {klass.__module__}.{klass.__qualname__}"
        for attr, v in vars(klass).items():
            if attr.startswith("__") and attr != "__call__":
                continue
            state[f"{label}.{attr}"] = describe(v) if isinstance(v, LITERALS) else \
                ("object", type(v).__qualname__, id(v))
    return state


def reachable_state(fn, args: tuple = (), kwargs: dict | None = None):
    """(modules, captured) the call can reach (see `graphc.jit.reach.reachable`): the Modules,
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
        if isinstance(obj, LITERALS):
            captured[name] = describe(obj)
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
                fields[f"{name}.param_groups[{g}][{key!r}]"] = describe(value)
    for label, p in optimizer_params(opt):
        label = param_names.get(id(p), label)
        fields[f"{name}.params[{label}]"] = _tensor_key(p, identity=True)
        for key, value in opt.state.get(p, {}).items():
            fields[f"{name}.state[{label}].{key}"] = _tensor_key(value, identity=True) \
                if isinstance(value, Tensor) else describe(value)
    return fields


def signature_of(fn, modules, args: tuple, kwargs: dict, captured=None) -> dict[str, Any]:
    """The guard fields of one call (see the module docstring)."""
    sig: dict[str, Any] = {"grad mode": is_grad_enabled()}
    for i, a in enumerate(args):
        sig[f"arg {i}"] = describe(a)
    for k, v in kwargs.items():
        sig[f"kwarg {k}"] = describe(v)
    sig.update(_module_state(modules))
    for name, description in (captured or {}).items():
        sig[f"captured {name}"] = description
    return sig


def aliasing(traced: TraceResult, args: tuple, kwargs: dict) -> tuple:
    """For each tensor of the call and each captured tensor, the first one with its storage:
    a graph traced with `f(x, x)` (one input) must not run for `f(x, y)`."""
    flat = [t for _, t in flatten((args, kwargs))]
    flat += [b.tensor for b in traced.bindings if isinstance(b, TensorBinding)]
    first: dict[int, int] = {}
    return tuple(first.setdefault(id(t._data), i) for i, t in enumerate(flat))



def diff_signatures(old: dict, new: dict) -> list[str]:
    rows = []
    for key in dict.fromkeys(list(old) + list(new)):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if a == b:
            continue
        if is_tensor_key(a) and is_tensor_key(b):
            for label, x, y in (("shape", a[1], b[1]), ("dtype", a[2], b[2]),
                                ("requires_grad", a[3], b[3])):
                if x != y:
                    rows.append(f"{key} {label} {_fmt(x)} -> {_fmt(y)}")
            if len(a) > 4 and a[4] != b[4]:
                rows.append(f"{key} replaced by another tensor")
        else:
            rows.append(f"{key}: {_fmt(a)} -> {_fmt(b)}")
    return rows


def is_tensor_key(x) -> bool:
    return isinstance(x, tuple) and x[:1] == ("tensor",)


def _fmt(x) -> str:
    if isinstance(x, tuple) and x[:1] == ("py",):
        return x[2]
    if isinstance(x, tuple) and x[:1] == ("object",):
        return f"<{x[1]} object at {x[2]:#x}>"
    if is_tensor_key(x):
        return f"tensor{_fmt(x[1])} {x[2]}"
    if isinstance(x, tuple) and x and all(isinstance(i, int) or i == "*" for i in x):
        return "(" + ",".join(str(i) for i in x) + ")"  # '*': a dynamic dimension
    if isinstance(x, tuple) and x[:1] in (("tuple",), ("list",), ("dict",)):
        return x[0] + "(" + ", ".join(_fmt(i) for i in x[1:]) + ")"
    return repr(x)


# ---- dynamic dimensions ----------------------------------------------------------------------
def _signature_key(path: tuple) -> str:
    return f"arg {path[1]}" if path[0] == 0 else f"kwarg {path[1]}"


def _mask(desc, rest: tuple, dim: int):
    """`desc` (an argument's description) with the size of `dim` of the tensor at `rest`
    replaced by '*'."""
    if not rest:
        if is_tensor_key(desc) and dim < len(desc[1]):
            shape = list(desc[1])
            shape[dim] = "*"
            return (desc[0], tuple(shape)) + desc[2:]
        return desc
    head, tail = rest[0], rest[1:]
    if isinstance(desc, tuple) and desc[:1] == ("dict",):
        return ("dict",) + tuple((k, _mask(d, tail, dim) if k == head else d)
                                 for k, d in desc[1:])
    if isinstance(desc, tuple) and isinstance(head, int) and 1 + head < len(desc):
        return desc[:1 + head] + (_mask(desc[1 + head], tail, dim),) + desc[2 + head:]
    return desc


def mask_signature(sig: dict, dynamic: frozenset) -> dict:
    """The signature with each dynamic dimension ((argument path, dim) pairs) left out: an
    entry traced with symbolic sizes serves every size its shape guard admits."""
    if not dynamic:
        return sig
    sig = dict(sig)
    for path, dim in dynamic:
        key = _signature_key(path)
        if key in sig:
            sig[key] = _mask(sig[key], path[2:], dim)
    return sig


def mask_call(call: tuple, dynamic: frozenset) -> tuple:
    """`describe_call`'s result with the dynamic dimensions left out."""
    if not dynamic:
        return call
    args, kwargs = list(call[0]), list(call[1])
    for path, dim in dynamic:
        if path[0] == 0 and path[1] < len(args):
            args[path[1]] = _mask(args[path[1]], path[2:], dim)
        elif path[0] == 1:
            kwargs = [(k, _mask(d, path[2:], dim) if k == path[1] else d) for k, d in kwargs]
    return tuple(args), tuple(kwargs)


def describe_call(args: tuple, kwargs: dict) -> tuple:
    return tuple(map(describe, args)), tuple((k, describe(v)) for k, v in kwargs.items())


def dim_label(path: tuple, dim: int, names: list[str] | None = None) -> str:
    """`x.size(0)` for the tensor argument at `path` (named after the parameter when known)."""
    if path[0] == 0:
        base = names[path[1]] if names and path[1] < len(names) else f"args[{path[1]}]"
    else:
        base = str(path[1])
    return base + "".join(f"[{p!r}]" for p in path[2:]) + f".size({dim})"


class ShapeGuard:
    """What a symbolic entry assumed about the sizes of its arguments: for each symbol, the
    argument dimensions it was traced from (`sources`: one symbol may stand for several equal
    dims), and the relations its shape rules needed (`relations`, graphc.symbolic). A call fits
    when every symbol gets one size >= 2 and every relation holds for those sizes."""

    __slots__ = ("sources", "relations", "labels", "dim_labels")

    def __init__(self, symbols: list[tuple[tuple, int, str]], relations: list,
                 labels: dict[str, str]) -> None:
        self.sources = [(path, dim, name) for path, dim, name in symbols]
        self.relations = relations
        self.labels = labels  # symbol -> the argument dimension it came from, for messages
        self.dim_labels: dict[tuple, str] = {}  # (path, dim) -> its label, where known

    def values(self, args: tuple, kwargs: dict) -> dict[str, int] | None:
        from graphc.jit.pytree import at
        from graphc.symbolic import MIN_SIZE

        values: dict[str, int] = {}
        tree = (args, kwargs)
        for path, dim, name in self.sources:
            t = args[path[1]] if len(path) == 2 and path[0] == 0 else at(tree, path)
            n = t._data.shape[dim]
            if n < MIN_SIZE or values.setdefault(name, n) != n:
                return None
        return values

    def holds(self, args: tuple, kwargs: dict) -> bool:
        from graphc.symbolic import relation_holds

        try:
            values = self.values(args, kwargs)
        except (IndexError, KeyError, TypeError, AttributeError):
            return False
        return values is not None and all(relation_holds(e, op, values)
                                          for e, op in self.relations)

    def failures(self, args: tuple, kwargs: dict) -> list[str]:
        """Why this call's sizes do not fit (the recompile reasons)."""
        from graphc.jit.pytree import at
        from graphc.symbolic import MIN_SIZE, check_relations

        out, values, first = [], {}, {}
        tree = (args, kwargs)
        for path, dim, name in self.sources:
            label = self.dim_labels.get((path, dim), self.labels.get(name, name))
            try:
                n = at(tree, path)._data.shape[dim]
            except (IndexError, KeyError, TypeError, AttributeError):
                return [f"{label} is gone"]
            if n < MIN_SIZE:
                out.append(f"{label} is {n}: sizes 0 and 1 are specialised, the graph has "
                           f"the symbol {name} (>= 2) there")
                continue
            first.setdefault(name, label)
            if values.setdefault(name, n) != n:
                out.append(f"{first[name]} and {label} were equal at the trace (both the "
                           f"symbol {name}), now {values[name]} and {n}")
        if not out:
            sizes = ", ".join(f"{k}={v} ({self.labels.get(k, k)})"
                              for k, v in sorted(values.items()))
            out = [f"the guard {g} fails for {sizes}"
                   for g in check_relations(self.relations, values)]
        return out


def _is_module(obj) -> bool:
    from graphc.nn.module import Module

    return isinstance(obj, Module)

__all__ = ["ShapeGuard", "aliasing", "describe", "describe_call", "diff_signatures",
           "dim_label", "is_tensor_key", "mask_call", "mask_signature", "reachable_state",
           "signature_of", "user_classes"]
