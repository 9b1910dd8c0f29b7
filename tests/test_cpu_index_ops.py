"""The CPU backend's index ops (graphc.backends.cpu.index_ops), focused: gathers and scatters
over strided and broadcast views, negative axes and indices, repeated indices (accumulated
bit for bit as the interpreter does), empty tensors, pad/flip/slice_scatter, argmax/argmin
with NaNs and ties, randint/randperm bit for bit; indices out of range fail the call with an
error naming the op, and the executable keeps working afterwards."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
from graphc.backends import compile as backend_compile  # noqa: E402
from graphc.errors import IndexOutOfRangeError  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.ops.registry import call  # noqa: E402


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _i(*values) -> np.ndarray:
    return np.array(values, np.int64)


def compiled(fn, *arrays, op: str):
    """(executable, graph) of `fn` traced on `arrays`; the graph must hold `op`."""
    graph = graphc.trace(fn, *[graphc.tensor(a) for a in arrays])
    assert op in [n.op for n in graph.nodes], graph
    return backend_compile(graph, "cpu"), graph


def check(fn, *arrays, op: str):
    """Compile `fn` and check it bit for bit against the interpreter; the executable."""
    exe, graph = compiled(fn, *arrays, op=op)
    same_as_interpreter(exe, graph, *arrays)
    return exe, graph


def same_as_interpreter(exe, graph, *arrays) -> None:
    want = interpret(graph, *[np.array(a, copy=True) for a in arrays])
    got = exe.run(*[np.array(a, copy=True) for a in arrays])
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


# ---- gathers over views ------------------------------------------------------------------------
def test_take_of_a_transposed_view_with_negative_indices_and_axis(rng):
    def f(x, i):
        return x.permute(1, 0).index_select(-1, i) + 0.0  # take over a permute view

    x = rng.standard_normal((5, 3)).astype(np.float32)
    check(f, x, _i(-1, 0, 4, -5, 2), op="take")


def test_getitem_with_a_2d_index_of_a_broadcast_view(rng):
    def f(x, i):
        return x.expand(4, 3, 6)[:, i]

    check(f, rng.standard_normal((3, 1)).astype(np.float32), _i(2, 0, 1, 2).reshape(2, 2),
          op="take")


def test_gather_along_the_last_axis_of_a_strided_view(rng):
    def f(x, i):
        return graphc.gather(x[:, ::2], -1, i)

    x = rng.standard_normal((3, 8)).astype(np.float64)
    check(f, x, rng.integers(0, 4, (3, 5)), op="gather")


def test_embedding_of_a_3d_index_and_its_gradient_with_padding(rng):
    w = rng.standard_normal((6, 4)).astype(np.float32)
    idx = rng.integers(0, 6, (2, 3, 5))

    def f(w, i, g):
        w = w.requires_grad_()
        y = F.embedding(i, w, padding_idx=-2)
        return y, graphc.autograd.grad((y * g).sum(), [w])[0]

    g = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    _, graph = check(f, w, idx, g, op="embedding_backward")
    assert "embedding" in [n.op for n in graph.nodes]


# ---- scatters: repeated indices accumulate bit for bit -----------------------------------------
def test_index_add_with_many_repeated_indices_is_bit_exact(rng):
    def f(x, i, s):
        return x.index_add(1, i, s)

    x = rng.standard_normal((2, 3)).astype(np.float32)
    i = rng.integers(-3, 3, 500)
    s = (rng.standard_normal((2, 500)) * 1e3).astype(np.float32)
    check(f, x, i, s, op="index_add")


def test_scatter_add_into_a_permuted_input_is_bit_exact(rng):
    def f(x, i, s):
        return graphc.scatter_add(x.permute(1, 0), 0, i, s)

    x = rng.standard_normal((4, 3)).astype(np.float32)
    i = rng.integers(0, 3, (300, 4))
    s = rng.standard_normal((300, 4)).astype(np.float32)
    check(f, x, i, s, op="scatter_add")


def test_index_put_keeps_the_last_of_repeated_indices(rng):
    def f(x, i, v):
        y = x.clone()
        y[i] = v
        return y

    x = rng.standard_normal((4, 3)).astype(np.float32)
    v = rng.standard_normal((5, 3)).astype(np.float32)
    check(f, x, _i(1, -1, 1, 3, 1), v, op="index_put")


def test_slice_scatter_with_steps_from_a_transposed_source(rng):
    def f(x, v):
        y = x.clone()
        y[1::2, ::3] = v.permute(1, 0)
        return y

    x = rng.standard_normal((5, 7)).astype(np.float32)
    check(f, x, rng.standard_normal((3, 2)).astype(np.float32), op="slice_scatter")


# ---- indices out of range: a clear error, and the executable still works ---------------------
BAD = [
    ("take", lambda x, i: x.index_select(0, i), _i(0, 3), _i(0, 4),
     "take: an index is out of bounds for dimension 0 with size 4"),
    ("take", lambda x, i: x[i], _i(-4, 1), _i(1, -5), "valid indices: -4..3"),
    ("gather", lambda x, i: graphc.gather(x, 0, i), _i(3, 0), _i(-1, 0),
     "gather: an index is out of bounds for dimension 0 with size 4"),
    ("scatter_add", lambda x, i: graphc.scatter_add(x, 0, i, x[:2] * 2), _i(3, 3), _i(0, 4),
     "scatter_add: an index is out of bounds"),
    ("index_add", lambda x, i: x.index_add(0, i, x[:2]), _i(-4, 3), _i(1, 9),
     "index_add: an index is out of bounds for dimension 0 with size 4"),
    ("embedding", lambda x, i: F.embedding(i, x.reshape(2, 2)), _i(1, 0), _i(2, 0),
     "embedding: index out of range in self"),
]


@pytest.mark.parametrize("op,fn,good,bad,message", BAD, ids=[b[0] + str(k) for k, b in
                                                            enumerate(BAD)])
def test_an_index_out_of_range_fails_the_call_and_the_next_call_works(op, fn, good, bad,
                                                                     message, rng):
    x = rng.standard_normal(4).astype(np.float32)
    exe, graph = compiled(fn, x, good, op=op)
    with pytest.raises(IndexOutOfRangeError, match=message) as info:
        exe.run(x, bad)
    assert "in node" in str(info.value)
    same_as_interpreter(exe, graph, x, good)


def test_embedding_backward_refuses_an_index_out_of_range(rng):
    def f(g, i):
        return call("embedding_backward", g, i, num_weights=3, padding_idx=None)

    g = rng.standard_normal((2, 5)).astype(np.float32)
    exe, graph = compiled(f, g, _i(0, 2), op="embedding_backward")
    with pytest.raises(IndexOutOfRangeError, match="embedding_backward: index out of range"):
        exe.run(g, _i(3, 0))
    same_as_interpreter(exe, graph, g, _i(2, 2))


# ---- empty tensors ---------------------------------------------------------------------------
def test_empty_indices_and_sources(rng):
    def f(x, i, s):
        return x.index_select(1, i), x.index_add(1, i, s), graphc.gather(x, 1, i.reshape(1, 0))

    x = rng.standard_normal((3, 4)).astype(np.float32)
    check(f, x, np.zeros(0, np.int64), np.zeros((3, 0), np.float32), op="index_add")


def test_pad_that_crops_everything_and_flip_of_an_empty_tensor():
    def f(x, e):
        return F.pad(x, (-3, 1), value=2.0), e.flip(0), F.pad(e, (1, 1), value=-1.0)

    check(f, np.ones((2, 3), np.float32), np.zeros((0, 2), np.float32), op="pad")


# ---- pad, flip -------------------------------------------------------------------------------
def test_pad_and_crop_of_an_int64_view(rng):
    def f(x):
        return F.pad(x.permute(1, 0), (2, -1, -1, 3), value=7.0)

    check(f, rng.integers(-9, 9, (4, 5)), op="pad")


def test_flip_of_a_strided_view_along_several_axes(rng):
    def f(x):
        return x[:, ::2].flip(0, -1)

    check(f, rng.standard_normal((3, 6, 2)).astype(np.float32), op="flip")


# ---- argmax / argmin -------------------------------------------------------------------------
def test_argmax_argmin_first_extreme_and_first_nan(rng):
    x = np.array([[1.0, 3.0, 3.0, np.nan, np.nan],
                  [-1.0, -1.0, 0.0, 0.0, -1.0],
                  [np.inf, 2.0, np.inf, -np.inf, -np.inf]], np.float32)

    def f(x):
        return (x.argmax(1), x.argmin(-1), x.argmax(0, keepdim=True), x[1:].argmin(),
                x.argmax(keepdim=True))

    check(f, x, op="argmax")


def test_argmax_over_all_of_a_transposed_view_counts_in_row_major_order(rng):
    def f(x):
        return x.permute(2, 0, 1).argmax(), x.permute(1, 0, 2).argmin(1)

    x = rng.integers(0, 3, (3, 4, 2))  # int64 with many ties
    check(f, x, op="argmax")


# ---- randint, randperm -----------------------------------------------------------------------
def _seed(seed: int, offset: int) -> np.ndarray:
    return np.array([seed % (1 << 64), offset % (1 << 64)], np.uint64).view(np.int64)


@pytest.mark.parametrize("low,high", [(0, 7), (-5, 2**32 - 5), (-2**40, 3), (-2**63, 2**63 - 1)])
def test_randint_is_bit_exact(low, high):
    def f(s):
        return call("randint", s, low=low, high=high, shape=(3, 7))

    for seed in (_seed(1, 0), _seed(2**64 - 1, 2**32 - 1)):
        exe, graph = compiled(f, seed, op="randint")
        same_as_interpreter(exe, graph, seed)


@pytest.mark.parametrize("n", [2, 7, 1000])
def test_randperm_is_the_stable_argsort_of_the_eager_keys(n):
    def f(s):
        return call("randperm", s, n=n)

    seed = _seed(0x243F6A8885A308D3, 5)
    exe, graph = check(f, seed, op="randperm")
    assert sorted(exe.run(seed)[0].tolist()) == list(range(n))
