"""conv_polyphase: 3x3 stride-2 convolutions (padding 1) as Winograd on the input's phases.

A stride-2 correlation reads even and odd input rows and columns with different taps: with
pad 1, output row i reads input rows 2i - 1, 2i, 2i + 1, i.e. the even phase E[a] = x[2a]
at a = i (tap 1) and the odd phase O[a] = x[2a + 1] at a = i - 1 and i (taps 0 and 2). So
the convolution is the sum of four stride-1 correlations, one per phase pair (rows, columns),
with the sub-filters w[1, 1] (1x1), w[1, ::2] (1x2), w[::2, 1] (2x1) and w[::2, ::2] (2x2).
Each runs in Winograd's form for a 2x2 block of outputs: F(2, 1) (the identity, 2 points)
along an even axis, F(2, 2) (3 points: B^T = [[1, -1, 0], [0, 1, 0], [0, -1, 1]],
G = [[1, 0], [1, 1], [0, 1]], A^T = [[1, 1, 0], [0, 1, 1]], coefficients 0 and +-1 only, so
the transforms round nothing) along an odd one: 4 + 6 + 6 + 9 = 25 transform-domain
products per output block where im2col's GEMM spends 36, i.e. 25 GEMMs
`M[xi] (C_out x T) = U[xi] (C_out x C_in) @ V[xi] (C_in x T)` over the T output blocks of a
block of images (1.44x fewer multiplications than im2col's [C_out x 9 C_in] @ [9 C_in x P]).

The kernel, per block of images (BLOCK_TILES output blocks or more, as conv_winograd's):
- filter transform (once per call, or a forked kernel of its own before a split kernel):
  `U[xi][o][c]` for the 25 positions;
- input transform: each channel plane copied into a zero-padded plane (one row and column
  of zeros before it, border zeroed once per kernel), then every output block's 5x5 input
  patch (rows 4ty - 1 .. 4ty + 3) to its 25 values `V[xi][c][t]`;
- the 25 GEMMs in one call of winograd_gemm's generated function;
- output transform: each output block's 2x2 values, the four phases' A^T M A added in a
  fixed order.
On more than one core the blocks are split over the threads (conv_threads, as
conv_winograd's: each share its own padded plane, V and M; U made once); a kernel whose
batch is one block forks its filter transform and its 25 GEMMs instead.

Rounding: the GEMMs sum over C_in (as conv_winograd's forward: within 2x eager's distance
from float64; tests/test_cpu_conv_polyphase.py).

Taken when: ENABLED, float32, a host where winograd_gemm serves, a 3x3 kernel, stride 2,
padding 1, dilation 1, groups 1, even output height and width, at least MIN_CHANNELS input
and output channels, every block's GEMM a whole number of vectors wide, input channels at
most winograd_gemm.MAX_K. Only the forward for now: the input and weight gradients keep
im2col.
"""

from __future__ import annotations

from llvmlite import ir

from graphc.backends.cpu import kernels, winograd_gemm
from graphc.backends.cpu.conv_blocks import block_images, walk_blocks
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
from graphc.backends.cpu.winograd_transforms import combine, pad_plane, spaced
from graphc.types import float32

__all__ = ["ENABLED", "MIN_CHANNELS", "POSITIONS", "conv2d", "phase_matrices"]

ENABLED = True  # False: im2col + GEMM (A/B runs)
MIN_CHANNELS = 16
BLOCK_TILES = 64  # output blocks a GEMM's columns hold, at least (as conv_winograd's)
WIDE_CHANNELS = 512  # from this many channels in and out together, blocks of twice as many
LANES = 16  # output blocks a vector of the small planes' output transform holds

# Per axis, per phase: (input patch offsets, B^T, G's rows over the filter taps, A^T).
# Patch offset r is input row 4ty - 1 + r of output block ty; the even phase reads rows
# 4ty, 4ty + 2 (offsets 1, 3) with tap 1; the odd phase rows 4ty - 1, 4ty + 1, 4ty + 3
# (offsets 0, 2, 4) with taps 0 and 2.
EVEN = ((1, 3), ((1, 0), (0, 1)), ((1,), (1,)), (1,), ((1, 0), (0, 1)))
ODD = ((0, 2, 4), ((1, -1, 0), (0, 1, 0), (0, -1, 1)), ((1, 0), (1, 1), (0, 1)), (0, 2),
       ((1, 1, 0), (0, 1, 1)))
PHASES = ((EVEN, EVEN), (EVEN, ODD), (ODD, EVEN), (ODD, ODD))
POSITIONS = sum(len(r[1]) * len(c[1]) for r, c in PHASES)  # 4 + 6 + 6 + 9 = 25


def phase_matrices():
    """[(rows, cols)] of the four phase pairs, each axis (patch offsets, B^T, G, filter
    taps, A^T): the numbers the transforms use (for tests)."""
    return PHASES


def _two_sided(b, dt, left, d, right):
    """left @ d @ right^T for `d` given as rows of IR values (combine's order)."""
    rows = [[combine(b, dt, r, [d[k][col] for k in range(len(d))]) for col in range(len(d[0]))]
            for r in left]
    return [[combine(b, dt, r, row) for r in right] for row in rows]


def conv2d(lw, node, g, x, w, out) -> bool:
    """out = conv2d(x, w) by polyphase Winograd (see the module docstring), or False."""
    dt = x.type.dtype
    ci, co = g.c, g.o
    if not (ENABLED and dt is float32 and winograd_gemm.available()
            and all(type(d) is int for d in (ci, co, g.h, g.w, g.ho, g.wo))
            and (g.kh, g.kw) == (3, 3) and g.stride == (2, 2) and g.padding == (1, 1)
            and g.dilation == (1, 1) and g.groups == 1 and min(ci, co) >= MIN_CHANNELS
            and ci <= winograd_gemm.MAX_K and g.ho % 2 == 0 and g.wo % 2 == 0):
        return False
    th, tw = g.ho // 2, g.wo // 2
    tiles = th * tw
    want = BLOCK_TILES * (2 if ci + co >= WIDE_CHANNELS else 1)
    nb = max(1, -(-want // tiles))
    nb = nb if type(g.n) is not int else min(g.n, nb)
    counts = {nb} | ({g.n % nb} - {0} if type(g.n) is int else {1})
    t_max = nb * tiles
    u_step = spaced(co * ci)
    if any(_gemm(ci, co, n * tiles, u_step) is None for n in counts):
        return False
    xs = image_strides(x)
    hp, wp = 4 * th + 1, 4 * tw + 1  # the padded plane: one zero row and column before
    _polyphase(lw, node, g, x, xs, w, out, nb, (th, tw), (hp, wp), t_max, u_step)
    return True


def _gemm(ci: int, co: int, ld: int, u_step: int):
    """winograd_gemm's plan for a block of `ld` output blocks: M[xi] (co x ld) = U[xi]
    (co x ci) @ V[xi] (ci x ld), 25 products."""
    return winograd_gemm.plan(co, ld, ci, ci, 1, ld, ld, u_step, spaced(ci * ld),
                              spaced(co * ld), products=POSITIONS)


def _polyphase(lw, node, g, x, xs, w, out, nb, tiles_hw, padded, t_max, u_step) -> None:
    dt = x.type.dtype
    ci, co = g.c, g.o
    th, tw = tiles_hw
    hp, wp = padded
    w = contiguous_in(lw, w)
    with contiguous_out(lw, out) as dst:
        shapes = [(hp * wp,), (POSITIONS, spaced(ci * t_max)), (POSITIONS, spaced(co * t_max))]
        units = -(-g.n // nb) if type(g.n) is int else None
        macs = g.n * co * ci * 9 * g.ho * g.wo if units else None
        split = plan_split(lw, dt, shapes, units, macs, shared=[(POSITIONS, u_step)])
        temps = workspace(lw, dt, (POSITIONS, u_step), *shapes) if split is None else \
            split.shared + split.locs + [split.control]
        locs = [x, w, dst] + temps
        # not split over images (one block: 256 -> 512 channels at 8x8, batch 32): the
        # filter transform in a forked kernel of its own first, the 25 GEMMs forked
        alone = split is None and kernels.forks(lw.openmp, POSITIONS * co * ci)
        recipe = (g.key(), split is not None, alone)
        kb, ids = image_kernel(lw, "conv2d_polyphase", locs, recipe)
        si, wi, oi, ui, pi, vi, mi = ids[:7]
        prelude = None if split is None and not alone else \
            _filter_kernel(lw, locs, recipe, g, u_step)
        if alone:
            lw.calls.append(prelude)
        b = kb.begin()
        if b is None:  # built before for a node of the same geometry
            return lw.calls.append(called_kernel(lw, kb.kernel, split, prelude=prelude))
        with loop(b, 0, hp * wp, "zero") as q:
            kb.store(b, pi, q, const(dt, 0.0))
        if prelude is None:
            _filter_transform(b, kb, dt, wi, ui, u_step, g, (i64(0), i64(co)))

        def block(b, n0, count):
            ld = count * th * tw
            v_step, m_step = spaced(ci * ld), spaced(co * ld)
            _input_transform(b, kb, dt, (n0, count), si, xs, g, pi, wp, vi, v_step, ld)
            forked = split is None and kernels.forks(
                lw.openmp, kernels.gemm_work(POSITIONS, co, ld, ci))
            fn = winograd_gemm.function(lw.module, _gemm(ci, co, ld, u_step), forked)
            b.call(fn, [kb.pointer(b, k, i64(0)) for k in (ui, vi, mi)] + [const(dt, 0.0)])
            _output_transform(b, kb, dt, (n0, count), mi, m_step, co, oi, (g.ho, g.wo), ld)

        walk_blocks(b, kb, g, nb, split, ids[-1], block)
        lw.calls.append(called_kernel(lw, kb.finish(b), split, prelude=prelude))


def _filter_transform(b, kb, dt, wi, ui, u_step, g, o_range) -> None:
    """U[xi][o][c] of the four phases' sub-filters (G f G^T each) for o in `o_range`."""
    with loop(b, *o_range, "wo") as o, loop(b, 0, g.c, "wc") as c:
        base = imul(b, iadd(b, imul(b, o, g.c), c), 9)
        f = [[kb.load(b, wi, iadd(b, base, r * 3 + s)) for s in range(3)] for r in range(3)]
        at = iadd(b, imul(b, o, g.c), c)
        xi = 0
        for rows, cols in PHASES:
            sub = [[f[r][s] for s in cols[3]] for r in rows[3]]
            for row in _two_sided(b, dt, rows[2], sub, cols[2]):
                for value in row:
                    kb.store(b, ui, iadd(b, at, xi * u_step), value)
                    xi += 1


def _filter_kernel(lw, locs, recipe, g, u_step):
    """The filter transform as a kernel of its own, run once before a split kernel's shares;
    forked over w's output channels where large enough."""
    kb, ids = image_kernel(lw, "conv2d_polyphase_filter", locs, recipe)
    b = kb.begin(parallel=True, work=POSITIONS * g.o * g.c)
    if b is None:
        return kb.kernel
    _filter_transform(b, kb, locs[0].type.dtype, ids[1], ids[3], u_step, g,
                      kb.outer_range(b, g.o))
    return kb.finish(b)


def _input_transform(b, kb, dt, images, si, ss, g, pi, wp, vi, v_step, ld) -> None:
    """V[xi][c][t] of every output block t of the images (n0, count): each channel plane
    into the padded plane, then each block's 5x5 patch through the phases' B^T."""
    n0, count = images
    th, tw = g.ho // 2, g.wo // 2
    rows = (0, min(g.h, 4 * th))  # the source rows any patch reads
    with block_images(b, count) as j, loop(b, 0, g.c, "ci") as c:
        pad_plane(b, kb, si, iadd(b, imul(b, iadd(b, n0, j), ss[0]), imul(b, c, ss[1])),
                  ss[2:], (g.h, min(g.w, 4 * tw)), pi, wp, (1, 1), rows)
        row_v = iadd(b, imul(b, c, ld), imul(b, j, th * tw))
        with loop(b, 0, th, "ty") as ty, loop(b, 0, tw, "tx") as tx:
            at = iadd(b, imul(b, ty, 4 * wp), imul(b, tx, 4))
            d = [[kb.load(b, pi, iadd(b, at, r * wp + s)) for s in range(5)] for r in range(5)]
            t = iadd(b, row_v, imul(b, ty, tw), tx)
            xi = 0
            for rows_p, cols_p in PHASES:
                sub = [[d[r][s] for s in cols_p[0]] for r in rows_p[0]]
                for row in _two_sided(b, dt, rows_p[1], sub, cols_p[1]):
                    for value in row:
                        kb.store(b, vi, iadd(b, t, xi * v_step), value)
                        xi += 1


def _phase_sum(b, dt, m_of):
    """The 2x2 outputs of one output block (IR values, or vectors of LANES blocks): the sum
    over the phases of A^T M A, in phase order; `m_of(xi)` loads M's position xi."""
    total, xi = None, 0
    for rows_p, cols_p in PHASES:
        m = []
        for _ in rows_p[1]:
            m.append([m_of(xi + k) for k in range(len(cols_p[1]))])
            xi += len(cols_p[1])
        y = _two_sided(b, dt, rows_p[4], m, cols_p[4])
        total = y if total is None else \
            [[b.fadd(total[r][s], y[r][s]) for s in range(2)] for r in range(2)]
    return total


def _output_transform(b, kb, dt, images, mi, m_step, co, oi, out_hw, ld) -> None:
    """out[n0 + j, o] (NCHW, contiguous) of every output block: the sum over the phases of
    A^T M A, in phase order (`_phase_sum`); planes of LANES blocks or a whole fraction of it
    by `_output_by_vectors`."""
    n0, count = images
    th, tw = out_hw[0] // 2, out_hw[1] // 2
    if LANES % (th * tw) == 0 and ld % LANES == 0:
        return _output_by_vectors(b, kb, images, mi, m_step, co, oi, out_hw, ld)
    plane = out_hw[0] * out_hw[1]
    with block_images(b, count) as j, loop(b, 0, co, "co") as o:
        row_m = iadd(b, imul(b, o, ld), imul(b, j, th * tw))
        base = imul(b, iadd(b, imul(b, iadd(b, n0, j), co), o), plane)
        with loop(b, 0, th, "ty") as ty, loop(b, 0, tw, "tx") as tx:
            t = iadd(b, row_m, imul(b, ty, tw), tx)
            total = _phase_sum(b, dt, lambda xi: kb.load(b, mi, iadd(b, t, xi * m_step)))
            at = iadd(b, base, imul(b, ty, 2 * out_hw[1]), imul(b, tx, 2))
            for r in range(2):
                for s in range(2):
                    kb.store(b, oi, iadd(b, at, r * out_hw[1] + s), total[r][s])


def _output_by_vectors(b, kb, images, mi, m_step, co, oi, out_hw, ld) -> None:
    """_output_transform for small planes (ResNet-18's 256 -> 512 layer: 4x4 outputs, 4
    blocks an image), LANES blocks at once: each position's LANES sums one vector load along
    M's row, the phases' sum on vectors, the 2x2 outputs of every block shuffled into whole
    output planes and stored as vectors (the same additions in the same order as the block
    loop, which LLVM leaves scalar at 2 blocks a row: 1.1 ms of the kernel's 9.8)."""
    n0, _ = images
    tw = out_hw[1] // 2
    per_image = (out_hw[0] // 2) * tw
    count = LANES // per_image  # images a vector of blocks covers
    plane = out_hw[0] * out_hw[1]
    vec = ir.VectorType(F32, LANES)
    order = []  # the concatenated 2x2 outputs ([r][s] runs of LANES) in the planes' order
    for k in range(count):
        for row in range(out_hw[0]):
            for col in range(out_hw[1]):
                tile = k * per_image + (row // 2) * tw + col // 2
                order.append(((row % 2) * 2 + col % 2) * LANES + tile)
    with loop(b, 0, co, "co") as o, loop(b, 0, ld // LANES, "tg") as group:
        at = iadd(b, imul(b, o, ld), imul(b, group, LANES))
        total = _phase_sum(b, float32, lambda xi: b.load(
            kb.pointer(b, mi, iadd(b, at, xi * m_step)), typ=vec, align=4))
        every = _concatenated(b, [total[0][0], total[0][1], total[1][0], total[1][1]])
        first = iadd(b, n0, imul(b, group, count))
        for k in range(count):
            mask = ir.Constant(ir.VectorType(I32, plane), order[k * plane:(k + 1) * plane])
            values = b.shuffle_vector(every, ir.Constant(every.type, ir.Undefined), mask)
            out_at = imul(b, iadd(b, imul(b, iadd(b, first, k), co), o), plane)
            b.store(values, kb.pointer(b, oi, out_at), align=4)


def _concatenated(b, vectors: list):
    """One vector of the given equal-length vectors, in order (pairwise shuffles)."""
    while len(vectors) > 1:
        n = vectors[0].type.count
        both = ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n)))
        vectors = [b.shuffle_vector(vectors[i], vectors[i + 1], both)
                   for i in range(0, len(vectors), 2)]
    return vectors[0]
