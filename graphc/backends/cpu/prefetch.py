"""prefetch: large one-dimensional elementwise loops, in blocks that prefetch ahead of themselves.

A fused elementwise kernel over a tensor far bigger than the caches (the benchmark's elementwise
chain: 16M float32, 64 MB in and 64 MB out) cost its compute plus its memory traffic, not the
larger of the two, when it left the fetching to the hardware prefetchers. Measured on the
AVX-512 hosts (docs/performance.md, "seventh session"): the chain's loop ran at 1.2 ns per
element over 1M elements, a bare relu at 0.7 over 16M, and the chain over 16M at 2.4-2.7. A loop
of ~90 vector instructions per 16 elements issues its loads too slowly for the prefetchers to
run ahead, so its cache lines arrive late; with 512-bit vectors (one load per cache line), it
seems, even more so, which is why the 512-bit hint of graphc.backends.cpu.scalars made the
chain slower while it made the same loops over data in cache up to 2x faster. Asking for the
lines ourselves, a fixed distance ahead, lets the memory traffic overlap the arithmetic: the
chain then ran at 1.07-1.11 ns per element over 16M, a relu at 0.54-0.60.

`prefetching_nest(kb, b, sizes, strides, leaf, ...)` is `KernelBuilder.nest` for a domain
collapsed to one dimension of at least PREFETCH_MIN_ELEMENTS, every operand contiguous or
broadcast (element stride 1 or 0): an outer loop over blocks of PREFETCH_BLOCK elements
whose body prefetches, for each contiguous operand, the cache lines PREFETCH_AHEAD_BYTES
past the block's start (for writing, for the outputs), then runs the block (a loop of
constant trip count, which LLVM vectorises); a remainder loop runs the last elements. It returns
False, emitting nothing, for any other domain, and the caller nests as before.

`row_prefetcher(kb, sizes, strides, outputs)` does the same for a loop nest whose innermost
loop runs along short contiguous rows (a reduction over a channel's planes, reductions.py:
rows of 16 to 1024 float32 that lie C rows apart, where the hardware's prefetchers stop at
each row's page): a function to call at each row's start, asking for the row's cache lines
PREFETCH_AHEAD_BYTES ahead. `blocked_rows` cuts such a nest's rows longer than
REDUCED_ROW_BLOCK elements into blocks, so that those hints come a block at a time rather than
a whole 4 KiB row's 64 lines an operand at its start (on the Zen 5 host, with the operands
in memory, the burst cost the batch-norm backward's sums a third of their time).
`prefetch_lines` is the one place that emits the hint.

Invariants: each element is computed by the same `leaf` code as in `KernelBuilder.nest`, so
results are bit for bit the same (`blocked_rows` aside: a row's sum goes to its output in
parts, float32 rounding of the order, judged by the float64 rule of docs/performance.md).
A prefetch never faults (past the end of an array it only fetches a line no one reads).
graphc.backends.cpu.codegen nests DDP's fused waits (their reads `combined` from the ranks'
shared windows, their outputs stored non-temporally) as before: prefetching the windows was
slower (docs/distributed.md).
"""

from __future__ import annotations

import math

from llvmlite import ir

from graphc.backends.cpu.values import I32, PTR, i64, loop, size
from graphc.symbolic import Sym

# Elements per block: 64 float32 are 4 cache lines, one 512-bit vector each.
PREFETCH_BLOCK = 64
# How far ahead of the block being computed its operands are fetched (1024: four float32
# blocks). 512 to 4096 bytes all ran the chain at 1.07-1.14 ns per element.
PREFETCH_AHEAD_BYTES = 1024
# Below this many elements (256 KiB of float32, within the L2 cache) the hardware keeps up.
PREFETCH_MIN_ELEMENTS = 1 << 16
CACHE_LINE_BYTES = 64
# Reduced rows longer than this many elements are summed a block at a time (`blocked_rows`;
# graphc.backends.cpu.reductions and sibling_sums); None: whole rows. 256 float32 are 1 KiB,
# PREFETCH_AHEAD_BYTES.
REDUCED_ROW_BLOCK: int | None = 256
# Rows longer than this (bytes) are not prefetched row by row (one hint per line at the row's
# start would run too far ahead); ResNet-18's planes are 64 bytes to 4 KiB.
PREFETCH_ROW_MAX_BYTES = 1 << 14


def prefetching_nest(kb, b: ir.IRBuilder, sizes, strides, leaf, outputs=()) -> bool:
    """The loop over a large one-dimensional domain in blocks that prefetch ahead (module
    docstring); False, emitting nothing, where the domain is not one. `kb`: the
    KernelBuilder, `sizes`/`strides`: its collapsed domain, `leaf(b, offsets)`: the code of
    one element; `outputs`: the operands written (prefetched for writing)."""
    if not _wanted(sizes, strides):
        return False
    if kb.parallel:  # `.range(ptrs..., lo, hi)`: this thread's share of the one dimension
        lo, hi = kb.fn.args[-2], kb.fn.args[-1]
        kb.outer_size = sizes[0]
    else:
        lo, hi = i64(0), size(b, sizes[0])
    fetched = [k for k, op in enumerate(kb.operands)
               if op.loc is not None and op.arange is None and strides[k][0] == 1]
    blocks = b.sdiv(b.sub(hi, lo), i64(PREFETCH_BLOCK))
    with loop(b, 0, blocks, "block") as j:
        start = b.add(lo, b.mul(j, i64(PREFETCH_BLOCK)), flags=["nsw"])
        for k in fetched:
            prefetch_lines(kb, b, k, start, PREFETCH_BLOCK * kb.operands[k].dtype.itemsize,
                           write=k in outputs)
        with loop(b, 0, PREFETCH_BLOCK, "i") as i:
            at = b.add(start, i, flags=["nsw"])
            leaf(b, [at if s[0] else i64(0) for s in strides])
    rest = b.add(lo, b.mul(blocks, i64(PREFETCH_BLOCK)), flags=["nsw"])
    with loop(b, rest, hi, "rest") as i:
        leaf(b, [i if s[0] else i64(0) for s in strides])
    return True


def row_prefetcher(kb, sizes, strides, outputs=(), rows_ahead: int | None = None):
    """`fetch(b, offsets)`, to call at the start of each innermost row of a loop nest over
    the collapsed `sizes` (more than one dimension, at least PREFETCH_MIN_ELEMENTS elements,
    rows of a cache line to PREFETCH_ROW_MAX_BYTES; shorter rows share lines, and the hints
    changed how LLVM vectorised them, so their sums' rounding): it asks for the row's lines
    PREFETCH_AHEAD_BYTES past its start, for each operand contiguous along the row (for
    writing: `outputs`; `rows_ahead` rows on instead where given); None where the nest is not
    such (sizes known per call included)."""
    if len(sizes) < 2 or any(type(n) is not int for n in sizes) or \
            math.prod(sizes) < PREFETCH_MIN_ELEMENTS:
        return None
    fetched = [k for k, op in enumerate(kb.operands)
               if op.loc is not None and op.arange is None and strides[k][-1] == 1
               and CACHE_LINE_BYTES <= sizes[-1] * op.dtype.itemsize <= PREFETCH_ROW_MAX_BYTES]
    if not fetched:
        return None

    def fetch(b, offsets) -> None:
        for k in fetched:
            row_bytes = sizes[-1] * kb.operands[k].dtype.itemsize
            prefetch_lines(kb, b, k, offsets[k], row_bytes, write=k in outputs,
                           ahead=None if rows_ahead is None else rows_ahead * row_bytes)

    return fetch


def blocked_rows(kb, sizes, strides):
    """The collapsed `sizes`/`strides` of a loop nest (more than one loop) whose innermost
    loop runs along rows of more than REDUCED_ROW_BLOCK elements (a multiple of it) with that
    loop cut in two, [row / block, block], each operand's stride s becoming (s * block, s);
    else as they are (REDUCED_ROW_BLOCK None included, and rows of `kb`'s operands past
    PREFETCH_ROW_MAX_BYTES, left to the hardware as before). For a reduction whose rows are summed
    in registers: a row's sum then goes to its output a block at a time, and
    `row_prefetcher`'s hints at each block's start spread over the row instead of a burst of
    a whole long row's lines at its start (4 KiB rows, ResNet-18's 64-channel planes: the
    batch-norm backward's sums 0.78 -> 0.59 ms with x, dy and the mask cold)."""
    block = REDUCED_ROW_BLOCK
    n = sizes[-1] if sizes else None
    if block is None or len(sizes) < 2 or type(n) is not int or n <= block or n % block or \
            n * max(op.dtype.itemsize for op in kb.operands) > PREFETCH_ROW_MAX_BYTES:
        return sizes, strides
    return list(sizes[:-1]) + [n // block, block], \
        [tuple(s[:-1]) + (s[-1] * block, s[-1]) for s in strides]


def prefetch_lines(kb, b, k: int, offset, nbytes: int, write: bool = False,
                   ahead: int | None = None) -> None:
    """Ask for operand `k`'s cache lines that hold `nbytes` from PREFETCH_AHEAD_BYTES (or
    `ahead`) past its element `offset` (llvm.prefetch, keep in every cache level; past the
    array's end it fetches a line no one reads, never faults)."""
    prefetch = kb.cg.declare("llvm.prefetch.p0", ir.FunctionType(
        ir.VoidType(), [PTR, I32, I32, I32]))
    ahead = PREFETCH_AHEAD_BYTES if ahead is None else ahead
    first = b.gep(kb.pointer(b, k, offset), [i64(ahead)],
                  source_etype=ir.IntType(8))  # not inbounds: it may point past the end
    for line in range(0, nbytes, CACHE_LINE_BYTES):
        at = first if line == 0 else b.gep(first, [i64(line)], source_etype=ir.IntType(8))
        # llvm.prefetch(address, rw, locality 3: keep in every cache level, 1: data)
        b.call(prefetch, [at, ir.Constant(I32, int(write)), ir.Constant(I32, 3),
                          ir.Constant(I32, 1)])


def _wanted(sizes, strides) -> bool:
    """One dimension, every operand contiguous or broadcast, and large (or known per call)."""
    if len(sizes) != 1 or any(s[0] not in (0, 1) for s in strides):
        return False
    n = sizes[0]
    return type(n) is Sym or n >= PREFETCH_MIN_ELEMENTS
