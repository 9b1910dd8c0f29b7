"""conv_few_channels: the forward of convolutions with few input channels, register-tiled.

Called first by graphc.backends.cpu.conv's `conv2d` lowering; `conv2d` returns None when the
node does not take this path. It serves float32 convolutions with at most MAX_CHANNELS
input channels, stride 1 and groups 1, on rows that fill the vectors well enough
(MIN_LANE_USE): ResNet's CIFAR stem, LeNet-5's first layer, the benchmark's conv2d case
(64 x 3 x 32 x 32 by 64 x 3 x 3 x 3). There im2col + GEMM has
K = C*kH*kW = 27 rows: the GEMM is short and thin, im2col writes 27 copies of each image
and the output is written by the GEMM and then read again by the bias pass, while the
arithmetic is 226 MFLOP for 16.8 MB of output.

The kernel, per image (split over the cores by images, graphc.backends.cpu.conv_threads):
- the image's C planes are copied into zero-padded planes in the conv workspace (their
  border zeroed once per call), so no tap needs a bounds test;
- the output is cut into tiles of `channels` output channels x `rows` output rows x one
  segment of a row (one or two vectors of LANES floats; a row's last segment covers the
  rest in vectors of 8, 4, 2 and 1 floats, so no store is masked and none runs past the
  row). A tile's sums stay in vector registers through all C*kH*kW taps: per tap it loads
  the segment's input vectors once (unaligned loads from the padded plane, shifted by the
  tap) and multiplies them by each channel's weight, broadcast (fused multiply-adds);
- a bias (a fused `add` of a per-channel vector: the conv2d case) is added in the
  registers after the last tap, so every output element is stored once, as the sum
  conv + bias (the same rounding as the separate add); any other fused epilogue runs per
  image after its tiles, while the image is in cache (graphc.backends.cpu.conv_epilogue);
  for `conv2d_channel_sums` (graphc.backends.cpu.conv_channel_sums) each of the image's
  planes' shifted sums are added there too (winograd_transforms.add_plane_sums), for the
  batch norm after the convolution.

Where a row fills the lanes too poorly for these tiles and O is a multiple of 16 (LeNet-5's
second layer, 6 -> 16 channels on rows of 10), the tiles hold the output channels in the
lanes instead (graphc.backends.cpu.conv_channel_lanes), the rest of the kernel as here.

The weight gradient of the same convolutions: graphc.backends.cpu.conv_few_channels_grad.

Rounding: each output sums its taps in order (c, i, j) by fused multiply-adds, not in
numpy's order: judged by distance from a float64 run (docs/performance.md, "Rounding";
tests/test_cpu_conv_few_channels.py).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

from llvmlite import ir

from graphc.backends.cpu import conv_channel_lanes, conv_direct, small_gemm
from graphc.backends.cpu.conv_threads import temporaries, units_loop
from graphc.backends.cpu.image_kernels import (
    called_kernel,
    contiguous_in,
    contiguous_out,
    iadd,
    image_kernel,
    image_strides,
    imul,
)
from graphc.backends.cpu.values import F32, I64, i64, loop
from graphc.backends.cpu.winograd_transforms import add_plane_sums
from graphc.types import float32

__all__ = ["MAX_CHANNELS", "MAX_TAPS", "Tiling", "accumulators", "conv2d", "fma", "pieces",
           "splat",
           "tiling_for"]

# Which convolutions this path serves (measured against im2col + GEMM, 1-thread CPU time,
# in-process A/B, docs/performance.md "Convolution (CPU)", seventh session): up to 8 input
# channels 2-2.5x faster on rows of 16 floats or more (3->64 on 32x32, 8->32 on 16x16),
# even at 8x8; rows that fill less than half the vector lanes they take (10 or 14 wide:
# vectors of 8 + 2, 8 + 4 + 2) lost 1.3-1.6x, unless the alternative is the few-rows
# direct loops (LeNet's 1->6 on 12x12: 2x faster than those). 16 channels and more: Winograd
# or the GEMM (a tie at 16 -> 32 on 32x32).
MAX_CHANNELS = 8  # input channels
MAX_TAPS = 100  # C*kH*kW, the taps of a kernel row unrolled in the tile's loop
MIN_LANE_USE = 0.5  # a row's floats over the lanes of the vectors that hold them
SEGMENT_VECTORS = 2  # full vectors of a row segment


@dataclass(frozen=True)
class Tiling:
    """A tile: `channels` output channels x `rows` output rows x a row segment, whose
    pieces are vectors of the widths listed (`full`: a segment repeated `segments` times
    along the row, then `tail` for the rest of the row)."""

    lanes: int
    channels: int
    rows: int
    full: tuple[int, ...]
    segments: int
    tail: tuple[int, ...]


def pieces(width: int, lanes: int) -> list[int]:
    """`width` floats as vectors of `lanes`, then of halving widths (binary remainder)."""
    out = [lanes] * (width // lanes)
    rest, piece = width % lanes, lanes // 2
    while rest:
        if rest >= piece:
            out.append(piece)
            rest -= piece
        piece //= 2
    return out


def accumulators(lanes: int) -> int:
    """Vector registers a tile's sums may take: of 32 (AVX-512) or 16 (AVX2), the rest hold
    a tap's input vectors and a broadcast weight."""
    return 24 if lanes == 16 else 12


def tiling_for(g, dt) -> Tiling | None:
    """The tiling for a convolution `g` (conv_im2col.Geometry), or None where this path does not
    serve it (see the module docstring; also: sizes known per call, a host without AVX2)."""
    lanes = small_gemm.lanes()
    if not lanes or dt is not float32 or g.groups != 1 or g.c > MAX_CHANNELS or \
            g.stride != (1, 1) or g.k > MAX_TAPS or \
            not all(type(d) is int for d in (g.c, g.h, g.w, g.o, g.ho, g.wo)) or \
            min(g.o, g.ho, g.wo) < 1:
        return None
    row = pieces(g.wo, lanes)
    if g.wo < MIN_LANE_USE * len(row) * lanes and g.o >= conv_direct.FEW_ROWS:
        return None
    full_vectors = g.wo // lanes
    segments = full_vectors // SEGMENT_VECTORS
    full = (lanes,) * SEGMENT_VECTORS if segments else ()
    tail = tuple(row[segments * SEGMENT_VECTORS:])
    widest = max(len(full), len(tail))
    budget = accumulators(lanes)
    if g.o * widest >= budget:
        rows = 1
        channels = budget // widest
        tiles = -(-g.o // channels)
        channels = -(-g.o // tiles)  # even tiles: 64 channels as 6 x 11, not 5 x 12 + 4
    else:
        channels = g.o
        rows = min(g.ho, max(1, budget // (g.o * widest)))
    return Tiling(lanes, channels, rows, full, segments, tail)


def bias_operand(epilogue, fused, g) -> int | None:
    """The operand of a fused epilogue that is exactly `conv + bias` (bias: one value per
    output channel, float32; the sum written to a contiguous output), whose bias the tiles
    add in registers; else None."""
    if epilogue is None:
        return None
    body = epilogue
    leaves, outs, strides, _ = fused
    if len(body.instrs) != 2 or len(outs) != 1:
        return None
    op, args, _ = body.instrs[1]
    if op != "add" or body.n not in args or len(args) != 2 or body.outputs != (body.n + 1,):
        return None
    other = args[0] if args[1] == body.n else args[1]
    if other == body.n or other not in leaves or outs[0][2] is not float32 or \
            body.types[other].dtype is not float32:
        return None
    k = leaves[other]
    s, so = strides[k], strides[outs[0][1]]
    if s[0] != 0 or s[2] != 0 or s[3] != 0 or so[1:] != (g.p, g.wo, 1) or \
            (g.n != 1 and so[0] != g.o * g.p):
        return None
    return k


def conv2d(lw, node, g, x, w, out, epilogue, sums=None) -> bool | None:
    """out = conv2d(x, w) by register tiles (None: not this path's node); `epilogue` as in
    conv.conv2d (a fused body to apply; returns whether it did). `sums` (a Loc: float64
    [N, 3, O], conv2d_channel_sums' second output; no epilogue then): also each image's and
    channel's shifted sums of out, added after the image's tiles (add_plane_sums)."""
    dt = x.type.dtype
    t = tiling_for(g, dt)
    if t is None and g.c <= MAX_CHANNELS:  # rows too narrow for the lanes (any taps)
        t = conv_channel_lanes.channel_tiling(g, dt)
    if t is None:
        return None
    with contiguous_out(lw, out) as dst:
        return _build(lw, g, t, x, w, dst, epilogue, sums)


def _build(lw, g, t: Tiling | conv_channel_lanes.ChannelTiling, x, w, out, epilogue,
           sums=None) -> bool:
    dt = x.type.dtype
    xs = image_strides(x)
    w = contiguous_in(lw, w)
    (ph, pw) = g.padding
    hp, wp = g.h + 2 * ph, g.w + 2 * pw
    plane = g.c * hp * wp
    lanes_hold_channels = isinstance(t, conv_channel_lanes.ChannelTiling)
    shapes = [(plane,)] + (conv_channel_lanes.temporary_shapes(g) if lanes_hold_channels else [])
    split, temps = temporaries(lw, dt, shapes, g.n, g.n * g.o * g.k * g.p)
    kb, ids = image_kernel(lw, "conv2d_few_channels",
                           [x, w, out] + ([] if sums is None else [sums]) + temps)
    xi, wi, oi = ids[:3]
    si, pi = (None, ids[3]) if sums is None else ids[3:5]
    fused, extra, bias = None, None, None
    if epilogue is not None:
        from graphc.backends.cpu.conv_epilogue import epilogue_operands

        fused, extra = epilogue_operands(lw, kb, epilogue, out.type.shape, oi)
        bias = bias_operand(epilogue, fused, g)
        if bias is not None:  # the sum conv + bias goes straight into the node's output
            oi = fused[1][0][1]
    kb.recipe = ("conv2d", ("few_channels", g.key(), astuple(t), split is not None, extra,
                            bias is not None, sums is not None),
                 tuple((op.loc.type, op.loc.strides) for op in kb.operands))
    b = kb.begin()
    if b is None:  # built before for a node of the same geometry
        lw.calls.append(called_kernel(lw, kb.kernel, split))
        return fused is not None
    bias_stride = None if bias is None else fused[2][bias][1]
    if lanes_hold_channels:
        wt, image_sums = ids[ids.index(pi) + 1:ids.index(pi) + 3]
        tiles = conv_channel_lanes.ChannelTiles(kb, t, g, wi, pi, oi, wt, image_sums, bias,
                                                bias_stride, fma, splat)
        tiles.transpose_weights(b)
    else:
        tiles = _Tiles(kb, t, g, wi, pi, oi, bias, bias_stride)
    with loop(b, 0, plane, "zero") as q:
        kb.store(b, pi, q, ir.Constant(F32, 0.0))
    with units_loop(b, kb, split, ids[-1], g.n, "n") as n:
        with loop(b, 0, g.c, "pc") as c, loop(b, 0, g.h, "pr") as r:
            src = iadd(b, imul(b, n, xs[0]), imul(b, c, xs[1]), imul(b, r, xs[2]))
            dst = iadd(b, imul(b, c, hp * wp), imul(b, r, wp), ph * wp + pw)
            with loop(b, 0, g.w, "pq") as q:
                kb.store(b, pi, b.add(dst, q),
                         kb.load(b, xi, b.add(src, imul(b, q, xs[3]))))
        tiles.image(b, n)
        if si is not None:  # the image's output is still in cache: its planes' sums
            with loop(b, 0, g.o, "so") as o:
                at = imul(b, iadd(b, imul(b, n, g.o), o), g.ho * g.wo)
                add_plane_sums(b, kb, dt, oi, at, at, g.ho * g.wo, si, n, o, g.o, first=True)
        if fused is not None and bias is None:  # the image's output is still in cache
            from graphc.backends.cpu.conv_epilogue import apply_epilogue

            apply_epilogue(lw, kb, b, epilogue, fused, n)
    lw.calls.append(called_kernel(lw, kb.finish(b), split))
    return fused is not None


class _Tiles:
    """The code of one image's tiles (`image`): output-channel tiles, then row blocks, then
    row segments, each tile's sums in registers through every tap."""

    def __init__(self, kb, t: Tiling, g, wi, pi, oi, bias, bias_stride) -> None:
        self.kb, self.t, self.g = kb, t, g
        self.hp, self.wp = g.h + 2 * g.padding[0], g.w + 2 * g.padding[1]
        self.wi, self.pi, self.oi = wi, pi, oi
        self.bias, self.bias_stride = bias, bias_stride

    def image(self, b, n) -> None:
        t, g = self.t, self.g
        full, rest = divmod(g.o, t.channels)
        out_image = imul(b, n, g.o * g.p)
        if full:
            with loop(b, 0, full, "otile") as k:
                self.channel_tile(b, out_image, b.mul(k, i64(t.channels)), t.channels)
        if rest:
            self.channel_tile(b, out_image, i64(full * t.channels), rest)

    def channel_tile(self, b, out_image, o0, channels: int) -> None:
        t, g = self.t, self.g
        full, rest = divmod(g.ho, t.rows)
        if full:
            with loop(b, 0, full, "rblock") as k:
                self.row_block(b, out_image, o0, channels, b.mul(k, i64(t.rows)), t.rows)
        if rest:
            self.row_block(b, out_image, o0, channels, i64(full * t.rows), rest)

    def row_block(self, b, out_image, o0, channels: int, r0, rows: int) -> None:
        t = self.t
        width = sum(t.full)
        if t.segments == 1:
            self.tile(b, out_image, o0, channels, r0, rows, i64(0), t.full)
        elif t.segments:
            with loop(b, 0, t.segments, "seg") as s:
                self.tile(b, out_image, o0, channels, r0, rows, b.mul(s, i64(width)), t.full)
        if t.tail:
            self.tile(b, out_image, o0, channels, r0, rows, i64(t.segments * width), t.tail)

    def tile(self, b, out_image, o0, channels: int, r0, rows: int, col0, pieces) -> None:
        """out[o0 + o, r0 + r, col0 + pieces] for o < channels, r < rows: the sums over
        every tap, in registers, (+ bias), stored once."""
        kb, g = self.kb, self.g
        starts = [sum(pieces[:k]) for k in range(len(pieces))]
        vecs = [_vector(p) for p in pieces]
        origin = b.add(b.mul(r0, i64(self.wp)), col0)  # the tile's first input, tap (0, 0, 0)
        w_rows = [b.mul(b.add(o0, i64(o)), i64(g.k)) for o in range(channels)]
        sums = self.tap_sums(b, origin, w_rows, rows, starts, vecs)
        for o in range(channels):
            channel = b.add(o0, i64(o))
            if self.bias is not None:
                value = kb.load(b, self.bias, b.mul(channel, i64(self.bias_stride)))
            row0 = b.add(out_image, b.mul(channel, i64(g.p)))
            for r in range(rows):
                at = b.add(row0, b.add(b.mul(b.add(r0, i64(r)), i64(g.wo)), col0))
                for k, (start, vec) in enumerate(zip(starts, vecs)):
                    v = sums[o][r][k]
                    if self.bias is not None:
                        v = b.fadd(v, splat(b, value, vec))
                    ptr = kb.pointer(b, self.oi, b.add(at, i64(start)))
                    b.store(v, ptr, align=4)

    def tap_sums(self, b, origin, w_rows, rows: int, starts, vecs) -> list:
        """The tile's sums over every tap: a loop over the kernel rows of every input
        channel (t = c*kH + i), the kW taps of a kernel row unrolled; the sums are phi
        nodes through the loop: [channel][row][piece]."""
        kb, g, wp = self.kb, self.g, self.wp
        pre = b.block
        body = b.append_basic_block("taps.body")
        b.branch(body)
        b.position_at_end(body)
        t = b.phi(I64, name="t")
        t.add_incoming(i64(0), pre)
        sums = [[[b.phi(vec) for vec in vecs] for _ in range(rows)] for _ in w_rows]
        for per_row in sums:
            for row in per_row:
                for s, vec in zip(row, vecs):
                    s.add_incoming(_zeros(vec), pre)
        c, i = (b.udiv(t, i64(g.kh)), b.urem(t, i64(g.kh))) if g.kh > 1 else (t, i64(0))
        base = b.add(origin, b.add(b.mul(c, i64(self.hp * wp)),
                                   b.mul(i, i64(g.dilation[0] * wp))))
        new = [[list(row) for row in per_row] for per_row in sums]
        for j in range(g.kw):
            at = b.add(base, i64(j * g.dilation[1]))
            inputs = [[b.load(kb.pointer(b, self.pi, b.add(at, i64(r * wp + start))),
                              typ=vec, align=4) for start, vec in zip(starts, vecs)]
                      for r in range(rows)]
            tap = b.add(b.mul(t, i64(g.kw)), i64(j))
            for o, w_row in enumerate(w_rows):
                weight = kb.load(b, self.wi, b.add(w_row, tap))
                splats = {vec: splat(b, weight, vec) for vec in dict.fromkeys(vecs)}
                for r in range(rows):
                    for k, (vec, x) in enumerate(zip(vecs, inputs[r])):
                        new[o][r][k] = fma(b, splats[vec], x, new[o][r][k])
        nxt = b.add(t, i64(1), name="t.next")
        nxt.flags.append("nuw")
        for per_row, per_row_new in zip(sums, new):
            for row, row_new in zip(per_row, per_row_new):
                for s, s_new in zip(row, row_new):
                    s.add_incoming(s_new, b.block)
        t.add_incoming(nxt, b.block)
        end = b.append_basic_block("taps.end")
        b.cbranch(b.icmp_unsigned("<", nxt, i64(g.c * g.kh)), body, end)
        b.position_at_end(end)
        return new

    @staticmethod
    def _load(b, ptr, vec):
        return b.load(ptr, typ=vec, align=4)


def _vector(width: int):
    return F32 if width == 1 else ir.VectorType(F32, width)


def _zeros(vec):
    return ir.Constant(vec, 0.0 if vec is F32 else [0.0] * vec.count)


def splat(b, scalar, vec):
    """`scalar` in every lane of `vec` (the scalar itself where `vec` is F32)."""
    if vec is F32:
        return scalar
    one = b.insert_element(ir.Constant(vec, ir.Undefined), scalar, i64(0))
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), vec.count), [0] * vec.count)
    return b.shuffle_vector(one, ir.Constant(vec, ir.Undefined), zeros)


def fma(b, x, y, acc):
    """x*y + acc, one rounding (llvm.fma, vector or scalar)."""
    vec = x.type
    name = "llvm.fma.f32" if vec is F32 else f"llvm.fma.v{vec.count}f32"
    fn = b.module.globals.get(name)
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(vec, [vec, vec, vec]), name)
    return b.call(fn, [x, y, acc])
