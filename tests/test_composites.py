"""graphc.tril/triu, masked_fill, einsum, cumsum, topk, multinomial (graphc.utils.composites):
PyTorch parity of values and gradients, error wording, and compiled runs on cpu."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.errors import ArgumentError, DTypeError, ShapeError
from tests.torch_parity import check_parity, torch


@pytest.fixture
def rng(request):
    return np.random.default_rng(abs(hash(request.node.name)) % 2**32)


@pytest.mark.parametrize("diagonal", [-1, 0, 2])
@pytest.mark.parametrize("name", ["tril", "triu"])
def test_triangles(rng, name, diagonal):
    x = rng.standard_normal((2, 3, 4))
    check_parity(getattr(graphc, name), getattr(torch, name), x, diagonal=diagonal)
    t = graphc.tensor(x)
    getattr(t, name + "_")(diagonal)
    np.testing.assert_array_equal(t.numpy(), getattr(np, name)(x, diagonal))


def test_triangle_needs_two_dims():
    with pytest.raises(ShapeError, match="tril: input tensor must have at least 2 dimensions"):
        graphc.tril(graphc.ones(3))


def test_masked_fill(rng):
    x, mask = rng.standard_normal((3, 4)), rng.random((4,)) < 0.5
    check_parity(lambda a, m: a.masked_fill(m, -1.5), lambda a, m: a.masked_fill(m, -1.5),
                 x, mask)
    value = np.array(2.5)
    check_parity(lambda a, m, v: a.masked_fill(m, v), lambda a, m, v: a.masked_fill(m, v),
                 x, mask, value)
    t = graphc.tensor(x)
    t.masked_fill_(graphc.tensor(mask), float("-inf"))
    assert np.isneginf(t.numpy()[:, mask]).all()
    with pytest.raises(DTypeError, match="masked_fill_ only supports boolean masks"):
        graphc.zeros(2).masked_fill(graphc.ones(2), 1.0)
    with pytest.raises(ShapeError, match="0-dimensional value tensor"):
        graphc.zeros(2).masked_fill(graphc.ones(2).bool(), graphc.ones(2))


@pytest.mark.parametrize("equation,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bkj->bik", [(2, 3, 4), (2, 5, 4)]),
    ("...ij,...jk", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij->", [(3, 4)]),
    ("ij->ji", [(3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("abc,cd->abd", [(2, 3, 4), (4, 1)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(3, 3)]),
    ("iij->ji", [(3, 3, 2)]),
    ("bii,bij->bj", [(2, 3, 3), (2, 3, 4)]),
    ("ijij->ij", [(2, 3, 2, 3)]),
    ("iii->i", [(3, 3, 3)]),
])
def test_einsum(rng, equation, shapes):
    arrays = [rng.standard_normal(s) for s in shapes]
    check_parity(lambda *a: graphc.einsum(equation, *a), lambda *a: torch.einsum(equation, *a),
                 *arrays)


def test_einsum_errors():
    with pytest.raises(ShapeError, match="number of subscripts"):
        graphc.einsum("ij,jk", graphc.ones(2, 3), graphc.ones(3))
    with pytest.raises(ShapeError, match="subscript i is repeated for operand 0 but the "
                       "sizes don't match, 4 != 3"):
        graphc.einsum("ii->i", graphc.ones(3, 4))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum(rng, dim):
    x = rng.standard_normal((5, 7))
    check_parity(graphc.cumsum, torch.cumsum, x, dim=dim)
    ints = rng.integers(-3, 3, (4, 6))
    np.testing.assert_array_equal(graphc.tensor(ints).cumsum(dim).numpy(),
                                  np.cumsum(ints, axis=dim))
    assert graphc.tensor([True, True]).cumsum(0).dtype is graphc.int64


@pytest.mark.parametrize("largest", [True, False])
def test_topk(rng, largest):
    x = rng.permutation(24).reshape(4, 6).astype(np.float64) + rng.random((4, 6)) * 0.1
    check_parity(lambda a: graphc.topk(a, 3, dim=1, largest=largest),
                 lambda a: torch.topk(a, 3, dim=1, largest=largest), x)
    traced = graphc.compile(lambda a: graphc.topk(a, 3, 0, largest), backend="cpu")
    want = torch.topk(torch.tensor(x), 3, 0, largest)
    got = traced(graphc.tensor(x))
    np.testing.assert_array_equal(got[1].numpy(), want.indices.numpy())
    np.testing.assert_allclose(got[0].numpy(), want.values.numpy())
    with pytest.raises(ArgumentError, match="selected index k out of range"):
        graphc.topk(graphc.ones(3), 4)


def test_multinomial_distribution():
    gen = graphc.Generator().manual_seed(3)
    p = graphc.tensor([[0.1, 0.0, 0.6, 0.3], [0.0, 0.0, 1.0, 0.0]])
    draws = graphc.multinomial(p, 4000, replacement=True, generator=gen).numpy()
    freq = np.bincount(draws[0], minlength=4) / 4000
    np.testing.assert_allclose(freq, [0.1, 0.0, 0.6, 0.3], atol=0.03)
    assert (draws[1] == 2).all()
    picks = graphc.multinomial(graphc.ones(5), 5, generator=gen).numpy()
    assert sorted(picks.tolist()) == [0, 1, 2, 3, 4]
    with pytest.raises(ArgumentError, match="without replacement"):
        graphc.multinomial(graphc.ones(3), 4)
    with pytest.raises(ShapeError, match="prob_dist must be 1 or 2 dim"):
        graphc.multinomial(graphc.ones(1, 1, 3), 1)


def test_composites_compile_on_cpu(rng):
    def f(x, m):
        a = x.tril(-1) + x.triu(1).masked_fill(m, 0.5)
        return a, x.cumsum(1), graphc.einsum("ij,kj->ik", x, x)

    x = graphc.tensor(rng.standard_normal((4, 4)).astype(np.float32))
    m = graphc.tensor(rng.random((4, 4)) < 0.5)
    for got, want in zip(graphc.compile(f, backend="cpu")(x, m), f(x, m)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    sample = graphc.compile(lambda p: graphc.multinomial(p, 2, replacement=True),
                            backend="cpu")
    assert (sample(graphc.tensor([[0.0, 1.0, 0.0]])).numpy() == 1).all()
