"""conv_polyphase_grad: the weight gradient of 3x3 stride-2 convolutions by polyphase Winograd.

graphc.backends.cpu.conv_polyphase writes a stride-2 correlation (padding 1) as the sum of
four stride-1 correlations, one per phase pair of x (even and odd rows and columns), each in
Winograd's form for a 2x2 block of outputs: per axis F(2, 1) (the identity, 2 points) for
the even phase, F(2, 2) (3 points) for the odd one, 25 transform-domain positions in all.
Its weight gradient is the transpose of that forward, position by position:

    dU[xi] (C_out x C_in) = sum over output blocks t of Y[xi][o][t] * V[xi][c][t]
    gw[o, c, taps of the phase] = G_r^T dU_phase[o, c] G_c

- V: the forward's input transform of x (conv_polyphase.input_transform: 5x5 patches, 16
  blocks a vector from input rows loaded as vectors), then transposed per position in
  16 x 16 squares in vector registers to tile-major `Vt[xi][t][c]`, so that the GEMMs read
  it as their contiguous operand (V has C_in rows, half of Y's C_out: the smaller one is
  the one moved);
- Y: gy's 2x2 blocks through A (per axis: the even phase's identity, [g0, g0 + g1, g1] for
  the odd one; additions only), by the same input transform with gy as the source and
  these matrices as its phases (Y_PHASES), `Y[xi][o][t]`;
- the 25 products `dU[xi] (+)= Y[xi] (C_out x T) @ Vt[xi] (T x C_in)` in one call of
  winograd_gemm's generated function per block of images, which sums each block's tiles in
  chains of winograd_gemm.K_BLOCK (64) and adds each chain to dU in order (beta 0 for the
  kernel's or share's first block);
- the output transform G^T dU G per phase, in a kernel of its own: per axis tap 1 = dU0 +
  dU1 (even), taps 0 and 2 = dU0 + dU1 and dU1 + dU2 (odd), every element of gw written
  once.
im2col's GEMM for the same gradient multiplies 36 values per 2x2 outputs and input channel;
these products 25. ResNet-18's three stride-2 layers, batch 32, one thread: see
docs/performance.md, "stride-2 weight gradients, twelfth session".

On more than one core a kernel of several blocks is split over its blocks (conv_threads:
each share sums its images into its own dU, then a reduce kernel adds the shares' dU in
share order over output-channel rows and writes gw); a kernel of one block (256 -> 512
channels at 4x4, batch 32) forks its 25 products and its output transform instead.

Rounding: each element of dU sums its tiles in chains of 64, the chains added in order; the
odd axes' transforms subtract (B^T's d0 - d1) and the output transform adds the positions
back (dU0 + dU1 cancels the gy0 * d1 terms), so the distance from float64 is checked
against eager's (tests/test_cpu_conv_polyphase_grad.py: within 2x, at 1 and 2 threads).

Taken when: ENABLED, float32, conv_polyphase.applies (3x3, stride 2, padding 1, groups 1,
even output planes, a host where winograd_gemm serves, MIN_CHANNELS to MAX_K channels), and
the input channels a whole number of vectors (the GEMMs' n).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from graphc.backends.cpu import conv_threads, kernels, winograd_filters, winograd_gemm
from graphc.backends.cpu.conv_blocks import tile_blocks, walk_blocks
from graphc.backends.cpu.conv_polyphase import (
    EVEN,
    ODD,
    PHASES,
    POSITIONS,
    Pass,
    applies,
    by_rows_apply,
    input_transform,
)
from graphc.backends.cpu.conv_polyphase_filters import two_sided
from graphc.backends.cpu.conv_threads import plan_split
from graphc.backends.cpu.conv_workspace import workspace
from graphc.backends.cpu.image_kernels import (
    called_kernel,
    contiguous_out,
    iadd,
    image_kernel,
    image_strides,
    imul,
)
from graphc.backends.cpu.scalars import const
from graphc.backends.cpu.values import F32, as_i64, i64, loop, square_transposed
from graphc.backends.cpu.winograd_filters import FILTER_LANES, store_filter_taps
from graphc.backends.cpu.winograd_transforms import spaced
from graphc.types import float64

__all__ = ["BLOCK_TILES", "ENABLED", "Y_PHASES", "conv2d_weight_grad"]

ENABLED = True  # False: im2col + GEMM (A/B runs)
# A batch of one block on more than one thread: x's and gy's input transforms (and Vt's
# transpose) forked over their channels, kernels of their own before the forked GEMMs (the
# same bits); inside, on the calling thread, they were ~0.9 of the 256 -> 512 layer's 4.1 ms
# (2 threads: 2.5 ms, fourteenth session). False: inside (A/B runs).
FORKED_TRANSFORMS = True
# Output blocks a block's GEMMs sum (k), at least: as the forward's, twice as many from
# WIDE_CHANNELS channels in and out together (the 256 -> 512 layer: its 32 images of 4x4
# outputs one block of 128, dU (13 MB) written once)
BLOCK_TILES = 64
WIDE_CHANNELS = 512
SQUARE = 16  # V's transpose: squares of 16 x 16 float32 (one AVX-512 register a row)


def _y_axis(phase):
    """gy's transform along one axis for a phase of the forward: gy's two rows (patch
    offsets 0 and 1 of a 2x2 block) through A = (A^T)^T."""
    return ((0, 1), tuple(zip(*phase[4])), phase[2], phase[3], phase[4])


def _combination(axis, i: int) -> int:
    """Which of gy's row (column) combinations position i of a phase's axis reads: 0 for g0,
    1 for g0 + g1, 2 for g1 (the even phase's A is the identity: g0, g1; the odd one's g0,
    g0 + g1, g1)."""
    return i if len(axis[1]) == 3 else (0, 2)[i]


# Y's 9 distinct values of a 2x2 block of gy: the odd phase's A along both axes, Y[3 kr + kc]
# with kr, kc as `_combination`; each of the 25 positions (PHASES' order) reads one of them
Y_PHASES = ((_y_axis(ODD), _y_axis(ODD)),)
PAIRED = tuple(3 * _combination(rows, i) + _combination(cols, j) for rows, cols in PHASES
               for i in range(len(rows[1])) for j in range(len(cols[1])))
# Y's matrices stored by how many positions read them (4: g0 or g1 along both axes, 2: a sum
# along one, 1: along both), so each width's products are equally spaced for one GEMM call
Y_ORDER = tuple(sorted(range(9), key=lambda k: (-PAIRED.count(k), k)))
WIDTHS = tuple(PAIRED.count(k) for k in Y_ORDER)  # (4, 4, 4, 4, 2, 2, 2, 2, 1)
assert _y_axis(ODD)[1] == ((1, 0), (1, 1), (0, 1)) and _y_axis(EVEN)[1] == ((1, 0), (0, 1))
assert len(PAIRED) == POSITIONS and WIDTHS == (4, 4, 4, 4, 2, 2, 2, 2, 1)


@dataclass(frozen=True)
class _Layout:
    """Where each position's matrices lie for a block of `ld` output blocks: the positions
    that read one Y matrix side by side, `Vt` (ld x width * ci) and `dU` (co x width * ci),
    so that they are one product `dU_k (+)= Y_k (co x ld) @ Vt_k` (1.44x fewer stores of Y
    than one matrix a position: 9 against 25)."""

    ci: int
    co: int
    ld: int

    def groups(self):
        """(width, first Y slot, products) of each GEMM call."""
        return [(w, Y_ORDER.index(k), WIDTHS.count(w)) for w, k in
                ((4, Y_ORDER[0]), (2, Y_ORDER[4]), (1, Y_ORDER[8]))]

    def starts(self, rows: int) -> list[int]:
        """Each Y slot's matrix start (rows x its width * ci) in a region of such matrices
        (Vt: rows ld; dU: rows co), then the region's size."""
        starts = [0]
        for w in WIDTHS:
            starts.append(starts[-1] + spaced(rows * w * self.ci))
        return starts

    def vt(self, xi: int) -> tuple[int, int]:
        """(start, row length) of position xi's columns in Vt."""
        return self._place(xi, self.starts(self.ld))

    def du(self, xi: int) -> tuple[int, int]:
        """(start, row length) of position xi's columns in dU."""
        return self._place(xi, self.starts(self.co))

    def _place(self, xi: int, starts) -> tuple[int, int]:
        slot = Y_ORDER.index(PAIRED[xi])
        beside = PAIRED[:xi].count(PAIRED[xi])  # positions before it reading the same Y
        return starts[slot] + beside * self.ci, WIDTHS[slot] * self.ci


def _gemm(co: int, ci: int, ld: int, width: int, products: int):
    """winograd_gemm's plan for one width's products: dU_k (co x width * ci) (+)= Y_k (co x
    ld, rows ld apart) @ Vt_k (ld x width * ci)."""
    n = width * ci
    return winograd_gemm.plan(co, n, ld, ld, 1, n, n, spaced(co * ld), spaced(ld * n),
                              spaced(co * n), accumulates=True, max_c=co * n,
                              products=products)


def conv2d_weight_grad(lw, node, g) -> bool:
    """gw of a 3x3 stride-2 convolution by polyphase Winograd (see the module docstring), or
    False."""
    gy, x = node.inputs
    dt = x.type.dtype
    if not (ENABLED and applies(g, dt)) or g.c % SQUARE:
        return False
    ci, co = g.c, g.o
    th, tw = g.ho // 2, g.wo // 2
    tiles = th * tw
    nb, counts = tile_blocks(g.n, tiles, BLOCK_TILES * (2 if ci + co >= WIDE_CHANNELS else 1))
    t_max = nb * tiles
    full = _Layout(ci, co, t_max)
    if any(_gemm(co, ci, n * tiles, w, k) is None for n in counts for w, _, k in
           full.groups()):
        return False
    xp = Pass(False, PHASES, ci, co, (g.h, g.w), (g.ho, g.wo), (th, tw),
              (4 * th + 1, 4 * tw + 1), (1, 1), 4, 5)
    yp = Pass(False, Y_PHASES, co, ci, (g.ho, g.wo), (g.ho, g.wo), (th, tw),
              (g.ho, g.wo), (0, 0), 2, 2, tuple(Y_ORDER.index(k) for k in range(9)))
    xl, gl = lw.locs[x], lw.locs[gy]
    xs, gs = image_strides(xl), image_strides(gl)
    with contiguous_out(lw, lw.locs[node.outputs[0]]) as dst:
        # dU first (a share's own, summed by the reduce kernel), the padded planes of x and
        # gy (the block loop's, where the transform is not by rows), V, Vt, Y
        shapes = [(full.starts(co)[-1],), (xp.padded[0] * xp.padded[1],), (g.ho * g.wo,),
                  (POSITIONS, spaced(ci * t_max)), (full.starts(t_max)[-1],),
                  (9, spaced(co * t_max))]
        units = -(-g.n // nb) if type(g.n) is int else None
        macs = g.n * co * ci * 9 * g.ho * g.wo if units else None
        split = plan_split(lw, dt, shapes, units, macs, rows=co)
        temps = workspace(lw, dt, *shapes) if split is None else split.locs + [split.control]
        locs = [gl, xl, dst] + temps
        # one block not split: its products forked where a fork pays
        forked = split is None and units == 1 and kernels.forks(
            lw.openmp, kernels.gemm_work(POSITIONS, co, ci, t_max))
        by_channels = forked and FORKED_TRANSFORMS and lw.most_threads() > 1 and \
            type(g.n) is int and nb >= g.n and by_rows_apply(xp, xs, t_max) and \
            by_rows_apply(yp, gs, t_max)
        recipe = (g.key(), forked, None if split is None else (split.shares, split.copy_bytes),
                  by_channels)
        kb, ids = image_kernel(lw, "conv2d_polyphase_weight_grad", locs, recipe)
        gi, si, _, ui, pxi, pyi, vi, vti, yi = ids[:9]
        out = _out_kernel(lw, locs, recipe, g, full, split)
        if by_channels:
            lw.calls.extend(_transform_kernels(lw, locs, recipe, g.n, (xp, xs), (yp, gs), full))
        b = kb.begin()
        if b is None:  # built before for a node of the same geometry
            lw.calls.append(called_kernel(lw, kb.kernel, split, reduce=out))
        else:
            with loop(b, 0, xp.padded[0] * xp.padded[1], "zero") as q:
                kb.store(b, pxi, q, const(dt, 0.0))
            start = 0 if split is None else \
                b.mul(conv_threads.unit_range(b, kb, ids[-1])[0], i64(nb))

            def block(b, n0, count):
                ld = count * tiles
                v_step, y_step = spaced(ci * ld), spaced(co * ld)
                layout = _Layout(ci, co, ld)
                if not by_channels:  # else in kernels of their own, before
                    input_transform(b, kb, dt, (n0, count), si, xs, xp, pxi, vi, v_step, ld)
                    _tile_major(b, kb, vi, vti, layout, v_step)
                    input_transform(b, kb, dt, (n0, count), gi, gs, yp, pyi, yi, y_step, ld)
                beta = _first_or_add(b, dt, n0, start)
                for width, slot, products in layout.groups():
                    fn = winograd_gemm.function(
                        lw.module, _gemm(co, ci, ld, width, products), forked and products > 1)
                    at = [slot * y_step, layout.starts(ld)[slot], full.starts(co)[slot]]
                    b.call(fn, [kb.pointer(b, k, i64(a)) for k, a in zip((yi, vti, ui), at)] +
                           [beta])

            walk_blocks(b, kb, g, nb, split, ids[-1], block)
            lw.calls.append(called_kernel(lw, kb.finish(b), split, reduce=out))
        if split is None:
            lw.calls.append(out)
    return True


def _first_or_add(b, dt, n0, start):
    """The GEMMs' beta: 0 for the first block of the kernel (or of its share), which writes
    dU, 1 after."""
    zero, one = const(dt, 0.0), const(dt, 1.0)
    if isinstance(n0, int) and isinstance(start, int):
        return zero if n0 == start else one
    return b.select(b.icmp_signed("==", as_i64(n0), as_i64(start)), zero, one)


def _transform_kernels(lw, locs, recipe, n: int, x_pass, y_pass, layout: _Layout) -> list:
    """A one-block batch's (`n` images) transforms as kernels of their own on `locs`
    (conv_threads.channel_kernel), forked over x's channels by squares of SQUARE (V and its
    Vt) and over gy's channels (Y); `x_pass`, `y_pass`: (Pass, the source's strides)."""
    dt = locs[0].type.dtype
    ci, co, ld = layout.ci, layout.co, layout.ld
    v_step, y_step = spaced(ci * ld), spaced(co * ld)
    (xp, xs), (yp, gs) = x_pass, y_pass

    def x_share(b, kb, ids, squares):
        channels = tuple(b.mul(k, i64(SQUARE)) for k in squares)
        input_transform(b, kb, dt, (0, n), ids[1], xs, xp, ids[4], ids[6], v_step, ld, channels)
        _tile_major(b, kb, ids[6], ids[7], layout, v_step, squares)

    def y_share(b, kb, ids, channels):
        input_transform(b, kb, dt, (0, n), ids[0], gs, yp, ids[5], ids[8], y_step, ld, channels)

    name = "conv2d_polyphase_weight_grad"
    return [conv_threads.channel_kernel(lw, name + "_x", locs, recipe, ci // SQUARE,
                                        POSITIONS * ld * ci, x_share),
            conv_threads.channel_kernel(lw, name + "_y", locs, recipe, co, 9 * ld * co,
                                        y_share)]


def _tile_major(b, kb, vi, vti, layout: _Layout, v_step: int, squares=None) -> None:
    """Vt (layout.vt: position xi's columns of its Y's matrix, rows t) = V[xi][c][t] for
    a block's ld columns: squares of SQUARE x SQUARE in registers, the columns past the last
    whole square one by one. `squares`: only the channel squares [lo, hi) (a forked kernel's
    share)."""
    vec = ir.VectorType(F32, SQUARE)
    ci, ld = layout.ci, layout.ld
    whole = ld - ld % SQUARE
    for xi in range(POSITIONS):
        start, row = layout.vt(xi)
        with loop(b, *(squares or (0, ci // SQUARE)), "cs") as cs:
            c0 = b.mul(cs, i64(SQUARE))
            if whole:
                with loop(b, 0, whole // SQUARE, "ts") as ts:
                    t0 = b.mul(ts, i64(SQUARE))
                    rows = [b.load(kb.pointer(b, vi, iadd(b, imul(b, iadd(b, c0, r), ld), t0,
                                                          xi * v_step)), typ=vec, align=4)
                            for r in range(SQUARE)]
                    for k, values in enumerate(square_transposed(b, rows)):
                        at = iadd(b, imul(b, iadd(b, t0, k), row), c0, start)
                        b.store(values, kb.pointer(b, vti, at), align=4)
            if whole < ld:
                with loop(b, whole, ld, "t") as t, loop(b, 0, SQUARE, "c") as c:
                    cc = b.add(c0, c)
                    value = kb.load(b, vi, iadd(b, imul(b, cc, ld), t, xi * v_step))
                    kb.store(b, vti, iadd(b, imul(b, t, row), cc, start), value)


def _out_kernel(lw, locs, recipe, g, layout: _Layout, split):
    """gw from dU (`_weight_out`) as a kernel of its own: after a kernel not split, forked
    over the output channels where large enough; after a split one, its reduce kernel,
    share 0's dU += the other shares' (share order) over its rows of output channels
    first."""
    dt = locs[0].type.dtype
    kb, ids = image_kernel(lw, "conv2d_polyphase_weight_out", locs, recipe)
    if split is None:
        b = kb.begin(parallel=True, work=POSITIONS * g.o * g.c)
        if b is None:
            return kb.kernel
        _weight_out(b, kb, dt, ids[3], layout, ids[2], kb.outer_range(b, g.o))
        return kb.finish(b)
    b = kb.begin()
    if b is None:
        return kb.kernel
    ui, ctrl = ids[3], ids[-1]
    o_range = conv_threads.unit_range(b, kb, ctrl, conv_threads.ROWS_LO)
    copy = split.copy_bytes // dt.itemsize
    starts = layout.starts(g.o)
    with loop(b, 1, kb.load(b, ctrl, i64(conv_threads.SHARES)), "share") as s:
        frm = b.mul(s, i64(copy))
        for start, width in zip(starts, WIDTHS):
            with loop(b, *o_range, "o") as o:
                row = iadd(b, imul(b, o, width * g.c), start)
                with loop(b, 0, width * g.c, "c") as c:
                    at = b.add(row, c)
                    total = b.fadd(kb.load(b, ui, at), kb.load(b, ui, b.add(frm, at)))
                    kb.store(b, ui, at, total)
    _weight_out(b, kb, dt, ui, layout, ids[2], o_range)
    return kb.finish(b)


def _weight_out(b, kb, dt, ui, layout: _Layout, oi, o_range) -> None:
    """gw[o, c] for o in `o_range`: each phase's G_r^T dU G_c (its 2x2, 2x1, 1x2 or 1x1
    slice of the 3x3 taps), c innermost so dU's rows and gw are read and written along
    their rows: float32 FILTER_LANES filters a vector where C_in is whole vectors (dU's
    rows loaded as vectors, each filter's 9 taps one store, transposed in registers:
    winograd_filters.store_filter_taps; the same operations per filter, the same bits),
    else one by one. LLVM's own vectorisation of the one-by-one loop scattered gw's taps:
    the 256 -> 512 layer's took ~1.7 ms for 13 MB of dU (fourteenth session)."""
    ci = layout.ci
    lanes = FILTER_LANES
    vectors = winograd_filters.FILTER_VECTORS and dt is not float64 and ci % lanes == 0
    vec = ir.VectorType(F32, lanes)
    with loop(b, *o_range, "o") as o, \
            loop(b, 0, ci // lanes if vectors else ci, "c") as step:
        c = b.mul(step, i64(lanes)) if vectors else step
        rows_at = {}  # o's row of each width's matrices, + c

        def du(xi):
            start, row = layout.du(xi)
            if row not in rows_at:
                rows_at[row] = iadd(b, imul(b, o, row), c)
            at = iadd(b, rows_at[row], start)
            return b.load(kb.pointer(b, ui, at), typ=vec, align=4) if vectors else \
                kb.load(b, ui, at)

        taps = [None] * 9
        xi = 0
        for rows, cols in PHASES:
            d = []
            for _ in rows[1]:
                d.append([du(xi + k) for k in range(len(cols[1]))])
                xi += len(cols[1])
            values = two_sided(b, dt, tuple(zip(*rows[2])), d, tuple(zip(*cols[2])))
            for r, row in zip(rows[3], values):
                for s, value in zip(cols[3], row):
                    taps[3 * r + s] = value
        if vectors:
            store_filter_taps(b, kb, oi, ci, o, c, False, taps)
        else:
            base = imul(b, iadd(b, imul(b, o, ci), c), 9)
            for tap, value in enumerate(taps):
                kb.store(b, oi, iadd(b, base, tap), value)
