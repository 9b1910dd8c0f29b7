"""The eager path of the dispatch point (graphc.dispatch._apply_eager) gives what the general
path gives: an op's first call on some types goes the general way and leaves a plan, its later
calls take the plan. Both must agree with each other and with PyTorch bit for bit (values and
dtypes, Python numbers typed as PyTorch types them), record the same autograd nodes, raise the
same errors, stay out of traces, and in-place changes must keep their snapshot semantics.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphc
from graphc import dispatch
from graphc.errors import ShapeError
from graphc.jit.tracer import trace_call

torch = pytest.importorskip("torch")

_DTYPES = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "bool": np.bool_}

_BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "lt": lambda a, b: a < b, "eq": lambda a, b: a == b,
    "pow": lambda a, b: a ** b, "maximum": lambda a, b: a.maximum(b),
}


def _values(dtype: str, shape: tuple, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype == "int64":
        return rng.integers(-4, 5, shape).astype(np.int64)
    return (rng.standard_normal(shape) * 3).astype(_DTYPES[dtype])


# numpy's and PyTorch's transcendental functions may differ in the last bit; the rest agree
# exactly (the two graphc paths always do: they run the same kernel).
_LAST_BIT = {"pow", "exp", "tanh", "sigmoid"}


def _same(ours, theirs, op: str = "") -> None:
    expected = theirs.numpy()
    got = ours.numpy()
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if op in _LAST_BIT:
        np.testing.assert_allclose(got, expected, rtol=3e-7 if got.dtype == np.float32 else 4e-16)
    else:
        assert got.tobytes() == expected.tobytes(), (got, expected)


def _identical(first, second) -> None:
    assert first.dtype is second.dtype
    assert first.numpy().tobytes() == second.numpy().tobytes()


def _twice(fn):
    """fn() by the general path (no plan yet), then by the eager path; both results."""
    dispatch._EAGER.clear()  # the plans are a memo: dropping them only costs time
    first = fn()
    assert dispatch._EAGER, "the general call left no plan"
    return first, fn()


@pytest.mark.parametrize("op", sorted(_BINARY))
@pytest.mark.parametrize("dtypes", [("float32", "float32"), ("float32", "float64"),
                                    ("int64", "float32"), ("int64", "int64"), ("bool", "int64")])
def test_tensor_operands_match_the_general_path_and_pytorch(op, dtypes):
    if op == "pow" and "float32" not in dtypes:
        pytest.skip("integer pow of negative exponents is an error in PyTorch, not a value")
    if op == "sub" and "bool" in dtypes:
        pytest.skip("PyTorch refuses sub with a bool tensor")
    a = _values(dtypes[0], (3, 4), 1)
    b = _values(dtypes[1], (4,), 2)  # broadcast
    fn = _BINARY[op]
    first, second = _twice(lambda: fn(graphc.tensor(a), graphc.tensor(b)))
    _identical(first, second)
    _same(first, fn(torch.from_numpy(a), torch.from_numpy(b)), op)


@pytest.mark.parametrize("scalar", [2.0, 3, True, np.float32(0.5), np.int64(2)],
                         ids=["float", "int", "bool", "np_float32", "np_int64"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "bool"])
@pytest.mark.parametrize("op", ["add", "mul", "sub", "div", "lt"])
def test_number_operands_are_typed_as_pytorch_types_them(op, dtype, scalar):
    if op == "sub" and (dtype == "bool" or type(scalar) is bool):
        pytest.skip("PyTorch refuses sub with a bool operand")
    if dtype == "bool" and op == "add" and type(scalar) is bool:
        pytest.skip("bool + bool stays bool in both; the numpy check covers it elsewhere")
    a = _values(dtype, (5,), 3)
    fn = _BINARY[op]
    first, second = _twice(lambda: fn(graphc.tensor(a), scalar))
    expected = fn(torch.from_numpy(a), scalar.item() if isinstance(scalar, np.generic)
                  else scalar)
    _identical(first, second)
    if isinstance(scalar, np.generic):  # graphc types numpy numbers as Python ones: no check
        return
    _same(first, expected, op)
    reflected = _twice(lambda: fn(scalar, graphc.tensor(a)) if op != "lt" else
                       graphc.tensor(a) > scalar)
    for r in reflected:
        assert r.dtype is first.dtype


@pytest.mark.parametrize("op", ["relu", "neg", "exp", "sigmoid", "tanh", "abs"])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_unary_ops_match_the_general_path_and_pytorch(op, dtype):
    a = _values(dtype, (2, 3), 4)
    first, second = _twice(lambda: getattr(graphc.tensor(a), op)())
    _identical(first, second)
    _same(first, getattr(torch.from_numpy(a), op)(), op)


def test_nan_and_inf_come_without_numpy_warnings():
    a, z = graphc.tensor([1.0, -1.0, 0.0]), graphc.zeros(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first, second = _twice(lambda: a / z)
        big = _twice(lambda: graphc.tensor([3e38]) * 10.0)
    for r in (first, second):
        assert np.isposinf(r.numpy()[0]) and np.isneginf(r.numpy()[1]) and np.isnan(r.numpy()[2])
    assert all(np.isposinf(r.numpy()[0]) for r in big)


@pytest.mark.parametrize("scalar", [2.0, 3], ids=["float", "int"])
def test_a_number_operand_records_the_same_node(scalar):
    w = graphc.tensor([1.0, -2.0, 3.0], requires_grad=True)
    for y in _twice(lambda: w * scalar):
        assert y.grad_fn.name() == "MulBackward0" and not y.is_leaf and y.requires_grad
        w.grad = None
        y.sum().backward()
        np.testing.assert_array_equal(w.grad.numpy(), np.full(3, scalar, np.float32))


def test_nodes_of_the_eager_path_carry_types_edges_and_saved_tensors():
    w = graphc.tensor([1.0, 2.0], requires_grad=True)
    b = graphc.tensor([3.0, 4.0])
    first, second = _twice(lambda: w * b)
    for y in (first, second):
        node = y.grad_fn
        assert node.needs_input_grad == (True, False)
        assert node.next_functions[0][0].name() == "AccumulateGrad"
        assert node.next_functions[1] == (None, 0)
        assert node.input_meta == (((2,), graphc.float32), ((2,), graphc.float32))
    comparison = _twice(lambda: w < b)
    assert all(c.grad_fn is None and not c.requires_grad for c in comparison)
    with graphc.no_grad():
        assert all(r.grad_fn is None for r in _twice(lambda: w * b))
    y = w * b
    b.add_(1.0)  # b was saved by mul: backward must see the change
    with pytest.raises(graphc.AutogradError, match="modified by an inplace operation"):
        y.sum().backward()


def test_errors_name_the_op_and_the_users_line_on_every_call():
    a, b = graphc.ones(10), graphc.ones(3)
    for _ in range(2):
        with pytest.raises(ShapeError, match=r"add.*test_eager_dispatch\.py"):
            a + b  # noqa: B018
    base, exponent = graphc.tensor([2, 3]), graphc.tensor([1, 2])
    _ = base ** exponent  # the plan for int64 ** int64; the kernel refuses negative exponents
    with pytest.raises(graphc.ArgumentError, match=r"pow at test_eager_dispatch\.py:\d+"):
        base ** graphc.tensor([1, -2])  # noqa: B018
    add = graphc.ops.registry.get("add")
    for _ in range(2):
        with pytest.raises(TypeError, match=r"add.*input 1 must be a graphc.Tensor or a number"):
            dispatch.apply(add, graphc.ones(3), "a string")


def test_a_trace_after_eager_calls_still_records_every_op():
    x = graphc.ones(4)
    for _ in range(2):  # plans for mul with a number and for add
        _ = x * 2.0 + x
    traced = trace_call(lambda t: t * 2.0 + t, (x,))
    assert [n.op for n in traced.graph.nodes].count("mul") == 1
    assert {"mul", "add"} <= {n.op for n in traced.graph.nodes}


def test_inplace_without_grad_changes_the_tensor_and_its_views():
    x = graphc.zeros(4)
    view = x[1:3]
    before = x._version
    for _ in range(2):
        x.add_(graphc.ones(4))
        assert x.grad_fn is None and not x.requires_grad
    np.testing.assert_array_equal(x.numpy(), np.full(4, 2, np.float32))
    np.testing.assert_array_equal(view.numpy(), np.full(2, 2, np.float32))
    assert x._version == before + 2 and view._version == x._version
    view.mul_(3.0)  # a view of a tensor that does not require grad
    np.testing.assert_array_equal(x.numpy(), np.array([2, 6, 6, 2], np.float32))


@pytest.mark.parametrize("method", ["add_", "mul_", "div_", "sub_"])
def test_inplace_with_an_operand_that_requires_grad_keeps_the_old_value(method):
    """x.mul_(w): the gradient for w is x's value before the change (a snapshot), although x
    itself does not require grad."""
    for _ in range(2):
        x0 = np.array([1.0, 2.0, 4.0], np.float32)
        x = graphc.tensor(x0)
        w = graphc.tensor([0.5, -1.0, 2.0], requires_grad=True)
        getattr(x, method)(w)
        assert x.requires_grad and x.grad_fn is not None
        x.sum().backward()
        tx = torch.from_numpy(x0.copy())
        tw = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
        getattr(tx, method)(tw)
        tx.sum().backward()
        np.testing.assert_allclose(x.detach().numpy(), tx.detach().numpy())
        np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy())


def test_augmented_assignment_with_an_operand_that_requires_grad_records():
    x = graphc.ones(3)
    w = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x *= w
    x.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.ones(3, np.float32))


def test_inplace_with_an_unknown_operand_is_still_recorded():
    """A compute whose operands are not listed takes the snapshot path (it may read a tensor
    that requires grad)."""
    from graphc.ops.registry import inplace

    x = graphc.ones(3)
    w = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    inplace(x, "mul_", lambda old: old * w)
    assert x.grad_fn is not None
    x.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.ones(3, np.float32))


def test_inplace_refusals_stay():
    w = graphc.ones(3, requires_grad=True)
    with pytest.raises(graphc.AutogradError, match="leaf Variable"):
        w.add_(1.0)
    x = graphc.ones(3, dtype=graphc.int64)
    with pytest.raises(graphc.DTypeError, match="can't be cast"):
        x.add_(graphc.ones(3))
    with pytest.raises(ShapeError, match="doesn't match the broadcast shape"):
        graphc.ones(3).add_(graphc.ones(2, 3))
