"""Random ops on a counter-based generator (Philox4x32-10), and the Generator API.

A random op's output is a pure function of (seed, offset, shape, attributes): no hidden state
lives in a kernel. The seed and offset reach every random op as an INPUT, an int64 tensor of
shape (2,) holding `[seed, offset]` (both reinterpreted as unsigned 64-bit), never as
attributes, so one compiled graph can be run again with a new offset each step. The public
functions take (seed, offset) from a `Generator` and advance its offset by the counters used.

Backends reimplement the stream below exactly; this docstring is its specification.

Philox4x32-10 (Salmon et al., SC'11, "Parallel random numbers: as easy as 1, 2, 3"), as in
Random123's `philox4x32_R(10, ctr, key)`: 10 rounds over a counter (c0, c1, c2, c3) and a key
(k0, k1), all uint32, with the key bumped (k0 += 0x9E3779B9, k1 += 0xBB67AE85) before rounds
2..10. One round, with M0 = 0xD2511F53 and M1 = 0xCD9E8D57 and 64-bit products:

    p0 = (uint64)M0 * c0;  p1 = (uint64)M1 * c2;
    (c0, c1, c2, c3) = ((p1 >> 32) ^ c1 ^ k0, (uint32)p1, (p0 >> 32) ^ c3 ^ k1, (uint32)p0)

The word stream of (seed, offset): key k0 = seed & 0xffffffff, k1 = seed >> 32; the n-th
counter (n = 0, 1, ...) is the 64-bit number N = offset + n (mod 2^64) laid out as
c0 = N & 0xffffffff, c1 = N >> 32, c2 = 0, c3 = 0. Word j of the stream is output word j % 4
of counter j / 4:

    word(j) = philox4x32_10({lo32(offset + j/4), hi32(offset + j/4), 0, 0},
                            {lo32(seed), hi32(seed)})[j % 4]

An op that reads W words consumes ceil(W / 4) counters; the generator's offset (in counters)
advances by that much, so the next op starts on a fresh counter.

Conversions (all exact; `u` is in [0, 1)):
- float32 uniform from one word w:  u = (float)(w >> 8) * 0x1p-24f          (top 24 bits)
- float64 uniform from words a, b:  u = (double)(((uint64)a << 32 | b) >> 11) * 0x1p-53

What each op reads (element i in row-major order; n = numel; U = 1 word per uniform for
float32, 2 for float64; uniform i uses words [i*U, (i+1)*U)):
- uniform(seed; shape, dtype): element i = uniform i.                       n*U words
- normal(seed; shape, dtype): Box-Muller on pairs. Pair k (elements 2k, 2k+1) uses uniforms
  u1 = uniform 2k, u2 = uniform 2k+1, computed IN DOUBLE whatever the dtype:
      r = sqrt(-2.0 * log(1.0 - u1));  t = 6.283185307179586 * u2;
      element 2k = (dtype)(r * cos(t)),  element 2k+1 = (dtype)(r * sin(t))
  An odd n still consumes the whole last pair.                              2*ceil(n/2)*U words
  (log/cos/sin are the platform's: results agree to the last ulp of libm, not bit for bit.)
- dropout(x, seed; p): element i keeps iff (double)(word(i) >> 8) * 0x1p-24 < 1.0 - p (one
  word per element for every dtype, so float32 and float64 graphs draw the same mask);
  out = x * (keep ? scale : 0) with scale = (T)1 / (T)(1 - p) in x's dtype T (0 when p == 1),
  PyTorch's `input * bernoulli(1 - p) / (1 - p)`.                            n words
- bernoulli(p, seed): element i = (double)(word(i) >> 8) * 0x1p-24 < (double)p[i] ? 1 : 0, in
  p's dtype.                                                                 n words
- randint(seed; low, high, shape): r = high - low; when r <= 2^32 element i is
  low + word(i) % r, else low + (((uint64)word(2i) << 32 | word(2i+1)) % r) (mod 2^64, int64).
                                                                             n or 2n words
- randperm(seed; n): key i = (uint64)word(2i) << 32 | word(2i+1); the result is the stable
  argsort of the keys (ties, which need a 64-bit collision, go to the lower index). 2n words

Dropout's VJP is dropout itself applied to the incoming gradient with the SAME seed input (the
op is linear in x with the mask fixed by (seed, offset)), so a compiled backward recomputes the
very mask of the forward. Every random op is `effectful`: no pass may merge two of them.

>>> import graphc
>>> g = graphc.Generator().manual_seed(0)
>>> graphc.rand(2, generator=g).shape
graphc.Size([2])
"""

from __future__ import annotations

import math
import os
import threading

import numpy as np

from graphc.errors import ArgumentError, DTypeError, ShapeError, where
from graphc.ops.registry import RANDOM, OpDef, call, inplace, register
from graphc.ops.registry import inplace as _inplace  # `dropout` has an `inplace` flag
from graphc.ops.shapes import size_arg
from graphc.types import DType, TensorType, as_dtype, float32, float64, int64, promote

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10
DEFAULT_SEED = 67280421310721  # PyTorch's default CPU seed
TWO_PI = 6.283185307179586
_MASK32 = 0xFFFFFFFF
_U64 = 1 << 64


# ---- the generator core (numpy, vectorised) -------------------------------------------------
def philox4x32(c0, c1, c2, c3, k0: int, k1: int, rounds: int = PHILOX_ROUNDS):
    """Philox4x32-R of counters (arrays of uint32 values) under key (k0, k1): 4 uint32 arrays."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in (c0, c1, c2, c3))
    k0, k1 = np.uint64(k0 & _MASK32), np.uint64(k1 & _MASK32)
    m0, m1, mask, s32 = np.uint64(PHILOX_M0), np.uint64(PHILOX_M1), np.uint64(_MASK32), \
        np.uint64(32)
    for r in range(rounds):
        if r:
            k0 = (k0 + np.uint64(PHILOX_W0)) & mask
            k1 = (k1 + np.uint64(PHILOX_W1)) & mask
        p0 = c0 * m0  # both factors < 2^32: the product fits in 64 bits
        p1 = c2 * m1
        c0, c1, c2, c3 = (p1 >> s32) ^ c1 ^ k0, p1 & mask, (p0 >> s32) ^ c3 ^ k1, p0 & mask
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def counters_for(n_words: int) -> int:
    """Counters (128-bit blocks) an op reading `n_words` words consumes."""
    return (int(n_words) + 3) // 4


def random_words(seed: int, offset: int, n_words: int) -> np.ndarray:
    """Words 0..n_words-1 of the stream of (seed, offset), as a uint32 array (see docstring)."""
    seed, offset = int(seed) % _U64, int(offset) % _U64
    n_ctr = counters_for(n_words)
    ctr = np.uint64(offset) + np.arange(n_ctr, dtype=np.uint64)  # wraps mod 2^64
    lo = ctr & np.uint64(_MASK32)
    hi = ctr >> np.uint64(32)
    zero = np.zeros(n_ctr, dtype=np.uint64)
    out = philox4x32(lo, hi, zero, zero, seed & _MASK32, seed >> 32)
    return np.stack(out, axis=1).reshape(-1)[:n_words]


def words_per_uniform(dtype: DType) -> int:
    return 2 if dtype is float64 else 1


def uniform_from_words(words: np.ndarray, dtype: DType) -> np.ndarray:
    """Uniforms in [0, 1): 24 bits of one word (float32) or 53 bits of two words (float64)."""
    if dtype is float64:
        pairs = words.astype(np.uint64).reshape(-1, 2)
        x = (pairs[:, 0] << np.uint64(32)) | pairs[:, 1]
        return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return (words >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)


def _u24(words: np.ndarray) -> np.ndarray:
    """The float32 uniforms of `words`, as float64 (exact), for comparisons against p."""
    return (words >> np.uint32(8)).astype(np.float64) * 2.0**-24


def _seed_offset(seed_array: np.ndarray) -> tuple[int, int]:
    seed, offset = (int(v) for v in seed_array.astype(np.int64).view(np.uint64))
    return seed, offset


def _numel(shape) -> int:
    return int(math.prod(shape))


# ---- scalar reference: the specification above, one word at a time ----------------------------
def philox4x32_scalar(ctr, key, rounds: int = PHILOX_ROUNDS) -> list[int]:
    """Philox4x32-R on Python ints, as a backend renders it in C (tests check the kernels
    against it, and it against the Random123 known answers)."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & _MASK32, (k1 + PHILOX_W1) & _MASK32
        p0, p1 = PHILOX_M0 * c0, PHILOX_M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & _MASK32, p1 & _MASK32, \
            ((p0 >> 32) ^ c3 ^ k1) & _MASK32, p0 & _MASK32
    return [c0, c1, c2, c3]


class ReferenceStream:
    """word(j) and the uniforms of the (seed, offset) stream, from the docstring's formulas."""

    def __init__(self, seed: int, offset: int) -> None:
        self.seed, self.offset = int(seed) % _U64, int(offset) % _U64
        self._blocks: dict[int, list[int]] = {}

    def word(self, j: int) -> int:
        n = j // 4
        if n not in self._blocks:
            ctr = (self.offset + n) % _U64
            self._blocks[n] = philox4x32_scalar((ctr & _MASK32, ctr >> 32, 0, 0),
                                                (self.seed & _MASK32, self.seed >> 32))
        return self._blocks[n][j % 4]

    def uniform(self, i: int, dtype: str) -> float:
        """Uniform i: 53 bits of words 2i, 2i+1 (float64) or 24 bits of word i (float32)."""
        if dtype == "float64":
            return (((self.word(2 * i) << 32) | self.word(2 * i + 1)) >> 11) * 2.0**-53
        return (self.word(i) >> 8) * 2.0**-24


# ---- word counts per op (the public functions advance the generator by these) ----------------
def uniform_words(n: int, dtype: DType) -> int:
    return n * words_per_uniform(dtype)


def normal_words(n: int, dtype: DType) -> int:
    return 2 * ((n + 1) // 2) * words_per_uniform(dtype)


def randint_words(n: int, low: int, high: int) -> int:
    return n if high - low <= 1 << 32 else 2 * n


# ---- shape rules shared by the ops -----------------------------------------------------------
def _check_seed(op: str, seed: TensorType) -> None:
    if seed.dtype is not int64 or seed.shape != (2,):
        raise DTypeError(
            f"{where(op)}: the seed input must be an int64 tensor of shape (2,) holding "
            f"[seed, offset], got {seed}"
        )


def _float_dtype(op: str, dtype) -> DType:
    dt = float32 if dtype is None else as_dtype(dtype)
    if not dt.is_floating:
        raise DTypeError(
            f"{where(op)}: \"{op}\" not implemented for '{dt.name}': random floats need "
            "dtype float32 or float64"
        )
    return dt


def _source_infer_for(op: str):
    def infer(seed: TensorType, shape: tuple, dtype: str) -> TensorType:
        _check_seed(op, seed)
        return TensorType(shape, _float_dtype(op, dtype))

    infer.__name__ = f"_{op}_infer"
    return infer


# ---- uniform ---------------------------------------------------------------------------------
def _uniform_kernel(seed, shape: tuple, dtype: str):
    dt = as_dtype(dtype)
    n = _numel(shape)
    words = random_words(*_seed_offset(seed), uniform_words(n, dt))
    return uniform_from_words(words, dt).reshape(shape)


register(OpDef("uniform", RANDOM, ("seed",), _source_infer_for("uniform"), _uniform_kernel,
               None, attrs={"shape": tuple, "dtype": str}, effectful=True,
               doc="Uniform [0, 1) floats from the Philox stream of the seed input."))


# ---- normal ----------------------------------------------------------------------------------
def _normal_kernel(seed, shape: tuple, dtype: str):
    dt = as_dtype(dtype)
    n = _numel(shape)
    words = random_words(*_seed_offset(seed), normal_words(n, dt))
    u = uniform_from_words(words, dt).astype(np.float64).reshape(-1, 2)
    r = np.sqrt(-2.0 * np.log(1.0 - u[:, 0]))
    t = TWO_PI * u[:, 1]
    z = np.stack((r * np.cos(t), r * np.sin(t)), axis=1).reshape(-1)[:n]
    return z.astype(dt.np).reshape(shape)


register(OpDef("normal", RANDOM, ("seed",), _source_infer_for("normal"), _normal_kernel,
               None, attrs={"shape": tuple, "dtype": str}, effectful=True,
               doc="Standard normal floats (Box-Muller on pairs of uniforms)."))


# ---- dropout ---------------------------------------------------------------------------------
def _dropout_infer(x: TensorType, seed: TensorType, p: float) -> TensorType:
    _check_seed("dropout", seed)
    if not x.dtype.is_floating:
        raise DTypeError(
            f"{where('dropout')}: expected a floating point input (float32 or float64), got "
            f"{x.dtype.name}"
        )
    return x


def dropout_multiplier(seed: int, offset: int, n: int, p: float, dtype: DType) -> np.ndarray:
    """The flat factor dropout multiplies by: scale where kept, 0 where dropped."""
    keep = _u24(random_words(seed, offset, n)) < 1.0 - p
    t = dtype.np
    scale = t(0) if p >= 1.0 else t(1) / t(1.0 - p)
    return np.where(keep, scale, t(0)).astype(t)


def _dropout_kernel(x, seed, p: float):
    dt = as_dtype(x.dtype)
    m = dropout_multiplier(*_seed_offset(seed), x.size, p, dt)
    return x * m.reshape(x.shape)


def _dropout_vjp(ctx, g):
    # Linear in x with the mask fixed by the seed input: the same op on g reuses the mask.
    return (call("dropout", g, ctx.inputs[1], p=ctx.attrs["p"]), None)


register(OpDef("dropout", RANDOM, ("x", "seed"), _dropout_infer, _dropout_kernel, _dropout_vjp,
               attrs={"p": float}, saved_inputs=(1,), effectful=True,
               doc="Zero each element with probability p, scale the rest by 1/(1-p)."))


# ---- bernoulli -------------------------------------------------------------------------------
def _bernoulli_infer(p: TensorType, seed: TensorType) -> TensorType:
    _check_seed("bernoulli", seed)
    if not p.dtype.is_floating:
        raise DTypeError(
            f"{where('bernoulli')}: expected a floating point probability tensor, got "
            f"{p.dtype.name}"
        )
    return p


def _bernoulli_kernel(p, seed):
    u = _u24(random_words(*_seed_offset(seed), p.size)).reshape(p.shape)
    return (u < p.astype(np.float64)).astype(p.dtype)


register(OpDef("bernoulli", RANDOM, ("p", "seed"), _bernoulli_infer, _bernoulli_kernel, None,
               effectful=True, doc="1 with probability p[i], else 0, in p's dtype."))


# ---- randint ---------------------------------------------------------------------------------
def _randint_infer(seed: TensorType, low: int, high: int, shape: tuple) -> TensorType:
    _check_seed("randint", seed)
    if low >= high:
        raise ArgumentError(
            f"{where('randint')}: random_ expects 'from' to be less than 'to', but got "
            f"from={low} >= to={high}"
        )
    return TensorType(shape, int64)


def _randint_kernel(seed, low: int, high: int, shape: tuple):
    n = _numel(shape)
    words = random_words(*_seed_offset(seed), randint_words(n, low, high)).astype(np.uint64)
    if high - low > 1 << 32:
        pairs = words.reshape(-1, 2)
        words = (pairs[:, 0] << np.uint64(32)) | pairs[:, 1]
    x = words % np.uint64(high - low) + np.uint64(low % _U64)  # wraps mod 2^64
    return x.view(np.int64).reshape(shape)


register(OpDef("randint", RANDOM, ("seed",), _randint_infer, _randint_kernel, None,
               attrs={"low": int, "high": int, "shape": tuple}, effectful=True,
               doc="Integers uniform in [low, high) (modulo reduction of 32/64-bit words)."))


# ---- randperm --------------------------------------------------------------------------------
def _randperm_infer(seed: TensorType, n: int) -> TensorType:
    _check_seed("randperm", seed)
    if n < 0:
        raise ArgumentError(f"{where('randperm')}: n must be non-negative, got{n}")
    return TensorType((n,), int64)


def _randperm_kernel(seed, n: int):
    pairs = random_words(*_seed_offset(seed), 2 * n).astype(np.uint64).reshape(-1, 2)
    keys = (pairs[:, 0] << np.uint64(32)) | pairs[:, 1]
    return np.argsort(keys, kind="stable").astype(np.int64)


register(OpDef("randperm", RANDOM, ("seed",), _randperm_infer, _randperm_kernel, None,
               attrs={"n": int}, effectful=True,
               doc="A random permutation of 0..n-1 (stable argsort of 64-bit keys)."))


# ---- Generator -------------------------------------------------------------------------------
def _canonical_seed(seed) -> int:
    """PyTorch's range: [-2^63, 2^64); negative seeds map to seed + 2^64."""
    if hasattr(seed, "dtype") and getattr(seed, "ndim", 1) == 0 and seed.dtype.name == "int64":
        seed = seed.item()  # a 0-d int64 tensor or numpy scalar
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"manual_seed expected an int seed, got {type(seed).__name__}")
    seed = int(seed)
    if not -(1 << 63) <= seed < _U64:
        raise ArgumentError(
            f"manual_seed: Overflow when unpacking long: seed must be in [-2**63, 2**64), got "
            f"{seed}"
        )
    return seed % _U64


class Generator:
    """A Philox stream position: a 64-bit seed and an offset counted in 128-bit counters.

    Random ops read (seed, offset) from it and advance the offset by the counters they used,
    so a sequence of calls never reuses a counter, and (seed, offset) replays any call.

    >>> import graphc
    >>> g = graphc.Generator().manual_seed(42)
    >>> a = graphc.rand(3, generator=g)
    >>> g.get_state().tolist()
    [42, 1]
    """

    def __init__(self, device: str = "cpu") -> None:
        if str(device) != "cpu":
            raise ArgumentError(f"Generator: only the 'cpu' device is known, got {device!r}")
        self._seed = DEFAULT_SEED
        self._offset = 0

    @property
    def device(self) -> str:
        return "cpu"

    def manual_seed(self, seed) -> Generator:
        """Set the seed and rewind the offset to 0; returns the generator."""
        self._seed = _canonical_seed(seed)
        self._offset = 0
        return self

    def seed(self) -> int:
        """Seed from the operating system's entropy; returns the new seed."""
        self.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        return self._seed

    def initial_seed(self) -> int:
        return self._seed

    @property
    def offset(self) -> int:
        """Counters used since the last seeding."""
        return self._offset

    def get_state(self):
        """An int64 tensor [seed, offset] (the seed's 64 bits reinterpreted as int64)."""
        from graphc.tensor import Tensor

        return Tensor._wrap(np.array([self._seed, self._offset], np.uint64).view(np.int64))

    def set_state(self, state) -> Generator:
        """Restore a state from `get_state()` (or any [seed, offset] pair)."""
        arr = np.asarray(state._data if hasattr(state, "_data") else state)
        if arr.shape != (2,) or arr.dtype.kind not in "iu":
            raise ShapeError(
                "Generator.set_state: expected an int64 tensor of shape (2,) holding "
                f"[seed, offset], got shape {list(arr.shape)} of {arr.dtype}"
            )
        seed, offset = (int(v) for v in arr.astype(np.int64).view(np.uint64))
        self._seed, self._offset = seed, offset
        return self

    def _take(self, counters: int) -> tuple[int, int]:
        """(seed, offset) for a call using `counters` counters; advances the offset."""
        seed, offset = self._seed, self._offset
        self._offset = (offset + int(counters)) % (1 << 63)
        return seed, offset

    def __repr__(self) -> str:
        return f"<graphc.Generator seed={self._seed} offset={self._offset}>"


default_generator = Generator()

# A trace installs a provider (generator, counters) -> seed tensor, e.g. one that hands out a
# graph input and records how far to advance the offset per run. None: a constant tensor.
# Per thread, as tracing is: another thread's eager random ops never reach a trace's
# provider, and a trace that ends restores only its own thread's.
_seed_state = threading.local()


def set_seed_provider(provider):
    """Install provider(generator, counters) -> int64[2] tensor for the calling thread;
    returns the previous one."""
    previous = getattr(_seed_state, "provider", None)
    _seed_state.provider = provider
    return previous


def seed_input(generator: Generator | None, n_words: int):
    """The [seed, offset] input tensor of one random call reading `n_words` words."""
    gen = default_generator if generator is None else generator
    counters = counters_for(n_words)
    provider = getattr(_seed_state, "provider", None)
    if provider is not None:
        return provider(gen, counters)
    from graphc.tensor import Tensor

    seed, offset = gen._take(counters)
    return Tensor._wrap(np.array([seed, offset], np.uint64).view(np.int64))


def manual_seed(seed) -> Generator:
    """Seed the default generator; returns it (as torch.manual_seed)."""
    return default_generator.manual_seed(seed)


def seed() -> int:
    """Seed the default generator from the operating system's entropy; returns the seed."""
    return default_generator.seed()


def initial_seed() -> int:
    """The seed the default generator started from."""
    return default_generator.initial_seed()


def get_rng_state():
    """The default generator's state, as a tensor (set_rng_state restores it)."""
    return default_generator.get_state()


def set_rng_state(state) -> None:
    """Restore the default generator's state from get_rng_state's tensor."""
    default_generator.set_state(state)


# ---- public functions ------------------------------------------------------------------------
def _finish(t, requires_grad: bool):
    if requires_grad:
        t.requires_grad_(True)
    return t


def rand(*size, generator=None, dtype=None, requires_grad=False, device=None):
    """Uniform floats in [0, 1).

    >>> import graphc
    >>> graphc.rand(2, 3, generator=graphc.Generator().manual_seed(0)).shape
    graphc.Size([2, 3])
    """
    check_device("graphc.rand", device)
    shape, dt = size_arg("rand", size), _float_dtype("rand", dtype)
    seed_t = seed_input(generator, uniform_words(_numel(shape), dt))
    return _finish(call("uniform", seed_t, shape=shape, dtype=dt.name), requires_grad)


def randn(*size, generator=None, dtype=None, requires_grad=False, device=None):
    """Standard normal floats."""
    check_device("graphc.randn", device)
    shape, dt = size_arg("randn", size), _float_dtype("randn", dtype)
    seed_t = seed_input(generator, normal_words(_numel(shape), dt))
    return _finish(call("normal", seed_t, shape=shape, dtype=dt.name), requires_grad)


def rand_like(t, *, dtype=None, requires_grad=False, generator=None, device=None):
    """Uniform [0, 1) samples with the shape (and dtype) of `x`."""
    check_device("graphc.rand_like", device)
    return rand(tuple(t.shape), generator=generator, dtype=dtype or t.dtype,
                requires_grad=requires_grad)


def randn_like(t, *, dtype=None, requires_grad=False, generator=None, device=None):
    """Standard normal samples with the shape (and dtype) of `x`."""
    check_device("graphc.randn_like", device)
    return randn(tuple(t.shape), generator=generator, dtype=dtype or t.dtype,
                 requires_grad=requires_grad)


def randint(low, high=None, size=None, *, generator=None, dtype=None, requires_grad=False,
            device=None):
    """Integers uniform in [low, high): randint(high, size) or randint(low, high, size)."""
    check_device("graphc.randint", device)
    if size is None:
        if high is None or not isinstance(high, (tuple, list)):
            raise TypeError("randint() missing the size argument: randint(low, high, size)")
        low, high, size = 0, low, high
    low, high = int(low), int(high)
    shape = size_arg("randint", (size,))
    seed_t = seed_input(generator, randint_words(_numel(shape), low, high) if low < high else 0)
    out = call("randint", seed_t, low=low, high=high, shape=shape)
    if dtype is not None and as_dtype(dtype) is not int64:
        out = call("cast", out, dtype=as_dtype(dtype).name)
    return _finish(out, requires_grad)


def randperm(n, *, generator=None, dtype=None, requires_grad=False, device=None):
    """A random permutation of 0..n-1 (int64), e.g. to shuffle a data set."""
    check_device("graphc.randperm", device)
    n = int(n)
    seed_t = seed_input(generator, 2 * max(n, 0))
    out = call("randperm", seed_t, n=n)
    if dtype is not None and as_dtype(dtype) is not int64:
        out = call("cast", out, dtype=as_dtype(dtype).name)
    return _finish(out, requires_grad)


def check_device(function: str, device) -> None:
    """The front end's device check (graphc.ops.sources.check_device), imported when called."""
    from graphc.ops.sources import check_device as source_check

    source_check(function, device)


def _check_std(std: float) -> None:
    if std < 0:
        raise ArgumentError(f"{where('normal')}: normal expects std >= 0.0, but found std {std}")


def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, requires_grad=False,
           device=None):
    """mean + std * randn: floats with `size`, or tensors broadcast together.

    With tensor mean/std the result is the reparameterised sample, so gradients flow to them.
    """
    check_device("graphc.normal", device)
    from graphc.ops.shapes import broadcast_shapes

    mean_is_t, std_is_t = hasattr(mean, "shape"), hasattr(std, "shape")
    if not std_is_t:
        _check_std(float(std))
    if not mean_is_t and not std_is_t:
        if size is None:
            raise TypeError("normal() with float mean and std needs a size")
        z = randn(size_arg("normal", (size,)), generator=generator, dtype=dtype)
        return _finish(z * float(std) + float(mean), requires_grad)
    tensors = [t for t in (mean, std) if hasattr(t, "shape")]
    shape, dt = tuple(tensors[0].shape), tensors[0].dtype
    for t in tensors[1:]:
        shape, dt = broadcast_shapes("normal", shape, tuple(t.shape)), promote(dt, t.dtype)
    z = randn(shape, generator=generator, dtype=dt if dt.is_floating else None)
    return z * std + mean


def bernoulli(input, p=None, *, generator=None):
    """1 with probability input[i] (or p, with input's shape), else 0, in input's dtype."""
    probs = input if p is None else call("full", shape=tuple(input.shape), value=float(p),
                                          dtype=input.dtype.name)
    seed_t = seed_input(generator, probs.numel())
    return call("bernoulli", probs, seed_t)


def _check_dropout_p(p) -> float:
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ArgumentError(
            f"{where('dropout')}: dropout probability has to be between 0 and 1, but got {p}"
        )
    return p


def dropout(input, p: float = 0.5, training: bool = True, inplace: bool = False, *,
            generator=None):
    """Zero elements with probability p and scale the rest by 1/(1-p) (training only).

    >>> import graphc
    >>> x = graphc.ones(4)
    >>> graphc.dropout(x, 0.5, training=False) is x
    True
    """
    p = _check_dropout_p(p)
    if p == 0.0 or not training or input.numel() == 0:
        return input
    seed_t = seed_input(generator, input.numel())
    if inplace:
        def dropped(old):
            return call("dropout", old, seed_t, p=p)

        return _inplace(input, "dropout_", dropped)
    return call("dropout", input, seed_t, p=p)


# ---- in-place initialisers (nn.init) ---------------------------------------------------------
def uniform_(self, a: float = 0.0, b: float = 1.0, *, generator=None):
    """Fill self with uniform values in [a, b) (in place; use under no_grad on parameters)."""
    dt = _float_dtype("uniform_", self.dtype)
    seed_t = seed_input(generator, uniform_words(self.numel(), dt))
    shape, lo, span = tuple(self.shape), float(a), float(b) - float(a)

    def filled(old):
        u = call("uniform", seed_t, shape=shape, dtype=dt.name)
        return u * span + lo if (lo, span) != (0.0, 1.0) else u

    return inplace(self, "uniform_", filled)


def normal_(self, mean: float = 0.0, std: float = 1.0, *, generator=None):
    """Fill self with normal values of the given mean and std (in place)."""
    _check_std(float(std))
    dt = _float_dtype("normal_", self.dtype)
    seed_t = seed_input(generator, normal_words(self.numel(), dt))
    shape, mu, sigma = tuple(self.shape), float(mean), float(std)

    def filled(old):
        z = call("normal", seed_t, shape=shape, dtype=dt.name)
        return z * sigma + mu if (mu, sigma) != (0.0, 1.0) else z

    return inplace(self, "normal_", filled)


def bernoulli_(self, p=0.5, *, generator=None):
    """Fill self with 0/1 draws, 1 with probability p (a float or a tensor broadcast to self)."""
    shape = tuple(self.shape)
    dt = self.dtype if self.dtype.is_floating else float32
    if hasattr(p, "shape"):
        probs = call("cast", p, dtype=dt.name) if p.dtype is not dt else p
        if tuple(probs.shape) != shape:
            probs = call("broadcast_to", probs, shape=shape)
    else:
        probs = call("full", shape=shape, value=float(p), dtype=dt.name)
    seed_t = seed_input(generator, self.numel())

    def filled(old):
        draws = call("bernoulli", probs, seed_t)
        return draws if draws.dtype is old.dtype else call("cast", draws, dtype=old.dtype.name)

    return inplace(self, "bernoulli_", filled)


def _bernoulli_method(self, p=None, *, generator=None):
    """Tensor.bernoulli: 0/1 samples with probabilities `p` (or this tensor's values)."""
    return bernoulli(self, p, generator=generator)


TENSOR_METHODS = {
    "uniform_": uniform_, "normal_": normal_, "bernoulli_": bernoulli_,
    "bernoulli": _bernoulli_method,
}

PUBLIC = (
    "Generator", "default_generator", "manual_seed", "seed", "initial_seed", "get_rng_state",
    "set_rng_state", "rand", "randn", "rand_like", "randn_like", "randint", "randperm",
    "normal", "bernoulli", "dropout",
)
