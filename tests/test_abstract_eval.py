"""Abstract evaluation in the dispatch point: ops run their shape/dtype rule only."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import graphc
from graphc.dispatch import abstract_eval, current_tracer, is_abstract
from graphc.errors import TraceError
from graphc.tensor import AbstractArray, Tensor
from graphc.types import TensorType, float32, int64

HUGE = 1 << 20  # 2**40 elements per operand: only a shape rule can handle that


def huge(*shape, dtype=float32, requires_grad=False) -> Tensor:
    return Tensor._abstract(TensorType(shape, dtype), requires_grad)


def test_ops_run_their_shape_rule_only():
    a, b = huge(HUGE, HUGE), huge(HUGE, 3)
    with abstract_eval():
        y = (a @ b).relu().sum(dim=0)
    assert y.is_abstract and tuple(y.shape) == (3,) and y.dtype is float32
    assert isinstance(y._data, AbstractArray)


def test_concrete_inputs_give_abstract_results():
    x = graphc.ones(2, 3)
    with abstract_eval():
        y = x * 2 + graphc.tensor([1.0, 2.0, 3.0])
        i = x.argmax(dim=1)
    assert y.is_abstract and tuple(y.shape) == (2, 3)
    assert i.is_abstract and i.dtype is int64
    assert not x.is_abstract and (x.numpy() == 1).all()


def test_autograd_records_and_backward_gives_abstract_grads():
    w = huge(HUGE, 4, requires_grad=True)
    x = huge(8, HUGE)
    with abstract_eval():
        loss = (x @ w).tanh().mean()
        assert loss.grad_fn is not None
        loss.backward()
    assert w.grad.is_abstract and tuple(w.grad.shape) == (HUGE, 4)


@pytest.mark.parametrize("read", [
    lambda t: t.numpy(), lambda t: t.item(), lambda t: bool(t), lambda t: float(t),
    lambda t: np.asarray(t), lambda t: t.tolist(),
])
def test_reading_values_is_a_trace_error(read):
    with abstract_eval():
        t = graphc.ones(1) * 3
    with pytest.raises(TraceError, match="abstract"):
        read(t)


def test_an_abstract_tensor_in_an_eager_kernel_is_a_trace_error():
    with abstract_eval():
        t = graphc.ones(2) * 3
    with pytest.raises(TraceError, match="no values"):
        t + 1


def test_inplace_into_a_concrete_tensor_is_refused_and_changes_nothing():
    x = graphc.ones(3)
    with abstract_eval(), pytest.raises(TraceError, match="concrete tensor"):
        x.add_(1)
    assert (x.numpy() == 1).all()


def test_inplace_on_an_abstract_tensor_keeps_its_type():
    with abstract_eval():
        y = graphc.ones(2, 3) * 2
        y.mul_(3)
        y.relu_()
    assert y.is_abstract and tuple(y.shape) == (2, 3) and y._version == 2


def test_view_ops_give_views_sharing_the_version_counter():
    with abstract_eval():
        y = graphc.ones(2, 3) * 2
        v = y.t()
    assert v._base is y and v._version_counter is y._version_counter


def test_repr_names_the_type():
    with abstract_eval():
        y = graphc.ones(2, 3, requires_grad=True) * 2
    assert repr(y) == ("tensor(..., size=(2, 3), dtype=graphc.float32, abstract=True, "
                       "requires_grad=True)")


def test_mode_is_per_thread_and_restored():
    seen = []
    with abstract_eval():
        assert is_abstract()
        worker = threading.Thread(target=lambda: seen.append((is_abstract(), current_tracer())))
        worker.start()
        worker.join()
        with abstract_eval(False):
            assert not (graphc.ones(2) * 2).is_abstract
        assert is_abstract()
    assert not is_abstract()
    assert seen == [(False, None)]
