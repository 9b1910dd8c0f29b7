"""The CPU backend's random ops (graphc.backends.cpu.random_ops): uniform, normal, dropout and
bernoulli traced, compiled with graphc.backends.compile(graph, "cpu") and compared with the
interpreter (bit for bit, normal within philox.NORMAL_TOLERANCE) over shapes, both float
dtypes, seeds with the high bits set, strided inputs and in-place dropout; an MLP with Dropout
compiled as a whole training step tracks eager mode step by step with identical masks."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
from graphc import nn, optim  # noqa: E402
from graphc.backends import compile as backend_compile  # noqa: E402
from graphc.backends.cpu import philox  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from tests.test_cpu_backend import sample  # noqa: E402


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


DTYPES = ["float32", "float64"]
SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 33), (4, 1, 65)]
# [seed, offset] inputs: small, the seed's high word set (negative as int64), a large offset
SEEDS = [np.array([0, 0], np.int64), np.array([-3, 12345], np.int64),
         np.array([0x1234_5678_9ABC_DEF0, (1 << 40) + 7], np.int64)]


def _run_both(graph, arrays):
    """(compiled outputs, interpreter outputs) of `graph` on `arrays`."""
    want = [np.asarray(w) for w in interpret(graph, *[np.array(a, copy=True) for a in arrays])]
    exe = backend_compile(graph, "cpu")
    assert isinstance(exe, CpuExecutable)
    got = exe.run(*[np.array(a, copy=True) for a in arrays])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
    return got, want


def _ops(graph) -> list[str]:
    return [n.op for n in graph.nodes]


def _check_exact(graph, arrays, op: str):
    assert op in _ops(graph)
    for seed in SEEDS:
        got, want = _run_both(graph, arrays + [seed])
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.view(f"u{g.itemsize}"), w.view(f"u{w.itemsize}"))


# ---- uniform and normal ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_uniform_is_bit_exact(shape, dtype):
    def f(x):
        return graphc.rand(shape, dtype=getattr(graphc, dtype))

    graph = graphc.trace(f, graphc.zeros(1))
    _check_exact(graph, [np.zeros(1, np.float32)], "uniform")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_normal_is_within_the_tolerance(shape, dtype):
    def f(x):
        return graphc.randn(shape, dtype=getattr(graphc, dtype))

    graph = graphc.trace(f, graphc.zeros(1))
    assert "normal" in _ops(graph)
    tol = philox.NORMAL_TOLERANCE[dtype]
    for seed in SEEDS:
        (got,), (want,) = _run_both(graph, [np.zeros(1, np.float32), seed])
        assert np.all(np.isfinite(got))
        assert np.all(np.abs(got - want) <= tol * np.maximum(1.0, np.abs(want))), \
            np.max(np.abs(got - want))


def test_several_random_ops_in_one_graph_follow_the_stream(rng):
    """Later ops read [seed, offset + k] computed in the graph; the draws stay exact."""
    def f(x):
        return (graphc.rand(5, 3, dtype=graphc.float64), F.dropout(x, 0.4),
                graphc.bernoulli(x.sigmoid()), graphc.rand(4, 9))

    x = sample(rng, (4, 9), "float32")
    graph = graphc.trace(f, graphc.tensor(x))
    assert _ops(graph).count("uniform") == 2
    _check_exact(graph, [x], "dropout")


# ---- dropout and bernoulli -------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.5, 0.1, 0.9, 1.0])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES[1:])
def test_dropout_is_bit_exact(shape, dtype, p, rng):
    def f(x):
        return F.dropout(x, p, training=True)

    x = sample(rng, shape, dtype)
    graph = graphc.trace(f, graphc.tensor(x))
    _check_exact(graph, [x], "dropout")


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_of_a_strided_view_and_in_place(dtype, rng):
    def f(x):
        a = F.dropout(x.t(), 0.3)  # a transposed input: the index is the output's row-major
        b = F.dropout(x[:, 1::2], 0.6)
        c = F.dropout(x * 2.0, 0.5, inplace=True)
        return a, b, c

    x = sample(rng, (6, 10), dtype)
    graph = graphc.trace(f, graphc.tensor(x))
    assert _ops(graph).count("dropout") == 3
    _check_exact(graph, [x], "dropout")


def test_float32_and_float64_dropout_draw_the_same_mask(rng):
    x = sample(rng, (5, 17), "float64") + 10.0  # no zeros but the dropped ones
    masks = []
    for dtype in DTYPES:
        xs = x.astype(dtype)
        graph = graphc.trace(lambda t: F.dropout(t, 0.5), graphc.tensor(xs))
        (got,), _ = _run_both(graph, [xs, SEEDS[1]])
        masks.append(got != 0)
    np.testing.assert_array_equal(masks[0], masks[1])
    assert 0 < masks[0].sum() < masks[0].size


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_bernoulli_is_bit_exact(shape, dtype, rng):
    p = rng.random(shape).astype(dtype)
    if p.size > 3:
        p.flat[:3] = [0.0, 1.0, np.nan]
    graph = graphc.trace(lambda t: graphc.bernoulli(t), graphc.tensor(p))
    _check_exact(graph, [p], "bernoulli")


def test_bernoulli_of_a_broadcast_probability(rng):
    def f(p):
        return graphc.bernoulli(p.expand(4, 6, 3))

    p = rng.random((6, 1)).astype("float32")
    graph = graphc.trace(f, graphc.tensor(p))
    _check_exact(graph, [p], "bernoulli")


# ---- an MLP with Dropout: the whole training step --------------------------------------------
class DropMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(20, 32), nn.Linear(32, 32), nn.Linear(32, 5)
        self.drop1, self.drop2 = nn.Dropout(0.5), nn.Dropout(0.2)

    def forward(self, x):
        h = self.drop1(self.fc1(x).relu())
        return self.fc3(self.drop2(self.fc2(h).relu())), h


def test_mlp_with_dropout_training_step_matches_eager(rng):
    def make():
        graphc.manual_seed(0)
        model = DropMLP()
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x, y):
            opt.zero_grad()
            out, h = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            opt.step()
            return loss, h

        return model, step

    (m_cpu, s_cpu), (m_ref, s_ref) = make(), make()
    s_cpu = graphc.compile(s_cpu, backend="cpu")
    graphc.manual_seed(3)
    for k in range(6):  # the first compiled call traces (eagerly), the others run the kernel
        x = graphc.tensor(sample(rng, (16, 20), "float32"))
        y = graphc.tensor(rng.integers(0, 5, 16))
        state = graphc.get_rng_state()
        want_loss, want_h = s_ref(x, y)
        after = graphc.get_rng_state()
        graphc.set_rng_state(state)
        got_loss, got_h = s_cpu(x, y)
        np.testing.assert_array_equal(graphc.get_rng_state().numpy(), after.numpy())
        got_h, want_h = got_h.detach().numpy(), want_h.detach().numpy()
        np.testing.assert_array_equal(got_h == 0, want_h == 0, err_msg=f"mask, step {k}")
        assert 0 < (want_h == 0).mean() < 1
        np.testing.assert_allclose(got_h, want_h, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_loss.detach().numpy(), want_loss.detach().numpy(),
                                   rtol=1e-5)
    assert isinstance(s_cpu.executable, CpuExecutable)
    assert _ops(s_cpu.graph).count("dropout") >= 4  # two forward, their two gradients
    for a, b in zip(m_cpu.parameters(), m_ref.parameters()):
        a, b = a.detach().numpy(), b.detach().numpy()
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()))
