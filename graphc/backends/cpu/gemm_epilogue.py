"""gemm_epilogue: a fused GEMM's elementwise epilogue run row chunk by row chunk inside the
GEMM's own kernel, while the chunk's result is in cache.

A medium product runs in small_gemm's generated kernel as a loop of row chunks (ROW_CHUNK
rows each, the loop shared by the cores). Lowered as written, `fused(matmul, add, gelu,
...)` then runs the product over all 1024 rows, writing c (2 MB for the GPT's [1024, 512]
first Linear: more than L2 holds, so it goes to memory), and the elementwise kernel reads
c back from memory. Here each chunk's iteration calls the GEMM kernel on its rows, then
evaluates the body (`Body.evaluate`, the same rendering as codegen's elementwise kernels)
over those rows, whose c (256 KB at n = 512) is still in L2: the same instructions per
element as the separate kernel, so the same bits (tests/test_cpu_gemm_epilogue.py).

Taken (`plan`) where the body is elementwise only (no ending reduction, no arange), every
operand it reads or writes is c's shape broadcast so that c's leading dims fold into rows
(a bias, a residual, a second output), no input overlaps c or an output (a chunk's
epilogue reads an input after other chunks' products were written), and no output overlaps
the GEMM's operands (a chunk's epilogue writes before later chunks' products read them).
Else the GEMM and the elementwise kernel run as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from graphc.backends.cpu.gemm_addends import overlaps
from graphc.backends.cpu.kernels import Body, KernelBuilder
from graphc.backends.cpu.scalars import convert
from graphc.backends.cpu.values import CpuLoweringError, Loc, broadcast_strides, i64, loop

__all__ = ["FOLD", "ChunkEpilogue", "plan"]

FOLD = True  # False: the epilogue stays its own kernel (benchmarks' A/B, tests)


@dataclass(frozen=True)
class ChunkEpilogue:
    """A body to evaluate per row chunk: `reads` (ref, Loc, row stride, column stride) its
    inputs other than c, `writes` (ref, Loc, row stride, column stride, dtype) the node's
    outputs, strides in elements over c's (rows, n)."""

    body: Body
    reads: tuple
    writes: tuple

    def recipe(self) -> tuple:
        """What the kernel's code depends on besides its operands' chunk strides."""
        return (self.body.recipe("gemm_epilogue", 1, None),
                tuple((ref, rs, cs) for ref, _, rs, cs in self.reads),
                tuple((ref, rs, cs, dt.name) for ref, _, rs, cs, dt in self.writes))

    def operands(self, kb: KernelBuilder, c: int, chunk_rows: int):
        """Register the operands with `kb` (a domain of row chunks): (leaves ref -> operand,
        outputs [(ref, operand, dtype)], {operand: (row stride, column stride)}); `c`: the
        GEMM's c operand (rows n apart)."""
        n = self.body.types[self.body.n].shape[-1]
        leaves, strides = {self.body.n: c}, {c: (n, 1)}
        for ref, loc, rs, cs in self.reads:
            leaves[ref] = kb.operand(loc, (rs * chunk_rows,))
            strides[leaves[ref]] = (rs, cs)
        outs = []
        for ref, loc, rs, cs, dt in self.writes:
            k = kb.operand(loc, (rs * chunk_rows,))
            strides[k] = (rs, cs)
            outs.append((ref, k, dt))
        return leaves, outs, strides

    def emit(self, lw, kb: KernelBuilder, b, operands, offsets, rows: int, n: int) -> None:
        """The body over a chunk's `rows` x `n` elements, `offsets` the chunk's first."""
        leaves, outs, strides = operands
        body = self.body
        with loop(b, 0, rows, "er") as r, loop(b, 0, n, "ej") as j:
            at = list(offsets)
            for k, (rs, cs) in strides.items():
                at[k] = b.add(offsets[k], b.add(b.mul(r, i64(rs)), b.mul(j, i64(cs))))
            env = body.evaluate(lw, kb, b, at, leaves, len(body.instrs), body.outputs)
            for ref, k, dt in outs:
                kb.store(b, k, at[k], convert(b, env[ref], body.types[ref].dtype, dt))


def plan(lw, body: Body, c: Loc, a: Loc, b: Loc) -> ChunkEpilogue | None:
    """The chunked epilogue of `body` (a fused node's, its matmul anchor writing `c` from
    `a` and `b`), or None where it must stay its own kernel (the module docstring)."""
    node = body.node
    shape = tuple(body.types[body.n].shape)
    if not FOLD or body.fused.ending is not None or len(shape) < 2 \
            or not all(type(d) is int for d in shape):
        return None
    try:
        body.check(1, len(body.instrs))
    except CpuLoweringError:  # an op the elementwise rendering refuses: lowered as before
        return None
    if any(op == "arange" for op, _, _ in body.instrs):
        return None
    used = {r for _, args, _ in body.instrs[1:] for r in args} | set(body.outputs)
    reads = []
    for ref in sorted(r for r in used if r < body.n):
        loc = lw.locs[node.inputs[ref]]
        folded = _row_strides(loc, shape)
        if folded is None or overlaps(loc, c):
            return None
        reads.append((ref, loc, *folded))
    writes = []
    for ref, value in zip(body.outputs, node.outputs):
        loc = lw.locs[value]
        folded = _row_strides(loc, shape)
        if folded is None or overlaps(loc, a) or overlaps(loc, b) \
                or any(overlaps(loc, r[1]) for r in reads):
            return None
        writes.append((ref, loc, *folded, value.type.dtype))
    return ChunkEpilogue(body, tuple(reads), tuple(writes))


def _row_strides(loc: Loc, shape: tuple) -> tuple[int, int] | None:
    """(row stride, column stride) in elements of `loc` read broadcast over `shape` with
    its leading dims folded into rows, or None where they do not fold."""
    item = loc.type.dtype.itemsize
    if not all(type(s) is int for s in loc.strides) or not _broadcasts(loc.type.shape, shape):
        return None
    s = broadcast_strides(tuple(loc.type.shape), tuple(st // item for st in loc.strides),
                          shape)
    # a leading dim of size 1 moves no row (its stride, often 0 when broadcast, is never
    # used): the row stride is the innermost other leading dim's, and each other one must
    # step over the rows inside it
    lead = [i for i in range(len(shape) - 1) if shape[i] != 1]
    if not lead:
        return s[-2], s[-1]
    row = s[lead[-1]]
    for i in lead:
        if s[i] != row * math.prod(shape[i + 1:-1]):
            return None
    return row, s[-1]


def _broadcasts(small: tuple, shape: tuple) -> bool:
    """Whether `small` broadcasts to `shape` (numpy's rule)."""
    if len(small) > len(shape):
        return False
    return all(d in (1, want) for d, want in zip(reversed(small), reversed(shape)))
