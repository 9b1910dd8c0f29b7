"""batch_norm_backward: the lowering of `batch_norm_relu_backward` (graphc.ops.batch_norm_relu,
made by graphc.passes.batch_norm_backward), called by the Lowerer.

Per channel c of an (N, C, S...) input x, with g = where(positive, grad [+ residual_grad], 0)
(the add in x's dtype, as the fused body rendered it): grad_bias = sum(g) and grad_weight =
invstd * sum(g * (x - mean)), each plane's sums in x's dtype (vector registers, reassociated)
and the planes' added in float64, then grad_input = A*g + B*(x - mean) + C with, in float64 per
channel, a = weight * invstd, A = a, B = -a * invstd * grad_weight / m and C = -a * grad_bias /
m (m = N * S), rounded to x's dtype: batch_norm's training VJP, `a * (g - grad_bias/m - xhat *
grad_weight/m)`, with the per-channel factors taken out of the element loop and the sums more
exact than the float32 sums they replace (the rounding rule: docs/performance.md, "batch norm +
ReLU backward as one node, twelfth session").

How: channels in blocks (CHANNEL_BLOCK_BYTES of the planes the first walk reads and writes),
each block walked twice in memory order (image by image, the block's channels within each):
the sums walk reads grad, the mask, x (and the residual's gradient, writing g when
relu_grad=true), each plane prefetched 1 KiB ahead; then the apply walk reads g (or grad and
the mask, recomputing it) and x again, now from L2, and writes grad_input. So each input is
read from memory once, where the two fused nodes it replaces read x, the mask and grad (or
g) twice.

Invariants: a channel's sums are added plane by plane in image order (a plane's elements
reassociated in vector registers) whatever the thread count, so the kernel split over the
channels (conv_threads, pooling's bar) gives the one-thread result bit for bit; strided
inputs are read through contiguous copies; nothing is read outside the inputs.
"""

from __future__ import annotations

import math
from contextlib import ExitStack

from llvmlite import ir

from graphc.backends.cpu import conv_threads, pool
from graphc.backends.cpu.batch_norm import by_channel_blocks, prefetch_plane
from graphc.backends.cpu.conv_workspace import workspace
from graphc.backends.cpu.image_kernels import (
    called_kernel,
    contiguous_in,
    contiguous_out,
    element_strides,
    fadd,
    image_kernel,
    imul,
)
from graphc.backends.cpu.prefetch import prefetch_lines
from graphc.backends.cpu.scalars import convert, prefer_wide_vectors
from graphc.backends.cpu.values import F64, i64, loop, size, unsupported
from graphc.ir.graph import Node
from graphc.types import float32, float64

__all__ = ["batch_norm_relu_backward"]

# Channels per block: this many bytes of the planes the sums walk reads and writes (all N
# images), so that the apply walk finds them in L2 (2 MiB a core here); None: one block.
CHANNEL_BLOCK_BYTES: int | None = 1 << 20
# rows of the float64 workspace: the two sums, then the apply's factors
# Each plane's walk first asks for the lines of the plane walked next ("next plane"), or for
# its own lines 1 KiB ahead ("ahead": the forward's way), or for nothing (None).
PREFETCH: str | None = "next plane"
# Vectorise in 512-bit registers where the target has them (scalars.prefer_wide_vectors).
WIDE_VECTORS = True
SUM_G, SUM_GX, FACTOR_G, FACTOR_X, OFFSET = range(5)
ROWS = 5


def batch_norm_relu_backward(lw, node: Node) -> None:
    """`batch_norm_relu_backward`: the sums walk, then the apply walk, a block of channels at
    a time (the module docstring)."""
    grad, positive, x, weight, mean_v, invstd_v, *residual = node.inputs
    dx_v, gw_v, gb_v, *g_out = node.outputs
    dt = x.type.dtype
    if dt not in (float32, float64) or x.type.is_symbolic:
        raise unsupported(node, f"{node.op} of {x.type}")
    n, c = x.type.shape[:2]
    s = math.prod(x.type.shape[2:])
    reads = [contiguous_in(lw, lw.locs[v]) for v in (grad, positive, x, *residual)]
    params = [lw.locs[v] for v in (weight, mean_v, invstd_v, gw_v, gb_v)]
    pstr = [element_strides(p)[0] for p in params]
    # split over the channels (each one's sums and gradient are its own): memory-bound, so
    # pooling's bar; the workspace is one copy, each share writes its own channels' columns
    split = conv_threads.plan_split(lw, float64, [], c, 3 * n * s * c, shared=[(ROWS, c)],
                                    least=pool.POOL_MIN_SPLIT_TAPS)
    ws = workspace(lw, float64, (ROWS, c))[0] if split is None else split.shared[0]
    with ExitStack() as stack:
        writes = [stack.enter_context(contiguous_out(lw, lw.locs[v])) for v in (dx_v, *g_out)]
        locs = [*reads, *params, ws, *writes]
        kb, ids = image_kernel(lw, node.op, locs + ([] if split is None else [split.control]),
                               ("channel blocks", split is not None, CHANNEL_BLOCK_BYTES,
                                PREFETCH, WIDE_VECTORS,
                                tuple(sorted(node.attrs.items())), len(residual)))
        gi, pi, xi, *rest = ids
        ri = rest[0] if residual else None
        wi, mi, ii, gwi, gbi, wsi, dxi = rest[len(residual):len(residual) + 7]
        goi = rest[len(residual) + 7] if g_out else None
        b = kb.begin()
        if b is None:  # built before for a node of the same shapes and attributes
            lw.calls.append(called_kernel(lw, kb.kernel, split))
            return
        lo_c, hi_c = (0, c) if split is None else conv_threads.unit_range(b, kb, ids[-1])
        m = float(n * s)
        register = ir.FloatType() if dt is float32 else F64
        if WIDE_VECTORS:
            prefer_wide_vectors(b.function)

        def at_ws(row: int, ch):
            return b.add(i64(row * c), ch)

        def wide(v):
            return convert(b, v, dt, float64)

        def narrow(v):
            return convert(b, v, float64, dt)

        def param(k: int, ch):
            return kb.load(b, ids_of[k], imul(b, ch, pstr[k]))

        ids_of = (wi, mi, ii, gwi, gbi)

        def relu_grad(at):
            """g at element `at`: where(positive, grad [+ residual_grad], 0) in x's dtype."""
            d = kb.load(b, gi, at)
            if ri is not None:
                d = lw.scalars.op_add(b, {}, [d, kb.load(b, ri, at)], [dt, dt], dt)
            return b.select(kb.load(b, pi, at), d, ir.Constant(d.type, 0.0))

        def fetch(k, ch, lo, hi, base, operands):
            """PREFETCH's lines of `operands` for the plane (k, ch) of a walk over the
            channels [lo, hi) of every image."""
            if PREFETCH == "ahead":
                return prefetch_plane(b, kb, operands, base, s)
            if PREFETCH != "next plane":
                return None
            last = b.icmp_signed(">=", b.add(ch, i64(1)), size(b, hi))
            following = b.add(b.mul(b.add(k, i64(1)), i64(c * s)), b.mul(size(b, lo), i64(s)))
            # the walk's last plane asks for itself: no address past the tensor (an inbounds
            # pointer past the end is poison in LLVM's terms)
            final = b.icmp_signed(">=", b.add(k, i64(1)), size(b, n))
            following = b.select(final, base, following)
            at = b.select(last, following, b.add(base, i64(s)))
            for operand, write in operands:
                prefetch_lines(kb, b, operand, at, s * kb.operands[operand].dtype.itemsize,
                               write, ahead=0)

        def sums_walk(lo, hi):
            with loop(b, lo, hi, "c0") as ch:
                kb.store(b, wsi, at_ws(SUM_G, ch), ir.Constant(F64, 0.0))
                kb.store(b, wsi, at_ws(SUM_GX, ch), ir.Constant(F64, 0.0))
            with b.goto_entry_block():
                s1, s2 = b.alloca(register, name="s1"), b.alloca(register, name="s2")
            with loop(b, 0, n, "n") as k, loop(b, lo, hi, "c") as ch:
                base = b.add(b.mul(k, i64(c * s)), b.mul(ch, i64(s)))
                fetch(k, ch, lo, hi, base, [(gi, False), (pi, False), (xi, False)]
                      + ([(ri, False)] if ri is not None else [])
                      + ([(goi, True)] if goi is not None else []))
                mean = param(1, ch)
                b.store(ir.Constant(register, 0.0), s1)
                b.store(ir.Constant(register, 0.0), s2)
                with loop(b, 0, s, "s") as q:
                    at = b.add(base, q)
                    g = relu_grad(at)
                    if goi is not None:
                        kb.store(b, goi, at, g)
                    b.store(fadd(b, b.load(s1), g, True), s1)
                    centred = b.fsub(kb.load(b, xi, at), mean)
                    b.store(fadd(b, b.load(s2), b.fmul(g, centred), True), s2)
                for row, acc in ((SUM_G, s1), (SUM_GX, s2)):  # the plane's sums, added in float64
                    kb.store(b, wsi, at_ws(row, ch),
                             b.fadd(kb.load(b, wsi, at_ws(row, ch)), wide(b.load(acc))))

        def factors(lo, hi):
            """Per channel: the two gradients, and A, B, C of the apply (float64)."""
            with loop(b, lo, hi, "c1") as ch:
                invstd = wide(param(2, ch))
                sum_g = kb.load(b, wsi, at_ws(SUM_G, ch))
                sum_gx = b.fmul(kb.load(b, wsi, at_ws(SUM_GX, ch)), invstd)
                kb.store(b, gbi, imul(b, ch, pstr[4]), narrow(sum_g))
                kb.store(b, gwi, imul(b, ch, pstr[3]), narrow(sum_gx))
                a = b.fmul(wide(param(0, ch)), invstd)
                count = ir.Constant(F64, m)
                kb.store(b, wsi, at_ws(FACTOR_G, ch), a)
                kb.store(b, wsi, at_ws(FACTOR_X, ch),
                         b.fneg(b.fmul(b.fmul(a, invstd), b.fdiv(sum_gx, count))))
                kb.store(b, wsi, at_ws(OFFSET, ch), b.fneg(b.fmul(a, b.fdiv(sum_g, count))))

        def apply_walk(lo, hi):
            with loop(b, 0, n, "n1") as k, loop(b, lo, hi, "ca") as ch:
                base = b.add(b.mul(k, i64(c * s)), b.mul(ch, i64(s)))
                fetch(k, ch, lo, hi, base, [(dxi, True)])
                mean = param(1, ch)
                factor_g, factor_x, offset = (narrow(kb.load(b, wsi, at_ws(row, ch)))
                                              for row in (FACTOR_G, FACTOR_X, OFFSET))
                with loop(b, 0, s, "sa") as q:
                    at = b.add(base, q)
                    g = relu_grad(at) if goi is None else kb.load(b, goi, at)
                    centred = b.fsub(kb.load(b, xi, at), mean)
                    dx = b.fadd(b.fmul(factor_g, g), b.fadd(b.fmul(factor_x, centred), offset))
                    kb.store(b, dxi, at, dx)

        def walks(lo, hi):
            sums_walk(lo, hi)
            factors(lo, hi)
            apply_walk(lo, hi)

        block = _block_channels(n, s, [lw.locs[v] for v in (grad, positive, x, *residual,
                                                            *g_out)])
        by_channel_blocks(b, lo_c, hi_c, block, c, walks)
        lw.calls.append(called_kernel(lw, kb.finish(b), split))


def _block_channels(n: int, s: int, locs) -> int:
    """Channels per block: CHANNEL_BLOCK_BYTES of the sums walk's planes, at least one."""
    if CHANNEL_BLOCK_BYTES is None:
        return 1 << 62
    per_channel = n * s * sum(loc.type.dtype.itemsize for loc in locs)
    return max(1, CHANNEL_BLOCK_BYTES // per_channel)
