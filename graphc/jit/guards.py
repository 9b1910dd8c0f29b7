"""The guards of `graphc.compile`: the signature of a call, and the fast path's cheap checks.

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

The fast path: computing the full signature walks every reachable module, optimizer and `.grad`
(hundreds of microseconds for an MLP), so each entry also keeps a `Guard`, built from the same
state at the same moment as a signature it equals (at the trace, and again whenever the full
signature picks the entry): cheap checks, run first on every call, that together imply the full
signature is unchanged. They are compiled into one Python function per guard (`compile_checks`,
its text in `Guard.source`): each kind of check is one expression over all its objects, so a
call runs a few C loops, not a Python loop per object. By identity, everything the signature
reads through: the function's `__code__`/`__closure__`/`__globals__` and its closure cells and
named globals, the keys and items of every container `graphc.jit.reach.reachable` looks into,
each module's `__dict__` (keys in order, every value: training flag, parameter/buffer/child
tables, hook dicts, public attributes) and its tables and hook dicts, each optimizer's
param_groups (every hyperparameter object), params and per-parameter state dicts; Python
literals are immutable, so identity implies the same value. By type: every guarded tensor
(shape, dtype, requires_grad, is_leaf) and every `.grad` the signature describes (None, or
shape, dtype, requires_grad), the arguments (their full description, as in the signature), grad
mode, and which argument tensors are `.grad` holders. A check may fail where the signature
would be equal (a hyperparameter set again to an equal new float): the full signature then
decides, and refreshes the entry's guard. A guard never holds where the signature differs; the
one assumption is that no guarded object changes its `__class__`. An entry whose signature
equals a newer entry's (traced again because it was stale) is never taken by the fast path, so
both paths pick the same entry. A guard holds the objects it checks, so no id it compares is
reused while it lives. The stale checks and the storage-sharing check run on every call, fast
path or not, except the misfit check of an entry whose guard already checks every captured
tensor's type and recorded the graph's (`Guard.implies_types`); retrace decisions and the
recompile reasons are the full signature's.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import numpy as np

from graphc.autograd.grad_mode import is_grad_enabled
from graphc.jit.bindings import GradBinding, TensorBinding, TraceResult
from graphc.jit.pytree import LITERALS, flatten
from graphc.jit.reach import (
    ABSENT,
    Reads,
    cell_contents,
    grad_holders,
    optimizer_params,
    reachable,
)
from graphc.tensor import Tensor
from graphc.types import as_dtype


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
            state.update(_class_state(type(m)))
            hooks = (m._forward_pre_hooks, m._forward_hooks, m._backward_hooks,
                     getattr(m, "_backward_pre_hooks", {}))
            state[f"{key} hooks"] = tuple(tuple(h.keys()) for h in hooks)
            for attr, v in vars(m).items():
                if attr.startswith("_") or attr == "training":
                    continue
                if isinstance(v, LITERALS):
                    state[f"{key}.{attr}"] = _describe(v)
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
            state[f"{label}.{attr}"] = _describe(v) if isinstance(v, LITERALS) else \
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
        if _is_tensor_key(desc) and dim < len(desc[1]):
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


def _mask_call(call: tuple, dynamic: frozenset) -> tuple:
    """`_describe_call`'s result with the dynamic dimensions left out."""
    if not dynamic:
        return call
    args, kwargs = list(call[0]), list(call[1])
    for path, dim in dynamic:
        if path[0] == 0 and path[1] < len(args):
            args[path[1]] = _mask(args[path[1]], path[2:], dim)
        elif path[0] == 1:
            kwargs = [(k, _mask(d, path[2:], dim) if k == path[1] else d) for k, d in kwargs]
    return tuple(args), tuple(kwargs)


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


# ---- the fast guard --------------------------------------------------------------------------
class Guard:
    """Cheap checks that, when they all hold, imply the call's full signature equals the one
    computed at the same moment as the guard was built (see "The fast path" in the module
    docstring). They may fail where the signature is equal (then the full signature decides);
    they never hold where it differs."""

    __slots__ = ("grad_mode", "call", "attrs", "cells", "lookups", "empty",
                 "dicts", "seqs", "big", "tensors", "grads", "holder_ids", "arg_holders",
                 "dynamic", "top_dims", "_implied", "_checks")

    def __init__(self, fn, args: tuple, kwargs: dict) -> None:
        self.grad_mode = is_grad_enabled()
        self.call = _describe_call(args, kwargs)
        self.attrs: list = []  # (object, attribute, value or ABSENT): getattr is value
        self.cells: list = []  # (closure cell, contents or ABSENT)
        self.lookups: list = []  # (dict, keys, values or ABSENT): d.get(key) is value
        self.empty: list = []  # containers that are empty
        self.dicts: list = []  # (dict, keys in order, values): same keys, same objects
        self.seqs: list = []  # (list or tuple, items): same length, same objects
        self.big: list = []  # containers reachable() does not look into (more than 64 items)
        self.tensors: list = []  # (tensor, shape, dtype, requires_grad, is_leaf)
        self.grads: list = []  # (holder, None or (shape, dtype, requires_grad) of its .grad)
        self.dynamic: frozenset = frozenset()  # argument dims a symbolic entry leaves free
        self.top_dims: dict | None = None  # {positional index: dims} when all are top-level
        self._implied: tuple | None = None  # (typed list, answer) of `implies_types`
        _GuardBuilder(self).build(fn, args, kwargs)
        self._checks = None  # compile_checks', made by the first `holds` (set_dynamic may
        # change what they check, and a guard built on the slow path may never be tried)

    def set_dynamic(self, dynamic: frozenset) -> None:
        """Leave these argument dimensions ((path, dim) pairs) out of the call's description:
        the entry's ShapeGuard checks them."""
        self.dynamic = frozenset(dynamic)
        self.call = _mask_call(self.call, self.dynamic)
        top: dict[int, set[int]] = {}
        for path, dim in self.dynamic:
            if len(path) != 2 or path[0] != 0:
                top = None
                break
            top.setdefault(path[1], set()).add(dim)
        self.top_dims = top
        self._checks = None

    def implies_types(self, typed: list) -> bool:
        """Whether this guard holding implies that every binding of `typed` (an entry's
        (binding, graph value, shape, dtype) list: captured tensors and `.grad`s of captured
        holders) still has its graph value's shape and dtype, so the entry's per-call misfit
        check can be skipped: true when the guard checks each such tensor's (or `.grad`'s)
        shape and dtype and recorded exactly the graph's. Answered once per list."""
        if self._implied is None or self._implied[0] is not typed:
            tensors = {id(t): (shape, dtype) for t, shape, dtype, _, _ in self.tensors}
            grads = {id(t): key and key[:2] for t, key in self.grads}
            recorded = []
            for b, *_ in typed:
                if isinstance(b, TensorBinding):
                    recorded.append(tensors.get(id(b.tensor)))
                elif isinstance(b, GradBinding) and b.path is None:  # a captured holder's
                    recorded.append(grads.get(id(b.holder)))
                else:
                    recorded.append(None)
            answer = all(r is not None and r[0] == tuple(shape) and r[1] is dtype
                         for r, (_, _, shape, dtype) in zip(recorded, typed))
            self._implied = (typed, answer)
        return self._implied[1]

    def holds(self, args: tuple, kwargs: dict) -> bool:
        checks = self._checks
        if checks is None:
            checks = self._checks = compile_checks(self)
        try:
            return checks(args, kwargs)
        except (AttributeError, KeyError, TypeError, ValueError):  # let the signature say
            return False

    @property
    def source(self) -> str:
        """The Python source of this guard's checks (`compile_checks`), for reading."""
        if self._checks is None:
            self._checks = compile_checks(self)
        return self._checks.__doc__


def compile_checks(g: Guard):
    """One Python function that runs every check of `g` (`Guard.holds`), specialised to it:
    the objects it compares are the function's globals, and each kind of check is one
    expression over all its objects, so a call costs no Python loop per object, and a
    container's values are gathered by star-unpacking (`(*d0.values(), *s1)`), the fastest
    way Python has to read them. The checks, in order:

    - grad mode, then the call: where it is positional and no dimension is dynamic, each
      tensor argument's array shape, dtype and requires_grad, and each other argument's
      description; else the description of the whole call (`_describe_call`, masked);
    - attributes: getattr(object, name) is value, all in one map (an AttributeError fails
      the guard), or getattr(object, name, ABSENT) where it was absent; closure cells; dict
      lookups (`d.get(key, ABSENT) is value`);
    - containers: the empty ones still are (one map of len); the dicts' keys in order (==,
      as a dict compares keys), then every dict value and sequence item (is), each
      container's followed by a separator (so the tuples are equal only where every
      container has its length);
      containers too big to be looked into still are (len > 64);
    - tensors: (array shape, dtype, requires_grad, grad_fn) per leaf (grad_fn None) in one
      tuple; the rare guarded interior tensor (grad_fn not None) on its own line;
    - `.grad`s: (array shape, dtype, requires_grad) per holder that had one, in one tuple (a
      `.grad` gone raises AttributeError), None per holder that had none; and which argument
      tensors hold a `.grad` (`_arg_holders`) where an argument requires grad.
    The function's `__doc__` is its source (`Guard.source`)."""
    names: dict[str, Any] = {"ABSENT": ABSENT, "Tensor": Tensor, "is_": operator.is_,
                             "is_grad_enabled": is_grad_enabled, "cell_contents": cell_contents,
                             "repeat": itertools.repeat, "describe": _describe,
                             "LEAF_TYPE": _LEAF_TYPE, "GRAD_TYPE": _GRAD_TYPE,
                             "GRAD": operator.attrgetter("_grad"),
                             "arg_holders": _arg_holders, "GRAD_MODE": g.grad_mode,
                             "END": _END}

    def name(prefix: str, value) -> str:
        key = f"{prefix}{len(names)}"
        names[key] = value
        return key

    lines = ["if is_grad_enabled() is not GRAD_MODE:", "    return False"]
    args, kwargs = g.call
    if g.dynamic or kwargs:
        lines += [f"if not {name('call', _CallDescription(g))}(args, kwargs):",
                  "    return False"]
    else:
        lines += [f"if len(args) != {len(args)} or kwargs:", "    return False"]
        for i, d in enumerate(args):
            if _is_tensor_key(d):
                lines.append(f"a = args[{i}]")
                lines.append(f"if not (isinstance(a, Tensor) and a._array.shape == "
                             f"{name('shape', d[1])} and a._dtype is "
                             f"{name('dtype', as_dtype(d[2]))} and a._requires_grad is "
                             f"{d[3]!r}):")
            else:
                lines.append(f"if describe(args[{i}]) != {name('described', d)}:")
            lines.append("    return False")
    present = [(obj, attr, value) for obj, attr, value in g.attrs if value is not ABSENT]
    checks = []
    if present:  # getattr without a default: an attribute that went away raises, and fails
        checks.append(
            f"all(map(is_, map(getattr, {name('objects', tuple(o for o, _, _ in present))}, "
            f"{name('names', tuple(a for _, a, _ in present))}), "
            f"{name('values', tuple(v for _, _, v in present))}))")
    checks += [f"getattr({name('o', obj)}, {attr!r}, ABSENT) is ABSENT"
               for obj, attr, value in g.attrs if value is ABSENT]
    checks += [f"cell_contents({name('cell', cell)}) is {name('v', value)}"
               for cell, value in g.cells]
    checks += [f"all(map(is_, map({name('d', d)}.get, {name('keys', keys)}, repeat(ABSENT)), "
               f"{name('values', values)}))" for d, keys, values in g.lookups if keys]
    # a separator after each container's keys (dicts) or items (sequences): equal tuples
    # then mean equal lengths, container by container, with no lengths compared
    dicts = [name("d", d) for d, _, _ in g.dicts]
    seqs = [name("s", seq) for seq, _ in g.seqs]
    if g.empty:
        checks.append(f"not any(map(len, {name('empty', tuple(g.empty))}))")
    if dicts:
        keys = tuple(itertools.chain.from_iterable(keys + (_END,) for _, keys, _ in g.dicts))
        checks.append(f"({''.join(f'*{d}, END, ' for d in dicts)}) == {name('keys', keys)}")
    if dicts or seqs:
        items = tuple(itertools.chain(
            itertools.chain.from_iterable(values for _, _, values in g.dicts),
            itertools.chain.from_iterable(items + (_END,) for _, items in g.seqs)))
        gathered = "".join([f"*{d}.values(), " for d in dicts] + [f"*{q}, END, " for q in seqs])
        checks.append(f"all(map(is_, ({gathered}), {name('items', items)}))")
    checks += [f"len({name('big', c)}) > 64" for c in g.big]
    leaves = [(t, (shape, dtype, requires_grad, None))
              for t, shape, dtype, requires_grad, leaf in g.tensors if leaf]
    if leaves:
        checks.append(f"tuple(map(LEAF_TYPE, {name('leaves', tuple(t for t, _ in leaves))})) "
                      f"== {name('types', tuple(k for _, k in leaves))}")
    for t, shape, dtype, requires_grad, leaf in g.tensors:
        if not leaf:
            checks.append(f"LEAF_TYPE({name('t', t)})[:3] == "
                          f"{name('type', (shape, dtype, requires_grad))} "
                          f"and {name('t', t)}.grad_fn is not None")
    with_grad = [(t, key) for t, key in g.grads if key is not None]
    if with_grad:  # a `.grad` that went away raises AttributeError, and fails
        checks.append(f"tuple(map(GRAD_TYPE, {name('holders', tuple(t for t, _ in with_grad))})) "
                      f"== {name('grads', tuple(key for _, key in with_grad))}")
    no_grad = tuple(t for t, key in g.grads if key is None)
    if no_grad:
        checks.append(f"all(map(is_, map(GRAD, {name('holders', no_grad)}), repeat(None)))")
    if g.arg_holders is not None:
        checks.append(f"arg_holders(args, kwargs, {name('ids', g.holder_ids)}) == "
                      f"{name('holding', g.arg_holders)}")
    lines.append("return (" + "\n        and ".join(checks or ["True"]) + ")")
    source = "def checks(args, kwargs):\n" + "".join(f"    {line}\n" for line in lines)
    exec(compile(source, "<graphc guard>", "exec"), names)  # noqa: S102 (our own text)
    checks_fn = names["checks"]
    checks_fn.__doc__ = source
    return checks_fn


class _CallDescription:
    """The call check of a guard whose call has kwargs or dynamic dimensions: the whole
    call's description, its dynamic dimensions masked."""

    __slots__ = ("call", "dynamic", "top_dims")

    def __init__(self, g: Guard) -> None:
        self.call, self.dynamic, self.top_dims = g.call, g.dynamic, g.top_dims

    def __call__(self, args: tuple, kwargs: dict) -> bool:
        if self.top_dims is not None and self.dynamic:
            return _describe_masked(args, kwargs, self.top_dims) == self.call
        return _mask_call(_describe_call(args, kwargs), self.dynamic) == self.call


_END = object()  # the separator after each container's keys or items (`compile_checks`)
_LEAF_TYPE = operator.attrgetter("_array.shape", "_dtype", "_requires_grad", "grad_fn")
# a holder's `.grad` as `Guard.grads` records it (`_grad_type`), read from the holder
_GRAD_TYPE = operator.attrgetter("_grad._array.shape", "_grad._dtype", "_grad._requires_grad")


def _describe_masked(args: tuple, kwargs: dict, top_dims: dict) -> tuple:
    """`_mask_call(_describe_call(...))` where every dynamic dim is of a positional tensor
    argument: those tensors are described with their dims masked directly (the fast path)."""
    described = []
    for i, a in enumerate(args):
        dims = top_dims.get(i)
        if dims is not None and isinstance(a, Tensor):
            shape = a._data.shape
            described.append(("tensor", tuple("*" if d in dims and d < len(shape) else n
                                              for d, n in enumerate(shape)),
                              a._dtype.name, a._requires_grad))
        else:
            described.append(_describe(a))
    return tuple(described), tuple((k, _describe(v)) for k, v in kwargs.items())


def _describe_call(args: tuple, kwargs: dict) -> tuple:
    return tuple(map(_describe, args)), tuple((k, _describe(v)) for k, v in kwargs.items())


def _grad_type(g):
    return None if g is None else (g._data.shape, g._dtype, g._requires_grad)


def _arg_holders(args: tuple, kwargs: dict, captured_ids: frozenset) -> tuple:
    """The argument tensors whose `.grad` the signature describes (`grad_holders`): for each,
    once, its path, its `.grad`'s type, and whether it is also a captured holder (which then
    goes undescribed under its own name)."""
    seen: set[int] = set()
    out = []
    for path, t in flatten((args, kwargs)):
        if t._requires_grad and t.grad_fn is None and id(t) not in seen:
            seen.add(id(t))
            out.append((path, _grad_type(t._grad), id(t) in captured_ids))
    return tuple(out)


class _GuardBuilder(Reads):
    """Fills a Guard by walking what `reachable_state` walks: `graphc.jit.reach.reachable`
    (told every read, as a `Reads`), the modules' `_module_state`, the optimizers'
    `_optimizer_state` and the `grad_holders`. It records every container it reads, so a
    change to any of them fails the guard."""

    def __init__(self, guard: Guard) -> None:
        self.g = guard
        self.modules_seen: set[int] = set()
        self.classes_seen: set[int] = set()
        self.tensors_seen: dict[int, Tensor] = {}

    def build(self, fn, args: tuple, kwargs: dict) -> None:
        from graphc.nn.module import Module
        from graphc.optim.optimizer import Optimizer

        found = [obj for _, obj in reachable(fn, args, kwargs, reads=self)]
        holders: list[Tensor] = []
        for obj in found:
            if isinstance(obj, Module):
                holders += self._module(obj)
        for obj in found:
            if isinstance(obj, Optimizer):
                holders += self._optimizer(obj)
            elif isinstance(obj, Tensor):
                self._tensor(obj)
                if obj.requires_grad and obj.is_leaf:
                    holders.append(obj)
        unique = {id(t): t for t in holders}
        self.g.grads = [(t, _grad_type(t._grad)) for t in unique.values()]
        self.g.holder_ids = frozenset(unique)
        needs_grad = any(t.requires_grad for _, t in flatten((args, kwargs)))
        self.g.arg_holders = _arg_holders(args, kwargs, self.g.holder_ids) if needs_grad \
            else None  # none requires grad: the arguments' description says so for the call

    # ---- the walk's reads (graphc.jit.reach.Reads) -----------------------------------------
    def attr(self, obj, name: str, value) -> None:
        self.g.attrs.append((obj, name, value))

    def cell(self, cell, value) -> None:
        self.g.cells.append((cell, value))

    def lookup(self, d: dict, keys: tuple, values: tuple) -> None:
        self.g.lookups.append((d, keys, values))

    def mapping(self, d: dict) -> None:
        if d:
            self.g.dicts.append((d, tuple(d), tuple(d.values())))
        else:
            self.g.empty.append(d)

    def sequence(self, seq) -> None:
        self.g.seqs.append((seq, tuple(seq)))

    def big(self, container) -> None:
        self.g.big.append(container)

    # ---- the state the signature describes ---------------------------------------------------
    def _tensor(self, t: Tensor) -> None:
        if id(t) not in self.tensors_seen:  # a module's parameter is an optimizer's too
            self.tensors_seen[id(t)] = t
            self.g.tensors.append((t, t._data.shape, t._dtype, t._requires_grad,
                                   t.grad_fn is None))

    def _module(self, module) -> list[Tensor]:
        """Guard `_module_state` of `module` and every module below it; returns its
        parameters (they hold `.grad`s)."""
        if id(module) in self.modules_seen:
            return []
        self.modules_seen.add(id(module))
        g = self.g
        d = vars(module)
        g.attrs.append((module, "__dict__", d))
        self.mapping(d)  # its keys in order, every value by identity
        for key, value in d.items():
            if isinstance(value, Tensor) and not key.startswith("_"):
                self._tensor(value)
        for name in _HOOK_DICTS:
            hooks = d[name] if name in d else getattr(module, name, ABSENT)
            if name not in d:
                g.attrs.append((module, name, hooks))
            if isinstance(hooks, dict):
                self.mapping(hooks)
        self._classes(type(module))
        params = module._parameters
        for table in (params, module._buffers, module._modules):
            self.mapping(table)
        for t in list(params.values()) + list(module._buffers.values()):
            if t is not None:
                self._tensor(t)
        params = [p for p in params.values() if p is not None]
        for child in module._modules.values():
            if child is not None:
                params += self._module(child)
        return params

    def _classes(self, cls: type) -> None:
        """Guard every class attribute a module's methods can read (numbers, strings, the
        methods themselves, `forward` included): each class dict of its MRO below
        graphc.nn.Module, once per class. Assigning `Model.scale = 5.0` or replacing
        `Model.forward` then retraces, as Dynamo's guards do."""
        for klass in user_classes(cls):
            if id(klass) not in self.classes_seen:
                self.classes_seen.add(id(klass))
                self.mapping(vars(klass))

    def _optimizer(self, opt) -> list[Tensor]:
        """Guard `_optimizer_state`; returns the optimizer's parameters."""
        g = self.g
        groups, state = opt.param_groups, opt.state
        g.attrs += [(opt, "param_groups", groups), (opt, "state", state)]
        g.seqs.append((groups, tuple(groups)))
        params = []
        for group in groups:
            self.mapping(group)
            g.seqs.append((group["params"], tuple(group["params"])))
            params += group["params"]
        entries = tuple(state.get(p, ABSENT) for p in params)
        g.lookups.append((state, tuple(params), entries))
        for p, entry in zip(params, entries):
            self._tensor(p)
            if entry is not ABSENT:
                self.mapping(entry)
                for value in entry.values():
                    if isinstance(value, Tensor):
                        self._tensor(value)
        return params


_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")


def _is_module(obj) -> bool:
    from graphc.nn.module import Module

    return isinstance(obj, Module)


__all__ = ["Guard", "ShapeGuard", "aliasing", "diff_signatures", "dim_label", "mask_signature",
           "reachable_state", "signature_of"]
