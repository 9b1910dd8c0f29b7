"""A training step takes the cpu executable's steady call: its `.grad` outputs are held until
the next step replaces them, so each kept output ping-pongs between two arrays (the last
call's, held; the one of two calls ago, dropped), as the general way (`_outputs`) would pick
them. A held array is never written: not the `.grad` the user keeps, nor any older one."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
import graphc.nn as gnn  # noqa: E402
import graphc.optim as goptim  # noqa: E402
from graphc.backends import compile as backend_compile  # noqa: E402
from graphc.ir import parse  # noqa: E402
from tests.test_cpu_steady_call import count_general_calls  # noqa: E402

N = 64  # the output, N x 4N float32 = 64 KB, is kept for reuse


def _product():
    return backend_compile(parse(f'''graph @f(%x: f32[{N},{N}], %w: f32[{N},{4 * N}])
        -> (f32[{N},{4 * N}]) {{
      %0: f32[{N},{4 * N}] = matmul(%x, %w)
      return (%0)
    }}'''), "cpu")


@pytest.fixture
def inputs(request):
    rng = np.random.default_rng(abs(hash(request.node.name)) % 2**32)
    return (rng.standard_normal((N, N)).astype(np.float32),
            rng.standard_normal((N, 4 * N)).astype(np.float32))


def test_the_last_output_held_ping_pongs_between_two_arrays(inputs, monkeypatch):
    x, w = inputs
    ex = _product()
    held = ex.run(x, w)[0]
    held = ex.run(x, w)[0]  # the first one dropped: two arrays made
    general = count_general_calls(ex, monkeypatch)
    seen = []
    for _ in range(6):
        x *= -0.5
        snapshot = held.copy()
        new = ex.run(x, w)[0]
        assert new is not held
        np.testing.assert_array_equal(held, snapshot)  # the held one untouched
        np.testing.assert_allclose(new, x @ w, rtol=1e-5, atol=1e-5)
        seen.append(id(new))
        held = new  # as `.grad = new` drops the last step's
    assert general == [0]
    assert len(set(seen)) == 2 and seen[0::2] == [seen[0]] * 3


def test_both_arrays_held_go_the_general_way_and_neither_is_written(inputs, monkeypatch):
    x, w = inputs
    ex = _product()
    kept = [ex.run(x, w)[0], ex.run(x, w)[0]]  # the last call's and the one before
    snapshots = [a.copy() for a in kept]
    general = count_general_calls(ex, monkeypatch)
    x *= 2.0
    new = ex.run(x, w)[0]
    assert general == [1]
    assert all(new is not a for a in kept)
    for a, snapshot in zip(kept, snapshots):
        np.testing.assert_array_equal(a, snapshot)
    np.testing.assert_allclose(new, x @ w, rtol=1e-5, atol=1e-5)


def _training_step():
    graphc.manual_seed(0)
    model = gnn.Sequential(gnn.Linear(128, 256), gnn.ReLU(), gnn.Linear(256, 10))
    opt = goptim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = gnn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    rng = np.random.default_rng(7)
    x = graphc.tensor(rng.standard_normal((32, 128)).astype(np.float32))
    y = graphc.tensor(rng.integers(0, 10, 32))
    return model, graphc.compile(step, backend="cpu"), x, y


def test_a_training_step_takes_the_steady_call(monkeypatch):
    model, step, x, y = _training_step()
    for _ in range(3):
        step(x, y)
    general = count_general_calls(step.executable, monkeypatch)
    losses = [float(step(x, y)) for _ in range(4)]
    assert general == [0]
    assert losses == sorted(losses, reverse=True)  # it still learns


def test_gradients_the_user_holds_are_never_overwritten(monkeypatch):
    model, step, x, y = _training_step()
    weight = model[0].weight  # its .grad: 256 x 128 floats, a kept output
    step(x, y)
    held = []  # every step's .grad, kept by the user: the steady call cannot reuse them
    for _ in range(4):
        step(x, y)
        held.append((weight.grad, weight.grad.numpy().copy()))
    for grad, snapshot in held:
        np.testing.assert_array_equal(grad.numpy(), snapshot)
    assert len({id(grad.numpy()) for grad, _ in held}) == len(held)
    # dropped again: the steady call takes over, and the last one held stays as it was
    last, snapshot = held[-1]
    del held, grad
    general = count_general_calls(step.executable, monkeypatch)
    for _ in range(3):
        step(x, y)
        assert weight.grad.numpy() is not last.numpy()
    np.testing.assert_array_equal(last.numpy(), snapshot)
    assert general[0] <= 1  # the first call may find both arrays held (`last`, the newest)
