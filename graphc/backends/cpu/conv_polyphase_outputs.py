"""conv_polyphase_outputs: the output transforms of the stride-2 polyphase kernels.

graphc.backends.cpu.conv_polyphase computes 25 transform-domain products M[xi] per block of
output blocks; this module turns them back into the result (moved out of conv_polyphase,
which had passed 560 lines):
- the forward (`_output_transform`): each output block's 2x2 values, the four phases'
  A^T M A added in phase order, the tile loop for large planes, LANES blocks a vector for
  planes of LANES blocks or a whole fraction (`_output_by_vectors`: whole planes stored as
  vectors); for conv2d_channel_sums also each image's and channel's shifted sums of the
  plane just written (graphc.backends.cpu.plane_sums), one channel behind in the tile loop
  (SUMS_BEHIND), from the stored vector where a plane is one (VECTOR_SUMS): neither waits
  on the stores just made;
- the input gradient (`_phases_out`): each phase of gx its own elements.
Every element is written once, by the same additions in the same order on any thread count.
"""

from __future__ import annotations

from llvmlite import ir

from graphc.backends.cpu.conv_blocks import block_images
from graphc.backends.cpu.conv_polyphase_filters import two_sided
from graphc.backends.cpu.image_kernels import iadd, imul
from graphc.backends.cpu.plane_sums import add_plane_sums, add_vector_sums
from graphc.backends.cpu.values import F32, I32, as_i64, i64, loop
from graphc.types import float32

__all__ = ["LANES", "SUMS_BEHIND", "VECTOR_SUMS", "concatenated", "output_by_pass"]

LANES = 16  # output blocks a vector holds (the input transform by rows, small planes' output)
# The tile loop's output transform (planes of more than LANES blocks: ResNet-18's 16x16
# outputs) adds a plane's batch-norm sums (conv2d_channel_sums: add_plane_sums) one channel
# behind, after the next one's stores, as winograd_transforms.SUMS_BEHIND does for the
# stride-1 kernels (the sums' loads then no longer wait on the stores just made). False:
# each plane's sums right after it (A/B runs).
SUMS_BEHIND = True
# Planes of LANES blocks or a fraction (8x8 and 4x4 outputs: a plane one vector, stored
# whole) take their sums from that vector (plane_sums.add_vector_sums: no loads, no wait on
# the store; one-behind there measured 4.32 -> 4.42 ms at 256 -> 512). False: add_plane_sums
# from memory right after the store (A/B runs). Both together, conv2d_channel_sums one-op,
# batch 32, 1 thread, 21 rounds (benchmarks/stride2_grads.py --kinds fwd sums --ab ...=False):
# 64 -> 128 4.61 -> 4.47 ms, 128 -> 256 3.93 -> 3.89, 256 -> 512 4.40 -> 4.34 (load 0.8);
# 5.18 -> 5.04, 4.70 -> 4.53, 5.69 -> 5.39 (load 7.5). The same output bits.
VECTOR_SUMS = True


def output_by_pass(b, kb, dt, images, mi, m_step, p, oi, ld, sums=None,
                   channels=None) -> None:
    """The pass's output transform of the images (n0, count): the input gradient's phases
    each to their own elements (_phases_out), the forward's phases summed (_output_transform,
    with the plane sums `sums`). `channels`: only the output's channels [lo, hi) (a forked
    kernel's share)."""
    if p.grad:
        _phases_out(b, kb, dt, images, mi, m_step, p, oi, ld, channels)
    else:
        _output_transform(b, kb, dt, p.phases, images, mi, m_step, p.m_ch, oi, p.out_hw, ld,
                          sums, channels)


def _phases_out(b, kb, dt, images, mi, m_step, p, oi, ld, channels=None) -> None:
    """gx[n0 + j, c] (NCHW, contiguous) of every block: each phase's A^T M A, 2x2 values of
    that phase's grid (rows 4ty + 2i + parity), so every element of gx is written once."""
    n0, count = images
    th, tw = p.tiles_hw
    out_h, out_w = p.out_hw
    with block_images(b, count) as j, loop(b, *(channels or (0, p.m_ch)), "c") as c:
        row_m = iadd(b, imul(b, c, ld), imul(b, j, th * tw))
        base = imul(b, iadd(b, imul(b, iadd(b, n0, j), p.m_ch), c), out_h * out_w)
        with loop(b, 0, th, "ty") as ty, loop(b, 0, tw, "tx") as tx:
            t = iadd(b, row_m, imul(b, ty, tw), tx)
            at = iadd(b, base, imul(b, ty, 4 * out_w), imul(b, tx, 4))
            xi = 0
            for rows_p, cols_p in p.phases:
                m = []
                for _ in rows_p[1]:
                    m.append([kb.load(b, mi, iadd(b, t, (xi + k) * m_step))
                              for k in range(len(cols_p[1]))])
                    xi += len(cols_p[1])
                y = two_sided(b, dt, rows_p[4], m, cols_p[4])
                pr, pc = (int(len(axis[1]) == 3) for axis in (rows_p, cols_p))  # odd: 1
                for r in range(2):
                    for s in range(2):
                        kb.store(b, oi, iadd(b, at, (2 * r + pr) * out_w + 2 * s + pc), y[r][s])


def _phase_sum(b, dt, phases, m_of):
    """The 2x2 outputs of one output block (IR values, or vectors of LANES blocks): the sum
    over the phases of A^T M A, in phase order; `m_of(xi)` loads M's position xi."""
    total, xi = None, 0
    for rows_p, cols_p in phases:
        m = []
        for _ in rows_p[1]:
            m.append([m_of(xi + k) for k in range(len(cols_p[1]))])
            xi += len(cols_p[1])
        y = two_sided(b, dt, rows_p[4], m, cols_p[4])
        total = y if total is None else \
            [[b.fadd(total[r][s], y[r][s]) for s in range(2)] for r in range(2)]
    return total


def _output_transform(b, kb, dt, phases, images, mi, m_step, co, oi, out_hw, ld, sums=None,
                      channels=None) -> None:
    """out[n0 + j, o] (NCHW, contiguous) of every output block: the sum over the phases of
    A^T M A, in phase order (`_phase_sum`); planes of LANES blocks or a whole fraction of it
    by `_output_by_vectors`. `sums` (a kernel argument's id, or None): each plane's shifted
    sums added right after it is written (add_plane_sums)."""
    n0, count = images
    th, tw = out_hw[0] // 2, out_hw[1] // 2
    if LANES % (th * tw) == 0 and ld % LANES == 0:
        return _output_by_vectors(b, kb, phases, images, mi, m_step, co, oi, out_hw, ld, sums,
                                  channels)
    plane = out_hw[0] * out_hw[1]
    lo, hi = (as_i64(v) for v in (channels or (0, co)))
    behind = sums is not None and SUMS_BEHIND

    def plane_sums(b, j, o):  # plane (j, o), written by now
        base = imul(b, iadd(b, imul(b, iadd(b, n0, j), co), o), plane)
        add_plane_sums(b, kb, dt, oi, base, base, plane, sums, iadd(b, n0, j), o, co,
                       first=True)

    with block_images(b, count) as j:
        with loop(b, lo, hi, "co") as o:
            row_m = iadd(b, imul(b, o, ld), imul(b, j, th * tw))
            base = imul(b, iadd(b, imul(b, iadd(b, n0, j), co), o), plane)
            with loop(b, 0, th, "ty") as ty, loop(b, 0, tw, "tx") as tx:
                t = iadd(b, row_m, imul(b, ty, tw), tx)
                total = _phase_sum(b, dt, phases,
                                   lambda xi: kb.load(b, mi, iadd(b, t, xi * m_step)))
                at = iadd(b, base, imul(b, ty, 2 * out_hw[1]), imul(b, tx, 2))
                for r in range(2):
                    for s in range(2):
                        kb.store(b, oi, iadd(b, at, r * out_hw[1] + s), total[r][s])
            if behind:  # the previous channel's
                with b.if_then(b.icmp_signed(">", o, lo)):
                    plane_sums(b, j, b.sub(o, i64(1)))
            elif sums is not None:
                plane_sums(b, j, o)
        if behind:
            with b.if_then(b.icmp_signed(">", hi, lo)):
                plane_sums(b, j, b.sub(hi, i64(1)))


def _output_by_vectors(b, kb, phases, images, mi, m_step, co, oi, out_hw, ld, sums=None,
                       channels=None) -> None:
    """_output_transform for small planes (ResNet-18's 256 -> 512 layer: 4x4 outputs, 4
    blocks an image), LANES blocks at once: each position's LANES sums one vector load along
    M's row, the phases' sum on vectors, the 2x2 outputs of every block shuffled into whole
    output planes and stored as vectors (the same additions in the same order as the block
    loop, which LLVM leaves scalar at 2 blocks a row: 1.1 ms of the kernel's 9.8). `sums`:
    each plane's from the vector just stored (VECTOR_SUMS), else add_plane_sums."""
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
    by_vector = sums is not None and VECTOR_SUMS
    with loop(b, *(channels or (0, co)), "co") as o, loop(b, 0, ld // LANES, "tg") as group:
        at = iadd(b, imul(b, o, ld), imul(b, group, LANES))
        total = _phase_sum(b, float32, phases, lambda xi: b.load(
            kb.pointer(b, mi, iadd(b, at, xi * m_step)), typ=vec, align=4))
        every = concatenated(b, [total[0][0], total[0][1], total[1][0], total[1][1]])
        first = iadd(b, n0, imul(b, group, count))
        for k in range(count):
            mask = ir.Constant(ir.VectorType(I32, plane), order[k * plane:(k + 1) * plane])
            values = b.shuffle_vector(every, ir.Constant(every.type, ir.Undefined), mask)
            out_at = imul(b, iadd(b, imul(b, iadd(b, first, k), co), o), plane)
            b.store(values, kb.pointer(b, oi, out_at), align=4)
            if by_vector:
                add_vector_sums(b, kb, values, sums, iadd(b, first, k), o, co)
            elif sums is not None:
                add_plane_sums(b, kb, float32, oi, out_at, out_at, plane, sums,
                               iadd(b, first, k), o, co, first=True)


def concatenated(b, vectors: list):
    """One vector of the given equal-length vectors, in order (pairwise shuffles)."""
    while len(vectors) > 1:
        n = vectors[0].type.count
        both = ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n)))
        vectors = [b.shuffle_vector(vectors[i], vectors[i + 1], both)
                   for i in range(0, len(vectors), 2)]
    return vectors[0]
