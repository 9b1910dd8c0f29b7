"""In-place operations against PyTorch: version counters, the saved-tensor check and its
message, leaf rules, history rebasing on non-leaves (gradients match torch), overwrites that
keep a tensor in the graph (zero_, fill_), dtype rules, and Python's augmented assignment."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from tests.conftest import torch_or_skip

INPLACE_CALLS = [
    ("add_", lambda t: t.add_(1.0)), ("add_alpha", lambda t: t.add_(t.detach(), alpha=2)),
    ("sub_", lambda t: t.sub_(0.5)), ("mul_", lambda t: t.mul_(2.0)),
    ("div_", lambda t: t.div_(4.0)), ("pow_", lambda t: t.pow_(2.0)),
    ("zero_", lambda t: t.zero_()), ("fill_", lambda t: t.fill_(3.0)),
    ("copy_", lambda t: t.copy_(graphc.ones(3))), ("clamp_", lambda t: t.clamp_(min=0.5)),
    ("exp_", lambda t: t.exp_()), ("log_", lambda t: t.log_()), ("sqrt_", lambda t: t.sqrt_()),
    ("neg_", lambda t: t.neg_()), ("tanh_", lambda t: t.tanh_()),
    ("sigmoid_", lambda t: t.sigmoid_()), ("relu_", lambda t: t.relu_()),
]


@pytest.mark.parametrize("name, fn", INPLACE_CALLS, ids=[n for n, _ in INPLACE_CALLS])
def test_inplace_bumps_version_and_matches_torch(name, fn):
    t = graphc.tensor([0.25, 1.0, 2.0])
    out = fn(t)
    assert out is t and t._version == 1
    fn(t)
    assert t._version == 2
    torch = torch_or_skip()
    tt = torch.tensor([0.25, 1.0, 2.0])
    fn_t = {"copy_": lambda x: x.copy_(torch.ones(3))}.get(name, fn)
    fn_t(tt)
    fn_t(tt)
    np.testing.assert_allclose(t.numpy(), tt.numpy(), rtol=1e-6)


def test_augmented_assignment_is_in_place():
    x = graphc.tensor([1.0, 2.0])
    alias = x
    x += 1
    x *= 3
    x -= 1
    x /= 2
    assert x is alias and x.tolist() == [2.5, 4.0] and x._version == 4
    a = np.zeros(2)
    t = graphc.from_numpy(a)
    t += 5
    assert a.tolist() == [5.0, 5.0]


def test_views_share_the_version_counter():
    x = graphc.zeros(2, 3)
    v = x.reshape(6)
    v.add_(1)
    assert x._version == 1 and x.tolist() == [[1.0] * 3] * 2
    x[0] = 7.0
    assert v._version == 2 and v.tolist()[:3] == [7.0] * 3


# ---- the saved-tensor check --------------------------------------------------------------
def test_modified_saved_output_error_names_node_and_versions():
    x = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x.exp()
    y.add_(1)
    with pytest.raises(RuntimeError, match=r"one of the variables needed for gradient "
                                           r"computation has been modified by an inplace "
                                           r"operation: \[graphc.FloatTensor \[3\]\], which is "
                                           r"output 0 of ExpBackward0, is at version 1; expected "
                                           r"version 0 instead"):
        y.sum().backward()


def test_modified_saved_input_error():
    x = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    z = y * y  # saves y at version 0
    y.mul_(3)
    with pytest.raises(RuntimeError, match=r"\[graphc.FloatTensor \[3\]\], which is output 0 of "
                                           r"MulBackward0, is at version 1; expected version 0"):
        z.sum().backward()
    w = graphc.tensor([1.0, 2.0], dtype=graphc.float64, requires_grad=True)
    u = (w * w).sum()
    with graphc.no_grad():
        w.add_(1)  # a leaf: no "which is output" clause
    with pytest.raises(RuntimeError, match=r"\[graphc.DoubleTensor \[2\]\] is at version 1; "
                                           r"expected version 0 instead"):
        u.backward()


def test_unsaved_tensors_may_change():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    z = y + 1  # add saves nothing
    y.mul_(5)
    z.sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


# ---- leaves --------------------------------------------------------------------------------
def test_inplace_on_leaf_requiring_grad():
    w = graphc.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in "
                                           "an in-place operation."):
        w.add_(1)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        w += 1
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad is "
                                           "being used in an in-place operation."):
        w[0].add_(1)
    assert w._version == 0
    with graphc.no_grad():
        w.sub_(0.5)
        w[0].mul_(2)
    assert w.is_leaf and w.requires_grad and w.grad_fn is None and w._version == 2
    assert w.tolist() == [1.0, 1.5]


def test_optimizer_style_update():
    p = graphc.tensor([1.0, 2.0], requires_grad=True)
    (p * p).sum().backward()
    with graphc.no_grad():
        p.sub_(p.grad * 0.1)
        p.grad.zero_()
    assert p.tolist() == pytest.approx([0.8, 1.6]) and p.grad.tolist() == [0.0, 0.0]
    (p * p).sum().backward()
    assert p.grad.tolist() == pytest.approx([1.6, 3.2])


# ---- rebasing history on non-leaves (gradients against torch) ----------------------------
REBASE_PROGRAMS = {
    "mul_": lambda m, x: (x * 2).mul_(3),
    "chain": lambda m, x: (x * 2).add_(x).mul_(x).sub_(1.0).exp_(),
    "iadd_self_chain": lambda m, x: _iops(x * 1.5, x),
    "clamp_sigmoid": lambda m, x: (x * 3).clamp_(min=0.5, max=4.0).sigmoid_(),
    "div_tanh": lambda m, x: (x + 1).div_(x + 2).tanh_(),
    "into_constant": lambda m, x: m.zeros(3).add_(x).mul_(x),
    "copy_into_constant": lambda m, x: m.zeros(3).copy_(x * 2),
    "zero_then_add": lambda m, x: (x * 2).zero_().add_(x),
    "fill": lambda m, x: (x * 2).fill_(3.0),
    "float64_into_float32": lambda m, x: (x * 1).add_(x.double()),
    "setitem": lambda m, x: _setitem(x * 2, x),
}


def _iops(y, x):
    y += x
    y *= x
    y /= 2
    return y


def _setitem(y, x):
    y[0] = 5.0
    y[1:] = x[:2] * 3
    return y


@pytest.mark.parametrize("name", list(REBASE_PROGRAMS))
def test_rebased_history_gradients_match_torch(name):
    torch = torch_or_skip()
    program = REBASE_PROGRAMS[name]
    results = []
    for mod in (graphc, torch):
        x = mod.tensor([0.5, 1.0, 2.0], requires_grad=True)
        y = program(mod, x)
        assert y.requires_grad and not y.is_leaf
        (y * y).sum().backward()
        results.append((y.detach().numpy(), x.grad.numpy()))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5)


@pytest.mark.parametrize("program, node, versions", [
    (lambda x: (x + 1).tanh_().div_(x + 2), "TanhBackward0", (2, 1)),
    (lambda x: (x * 2).add_(x).exp_().mul_(x), "ExpBackward0", (3, 2)),
])
def test_inplace_after_output_saving_op_errors_like_torch(program, node, versions):
    x = graphc.tensor([0.5, 1.0, 2.0], requires_grad=True)
    y = program(x)
    now, expected = versions
    with pytest.raises(RuntimeError, match=rf"which is output 0 of {node}, is at version {now}; "
                                           rf"expected version {expected} instead"):
        (y * y).sum().backward()


VIEW_PROGRAMS = {
    "slice_mul_": lambda m, x: _then(x * 2, lambda y: y[1:].mul_(3)),
    "slice_zero_": lambda m, x: _then(x * 2, lambda y: y[:2].zero_()),
    "view_of_view": lambda m, x: _then((x * 2).reshape(3, 1), lambda y: y.t()[0].exp_()),
    "setitem_on_view": lambda m, x: _then((x + 1).reshape(3, 1), _set_row),
    "view_add_leaf": lambda m, x: _then(m.zeros(2, 3), lambda y: y[1].add_(x)),
}


def _then(y, change):
    change(y)
    return y


def _set_row(y):
    y[1][0] = 7.0


@pytest.mark.parametrize("name", list(VIEW_PROGRAMS))
def test_inplace_on_views_with_autograd_matches_torch(name):
    torch = torch_or_skip()
    program = VIEW_PROGRAMS[name]
    results = []
    for mod in (graphc, torch):
        x = mod.tensor([0.5, 1.0, 2.0], requires_grad=True)
        y = program(mod, x)
        assert y.requires_grad
        (y * y).sum().backward()
        results.append((y.detach().numpy(), x.grad.numpy()))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5)


def test_zero_keeps_tensor_in_graph():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.zero_()
    assert y.requires_grad and y.grad_fn.name() == "ZeroBackward0"
    y.sum().backward()
    assert x.grad.tolist() == [0.0, 0.0]
    z = x * 1
    z.fill_(4.0)
    assert z.grad_fn.name() == "FillBackward0"


def test_retain_grad_follows_inplace():
    torch = torch_or_skip()
    grads = []
    for mod in (graphc, torch):
        x = mod.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = x * 2
        y.retain_grad()
        y.mul_(3)
        (y * y).sum().backward()
        grads.append((y.grad.numpy(), x.grad.numpy()))
    np.testing.assert_allclose(grads[0][0], grads[1][0])
    np.testing.assert_allclose(grads[0][1], grads[1][1])


# ---- dtype rules ---------------------------------------------------------------------------
def test_inplace_dtype_rules():
    i = graphc.tensor([1, 2])
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired "
                                           "output type Long"):
        i.add_(1.5)
    with pytest.raises(RuntimeError, match="result type Float can't be cast"):
        i.exp_()
    assert i.tolist() == [1, 2] and i._version == 0
    i.add_(True)
    assert i.tolist() == [2, 3]
    f = graphc.tensor([1.0, 2.0])
    f.add_(graphc.tensor([1.0, 1.0], dtype=graphc.float64))
    assert f.dtype is graphc.float32 and f.tolist() == [2.0, 3.0]
    b = graphc.tensor([True, False])
    with pytest.raises(RuntimeError, match="result type Long can't be cast to the desired output "
                                           "type Bool"):
        b.add_(1)
    f.copy_(graphc.tensor([5, 6]))
    assert f.dtype is graphc.float32 and f.tolist() == [5.0, 6.0]
