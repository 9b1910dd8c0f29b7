"""gemm_addends: a fused GEMM whose epilogue only adds a bias and residuals, folded into the
generated kernel's stores.

A Linear layer's `x @ W^T + b`, and a transformer block's `x + (h @ W^T + b)`, reach the
backend as `fused(matmul, add[, add...])`. Lowered as written, the GEMM stores c and an
elementwise kernel reads it back with the bias (and the residual) to store it again: a
second pass over c, 20-40 us for the GPT's [1024 x 128] products (20 a step). Where the
product runs in small_gemm's row-ordered kernel, `addends` lets that kernel add them in
its last block's stores instead (small_gemm `_store`).

Kept: the same additions in the same order as the unfused kernel's (c first, then each
operand in the body's order; a float addition is commutative), so the result is the same
bits with or without folding (tests/test_gemm_addends.py).

`addends(lw, body, c)` recognises the body and returns its operands; graphc.backends.cpu.
codegen's `fused` passes them to the GEMM, which folds them where its kernel can (else the
elementwise epilogue runs as before).
"""

from __future__ import annotations

from graphc.backends.cpu.values import Loc
from graphc.types import float32

__all__ = ["FOLD", "addends", "overlaps"]

FOLD = True  # False: every epilogue stays an elementwise kernel (benchmarks' A/B, tests)


def addends(lw, body, c: Loc | None) -> tuple[tuple[str, Loc], ...]:
    """((kind, Loc), ...) where `body` (a fused node's kernels.Body, its anchor first) is a
    matmul into `c` (None: a scratch, not the node's output) followed only by adds, each of
    the running result and one of the node's inputs: an [n] vector ("row", contiguous) or
    an array of c's shape ("full", contiguous like c), none of them overlapping c (the
    kernel writes c before the last block adds them), the chain's result the node's only
    output. Else (): the epilogue stays."""
    instrs = body.instrs
    c_type = body.types[body.n]
    if not FOLD or c is None or instrs[0][0] != "matmul" or c_type.dtype is not float32 \
            or len(instrs) < 2 or len(body.node.outputs) != 1 \
            or tuple(body.outputs) != (body.n + len(instrs) - 1,):
        return ()
    found = []
    running = body.n
    for k, (op, args, _) in enumerate(instrs[1:], start=1):
        if op != "add" or len(args) != 2 or running not in args:
            return ()
        other = args[1] if args[0] == running else args[0]
        if other >= body.n or other == running:
            return ()
        loc = lw.locs[body.node.inputs[other]]
        kind = _kind(loc, c_type)
        if kind is None or overlaps(loc, c):
            return ()
        found.append((kind, loc))
        running = body.n + k
    return tuple(found)


def _kind(loc: Loc, c_type) -> str | None:
    """"row" for a contiguous [n] float32 vector, "full" for a contiguous array of c's
    shape, else None."""
    t = loc.type
    if t.dtype is not float32 or not all(type(s) is int for s in loc.strides):
        return None
    item = t.dtype.itemsize
    expected, stride = [], item
    for d in reversed(t.shape):
        expected.append(stride)
        stride *= d
    if tuple(reversed(expected)) != tuple(loc.strides):
        return None
    if t.shape == c_type.shape:
        return "full"
    if tuple(t.shape) == (c_type.shape[-1],):
        return "row"
    return None


def overlaps(loc: Loc, c: Loc) -> bool:
    """Whether `loc` may share bytes with `c` (unknown offsets count as sharing)."""
    if (loc.base, loc.index) != (c.base, c.index):
        return False
    if type(loc.offset) is not int or type(c.offset) is not int:
        return True
    if not all(type(d) is int for d in (*loc.type.shape, *c.type.shape)):
        return True
    size_loc = loc.type.dtype.itemsize * _count(loc.type.shape)
    size_c = c.type.dtype.itemsize * _count(c.type.shape)
    return loc.offset < c.offset + size_c and c.offset < loc.offset + size_loc


def _count(shape) -> int:
    total = 1
    for d in shape:
        total *= d
    return total
