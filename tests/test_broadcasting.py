"""Broadcasting and type promotion against PyTorch: the broadcasting-semantics examples (the
seeds' autograd-mechanics notes, PyTorch's docs), their errors, in-place ops that would change
their target's shape, gradients of broadcast operands, and Python-scalar promotion."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from tests.conftest import torch_or_skip

# (shape x, shape y, result shape or None when not broadcastable)
CASES = [
    ((5, 7, 3), (5, 7, 3), (5, 7, 3)),
    ((5, 3, 4, 1), (3, 1, 1), (5, 3, 4, 1)),
    ((5, 1, 4, 1), (3, 1, 1), (5, 3, 4, 1)),
    ((1,), (3, 1, 7), (3, 1, 7)),
    ((), (2, 3), (2, 3)),
    ((4, 1), (1, 5), (4, 5)),
    ((0,), (2, 1), (2, 0)),
    ((5, 2, 4, 1), (3, 1, 1), None),
    ((0,), (2, 2), None),
    ((2,), (3,), None),
    ((2, 3), (2,), None),
]


@pytest.mark.parametrize("sx, sy, expected", CASES, ids=[f"{a}+{b}" for a, b, _ in CASES])
def test_broadcast_shapes(sx, sy, expected):
    x, y = graphc.ones(*sx), graphc.ones(*sy)
    if expected is not None:
        assert (x + y).shape == expected and (y * x).shape == expected
    else:
        with pytest.raises(RuntimeError, match="must match the size of tensor b"):
            x + y


@pytest.mark.parametrize("sx, sy", [(a, b) for a, b, e in CASES if e is None])
def test_broadcast_error_wording_matches_torch(sx, sy):
    torch = torch_or_skip()
    with pytest.raises(RuntimeError) as theirs:
        torch.ones(*sx) + torch.ones(*sy)
    with pytest.raises(graphc.ShapeError) as ours:
        graphc.ones(*sx) + graphc.ones(*sy)
    assert str(ours.value).endswith(str(theirs.value))


def test_seed_error_example():
    x, y = graphc.ones(5, 2, 4, 1), graphc.ones(3, 1, 1)
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(2\) must match the size of "
                                           r"tensor b \(3\) at non-singleton dimension 1"):
        x + y
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(2\) must match the size of "
                                           r"tensor b \(3\) at non-singleton dimension 1"):
        graphc.ones(2, 2) * graphc.ones(2, 3)


@pytest.mark.parametrize("op", ["add_", "sub_", "mul_", "div_"])
def test_inplace_may_not_change_target_shape(op):
    x = graphc.ones(3)
    with pytest.raises(RuntimeError, match=r"output with shape \[3\] doesn't match the broadcast "
                                           r"shape \[2, 3\]"):
        getattr(x, op)(graphc.ones(2, 3))
    assert x.tolist() == [1.0, 1.0, 1.0] and x._version == 0
    y = graphc.ones(1, 3, 1)
    with pytest.raises(RuntimeError, match=r"output with shape \[1, 3, 1\] doesn't match the "
                                           r"broadcast shape \[3, 3, 7\]"):
        getattr(y, op)(graphc.ones(3, 1, 7))
    z = graphc.ones(5, 3, 4, 1)
    getattr(z, op)(graphc.ones(3, 1, 1))  # broadcasting the other operand is fine
    assert z.shape == (5, 3, 4, 1) and z._version == 1


def test_iadd_shape_error():
    x = graphc.ones(3)
    with pytest.raises(RuntimeError, match=r"output with shape \[3\] doesn't match"):
        x += graphc.ones(2, 3)


def test_broadcast_values_and_gradients_match_torch(rng):
    torch = torch_or_skip()
    a0 = rng.standard_normal((5, 1, 4, 1))
    b0 = rng.standard_normal((3, 1, 1))
    grads = []
    for mod in (graphc, torch):
        a = mod.tensor(a0, requires_grad=True)
        b = mod.tensor(b0, requires_grad=True)
        y = a * b + b.exp() - a / (b * b + 1.0)
        (y * y).sum().backward()
        grads.append((y.detach().numpy(), a.grad.numpy(), b.grad.numpy()))
    for ours, theirs in zip(*grads):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=1e-10)


# ---- type promotion ----------------------------------------------------------------------
PROMOTIONS = [
    (lambda m: m.tensor([1, 2]) * 2.5, "float32"),
    (lambda m: m.tensor([1.0], dtype=m.float64) * 2, "float64"),
    (lambda m: m.tensor([1.0], dtype=m.float64) * 2.5, "float64"),
    (lambda m: m.tensor([1, 2]) + 1, "int64"),
    (lambda m: m.tensor([1, 2]) + True, "int64"),
    (lambda m: m.tensor([True]) + 1, "int64"),
    (lambda m: m.tensor([True]) + True, "bool"),
    (lambda m: m.tensor([True]) * 1.5, "float32"),
    (lambda m: m.tensor([1.0]) * 2, "float32"),
    (lambda m: m.tensor([1]) / 2, "float32"),
    (lambda m: m.tensor([1]) / m.tensor([2]), "float32"),
    (lambda m: m.tensor([1.0]) + m.tensor([1], dtype=m.float64), "float64"),
    (lambda m: m.tensor([1]) + m.tensor([1.5]), "float32"),
    (lambda m: 2 - m.tensor([1]), "int64"),
    (lambda m: 2.0 ** m.tensor([1]), "float32"),
    (lambda m: m.tensor([1, 2]) == 1.5, "bool"),
    (lambda m: m.tensor([1.0]).exp(), "float32"),
    (lambda m: m.tensor([1]).exp(), "float32"),
]


@pytest.mark.parametrize("make, dtype", PROMOTIONS, ids=[str(i) for i in range(len(PROMOTIONS))])
def test_type_promotion(make, dtype):
    assert make(graphc).dtype.name == dtype
    torch = torch_or_skip()
    assert str(make(torch).dtype) == f"torch.{dtype}"
