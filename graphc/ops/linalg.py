"""Linear algebra: matmul (the one contraction primitive) and the functions built on it.

`matmul` follows PyTorch's (and numpy's) semantics in full, so `a @ b` can dispatch to the
registry op directly: 1-D x 1-D is a dot product (0-d result); a 1-D left operand is treated as
a row (1, K) and a 1-D right operand as a column (K, 1), the added dimension removed from the
result; operands of 3 or more dimensions are batches of matrices whose batch dimensions
broadcast. Both operands have one dtype (PyTorch does not promote here); bool is refused.

Its VJP works on the operands promoted to at least 2-D, transposes with the movement op
`permute`, and sums broadcast batch dimensions away with `sum_to`. mm, bmm, dot, outer and
linear check their stricter shape contracts with PyTorch's messages and then call matmul (or,
for outer, a broadcasting mul).
"""

from __future__ import annotations

import numpy as np

from graphc.errors import DTypeError, ShapeError, where
from graphc.ops.grad_utils import sum_to
from graphc.ops.registry import CONTRACTION, OpDef, call, register
from graphc.ops.shapes import broadcast_shapes, numel
from graphc.types import TensorType, bool_

# PyTorch's scalar-type names, lower case as in "float != double" and capitalised as in dot's.
_C_NAME = {"float32": "float", "float64": "double", "int64": "long", "bool": "bool"}
_T_NAME = {"float32": "Float", "float64": "Double", "int64": "Long", "bool": "Bool"}


# ---- matmul ----------------------------------------------------------------------------------
def _shapes(a: TensorType, b: TensorType) -> str:
    return f"{list(a.shape)} @ {list(b.shape)}"


def _inner_mismatch(a: TensorType, b: TensorType) -> ShapeError:
    """PyTorch's message for each matmul case, plus both full shapes where it folds them."""
    op = where("matmul")
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    rows = numel(a.shape[:-1])
    both = f" (matmul of {_shapes(a, b)})"
    if a.ndim == 1 and b.ndim == 1:
        return ShapeError(
            f"{op}: inconsistent tensor size, expected tensor [{ka}] and src [{kb}] to have the "
            f"same number of elements, but got {ka} and {kb} elements respectively"
        )
    if b.ndim == 1:
        return ShapeError(f"{op}: size mismatch, got input ({rows}), mat ({rows}x{ka}), vec "
                          f"({kb})" + (both if a.ndim > 2 else ""))
    if b.ndim == 2:
        return ShapeError(f"{op}: mat1 and mat2 shapes cannot be multiplied ({rows}x{ka} and "
                          f"{kb}x{b.shape[-1]})" + (both if a.ndim != 2 else ""))
    return ShapeError(f"{op}: shapes cannot be multiplied: {_shapes(a, b)} (the inner "
                      f"dimensions {ka} and {kb} differ)")


def _matmul_infer(a: TensorType, b: TensorType) -> TensorType:
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"{where('matmul')}: both arguments to matmul need to be at least 1D, "
                         f"but they are {a.ndim}D and {b.ndim}D")
    if a.dtype is not b.dtype:
        raise DTypeError(f"{where('matmul')}: expected m1 and m2 to have the same dtype, but "
                         f"got: {_C_NAME[a.dtype.name]} != {_C_NAME[b.dtype.name]}")
    if a.dtype is bool_:
        raise DTypeError(f"{where('matmul')}: \"matmul\" not implemented for 'Bool'")
    if a.shape[-1] != (b.shape[0] if b.ndim == 1 else b.shape[-2]):
        raise _inner_mismatch(a, b)
    try:
        batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    except ShapeError as err:
        raise ShapeError(f"{err} (batch dimensions of {_shapes(a, b)})") from None
    rows = a.shape[-2:-1] if a.ndim >= 2 else ()
    cols = b.shape[-1:] if b.ndim >= 2 else ()
    return TensorType(batch + rows + cols, a.dtype)


def _matmul_kernel(a, b):
    return np.asarray(np.matmul(a, b))


def _mT(x):
    """Swap the last two axes (a movement op, so the backward stays graph calls)."""
    dims = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    return call("permute", x, dims=dims)


def _matmul_vjp(ctx, g):
    a, b = ctx.inputs
    need_a, need_b = ctx.needs_input_grad
    ta, tb = ctx.input_types
    k = ta.shape[-1]
    a2 = a if ta.ndim >= 2 else call("reshape", a, shape=(1, k))
    b2 = b if tb.ndim >= 2 else call("reshape", b, shape=(k, 1))
    if ta.ndim < 2 or tb.ndim < 2:  # put back the dimensions the result squeezed out
        out2 = ctx.output_types[0].shape[: max(ta.ndim, tb.ndim, 2) - 2] + \
            (a2.shape[-2], b2.shape[-1])
        g = call("reshape", g, shape=out2)
    ga = gb = None
    if need_a:
        ga = sum_to(call("matmul", g, _mT(b2)), tuple(a2.shape))
        if ga.ndim != ta.ndim:
            ga = call("reshape", ga, shape=ta.shape)
    if need_b:
        if b2.ndim == 2 and a2.ndim > 2:  # a batch against one matrix: fold the batch into rows
            flat_a = call("reshape", a2, shape=(numel(a2.shape[:-1]), k))
            flat_g = call("reshape", g, shape=(numel(g.shape[:-1]), g.shape[-1]))
            gb = call("matmul", _mT(flat_a), flat_g)
        else:
            gb = sum_to(call("matmul", _mT(a2), g), tuple(b2.shape))
        if gb.ndim != tb.ndim:
            gb = call("reshape", gb, shape=tb.shape)
    return (ga, gb)


register(OpDef("matmul", CONTRACTION, ("a", "b"), _matmul_infer, _matmul_kernel, _matmul_vjp,
               saved_inputs=(0, 1), epilogue_anchor=True))


# ---- public functions ------------------------------------------------------------------------
def matmul(a, b):
    """Matrix product with PyTorch's rules for 1-D operands and broadcast batch dimensions.

    >>> graphc.matmul(graphc.ones(2, 3), graphc.ones(3)).shape
    graphc.Size([2])
    """
    return call("matmul", a, b)


def mm(a, b):
    """The product of two matrices (2-D only, no broadcasting)."""
    if a.ndim != 2:
        raise ShapeError(f"{where('mm')}: self must be a matrix, got {a.ndim}-D "
                         f"{list(a.shape)}")
    if b.ndim != 2:
        raise ShapeError(f"{where('mm')}: mat2 must be a matrix, got {b.ndim}-D "
                         f"{list(b.shape)}")
    return call("matmul", a, b)


def bmm(a, b):
    """Batched product of (B, N, K) and (B, K, M): 3-D only, equal batch sizes."""
    if a.ndim != 3:
        raise ShapeError(f"{where('bmm')}: batch1 must be a 3D tensor, got {list(a.shape)}")
    if b.ndim != 3:
        raise ShapeError(f"{where('bmm')}: batch2 must be a 3D tensor, got {list(b.shape)}")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ShapeError(
            f"{where('bmm')}: Expected size for first two dimensions of batch2 tensor to be: "
            f"[{a.shape[0]}, {a.shape[2]}] but got: [{b.shape[0]}, {b.shape[1]}]."
        )
    return call("matmul", a, b)


def dot(a, b):
    """Inner product of two 1-D tensors of one dtype (0-d result)."""
    if a.ndim != 1 or b.ndim != 1:
        raise ShapeError(f"{where('dot')}: 1D tensors expected, but got {a.ndim}D and "
                         f"{b.ndim}D tensors")
    if a.dtype is not b.dtype:
        raise DTypeError(f"{where('dot')}: dot : expected both vectors to have same dtype, but "
                         f"found {_T_NAME[a.dtype.name]} and {_T_NAME[b.dtype.name]}")
    return call("matmul", a, b)


def outer(a, b):
    """Outer product of two 1-D tensors: out[i, j] = a[i] * b[j] (a broadcasting mul)."""
    for name, t in (("self", a), ("vec2", b)):
        if t.ndim != 1:
            raise ShapeError(f"{where('outer')}: outer: Expected 1-D argument {name}, but got "
                             f"{t.ndim}-D")
    return call("mul", call("reshape", a, shape=(a.shape[0], 1)), b)


def linear(x, weight, bias=None):
    """y = x @ weight.T + bias, as torch.nn.functional.linear (and the seeds' LinearFunction).

    >>> graphc.linear(graphc.ones(4, 3), graphc.ones(2, 3)).shape
    graphc.Size([4, 2])
    """
    out = call("matmul", x, _mT(weight) if weight.ndim == 2 else weight)
    return out if bias is None else out + bias


TENSOR_METHODS = {"matmul": matmul, "mm": mm, "bmm": bmm, "dot": dot, "outer": outer}

PUBLIC = ("matmul", "mm", "bmm", "dot", "outer", "linear")
