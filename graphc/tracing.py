"""Tracing: run a function or module once and record every op it applies into an ir.Graph.

Inside a trace every op still runs eagerly (values, shapes and autograd are real); the
dispatch point tells the `Tracer` about each op application and each in-place write. The
tracer maps every tensor's storage (its numpy array) to the IR value that currently holds it:
- a tensor passed as an argument becomes a graph input named after the parameter;
- a tensor that existed before the trace and is read inside it (module parameters and
  buffers, optimizer state, closure tensors) becomes a *captured* graph input, bound by the
  executable to that tensor object at every call, never a constant baked into the graph;
- a tensor created inside the trace by something other than an op (a Python scalar operand,
  `graphc.tensor([...])`) becomes a `full` node when all its elements are one value that an
  attribute holds exactly, else a graph input bound to a copy of its data (a `ConstantBinding`;
  the registry has no op that carries array data);
- an in-place write rebinds the storage to the value that was written, and an input whose
  storage ends up bound to a new value becomes an update (`%w <- %v`) of the graph;
- random ops read their [seed, offset] from a graph input bound to the generator, so every
  call of a compiled graph draws fresh numbers, exactly as the same eager calls would.
Reading a tensor's value (`bool(t)`, `.item()`, `.numpy()`) inside a trace raises TraceError;
`trace_call` adds the user's source line (and the custom Function it happened in) to it.
"""

from __future__ import annotations

import inspect
import itertools
import os
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from graphc.dispatch import current_tracer, set_tracer
from graphc.errors import TraceError, user_source_location
from graphc.ir.graph import Graph, Node, Value
from graphc.ops import random as _random
from graphc.tensor import Tensor, tensor_serial
from graphc.types import DType

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_FUNCTION_FILE = os.path.join(_PACKAGE_DIR, "autograd", "function.py")


@dataclass
class ArgBinding:
    """A graph input fed by the tensor at `path` in the call's (args, kwargs)."""

    path: tuple


@dataclass
class TensorBinding:
    """A graph input bound to a tensor captured by the traced code (a parameter, a buffer)."""

    tensor: Tensor


@dataclass
class ConstantBinding:
    """A graph input fed with (a fresh copy of) data the traced code created, not from an op."""

    array: np.ndarray


@dataclass
class RngBinding:
    """A graph input that holds [seed, offset] of `generator`; a call advances it by `counters`.

    `traced_state` is the (seed, offset) the trace started from. A generator the traced call
    made itself and dropped (`graphc.Generator().manual_seed(s)` inside it) is `transient`:
    every eager call makes it afresh, so every run reads `traced_state`, unadvanced, and
    `generator` is then a stand-in in the state the trace left it in.
    """

    generator: Any
    counters: int = 0
    traced_state: tuple[int, int] = (0, 0)
    transient: bool = False


@dataclass
class TraceResult:
    """A traced graph plus what is needed to call it again with new arguments."""

    graph: Graph
    bindings: list  # one ArgBinding / TensorBinding / RngBinding per graph input, in order
    out_spec: Any  # the output structure with tensors replaced by their output index
    result: Any = None  # what the tracing call returned (it ran eagerly)
    # output index -> graph input index, for outputs that ARE an input tensor (`return x`,
    # `return self.weight`): a compiled call returns that very tensor, as the eager call does
    output_aliases: dict[int, int] = field(default_factory=dict)


def _literal(op: str, key: str, value):
    """Canonicalise an attribute into an IR literal (int, float, bool, str, None, tuples)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, DType):
        return value.name
    if isinstance(value, (tuple, list)):
        return tuple(_literal(op, key, v) for v in value)
    raise TraceError(
        f"{op}: attribute {key}={value!r} is not a literal (int, float, bool, str, None or a "
        "tuple of those), so it cannot be recorded in the IR"
    )


def _attribute(op: str, key: str, value, kind):
    """An attribute as a literal; a bool where the op's schema expects a number
    (`full(value=True)`) becomes 1.0 / 0.0 (ints stay: clamp's int bounds keep int64)."""
    lit = _literal(op, key, value)
    if kind in (int, float) and isinstance(lit, bool):
        return kind(lit)
    return lit


class Tracer:
    """Records op applications into a Graph while they run eagerly (see the module docstring)."""

    def __init__(self, name: str, names_by_storage: dict[int, str]) -> None:
        self.graph = Graph(name)
        self.start_serial = tensor_serial()
        self.bindings: list = []
        self._rngs: dict[int, tuple[RngBinding, Tensor]] = {}
        self._values: dict[int, Value] = {}
        self._keep: list[np.ndarray] = []  # keeps recorded arrays alive, so ids stay unique
        self._input_of: dict[Value, Tensor] = {}
        self._names_by_storage = names_by_storage
        self._used_names: set[str] = set()
        self._counter = itertools.count()

    # ---- names and values ------------------------------------------------------------------
    def _name(self, hint: str | None = None) -> str:
        if hint:
            name = "".join(c if c.isalnum() or c in "_." else "_" for c in hint)
            candidate, k = name, 1
            while candidate in self._used_names or candidate.isdigit():
                candidate, k = f"{name}_{k}", k + 1
        else:
            candidate = str(next(self._counter))
            while candidate in self._used_names:
                candidate = str(next(self._counter))
        self._used_names.add(candidate)
        return candidate

    def _bind(self, t: Tensor, v: Value) -> None:
        self._values[id(t._data)] = v
        self._keep.append(t._data)

    def add_input(self, t: Tensor, name: str, binding, updatable: bool = True) -> Value:
        v = Value(self._name(name), t.type)
        self.graph.inputs.append(v)
        self.bindings.append(binding)
        if updatable:  # an in-place write to it becomes an update of the graph
            self._input_of[v] = t
        self._bind(t, v)
        return v

    def value_of(self, t: Tensor) -> Value:
        v = self._values.get(id(t._data))
        if v is not None:
            return v
        if t._serial < self.start_serial:
            name = self._names_by_storage.get(id(t._data), f"c{len(self.bindings)}")
            return self.add_input(t, name, TensorBinding(t))
        return self._constant(t)

    def _constant(self, t: Tensor) -> Value:
        """A tensor made inside the trace without an op: a `full` node, or a bound copy."""
        data = t._data
        flat = data.reshape(-1)
        value = _uniform_literal(flat) if flat.size else 0.0
        if value is None:
            binding = ConstantBinding(np.array(data, copy=True))
            return self.add_input(t, "const", binding, updatable=False)
        node = Node("full", [], {"shape": tuple(data.shape), "value": value,
                                 "dtype": t.dtype.name}, [], user_source_location())
        v = Value(self._name(), t.type)
        node.outputs.append(v)
        self.graph.nodes.append(node)
        self._bind(t, v)
        return v

    def alias(self, copy: Tensor, original: Tensor) -> None:
        """`copy` holds the current value of `original` (a snapshot an in-place op made)."""
        self._bind(copy, self.value_of(original))

    # ---- the dispatch protocol -------------------------------------------------------------
    def record(self, opdef, inputs, attrs, outputs) -> None:
        schema = opdef.attrs or {}
        node = Node(
            opdef.name,
            [self.value_of(t) for t in inputs],
            {k: _attribute(opdef.name, k, v, schema.get(k)) for k, v in attrs.items()},
            [Value(self._name(), t.type) for t in outputs],
            user_source_location(),
        )
        self.graph.nodes.append(node)
        for t, v in zip(outputs, node.outputs):
            self._bind(t, v)

    def rebind(self, target: Tensor, result: Tensor) -> None:
        self._bind(target, self.value_of(result))

    def seed_input(self, generator, counters: int) -> Tensor:
        """The [seed, offset] tensor of one random call: the bound rng input plus an offset."""
        from graphc.ops.registry import call

        if id(generator) not in self._rngs:
            traced_state = (generator.initial_seed(), generator.offset)
            t = Tensor._wrap(np.array(traced_state, np.uint64).view(np.int64))
            binding = RngBinding(None, traced_state=traced_state)  # see settle_generators
            self._rngs[id(generator)] = (binding, t, generator)
            self.add_input(t, "rng", binding)
        binding, state, _ = self._rngs[id(generator)]
        start = binding.counters
        binding.counters += counters
        generator._take(counters)  # advance as the eager call would
        if start == 0:
            return state
        step = call("arange", start=0.0, end=2.0 * start, step=float(start), dtype="int64")
        return call("add", state, step)  # [seed, offset + start]

    # ---- finishing ---------------------------------------------------------------------------
    def settle_generators(self) -> None:
        """Give each RngBinding its generator, or mark it transient if nothing else holds it.

        The tracer alone held the generators so far (keeping their ids unique); once it lets
        go, a generator the traced call made and dropped is gone.
        """
        refs = [(binding, weakref.ref(gen)) for binding, _, gen in self._rngs.values()]
        self._rngs.clear()
        for binding, ref in refs:
            binding.generator = ref()
            if binding.generator is None:  # a stand-in, left where the trace left it
                binding.transient = True
                seed, offset = binding.traced_state
                after = (seed, (offset + binding.counters) % (1 << 63))
                binding.generator = _random.Generator().set_state(
                    np.array(after, np.uint64).view(np.int64))

    def finish(self, outputs: list[Tensor]) -> None:
        self.graph.outputs = [self.value_of(t) for t in outputs]
        for v, t in self._input_of.items():
            current = self._values.get(id(t._data))
            if current is not None and current is not v:
                self.graph.updates.append((v, current))
        for b in self.bindings:
            g = b.tensor._grad if isinstance(b, TensorBinding) else None
            if g is not None and g._serial >= self.start_serial:
                raise TraceError(
                    "backward() inside a traced function wrote the .grad of a captured tensor; "
                    "compiled training steps are not supported yet: call backward() outside "
                    "the compiled function"
                )


def _uniform_literal(flat: np.ndarray):
    """The one value of a non-empty 1-d array as a float attribute of `full`, or None if the
    elements differ (bit for bit: -0.0 is not 0.0) or a float cannot hold the value exactly
    (int64 values past 2**53)."""
    bits = flat.view(f"u{flat.dtype.itemsize}") if flat.dtype.kind == "f" else flat
    if not (bits == bits[0]).all():
        return None
    value = float(flat[0])
    if flat.dtype.kind in "iu" and (abs(int(flat[0])) > 2 ** 53 or int(value) != int(flat[0])):
        return None
    return value


def _is_namedtuple(obj) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def _flatten(obj, path=()):
    """Yield (path, tensor) for every tensor in nested tuples, lists and dicts."""
    if isinstance(obj, Tensor):
        yield path, obj
    elif isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            yield from _flatten(item, path + (i,))
    elif isinstance(obj, dict):
        for k, item in obj.items():
            yield from _flatten(item, path + (k,))


def _spec(obj, index: dict[int, int]):
    """The output structure with each tensor replaced by ('out', position)."""
    if isinstance(obj, Tensor):
        return ("out", index[id(obj)])
    if _is_namedtuple(obj):
        return type(obj)(*(_spec(item, index) for item in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_spec(item, index) for item in obj)
    if isinstance(obj, dict):
        return {k: _spec(v, index) for k, v in obj.items()}
    return ("const", obj)


def unflatten(spec, outputs: list):
    """Rebuild the traced function's output structure from the outputs of a run."""
    if type(spec) is tuple and len(spec) == 2 and spec[0] in ("out", "const"):
        return outputs[spec[1]] if spec[0] == "out" else spec[1]
    if _is_namedtuple(spec):
        return type(spec)(*(unflatten(s, outputs) for s in spec))
    if isinstance(spec, (tuple, list)):
        return type(spec)(unflatten(s, outputs) for s in spec)
    if isinstance(spec, dict):
        return {k: unflatten(v, outputs) for k, v in spec.items()}
    return spec


def captured_roots(fn) -> list[tuple[str, Any]]:
    """(name, object) for what `fn` can reach: itself if a Module, else its bound `self`, its
    closure cells and the globals its code names. Used for names and for guards."""
    from graphc.nn.module import Module

    roots: list[tuple[str, Any]] = []
    if isinstance(fn, Module):
        roots.append(("", fn))
    else:
        target = getattr(fn, "__func__", fn)
        if getattr(fn, "__self__", None) is not None:
            roots.append(("self", fn.__self__))
        code = getattr(target, "__code__", None)
        if code is not None:
            cells = dict(zip(code.co_freevars, target.__closure__ or ()))
            for var, cell in cells.items():
                try:
                    roots.append((var, cell.cell_contents))
                except ValueError:  # an empty cell
                    continue
            glb = getattr(target, "__globals__", {})
            roots += [(n, glb[n]) for n in code.co_names if n in glb]
    return roots


def _storage_names(fn) -> dict[int, str]:
    """Readable names for state the function may capture: module parameters and buffers."""
    from graphc.nn.module import Module

    names: dict[int, str] = {}
    for prefix, obj in captured_roots(fn):
        if isinstance(obj, Module):
            for name, t in itertools.chain(obj.named_parameters(), obj.named_buffers()):
                full = f"{prefix}.{name}" if prefix else name
                names.setdefault(id(t._data), full)
        elif isinstance(obj, Tensor):
            names.setdefault(id(obj._data), prefix)
    return names


def _arg_names(fn, args) -> list[str]:
    try:
        sig = inspect.signature(fn.forward if hasattr(fn, "forward") else fn)
        params = [p.name for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(len(args)):
        names.append(params[i] if i < len(params) and not params[-1:] == ["args"] else f"arg{i}")
    return names


def graph_name(fn) -> str:
    name = type(fn).__name__ if not hasattr(fn, "__name__") else fn.__name__
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "graph"


def trace_call(fn: Callable, args: tuple, kwargs: dict | None = None,
               name: str | None = None) -> TraceResult:
    """Run `fn(*args, **kwargs)` once under a Tracer; return the graph and its bindings."""
    kwargs = kwargs or {}
    if current_tracer() is not None:
        raise TraceError("graphc.trace cannot be nested: a trace is already running")
    tracer = Tracer(name or graph_name(fn), _storage_names(fn))
    arg_names = _arg_names(fn, args)
    for path, t in _flatten((args, kwargs)):
        if id(t._data) in tracer._values:
            continue  # the same tensor passed twice: one input
        label = arg_names[path[1]] if path[0] == 0 else str(path[1])
        suffix = "".join(f"_{p}" for p in path[2:])
        tracer.add_input(t, label + suffix, ArgBinding(path))
    previous_provider = _random.set_seed_provider(tracer.seed_input)
    set_tracer(tracer)
    try:
        result = fn(*args, **kwargs)
    except TraceError as err:
        _locate(err)
        raise
    finally:
        set_tracer(None)
        _random.set_seed_provider(previous_provider)
    flat = [t for _, t in _flatten(result)]
    index: dict[int, int] = {}
    outputs = []
    for t in flat:
        if id(t) not in index:
            index[id(t)] = len(outputs)
            outputs.append(t)
    tracer.finish(outputs)
    tracer.settle_generators()
    aliases = {}
    for i, t in enumerate(outputs):
        for j, b in enumerate(tracer.bindings):
            bound = _at((args, kwargs), b.path) if isinstance(b, ArgBinding) else \
                b.tensor if isinstance(b, TensorBinding) else None
            if t is bound:
                aliases[i] = j
    return TraceResult(tracer.graph, tracer.bindings, _spec(result, index), result, aliases)


def _at(tree, path: tuple):
    """The item at `path` in nested tuples, lists and dicts."""
    for p in path:
        tree = tree[p]
    return tree


def _locate(err: TraceError) -> None:
    """Add the user's source line to a TraceError raised inside the traced code.

    That is the innermost frame of the traceback outside graphc (where `bool(t)` or `.item()`
    was written); when it lies in the forward of a custom autograd.Function, say so too.
    """
    loc, function, applying = None, None, None
    tb = err.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        filename = os.path.abspath(code.co_filename)
        if not filename.startswith(_PACKAGE_DIR + os.sep):
            loc, function = f"{os.path.basename(filename)}:{tb.tb_lineno}", applying
        elif code.co_name == "apply" and filename == _FUNCTION_FILE:
            applying = tb.tb_frame.f_locals.get("cls")
        tb = tb.tb_next
    message = str(err)
    if function is not None and "autograd.Function" not in message:
        message += (
            f" This happened in the forward of the custom autograd.Function "
            f"{function.__name__}: a Function is traced only when its forward is built from "
            "graphc ops; rewrite the forward with graphc ops (no numpy), or call it outside "
            "the compiled function."
        )
    if loc is not None and loc not in message:
        message = f"{loc}: {message}"
    err.args = (message,) + err.args[1:]


def trace(fn: Callable, *example_inputs, **kwargs) -> Graph:
    """Trace `fn` (a function or a Module) on example inputs into an IR graph.

    >>> import graphc
    >>> def f(x):
    ...     return (x * 2).relu()
    >>> print(graphc.trace(f, graphc.ones(3)))  # doctest: +NORMALIZE_WHITESPACE +ELLIPSIS
    graph @f(%x: f32[3]) -> (f32[3]) {
      %0: f32[] = full[shape=(), value=2.0, dtype="float32"]()  # <doctest ...>:2
      %1: f32[3] = mul(%x, %0)                                # <doctest ...>:2
      %2: f32[3] = relu(%1)                                   # <doctest ...>:2
      return (%2)
    }
    """
    return trace_call(fn, example_inputs, kwargs).graph
