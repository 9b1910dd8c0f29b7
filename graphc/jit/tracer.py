"""Tracing: run a function or module once and record every op it applies into an ir.Graph.

A trace runs the function once in abstract evaluation (graphc.dispatch.abstract_eval): each
op runs its shape/dtype rule only and makes abstract tensors (shape and dtype, no data), and
autograd records and runs as usual, so a trace costs time in the number of ops, not in the
tensors' sizes. The dispatch point tells the `Tracer` about each op application and each
in-place write; an in-place write into a tensor that existed before the call changes no data,
the tracer rebinds the tensor to the written value instead, so an abstract trace leaves every
tensor as it was (`trace_call(..., abstract=False)` runs every kernel eagerly, as tests that
compare against eager values want). The tracer maps every tensor's storage (its array, or the
abstract stand-in) to the IR value that currently holds it:
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

Gradients are state too, so a training step (zero_grad, forward, `loss.backward()`,
`opt.step()`) traces into one graph. The tracer snapshots, before the call, the `.grad` of
every tensor that can hold one (parameters of the modules and optimizers the function reaches,
captured and argument tensors that require grad), and binds them explicitly:
- a `.grad` that existed before the call and is read inside it (accumulation without
  zero_grad, the optimizer reading it) is a `GradBinding` input: the executable feeds it the
  holder's `.grad` as it is at each call (`%fc.weight.grad`);
- such a `.grad` written in place (accumulated into, `zero_grad(set_to_none=False)`) is an
  update of that input (`%fc.weight.grad <- %v`), written back into the same tensor object; an
  input is added for it even when the step only writes it, since updates are of inputs only;
- a holder whose `.grad` ends the call as another tensor (zero_grad set it to None and backward
  assigned a fresh one) or as None (`zero_grad()` after `step()`) is a `GradOutput`: an extra
  graph output after the function's own, which the executable assigns to `holder.grad` after
  every run (a fresh tensor), or None without an output.
Optimizer state (momentum buffers, Adam moments, `step`) needs nothing special: state tensors
that exist before the call are captured inputs updated in place. State created lazily inside
the call makes the traced graph valid for that first call only; graphc.compile guards on the
optimizer's state so the next call traces again. In an abstract trace such state is made of
abstract tensors: each tensor the call made and left in state it reaches (optimizer state,
module attributes, reachable containers) becomes an extra graph output after the `.grad`
outputs (`TraceResult.escaped`), and graphc.compile's first run gives it that value. An
optimizer made before the call that the trace steps but the call cannot reach
(graphc.jit.reach: a class attribute, a Python module's) is refused: nothing would guard its
state, and the state its step made would stay abstract.
Custom autograd.Functions: a Function's forward ops are recorded inline, like any others, and
the application itself is remembered as a `FunctionRegion` in `graph.meta["functions"]`
(`record_function`): the class, its arguments (graph values for tensors, literals for the
rest), its outputs, what `ctx.save_for_backward` saved, the other attributes the forward set
on ctx, which outputs are non-differentiable, and how many nodes the forward recorded. That
is what `derive_backward` needs to call the Function's own `backward`; the IR text prints it
as a `function` line (see graphc.ir.printer). Regions are recorded in grad mode or not.
Reading a tensor's value (`bool(t)`, `.item()`, `.numpy()`, a data-dependent shape such as
boolean-mask indexing) inside a trace raises TraceError;
`trace_call` adds the user's source line (and the custom Function it happened in) to it.
"""

from __future__ import annotations

import inspect
import itertools
import os
import weakref
from typing import Any, Callable

import numpy as np

from graphc.dispatch import abstract_eval, current_tracer, set_tracer
from graphc.errors import TraceError, user_source_location
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.printer import FunctionRegion, Opaque
from graphc.jit.bindings import (
    ArgBinding,
    ConstantBinding,
    GradBinding,
    GradOutput,
    RngBinding,
    TensorBinding,
    TraceResult,
)
from graphc.jit.nan_check import LazyState
from graphc.jit.pytree import at, flatten, is_namedtuple, output_spec
from graphc.jit.reach import grad_holders, reachable, storage_names
from graphc.ops import random as _random
from graphc.symbolic import ShapeEnv, Sym
from graphc.tensor import AbstractArray, Tensor, tensor_serial
from graphc.types import DType

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # graphc/
_FUNCTION_FILE = os.path.join(_PACKAGE_DIR, "autograd", "function.py")


def _literal(op: str, key: str, value):
    """Canonicalise an attribute into an IR literal (int, float, bool, str, None, tuples)."""
    kind = type(value)  # the exact types most attributes are come back as they are
    if kind is int or kind is float or kind is str or kind is bool:
        return value
    if kind is tuple and all(type(v) is int for v in value):  # shapes, dims, strides
        return value
    if value is None or isinstance(value, (bool, str, Sym)):  # a symbolic size prints as such
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

    def __init__(self, name: str, names_by_storage: dict[int, str],
                 grad_holders: list[tuple[Tensor, tuple | None]] = ()) -> None:
        self.graph = Graph(name)
        self.start_serial = tensor_serial()
        self._originals: dict[int, tuple[Tensor, np.ndarray]] = {}
        self._generators_before = weakref.WeakKeyDictionary()  # never keeps one alive
        self.bindings: list = []
        self.grad_outputs: list[GradOutput] = []
        self._rngs: dict[int, tuple[RngBinding, Tensor]] = {}
        self._values: dict[int, Value] = {}
        self._keep: list[np.ndarray] = []  # keeps recorded arrays alive, so ids stay unique
        self._input_of: dict[Value, Tensor] = {}
        self._names_by_storage = names_by_storage
        self._used_names: set[str] = set()
        self._counter = itertools.count()
        # (holder, argument path or None, its .grad before the call): see the module docstring
        self._holders = [(h, path, h._grad) for h, path in grad_holders]
        self._grad_of = {id(g): (h, path) for h, path, g in self._holders if g is not None}
        self._grad_inputs: dict[int, Value] = {}  # id(holder) -> its GradBinding input
        # optimizers whose step ran in the trace, and those made in it (`note_optimizer`)
        self.optimizers_stepped: dict[int, Any] = {}
        self.optimizers_made: set[int] = set()

    def note_optimizer(self, opt, made: bool) -> None:
        """graphc.optim tells the tracer of each optimizer made (`made`) or stepped in the
        trace: one stepped that the call cannot reach is refused (`_check_reached`)."""
        if made:
            self.optimizers_made.add(id(opt))
        else:
            self.optimizers_stepped.setdefault(id(opt), opt)

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
            if id(t) in self._grad_of:  # the .grad of a holder, as it was before the call
                holder, path = self._grad_of[id(t)]
                return self._grad_input(holder, path, t, bind=True)
            name = self._names_by_storage.get(id(t._data), f"c{len(self.bindings)}")
            return self.add_input(t, name, TensorBinding(t))
        return self._constant(t)

    def _holder_name(self, holder: Tensor) -> str:
        v = self._values.get(id(holder._data))
        if v is not None and v in self._input_of:
            return v.name
        return self._names_by_storage.get(id(holder._data), "param")

    def _grad_input(self, holder: Tensor, path, grad: Tensor, bind: bool) -> Value:
        """The GradBinding input of `holder` (its `.grad` at the call). Without `bind`, the
        grad's storage keeps the value the trace gave it (an input added at the end for an
        update only)."""
        v = Value(self._name(self._holder_name(holder) + ".grad"), grad.type)
        self.graph.inputs.append(v)
        self.bindings.append(GradBinding(None if path is not None else holder, path))
        self._input_of[v] = grad
        self._grad_inputs[id(holder)] = v
        if bind:
            self._bind(grad, v)
        else:
            self._keep.append(grad._data)
        return v

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

    def record_function(self, cls, ctx, args: tuple, outputs: tuple, start: int) -> None:
        """Remember one `cls.apply(*args)` whose forward recorded the nodes from `start` on
        and returned `outputs` (see the module docstring)."""
        internal = ("_saved", "_dirty", "_non_differentiable", "needs_input_grad",
                    "materialize_grads", "_node_name")
        region = FunctionRegion(
            f"{cls.__module__}:{cls.__qualname__}",
            self._items(args), self._items(outputs), 0, 0,
            saved=self._items(ctx._saved),
            ctx={k: self._item(v) for k, v in vars(ctx).items() if k not in internal},
            non_differentiable=tuple(i for i, o in enumerate(outputs)
                                     if id(o) in ctx._non_differentiable),
            dirty=tuple(i for i, o in enumerate(outputs) if id(o) in ctx._dirty),
            materialize_grads=bool(ctx.materialize_grads), loc=self.function_location(),
            cls=cls)
        region.end = len(self.graph.nodes)  # after the values above made their constants
        region.nodes = region.end - start
        self.graph.meta.setdefault("functions", []).append(region)

    def function_location(self) -> str | None:
        return user_source_location()

    def _items(self, items) -> tuple:
        return tuple(self._item(x) for x in items)

    def _item(self, x):
        """A region item: a Value for a tensor, a literal, a tuple of items, else Opaque."""
        if isinstance(x, Tensor):
            return self.value_of(x)
        if isinstance(x, (tuple, list)) and not is_namedtuple(x):
            return self._items(x)
        if isinstance(x, DType):  # a literal would hand backward its name, not the dtype
            return Opaque(type(x).__name__, x)
        try:
            return _literal("function", "item", x)
        except TraceError:
            return Opaque(type(x).__name__, x)

    def rebind(self, target: Tensor, result: Tensor) -> None:
        self._bind(target, self.value_of(result))

    def before_write(self, target: Tensor) -> None:
        """Keep the value a pre-existing tensor had before the trace first writes it, so a
        failed or refused trace can be undone (`restore`)."""
        key = id(target._data)
        if target._serial < self.start_serial and key not in self._originals \
                and not target.is_abstract:  # abstract (a symbolic argument): no data
            self._originals[key] = (target, target._data.copy())

    def restore(self) -> None:
        """Undo the tracing run's effects on state that existed before it: tensors written in
        place, `.grad`s assigned, generators advanced. For a trace that fails, or whose result
        graphc.compile refuses, so that no exception leaves a model half-updated."""
        for t, saved in self._originals.values():
            np.copyto(t._data, saved)
            t._version_counter.bump()
        for holder, _path, grad in self._holders:
            holder._grad = grad
        for generator, (seed, offset) in list(self._generators_before.items()):
            generator._seed, generator._offset = seed, offset

    def seed_input(self, generator, counters: int) -> Tensor:
        """The [seed, offset] tensor of one random call: the bound rng input plus an offset."""
        from graphc.ops.registry import call

        if id(generator) not in self._rngs:
            traced_state = (generator.initial_seed(), generator.offset)
            self._generators_before[generator] = traced_state
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

    def finish(self, outputs: list[Tensor], escaped: list[Tensor] = ()) -> list[int]:
        """Set the graph's outputs (the function's, then the .grad outputs, then one per
        `escaped` tensor) and updates; returns the output index of each escaped tensor."""
        self.graph.outputs = [self.value_of(t) for t in outputs]
        self._finish_grads()
        indices = []
        for t in escaped:
            indices.append(len(self.graph.outputs))
            self.graph.outputs.append(self.value_of(t))
        for v, t in self._input_of.items():
            current = self._values.get(id(t._data))
            if current is not None and current is not v:
                self.graph.updates.append((v, current))
        return indices

    def _finish_grads(self) -> None:
        """Bind the `.grad` writes of the call (see the module docstring): an in-place write
        into a `.grad` that existed before is an update of its GradBinding input; a `.grad`
        that ends as another tensor, or as None, is a GradOutput."""
        holders = list(self._holders)
        known = {id(h) for h, _, _ in holders}
        for b, v in zip(self.bindings, self.graph.inputs):
            # tensors read by the trace that the walk did not find: a .grad made inside
            if isinstance(b, (TensorBinding, ArgBinding)) and v in self._input_of:
                t = self._input_of[v]
                g = t._grad
                if id(t) not in known and g is not None and g._serial >= self.start_serial:
                    known.add(id(t))
                    path = b.path if isinstance(b, ArgBinding) else None
                    holders.append((t, path, None))
        for holder, path, before in holders:
            if before is not None and id(holder) not in self._grad_inputs:
                written = self._values.get(id(before._data))
                if written is not None:  # written in place, never read: an input to update
                    self._grad_input(holder, path, before, bind=False)
            after = holder._grad
            if after is before:
                continue
            if after is None:
                self.grad_outputs.append(GradOutput(None if path is not None else holder,
                                                    path, None))
                continue
            self.graph.outputs.append(self.value_of(after))
            self.grad_outputs.append(GradOutput(None if path is not None else holder, path,
                                                len(self.graph.outputs) - 1))


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


def arg_names(fn, args) -> list[str]:
    """The names of the call's positional arguments (`x`, or `arg0` where unknown)."""
    return _arg_names(fn, args)


def graph_name(fn) -> str:
    name = type(fn).__name__ if not hasattr(fn, "__name__") else fn.__name__
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "graph"


def _symbolic_arguments(args: tuple, kwargs: dict, dynamic: dict, env: ShapeEnv,
                        apart: frozenset = frozenset()) -> tuple:
    """Give the argument dimensions named in `dynamic` ({path: dims}) symbolic sizes for the
    trace: each such tensor's array is swapped for an abstract one of symbolic shape (put back
    by `_restore_arguments`). Dimensions of equal size share one symbol (PyTorch's duck
    sizing: `x[32,784]` and `y[32]` give `s0`, and the guards then require them equal),
    except those in `apart` ({(path, dim)}), which get a symbol of their own.
    Returns (swapped [(tensor, array)], symbols [(path, dim, name)])."""
    swapped, symbols, by_size, seen = [], [], {}, set()
    for path, t in flatten((args, kwargs)):
        dims = dynamic.get(path)
        if dims and id(t) in seen:  # the same tensor again: its symbols, from here too
            symbols += [(path, d, t._data.shape[d].name) for d in sorted(dims)
                        if type(t._data.shape[d]) is Sym]
            continue
        if not dims or t.is_abstract:
            continue
        seen.add(id(t))
        shape = list(t._data.shape)
        for d in sorted(dims):
            n = shape[d]
            if n < 2:  # sizes 0 and 1 are specialised, as PyTorch does
                continue
            sym = None if (path, d) in apart else by_size.get(n)
            if sym is None:
                sym = env.new_symbol(n, _source_text(path, d))
                if (path, d) not in apart:
                    by_size[n] = sym
            shape[d] = sym
            symbols.append((path, d, sym.name))
        swapped.append((t, t._data))
        t._data = AbstractArray(tuple(shape), t._data.dtype)
    return swapped, symbols


def _source_text(path: tuple, dim: int) -> str:
    where = ("args" if path[0] == 0 else "kwargs") + "".join(f"[{p!r}]" for p in path[1:])
    return f"{where}.size({dim})"


def trace_call(fn: Callable, args: tuple, kwargs: dict | None = None,
               name: str | None = None, abstract: bool = True,
               dynamic: dict | None = None, apart: frozenset = frozenset()) -> TraceResult:
    """Run `fn(*args, **kwargs)` once under a Tracer; return the graph and its bindings.

    `abstract` (the default): in abstract evaluation, so no kernel runs and no tensor that
    existed before the call changes (see the module docstring); else every op runs eagerly.
    `dynamic` ({argument path: dims}): those argument dimensions are traced as symbolic sizes
    (graphc.symbolic) in a new ShapeEnv, active for the trace; the result's `symbols` and
    `shape_env` say which and what the trace assumed about them; equal sizes share a symbol
    except the dims in `apart` ({(path, dim)}). Activate `result.shape_env` again while
    running passes over the graph."""
    kwargs = kwargs or {}
    if current_tracer() is not None:
        raise TraceError("graphc.trace cannot be nested: a trace is already running")
    if dynamic:
        env = ShapeEnv()
        with env.active():
            return _trace_symbolic(fn, args, kwargs, name, abstract, dynamic, env, apart)
    return _trace_call(fn, args, kwargs, name, abstract)


def _trace_symbolic(fn, args, kwargs, name, abstract, dynamic, env, apart) -> TraceResult:
    if not abstract:
        raise TraceError("a symbolic trace is abstract: it has no sizes to run kernels with")
    swapped, symbols = _symbolic_arguments(args, kwargs, dynamic, env, apart)
    try:
        traced = _trace_call(fn, args, kwargs, name, abstract)
    finally:
        for t, array in swapped:  # an in-place write the trace made to one changed no data
            t._data = array
    traced.symbols = symbols
    traced.shape_env = env
    return traced


def _trace_call(fn: Callable, args: tuple, kwargs: dict, name: str | None,
                abstract: bool) -> TraceResult:
    holders = [(t, path) for _, t, path in grad_holders(fn, args, kwargs)]
    arg_names = _arg_names(fn, args)
    tracer = Tracer(name or graph_name(fn), storage_names(fn, args, kwargs, arg_names), holders)
    for path, t in flatten((args, kwargs)):
        if id(t._data) in tracer._values:
            continue  # the same tensor passed twice: one input
        label = arg_names[path[1]] if path[0] == 0 else str(path[1])
        suffix = "".join(f"_{p}" for p in path[2:])
        tracer.add_input(t, label + suffix, ArgBinding(path))
    previous_provider = _random.set_seed_provider(tracer.seed_input)
    set_tracer(tracer)
    try:
        with abstract_eval(abstract):
            result = fn(*args, **kwargs)
    except BaseException as err:
        set_tracer(None)
        tracer.restore()
        if isinstance(err, TraceError):
            _locate(err)
        raise
    finally:
        set_tracer(None)
        _random.set_seed_provider(previous_provider)
    flat = [t for _, t in flatten(result)]
    index: dict[int, int] = {}
    outputs = []
    for t in flat:
        if id(t) not in index:
            index[id(t)] = len(outputs)
            outputs.append(t)
    if abstract:
        found = reachable(fn, args, kwargs)
        _check_reached(fn, tracer, found)
        escaped = _escaped(found, tracer.start_serial, outputs)
    else:
        escaped = []
    escaped_at = tracer.finish(outputs, escaped)
    tracer.settle_generators()
    aliases = {}
    for i, t in enumerate(outputs):
        for j, b in enumerate(tracer.bindings):
            if isinstance(b, ArgBinding):
                bound = at((args, kwargs), b.path)
            elif isinstance(b, TensorBinding):
                bound = b.tensor
            elif isinstance(b, GradBinding):
                bound = tracer._input_of[tracer.graph.inputs[j]]  # the .grad before the call
            else:
                bound = None
            if t is bound:
                aliases[i] = j
    output_grads = {}
    for i, t in enumerate(outputs):
        for k, go in enumerate(tracer.grad_outputs):
            if go.index is not None and go.resolve(args, kwargs)._grad is t:
                output_grads[i] = k
    return TraceResult(tracer.graph, tracer.bindings, output_spec(result, index), result, aliases,
                       tracer.grad_outputs, output_grads, restore=tracer.restore,
                       escaped=list(zip(escaped_at, escaped)))


def _check_reached(fn, tracer: Tracer, found: list) -> None:
    """Refuse a trace that stepped an optimizer the call cannot reach (`found`: `reachable`),
    one made before the call: its state would go unguarded, and state its step made lazily
    would stay abstract (no data) in it, where no compiled run gives it values."""
    reached = {id(obj) for _, obj in found}
    missed = [opt for key, opt in tracer.optimizers_stepped.items()
              if key not in reached and key not in tracer.optimizers_made]
    if not missed:
        return
    tracer.restore()

    def made_here(t) -> bool:
        return isinstance(t, Tensor) and t.is_abstract and t._serial >= tracer.start_serial

    for opt in missed:  # what the trace left in it (abstract tensors) goes again
        for group in opt.param_groups:
            for p in group["params"]:
                if made_here(p._grad):  # the walk took no note of its .grad before: None
                    p._grad = None
        for p in list(opt.state):
            state = opt.state[p]
            for key in [k for k, v in state.items() if made_here(v)]:
                del state[key]
            if not state:
                del opt.state[p]
    opt = missed[0]
    raise TraceError(
        f"graphc: `{graph_name(fn)}` steps an optimizer ({type(opt).__name__}) that graphc "
        "cannot reach from the function, so its state would not be guarded and the state its step "
        "makes would not be kept. graphc looks in the arguments, default argument values, "
        "closure cells, the globals the code names, a bound method's self, a "
        "functools.partial's arguments, and one level into the objects, lists and dicts "
        "found there (not into class attributes or Python modules). Hold the optimizer in "
        "one of those places (e.g. `def step(x, y, opt=opt)`), or pass it as an argument.")


def _escaped(reached: list, start_serial: int, outputs: list[Tensor]) -> list[Tensor]:
    """The abstract tensors an abstract trace made and left where the state that the call
    reaches holds them (`reached`: `reachable`): optimizer state created lazily, module
    parameters, buffers and tensor attributes assigned inside, tensors put into reachable
    containers. The function's own outputs are not among them (the compiled call returns
    those)."""
    from graphc.nn.module import Module
    from graphc.optim.optimizer import Optimizer

    found: list[Tensor] = []
    seen = {id(t) for t in outputs}

    def add(t) -> None:
        if isinstance(t, Tensor) and t.is_abstract and t._serial >= start_serial \
                and id(t) not in seen:
            seen.add(id(t))
            found.append(t)

    for _, obj in reached:
        if isinstance(obj, Module):
            for module in obj.modules():
                for value in vars(module).values():
                    add(value)
                for _, t in itertools.chain(module.named_parameters(recurse=False),
                                            module.named_buffers(recurse=False)):
                    add(t)
        elif isinstance(obj, Optimizer):
            for state in obj.state.values():
                for value in state.values():
                    add(value)
        else:
            add(obj)
    return found


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

    The trace is abstract (shapes and dtypes only, no kernel runs) and leaves no effect: no
    tensor changes, `.grad`s and random generators are as before, and optimizer state the
    call creates lazily is dropped. Run the function (or `graphc.compile` it) for its effects.

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
    state = LazyState(fn, example_inputs, kwargs)
    traced = trace_call(fn, example_inputs, kwargs)
    traced.restore()  # the trace changed no tensor; undo the .grads and draws it set
    state.drop_new()  # and the optimizer state it made (abstract tensors)
    return traced.graph
