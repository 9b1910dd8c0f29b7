"""Compile-and-compare: `assert_compiled_matches(fn, *inputs, backends=..., grads=True)`.

One call checks a function or Module on its example inputs, in up to two *checks*:
- forward: `fn(*inputs)`;
- grads (`grads=True`): a function that runs `fn` with every floating input requiring grad,
  sums each floating output times a fixed random projection (numpy seed 0, one standard
  normal array per output), and returns the outputs and `graphc.autograd.grad` of that sum
  w.r.t. every floating input and every tensor that requires grad among the parameters of
  the Modules `fn` reaches (itself, its `self`, its closure and named globals) and the leaf
  tensors it captures. Autograd runs eagerly inside the trace, so the traced graph holds the
  backward ops too.

Each check traces the function once with `graphc.jit.tracer.trace_call` (that run is the eager
result) and runs the traced graph on the interpreter and on each named backend
(`graphc.backends.compile(graph, name).run`). Eager, interpreter and every backend are then
compared, output by output and updated input by updated input (BatchNorm's running stats),
against a float64 reference: the same eager call with floating inputs converted to float64,
on float64 copies of what `fn` reaches: a Module is deep-copied and converted with
`.double()`; a bound method is rebound to such a copy; a plain function is rebuilt with its
closure cells and the globals it names replaced by copies (state reached only through other
functions is not converted).

Tolerances by the dtype of the checked value: float32 rtol 1e-4, atol 1e-5; float64 rtol and
atol 1e-10; integers and bools exactly. A value passes where |got - ref| <= atol * scale +
rtol * |ref|, scale = max(1, max |ref|) (so atol is relative to the tensor's magnitude).
`rtol`/`atol` given by the caller replace the floating defaults.

State: every run starts from the same state. Parameters, buffers and closure tensors the
function can reach (`captured_roots`) and the inputs are snapshot before the first trace and
restored after every run; random ops read `[seed, offset]` from a graph input bound to the
generator (`RngBinding`), which every run (the reference included) gets at the offset the
trace started from, so dropout draws the same mask everywhere. On return the model, inputs
and generators are as they were before the call. Code that updates in place a tensor reached
some other way (an optimizer's state) cannot be checked: that raises GraphcError.

On a mismatch a `CompiledMismatch` (an AssertionError) is raised. For a backend, the harness
bisects to the first node whose output diverges from the interpreter (the oracle; see
`graphc.testing.repro.first_divergent_node`) and writes a repro to `repro_dir` (a fresh temporary
directory by default): that node alone, with its inputs as graph inputs holding the
interpreter's values, as `.gir` + `.npz`; if the node alone runs right on the backend, the
nodes up to it that it depends on. The message names the node as its IR text line with its
user source location, the max abs/rel errors, and the repro paths with the commands that
rerun them. A mismatch of eager graphc or of the interpreter is reported without bisection:
it is not a backend's fault.
"""

from __future__ import annotations

import copy
import itertools
import os
import tempfile
import types

import numpy as np

from graphc.autograd import grad as autograd_grad
from graphc.backends import check_backend
from graphc.backends import compile as compile_graph
from graphc.errors import GraphcError
from graphc.ir.graph import Graph, Value
from graphc.ir.interpreter import Interpreter
from graphc.ir.printer import format_node
from graphc.jit.bindings import ArgBinding, RngBinding, TensorBinding
from graphc.jit.pytree import flatten
from graphc.jit.reach import captured_roots, global_names
from graphc.jit.tracer import graph_name, trace_call
from graphc.nn.module import Module
from graphc.ops import random as _random
from graphc.tensor import Tensor
from graphc.testing.repro import first_divergent_node, record_values, run_repro, write_node_repro
from graphc.types import float64

DEFAULT_TOLERANCES = {"float32": (1e-4, 1e-5), "float64": (1e-10, 1e-10)}


class CompiledMismatch(AssertionError):
    """A run differs from the float64 reference. Attributes: `run` ("eager", "interp" or a
    backend name), `check`, `label`, and, for a bisected backend, `node`, `node_text`,
    `gir_path`, `npz_path` (None otherwise)."""

    def __init__(self, message: str, **info) -> None:
        super().__init__(message)
        self.run = self.check = self.label = None
        self.node = self.node_text = self.gir_path = self.npz_path = None
        self.__dict__.update(info)


# ---- comparison -------------------------------------------------------------------------------
def tolerance(dtype_name: str, rtol=None, atol=None) -> tuple[float, float]:
    """(rtol, atol) for values of a dtype; (0, 0) for integers and bools."""
    if dtype_name not in DEFAULT_TOLERANCES:
        return 0.0, 0.0
    d_rtol, d_atol = DEFAULT_TOLERANCES[dtype_name]
    return (d_rtol if rtol is None else rtol), (d_atol if atol is None else atol)


def compare(got, ref, rtol: float, atol: float) -> tuple[float, float, int] | None:
    """None when `got` matches `ref` (see the module docstring), else (max abs error, max
    relative error, number of elements out of tolerance)."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return float("inf"), float("inf"), max(got.size, ref.size)
    if got.dtype.kind not in "fc" or ref.dtype.kind not in "fc":
        bad = got != ref
        return (1.0, 1.0, int(bad.sum())) if bad.any() else None
    g, r = got.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(r)
    scale = max(1.0, float(np.abs(r[finite]).max())) if finite.any() else 1.0
    with np.errstate(all="ignore"):
        err = np.abs(g - r)
        same = (g == r) | (np.isnan(g) & np.isnan(r))
        bad = ~same & ~(err <= atol * scale + rtol * np.abs(r))
        if not bad.any():
            return None
        rel = err / np.abs(r)  # over the elements off where the reference is not 0
    nonzero = bad & (r != 0)
    max_rel = float(np.nanmax(rel[nonzero])) if nonzero.any() else float("inf")
    return float(np.nanmax(np.where(same, 0.0, err))), max_rel, int(bad.sum())


def _error_text(err) -> str:
    return f"max abs error {err[0]:.3g}, max rel error {err[1]:.3g} ({err[2]} elements off)"


# ---- state: snapshot and restore --------------------------------------------------------------
class _State:
    """The values of every tensor the function can reach, and the generators' offsets."""

    def __init__(self, fn, inputs) -> None:
        tensors: dict[int, Tensor] = {id(t): t for _, t in flatten(list(inputs))}
        for _, obj in captured_roots(fn):
            if isinstance(obj, Module):
                for t in itertools.chain(obj.parameters(), obj.buffers()):
                    tensors[id(t)] = t
            elif isinstance(obj, Tensor):
                tensors[id(obj)] = obj
        self.saved = {k: (t, t._data.copy()) for k, t in tensors.items()}
        self.generators = {id(_random.default_generator):
                           (_random.default_generator, _random.default_generator.offset)}

    def add_generator(self, gen, offset: int) -> None:
        self.generators.setdefault(id(gen), (gen, offset))

    def restore(self) -> None:
        for t, data in self.saved.values():
            if t._data.shape == data.shape and t._data.dtype == data.dtype:
                np.copyto(t._data, data)
            else:
                t._data = data.copy()
        for gen, offset in self.generators.values():
            gen.set_state(np.array([gen.initial_seed(), offset], np.uint64).view(np.int64))


# ---- one check: trace, run everything, compare ------------------------------------------------
def _leaves(spec, path=()):
    """(path, output index) of every traced output in `out_spec`, in `flatten` order."""
    if type(spec) is tuple and len(spec) == 2 and spec[0] in ("out", "const"):
        if spec[0] == "out":
            yield path, spec[1]
    elif isinstance(spec, (tuple, list)):
        for i, s in enumerate(spec):
            yield from _leaves(s, path + (i,))
    elif isinstance(spec, dict):
        for k, s in spec.items():
            yield from _leaves(s, path + (k,))


def _at(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def _to_float64(t):
    if isinstance(t, Tensor) and t.is_floating_point():
        return t.detach().to(float64).requires_grad_(t.requires_grad)
    return t


def _array(t) -> np.ndarray:
    return np.array(t._data, copy=True)


def _run_check(check: str, fn, args: tuple, ref_fn, ref_args: tuple, labeler, twin,
               state: _State, backends, rtol, atol, repro_dir):
    """Trace `fn` on `args`, run eager/interpreter/backends and `ref_fn` on `ref_args`, and
    compare; returns what the eager (tracing) call returned. `twin(t)` is the reference's
    copy of a captured tensor `t`."""
    traced = trace_call(fn, args, abstract=False)  # eager: its values are compared
    graph = traced.graph
    leaves = {}
    for path, i in _leaves(traced.out_spec):
        leaves.setdefault(i, path)
    eager = [_array(_at(traced.result, leaves[i])) for i in range(len(graph.outputs))]
    labels = [labeler(leaves[i]) for i in range(len(graph.outputs))]
    bound = dict(zip(graph.inputs, traced.bindings))
    for t, _ in graph.updates:
        b = bound[t]
        if isinstance(b, TensorBinding) and id(b.tensor) not in state.saved:
            raise GraphcError(f"assert_compiled_matches: the traced code updates %{t.name}, "
                              "a tensor reached other than through the inputs, a Module or "
                              "a closure; its value before the call is lost: pass it in")
    eager += [_array(_binding_tensor(bound[t], args)) for t, _ in graph.updates]
    labels += [f"update of %{t.name}" for t, _ in graph.updates]
    for b in traced.bindings:
        if isinstance(b, RngBinding):
            state.add_generator(b.generator, (b.generator.offset - b.counters) % (1 << 63))
    state.restore()
    arrays = [_input_array(b, args) for b in traced.bindings]

    ref_result = ref_fn(*ref_args)
    ref = [_array(_at(ref_result, leaves[i])) for i in range(len(graph.outputs))]
    ref += [_array(_binding_tensor(bound[t], ref_args) if isinstance(bound[t], ArgBinding)
                   else twin(bound[t].tensor)) for t, _ in graph.updates]
    state.restore()

    dtypes = [v.type.dtype.name for v in graph.outputs] + \
        [t.type.dtype.name for t, _ in graph.updates]
    runs = [("eager", eager), ("interp", Interpreter(graph).run(*arrays))]
    runs += [(b, compile_graph(graph, b).run(*(a.copy() for a in arrays))) for b in backends]
    for run, values in runs:
        for got, want, dtype, label in zip(values, ref, dtypes, labels):
            r_tol, a_tol = tolerance(dtype, rtol, atol)
            err = compare(got, want, r_tol, a_tol)
            if err is None:
                continue
            head = (f"{run} differs from the float64 reference in the {check} check of "
                    f"@{graph.name}, on {label} ({dtype}): {_error_text(err)}; "
                    f"rtol={r_tol:g}, atol={a_tol:g} x max(1, max|ref|)")
            if run == "eager":
                raise CompiledMismatch(
                    head + ".\nEager graphc itself is off: float32 rounding of this function "
                    "or an eager bug, not the compiler. Pass larger rtol/atol, or float64 "
                    "inputs and model, if the rounding is expected.",
                    run=run, check=check, label=label)
            if run == "interp":
                raise CompiledMismatch(
                    head + ".\nThe interpreter (the oracle) disagrees with eager graphc on "
                    "the traced graph: a tracing or interpreter bug, not a backend's.",
                    run=run, check=check, label=label)
            raise _bisected(head, run, check, label, graph, arrays, rtol, atol,
                            repro_dir or tempfile.mkdtemp(prefix="graphc-repro-"))
    return traced.result


def _binding_tensor(binding, args) -> Tensor:
    if isinstance(binding, ArgBinding):
        return _at((args, {}), binding.path)
    return binding.tensor


def _input_array(binding, args) -> np.ndarray:
    """The value of one graph input as the trace started (the state is restored)."""
    if isinstance(binding, RngBinding):
        gen = binding.generator
        return np.array([gen.initial_seed(), gen.offset], np.uint64).view(np.int64)
    if isinstance(binding, (ArgBinding, TensorBinding)):
        return _array(_binding_tensor(binding, args))
    return np.array(binding.array, copy=True)  # data the traced code made (ConstantBinding)


# ---- bisection and the repro ------------------------------------------------------------------
def _bisected(head: str, backend: str, check: str, label: str, graph: Graph, arrays,
              rtol, atol, repro_dir: str) -> CompiledMismatch:
    def differs(value: Value, got, expected):
        return compare(got, expected, *tolerance(value.type.dtype.name, rtol, atol))

    values = record_values(graph, arrays)
    found = first_divergent_node(graph, backend, values, differs)
    if found is None:
        return CompiledMismatch(
            head + f".\nNo single node diverges from the interpreter under backend "
            f"{backend!r}: the difference only shows on the whole graph.",
            run=backend, check=check, label=label)
    index, err = found
    node = graph.nodes[index]
    gir, npz, isolated = write_node_repro(graph, index, backend, values, differs,
                                          os.path.join(repro_dir, f"{graph.name}_{check}"))
    what = ("the node alone, its inputs as graph inputs" if isolated else
            "the graph up to the node, as the node alone computes right")
    message = (
        f"{head}.\nFirst node whose output diverges from the interpreter under backend "
        f"{backend!r} (node {index} of {len(graph.nodes)}), {_error_text(err)}:\n"
        f"  {format_node(node)}\n"
        f"Repro, {what}:\n  {gir}\n  {npz}\n"
        f"  graphc run {gir} --inputs {npz} --backend {backend}\n"
        f"  graphc.testing.run_repro({gir!r}, {npz!r}, backend={backend!r})")
    return CompiledMismatch(message, run=backend, check=check, label=label, node=node,
                            node_text=format_node(node), gir_path=gir, npz_path=npz)


# ---- the gradient check's function -------------------------------------------------------------
def _with_grads(model, n_inputs: int, params: list):
    """A function of (*inputs, *projections) returning (fn's outputs, gradients) (see the
    module docstring)."""

    def forward_and_grads(*args):
        inputs, projections = args[:n_inputs], args[n_inputs:]
        out = model(*inputs)  # `model`: traced parameters are named model.<name>
        floats = [t for _, t in flatten(out) if t.is_floating_point()]
        terms = [(o * p).sum() for o, p in zip(floats, projections) if o.requires_grad]
        wrt = [a for a in inputs if isinstance(a, Tensor) and a.requires_grad] + params
        if not terms or not wrt:
            return out, ()
        loss = terms[0]
        for term in terms[1:]:
            loss = loss + term
        return out, tuple(autograd_grad(loss, wrt, allow_unused=True))

    forward_and_grads.__name__ = graph_name(model) + "_grads"
    return forward_and_grads


def _projections(out) -> list[Tensor]:
    rng = np.random.default_rng(0)
    return [Tensor._wrap(rng.standard_normal(t.shape).astype(t.dtype.np))
            for _, t in flatten(out) if t.is_floating_point()]


# ---- the float64 reference --------------------------------------------------------------------
def _parameters(fn) -> list[tuple[str, Tensor]]:
    """(name, tensor) of the parameters of the Modules `fn` reaches, and of the leaf tensors
    it captures, that require grad, each once."""
    seen, out = set(), []
    for prefix, obj in captured_roots(fn):
        named = obj.named_parameters() if isinstance(obj, Module) else \
            [("", obj)] if isinstance(obj, Tensor) and obj.grad_fn is None else []
        for n, p in named:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                out.append((".".join(x for x in (prefix, n) if x), p))
    return out


class _Float64Twin:
    """`fn` run on float64 copies of the Modules and floating tensors it reaches: a Module is
    deep-copied and converted with `.double()`; a bound method is rebound to such a copy; a
    function is rebuilt with its closure cells and the globals it names replaced. `twin(t)`
    is the copy of an original tensor (the tensor itself when it was not copied)."""

    def __init__(self, fn) -> None:
        self._copies: dict[int, object] = {}
        self._pairs: list[tuple[Module, Module]] = []
        if isinstance(fn, Module):
            self.fn = self._copy(fn)
        elif isinstance(getattr(fn, "__self__", None), Module):
            self.fn = types.MethodType(fn.__func__, self._copy(fn.__self__))
        elif isinstance(getattr(fn, "__code__", None), types.CodeType):
            code, glb = fn.__code__, fn.__globals__
            cells = tuple(types.CellType(self._copy(c.cell_contents)) if _full(c) else c
                          for c in fn.__closure__ or ())
            names = {n: self._copy(glb[n]) for n in global_names(code) if n in glb}
            if any(names[n] is not glb[n] for n in names):
                glb = {**glb, **names}
            self.fn = types.FunctionType(code, glb, fn.__name__, fn.__defaults__,
                                         cells or None)
            self.fn.__kwdefaults__ = fn.__kwdefaults__
        else:
            self.fn = fn
        self._twins = {id(t): t2 for m, m2 in self._pairs for t, t2 in zip(
            itertools.chain(m.parameters(), m.buffers()),
            itertools.chain(m2.parameters(), m2.buffers()))}
        self._twins.update({k: v for k, v in self._copies.items() if isinstance(v, Tensor)})

    def _copy(self, obj):
        if id(obj) not in self._copies:
            if isinstance(obj, Module):
                self._copies[id(obj)] = twin = copy.deepcopy(obj).double()
                self._pairs.append((obj, twin))
            elif isinstance(obj, Tensor):
                self._copies[id(obj)] = _to_float64(obj)
            else:
                return obj
        return self._copies[id(obj)]

    def twin(self, t: Tensor) -> Tensor:
        return self._twins.get(id(t), t)


def _full(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell
        return False
    return True


# ---- the entry point --------------------------------------------------------------------------
def assert_compiled_matches(fn, *inputs, backends=("interp",), grads: bool = True,
                            rtol: float | None = None, atol: float | None = None,
                            repro_dir: str | None = None) -> None:
    """Check eager, the interpreter and each backend against a float64 reference, forward and
    (with `grads`) gradients; raise `CompiledMismatch` naming the first divergent node and a
    repro on a mismatch (see the module docstring).

    >>> import graphc
    >>> def f(x):
    ...     return (x * 2).relu().sum(0)
    >>> assert_compiled_matches(f, graphc.randn(3, 4))
    """
    for b in backends:
        check_backend(b)
    state = _State(fn, inputs)
    options = dict(state=state, backends=backends, rtol=rtol, atol=atol, repro_dir=repro_dir)

    def output_label(path) -> str:
        return "output " + ".".join(str(p) for p in path) if path else "the output"

    try:
        ref = _Float64Twin(fn)
        out = _run_check("forward", fn, tuple(inputs), ref.fn,
                         tuple(_to_float64(t) for t in inputs), output_label, ref.twin,
                         **options)
        if not grads:
            return
        projections = _projections(out)
        grad_inputs = tuple(t.detach().clone().requires_grad_(True)
                            if isinstance(t, Tensor) and t.is_floating_point() else t
                            for t in inputs)
        params = _parameters(fn)
        wrt_labels = [f"grad of input {i}" for i, t in enumerate(grad_inputs)
                      if isinstance(t, Tensor) and t.requires_grad]
        wrt_labels += [f"grad of parameter {n}" for n, _ in params]

        def grad_label(path) -> str:
            return output_label(path[1:]) if path[0] == 0 else wrt_labels[path[1]]

        ref = _Float64Twin(fn)  # fresh copies: the forward's reference run changed buffers
        args = grad_inputs + tuple(projections)
        _run_check("grads", _with_grads(fn, len(inputs), [p for _, p in params]), args,
                   _with_grads(ref.fn, len(inputs), [ref.twin(p) for _, p in params]),
                   tuple(_to_float64(t) for t in args), grad_label, ref.twin, **options)
    finally:
        state.restore()


__all__ = ["CompiledMismatch", "assert_compiled_matches", "compare", "run_repro", "tolerance"]
