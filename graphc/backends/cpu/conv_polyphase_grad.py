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

from llvmlite import ir

from graphc.backends.cpu import conv_threads, kernels, winograd_gemm
from graphc.backends.cpu.conv_blocks import walk_blocks
from graphc.backends.cpu.conv_polyphase import (
    EVEN,
    ODD,
    PHASES,
    POSITIONS,
    Pass,
    applies,
    input_transform,
    two_sided,
)
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
from graphc.backends.cpu.values import F32, I32, as_i64, i64, loop
from graphc.backends.cpu.winograd_transforms import spaced

__all__ = ["BLOCK_TILES", "ENABLED", "Y_PHASES", "conv2d_weight_grad", "square_transposed"]

ENABLED = True  # False: im2col + GEMM (A/B runs)
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


# Y's phase pairs in PHASES' order, so Y's 25 positions line up with V's
Y_PHASES = tuple((_y_axis(rows), _y_axis(cols)) for rows, cols in PHASES)
assert Y_PHASES[0][0][1] == ((1, 0), (0, 1)) and _y_axis(ODD)[1] == ((1, 0), (1, 1), (0, 1))
assert _y_axis(EVEN)[0] == _y_axis(ODD)[0]


def _gemm(co: int, ci: int, ld: int, u_step: int):
    """winograd_gemm's plan for a block of `ld` output blocks: dU[xi] (co x ci) (+)= Y[xi]
    (co x ld, rows ld apart) @ Vt[xi] (ld x ci), 25 products."""
    return winograd_gemm.plan(co, ci, ld, ld, 1, ci, ci, spaced(co * ld), spaced(ci * ld),
                              u_step, accumulates=True, max_c=co * ci, products=POSITIONS)


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
    want = BLOCK_TILES * (2 if ci + co >= WIDE_CHANNELS else 1)
    nb = max(1, -(-want // tiles))
    nb = nb if type(g.n) is not int else min(g.n, nb)
    counts = {nb} | ({g.n % nb} - {0} if type(g.n) is int else {1})
    t_max = nb * tiles
    u_step = spaced(co * ci)
    if any(_gemm(co, ci, n * tiles, u_step) is None for n in counts):
        return False
    xp = Pass(False, PHASES, ci, co, (g.h, g.w), (g.ho, g.wo), (th, tw),
              (4 * th + 1, 4 * tw + 1), (1, 1), 4, 5)
    yp = Pass(False, Y_PHASES, co, ci, (g.ho, g.wo), (g.ho, g.wo), (th, tw),
              (g.ho, g.wo), (0, 0), 2, 2)
    xl, gl = lw.locs[x], lw.locs[gy]
    xs, gs = image_strides(xl), image_strides(gl)
    with contiguous_out(lw, lw.locs[node.outputs[0]]) as dst:
        # dU first (a share's own, summed by the reduce kernel), the padded planes of x and
        # gy (the block loop's, where the transform is not by rows), V, Vt, Y
        shapes = [(POSITIONS, u_step), (xp.padded[0] * xp.padded[1],), (g.ho * g.wo,),
                  (POSITIONS, spaced(ci * t_max)), (POSITIONS, spaced(ci * t_max)),
                  (POSITIONS, spaced(co * t_max))]
        units = -(-g.n // nb) if type(g.n) is int else None
        macs = g.n * co * ci * 9 * g.ho * g.wo if units else None
        split = plan_split(lw, dt, shapes, units, macs, rows=co)
        temps = workspace(lw, dt, *shapes) if split is None else split.locs + [split.control]
        locs = [gl, xl, dst] + temps
        # one block not split: its 25 products forked where a fork pays
        forked = split is None and units == 1 and kernels.forks(
            lw.openmp, kernels.gemm_work(POSITIONS, co, ci, t_max))
        recipe = (g.key(), forked, None if split is None else (split.shares, split.copy_bytes))
        kb, ids = image_kernel(lw, "conv2d_polyphase_weight_grad", locs, recipe)
        gi, si, _, ui, pxi, pyi, vi, vti, yi = ids[:9]
        out = _out_kernel(lw, locs, recipe, g, u_step, split)
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
                input_transform(b, kb, dt, (n0, count), si, xs, xp, pxi, vi, v_step, ld)
                _tile_major(b, kb, vi, vti, ci, ld, v_step)
                input_transform(b, kb, dt, (n0, count), gi, gs, yp, pyi, yi, y_step, ld)
                fn = winograd_gemm.function(lw.module, _gemm(co, ci, ld, u_step), forked)
                b.call(fn, [kb.pointer(b, k, i64(0)) for k in (yi, vti, ui)] +
                       [_first_or_add(b, dt, n0, start)])

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


def _tile_major(b, kb, vi, vti, ci: int, ld: int, v_step: int) -> None:
    """Vt[xi][t][c] = V[xi][c][t] (a block's ld columns, Vt's positions v_step apart as V's):
    squares of SQUARE x SQUARE in registers, the columns past the last whole square one by
    one."""
    vec = ir.VectorType(F32, SQUARE)
    whole = ld - ld % SQUARE
    with loop(b, 0, POSITIONS, "xi") as xi, loop(b, 0, ci // SQUARE, "cs") as cs:
        base = imul(b, xi, v_step)
        c0 = b.mul(cs, i64(SQUARE))
        if whole:
            with loop(b, 0, whole // SQUARE, "ts") as ts:
                t0 = b.mul(ts, i64(SQUARE))
                rows = [b.load(kb.pointer(b, vi, iadd(b, base, imul(b, iadd(b, c0, r), ld),
                                                      t0)), typ=vec, align=4)
                        for r in range(SQUARE)]
                for k, row in enumerate(square_transposed(b, rows)):
                    at = iadd(b, base, imul(b, iadd(b, t0, k), ci), c0)
                    b.store(row, kb.pointer(b, vti, at), align=4)
        if whole < ld:
            with loop(b, whole, ld, "t") as t, loop(b, 0, SQUARE, "c") as c:
                cc = b.add(c0, c)
                value = kb.load(b, vi, iadd(b, base, imul(b, cc, ld), t))
                kb.store(b, vti, iadd(b, base, imul(b, t, ci), cc), value)


def square_transposed(b, rows: list) -> list:
    """The transpose of a square of n vectors of n lanes (n a power of two): log2(n) rounds
    of pairwise shuffles, round h swapping the h x h off-diagonal blocks of every 2h x 2h
    block."""
    n = len(rows)
    rows = list(rows)
    h = n // 2
    while h:
        lo = ir.Constant(ir.VectorType(I32, n), [c if not c & h else n + c - h for c in range(n)])
        hi = ir.Constant(ir.VectorType(I32, n), [c + h if not c & h else n + c for c in range(n)])
        for r in range(n):
            if not r & h:
                rows[r], rows[r + h] = (b.shuffle_vector(rows[r], rows[r + h], lo),
                                        b.shuffle_vector(rows[r], rows[r + h], hi))
        h //= 2
    return rows


def _out_kernel(lw, locs, recipe, g, u_step, split):
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
        _weight_out(b, kb, dt, ids[3], u_step, ids[2], kb.outer_range(b, g.o), g.c)
        return kb.finish(b)
    b = kb.begin()
    if b is None:
        return kb.kernel
    ui, ctrl = ids[3], ids[-1]
    o_range = conv_threads.unit_range(b, kb, ctrl, conv_threads.ROWS_LO)
    copy = split.copy_bytes // dt.itemsize
    with loop(b, 1, kb.load(b, ctrl, i64(conv_threads.SHARES)), "share") as s:
        frm = b.mul(s, i64(copy))
        with loop(b, 0, POSITIONS, "xi") as xi, loop(b, *o_range, "o") as o:
            row = iadd(b, imul(b, xi, u_step), imul(b, o, g.c))
            with loop(b, 0, g.c, "c") as c:
                at = b.add(row, c)
                kb.store(b, ui, at, b.fadd(kb.load(b, ui, at), kb.load(b, ui, b.add(frm, at))))
    _weight_out(b, kb, dt, ui, u_step, ids[2], o_range, g.c)
    return kb.finish(b)


def _weight_out(b, kb, dt, ui, u_step, oi, o_range, ci: int) -> None:
    """gw[o, c] for o in `o_range`: each phase's G_r^T dU G_c (its 2x2, 2x1, 1x2 or 1x1
    slice of the 3x3 taps), c innermost so dU's 25 rows and gw are read and written along
    their rows."""
    with loop(b, *o_range, "o") as o, loop(b, 0, ci, "c") as c:
        at = iadd(b, imul(b, o, ci), c)
        base = imul(b, at, 9)
        xi = 0
        for rows, cols in PHASES:
            du = []
            for _ in rows[1]:
                du.append([kb.load(b, ui, iadd(b, at, (xi + k) * u_step))
                           for k in range(len(cols[1]))])
                xi += len(cols[1])
            taps = two_sided(b, dt, tuple(zip(*rows[2])), du, tuple(zip(*cols[2])))
            for r, row in zip(rows[3], taps):
                for s, value in zip(cols[3], row):
                    kb.store(b, oi, iadd(b, base, 3 * r + s), value)
