"""conv_channel_lanes: conv_few_channels' tiles with the output channels in the vector lanes.

conv_few_channels puts a row segment of outputs in each vector; rows narrower than the lanes
leave most of them idle (LeNet-5's second convolution, 6 -> 16 channels 5x5 on 14x14: rows
of 10 outputs, vectors of 8 + 2 of 16 lanes), and im2col + GEMM, which it fell back to, ran
at ~85 GFLOP/s there (358 us a step). Where the output channels are a multiple of the lanes,
a tile here is `rows` x `columns` output positions, each holding its O channels in O/lanes
vectors; per tap it loads the tap's weights for the O channels once (a row of the weights
transposed to [C*kH*kW, O], made once per call) and multiplies them by each position's
input, broadcast (fused multiply-adds). The sums stay in registers through every tap, then
go to an image buffer [H_out*W_out, O], which is transposed into the image's NCHW planes
(plus the bias, where conv_few_channels found one: the same single rounding).

Called by conv_few_channels' `_build` (the padded planes, the image loop, the epilogue are
its); the sums run in the same tap order (c, i, j) by fused multiply-adds.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from graphc.backends.cpu import small_gemm
from graphc.backends.cpu.values import F32, I64, i64, loop
from graphc.types import float32

__all__ = ["ENABLED", "ChannelTiles", "ChannelTiling", "channel_tiling", "temporary_shapes"]

ENABLED = True  # off: im2col + GEMM for these (benchmarks.lenet_kernels' "before")
ACCUMULATORS = 24  # of AVX-512's 32 vector registers; the rest: a tap's weights, a broadcast


@dataclass(frozen=True)
class ChannelTiling:
    """A tile: `rows` x `columns` output positions x all O channels (`vectors` per position)."""

    lanes: int
    vectors: int
    rows: int
    columns: int


def channel_tiling(g, dt) -> ChannelTiling | None:
    """The tiling for a convolution `g` that conv_few_channels' row tiles do not serve, or
    None: float32, AVX-512, O a multiple of 16 up to 64, stride 1, groups 1."""
    lanes = small_gemm.lanes()
    if not ENABLED or lanes != 16 or dt is not float32 or g.groups != 1 or g.stride != (1, 1) or \
            g.o % lanes or g.o > 4 * lanes or \
            not all(type(d) is int for d in (g.c, g.h, g.w, g.o, g.ho, g.wo)) or \
            min(g.ho, g.wo) < 1:
        return None
    vectors = g.o // lanes
    columns = min(g.wo, ACCUMULATORS // vectors)
    rows = max(1, min(g.ho, ACCUMULATORS // (vectors * columns)))
    return ChannelTiling(lanes, vectors, rows, columns)


def temporary_shapes(g) -> list[tuple[int]]:
    """The workspace this path needs besides the padded planes: the transposed weights and
    one image's sums, position-major."""
    return [(g.k * g.o,), (g.p * g.o,)]


class ChannelTiles:
    """The code of one image (`image`) and of the weights' transpose (`transpose_weights`)."""

    def __init__(self, kb, t: ChannelTiling, g, wi, pi, oi, wt, sums, bias, bias_stride,
                 fma, splat) -> None:
        self.kb, self.t, self.g = kb, t, g
        self.hp, self.wp = g.h + 2 * g.padding[0], g.w + 2 * g.padding[1]
        self.wi, self.pi, self.oi, self.wt, self.sums = wi, pi, oi, wt, sums
        self.bias, self.bias_stride = bias, bias_stride
        self.fma, self.splat = fma, splat
        self.vec = ir.VectorType(F32, t.lanes)

    def transpose_weights(self, b) -> None:
        """wt[tap * O + o] = w[o * K + tap], once per call."""
        kb, g = self.kb, self.g
        with loop(b, 0, g.o, "wo") as o, loop(b, 0, g.k, "wk") as k:
            kb.store(b, self.wt, b.add(b.mul(k, i64(g.o)), o),
                     kb.load(b, self.wi, b.add(b.mul(o, i64(g.k)), k)))

    def image(self, b, n) -> None:
        t, g = self.t, self.g
        full, rest = divmod(g.ho, t.rows)
        cuts = [(q, min(t.columns, g.wo - q)) for q in range(0, g.wo, t.columns)]
        for q0, columns in cuts:
            if full:
                with loop(b, 0, full, "rblock") as k:
                    self.tile(b, b.mul(k, i64(t.rows)), t.rows, q0, columns)
            if rest:
                self.tile(b, i64(full * t.rows), rest, q0, columns)
        self.planes(b, n)

    def tile(self, b, r0, rows: int, q0: int, columns: int) -> None:
        """sums[(r0 + r) * W_out + q0 + q] for r < rows, q < columns: every tap in registers."""
        kb, g, t, wp = self.kb, self.g, self.t, self.wp
        pre = b.block
        body = b.append_basic_block("ctaps.body")
        b.branch(body)
        b.position_at_end(body)
        tap_row = b.phi(I64, name="t")
        tap_row.add_incoming(i64(0), pre)
        zeros = ir.Constant(self.vec, [0.0] * t.lanes)
        accs = [[[b.phi(self.vec) for _ in range(t.vectors)] for _ in range(columns)]
                for _ in range(rows)]
        for per_row in accs:
            for per_pos in per_row:
                for acc in per_pos:
                    acc.add_incoming(zeros, pre)
        c, i = (b.udiv(tap_row, i64(g.kh)), b.urem(tap_row, i64(g.kh))) if g.kh > 1 else \
            (tap_row, i64(0))
        origin = b.add(b.add(b.mul(c, i64(self.hp * wp)), b.mul(i, i64(g.dilation[0] * wp))),
                       b.add(b.mul(r0, i64(wp)), i64(q0)))
        new = [[list(per_pos) for per_pos in per_row] for per_row in accs]
        for j in range(g.kw):
            tap = b.add(b.mul(tap_row, i64(g.kw)), i64(j))
            weights = [b.load(kb.pointer(b, self.wt, b.add(b.mul(tap, i64(g.o)),
                                                           i64(v * t.lanes))),
                              typ=self.vec, align=4) for v in range(t.vectors)]
            at = b.add(origin, i64(j * g.dilation[1]))
            for r in range(rows):
                for q in range(columns):
                    x = self.splat(b, kb.load(b, self.pi, b.add(at, i64(r * wp + q))), self.vec)
                    for v in range(t.vectors):
                        new[r][q][v] = self.fma(b, weights[v], x, new[r][q][v])
        nxt = b.add(tap_row, i64(1), name="t.next")
        nxt.flags.append("nuw")
        for per_row, per_row_new in zip(accs, new):
            for per_pos, per_pos_new in zip(per_row, per_row_new):
                for acc, acc_new in zip(per_pos, per_pos_new):
                    acc.add_incoming(acc_new, b.block)
        tap_row.add_incoming(nxt, b.block)
        end = b.append_basic_block("ctaps.end")
        b.cbranch(b.icmp_unsigned("<", nxt, i64(g.c * g.kh)), body, end)
        b.position_at_end(end)
        for r in range(rows):
            for q in range(columns):
                position = b.add(b.mul(b.add(r0, i64(r)), i64(g.wo)), i64(q0 + q))
                for v in range(t.vectors):
                    at = b.add(b.mul(position, i64(g.o)), i64(v * t.lanes))
                    b.store(new[r][q][v], kb.pointer(b, self.sums, at), align=4)

    def planes(self, b, n) -> None:
        """out[n, o, p] = sums[p * O + o] (+ bias[o])."""
        kb, g = self.kb, self.g
        with loop(b, 0, g.o, "to") as o:
            row = b.mul(b.add(b.mul(n, i64(g.o)), o), i64(g.p))
            bias = None if self.bias is None else \
                kb.load(b, self.bias, b.mul(o, i64(self.bias_stride)))
            with loop(b, 0, g.p, "tp") as p:
                v = kb.load(b, self.sums, b.add(b.mul(p, i64(g.o)), o))
                kb.store(b, self.oi, b.add(row, p), v if bias is None else b.fadd(v, bias))
