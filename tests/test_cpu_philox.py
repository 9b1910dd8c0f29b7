"""graphc.backends.cpu.philox: the compiled Philox stream against eager graphc, bit for bit.

Each emitter is JIT-compiled into a loop (`philox.emit_fill`) with a small llvmlite MCJIT kept
here (independent of graphc.backends.cpu.llvm: one target machine per engine, engines kept
alive for the session), run on a (seed, offset), and compared with what graphc's eager random
functions draw from a Generator set to the same [seed, offset]: raw words, uniform float32 and
float64, dropout (float32 and float64 share masks), bernoulli, normal (within
`philox.NORMAL_TOLERANCE`: mathlib's log/sin/cos are not libm's); Random123's known answers;
offsets whose counters carry into the high word or wrap mod 2^64; vector-typed emitters; 1e6
elements fast.
"""

from __future__ import annotations

import ctypes
import functools
import time

import numpy as np
import pytest

llvmlite = pytest.importorskip("llvmlite")
from llvmlite import binding as llvm  # noqa: E402
from llvmlite import ir  # noqa: E402

import graphc  # noqa: E402
from graphc.backends.cpu import philox  # noqa: E402
from graphc.ops import random as R  # noqa: E402

# Random123 kat_vectors, "philox4x32 10" lines: counter[4], key[2] -> output[4].
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]
U64 = 1 << 64
# (seed, offset): plain, PyTorch's default seed, all-ones seed, a counter carrying from the
# low into the high word within the draw, and counters wrapping past 2^64.
STREAMS = [
    (0, 0),
    (42, 7),
    (R.DEFAULT_SEED, 3),
    (U64 - 1, 123456789),
    (0x123456789ABCDEF0, (1 << 32) - 3),
    (0xDEADBEEF00C0FFEE, U64 - 2),
]
SIZES = (1, 3, 5, 1001)
DTYPES = ("float32", "float64")


# ---- a tiny JIT (kept local: these tests do not depend on backends/cpu/llvm.py) --------------
def _target_machine():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(),
                                        opt=3, codemodel="jitdefault")


def _optimised(module: ir.Module, tm):
    mod = llvm.parse_assembly(str(module))
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


_ENGINES = []  # every engine (and the module it owns) lives for the whole session


def _jit(module: ir.Module, name: str, argtypes):
    tm = _target_machine()  # one per engine: the engine owns (and frees) it
    engine = llvm.create_mcjit_compiler(_optimised(module, tm), tm)
    engine.finalize_object()
    _ENGINES.append(engine)
    return ctypes.CFUNCTYPE(None, *argtypes)(engine.get_function_address(name))


def _module(name: str) -> ir.Module:
    module = ir.Module(name=name)
    module.triple = llvm.get_process_triple()
    return module


_ELEMENT = {"words": np.uint32, "float32": np.float32, "float64": np.float64}


@functools.lru_cache(maxsize=None)
def _fill(kind: str, dtype: str = "float32", p: float = 0.5):
    """run(n, seed, offset[, src]) -> the loop's output array."""
    module = _module(f"philox_{kind}_{dtype}")
    philox.emit_fill(module, "fill", kind, dtype, p)
    reads = kind in ("dropout", "bernoulli")
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    cfun = _jit(module, "fill", [vp] * (2 if reads else 1) + [i64, i64, i64])
    et = _ELEMENT["words" if kind == "words" else dtype]

    def run(n: int, seed: int, offset: int, src: np.ndarray | None = None) -> np.ndarray:
        out = np.empty(n, et)
        s, o = (int(np.uint64(v % U64).view(np.int64)) for v in (seed, offset))
        if reads:
            src = np.ascontiguousarray(src, dtype=dtype)
            cfun(src.ctypes.data, out.ctypes.data, n, s, o)
        else:
            cfun(out.ctypes.data, n, s, o)
        return out

    return run


# ---- eager graphc on the same [seed, offset] ---------------------------------------------------
def _generator(seed: int, offset: int) -> graphc.Generator:
    g = graphc.Generator()
    return g.set_state(np.array([seed % U64, offset % U64], np.uint64).view(np.int64))


def _eager(kind: str, seed: int, offset: int, n: int, dtype: str = "float32", p=0.5, src=None):
    g = _generator(seed, offset)
    if kind == "uniform":
        return graphc.rand(n, generator=g, dtype=dtype).numpy()
    if kind == "normal":
        return graphc.randn(n, generator=g, dtype=dtype).numpy()
    if kind == "dropout":  # the op itself: the public function returns x unchanged at p == 0
        seed_t = _generator(seed, offset).get_state()
        return R.call("dropout", graphc.tensor(src.astype(dtype)), seed_t, p=float(p)).numpy()
    if kind == "bernoulli":
        return graphc.bernoulli(graphc.tensor(src.astype(dtype)), generator=g).numpy()
    raise KeyError(kind)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32 if a.itemsize == 4 else np.uint64)


def _assert_bit_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    bad = np.flatnonzero(_bits(got) != _bits(want))
    assert bad.size == 0, (f"{what}: {bad.size} of {got.size} differ, first at {bad[:5]}: "
                           f"got {got[bad[:5]]}, eager {want[bad[:5]]}")


# ---- the generator itself ----------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _philox_fn():
    """void kat(u32* in6, u32* out4): philox4x32_10 of in[0:4] under in[4:6]."""
    module = _module("philox_kat")
    ptr = ir.PointerType()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr]), "kat")
    b = ir.IRBuilder(fn.append_basic_block())
    i32 = ir.IntType(32)
    words = [b.load(b.gep(fn.args[0], [ir.Constant(i32, k)], source_etype=i32), typ=i32)
             for k in range(6)]
    for k, w in enumerate(philox.philox4x32_10(b, words[:4], words[4:])):
        b.store(w, b.gep(fn.args[1], [ir.Constant(i32, k)], source_etype=i32))
    b.ret_void()
    return _jit(module, "kat", [ctypes.c_void_p, ctypes.c_void_p])


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_philox4x32_10_known_answers(ctr, key, want):
    src = np.array(ctr + key, np.uint32)
    out = np.zeros(4, np.uint32)
    _philox_fn()(src.ctypes.data, out.ctypes.data)
    assert [int(w) for w in out] == list(want)


def test_philox4x32_10_matches_scalar_reference(rng):
    run = _philox_fn()
    out = np.zeros(4, np.uint32)
    for src in rng.integers(0, 2**32, size=(200, 6), dtype=np.uint64).astype(np.uint32):
        run(src.ctypes.data, out.ctypes.data)
        want = R.philox4x32_scalar(tuple(int(v) for v in src[:4]), (int(src[4]), int(src[5])))
        assert [int(w) for w in out] == want


@pytest.mark.parametrize("seed,offset", STREAMS)
def test_words_match_eager_stream(seed, offset):
    n = 4 * 9 + 3  # a partial last counter
    got = _fill("words")(n, seed, offset)
    np.testing.assert_array_equal(got, R.random_words(seed, offset, n))
    ref = R.ReferenceStream(seed, offset)
    assert [int(w) for w in got[:12]] == [ref.word(j) for j in range(12)]


def test_offset_carries_into_high_word():
    """Counter 2^32 - 1 + k: c0 wraps to 0 and c1 becomes 1 (not a 32-bit counter)."""
    seed, offset = 99, (1 << 32) - 1
    got = _fill("words")(8, seed, offset)
    ref = R.ReferenceStream(seed, offset)
    assert [int(w) for w in got] == [ref.word(j) for j in range(8)]
    carried = R.philox4x32_scalar((0, 1, 0, 0), (99, 0))
    assert [int(w) for w in got[4:]] == carried
    assert [int(w) for w in got[4:]] != R.philox4x32_scalar((0, 0, 0, 0), (99, 0))


def test_offset_wraps_mod_2_64():
    got = _fill("words")(8, 5, U64 - 1)
    assert [int(w) for w in got[4:]] == R.philox4x32_scalar((0, 0, 0, 0), (5, 0))


# ---- uniforms ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed,offset", STREAMS)
def test_uniform_bit_exact(seed, offset, dtype):
    for n in SIZES:
        got = _fill("uniform", dtype)(n, seed, offset)
        _assert_bit_equal(got, _eager("uniform", seed, offset, n, dtype),
                          f"uniform {dtype} n={n}")
        assert ((got >= 0) & (got < 1)).all()


def test_uniform_float64_uses_53_bits():
    u = _fill("uniform", "float64")(4096, 1, 0)
    assert (np.modf(u * 2.0**53)[0] == 0).all()
    assert (np.modf(u * 2.0**24)[0] != 0).mean() > 0.99  # not a float32 uniform widened


# ---- dropout -----------------------------------------------------------------------------------
DROPOUT_P = (0.0, 0.1, 1 / 3, 0.5, 0.999, 1.0)


def _inputs(rng, n: int) -> np.ndarray:
    x = rng.standard_normal(n)
    x[:4] = [np.inf, -np.inf, np.nan, -0.0][: min(4, n)]
    return x


@pytest.mark.parametrize("p", DROPOUT_P)
@pytest.mark.parametrize("seed,offset", STREAMS[::2] + STREAMS[-1:])
def test_dropout_bit_exact(seed, offset, p, rng):
    x = _inputs(rng, 1001)
    masks = []
    for dtype in DTYPES:
        got = _fill("dropout", dtype, p)(x.size, seed, offset, x)
        want = _eager("dropout", seed, offset, x.size, dtype, p, x)
        _assert_bit_equal(got, want, f"dropout {dtype} p={p}")
        ones = _fill("dropout", dtype, p)(x.size, seed, offset, np.ones(x.size))
        masks.append(ones != 0)
    np.testing.assert_array_equal(masks[0], masks[1])  # float32 and float64 draw one mask
    if 0 < p < 1:
        assert abs(masks[0].mean() - (1 - p)) < 0.06


@pytest.mark.parametrize("p", (0.0, 0.1, 0.2, 1 / 3, 0.5, 0.7, 1 - 2**-24, 1e-9, 1 - 1e-9,
                               2**-25, 1.0))
def test_dropout_threshold_is_the_documented_comparison(p):
    """(w >> 8) < T  <=>  (double)(w >> 8) * 2^-24 < 1 - p, over every 24-bit value."""
    x = np.arange(1 << 24, dtype=np.int64)
    np.testing.assert_array_equal(x < philox._keep_threshold(p), x * 2.0**-24 < 1.0 - p)


def test_dropout_scale_in_the_input_dtype():
    assert philox.dropout_scale(0.1, "float32") == float(np.float32(1) / np.float32(0.9))
    assert philox.dropout_scale(0.1, "float64") == 1 / 0.9
    assert philox.dropout_scale(1.0, "float32") == 0.0


# ---- bernoulli ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed,offset", STREAMS)
def test_bernoulli_bit_exact(seed, offset, dtype, rng):
    probs = rng.random(1001)
    probs[:8] = [0.0, 1.0, np.nan, 0.5, 2**-24, 1 - 2**-24, -0.5, 1.5]
    # around every uniform the first words produce: u - 1 ulp, u, u + 1 ulp
    u = R._u24(R.random_words(seed, offset, 30))
    probs[8:38] = u
    probs[38:68] = np.nextafter(u, 2)
    probs[68:98] = np.nextafter(u, -1)
    got = _fill("bernoulli", dtype)(probs.size, seed, offset, probs)
    want = _eager("bernoulli", seed, offset, probs.size, dtype, src=probs)
    _assert_bit_equal(got, want, f"bernoulli {dtype}")
    assert set(np.unique(got)) <= {0.0, 1.0}


# ---- normal ------------------------------------------------------------------------------------
def _normal_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want) / np.maximum(1.0, np.abs(want))))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed,offset", STREAMS)
def test_normal_matches_eager(seed, offset, dtype):
    for n in SIZES:
        got = _fill("normal", dtype)(n, seed, offset)
        want = _eager("normal", seed, offset, n, dtype)
        assert got.dtype == want.dtype and np.isfinite(got).all()
        assert _normal_error(got, want) <= philox.NORMAL_TOLERANCE[dtype], (dtype, n)


@pytest.mark.parametrize("dtype", DTYPES)
def test_normal_large_sample_agreement(dtype):
    """Over 2^16 draws: float32 bit-exact almost everywhere and never more than 1 ulp off;
    float64 within a few ulp (mathlib vs numpy's log/sin/cos)."""
    n = 1 << 16
    got = _fill("normal", dtype)(n, 7, 11)
    want = _eager("normal", 7, 11, n, dtype)
    assert _normal_error(got, want) <= philox.NORMAL_TOLERANCE[dtype]
    ulps = np.abs(got - want) / np.spacing(np.abs(want).astype(got.dtype))
    if dtype == "float32":
        assert ulps.max() <= 1 and (got == want).mean() > 0.99
    else:
        assert ulps.max() <= 8
    assert abs(got.mean()) < 0.02 and abs(got.std() - 1) < 0.02


def test_normal_odd_n_is_a_prefix_of_the_pairs():
    full = _fill("normal", "float32")(6, 3, 4)
    np.testing.assert_array_equal(_fill("normal", "float32")(5, 3, 4), full[:5])


# ---- vector-typed emitters ---------------------------------------------------------------------
def _splat(b: ir.IRBuilder, x: ir.Value, lanes: int) -> ir.Value:
    vt = ir.VectorType(x.type, lanes)
    v = b.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return b.shuffle_vector(v, ir.Constant(vt, ir.Undefined),
                            ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))


@functools.lru_cache(maxsize=None)
def _vector_fn(lanes: int = 8):
    """void v(i64* seed_offset, i64* idx, u32* words, float* u, double* z): lanes at once."""
    module = _module("philox_vector")
    ptr = ir.PointerType()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr] * 5), "v")
    b = ir.IRBuilder(fn.append_basic_block())
    seed, offset = (_splat(b, v, lanes) for v in philox.load_seed(b, fn.args[0]))
    vi64 = ir.VectorType(ir.IntType(64), lanes)
    i = b.load(fn.args[1], typ=vi64, align=8)  # numpy arrays: 16-byte aligned
    b.store(philox.word(b, seed, offset, i), fn.args[2], align=4)
    b.store(philox.uniform(b, seed, offset, i, "float32"), fn.args[3], align=4)
    b.store(philox.normal(b, seed, offset, i, "float64"), fn.args[4], align=4)
    b.ret_void()
    return _jit(module, "v", [ctypes.c_void_p] * 5)


def test_vector_emitters_match_scalar_loops(rng):
    seed, offset = 0x0123456789ABCDEF, (1 << 32) - 2
    idx = rng.integers(0, 200, size=8).astype(np.int64)
    so = np.array([seed, offset], np.uint64).view(np.int64)
    words, u, z = np.empty(8, np.uint32), np.empty(8, np.float32), np.empty(8, np.float64)
    _vector_fn()(so.ctypes.data, idx.ctypes.data, words.ctypes.data, u.ctypes.data,
                 z.ctypes.data)
    np.testing.assert_array_equal(words, _fill("words")(200, seed, offset)[idx])
    _assert_bit_equal(u, _fill("uniform", "float32")(200, seed, offset)[idx], "vector uniform")
    _assert_bit_equal(z, _fill("normal", "float64")(200, seed, offset)[idx], "vector normal")


# ---- speed and errors --------------------------------------------------------------------------
@pytest.mark.parametrize("kind,dtype", [("uniform", "float32"), ("uniform", "float64"),
                                        ("normal", "float32"), ("normal", "float64"),
                                        ("dropout", "float32"), ("bernoulli", "float64")])
def test_one_million_elements_fast(kind, dtype):
    n = 1_000_000
    run = _fill(kind, dtype, 0.5)
    src = np.full(n, 0.5)
    args = (src,) if kind in ("dropout", "bernoulli") else ()
    run(1000, 1, 2, *(a[:1000] for a in args))  # warm
    start = time.perf_counter()
    out = run(n, 1, 2, *args)
    elapsed = time.perf_counter() - start
    assert elapsed < 0.25, f"{kind} {dtype}: {elapsed:.3f} s for 1e6 elements"
    if kind == "uniform":
        _assert_bit_equal(out, _eager("uniform", 1, 2, n, dtype), "uniform 1e6")


def test_loops_vectorise_without_calls():
    features = llvm.get_host_cpu_features().flatten().split(",")
    if "+avx2" not in features:
        pytest.skip("the host has no AVX2: nothing wider than SSE to check for")
    for kind, dtype in (("words", "float32"), ("uniform", "float64"), ("normal", "float32"),
                        ("dropout", "float64")):
        module = _module(f"asm_{kind}")
        philox.emit_fill(module, "fill", kind, dtype)
        tm = _target_machine()
        asm = tm.emit_assembly(_optimised(module, tm))
        assert "vpmuludq" in asm and ("%ymm" in asm or "%zmm" in asm), (kind, dtype)
        assert "call" not in asm, (kind, dtype)


def test_bad_dtype_and_kind():
    module = _module("bad")
    with pytest.raises(ValueError, match="float32 or float64"):
        philox.emit_fill(module, "f", "uniform", "int64")
    with pytest.raises(ValueError, match="kind must be one of"):
        philox.emit_fill(module, "g", "randint")
