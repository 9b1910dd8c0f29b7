"""The guards of `graphc.compile`: the fast path's cheap checks of a call.

A compiled callable (graphc.jit.compiler) keys its executables by the full signature of a
call (graphc.jit.signature: every argument's description, the state of the modules and
optimizers the function reaches, the `.grad`s it may touch).

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
literals are immutable, so identity implies the same value. Where CPython keeps dict version
tags (3.11), a dict's unchanged tag stands for its unchanged keys and values: one comparison
for all the dicts whose tags held (graphc.jit.dict_versions), the keys and values compared only
after a change. By type: every guarded tensor (shape, dtype, requires_grad, is_leaf) and every
`.grad` the signature describes (None, or shape, dtype, requires_grad), the arguments (their
full description, as in the signature), grad mode, and which argument tensors are `.grad`
holders. A check may fail where the signature would be equal (a hyperparameter set again to an
equal new float): the full signature then decides, and refreshes the entry's guard. A guard
never holds where the signature differs; the one assumption is that no guarded object changes
its `__class__`. An entry whose signature equals a newer entry's (traced again because it was
stale) is never taken by the fast path, so both paths pick the same entry. A guard holds the
objects it checks, so no id it compares is reused while it lives. The stale checks and the
storage-sharing check run on every call, fast path or not, except the misfit check of an entry
whose guard already checks every captured tensor's type and recorded the graph's
(`Guard.implies_types`); retrace decisions and the recompile reasons are the full signature's.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

from graphc.autograd import grad_mode
from graphc.autograd.grad_mode import is_grad_enabled
from graphc.jit.bindings import GradBinding, TensorBinding
from graphc.jit.dict_versions import DictVersions, tagged_dict
from graphc.jit.pytree import flatten
from graphc.jit.reach import ABSENT, Reads, cell_contents, reachable
from graphc.jit.signature import (  # the signature's names compiler.py imports from here
    ShapeGuard,
    aliasing,
    describe,
    describe_call,
    diff_signatures,
    dim_label,
    is_tensor_key,
    mask_call,
    mask_signature,
    reachable_state,
    signature_of,
    user_classes,
)
from graphc.tensor import Tensor
from graphc.types import as_dtype

# ---- the fast guard --------------------------------------------------------------------------
# What a guard's checks may raise on objects that changed (an attribute gone, a key missing,
# a value of another kind): the guard then fails, and the full signature decides.
CHECK_ERRORS = (AttributeError, KeyError, TypeError, ValueError)


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
        self.call = describe_call(args, kwargs)
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
        self.call = mask_call(self.call, self.dynamic)
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
        except CHECK_ERRORS:  # let the signature say
            return False

    @property
    def checks(self):
        """The compiled checks, `checks(args, kwargs) -> bool` (`compile_checks`): `holds`
        without its frame, for a caller that catches CHECK_ERRORS as a failed guard itself
        (graphc.jit.compiler's fast path). The function stays this guard's until
        `set_dynamic`, which makes a new one."""
        if self._checks is None:
            self._checks = compile_checks(self)
        return self._checks

    @property
    def source(self) -> str:
        """The Python source of this guard's checks (`compile_checks`), for reading."""
        return self.checks.__doc__


def compile_checks(g: Guard):
    """One Python function that runs every check of `g` (`Guard.holds`), specialised to it:
    the objects it compares are the function's globals, and each kind of check is one
    expression over all its objects, so a call costs no Python loop per object, and a
    container's values are gathered by star-unpacking (`(*d0.values(), *s1)`), the fastest
    way Python has to read them. The checks, in order:

    - grad mode, then the call: where it is positional and every dynamic dimension is a
      positional tensor's, each tensor argument's array shape (its rank and its other dims
      where some are dynamic), dtype and requires_grad, and each other argument's
      description; else the description of the whole call (`describe_call`, masked);
    - attributes: getattr(object, name) is value, all in one map (an AttributeError fails
      the guard), or getattr(object, name, ABSENT) where it was absent; closure cells; dict
      lookups (`d.get(key, ABSENT) is value`);
    - dicts with a version tag (graphc.jit.dict_versions, CPython 3.11), where they hold at
      least TAGS_FROM_ITEMS keys and empty dicts: all their tags in one comparison
      (`versions.matches()`); where one changed, `dict_checks`, the
      comparison below of those dicts' keys and values, decides, and the tags are kept
      where it holds (`versions.confirm`);
    - containers (the other dicts, or all where there are no tags): the empty ones still
      are (one map of len); the dicts' keys in order (==, as a dict compares keys), then
      every dict value and sequence item (is), each container's followed by a separator
      (so the tuples are equal only where every container has its length);
      containers too big to be looked into still are (len > 64);
    - tensors: (array shape, dtype, requires_grad, grad_fn) per leaf (grad_fn None) in one
      tuple; the rare guarded interior tensor (grad_fn not None) on its own line;
    - `.grad`s: (array shape, dtype, requires_grad) per holder that had one, in one tuple (a
      `.grad` gone raises AttributeError), None per holder that had none; and which argument
      tensors hold a `.grad` (`_arg_holders`) where an argument requires grad.
    The function's `__doc__` is its source (`Guard.source`)."""
    names: dict[str, Any] = {"ABSENT": ABSENT, "Tensor": Tensor, "is_": operator.is_,
                             "GRAD_STATE": grad_mode.state, "cell_contents": cell_contents,
                             "repeat": itertools.repeat, "describe": describe,
                             "LEAF_TYPE": _LEAF_TYPE, "GRAD_TYPE": _GRAD_TYPE,
                             "GRAD": operator.attrgetter("_grad"),
                             "arg_holders": _arg_holders, "GRAD_MODE": g.grad_mode,
                             "END": _END}

    def name(prefix: str, value) -> str:
        key = f"{prefix}{len(names)}"
        names[key] = value
        return key

    # grad mode read off its thread-local state, not through is_grad_enabled(): one frame
    # less in every call (the mode is always stored as a bool)
    lines = ["if GRAD_STATE.enabled is not GRAD_MODE:", "    return False"]
    args, kwargs = g.call
    if kwargs or (g.dynamic and g.top_dims is None):
        lines += [f"if not {name('call', _CallDescription(g))}(args, kwargs):",
                  "    return False"]
    else:
        lines += [f"if len(args) != {len(args)} or kwargs:", "    return False"]
        for i, d in enumerate(args):
            if is_tensor_key(d):
                lines.append(f"a = args[{i}]")
                shape = f"a._array.shape == {name('shape', d[1])}"
                if "*" in d[1]:  # a symbolic entry's dynamic dims (`set_dynamic`): the rank
                    # and every other dim; the ShapeGuard checks those
                    shape = " and ".join([f"len(a._array.shape) == {len(d[1])}"] + [
                        f"a._array.shape[{j}] == {n}" for j, n in enumerate(d[1]) if n != "*"])
                lines.append(f"if not (isinstance(a, Tensor) and {shape} and a._dtype is "
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
    # the dicts with a version tag: their tags in one comparison, and their keys and values
    # only where a tag changed (graphc.jit.dict_versions); the other containers as they are.
    # Tags where they replace at least TAGS_FROM_ITEMS keys and empty dicts: the gather costs
    # about what comparing that many keys does
    empty = [(c, tagged_dict(c, empty=True)) for c in g.empty]
    dicts = [(entry, tagged_dict(entry[0], empty=False)) for entry in g.dicts]
    items = sum(1 for _, t in empty if t is not None) + sum(
        len(entry[1]) for entry, t in dicts if t is not None)
    if items < TAGS_FROM_ITEMS:
        empty = [(c, None) for c, _ in empty]
        dicts = [(entry, None) for entry, _ in dicts]
    tagged = [t for _, t in empty + dicts if t is not None]
    fallback = ""
    if tagged:
        versions = name("versions", DictVersions(tagged))
        checks.append(f"({versions}.matches() or {versions}.confirm(dict_checks))")
        fallback = "\n\ndef dict_checks():\n    return (" + "\n        and ".join(_container_checks(
            name, [c for c, t in empty if t is not None],
            [entry for entry, t in dicts if t is not None], [])) + ")\n"
    checks += _container_checks(name, [c for c, t in empty if t is None],
                                [entry for entry, t in dicts if t is None], g.seqs)
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
    source += fallback
    exec(compile(source, "<graphc guard>", "exec"), names)  # noqa: S102 (our own text)
    checks_fn = names["checks"]
    checks_fn.__doc__ = source
    return checks_fn


def _container_checks(name, empty: list, dicts: list, seqs: list) -> list[str]:
    """`compile_checks`' expressions for containers: the `empty` ones still are, the `dicts`
    ((dict, keys, values) as recorded) have those keys in order and those values, the `seqs`
    ((sequence, items)) those items. A separator after each container's keys (dicts) or items
    (sequences): equal tuples then mean equal lengths, container by container, with no
    lengths compared. `name(prefix, value)` makes a global of the checks."""
    checks = []
    if empty:
        checks.append(f"not any(map(len, {name('empty', tuple(empty))}))")
    names = [name("d", d) for d, _, _ in dicts]
    if dicts:
        keys = tuple(itertools.chain.from_iterable(keys + (_END,) for _, keys, _ in dicts))
        checks.append(f"({''.join(f'*{d}, END, ' for d in names)}) == {name('keys', keys)}")
    if dicts or seqs:
        items = tuple(itertools.chain(
            itertools.chain.from_iterable(values for _, _, values in dicts),
            itertools.chain.from_iterable(items + (_END,) for _, items in seqs)))
        gathered = "".join([f"*{d}.values(), " for d in names]
                           + [f"*{name('s', q)}, END, " for q, _ in seqs])
        checks.append(f"all(map(is_, ({gathered}), {name('items', items)}))")
    return checks


class _CallDescription:
    """The call check of a guard whose call has kwargs or dynamic dimensions: the whole
    call's description, its dynamic dimensions masked."""

    __slots__ = ("call", "dynamic", "top_dims")

    def __init__(self, g: Guard) -> None:
        self.call, self.dynamic, self.top_dims = g.call, g.dynamic, g.top_dims

    def __call__(self, args: tuple, kwargs: dict) -> bool:
        if self.top_dims is not None and self.dynamic:
            return _describe_masked(args, kwargs, self.top_dims) == self.call
        return mask_call(describe_call(args, kwargs), self.dynamic) == self.call


_END = object()  # the separator after each container's keys or items (`compile_checks`)
TAGS_FROM_ITEMS = 12  # dict version tags where they stand for this many keys and empty dicts
_LEAF_TYPE = operator.attrgetter("_array.shape", "_dtype", "_requires_grad", "grad_fn")
# a holder's `.grad` as `Guard.grads` records it (`_grad_type`), read from the holder
_GRAD_TYPE = operator.attrgetter("_grad._array.shape", "_grad._dtype", "_grad._requires_grad")


def _describe_masked(args: tuple, kwargs: dict, top_dims: dict) -> tuple:
    """`mask_call(describe_call(...))` where every dynamic dim is of a positional tensor
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
            described.append(describe(a))
    return tuple(described), tuple((k, describe(v)) for k, v in kwargs.items())




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


__all__ = ["Guard", "ShapeGuard", "aliasing", "diff_signatures", "dim_label", "mask_signature",
           "reachable_state", "signature_of"]
