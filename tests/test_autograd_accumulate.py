"""AccumulateGrad's adoption of an unshared gradient (graphc.autograd.graph._adoptable): a
gradient only the engine holds becomes `.grad` without a copy, as PyTorch steals it; a
gradient anything else can reach (a hook, another leaf, the caller, a retained grad, a view's
source) is copied, so no `.grad` ever aliases another tensor's memory.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.ops import registry


@pytest.fixture
def copies(monkeypatch):
    """The shapes of the gradients AccumulateGrad copies (its `copy` / `cast` calls)."""
    seen = []
    call = registry.call

    def spy(name, *inputs, **attrs):
        if name in ("copy", "cast"):
            seen.append(tuple(inputs[0].shape))
        return call(name, *inputs, **attrs)

    monkeypatch.setattr(registry, "call", spy)
    return seen


def _aliases(a, b) -> bool:
    return np.shares_memory(a.detach().numpy(), b.detach().numpy())


def test_an_unshared_gradient_is_adopted(copies):
    w = graphc.ones(4, 3, requires_grad=True)
    b = graphc.ones(3, requires_grad=True)
    ((graphc.ones(2, 4) @ w) + b).relu().sum().backward()
    assert copies == []
    assert w.grad.tolist() == [[2.0] * 3] * 4 and b.grad.tolist() == [2.0] * 3
    assert w.grad.numpy().flags.c_contiguous and w.grad.grad_fn is None


def test_a_transposed_gradient_is_copied_into_the_parameters_layout(copies):
    w = graphc.ones(5, 4, requires_grad=True)
    graphc.nn.functional.linear(graphc.ones(2, 4), w).sum().backward()
    assert copies == [(5, 4)] and w.grad.numpy().flags.c_contiguous


def test_a_gradient_a_hook_keeps_is_copied():
    w = graphc.ones(3, requires_grad=True)
    kept = []
    w.register_hook(lambda g: kept.append(g))
    (w * 2.0).sum().backward()
    assert not _aliases(w.grad, kept[0])
    w.grad.add_(1.0)
    assert kept[0].tolist() == [2.0, 2.0, 2.0]


def test_one_gradient_for_two_leaves_is_not_shared():
    a = graphc.ones(3, requires_grad=True)
    b = graphc.ones(3, requires_grad=True)
    (a + b).sum().backward()  # AddBackward gives both leaves the same gradient tensor
    assert not _aliases(a.grad, b.grad)
    a.grad.add_(1.0)
    assert b.grad.tolist() == [1.0, 1.0, 1.0]


def test_the_callers_gradient_is_copied():
    w = graphc.ones(3, requires_grad=True)
    given = graphc.tensor([1.0, 2.0, 3.0])
    w.backward(given)
    assert not _aliases(w.grad, given)
    (w * 1.0).backward(given)
    given.add_(1.0)
    assert w.grad.tolist() == [2.0, 4.0, 6.0]


def test_a_retained_gradient_and_the_leafs_do_not_share():
    w = graphc.ones(3, requires_grad=True)
    y = w + 0.0
    y.retain_grad()
    y.sum().backward()
    assert not _aliases(w.grad, y.grad)


def test_autograd_grad_returns_what_no_grad_holds():
    w = graphc.ones(3, requires_grad=True)
    (g,) = graphc.autograd.grad((w * 3.0).sum(), w)
    assert w.grad is None and g.tolist() == [3.0, 3.0, 3.0]
    graphc.autograd.backward((w * 3.0).sum(), inputs=[w])
    assert not _aliases(w.grad, g) and w.grad.tolist() == [3.0, 3.0, 3.0]


def test_later_gradients_still_accumulate():
    w = graphc.ones(3, requires_grad=True)
    for _ in range(3):
        (w * 2.0).sum().backward()
    assert w.grad.tolist() == [6.0, 6.0, 6.0] and w.grad._version == 2


def test_a_whole_buffer_view_is_adopted_and_cut_from_its_source(copies):
    w = graphc.ones(6, requires_grad=True)
    (w.reshape(2, 3) * 2.0).sum().backward()  # the gradient is a reshape of a fresh array
    assert copies == []
    assert w.grad._base is None and w.grad.tolist() == [2.0] * 6


def test_a_slice_of_a_gradient_is_copied(copies):
    w = graphc.ones(2, requires_grad=True)
    (graphc.cat([w, graphc.ones(2)]) * 2.0).sum().backward()  # w.grad: a slice of a (4,)
    assert copies == [(2,)] and w.grad.tolist() == [2.0, 2.0]
