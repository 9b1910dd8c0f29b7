"""column_parts: a kernel that adds its rows into column sums, forked over the rows.

A column sum (the result keeps only the innermost dim: GPT's bias gradients, `reduce_sum`
over [B*T, C]; a LayerNorm backward row program's gamma and beta gradients) adds every row
into the same outputs, so its rows could not be shared out the way a row-outermost
reduction's are (graphc.backends.cpu.kernels.reduction_loops), and it ran serially: on two
threads it also read the half of its rows the other core had just written (the GEMM or row
kernel before it splits its rows between the cores). Cutting the columns instead (each
thread half of every row) kept the bits but cost 40-50% more on one thread (tenth session,
docs/performance.md).

Here the rows are cut into `parts` contiguous parts (the most threads graphc's calls use,
fixed when compiling), the parts outermost and forked as a parallel kernel's outermost loop
is (one contiguous share of the parts a thread): part p adds its rows, in the serial kernel's
order, into its own partial row of a workspace buffer (rows PAGE_BYTES apart: no page holds
two threads' rows), and a merge kernel after the join adds the partial rows in part order
into the result, dividing a mean there. On one thread the same parts run one
after another, so the result has the same bits at every thread count; it differs from the
serial kernel's only by adding the parts' totals last (float rounding of the order, judged
by the float64-distance rule: docs/performance.md, "Rounding"). The workspace is the
module's convolution workspace (graphc.backends.cpu.conv_workspace): the merge runs right
after the kernel, and nothing stays there between kernels.

Users: graphc.backends.cpu.reductions (a lone or fused column reduce_sum / reduce_mean) and
graphc.backends.cpu.rows (a row program's column sums).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from graphc.backends.cpu.conv_workspace import workspace
from graphc.backends.cpu.kernels import Kernel, KernelBuilder, forks
from graphc.backends.cpu.scalars import const, convert, reduction_combiner
from graphc.backends.cpu.values import CpuLoweringError, Loc, collapse, i64, loop
from graphc.types import TensorType

__all__ = ["ColumnParts", "plan"]

SPLIT = True  # False: column sums stay serial kernels (benchmarks' A/B)
# Partial rows lie at least a page apart, with a page before the first: a core's hardware
# prefetchers run ahead within a 4 KiB page, and partial rows 512 bytes apart (64-byte
# aligned, no line shared) made GPT's LayerNorm backward row program no faster on two
# threads than on one (56 us, against 33 us with rows a page apart or no column sums).
PAGE_BYTES = 4096
OPS = ("reduce_sum", "reduce_mean")  # the reductions whose columns are cut into parts


@dataclass
class ColumnParts:
    """How a column-sum kernel's rows go into `parts` partial rows: `locs[i]` the partial
    buffer [parts, padded] of the kernel's i-th column output (its first `width` columns
    used, rows `padded` elements apart: PAGE_BYTES and more)."""

    parts: int
    width: int
    padded: int
    locs: list[Loc]

    @property
    def count(self) -> int:
        """The elements of one partial buffer (what a kernel initialises)."""
        return self.parts * self.padded

    def loops(self, sizes: list, strides: list, partials: list[int]) -> tuple[list, list,
                                                                              bool]:
        """(sizes, strides, parallel) of the kernel's collapsed loops with the rows cut:
        [parts, rows / parts, ...]; operand k of `partials` (a partial buffer) moves one
        padded row per part, every other operand rows / parts rows."""
        if sizes[0] % self.parts:
            raise CpuLoweringError(f"column_parts: {sizes[0]} rows do not cut into "
                                   f"{self.parts} parts (internal: plan checked other loops)")
        chunk = sizes[0] // self.parts
        cut = [(self.padded if k in partials else s[0] * chunk,) + tuple(s)
               for k, s in enumerate(strides)]
        return [self.parts, chunk] + list(sizes[1:]), cut, True

    def merge(self, lw, outputs: list[tuple[Loc, str, int]]) -> Kernel:
        """The kernel that adds the partial rows, in part order, into each result:
        `outputs[i]` = (the result's Loc, the reduction op, the count a mean divides by)
        for `locs[i]`."""
        recipe = ("column merge", self.parts, self.padded,
                  tuple((out.type.dtype.name, op, n) for out, op, n in outputs))
        kb = KernelBuilder(lw, lw.name("column_merge"), (self.width,), recipe)
        pairs = [(kb.operand(part, (1,)), kb.operand(out, (1,)))
                 for part, (out, _, _) in zip(self.locs, outputs)]
        b = kb.begin()
        if b is None:
            return kb.kernel
        with loop(b, 0, self.width, "column") as j:
            for (part, out), (out_loc, op, n), loc in zip(pairs, outputs, self.locs):
                t = loc.type.dtype
                combine = reduction_combiner(lw.scalars, op, t)
                total = kb.load(b, part, j)
                for p in range(1, self.parts):
                    total = combine(b, total, kb.load(b, part, b.add(j, i64(p * self.padded))),
                                    False)
                if op == "reduce_mean":
                    total = b.fdiv(total, const(t, n))
                kb.store(b, out, j, convert(b, total, t, out_loc.type.dtype))
        return kb.finish(b)


def plan(lw, domain, strides: list, dtypes: list, op: str = "reduce_sum") -> \
        ColumnParts | None:
    """ColumnParts for a kernel over `domain` whose operands have element `strides` (one
    tuple per operand; the last len(dtypes) ones the column outputs, stride 0 along the
    reduced dims, accumulated in `dtypes`), or None (the kernel as before) unless: SPLIT,
    the kernel forks (`kernels.forks` on the domain's elements), the collapsed loops keep
    only the innermost dim (a column sum) of static sizes, the outermost cuts into
    `lw.most_threads()` >= 2 equal parts, and the sums are floating `OPS`."""
    work = math.prod(domain)
    if not SPLIT or op not in OPS or type(work) is not int or not forks(lw.openmp, work):
        return None
    if not all(t.is_floating for t in dtypes):
        return None
    sizes, collapsed = collapse(domain, strides)
    parts = lw.most_threads()
    if len(sizes) < 2 or any(type(n) is not int for n in sizes) or parts < 2 or \
            sizes[0] % parts:
        return None
    last = len(sizes) - 1
    for s in collapsed[len(collapsed) - len(dtypes):]:
        if [d for d, x in enumerate(s) if x != 0] != [last]:
            return None
    width = sizes[last]
    t = dtypes[0]
    if any(d is not t for d in dtypes):
        return None
    # a page between any two partial rows (module docstring): rows PAGE_BYTES apart or more
    gap = (-(-width * t.itemsize // PAGE_BYTES) + 1) * PAGE_BYTES // t.itemsize
    (whole,) = workspace(lw, t, (len(dtypes) * (parts + 1) * gap,))
    locs = [Loc(whole.base, whole.index, whole.offset + (i * (parts + 1) + 1) * gap * t.itemsize,
                (gap * t.itemsize, t.itemsize), TensorType((parts, gap), t))
            for i in range(len(dtypes))]
    return ColumnParts(parts, width, gap, locs)
