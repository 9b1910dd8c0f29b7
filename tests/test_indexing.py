"""__getitem__ / __setitem__ against numpy and PyTorch (values and gradients), views and their
version counters, in-place rules on views, and second derivatives of the movement ops."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.autograd import gradcheck, gradgradcheck
from graphc.errors import AutogradError, ShapeError, TraceError
from tests.conftest import torch_or_skip


def _i(*values):
    return np.array(values, dtype=np.int64)


# Indices valid for a (4, 5, 3) tensor, in PyTorch's and numpy's common meaning.
INDICES = [
    0, -1, (1, 2), (1, 2, 0), slice(1, 3), (slice(None), 2), (Ellipsis, 1), (None, 1),
    (slice(None, None, 2), None, slice(1, None, 2)), (Ellipsis, None), (),
    (slice(-3, -1), Ellipsis, slice(0, 1)), _i(3, 0, 0), (slice(None), _i(4, -5)),
    (_i(0, 3), _i(1, 4)), (_i(0, 3), slice(1, 4), _i(2, 0)), (slice(None), _i(0, 4), _i(2, 0)),
    (_i(1, 2).reshape(2, 1), _i(0, 1, 4)), (Ellipsis, _i(2, 1, 0)), (None, _i(1), None),
    np.array([True, False, True, True]), (slice(None), np.array([True, False, True, False, True])),
    (np.arange(20).reshape(4, 5) % 3 == 0,),
    (slice(1, 2), slice(None), np.array([False, True, True])),
    (_i(3, 1), Ellipsis, None), [0, 2], (slice(1, 1),), (slice(None), slice(4, 2)),
    True, (slice(None), False), np.array(2, dtype=np.int64), (0, np.array(True)),
]


def _name(index) -> str:
    return repr(index).replace("\n", "").replace(" ", "")[:60]


def _to_torch(torch, index):
    if isinstance(index, tuple):
        return tuple(_to_torch(torch, i) for i in index)
    if isinstance(index, np.ndarray):
        return torch.from_numpy(index)
    return index


@pytest.mark.parametrize("index", INDICES, ids=[_name(i) for i in INDICES])
def test_getitem_matches_numpy_and_torch(index, rng):
    torch = torch_or_skip()
    data = rng.standard_normal((4, 5, 3))
    x = graphc.tensor(data, requires_grad=True)
    got = x[index]
    np.testing.assert_array_equal(got.detach().numpy(), data[index])

    tx = torch.tensor(data, requires_grad=True)
    want = tx[_to_torch(torch, index)]
    assert tuple(got.shape) == tuple(want.shape)
    seed = rng.standard_normal(tuple(want.shape))
    got.backward(graphc.tensor(seed))
    want.backward(torch.from_numpy(seed))
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-12)


NEGATIVE_STEPS = [
    slice(None, None, -1), (slice(None), slice(3, 0, -2)), (Ellipsis, slice(-1, None, -2)),
    (slice(3, None, -2), _i(1, 4)), (slice(1, 3, -1),), (0, slice(None, None, -3)),
]


@pytest.mark.parametrize("index", NEGATIVE_STEPS, ids=[_name(i) for i in NEGATIVE_STEPS])
def test_negative_steps_match_numpy(index, rng):
    data = rng.standard_normal((4, 5, 3))
    x = graphc.tensor(data, requires_grad=True)
    np.testing.assert_array_equal(x[index].detach().numpy(), data[index])
    seed = rng.standard_normal(data[index].shape)
    x[index].backward(graphc.tensor(seed))
    want = np.zeros_like(data)
    np.add.at(want, index, seed)
    np.testing.assert_allclose(x.grad.numpy(), want)
    y = graphc.tensor(data)
    y[index] = graphc.tensor(seed)
    expect = data.copy()
    expect[index] = seed
    np.testing.assert_array_equal(y.numpy(), expect)


SET_CASES = [
    (1, (5, 3)), ((slice(1, 3), 0), (3,)), ((Ellipsis, 2), (1,)),
    ((slice(None, None, 2),), (5, 3)),
    (_i(3, 0), (2, 5, 3)), ((slice(None), _i(0, 4)), (4, 2, 3)), ((_i(0, 3), 1, _i(2, 0)), (2,)),
    ((_i(0, 3), slice(None), _i(2, 0)), (2, 5)), (np.array([True, False, False, True]), (3,)),
    ((slice(None), np.array([True, False, True, False, True])), (1, 1, 3)),
    ((None, 0, slice(1, 4)), (3, 3)), ((), (4, 5, 3)),
]


@pytest.mark.parametrize("index,value_shape", SET_CASES, ids=[_name(c[0]) for c in SET_CASES])
def test_setitem_matches_torch_values_and_gradients(index, value_shape, rng):
    torch = torch_or_skip()
    data, value = rng.standard_normal((4, 5, 3)), rng.standard_normal(value_shape)
    x, v = graphc.tensor(data, requires_grad=True), graphc.tensor(value, requires_grad=True)
    y = x * 2.0
    y[index] = v
    tx, tv = torch.tensor(data, requires_grad=True), torch.tensor(value, requires_grad=True)
    ty = tx * 2.0
    ty[_to_torch(torch, index)] = tv
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy())
    seed = rng.standard_normal((4, 5, 3))
    y.backward(graphc.tensor(seed))
    ty.backward(torch.from_numpy(seed))
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())
    np.testing.assert_allclose(v.grad.numpy(), tv.grad.numpy())


def test_setitem_gradient_is_zero_where_overwritten():
    x = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    y[0] = 5
    assert y.grad_fn is not None and y.tolist() == [5.0, 4.0, 6.0]
    y.backward(graphc.ones(3))
    assert x.grad.tolist() == [0.0, 2.0, 2.0]


def test_setitem_bumps_version_and_catches_saved_tensors():
    x = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1
    z = y * y  # saves y
    before = y._version
    y[1] = 0.0
    assert y._version == before + 1
    with pytest.raises(AutogradError, match="modified by an inplace operation"):
        z.backward(graphc.ones(3))


def test_setitem_casts_to_the_target_dtype():
    x = graphc.zeros(3, dtype=graphc.int64)
    x[0] = 2.7
    x[1:] = graphc.tensor([1.5, -1.5])
    assert x.dtype is graphc.int64 and x.tolist() == [2, 1, -1]


def test_setitem_value_requiring_grad_into_plain_tensor():
    x = graphc.zeros(2, 3)
    v = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x[1] = v
    assert x.requires_grad and not x.is_leaf
    x.backward(graphc.ones(2, 3))
    assert v.grad.tolist() == [1.0, 1.0, 1.0]


def test_views_share_memory_and_version_counter():
    x = graphc.ones(4)
    y = x[1:3]
    x.add_(1)
    assert y._version == x._version == 1
    assert y.tolist() == [2.0, 2.0]
    y[0] = 7.0  # writes through to x
    assert x.tolist() == [2.0, 7.0, 2.0, 2.0] and x._version == 2
    for view in (x.reshape(2, 2), x.view(4, 1)[:, 0], x.unsqueeze(0).t(), x.expand(3, 4),
                 x[None, ...], x[...], x.split(2)[1], x.narrow(0, 1, 2)):
        assert np.shares_memory(view.numpy(), x.numpy())
        assert view._version_counter is x._version_counter
    for copy in (x.flip(0), x.clone(), x[[0, 1]], x[x > 3], x.repeat(2)):
        assert not np.shares_memory(copy.numpy(), x.numpy())


def test_contiguous_returns_self_or_copy():
    x = graphc.ones(2, 3)
    assert x.contiguous() is x
    y = x.t().contiguous()
    assert not np.shares_memory(y.numpy(), x.numpy()) and y.numpy().flags.c_contiguous


def test_inplace_on_expanded_tensor_errors():
    x = graphc.ones(3)
    y = x.expand(2, 3)
    with pytest.raises(ShapeError, match="more than one element of the written-to tensor"):
        y.add_(1)
    with pytest.raises(ShapeError, match="more than one element of the written-to tensor"):
        y[0] = 2.0
    assert x.tolist() == [1.0, 1.0, 1.0]
    assert x.expand(3).add_(1).tolist() == [2.0, 2.0, 2.0]  # nothing repeats: writable


def test_boolean_mask_in_a_trace_raises():
    x, mask = graphc.ones(3), graphc.tensor([True, False, True])

    def read(x, mask):
        return x[mask]

    def write(x, mask):
        y = x.clone()
        y[mask] = 0.0
        return y

    for fn in (read, write):
        with pytest.raises(TraceError, match="graphc.where"):
            graphc.trace(fn, x, mask)


def test_iteration_and_unbind_use_getitem():
    x = graphc.arange(6).reshape(3, 2)
    assert [r.tolist() for r in x] == [[0, 1], [2, 3], [4, 5]]
    assert [r.tolist() for r in x.unbind(1)] == [[0, 2, 4], [1, 3, 5]]


def test_index_tensor_in_range_check_and_negative_indices():
    x = graphc.arange(5)
    assert x[graphc.tensor([-1, 0, -5])].tolist() == [4, 0, 0]
    with pytest.raises(IndexError, match="index -6 is out of bounds for dimension 0 with size 5"):
        x[graphc.tensor([-6])]
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        x[5] = 1


def _second_order(fn, *shapes, rng):
    inputs = tuple(graphc.tensor(rng.standard_normal(s), requires_grad=True) for s in shapes)
    assert gradcheck(fn, inputs)
    assert gradgradcheck(fn, inputs)


def _square(fn):
    """fn followed by squaring, so second derivatives are not all zero."""

    def wrapped(*args):
        out = fn(*args)
        return out * out

    return wrapped


SECOND_ORDER = {
    "getitem_slice": (lambda x: x[1:, ::2], [(3, 4)]),
    "getitem_take": (lambda x: x[graphc.tensor([2, 0, 2])], [(3, 2)]),
    "getitem_two_arrays": (lambda x: x[graphc.tensor([1, 0]), :, graphc.tensor([0, 1])],
                           [(2, 3, 2)]),
    "gather": (lambda x: x.gather(1, graphc.tensor([[0, 0], [2, 1]])), [(2, 3)]),
    "scatter_add": (lambda x, s: x.scatter_add(0, graphc.tensor([[1, 1, 0]]), s),
                    [(2, 3), (1, 3)]),
    "index_add": (lambda x, s: x.index_add(0, graphc.tensor([1, 1]), s), [(2, 3), (2, 3)]),
    "setitem_slice": (lambda x, v: _set(x, (slice(0, 2), 1), v), [(3, 3), (2,)]),
    "setitem_index": (lambda x, v: _set(x, graphc.tensor([2, 0]), v), [(3, 2), (2, 2)]),
    "pad": (lambda x: graphc.ops.movement.pad(x, (1, -1, 2, 0)), [(2, 3)]),
    "cat": (lambda a, b: graphc.cat([a, b], 1), [(2, 1), (2, 2)]),
    "expand_flip": (lambda x: x.expand(2, 3).flip(1), [(3,)]),
    "permute_reshape": (lambda x: x.permute(1, 0).reshape(-1), [(2, 3)]),
}


def _set(x, index, value):
    y = x * 1.0
    y[index] = value
    return y


@pytest.mark.parametrize("name", list(SECOND_ORDER))
def test_second_derivatives(name, rng):
    fn, shapes = SECOND_ORDER[name]
    _second_order(_square(fn), *shapes, rng=rng)


def test_indexing_errors_name_the_op_and_line():
    x = graphc.ones(2, 3)
    with pytest.raises(ValueError, match=r"getitem at test_indexing.py:\d+: slice step cannot be"):
        x[::0]
    with pytest.raises(IndexError, match=r"getitem at test_indexing.py:\d+: index 2 is out of"):
        x[2]
    with pytest.raises(ShapeError, match=r"setitem at test_indexing.py:\d+: The expanded size"):
        x[0] = graphc.ones(2)
    with pytest.raises(ValueError, match="expected a non-empty list of Tensors"):
        graphc.cat([])
    with pytest.raises(IndexError, match="single ellipsis"):
        x[..., ...]
