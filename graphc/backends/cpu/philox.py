"""The Philox4x32-10 stream of graphc.ops.random emitted as LLVM IR: words, uniforms, normals,
dropout and bernoulli draws for element i of a (seed, offset) stream.

graphc.ops.random's module docstring is the specification; this module renders it in IR so
compiled random ops draw exactly what eager mode draws. Every emitter takes an
`llvmlite.ir.IRBuilder` and IR values `seed`, `offset` (i64: the two words of the op's int64[2]
seed input, read as unsigned) and the element index `i` (i64, row-major over the op's output),
and returns IR values. They are straight-line code: integer arithmetic with 32x32->64
multiplies as zext/mul/lshr/trunc, choices by `select`, no branches and no calls except
mathlib's intrinsics, so a loop over i vectorises. Scalars or vectors: every value may be
`<N x i64>` instead of i64 (all of seed, offset and i with the same N), results follow.

Invariants:
- Bit for bit equal to eager (`graphc.ops.random`'s kernels) for the raw words, uniform
  float32/float64, dropout (same mask for float32 and float64 inputs, the same scale) and
  bernoulli. The arithmetic that decides a value is exact (shifts, exact int->float
  conversions, multiplies by powers of two); no fast-math flag is set on it.
- normal: Box-Muller in double exactly as documented, with mathlib's log/sin/cos in place of
  numpy's: they differ in the last ulp or so of the double result, so a float64 normal
  agrees to a few ulp (3 at most, 84% bit for bit, over 2^20 draws measured on znver3) and a
  float32 normal almost always bit for bit (all of those 2^20; the tests allow one float32
  ulp). `NORMAL_TOLERANCE` is the bound tests/test_cpu_philox.py asserts, relative to
  max(1, |z|).
- word j of the stream lives in counter offset + j/4 (mod 2^64), so j and j+1 share a
  counter when j is even: a float64 uniform (words 2i, 2i+1) runs Philox once, a normal pair
  once (float32: words 2k, 2k+1) or once (float64: words 4k..4k+3).

Example:
    >>> from llvmlite import ir
    >>> module = ir.Module()
    >>> i64 = ir.IntType(64)
    >>> fn = ir.Function(module, ir.FunctionType(ir.FloatType(), [i64] * 3), "u")
    >>> b = ir.IRBuilder(fn.append_basic_block())
    >>> _ = b.ret(uniform(b, *fn.args, "float32"))
    >>> [f.name for f in module.functions if f.is_declaration]
    []
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from graphc.backends.cpu import mathlib
from graphc.ops.random import PHILOX_M0, PHILOX_M1, PHILOX_ROUNDS, PHILOX_W0, PHILOX_W1, TWO_PI

__all__ = ["NORMAL_TOLERANCE", "philox4x32_10", "block", "word", "word_pair", "uniform",
           "normal_pair", "normal", "dropout_keep", "dropout", "dropout_scale", "bernoulli_keep",
           "bernoulli", "load_seed", "emit_fill", "FILLS"]

I32, I64 = ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()
_FLOATS = {"float32": F32, "float64": F64}

# |compiled - eager| <= NORMAL_TOLERANCE[dtype] * max(1, |eager|) for normal draws.
NORMAL_TOLERANCE = {"float32": 1e-6, "float64": 1e-14}


# ---- typed constants (splatted when the values are vectors) ---------------------------------
def _lanes(v: ir.Value) -> int | None:
    return v.type.count if isinstance(v.type, ir.VectorType) else None


def _ty(scalar: ir.Type, lanes: int | None) -> ir.Type:
    return ir.VectorType(scalar, lanes) if lanes else scalar


def _c(scalar: ir.Type, lanes: int | None, value) -> ir.Constant:
    if lanes:
        return ir.Constant(ir.VectorType(scalar, lanes), [ir.Constant(scalar, value)] * lanes)
    return ir.Constant(scalar, value)


def _mulhilo(b: ir.IRBuilder, a: ir.Value, m: int) -> tuple[ir.Value, ir.Value]:
    """(hi, lo) 32-bit halves of the 64-bit product of the uint32 `a` and the constant m."""
    lanes = _lanes(a)
    p = b.mul(b.zext(a, _ty(I64, lanes)), _c(I64, lanes, m))
    hi = b.trunc(b.lshr(p, _c(I64, lanes, 32)), _ty(I32, lanes))
    return hi, b.trunc(p, _ty(I32, lanes))


# ---- the generator --------------------------------------------------------------------------
def philox4x32_10(builder: ir.IRBuilder, counter_words, key_words) -> list[ir.Value]:
    """Philox4x32-10 of the counter (c0, c1, c2, c3) under the key (k0, k1), all i32 values
    (or vectors): the 4 output words, as Random123's philox4x32_R(10, ctr, key)."""
    c0, c1, c2, c3 = counter_words
    k0, k1 = key_words
    lanes = _lanes(c0)
    for r in range(PHILOX_ROUNDS):
        if r:
            k0 = builder.add(k0, _c(I32, lanes, PHILOX_W0))
            k1 = builder.add(k1, _c(I32, lanes, PHILOX_W1))
        hi0, lo0 = _mulhilo(builder, c0, PHILOX_M0)
        hi1, lo1 = _mulhilo(builder, c2, PHILOX_M1)
        c0, c1, c2, c3 = (builder.xor(builder.xor(hi1, c1), k0), lo1,
                          builder.xor(builder.xor(hi0, c3), k1), lo0)
    return [c0, c1, c2, c3]


def _split(b: ir.IRBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(low, high) 32 bits of the i64 x."""
    lanes = _lanes(x)
    return (b.trunc(x, _ty(I32, lanes)),
            b.trunc(b.lshr(x, _c(I64, lanes, 32)), _ty(I32, lanes)))


def block(builder: ir.IRBuilder, seed: ir.Value, offset: ir.Value,
          n: ir.Value) -> list[ir.Value]:
    """The 4 words of counter n of the stream: Philox of {lo(offset+n), hi(offset+n), 0, 0}
    under {lo(seed), hi(seed)} (all i64 arithmetic mod 2^64)."""
    lanes = _lanes(n)
    lo, hi = _split(builder, builder.add(offset, n))
    zero = _c(I32, lanes, 0)
    return philox4x32_10(builder, (lo, hi, zero, zero), _split(builder, seed))


def _pick(b: ir.IRBuilder, index: ir.Value, values: list[ir.Value]) -> ir.Value:
    """values[index] for an i64 index in range, by a chain of selects (no branch)."""
    lanes = _lanes(index)
    out = values[-1]
    for k in range(len(values) - 2, -1, -1):
        out = b.select(b.icmp_unsigned("==", index, _c(I64, lanes, k)), values[k], out)
    return out


def word(builder: ir.IRBuilder, seed: ir.Value, offset: ir.Value, j: ir.Value) -> ir.Value:
    """Word j (i64, unsigned) of the stream of (seed, offset): word j % 4 of counter j / 4."""
    lanes = _lanes(j)
    words = block(builder, seed, offset, builder.lshr(j, _c(I64, lanes, 2)))
    return _pick(builder, builder.and_(j, _c(I64, lanes, 3)), words)


def word_pair(builder: ir.IRBuilder, seed: ir.Value, offset: ir.Value,
              j: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Words j and j+1 for an EVEN j (one Philox call: they share counter j / 4)."""
    lanes = _lanes(j)
    w = block(builder, seed, offset, builder.lshr(j, _c(I64, lanes, 2)))
    high = builder.icmp_unsigned("!=", builder.and_(j, _c(I64, lanes, 2)), _c(I64, lanes, 0))
    return builder.select(high, w[2], w[0]), builder.select(high, w[3], w[1])


# ---- uniforms -------------------------------------------------------------------------------
def _u24(b: ir.IRBuilder, w: ir.Value, fty: ir.Type) -> ir.Value:
    """(T)(w >> 8) * 2^-24: exact in float and double (24 significant bits at most)."""
    lanes = _lanes(w)
    top = b.lshr(w, _c(I32, lanes, 8))
    # sitofp: the value is below 2^24, so signed and unsigned agree (and sitofp vectorises
    # on every x86 target).
    return b.fmul(b.sitofp(top, _ty(fty, lanes)), _c(fty, lanes, 2.0 ** -24))


def _u53(b: ir.IRBuilder, a: ir.Value, c: ir.Value) -> ir.Value:
    """(double)(((uint64)a << 32 | c) >> 11) * 2^-53: exact."""
    lanes = _lanes(a)
    i64t = _ty(I64, lanes)
    x = b.or_(b.shl(b.zext(a, i64t), _c(I64, lanes, 32)), b.zext(c, i64t))
    x = b.lshr(x, _c(I64, lanes, 11))
    return b.fmul(b.sitofp(x, _ty(F64, lanes)), _c(F64, lanes, 2.0 ** -53))


def _float_type(dtype: str) -> ir.Type:
    if dtype not in _FLOATS:
        raise ValueError(f"philox: random floats need dtype float32 or float64, got {dtype!r}")
    return _FLOATS[dtype]


def uniform(builder: ir.IRBuilder, seed: ir.Value, offset: ir.Value, i: ir.Value,
            dtype: str) -> ir.Value:
    """Uniform i in [0, 1) as a float (float32: word i) or double (float64: words 2i, 2i+1)."""
    fty = _float_type(dtype)
    if dtype == "float64":
        j = builder.shl(i, _c(I64, _lanes(i), 1))
        return _u53(builder, *word_pair(builder, seed, offset, j))
    return _u24(builder, word(builder, seed, offset, i), fty)


# ---- normals (Box-Muller) -------------------------------------------------------------------
def normal_pair(builder: ir.IRBuilder, seed: ir.Value, offset: ir.Value, k: ir.Value,
                dtype: str) -> tuple[ir.Value, ir.Value]:
    """Elements 2k and 2k+1 of a normal draw, (r cos t, r sin t), computed in double and
    rounded to dtype: u1, u2 = uniforms 2k, 2k+1; r = sqrt(-2 log(1 - u1)); t = 2 pi u2."""
    fty = _float_type(dtype)
    lanes = _lanes(k)
    f64t = _ty(F64, lanes)
    if dtype == "float64":  # words 4k .. 4k+3: exactly counter k
        w = block(builder, seed, offset, k)
        u1, u2 = _u53(builder, w[0], w[1]), _u53(builder, w[2], w[3])
    else:  # words 2k, 2k+1
        a, c = word_pair(builder, seed, offset, builder.shl(k, _c(I64, lanes, 1)))
        u1 = builder.fpext(_u24(builder, a, F32), f64t)  # exact
        u2 = builder.fpext(_u24(builder, c, F32), f64t)
    one_minus = builder.fsub(_c(F64, lanes, 1.0), u1)  # exact: u1 is a multiple of 2^-53
    r = mathlib.sqrt(builder, builder.fmul(_c(F64, lanes, -2.0),
                                           mathlib.log(builder, one_minus)))
    t = builder.fmul(_c(F64, lanes, TWO_PI), u2)
    z0 = builder.fmul(r, mathlib.cos(builder, t))
    z1 = builder.fmul(r, mathlib.sin(builder, t))
    if dtype == "float32":
        z0, z1 = builder.fptrunc(z0, _ty(fty, lanes)), builder.fptrunc(z1, _ty(fty, lanes))
    return z0, z1


def normal(builder: ir.IRBuilder, seed: ir.Value, offset: ir.Value, i: ir.Value,
           dtype: str) -> ir.Value:
    """Normal element i: the cos half of pair i/2 for even i, the sin half for odd i."""
    lanes = _lanes(i)
    z0, z1 = normal_pair(builder, seed, offset, builder.lshr(i, _c(I64, lanes, 1)), dtype)
    odd = builder.icmp_unsigned("!=", builder.and_(i, _c(I64, lanes, 1)), _c(I64, lanes, 0))
    return builder.select(odd, z1, z0)


# ---- dropout and bernoulli ------------------------------------------------------------------
def _keep_threshold(p: float) -> int:
    """T with (w >> 8) < T  <=>  (double)(w >> 8) * 2^-24 < 1.0 - p, for every word w.

    (w >> 8) * 2^-24 is exact and x * 2^-24 < c <=> x < c * 2^24 (exact scaling), and for an
    integer x that is x < ceil(c * 2^24)."""
    c = 1.0 - float(p)
    if not c > 0.0:  # p >= 1 (or nan): nothing kept
        return 0
    return min(math.ceil(c * 2.0 ** 24), 1 << 24)


def dropout_keep(builder: ir.IRBuilder, seed: ir.Value, offset: ir.Value, i: ir.Value,
                 p: float) -> ir.Value:
    """i1: element i survives dropout with probability p, iff (double)(word(i) >> 8) * 2^-24
    < 1.0 - p (one word per element whatever the dtype), as an exact integer compare."""
    lanes = _lanes(i)
    top = builder.lshr(word(builder, seed, offset, i), _c(I32, lanes, 8))
    return builder.icmp_unsigned("<", top, _c(I32, lanes, _keep_threshold(p)))


def dropout_scale(p: float, dtype: str) -> float:
    """What kept elements are multiplied by: (T)1 / (T)(1 - p) in dtype T, 0 when p >= 1."""
    t = np.dtype(dtype).type
    if p >= 1.0:
        return 0.0
    return float(t(1) / t(1.0 - p))


def dropout(builder: ir.IRBuilder, seed: ir.Value, offset: ir.Value, i: ir.Value,
            x: ir.Value, p: float) -> ir.Value:
    """x * (keep ? scale : 0) for element i (x a float or double value, or a vector)."""
    lanes = _lanes(x)
    fty = x.type.element if lanes else x.type
    dtype = "float64" if isinstance(fty, ir.DoubleType) else "float32"
    keep = dropout_keep(builder, seed, offset, i, p)
    factor = builder.select(keep, _c(fty, lanes, dropout_scale(p, dtype)), _c(fty, lanes, 0.0))
    return builder.fmul(x, factor)


def bernoulli_keep(builder: ir.IRBuilder, seed: ir.Value, offset: ir.Value, i: ir.Value,
                   p: ir.Value) -> ir.Value:
    """i1: (double)(word(i) >> 8) * 2^-24 < (double)p (p a float or double value; nan: 0)."""
    lanes = _lanes(i)
    u = _u24(builder, word(builder, seed, offset, i), F64)
    scalar = p.type.element if _lanes(p) else p.type
    pd = p if isinstance(scalar, ir.DoubleType) else builder.fpext(p, _ty(F64, lanes))
    return builder.fcmp_ordered("<", u, pd)


def bernoulli(builder: ir.IRBuilder, seed: ir.Value, offset: ir.Value, i: ir.Value,
              p: ir.Value) -> ir.Value:
    """Element i of bernoulli(p): 1.0 or 0.0 in p's type."""
    lanes = _lanes(p)
    fty = p.type.element if lanes else p.type
    return builder.select(bernoulli_keep(builder, seed, offset, i, p), _c(fty, lanes, 1.0),
                          _c(fty, lanes, 0.0))


# ---- seed input and whole loops -------------------------------------------------------------
def load_seed(builder: ir.IRBuilder, ptr: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(seed, offset) from the int64[2] seed input at `ptr` (load before the element loop)."""
    seed = builder.load(builder.gep(ptr, [ir.Constant(I64, 0)], source_etype=I64), typ=I64)
    offset = builder.load(builder.gep(ptr, [ir.Constant(I64, 1)], source_etype=I64), typ=I64)
    return seed, offset


# The loops emit_fill builds.
FILLS = ("words", "uniform", "normal", "dropout", "bernoulli")


def emit_fill(module: ir.Module, name: str, kind: str, dtype: str = "float32",
              p: float = 0.5) -> ir.Function:
    """Append a whole loop to `module`, for tests and benchmarks:

    - words:     void name(u32* out, i64 n, i64 seed, i64 offset)       out[i] = word(i)
    - uniform:   void name(T* out, i64 n, i64 seed, i64 offset)         out[i] = uniform i
    - normal:    void name(T* out, i64 n, i64 seed, i64 offset)         out[i] = normal i
    - dropout:   void name(T* x, T* out, i64 n, i64 seed, i64 offset)   out[i] = dropout(x[i])
    - bernoulli: void name(T* p, T* out, i64 n, i64 seed, i64 offset)   out[i] = bernoulli(p[i])
    (T = dtype; dropout's probability is the constant `p`).
    """
    if kind not in FILLS:
        raise ValueError(f"philox: emit_fill kind must be one of {FILLS}, got {kind!r}")
    ety = I32 if kind == "words" else _float_type(dtype)
    ptr = ir.PointerType()
    reads = kind in ("dropout", "bernoulli")
    params = [ptr] * (2 if reads else 1) + [I64, I64, I64]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), name)
    for a in fn.args[:2 if reads else 1]:
        a.add_attribute("noalias")
    fn.attributes.add("nounwind")
    src = fn.args[0] if reads else None
    out, n, seed, offset = fn.args[-4:]
    entry, loop, done = (fn.append_basic_block(s) for s in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", n, ir.Constant(I64, 0)), loop, done)
    b.position_at_end(loop)
    i = b.phi(I64, name="i")
    i.add_incoming(ir.Constant(I64, 0), entry)
    if kind == "words":
        v = word(b, seed, offset, i)
    elif kind == "uniform":
        v = uniform(b, seed, offset, i, dtype)
    elif kind == "normal":
        v = normal(b, seed, offset, i, dtype)
    else:
        x = b.load(b.gep(src, [i], source_etype=ety), typ=ety)
        v = dropout(b, seed, offset, i, x, p) if kind == "dropout" else \
            bernoulli(b, seed, offset, i, x)
    b.store(v, b.gep(out, [i], source_etype=ety))
    nxt = b.add(i, ir.Constant(I64, 1), flags=["nsw"])
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, n), loop, done)
    b.position_at_end(done)
    b.ret_void()
    return fn
