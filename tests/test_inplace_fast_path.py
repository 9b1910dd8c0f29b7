"""The eager in-place path for one named op (graphc.autograd.inplace._apply_op_in_place) gives
what the general path gives: values, versions, history, gradients (first and second order),
the saved-tensor checks and the errors; and it takes a snapshot of the old value only where
the op's backward reads it (mul_, div_, pow_, log_, clamp_), none for add_, sub_ or exp_.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.autograd import inplace as inplace_module
from graphc.errors import AutogradError, DTypeError, ShapeError
from graphc.ops import registry
from graphc.tensor import Tensor
from tests.conftest import torch_or_skip

# (method, op, operand maker or None for a unary op)
CASES = [
    ("add_", "add", "tensor"), ("sub_", "sub", "tensor"), ("mul_", "mul", "tensor"),
    ("div_", "div", "tensor"), ("pow_", "pow", "number"), ("exp_", "exp", None),
    ("log_", "log", None), ("sqrt_", "sqrt", None), ("tanh_", "tanh", None),
    ("sigmoid_", "sigmoid", None), ("relu_", "relu", None), ("neg_", "neg", None),
]
SNAPSHOTS = {"mul", "div", "pow", "log"}  # ops whose node saves input 0


def _operands(kind, lib, grad: bool):
    if kind is None:
        return ()
    if kind == "number":
        return (2.0,)
    v = lib.tensor([0.5, 1.5, 3.0])
    if grad:
        v.requires_grad_(True)
    return (v,)


def _run(lib, name, kind, operand_grad: bool, path: str | None = None, op: str | None = None):
    """y = w * 1 (a non-leaf), y.<name>(operands), (y * y).sum() backward: values and grads."""
    w = lib.tensor([0.25, 1.0, 2.0], requires_grad=True)
    operands = _operands(kind, lib, operand_grad)
    y = w * 1.0
    if path is None:
        getattr(y, name)(*operands)
    else:  # graphc's in-place dispatcher, by the named op or by the general path
        compute = None if path == "fast" else (
            lambda old: registry.call(op, old, *operands))
        registry.inplace(y, name, compute, operands, op if path == "fast" else None)
    (y * y).sum().backward()
    grads = [w.grad] + [v.grad for v in operands if getattr(v, "requires_grad", False)]
    return y, grads, y.grad_fn.name() if hasattr(y.grad_fn, "name") else type(y.grad_fn).__name__


@pytest.mark.parametrize("operand_grad", [False, True])
@pytest.mark.parametrize("name, op, kind", CASES, ids=[c[0] for c in CASES])
def test_fast_path_matches_the_general_path_and_pytorch(name, op, kind, operand_grad):
    if kind != "tensor" and operand_grad:
        pytest.skip("no tensor operand to require grad")
    fast, fast_grads, fast_node = _run(graphc, name, kind, operand_grad, "fast", op)
    slow, slow_grads, slow_node = _run(graphc, name, kind, operand_grad, "general", op)
    assert fast.detach().numpy().tobytes() == slow.detach().numpy().tobytes()
    assert fast._version == slow._version == 1
    assert fast_node == slow_node
    for a, b in zip(fast_grads, slow_grads):
        assert a.numpy().tobytes() == b.numpy().tobytes()
    torch = torch_or_skip()
    ref, ref_grads, ref_node = _run(torch, name, kind, operand_grad)
    assert fast_node == ref_node
    np.testing.assert_allclose(fast.detach().numpy(), ref.detach().numpy(), rtol=1e-6)
    for a, b in zip(fast_grads, ref_grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5)


@pytest.mark.parametrize("name, op, kind", CASES, ids=[c[0] for c in CASES])
def test_snapshot_only_where_the_backward_reads_the_old_value(name, op, kind, monkeypatch):
    copies = []
    original = Tensor._detached_copy_with_history

    def counting(self, abstract, copy=True):
        copies.append(copy)
        return original(self, abstract, copy)

    monkeypatch.setattr(Tensor, "_detached_copy_with_history", counting)
    _run(graphc, name, kind, operand_grad=kind == "tensor")
    assert copies == ([True] if op in SNAPSHOTS else [])


def test_no_grad_and_plain_tensors_take_no_snapshot(monkeypatch):
    monkeypatch.setattr(Tensor, "_detached_copy_with_history", None)  # any call fails
    x = graphc.ones(3)
    x.mul_(graphc.full((3,), 2.0))
    w = graphc.ones(3, requires_grad=True)
    with graphc.no_grad():
        w.mul_(3.0)
    assert x.tolist() == [2.0, 2.0, 2.0] and w.tolist() == [3.0, 3.0, 3.0]
    assert w.grad_fn is None and w._version == 1


def test_second_order_through_the_fast_path():
    w = graphc.tensor([0.5, 2.0], requires_grad=True)
    y = w * w
    y.add_(w)  # y = w^2 + w, through the named op
    y.mul_(w)  # y = w^3 + w^2
    (g,) = graphc.autograd.grad(y.sum(), w, create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), 3 * np.array([0.25, 4.0]) + 2 * np.array(
        [0.5, 2.0]), rtol=1e-6)
    (gg,) = graphc.autograd.grad(g.sum(), w)
    np.testing.assert_allclose(gg.numpy(), 6 * np.array([0.5, 2.0]) + 2, rtol=1e-6)


def test_saved_tensor_checks_still_fire():
    w = graphc.tensor([1.0, 2.0], requires_grad=True)
    y = w.exp()  # exp saves its output y
    y.add_(1.0)
    with pytest.raises(AutogradError, match="modified by an inplace operation"):
        y.sum().backward()
    v = graphc.tensor([1.0, 2.0], requires_grad=True)
    z = v * 1.0
    product = z * v  # mul saves z
    z.sub_(1.0)
    with pytest.raises(AutogradError, match="is at version 1; expected version 0"):
        product.sum().backward()


def test_errors_are_the_general_paths():
    leaf = graphc.ones(2, requires_grad=True)
    with pytest.raises(AutogradError, match="add_ at .*: a leaf Variable that requires grad"):
        leaf.add_(1.0)
    with pytest.raises(ShapeError, match="output with shape \\[2\\] doesn't match the broadcast "
                                         "shape \\[3, 2\\]"):
        graphc.ones(2).add_(graphc.ones(3, 2))
    with pytest.raises(DTypeError, match="result type Float can't be cast to the desired output "
                                         "type Long"):
        graphc.tensor([1, 2]).mul_(1.5)
    with pytest.raises(ShapeError, match="more than one element of the written-to tensor"):
        graphc.from_numpy(np.broadcast_to(np.ones(1, np.float32), (3,))).add_(1.0)


def test_views_and_traces_take_the_general_path(monkeypatch):
    """A view's change goes through its base (CopySlices), which only the general path does."""
    monkeypatch.setattr(inplace_module, "_apply_op_in_place", None)  # any call fails
    w = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    base = w * 1.0
    base[1:].mul_(2.0)
    base.sum().backward()
    assert w.grad.tolist() == [1.0, 2.0, 2.0]
    graph = graphc.trace(lambda t: t.clone().add_(1.0), graphc.ones(2))
    assert "add(" in str(graph)
