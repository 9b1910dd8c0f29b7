"""graphc.trace: what a trace records, and the TraceError of every data-dependent construct.

Each data-dependent construct sits on a line tagged with a marker comment (`# <- name`); the
error must name that line of this file, the user's line, not one inside graphc.
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from graphc.errors import TraceError
from graphc.ir import format_graph, parse, run, verify
from graphc.jit.bindings import ArgBinding, ConstantBinding, RngBinding, TensorBinding
from graphc.jit.tracer import trace_call

_SOURCE = open(__file__).read().splitlines()


def line_of(marker: str) -> str:
    """`test_trace.py:N` of the line tagged `# <- marker`."""
    hits = [i + 1 for i, text in enumerate(_SOURCE) if text.rstrip().endswith(f"# <- {marker}")]
    assert len(hits) == 1, marker
    return f"{os.path.basename(__file__)}:{hits[0]}"


def arrays_for(traced, args=(), kwargs=None) -> list[np.ndarray]:
    """The graph's input arrays for a call, as graphc.compile binds them."""
    out = []
    for b in traced.bindings:
        if isinstance(b, ArgBinding):
            t = (tuple(args), kwargs or {})
            for p in b.path:
                t = t[p]
            out.append(t._data)
        elif isinstance(b, TensorBinding):
            out.append(b.tensor._data)
        elif isinstance(b, ConstantBinding):
            out.append(b.array.copy())
        else:
            assert isinstance(b, RngBinding)
            out.append(b.generator.get_state()._data)
    return out


# ---- data-dependent constructs --------------------------------------------------------------
def if_on_sum(x):
    if x.sum() > 0:  # <- if_sum
        return x
    return -x


def bool_of(x):
    y = x.max()
    return x * 2 if bool(y) else x  # <- bool


def item_of(x):
    return x * x.sum().item()  # <- item


def numpy_of(x):
    return graphc.tensor(x.numpy() * 2)  # <- numpy


def asarray_of(x):
    return graphc.tensor(np.asarray(x) + 1)  # <- asarray


def tolist_of(x):
    return graphc.tensor(x.tolist())  # <- tolist


def float_of(x):
    return x * float(x[0])  # <- float


class NumpyExp(graphc.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return graphc.tensor(np.exp(x.numpy()))  # <- fn_numpy

    @staticmethod
    def backward(ctx, g):
        return g


class NumpyAsarray(graphc.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return graphc.tensor(np.tanh(x))  # <- fn_asarray

    @staticmethod
    def backward(ctx, g):
        return g


def uses_numpy_function(x):
    return NumpyExp.apply(x * 2) + 1


def uses_asarray_function(x):
    return NumpyAsarray.apply(x)


DATA_DEPENDENT = [
    (if_on_sum, "if_sum", "bool"),
    (bool_of, "bool", "bool"),
    (item_of, "item", r"\.item\(\)"),
    (numpy_of, "numpy", r"\.numpy\(\)"),
    (asarray_of, "asarray", "numpy conversion"),
    (tolist_of, "tolist", r"\.tolist\(\)"),
    (float_of, "float", r"float\(tensor\)"),
    (uses_numpy_function, "fn_numpy", r"autograd\.Function NumpyExp"),
    (uses_asarray_function, "fn_asarray", r"autograd\.Function NumpyAsarray"),
]


@pytest.mark.parametrize("fn,marker,what", DATA_DEPENDENT, ids=[d[1] for d in DATA_DEPENDENT])
@pytest.mark.parametrize("how", ["trace", "compile"])
def test_data_dependent_code_raises_trace_error_at_the_users_line(fn, marker, what, how):
    x = graphc.tensor([1.0, -2.0, 3.0])
    with pytest.raises(TraceError) as info:
        if how == "trace":
            graphc.trace(fn, x)
        else:
            with graphc.no_grad():
                graphc.compile(fn, backend="interp")(x)
    message = str(info.value)
    assert message.startswith(line_of(marker) + ": "), message
    assert _re_search(what, message), message
    assert "graphc.where" in message and "out of the compiled function" in message, message
    # the same function runs eagerly, and the tracer was removed
    assert graphc.dispatch.current_tracer() is None
    fn(x)


def _re_search(pattern: str, text: str) -> bool:
    import re

    return re.search(pattern, text) is not None


def test_trace_error_inside_a_module_names_the_forward_line():
    class Gate(nn.Module):
        def forward(self, x):
            return x if x.mean().item() > 0 else -x  # <- module_item

    with pytest.raises(TraceError, match=line_of("module_item")):
        graphc.trace(nn.Sequential(nn.Linear(3, 3), Gate()), graphc.ones(2, 3))


def test_shape_dependent_python_is_allowed():
    def f(x):
        if x.shape[0] > 2 and x.ndim == 2:
            x = x[:2]
        for row in x:  # iterating over the first dimension is shape-based
            x = x + row
        return x * len(x)

    x = graphc.tensor(np.arange(8.0, dtype=np.float32).reshape(4, 2))
    traced = trace_call(f, (x,))
    np.testing.assert_allclose(run(traced.graph, x._data)[0], f(x).numpy())


# ---- what becomes nodes and inputs -----------------------------------------------------------
class Scale(graphc.autograd.Function):
    """A custom Function built from graphc ops: it traces into its ops."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return (x * w).tanh()

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, g * x


def test_builtin_ops_and_custom_functions_become_nodes():
    w = graphc.tensor([0.5, -1.0, 2.0])

    def f(x):
        return Scale.apply(x.exp(), w).sum(0) + x.relu().mean()

    x = graphc.tensor([[1.0, -2.0, 0.5], [0.1, 0.2, -0.3]])
    traced = trace_call(f, (x,))
    ops = Counter(n.op for n in traced.graph)
    assert ops["exp"] == 1 and ops["mul"] == 1 and ops["tanh"] == 1 and ops["relu"] == 1
    assert ops["reduce_sum"] >= 1 and ops["reduce_mean"] == 1
    assert [v.name for v in traced.graph.inputs] == ["x", "w"]
    assert isinstance(traced.bindings[1], TensorBinding) and traced.bindings[1].tensor is w
    # under grad mode too (the Function then also records history eagerly)
    xg = graphc.tensor(x.numpy(), requires_grad=True)
    traced_grad = trace_call(f, (xg,))
    assert [n.op for n in traced_grad.graph] == [n.op for n in traced.graph]
    np.testing.assert_allclose(run(traced.graph, *arrays_for(traced, (x,)))[0], f(x).numpy(),
                               rtol=1e-6)


def test_module_parameters_and_buffers_are_named_inputs_not_constants():
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.ReLU())
    model.eval()
    traced = trace_call(model, (graphc.ones(2, 4),))
    names = [v.name for v in traced.graph.inputs]
    assert names == ["input", "0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                     "1.running_var"]
    assert all(n.op != "full" or n.attrs["shape"] in ((), (3,)) for n in traced.graph)
    params = dict(model.named_parameters()) | dict(model.named_buffers())
    for b, v in zip(traced.bindings[1:], traced.graph.inputs[1:]):
        assert b.tensor is params[v.name]


def test_constants_made_inside_the_trace():
    def f(x):
        return x * graphc.tensor([1.0, 2.0, 3.0]) + graphc.full((3,), 0.5) + 2

    traced = trace_call(f, (graphc.ones(3),))
    g = traced.graph
    assert [v.name for v in g.inputs] == ["x", "const"]
    assert isinstance(traced.bindings[1], ConstantBinding)
    assert [n.op for n in g].count("full") == 2
    y = graphc.tensor([1.0, -1.0, 0.0])
    np.testing.assert_allclose(run(g, *arrays_for(traced, (y,)))[0], f(y).numpy())


def test_uniform_constants_that_a_float_cannot_hold_are_bound():
    big = 2 ** 60 + 1

    def f(x):
        return x + graphc.tensor([big, big]) + graphc.tensor([True, True])

    x = graphc.tensor([1, 2])
    traced = trace_call(f, (x,))
    assert isinstance(traced.bindings[1], ConstantBinding)
    verify(traced.graph)
    np.testing.assert_array_equal(run(traced.graph, *arrays_for(traced, (x,)))[0],
                                  f(x).numpy())


def test_inplace_under_grad_mode_records_the_current_value_not_a_constant():
    """The snapshot an in-place op takes under grad mode must not become a constant."""

    def f(x):
        y = x * 2
        y.add_(1)
        y.mul_(x)
        return y

    traced = trace_call(f, (graphc.ones(3),))
    assert all(n.attrs.get("shape") != (3,) for n in traced.graph if n.op == "full")
    other = graphc.tensor([1.0, 2.0, -3.0])
    np.testing.assert_allclose(run(traced.graph, other._data)[0], f(other).numpy())


def test_inplace_writes_to_inputs_become_updates():
    counter = graphc.zeros(())

    def f(x):
        x.mul_(2)
        counter.add_(1)
        return x + counter

    x = graphc.ones(2)
    traced = trace_call(f, (x,))
    g = traced.graph
    assert [(a.name, b.type) for a, b in g.updates] == [("x", x.type), ("counter", counter.type)]
    assert counter.item() == 0.0 and x.tolist() == [1.0, 1.0]  # an abstract trace writes nothing
    eager = trace_call(f, (x,), abstract=False)  # an eager trace runs the writes
    assert format_graph(eager.graph) == format_graph(g)
    assert counter.item() == 1.0 and x.tolist() == [2.0, 2.0]
    text = format_graph(g)
    assert "%x <- " in text and "%counter <- " in text
    out, new_x, new_counter = run(g, np.array([3.0, 4.0], np.float32), np.array(5.0, np.float32))
    np.testing.assert_allclose(out, [12.0, 14.0])
    np.testing.assert_allclose(new_x, [6.0, 8.0])
    assert new_counter == 6.0


def test_inplace_on_a_view_inside_a_trace_is_refused_at_the_users_line():
    def f(x):
        y = x * 1
        y[0].add_(1)  # <- view_inplace
        return y

    with pytest.raises(TraceError, match=line_of("view_inplace")):
        graphc.trace(f, graphc.ones(2, 2))


def test_namedtuple_outputs_keep_their_type():
    def f(x):
        return x.max(dim=1)

    x = graphc.tensor([[1.0, 5.0], [7.0, 2.0]])
    traced = trace_call(f, (x,))
    assert type(traced.result).__name__ == "max"
    from graphc.jit.pytree import unflatten

    values, indices = run(traced.graph, x._data)
    rebuilt = unflatten(traced.out_spec, [values, indices])
    assert type(rebuilt) is type(traced.result) and rebuilt.indices.tolist() == [1, 0]


def test_random_ops_read_a_bound_rng_input():
    def f(x):
        return graphc.nn.functional.dropout(x, 0.5, training=True) + graphc.rand(4)

    graphc.manual_seed(3)
    traced = trace_call(f, (graphc.ones(4),))
    assert [type(b) for b in traced.bindings] == [ArgBinding, RngBinding]
    assert traced.bindings[1].counters == 2  # one counter each for 4 words
    g = traced.graph
    assert {"dropout", "uniform"} <= {n.op for n in g}
    graphc.manual_seed(3)
    state = graphc.default_generator.get_state()._data.copy()
    want = f(graphc.ones(4))
    np.testing.assert_array_equal(run(g, np.ones(4, np.float32), state)[0], want.numpy())


def test_arguments_are_named_after_parameters_and_keywords():
    def f(x, pair, *, scale):
        return x * pair[0] + pair[1] * scale["s"]

    a, b, c, s = (graphc.ones(2) for _ in range(4))
    g = graphc.trace(f, a, (b, c), scale={"s": s})
    assert [v.name for v in g.inputs] == ["x", "pair_0", "pair_1", "scale_s"]


def test_the_same_tensor_passed_twice_is_one_input():
    x = graphc.ones(3)
    g = graphc.trace(lambda a, b: a * b, x, x)
    assert len(g.inputs) == 1 and g.nodes[0].inputs == [g.inputs[0], g.inputs[0]]


def test_traces_do_not_nest():
    def inner(x):
        return graphc.trace(lambda y: y + 1, x)

    with pytest.raises(TraceError, match="cannot be nested"):
        graphc.trace(inner, graphc.ones(1))


def test_printed_trace_parses_back_and_verifies():
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Dropout(0.25), nn.Linear(8, 2))
    g = graphc.trace(model, graphc.ones(3, 4))
    assert parse(format_graph(g)) == g
    verify(parse(format_graph(g)))
