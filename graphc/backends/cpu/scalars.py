"""scalars: registry scalar ops as LLVM instructions on register values.

The second layer of the CPU code generator (values <- scalars <- kernels <- codegen): it knows
nothing of memory, loops or graphs; it turns one element's values into another's.

- `const(dtype, value)` and `convert(b, v, src, dst)` (numpy's astype) on register values,
  whose LLVM types are `values.REG` (bool is i1: loads and stores widen and narrow it).
- `SCALAR_LOWERINGS`: the backend's table from the registry's `scalar` names to the function
  rendering one element (graphc.backends.common's contract, tinygrad's `code_for_op`).
  `Scalars` (one per LLVM module) renders through it: `emit(b, op, attrs, args, types, out)`
  promotes `args` (of dtypes `types`) as numpy does and returns one value of `out.dtype`, or
  raises KeyError for a name the table lacks. exp log log1p tanh sigmoid erf sin cos sqrt
  rsqrt and gelu come from graphc.backends.cpu.mathlib; the polynomial ones
  (`WIDE_VECTOR_FUNCTIONS`) mark the LLVM function they are emitted into as preferring
  512-bit vectors (`prefer_wide_vectors`), which only AVX-512 targets act on.
- `reduction_identity(op, dt)` and `reduction_combiner(scalars, op, dt)`: the start value and
  the step of a reduction, from its OpDef's `Reduction` (identity and combiner:
  `COMBINER_LOWERINGS`).

Invariants: every op is straight-line code in the caller's block (selects, no branches, no
libm calls; integer pow calls `graphc_ipow`, an internal function added to the module once),
so a loop around it stays one block and vectorises. maximum/minimum and the max/min
reductions propagate NaN as numpy does. The only fast-math flags set here are `reassoc nsz`
on the float sums and products a reduction keeps in a register (mathlib adds `contract`).
"""

from __future__ import annotations

from llvmlite import ir

from graphc.backends.cpu import mathlib
from graphc.backends.cpu.values import F32, F64, I1, I64, REG, i64
from graphc.ops.registry import REGISTRY
from graphc.ops.shapes import result_dtype
from graphc.types import TensorType, bool_, float64, int64

# scalar names rendered by mathlib, each with an `op_<name>` method made below
_MATHLIB = ("exp", "log", "log1p", "tanh", "sigmoid", "erf", "sin", "cos", "sqrt", "rsqrt")


# mathlib functions that are tens of instructions per element: a loop computing one is bound
# by instruction throughput, not memory, so on an AVX-512 host it runs faster in 512-bit
# vectors (half the instructions per element, the polynomial constants folded as broadcast
# operands) than in the 256-bit ones LLVM prefers for Intel cores (docs/performance.md, "GELU
# epilogue": the GPT's gelu epilogue ~20% faster). Targets without AVX-512 ignore the hint.
WIDE_VECTOR_FUNCTIONS = frozenset(
    ("exp", "log", "log1p", "tanh", "sigmoid", "erf", "sin", "cos", "gelu"))
_PREFER_512 = '"prefer-vector-width"="512"'


def prefer_wide_vectors(fn: ir.Function) -> None:
    """Let LLVM vectorise `fn`'s loops with 512-bit vectors where the target has them."""
    # llvmlite's FunctionAttributes.add accepts only its list of keyword attributes; a
    # string attribute is printed as given ('"key"="value"'), so it goes into the set itself.
    set.add(fn.attributes, _PREFER_512)


def const(dtype, value) -> ir.Constant:
    ty = REG[dtype.name]
    if dtype is bool_:
        return ir.Constant(I1, int(bool(value)))
    if dtype.is_floating:
        return ir.Constant(ty, float(value))
    return ir.Constant(ty, int(value))


def convert(b: ir.IRBuilder, v, src, dst):
    """A register value of dtype `src` as dtype `dst` (numpy's astype)."""
    if src is dst:
        return v
    if dst is bool_:
        if src.is_floating:
            return b.fcmp_unordered("!=", v, const(src, 0.0))
        return b.icmp_signed("!=", v, const(src, 0))
    if src is bool_:
        return b.uitofp(v, REG[dst.name]) if dst.is_floating else b.zext(v, I64)
    if src.is_floating and dst.is_floating:
        return b.fpext(v, F64) if dst is float64 else b.fptrunc(v, F32)
    if src.is_floating:
        return b.fptosi(v, I64)
    return b.sitofp(v, REG[dst.name])


class Scalars:
    """Renders registry scalar ops on register values; one per LLVM module."""

    def __init__(self, module: ir.Module) -> None:
        self.module = module
        self._ipow: ir.Function | None = None

    def intrinsic(self, b, name: str, dtype, *args):
        ty = REG[dtype.name]
        fn = self.module.declare_intrinsic(name, [ty])
        return b.call(fn, list(args))

    def mathlib(self, b, name: str, x, attrs: dict | None = None):
        """A graphc.backends.cpu.mathlib function (vectorisable, no libm calls). A polynomial
        one marks the function it is emitted into as preferring 512-bit vectors."""
        if name in WIDE_VECTOR_FUNCTIONS:
            prefer_wide_vectors(b.function)
        return mathlib.emit(b, name, [x], attrs)

    # ---- the op table: one method per scalar name --------------------------------------
    def emit(self, b, op: str, attrs: dict, args: list, types: list, out: TensorType):
        """`op` applied to register values `args` of dtypes `types`, giving `out.dtype`."""
        return SCALAR_LOWERINGS[op](self, b, attrs, args, types, out.dtype)

    def _promoted(self, b, args, types, ct):
        return [convert(b, a, t, ct) for a, t in zip(args, types)]

    def _float_in(self, b, args, types, rt):
        return convert(b, args[0], types[0], rt)

    def op_add(self, b, attrs, args, types, rt):
        x, y = self._promoted(b, args, types, rt)
        return b.fadd(x, y) if rt.is_floating else b.or_(x, y) if rt is bool_ else b.add(x, y)

    def op_sub(self, b, attrs, args, types, rt):
        x, y = self._promoted(b, args, types, rt)
        return b.fsub(x, y) if rt.is_floating else b.xor(x, y) if rt is bool_ else b.sub(x, y)

    def op_mul(self, b, attrs, args, types, rt):
        x, y = self._promoted(b, args, types, rt)
        return b.fmul(x, y) if rt.is_floating else b.and_(x, y) if rt is bool_ else b.mul(x, y)

    def op_div(self, b, attrs, args, types, rt):
        x, y = self._promoted(b, args, types, rt)
        return b.fdiv(x, y)

    def op_neg(self, b, attrs, args, types, rt):
        x = self._float_in(b, args, types, rt)
        return b.fneg(x) if rt.is_floating else b.sub(const(rt, 0), x) if rt is int64 else x

    def op_abs(self, b, attrs, args, types, rt):
        x = self._float_in(b, args, types, rt)
        if rt.is_floating:
            return self.intrinsic(b, "llvm.fabs", rt, x)
        if rt is bool_:
            return x
        return b.select(b.icmp_signed("<", x, const(rt, 0)), b.sub(const(rt, 0), x), x)

    def op_sign(self, b, attrs, args, types, rt):
        x = self._float_in(b, args, types, rt)
        if rt is bool_:
            return x
        if rt.is_floating:
            pos = b.fcmp_ordered(">", x, const(rt, 0))
            neg = b.fcmp_ordered("<", x, const(rt, 0))
            zero_or_nan = b.fmul(x, const(rt, 0))
            return b.select(pos, const(rt, 1), b.select(neg, const(rt, -1), zero_or_nan))
        pos, neg = b.icmp_signed(">", x, const(rt, 0)), b.icmp_signed("<", x, const(rt, 0))
        return b.select(pos, const(rt, 1), b.select(neg, const(rt, -1), const(rt, 0)))

    def max_min(self, b, x, y, rt, is_max: bool):
        if rt.is_floating:
            wins = b.fcmp_ordered(">" if is_max else "<", x, y)
            r = b.select(wins, x, y)  # y when y is NaN
            return b.select(b.fcmp_unordered("uno", x, x), x, r)  # x when x is NaN
        if rt is bool_:
            return b.or_(x, y) if is_max else b.and_(x, y)
        return b.select(b.icmp_signed(">" if is_max else "<", x, y), x, y)

    def op_maximum(self, b, attrs, args, types, rt):
        return self.max_min(b, *self._promoted(b, args, types, rt), rt, True)

    def op_minimum(self, b, attrs, args, types, rt):
        return self.max_min(b, *self._promoted(b, args, types, rt), rt, False)

    def op_relu(self, b, attrs, args, types, rt):
        x = self._float_in(b, args, types, rt)
        if rt is bool_:
            return x
        if rt.is_floating:
            return b.select(b.fcmp_ordered("<", x, const(rt, 0)), const(rt, 0), x)
        return b.select(b.icmp_signed("<", x, const(rt, 0)), const(rt, 0), x)

    def op_leaky_relu(self, b, attrs, args, types, rt):
        x = self._float_in(b, args, types, rt)
        slope = b.fmul(x, const(rt, attrs["negative_slope"]))
        return b.select(b.fcmp_ordered(">", x, const(rt, 0)), x, slope)

    def op_clamp(self, b, attrs, args, types, rt):
        x = self._float_in(b, args, types, rt)
        if attrs.get("min") is not None:
            x = self.max_min(b, x, const(rt, attrs["min"]), rt, True)
        if attrs.get("max") is not None:
            x = self.max_min(b, x, const(rt, attrs["max"]), rt, False)
        return x

    def op_cast(self, b, attrs, args, types, rt):
        return convert(b, args[0], types[0], rt)

    def op_select(self, b, attrs, args, types, rt):
        cond = convert(b, args[0], types[0], bool_)
        x, y = self._promoted(b, args[1:], types[1:], rt)
        return b.select(cond, x, y)

    def _compare(self, b, args, types, pred: str):
        ta, tb = (TensorType((1,), t) for t in types)
        ct = result_dtype(ta, tb)
        x, y = self._promoted(b, args, types, ct)
        if ct.is_floating:
            if pred == "!=":
                return b.fcmp_unordered("!=", x, y)
            return b.fcmp_ordered(pred, x, y)
        if ct is bool_:
            return b.icmp_unsigned(pred, x, y)
        return b.icmp_signed(pred, x, y)

    def op_eq(self, b, attrs, args, types, rt):
        return self._compare(b, args, types, "==")

    def op_ne(self, b, attrs, args, types, rt):
        return self._compare(b, args, types, "!=")

    def op_lt(self, b, attrs, args, types, rt):
        return self._compare(b, args, types, "<")

    def op_le(self, b, attrs, args, types, rt):
        return self._compare(b, args, types, "<=")

    def op_gt(self, b, attrs, args, types, rt):
        return self._compare(b, args, types, ">")

    def op_ge(self, b, attrs, args, types, rt):
        return self._compare(b, args, types, ">=")

    def _bools(self, b, args, types):
        return [convert(b, a, t, bool_) for a, t in zip(args, types)]

    def op_logical_and(self, b, attrs, args, types, rt):
        return b.and_(*self._bools(b, args, types))

    def op_logical_or(self, b, attrs, args, types, rt):
        return b.or_(*self._bools(b, args, types))

    def op_logical_xor(self, b, attrs, args, types, rt):
        return b.xor(*self._bools(b, args, types))

    def op_logical_not(self, b, attrs, args, types, rt):
        return b.not_(self._bools(b, args, types)[0])

    def op_pow(self, b, attrs, args, types, rt):
        x, y = self._promoted(b, args, types, rt)
        if rt.is_floating:
            fn = self.module.declare_intrinsic("llvm.pow", [REG[rt.name]])
            return b.call(fn, [x, y])
        if rt is bool_:
            return b.or_(x, b.not_(y))  # x**y for bools: 1 when y is 0, else x
        return b.call(self._integer_pow(), [x, y])

    def _integer_pow(self) -> ir.Function:
        """i64 graphc_ipow(i64 x, i64 n): x**n by squaring (n < 0 gives 0; eager refuses)."""
        if self._ipow is None:
            fn = ir.Function(self.module, ir.FunctionType(I64, [I64, I64]), "graphc_ipow")
            fn.linkage = "internal"
            x, n = fn.args
            b = ir.IRBuilder(fn.append_basic_block("entry"))
            head, body, end = (fn.append_basic_block(s) for s in ("head", "body", "end"))
            entry = b.block
            b.branch(head)
            b.position_at_end(head)
            acc, base, k = b.phi(I64), b.phi(I64), b.phi(I64)
            acc.add_incoming(i64(1), entry)
            base.add_incoming(x, entry)
            k.add_incoming(n, entry)
            b.cbranch(b.icmp_signed(">", k, i64(0)), body, end)
            b.position_at_end(body)
            odd = b.trunc(k, I1)
            acc2 = b.select(odd, b.mul(acc, base), acc)
            acc.add_incoming(acc2, body)
            base.add_incoming(b.mul(base, base), body)
            k.add_incoming(b.ashr(k, i64(1)), body)
            b.branch(head)
            b.position_at_end(end)
            b.ret(b.select(b.icmp_signed("<", n, i64(0)), i64(0), acc))
            self._ipow = fn
        return self._ipow

    def op_floor_divide(self, b, attrs, args, types, rt):
        x, y = self._promoted(b, args, types, rt)
        if rt.is_floating:
            return self.intrinsic(b, "llvm.floor", rt, b.fdiv(x, y))
        safe = b.select(b.icmp_signed("==", y, const(rt, 0)), const(rt, 1), y)
        q, r = b.sdiv(x, safe), b.srem(x, safe)
        fix = b.and_(b.icmp_signed("!=", r, const(rt, 0)),
                     b.icmp_signed("!=", b.icmp_signed("<", r, const(rt, 0)),
                                   b.icmp_signed("<", safe, const(rt, 0))))
        return b.select(fix, b.sub(q, const(rt, 1)), q)

    def op_remainder(self, b, attrs, args, types, rt):
        x, y = self._promoted(b, args, types, rt)
        if rt.is_floating:
            r = b.frem(x, y)
            fix = b.and_(b.fcmp_ordered("!=", r, const(rt, 0)),
                         b.icmp_unsigned("!=", b.fcmp_ordered("<", r, const(rt, 0)),
                                         b.fcmp_ordered("<", y, const(rt, 0))))
            return b.select(fix, b.fadd(r, y), r)
        safe = b.select(b.icmp_signed("==", y, const(rt, 0)), const(rt, 1), y)
        r = b.srem(x, safe)
        fix = b.and_(b.icmp_signed("!=", r, const(rt, 0)),
                     b.icmp_signed("!=", b.icmp_signed("<", r, const(rt, 0)),
                                   b.icmp_signed("<", safe, const(rt, 0))))
        return b.select(fix, b.add(r, safe), r)

    def op_gelu(self, b, attrs, args, types, rt):
        x = self._float_in(b, args, types, rt)
        return self.mathlib(b, "gelu", x, {"approximate": attrs.get("approximate", "none")})

    # ---- graphc.ops.mathops: rounding, trig, hyperbolic, expm1/log2/log10, atan2, fmod -----
    def _rounded(self, b, intrinsic: str, args, types, rt):
        x = self._float_in(b, args, types, rt)
        return self.intrinsic(b, intrinsic, rt, x) if rt.is_floating else x  # ints: as they are

    def op_floor(self, b, attrs, args, types, rt):
        return self._rounded(b, "llvm.floor", args, types, rt)

    def op_ceil(self, b, attrs, args, types, rt):
        return self._rounded(b, "llvm.ceil", args, types, rt)

    def op_trunc(self, b, attrs, args, types, rt):
        return self._rounded(b, "llvm.trunc", args, types, rt)

    def op_round(self, b, attrs, args, types, rt):
        return self._rounded(b, "llvm.rint", args, types, rt)  # half to even, as torch.round

    def in_double(self, b, fn, args, types, rt):
        """fn(b, *values) computed in double, the arguments widened and the result rounded
        once to `rt`: float32 results are correctly rounded but for rare double roundings."""
        xs = [convert(b, a, t, float64) for a, t in zip(args, types)]
        return convert(b, fn(b, *xs), float64, rt)

    def op_fmod(self, b, attrs, args, types, rt):
        x, y = self._promoted(b, args, types, rt)
        if rt.is_floating:
            return b.frem(x, y)  # C's fmod: the dividend's sign
        if rt is bool_:
            return b.and_(x, b.not_(y))
        safe = b.select(b.icmp_signed("==", y, const(rt, 0)), const(rt, 1), y)
        return b.srem(x, safe)


def _f64(value: float) -> ir.Constant:
    return ir.Constant(F64, value)


def _copysign64(b, mag, sign):
    fn = b.module.declare_intrinsic("llvm.copysign", [F64], ir.FunctionType(F64, [F64, F64]))
    return b.call(fn, [mag, sign])


def _signbit64(b, x):
    return b.icmp_signed("<", b.bitcast(x, I64), i64(0))


def _tan64(b, x):
    return b.fdiv(mathlib.sin(b, x), mathlib.cos(b, x))


def _atan2_64(b, y, x):
    """atan(y/x), moved by pi into the left half plane (x < 0 or x = -0); both zero or both
    infinite: the quadrant from the signs alone (atan2(+-0, -0) = +-pi, (inf, inf) = pi/4)."""
    inf = _f64(float("inf"))
    one = _f64(1.0)
    fabs = b.module.declare_intrinsic("llvm.fabs", [F64])
    both_inf = b.and_(b.fcmp_ordered("==", b.call(fabs, [y]), inf),
                      b.fcmp_ordered("==", b.call(fabs, [x]), inf))
    both_zero = b.and_(b.fcmp_ordered("==", y, _f64(0.0)), b.fcmp_ordered("==", x, _f64(0.0)))
    xs = b.select(b.or_(both_inf, both_zero), _copysign64(b, one, x), x)
    ys = b.select(both_inf, _copysign64(b, one, y), y)
    r = mathlib.atan(b, b.fdiv(ys, xs))
    shifted = b.fadd(r, _copysign64(b, _f64(3.141592653589793), ys))
    return b.select(_signbit64(b, xs), shifted, r)


def _cos_side64(b, x):
    """sqrt((1 - x)(1 + x)): sqrt(1 - x^2) without cancellation near |x| = 1."""
    sqrt = b.module.declare_intrinsic("llvm.sqrt", [F64])
    return b.call(sqrt, [b.fmul(b.fsub(_f64(1.0), x), b.fadd(_f64(1.0), x))])


def _asin64(b, x):
    return _atan2_64(b, x, _cos_side64(b, x))


def _acos64(b, x):
    return _atan2_64(b, _cos_side64(b, x), x)


def _atan64(b, x):
    return mathlib.atan(b, x)


def _expm1_64(b, x):
    """Kahan's expm1: (u - 1) * x / log(u) with u = exp(x) cancels exp's rounding error."""
    u = mathlib.exp(b, x)
    um1 = b.fsub(u, _f64(1.0))
    r = b.fdiv(b.fmul(um1, x), mathlib.log(b, u))
    r = b.select(b.fcmp_ordered("==", u, _f64(float("inf"))), u, r)
    r = b.select(b.fcmp_ordered("==", um1, _f64(-1.0)), um1, r)
    return b.select(b.fcmp_ordered("==", u, _f64(1.0)), x, r)


def _sinh64(b, x):
    """(u + u / (u + 1)) / 2 with u = expm1(|x|), the sign of x: accurate near 0."""
    fabs = b.module.declare_intrinsic("llvm.fabs", [F64])
    u = _expm1_64(b, b.call(fabs, [x]))
    s = b.fmul(_f64(0.5), b.fadd(u, b.fdiv(u, b.fadd(u, _f64(1.0)))))
    s = b.select(b.fcmp_ordered("==", u, _f64(float("inf"))), u, s)
    return _copysign64(b, s, x)


def _cosh64(b, x):
    fabs = b.module.declare_intrinsic("llvm.fabs", [F64])
    e = mathlib.exp(b, b.call(fabs, [x]))
    return b.fmul(_f64(0.5), b.fadd(e, b.fdiv(_f64(1.0), e)))


def _log2_64(b, x):
    """log(x) / ln 2; a power of two gives its exponent exactly (from the bits)."""
    r = b.fmul(mathlib.log(b, x), _f64(1.4426950408889634))
    bits = b.bitcast(x, I64)
    field = b.lshr(bits, i64(52))  # sign and exponent: a positive x has no sign bit
    exact = b.and_(b.icmp_signed("==", b.and_(bits, i64((1 << 52) - 1)), i64(0)),
                   b.and_(b.icmp_signed(">", field, i64(0)),
                          b.icmp_signed("<", field, i64(2047))))
    return b.select(exact, b.sitofp(b.sub(field, i64(1023)), F64), r)


def _log10_64(b, x):
    return b.fmul(mathlib.log(b, x), _f64(0.4342944819032518))


def _double_method(name: str, fn):
    """The lowering of a graphc.ops.mathops function computed in double (Scalars.in_double)."""

    def method(self, b, attrs, args, types, rt):
        return self.in_double(b, fn, args, types, rt)

    method.__name__ = f"op_{name}"
    return method


_IN_DOUBLE = {"tan": _tan64, "atan": _atan64, "asin": _asin64, "acos": _acos64,
              "atan2": _atan2_64, "sinh": _sinh64, "cosh": _cosh64, "expm1": _expm1_64,
              "log2": _log2_64, "log10": _log10_64}


def _mathlib_method(name: str):
    """The lowering of mathlib function `name` (integer inputs computed in float32)."""

    def method(self, b, attrs, args, types, rt):
        return self.mathlib(b, name, self._float_in(b, args, types, rt))

    method.__name__ = f"op_{name}"
    return method


SCALAR_LOWERINGS = {
    "add": Scalars.op_add, "sub": Scalars.op_sub, "mul": Scalars.op_mul,
    "div": Scalars.op_div, "neg": Scalars.op_neg, "abs": Scalars.op_abs,
    "sign": Scalars.op_sign, "maximum": Scalars.op_maximum, "minimum": Scalars.op_minimum,
    "relu": Scalars.op_relu, "leaky_relu": Scalars.op_leaky_relu, "clamp": Scalars.op_clamp,
    "cast": Scalars.op_cast, "select": Scalars.op_select, "eq": Scalars.op_eq,
    "ne": Scalars.op_ne, "lt": Scalars.op_lt, "le": Scalars.op_le, "gt": Scalars.op_gt,
    "ge": Scalars.op_ge, "logical_and": Scalars.op_logical_and,
    "logical_or": Scalars.op_logical_or, "logical_xor": Scalars.op_logical_xor,
    "logical_not": Scalars.op_logical_not, "pow": Scalars.op_pow,
    "floor_divide": Scalars.op_floor_divide, "remainder": Scalars.op_remainder,
    "gelu": Scalars.op_gelu,
    **{name: _mathlib_method(name) for name in _MATHLIB},
    "floor": Scalars.op_floor, "ceil": Scalars.op_ceil, "trunc": Scalars.op_trunc,
    "round": Scalars.op_round, "fmod": Scalars.op_fmod,
    **{name: _double_method(name, fn) for name, fn in _IN_DOUBLE.items()},
}


# ---- reductions: the identity and combiner of each OpDef's Reduction ------------------------
def reduction_identity(op: str, dt) -> ir.Constant:
    """The start value of reduction `op` in dtype `dt`: the identity of its combine step."""
    return const(dt, REGISTRY[op].reduction.identity_value(dt))


def _combine_add(scalars: Scalars, b, acc, v, dt, in_register: bool):
    if dt.is_floating:
        r = b.fadd(acc, v)
        if in_register:
            r.flags.extend(("reassoc", "nsz"))
        return r
    return b.or_(acc, v) if dt is bool_ else b.add(acc, v)


def _combine_mul(scalars: Scalars, b, acc, v, dt, in_register: bool):
    if dt.is_floating:
        r = b.fmul(acc, v)
        if in_register:
            r.flags.extend(("reassoc", "nsz"))
        return r
    return b.and_(acc, v) if dt is bool_ else b.mul(acc, v)


def _combine_max(scalars: Scalars, b, acc, v, dt, in_register: bool):
    return scalars.max_min(b, acc, v, dt, True)


def _combine_min(scalars: Scalars, b, acc, v, dt, in_register: bool):
    return scalars.max_min(b, acc, v, dt, False)


COMBINER_LOWERINGS = {"add": _combine_add, "mul": _combine_mul, "max": _combine_max,
                      "min": _combine_min}


def reduction_combiner(scalars: Scalars, op: str, dt):
    """combine(b, acc, v, in_register) for a reduction; float sums in registers reassociate
    (so they vectorise); max/min propagate NaN as numpy does."""
    step = COMBINER_LOWERINGS[REGISTRY[op].reduction.combiner]

    def combine(b, acc, v, in_register: bool):
        return step(scalars, b, acc, v, dt, in_register)

    return combine
