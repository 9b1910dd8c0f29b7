"""What a call can reach: the one walker that both tracing and the guards use.

`captured_roots(fn)` lists what `fn` captures (itself if a Module, its bound `self`, its
default argument values, closure cells, the globals its code names; a `functools.partial`'s
bound arguments; a callable object itself); `reachable(fn, args, kwargs)` walks from there,
one level into plain objects (callable ones too), containers and helper functions, and finds
the Python literals, Modules, Tensors and Optimizers the call can read. Tracing names
captured state from it (`storage_names`) and finds the tensors whose `.grad` a step may touch
(`grad_holders`); `graphc.jit.signature` describes the same state as the call's signature.
State the walk missed would go unguarded and, made lazily in an abstract trace, stay
abstract: so every way a step can hold its model and optimizer is a root here.
"""

from __future__ import annotations

import dis
import functools
import itertools
import types
from typing import Any

from graphc.jit.pytree import LITERALS, flat_leaves, flatten, path_name
from graphc.tensor import Tensor

ABSENT = object()  # an attribute, global, cell or dict entry that is not there


class Reads:
    """What a walk reads, reported to a caller that must notice when any of it changes (the
    guards of graphc.compile record it). The walker calls one hook per read; this base class
    records nothing, which is what tracing needs."""

    def attr(self, obj, name: str, value) -> None:
        """`getattr(obj, name, ABSENT)` was `value`."""

    def cell(self, cell, value) -> None:
        """A closure cell held `value` (ABSENT when empty)."""

    def lookup(self, d: dict, keys: tuple, values: tuple) -> None:
        """`d.get(key, ABSENT)` was `value` for each key (a function's globals)."""

    def mapping(self, d: dict) -> None:
        """All keys (in order) and values of `d` were read."""

    def sequence(self, seq) -> None:
        """All items of a list or tuple were read."""

    def big(self, container) -> None:
        """A container with more than 64 items, which the walk does not look into."""


_NO_READS = Reads()


def cell_contents(cell):
    """A closure cell's contents, ABSENT for an empty cell."""
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return ABSENT


def captured_roots(fn, reads: Reads = _NO_READS) -> list[tuple[str, Any]]:
    """(name, object) for what `fn` can reach: itself if a Module, else its bound `self`, its
    default argument values (`def step(x, model=model)`, keyword-only ones too), its closure
    cells and the globals its code names. For a `functools.partial`: the arguments it binds
    and what its function reaches; for a compiled callable: what its function reaches; for an
    object of a class with a `__call__` (a Trainer): the object as `self`, and what `__call__`
    reaches. Used for names and for guards; `reads` is told everything read on the way."""
    from graphc.nn.module import Module

    if isinstance(fn, Module):
        return [("", fn)]
    if isinstance(fn, functools.partial):
        return _partial_roots(fn, reads)
    if _is_compiled(fn):  # called inside a trace, it runs `fn` inline
        reads.attr(fn, "fn", fn.fn)
        return captured_roots(fn.fn, reads)
    call = None if isinstance(fn, (types.FunctionType, types.MethodType)) else next(
        (vars(k)["__call__"] for k in type(fn).__mro__ if "__call__" in vars(k)), None)
    if isinstance(call, types.FunctionType):  # an object of a class with a __call__
        reads.attr(type(fn), "__call__", call)
        return [("self", fn)] + captured_roots(call, reads)
    target = getattr(fn, "__func__", fn)
    if isinstance(fn, types.FunctionType):  # __func__, __self__: only set in its __dict__
        reads.mapping(fn.__dict__)
        reads.attr(fn, "__code__", fn.__code__)  # the one writable one
    elif not isinstance(fn, types.MethodType):  # a method's attributes are read-only
        for attr in ("__func__", "__self__"):
            reads.attr(fn, attr, getattr(fn, attr, ABSENT))
    if target is not fn:
        for attr in ("__code__", "__closure__", "__globals__"):
            reads.attr(target, attr, getattr(target, attr, ABSENT))
    roots: list[tuple[str, Any]] = []
    owner = getattr(fn, "__self__", None)
    if owner is not None:
        roots.append(("self", owner))
    code = getattr(target, "__code__", None)
    if code is not None:
        roots += _default_roots(target, code, reads)
        closure = getattr(target, "__closure__", None) or ()
        for var, cell in zip(code.co_freevars, closure):
            value = cell_contents(cell)
            reads.cell(cell, value)
            if value is not ABSENT:
                roots.append((var, value))
        glb = getattr(target, "__globals__", {})
        names = global_names(code)
        values = tuple(glb.get(name, ABSENT) for name in names)
        reads.lookup(glb, names, values)
        roots += [(n, v) for n, v in zip(names, values) if v is not ABSENT]
    return roots


def _default_roots(target, code: types.CodeType, reads: Reads) -> list[tuple[str, Any]]:
    """(parameter name, default value) for each default of `target`: the state a step reaches
    through `def step(x, y, model=model, opt=opt)` is as much its own as a global's. Both
    attributes are writable (`__kwdefaults__` is a dict), so the guards read them."""
    defaults = getattr(target, "__defaults__", None)
    kwdefaults = getattr(target, "__kwdefaults__", None)
    reads.attr(target, "__defaults__", defaults)
    reads.attr(target, "__kwdefaults__", kwdefaults)
    roots: list[tuple[str, Any]] = []
    if defaults:
        positional = code.co_varnames[:code.co_argcount]
        roots += list(zip(positional[len(positional) - len(defaults):], defaults))
    if kwdefaults:
        reads.mapping(kwdefaults)
        roots += list(kwdefaults.items())
    return roots


def _partial_roots(fn: functools.partial, reads: Reads) -> list[tuple[str, Any]]:
    """The roots of a `functools.partial`: the arguments it binds (`args[i]`, keyword names),
    then what its function captures. `func`, `args` and `keywords` are read-only attributes,
    but the keywords dict can change in place."""
    for attr in ("func", "args", "keywords"):
        reads.attr(fn, attr, getattr(fn, attr))
    reads.mapping(fn.keywords)
    roots = [(f"args[{i}]", value) for i, value in enumerate(fn.args)]
    roots += list(fn.keywords.items())
    return roots + [(f"func.{name}" if name != "self" else "func.__self__", value)
                    for name, value in captured_roots(fn.func, reads)]


@functools.lru_cache(maxsize=4096)
def global_names(code: types.CodeType) -> tuple[str, ...]:
    """The global names `code` loads, those of the code nested in it (comprehensions, lambdas,
    inner functions) included. Not `co_names`: it also holds attribute names (`x.t()` names
    `t`), so a global that shares an attribute's name would be guarded for nothing, and it
    leaves out what a comprehension reads."""
    names = dict.fromkeys(ins.argval for ins in dis.get_instructions(code)
                          if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(dict.fromkeys(global_names(const)))
    return tuple(names)


def reachable(fn, args: tuple = (), kwargs: dict | None = None,
              arg_names: list[str] | None = None,
              reads: Reads = _NO_READS) -> list[tuple[str, Any]]:
    """(name, object) for the state a call of `fn` can reach: Python literals, Modules,
    Tensors and Optimizers among `fn`'s captured roots (itself, its `self`, closure cells,
    globals), one level into plain objects, containers and helper functions, and the same
    for the arguments that are neither tensors nor literals (a Module or an object holding one
    passed in). Modules, tensors and optimizers are not looked into, but for the optimizers a
    module holds as attributes (`self.opt`). Names are for people
    (recompile diffs; input names, where `arg_names` names the positional arguments).
    `reads` is told every attribute, cell and container the walk reads (see `Reads`)."""
    from graphc.nn.module import Module
    from graphc.optim.optimizer import Optimizer

    found: list[tuple[str, Any]] = []
    seen: set[int] = set()

    def visit(name: str, obj, depth: int) -> None:
        if isinstance(obj, LITERALS):  # a global SCALE = 2.0 is baked into the graph
            found.append((name, obj))
            return
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType)):
            return
        seen.add(id(obj))
        if isinstance(obj, (Module, Tensor, Optimizer)):
            found.append((name, obj))
            if isinstance(obj, Module):
                optimizers_held_by(name, obj)
        elif depth >= 2:
            return
        elif isinstance(obj, (types.FunctionType, types.MethodType, functools.partial)) or \
                _is_compiled(obj):
            for sub, item in captured_roots(obj, reads):
                visit(f"{name}.{sub}" if sub != "self" else f"{name}.__self__", item, depth + 1)
        elif isinstance(obj, (list, tuple)) and len(obj) <= 64:
            reads.sequence(obj)
            for i, item in enumerate(obj):
                visit(f"{name}[{i}]", item, depth + 1)
        elif isinstance(obj, dict) and len(obj) <= 64:
            reads.mapping(obj)
            for k, item in obj.items():
                visit(f"{name}[{k!r}]", item, depth + 1)
        else:
            if isinstance(obj, (list, tuple, dict)):
                reads.big(obj)
            if hasattr(obj, "__dict__"):  # an object with a __call__ too (a Trainer)
                d = vars(obj)
                reads.attr(obj, "__dict__", d)
                reads.mapping(d)
                for attr, item in list(d.items())[:64]:
                    visit(f"{name}.{attr}", item, depth + 1)

    def optimizers_held_by(name: str, module) -> None:
        """An optimizer a module holds as an attribute (`self.opt` of a module whose method
        is the step). Not told to `reads`: the guards read every module's `__dict__` in full
        (graphc.jit.guards._GuardBuilder._module)."""
        for sub, m in module.named_modules():
            for attr, value in vars(m).items():
                if isinstance(value, Optimizer):
                    where = ".".join(p for p in (name, sub, attr) if p)
                    visit(where, value, 2)

    for name, obj in captured_roots(fn, reads):
        visit(name, obj, 0)
    for path, arg in flat_leaves((args, kwargs or {})):
        if not isinstance(arg, (Tensor,) + LITERALS):  # those are described as arguments
            named = arg_names is not None and path[0] == 0 and path[1] < len(arg_names)
            label = arg_names[path[1]] + "".join(f"[{p!r}]" for p in path[2:]) if named \
                else path_name(path)
            visit(label, arg, 1)
    return found


def _is_compiled(obj) -> bool:
    from graphc.jit.compiler import Compiled

    return isinstance(obj, Compiled)


def optimizer_params(opt) -> list[tuple[str, Tensor]]:
    """(label, parameter) for every parameter of an optimizer, labelled by group and index."""
    return [(f"param_groups[{g}][{i}]", p) for g, group in enumerate(opt.param_groups)
            for i, p in enumerate(group["params"])]


def grad_holders(fn, args: tuple = (), kwargs: dict | None = None, found=None
                 ) -> list[tuple[str, Tensor, tuple | None]]:
    """(name, tensor, argument path or None) for every tensor whose `.grad` a call of `fn`
    may read or write: the parameters of the modules and optimizers it reaches, the captured
    tensors and the argument tensors that require grad (leaves). `found`: `reachable(fn,
    args, kwargs)` when the caller has it already."""
    from graphc.nn.module import Module
    from graphc.optim.optimizer import Optimizer

    out: list[tuple[str, Tensor, tuple | None]] = []
    seen: set[int] = set()

    def add(name: str, t: Tensor, path) -> None:
        if id(t) not in seen:
            seen.add(id(t))
            out.append((name, t, path))

    for path, t in flatten((args, kwargs or {})):
        if t.requires_grad and t.is_leaf:
            add(path_name(path), t, path)
    if found is None:
        found = reachable(fn, args, kwargs)
    for name, obj in found:  # module names first: they name the parameters best
        if isinstance(obj, Module):
            for pname, p in obj.named_parameters():
                add(f"{name}.{pname}" if name else pname, p, None)
    for name, obj in found:
        if isinstance(obj, Optimizer):
            for label, p in optimizer_params(obj):
                add(f"{name}.{label}", p, None)
        elif isinstance(obj, Tensor) and obj.requires_grad and obj.is_leaf:
            add(name, obj, None)
    return out


def storage_names(fn, args: tuple = (), kwargs: dict | None = None,
                   arg_names: list[str] | None = None) -> dict[int, str]:
    """Readable names for state the function may capture: module parameters and buffers
    (also of modules held by an argument, `self.model` of a method), and optimizer state
    (`<parameter>.<key>`: `fc.weight.momentum_buffer`)."""
    from graphc.nn.module import Module
    from graphc.optim.optimizer import Optimizer

    names: dict[int, str] = {}
    for prefix, obj in captured_roots(fn):
        if isinstance(obj, Module):
            for name, t in itertools.chain(obj.named_parameters(), obj.named_buffers()):
                full = f"{prefix}.{name}" if prefix else name
                names.setdefault(id(t._data), full)
        elif isinstance(obj, Tensor):
            names.setdefault(id(obj._data), prefix)
    found = reachable(fn, args, kwargs, arg_names)
    for prefix, obj in found:  # modules further in (`self.model`)
        if isinstance(obj, Module):
            for name, t in itertools.chain(obj.named_parameters(), obj.named_buffers()):
                names.setdefault(id(t._data), f"{prefix}.{name}" if prefix else name)
    for prefix, obj in found:
        if isinstance(obj, Optimizer):
            for label, p in optimizer_params(obj):
                pname = names.setdefault(id(p._data), f"{prefix}.{label}")
                for key, value in obj.state.get(p, {}).items():
                    if isinstance(value, Tensor):
                        names.setdefault(id(value._data), f"{pname}.{key}")
    return names
