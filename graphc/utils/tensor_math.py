"""`MathMethods`: the Tensor methods of PyTorch's wider math surface, written out.

Every method is one line that forwards to the function of the same meaning: the primitives of
graphc.ops.mathops (floor, tan, atan2, fmod...) and the composites of
graphc.utils.math_composites (square, lerp, isnan, nan_to_num...) and graphc.utils.selection
(sort, median, unique...). It is the base of graphc.tensor_methods.TensorMethods, so
`graphc.Tensor` has them all; nothing here computes but the two random fills at the end.

>>> import graphc
>>> graphc.tensor([1.5, -0.5]).floor()
tensor([ 1., -1.])
"""

from __future__ import annotations

from graphc.errors import DTypeError
from graphc.ops import elementwise, mathops, random
from graphc.ops.registry import inplace
from graphc.utils import math_composites as mc
from graphc.utils import selection as sel


def _update(target, name: str, fn, *args, **kwargs):
    """`target` changed in place to `fn(old, *args, **kwargs)`
    (graphc.autograd.inplace.apply_inplace)."""
    return inplace(target, name, lambda old: fn(old, *args, **kwargs))


class MathMethods:
    """Math, comparison, scan and selection methods of `graphc.Tensor` (module docstring)."""

    __slots__ = ()

    def floor(self):
        """The largest integer <= x, elementwise."""
        return mathops.floor(self)

    def ceil(self):
        """The smallest integer >= x, elementwise."""
        return mathops.ceil(self)

    def trunc(self):
        """x rounded toward zero, elementwise."""
        return mathops.trunc(self)

    def fix(self):
        """trunc (PyTorch's alias)."""
        return mathops.trunc(self)

    def round(self, *, decimals=0):
        """x rounded half to even (to `decimals` places)."""
        return mathops.round(self, decimals=decimals)

    def tan(self):
        """The tangent of x, elementwise."""
        return mathops.tan(self)

    def atan(self):
        """The arctangent of x, elementwise."""
        return mathops.atan(self)

    def arctan(self):
        """atan (numpy's name)."""
        return mathops.atan(self)

    def asin(self):
        """The arcsine of x, elementwise."""
        return mathops.asin(self)

    def arcsin(self):
        """asin (numpy's name)."""
        return mathops.asin(self)

    def acos(self):
        """The arccosine of x, elementwise."""
        return mathops.acos(self)

    def arccos(self):
        """acos (numpy's name)."""
        return mathops.acos(self)

    def sinh(self):
        """The hyperbolic sine of x, elementwise."""
        return mathops.sinh(self)

    def cosh(self):
        """The hyperbolic cosine of x, elementwise."""
        return mathops.cosh(self)

    def expm1(self):
        """exp(x) - 1, accurate near 0."""
        return mathops.expm1(self)

    def log2(self):
        """The base-2 logarithm of x, elementwise."""
        return mathops.log2(self)

    def log10(self):
        """The base-10 logarithm of x, elementwise."""
        return mathops.log10(self)

    def atan2(self, other):
        """The angle of the point (other, self), elementwise."""
        return mathops.atan2(self, other)

    def arctan2(self, other):
        """atan2 (numpy's name)."""
        return mathops.atan2(self, other)

    def fmod(self, other):
        """C's fmod: the remainder with the dividend's sign."""
        return mathops.fmod(self, other)

    def square(self):
        """self * self."""
        return mc.square(self)

    def reciprocal(self):
        """1 / self (integers give float32)."""
        return mc.reciprocal(self)

    def true_divide(self, other):
        """self / other (true division)."""
        return mc.true_divide(self, other)

    def absolute(self):
        """|self| (abs)."""
        return mc.absolute(self)

    def sgn(self):
        """The sign of self (sign, for real tensors)."""
        return mc.sgn(self)

    def frac(self):
        """self - trunc(self)."""
        return mc.frac(self)

    def signbit(self):
        """True where the sign bit is set (-0.0 included)."""
        return mc.signbit(self)

    def addcmul(self, tensor1, tensor2, *, value=1):
        """self + value * tensor1 * tensor2."""
        return mc.addcmul(self, tensor1, tensor2, value=value)

    def addcdiv(self, tensor1, tensor2, *, value=1):
        """self + value * tensor1 / tensor2."""
        return mc.addcdiv(self, tensor1, tensor2, value=value)

    def lerp(self, end, weight):
        """self + weight * (end - self)."""
        return mc.lerp(self, end, weight)

    def hypot(self, other):
        """sqrt(self**2 + other**2)."""
        return mc.hypot(self, other)

    def logaddexp(self, other):
        """log(exp(self) + exp(other)), stably."""
        return mc.logaddexp(self, other)

    def clamp_min(self, min):  # noqa: A002
        """max(self, min)."""
        return mc.clamp_min(self, min)

    def clamp_max(self, max):  # noqa: A002
        """min(self, max)."""
        return mc.clamp_max(self, max)

    def isnan(self):
        """True where self is NaN."""
        return mc.isnan(self)

    def isinf(self):
        """True where self is +-inf."""
        return mc.isinf(self)

    def isposinf(self):
        """True where self is +inf."""
        return mc.isposinf(self)

    def isneginf(self):
        """True where self is -inf."""
        return mc.isneginf(self)

    def isfinite(self):
        """True where self is neither inf nor NaN."""
        return mc.isfinite(self)

    def nan_to_num(self, nan=0.0, posinf=None, neginf=None):
        """NaN and infinities replaced by finite values."""
        return mc.nan_to_num(self, nan, posinf, neginf)

    def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        """Elementwise closeness (bool)."""
        return mc.isclose(self, other, rtol, atol, equal_nan)

    def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        """Whether isclose holds everywhere (a Python bool)."""
        return mc.allclose(self, other, rtol, atol, equal_nan)

    def equal(self, other):
        """Same shape and elements (a Python bool)."""
        return mc.equal(self, other)

    def count_nonzero(self, dim=None):
        """The number of non-zero elements (over dim)."""
        return mc.count_nonzero(self, dim)

    def nansum(self, dim=None, keepdim=False, *, dtype=None):
        """sum with NaN counted as zero."""
        return mc.nansum(self, dim, keepdim, dtype=dtype)

    def nanmean(self, dim=None, keepdim=False, *, dtype=None):
        """mean over the elements that are not NaN."""
        return mc.nanmean(self, dim, keepdim, dtype=dtype)

    def dist(self, other, p=2):
        """The p-norm of self - other."""
        return mc.dist(self, other, p)

    def addmm(self, mat1, mat2, *, beta=1, alpha=1):
        """beta * self + alpha * (mat1 @ mat2)."""
        return mc.addmm(self, mat1, mat2, beta=beta, alpha=alpha)

    def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
        """beta * self + alpha * (batch1 @ batch2)."""
        return mc.baddbmm(self, batch1, batch2, beta=beta, alpha=alpha)

    def kron(self, other):
        """The Kronecker product."""
        return mc.kron(self, other)

    def cross(self, other, dim=None):
        """The cross product of 3-vectors along dim."""
        return mc.cross(self, other, dim)

    def erfinv(self):
        """The inverse error function, elementwise."""
        return mc.erfinv(self)

    def erfinv_(self):
        """In-place erfinv."""
        return mc.erfinv_(self)

    def cumprod(self, dim, *, dtype=None):
        """Running product along dim."""
        return mc.cumprod(self, dim, dtype=dtype)

    def logcumsumexp(self, dim):
        """log(cumsum(exp(self))) along dim, stably."""
        return mc.logcumsumexp(self, dim)

    def sort(self, dim=-1, descending=False, stable=False):
        """(values, indices) sorted along dim."""
        return sel.sort(self, dim, descending, stable)

    def argsort(self, dim=-1, descending=False, stable=False):
        """The indices that sort self along dim."""
        return sel.argsort(self, dim, descending, stable)

    def msort(self):
        """self sorted along dim 0."""
        return sel.msort(self)

    def kthvalue(self, k, dim=-1, keepdim=False):
        """(values, indices) of the k-th smallest along dim."""
        return sel.kthvalue(self, k, dim, keepdim)

    def median(self, dim=None, keepdim=False):
        """The lower median (with dim: values and indices)."""
        return sel.median(self, dim, keepdim)

    def cummax(self, dim):
        """(values, indices) of the running maximum."""
        return sel.cummax(self, dim)

    def cummin(self, dim):
        """(values, indices) of the running minimum."""
        return sel.cummin(self, dim)

    def nonzero(self, *, as_tuple=False):
        """Indices of the non-zero elements (eager only)."""
        return sel.nonzero(self, as_tuple=as_tuple)

    def argwhere(self):
        """nonzero as a (count, ndim) tensor (eager only)."""
        return sel.argwhere(self)

    def masked_select(self, mask):
        """The elements where mask is True, 1-D (eager only)."""
        return sel.masked_select(self, mask)

    def masked_scatter(self, mask, source):
        """self with mask's True positions filled from source (eager only)."""
        return sel.masked_scatter(self, mask, source)

    def unique(self, sorted=True, return_inverse=False, return_counts=False, dim=None):
        """The distinct values (eager only)."""
        return sel.unique(self, sorted, return_inverse, return_counts, dim)

    def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
        """Runs of equal values collapsed (eager only)."""
        return sel.unique_consecutive(self, return_inverse, return_counts, dim)

    def floor_(self):
        """In-place floor."""
        return _update(self, 'floor_', mathops.floor)

    def ceil_(self):
        """In-place ceil."""
        return _update(self, 'ceil_', mathops.ceil)

    def trunc_(self):
        """In-place trunc."""
        return _update(self, 'trunc_', mathops.trunc)

    def round_(self, *, decimals=0):
        """In-place round."""
        return _update(self, 'round_', mathops.round, decimals=decimals)

    def fmod_(self, other):
        """In-place fmod."""
        return _update(self, 'fmod_', mathops.fmod, other)

    def square_(self):
        """In-place square."""
        return mc.square_(self)

    def reciprocal_(self):
        """In-place reciprocal."""
        return mc.reciprocal_(self)

    def addcmul_(self, tensor1, tensor2, *, value=1):
        """In-place addcmul (optimizers' update)."""
        return mc.addcmul_(self, tensor1, tensor2, value=value)

    def addcdiv_(self, tensor1, tensor2, *, value=1):
        """In-place addcdiv (optimizers' update)."""
        return mc.addcdiv_(self, tensor1, tensor2, value=value)

    def lerp_(self, end, weight):
        """In-place lerp (EMA updates)."""
        return mc.lerp_(self, end, weight)

    def clamp_min_(self, min):  # noqa: A002
        """In-place clamp_min."""
        return mc.clamp_min_(self, min)

    def clamp_max_(self, max):  # noqa: A002
        """In-place clamp_max."""
        return mc.clamp_max_(self, max)

    def nan_to_num_(self, nan=0.0, posinf=None, neginf=None):
        """In-place nan_to_num."""
        return mc.nan_to_num_(self, nan, posinf, neginf)

    def exponential_(self, lambd=1.0, *, generator=None):
        """Fill self with exponential draws of rate lambd (in place)."""
        return _exponential_(self, lambd, generator)

    def random_(self, from_=0, to=None, *, generator=None):
        """Fill self with integers drawn uniformly from [from_, to) (in place)."""
        return _random_(self, from_, to, generator)

    def half(self):
        """Refused: graphc has no float16 (a clear error rather than float32 in disguise)."""
        raise DTypeError("Tensor.half(): graphc has no float16 dtype (it keeps float32, "
                         "float64, int64 and bool); use .float()")

    def bfloat16(self):
        """Refused: graphc has no bfloat16."""
        raise DTypeError("Tensor.bfloat16(): graphc has no bfloat16 dtype (it keeps float32, "
                         "float64, int64 and bool); use .float()")


def _exponential_(self, lambd, generator):
    """-log(1 - u) / lambd with u uniform in [0, 1): exponential draws of rate lambd."""
    if lambd <= 0:
        raise ValueError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")

    def draw(old):
        u = random.rand(tuple(old.shape), generator=generator, dtype=old.dtype)
        return -elementwise.log1p(-u) / lambd

    return inplace(self, "exponential_", draw)


def _random_(self, from_, to, generator):
    """Integers uniform in [from_, to) (to: 2**mantissa bits + 1 for floats, as PyTorch)."""
    if to is None:
        to = {"float32": 2**24 + 1, "float64": 2**53 + 1, "int64": 2**63 - 1,
              "bool": 2}[self.dtype.name]
    if from_ >= to:
        raise ValueError(f"random_ expects 'from' to be less than 'to', but got from={from_} "
                         f">= to={to}")

    def draw(old):
        ints = random.randint(from_, to, tuple(old.shape), generator=generator)
        return ints.to(old.dtype)

    return inplace(self, "random_", draw)
