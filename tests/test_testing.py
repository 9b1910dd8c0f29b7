"""graphc.testing.assert_compiled_matches and graphc.testing.repro.

Models (MLP, LeNet-5 with BatchNorm in eval and train mode, with dropout, a custom
autograd.Function) pass on the interpreter, forward and gradients. A backend registered here
wraps the interpreter and corrupts one node (picked by op and source line); the harness must
catch it, name that node's IR text and source line, and write a repro that parses, verifies
and, run with `run_repro`, diverges on the broken backend and matches on "interp".
"""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import graphc
from graphc import nn
from graphc.autograd import Function
from graphc.backends import BACKENDS, register_backend
from graphc.ir import Interpreter, parse, verify
from graphc.testing import CompiledMismatch, assert_compiled_matches, compare
from graphc.testing.repro import load_repro, run_repro, save_repro


# ---- models -----------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 5)

    def forward(self, x):
        h = self.fc1(x).relu()
        h = self.fc2(h).relu()  # the line the broken backend corrupts
        return self.fc3(h)


def line_of(obj, marker: str) -> int:
    """The line number of the source line of `obj` that contains `marker`."""
    lines, first = inspect.getsourcelines(obj)
    return first + next(i for i, line in enumerate(lines) if marker in line)


BROKEN_LINE = line_of(MLP, "the line the broken backend corrupts")


def lenet(batchnorm: bool = True, dropout: float = 0.0):
    """LeNet-5 on 28x28 (conv 1->6 5x5 padding 2, pool, conv 6->16 5x5, pool, 120, 84, 10)."""
    norm2d = (lambda c: [nn.BatchNorm2d(c)]) if batchnorm else (lambda c: [])
    drop = [nn.Dropout(dropout)] if dropout else []
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), *norm2d(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), *norm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), *([nn.BatchNorm1d(120)] if batchnorm else []), nn.ReLU(),
        *drop, nn.Linear(120, 84), nn.ReLU(), *drop, nn.Linear(84, 10),
    )


class SiLU(Function):
    """x * sigmoid(x) with a hand-written backward built from graphc ops."""

    @staticmethod
    def forward(ctx, x):
        s = x.sigmoid()
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx, g):
        x, s = ctx.saved_tensors
        return g * (s * (1 + x * (1 - s)))  # the backward line a broken backend corrupts


class CustomFunctionModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 10)
        self.fc2 = nn.Linear(10, 3)

    def forward(self, x):
        return self.fc2(SiLU.apply(self.fc1(x)))


def inputs(rng, *shape):
    return graphc.tensor(rng.standard_normal(shape).astype(np.float32))


# ---- a deliberately broken backend ------------------------------------------------------------
class CorruptingInterpreter(Interpreter):
    """The interpreter, except that nodes for which `corrupt(node, graph)` holds get 0.5
    added to their outputs."""

    def __init__(self, graph, corrupt) -> None:
        super().__init__(graph)
        self.corrupt = corrupt

    def run_node(self, node, args):
        results = super().run_node(node, args)
        if self.corrupt(node, self.graph):
            results = [r + np.asarray(0.5, r.dtype) for r in results]
        return results


class CorruptingExecutable:
    """An Executable (graphc.backends' contract) over CorruptingInterpreter."""

    memory_plan = None

    def __init__(self, graph, corrupt) -> None:
        self.graph = verify(graph)
        self._interpreter = CorruptingInterpreter(graph, corrupt)

    def run(self, *arrays):
        return self._interpreter.run(*arrays)


BACKWARD_LINE = line_of(SiLU, "the backward line a broken backend corrupts")


def relu_at_broken_line(node, graph) -> bool:
    return node.op == "relu" and node.loc == f"test_testing.py:{BROKEN_LINE}"


def mul_at_backward_line(node, graph) -> bool:
    return node.op == "mul" and node.loc == f"test_testing.py:{BACKWARD_LINE}"


def relu_not_an_output(node, graph) -> bool:
    """As a bad fused kernel would: every node made an output hides it."""
    return node.op == "relu" and node.outputs[0] not in graph.outputs


def broken_relu(graph, options):
    return CorruptingExecutable(graph, relu_at_broken_line)


def broken_backward_mul(graph, options):
    return CorruptingExecutable(graph, mul_at_backward_line)


def broken_fused_relu(graph, options):
    return CorruptingExecutable(graph, relu_not_an_output)


BROKEN = {"broken_relu": broken_relu, "broken_backward": broken_backward_mul,
          "broken_fused": broken_fused_relu}


@pytest.fixture
def broken_backends():
    for name, factory in BROKEN.items():
        register_backend(name, factory)
    yield
    for name in BROKEN:
        BACKENDS.pop(name, None)


# ---- models pass on the interpreter -----------------------------------------------------------
def test_mlp_matches(rng):
    graphc.manual_seed(0)
    assert_compiled_matches(MLP(), inputs(rng, 4, 12), backends=("interp",))


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_lenet_batchnorm_matches(rng, train):
    graphc.manual_seed(1)
    model = lenet(batchnorm=True)
    x = inputs(rng, 3, 1, 28, 28)
    model.train()
    model(x)  # non-trivial running statistics for eval mode
    model.train(train)
    state = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    assert_compiled_matches(model, x)
    for k, v in model.state_dict().items():  # the harness leaves the model as it found it
        np.testing.assert_array_equal(v.numpy(), state[k], err_msg=k)


def test_dropout_compares_with_the_same_masks(rng):
    graphc.manual_seed(2)
    model = lenet(batchnorm=False, dropout=0.4).train()
    offset = graphc.default_generator.offset
    assert_compiled_matches(model, inputs(rng, 2, 1, 28, 28))
    assert graphc.default_generator.offset == offset


def test_custom_function_model_matches(rng):
    graphc.manual_seed(3)
    assert_compiled_matches(CustomFunctionModel(), inputs(rng, 5, 6))


def test_plain_function_with_integer_output(rng):
    def f(x, w):
        y = (x @ w).tanh()
        return {"y": y, "arg": y.argmax(1), "pos": y > 0}

    assert_compiled_matches(f, inputs(rng, 4, 3), inputs(rng, 3, 5))


def test_loss_with_integer_targets(rng):
    graphc.manual_seed(7)
    model = MLP()

    def loss(x, y):
        return nn.functional.cross_entropy(model(x), y)

    y = graphc.tensor(rng.integers(0, 5, size=4))
    assert_compiled_matches(loss, inputs(rng, 4, 12), y)


def test_eager_rounding_is_reported_as_eager(rng):
    def cancel(x):
        return (x + 1e4) - 1e4

    with pytest.raises(CompiledMismatch, match="eager differs") as info:
        assert_compiled_matches(cancel, inputs(rng, 8) * 1e-3, grads=False)
    assert info.value.run == "eager"
    assert_compiled_matches(cancel, inputs(rng, 8) * 1e-3, grads=False, atol=1e-3)


# ---- a broken backend is caught, named and reproduced -----------------------------------------
def test_broken_relu_is_bisected_with_a_repro(rng, tmp_path, broken_backends):
    graphc.manual_seed(4)
    model, x = MLP(), inputs(rng, 4, 12)
    with pytest.raises(CompiledMismatch) as info:
        assert_compiled_matches(model, x, backends=("interp", "broken_relu"),
                                repro_dir=str(tmp_path))
    err, message = info.value, str(info.value)
    assert err.run == "broken_relu" and err.check == "forward"
    assert err.node.op == "relu" and err.node.loc == f"test_testing.py:{BROKEN_LINE}"
    assert err.node_text in message and "relu(" in err.node_text
    assert f"# test_testing.py:{BROKEN_LINE}" in message
    assert "max abs error 0.5" in message
    assert os.path.dirname(err.gir_path) == str(tmp_path)
    assert err.gir_path in message and err.npz_path in message

    with open(err.gir_path) as f:
        repro = verify(parse(f.read()))
    assert [n.op for n in repro.nodes] == ["relu"]
    good = run_repro(err.gir_path, err.npz_path)
    bad = run_repro(err.gir_path, err.npz_path, backend="broken_relu")
    _, arrays = load_repro(err.gir_path, err.npz_path)
    np.testing.assert_array_equal(good[0], np.maximum(arrays[0], 0))
    np.testing.assert_allclose(bad[0] - good[0], 0.5, rtol=1e-6)


def test_broken_backward_is_caught_in_the_grads_check(rng, tmp_path, broken_backends):
    graphc.manual_seed(5)
    with pytest.raises(CompiledMismatch) as info:
        assert_compiled_matches(CustomFunctionModel(), inputs(rng, 5, 6),
                                backends=("broken_backward",), repro_dir=str(tmp_path))
    err = info.value
    assert err.check == "grads" and err.node.op == "mul"
    assert err.node.loc == f"test_testing.py:{BACKWARD_LINE}"
    assert "grad of" in err.label
    bad = run_repro(err.gir_path, err.npz_path, backend="broken_backward")
    good = run_repro(err.gir_path, err.npz_path)
    assert compare(bad[0], good[0], 1e-4, 1e-5) is not None


def test_bug_hidden_by_per_node_outputs_is_found_by_prefixes(rng, tmp_path, broken_backends):
    graphc.manual_seed(6)
    with pytest.raises(CompiledMismatch) as info:
        assert_compiled_matches(MLP(), inputs(rng, 4, 12), backends=("broken_fused",),
                                grads=False, repro_dir=str(tmp_path))
    err = info.value
    assert "the graph up to the node" in str(err)
    assert err.node.op == "matmul"  # the first node whose output shows the corrupted relu
    bad = run_repro(err.gir_path, err.npz_path, backend="broken_fused")
    good = run_repro(err.gir_path, err.npz_path)
    assert compare(bad[0], good[0], 1e-4, 1e-5) is not None


# ---- pieces -----------------------------------------------------------------------------------
def test_repro_round_trip_any_input_name(tmp_path):
    g = parse("""graph @f(%file: f32[2], %w.0: i64[2]) -> (f32[2]) {
      %0: f32[2] = relu(%file)
      return (%0)
    }""")
    a = np.array([-1.0, 3.0], np.float32)
    gir, npz = save_repro(g, [a, np.array([1, 2])], str(tmp_path / "sub" / "f"))
    graph, arrays = load_repro(gir, npz)
    assert graph == g and arrays[1].tolist() == [1, 2]
    assert run_repro(gir, npz)[0].tolist() == [0.0, 3.0]


def test_compare_tolerances():
    ref = np.array([1000.0, 0.0])
    assert compare(np.array([1000.0, 5e-3], np.float32), ref, 1e-4, 1e-5) is None  # scaled
    assert compare(np.array([1000.0, 2e-2], np.float32), ref, 1e-4, 1e-5)[2] == 1
    assert compare(np.array([1, 2]), np.array([1, 3]), 0, 0)[2] == 1
    assert compare(np.array([np.nan]), np.array([np.nan]), 0, 0) is None
