"""The bad-input catalogue: every way a user can hand graphc something wrong, and what follows.

Each case asserts three things: the error class; that the message names what failed (the op
or function, and the user's source line where one applies), what was expected and what came;
and that nothing was corrupted (module parameters and buffers, optimizer state and `.grad`s
unchanged, the compiled callable and its executable still usable with good input and still
correct, the on-disk kernel cache holding only whole entries). Cases that show a defect in a
file this catalogue does not own are marked xfail with the defect described.

The catalogue is three files sharing `tests/bad_inputs_support.py`:
- this file: wrong shapes, dtypes and devices at a compiled call; what a trace cannot record;
  in-place changes to saved tensors; custom Functions returning bad gradients; malformed IR;
- `test_bad_inputs_backends.py`: the on-disk kernel cache and native libraries; recompiles,
  backends and compile arguments;
- `test_bad_inputs_numerics_training.py`: GRAPHC_CHECK_NANS; optimizers and training steps;
  indices out of range inside compiled graphs.

Source lines are found by marker comments (`# LINE:<name>`) in the file that holds them, so
the assertions name the very line that applied the failing op. The CPU-backend cases of each
file share one object cache (a temporary folder for the module), except the cache cases,
which get their own.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from graphc.autograd.function import Function
from graphc.errors import (
    ArgumentError,
    AutogradError,
    DTypeError,
    GraphcError,
    ShapeError,
    TraceError,
)
from graphc.ir import parse, verify
from graphc.ir.interpreter import InterpreterError
from graphc.ir.parser import ParseError
from tests.bad_inputs_support import (  # noqa: F401 (module_object_cache: an autouse fixture)
    assert_unchanged,
    close,
    marker_lookup,
    module_object_cache,
    snapshot,
    t,
)

line = marker_lookup(__file__)


# ---- wrong shapes, dtypes and devices at a compiled call --------------------------------------
def _matmul_relu(x, w):
    return (x @ w).relu()  # LINE:matmul


@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_wrong_shape_at_a_compiled_call_retraces_into_a_shape_error(rng, backend):
    f = graphc.compile(_matmul_relu, backend=backend)
    x, w = t(rng, 2, 3), t(rng, 3, 4)
    f(x, w)
    with pytest.raises(ShapeError) as err:
        f(t(rng, 2, 5), w)
    message = str(err.value)
    assert f"matmul at {line('matmul')}" in message
    assert "(2x5 and 3x4)" in message  # what came, in PyTorch's words
    assert len(f.graphs) == 1  # the failed trace left no entry
    close(f(x, w), _matmul_relu(x, w))  # the old graph still runs, correctly


def test_wrong_dtype_at_a_compiled_call_is_a_dtype_error(rng):
    f = graphc.compile(_matmul_relu, backend="interp")
    x, w = t(rng, 2, 3), t(rng, 3, 4)
    f(x, w)
    with pytest.raises(DTypeError) as err:
        f(x.double(), w)
    assert f"matmul at {line('matmul')}" in str(err.value)
    assert "double != float" in str(err.value)
    close(f(x, w), _matmul_relu(x, w))


def test_a_valid_new_shape_retraces_and_says_why(rng):
    f = graphc.compile(_matmul_relu, backend="interp")
    w = t(rng, 3, 4)
    f(t(rng, 2, 3), w)
    x = t(rng, 7, 3)
    close(f(x, w), _matmul_relu(x, w))
    assert len(f.graphs) == 2
    assert f.recompile_reasons == [["arg 0 shape (2,3) -> (7,3)"]]


@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_an_executable_fed_the_wrong_array_names_the_input_and_both_types(rng, backend):
    f = graphc.compile(_matmul_relu, backend=backend)
    x, w = t(rng, 2, 3), t(rng, 3, 4)
    f(x, w)
    executable = f.executable
    with pytest.raises((InterpreterError, ArgumentError)) as err:
        executable.run(np.zeros((2, 5), np.float32), w._data)
    assert "input %x expects f32[2,3], got float32[2, 5]" in str(err.value)
    with pytest.raises((InterpreterError, ArgumentError)) as err:
        executable.run(x._data.astype(np.float64), w._data)
    assert "expects f32[2,3], got float64[2, 3]" in str(err.value)
    np.testing.assert_allclose(executable.run(x._data, w._data)[0],
                               _matmul_relu(x, w)._data, rtol=1e-5)


@pytest.mark.parametrize("call", ["tensor.to", "graphc.tensor", "Module.to"])
def test_a_device_string_other_than_cpu_is_refused_and_named(call):
    x = graphc.ones(3)
    model = nn.Linear(3, 2)
    before = snapshot(model, x)
    with pytest.raises(ValueError) as err:
        if call == "tensor.to":
            x.to("cuda")
        elif call == "graphc.tensor":
            graphc.tensor([1.0], device="gpu")
        else:
            model.to("cuda:0")
    message = str(err.value)
    assert "live on the CPU" in message and ("'cuda'" in message or "'gpu'" in message
                                             or "'cuda:0'" in message)
    assert_unchanged(before, model, x)


def test_device_errors_are_graphc_errors_naming_the_function():
    with pytest.raises(ArgumentError, match="Tensor.to.*compile"):
        graphc.ones(3).to("cuda")
    with pytest.raises(ArgumentError, match="zeros.*live on the CPU"):
        graphc.zeros(3, device="cuda")


# ---- what a trace cannot record -------------------------------------------------------------
def test_data_dependent_control_flow_in_a_trace_names_the_line_and_undoes_the_run(rng):
    counter = graphc.zeros(1)

    def f(x):
        counter.add_(1.0)  # changed before the failure: the failed trace must undo it
        if x.sum() > 0:  # LINE:branch
            return x * 2
        return x

    cf = graphc.compile(f, backend="interp")
    with pytest.raises(TraceError) as err:
        cf(t(rng, 3))
    message = str(err.value)
    assert message.startswith(f"{line('branch')}: bool(tensor)")
    assert "graphc.where" in message  # what to do
    assert counter.tolist() == [0.0] and cf._entries == []
    np.testing.assert_array_equal(f(graphc.ones(3))._data, np.full(3, 2.0, np.float32))


_READS = {"item": lambda s: s.item(), "float": lambda s: float(s), "numpy": lambda s: s.numpy()}  # LINE:read  # noqa: E501


@pytest.mark.parametrize("read", ["item", "float", "numpy"])
def test_reading_a_value_inside_a_trace_names_the_read_and_the_line(rng, read):
    with pytest.raises(TraceError) as err:
        graphc.compile(lambda x: x * _READS[read](x.sum()), backend="interp")(t(rng, 3))
    message = str(err.value)
    named = {"item": ".item()", "float": "float(tensor)", "numpy": ".numpy()"}[read]
    assert message.startswith(f"{line('read')}: {named} needs the tensor's value")
    assert "move this code out of the compiled function" in message


class _NumpyEscape(Function):
    @staticmethod
    def forward(ctx, x):
        return graphc.tensor(np.sin(x.numpy()))  # LINE:escape

    @staticmethod
    def backward(ctx, g):
        return g


def test_a_custom_function_escaping_to_numpy_is_named_in_the_trace_error(rng):
    with pytest.raises(TraceError) as err:
        graphc.compile(lambda x: _NumpyEscape.apply(x) * 2, backend="interp")(t(rng, 3))
    message = str(err.value)
    assert message.startswith(line("escape"))
    assert "_NumpyEscape" in message and "rewrite the forward with graphc ops" in message


# ---- in-place changes to saved tensors --------------------------------------------------------
def test_eager_in_place_change_to_a_saved_tensor_names_the_node_and_versions(rng):
    a = graphc.tensor(rng.standard_normal(3).astype(np.float32), requires_grad=True)
    b = a.exp()
    c = b * 2
    b.add_(1.0)
    with pytest.raises(AutogradError) as err:
        c.sum().backward()
    message = str(err.value)
    assert "output 0 of ExpBackward0" in message
    assert "is at version 1; expected version 0" in message
    assert "MulBackward0 saved this tensor" in message and "clone()" in message
    assert a.grad is None  # nothing was accumulated


def test_compiled_in_place_change_to_a_saved_parameter_before_backward(rng):
    model = nn.Linear(3, 2)
    cmodel = graphc.compile(model, backend="interp")
    x = graphc.tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=True)
    cmodel(x)
    y = cmodel(x)  # the compiled forward, with a CompiledFunction grad_fn
    with graphc.no_grad():
        model.weight.mul_(2.0)
    with pytest.raises(AutogradError) as err:
        y.sum().backward()
    message = str(err.value)
    assert "[graphc.FloatTensor [2, 3]] is at version 2; expected version 1" in message
    assert "CompiledFunctionBackward saved this tensor" in message
    assert x.grad is None and model.weight.grad is None
    z = cmodel(x)  # still usable: a fresh forward saves the new weight
    z.sum().backward()
    np.testing.assert_allclose(x.grad._data, np.tile(model.weight._data.sum(0), (4, 1)),
                               rtol=1e-5)


def test_in_place_change_to_a_saved_tensor_inside_a_compiled_training_step(rng):
    w = graphc.tensor(rng.standard_normal((3, 2)).astype(np.float32), requires_grad=True)
    before = snapshot(w)

    def step(x):
        y = (x @ w).tanh()
        y.add_(1.0)  # tanh saved its output for the backward
        y.sum().backward()
        with graphc.no_grad():
            w.sub_(0.1 * w.grad)
        return y.detach()

    with pytest.raises(AutogradError, match="output 0 of TanhBackward0"):
        graphc.compile(step, backend="interp")(t(rng, 4, 3))
    assert_unchanged(before, w)
    assert w.grad is None


# ---- custom Functions returning bad gradients -------------------------------------------------
class _WrongCount(Function):
    @staticmethod
    def forward(ctx, a, b):
        return a * b

    @staticmethod
    def backward(ctx, g):
        return g  # two inputs, one gradient


class _WrongShape(Function):
    @staticmethod
    def forward(ctx, a):
        return a * 2

    @staticmethod
    def backward(ctx, g):
        return graphc.ones(5) * g.sum()


def test_a_function_returning_the_wrong_number_of_gradients(rng):
    a = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = graphc.tensor([4.0, 5.0, 6.0], requires_grad=True)
    with pytest.raises(AutogradError) as err:
        _WrongCount.apply(a, b).sum().backward()
    assert "_WrongCountBackward returned an incorrect number of gradients (expected 2, got 1)" \
        in str(err.value)
    assert a.grad is None and b.grad is None


def test_a_function_returning_a_gradient_of_the_wrong_shape():
    a = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(ShapeError) as err:
        _WrongShape.apply(a).sum().backward()
    assert "_WrongShapeBackward returned an invalid gradient at index 0 - got [5] but " \
           "expected shape compatible with [3]" in str(err.value)
    assert a.grad is None


# ---- malformed IR text ------------------------------------------------------------------------
_GOOD = "graph @f(%x: f32[3]) -> (f32[3]) {\n  %0: f32[3] = relu(%x)\n  return (%0)\n}"


@pytest.mark.parametrize("text, expected", [
    (_GOOD.replace("relu(%x)", "relu(%x"),
     "line 3, column 3: expected ',' or ')', got 'return'"),
    (_GOOD.replace("%x: f32[3])", "%x: f33[3])"),
     "line 1, column 14: expected a dtype (f32, f64, i64, bool), got 'f33'"),
    (_GOOD.replace("relu(%x)", "relu(%y)"), "line 2, column 21: %y is used before it is defined"),
    (_GOOD.replace("relu(%x)", "relu(%x) $"), "line 2, column 25: unexpected character '$'"),
    (_GOOD.replace("-> (f32[3])", "-> (f32[4])"),
     "line 3, column 3: graph @f: return types ['f32[3]'] differ from the declared "
     "['f32[4]']"),
    (_GOOD.replace("f32[3] = relu", "f32[-3] = relu"),
     "line 2, column 11: expected a non-negative integer dimension, got '-3'"),
    (_GOOD + "\n}", "line 5, column 1: expected end of input after the graph, got '}'"),
], ids=["unclosed-call", "bad-dtype", "undefined-value", "bad-character", "return-type",
        "negative-dim", "trailing-text"])
def test_malformed_ir_text_names_line_column_and_what_was_expected(text, expected):
    with pytest.raises(ParseError) as err:
        parse(text)
    assert str(err.value).startswith(expected + "; ")  # then what to do
    assert parse(_GOOD) == parse(_GOOD)  # the parser holds no state between calls


@pytest.mark.parametrize("node, expected", [
    ("%0: f32[4] = relu(%x)", "relu at unknown location: output types ['f32[4]'] differ from "
                              "the op's rule: ['f32[3]']"),
    ("%0: f32[3] = frobnicate(%x)", "frobnicate at unknown location: unknown op 'frobnicate'"),
])
def test_ir_that_parses_but_does_not_verify_names_the_node(node, expected):
    graph = parse(_GOOD.replace("%0: f32[3] = relu(%x)", node).replace("(%0)", "(%x)"))
    with pytest.raises(GraphcError) as err:
        verify(graph)
    assert str(err.value).startswith(expected)
    assert f"in: {node}" in str(err.value)
