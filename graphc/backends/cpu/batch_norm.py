"""batch_norm: the lowering of `batch_norm`'s forward and of `batch_norm_relu` (called by the
Lowerer).

Per channel c of an (N, C, S...) input x, in float64: in training the batch mean and biased
variance, in eval the running statistics; `invstd = 1/sqrt(var + eps)`, `scale = invstd *
weight[c]`, and `out = (x - mean) * scale + bias[c]`; out, mean and invstd rounded to the
input's dtype, as the numpy kernel (graphc.ops.nn_ops) does.

How (IMAGE_ORDER, the default): the kernel walks x in memory order, image by image and,
within an image, channel by channel (each channel's plane of S elements contiguous), as an
elementwise kernel does, each plane prefetched (PREFETCH; graphc.backends.cpu.prefetch's
reason). In training a first walk sums, per channel, the shifted values d = x - K and d^2 in
float64 (K: the channel's first element; see `_shifted_sums`) into a workspace of 4 x C
float64 (the sums and K, then the mean, scale and bias of each channel); a second walk writes
the output. Both walks go a block of channels at a time (CHANNEL_BLOCK_BYTES of x), so the
output walk reads the block's planes from L2, where the statistics walk left them. The
earlier kernel (IMAGE_ORDER = False) went channel by channel: three passes over each channel's
N planes (the mean, the squared deviations, the output), the planes C
planes apart, so every plane began cold (docs/performance.md, "ninth session").

`batch_norm_relu` (graphc.ops.batch_norm_relu, made by graphc.passes.batch_norm_relu): the same
kernel, whose output walk adds the residual (if any) to the rounded y, takes the ReLU and
stores its mask, each by the scalar rule a fused body renders (graphc.backends.cpu.scalars),
so the result is the two kernels' bit for bit; it always walks in image order. With
`sums=true` (graphc.passes.conv_channel_sums) there is no statistics walk: each channel's
mean and variance are the convolution's per-image shifted sums merged in image order
(`_merged_statistics`, Chan's update, the op's reference kernel step for step, image by
image over a vector of channels), then the output walk, one block, its hints left to the
hardware (PREFETCH_SUMS_WALK).

Invariants: a channel's sums are added in one order (image by image, a plane's elements
reassociated in vector registers) whatever the thread count, so the kernel split over the
channels (conv_threads, pooling's bar) gives the one-thread result bit for bit; x is read
through a contiguous copy if it is strided; nothing is read outside x, and a prefetch past x's
end never faults.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

from llvmlite import ir

from graphc.backends.cpu import conv_threads, pool
from graphc.backends.cpu.conv_workspace import workspace
from graphc.backends.cpu.image_kernels import (
    called_kernel,
    contiguous_in,
    contiguous_out,
    element_strides,
    fadd,
    iadd,
    image_kernel,
    imul,
)
from graphc.backends.cpu.prefetch import prefetch_lines
from graphc.backends.cpu.scalars import convert
from graphc.backends.cpu.values import F64, i64, loop, size, unsupported
from graphc.ir.graph import Node
from graphc.types import bool_, float32, float64

__all__ = ["batch_norm", "by_channel_blocks", "prefetch_plane"]

# Walk x in memory order (the module docstring); False: the channel-by-channel kernel of
# before (benchmarks' A/B: benchmarks/batch_norm_passes.py).
IMAGE_ORDER = True
# Each plane's walk first asks for the lines of x (and of the output) 1 KiB ahead.
PREFETCH = True
# The same in the output walk of a kernel given its sums (sums=true: that walk alone, x not
# read before). False: the hardware's prefetchers alone, which did better there (Zen 5, x
# cold: 64 channels 0.62 -> 0.54 ms, with a residual 0.96 -> 0.75; docs/performance.md,
# fourteenth session); the walks of the two-walk kernel keep theirs (128 channels 0.31 ms
# with, 0.36 without).
PREFETCH_SUMS_WALK = False
# In training, channels in blocks of this many bytes of x (its N planes a channel), each
# block's statistics walk then its output walk, so that the second reads x from L2 (2 MiB a
# core here), not memory; None: one block (the two walks over the whole of x). 256 KiB: of
# 256 KiB, 512 KiB and 1 MiB the fastest at 128 and 256 channels (benchmarks/
# batch_norm_passes.py, docs/performance.md "ResNet-18, tenth session, h8").
CHANNEL_BLOCK_BYTES: int | None = 1 << 18
# rows of the workspace: the sums and the shift K, then (the sums read) mean, scale and bias
SUM, SQUARES, SHIFT, BIAS = range(4)
MEAN, SCALE = SUM, SQUARES


def batch_norm(lw, node: Node) -> None:
    """`batch_norm`, and `batch_norm_relu` (graphc.ops.batch_norm_relu: the output walk writes
    relu(y [+ residual]) and its mask, rendered by the scalar rules of add, relu and gt)."""
    x, weight, bias, rmean, rvar = node.inputs[:5]
    with_sums = bool(node.attrs.get("sums"))  # the convolution's sums after rvar
    residual = node.inputs[6:] if with_sums else node.inputs[5:]
    fused_relu = node.op == "batch_norm_relu"
    out, *masks, mean_v, invstd_v = node.outputs
    dt = x.type.dtype
    if dt not in (float32, float64):
        raise unsupported(node, f"{node.op} of {dt.name}")
    if not IMAGE_ORDER and not fused_relu:
        return _by_channel(lw, node)
    training, eps = node.attrs["training"], node.attrs["eps"]
    n, c = x.type.shape[:2]
    sums = [contiguous_in(lw, lw.locs[node.inputs[5]])] if with_sums else []
    s = math.prod(x.type.shape[2:])
    lx = contiguous_in(lw, lw.locs[x])
    params = [lw.locs[v] for v in (weight, bias, rmean, rvar)]
    pstr = [element_strides(p)[0] if p.type.ndim else 0 for p in params]
    # split over the channels (each one's statistics and output are its own): two walks over
    # the input, memory-bound, so pooling's bar; the workspace is one copy, shares write
    # their own channels' columns
    split = conv_threads.plan_split(lw, float64, [], c, 2 * n * s * c,
                                    shared=[(4, c)], least=pool.POOL_MIN_SPLIT_TAPS)
    ws = workspace(lw, float64, (4, c))[0] if split is None else split.shared[0]
    extra = [contiguous_in(lw, lw.locs[v]) for v in residual]
    with contiguous_out(lw, lw.locs[out]) as lo, _maybe_out(lw, masks) as lmask:
        locs = [lx, *params, lo, lw.locs[mean_v], lw.locs[invstd_v], ws, *lmask, *extra,
                *sums]
        kb, ids = image_kernel(lw, node.op, locs + ([] if split is None else [split.control]),
                               ("images", tuple(sorted(node.attrs.items())),
                                split is not None, PREFETCH, PREFETCH_SUMS_WALK, len(residual),
                                CHANNEL_BLOCK_BYTES))
        xi, wi, bi, rmi, rvi, oi, mi, ii, wsi = ids[:9]
        maski, ri = (ids[9] if fused_relu else None), (ids[10] if residual else None)
        sumsi = ids[9 + len(lmask) + len(extra)] if with_sums else None
        ms, is_ = (element_strides(lw.locs[v])[0] for v in (mean_v, invstd_v))
        b = kb.begin()
        if b is None:  # built before for a node of the same shapes and attributes
            return lw.calls.append(called_kernel(lw, kb.kernel, split))
        lo_c, hi_c = (0, c) if split is None else conv_threads.unit_range(b, kb, ids[-1])

        def column(row: int, ch):
            return b.add(i64(row * c), ch)

        def wide(v):
            return convert(b, v, dt, float64)

        def walks(lo, hi):
            """The statistics, then the output, of channels [lo, hi)."""
            if training and not with_sums:
                with loop(b, lo, hi, "c0") as ch:
                    kb.store(b, wsi, column(SUM, ch), ir.Constant(F64, 0.0))
                    kb.store(b, wsi, column(SQUARES, ch), ir.Constant(F64, 0.0))
                    kb.store(b, wsi, column(SHIFT, ch), wide(kb.load(b, xi, imul(b, ch, s))))
                _shifted_sums(b, kb, xi, wsi, n, c, s, lo, hi, dt)
            if with_sums:  # each channel's mean and variance into the MEAN and SCALE rows
                _merged_statistics(b, kb, sumsi, wsi, n, c, s, lo, hi)
            with loop(b, lo, hi, "c1") as ch:
                if with_sums:
                    mean = kb.load(b, wsi, column(MEAN, ch))
                    var = kb.load(b, wsi, column(SCALE, ch))
                elif training:
                    m = b.sitofp(size(b, n * s), F64)
                    centre = b.fdiv(kb.load(b, wsi, column(SUM, ch)), m)
                    var = b.fsub(b.fdiv(kb.load(b, wsi, column(SQUARES, ch)), m),
                                 b.fmul(centre, centre))
                    var = b.select(b.fcmp_ordered("<", var, ir.Constant(F64, 0.0)),
                                   ir.Constant(F64, 0.0), var)  # a NaN stays
                    mean = b.fadd(kb.load(b, wsi, column(SHIFT, ch)), centre)
                else:
                    mean = wide(kb.load(b, rmi, imul(b, ch, pstr[2])))
                    var = wide(kb.load(b, rvi, imul(b, ch, pstr[3])))
                invstd = _invstd(lw, b, var, eps)
                kb.store(b, wsi, column(MEAN, ch), mean)
                kb.store(b, wsi, column(SCALE, ch),
                         b.fmul(invstd, wide(kb.load(b, wi, imul(b, ch, pstr[0])))))
                kb.store(b, wsi, column(BIAS, ch), wide(kb.load(b, bi, imul(b, ch, pstr[1]))))
                kb.store(b, mi, imul(b, ch, ms), convert(b, mean, float64, dt))
                kb.store(b, ii, imul(b, ch, is_), convert(b, invstd, float64, dt))
            with loop(b, 0, n, "n") as k, loop(b, lo, hi, "c") as ch:
                base = b.add(b.mul(k, i64(c * s)), b.mul(ch, i64(s)))
                if PREFETCH_SUMS_WALK or not with_sums:
                    prefetch_plane(b, kb, [(xi, False), (oi, True)]
                                    + ([(ri, False)] if residual else []), base, s)
                mean = kb.load(b, wsi, column(MEAN, ch))
                scale = kb.load(b, wsi, column(SCALE, ch))
                shift = kb.load(b, wsi, column(BIAS, ch))
                with loop(b, 0, s, "s") as q:
                    at = b.add(base, q)
                    v = b.fsub(wide(kb.load(b, xi, at)), mean)
                    y = convert(b, b.fadd(b.fmul(v, scale), shift), float64, dt)
                    if fused_relu:
                        y = _relu_and_mask(lw, b, kb, y, dt, maski, at,
                                           None if ri is None else kb.load(b, ri, at))
                    kb.store(b, oi, at, y)

        # (with sums there is no statistics walk: one block, the output walk)
        block = _block_channels(n, s, dt) if training and not with_sums else c
        by_channel_blocks(b, lo_c, hi_c, block, c, walks)
        lw.calls.append(called_kernel(lw, kb.finish(b), split))


def by_channel_blocks(b, lo_c, hi_c, block: int, c: int, walks) -> None:
    """`walks(lo, hi)` over the channels [lo_c, hi_c) at once where `block` >= `c`, else
    block by block (the last one partial), so that a block's N planes stay in L2 between the
    walks."""
    if block >= c:
        return walks(lo_c, hi_c)
    first, last = size(b, lo_c), size(b, hi_c)
    blocks = b.sdiv(b.add(b.sub(last, first), i64(block - 1)), i64(block))
    with loop(b, 0, blocks, "block") as j:
        lo = b.add(first, b.mul(j, i64(block)))
        hi = b.add(lo, i64(block))
        walks(lo, b.select(b.icmp_signed("<", hi, last), hi, last))


def _merged_statistics(b, kb, sumsi, wsi, n: int, c: int, s: int, lo, hi) -> None:
    """The mean and biased variance (float64) of channels [lo, hi) from the per-image shifted
    sums of operand `sumsi` ([N, 3, C]: K, S1, S2), merged in image order by Chan's update:
    per channel the same operations in the same order as graphc.ops.batch_norm_relu.
    merged_statistics, written to the workspace's MEAN and SCALE rows. Images outermost,
    channels innermost (the running mean and M2 in those rows): the channel loop is a vector
    loop (contiguous along C, the image's factors hoisted) where one channel's chain of 32
    dependent divisions, channel after channel, took ~0.1 ms at 512 channels."""
    plane = ir.Constant(F64, float(s))

    def image(k, ch):
        shift, s1, s2 = (kb.load(b, sumsi, iadd(b, imul(b, k, 3 * c), row * c, ch))
                         for row in range(3))
        return b.fadd(shift, b.fdiv(s1, plane)), b.fsub(s2, b.fmul(s1, b.fdiv(s1, plane)))

    def at(row: int, ch):
        return b.add(i64(row * c), ch)

    with loop(b, lo, hi, "first") as ch:
        first_mean, first_m2 = image(i64(0), ch)
        kb.store(b, wsi, at(MEAN, ch), first_mean)
        kb.store(b, wsi, at(SCALE, ch), first_m2)
    with loop(b, 1, n, "img") as k:
        kf = b.sitofp(k, F64)
        after = b.fadd(kf, ir.Constant(F64, 1.0))
        weight = b.fdiv(b.fmul(plane, kf), after)
        with loop(b, lo, hi, "merge") as ch:
            mean_k, m2_k = image(k, ch)
            mean = kb.load(b, wsi, at(MEAN, ch))
            delta = b.fsub(mean_k, mean)
            kb.store(b, wsi, at(MEAN, ch), b.fadd(mean, b.fdiv(delta, after)))
            m2 = b.fadd(m2_k, b.fmul(b.fmul(delta, delta), weight))
            kb.store(b, wsi, at(SCALE, ch), b.fadd(kb.load(b, wsi, at(SCALE, ch)), m2))
    with loop(b, lo, hi, "variance") as ch:
        var = b.fdiv(kb.load(b, wsi, at(SCALE, ch)), b.sitofp(size(b, n * s), F64))
        var = b.select(b.fcmp_ordered("<", var, ir.Constant(F64, 0.0)),
                       ir.Constant(F64, 0.0), var)  # a NaN stays
        kb.store(b, wsi, at(SCALE, ch), var)


def _block_channels(n: int, s: int, dt) -> int:
    """Channels per block (CHANNEL_BLOCK_BYTES of x, at least one): each block's statistics
    walk, then its output walk, so the second reads x from L2."""
    if CHANNEL_BLOCK_BYTES is None or not isinstance(n * s, int):
        return 1 << 62  # (a symbolic size: one block, as before)
    return max(1, CHANNEL_BLOCK_BYTES // (n * s * dt.itemsize))


def _relu_and_mask(lw, b, kb, y, dt, maski: int, at, residual):
    """relu(y [+ residual]) with its mask (> 0) stored at `at` of operand `maski`: the scalar
    rules of add, relu and gt (graphc.backends.cpu.scalars), as the fused ReLU rendered them."""
    if residual is not None:
        y = lw.scalars.op_add(b, {}, [y, residual], [dt, dt], dt)
    r = lw.scalars.op_relu(b, {}, [y], [dt], dt)
    zero = ir.Constant(y.type, 0.0)
    kb.store(b, maski, at, lw.scalars.op_gt(b, {}, [r, zero], [dt, dt], bool_))
    return r


@contextmanager
def _maybe_out(lw, values):
    """`contiguous_out` of each value in `values` (none or one): a list of the Locs."""
    if not values:
        yield []
        return
    with contiguous_out(lw, lw.locs[values[0]]) as loc:
        yield [loc]


def _shifted_sums(b, kb, xi, wsi, n: int, c: int, s: int, lo_c, hi_c, dt) -> None:
    """Per channel of [lo_c, hi_c), S1 += sum(x - K) and S2 += sum((x - K)^2) in float64
    (K: the workspace's SHIFT row), x walked in memory order, each plane's two sums in
    registers (reassociated: vector registers) and added to the workspace's once.

    Why the shift: mean = K + S1/m and var = S2/m - (S1/m)^2 (m = N*S) lose about
    log10(1 + (mean - K)^2 / var) of float64's ~16 digits to the subtraction, and K, a sample
    of the channel, lies a few deviations from its mean, so a large mean over a small spread
    (1e5 + 0.1 * noise) costs nothing, where unshifted sums would lose every digit. Only a
    K some 10^4 deviations from the mean would cost the float32 result's last bits."""
    with b.goto_entry_block():
        s1 = b.alloca(F64, name="s1")
        s2 = b.alloca(F64, name="s2")
    with loop(b, 0, n, "n") as k, loop(b, lo_c, hi_c, "c") as ch:
        base = b.add(b.mul(k, i64(c * s)), b.mul(ch, i64(s)))
        prefetch_plane(b, kb, [(xi, False)], base, s)
        shift = kb.load(b, wsi, b.add(i64(SHIFT * c), ch))
        b.store(ir.Constant(F64, 0.0), s1)
        b.store(ir.Constant(F64, 0.0), s2)
        with loop(b, 0, s, "s") as q:
            d = b.fsub(convert(b, kb.load(b, xi, b.add(base, q)), dt, float64), shift)
            b.store(fadd(b, b.load(s1), d, True), s1)
            b.store(fadd(b, b.load(s2), b.fmul(d, d), True), s2)
        for row, acc in ((SUM, s1), (SQUARES, s2)):
            at = b.add(i64(row * c), ch)
            kb.store(b, wsi, at, b.fadd(kb.load(b, wsi, at), b.load(acc)))


def prefetch_plane(b, kb, operands, base, s: int) -> None:
    """With PREFETCH, ask for the plane 1 KiB past element `base` of each
    (operand, for writing) in `operands` (graphc.backends.cpu.prefetch.prefetch_lines: 1 KiB)."""
    if PREFETCH:
        for k, write in operands:
            prefetch_lines(kb, b, k, base, s * kb.operands[k].dtype.itemsize, write)


def _by_channel(lw, node: Node) -> None:
    """The kernel of before (IMAGE_ORDER = False): channel by channel, the mean, the squared
    deviations and the output, each a pass over the channel's N planes."""
    x, weight, bias, rmean, rvar = node.inputs
    out, mean_v, invstd_v = node.outputs
    dt = x.type.dtype
    training, eps = node.attrs["training"], node.attrs["eps"]
    n, c = x.type.shape[:2]
    s = math.prod(x.type.shape[2:])
    count = n * s
    lx = contiguous_in(lw, lw.locs[x])
    params = [lw.locs[v] for v in (weight, bias, rmean, rvar)]
    pstr = [element_strides(p)[0] if p.type.ndim else 0 for p in params]
    split = conv_threads.plan_split(lw, dt, [], c, 3 * count * c,
                                    least=pool.POOL_MIN_SPLIT_TAPS)
    with contiguous_out(lw, lw.locs[out]) as lo:
        locs = [lx, *params, lo, lw.locs[mean_v], lw.locs[invstd_v]]
        kb, ids = image_kernel(lw, "batch_norm", locs + ([] if split is None else
                                                         [split.control]),
                               ("channels", tuple(sorted(node.attrs.items())),
                                split is not None))
        xi, wi, bi, rmi, rvi, oi, mi, ii = ids[:8]
        ms, is_ = (element_strides(lw.locs[v])[0] for v in (mean_v, invstd_v))
        b = kb.begin()
        if b is None:
            return lw.calls.append(called_kernel(lw, kb.kernel, split))
        with b.goto_entry_block():
            acc = b.alloca(F64, name="acc")

        def over(b, ch, fn):
            with loop(b, 0, n, "n") as k:
                base = b.add(b.mul(k, i64(c * s)), b.mul(ch, i64(s)))
                with loop(b, 0, s, "s") as q:
                    fn(b, b.add(base, q))

        def wide(v):
            return convert(b, v, dt, float64)

        with conv_threads.units_loop(b, kb, split, ids[-1], c, "c") as ch:
            if training:
                b.store(ir.Constant(F64, 0.0), acc)
                over(b, ch, lambda b, at: b.store(fadd(b, b.load(acc), wide(kb.load(b, xi, at)),
                                                       True), acc))
                mean = b.fdiv(b.load(acc), b.sitofp(size(b, count), F64))
                b.store(ir.Constant(F64, 0.0), acc)

                def sq(b, at):
                    d = b.fsub(wide(kb.load(b, xi, at)), mean)
                    b.store(fadd(b, b.load(acc), b.fmul(d, d), True), acc)

                over(b, ch, sq)
                var = b.fdiv(b.load(acc), b.sitofp(size(b, count), F64))
            else:
                mean = wide(kb.load(b, rmi, imul(b, ch, pstr[2])))
                var = wide(kb.load(b, rvi, imul(b, ch, pstr[3])))
            invstd = _invstd(lw, b, var, eps)
            scale = b.fmul(invstd, wide(kb.load(b, wi, imul(b, ch, pstr[0]))))
            shift = wide(kb.load(b, bi, imul(b, ch, pstr[1])))

            def norm(b, at):
                v = b.fsub(wide(kb.load(b, xi, at)), mean)
                kb.store(b, oi, at, convert(b, b.fadd(b.fmul(v, scale), shift), float64, dt))

            over(b, ch, norm)
            kb.store(b, mi, imul(b, ch, ms), convert(b, mean, float64, dt))
            kb.store(b, ii, imul(b, ch, is_), convert(b, invstd, float64, dt))
        lw.calls.append(called_kernel(lw, kb.finish(b), split))


def _invstd(lw, b, var, eps: float):
    """1 / sqrt(var + eps) in float64 (the statistics' precision)."""
    root = lw.scalars.intrinsic(b, "llvm.sqrt", float64, b.fadd(var, ir.Constant(F64, float(eps))))
    return b.fdiv(ir.Constant(F64, 1.0), root)
