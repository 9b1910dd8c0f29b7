"""plane_sums: a convolution output plane's shifted sums for the batch norm after it.

`conv2d_channel_sums` (graphc.ops.batch_norm_relu, made by graphc.passes.conv_channel_sums)
returns, per image n and output channel o, float64 [N, 3, O]: K = out[n, o, 0, 0], sum(out -
K) and sum((out - K)^2). The kernels that write out add them from the rows they have just
written, while those are in cache: the Winograd output transforms (graphc.backends.cpu.
winograd_transforms, one channel behind: SUMS_BEHIND there), the stride-2 polyphase kernel
and the few-channel kernel (conv_polyphase, conv_few_channels), and the fallback walk of
graphc.backends.cpu.conv_channel_sums. `add_plane_sums` emits that sum, in one place;
`add_vector_sums` the same sums of a whole plane held in one vector register (the polyphase
kernel's 4x4 planes), with no loads.
(winograd_transforms re-exports it, where those kernels import it from.)
"""

from __future__ import annotations

from llvmlite import ir

from graphc.backends.cpu.image_kernels import fadd, iadd, imul
from graphc.backends.cpu.scalars import convert
from graphc.backends.cpu.values import F64, I32, loop
from graphc.types import float64

__all__ = ["SUM_D", "SUM_SHIFT", "SUM_SQUARES", "add_plane_sums", "add_vector_sums"]

# the rows of a sums operand (graphc.ops.batch_norm_relu.sums_type: [N, 3, C] float64)
SUM_SHIFT, SUM_D, SUM_SQUARES = range(3)


def add_plane_sums(b, kb, dt, oi, plane, start, count: int, sums: int, n, o, co: int,
                   first) -> None:
    """sums[n, 1, o] (+)= sum(d) and sums[n, 2, o] (+)= sum(d^2) over d = out[start + q] - K
    (q < count, in float64), K = sums[n, 0, o], which the plane's first part (`first`: True,
    False or an i1 value) sets to the plane's first element out[plane] (written by then) and
    whose sums it writes rather than adds to. The elements are summed in registers
    (reassociated: LLVM's vector lanes), in one order fixed by the code, whatever the
    thread count (an image is one thread's)."""
    with b.goto_entry_block():
        acc = [b.alloca(F64, name="sum_d"), b.alloca(F64, name="sum_d2")]
    slot = [iadd(b, imul(b, n, 3 * co), row * co, o) for row in range(3)]
    zero = ir.Constant(F64, 0.0)
    if first is True:
        shift = convert(b, kb.load(b, oi, plane), dt, float64)
    elif first is False:
        shift = kb.load(b, sums, slot[SUM_SHIFT])
    else:
        shift = b.select(first, convert(b, kb.load(b, oi, plane), dt, float64),
                         kb.load(b, sums, slot[SUM_SHIFT]))
    for a in acc:
        b.store(zero, a)
    with loop(b, 0, count, "sq") as q:
        d = b.fsub(convert(b, kb.load(b, oi, iadd(b, start, q)), dt, float64), shift)
        b.store(fadd(b, b.load(acc[0]), d, True), acc[0])
        b.store(fadd(b, b.load(acc[1]), b.fmul(d, d), True), acc[1])
    if first is not False:
        kb.store(b, sums, slot[SUM_SHIFT], shift)
    for row, a in ((SUM_D, acc[0]), (SUM_SQUARES, acc[1])):
        total = b.load(a)
        if first is not True:
            before = kb.load(b, sums, slot[row])
            before = before if first is False else b.select(first, zero, before)
            total = b.fadd(before, total)
        kb.store(b, sums, slot[row], total)


def add_vector_sums(b, kb, values, sums: int, n, o, co: int) -> None:
    """add_plane_sums (first=True) of a plane that is the whole of `values` (a float32 vector,
    computed and stored just before): K = values[0], sum(d) and sum(d^2) of d = values - K in
    float64, from the registers (no loads of the stores just made, which wait on them),
    summed as a pairwise tree of the lanes: one order fixed by the code."""
    count = values.type.count
    wide = b.fpext(values, ir.VectorType(F64, count))
    shift = b.extract_element(wide, ir.Constant(I32, 0))
    splat = b.shuffle_vector(wide, ir.Constant(wide.type, ir.Undefined),
                             ir.Constant(ir.VectorType(I32, count), [0] * count))
    d = b.fsub(wide, splat)
    slot = [iadd(b, imul(b, n, 3 * co), row * co, o) for row in range(3)]
    kb.store(b, sums, slot[SUM_SHIFT], shift)
    kb.store(b, sums, slot[SUM_D], _lanes_sum(b, d))
    kb.store(b, sums, slot[SUM_SQUARES], _lanes_sum(b, b.fmul(d, d)))


def _lanes_sum(b, v):
    """The sum of a vector's lanes (a power of two of them), halves added pairwise."""
    while v.type.count > 1:
        half = v.type.count // 2
        lo, hi = (b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                   ir.Constant(ir.VectorType(I32, half),
                                               list(range(k, k + half))))
                  for k in (0, half))
        v = b.fadd(lo, hi)
    return b.extract_element(v, ir.Constant(I32, 0))
