"""The counter-based generator: Philox known answers, the documented stream layout,
determinism, offsets, statistics, dropout's mask reuse in backward, Generator state, errors."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.errors import ArgumentError, AutogradError, DTypeError, ShapeError
from graphc.ops import random as R
from graphc.ops.random import ReferenceStream
from graphc.ops.random import philox4x32_scalar as philox_ref
from graphc.ops.registry import RANDOM, REGISTRY, call

# Random123 kat_vectors, "philox4x32 10" lines: counter[4], key[2] -> output[4].
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]
RANDOM_OPS = ("uniform", "normal", "dropout", "bernoulli", "randint", "randperm")


@pytest.fixture(autouse=True)
def _keep_default_generator():
    """Tests here reseed the default generator; give others back the state they had."""
    state = graphc.get_rng_state()
    yield
    graphc.set_rng_state(state)


def gen(seed: int = 0) -> graphc.Generator:
    return graphc.Generator().manual_seed(seed)


# ---- Philox ----------------------------------------------------------------------------------
@pytest.mark.parametrize("ctr,key,want", KAT)
def test_philox_known_answers_vectorised(ctr, key, want):
    got = R.philox4x32(*(np.array([c], np.uint32) for c in ctr), *key)
    assert [int(w[0]) for w in got] == list(want)


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_philox_known_answers_scalar_reference(ctr, key, want):
    assert philox_ref(ctr, key) == list(want)


def test_philox_batch_equals_scalar_reference(rng):
    ctr = rng.integers(0, 2**32, size=(4, 50), dtype=np.uint64)
    key = (0x01234567, 0x89ABCDEF)
    got = np.stack(R.philox4x32(*ctr, *key), axis=1)
    want = [philox_ref([int(c) for c in ctr[:, i]], key) for i in range(50)]
    np.testing.assert_array_equal(got, np.array(want, np.uint32))


def test_word_stream_layout_matches_docstring():
    seed, offset = 0x0123456789ABCDEF, 2**32 - 2  # counters straddle the c0 -> c1 carry
    words = R.random_words(seed, offset, 16)
    s = ReferenceStream(seed, offset)
    assert [int(w) for w in words] == [s.word(j) for j in range(16)]
    # counter n = offset + n in (c0 = low word, c1 = high word), c2 = c3 = 0, key = seed halves
    third = philox_ref((0, 1, 0, 0), (seed & 0xFFFFFFFF, seed >> 32))  # offset + 2 = 2^32
    assert [int(w) for w in words[8:12]] == third


def test_uniform_conversions_are_the_documented_bit_recipes():
    w = np.array([0xFFFFFFFF, 0x000000FF, 0x80000000, 0x12345678], np.uint32)
    f32 = R.uniform_from_words(w, graphc.float32)
    assert f32.dtype == np.float32
    assert f32.tolist() == [(2**24 - 1) / 2**24, 0.0, 0.5, (0x12345678 >> 8) / 2**24]
    f64 = R.uniform_from_words(w, graphc.float64)
    x = (0xFFFFFFFF << 32 | 0xFF, 0x80000000 << 32 | 0x12345678)
    assert f64.tolist() == [(v >> 11) / 2**53 for v in x]
    assert f32.max() < 1.0 and f64.max() < 1.0


def test_rand_is_the_stream_of_the_generator_position():
    got = graphc.rand(3, 5, generator=gen(123)).numpy()
    s = ReferenceStream(123, 0)
    np.testing.assert_array_equal(got.reshape(-1), [s.uniform(i, "float32") for i in range(15)])


def test_elements_split_over_consecutive_calls_at_counter_boundaries():
    whole = graphc.rand(12, generator=gen(5)).numpy()
    g = gen(5)
    parts = [graphc.rand(4, generator=g).numpy() for _ in range(3)]
    np.testing.assert_array_equal(whole, np.concatenate(parts))


# ---- determinism and offsets -----------------------------------------------------------------
def test_manual_seed_replays_every_kind_of_draw():
    def draw():
        return [graphc.rand(5).numpy(), graphc.randn(2, 3, dtype=graphc.float64).numpy(),
                graphc.randint(0, 100, (7,)).numpy(), graphc.randperm(9).numpy(),
                graphc.dropout(graphc.ones(10), 0.5).numpy()]

    assert graphc.manual_seed(2024) is graphc.default_generator
    first = draw()
    graphc.manual_seed(2024)
    for a, b in zip(first, draw()):
        np.testing.assert_array_equal(a, b)
    graphc.manual_seed(2025)
    assert not np.array_equal(first[0], graphc.rand(5).numpy())


def test_offset_advances_by_counters_used_and_streams_differ():
    g = gen(1)
    a = graphc.rand(5, generator=g)  # 5 words -> 2 counters
    assert g.offset == 2
    b = graphc.rand(5, generator=g)
    assert g.offset == 4
    assert not np.array_equal(a.numpy(), b.numpy())
    graphc.randn(3, generator=g, dtype=graphc.float64)  # 2 pairs * 2 uniforms * 2 words
    assert g.offset == 6
    graphc.randint(0, 2**40, (3,), generator=g)  # 64-bit range: 2 words each -> 2 counters
    assert g.offset == 8
    graphc.randperm(5, generator=g)  # 10 words -> 3 counters
    assert g.offset == 11


def test_seed_is_an_op_input_not_an_attribute():
    for name in RANDOM_OPS:
        opdef = REGISTRY[name]
        assert opdef.kind == RANDOM and opdef.effectful, name
        assert "seed" in opdef.inputs and "seed" not in opdef.attrs, name
    s0 = graphc.tensor([7, 0], dtype=graphc.int64)
    s1 = graphc.tensor([7, 1], dtype=graphc.int64)
    a, b = (call("uniform", s, shape=(8,), dtype="float32").numpy() for s in (s0, s1))
    # offset 1 starts one counter (4 words) later: the streams overlap by exactly that shift
    np.testing.assert_array_equal(a[4:], b[:4])
    assert not np.array_equal(a, b)


def test_private_generator_leaves_the_default_alone():
    graphc.manual_seed(3)
    before = graphc.get_rng_state().tolist()
    graphc.randn(10, generator=gen(9))
    assert graphc.get_rng_state().tolist() == before


def test_seed_provider_hook_supplies_the_seed_input():
    seen = []

    def provider(generator, counters):
        seen.append(counters)
        return graphc.tensor([11, 40], dtype=graphc.int64)

    previous = R.set_seed_provider(provider)
    try:
        got = graphc.rand(6).numpy()
    finally:
        R.set_seed_provider(previous)
    assert seen == [2]
    s = ReferenceStream(11, 40)
    np.testing.assert_array_equal(got, [s.uniform(i, "float32") for i in range(6)])


# ---- statistics ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [graphc.float32, graphc.float64])
def test_uniform_statistics(dtype):
    u = graphc.rand(100_000, generator=gen(17), dtype=dtype).numpy()
    assert u.dtype == dtype.np and u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.005  # sd of the mean: 0.0009
    assert abs(u.var() - 1 / 12) < 0.002
    counts = np.histogram(u, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(counts - 10_000) < 500)  # sd per bin: 95


@pytest.mark.parametrize("dtype", [graphc.float32, graphc.float64])
def test_normal_statistics(dtype):
    z = graphc.randn(100_000, generator=gen(18), dtype=dtype).numpy()
    assert z.dtype == dtype.np and np.isfinite(z).all()
    assert abs(z.mean()) < 0.015  # sd of the mean: 0.0032
    assert abs(z.var() - 1.0) < 0.02  # sd of the variance: 0.0045
    assert abs(np.mean(np.abs(z) < 1.0) - 0.6827) < 0.01
    assert abs(np.mean(z**3)) < 0.05  # skew


def test_normal_and_initialisers_scale_and_shift():
    x = graphc.normal(3.0, 2.0, (50_000,), generator=gen(1)).numpy()
    assert abs(x.mean() - 3.0) < 0.05 and abs(x.std() - 2.0) < 0.05
    w = graphc.zeros(200, 250)
    assert w.uniform_(-0.5, 1.5, generator=gen(2)) is w
    assert w.numpy().min() >= -0.5 and w.numpy().max() < 1.5
    assert abs(w.numpy().mean() - 0.5) < 0.02
    w.normal_(1.0, 0.1, generator=gen(3))
    assert abs(w.numpy().mean() - 1.0) < 0.005 and abs(w.numpy().std() - 0.1) < 0.005


def test_randint_randperm_bernoulli():
    r = graphc.randint(-3, 4, (70_000,), generator=gen(4)).numpy()
    assert r.dtype == np.int64 and r.min() == -3 and r.max() == 3
    assert np.all(np.abs(np.bincount(r + 3) - 10_000) < 500)
    assert graphc.randint(10, (4,)).numpy().max() < 10  # randint(high, size)
    p = graphc.randperm(1000, generator=gen(5)).numpy()
    assert p.dtype == np.int64 and sorted(p.tolist()) == list(range(1000))
    assert not np.array_equal(p, np.arange(1000))
    b = graphc.bernoulli(graphc.full((40_000,), 0.3), generator=gen(6)).numpy()
    assert set(np.unique(b).tolist()) <= {0.0, 1.0} and abs(b.mean() - 0.3) < 0.01
    t = graphc.zeros(40_000)
    t.bernoulli_(0.8, generator=gen(7))
    assert abs(t.numpy().mean() - 0.8) < 0.01


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_keep_rate_and_scale(p):
    y = graphc.dropout(graphc.ones(100_000), p, generator=gen(8)).numpy()
    kept = y != 0
    assert abs(kept.mean() - (1 - p)) < 0.01
    np.testing.assert_allclose(y[kept], np.float32(1) / np.float32(1 - p))


# ---- dropout semantics -----------------------------------------------------------------------
def test_dropout_backward_reuses_the_forward_mask():
    x = graphc.tensor(np.linspace(1, 2, 24, dtype=np.float32).reshape(4, 6), requires_grad=True)
    y = graphc.dropout(x, 0.4, generator=gen(10))
    g = np.arange(24, dtype=np.float32).reshape(4, 6) + 1
    y.backward(graphc.tensor(g))
    mult = y.detach().numpy() / x.detach().numpy()  # scale where kept, 0 where dropped
    np.testing.assert_allclose(x.grad.numpy(), g * mult, rtol=1e-6)
    assert 0 < (mult == 0).sum() < 24


def test_dropout_double_backward_keeps_the_mask():
    x = graphc.tensor(np.linspace(1, 2, 16), requires_grad=True)
    v = graphc.tensor(np.linspace(-1, 1, 16), requires_grad=True)
    y = graphc.dropout(x, 0.5, generator=gen(11)) * v
    mult = (y.detach().numpy() / v.detach().numpy()) / x.detach().numpy()  # 2 or 0
    (gx,) = graphc.autograd.grad(y, x, graphc.ones(16, dtype=graphc.float64), create_graph=True)
    np.testing.assert_allclose(gx.detach().numpy(), mult * v.detach().numpy())
    u = np.arange(16.0)
    (gv,) = graphc.autograd.grad(gx, v, graphc.tensor(u))  # d(mask * v)/dv = mask
    np.testing.assert_allclose(gv.numpy(), mult * u)
    assert 0 < (mult == 0).sum() < 16


def test_dropout_identity_cases_and_p_one():
    x = graphc.randn(5, 5)
    assert graphc.dropout(x, 0.0) is x
    assert graphc.dropout(x, 0.7, training=False) is x
    offset = graphc.default_generator.offset
    graphc.dropout(x, 0.0)
    assert graphc.default_generator.offset == offset  # no draw when nothing is dropped
    z = graphc.dropout(x, 1.0)
    np.testing.assert_array_equal(z.numpy(), np.zeros((5, 5), np.float32))


def test_dropout_inplace():
    x = graphc.ones(1000)
    version = x._version
    y = graphc.dropout(x, 0.5, inplace=True, generator=gen(12))
    assert y is x and x._version == version + 1
    assert set(np.unique(x.numpy()).tolist()) == {0.0, 2.0}
    want = graphc.dropout(graphc.ones(1000), 0.5, generator=gen(12))
    np.testing.assert_array_equal(x.numpy(), want.numpy())


def test_dropout_same_mask_for_float32_and_float64():
    a = graphc.dropout(graphc.ones(64), 0.3, generator=gen(13)).numpy()
    b = graphc.dropout(graphc.ones(64, dtype=graphc.float64), 0.3, generator=gen(13)).numpy()
    np.testing.assert_array_equal(a != 0, b != 0)


# ---- Generator state -------------------------------------------------------------------------
def test_generator_state_save_and_restore():
    g = gen(77)
    graphc.rand(10, generator=g)
    state = g.get_state()
    assert state.dtype is graphc.int64 and state.tolist() == [77, 3]
    a = graphc.randn(20, generator=g).numpy()
    g.set_state(state)
    np.testing.assert_array_equal(a, graphc.randn(20, generator=g).numpy())
    state.numpy()[1] = 0  # get_state hands out a copy: the generator is untouched by this
    assert g.get_state().tolist()[1] != 0


def test_global_rng_state_functions():
    graphc.manual_seed(5)
    assert graphc.initial_seed() == 5
    state = graphc.get_rng_state()
    a = graphc.rand(8).numpy()
    graphc.set_rng_state(state)
    np.testing.assert_array_equal(a, graphc.rand(8).numpy())
    s = graphc.seed()
    assert isinstance(s, int) and graphc.initial_seed() == s
    assert graphc.default_generator.offset == 0


def test_seed_range_follows_pytorch():
    g = graphc.Generator()
    assert g.initial_seed() == 67280421310721  # PyTorch's default seed
    assert g.manual_seed(-1).initial_seed() == 2**64 - 1
    assert g.manual_seed(2**64 - 1).get_state().tolist()[0] == -1  # 64 bits in an int64
    with pytest.raises(ArgumentError, match="Overflow"):
        g.manual_seed(2**64)
    with pytest.raises(TypeError, match="int seed"):
        g.manual_seed(1.5)
    with pytest.raises(ShapeError, match="shape \\(2,\\)"):
        g.set_state(graphc.tensor([1, 2, 3]))


# ---- errors ----------------------------------------------------------------------------------
def test_errors():
    with pytest.raises(DTypeError, match="not implemented for 'int64'"):
        graphc.rand(3, dtype=graphc.int64)
    with pytest.raises(DTypeError, match="not implemented for 'int64'"):
        graphc.randn(3, dtype=graphc.int64)
    with pytest.raises(ArgumentError, match="negative dimension"):
        graphc.rand(2, -1)
    with pytest.raises(ArgumentError, match="from=5 >= to=3"):
        graphc.randint(5, 3, (2,))
    with pytest.raises(ArgumentError, match="n must be non-negative"):
        graphc.randperm(-1)
    with pytest.raises(ArgumentError, match="normal expects std >= 0.0"):
        graphc.normal(0.0, -1.0, (3,))
    with pytest.raises(ArgumentError, match="but got 1.5"):
        graphc.dropout(graphc.ones(3), 1.5)
    with pytest.raises(DTypeError, match="floating point input"):
        graphc.dropout(graphc.tensor([1, 2, 3]), 0.5)
    w = graphc.zeros(3, requires_grad=True)
    with pytest.raises(AutogradError, match="leaf Variable"):
        w.uniform_()  # parameters are initialised under no_grad, as in PyTorch
    with graphc.no_grad():
        w.normal_()
    assert w.requires_grad and w.is_leaf


def test_public_surface():
    for name in ("Generator", "manual_seed", "seed", "initial_seed", "get_rng_state",
                 "set_rng_state", "rand", "randn", "rand_like", "randn_like", "randint",
                 "randperm", "normal", "bernoulli", "dropout", "default_generator"):
        assert hasattr(graphc, name), name
    for method in ("uniform_", "normal_", "bernoulli_", "bernoulli"):
        assert hasattr(graphc.Tensor, method), method
    x = graphc.zeros(2, 3, dtype=graphc.float64)
    assert graphc.rand_like(x).dtype is graphc.float64
    assert tuple(graphc.randn_like(x).shape) == (2, 3)
    r = graphc.rand(2, requires_grad=True)
    assert r.requires_grad and r.is_leaf
    assert tuple(graphc.rand((2, 4)).shape) == (2, 4) and graphc.rand().shape == ()
