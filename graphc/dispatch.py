"""The one dispatch point all tensor math goes through.

`apply(opdef, *inputs, **attrs)` checks the inputs against the op's shape/dtype rule, then
runs the numpy kernel (eager mode) or, in abstract evaluation, only that rule, wraps the
results, and, when grad mode is on and an input requires grad, attaches an `OpBackward` node.
Inside a trace the active tracer is then told of the application and records an IR node.
The in-place variant, `apply_inplace` (graphc.autograd.inplace, installed here as the registry's
in-place dispatcher), computes the out-of-place result with history, writes it into the
target, bumps the target's version counter, and rebases the target's history onto the new
node (PyTorch's semantics, including its errors for leaves that require grad and for shape
changes).

Abstract evaluation (`abstract_eval()`; JAX's abstract eval, PyTorch's FakeTensor mode): ops
run their `OpDef.infer` rule only and return *abstract* tensors, which have a shape, a dtype
and autograd state but no data (`Tensor.is_abstract`; their array is a `graphc.tensor.
AbstractArray`, whose values cannot be read). Autograd works unchanged on them (VJPs are ops
too), so a forward and its backward cost time in the number of ops, not in tensor sizes.
Concrete tensors (parameters, inputs) may be read by ops in that mode; an in-place write into
one changes no data: inside a trace the tracer rebinds the tensor to the written value (the
compiled graph makes the change), outside one it is refused. `derive_backward` and
`graphc.trace` / `graphc.compile` run in this mode.

The tracer hook (`set_tracer`) and the abstract flag are per thread: a trace in one thread does
not see ops that another thread runs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numpy as np

from graphc.autograd import grad_mode
from graphc.autograd.grad_mode import is_grad_enabled
from graphc.autograd.graph import OpBackward, gradient_edge
from graphc.backends import residency
from graphc.backends.residency import stale as _device_copies
from graphc.errors import GraphcError, where
from graphc.ops import registry
from graphc.ops.registry import OpDef
from graphc.symbolic import current_env
from graphc.types import TensorType, bool_, float32, int64, promote


class _DispatchState(threading.local):
    """This thread's tracer (an object with `record(opdef, inputs, attrs, outputs)`, `alias`,
    `before_write` and `rebind`; None outside a trace) and abstract-evaluation flag."""

    tracer = None
    abstract = False


_state = _DispatchState()
state = _state  # read directly by graphc.compile's per-call fast path (no call: no frame)


def set_tracer(tracer) -> object:
    """Install this thread's tracer (None to remove); returns the previous one to restore."""
    previous, _state.tracer = _state.tracer, tracer
    return previous


def current_tracer():
    """This thread's tracer, or None outside a trace."""
    return _state.tracer


def is_abstract() -> bool:
    """Whether ops run in abstract evaluation (shape/dtype rules only) in this thread."""
    return _state.abstract


@contextlib.contextmanager
def abstract_eval(enabled: bool = True) -> Iterator[None]:
    """Run ops by their shape/dtype rule only (see the module docstring).

    >>> import graphc
    >>> x = graphc.ones(8192, 784)
    >>> with abstract_eval():
    ...     y = (x @ graphc.ones(784, 10)).relu()
    >>> y.shape, y.is_abstract
    (graphc.Size([8192, 10]), True)
    """
    previous, _state.abstract = _state.abstract, bool(enabled)
    try:
        yield
    finally:
        _state.abstract = previous


def scalar_dtype(value, like):
    """PyTorch's weak typing of Python scalars: a float tensor keeps its dtype."""
    if like is not None and like.dtype.is_floating:
        return like.dtype
    if isinstance(value, bool):
        return bool_ if like is None or like.dtype is bool_ else like.dtype
    if isinstance(value, (int, np.integer)):
        return int64
    return float32


def _tensorize(opdef: OpDef, inputs: tuple) -> tuple:
    """Turn Python scalars among the inputs into 0-d tensors typed after the tensor inputs."""

    if all(isinstance(t, Tensor) for t in inputs):
        return inputs
    like = None
    for t in inputs:
        if isinstance(t, Tensor) and (like is None or promote(like.dtype, t.dtype) is t.dtype):
            like = t
    out = []
    for i, t in enumerate(inputs):
        if isinstance(t, (bool, int, float, np.number, np.bool_)):
            t = Tensor._wrap(np.asarray(t, dtype=scalar_dtype(t, like).np))
        elif not isinstance(t, Tensor):
            raise TypeError(
                f"{where(opdef.name)}: input {i} must be a graphc.Tensor or a number, "
                f"got {type(t).__name__}"
            )
        out.append(t)
    return tuple(out)


def _fetch_inputs(inputs: tuple) -> None:
    """Bring the inputs' host arrays up to date where a device holds a newer value
    (graphc.backends.residency), so the eager path may read `_array`; other tensors' marks
    stay (a live executable's resident parameters cost nothing until read)."""
    for t in inputs:
        array = getattr(t, "_array", None)
        if array is not None:
            residency.fresh(array)


def _check_inputs(opdef: OpDef, inputs: tuple) -> None:
    if not opdef.variadic and len(inputs) != len(opdef.inputs):
        raise GraphcError(
            f"{where(opdef.name)}: takes {len(opdef.inputs)} tensor inputs "
            f"{opdef.inputs}, got {len(inputs)}"
        )


def apply(opdef: OpDef, *inputs, **attrs):
    """Run one op on tensors: eagerly (with autograd) or, inside a trace, as an IR node."""
    state = _state
    if state.tracer is None and not state.abstract:
        if _device_copies:  # some host arrays wait for a device value: fetch this op's first
            _fetch_inputs(inputs)
        try:  # the eager path, for types seen before (see _apply_eager)
            key = _eager_key(opdef.name, _attrs_key(attrs) if attrs else (), inputs)
        except AttributeError:  # a numpy number, or something that is no operand
            key = _key_with_numbers(opdef, inputs, attrs)
        try:
            plan = _EAGER.get(key)
        except TypeError:  # an unhashable attribute value
            plan = key = None
        if plan is not None:
            return _apply_eager(opdef, inputs, attrs, plan)
    else:
        key = None
    inputs = _tensorize(opdef, inputs)
    _check_inputs(opdef, inputs)
    out_types = _inferred(opdef, inputs, attrs)
    if key is not None:
        _remember_plan(key, opdef, inputs, out_types)
    single = isinstance(out_types, TensorType)
    if single:
        out_types = (out_types,)
    if _state.abstract:
        outputs = tuple(_abstract_output(opdef, ty, inputs, attrs) for ty in out_types)
    else:
        with np.errstate(all="ignore"):  # inf/nan follow IEEE as in PyTorch, without warnings
            result = opdef.kernel(*(t._data for t in inputs), **attrs)
        arrays = (result,) if single else tuple(result)
        outputs = tuple(_wrap_output(opdef, a, ty, inputs, attrs)
                        for a, ty in zip(arrays, out_types))

    if (
        opdef.vjp is not None
        and is_grad_enabled()
        and any(t.requires_grad for t in inputs)
        and any(ty.dtype.is_floating for ty in out_types)
    ):
        edges = tuple(gradient_edge(t) for t in inputs)
        node = OpBackward(opdef, inputs, outputs, attrs, edges)
        for nr, out in enumerate(outputs):
            if out.dtype.is_floating:
                out._set_history(node, nr)
    tracer = _state.tracer
    if tracer is not None:
        tracer.record(opdef, inputs, attrs, outputs)
    return outputs[0] if single else outputs


# ---- the eager path -------------------------------------------------------------------------
# Outside a trace and abstract evaluation, with every array current (no device holds a newer
# value: graphc.backends.residency), an op whose (name, attributes, input types) it has seen
# before skips the checks `apply` made then (arity, scalar typing, the shape rule) and reads
# what they gave from an _EagerPlan. It then runs the same kernel on the same arrays, checks
# the result against the plan's types as `_wrap_output` does, and records the same autograd
# node, so its results are those of the general path bit for bit. Python numbers among the
# inputs are keyed by their type (which decides the dtype they take, `scalar_dtype`).

_NUMBER_TYPES = (bool, int, float, np.number, np.bool_)
_PYTHON_NUMBERS = frozenset((bool, int, float))


class _EagerPlan:
    """What the eager path needs of one (op, attributes, input types): the dtype each Python
    number among the inputs takes (`number_dtypes` graphc's, `numbers` numpy's, None for a
    tensor; both None where no input is a number), the result types and their numpy dtypes,
    and, for autograd, whether the op may record, the input types and the nodes' metadata."""

    __slots__ = ("input_meta", "input_types", "may_record", "node_types", "number_dtypes",
                 "numbers", "numpy_dtypes", "single", "types")

    def __init__(self, opdef: OpDef, inputs: tuple, numbers: tuple, out_types) -> None:
        self.number_dtypes = numbers if any(d is not None for d in numbers) else None
        self.numbers = None if self.number_dtypes is None else tuple(
            [None if d is None else np.dtype(d.np) for d in numbers])
        self.input_types = tuple([t.type for t in inputs])
        self.input_meta = tuple([(ty.shape, ty.dtype) for ty in self.input_types])
        self.single = isinstance(out_types, TensorType)
        self.types = (out_types,) if self.single else tuple(out_types)
        self.numpy_dtypes = tuple([np.dtype(ty.dtype.np) for ty in self.types])
        self.node_types = (self.input_types, self.types)
        self.may_record = opdef.vjp is not None and any(ty.dtype.is_floating
                                                        for ty in self.types)


_EAGER: dict = {}  # _eager_key(...) -> _EagerPlan
_EAGER_LIMIT = 4096


def _attrs_key(attrs: dict) -> tuple:
    """Attributes keyed with their Python types (1, 1.0 and True differ)."""
    return tuple([(k, type(v), v) for k, v in attrs.items()]) if attrs else ()


def _eager_key(name: str, attrs_key: tuple, inputs: tuple) -> tuple:
    """(op name, attrs key, then per input its shape and dtype, or its type and None for a
    Python number). Written out for one and two inputs: a comprehension costs more than the
    rest of the key. Raises AttributeError for other inputs (`_key_with_numbers` takes them)."""
    if len(inputs) == 2:
        x, y = inputs
        if type(y) in _PYTHON_NUMBERS:
            return (name, attrs_key, x._array.shape, x._dtype, type(y), None)
        if type(x) in _PYTHON_NUMBERS:
            return (name, attrs_key, type(x), None, y._array.shape, y._dtype)
        return (name, attrs_key, x._array.shape, x._dtype, y._array.shape, y._dtype)
    if len(inputs) == 1:
        x = inputs[0]
        return (name, attrs_key, x._array.shape, x._dtype)
    parts = [name, attrs_key]
    for t in inputs:
        parts += (t._array.shape, t._dtype)
    return tuple(parts)


def _key_with_numbers(opdef: OpDef, inputs: tuple, attrs: dict) -> tuple | None:
    """`_eager_key` of inputs among which are numpy numbers (None for anything else)."""
    parts = [opdef.name, _attrs_key(attrs)]
    for t in inputs:
        if isinstance(t, Tensor):
            parts += (t._array.shape, t._dtype)
        elif isinstance(t, _NUMBER_TYPES):
            parts += (type(t), None)
        else:
            return None
    return tuple(parts)


def _remember_plan(key: tuple, opdef: OpDef, inputs: tuple, out_types) -> None:
    """Keep the plan of a general `apply` call whose inputs (`_tensorize`d) are all concrete;
    `key` was made from the caller's inputs, so it tells numbers from tensors."""
    if current_env() is not None or not all(type(t._array) is np.ndarray for t in inputs):
        return
    numbers = tuple([None if type(key[2 + 2 * i]) is tuple else t._dtype
                     for i, t in enumerate(inputs)])
    if len(_EAGER) >= _EAGER_LIMIT:
        _EAGER.clear()
    _EAGER[key] = _EagerPlan(opdef, inputs, numbers, out_types)


# numpy's floating-point error state is a context variable (numpy 2); the eager path sets it
# to "ignore" (inf/nan follow IEEE as in PyTorch, without warnings) from a state made once.
# Where numpy keeps it elsewhere, np.errstate does the same, slower.
try:
    from numpy._core._ufunc_config import _extobj_contextvar as _NUMPY_ERRORS

    with np.errstate(all="ignore"):
        _NUMPY_IGNORING = _NUMPY_ERRORS.get()
except ImportError:  # pragma: no cover (numpy < 2)
    _NUMPY_ERRORS = _NUMPY_IGNORING = None


_new = object.__new__


def _apply_eager(opdef: OpDef, inputs: tuple, attrs: dict, plan: _EagerPlan):
    """`apply` on inputs whose types `plan` was made for (see the section's comment): the
    kernel, the wrap, the history. Arrays are read as `_array`, not through the fetching
    `_data` property (the caller fetched any newer device copy: `_fetch_inputs`)."""
    numbers = plan.numbers
    if numbers is not None:  # numbers become 0-d arrays, as `_tensorize` makes them
        arrays = _number_arrays(inputs, numbers)
    elif len(inputs) == 2:
        arrays = (inputs[0]._array, inputs[1]._array)
    elif len(inputs) == 1:
        arrays = (inputs[0]._array,)
    else:
        arrays = [t._array for t in inputs]
    if _NUMPY_ERRORS is None:
        with np.errstate(all="ignore"):
            result = opdef.kernel(*arrays, **attrs)
    else:  # np.errstate(all="ignore") without building its state each time (1.3 us)
        token = _NUMPY_ERRORS.set(_NUMPY_IGNORING)
        try:
            result = opdef.kernel(*arrays, **attrs)
        finally:
            _NUMPY_ERRORS.reset(token)
    if plan.single:
        outputs = (_eager_output(opdef, result, plan.types[0], plan.numpy_dtypes[0], inputs,
                                 attrs),)
    else:
        outputs = tuple([_eager_output(opdef, array, ty, want, inputs, attrs)
                         for array, ty, want in zip(result, plan.types, plan.numpy_dtypes)])
    if plan.may_record and _grad_mode.enabled:
        for t in inputs:
            if getattr(t, "_requires_grad", False):  # (a number among the inputs has none)
                if numbers is not None:
                    inputs = _numbers_as_tensors(inputs, arrays, plan.number_dtypes)
                _record(opdef, inputs, outputs, attrs, plan)
                break
    return outputs[0] if plan.single else outputs


def _number_arrays(inputs: tuple, numbers: tuple) -> tuple:
    """The inputs' arrays, each Python number made a 0-d array of its planned dtype (`numbers`:
    np.dtype or None per input). Written out for two inputs (a comprehension costs more)."""
    if len(inputs) == 2:
        (x, y), (x_dtype, y_dtype) = inputs, numbers
        return (x._array if x_dtype is None else np.asarray(x, x_dtype),
                y._array if y_dtype is None else np.asarray(y, y_dtype))
    return tuple([t._array if dtype is None else np.asarray(t, dtype)
                  for t, dtype in zip(inputs, numbers)])


def _numbers_as_tensors(inputs: tuple, arrays: tuple, dtypes: tuple) -> tuple:
    """The inputs with each Python number replaced by a 0-d tensor around its array (for the
    autograd node, which keeps tensors); `dtypes`: the graphc dtype of each, None for a
    tensor. Written out for two inputs, as `_number_arrays`."""
    if len(inputs) == 2:
        (x, y), (x_dtype, y_dtype) = inputs, dtypes
        return (x if x_dtype is None else Tensor._result(arrays[0], x_dtype),
                y if y_dtype is None else Tensor._result(arrays[1], y_dtype))
    out = list(inputs)
    for i, dtype in enumerate(dtypes):
        if dtype is not None:
            out[i] = Tensor._result(arrays[i], dtype)
    return tuple(out)


def _eager_output(opdef: OpDef, array, ty: TensorType, want: np.dtype, inputs: tuple,
                  attrs: dict):
    """The tensor around a kernel's result `array`, checked and cast as `_wrap_output` does
    (`want` is np.dtype(ty.dtype.np))."""
    if type(array) is not np.ndarray:
        array = np.asarray(array)
    if array.dtype is not want and array.dtype != want:
        array = array.astype(want)
    if array.shape != ty.shape:
        _wrong_shape(opdef, array, ty)
    out = _new(Tensor)  # Tensor._result(array, ty.dtype), inlined: one tensor per op
    out._array = array
    out._dtype = ty.dtype
    out._serial = next(tensor_serials)
    out._version_counter = VersionCounter()
    if opdef.view and np.shares_memory(array, inputs[0]._array):
        _make_view(out, inputs[0], opdef, attrs)
    return out


def _record(opdef: OpDef, inputs: tuple, outputs: tuple, attrs: dict, plan: _EagerPlan):
    """Attach the OpBackward node of this application to its floating outputs. The edges are
    `gradient_edge` of each input, inlined (one call per input costs more than the rest)."""
    edges = []
    for t in inputs:
        node = t.grad_fn
        if node is not None:
            edges.append((node, t._output_nr))
        elif t._requires_grad:
            edges.append((t._accumulator or t._grad_accumulator(), 0))
        else:
            edges.append(_NO_EDGE)
    node = OpBackward(opdef, inputs, outputs, attrs, tuple(edges), plan.node_types,
                      plan.input_meta)
    for nr, out in enumerate(outputs):
        if out._dtype.is_floating:
            out.grad_fn = node  # Tensor._set_history(node, nr), inlined
            if nr:
                out._output_nr = nr  # (0 is the class default of a fresh result)
            out._requires_grad = True


_NO_EDGE = (None, 0)


def _wrong_shape(opdef: OpDef, array, ty: TensorType):
    raise GraphcError(
        f"internal error: kernel of {opdef.name} ({opdef.source}) returned shape "
        f"{array.shape}, its shape rule says {ty.shape}"
    )


_INFERRED: dict = {}  # (op, input shapes and dtypes, attrs) -> what the op's rule returned
_INFERRED_LIMIT = 4096


def _inferred(opdef: OpDef, inputs: tuple, attrs: dict):
    """`opdef.infer` on the inputs' types, remembered per (op, types, attributes): a rule is a
    pure function of them (the registry's contract), and eager code calls the same op on the
    same types again and again. Attributes are keyed with their Python types (1, 1.0 and
    True differ). Only results are remembered; a rule that raises raises on every call.
    Unhashable attributes skip the memory, and so does a symbolic trace (a rule's symbolic
    comparisons record guards into the trace's ShapeEnv, every time: graphc.symbolic)."""
    if current_env() is not None:
        return opdef.infer(*(t.type for t in inputs), **attrs)
    try:
        key = (opdef.name, _attrs_key(attrs), *[(t._data.shape, t._dtype) for t in inputs])
        hit = _INFERRED.get(key)
    except TypeError:  # an unhashable attribute value
        return opdef.infer(*(t.type for t in inputs), **attrs)
    if hit is None:
        hit = opdef.infer(*(t.type for t in inputs), **attrs)
        if len(_INFERRED) >= _INFERRED_LIMIT:
            _INFERRED.clear()
        _INFERRED[key] = hit
    return hit


def _wrap_output(opdef: OpDef, array, ty: TensorType, inputs: tuple, attrs: dict):

    array = np.asarray(array)
    if array.dtype != ty.dtype.np:
        array = array.astype(ty.dtype.np)
    if array.shape != ty.shape:
        raise GraphcError(
            f"internal error: kernel of {opdef.name} ({opdef.source}) returned shape "
            f"{array.shape}, its shape rule says {ty.shape}"
        )
    out = Tensor._wrap(array)
    if opdef.view and inputs and np.shares_memory(array, inputs[0]._data):
        _make_view(out, inputs[0], opdef, attrs)
    return out


def _abstract_output(opdef: OpDef, ty: TensorType, inputs: tuple, attrs: dict):
    """An abstract tensor of type `ty`; a view op's result counts as a view of its input
    (there is no memory to compare, and a kernel gives a view wherever it can)."""

    out = Tensor._abstract(ty)
    if opdef.view and inputs:
        _make_view(out, inputs[0], opdef, attrs)
    return out


def _make_view(out, source, opdef: OpDef, attrs: dict) -> None:
    out._base = source._base if source._base is not None else source
    out._version_counter = source._version_counter
    out._view_of = (source, opdef.name, attrs)


# graphc.tensor's mixins import this module, so the Tensor class comes last (the eager path
# makes its results directly; a function-level import costs ~0.5 us per op), and so does the
# in-place half of the dispatch point, which needs both.
from graphc.autograd.inplace import apply_inplace  # noqa: E402
from graphc.tensor import Tensor, VersionCounter  # noqa: E402
from graphc.tensor import serials as tensor_serials  # noqa: E402

registry.set_dispatcher(apply, apply_inplace)

_grad_mode = grad_mode.state  # noqa: E305  (this thread's grad mode, read once per op)
