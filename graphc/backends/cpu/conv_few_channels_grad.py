"""conv_few_channels_grad: the weight gradient of convolutions with few input channels,
register-tiled (the backward partner of graphc.backends.cpu.conv_few_channels).

Called first by graphc.backends.cpu.conv's `conv2d_weight_grad` lowering; returns False when
the node does not take this path. It serves convolutions like conv_few_channels' forward
(float32, stride 1, groups 1, at most MAX_CHANNELS input channels; a host with AVX2 or
AVX-512), of any row width and up to this module's MAX_TAPS taps. There im2col + GEMM is
`gy [O x P] @ cols^T [P x C*kH*kW]` per image: a GEMM only 27 columns wide for a 3-channel
3x3 convolution.

The kernel: gw[o, c, i, j] = sum over images and output positions of gy[o, r, q] *
xpad[c, r + i*dH, q + j*dW]. At stride 1, with the output gradient copied into rows of the
padded width Wp (zeros past W_out), every tap is one flat sum over p = r*Wp + q of
gy[o, p] * xpad[c, p + i*dH*Wp + j*dW]: vectors of LANES consecutive p, with no row
structure (the flat buffer is rounded up to whole vectors, zero-filled). A tile is
`channels` output channels x the kW taps of one kernel row: per vector step it loads the
channels' gy vectors and the kW shifted input vectors once and does channels x kW fused
multiply-adds into vector sums kept in registers. Per image, each tile's sums are added
into a vector partial sum per (output channel, tap) in the workspace; after the last image
each partial's lanes are added in a fixed tree into the gradient (a loop over the partials:
unrolled per tap, those trees were 1.19 MB of LLVM IR and 3.3 s of LLVM for LeNet-5's
second layer, docs/performance.md "Compact few-channel kernels").

Units of work are the output-channel tiles (each gradient row is one thread's: no partial
gradients to add across threads); each share copies the images' padded planes and its
channels' output gradients into its own workspace (graphc.backends.cpu.conv_threads).

Rounding: per lane a sum over one image's positions (~P/LANES terms), then over the images,
then over the lanes: another order than numpy's, judged by distance from a float64 run
(docs/performance.md, "Rounding"; tests/test_cpu_conv_few_channels.py).

Padded positions: the zeros past W_out in gy's rows (and past its last row) would multiply
real input values (those a tap's window never reaches at that row), so one infinite input
value gave NaN (0 * inf) in taps where PyTorch's gradient, which never forms those
products, is finite (8 NaN taps of 108 for one inf in a 2x3x8x8 input). No such product
counts: a mask of the valid positions, made once per call, keeps the padded lanes' sums as
they were (AVX-512: masked fused multiply-adds, the step's 16 bits loaded into a mask
register; AVX2: the tap's input vectors zeroed there by an `and`), so with an infinite
input value the gradient matches PyTorch's (tests/test_cpu_conv_few_channels.py). Not
mended: an infinite output-gradient value at a border meets the input's zero padding and
gives NaN there, as the interpreter's im2col does; PyTorch skips those products too.
Cost, kernels alone, 1 thread (docs/performance.md, "Two threads: the few-channel
convolutions"): 0.5-4.5% with AVX-512; the AVX2 code 10-18% when run on an AVX-512 host,
not measured on an AVX2-only one.
"""

from __future__ import annotations

from llvmlite import ir

from graphc.backends.cpu import conv_few_channels, small_gemm
from graphc.backends.cpu.conv_im2col import grad_image
from graphc.backends.cpu.conv_threads import temporaries, units_loop
from graphc.backends.cpu.image_kernels import (
    called_kernel,
    contiguous_out,
    iadd,
    image_kernel,
    image_strides,
    imul,
)
from graphc.backends.cpu.values import F32, I1, I32, I64, i64, loop
from graphc.types import float32

__all__ = ["MAX_TAPS", "conv2d_weight_grad", "serves"]

I16 = ir.IntType(16)

# C*kH*kW: only a kernel row's kW taps are unrolled here, so the gradient serves more taps
# than the forward (8 channels of 5x5; measured, 1 thread, CPU time: LeNet's second layer,
# 6->16 5x5 on 14x14, 0.48 -> 0.42 ms against im2col + GEMM; 8->32 5x5 on 16x16 1.72 -> 1.22)
MAX_TAPS = 200


def _tile_channels(g, lanes: int) -> int:
    """Output channels a tile sums at once: channels x kW vector sums in the registers a
    tile may take (conv_few_channels.accumulators), the channels split into even tiles."""
    most = max(1, conv_few_channels.accumulators(lanes) // g.kw)
    tiles = -(-g.o // min(g.o, most))
    return -(-g.o // tiles)


def serves(g, dt) -> bool:
    """Whether this path takes the weight gradient of `g` (conv_im2col.Geometry)."""
    lanes = small_gemm.lanes()
    return bool(lanes) and dt is float32 and g.groups == 1 and \
        g.c <= conv_few_channels.MAX_CHANNELS and g.stride == (1, 1) and \
        g.k <= MAX_TAPS and g.kw <= conv_few_channels.accumulators(lanes) \
        and all(type(d) is int for d in (g.c, g.h, g.w, g.o, g.ho, g.wo)) and \
        min(g.o, g.ho, g.wo) >= 1


def conv2d_weight_grad(lw, node, g) -> bool:
    gy, x = node.inputs
    dt = x.type.dtype
    if not serves(g, dt):
        return False
    lanes = small_gemm.lanes()
    gl, gs = grad_image(lw, lw.locs[gy], g)
    xl = lw.locs[x]
    xs = image_strides(xl)
    (ph, pw), dw = g.padding, g.dilation[1]
    hp, wp = g.h + 2 * ph, g.w + 2 * pw
    flat = -(-g.ho * wp // lanes) * lanes  # positions p of one plane, whole vectors
    slack = flat - g.ho * wp + (g.kw - 1) * dw
    channels = _tile_channels(g, lanes)
    full, rest = divmod(g.o, channels)
    units = full + (rest > 0)
    # the tile's output gradients, then the mask of valid positions (`_Grads.masks`)
    gpad_floats = channels * flat + flat + flat // lanes
    shapes = [(g.c * hp * wp + slack,), (gpad_floats,), (channels * g.k * lanes,)]
    split, temps = temporaries(lw, dt, shapes, units, g.n * g.o * g.k * g.p)
    with contiguous_out(lw, lw.locs[node.outputs[0]]) as dst:
        kb, ids = image_kernel(lw, "conv2d_few_channels_weight_grad", [gl, xl, dst] + temps,
                               ("few_channels", g.key(), lanes, channels, split is not None))
        b = kb.begin()
        if b is None:
            lw.calls.append(called_kernel(lw, kb.kernel, split))
            return True
        grads = _Grads(kb, g, ids, gs, xs, lanes, flat, hp, wp)
        for k, count in ((ids[3], g.c * hp * wp + slack), (ids[4], gpad_floats)):
            with loop(b, 0, count, "zero") as q:
                kb.store(b, k, q, ir.Constant(F32, 0.0))
        grads.masks(b, channels)
        with units_loop(b, kb, split, ids[-1], units, "otile") as unit:
            o0 = b.mul(unit, i64(channels))
            if rest:
                last = b.icmp_signed("==", unit, i64(full))
                with b.if_else(last) as (then, otherwise):
                    with then:
                        grads.tile(b, o0, rest)
                    with otherwise:
                        grads.tile(b, o0, channels)
            else:
                grads.tile(b, o0, channels)
        lw.calls.append(called_kernel(lw, kb.finish(b), split))
    return True


def _lane_sum(b, v):
    """The sum of vector v's lanes in a fixed tree: lane k + lane k + half, the vector halved
    until one lane is left (8 instructions for 16 lanes, where extracting every lane took 31)."""
    width = v.type.count
    while width > 1:
        half = width // 2
        low = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, half), list(range(half))))
        high = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, half),
                                                  list(range(half, width))))
        v = b.fadd(low, high)
        width = half
    return b.extract_element(v, ir.Constant(I32, 0))


class _Grads:
    """The code of one output-channel tile's gradient rows (`tile`)."""

    def __init__(self, kb, g, ids, gs, xs, lanes, flat, hp, wp) -> None:
        self.kb, self.g, self.gs, self.xs = kb, g, gs, xs
        self.gi, self.xi, self.oi, self.xpad, self.gpad, self.part = ids[:6]
        self.lanes, self.flat, self.hp, self.wp = lanes, flat, hp, wp
        self.vec = ir.VectorType(F32, lanes)
        self.words = ir.VectorType(I32, lanes)

    def masks(self, b, channels: int) -> None:
        """The positions p whose output gradient is real (row < H_out, column < W_out),
        after the tile's output gradients in `gpad`: an int32 of all ones per valid p
        (`mask_words`), and with 16 lanes one i16 of bits per vector step (`mask_bits`)."""
        kb, g, wp = self.kb, self.g, self.wp
        self.mask_words = channels * self.flat
        self.mask_bits = self.mask_words + self.flat
        words = kb.pointer(b, self.gpad, i64(self.mask_words))
        with loop(b, 0, g.ho, "mr") as r, loop(b, 0, g.wo, "mq") as q:
            at = iadd(b, imul(b, r, wp), q)
            b.store(ir.Constant(I32, -1), b.gep(words, [at], inbounds=True, source_etype=I32))
        if self.lanes != 16:
            return
        bits = kb.pointer(b, self.gpad, i64(self.mask_bits))
        with loop(b, 0, self.flat // self.lanes, "mb") as s:
            v = b.load(b.gep(words, [b.mul(s, i64(self.lanes))], inbounds=True,
                             source_etype=I32), typ=self.words, align=4)
            valid = b.icmp_signed("!=", v, ir.Constant(self.words, [0] * self.lanes))
            b.store(b.bitcast(valid, I16), b.gep(bits, [s], inbounds=True, source_etype=I16))

    def tile(self, b, o0, channels: int) -> None:
        """gw[o0 + o] for o < channels: over the images, the padded planes and the tile's
        output gradients copied, then every kernel row's sums; then the lanes added."""
        kb, g = self.kb, self.g
        (ph, pw), hp, wp = g.padding, self.hp, self.wp
        with loop(b, 0, g.n, "n") as n:
            with loop(b, 0, g.c, "pc") as c, loop(b, 0, g.h, "pr") as r:
                src = iadd(b, imul(b, n, self.xs[0]), imul(b, c, self.xs[1]),
                           imul(b, r, self.xs[2]))
                to = iadd(b, imul(b, c, hp * wp), imul(b, r, wp), ph * wp + pw)
                with loop(b, 0, g.w, "pq") as q:
                    kb.store(b, self.xpad, b.add(to, q),
                             kb.load(b, self.xi, b.add(src, imul(b, q, self.xs[3]))))
            with loop(b, 0, channels, "go") as o, loop(b, 0, g.ho, "gr") as r:
                src = iadd(b, imul(b, n, self.gs[0]), imul(b, b.add(o0, o), self.gs[1]),
                           imul(b, r, self.gs[2]))
                to = iadd(b, imul(b, o, self.flat), imul(b, r, wp))
                with loop(b, 0, g.wo, "gq") as q:
                    kb.store(b, self.gpad, b.add(to, q),
                             kb.load(b, self.gi, b.add(src, imul(b, q, self.gs[3]))))
            first = b.icmp_signed("==", n, i64(0))
            with loop(b, 0, g.c * g.kh, "krow") as t:
                self.kernel_row(b, t, channels, first)
        # a loop over the tile's channels x taps partials, each one's lanes added in the
        # fixed tree (unrolled, those trees were 1.19 MB of LLVM IR for LeNet-5's 6->16)
        gw_tile = b.mul(o0, i64(g.k))  # gw[o0 + o, tap] is gw's element o0*k + (o*k + tap)
        with loop(b, 0, channels * g.k, "lanesum") as s:
            v = b.load(kb.pointer(b, self.part, b.mul(s, i64(self.lanes))), typ=self.vec,
                       align=4)
            kb.store(b, self.oi, b.add(gw_tile, s), _lane_sum(b, v))

    def kernel_row(self, b, t, channels: int, first) -> None:
        """The sums of kernel row t = c*kH + i (its kW taps) for the tile's channels over
        one image, added into the vector partials (stored at the first image)."""
        kb, g, wp, vec = self.kb, self.g, self.wp, self.vec
        c, i = (b.udiv(t, i64(g.kh)), b.urem(t, i64(g.kh))) if g.kh > 1 else (t, i64(0))
        shift = b.add(b.mul(c, i64(self.hp * wp)), b.mul(i, i64(g.dilation[0] * wp)))
        zero = ir.Constant(vec, [0.0] * self.lanes)
        pre = b.block
        body = b.append_basic_block("pos.body")
        b.branch(body)
        b.position_at_end(body)
        p = b.phi(I64, name="p")
        p.add_incoming(i64(0), pre)
        sums = [[b.phi(vec) for _ in range(g.kw)] for _ in range(channels)]
        for row in sums:
            for s in row:
                s.add_incoming(zero, pre)
        at = b.add(shift, p)
        xv = [b.load(kb.pointer(b, self.xpad, b.add(at, i64(j * g.dilation[1]))), typ=vec,
                     align=4) for j in range(g.kw)]
        # No product of a padded output-gradient position may count (0 * inf is NaN): with
        # 16 lanes the step's mask bits keep those lanes' sums (masked fused multiply-adds,
        # no extra vector operation); with 8 (AVX2, no mask registers) the input vectors
        # are zeroed there, one `and` per tap.
        valid = None
        if self.lanes == 16:
            ptr = b.gep(kb.pointer(b, self.gpad, i64(self.mask_bits)), [b.lshr(p, i64(4))],
                        inbounds=True, source_etype=I16)
            valid = b.bitcast(b.load(ptr, typ=I16), ir.VectorType(I1, 16))
        else:
            words = b.load(kb.pointer(b, self.gpad, b.add(p, i64(self.mask_words))),
                           typ=self.words, align=4)
            xv = [b.bitcast(b.and_(b.bitcast(x, self.words), words), vec) for x in xv]
        new = []
        for o in range(channels):
            gv = b.load(kb.pointer(b, self.gpad, b.add(p, i64(o * self.flat))), typ=vec,
                        align=4)
            row = [conv_few_channels.fma(b, gv, x, s) for x, s in zip(xv, sums[o])]
            if valid is not None:
                row = [b.select(valid, v, s) for v, s in zip(row, sums[o])]
            new.append(row)
        nxt = b.add(p, i64(self.lanes), name="p.next")
        nxt.flags.append("nuw")
        for row, row_new in zip(sums, new):
            for s, s_new in zip(row, row_new):
                s.add_incoming(s_new, b.block)
        p.add_incoming(nxt, b.block)
        end = b.append_basic_block("pos.end")
        b.cbranch(b.icmp_unsigned("<", nxt, i64(self.flat)), body, end)
        b.position_at_end(end)
        for o, row in enumerate(new):
            for j, s in enumerate(row):
                tap = b.add(b.mul(t, i64(g.kw)), i64(j))
                at = b.mul(b.add(b.mul(i64(o), i64(g.k)), tap), i64(self.lanes))
                ptr = kb.pointer(b, self.part, at)
                old = b.load(ptr, typ=vec, align=4)
                b.store(b.select(first, s, b.fadd(old, s)), ptr, align=4)
