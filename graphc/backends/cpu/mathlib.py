"""Vectorisable math functions emitted as LLVM IR: exp, log, tanh, sigmoid, erf, sin, cos, ...

Each function here emits straight-line IR with an `llvmlite.ir.IRBuilder` for a float or
double value, scalar or vector (`<N x float>`): no calls to libm and no branches, so a loop
that uses them vectorises (every branch of a piecewise approximation is computed and the lanes
pick theirs with `select`). The only intrinsics used are ones every x86-64 target lowers to
plain instructions: `llvm.fmuladd` (an FMA where the target has one, else mul + add),
`llvm.fabs`, `llvm.copysign` and `llvm.sqrt`. Rounding to an integer uses the add-and-subtract
of 1.5 * 2^p trick, never `fptosi` on a value that could be nan or out of range, so no
instruction ever produces poison.

Invariants:
- inf, -inf, nan, +-0 and denormal inputs give what numpy gives (`np.exp`, `np.log`, ...,
  `scipy.special.erf`; gelu as the registry's numpy kernel computes it in float64).
- Fast-math flags: only `contract` (FMA formation). Never `nnan`/`ninf`/`nsz`/`reassoc`:
  the special-value handling and the Cody-Waite / rounding tricks rely on IEEE semantics.
- Accuracy (max error over a dense sweep of the whole domain, measured in
  tests/test_cpu_mathlib.py against float64 / long double references, on a target with FMA):
  see `ACCURACY_ULP`. Without hardware FMA the results stay finite and close but a few
  functions (erf, gelu) lose their exact x*x splitting and can be a few ulp worse.
- sin and cos: Cody-Waite reduction by pi/2 with constants split so each product q*P_i is
  exact while |q| < 2^16 (float) or 2^27 (double); they are accurate for
  |x| <= `TRIG_ACCURATE_RANGE` (about 1.03e5 for float, 2.1e8 for double). Beyond that the
  result is still finite and within [-1, 1] but is not sin(x) (no Payne-Hanek reduction);
  inf and nan give nan.

Entry point: `emit(builder, name, args, attrs=None)` with the registry's scalar op names
(`SUPPORTED`). Outside it, for kernels that know their arguments' range: `exp_flushed` (exp
with results under 2^-125.5 flushed to +0; the attention kernels' softmax).

Example:
    >>> from llvmlite import ir
    >>> f32x8 = ir.VectorType(ir.FloatType(), 8)
    >>> module = ir.Module()
    >>> fn = ir.Function(module, ir.FunctionType(f32x8, [f32x8]), "vexp")
    >>> builder = ir.IRBuilder(fn.append_basic_block())
    >>> _ = builder.ret(emit(builder, "exp", [fn.args[0]]))
    >>> sorted({f.name.split(".")[1] for f in module.functions if f.is_declaration})
    ['fmuladd']
"""

from __future__ import annotations

import math
import weakref

from llvmlite import ir

__all__ = ["SUPPORTED", "ACCURACY_ULP", "TRIG_ACCURATE_RANGE", "emit", "exp", "exp_flushed", "log",
           "log1p", "tanh", "sigmoid", "erf", "gelu", "gelu_tanh", "sin", "cos", "sqrt", "rsqrt",
           "atan"]

_FLAGS = ("contract",)


# ---- IR helpers ---------------------------------------------------------------------------------
class _Emitter:
    """Builder plus the value's type facts: float width, lane count, the same-width int type."""

    def __init__(self, builder: ir.IRBuilder, ty: ir.Type):
        self.b = builder
        self.ty = ty
        self.lanes = ty.count if isinstance(ty, ir.VectorType) else None
        scalar = ty.element if self.lanes else ty
        if isinstance(scalar, ir.DoubleType):
            self.f64, self.bits, self.mant, self.bias, self.suffix = True, 64, 52, 1023, "f64"
        elif isinstance(scalar, ir.FloatType):
            self.f64, self.bits, self.mant, self.bias, self.suffix = False, 32, 23, 127, "f32"
        else:
            raise TypeError(f"mathlib: expected float or double (or a vector of them), got {ty}")
        self.scalar = scalar
        self.iscalar = ir.IntType(self.bits)
        self.ity = ir.VectorType(self.iscalar, self.lanes) if self.lanes else self.iscalar
        if self.lanes:
            self.suffix = f"v{self.lanes}{self.suffix}"

    # constants (splatted for vectors)
    def c(self, value: float) -> ir.Constant:
        if self.lanes:
            return ir.Constant(self.ty, [ir.Constant(self.scalar, value)] * self.lanes)
        return ir.Constant(self.ty, value)

    def ci(self, value: int) -> ir.Constant:
        if self.lanes:
            return ir.Constant(self.ity, [ir.Constant(self.iscalar, value)] * self.lanes)
        return ir.Constant(self.ity, value)

    # float arithmetic (contract only)
    def add(self, a, b):
        return self.b.fadd(a, b, flags=_FLAGS)

    def sub(self, a, b):
        return self.b.fsub(a, b, flags=_FLAGS)

    def mul(self, a, b):
        return self.b.fmul(a, b, flags=_FLAGS)

    def div(self, a, b):
        return self.b.fdiv(a, b, flags=_FLAGS)

    def _intrinsic(self, name: str, nargs: int) -> ir.Function:
        module = self.b.module
        full = f"{name}.{self.suffix}"
        fn = module.globals.get(full)
        if fn is None:
            fn = ir.Function(module, ir.FunctionType(self.ty, [self.ty] * nargs), full)
        return fn

    def fma(self, a, b, c):
        """a*b + c, fused where the target has FMA (llvm.fmuladd never becomes a libcall)."""
        return self.b.call(self._intrinsic("llvm.fmuladd", 3), [a, b, c])

    def fabs(self, a):
        return self.b.call(self._intrinsic("llvm.fabs", 1), [a])

    def copysign(self, mag, sign):
        return self.b.call(self._intrinsic("llvm.copysign", 2), [mag, sign])

    def sqrt(self, a):
        return self.b.call(self._intrinsic("llvm.sqrt", 1), [a])

    def poly(self, x, coeffs):
        """Horner evaluation, highest degree first; coeffs are floats or IR values."""
        coeffs = [self.c(k) if isinstance(k, (int, float)) else k for k in coeffs]
        acc = coeffs[0]
        for k in coeffs[1:]:
            acc = self.fma(acc, x, k)
        return acc

    # comparisons and selection
    def lt(self, a, b):
        return self.b.fcmp_ordered("<", a, b)

    def gt(self, a, b):
        return self.b.fcmp_ordered(">", a, b)

    def eq(self, a, b):
        return self.b.fcmp_ordered("==", a, b)

    def isnan(self, a):
        return self.b.fcmp_unordered("uno", a, a)

    def sel(self, cond, a, b):
        return self.b.select(cond, a, b)

    def min_c(self, a, bound: float):
        """min(a, bound) keeping nan (a select, not llvm.minnum, which drops nans)."""
        return self.sel(self.gt(a, self.c(bound)), self.c(bound), a)

    def max_c(self, a, bound: float):
        return self.sel(self.lt(a, self.c(bound)), self.c(bound), a)

    # bit manipulation
    def as_int(self, a):
        return self.b.bitcast(a, self.ity)

    def as_float(self, a):
        return self.b.bitcast(a, self.ty)

    def round_magic(self, y):
        """(rint(y) as float, rint(y) as int) for |y| < 2^(p-2), via y + 1.5*2^p - 1.5*2^p.

        No fptosi: the integer is the low bits of the sum, well defined for any input.
        """
        magic = 1.5 * 2.0 ** self.mant
        t = self.add(y, self.c(magic))
        kf = self.sub(t, self.c(magic))
        ki = self.b.sub(self.as_int(t), self.as_int(self.c(magic)))
        return kf, ki

    def pow2i(self, k):
        """2^k as a float for an int k in the normal exponent range."""
        return self.as_float(self.b.shl(self.b.add(k, self.ci(self.bias)), self.ci(self.mant)))


def _nan():
    return float("nan")


_INF = float("inf")


# ---- exp ------------------------------------------------------------------------------------
# Clamp bounds: beyond them exp is inf / 0 in the format (exp(89) > FLT_MAX, exp(-104) < 2^-150
# rounds to 0), and the clamped k keeps 2^(k/2) normal so the scaling below is exact.
_EXP_CLAMP = {False: (-104.0, 89.0), True: (-746.0, 710.0)}
# ln 2 split so k * hi is exact (k has <= 11 bits): Cephes for float, fdlibm for double.
_LN2_SPLIT = {False: (0.693359375, -2.12194440e-4),
              True: (6.93147180369123816490e-01, 1.90821492927058770002e-10)}
# exp(r) on |r| <= ln2/2 (+ the reduction's slack), highest degree first. float32: degree 6,
# 1 + r + r^2 Q(r) with Q minimax for the relative error, float32 coefficients fitted lowest
# order first (0.05 half-ulps; the degree-7 Taylor polynomial it replaced was 0.03, one FMA
# more in every exp). float64: Taylor, 1/n! to degree 13 (< 0.1 ulp).
_EXP_POLY = {False: (0.0013820435851812363, 0.008368680253624916, 0.04166826978325844,
                     0.1666652113199234, 0.4999999403953552, 1.0, 1.0),
             True: tuple(1.0 / math.factorial(n) for n in range(13, -1, -1))}


def _exp_core(m: _Emitter, x):
    """exp(x) (nan for a nan: the compares are false for it, so it reaches the polynomial);
    overflows to inf and underflows to 0/denormals correctly.

    Lanes below the clamp's low bound (where the result is +0) compute on x = 0 and select
    +0: left to underflow through the 2^k scaling, each such lane costs a floating-point
    assist on Intel cores (~150 cycles), and softmax rows with masked (-inf) scores are full
    of them."""
    lo, hi = _EXP_CLAMP[m.f64]
    zero = m.lt(x, m.c(lo))
    xs = m.min_c(m.sel(zero, m.c(0.0), x), hi)
    kf, k = m.round_magic(m.mul(xs, m.c(1.0 / math.log(2.0))))
    c1, c2 = _LN2_SPLIT[m.f64]
    r = m.fma(kf, m.c(-c1), xs)
    r = m.fma(kf, m.c(-c2), r)
    p = m.poly(r, _EXP_POLY[m.f64])
    # Scale by 2^k as 2^(k>>1) * 2^(k - k>>1): both factors are normal for every clamped k, and
    # the second product rounds once, into the denormals when the result is that small.
    k1 = m.b.ashr(k, m.ci(1))
    k2 = m.b.sub(k, k1)
    return m.sel(zero, m.c(0.0), m.mul(m.mul(p, m.pow2i(k1)), m.pow2i(k2)))


def exp(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """exp(x); a nan propagates through the arithmetic (no compare and select: every lane's
    instructions are defined for a nan, and the polynomial of a nan is nan whatever 2^k's
    bits are)."""
    return _exp_core(_Emitter(builder, x.type), x)


# Below these exp is under 2^-125.5 (float32) / 2^-1021 (float64): exp_flushed returns +0 there,
# and 2^k stays normal for every lane it keeps.
_EXP_FLUSH_BELOW = {False: -87.0, True: -708.0}


def exp_flushed(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """exp(x) for x <= 88 (float64: 709), +0 where x < -87 (float64: -708) and the result
    would be under 2^-125.5: for softmax's exp(s - max) and exp(s - logsumexp), whose
    arguments are at most ~0 and whose results that small are nothing against a row's sum
    (at least 1) but, left to exp's scaling into the denormals, cost it a second product.

    exp's bits wherever it keeps x (the same reduction and polynomial; p * 2^k rounds once, as
    exp's p * 2^(k>>1) * 2^(k - k>>1) does for a normal result), in 4 fewer instructions: no
    overflow clamp, one 2^k. A nan propagates (the compare is false for it)."""
    m = _Emitter(builder, x.type)
    flushed = m.lt(x, m.c(_EXP_FLUSH_BELOW[m.f64]))
    xs = m.sel(flushed, m.c(_EXP_FLUSH_BELOW[m.f64]), x)
    kf, k = m.round_magic(m.mul(xs, m.c(1.0 / math.log(2.0))))
    c1, c2 = _LN2_SPLIT[m.f64]
    r = m.fma(kf, m.c(-c1), xs)
    r = m.fma(kf, m.c(-c2), r)
    p = m.poly(r, _EXP_POLY[m.f64])
    return m.sel(flushed, m.c(0.0), m.mul(p, m.pow2i(k)))


# ---- log ------------------------------------------------------------------------------------
# fdlibm / musl: log(1+f) = f - f^2/2 + s*(f^2/2 + R(s^2)), s = f/(2+f).
_LOG_LG = {
    False: (0xaaaaaa / 2**24, 0xccce13 / 2**25, 0x91e9ee / 2**25, 0xf89e26 / 2**26),
    True: (6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01,
           2.222219843214978396e-01, 1.818357216161805012e-01, 1.531383769920937332e-01,
           1.479819860511658591e-01),
}
_LN2_HILO = {False: (6.9313812256e-01, 9.0580006145e-06),
             True: (6.93147180369123816490e-01, 1.90821492927058770002e-10)}
_ONE_BITS = {False: 0x3F800000, True: 0x3FF0000000000000}
_SQRT_HALF_BITS = {False: 0x3F3504F3, True: 0x3FE6A09E667F3BCD}


def _log_finite_positive(m: _Emitter, x):
    """log(x) for finite x > 0 (denormals included)."""
    smallest_normal = 2.0 ** (1 - m.bias)
    shift = 54 if m.f64 else 25
    tiny = m.lt(x, m.c(smallest_normal))
    xs = m.sel(tiny, m.mul(x, m.c(2.0 ** shift)), x)
    kadj = m.b.select(tiny, m.ci(-shift), m.ci(0))
    # Move the mantissa into [sqrt(1/2), sqrt(2)) and take the exponent to match.
    ix = m.b.add(m.as_int(xs), m.ci(_ONE_BITS[m.f64] - _SQRT_HALF_BITS[m.f64]))
    k = m.b.add(m.b.sub(m.b.ashr(ix, m.ci(m.mant)), m.ci(m.bias)), kadj)
    mant_mask = (1 << m.mant) - 1
    ix = m.b.add(m.b.and_(ix, m.ci(mant_mask)), m.ci(_SQRT_HALF_BITS[m.f64]))
    f = m.sub(m.as_float(ix), m.c(1.0))
    dk = m.b.sitofp(k, m.ty)
    s = m.div(f, m.add(m.c(2.0), f))
    z = m.mul(s, s)
    w = m.mul(z, z)
    lg = _LOG_LG[m.f64]
    odd = list(reversed(lg[0::2]))   # Lg1, Lg3, Lg5, Lg7 in w
    even = list(reversed(lg[1::2]))  # Lg2, Lg4, Lg6 in w
    t1 = m.mul(w, m.poly(w, even))
    t2 = m.mul(z, m.poly(w, odd))
    r = m.add(t2, t1)
    hfsq = m.mul(m.mul(m.c(0.5), f), f)
    ln2_hi, ln2_lo = _LN2_HILO[m.f64]
    acc = m.mul(s, m.add(hfsq, r))
    acc = m.add(acc, m.mul(dk, m.c(ln2_lo)))
    acc = m.sub(acc, hfsq)
    acc = m.add(acc, f)
    return m.add(acc, m.mul(dk, m.c(ln2_hi)))


def _log_specials(m: _Emitter, x, y):
    """log's values at 0 (-inf), inf (inf), negatives (nan) and nan (nan) over y."""
    y = m.sel(m.eq(x, m.c(_INF)), m.c(_INF), y)
    y = m.sel(m.eq(x, m.c(0.0)), m.c(-_INF), y)
    y = m.sel(m.lt(x, m.c(0.0)), m.c(_nan()), y)
    return m.sel(m.isnan(x), x, y)


def _finite_positive_or_one(m: _Emitter, x):
    ok = m.b.and_(m.gt(x, m.c(0.0)), m.lt(x, m.c(_INF)))
    return m.sel(ok, x, m.c(1.0))


def log(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    m = _Emitter(builder, x.type)
    y = _log_finite_positive(m, _finite_positive_or_one(m, x))
    return _log_specials(m, x, y)


def log1p(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """log(1+x) = log(u) - ((u-1)-x)/u with u = 1+x (the rounding of u corrected to first order)."""
    m = _Emitter(builder, x.type)
    u = m.add(m.c(1.0), x)
    us = _finite_positive_or_one(m, u)
    corr = m.div(m.sub(m.sub(us, m.c(1.0)), m.sel(m.eq(us, u), x, m.c(0.0))), us)
    y = m.sub(_log_finite_positive(m, us), corr)
    y = m.sel(m.eq(u, m.c(1.0)), x, y)  # |x| below half an ulp of 1: log1p(x) = x (keeps -0)
    return _log_specials(m, u, y)


# ---- tanh and sigmoid -----------------------------------------------------------------------
# |x| < 0.625: tanh(x) = x + x*z*R(z), z = x^2 (Cephes: a polynomial for float, P/Q for double);
# above: 1 - 2/(exp(2|x|) + 1) with the sign of x, which saturates to 1 once exp overflows.
_TANH_P_F32 = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
               -3.33332819422e-1)
_TANH_P_F64 = (-9.64399179425052238628e-1, -9.92877231001918586564e1,
               -1.61468768441708447952e3)
_TANH_Q_F64 = (1.0, 1.12811678491632931402e2, 2.23548839060100448583e3,
               4.84406305325125486048e3)


def tanh(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    m = _Emitter(builder, x.type)
    nan = m.isnan(x)
    xs = m.sel(nan, m.c(0.0), x)
    a = m.fabs(xs)
    z = m.mul(xs, xs)
    if m.f64:
        ratio = m.div(m.poly(z, _TANH_P_F64), m.poly(z, _TANH_Q_F64))
    else:
        ratio = m.poly(z, _TANH_P_F32)
    small = m.fma(m.mul(xs, z), ratio, xs)
    e = _exp_core(m, m.add(a, a))
    large = m.copysign(m.sub(m.c(1.0), m.div(m.c(2.0), m.add(e, m.c(1.0)))), xs)
    y = m.sel(m.lt(a, m.c(0.625)), small, large)
    return m.sel(nan, x, m.copysign(y, xs))  # odd, and tanh(-0) = -0


def sigmoid(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """1/(1+e) for x >= 0 and e/(1+e) for x < 0 with e = exp(-|x|): never overflows."""
    m = _Emitter(builder, x.type)
    nan = m.isnan(x)
    xs = m.sel(nan, m.c(0.0), x)
    e = _exp_core(m, m.b.fneg(m.fabs(xs)))
    d = m.add(m.c(1.0), e)
    y = m.sel(m.lt(xs, m.c(0.0)), m.div(e, d), m.div(m.c(1.0), d))
    return m.sel(nan, x, y)


# ---- erf, erfc and gelu ---------------------------------------------------------------------
# |a| < 1: erf(a) = a * P(a^2). a >= 0.5 (float32, gelu's: a >= 0.75): erfc(a) = exp(-a^2) *
# u * G(u) with u = 1/a and G a polynomial in (u - centre) per range of u, the coefficients
# picked per lane by `select` (float32: one range, no select).
# Fitted (Chebyshev, mpmath at 50 digits) to well under an ulp, coefficients rounded to the type.
_ERF_SMALL_F32 = (
    -9.667044650996104e-06,
    0.00011265958892181516,
    -0.0008484080317430198,
    0.005221031606197357,
    -0.026865430176258087,
    0.11283782124519348,
    -0.37612637877464294,
    1.128379225730896,
)
# float32 (gelu's tail, from |x| = GELU_TAIL_FROM_F32: u <= 1.331): one range of u, degree 13
# in u - 0.7117, least squares for the relative error on u in [0.09, 1.3334], coefficients
# rounded to float32 lowest order first, the rest refitted after each: max 1.6 ulp for u *
# G(u) against scipy's erfcx as evaluated in float32 (the two ranges of degree 9 it replaced,
# split at u = 0.7 and serving u up to 2: 1.72), with no coefficient picked per lane (11
# selects fewer: the GPT's gelu epilogue is bound by its vector instructions).
_ERFC_TAIL_F32 = (  # (upper bound of u, centre, coefficients), by increasing u
    (1.3334, 0.7117000222206116, (
        0.031239334493875504, -0.02791582979261875, -0.02789164148271084, 0.041260648518800735,
        -0.019707102328538895, 0.012070107273757458, -0.004299212247133255,
        -0.016858000308275223, 0.04186123609542847, -0.058145809918642044,
        0.048596885055303574, 0.014254325069487095, -0.17037394642829895, 0.47468137741088867,
    )),
)
# float32 gelu: erf(x/sqrt2) for |x| < GELU_TAIL_FROM_F32 as x * (C0 + x^2 P(x^2)), C0 =
# sqrt(2/pi) held as hi + lo (hi rounded down, so the sum's low part is positive at x = 0 and
# erf(-0) = -0), P of degree 4 (least squares for the relative error on [0, 1.0625], float32
# coefficients fitted lowest order first): 0.83 ulp as evaluated. x^2 is the exp argument's
# own x * x. From there on (and for x <= -GELU_TAIL_FROM_F32, gelu's x/2 * erfc) the tail.
GELU_TAIL_FROM_F32 = 1.0625
_GELU_ERF_SMALL_F32_C0 = (0.7978845238685608, 3.693430628004535e-08)
_GELU_ERF_SMALL_F32 = (-1.4936426850908902e-05, 0.00022610467567574233, -0.002371974987909198,
                       0.019946442916989326, -0.13298070430755615)
_ERF_SMALL_F64 = (
    5.957176147748911e-11,
    -1.1372848856791674e-09,
    1.4659775274047436e-08,
    -1.6350312701054695e-07,
    1.6461000484121368e-06,
    -1.4925595266831182e-05,
    0.0001205533111164271,
    -0.000854832698083379,
    0.0052239776248180145,
    -0.026866170645076792,
    0.11283791670954879,
    -0.3761263890318375,
    1.1283791670955126,
)
_ERFC_TAIL_F64 = (  # (upper bound of u, centre, coefficients), by increasing u
    (0.2, 0.11800000000000001, (
        -6739.654003006614, 1807.5658888654502, 655.6512764446286, -514.1790798765918,
        66.34853886876598, 70.80577156669726, -38.61473082565145, -0.7827001912977717,
        8.98565943848971, -3.123270037947159, -1.238660661850142, 1.3895987005326857,
        -0.11666958330458999, -0.48554148381140666, 0.24444378709853318, 0.16914571410466298,
        -0.24956572297301688, -0.06392987540617387, 0.5603410088595999,
    )),
    (0.5, 0.35, (
        -24.281389049699325, 9.085527009653125, 3.359618558003053, -5.335354158564886,
        3.6955325681629487, -1.4103042347176573, -0.2512919221398216, 0.9069337813042173,
        -0.7891178725861039, 0.33757940581102625, 0.08008000586515135, -0.2779308819940065,
        0.24309647488028785, -0.07070954803582273, -0.10957283582690526, 0.18859503441044556,
        -0.10576403680337278, -0.1466439707899808, 0.5345896477470591,
    )),
    (1.0, 0.75, (
        -0.004979566847164364, 0.008511955575503476, -0.00915547159608212, 0.008131369780628775,
        -0.005205044014682195, 0.0003742892856856971, 0.005639680087307556,
        -0.011588248910783033, 0.015771747736036804, -0.016227454746723567, 0.011128915088945559,
        0.0005608110255211365, -0.018116937854317592, 0.03768872001146378, -0.050465735252150604,
        0.040293199742531254, 0.01934787262869018, -0.16908097778547482, 0.46817959203854037,
    )),
    (2.0, 1.5, (
        7.343789842831182e-07, -1.5469077369386098e-06, 2.1001508282365934e-06,
        -3.3825456726344564e-06, 5.125490500443794e-06, -5.6320422643848516e-06,
        1.4804377388763347e-06, 1.5647927875714964e-05, -6.387404410449392e-05,
        0.0001778161575761965, -0.0004147425322285611, 0.0008465768328512575,
        -0.0014927625233907005, 0.00206370318901489, -0.0011647369991920615,
        -0.005933200786440649, 0.033156950954030935, -0.11839802134553727, 0.35952293862040013,
    )),
)
# float32 erf for 1 <= a <= 3.92 as 1 - Q(a - 2.5): Q fits erfc there to ~2e-9 absolute
# (Chebyshev, degree 15; a - 2.5 is exact), far below erf's half ulp near 1, so erf needs no
# exp, division or per-lane coefficients (erf's own tail is only for gelu's relative erfc).
# erf(a) rounds to 1 from a = 3.83 on; the clamp keeps Q within its range.
_ERF_MID_F32 = (3.670401440558635e-07, -8.742103432268777e-07, -3.57997600985982e-06,
                1.5608444300596602e-05, -7.408107649098383e-06, -8.079901454038918e-05,
                0.00025290006306022406, -0.0002591343072708696, -0.0005441140383481979,
                0.0027978308498859406, -0.006116759032011032, 0.008622515015304089,
                -0.008350181393325329, 0.005445699207484722, -0.002178280148655176,
                0.00040695216739550233)
_ERF_MID_F32_END = 3.92
# erfc(a) underflows to 0 beyond these (the tail's lowest u range starts just below 1/max).
_ERFC_A_MAX = {False: 11.0, True: 27.5}


def _erf_small(m: _Emitter, a):
    """erf(a) for |a| < 1."""
    coeffs = _ERF_SMALL_F64 if m.f64 else _ERF_SMALL_F32
    return m.mul(a, m.poly(m.mul(a, a), coeffs))


def _erfc_tail(m: _Emitter, u, h, lo, e=None):
    """erfc(a) = e * f for a >= 0.5 (float32: 0.75), given u ~ 1/a and a^2 = h + lo exactly
    (h <= a_max^2); `e`: exp(-h) where the caller has it.

    Returned as two factors so a caller can multiply its own factor in before the
    possibly-denormal exp(-h) (keeps the product's last rounding the only one in the
    denormal range).
    """
    table = _ERFC_TAIL_F64 if m.f64 else _ERFC_TAIL_F32
    # u beyond the widest range (a < 0.5 or 0.75, u = inf at a = 0) only reaches lanes whose
    # caller picks another branch: any value there, inf or nan included, is discarded, so no clamp
    centre = m.c(table[-1][1])
    coeffs = [m.c(k) for k in table[-1][2]]
    for bound, mid, cs in reversed(table[:-1]):  # narrower ranges override, by lane
        inside = m.lt(u, m.c(bound))
        centre = m.sel(inside, m.c(mid), centre)
        coeffs = [m.sel(inside, m.c(k), acc) for k, acc in zip(cs, coeffs)]
    g = m.poly(m.sub(u, centre), coeffs)
    e = _exp_core(m, m.b.fneg(h)) if e is None else e
    f = m.mul(m.mul(m.sub(m.c(1.0), lo), u), g)  # exp(-lo) ~ 1 - lo: |lo| <= ulp(h)/2
    return e, f


def _square_split(m: _Emitter, a):
    """a*a as hi + lo exactly (lo from an FMA)."""
    hi = m.b.fmul(a, a)  # no contract: hi must be the rounded product
    return hi, m.fma(a, a, m.b.fneg(hi))


# gelu's erf(x/sqrt2), by basic block and x: erf(x * 0.70710677) emitted after gelu(x) in the
# same block (the gelu derivative in a fused body: `(erf(x * 0.70710677) + 1) * 0.5`) takes it
# instead of evaluating its own polynomials (float32: the degree-15 one on [1, 3.92], 15 FMAs a
# lane). gelu's value is computed from x itself (float32: a polynomial of x * x below
# |x| = GELU_TAIL_FROM_F32, 1 - erfc's tail above; float64: the tail from 1): within erf's bound of
# erf(x * 0.70710677) (`ERF_AFTER_GELU`; tests/test_cpu_mathlib.py), not the same bits.
_GELU_ERF: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
ERF_AFTER_GELU = True  # False: erf always evaluates its own (the benchmarks' A/B)


def _gelu_erf_of(builder: ir.IRBuilder, v: ir.Value):
    """gelu's erf(x/sqrt2) (signed, nan for nan) when v is `fmul x, 0.70710677` and gelu(x)
    was emitted in the builder's block, else None."""
    if not ERF_AFTER_GELU or not isinstance(v, ir.Instruction) or v.opname != "fmul":
        return None
    by_input = _GELU_ERF.get(builder.block, {})
    root_half = str(_Emitter(builder, v.type).c(math.sqrt(0.5)))
    for x, k in (v.operands, v.operands[::-1]):
        if str(k) == root_half and id(x) in by_input and by_input[id(x)][0] is x:
            return by_input[id(x)][1]
    return None


def erf(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    after_gelu = _gelu_erf_of(builder, x)
    if after_gelu is not None:  # signed, nan for a nan and +-1 at +-inf already
        return after_gelu
    m = _Emitter(builder, x.type)
    nan = m.isnan(x)
    a = m.fabs(m.sel(nan, m.c(0.0), x))
    if m.f64:
        at = m.min_c(a, _ERFC_A_MAX[m.f64])
        h, lo = _square_split(m, at)
        e, f = _erfc_tail(m, m.div(m.c(1.0), at), h, lo)
        large = m.sub(m.c(1.0), m.mul(e, f))
    else:
        t = m.sub(m.min_c(a, _ERF_MID_F32_END), m.c(2.5))
        large = m.sub(m.c(1.0), m.poly(t, _ERF_MID_F32))
    y = m.sel(m.lt(a, m.c(1.0)), _erf_small(m, a), large)
    return m.sel(nan, x, m.copysign(y, x))


def gelu(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """x * Phi(x) = x/2 * (1 + erf(x/sqrt2)), as x/2 * erfc(|x|/sqrt2) for x <= -1.0625
    (float64: -sqrt(1/2); no cancellation: 1 + erf stays above 1/4).

    erf(x/sqrt2) is a polynomial of x for |x| below the small bound (float32:
    GELU_TAIL_FROM_F32, in x * x; float64: |x|/sqrt2 < 1, in x * 0.70710677), else 1 - erfc's
    tail with x's sign. The
    tail takes exp(-x^2/2) from x itself (x*x split exactly, halved), so the rounding of
    x/sqrt2 does not cost accuracy where the result is tiny.

    x * x, x * 0.70710677 and exp(-x^2/2) come from the very instructions that the gelu
    derivative's `exp(x * x * -0.5)` and `erf(x * 0.70710677)` emit (unflagged fmuls, as
    graphc's scalar mul renders them), and LLVM's CSE then computes each once. erf(x *
    0.70710677) emitted after it in the same block takes its erf(x/sqrt2) (`_gelu_erf_of`).

    A nan needs no compare and select: every comparison is false for it, so it takes the
    erf side, a product of nans (no instruction here is undefined for a nan).
    """
    m = _Emitter(builder, x.type)
    ax = m.fabs(x)
    xt = m.min_c(ax, _ERFC_A_MAX[m.f64] * math.sqrt(2.0))
    _, lo = _square_split(m, xt)
    x2 = builder.fmul(x, x)
    # exp(-h): exp(x*x*-0.5) is exp(-h) for |x| <= xt's bound and 0 (as exp(-h)) beyond
    e = exp(builder, builder.fmul(x2, m.c(-0.5)))
    e, f = _erfc_tail(m, m.div(m.c(math.sqrt(2.0)), xt), None, m.mul(lo, m.c(0.5)), e)
    if m.f64:
        scaled = builder.fmul(x, m.c(math.sqrt(0.5)))
        small = _erf_small(m, scaled)  # odd: erf(scaled) with its sign
        small_region = m.lt(m.fabs(scaled), m.c(1.0))
    else:
        c0_hi, c0_lo = _GELU_ERF_SMALL_F32_C0
        low = m.fma(m.poly(x2, _GELU_ERF_SMALL_F32), x2, m.c(c0_lo))
        small = m.fma(x, m.c(c0_hi), m.mul(x, low))
        small_region = m.lt(ax, m.c(GELU_TAIL_FROM_F32))
    erf_x = m.sel(small_region, small, m.copysign(m.sub(m.c(1.0), m.mul(e, f)), x))
    _GELU_ERF.setdefault(builder.block, {})[id(x)] = (x, erf_x)
    half_x = m.mul(x, m.c(0.5))
    cdf_side = m.mul(half_x, m.add(m.c(1.0), erf_x))
    negative_tail = m.mul(m.mul(half_x, f), e)
    tail_from = math.sqrt(0.5) if m.f64 else GELU_TAIL_FROM_F32
    return m.sel(m.b.fcmp_ordered("<=", x, m.c(-tail_from)), negative_tail, cdf_side)


def gelu_tanh(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """x/2 * (1 + tanh(k*(x + 0.044715 x^3))) = x * sigmoid(2k*(x + 0.044715 x^3)), k = sqrt(2/pi).

    The sigmoid form has no cancellation for negative x.
    """
    m = _Emitter(builder, x.type)
    k2 = 2.0 * math.sqrt(2.0 / math.pi)
    inner = m.mul(x, m.fma(m.mul(x, x), m.c(k2 * 0.044715), m.c(k2)))
    return m.mul(x, sigmoid(builder, inner))


# ---- sin and cos ----------------------------------------------------------------------------
# pi/2 as a sum of parts: all but the last have few enough bits that q * part is exact for
# |q| < 2^16 (float: 8-bit parts) or 2^27 (double: 26-bit parts), so x - q*P1 - q*P2 - ...
# cancels exactly (Sterbenz) until the remainder is the reduced argument (Cody-Waite).
_PIO2_PARTS = {
    False: (1.5703125, 0.0004825592041015625, 1.2665987014770508e-06, 9.89530235528946e-10,
            2.5579538487363607e-12, 5.390302953474238e-15),
    True: (1.5707963109016418, 1.5893254712295857e-08, 6.123233932053594e-17,
           6.36831716351095e-25),
}
TRIG_ACCURATE_RANGE = {"float32": 2.0 ** 16 * 1.5703125, "float64": 2.0 ** 27 * 1.5707963}
# |r| <= pi/4: sin(r) = r + r*z*S(z), cos(r) = 1 - z/2 + z^2*C(z) (Cephes float, fdlibm double).
_SIN_S = {False: (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1),
          True: (1.58969099521155010221e-10, -2.50507602534068634195e-08,
                 2.75573137070700676789e-06, -1.98412698298579493134e-04,
                 8.33333333332248946124e-03, -1.66666666666666324348e-01)}
_COS_C = {False: (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2),
          True: (-1.13596475577881948265e-11, 2.08757232129817482790e-09,
                 -2.75573143513906633035e-07, 2.48015872894767294178e-05,
                 -1.38888888888741095749e-03, 4.16666666666666019037e-02)}


def _sincos(builder: ir.IRBuilder, x: ir.Value, quadrant_offset: int) -> ir.Value:
    """sin(x) (offset 0) or cos(x) = sin(x + pi/2) (offset 1)."""
    m = _Emitter(builder, x.type)
    finite = m.lt(m.fabs(x), m.c(_INF))  # false for inf and nan
    xs = m.sel(finite, x, m.c(0.0))
    # Beyond the accurate range clamp the quotient so the rounding trick stays defined.
    limit = 2.0 ** (m.mant - 2)
    y = m.max_c(m.min_c(m.mul(xs, m.c(2.0 / math.pi)), limit), -limit)
    qf, q = m.round_magic(y)
    r = xs
    for part in _PIO2_PARTS[m.f64]:
        r = m.fma(qf, m.c(-part), r)
    r = m.max_c(m.min_c(r, 1.0), -1.0)  # a no-op within range; keeps far lanes finite
    z = m.mul(r, r)
    sin_r = m.fma(m.mul(r, z), m.poly(z, _SIN_S[m.f64]), r)
    hz = m.mul(m.c(0.5), z)
    w = m.sub(m.c(1.0), hz)
    # fdlibm: cos = w + ((1 - w) - hz + z^2*C(z)), recovering the rounding of 1 - hz.
    tail = m.fma(m.mul(z, z), m.poly(z, _COS_C[m.f64]), m.sub(m.sub(m.c(1.0), w), hz))
    cos_r = m.add(w, tail)
    j = m.b.add(q, m.ci(quadrant_offset))
    odd = m.b.icmp_unsigned("!=", m.b.and_(j, m.ci(1)), m.ci(0))
    v = m.sel(odd, cos_r, sin_r)
    # Quadrants 2 and 3 negate: move bit 1 of j onto the sign bit.
    sign = m.b.shl(m.b.and_(j, m.ci(2)), m.ci(m.bits - 2))
    v = m.as_float(m.b.xor(m.as_int(v), sign))
    v = m.max_c(m.min_c(v, 1.0), -1.0)  # only matters beyond the accurate range
    if quadrant_offset == 0:
        v = m.sel(m.eq(xs, m.c(0.0)), xs, v)  # sin(-0) = -0
    return m.sel(finite, v, m.c(_nan()))


def sin(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _sincos(builder, x, 0)


def cos(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _sincos(builder, x, 1)


# ---- sqrt and rsqrt -------------------------------------------------------------------------
def sqrt(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """llvm.sqrt: correctly rounded (sqrtps/sqrtpd), nan for x < 0, -0 for -0."""
    return _Emitter(builder, x.type).sqrt(x)


def rsqrt(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """1/sqrt(x) as numpy computes it: two correctly rounded steps (<= 1 ulp), -inf at -0."""
    m = _Emitter(builder, x.type)
    return m.div(m.c(1.0), m.sqrt(x))


# ---- atan ---------------------------------------------------------------------------------
# Cephes atan (double): arguments reduced to |x| <= tan(pi/8) (by pi/2 - atan(1/x) above
# tan(3pi/8), pi/4 + atan((x-1)/(x+1)) above 0.66), then x + x^3 P(x^2)/Q(x^2); <= 1 ulp
# against numpy in double. The scalar ops tan/atan/asin/acos/atan2 of the cpu backend compute
# float32 inputs in double with it (graphc.backends.cpu.scalars), so it is not in SUPPORTED.
_ATAN_P = (-8.750608600031904122785e-1, -1.615753718733365076637e1,
           -7.500855792314704667340e1, -1.228866684490136173410e2, -6.485021904942025371773e1)
_ATAN_Q = (1.0, 2.485846490142306297962e1, 1.650270098316988542046e2,
           4.328810604912902668951e2, 4.853903996359136964868e2, 1.945506571482613964425e2)
_T3P8 = 2.41421356237309504880
_MOREBITS = 6.123233995736765886130e-17


def atan(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """arctan(x) (double or float; nan stays nan, +-inf give +-pi/2, -0 gives -0)."""
    m = _Emitter(builder, x.type)
    a = m.fabs(x)
    big = m.gt(a, m.c(_T3P8))
    mid = m.b.and_(m.gt(a, m.c(0.66)), m.b.not_(big))
    base = m.sel(big, m.c(math.pi / 2), m.sel(mid, m.c(math.pi / 4), m.c(0.0)))
    extra = m.sel(big, m.c(_MOREBITS), m.sel(mid, m.c(0.5 * _MOREBITS), m.c(0.0)))
    safe = m.sel(m.eq(a, m.c(0.0)), m.c(1.0), a)  # the unselected 1/a never divides by 0
    xr = m.sel(big, m.div(m.c(-1.0), safe),
               m.sel(mid, m.div(m.sub(a, m.c(1.0)), m.add(a, m.c(1.0))), a))
    z = m.mul(xr, xr)
    r = m.fma(xr, m.div(m.mul(z, m.poly(z, _ATAN_P)), m.poly(z, _ATAN_Q)), xr)
    r = m.add(base, m.add(r, extra))
    return m.copysign(r, x)


# ---- dispatch -------------------------------------------------------------------------------
_UNARY = {
    "exp": exp, "log": log, "log1p": log1p, "tanh": tanh, "sigmoid": sigmoid, "erf": erf,
    "sin": sin, "cos": cos, "sqrt": sqrt, "rsqrt": rsqrt,
}
SUPPORTED = frozenset(_UNARY) | {"gelu"}

# Max error in ulp measured by tests/test_cpu_mathlib.py over its dense sweeps (sin/cos within
# TRIG_ACCURATE_RANGE); the tests assert these bounds.
# (gelu_tanh: |x| <= 5; below -5 its relative error grows with the rounding of the tanh
# argument, as in PyTorch's float formula: <= 2e-5 float, 1e-13 double. float64 erf is measured
# against scipy's float64 erf, itself about 1 ulp off; against mpmath it is within 2 ulp.)
ACCURACY_ULP = {
    "float32": {"exp": 0.82, "log": 0.71, "log1p": 1.44, "tanh": 1.21, "sigmoid": 2.13,
                "erf": 2.23, "sin": 2.07, "cos": 2.48, "gelu": 3.31, "gelu_tanh": 23.6,
                "sqrt": 0.5, "rsqrt": 1.32},
    "float64": {"exp": 0.77, "log": 0.70, "log1p": 1.34, "tanh": 1.13, "sigmoid": 1.86,
                "erf": 3.0, "sin": 1.35, "cos": 1.5, "gelu": 4.0, "gelu_tanh": 26.9,
                "sqrt": 0.5, "rsqrt": 1.21},
}


def emit(builder: ir.IRBuilder, name: str, args: list[ir.Value],
         attrs: dict | None = None) -> ir.Value:
    """Emit the scalar op `name` (a registry `scalar=` name) on float/double values or vectors.

    `attrs` carries the op's attributes where it has some: gelu's `approximate` ("none" or
    "tanh").
    """
    if name == "gelu":
        approximate = (attrs or {}).get("approximate", "none")
        if approximate not in ("none", "tanh"):
            raise ValueError(f"mathlib: gelu approximate must be 'none' or 'tanh', got "
                             f"{approximate!r}")
        fn = gelu_tanh if approximate == "tanh" else gelu
    elif name in _UNARY:
        fn = _UNARY[name]
    else:
        raise KeyError(f"mathlib: no emitter for scalar op {name!r}; supported: "
                       f"{', '.join(sorted(SUPPORTED))}")
    if len(args) != 1:
        raise ValueError(f"mathlib: {name} takes 1 argument, got {len(args)}")
    return fn(builder, args[0])
