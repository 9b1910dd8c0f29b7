"""Eager mode's numpy update (graphc.optim.foreach) against the op-by-op update: SGD and
Adam/AdamW with every option, float32 and float64, several steps, must agree bit for bit in
parameters and state and bump the same version counters; the numpy path must really run
(no graphc op in a steady step), and step aside where only the ops are right (a tensor
hyperparameter, aliased memory, a trace, `foreach=False`).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import graphc
from graphc.ops import registry
from graphc.optim import SGD, Adam, AdamW

SGD_OPTIONS = [
    dict(lr=0.1),
    dict(lr=0.1, momentum=0.9),
    dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    dict(lr=0.1, momentum=0.5, dampening=0.25, maximize=True),
    dict(lr=0.0, momentum=0.9, weight_decay=0.1),
    dict(lr=0.1, momentum=1, weight_decay=1),  # Python ints
]
ADAM_OPTIONS = [
    (Adam, dict(lr=1e-2)),
    (Adam, dict(lr=1e-2, weight_decay=0.1, amsgrad=True)),
    (Adam, dict(lr=1e-2, betas=(0.3, 0.9), maximize=True)),  # lerp's second formula
    (AdamW, dict(lr=1e-2, weight_decay=0.05)),
    (AdamW, dict(lr=1e-2, amsgrad=True, maximize=True, eps=1e-3)),
]


def _params(dtype, seed):
    rng = np.random.default_rng(seed)
    return [graphc.tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)
            for shape in [(4, 3), (3,), ()]]


def _run(make, dtype, foreach, steps=4, seed=0):
    params = _params(dtype, seed)
    opt = make(params, foreach)
    rng = np.random.default_rng(seed + 1)
    for _ in range(steps):
        for p in params:
            p.grad = graphc.tensor(rng.standard_normal(p.shape).astype(dtype))
        opt.step()
    state = {(i, key): value for i, p in enumerate(params)
             for key, value in opt.state.get(p, {}).items()}
    return params, state


def _assert_same(first, second):
    (params_a, state_a), (params_b, state_b) = first, second
    for a, b in zip(params_a, params_b):
        assert a.dtype is b.dtype and a._version == b._version
        assert a.detach().numpy().tobytes() == b.detach().numpy().tobytes()
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        a, b = state_a[key], state_b[key]
        assert a.dtype is b.dtype and a._version == b._version, key
        assert a.numpy().tobytes() == b.numpy().tobytes(), key


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", SGD_OPTIONS, ids=str)
def test_sgd_numpy_update_is_the_op_update(options, dtype):
    def make(params, foreach):
        return SGD(params, foreach=foreach, **options)

    _assert_same(_run(make, dtype, None), _run(make, dtype, False))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cls, options", ADAM_OPTIONS, ids=str)
def test_adam_numpy_update_is_the_op_update(cls, options, dtype):
    def make(params, foreach):
        return cls(params, foreach=foreach, **options)

    _assert_same(_run(make, dtype, None), _run(make, dtype, False))


@pytest.mark.parametrize("make", [
    lambda ps, foreach: SGD(ps, lr=0.1, momentum=0.9, foreach=foreach),
    lambda ps, foreach: Adam(ps, lr=0.1, amsgrad=True, foreach=foreach),
], ids=["SGD", "Adam"])
def test_a_steady_eager_step_calls_no_op_unless_foreach_is_off(make, monkeypatch):
    applied = []
    apply = registry._dispatcher

    def counting_apply(opdef, *inputs, **attrs):
        applied.append(opdef.name)
        return apply(opdef, *inputs, **attrs)

    for foreach, expect_ops in [(None, False), (True, False), (False, True)]:
        params = _params(np.float32, 3)
        opt = make(params, foreach)
        for _ in range(2):  # the first step makes the state (with ops)
            for p in params:
                p.grad = graphc.ones(*p.shape)
            applied.clear()
            monkeypatch.setattr(registry, "_dispatcher", counting_apply)
            opt.step()
            monkeypatch.setattr(registry, "_dispatcher", apply)
        assert bool(applied) == expect_ops, (foreach, applied)


def test_tensor_hyperparameters_and_aliasing_take_the_op_path():
    """A tensor lr (a scheduler's runtime input) and a gradient sharing the parameter's memory
    are the op path's; the results still equal the op path's."""
    def lr_tensor(params, foreach):
        return SGD(params, lr=graphc.tensor(0.1), momentum=0.9, foreach=foreach)

    _assert_same(_run(lr_tensor, np.float32, None), _run(lr_tensor, np.float32, False))
    results = []
    for foreach in (None, False):
        p = graphc.tensor([1.0, 2.0], requires_grad=True)
        opt = SGD([p], lr=0.5, momentum=0.9, foreach=foreach)
        for _ in range(3):
            p.grad = p.detach()  # the gradient is the parameter's memory
            opt.step()
        results.append(p.detach().numpy().tobytes())
    assert results[0] == results[1]


def test_numpy_scalar_hyperparameters_take_the_op_path():
    """np.float64(0.1) would make numpy compute in float64; graphc casts it to float32."""
    def make(params, foreach):
        return SGD(params, lr=np.float64(0.1), momentum=np.float64(0.9), foreach=foreach)

    _assert_same(_run(make, np.float32, None), _run(make, np.float32, False))


def test_the_step_still_traces_as_graph_ops():
    w = graphc.ones(3, requires_grad=True)
    opt = SGD([w], lr=0.1, momentum=0.9)
    w.grad = graphc.ones(3)
    opt.step()  # eager: the buffer exists now

    def step(g):
        w.grad = g
        opt.step()
        return w

    graph = str(graphc.trace(step, graphc.ones(3)))
    assert "mul(" in graph and "add(" in graph


def test_a_state_dict_round_trip_keeps_foreach():
    params = _params(np.float32, 0)
    opt = SGD(params, lr=0.1, foreach=False)
    copy = SGD(params, lr=0.1)
    copy.load_state_dict(opt.state_dict())
    assert [g["foreach"] for g in copy.param_groups] == [False]
    assert list(itertools.chain.from_iterable(g["params"] for g in copy.param_groups)) == params
