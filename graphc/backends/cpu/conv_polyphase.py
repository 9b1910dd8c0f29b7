"""conv_polyphase: 3x3 stride-2 convolutions (padding 1) as Winograd on the input's phases.

A stride-2 correlation reads even and odd input rows and columns with different taps: with
pad 1, output row i reads input rows 2i - 1, 2i, 2i + 1, i.e. the even phase E[a] = x[2a]
at a = i (tap 1) and the odd phase O[a] = x[2a + 1] at a = i - 1 and i (taps 0 and 2). So
the convolution is the sum of four stride-1 correlations, one per phase pair (rows, columns),
with the sub-filters w[1, 1] (1x1), w[1, ::2] (1x2), w[::2, 1] (2x1) and w[::2, ::2] (2x2).
Each runs in Winograd's form for a 2x2 block of outputs: F(2, 1) (the identity, 2 points)
along an even axis, F(2, 2) (3 points: B^T = [[1, -1, 0], [0, 1, 0], [0, -1, 1]],
G = [[1, 0], [1, 1], [0, 1]], A^T = [[1, 1, 0], [0, 1, 1]], coefficients 0 and +-1 only:
additions, no scaling) along an odd one: 4 + 6 + 6 + 9 = 25 transform-domain
products per output block where im2col's GEMM spends 36, i.e. 25 GEMMs
`M[xi] (C_out x T) = U[xi] (C_out x C_in) @ V[xi] (C_in x T)` over the T output blocks of a
block of images (1.44x fewer multiplications than im2col's [C_out x 9 C_in] @ [9 C_in x P]).

The kernel, per block of images (BLOCK_TILES output blocks or more, as conv_winograd's):
- filter transform (once per call, or a forked kernel of its own before a split kernel):
  `U[slot][o][c]`, the 16 distinct matrices of the 25 positions (graphc.backends.cpu.
  conv_polyphase_filters: along an even axis both points read the same tap);
- input transform: every output block's 5x5 input patch (rows 4ty - 1 .. 4ty + 3) to its
  25 values `V[xi][c][t]`, 16 blocks a vector from input rows loaded as vectors where a
  plane's rows hold a whole fraction of 16 blocks (ResNet-18's three layers: the same
  bits, 0-0.9 ms a kernel faster), else through a zero-padded copy of each channel plane;
- the 25 GEMMs in 8 calls of winograd_gemm's generated functions, the positions that
  read one U matrix one after the other (conv_polyphase_filters.gemm_calls);
- output transform: each output block's 2x2 values, the four phases' A^T M A added in a
  fixed order; for `conv2d_channel_sums` (graphc.backends.cpu.conv_channel_sums) also each
  image's and channel's shifted sums of the plane it has just written
  (plane_sums.add_plane_sums), for the batch norm after the convolution: graphc.backends.cpu.
  conv_polyphase_outputs.
On more than one core the blocks are split over the threads (conv_threads, as
conv_winograd's: each share its own padded plane, V and M; U made once); a kernel whose
batch is one block (the 256 -> 512 forward at batch 16) forks its filter transform and its 25
GEMMs instead, and, where the input transform goes by rows (no padded plane), its input and
output transforms over the channels too, each a kernel of its own before and after
(conv_threads.channel_kernel, FORKED_TRANSFORMS; each channel by the same code: the same
bits on any thread count).

Rounding: the GEMMs sum over C_in in 25 short chains, which im2col sums in one of 9 C_in:
the forward measured 0.4-0.8x eager's distance from float64 (tests/test_cpu_conv_polyphase.
py checks 2x).

The forward is taken when: ENABLED, float32, a host where winograd_gemm serves, a 3x3
kernel, stride 2, padding 1, dilation 1, groups 1, even output height and width, at least
MIN_CHANNELS and at most winograd_gemm.MAX_K channels in and out, every block's GEMM a
whole number of vectors wide.

The input gradient (`conv2d_input_grad`) is the converse: gx's four phases are stride-1
correlations of gy (gx_E[a] = w1 gy[a], gx_O[a] = w2 gy[a] + w0 gy[a + 1] along each axis),
so a 2x2 block of each phase reads a 3x3 patch of gy, the same 25 positions, U stored
transposed, and each phase's A^T M A written to its own elements of gx (a 4x4 block a
tile). Taken where gx's planes are exactly twice gy's, with GRAD_MIN_OUT_CHANNELS output
channels and GRAD_MIN_TILES output blocks an image or more (rounding and speed, see there).
The weight gradient is graphc.backends.cpu.conv_polyphase_grad's, from this module's input
transform (`Pass`, `input_transform`: x's patches as the forward's, gy's 2x2 blocks through
A with `slots` placing Y's matrices).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from graphc.backends.cpu import conv_threads, kernels, winograd_gemm
from graphc.backends.cpu.conv_blocks import block_images, tile_blocks, walk_blocks
from graphc.backends.cpu.conv_polyphase_filters import (
    filter_kernel,
    filter_transform,
    gemm_calls,
    two_sided,
    u_slots,
)
from graphc.backends.cpu.conv_polyphase_outputs import LANES, concatenated, output_by_pass
from graphc.backends.cpu.conv_threads import plan_split
from graphc.backends.cpu.conv_workspace import workspace
from graphc.backends.cpu.image_kernels import (
    called_kernel,
    contiguous_in,
    contiguous_out,
    iadd,
    image_kernel,
    image_strides,
    imul,
)
from graphc.backends.cpu.scalars import const
from graphc.backends.cpu.values import F32, I32, i64, loop
from graphc.backends.cpu.winograd_transforms import pad_plane, spaced
from graphc.types import float32

__all__ = ["ENABLED", "FORKED_TRANSFORMS", "MIN_CHANNELS", "POSITIONS", "Pass", "applies",
           "by_rows_apply", "conv2d", "conv2d_input_grad", "input_transform", "phase_matrices"]

ENABLED = True  # False: im2col + GEMM (A/B runs)
MIN_CHANNELS = 16
# Output blocks a GEMM's columns hold, at least (as conv_winograd's). The Intel host took
# twice as many from 512 channels in and out together; on the Zen 5 host (1 MB L2) the
# 256 -> 512 layer's forward and input gradient ran 5.62 -> 5.28 and 5.13 -> 4.86 ms with
# 64 (two blocks at batch 32; thirteenth session).
BLOCK_TILES = 64
# The input transform LANES blocks a vector, rows loaded as vectors (_input_by_rows); False:
# the block loop through the padded plane (for A/B runs and tests)
ROW_VECTORS = True
# A batch of one block: the input transform (by rows) forked over V's channels and the
# output transform over the output's, each a kernel of its own around the GEMMs' (the same
# bits). False: both inside, on the calling thread (A/B runs: benchmarks.step_threads --ab
# polyphase_forks).
FORKED_TRANSFORMS = True
# The input gradient sums over the output channels: F(2, 2)'s transforms (gy[a] - gy[a + 1]
# and the like, cancelling in the sum) cost more against eager's short col2im sums when
# that sum is short. Distance from float64 over eager graphc's (gy and w normal): 16 and 48
# output channels 2.45x and 2.3x (past the 2x rule), 128: 1.20x, 256: 1.03x, 512: 0.93x.
GRAD_MIN_OUT_CHANNELS = 128
# ... and from this many output blocks an image: the 256 -> 512 layer's (4x4 gy planes, 4
# blocks; its U, 13 MB a call, is written and read where im2col reads w's 4.7 MB) lost to
# im2col on the Intel host's good BLAS (9.7-11.3 against 9.3-9.5 ms, eleventh session; 8.4
# against 8.3, twelfth) and wins on the Zen 5 host's OpenBLAS (5.1 against 9.8 ms,
# thirteenth); 64 -> 128 and 128 -> 256: 8.7 -> 7.2 and 8.2 -> 7.1 ms (Intel).
GRAD_MIN_TILES = 4

# Per axis, per phase: (input patch offsets, B^T, G's rows over the filter taps, A^T).
# Patch offset r is input row 4ty - 1 + r of output block ty; the even phase reads rows
# 4ty, 4ty + 2 (offsets 1, 3) with tap 1; the odd phase rows 4ty - 1, 4ty + 1, 4ty + 3
# (offsets 0, 2, 4) with taps 0 and 2.
EVEN = ((1, 3), ((1, 0), (0, 1)), ((1,), (1,)), (1,), ((1, 0), (0, 1)))
ODD = ((0, 2, 4), ((1, -1, 0), (0, 1, 0), (0, -1, 1)), ((1, 0), (1, 1), (0, 1)), (0, 2),
       ((1, 1, 0), (0, 1, 1)))
PHASES = ((EVEN, EVEN), (EVEN, ODD), (ODD, EVEN), (ODD, ODD))
POSITIONS = sum(len(r[1]) * len(c[1]) for r, c in PHASES)  # 4 + 6 + 6 + 9 = 25
# The input gradient's, per axis and phase of gx: gx_E[a] = w1 gy[a], gx_O[a] = w2 gy[a] +
# w0 gy[a + 1] (input row 2a + 1 is read by output rows a (tap 2) and a + 1 (tap 0)), so a
# 2x2 block of a phase at a = 2ty reads gy rows 2ty .. 2ty + 2 (patch offsets 0 .. 2).
GRAD_EVEN = ((0, 1), EVEN[1], EVEN[2], (1,), EVEN[4])
GRAD_ODD = ((0, 1, 2), ODD[1], ODD[2], (2, 0), ODD[4])
GRAD_PHASES = ((GRAD_EVEN, GRAD_EVEN), (GRAD_EVEN, GRAD_ODD), (GRAD_ODD, GRAD_EVEN),
               (GRAD_ODD, GRAD_ODD))


def phase_matrices(grad: bool = False):
    """[(rows, cols)] of the four phase pairs, each axis (patch offsets, B^T, G, filter
    taps, A^T): the numbers the forward's (`grad`: the input gradient's) transforms use."""
    return GRAD_PHASES if grad else PHASES


@dataclass(frozen=True)
class Pass:
    """What differs between the forward and the input gradient: the phase tables, V's
    channels (the GEMMs' k) and M's, the source and result planes, the output blocks
    (tiles_hw), the padded source plane and where the source lies in it, the step between
    consecutive blocks' patches in it and their side; `slots`: the matrix the input
    transform stores each of the phases' positions in (None: position xi in matrix xi)."""

    grad: bool
    phases: tuple
    k_ch: int
    m_ch: int
    in_hw: tuple
    out_hw: tuple
    tiles_hw: tuple
    padded: tuple
    pad: tuple
    step: int
    patch: int
    slots: tuple | None = None

    def slot(self, xi: int) -> int:
        """The transform-domain matrix the input transform writes position `xi` to."""
        return xi if self.slots is None else self.slots[xi]

    def gemms(self, ci: int, ld: int, u_step: int) -> list:
        """[(winograd_gemm's plan, first position, first U matrix)] for a block of `ld` output
        blocks: M[xi] (m_ch x ld) = U[slot of xi] (m_ch x k_ch: the forward's U[.][o][c],
        the input gradient's U[.][c][o]) @ V[xi] (k_ch x ld), the 25 products in the calls
        of conv_polyphase_filters.gemm_calls (a plan None: the shape is not served)."""
        a_row, a_col = (self.k_ch, 1) if self.grad else (ci, 1)
        v_step, m_step = spaced(self.k_ch * ld), spaced(self.m_ch * ld)
        return [(winograd_gemm.plan(self.m_ch, ld, self.k_ch, a_row, a_col, ld, ld,
                                    slot_step * u_step, step * v_step, step * m_step,
                                    products=products), first, slot)
                for first, slot, products, step, slot_step in
                gemm_calls(u_slots(self.phases)[0])]


def applies(g, dt) -> bool:
    return (ENABLED and dt is float32 and winograd_gemm.available()
            and all(type(d) is int for d in (g.c, g.o, g.h, g.w, g.ho, g.wo))
            and (g.kh, g.kw) == (3, 3) and g.stride == (2, 2) and g.padding == (1, 1)
            and g.dilation == (1, 1) and g.groups == 1 and min(g.c, g.o) >= MIN_CHANNELS
            and max(g.c, g.o) <= winograd_gemm.MAX_K and g.ho % 2 == 0 and g.wo % 2 == 0)


def conv2d(lw, node, g, x, w, out, sums=None) -> bool:
    """out = conv2d(x, w) by polyphase Winograd (see the module docstring), or False. `sums`
    (a Loc: float64 [N, 3, O], conv2d_channel_sums' second output): also each image's and
    channel's shifted sums of out, added by the output transform (add_plane_sums)."""
    if not applies(g, x.type.dtype):
        return False
    th, tw = g.ho // 2, g.wo // 2
    p = Pass(False, PHASES, g.c, g.o, (g.h, g.w), (g.ho, g.wo), (th, tw),
              (4 * th + 1, 4 * tw + 1), (1, 1), 4, 5)
    return _polyphase(lw, node, g, x, w, out, p, sums)


def conv2d_input_grad(lw, node, g) -> bool:
    """gx of a stride-2 convolution by polyphase Winograd: each of gx's four phases is a
    stride-1 correlation of gy (3x3 patches at stride 2 per 2x2 block of the phase), or
    False. Taken where gx's planes are exactly twice gy's (even input sizes)."""
    gy, w = node.inputs
    if not applies(g, gy.type.dtype) or (g.h, g.w) != (2 * g.ho, 2 * g.wo) or \
            g.o < GRAD_MIN_OUT_CHANNELS or (g.ho // 2) * (g.wo // 2) < GRAD_MIN_TILES:
        return False
    th, tw = g.ho // 2, g.wo // 2
    p = Pass(True, GRAD_PHASES, g.o, g.c, (g.ho, g.wo), (g.h, g.w), (th, tw),
              (g.ho + 1, g.wo + 1), (0, 0), 2, 3)
    return _polyphase(lw, node, g, lw.locs[gy], lw.locs[w], lw.locs[node.outputs[0]], p)


def _polyphase(lw, node, g, src, w, out, p: Pass, sums=None) -> bool:
    dt = src.type.dtype
    ci, co = g.c, g.o
    th, tw = p.tiles_hw
    tiles = th * tw
    nb, counts = tile_blocks(g.n, tiles, BLOCK_TILES)
    t_max = nb * tiles
    u_step = spaced(co * ci)
    if any(plan is None for n in counts for plan, _, _ in p.gemms(ci, n * tiles, u_step)):
        return False
    ss = image_strides(src)
    hp, wp = p.padded
    w = contiguous_in(lw, w)
    with contiguous_out(lw, out) as dst:
        shapes = [(hp * wp,), (POSITIONS, spaced(p.k_ch * t_max)),
                  (POSITIONS, spaced(p.m_ch * t_max))]
        units = -(-g.n // nb) if type(g.n) is int else None
        macs = g.n * co * ci * 9 * g.ho * g.wo if units else None
        u_shape = (u_slots(p.phases)[1], u_step)  # the distinct matrices of U
        split = plan_split(lw, dt, shapes, units, macs, shared=[u_shape])
        temps = workspace(lw, dt, u_shape, *shapes) if split is None else \
            split.shared + split.locs
        # the sums (if any) after the temporaries, the split's control last (ids[-1])
        sums_i = None if sums is None else 3 + len(temps)
        locs = [src, w, dst] + temps + ([] if sums is None else [sums]) + \
            ([] if split is None else [split.control])
        # not split over images (one block: 256 -> 512 channels at 8x8, batch 16): the
        # filter transform in a forked kernel of its own first, the 25 GEMMs forked
        alone = split is None and kernels.forks(lw.openmp, POSITIONS * co * ci)
        # ... and, a batch of one block, its input and output transforms over the channels
        # (more than one thread only: on one they stay inside, no V or M through memory)
        by_channels = alone and FORKED_TRANSFORMS and lw.most_threads() > 1 and \
            type(g.n) is int and nb >= g.n and by_rows_apply(p, ss, t_max)
        recipe = (g.key(), p.grad, split is not None, alone, by_channels) + \
            (() if sums is None else ("sums",))
        kb, ids = image_kernel(lw, "conv2d_polyphase" + ("_input_grad" if p.grad else ""),
                               locs, recipe)
        si, wi, oi, ui, pi, vi, mi = ids[:7]
        prelude = None if split is None and not alone else \
            filter_kernel(lw, locs, recipe, g, u_step, p.phases, p.grad)
        if alone:
            lw.calls.append(prelude)
        transforms = _transform_kernels(lw, locs, recipe, p, (g.n, t_max), ss, sums_i) \
            if by_channels else (None, None)
        if by_channels:
            lw.calls.append(transforms[0])
        b = kb.begin()
        if b is None:  # built before for a node of the same geometry
            lw.calls.append(called_kernel(lw, kb.kernel, split, prelude=prelude))
            if by_channels:
                lw.calls.append(transforms[1])
            return True
        with loop(b, 0, hp * wp, "zero") as q:
            kb.store(b, pi, q, const(dt, 0.0))
        if prelude is None:
            filter_transform(b, kb, dt, wi, ui, u_step, g, (i64(0), i64(co)), p.phases,
                             p.grad)

        def block(b, n0, count):
            ld = count * tiles
            v_step, m_step = spaced(p.k_ch * ld), spaced(p.m_ch * ld)
            if not by_channels:  # else in a kernel of its own, before
                input_transform(b, kb, dt, (n0, count), si, ss, p, pi, vi, v_step, ld)
            forked = split is None and kernels.forks(
                lw.openmp, kernels.gemm_work(POSITIONS, p.m_ch, ld, p.k_ch))
            for plan, first, slot in p.gemms(ci, ld, u_step):
                fn = winograd_gemm.function(lw.module, plan, forked and plan.products > 1)
                at = (slot * u_step, first * v_step, first * m_step)
                b.call(fn, [kb.pointer(b, k, i64(a)) for k, a in zip((ui, vi, mi), at)] +
                       [const(dt, 0.0)])
            if not by_channels:  # else in a kernel of its own, after
                output_by_pass(b, kb, dt, (n0, count), mi, m_step, p, oi, ld, sums_i)

        walk_blocks(b, kb, g, nb, split, ids[-1], block)
        lw.calls.append(called_kernel(lw, kb.finish(b), split, prelude=prelude))
        if by_channels:
            lw.calls.append(transforms[1])
    return True


def _transform_kernels(lw, locs, recipe, p: Pass, whole, ss, sums_i) -> tuple:
    """(input, output) transforms of a one-block batch (`whole`: its images and tiles) as
    kernels of their own on `locs` (conv_threads.channel_kernel), forked over V's channels
    (p.k_ch) and the output's (p.m_ch)."""
    dt = locs[0].type.dtype
    n, ld = whole
    v_step, m_step = spaced(p.k_ch * ld), spaced(p.m_ch * ld)
    name = "conv2d_polyphase" + ("_input_grad" if p.grad else "")

    def input_share(b, kb, ids, channels):
        input_transform(b, kb, dt, (0, n), ids[0], ss, p, ids[4], ids[5], v_step, ld,
                        channels)

    def output_share(b, kb, ids, channels):
        output_by_pass(b, kb, dt, (0, n), ids[6], m_step, p, ids[2], ld, sums_i, channels)

    work = POSITIONS * ld
    return (conv_threads.channel_kernel(lw, name + "_in", locs, recipe, p.k_ch,
                                        work * p.k_ch, input_share),
            conv_threads.channel_kernel(lw, name + "_out", locs, recipe, p.m_ch,
                                        work * p.m_ch, output_share))


def by_rows_apply(p: Pass, ss, ld: int) -> bool:
    """Whether input_transform goes by rows (`_input_by_rows`, no padded plane) for a block
    of `ld` output blocks: ROW_VECTORS, rows of a whole fraction of LANES blocks that lie
    side by side, whole vectors of blocks."""
    tw = p.tiles_hw[1]
    return ROW_VECTORS and LANES % tw == 0 and p.in_hw[1] == p.step * tw and ss[3] == 1 \
        and ld % LANES == 0


def input_transform(b, kb, dt, images, si, ss, p: Pass, pi, vi, v_step, ld,
                    channels=None) -> None:
    """V[xi][c][t] of every output block t of the images (n0, count): each channel plane
    into the padded plane, then each block's patch through the phases' B^T; planes whose
    rows hold a whole fraction of LANES blocks by `_input_by_rows`. `channels`: only c in
    [lo, hi) (a forked kernel's share; by rows only: the padded plane is one for all)."""
    n0, count = images
    th, tw = p.tiles_hw
    if by_rows_apply(p, ss, ld):
        return _input_by_rows(b, kb, dt, images, si, ss, p, vi, v_step, ld, channels)
    assert channels is None, "input_transform: a channel range needs the rows' form"
    wp = p.padded[1]
    reach = [min(p.in_hw[a], (p.tiles_hw[a] - 1) * p.step + p.patch - p.pad[a])
             for a in range(2)]  # the source rows and columns any patch reads
    with block_images(b, count) as j, loop(b, 0, p.k_ch, "ci") as c:
        pad_plane(b, kb, si, iadd(b, imul(b, iadd(b, n0, j), ss[0]), imul(b, c, ss[1])),
                  ss[2:], (p.in_hw[0], reach[1]), pi, wp, p.pad, (0, reach[0]))
        row_v = iadd(b, imul(b, c, ld), imul(b, j, th * tw))
        with loop(b, 0, th, "ty") as ty, loop(b, 0, tw, "tx") as tx:
            at = iadd(b, imul(b, ty, p.step * wp), imul(b, tx, p.step))
            d = [[kb.load(b, pi, iadd(b, at, r * wp + s)) for s in range(p.patch)]
                 for r in range(p.patch)]
            t = iadd(b, row_v, imul(b, ty, tw), tx)
            xi = 0
            for rows_p, cols_p in p.phases:
                sub = [[d[r][s] for s in cols_p[0]] for r in rows_p[0]]
                for row in two_sided(b, dt, rows_p[1], sub, cols_p[1]):
                    for value in row:
                        kb.store(b, vi, iadd(b, t, p.slot(xi) * v_step), value)
                        xi += 1


def _input_by_rows(b, kb, dt, images, si, ss, p: Pass, vi, v_step, ld,
                   channels=None) -> None:
    """input_transform for LANES blocks at once, with no padded plane: the blocks of
    LANES // tw tile rows (of one image or several), each tile row's `patch` input rows
    loaded as vectors (a row in the padding: a zero vector), each patch element d[r][s] of
    the LANES blocks one shuffle of the rows r and a zero vector, the phases' B^T on
    vectors, each position's LANES values one store along V's row. The same additions in
    the same order as the block loop (bit for bit)."""
    n0, _ = images
    th, tw = p.tiles_hw
    width = p.in_hw[1]
    per_vector = LANES // tw  # tile rows a vector holds
    source = per_vector * width
    row_vec = ir.VectorType(F32, width)
    zero_row = ir.Constant(row_vec, [0.0] * width)
    zero = ir.Constant(ir.VectorType(F32, source), [0.0] * source)

    def tap(s):  # which element of the rows' concatenation (or `source`: zero) a lane reads
        mask = []
        for lane in range(LANES):
            slot, tx = divmod(lane, tw)
            col = p.step * tx - p.pad[1] + s
            mask.append(slot * width + col if 0 <= col < width else source)
        return ir.Constant(ir.VectorType(I32, LANES), mask)

    masks = [tap(s) for s in range(p.patch)]
    with loop(b, *(channels or (0, p.k_ch)), "ci") as c, \
            loop(b, 0, ld // LANES, "tg") as group:
        slots = []  # per tile row of the vector: its `patch` input rows
        for i in range(per_vector):
            tile_row = iadd(b, imul(b, group, per_vector), i)  # over the block's images
            image = iadd(b, n0, b.udiv(tile_row, i64(th)))
            ty = b.urem(tile_row, i64(th))
            plane = iadd(b, imul(b, image, ss[0]), imul(b, c, ss[1]))
            rows = []
            for r in range(p.patch):
                row = iadd(b, imul(b, ty, p.step), r - p.pad[0])
                inside = b.and_(b.icmp_signed(">=", row, i64(0)),
                                b.icmp_signed("<", row, i64(p.in_hw[0])))
                safe = b.select(inside, row, i64(0))  # never read outside the tensor
                loaded = b.load(kb.pointer(b, si, iadd(b, plane, imul(b, safe, ss[2]))),
                                typ=row_vec, align=4)
                rows.append(b.select(inside, loaded, zero_row))
            slots.append(rows)
        d = [[b.shuffle_vector(concatenated(b, [slots[i][r] for i in range(per_vector)]),
                               zero, masks[s]) for s in range(p.patch)]
             for r in range(p.patch)]
        at = iadd(b, imul(b, c, ld), imul(b, group, LANES))
        xi = 0
        for rows_p, cols_p in p.phases:
            sub = [[d[r][s] for s in cols_p[0]] for r in rows_p[0]]
            for row in two_sided(b, dt, rows_p[1], sub, cols_p[1]):
                for value in row:
                    b.store(value, kb.pointer(b, vi, iadd(b, at, p.slot(xi) * v_step)), align=4)
                    xi += 1
