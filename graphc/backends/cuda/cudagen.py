"""cudagen: CUDA C text for the kernels the runtime library does not have.

One translation unit per graph: `PRELUDE` (scalar helpers shared by every kernel: NaN-aware
max/min, floor division, remainder, integer pow, sign, gelu, sigmoid, the Philox4x32-10
stream of graphc.ops.random) followed by one `__global__` function per `Kernel`, each marked
`GC_EMU_EXPORT(name)` so the emulation build finds it (the macro is empty under nvcc).

Kernel shape: a `threads`-long index space over a 1-D grid of `BLOCK`-thread blocks (the
executable launches every kernel so). Elementwise kernels run one thread per element (ITEMS
per thread when large and their parameters are disjoint), with no shared memory and no
barriers, and return early past the end. Cooperative kernels
(graphc.backends.cuda.reductions: reductions, softmax, arg-reductions, the NLL loss) have
`guard=False`: `threads` is a multiple of BLOCK, every thread reaches every barrier, and a
segment of `lanes` neighbouring threads (a warp or more) reduces one output with warp
shuffles and, across warps, `__shared__` memory. Every pointer a kernel reads or writes is a
`char *` parameter `p<k>` whose address is fixed when the graph is compiled (arena offsets, the
executable's input buffers), so sizes, strides and offsets are constants in the text.

Helpers here are pure text builders:
- `ctype(dtype)`: float32 float, float64 double, int64 long long, bool bool (one byte, as
  numpy stores it); `literal(value, dtype)`;
- `decompose(shape, index, prefix)`: statements declaring coordinates `<prefix><d>` of a flat
  index over `shape` (row-major); `offset(coords, strides)`: the element offset expression;
- `scalar(op, attrs, args, types, out)`: a registry scalar op (graphc.ops.registry `scalar`
  names, through `SCALAR_LOWERINGS`, the backend's scalar table) as a C expression, with
  numpy's promotion (arguments cast to the result type, comparisons in the promoted type of
  their operands);
- `render(kernels)`: the whole translation unit.
Invariants: the text depends only on what it is given (no addresses of this process, no
timestamps), so identical graphs give identical sources and share one cache entry.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from graphc.ops.shapes import result_dtype
from graphc.types import TensorType

BLOCK = 256  # threads per block of every generated kernel; a multiple of 32
# An elementwise kernel over at least ITEMS_FROM items whose parameters are disjoint runs
# ITEMS items per thread, BLOCK apart (each warp's accesses stay coalesced), its parameters
# `__restrict__`: in whole blocks the items are straight-line code, so the compiler issues
# every item's loads before the first store. On an H200 the elementwise chain of
# benchmarks.gpu went from 0.57x to 0.89x of the copy bandwidth so
# (benchmarks/cuda/elementwise_variants.cu).
ITEMS, ITEMS_FROM = 4, 1 << 20

_CTYPES = {"float32": "float", "float64": "double", "int64": "long long", "bool": "bool"}


def ctype(dtype) -> str:
    return _CTYPES[getattr(dtype, "name", dtype)]


def literal(value, dtype) -> str:
    """`value` as a C literal of `dtype` (exact: hex floats; inf/nan through math.h)."""
    name = getattr(dtype, "name", dtype)
    if name == "bool":
        return "true" if value else "false"
    if name == "int64":
        return f"{int(value)}LL"
    value = float(value)
    t = _CTYPES[name]
    if math.isnan(value):
        return f"(({t})NAN)"
    if math.isinf(value):
        return f"(({t})INFINITY)" if value > 0 else f"(-({t})INFINITY)"
    return f"(({t}){value.hex()})"


def decompose(shape: tuple[int, ...], index: str, prefix: str = "c") -> list[str]:
    """Statements declaring `<prefix>d` = coordinate d of flat `index` over `shape`."""
    lines, rest = [], index
    for d in range(len(shape) - 1, -1, -1):
        if d == 0:
            lines.append(f"long long {prefix}{d} = {rest};")
        else:
            lines.append(f"long long {prefix}{d} = {rest} % {shape[d]}LL;")
            lines.append(f"long long {prefix}{d}q = {rest} / {shape[d]}LL;")
            rest = f"{prefix}{d}q"
    return lines


def offset(coords: list[str], strides: tuple[int, ...]) -> str:
    terms = [f"{c} * {s}LL" if s != 1 else c for c, s in zip(coords, strides) if s != 0]
    return " + ".join(terms) if terms else "0"


def load(param: str, dtype, index: str) -> str:
    return f"(({ctype(dtype)} *){param})[{index}]"


# ---- scalar ops ------------------------------------------------------------------------------
def _cast(expr: str, src, dst) -> str:
    if src is dst:
        return expr
    if dst.name == "bool":
        return f"(({expr}) != 0)"
    return f"(({ctype(dst)})({expr}))"


def _promoted(args, types, out):
    return [_cast(a, t, out) for a, t in zip(args, types)]


_UNARY_MATH = ("exp", "log", "log1p", "tanh", "sigmoid", "erf", "sin", "cos", "sqrt",
               "rsqrt")
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _arithmetic(op, attrs, args, types, out) -> str:
    x, y = _promoted(args, types, out)
    if out.name == "bool":
        return f"({x} {dict(add='||', sub='!=', mul='&&')[op]} {y})"
    return f"({x} {dict(add='+', sub='-', mul='*')[op]} {y})"


def _div(op, attrs, args, types, out) -> str:
    x, y = _promoted(args, types, out)
    return f"({x} / {y})"


def _unary_helper(op, attrs, args, types, out) -> str:
    """neg, abs, sign, relu: `-x` or `gc_<op>(x)`; bools are their own result."""
    (x,) = _promoted(args, types, out)
    if out.name == "bool":
        return x
    return f"(-{x})" if op == "neg" else f"gc_{op}({x})"


def _max_min(op, attrs, args, types, out) -> str:
    x, y = _promoted(args, types, out)
    return f"gc_{op[:3]}({x}, {y})"


def _leaky_relu(op, attrs, args, types, out) -> str:
    (x,) = _promoted(args, types, out)
    return f"({x} > 0 ? {x} : {x} * {literal(attrs['negative_slope'], out)})"


def _clamp(op, attrs, args, types, out) -> str:
    (x,) = _promoted(args, types, out)
    if attrs.get("min") is not None:
        x = f"gc_max({x}, {literal(attrs['min'], out)})"
    if attrs.get("max") is not None:
        x = f"gc_min({x}, {literal(attrs['max'], out)})"
    return x


def _cast_op(op, attrs, args, types, out) -> str:
    return _cast(args[0], types[0], out)


def _select(op, attrs, args, types, out) -> str:
    x, y = _promoted(args[1:], types[1:], out)
    return f"({_cast(args[0], types[0], _bool())} ? {x} : {y})"


def _compare(op, attrs, args, types, out) -> str:
    ct = result_dtype(*(TensorType((1,), t) for t in types))
    x, y = _promoted(args, types, ct)
    return f"({x} {_COMPARE[op]} {y})"


def _logical(op, attrs, args, types, out) -> str:
    xs = [_cast(a, t, _bool()) for a, t in zip(args, types)]
    if op == "logical_not":
        return f"(!{xs[0]})"
    symbol = {"logical_and": "&&", "logical_or": "||", "logical_xor": "!="}[op]
    return f"({xs[0]} {symbol} {xs[1]})"


def _pow(op, attrs, args, types, out) -> str:
    x, y = _promoted(args, types, out)
    return f"({x} || !{y})" if out.name == "bool" else f"gc_pow({x}, {y})"


def _binary_helper(op, attrs, args, types, out) -> str:
    """floor_divide, remainder: `gc_<op>(x, y)`."""
    x, y = _promoted(args, types, out)
    return f"gc_{op}({x}, {y})"


def _gelu(op, attrs, args, types, out) -> str:
    if not out.is_floating:
        raise KeyError(op)
    (x,) = _promoted(args, types, out)
    return f"gc_gelu_{'tanh' if attrs.get('approximate') == 'tanh' else 'erf'}({x})"


def _unary_math(op, attrs, args, types, out) -> str:
    """exp log log1p tanh sigmoid erf sin cos sqrt rsqrt: `gc_<op>(x)`, floating results only."""
    if not out.is_floating:
        raise KeyError(op)
    (x,) = _promoted(args, types, out)
    return f"gc_{op}({x})"



# graphc.ops.mathops: floor/ceil/round/trunc keep integers as they are; the others are
# CUDA's math functions (gc_<op> in the prelude), floating results only
_ROUNDING = ("floor", "ceil", "round", "trunc")
_MATHOPS_MATH = ("tan", "atan", "asin", "acos", "sinh", "cosh", "expm1", "log2", "log10")


def _rounding(op, attrs, args, types, out) -> str:
    if out.name == "bool":
        raise KeyError(op)
    (x,) = _promoted(args, types, out)
    return f"gc_{op}({x})" if out.is_floating else x


def _atan2(op, attrs, args, types, out) -> str:
    if not out.is_floating:
        raise KeyError(op)
    x, y = _promoted(args, types, out)
    return f"gc_atan2({x}, {y})"

# The backend's table of scalar ops (graphc.backends.common's contract): scalar name ->
# render(op, attrs, args, types, out) -> a C expression (KeyError for a dtype it refuses).
SCALAR_LOWERINGS = {
    "add": _arithmetic, "sub": _arithmetic, "mul": _arithmetic, "div": _div,
    "neg": _unary_helper, "abs": _unary_helper, "sign": _unary_helper, "relu": _unary_helper,
    "maximum": _max_min, "minimum": _max_min, "leaky_relu": _leaky_relu, "clamp": _clamp,
    "cast": _cast_op, "select": _select,
    **{name: _compare for name in _COMPARE},
    "logical_and": _logical, "logical_or": _logical, "logical_xor": _logical,
    "logical_not": _logical, "pow": _pow, "floor_divide": _binary_helper,
    "remainder": _binary_helper, "gelu": _gelu,
    **{name: _unary_math for name in _UNARY_MATH},
    **{name: _rounding for name in _ROUNDING}, "fmod": _binary_helper, "atan2": _atan2,
    **{name: _unary_math for name in _MATHOPS_MATH},
}


def scalar(op: str, attrs: dict, args: list[str], types: list, out) -> str:
    """The C expression of registry scalar op `op` (KeyError for a name not rendered)."""
    return SCALAR_LOWERINGS[op](op, attrs, args, types, out)


def _bool():
    from graphc.types import bool_

    return bool_


# ---- kernels and the translation unit -----------------------------------------------------------
@dataclass
class Kernel:
    """One generated kernel: `threads` work items, pointer parameters p0..p(n-1); `items`
    work items per thread (> 1: an elementwise kernel with disjoint parameters, see ITEMS)."""

    name: str
    threads: int
    params: int
    body: list[str] = field(default_factory=list)
    guard: bool = True  # False: a cooperative kernel (no early return; see the docstring)
    items: int = 1

    def text(self) -> str:
        qualifier = "__restrict__ " if self.items > 1 else ""
        params = ", ".join(f"char *{qualifier}p{k}" for k in range(self.params)) or "void"
        lines = [f'extern "C" __global__ void {self.name}({params}) {{']
        if self.items > 1:
            lines += self._items_text()
        else:
            lines.append("  long long gi = (long long)blockIdx.x * blockDim.x + threadIdx.x;")
            if self.guard:
                lines.append(f"  if (gi >= {self.threads}LL) return;")
            lines += ["  " + line for line in self.body]
        lines += ["}", f"GC_EMU_EXPORT({self.name})", ""]
        return "\n".join(lines)

    def _items_text(self) -> list[str]:
        """A whole block's items as straight-line code, every item's loads first (`_phases`,
        or each item in its own scope when the body cannot be split), then the last block's
        items in a loop."""
        n = self.items
        lines = [f"  long long g0 = (long long)blockIdx.x * (blockDim.x * {n}LL) + threadIdx.x;",
                 f"  if (g0 + {n - 1}LL * blockDim.x < {self.threads}LL) {{"]
        phases = _phases(self.body, n)
        if phases is None:
            for j in range(n):
                lines.append(f"    {{ long long gi = g0 + {j}LL * blockDim.x;")
                lines += ["      " + line for line in self.body]
                lines.append("    }")
        else:
            lines += ["    " + line for line in phases]
        lines += ["    return;", "  }",
                  f"  for (int item = 0; item < {n}; ++item) {{",
                  "    long long gi = g0 + (long long)item * blockDim.x;",
                  f"    if (gi >= {self.threads}LL) return;"]
        lines += ["    " + line for line in self.body]
        lines.append("  }")
        return lines


_DECLARED = re.compile(r"^(?:const )?(?:float|double|long long|int|bool) (\w+) = ")
_STORE = re.compile(r"^\(\((?:float|double|long long|bool) \*\)p\d+\)\[[^;{}]*\] = [^;{}]*;$")
_LOAD = re.compile(r"\(\((?:float|double|long long|bool) \*\)p\d+\)\[")


def _phases(body: list[str], items: int) -> list[str] | None:
    """The body for `items` items, BLOCK apart, with every item's lines up to its last load
    first and the rest after: straight-line code whose loads the compiler need not move
    (with `__restrict__` parameters it may, but nvcc was seen not to). Each item's variables
    get the suffix _<item>. None unless every line is a declaration or a store (no brace
    block, no return) and some line loads."""
    if not all(_DECLARED.match(line) or _STORE.match(line) for line in body):
        return None
    names = [m.group(1) for m in map(_DECLARED.match, body) if m]
    loads = [k for k, line in enumerate(body) if _LOAD.search(line.split("=", 1)[-1])
             and _DECLARED.match(line)]
    if not loads or len(names) != len(set(names)):
        return None
    split = loads[-1] + 1
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names + ["gi"])) + r")\b")
    renamed = [[pattern.sub(lambda m, j=j: f"{m.group(1)}_{j}", line) for line in body]
               for j in range(items)]
    first = [f"long long gi_{j} = g0 + {j}LL * blockDim.x;" for j in range(items)]
    return (first + [line for item in renamed for line in item[:split]]
            + [line for item in renamed for line in item[split:]])


def render(kernels: list[Kernel]) -> str:
    return PRELUDE + "\n".join(k.text() for k in kernels)


PRELUDE = r"""// generated by graphc.backends.cuda.cudagen
#ifndef __CUDACC_RTC__
#include <math.h>
#endif
#ifndef GC_EMU_EXPORT
#define GC_EMU_EXPORT(name)
#endif
#define GC_D static __device__ __forceinline__
GC_D float gc_max(float a, float b) { return a != a ? a : (b != b ? b : (a > b ? a : b)); }
GC_D double gc_max(double a, double b) { return a != a ? a : (b != b ? b : (a > b ? a : b)); }
GC_D long long gc_max(long long a, long long b) { return a > b ? a : b; }
GC_D bool gc_max(bool a, bool b) { return a || b; }
GC_D int gc_max(int a, int b) { return a > b ? a : b; }  // bool states kept as int
GC_D float gc_min(float a, float b) { return a != a ? a : (b != b ? b : (a < b ? a : b)); }
GC_D double gc_min(double a, double b) { return a != a ? a : (b != b ? b : (a < b ? a : b)); }
GC_D long long gc_min(long long a, long long b) { return a < b ? a : b; }
GC_D bool gc_min(bool a, bool b) { return a && b; }
GC_D int gc_min(int a, int b) { return a < b ? a : b; }
GC_D float gc_abs(float x) { return fabsf(x); }
GC_D double gc_abs(double x) { return fabs(x); }
GC_D long long gc_abs(long long x) { return x < 0 ? -x : x; }
template <typename T> GC_D T gc_sign(T x) { return x > 0 ? T(1) : (x < 0 ? T(-1) : x * T(0)); }
template <typename T> GC_D T gc_relu(T x) { return x < 0 ? T(0) : x; }
GC_D float gc_pow(float a, float b) { return powf(a, b); }
GC_D double gc_pow(double a, double b) { return pow(a, b); }
GC_D long long gc_pow(long long a, long long n) {
  long long r = 1;
  if (n < 0) return 0;
  while (n > 0) { if (n & 1) r *= a; a *= a; n >>= 1; }
  return r;
}
GC_D float gc_floor_divide(float a, float b) { return floorf(a / b); }
GC_D double gc_floor_divide(double a, double b) { return floor(a / b); }
GC_D long long gc_floor_divide(long long a, long long b) {
  if (b == 0) b = 1;
  long long q = a / b, r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q;
}
GC_D float gc_remainder(float a, float b) {
  float r = fmodf(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
GC_D double gc_remainder(double a, double b) {
  double r = fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
GC_D long long gc_remainder(long long a, long long b) {
  if (b == 0) b = 1;
  long long r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
GC_D float gc_exp(float x) { return expf(x); }
GC_D double gc_exp(double x) { return exp(x); }
GC_D float gc_log(float x) { return logf(x); }
GC_D double gc_log(double x) { return log(x); }
GC_D float gc_log1p(float x) { return log1pf(x); }
GC_D double gc_log1p(double x) { return log1p(x); }
GC_D float gc_tanh(float x) { return tanhf(x); }
GC_D double gc_tanh(double x) { return tanh(x); }
GC_D float gc_erf(float x) { return erff(x); }
GC_D double gc_erf(double x) { return erf(x); }
GC_D float gc_sin(float x) { return sinf(x); }
GC_D double gc_sin(double x) { return sin(x); }
GC_D float gc_cos(float x) { return cosf(x); }
GC_D double gc_cos(double x) { return cos(x); }
GC_D float gc_sqrt(float x) { return sqrtf(x); }
GC_D double gc_sqrt(double x) { return sqrt(x); }
GC_D float gc_rsqrt(float x) { return 1.0f / sqrtf(x); }
GC_D double gc_rsqrt(double x) { return 1.0 / sqrt(x); }
GC_D float gc_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
GC_D double gc_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
// graphc.ops.mathops (round: rint, halves to even; fmod: the dividend's sign)
GC_D float gc_floor(float x) { return floorf(x); }
GC_D double gc_floor(double x) { return floor(x); }
GC_D float gc_ceil(float x) { return ceilf(x); }
GC_D double gc_ceil(double x) { return ceil(x); }
GC_D float gc_round(float x) { return rintf(x); }
GC_D double gc_round(double x) { return rint(x); }
GC_D float gc_trunc(float x) { return truncf(x); }
GC_D double gc_trunc(double x) { return trunc(x); }
GC_D float gc_tan(float x) { return tanf(x); }
GC_D double gc_tan(double x) { return tan(x); }
GC_D float gc_atan(float x) { return atanf(x); }
GC_D double gc_atan(double x) { return atan(x); }
GC_D float gc_asin(float x) { return asinf(x); }
GC_D double gc_asin(double x) { return asin(x); }
GC_D float gc_acos(float x) { return acosf(x); }
GC_D double gc_acos(double x) { return acos(x); }
GC_D float gc_sinh(float x) { return sinhf(x); }
GC_D double gc_sinh(double x) { return sinh(x); }
GC_D float gc_cosh(float x) { return coshf(x); }
GC_D double gc_cosh(double x) { return cosh(x); }
GC_D float gc_expm1(float x) { return expm1f(x); }
GC_D double gc_expm1(double x) { return expm1(x); }
GC_D float gc_log2(float x) { return log2f(x); }
GC_D double gc_log2(double x) { return log2(x); }
GC_D float gc_log10(float x) { return log10f(x); }
GC_D double gc_log10(double x) { return log10(x); }
GC_D float gc_atan2(float y, float x) { return atan2f(y, x); }
GC_D double gc_atan2(double y, double x) { return atan2(y, x); }
GC_D float gc_fmod(float a, float b) { return fmodf(a, b); }
GC_D double gc_fmod(double a, double b) { return fmod(a, b); }
GC_D long long gc_fmod(long long a, long long b) { return a % (b == 0 ? 1 : b); }
template <typename T> GC_D T gc_gelu_erf(T x) {
  return T(0.5) * x * (T(1) + gc_erf(x * T(0.7071067811865476))); }
template <typename T> GC_D T gc_gelu_tanh(T x) {
  return T(0.5) * x * (T(1) + gc_tanh(T(0.7978845608028654) * (x + T(0.044715) * x * x * x)));
}
// Philox4x32-10 word j of the stream (seed, offset): graphc/ops/random.py's specification
GC_D unsigned int gc_philox_word(unsigned long long seed, unsigned long long offset,
                                 unsigned long long j) {
  unsigned long long n = offset + j / 4;
  unsigned int c0 = (unsigned int)n, c1 = (unsigned int)(n >> 32), c2 = 0, c3 = 0;
  unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    if (round) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    unsigned long long p0 = 0xD2511F53ull * c0, p1 = 0xCD9E8D57ull * c2;
    unsigned int n0 = (unsigned int)(p1 >> 32) ^ c1 ^ k0, n1 = (unsigned int)p1;
    unsigned int n2 = (unsigned int)(p0 >> 32) ^ c3 ^ k1, n3 = (unsigned int)p0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
  }
  unsigned int w = j % 4;
  return w == 0 ? c0 : (w == 1 ? c1 : (w == 2 ? c2 : c3));
}
// reductions (graphc.backends.cuda.reductions): NaN wins, then the better value, then the
// lower index; symmetric, so every lane of a shuffle butterfly reaches the same answer
template <typename T> GC_D bool gc_arg_wins(T v, long long i, T best, long long at,
                                            bool is_min) {
  if (i < 0) return false;
  if (at < 0) return true;
  bool vn = v != v, bn = best != best;
  if (vn || bn) return vn && (!bn || i < at);
  if (v == best) return i < at;
  return is_min ? v < best : v > best;
}
// online softmax: fold (m2, s2) into the running (max m, sum s of exp(x - m)); one exp in
// the element type per element (the sum itself in double)
template <typename T> GC_D void gc_online_merge(T &m, double &s, T m2, double s2) {
  T mx = gc_max(m, m2);
  s = (m == mx ? s : s * (double)gc_exp(m - mx)) +
      (m2 == mx ? s2 : s2 * (double)gc_exp(m2 - mx));
  m = mx;
}
GC_D double gc_uniform24(unsigned int w) { return (double)(w >> 8) * 0x1p-24; }
GC_D float gc_uniform_f32(unsigned long long s, unsigned long long o, unsigned long long i) {
  return (float)(gc_philox_word(s, o, i) >> 8) * 0x1p-24f; }
GC_D double gc_uniform_f64(unsigned long long s, unsigned long long o, unsigned long long i) {
  unsigned long long a = gc_philox_word(s, o, 2 * i), b = gc_philox_word(s, o, 2 * i + 1);
  return (double)(((a << 32) | b) >> 11) * 0x1p-53; }
"""

__all__ = ["BLOCK", "PRELUDE", "Kernel", "ctype", "decompose", "literal", "load", "offset",
           "render", "scalar"]
