"""`TensorMethods`: Tensor's operators and math methods, written out (tinygrad's style).

Every method is one line that forwards to the op module function of the same meaning
(`Tensor.tanh` is `graphc.ops.elementwise.tanh`), so grep, IDEs and type checkers find it and
eager mode and trace mode see the same calls; nothing here computes. Shape methods (reshape,
indexing, gather, `new_*`) are in graphc.tensor_shape; the Tensor class (graphc.tensor) takes
both mixins. Python operators follow PyTorch: a foreign operand (not a tensor, number or numpy
array) makes an operator return NotImplemented, so `tensor == None` is False.

>>> import graphc
>>> graphc.tensor([0.0, 1.0]).tanh()
tensor([0.0000, 0.7616])
"""

from __future__ import annotations

import numpy as np

from graphc.ops import elementwise, linalg, nn_ops, random, reduce
from graphc.ops.registry import call, inplace
from graphc.types import as_dtype, bool_, float32, float64, int64
from graphc.utils import composites
from graphc.utils.tensor_math import MathMethods


def _operand(other):
    """A binary operator's other operand as something `call` takes, or None if it is foreign.

    Tensors and Python/numpy numbers pass; an ndarray becomes a tensor (as PyTorch does);
    anything else makes the operator return NotImplemented, so Python tries the reflected
    method and `tensor == None` is False rather than an error.
    """
    if isinstance(other, (TensorMethods, bool, int, float, np.number, np.bool_)):
        return other
    if isinstance(other, np.ndarray):
        from graphc.tensor import Tensor

        return Tensor._wrap(np.array(other))
    return None


def _binary(op: str, a, b, reflected: bool = False):
    """`a <op> b` for an operator method (`b <op> a` when reflected), NotImplemented for a
    foreign operand."""
    if not isinstance(b, TensorMethods):
        b = _operand(b)
        if b is None:
            return NotImplemented
    return call(op, b, a) if reflected else call(op, a, b)


def _augmented(op: str, target, other):
    """`target <op>= other`: the in-place variant of an operator (`x += y` is `x.add_(y)`)."""
    other = _operand(other)
    if other is None:
        return NotImplemented
    return inplace(target, op + "_", None, (other,), op)


def _update(target, name: str, fn, *args, **kwargs):
    """`target` changed in place to `fn(old, *args, **kwargs)`
    (graphc.autograd.inplace.apply_inplace)."""
    return inplace(target, name, lambda old: fn(old, *args, **kwargs),
                   operands=(*args, *kwargs.values()))


def _update_by(target, name: str, op: str, fn, *args, **kwargs):
    """`_update`, where `fn(old, *args)` without keywords is the registry op `op` applied to
    `(old, *args)`: saying so lets eager mode take the shorter in-place path (the in-place
    dispatcher applies `op` itself)."""
    if kwargs:
        return _update(target, name, fn, *args, **kwargs)
    return inplace(target, name, None, args, op)


class TensorMethods(MathMethods):
    """Operators and math methods of `graphc.Tensor` (see the module docstring)."""

    __slots__ = ()
    __hash__ = object.__hash__  # defining __eq__ would otherwise make tensors unhashable

    # ---- Python operators --------------------------------------------------------------------
    def __add__(self, other):
        return _binary("add", self, other)

    def __radd__(self, other):
        return _binary("add", self, other, reflected=True)

    def __iadd__(self, other):
        return _augmented("add", self, other)

    def __sub__(self, other):
        return _binary("sub", self, other)

    def __rsub__(self, other):
        return _binary("sub", self, other, reflected=True)

    def __isub__(self, other):
        return _augmented("sub", self, other)

    def __mul__(self, other):
        return _binary("mul", self, other)

    def __rmul__(self, other):
        return _binary("mul", self, other, reflected=True)

    def __imul__(self, other):
        return _augmented("mul", self, other)

    def __truediv__(self, other):
        return _binary("div", self, other)

    def __rtruediv__(self, other):
        return _binary("div", self, other, reflected=True)

    def __itruediv__(self, other):
        return _augmented("div", self, other)

    def __floordiv__(self, other):
        return _binary("floor_divide", self, other)

    def __rfloordiv__(self, other):
        return _binary("floor_divide", self, other, reflected=True)

    def __ifloordiv__(self, other):
        return _augmented("floor_divide", self, other)

    def __mod__(self, other):
        return _binary("remainder", self, other)

    def __rmod__(self, other):
        return _binary("remainder", self, other, reflected=True)

    def __imod__(self, other):
        return _augmented("remainder", self, other)

    def __pow__(self, other):
        return _binary("pow", self, other)

    def __rpow__(self, other):
        return _binary("pow", self, other, reflected=True)

    def __ipow__(self, other):
        return _augmented("pow", self, other)

    def __matmul__(self, other):
        return _binary("matmul", self, other)

    def __rmatmul__(self, other):
        return _binary("matmul", self, other, reflected=True)

    def __eq__(self, other):
        return _binary("eq", self, other)

    def __ne__(self, other):
        return _binary("ne", self, other)

    def __lt__(self, other):
        return _binary("lt", self, other)

    def __le__(self, other):
        return _binary("le", self, other)

    def __gt__(self, other):
        return _binary("gt", self, other)

    def __ge__(self, other):
        return _binary("ge", self, other)

    def __and__(self, other):
        return _binary("logical_and", self, other)

    def __or__(self, other):
        return _binary("logical_or", self, other)

    def __xor__(self, other):
        return _binary("logical_xor", self, other)

    def __neg__(self):
        return call("neg", self)

    def __invert__(self):
        return call("logical_not", self)

    def __pos__(self):
        return self

    def __abs__(self):
        return call("abs", self)

    # ---- elementwise -------------------------------------------------------------------------
    def neg(self):
        """Elementwise -x."""
        return elementwise.neg(self)

    def abs(self):
        """Elementwise |x|."""
        return elementwise.abs(self)

    def sign(self):
        """Elementwise sign: -1, 0 or 1."""
        return elementwise.sign(self)

    def exp(self):
        """Elementwise e**x."""
        return elementwise.exp(self)

    def log(self):
        """Elementwise natural logarithm."""
        return elementwise.log(self)

    def sqrt(self):
        """Elementwise square root."""
        return elementwise.sqrt(self)

    def rsqrt(self):
        """Elementwise 1 / sqrt(x)."""
        return elementwise.rsqrt(self)

    def tanh(self):
        """Elementwise hyperbolic tangent."""
        return elementwise.tanh(self)

    def sigmoid(self):
        """Elementwise logistic sigmoid 1 / (1 + exp(-x))."""
        return elementwise.sigmoid(self)

    def relu(self):
        """Elementwise max(x, 0)."""
        return elementwise.relu(self)

    def sin(self):
        """Elementwise sine."""
        return elementwise.sin(self)

    def cos(self):
        """Elementwise cosine."""
        return elementwise.cos(self)

    def erf(self):
        """Elementwise error function."""
        return elementwise.erf(self)

    def clamp(self, min=None, max=None):
        """Elementwise x limited to [min, max] (either bound may be None)."""
        return elementwise.clamp(self, min, max)

    def clip(self, min=None, max=None):
        """Alias of clamp."""
        return elementwise.clamp(self, min, max)

    def add(self, b, alpha=1):
        """self + alpha * other, broadcasting."""
        return elementwise.add(self, b, alpha)

    def sub(self, b, alpha=1):
        """self - alpha * other, broadcasting."""
        return elementwise.sub(self, b, alpha)

    def mul(self, b):
        """self * other, broadcasting."""
        return elementwise.mul(self, b)

    def div(self, b):
        """self / other (true division), broadcasting."""
        return elementwise.div(self, b)

    def pow(self, b):
        """self ** other, broadcasting."""
        return elementwise.pow(self, b)

    def maximum(self, b):
        """Elementwise maximum of self and other."""
        return elementwise.maximum(self, b)

    def minimum(self, b):
        """Elementwise minimum of self and other."""
        return elementwise.minimum(self, b)

    def floor_divide(self, b):
        """self // other (rounded toward minus infinity), broadcasting."""
        return elementwise.floor_divide(self, b)

    def remainder(self, b):
        """self % other with the divisor's sign (Python's modulo), broadcasting."""
        return elementwise.remainder(self, b)

    def eq(self, b):
        """Elementwise self == other (a bool tensor)."""
        return elementwise.eq(self, b)

    def ne(self, b):
        """Elementwise self != other (a bool tensor)."""
        return elementwise.ne(self, b)

    def lt(self, b):
        """Elementwise self < other (a bool tensor)."""
        return elementwise.lt(self, b)

    def le(self, b):
        """Elementwise self <= other (a bool tensor)."""
        return elementwise.le(self, b)

    def gt(self, b):
        """Elementwise self > other (a bool tensor)."""
        return elementwise.gt(self, b)

    def ge(self, b):
        """Elementwise self >= other (a bool tensor)."""
        return elementwise.ge(self, b)

    def logical_and(self, b):
        """Elementwise logical and (non-zero is True)."""
        return elementwise.logical_and(self, b)

    def logical_or(self, b):
        """Elementwise logical or (non-zero is True)."""
        return elementwise.logical_or(self, b)

    def logical_not(self):
        """Elementwise logical not (non-zero is True)."""
        return elementwise.logical_not(self)

    def logical_xor(self, b):
        """Elementwise logical exclusive or."""
        return elementwise.logical_xor(self, b)

    def where(self, condition, other):
        """`graphc.where(condition, self, other)`: self where condition is True, else other
        (as torch.Tensor.where)."""
        return elementwise.where(condition, self, other)

    # ---- composites (graphc.utils.composites) ---------------------------------------------
    def tril(self, diagonal=0):
        """The lower triangle of the last two dims, zeros elsewhere."""
        return composites.tril(self, diagonal)

    def triu(self, diagonal=0):
        """The upper triangle of the last two dims, zeros elsewhere."""
        return composites.triu(self, diagonal)

    def tril_(self, diagonal=0):
        """In-place tril."""
        return composites.tril_(self, diagonal)

    def triu_(self, diagonal=0):
        """In-place triu."""
        return composites.triu_(self, diagonal)

    def masked_fill(self, mask, value):
        """`value` where the boolean `mask` is True, self elsewhere."""
        return composites.masked_fill(self, mask, value)

    def masked_fill_(self, mask, value):
        """In-place masked_fill."""
        return composites.masked_fill_(self, mask, value)

    def cumsum(self, dim, *, dtype=None):
        """Running sum along `dim`."""
        return composites.cumsum(self, dim, dtype=dtype)

    def topk(self, k, dim=-1, largest=True, sorted=True):  # noqa: A002
        """The k largest (smallest) elements along `dim` and their indices."""
        return composites.topk(self, k, dim, largest, sorted)

    def multinomial(self, num_samples, replacement=False, *, generator=None):
        """Category indices drawn with the probabilities in each row of self."""
        return composites.multinomial(self, num_samples, replacement, generator=generator)

    # ---- in place ----------------------------------------------------------------------------
    def add_(self, other, **kwargs):
        """In-place add: changes self and bumps its version counter."""
        return _update_by(self, "add_", "add", elementwise.add, other, **kwargs)

    def sub_(self, other, **kwargs):
        """In-place sub: changes self and bumps its version counter."""
        return _update_by(self, "sub_", "sub", elementwise.sub, other, **kwargs)

    def mul_(self, other, **kwargs):
        """In-place mul: changes self and bumps its version counter."""
        return _update_by(self, "mul_", "mul", elementwise.mul, other, **kwargs)

    def div_(self, other, **kwargs):
        """In-place div: changes self and bumps its version counter."""
        return _update_by(self, "div_", "div", elementwise.div, other, **kwargs)

    def pow_(self, other, **kwargs):
        """In-place pow: changes self and bumps its version counter."""
        return _update_by(self, "pow_", "pow", elementwise.pow, other, **kwargs)

    def clamp_(self, *args, **kwargs):
        """In-place clamp: changes self and bumps its version counter."""
        return _update(self, "clamp_", elementwise.clamp, *args, **kwargs)

    def neg_(self, *args, **kwargs):
        """In-place neg: changes self and bumps its version counter."""
        return _update_by(self, "neg_", "neg", elementwise.neg, *args, **kwargs)

    def exp_(self, *args, **kwargs):
        """In-place exp: changes self and bumps its version counter."""
        return _update_by(self, "exp_", "exp", elementwise.exp, *args, **kwargs)

    def log_(self, *args, **kwargs):
        """In-place log: changes self and bumps its version counter."""
        return _update_by(self, "log_", "log", elementwise.log, *args, **kwargs)

    def sqrt_(self, *args, **kwargs):
        """In-place sqrt: changes self and bumps its version counter."""
        return _update_by(self, "sqrt_", "sqrt", elementwise.sqrt, *args, **kwargs)

    def tanh_(self, *args, **kwargs):
        """In-place tanh: changes self and bumps its version counter."""
        return _update_by(self, "tanh_", "tanh", elementwise.tanh, *args, **kwargs)

    def sigmoid_(self, *args, **kwargs):
        """In-place sigmoid: changes self and bumps its version counter."""
        return _update_by(self, "sigmoid_", "sigmoid", elementwise.sigmoid, *args, **kwargs)

    def relu_(self, *args, **kwargs):
        """In-place relu: changes self and bumps its version counter."""
        return _update_by(self, "relu_", "relu", elementwise.relu, *args, **kwargs)

    def zero_(self):
        """Fill self with zeros, in place."""
        return inplace(self, "zero_", _zeros_of)

    def fill_(self, value):
        """Fill self with `value` (a number or a one-element tensor), in place."""
        value = value.item() if isinstance(value, TensorMethods) else value
        return inplace(self, "fill_", lambda old: _full_of(old, value))

    def copy_(self, src):
        """Copy src (broadcast to self's shape, cast to self's dtype) into self."""
        if not isinstance(src, TensorMethods):
            from graphc.tensor import Tensor

            src = Tensor._wrap(np.asarray(src))
        return inplace(self, "copy_", lambda old: _copied(src, old))

    # ---- reductions --------------------------------------------------------------------------
    def sum(self, dim=None, keepdim=False, *, dtype=None):
        """Sum over `dim` (all axes by default); bool and int64 sums are int64."""
        return reduce.sum(self, dim, keepdim, dtype=dtype)

    def mean(self, dim=None, keepdim=False, *, dtype=None):
        """Mean over `dim` (all axes by default); integer inputs need `dtype=` as in PyTorch."""
        return reduce.mean(self, dim, keepdim, dtype=dtype)

    def prod(self, dim=None, keepdim=False, *, dtype=None):
        """Product over one `dim` (all elements by default); bool and int64 products are int64."""
        return reduce.prod(self, dim, keepdim, dtype=dtype)

    def amax(self, dim=(), keepdim=False):
        """Maximum over `dim` (all axes by default); the gradient is split evenly among ties."""
        return reduce.amax(self, dim, keepdim)

    def amin(self, dim=(), keepdim=False):
        """Minimum over `dim` (all axes by default); the gradient is split evenly among ties."""
        return reduce.amin(self, dim, keepdim)

    def argmax(self, dim=None, keepdim=False):
        """Index of the (first) maximum over `dim`, or in the flattened tensor; int64."""
        return reduce.argmax(self, dim, keepdim)

    def argmin(self, dim=None, keepdim=False):
        """Index of the (first) minimum over `dim`, or in the flattened tensor; int64."""
        return reduce.argmin(self, dim, keepdim)

    def max(self, dim=None, keepdim=False):
        """max(x) -> the maximum; max(x, dim, keepdim=False) -> (values, indices);"""
        return reduce.max(self, dim, keepdim)

    def min(self, dim=None, keepdim=False):
        """min(x), min(x, dim, keepdim=False) -> (values, indices), min(x, other)."""
        return reduce.min(self, dim, keepdim)

    def var(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
        """Variance over `dim` with Bessel's `correction` (default 1; `unbiased=False` means 0)."""
        return reduce.var(self, dim, unbiased, keepdim, correction=correction)

    def std(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
        """Standard deviation: sqrt(var(x, ...)), same arguments as var."""
        return reduce.std(self, dim, unbiased, keepdim, correction=correction)

    def logsumexp(self, dim, keepdim=False):
        """log(sum(exp(x), dim)), computed stably by shifting with the max along `dim`."""
        return reduce.logsumexp(self, dim, keepdim)

    def norm(self, p='fro', dim=None, keepdim=False, dtype=None):
        """Vector p-norm over `dim` (all axes by default): p = 'fro'/2, 1, inf, -inf, 0, a float."""
        return reduce.norm(self, p, dim, keepdim, dtype)

    def all(self, dim=None, keepdim=False):
        """True where every element along `dim` is True (non-zero); a bool tensor."""
        return reduce.all(self, dim, keepdim)

    def any(self, dim=None, keepdim=False):
        """True where some element along `dim` is True (non-zero); a bool tensor."""
        return reduce.any(self, dim, keepdim)

    # ---- linear algebra and nn ---------------------------------------------------------------
    def matmul(self, b):
        """Matrix product with PyTorch's rules for 1-D operands and broadcast batch dimensions."""
        return linalg.matmul(self, b)

    def mm(self, b):
        """The product of two matrices (2-D only, no broadcasting)."""
        return linalg.mm(self, b)

    def bmm(self, b):
        """Batched product of (B, N, K) and (B, K, M): 3-D only, equal batch sizes."""
        return linalg.bmm(self, b)

    def dot(self, b):
        """Inner product of two 1-D tensors of one dtype (0-d result)."""
        return linalg.dot(self, b)

    def outer(self, b):
        """Outer product of two 1-D tensors: out[i, j] = a[i] * b[j] (a broadcasting mul)."""
        return linalg.outer(self, b)

    def softmax(self, dim=None, dtype=None):
        """exp(x) / sum(exp(x)) along `dim`, computed stably."""
        return nn_ops.softmax(self, dim, dtype)

    def log_softmax(self, dim=None, dtype=None):
        """log(softmax(x, dim)) without the overflow of the naive formula."""
        return nn_ops.log_softmax(self, dim, dtype)

    def log1p(self):
        """log(1 + x), accurate near 0."""
        return nn_ops.log1p(self)

    # ---- random ------------------------------------------------------------------------------
    def uniform_(self, a=0.0, b=1.0, *, generator=None):
        """Fill self with uniform values in [a, b) (in place; use under no_grad on parameters)."""
        return random.uniform_(self, a, b, generator=generator)

    def normal_(self, mean=0.0, std=1.0, *, generator=None):
        """Fill self with normal values of the given mean and std (in place)."""
        return random.normal_(self, mean, std, generator=generator)

    def bernoulli_(self, p=0.5, *, generator=None):
        """Fill self with 0/1 draws, 1 with probability p (a float, or a broadcast tensor)."""
        return random.bernoulli_(self, p, generator=generator)

    def bernoulli(self, p=None, *, generator=None):
        """0/1 draws, 1 with probability self (or `p` where given)."""
        return random.bernoulli(self, p, generator=generator)

    # ---- dtype and device ----------------------------------------------------------------------
    def to(self, *args, **kwargs):
        """`to(dtype)`, `to("cpu")`, `to(device, dtype)`, `to(other_tensor)`; devices are no-ops.

        `copy=True` always returns a new tensor (with history), as PyTorch.
        """
        from graphc.tensor import check_device, device

        dtype = kwargs.get("dtype")
        where_to = kwargs.get("device")
        for a in args:
            if isinstance(a, TensorMethods):
                dtype = a.dtype
            elif isinstance(a, (str, device)):
                where_to = a
            elif a is not None:
                dtype = a
        check_device("Tensor.to", where_to)
        if dtype is None or as_dtype(dtype) is self.dtype:
            return call("cast", self, dtype=self.dtype.name) if kwargs.get("copy") else self
        return elementwise.cast(self, as_dtype(dtype))

    def type_as(self, other):
        """self cast to other's dtype."""
        return elementwise.cast(self, other.dtype)

    def float(self):
        """self cast to float32."""
        return elementwise.cast(self, float32)

    def double(self):
        """self cast to float64."""
        return elementwise.cast(self, float64)

    def long(self):
        """self cast to int64."""
        return elementwise.cast(self, int64)

    def int(self):
        """self cast to int64 (graphc's one integer dtype)."""
        return elementwise.cast(self, int64)

    def bool(self):
        """self cast to bool."""
        return elementwise.cast(self, bool_)

    def cpu(self):
        """self: eager tensors live on the CPU."""
        return self

    def cuda(self, *args, **kwargs):
        """Refused: eager tensors live on the CPU; compile for the GPU instead."""
        raise ValueError("graphc eager tensors live on the CPU: there is no .cuda(); "
                         "use graphc.compile with the CUDA backend instead")


def _zeros_of(old):
    return call("full", shape=tuple(old.shape), value=0, dtype=old.dtype.name)


def _full_of(old, value):
    return call("full", shape=tuple(old.shape), value=value, dtype=old.dtype.name)


def _copied(src, old):
    value = elementwise.cast(src, old.dtype)
    if tuple(value.shape) != tuple(old.shape):
        value = call("broadcast_to", value, shape=tuple(old.shape))
    return value
