"""OpInfo entries for the 'random' op group.

The reference builds on `graphc.ops.random.ReferenceStream`, the scalar implementation of the
stream its docstring specifies (Python ints, one word at a time, the way a C backend renders
it), independent of the vectorised numpy kernels. Uniform, dropout masks, bernoulli,
randint and randperm must equal it exactly; normal agrees to libm rounding (numpy's
log/cos/sin against Python's math). No PyTorch parity of values: torch draws from its own
generator (mt19937 on CPU), so the same seed gives different numbers by design.
"""

from __future__ import annotations

import math

import numpy as np

import graphc
from graphc.errors import ArgumentError, DTypeError
from graphc.ops.random import ReferenceStream
from graphc.ops.registry import call
from tests.opinfo import ErrorInput, OpInfo, Sample, arr

_TORCH_SKIP = {"torch": "torch draws from its own generator (mt19937): values differ by design"}


# ---- op references on the scalar stream (graphc.ops.random.ReferenceStream) ------------------
def _stream(seed_offset: np.ndarray) -> ReferenceStream:
    """The reference stream of an op's [seed, offset] input array."""
    seed, offset = (int(v) for v in seed_offset.astype(np.int64).view(np.uint64))
    return ReferenceStream(seed, offset)


def uniform_ref(seed, shape, dtype):
    s = _stream(seed)
    n = math.prod(shape)
    return np.array([s.uniform(i, dtype) for i in range(n)], dtype=dtype).reshape(shape)


def normal_ref(seed, shape, dtype):
    s = _stream(seed)
    n = math.prod(shape)
    out = []
    for k in range((n + 1) // 2):
        u1, u2 = s.uniform(2 * k, dtype), s.uniform(2 * k + 1, dtype)
        r, t = math.sqrt(-2.0 * math.log(1.0 - u1)), 6.283185307179586 * u2
        out += [r * math.cos(t), r * math.sin(t)]
    return np.array(out[:n], dtype=dtype).reshape(shape)


def dropout_mask_ref(seed, n: int, p: float) -> np.ndarray:
    s = _stream(seed)
    return np.array([s.uniform(i, "float32") < 1.0 - p for i in range(n)])


def dropout_ref(x, seed, p):
    keep = dropout_mask_ref(seed, x.size, p).reshape(x.shape)
    return np.where(keep, x / (1.0 - p) if p < 1 else 0.0, 0.0)


def bernoulli_ref(p, seed):
    s = _stream(seed)
    flat = p.reshape(-1)
    return np.array([s.uniform(i, "float32") < float(flat[i]) for i in range(flat.size)],
                    dtype=p.dtype).reshape(p.shape)


def randint_ref(seed, low, high, shape):
    s = _stream(seed)
    r = high - low
    out = []
    for i in range(math.prod(shape)):
        x = s.word(i) if r <= 1 << 32 else (s.word(2 * i) << 32) | s.word(2 * i + 1)
        v = (low + x % r) % (1 << 64)
        out.append(v - (1 << 64) if v >= 1 << 63 else v)
    return np.array(out, dtype=np.int64).reshape(shape)


def randperm_ref(seed, n):
    s = _stream(seed)
    keys = [((s.word(2 * i) << 32) | s.word(2 * i + 1), i) for i in range(n)]
    return np.array([i for _, i in sorted(keys)], dtype=np.int64)


# ---- the ops under test ----------------------------------------------------------------------
def uniform_op(seed, shape, dtype):
    return call("uniform", seed, shape=shape, dtype=dtype)


def normal_op(seed, shape, dtype):
    return call("normal", seed, shape=shape, dtype=dtype)


def dropout_op(x, seed, p):
    return call("dropout", x, seed, p=p)


def bernoulli_op(p, seed):
    return call("bernoulli", p, seed)


def randint_op(seed, low, high, shape):
    return call("randint", seed, low=low, high=high, shape=shape)


def randperm_op(seed, n):
    return call("randperm", seed, n=n)


def public_dropout(x, p=0.5, training=True, seed=0):
    """graphc.dropout with a fresh generator per call, so repeated calls draw the same mask."""
    return graphc.dropout(x, p, training, generator=graphc.Generator().manual_seed(seed))


def public_dropout_ref(x, p=0.5, training=True, seed=0):
    if p == 0 or not training:
        return x
    return dropout_ref(x, np.array([seed, 0], np.int64), p)


def _seed(seed: int, offset: int) -> np.ndarray:
    """[seed, offset] as the op input holds it (64-bit patterns in int64)."""
    return np.array([seed % (1 << 64), offset % (1 << 64)], np.uint64).view(np.int64)


_SEEDS = (
    (_seed(0, 0), "seed 0"),
    (_seed(2**64 - 1, 5), "seed 2^64-1"),
    (_seed(0x243F6A8885A308D3, 2**32 - 1), "counter carry into c1"),
)


# ---- samples ---------------------------------------------------------------------------------
def _source_samples(rng):
    out = []
    for seed, desc in _SEEDS:
        for shape, dtype in (((7,), "float32"), ((2, 3), "float64"), ((), "float32"),
                             ((0, 3), "float32")):
            out.append(Sample((seed,), {"shape": shape, "dtype": dtype},
                              desc=f"{desc} {dtype}{list(shape)}"))
    return out


def _source_errors(rng):
    return [
        ErrorInput(Sample((np.zeros(3, np.int64),), {"shape": (2,), "dtype": "float32"}),
                   DTypeError, "seed input must be an int64 tensor of shape \\(2,\\)"),
        ErrorInput(Sample((np.zeros(2, np.float32),), {"shape": (2,), "dtype": "float32"}),
                   DTypeError, "seed input must be an int64 tensor"),
        ErrorInput(Sample((_seed(0, 0),), {"shape": (2,), "dtype": "int64"}),
                   DTypeError, "not implemented for 'int64'"),
    ]


def _dropout_samples(rng):
    return [
        Sample((arr(rng, 3, 4), _seed(7, 0), 0.5), desc="p=0.5"),
        Sample((arr(rng, 9, dtype=np.float64), _seed(2**63 + 11, 3), 0.2), desc="p=0.2 f64"),
        Sample((arr(rng, 2, 5), _seed(1, 2**32 - 1), 0.9), desc="p=0.9 carry"),
        Sample((arr(rng, 4), _seed(3, 0), 1.0), desc="p=1"),
    ]


def _dropout_errors(rng):
    return [
        ErrorInput(Sample((np.arange(4), _seed(0, 0), 0.5)), DTypeError,
                   "expected a floating point input"),
        ErrorInput(Sample((arr(rng, 4), np.zeros((1, 2), np.int64), 0.5)), DTypeError,
                   "seed input must be an int64 tensor of shape \\(2,\\)"),
    ]


def _public_dropout_samples(rng):
    return [
        Sample((arr(rng, 4, 5),), {"p": 0.3, "seed": 5}, desc="p=0.3"),
        Sample((arr(rng, 6),), {"p": 0.0, "seed": 5}, desc="p=0"),
        Sample((arr(rng, 6),), {"p": 0.5, "training": False}, desc="eval"),
        Sample((arr(rng, 6),), {"p": 1.0, "seed": 2}, desc="p=1"),
    ]


def _public_dropout_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 3),), {"p": 1.5}), ArgumentError,
                   "dropout probability has to be between 0 and 1, but got 1.5"),
        ErrorInput(Sample((arr(rng, 3),), {"p": -0.1}), ArgumentError,
                   "dropout probability has to be between 0 and 1, but got -0.1"),
    ]


def _bernoulli_samples(rng):
    return [
        Sample((rng.uniform(0, 1, (3, 4)).astype(np.float32), _seed(9, 0)), desc="f32"),
        Sample((np.array([0.0, 1.0, 0.5, 0.25, 0.75]), _seed(2**64 - 2, 7)), desc="f64 edges"),
    ]


def _bernoulli_errors(rng):
    return [ErrorInput(Sample((np.ones(3, np.int64), _seed(0, 0))), DTypeError,
                       "expected a floating point probability tensor")]


def _randint_samples(rng):
    return [
        Sample((_seed(4, 0),), {"low": 0, "high": 10, "shape": (3, 5)}, desc="[0,10)"),
        Sample((_seed(4, 2**32 - 1),), {"low": -7, "high": 3, "shape": (9,)}, desc="negative"),
        Sample((_seed(5, 1),), {"low": -2**40, "high": 2**40, "shape": (6,)}, desc="64-bit"),
        Sample((_seed(6, 0),), {"low": 0, "high": 2**32, "shape": (5,)}, desc="2^32"),
    ]


def _randint_errors(rng):
    return [ErrorInput(Sample((_seed(0, 0),), {"low": 5, "high": 3, "shape": (2,)}),
                       ArgumentError, "random_ expects 'from' to be less than 'to', but got "
                       "from=5 >= to=3")]


def _randperm_samples(rng):
    return [Sample((seed,), {"n": n}, desc=f"{desc} n={n}")
            for (seed, desc), n in zip(_SEEDS, (10, 1, 0))]


def _randperm_errors(rng):
    return [ErrorInput(Sample((_seed(0, 0),), {"n": -1}), ArgumentError,
                       "n must be non-negative")]


OP_INFOS: list[OpInfo] = [
    OpInfo("random.uniform", uniform_op, uniform_ref, _source_samples, ("uniform",),
           differentiable=False, error_inputs=_source_errors, exact=True, skips=_TORCH_SKIP),
    OpInfo("random.normal", normal_op, normal_ref, _source_samples, ("normal",),
           differentiable=False, error_inputs=_source_errors, atol=1e-6, rtol=1e-6,
           skips=_TORCH_SKIP),
    OpInfo("random.dropout", dropout_op, dropout_ref, _dropout_samples, ("dropout",),
           error_inputs=_dropout_errors, skips=_TORCH_SKIP),
    OpInfo("dropout", public_dropout, public_dropout_ref, _public_dropout_samples, ("dropout",),
           error_inputs=_public_dropout_errors, skips=_TORCH_SKIP),
    OpInfo("random.bernoulli", bernoulli_op, bernoulli_ref, _bernoulli_samples, ("bernoulli",),
           differentiable=False, error_inputs=_bernoulli_errors, exact=True, skips=_TORCH_SKIP),
    OpInfo("random.randint", randint_op, randint_ref, _randint_samples, ("randint",),
           differentiable=False, error_inputs=_randint_errors, exact=True, skips=_TORCH_SKIP),
    OpInfo("random.randperm", randperm_op, randperm_ref, _randperm_samples, ("randperm",),
           differentiable=False, error_inputs=_randperm_errors, exact=True, skips=_TORCH_SKIP),
]
