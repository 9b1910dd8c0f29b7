"""Composite math functions of PyTorch's surface, built from registry primitives.

Each is a decomposition (so it runs eagerly with autograd, traces, and compiles on every
backend with no lowering of its own), written where a primitive would gain nothing:

- arithmetic: `square` (x*x), `reciprocal` (1/x), `addcmul`, `addcdiv`, `lerp` (PyTorch's
  two-sided formula: start + w*(end-start) for |w| < 0.5, else end - (end-start)*(1-w)),
  `hypot`, `logaddexp` (max + log1p(exp(-|a-b|)), equal infinities kept), `frac`, `sgn`,
  `true_divide`, `absolute`, `clamp_min`/`clamp_max` (tensor bounds go through maximum/minimum);
- classification: `isnan` (x != x), `isinf`, `isfinite`, `isposinf`, `isneginf`, `signbit`,
  `nan_to_num`, `isclose`, and the Python-bool answers `allclose`, `equal` (they read values:
  inside a trace they stop with the trace's `.item()` error, as torch.compile graph-breaks);
- reductions and scans: `count_nonzero`, `nansum`, `nanmean`, `std_mean`, `var_mean`,
  `dist`, `cdist` (the direct form: sum |x1 - x2|^p, no matmul expansion), `cumprod` and
  `logcumsumexp` (Hillis-Steele scans as cumsum: log2(n) shifted steps), `addmm`, `baddbmm`,
  `tensordot`, `kron`, `cross`.

>>> import graphc
>>> graphc.lerp(graphc.tensor([0.0, 10.0]), graphc.tensor([10.0, 20.0]), 0.5)
tensor([ 5., 15.])
"""

from __future__ import annotations

import math
from collections import namedtuple

from graphc.errors import ArgumentError, DTypeError, ShapeError
from graphc.ops import elementwise, linalg, mathops, movement, reduce
from graphc.ops.registry import call, inplace_method
from graphc.ops.shapes import normalize_axis
from graphc.types import as_dtype, bool_, float32, float64, int64

StdMean = namedtuple("std_mean", ("std", "mean"))
VarMean = namedtuple("var_mean", ("var", "mean"))

_FLOAT_MAX = {"float32": 3.4028234663852886e38, "float64": 1.7976931348623157e308}


def _is_tensor(x) -> bool:
    from graphc.tensor import Tensor  # graphc.tensor imports the mixins that import this module

    return isinstance(x, Tensor)


def _tensor_of(x, like=None):
    """A Python number as a 0-d tensor of `like`'s dtype family, or the tensor itself."""
    if _is_tensor(x):
        return x
    dtype = like.dtype if like is not None and like.dtype.is_floating else None
    if dtype is None:
        dtype = bool_ if isinstance(x, bool) else int64 if isinstance(x, int) else float32
    return call("full", shape=(), value=x, dtype=dtype.name)


def _dtype_name(dtype) -> str:
    return {"float32": "Float", "float64": "Double", "int64": "Long", "bool": "Bool"}[dtype.name]


# ---- arithmetic ------------------------------------------------------------------------------
def square(input):  # noqa: A002 (PyTorch's argument names)
    """input * input (bool becomes int64, as torch.square)."""
    if input.dtype is bool_:
        input = elementwise.cast(input, int64)
    return input * input


def reciprocal(input):  # noqa: A002
    """1 / input (integers give float32)."""
    return elementwise.div(1.0, input) if input.dtype.is_floating else \
        elementwise.div(1.0, elementwise.cast(input, float32))


def true_divide(input, other):  # noqa: A002
    """input / other: true division (torch.true_divide, an alias of div)."""
    return elementwise.div(input, other)


def absolute(input):  # noqa: A002
    """|input| (torch.absolute, an alias of abs)."""
    return elementwise.abs(input)


def sgn(input):  # noqa: A002
    """The sign of input (for real tensors, sign)."""
    return elementwise.sign(input)


def frac(input):  # noqa: A002
    """input - trunc(input): the fractional part, with input's sign."""
    if not input.dtype.is_floating:
        raise DTypeError(f"\"frac_cpu\" not implemented for '{_dtype_name(input.dtype)}'")
    return input - mathops.trunc(input)


def addcmul(input, tensor1, tensor2, *, value=1):  # noqa: A002
    """input + value * tensor1 * tensor2 (broadcasting all three)."""
    prod = tensor1 * tensor2
    return input + (prod if value == 1 else prod * value)


def addcdiv(input, tensor1, tensor2, *, value=1):  # noqa: A002
    """input + value * tensor1 / tensor2; integer tensor1 and tensor2 are refused, as PyTorch."""
    if not tensor1.dtype.is_floating and not tensor2.dtype.is_floating:
        raise DTypeError(
            "Integer division with addcdiv is no longer supported, and in a future  release "
            "addcdiv will perform a true division of tensor1 and tensor2. The historic addcdiv "
            "behavior can be implemented as (input + value * torch.trunc(tensor1 / tensor2))."
            "to(input.dtype) for integer inputs and as (input + value * tensor1 / tensor2) for "
            "float inputs. The future addcdiv behavior is just the latter implementation: "
            "(input + value * tensor1 / tensor2), for all dtypes.")
    quot = tensor1 / tensor2
    return input + (quot if value == 1 else quot * value)


def lerp(input, end, weight):  # noqa: A002
    """input + weight * (end - input), with PyTorch's formula (exact at weight 1)."""
    if _is_tensor(weight) and weight.dtype is not input.dtype:
        raise DTypeError(f"expected dtype {_c_name(input.dtype)} for "
                         f"`weight` but got dtype {_c_name(weight.dtype)}")
    diff = end - input
    if not _is_tensor(weight):
        w = float(weight)
        return input + diff * w if abs(w) < 0.5 else end - diff * (1.0 - w)
    low = elementwise.abs(weight) < 0.5
    return elementwise.where(low, input + diff * weight, end - diff * (1.0 - weight))


def _c_name(dtype) -> str:
    return {"float32": "float", "float64": "double", "int64": "long int",
            "bool": "bool"}[dtype.name]


def hypot(input, other):  # noqa: A002
    """sqrt(input**2 + other**2), elementwise."""
    return elementwise.sqrt(input * input + other * other)


def logaddexp(input, other):  # noqa: A002
    """log(exp(input) + exp(other)) without overflow (equal infinities give themselves)."""
    a, b = _tensor_of(input, other), _tensor_of(other, input)
    top = elementwise.maximum(a, b)
    out = top + elementwise.log1p(elementwise.exp(-elementwise.abs(a - b)))
    same_inf = elementwise.logical_and(a == b, isinf(a))
    return elementwise.where(same_inf, a, out)


def clamp_min(input, min):  # noqa: A002
    """max(input, min): `min` a number or a broadcast tensor."""
    if _is_tensor(min):
        return elementwise.maximum(input, min)
    return elementwise.clamp(input, min=min)


def clamp_max(input, max):  # noqa: A002
    """min(input, max): `max` a number or a broadcast tensor."""
    if _is_tensor(max):
        return elementwise.minimum(input, max)
    return elementwise.clamp(input, max=max)


def clip(input, min=None, max=None):  # noqa: A002
    """clamp (torch.clip): tensor bounds broadcast, number bounds are attributes."""
    if _is_tensor(min) or _is_tensor(max):
        out = input
        if min is not None:
            out = clamp_min(out, min)
        if max is not None:
            out = clamp_max(out, max)
        return out
    return elementwise.clamp(input, min, max)


# ---- erfinv ------------------------------------------------------------------------------------
_GILES_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                  0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_GILES_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
               -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)
_SQRT_PI_2 = math.sqrt(math.pi) / 2.0


def _horner(coeffs, w):
    acc = w * coeffs[0] + coeffs[1]
    for c in coeffs[2:]:
        acc = acc * w + c
    return acc


def erfinv(input):  # noqa: A002
    """The inverse error function: Giles' approximation (about 1e-7) refined by Newton steps
    on erf (one for float32, two for float64); +-1 give +-inf, |x| > 1 NaN. The last step is
    written so autograd sees sqrt(pi)/2 * exp(y^2), PyTorch's derivative."""
    x = input if input.dtype.is_floating else elementwise.cast(input, float32)
    xd = x.detach()
    w = -elementwise.log((1.0 - xd) * (1.0 + xd))
    central = _horner(_GILES_CENTRAL, w - 2.5)
    tail = _horner(_GILES_TAIL, elementwise.sqrt(elementwise.clamp(w, min=5.0)) - 3.0)
    y = elementwise.where(w < 5.0, central, tail) * xd
    for last in ([True] if x.dtype is float32 else [False, True]):
        slope = elementwise.exp(y * y) * _SQRT_PI_2  # 1 / erf'(y), y without history
        y = y + ((x if last else xd) - elementwise.erf(y)) * slope  # last: dy/dx = slope
    edge = elementwise.abs(xd) == 1.0
    y = elementwise.where(edge, xd * math.inf, y)
    return elementwise.where(elementwise.abs(xd) > 1.0, _fill(math.nan, x), y)


# ---- classification --------------------------------------------------------------------------
def isnan(input):  # noqa: A002
    """True where input is NaN (never for integer and bool tensors)."""
    return input != input


def isinf(input):  # noqa: A002
    """True where input is +inf or -inf."""
    if not input.dtype.is_floating:
        return input != input
    return elementwise.abs(input) == math.inf


def isposinf(input):  # noqa: A002
    """True where input is +inf."""
    return input == math.inf if input.dtype.is_floating else input != input


def isneginf(input):  # noqa: A002
    """True where input is -inf."""
    return input == -math.inf if input.dtype.is_floating else input != input


def isfinite(input):  # noqa: A002
    """True where input is neither inf nor NaN."""
    if not input.dtype.is_floating:
        return input == input
    return elementwise.abs(input) < math.inf


def signbit(input):  # noqa: A002
    """True where input's sign bit is set (-0.0 included; the sign of a NaN is not read)."""
    if not input.dtype.is_floating:
        return input < 0
    negative_zero = elementwise.logical_and(input == 0, elementwise.div(1.0, input) < 0)
    return elementwise.logical_or(input < 0, negative_zero)


def nan_to_num(input, nan=0.0, posinf=None, neginf=None):  # noqa: A002
    """NaN, +inf and -inf replaced by `nan`, `posinf` (default: the dtype's largest finite
    value) and `neginf` (its lowest)."""
    if not input.dtype.is_floating:
        return movement.clone(input)
    big = _FLOAT_MAX[input.dtype.name]
    posinf = big if posinf is None else posinf
    neginf = -big if neginf is None else neginf
    out = elementwise.where(input == math.inf, _fill(posinf, input), input)
    out = elementwise.where(input == -math.inf, _fill(neginf, input), out)
    return elementwise.where(input != input, _fill(nan, input), out)


def _fill(value, like):
    return call("full", shape=(), value=float(value), dtype=like.dtype.name)


def isclose(input, other, rtol: float = 1e-05, atol: float = 1e-08,  # noqa: A002
            equal_nan: bool = False):
    """|input - other| <= atol + rtol * |other|, elementwise (bool); equal infinities match."""
    if input.dtype is not other.dtype:
        raise DTypeError(f"{_dtype_name(input.dtype)} did not match "
                         f"{_dtype_name(other.dtype)}")
    if rtol < 0:
        raise ArgumentError(f"rtol must be greater than or equal to zero, but got {rtol}")
    if atol < 0:
        raise ArgumentError(f"atol must be greater than or equal to zero, but got {atol}")
    same = input == other
    if input.dtype is bool_:
        return same
    a, b = input, other
    if not a.dtype.is_floating:
        a, b = elementwise.cast(a, float64), elementwise.cast(b, float64)
    near = elementwise.abs(a - b) <= elementwise.abs(b) * rtol + atol
    out = elementwise.logical_or(same, near)
    if equal_nan:
        out = elementwise.logical_or(out, elementwise.logical_and(isnan(a), isnan(b)))
    return out


def allclose(input, other, rtol: float = 1e-05, atol: float = 1e-08,  # noqa: A002
             equal_nan: bool = False) -> bool:
    """Whether isclose holds everywhere (a Python bool: it reads values)."""
    return bool(reduce.all(isclose(input, other, rtol, atol, equal_nan)).item())


def equal(input, other) -> bool:  # noqa: A002
    """True when both tensors have the same shape and elements (a Python bool)."""
    if tuple(input.shape) != tuple(other.shape):
        return False
    return bool(reduce.all(input == other).item())


# ---- reductions ------------------------------------------------------------------------------
def count_nonzero(input, dim=None):  # noqa: A002
    """The number of non-zero elements (over `dim`, an int or a tuple; all by default)."""
    return reduce.sum(input != 0, dim=dim)


def nansum(input, dim=None, keepdim: bool = False, *, dtype=None):  # noqa: A002
    """sum, treating NaN as zero."""
    clean = elementwise.where(isnan(input), _zero(input), input)
    return reduce.sum(clean, dim=dim, keepdim=keepdim, dtype=dtype)


def nanmean(input, dim=None, keepdim: bool = False, *, dtype=None):  # noqa: A002
    """mean over the elements that are not NaN (NaN where there are none)."""
    if not input.dtype.is_floating:
        raise DTypeError(f"nanmean(): expected input to have floating point or complex dtype "
                         f"but got {_dtype_name(input.dtype)}")
    present = elementwise.logical_not(isnan(input))
    total = nansum(input, dim, keepdim, dtype=dtype)
    return total / elementwise.cast(reduce.sum(present, dim=dim, keepdim=keepdim), total.dtype)


def _zero(like):
    return call("full", shape=(), value=0, dtype=like.dtype.name)


def std_mean(input, dim=None, unbiased=None, keepdim: bool = False, *,  # noqa: A002
             correction=None):
    """(std, mean) over `dim`, as torch.std_mean."""
    return StdMean(reduce.std(input, dim, unbiased, keepdim, correction=correction),
                   reduce.mean(input, dim, keepdim))


def var_mean(input, dim=None, unbiased=None, keepdim: bool = False, *,  # noqa: A002
             correction=None):
    """(var, mean) over `dim`, as torch.var_mean."""
    return VarMean(reduce.var(input, dim, unbiased, keepdim, correction=correction),
                   reduce.mean(input, dim, keepdim))


def dist(input, other, p=2):  # noqa: A002
    """The p-norm of input - other."""
    return reduce.norm(input - other, p=p)


def cdist(x1, x2, p: float = 2.0, compute_mode=None):
    """Pairwise p-norm distances between the rows of x1 (..., P, M) and x2 (..., R, M).

    p = 2 with more than 25 rows on a side uses PyTorch's matmul expansion
    (|a|^2 + |b|^2 - 2 a.b, clamped at 0), as its default compute_mode does; otherwise the
    direct form (sum |a - b|^p). A zero distance gets a zero gradient, as in PyTorch.
    """
    if x1.ndim < 2 or x2.ndim < 2:
        raise ShapeError(f"cdist only supports at least 2D tensors, X{1 if x1.ndim < 2 else 2} "
                         f"got: {x1.ndim if x1.ndim < 2 else x2.ndim}D")
    if x1.shape[-1] != x2.shape[-1]:
        raise ShapeError(f"X1 and X2 must have the same number of columns. X1: "
                         f"{x1.shape[-1]} X2: {x2.shape[-1]}")
    if p < 0:
        raise ArgumentError(f"cdist only supports non-negative p values, got {p}")
    modes = (None, "use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist",
             "donot_use_mm_for_euclid_dist")
    if compute_mode not in modes:
        raise ArgumentError(f"{compute_mode} is not a valid value for compute_mode")
    use_mm = p == 2 and (compute_mode == "use_mm_for_euclid_dist" or (
        compute_mode in (None, modes[1]) and (x1.shape[-2] > 25 or x2.shape[-2] > 25)))
    if use_mm:
        sq1 = reduce.sum(x1 * x1, dim=-1, keepdim=True)
        sq2 = movement.unsqueeze(reduce.sum(x2 * x2, dim=-1), -2)
        cross_term = linalg.matmul(x1, movement.transpose(x2, -2, -1))
        return _root(elementwise.clamp(sq1 + sq2 - cross_term * 2.0, min=0.0), 2.0)
    diff = elementwise.abs(movement.unsqueeze(x1, -2) - movement.unsqueeze(x2, -3))
    if p == 0:
        return reduce.sum(elementwise.cast(diff != 0, diff.dtype), dim=-1)
    if p == math.inf:
        return reduce.amax(diff, dim=-1)
    if p == 1:
        return reduce.sum(diff, dim=-1)
    if p == 2:
        return _root(reduce.sum(diff * diff, dim=-1), 2.0)
    return _root(reduce.sum(diff ** float(p), dim=-1), float(p))


def _root(total, p: float):
    """total ** (1/p), with a zero gradient where total is 0 (not inf * 0)."""
    positive = total > 0
    safe = elementwise.where(positive, total, _one_of(total))
    root = elementwise.sqrt(safe) if p == 2.0 else safe ** (1.0 / p)
    return elementwise.where(positive, root, _zero(total))


def _one_of(like):
    return call("full", shape=(), value=1.0, dtype=like.dtype.name)


def addmm(input, mat1, mat2, *, beta=1, alpha=1):  # noqa: A002
    """beta * input + alpha * (mat1 @ mat2)."""
    if mat1.ndim != 2:
        raise ShapeError(f"mat1 must be a matrix, got {mat1.ndim}-D tensor")
    if mat2.ndim != 2:
        raise ShapeError(f"mat2 must be a matrix, got {mat2.ndim}-D tensor")
    return _scaled_sum(input, linalg.mm(mat1, mat2), beta, alpha)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):  # noqa: A002
    """beta * input + alpha * (batch1 @ batch2) for batches of matrices."""
    if batch1.ndim != 3:
        raise ShapeError("batch1 must be a 3D tensor")
    if batch2.ndim != 3:
        raise ShapeError("batch2 must be a 3D tensor")
    return _scaled_sum(input, linalg.bmm(batch1, batch2), beta, alpha)


def _scaled_sum(input, product, beta, alpha):  # noqa: A002
    if alpha != 1:
        product = product * alpha
    if beta == 0:  # PyTorch ignores input then (its NaNs and infs included)
        return product
    return (input if beta == 1 else input * beta) + product


def tensordot(a, b, dims=2):
    """Sum over the last `dims` dims of a and the first of b (or the listed pairs of dims)."""
    if isinstance(dims, int):
        if dims < 0:
            raise ArgumentError(f"tensordot expects dims >= 0, but got dims={dims}")
        dims_a = list(range(a.ndim - dims, a.ndim))
        dims_b = list(range(dims))
    else:
        dims_a, dims_b = dims
        dims_a = [dims_a] if isinstance(dims_a, int) else list(dims_a)
        dims_b = [dims_b] if isinstance(dims_b, int) else list(dims_b)
        if len(dims_a) != len(dims_b):
            raise ArgumentError("both dimension lists should have same length")
    dims_a = [normalize_axis("tensordot", d, a.ndim) for d in dims_a]
    dims_b = [normalize_axis("tensordot", d, b.ndim) for d in dims_b]
    for da, db in zip(dims_a, dims_b):
        if a.shape[da] != b.shape[db]:
            raise ShapeError(f"contracted dimensions need to match, but first has size "
                             f"{a.shape[da]} in dim {da} and second has size {b.shape[db]} in "
                             f"dim {db}")
    keep_a = [d for d in range(a.ndim) if d not in dims_a]
    keep_b = [d for d in range(b.ndim) if d not in dims_b]
    k = math.prod(a.shape[d] for d in dims_a)
    left = movement.reshape(movement.permute(a, *keep_a, *dims_a),
                            (math.prod(a.shape[d] for d in keep_a), k))
    right = movement.reshape(movement.permute(b, *dims_b, *keep_b),
                             (k, math.prod(b.shape[d] for d in keep_b)))
    out = linalg.mm(left, right)
    return movement.reshape(out, tuple(a.shape[d] for d in keep_a) +
                            tuple(b.shape[d] for d in keep_b))


def kron(input, other):  # noqa: A002
    """The Kronecker product: blocks input[i] * other."""
    n = max(input.ndim, other.ndim)
    a = movement.reshape(input, (1,) * (n - input.ndim) + tuple(input.shape))
    b = movement.reshape(other, (1,) * (n - other.ndim) + tuple(other.shape))
    a_shape, b_shape = [], []
    for k in range(n):
        a_shape += [a.shape[k], 1]
        b_shape += [1, b.shape[k]]
    out = movement.reshape(a, tuple(a_shape)) * movement.reshape(b, tuple(b_shape))
    return movement.reshape(out, tuple(a.shape[k] * b.shape[k] for k in range(n)))


def cross(input, other, dim=None):  # noqa: A002
    """The cross product of 3-vectors along `dim` (default: the first dim of size 3)."""
    if input.ndim != other.ndim:
        raise ShapeError("linalg.cross: inputs must have the same number of dimensions.")
    if dim is None:
        dims = [k for k in range(input.ndim) if input.shape[k] == 3]
        if not dims:
            raise ShapeError("no dimension of size 3 in input")
        dim = dims[0]
    d = normalize_axis("cross", dim, input.ndim)
    if input.shape[d] != 3 or other.shape[d] != 3:
        raise ShapeError(f"linalg.cross: inputs dimension {d} must have length 3. Got "
                         f"{input.shape[d]} and {other.shape[d]}")
    a = [movement.narrow(input, d, k, 1) for k in range(3)]
    b = [movement.narrow(other, d, k, 1) for k in range(3)]
    return movement.cat([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2],
                         a[0] * b[1] - a[1] * b[0]], d)


# ---- scans -----------------------------------------------------------------------------------
def _scan(x, d: int, combine, fill):
    """Hillis-Steele inclusive scan of `combine` along d (log2(n) shifted steps)."""
    n = x.shape[d]
    trailing = x.ndim - 1 - d
    shift = 1
    while shift < n:
        pads = (0, 0) * trailing + (shift, 0)
        x = combine(movement.narrow(movement.pad(x, pads, value=fill), d, 0, n), x)
        shift *= 2
    return x


def cumprod(input, dim: int, *, dtype=None):  # noqa: A002
    """Running product along `dim` (bool and integers give int64), as torch.cumprod."""
    d = normalize_axis("cumprod", dim, max(input.ndim, 1))
    x = input
    if dtype is not None:
        x = elementwise.cast(x, as_dtype(dtype))
    elif not x.dtype.is_floating:
        x = elementwise.cast(x, int64)
    if x.ndim == 0:
        return movement.clone(x)
    out = _scan(x, d, elementwise.mul, 1)
    return out if out is not input else movement.clone(out)


def logcumsumexp(input, dim: int):  # noqa: A002
    """log(cumsum(exp(input))) along `dim`, without overflow."""
    if not input.dtype.is_floating:
        raise DTypeError(f"\"logcumsumexp_out_cpu\" not implemented for "
                         f"'{_dtype_name(input.dtype)}'")
    d = normalize_axis("logcumsumexp", dim, max(input.ndim, 1))
    if input.ndim == 0:
        return movement.clone(input)
    out = _scan(input, d, logaddexp, -math.inf)
    return out if out is not input else movement.clone(out)


# ---- in-place variants -----------------------------------------------------------------------
square_ = inplace_method("square_", square)
reciprocal_ = inplace_method("reciprocal_", reciprocal)
addcmul_ = inplace_method("addcmul_", addcmul)
addcdiv_ = inplace_method("addcdiv_", addcdiv)
lerp_ = inplace_method("lerp_", lerp)
clamp_min_ = inplace_method("clamp_min_", clamp_min)
clamp_max_ = inplace_method("clamp_max_", clamp_max)
nan_to_num_ = inplace_method("nan_to_num_", nan_to_num)
cumprod_ = inplace_method("cumprod_", cumprod)
erfinv_ = inplace_method("erfinv_", erfinv)

PUBLIC = ("square", "reciprocal", "true_divide", "absolute", "sgn", "frac", "addcmul",
          "addcdiv", "lerp", "hypot", "logaddexp", "clamp_min", "clamp_max", "clip", "isnan",
          "isinf", "isposinf", "isneginf", "isfinite", "signbit", "nan_to_num", "isclose",
          "allclose", "equal", "count_nonzero", "nansum", "nanmean", "std_mean", "var_mean",
          "dist", "cdist", "addmm", "baddbmm", "tensordot", "kron", "cross", "cumprod",
          "logcumsumexp", "erfinv")
