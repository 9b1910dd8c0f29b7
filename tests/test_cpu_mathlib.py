"""graphc.backends.cpu.mathlib: accuracy over the whole domain, special values, vectorisation.

Each emitter is JIT-compiled into a loop `void f(T* in, T* out, i64 n)` (a tiny llvmlite JIT
kept here, independent of graphc.backends.cpu.llvm), run over a sweep of evenly spaced bit
patterns (every binade of the format, nans and infs included) plus special values, and
compared with numpy: float32 against float64 references, float64 against long double (or
mpmath where numpy has no long-double function). Errors are in ulps of the rounded reference.
"""

from __future__ import annotations

import ctypes
import functools
import math
import re

import numpy as np
import pytest

llvmlite = pytest.importorskip("llvmlite")
from llvmlite import binding as llvm  # noqa: E402
from llvmlite import ir  # noqa: E402
from scipy import special  # noqa: E402

from graphc.backends.cpu import mathlib  # noqa: E402

DTYPES = ("float32", "float64")
FUNCTIONS = ("exp", "log", "log1p", "tanh", "sigmoid", "erf", "sin", "cos", "gelu",
             "gelu_tanh", "sqrt", "rsqrt")

# Max ulp error allowed over the sweep (sin/cos: within mathlib.TRIG_ACCURATE_RANGE).
# float64 references for erf/gelu are scipy's float64 functions (about 1 ulp themselves).
BOUNDS = {
    "float32": {"exp": 1, "log": 1, "log1p": 2, "tanh": 2, "sigmoid": 3, "erf": 3, "sin": 3,
                "cos": 3, "gelu": 4, "gelu_tanh": 32, "sqrt": 0.5, "rsqrt": 1.5},
    "float64": {"exp": 1, "log": 1, "log1p": 2, "tanh": 2, "sigmoid": 2, "erf": 3, "sin": 2,
                "cos": 2, "gelu": 4, "gelu_tanh": 32, "sqrt": 0.5, "rsqrt": 1.5},
}

# gelu tanh form for x < -5 (normal results): max relative error (argument rounding, ~|y| eps).
GELU_TANH_TAIL_REL = {"float32": 2e-5, "float64": 1e-13}


# ---- a tiny JIT (kept local so these tests do not depend on backends/cpu/llvm.py) ------------
def _target_machine(cpu: str | None = None, features: str | None = None):
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    cpu = llvm.get_host_cpu_name() if cpu is None else cpu
    if features is None:
        features = llvm.get_host_cpu_features().flatten()
    # One target machine per engine: an engine owns the machine it is given.
    return target.create_target_machine(cpu=cpu, features=features, opt=3, codemodel="jitdefault")


def _loop_ir(fn_name: str, dtype: str) -> str:
    """IR text of `void kernel(T* noalias in, T* noalias out, i64 n)` applying fn elementwise."""
    def body(b, x):
        if fn_name == "gelu_tanh":
            return mathlib.emit(b, "gelu", [x], {"approximate": "tanh"})
        return mathlib.emit(b, fn_name, [x])

    return _elementwise_loop_ir(f"mathlib_{fn_name}_{dtype}", dtype, body)


def _elementwise_loop_ir(name: str, dtype: str, body) -> str:
    """IR text of `void kernel(T* noalias in, T* noalias out, i64 n)`: out[i] = body(b, x[i])
    (`body` emits its instructions with the IRBuilder b and returns the value stored)."""
    fty = ir.FloatType() if dtype == "float32" else ir.DoubleType()
    i64 = ir.IntType(64)
    ptr = ir.PointerType()
    module = ir.Module(name=name)
    module.triple = llvm.get_process_triple()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, i64]), "kernel")
    for arg in fn.args[:2]:
        arg.add_attribute("noalias")
    src, dst, n = fn.args
    entry, loop, done = (fn.append_basic_block(s) for s in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", n, ir.Constant(i64, 0)), loop, done)
    b.position_at_end(loop)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    x = b.load(b.gep(src, [i], source_etype=fty), typ=fty)
    y = body(b, x)
    b.store(y, b.gep(dst, [i], source_etype=fty))
    nxt = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, n), loop, done)
    b.position_at_end(done)
    b.ret_void()
    return str(module)


def _optimised(ir_text: str, tm):
    mod = llvm.parse_assembly(ir_text)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


_ENGINES = []  # keep every engine (and its module) alive for the whole session


@functools.lru_cache(maxsize=None)
def _kernel(fn_name: str, dtype: str):
    return _runner(_loop_ir(fn_name, dtype), dtype)


def _runner(module_text: str, dtype: str):
    """`kernel(T* x, T* out, i64 n)` of an LLVM module, optimised, compiled and wrapped as
    x -> out (the engine kept alive for the process)."""
    tm = _target_machine()
    engine = llvm.create_mcjit_compiler(_optimised(module_text, tm), tm)
    engine.finalize_object()
    _ENGINES.append(engine)
    cfun = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
        engine.get_function_address("kernel"))

    def run(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=dtype)
        out = np.empty_like(x)
        cfun(x.ctypes.data, out.ctypes.data, x.size)
        return out

    return run


@functools.lru_cache(maxsize=None)
def _assembly(fn_name: str, dtype: str, cpu: str | None = None, features: str | None = None):
    tm = _target_machine(cpu, features)
    return tm.emit_assembly(_optimised(_loop_ir(fn_name, dtype), tm))


# ---- inputs and references -------------------------------------------------------------------
def _sweep(dtype: str) -> np.ndarray:
    """2^20 evenly spaced bit patterns over the whole format, both signs, nans and infs."""
    if dtype == "float32":
        bits = np.arange(0, 2**32, 2**12, dtype=np.uint64).astype(np.uint32)
        return bits.view(np.float32)
    bits = np.arange(0, 2**20, dtype=np.uint64) << np.uint64(44)
    bits |= np.uint64(0x5DEECE66D)  # low mantissa bits set too
    return bits.view(np.float64)


def _specials(dtype: str) -> np.ndarray:
    fi = np.finfo(dtype)
    tiny, den = fi.smallest_normal, fi.smallest_subnormal
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, den, -den, tiny - den, -(tiny - den), tiny,
            -tiny, fi.max, -fi.max, 1.0, -1.0, 0.5, -0.5, 2.0, 1e-30, -1e-30]
    return np.array(vals, dtype=dtype)


_K2 = 2.0 * math.sqrt(2.0 / math.pi)


def _reference(fn_name: str, x: np.ndarray) -> np.ndarray:
    """fn(x) in higher precision: float64 for float32 inputs, long double for float64."""
    hi = np.float64 if x.dtype == np.float32 else np.longdouble
    with np.errstate(all="ignore"):
        xh = x.astype(hi)
        if fn_name in ("exp", "log", "log1p", "tanh", "sin", "cos", "sqrt"):
            return getattr(np, fn_name)(xh)
        if fn_name == "rsqrt":
            return 1 / np.sqrt(xh)
        if fn_name == "sigmoid":
            e = np.exp(-np.abs(xh))
            return np.where(xh >= 0, 1 / (1 + e), e / (1 + e))
        if fn_name == "gelu_tanh":
            y = _K2 * (xh + 0.044715 * xh**3)
            return np.where(np.isneginf(xh), np.nan, xh / (1 + np.exp(-y)))
        # erf/gelu: scipy has float64 only (accurate to about an ulp).
        x64 = x.astype(np.float64)
        if fn_name == "erf":
            return special.erf(x64).astype(hi)
        if fn_name == "gelu":  # erfc form: no cancellation for x < 0 (same function)
            ref = np.where(np.isneginf(x64), np.nan,
                           0.5 * x64 * special.erfc(-x64 / math.sqrt(2.0))).astype(hi)
            if hi is np.longdouble:  # scipy's erfc loses ~x^2 ulp in the tail: mpmath there
                tail = np.flatnonzero((x64 < -1) & (x64 > -40))
                ref[tail] = _mp_gelu(x64[tail])
            return ref
    raise KeyError(fn_name)


def _mp_gelu(x: np.ndarray) -> np.ndarray:
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(40):
        return np.array([float(mpmath.mpf(v) / 2 * mpmath.erfc(-mpmath.mpf(v) / mpmath.sqrt(2)))
                         for v in x])


def _ulp_errors(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|y - ref| in ulps of ref rounded to y's type (the spacing below, at the top binade)."""
    dtype = y.dtype
    with np.errstate(all="ignore"):
        ref_t = ref.astype(dtype)
        spacing = np.spacing(np.abs(ref_t))
        top = np.isinf(spacing)
        spacing[top] = np.spacing(np.nextafter(np.abs(ref_t[top]), dtype.type(0)))
        err = np.abs(y.astype(ref.dtype) - ref) / spacing.astype(ref.dtype)
    return err.astype(np.float64)


def _check_nonfinite(x, y, ref_t, fn_name):
    bad_nan = np.isnan(y) != np.isnan(ref_t)
    assert not bad_nan.any(), (f"{fn_name}: nan mismatch at x={x[bad_nan][:5]}: "
                               f"got {y[bad_nan][:5]}, expected {ref_t[bad_nan][:5]}")
    inf_ref = np.isinf(ref_t)
    bad_inf = (np.isinf(y) != inf_ref) | (inf_ref & (y != ref_t))
    assert not bad_inf.any(), (f"{fn_name}: inf mismatch at x={x[bad_inf][:5]}: "
                               f"got {y[bad_inf][:5]}, expected {ref_t[bad_inf][:5]}")


def _in_accurate_range(fn_name: str, x: np.ndarray) -> np.ndarray:
    if fn_name in ("sin", "cos"):
        return np.abs(x) <= mathlib.TRIG_ACCURATE_RANGE[x.dtype.name]
    if fn_name == "gelu_tanh":  # the far negative tail is checked by relative error
        return ~(x < -5)
    return np.ones(x.shape, dtype=bool)


def max_ulp(fn_name: str, dtype: str, x: np.ndarray | None = None) -> float:
    """The max ulp error of the emitted fn over x (default: the sweep), finite results only."""
    x = _sweep(dtype) if x is None else x
    y = _kernel(fn_name, dtype)(x)
    ref = _reference(fn_name, x)
    with np.errstate(all="ignore"):
        ref_t = ref.astype(dtype)
    keep = np.isfinite(y) & np.isfinite(ref_t) & _in_accurate_range(fn_name, x)
    return float(_ulp_errors(y[keep], ref[keep]).max())


# ---- tests -----------------------------------------------------------------------------------
def test_supported_names_are_registry_scalar_ops():
    import graphc  # noqa: F401  (registers every op)
    from graphc.ops import registry

    scalars = {op.scalar for op in registry.REGISTRY.values() if op.scalar}
    assert mathlib.SUPPORTED <= scalars, mathlib.SUPPORTED - scalars
    for name in ("exp", "log", "tanh", "sigmoid", "erf", "sin", "cos", "gelu", "rsqrt", "sqrt"):
        assert name in mathlib.SUPPORTED


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn_name", FUNCTIONS)
def test_sweep_within_bound(fn_name, dtype):
    x = _sweep(dtype)
    y = _kernel(fn_name, dtype)(x)
    ref = _reference(fn_name, x)
    with np.errstate(all="ignore"):
        ref_t = ref.astype(dtype)
    ranged = _in_accurate_range(fn_name, x)
    _check_nonfinite(x[ranged], y[ranged], ref_t[ranged], fn_name)
    keep = np.isfinite(y) & np.isfinite(ref_t) & ranged
    err = _ulp_errors(y[keep], ref[keep])
    worst = int(np.argmax(err))
    assert err[worst] <= BOUNDS[dtype][fn_name], (
        f"{fn_name} {dtype}: {err[worst]:.2f} ulp at x={x[keep][worst]!r} "
        f"(got {y[keep][worst]!r}, expected {ref[keep][worst]!r})")
    if fn_name in ("sin", "cos"):  # beyond the accurate range: finite and within [-1, 1]
        far = ~ranged & np.isfinite(x)
        assert far.any() and np.all(np.abs(y[far]) <= 1)
    if fn_name == "gelu_tanh":  # x < -5: the rounding of the tanh argument (as in PyTorch)
        tail = (x < -5) & (np.abs(ref_t) >= np.finfo(dtype).smallest_normal)
        rel = np.abs((y[tail] - ref[tail]) / ref[tail]).astype(np.float64)
        assert tail.sum() > 100 and rel.max() <= GELU_TANH_TAIL_REL[dtype], rel.max()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn_name", FUNCTIONS)
def test_special_values_match_numpy(fn_name, dtype):
    x = _specials(dtype)
    y = _kernel(fn_name, dtype)(x)
    with np.errstate(all="ignore"):
        ref_t = _reference(fn_name, x).astype(dtype)
    _check_nonfinite(x, y, ref_t, fn_name)
    exact = np.isinf(ref_t) | (ref_t == 0) | ~np.isfinite(x) | (x == 0)
    exact &= ~np.isnan(ref_t)
    got, want = y[exact], ref_t[exact]
    assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want)), (
        f"{fn_name} {dtype} at {x[exact]}: got {got}, expected {want}")
    rest = ~exact & ~np.isnan(ref_t) & _in_accurate_range(fn_name, x)
    assert np.all(np.abs(y[~_in_accurate_range(fn_name, x) & np.isfinite(x)]) <= 1)
    err = _ulp_errors(y[rest], _reference(fn_name, x[rest]))
    assert np.all(err <= BOUNDS[dtype][fn_name]), (fn_name, x[rest], y[rest], err)


@pytest.mark.parametrize("dtype", DTYPES)
def test_exp_log_around_overflow_underflow_and_denormals(dtype):
    fi = np.finfo(dtype)
    lo = math.log(float(fi.smallest_subnormal)) - 1
    hi = math.log(float(fi.max)) + 1
    x = np.linspace(lo, hi, 200_001).astype(dtype)
    assert max_ulp("exp", dtype, x) <= BOUNDS[dtype]["exp"]
    sub = (np.arange(1, 2**16, dtype=np.uint64) * np.uint64(7919)).astype(
        np.uint32 if dtype == "float32" else np.uint64).view(dtype)
    sub = sub[(sub > 0) & (sub < fi.smallest_normal)]
    assert sub.size > 1000
    assert max_ulp("log", dtype, sub) <= BOUNDS[dtype]["log"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn_name", ("sin", "cos"))
def test_trig_dense_near_multiples_of_pi(fn_name, dtype):
    q = np.arange(-2000, 2001, dtype=np.float64)
    x = np.concatenate([q * (np.pi / 2), q * (np.pi / 2) * 37.0, np.linspace(-10, 10, 100_001)])
    x = x.astype(dtype)
    x = np.concatenate([x, np.nextafter(x, np.inf), np.nextafter(x, -np.inf)])
    assert max_ulp(fn_name, dtype, x) <= BOUNDS[dtype][fn_name]


def test_float32_erf_dense_where_it_is_one_polynomial():
    """float32 erf on [1, 4.2] (1 - Q(a - 2.5), no exp: mathlib._ERF_MID_F32): every 8th float,
    both signs, within 1.1 ulp of scipy's float64 erf, and exactly +-1 from 3.92 on."""
    lo, hi = np.float32(1.0).view(np.int32), np.float32(4.2).view(np.int32)
    x = np.arange(lo, hi, 8, dtype=np.int32).view(np.float32)
    x = np.concatenate([x, -x])
    assert max_ulp("erf", "float32", x) <= 1.1
    far = np.array([3.92, 4.0, 10.0, 1e30], np.float32)
    np.testing.assert_array_equal(_kernel("erf", "float32")(np.concatenate([far, -far])),
                                  np.array([1] * 4 + [-1] * 4, np.float32))


def _fmuladds_after_o3(dtype: str, *extra: str) -> int:
    """llvm.fmuladd calls left by O3 in `T f(T x)` returning gelu(x) plus, per `extra`,
    exp(x * x * -0.5) ("exp") or erf(x * 0.70710677) ("erf"): the gelu derivative's terms,
    as graphc's scalar mul renders them (unflagged fmuls)."""
    fty = ir.FloatType() if dtype == "float32" else ir.DoubleType()
    module = ir.Module(name="gelu_cse")
    module.triple = llvm.get_process_triple()
    fn = ir.Function(module, ir.FunctionType(fty, [fty]), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    x = fn.args[0]
    y = mathlib.emit(b, "gelu", [x])
    if "exp" in extra:
        y = b.fadd(y, mathlib.emit(b, "exp", [b.fmul(b.fmul(x, x), ir.Constant(fty, -0.5))]))
    if "erf" in extra:
        y = b.fadd(y, mathlib.emit(b, "erf", [b.fmul(x, ir.Constant(fty, math.sqrt(0.5)))]))
    b.ret(y)
    return len(re.findall(r"call (float|double) @llvm\.fmuladd",
                          str(_optimised(str(module), _target_machine()))))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_shares_its_derivative_terms(dtype):
    """gelu's exp(-x^2/2) is the same instructions as the derivative's exp, and erf(x *
    0.70710677) after gelu(x) in the same block takes gelu's erf (mathlib._GELU_ERF), so
    after CSE they cost nothing more (before, float32 erf's own degree-15 polynomial on [1,
    3.92] was 15 fmuladds extra)."""
    alone = _fmuladds_after_o3(dtype)
    assert _fmuladds_after_o3(dtype, "exp") == alone
    assert _fmuladds_after_o3(dtype, "exp", "erf") == alone


def _erf_after_gelu_kernel(dtype: str):
    """`void f(T* x, T* out, i64 n)`: out = erf(x * 0.70710677) with gelu(x) emitted first in
    the same block (its value unused), run over x."""
    fty = ir.FloatType() if dtype == "float32" else ir.DoubleType()

    def body(b, x):
        mathlib.emit(b, "gelu", [x])
        return mathlib.emit(b, "erf", [b.fmul(x, ir.Constant(fty, math.sqrt(0.5)))])

    return _runner(_elementwise_loop_ir("erf_after_gelu", dtype, body), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_erf_after_gelu_within_erfs_bound(dtype):
    """erf(x * 0.70710677) taking gelu(x)'s erf: within erf's sweep bound of erf of the rounded
    product (the sweep, specials, and densely on |x| in [1, 8] where it is 1 - gelu's erfc
    tail), and the same specials as numpy (nan, +-1 at +-inf, +-0)."""
    run = _erf_after_gelu_kernel(dtype)
    dense = np.linspace(1.0, 8.0, 200_001).astype(dtype)
    x = np.concatenate([_sweep(dtype), _specials(dtype), dense, -dense])
    with np.errstate(all="ignore"):
        scaled = x * np.asarray(math.sqrt(0.5), dtype)
    y = run(x)
    ref = _reference("erf", scaled)
    finite = np.isfinite(scaled)
    err = _ulp_errors(y[finite], ref[finite])
    worst = int(err.argmax())
    assert err[worst] <= BOUNDS[dtype]["erf"], (
        f"erf after gelu {dtype}: {err[worst]:.2f} ulp at x={x[finite][worst]!r}")
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype)
    got = run(special)
    assert np.isnan(got[0]) and list(got[1:3]) == [1, -1]
    assert got[3] == 0 and not np.signbit(got[3]) and got[4] == 0 and np.signbit(got[4])


@pytest.mark.parametrize("dtype", DTYPES)
def test_exp_flushed_is_exp_where_kept_and_zero_below(dtype):
    """exp_flushed (attention's softmax): exp's very bits from the flush bound up to where
    exp's clamp starts (the sweep and a dense range), +0 below the bound, -inf and
    nan as exp gives them."""
    run = _runner(_elementwise_loop_ir(f"exp_flushed_{dtype}", dtype, mathlib.exp_flushed),
                  dtype)
    bound = mathlib._EXP_FLUSH_BELOW[dtype == "float64"]
    top = 88.0 if dtype == "float32" else 709.0
    sweep = _sweep(dtype)
    x = np.concatenate([sweep[np.isfinite(sweep) & (sweep >= bound) & (sweep <= top)],
                        np.linspace(bound, 1.0, 400_001).astype(dtype)])
    np.testing.assert_array_equal(run(x).view(f"u{x.itemsize}"),
                                  _kernel("exp", dtype)(x).view(f"u{x.itemsize}"))
    below = np.array([np.nextafter(bound, -np.inf, dtype=dtype), bound - 1, -1e4, -np.inf],
                     dtype)
    got = run(below)
    assert (got == 0).all() and not np.signbit(got).any(), got
    assert np.isnan(run(np.array([np.nan], dtype)))[0]


def test_float64_erf_and_gelu_against_mpmath():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    x = np.concatenate([np.linspace(-6.5, 6.5, 1301), np.linspace(-40, -6.5, 200)])
    y_erf = _kernel("erf", "float64")(x)
    y_gelu = _kernel("gelu", "float64")(x)
    ref_erf = np.array([float(mpmath.erf(mpmath.mpf(v))) for v in x])
    ref_gelu = np.array([float(mpmath.mpf(v) / 2 * mpmath.erfc(-mpmath.mpf(v) / mpmath.sqrt(2)))
                         for v in x])
    assert _ulp_errors(y_erf, ref_erf).max() <= 2
    assert _ulp_errors(y_gelu, ref_gelu).max() <= 3


def test_vector_types_and_emit_errors():
    for lanes, fty in ((8, ir.FloatType()), (4, ir.DoubleType()), (16, ir.FloatType())):
        vty = ir.VectorType(fty, lanes)
        module = ir.Module()
        fn = ir.Function(module, ir.FunctionType(vty, [vty]), "f")
        b = ir.IRBuilder(fn.append_basic_block())
        acc = fn.args[0]
        for name in sorted(mathlib.SUPPORTED):
            acc = mathlib.emit(b, name, [acc])
        b.ret(acc)
        llvm.parse_assembly(str(module)).verify()
    b = ir.IRBuilder(ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), []), "g")
                     .append_basic_block())
    with pytest.raises(KeyError, match="no emitter"):
        mathlib.emit(b, "frobnicate", [ir.Constant(ir.FloatType(), 1.0)])
    with pytest.raises(TypeError, match="float or double"):
        mathlib.emit(b, "exp", [ir.Constant(ir.IntType(32), 1)])
    with pytest.raises(ValueError, match="approximate"):
        mathlib.emit(b, "gelu", [ir.Constant(ir.FloatType(), 1.0)], {"approximate": "x"})


def _has_calls(asm: str) -> list[str]:
    """call instructions, and jumps to symbols (tail calls), in the assembly."""
    return re.findall(r"^\s*(?:call\w*\s.*|jmp\w*\s+[A-Za-z_].*)$", asm, flags=re.M)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn_name", FUNCTIONS)
def test_loop_vectorises_without_calls_on_host(fn_name, dtype):
    asm = _assembly(fn_name, dtype)
    assert not _has_calls(asm), _has_calls(asm)
    features = llvm.get_host_cpu_features()
    if features.get("avx512f"):  # 512-bit, or 256-bit where LLVM's tuning prefers it (Intel)
        assert "zmm" in asm or "ymm" in asm
    elif features.get("avx2"):
        assert "ymm" in asm
    else:
        assert "xmm" in asm and re.search(r"\b\w+p[sd]\b", asm)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn_name", ("exp", "log", "tanh", "sigmoid", "erf", "sin", "gelu"))
def test_loop_uses_zmm_on_avx512(fn_name, dtype):
    if not llvm.get_host_cpu_features().get("avx512f"):
        pytest.skip(f"host CPU {llvm.get_host_cpu_name()} has no AVX-512; "
                    "test_loop_uses_zmm_for_znver4 checks the code for one")
    asm = _assembly(fn_name, dtype)
    if "zmm" not in asm and "ymm" in asm:
        pytest.skip(f"LLVM's tuning for {llvm.get_host_cpu_name()} prefers 256-bit vectors "
                    "(Intel's AVX-512 cores); test_loop_uses_zmm_for_znver4 checks 512-bit code")
    assert "zmm" in asm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn_name", ("exp", "log", "erf", "sin", "gelu"))
def test_loop_uses_zmm_for_znver4(fn_name, dtype):
    """Compiled (not run) for Zen 4, the AVX-512 CPU the project benchmarks on."""
    asm = _assembly(fn_name, dtype, "znver4", "")
    assert "zmm" in asm and not _has_calls(asm)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn_name", ("exp", "gelu"))
def test_nan_flows_through_without_compares(fn_name, dtype):
    """exp and gelu test no lane for nan (`fcmp uno`): a nan reaches the result through the
    arithmetic (test_special_values_match_numpy checks that it does), so those compares and
    their selects would be instructions for nothing in every vector loop."""
    ir_text = _loop_ir(fn_name, dtype)
    assert "fcmp uno" not in ir_text
    assert "fcmp uno" in _loop_ir("erf", dtype)  # the check can fail: erf still tests
