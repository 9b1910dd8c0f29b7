"""Composite tensor functions: tril/triu, masked_fill, einsum, cumsum, topk, multinomial.

Each is a decomposition into registry primitives (arange, comparisons, where, pad, slice,
matmul, argmax, gather, uniform), so it runs eagerly with autograd, traces, and compiles on
every backend with no lowering of its own:

- `tril`/`triu`: an `arange` row/column comparison selects with `where`.
- `masked_fill`: `where(mask, value, x)`, the value cast to x's dtype first (as PyTorch).
- `einsum`: operands reduced over their private indices, then contracted pairwise, left to
  right, by one batched `matmul` each (permute + reshape around it).
- `cumsum`: a Hillis-Steele scan, log2(n) shifted adds (pad + slice + add); summation order
  differs from PyTorch's sequential loop, so float results agree to rounding, not bitwise.
- `topk`: eagerly the indices come from numpy's sort and the values are gathered (so the
  gradient flows to them); in a trace, k rounds of argmax-and-mask (O(k n)) replace the sort.
  Ties come out in index order; PyTorch leaves their order unspecified.
- `multinomial`: inverse-CDF sampling from graphc's generator (uniform draws against the
  cumulative sum); draws differ from PyTorch's (another generator), the distribution is
  the same. Without replacement, one category is drawn and removed per sample.

>>> import graphc
>>> graphc.tril(graphc.ones(2, 2))
tensor([[1., 0.],
        [1., 1.]])
"""

from __future__ import annotations

import math
import string
from collections import namedtuple

import numpy as np

from graphc import dispatch
from graphc.errors import ArgumentError, DTypeError, ShapeError
from graphc.ops import elementwise, gather, linalg, movement, random, reduce
from graphc.ops.registry import call, inplace
from graphc.ops.shapes import normalize_axis
from graphc.symbolic import Sym
from graphc.types import as_dtype, bool_, int64

TopkResult = namedtuple("topk", ("values", "indices"))
TopkResult.__module__ = "graphc.return_types"


def _is_tensor(x) -> bool:
    from graphc.tensor import Tensor  # graphc.tensor imports this module (Tensor's methods)

    return isinstance(x, Tensor)


def _iota(n: int):
    end = n if type(n) is Sym else float(n)  # a symbolic size stays symbolic
    return call("arange", start=0.0, end=end, step=1.0, dtype="int64")


def _zero_of(x):
    return call("full", shape=(), value=False if x.dtype is bool_ else 0, dtype=x.dtype.name)


def _triangle(name: str, x, diagonal: int, lower: bool):
    if x.ndim < 2:
        raise ShapeError(f"{name}: input tensor must have at least 2 dimensions")
    rows, cols = x.shape[-2], x.shape[-1]
    offset = _iota(cols) - movement.unsqueeze(_iota(rows), -1)  # col - row
    keep = offset <= diagonal if lower else offset >= diagonal
    return elementwise.where(keep, x, _zero_of(x))


def tril(input, diagonal: int = 0):  # noqa: A002 (PyTorch's names)
    """The lower triangle of the last two dims (col - row <= diagonal), zeros elsewhere.

    >>> graphc.tril(graphc.ones(2, 3), diagonal=1)
    tensor([[1., 1., 0.],
            [1., 1., 1.]])
    """
    return _triangle("tril", input, int(diagonal), lower=True)


def triu(input, diagonal: int = 0):  # noqa: A002
    """The upper triangle of the last two dims (col - row >= diagonal), zeros elsewhere.

    >>> graphc.triu(graphc.ones(2, 2))
    tensor([[1., 1.],
            [0., 1.]])
    """
    return _triangle("triu", input, int(diagonal), lower=False)


def tril_(input, diagonal: int = 0):  # noqa: A002
    """In-place tril."""
    return inplace(input, "tril_", lambda old: tril(old, diagonal))


def triu_(input, diagonal: int = 0):  # noqa: A002
    """In-place triu."""
    return inplace(input, "triu_", lambda old: triu(old, diagonal))


def masked_fill(input, mask, value):  # noqa: A002
    """`value` where `mask` is True, input elsewhere (mask broadcasts; value keeps x's dtype).

    >>> x = graphc.zeros(3)
    >>> x.masked_fill(graphc.tensor([True, False, True]), 5.0)
    tensor([5., 0., 5.])
    """
    if not _is_tensor(mask) or mask.dtype is not bool_:
        got = mask.dtype.name if _is_tensor(mask) else type(mask).__name__
        raise DTypeError(f"masked_fill_ only supports boolean masks, but got mask with dtype "
                         f"{got}")
    if _is_tensor(value):
        if value.ndim != 0:
            raise ShapeError("masked_fill_ only supports a 0-dimensional value tensor, but got "
                             f"tensor with {value.ndim} dimension(s).")
        fill = elementwise.cast(value, input.dtype)
    else:
        if input.dtype is bool_:
            value = bool(value)
        elif not input.dtype.is_floating:
            if isinstance(value, float) and not value.is_integer():
                raise DTypeError(f"value cannot be converted to type {input.dtype.name} "
                                 "without overflow")
            value = int(value)
        fill = call("full", shape=(), value=value, dtype=input.dtype.name)
    return elementwise.where(mask, fill, input)


def masked_fill_(input, mask, value):  # noqa: A002
    """In-place masked_fill: the mask must broadcast to input's shape."""
    return inplace(input, "masked_fill_", lambda old: masked_fill(old, mask, value))


# ---- einsum ---------------------------------------------------------------------------------
def _parse_einsum(equation: str, operands) -> tuple[list[str], str]:
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ArgumentError("einsum(): more operands were provided than specified in the "
                            "equation" if len(operands) > len(terms) else
                            "einsum(): fewer operands were provided than specified in the "
                            "equation")
    letters = set(lhs + rhs) - set(",.>-")
    spare = [c for c in string.ascii_letters if c not in letters]
    ell_rank = 0
    for term, op in zip(terms, operands):
        if "..." in term:
            ell_rank = max(ell_rank, op.ndim - (len(term) - 3))
    ell = "".join(spare[:ell_rank])
    expanded = []
    for term, op in zip(terms, operands):
        if "..." in term:
            k = op.ndim - (len(term) - 3)
            term = term.replace("...", ell[ell_rank - k:])
        for c in term:
            if c not in string.ascii_letters:
                raise ArgumentError(f"einsum(): invalid subscript given at index "
                                    f"{equation.index(c)} in the equation string, subscripts "
                                    "must be in [a-zA-Z]")
        if len(term) != op.ndim:
            raise ShapeError(f"einsum(): the number of subscripts in the equation ({len(term)}) "
                             f"does not match the number of dimensions ({op.ndim}) for "
                             f"operand {len(expanded)} and no ellipsis was given")
        for c in set(term):
            sizes = {op.shape[k] for k, d in enumerate(term) if d == c}
            if len(sizes) > 1:
                first, second = [op.shape[k] for k, d in enumerate(term) if d == c][:2]
                raise ShapeError(f"einsum(): subscript {c} is repeated for operand "
                                 f"{len(expanded)} but the sizes don't match, {second} != "
                                 f"{first}")
        expanded.append(term)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = {c: "".join(expanded).count(c) for c in set("".join(expanded))}
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    return expanded, out


def _diagonal(op, term: str):
    """`op` restricted to equal indices for each letter repeated in `term` (`"ii"` -> the
    diagonal, subscripted `"i"`): the repeated axes move last, flatten, and a stride of n + 1
    picks their diagonal."""
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        first = term.index(c)
        second = term.index(c, first + 1)
        rest = [k for k in range(len(term)) if k not in (first, second)]
        n = op.shape[first]
        op = movement.permute(op, *rest, first, second)
        op = movement.reshape(op, tuple(op.shape[:-2]) + (n * n,))[..., ::n + 1]
        term = "".join(term[k] for k in rest) + c
    return op, term


def _contract(a, ta: str, b, tb: str, keep: set[str]):
    """a (subscripts ta) times b (tb), summed over the shared letters not in `keep`."""
    sizes = dict(zip(ta, a.shape)) | dict(zip(tb, b.shape))
    batch = [c for c in ta if c in tb and c in keep]
    summed = [c for c in ta if c in tb and c not in keep]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    a = movement.permute(a, *[ta.index(c) for c in batch + left + summed])
    b = movement.permute(b, *[tb.index(c) for c in batch + summed + right])

    def size(cs):
        return math.prod(sizes[c] for c in cs)

    nb = len(batch)
    a = movement.reshape(a, tuple(a.shape[:nb]) + (size(left), size(summed)))
    b = movement.reshape(b, tuple(b.shape[:nb]) + (size(summed), size(right)))
    out = linalg.matmul(a, b)
    out = movement.reshape(out, tuple(out.shape[:nb]) + tuple(sizes[c] for c in left)
                           + tuple(sizes[c] for c in right))
    return out, "".join(batch + left + right)


def einsum(equation: str, *operands):
    """Einstein summation (`"bij,bjk->bik"`, `"...ij,...jk"`, implicit output, diagonals such
    as `"ii->i"` and traces `"ii"`), as torch.einsum.

    >>> a = graphc.ones(2, 3)
    >>> graphc.einsum("ij,jk->ik", a, graphc.ones(3, 4)).shape
    graphc.Size([2, 4])
    """
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise ArgumentError("einsum(): must provide at least one operand")
    terms, out = _parse_einsum(equation, operands)
    ops = list(operands)
    for i, term in enumerate(terms):  # a letter repeated in one operand: its diagonal
        ops[i], terms[i] = _diagonal(ops[i], term)
    for i, (op, term) in enumerate(zip(ops, terms)):  # sum out letters only this one has
        others = set(out).union(*(t for j, t in enumerate(terms) if j != i))
        private = [k for k, c in enumerate(term) if c not in others]
        if private:
            ops[i] = reduce.sum(op, dim=tuple(private))
            terms[i] = "".join(c for c in term if c in others)
    acc, acc_t = ops[0], terms[0]
    for k in range(1, len(ops)):
        keep = set(out).union(*terms[k + 1:])
        acc, acc_t = _contract(acc, acc_t, ops[k], terms[k], keep)
    missing = [c for c in acc_t if c not in out]
    if missing:
        acc = reduce.sum(acc, dim=tuple(acc_t.index(c) for c in missing))
        acc_t = "".join(c for c in acc_t if c in out)
    if len(acc_t) != len(out):
        raise ArgumentError(f"einsum(): output subscript {set(out) - set(acc_t)} does not "
                            "appear in the equation for any input operand")
    if acc_t != out:
        acc = movement.permute(acc, *[acc_t.index(c) for c in out])
    return acc


# ---- scans, selection, sampling -------------------------------------------------------------
def cumsum(input, dim: int, *, dtype=None):  # noqa: A002
    """Running sum along `dim` (bool and integers give int64), as torch.cumsum.

    >>> graphc.cumsum(graphc.tensor([1, 2, 3]), 0)
    tensor([1, 3, 6])
    """
    d = normalize_axis("cumsum", dim, max(input.ndim, 1))
    x = input
    if dtype is not None:
        x = elementwise.cast(x, as_dtype(dtype))
    elif not x.dtype.is_floating:
        x = elementwise.cast(x, int64)
    if x.ndim == 0:
        return elementwise.cast(x, x.dtype) if x is not input else movement.clone(x)
    n = x.shape[d]
    trailing = x.ndim - 1 - d
    shift = 1
    while shift < n:
        pads = (0, 0) * trailing + (shift, 0)
        x = x + movement.narrow(movement.pad(x, pads), d, 0, n)
        shift *= 2
    return x if x is not input else movement.clone(x)


def topk(input, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):  # noqa: A002
    """The k largest (or smallest) elements along `dim` and their indices, as torch.topk.

    >>> graphc.topk(graphc.tensor([1.0, 3.0, 2.0]), 2)
    topk(values=tensor([3., 2.]), indices=tensor([1, 2]))
    """
    d = normalize_axis("topk", dim, max(input.ndim, 1))
    n = input.shape[d] if input.ndim else 1
    if not 0 <= k <= n:
        raise ArgumentError("selected index k out of range")
    if input.ndim == 0:
        return TopkResult(movement.clone(input), call("full", shape=(), value=0, dtype="int64"))
    if dispatch.current_tracer() is None and not input.is_abstract:
        arr = input.detach().numpy()
        key = -arr if largest else arr
        if arr.dtype.kind == "f":
            key = np.where(np.isnan(arr), -np.inf, key)  # NaN counts as the largest
        elif arr.dtype.kind == "b":
            key = key.astype(np.int64)
        order = np.argsort(key, axis=d, kind="stable")
        from graphc.tensor import Tensor

        index = Tensor._wrap(np.ascontiguousarray(np.take(order, np.arange(k), axis=d))
                             .astype(np.int64), False)
    else:
        index = _topk_traced(input.detach(), k, d, largest)
    return TopkResult(gather.gather(input, d, index), index)


def _topk_traced(x, k: int, d: int, largest: bool):
    """k rounds of argmax (argmin), each masking the pick: traceable, O(k n)."""
    pick = reduce.argmax if largest else reduce.argmin
    if x.dtype.is_floating:
        sentinel = -math.inf if largest else math.inf
    else:
        x = elementwise.cast(x, int64)
        sentinel = np.iinfo(np.int64).min if largest else np.iinfo(np.int64).max
    shape = [1] * x.ndim
    shape[d] = x.shape[d]
    iota = movement.reshape(_iota(x.shape[d]), tuple(shape))
    picks = []
    for _ in range(k):
        idx = pick(x, d, keepdim=True)
        picks.append(idx)
        x = masked_fill(x, iota == idx, sentinel)
    if not picks:
        out_shape = tuple(0 if i == d else s for i, s in enumerate(x.shape))
        return call("full", shape=out_shape, value=0, dtype="int64")
    return movement.cat(picks, d)


def multinomial(input, num_samples: int, replacement: bool = False, *,  # noqa: A002
                generator=None):
    """Category indices drawn with the (unnormalised) probabilities of each row of `input`.

    >>> p = graphc.tensor([0.0, 1.0, 0.0])
    >>> graphc.multinomial(p, 2, replacement=True)
    tensor([1, 1])
    """
    if input.ndim not in (1, 2):
        raise ShapeError("prob_dist must be 1 or 2 dim")
    if not input.dtype.is_floating:
        raise DTypeError(f"multinomial only supports floating-point dtypes for input, got: "
                         f"{input.dtype.name.capitalize()}")
    if num_samples <= 0:
        raise ArgumentError("cannot sample n_sample <= 0 samples")
    n = input.shape[-1]
    if not replacement and num_samples > n:
        raise ArgumentError("cannot sample n_sample > prob_dist.size(-1) samples without "
                            "replacement")
    if dispatch.current_tracer() is None and not input.is_abstract:
        arr = input.detach().numpy()
        if (arr < 0).any() or not np.isfinite(arr).all():
            raise ArgumentError("probability tensor contains either `inf`, `nan` or element "
                                "< 0")
        if (arr.sum(-1) <= 0).any():
            raise ArgumentError("invalid multinomial distribution (sum of probabilities <= 0)")
    p = movement.unsqueeze(input.detach(), 0) if input.ndim == 1 else input.detach()
    rows = p.shape[0]
    if replacement or num_samples == 1:
        out = _inverse_cdf(p, random.rand(rows, num_samples, generator=generator,
                                          dtype=p.dtype))
    else:
        picks = []
        iota = _iota(n)
        for _ in range(num_samples):
            idx = _inverse_cdf(p, random.rand(rows, 1, generator=generator, dtype=p.dtype))
            picks.append(idx)
            p = elementwise.where(iota == idx, _zero_of(p), p)
        out = movement.cat(picks, 1)
    return movement.squeeze(out, 0) if input.ndim == 1 else out


def _inverse_cdf(p, u):
    """For each row of p (rows, n) and each uniform draw u (rows, s): the index i with
    cdf[i-1] <= u * total < cdf[i]."""
    cdf = cumsum(p, -1)
    total = movement.narrow(cdf, -1, p.shape[-1] - 1, 1)
    below = movement.unsqueeze(cdf, 1) <= movement.unsqueeze(u * total, -1)  # (rows, s, n)
    idx = reduce.sum(below, dim=-1)
    return elementwise.clamp(idx, None, p.shape[-1] - 1)


PUBLIC = ("tril", "triu", "masked_fill", "einsum", "cumsum", "topk", "multinomial")
