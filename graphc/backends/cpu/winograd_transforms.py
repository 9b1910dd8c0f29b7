"""winograd_transforms: the IR of F(2x2, 3x3)'s transforms (graphc.backends.cpu.conv_winograd).

Each function emits, into a kernel being built (an image_kernels builder `kb` and its LLVM
builder `b`), one of the transforms around the Winograd kernels' GEMMs; conv_winograd decides
the blocks, the layouts and the GEMMs, these the arithmetic:
- `sandwich`: mat @ d @ mat^T of one tile held in IR values, coefficient by coefficient
  (`combine`: zeros skipped, +-1 as additions and subtractions), so every transform keeps
  the same order of operations wherever it is emitted (the results' rounding depends on it);
- `input_tiles`: V = B^T d B of every 4x4 tile of a part of a block's images, through a
  zero-padded plane (`pad_plane`); small planes (4x4, 8x8: tile rows of 2 or 4 tiles, which
  LLVM leaves scalar) by `planes_by_vectors`, 16 tiles a vector, with no padded plane,
  the channels inside each group of images (PLANE_CHANNELS_INNER);
  large planes whose tile rows hold 16 tiles or a whole fraction of it (32x32, 16x16) by
  `rows_by_vectors`, 16 tiles a vector along tile rows, with no padded plane either, its
  rows prefetched ROW_PREFETCH channels ahead;
- `grad_tiles_by_channels`: the weight gradient's Y = A gy A^T in its NN form's tile-major
  layout (output channels innermost), 16 channels a vector: each channel's gy rows loaded
  as vectors and the taps transposed in registers (values.square_transposed), no gathers;
- `spaced`: the distance between consecutive transform-domain matrices;
- the output transforms add the output's per-image, per-channel shifted sums for the batch
  norm after the convolution (graphc.passes.conv_channel_sums) from the rows a part just
  wrote, one channel behind (SUMS_BEHIND), by graphc.backends.cpu.plane_sums'
  `add_plane_sums` (re-exported here for the other kernels that add them).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from llvmlite import ir

from graphc.backends.cpu.conv_blocks import block_images
from graphc.backends.cpu.image_kernels import iadd, imul
from graphc.backends.cpu.plane_sums import add_plane_sums
from graphc.backends.cpu.prefetch import prefetch_lines
from graphc.backends.cpu.scalars import const
from graphc.backends.cpu.values import (
    F32,
    as_i64,
    i64,
    loop,
    square_transposed,
)

__all__ = ["A", "ALPHA", "AT", "BT", "G", "GT", "Tiles", "add_plane_sums", "combine",
           "grad_tiles_by_channels", "grad_tiles_by_channels_apply", "input_tiles",
           "output_planes_by_vectors", "output_tiles", "pad_plane", "planes_by_vectors",
           "planes_by_vectors_apply", "rows_by_vectors", "rows_by_vectors_apply", "sandwich",
           "spaced"]

# F(2, 3) by Toom-Cook on the points 0, 1, -1, infinity (the 1/2 of the interpolation moved
# into G): `y = AT @ ((G @ g) * (BT @ d))` is the correlation y[i] = sum_k d[i + k] g[k].
BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, -1, 0, 1))
G = ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1))
AT = ((1, 1, 1, 0), (0, 1, -1, 1))
# the weight gradient's transforms: gy's 2x2 blocks by A = AT^T, dU back to 3x3 by G^T
A = tuple(zip(*AT))
GT = tuple(zip(*G))
ALPHA = 4  # tile side: 2 outputs + 3 taps - 1


def combine(b, dt, row, vals):
    """sum_k row[k] * vals[k], skipping zero coefficients, +-1 as adds and subtractions."""
    acc = None
    for c, v in zip(row, vals):
        if c == 0:
            continue
        if c not in (1, -1):
            scale = const(dt, float(c))
            if isinstance(v.type, ir.VectorType):
                scale = ir.Constant(v.type, [scale.constant] * v.type.count)
            v = b.fmul(scale, v)
        if acc is None:
            acc = v if c != -1 else b.fneg(v)
        else:
            acc = b.fsub(acc, v) if c == -1 else b.fadd(acc, v)
    return const(dt, 0.0) if acc is None else acc


def sandwich(b, dt, mat, d):
    """mat @ d @ mat^T for a square or rectangular `d` given as rows of IR values."""
    left = [[combine(b, dt, r, [d[k][col] for k in range(len(d))]) for col in range(len(d[0]))]
            for r in mat]
    return [[combine(b, dt, r, row) for r in mat] for row in left]


@dataclass(frozen=True)
class Tiles:
    """The tiles of one part: tile rows [ty0, ty0 + nrows) of `tw` tiles each, of images
    n0 .. n0 + count - 1 (ty0 and n0 ints or loop values); `ld` = count * nrows * tw, the
    columns of its transform-domain matrices (image j's tiles from column j * nrows * tw)."""

    n0: object
    count: int
    ty0: object
    nrows: int
    tw: int
    ld: int


def input_tiles(b, kb, dt, part: Tiles, si, ss, ci, in_hw, pad, pi, wp, vi, v_step,
                channels=None) -> None:
    """V[xi][c][t] = (B^T d B)[xi] for every 4x4 tile d (at stride 2) of the part's images'
    channel planes c < ci of `si` (element strides `ss`), zero-padded by `pad` through the
    padded plane `pi` (`wp` wide, its border zero). `channels`: only c in [lo, hi) (a
    forked kernel's share, conv_threads.channel_kernel; the vector forms only)."""
    if planes_by_vectors_apply(dt, part, ss, in_hw):
        return planes_by_vectors(b, kb, dt, part, si, ss, ci, in_hw, pad, vi, v_step, BT,
                                 channels)
    if rows_by_vectors_apply(dt, part, ss, in_hw):
        return rows_by_vectors(b, kb, dt, part, si, ss, ci, in_hw, pad, vi, v_step, channels)
    assert channels is None, "input_tiles: a channel range needs a vector form (no padded plane)"
    per_image = part.nrows * part.tw
    # the padded rows these tiles read, and the source rows that land there
    src_rows = (_clamped(b, _twice_plus(b, part.ty0, -pad[0]), 0, in_hw[0]),
                _clamped(b, _twice_plus(b, part.ty0, 2 * part.nrows + 2 - pad[0]), 0, in_hw[0]))
    with block_images(b, part.count) as j, loop(b, 0, ci, "ci") as c:
        pad_plane(b, kb, si, iadd(b, imul(b, iadd(b, part.n0, j), ss[0]), imul(b, c, ss[1])),
                   ss[2:], in_hw, pi, wp, pad, src_rows)
        row_v = iadd(b, imul(b, c, part.ld), imul(b, j, per_image))
        with loop(b, 0, part.nrows, "ty") as ty, loop(b, 0, part.tw, "tx") as tx:
            at = iadd(b, imul(b, ty, 2 * wp), imul(b, tx, 2), imul(b, part.ty0, 2 * wp))
            d = [[kb.load(b, pi, iadd(b, at, r * wp + s)) for s in range(ALPHA)]
                 for r in range(ALPHA)]
            v = sandwich(b, dt, BT, d)
            t = iadd(b, row_v, imul(b, ty, part.tw), tx)
            for xi in range(ALPHA * ALPHA):
                kb.store(b, vi, iadd(b, t, xi * v_step), v[xi // ALPHA][xi % ALPHA])


def output_tiles(b, kb, dt, part: Tiles, mi, m_step, co: int, oi, out_hw,
                 sums: int | None = None, channels=None) -> None:
    """out[n0 + j, o] (NCHW, contiguous, planes `out_hw`) = A^T m A for every tile t of the
    part, m[xi] = M[xi * m_step + o * ld + t]; small planes by output_planes_by_vectors.
    `sums` (an operand: float64 [N, 3, co]): each image's and channel's shifted sums, the
    rows of the part added while they are in L1 (`add_plane_sums`), one channel behind
    (SUMS_BEHIND). `channels`: only o in [lo, hi) (a forked kernel's share, conv_threads.
    channel_kernel)."""
    if planes_by_vectors_apply(dt, part, (None, None, out_hw[1], 1), out_hw, whole=True):
        return output_planes_by_vectors(b, kb, dt, part, mi, m_step, co, oi, out_hw, sums,
                                        channels)
    per_image = part.nrows * part.tw
    plane_out = out_hw[0] * out_hw[1]
    n0, ld, tw, ty0 = part.n0, part.ld, part.tw, part.ty0
    lo, hi = channels or (i64(0), i64(co))

    def plane_of(b, j, o):
        return imul(b, iadd(b, imul(b, iadd(b, n0, j), co), o), plane_out)

    def plane_sums(b, j, o):  # the part's rows of plane (j, o), written by now
        plane = plane_of(b, j, o)
        rows_at = iadd(b, plane, imul(b, ty0, 2 * out_hw[1]))
        add_plane_sums(b, kb, dt, oi, plane, rows_at, 2 * part.nrows * out_hw[1], sums,
                       iadd(b, n0, j), o, co, first=_is_zero(b, ty0))

    behind = sums is not None and SUMS_BEHIND
    with block_images(b, part.count) as j:
        with loop(b, lo, hi, "co") as o:
            row_m = iadd(b, imul(b, o, ld), imul(b, j, per_image))
            plane = plane_of(b, j, o)
            with loop(b, 0, part.nrows, "ty") as ty, loop(b, 0, tw, "tx") as tx:
                t = iadd(b, row_m, imul(b, ty, tw), tx)
                m = [[kb.load(b, mi, iadd(b, t, (r * ALPHA + s) * m_step))
                      for s in range(ALPHA)] for r in range(ALPHA)]
                y = sandwich(b, dt, AT, m)
                at = iadd(b, plane, imul(b, ty, 2 * out_hw[1]), imul(b, tx, 2),
                          imul(b, ty0, 2 * out_hw[1]))
                for r in range(2):
                    for s in range(2):
                        kb.store(b, oi, iadd(b, at, r * out_hw[1] + s), y[r][s])
            if behind:  # the previous channel's
                with b.if_then(b.icmp_signed(">", o, as_i64(lo))):
                    plane_sums(b, j, b.sub(o, i64(1)))
            elif sums is not None:
                plane_sums(b, j, o)
        if behind:
            with b.if_then(b.icmp_signed(">", as_i64(hi), as_i64(lo))):
                plane_sums(b, j, b.sub(as_i64(hi), i64(1)))


def _twice_plus(b, v, k: int):
    """2*v + k of an i64 value or an int."""
    return 2 * v + k if isinstance(v, int) else iadd(b, imul(b, v, 2), k)


def _clamped(b, v, lo: int, hi: int):
    """min(max(v, lo), hi) of an i64 value or an int."""
    if isinstance(v, int):
        return min(max(v, lo), hi)
    v = b.select(b.icmp_signed("<", v, i64(lo)), i64(lo), v)
    return b.select(b.icmp_signed(">", v, i64(hi)), i64(hi), v)


def spaced(n: int) -> int:
    """The distance between consecutive transform-domain matrices: `n` elements and 32 more,
    so the 16 streams a tile transform reads or writes are not a power of two apart (they
    would share cache sets: 256x256 channels with 256 tiles put them 256 KiB apart)."""
    return n + 32


def pad_plane(b, kb, src, base, strides, hw, dst, wp, pad, rows) -> None:
    """dst[(r + pad_h) * wp + pad_w + q] = src[base + r*strides[0] + q*strides[1]] for the
    source rows r in [rows[0], rows[1]); the border of dst (zeroed once per kernel) stays
    zero."""
    with loop(b, *rows, "pr") as r:
        row = iadd(b, base, imul(b, r, strides[0]))
        at = iadd(b, imul(b, r, wp), pad[0] * wp + pad[1])
        with loop(b, 0, hw[1], "pq") as q:
            kb.store(b, dst, b.add(at, q), kb.load(b, src, iadd(b, row, imul(b, q, strides[1]))))


# Small planes' input transform in vectors of PLANE_LANES tiles (float32): see
# planes_by_vectors. False: the tile loop through the padded plane (for A/B runs).
PLANE_VECTORS = True
PLANE_LANES = 16
PLANE_SOURCE = 64  # at most this many elements of whole planes feed one vector of tiles


def planes_by_vectors_apply(dt, part: Tiles, ss, in_hw, whole: bool = False) -> bool:
    """Whether planes_by_vectors (or, `whole`, output_planes_by_vectors: the part's tiles
    cover its images' `in_hw` planes) serves this part: float32, the part's first tile row
    0, whole vectors of tiles made of whole images (or one image a whole number of vectors),
    small contiguous planes."""
    per_image = part.nrows * part.tw
    lanes = PLANE_LANES
    if not (PLANE_VECTORS and dt.name == "float32" and isinstance(part.ty0, int)
            and part.ty0 == 0 and part.ld % lanes == 0 and lanes % per_image == 0):
        return False
    if whole and (2 * part.nrows, 2 * part.tw) != tuple(in_hw):
        return False
    images = lanes // per_image
    return (part.count % images == 0 and images * in_hw[0] * in_hw[1] <= PLANE_SOURCE
            and ss[3] == 1 and ss[2] == in_hw[1])


def planes_by_vectors(b, kb, dt, part: Tiles, si, ss, ci, in_hw, pad, vi, v_step,
                      mat=BT, channels=None) -> None:
    """V[xi][c][t] = (B^T d B)[xi] of PLANE_LANES consecutive tiles t at once, for small
    planes (ResNet-18's 4x4 and 8x8 stages: tile rows of 2 or 4 tiles, which the tile loop
    runs in scalar code): the planes those tiles lie in (whole images, contiguous) are
    loaded as vectors, each tap d[r][s] of the PLANE_LANES tiles is one shuffle of them
    (a padded tap from a zero vector), the transform runs on vectors, and each xi's
    PLANE_LANES sums are one store along V's row. The same additions in the same order as
    the tile loop (bit for bit), with no padded plane. `mat` = A (2x2 blocks at stride 2,
    `pad` 0): the weight gradient's Y[xi][o][t] = (A gy A^T)[xi] of the NT form instead."""
    lanes = PLANE_LANES
    per_image = part.nrows * part.tw
    images = lanes // per_image
    plane = in_hw[0] * in_hw[1]
    vec = ir.VectorType(F32, plane)
    source = images * plane
    zero = ir.Constant(ir.VectorType(F32, source), [0.0] * source)

    def tap(r, s):  # which source element (or `source`: zero) each lane's d[r][s] is
        mask = []
        for lane in range(lanes):
            j, t = divmod(lane, per_image)
            ty, tx = divmod(t, part.tw)
            row, col = 2 * ty + r - pad[0], 2 * tx + s - pad[1]
            inside = 0 <= row < in_hw[0] and 0 <= col < in_hw[1]
            mask.append(j * plane + row * in_hw[1] + col if inside else source)
        return ir.Constant(ir.VectorType(ir.IntType(32), lanes), mask)

    side = len(mat[0])  # taps a tile: 4 (B^T d B) or 2 (A gy A^T)
    masks = [[tap(r, s) for s in range(side)] for r in range(side)]
    with _nest(b, (channels or (0, ci), "ci"), ((0, part.ld // lanes), "tg"),
               PLANE_CHANNELS_INNER) as (c, group):
        first = iadd(b, part.n0, imul(b, group, images))
        planes = [b.load(kb.pointer(b, si, iadd(b, imul(b, iadd(b, first, k), ss[0]),
                                                imul(b, c, ss[1]))), typ=vec, align=4)
                  for k in range(images)]
        src = _concatenated(b, planes)
        d = [[b.shuffle_vector(src, zero, masks[r][s]) for s in range(side)]
             for r in range(side)]
        v = sandwich(b, dt, mat, d)
        at = iadd(b, imul(b, c, part.ld), imul(b, group, lanes))
        for xi in range(ALPHA * ALPHA):
            b.store(v[xi // ALPHA][xi % ALPHA], kb.pointer(b, vi, iadd(b, at, xi * v_step)),
                    align=4)


# planes_by_vectors and output_planes_by_vectors walk the channels inside the groups of
# images (consecutive planes of an image: one stream of lines) rather than the images of
# each channel (a line per image, C planes apart: 32 KB at 512 channels 4x4, one of L1's
# sets). ResNet-18, batch 32, 1 thread, 21 alternated rounds (benchmarks/resnet18_kernels.py
# --only switch --switch winograd_transforms.PLANE_CHANNELS_INNER --channels 256 512):
# 512 channels 4x4 forward 5.91 -> 5.70 ms, input gradient 6.28 -> 6.07; 256 channels 8x8
# 4.91 -> 4.85, 5.06 -> 4.95; the weight gradients' Y within the noise. The same bits.
# False: channels outside (A/B runs).
PLANE_CHANNELS_INNER = True


@contextmanager
def _nest(b, outer, inner, swapped: bool):
    """Two loops ((lo, hi), name) each, yielding their values (outer's, inner's); `swapped`:
    inner's loop outside."""
    first, second = (inner, outer) if swapped else (outer, inner)
    with loop(b, *first[0], first[1]) as i, loop(b, *second[0], second[1]) as k:
        yield (k, i) if swapped else (i, k)


def _concatenated(b, vectors: list):
    """One vector of the given equal-length vectors, in order (pairwise shuffles)."""
    while len(vectors) > 1:
        n = vectors[0].type.count
        both = ir.Constant(ir.VectorType(ir.IntType(32), 2 * n), list(range(2 * n)))
        vectors = [b.shuffle_vector(vectors[i], vectors[i + 1], both)
                   for i in range(0, len(vectors), 2)]
    return vectors[0]


def output_planes_by_vectors(b, kb, dt, part: Tiles, mi, m_step, co: int, oi, out_hw,
                             sums: int | None = None, channels=None) -> None:
    """output_tiles for small planes, PLANE_LANES tiles at once (planes_by_vectors'
    converse): the 16 sums of PLANE_LANES tiles loaded as vectors along M's row, A^T m A on
    vectors, and the 2x2 outputs of every tile shuffled into whole output planes, stored
    as vectors. The same additions in the same order as the tile loop (bit for bit).
    `sums`: as output_tiles' (each plane is whole here, so its sums are written once), one
    iteration behind (SUMS_BEHIND)."""
    lanes = PLANE_LANES
    per_image = part.nrows * part.tw
    images = lanes // per_image
    plane = out_hw[0] * out_hw[1]
    vec = ir.VectorType(F32, lanes)
    # the 2x2 outputs, concatenated ([r][s] blocks of `lanes`), to images' planes in order
    order = []
    for k in range(images):
        for row in range(out_hw[0]):
            for col in range(out_hw[1]):
                tile = k * per_image + (row // 2) * part.tw + col // 2
                order.append(((row % 2) * 2 + col % 2) * lanes + tile)

    def plane_sums(b, o, group):  # the planes of (o, group), written by now
        first = iadd(b, part.n0, imul(b, group, images))
        for k in range(images):
            out_at = imul(b, iadd(b, imul(b, iadd(b, first, k), co), o), plane)
            add_plane_sums(b, kb, dt, oi, out_at, out_at, plane, sums, iadd(b, first, k), o,
                           co, first=True)

    ranges = {"co": tuple(as_i64(v) for v in (channels or (0, co))),
              "tg": (i64(0), i64(part.ld // lanes))}
    names = ("tg", "co") if PLANE_CHANNELS_INNER else ("co", "tg")
    inner_lo, inner_hi = ranges[names[1]]
    behind = sums is not None and SUMS_BEHIND

    def at_inner(i, k):  # (o, group) of the loops' values
        values = dict(zip(names, (i, k)))
        return values["co"], values["tg"]

    with loop(b, *ranges[names[0]], names[0]) as i:
        with loop(b, inner_lo, inner_hi, names[1]) as k:
            o, group = at_inner(i, k)
            at = iadd(b, imul(b, o, part.ld), imul(b, group, lanes))
            m = [[b.load(kb.pointer(b, mi, iadd(b, at, (r * ALPHA + s) * m_step)), typ=vec,
                         align=4) for s in range(ALPHA)] for r in range(ALPHA)]
            y = sandwich(b, dt, AT, m)
            every = _concatenated(b, [y[0][0], y[0][1], y[1][0], y[1][1]])
            first = iadd(b, part.n0, imul(b, group, images))
            for k_image in range(images):
                mask = ir.Constant(ir.VectorType(ir.IntType(32), plane),
                                   order[k_image * plane:(k_image + 1) * plane])
                values = b.shuffle_vector(every, ir.Constant(every.type, ir.Undefined), mask)
                out_at = imul(b, iadd(b, imul(b, iadd(b, first, k_image), co), o), plane)
                b.store(values, kb.pointer(b, oi, out_at), align=4)
            if behind:  # the previous iteration's planes
                with b.if_then(b.icmp_signed(">", k, inner_lo)):
                    plane_sums(b, *at_inner(i, b.sub(k, i64(1))))
            elif sums is not None:
                plane_sums(b, o, group)
        if behind:
            with b.if_then(b.icmp_signed(">", inner_hi, inner_lo)):
                plane_sums(b, *at_inner(i, b.sub(inner_hi, i64(1))))


# Large planes' input transform in vectors of PLANE_LANES tiles along tile rows (float32):
# see rows_by_vectors. False: the tile loop through the padded plane (for A/B runs).
ROW_VECTORS = True
# rows_by_vectors asks for the rows it loads ROW_PREFETCH channel planes ahead (llvm.
# prefetch; the planes a part reads lie C * H * W apart per image and H * W per channel,
# short streams the hardware's prefetchers miss). ResNet-18, batch 32, 1 thread, 21
# alternated rounds (benchmarks/resnet18_kernels.py --only switch --switch
# winograd_transforms.ROW_PREFETCH --values 0 4 --channels 64 128): 128 channels 16x16
# forward 5.40 -> 5.04 ms, input gradient 5.45 -> 5.06, weight gradient 5.75 -> 5.40 (2 and
# 8 planes ahead the same); 64 channels 32x32 within the noise (-0.0 to -0.1). The same
# bits (a prefetch only warms the caches). 0: no prefetches (A/B runs).
ROW_PREFETCH = 4
# The output transforms add a plane's sums (`sums`: add_plane_sums) one channel (or one
# vector of tiles) behind: after the next plane's tiles are stored, so that the sums' loads
# of the rows, 32-byte halves of the 64-byte vector stores just made (the conversion to
# float64 reads 8 floats at a time), no longer wait on those stores (it seems: store-to-load
# forwarding). conv2d_channel_sums as a one-op graph, batch 32, 1 thread, 15 alternated
# rounds (the sums cost 0.73 ms over conv2d at 64 channels 32x32, 0.38 at 512 4x4): 64
# channels 32x32 6.23 -> 5.78 ms, 128 16x16 5.02 -> 4.90, 256 8x8 5.62 -> 5.50, 512 4x4
# 6.42 -> 6.01. The same output bits; the sums the same additions, though LLVM vectorises
# the 16-element sums of the 4x4 planes in another order there (1e-16 relative). False: each
# plane's sums right after it (A/B runs).
SUMS_BEHIND = True
ROW_SOURCE = 64  # at most this many elements of input rows feed one tap's shuffle


def rows_by_vectors_apply(dt, part: Tiles, ss, in_hw) -> bool:
    """Whether rows_by_vectors serves this part: float32, a whole number of tile rows to a
    vector of PLANE_LANES tiles (ResNet-18's 32x32 planes: one tile row of 16 tiles; 16x16:
    two of 8), whole vectors in the part, input rows contiguous and short."""
    lanes = PLANE_LANES
    if not (ROW_VECTORS and dt.name == "float32" and lanes % part.tw == 0):
        return False
    per_vector = lanes // part.tw
    return (part.nrows % per_vector == 0 and part.ld % lanes == 0 and ss[3] == 1
            and per_vector * in_hw[1] <= ROW_SOURCE)


def rows_by_vectors(b, kb, dt, part: Tiles, si, ss, ci, in_hw, pad, vi, v_step,
                    channels=None) -> None:
    """V[xi][c][t] = (B^T d B)[xi] of PLANE_LANES consecutive tiles t at once, for planes
    whose tile rows are PLANE_LANES tiles or a whole fraction of it (ResNet-18's 32x32 and
    16x16 stages, where the tile loop first copies every plane into a padded one): the 4
    (or 2 + 2 * tile rows) input rows a vector of tiles reads are loaded as vectors (a row
    in the padding: a zero vector), each tap d[r][s] of the tiles is one shuffle of one
    row (or of one row per tile row) and a zero vector, the transform runs on vectors, and
    each xi's PLANE_LANES sums are one store along V's row. The same additions in the same
    order as the tile loop (bit for bit), with no padded plane."""
    lanes = PLANE_LANES
    per_vector = lanes // part.tw  # tile rows a vector holds
    width = in_hw[1]
    row_vec = ir.VectorType(F32, width)
    source = per_vector * width
    zero_row = ir.Constant(row_vec, [0.0] * width)
    zero = ir.Constant(ir.VectorType(F32, source), [0.0] * source)

    def tap(s):  # which element of the tile rows' source (or `source`: zero) lane reads
        mask = []
        for lane in range(lanes):
            i, tx = divmod(lane, part.tw)
            col = 2 * tx + s - pad[1]
            mask.append(i * width + col if 0 <= col < width else source)
        return ir.Constant(ir.VectorType(ir.IntType(32), lanes), mask)

    masks = [tap(s) for s in range(ALPHA)]
    per_image = part.nrows * part.tw
    with block_images(b, part.count) as j, loop(b, *(channels or (0, ci)), "ci") as c, \
            loop(b, 0, part.nrows // per_vector, "tg") as group:
        plane = iadd(b, imul(b, iadd(b, part.n0, j), ss[0]), imul(b, c, ss[1]))
        ty = iadd(b, imul(b, group, per_vector), part.ty0)
        top = _twice_plus(b, ty, -pad[0])  # the input row of the vector's first tap row
        rows = []
        for k in range(2 * per_vector + 2):
            row = iadd(b, top, k)
            inside = b.and_(b.icmp_signed(">=", row, i64(0)),
                            b.icmp_signed("<", row, i64(in_hw[0])))
            safe = b.select(inside, row, i64(0))  # never read outside the tensor
            row_at = iadd(b, plane, imul(b, safe, ss[2]))
            if ROW_PREFETCH and isinstance(ss[1], int):
                prefetch_lines(kb, b, si, row_at, width * 4, ahead=ROW_PREFETCH * ss[1] * 4)
            loaded = b.load(kb.pointer(b, si, row_at), typ=row_vec, align=4)
            rows.append(b.select(inside, loaded, zero_row))
        d = [[b.shuffle_vector(_concatenated(b, [rows[r + 2 * i] for i in range(per_vector)]),
                               zero, masks[s]) for s in range(ALPHA)] for r in range(ALPHA)]
        v = sandwich(b, dt, BT, d)
        at = iadd(b, imul(b, c, part.ld), imul(b, j, per_image), imul(b, group, lanes))
        for xi in range(ALPHA * ALPHA):
            b.store(v[xi // ALPHA][xi % ALPHA], kb.pointer(b, vi, iadd(b, at, xi * v_step)),
                    align=4)


def _is_zero(b, v):
    """v == 0 of an int (a Python bool) or an i64 value (an i1 value)."""
    return v == 0 if isinstance(v, int) else b.icmp_signed("==", as_i64(v), i64(0))


# The NN-form weight gradient's Y = A gy A^T (conv_winograd, Y[xi][t][o]: output channels
# innermost) of CHANNEL_LANES channels at once: see grad_tiles_by_channels. False: the
# channel loop LLVM vectorises by gathers (A/B runs).
CHANNEL_VECTORS = True
CHANNEL_LANES = 16
CHUNK = 8  # output columns (4 tiles) of both rows of a tile row, one vector a channel


def grad_tiles_by_channels_apply(dt, part: Tiles, gs, out_hw, co: int) -> bool:
    """Whether grad_tiles_by_channels serves this part: float32, whole vectors of output
    channels, output rows a whole number of CHUNK columns, contiguous."""
    return (CHANNEL_VECTORS and dt.name == "float32" and co % CHANNEL_LANES == 0
            and out_hw[1] % CHUNK == 0 and gs[3] == 1)


def grad_tiles_by_channels(b, kb, dt, part: Tiles, gi, gs, co: int, yi, y_step) -> None:
    """Y[xi][t][o] = (A gy A^T)[xi] of the part's 2x2 blocks t, CHANNEL_LANES output
    channels o a vector: for each tile row and CHUNK columns, each channel's two rows of
    gy there are loaded as one vector (contiguous loads, no gather), the CHANNEL_LANES
    vectors transposed in registers (values.square_transposed) into one vector of channels
    per tap position, the transform run on those vectors, and each of a tile's 16 sums stored
    along Y's row. The same additions in the same order per element as the element loop
    (bit for bit); only the taps are transposed, 4 values a tile against its 16 sums."""
    lanes, half = CHANNEL_LANES, CHUNK
    row_vec = ir.VectorType(F32, half)
    both = ir.Constant(ir.VectorType(ir.IntType(32), 2 * half), list(range(2 * half)))
    per_image = part.nrows * part.tw
    with block_images(b, part.count) as j, loop(b, 0, co // lanes, "cob") as ob, \
            loop(b, 0, part.nrows, "ty") as ty, loop(b, 0, 2 * part.tw // half, "chunk") as q:
        o0 = imul(b, ob, lanes)
        top = iadd(b, imul(b, iadd(b, part.n0, j), gs[0]), imul(b, o0, gs[1]),
                   imul(b, iadd(b, ty, part.ty0), 2 * gs[2]), imul(b, q, half))
        rows = []
        for o in range(lanes):  # channel o's rows 2ty, 2ty + 1 at the chunk's columns
            at = iadd(b, top, o * gs[1])
            pair = [b.load(kb.pointer(b, gi, iadd(b, at, r * gs[2])), typ=row_vec, align=4)
                    for r in range(2)]
            rows.append(b.shuffle_vector(pair[0], pair[1], both))
        taps = square_transposed(b, rows)  # taps[r * half + x]: channels' gy at row r, column x
        first = iadd(b, imul(b, j, per_image), imul(b, ty, part.tw), imul(b, q, half // 2))
        for k in range(half // 2):  # the chunk's tiles
            d = [[taps[r * half + 2 * k + c] for c in range(2)] for r in range(2)]
            y = sandwich(b, dt, A, d)
            at = iadd(b, imul(b, iadd(b, first, k), co), o0)
            for xi in range(ALPHA * ALPHA):
                b.store(y[xi // ALPHA][xi % ALPHA], kb.pointer(b, yi, iadd(b, at, xi * y_step)),
                        align=4)
