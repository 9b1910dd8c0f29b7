"""conv_winograd: 3x3 stride-1 convolutions by Winograd's minimal filtering F(2x2, 3x3).

Called by graphc.backends.cpu.conv's forward, input-gradient and weight-gradient lowerings
before im2col; each function returns False when its node does not take this path.

A 3x3 correlation's 2x2 block of outputs needs 36 multiplications directly and 16 in
Winograd's form (Lavin & Gray 2015): with d the 4x4 input tile and g the 3x3 filter,
`y = A^T [(G g G^T) * (B^T d B)] A`. Over channels, the elementwise product becomes 16
independent GEMMs, one per transform-domain position xi:
`M[xi] (C_out x T) = U[xi] (C_out x C_in) @ V[xi] (C_in x T)` over the T tiles of a block of
images, so the GEMM work is 16/36 of im2col's (2.25x less).

The kernel, per block of images (BLOCK_TILES tiles or more per GEMM, see there; an image
with more tiles goes in parts of tile rows, so a block's V and M stay in cache; the parts
are one loop, not one copy of the code each: ResNet-18's 32x32 kernels 86k -> 29k
characters of IR, LLVM 0.17 -> 0.06 s CPU each, run time and results the same):
- filter transform (once per call): `U[xi][o][c] = (G w[o, c] G^T)[xi]` (the input
  gradient's flipped filter transposed, `U[xi][c][o]`, so its GEMMs read U as laid out;
  from WIDE_CHANNELS on without the generated GEMM, in the forward's layout, read through
  BLAS's transpose flag);
- input transform: each channel plane copied into a zero-padded plane (border zeroed once per
  kernel, so no tap needs a bounds test), every 4x4 tile at stride 2 to `V[xi][ci][t]`
  (planes of 16 tiles or fewer: 16 tiles a vector, winograd_transforms.planes_by_vectors;
  tile rows of 16 tiles or a whole fraction of it: 16 tiles a vector along tile rows,
  rows_by_vectors, with no padded plane);
- 16 GEMMs, then the output transform of every tile to its 2x2 outputs (NCHW). The 16
  are one call of a generated function (graphc.backends.cpu.winograd_gemm: register tiles,
  no packing, no per-call BLAS cost) where it takes the shape, float32, else 16 BLAS calls.
The transforms' IR is emitted by graphc.backends.cpu.winograd_transforms (the filters'
by winograd_filters). For
`conv2d_channel_sums` (graphc.backends.cpu.conv_channel_sums) the output transform also adds
each image's and channel's shifted sums of the rows it has just written, for the batch norm
after the convolution (graphc.passes.conv_channel_sums).
On more than one core the blocks are split over the threads (graphc.backends.cpu.
conv_threads): each thread its own padded plane, V and M; the filter transform runs once,
before the threads, as a kernel of its own (`_filter_kernel`, itself forked over the output
channels), and every thread reads U. A kernel whose batch is one block (512 channels at 4x4,
batch 32: nothing to split) forks its filter kernel and its 16 generated GEMMs instead, and
its input and output transforms over the channels, kernels of their own around it
(FORKED_TRANSFORMS, conv_threads.channel_kernel).

The input gradient of a stride-1 3x3 convolution with padding p <= 2 is the same correlation
of the output gradient, padded by 2 - p, with the flipped filter and the channels swapped
(`f[c, o] = w[o, c, ::-1, ::-1]`): the same kernel with another filter transform.

The weight gradient is the transpose of the forward: with Y = A gy A^T (A = AT^T) for
every 2x2 block of the output gradient and V the forward's input tiles,
`dU[xi] (C_out x C_in) = sum over tiles Y[xi] V[xi]^T`, 16 GEMMs per block of images (beta
0 for the first block and 1 after, so the batch sums inside the GEMMs), then `gw[o, c] =
G^T dU[., o, c] G`. Below WIDE_CHANNELS the GEMMs compute dU^T = V Y^T from a tile-major Y,
both operands as they lie (BLAS's NN form, faster on these small products), and dU stays
transposed; wider layers read V through BLAS's transpose flag (WEIGHT_GRAD_NN). The NN
form's 16 products go to winograd_gemm's function where it takes them (beta a call
argument), and its Y (output channels innermost) is made 16 channels a vector with the
taps transposed in registers (winograd_transforms.grad_tiles_by_channels; else the channel
loop, which LLVM vectorises by gathers across channel planes). Split over
the cores, each share sums its blocks into its own dU and a reduce kernel
(`_weight_out_kernel`, over the output channels) adds the shares' dU in share order before
the G^T . G transform.

The transforms (points 0, 1, -1, infinity) have coefficients 0, +-1 and 1/2, so they round
little: the forward and input gradient stay within 2x im2col + GEMM's distance from a float64
run (measured 0.8-1.6x on ResNet-18's layers; tests/test_cpu_conv_winograd.py checks it with
graphc.testing.assert_rounding_within). F(4x4, 3x3) (4x fewer multiplications) was measured
10-25x further from float64 than im2col. The weight gradient's error grows with the tiles
one GEMM sums: on ResNet-18's layers (batch 32, x after a ReLU; benchmarks/
winograd_weight_grad.py) blocks of WEIGHT_GRAD_TILES = 64 tiles were 1.25-1.44x eager's
distance from float64 (im2col: 1.0-1.8x), 128 tiles 1.3-2.35x (512 channels at 4x4 past
the 2x rule), 256 tiles up to 2.35x; summing the blocks pairwise instead of in order gained
nothing in a numpy prototype (0.9-1.8x either way), so the GEMMs accumulate with beta = 1.

Taken when: a 3x3 kernel, stride 1, dilation 1, groups 1, even output height and width,
at least MIN_CHANNELS input and output channels (below that the transforms cost more than
the GEMM saves), float32 or float64.
"""

from __future__ import annotations

from graphc.backends.cpu import conv_threads, kernels, winograd_gemm
from graphc.backends.cpu.conv_blocks import block_images, tile_blocks, walk_blocks
from graphc.backends.cpu.conv_im2col import NOTRANS, TRANS, Conv
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
from graphc.backends.cpu.values import as_i64, i64, loop
from graphc.backends.cpu.winograd_filters import (
    FILTER_VECTOR,
    filter_at,
    filter_transform,
    filters_by_vectors,
    store_filter_taps,
    streamed,
)
from graphc.backends.cpu.winograd_transforms import (
    ALPHA,
    AT,
    BT,
    GT,
    A,
    G,
    Tiles,
    grad_tiles_by_channels,
    grad_tiles_by_channels_apply,
    input_tiles,
    output_tiles,
    planes_by_vectors,
    planes_by_vectors_apply,
    rows_by_vectors_apply,
    sandwich,
    spaced,
)
from graphc.types import float32, float64

__all__ = ["conv2d", "conv2d_input_grad", "conv2d_weight_grad", "BT", "G", "AT"]

MIN_CHANNELS = 16
# Tiles per GEMM: images go in blocks of at least BLOCK_TILES tiles (ResNet-18 CIFAR's 4x4
# planes have 4 tiles an image; [512 x 512] @ [512 x 4] would run far below BLAS's speed), and
# no more than needed, so that a block's transformed tiles V and products M stay in cache:
# 64 tiles ran 7-20% faster than 256 on the 16x16 and 8x8 stages (1-thread CPU time). With
# WIDE_CHANNELS channels or more in and out together, a GEMM of 64 columns runs below BLAS's
# speed, and those take blocks of at least 2 * BLOCK_TILES (512 channels 4x4: 128 tiles
# equal to 256, 64 tiles 13% slower; 256 channels 8x8, batch 32: 128 tiles 5-8% faster
# than 64, forward and input gradient, two in-process A/B runs; 64 and 128 channels: equal).
BLOCK_TILES = 64
WIDE_CHANNELS = 512
# ... on the Zen 5 host (1 MB of L2) only from DOUBLED_BLOCKS channels in and out together
# (the 512-channel layers): 256 channels 8x8 in blocks of 64 tiles, not 128 (batch 32, 1
# thread, 15 alternated rounds, two runs, load 5-8, the same bits): input gradient 6.16,
# 6.25 -> 5.92, 5.97 and 5.54, 5.45 -> 5.28, 5.40 ms; forward 5.61, 5.49 -> 5.53, 5.53 and
# 5.44, 5.49 -> 5.37, 5.41. 512: the 256-channel layers doubled (A/B runs).
DOUBLED_BLOCKS = 1024
# A kernel whose batch is one block (not split over images) also forks its input transform
# over the input channels and its output transform (and sums) over the output channels, each
# a kernel of its own (conv_threads.channel_kernel), around its forked GEMMs: the same bits.
# False: both transforms in the kernel, on the calling thread (for A/B runs).
FORKED_TRANSFORMS = True
# The weight gradient's GEMMs sum over a block's tiles: WEIGHT_GRAD_TILES at least (not
# doubled for wide layers), since longer sums round further (see the module docstring).
WEIGHT_GRAD_TILES = 64
# Below WIDE_CHANNELS, the weight gradient's GEMMs compute dU[xi]^T (C_in x C_out) = V[xi] @
# Y[xi]^T with Y stored tile-major ([T x C_out]), so both operands are read as they lie (BLAS's
# NN form), and dU is kept transposed ([xi][c][o]). OpenBLAS ran the other form dU = Y @ V^T
# (V through the transpose flag, NT) at 71 against 112 GFLOP/s on [64 x 64] @ [64 x 64] (128:
# 94 against 109; 256: 117 against 126; 1 thread, CPU time); whole kernels (batch 32,
# benchmarks/winograd_weight_grad.py) 64 channels 13.4 -> 9.0 ms, 128: 10.3 -> 9.3, 256:
# 9.5 -> 9.4, but 512 channels at 4x4 11.3 -> 15.0 (so wide layers keep the NT form).
# False keeps the NT form everywhere (for A/B runs).
WEIGHT_GRAD_NN = True
# weight_out stores gw non-temporally where dU is large (winograd_filters.streamed: 512 x
# 512 channels, gw 9.4 MB, read next by the optimizer's update, after the rest of the
# backward). 1 thread, batch 32, 21 alternated rounds (benchmarks/resnet18_kernels.py --only
# switch --switch conv_winograd.STREAMED_GW --channels 512): the weight gradient 6.46 ->
# 6.24 ms. False: stored as any (A/B runs).
STREAMED_GW = True
# weight_out from the NN form's transposed dU walks a block of 16 output channels over all
# input channels (gw's 16 filters then 16 sequential streams of stores; winograd_filters.
# filters_by_vectors' `blocks_outer`) rather than each input channel over all blocks (16
# filters' stores 9 x C floats apart). 256 channels 8x8, batch 32, 1 thread (benchmarks/
# resnet18_kernels.py --only switch --switch conv_winograd.WEIGHT_OUT_BLOCKS, 15 and 25
# alternated rounds, load 5-6): the weight gradient 5.21 -> 5.05 and 5.13 -> 4.90 ms; 64
# and 128 channels within the noise. The same bits. False: the walk by input channels.
WEIGHT_OUT_BLOCKS = True


def _applies(g, dt, ci: int, co: int, out_hw) -> bool:
    return ((g.kh, g.kw) == (3, 3) and g.stride == (1, 1) and g.dilation == (1, 1)
            and g.groups == 1 and dt in (float32, float64) and min(ci, co) >= MIN_CHANNELS
            and out_hw[0] % 2 == 0 and out_hw[1] % 2 == 0 and g.n > 0)


def conv2d(lw, node, g, x, w, out, sums=None) -> bool:
    """out = conv2d(x, w) by F(2x2, 3x3), or False. `sums` (a Loc: float64 [N, 3, O],
    conv2d_channel_sums' second output): also each image's and channel's shifted sums of out,
    added by the output transform (winograd_transforms.add_plane_sums)."""
    dt = x.type.dtype
    if not _applies(g, dt, g.c, g.o, (g.ho, g.wo)):
        return False
    _winograd(lw, node, g, x, image_strides(x), w, out, flip=False, ci=g.c, co=g.o,
              in_hw=(g.h, g.w), out_hw=(g.ho, g.wo), pad=g.padding, sums=sums)
    return True


def conv2d_input_grad(lw, node, g) -> bool:
    """gx = the correlation of gy (padded by 2 - p) with the flipped, transposed filter."""
    gy, w = node.inputs
    dt = gy.type.dtype
    pad = (2 - g.padding[0], 2 - g.padding[1])
    if min(pad) < 0 or not _applies(g, dt, g.o, g.c, (g.h, g.w)):
        return False
    gl = lw.locs[gy]
    _winograd(lw, node, g, gl, image_strides(gl), lw.locs[w], lw.locs[node.outputs[0]],
              flip=True, ci=g.o, co=g.c, in_hw=(g.ho, g.wo), out_hw=(g.h, g.w), pad=pad)
    return True


def _winograd(lw, node, g, src, ss, w, out, flip, ci, co, in_hw, out_hw, pad,
              sums=None) -> None:
    """out (co x out_hw per image) = the 3x3 correlation of src (ci x in_hw per image,
    element strides `ss`, zero-padded by `pad`) with f[co, ci] (w, or w flipped and
    transposed); `sums`: see conv2d."""
    cv = Conv(lw, node, g, src.type.dtype)
    dt = cv.dt
    w = contiguous_in(lw, w)
    th, tw = out_hw[0] // 2, out_hw[1] // 2
    tiles = th * tw
    hp, wp = out_hw[0] + 2, out_hw[1] + 2
    want = BLOCK_TILES * (2 if ci + co >= DOUBLED_BLOCKS else 1)
    nb, _ = tile_blocks(g.n, tiles, want)
    # an image with more tiles than a block wants goes in parts of `rows` tile rows
    rows = th if nb > 1 or tiles < 2 * want else max(1, want // tw)
    full_parts, tail_rows = divmod(th, rows)
    t_max = nb * rows * tw
    nxi = ALPHA * ALPHA
    with contiguous_out(lw, out) as dst:
        u_step = spaced(co * ci)
        # split over the cores: each share its own padded plane, V and M; U made once
        shapes = [(hp * wp,), (nxi, spaced(ci * t_max)), (nxi, spaced(co * t_max))]
        units = -(-g.n // nb) if type(g.n) is int else None
        macs = g.n * co * ci * 9 * out_hw[0] * out_hw[1] if units else None
        split = plan_split(lw, dt, shapes, units, macs, shared=[(nxi, u_step)])
        temps = workspace(lw, dt, (nxi, u_step), *shapes) if split is None else \
            split.shared + split.locs
        # the sums (if any) after the temporaries, the split's control last (ids[-1])
        locs = [src, w, dst] + temps + ([] if sums is None else [sums]) + \
            ([] if split is None else [split.control])
        sums_i = None if sums is None else 3 + len(temps)
        recipe = (g.key(), flip, ci, co, in_hw, out_hw, pad) + \
            (() if sums is None else ("sums",))
        # not split over images: the filter transform, where a fork pays (512 channels: 16 MB
        # of U), in a forked kernel of its own called first, as a split kernel's prelude is
        alone = split is None and kernels.forks(lw.openmp, nxi * co * ci)
        # ... and its input and output transforms too, over the channels (conv_threads.
        # channel_kernel), where the batch is one block of one part and a second thread can
        # take a share (on one, the transforms stay inside: no V or M through memory)
        whole = Tiles(0, g.n, 0, th, tw, g.n * tiles)
        by_channels = alone and FORKED_TRANSFORMS and lw.most_threads() > 1 and \
            type(g.n) is int and nb >= g.n and \
            rows == th and (planes_by_vectors_apply(dt, whole, ss, in_hw) or
                            rows_by_vectors_apply(dt, whole, ss, in_hw))
        kb, ids = image_kernel(lw, "conv2d_winograd", locs, recipe + (split is not None,
                                                                    alone, by_channels))
        si, wi, oi, ui, pi, vi, mi = ids[:7]
        # the input gradient's U stored transposed (see filter_transform)
        transposed = flip and (max(ci, co) < WIDE_CHANNELS or
                               (dt is float32 and winograd_gemm.available()))
        prelude = None if split is None and not alone else \
            _filter_kernel(lw, locs, recipe, u_step, g, flip, transposed)
        if alone:
            lw.calls.append(prelude)
        v_step, m_step = spaced(ci * whole.ld), spaced(co * whole.ld)
        if by_channels:
            lw.calls.append(conv_threads.channel_kernel(
                lw, "conv2d_winograd_input", locs, recipe, ci, nxi * ci * whole.ld,
                lambda b, kb, ids, part: input_tiles(b, kb, dt, whole, ids[0], ss, ci, in_hw,
                                                     pad, ids[4], wp, ids[5], v_step, part)))
            out_kernel = conv_threads.channel_kernel(
                lw, "conv2d_winograd_output", locs, recipe, co, nxi * co * whole.ld,
                lambda b, kb, ids, part: output_tiles(b, kb, dt, whole, ids[6], m_step, co,
                                                      ids[2], out_hw, sums_i, part))
        b = kb.begin()
        if b is None:  # built before for a node of the same geometry
            lw.calls.append(called_kernel(lw, kb.kernel, split, prelude=prelude))
            if by_channels:
                lw.calls.append(out_kernel)
            return
        with loop(b, 0, hp * wp, "zero") as q:
            kb.store(b, pi, q, const(dt, 0.0))
        if prelude is None:
            filter_transform(b, kb, dt, wi, ui, u_step, g, flip, transposed)

        def part(b, n0, count, ty0, nrows):
            """Tile rows [ty0, ty0 + nrows) of images n0 .. n0 + count - 1 (ty0 an int, or
            a loop's value: the parts of an image are one loop, not one copy each)."""
            per_image = nrows * tw
            ld = count * per_image
            v_step, m_step = spaced(ci * ld), spaced(co * ld)
            if not by_channels:  # else in a kernel of its own, before
                input_tiles(b, kb, dt, Tiles(n0, count, ty0, nrows, tw, ld), si, ss, ci,
                            in_hw, pad, pi, wp, vi, v_step)
            # M[xi] (co x T) = U[xi] (co x ci, or its transpose) @ V[xi] (ci x T)
            trans_u = flip and not transposed
            fast = None if trans_u else \
                _block_gemm(dt, co, ld, ci, (ci, 1), ld, ld, (u_step, v_step, m_step))
            if fast is not None:  # a kernel not split over images forks the 16 GEMMs
                forked = split is None and kernels.forks(  # (ResNet-18's 512 channels)
                    lw.openmp, kernels.gemm_work(winograd_gemm.POSITIONS, co, ld, ci))
                _call_block_gemm(lw, b, kb, fast, (ui, vi, mi), const(dt, 0.0), forked)
            for xi in range(nxi if fast is None else 0):
                cv.gemm(b, kb, TRANS if trans_u else NOTRANS, NOTRANS, co, ld, ci,
                        ui, xi * u_step, co if trans_u else ci,
                        vi, xi * v_step, ld, 0.0, mi, xi * m_step, ld)
            if not by_channels:  # else in a kernel of its own, after
                output_tiles(b, kb, dt, Tiles(n0, count, ty0, nrows, tw, ld), mi, m_step, co,
                             oi, out_hw, sums_i)

        def block(b, n0, count):
            _over_parts(b, part, n0, count, rows, full_parts, tail_rows)

        walk_blocks(b, kb, g, nb, split, ids[-1], block)
        lw.calls.append(called_kernel(lw, kb.finish(b), split, prelude=prelude))
        if by_channels:
            lw.calls.append(out_kernel)


def _over_parts(b, part, n0, count, rows: int, full_parts: int, tail_rows: int) -> None:
    """`part(b, n0, count, first_row, rows)` over a block's parts of tile rows: the full
    parts (one straight call where there is one, else a loop), then the shorter last."""
    if full_parts == 1:
        part(b, n0, count, 0, rows)
    elif full_parts:
        with loop(b, 0, full_parts, "part") as k:
            part(b, n0, count, b.mul(k, i64(rows)), rows)
    if tail_rows:
        part(b, n0, count, full_parts * rows, tail_rows)


def conv2d_weight_grad(lw, node, g) -> bool:
    """gw = G^T dU G with dU[xi] = sum over tiles of Y[xi] V[xi]^T (see the module
    docstring), or False."""
    gy, x = node.inputs
    dt = x.type.dtype
    if not _applies(g, dt, g.c, g.o, (g.ho, g.wo)):
        return False
    cv = Conv(lw, node, g, dt)
    xl, gl = lw.locs[x], lw.locs[gy]
    xs, gs = image_strides(xl), image_strides(gl)
    ci, co, in_hw, out_hw, pad = g.c, g.o, (g.h, g.w), (g.ho, g.wo), g.padding
    th, tw = out_hw[0] // 2, out_hw[1] // 2
    tiles = th * tw
    hp, wp = out_hw[0] + 2, out_hw[1] + 2
    want = WEIGHT_GRAD_TILES
    nb, _ = tile_blocks(g.n, tiles, want)
    rows = th if nb > 1 or tiles < 2 * want else max(1, want // tw)
    full_parts, tail_rows = divmod(th, rows)
    t_max = nb * rows * tw
    nxi = ALPHA * ALPHA
    u_step = spaced(co * ci)
    with contiguous_out(lw, lw.locs[node.outputs[0]]) as dst:
        # split: each share sums its blocks into its own dU; the reduce kernel adds them
        shapes = [(nxi, u_step), (hp * wp,), (nxi, spaced(ci * t_max)),
                  (nxi, spaced(co * t_max))]
        units = -(-g.n // nb) if type(g.n) is int else None
        macs = g.n * co * ci * 9 * out_hw[0] * out_hw[1] if units else None
        split = plan_split(lw, dt, shapes, units, macs, rows=co)
        temps = workspace(lw, dt, *shapes) if split is None else split.locs + [split.control]
        locs = [gl, xl, dst] + temps
        nn = WEIGHT_GRAD_NN and max(ci, co) < WIDE_CHANNELS
        recipe = (g.key(), ci, co, in_hw, out_hw, pad, nn,
                  None if split is None else (split.shares, split.copy_bytes))
        kb, ids = image_kernel(lw, "conv2d_winograd_weight_grad", locs, recipe)
        gi, si, oi, ui, pi, vi, yi = ids[:7]
        reduce = None if split is None else _weight_out_kernel(lw, locs, recipe, split, co,
                                                               ci, u_step, nn)
        b = kb.begin()
        if b is None:  # built before for a node of the same geometry
            lw.calls.append(called_kernel(lw, kb.kernel, split, reduce=reduce))
            return True
        with loop(b, 0, hp * wp, "zero") as q:
            kb.store(b, pi, q, const(dt, 0.0))
        start = 0 if split is None else \
            b.mul(conv_threads.unit_range(b, kb, ids[-1])[0], i64(nb))

        def part(b, n0, count, ty0, nrows):
            """Tile rows [ty0, ty0 + nrows) of images n0 .. n0 + count - 1 into dU."""
            per_image = nrows * tw
            ld = count * per_image
            v_step, y_step = spaced(ci * ld), spaced(co * ld)
            input_tiles(b, kb, dt, Tiles(n0, count, ty0, nrows, tw, ld), si, xs, ci, in_hw,
                         pad, pi, wp, vi, v_step)
            def y_tile(b, j, o, ty, tx):  # Y = A gy A^T of one 2x2 block
                at = iadd(b, imul(b, iadd(b, n0, j), gs[0]), imul(b, o, gs[1]),
                          imul(b, iadd(b, ty, ty0), 2 * gs[2]), imul(b, tx, 2 * gs[3]))
                d = [[kb.load(b, gi, iadd(b, at, r * gs[2] + c * gs[3])) for c in range(2)]
                     for r in range(2)]
                y = sandwich(b, dt, A, d)
                t = iadd(b, imul(b, j, per_image), imul(b, ty, tw), tx)
                t = iadd(b, imul(b, t, co), o) if nn else iadd(b, imul(b, o, ld), t)
                for xi in range(nxi):
                    kb.store(b, yi, iadd(b, t, xi * y_step), y[xi // ALPHA][xi % ALPHA])

            gy_part = Tiles(n0, count, ty0, nrows, tw, ld)
            if not nn and planes_by_vectors_apply(dt, gy_part, gs, out_hw):  # Y[xi][o][t]
                planes_by_vectors(b, kb, dt, gy_part, gi, gs, co, out_hw, (0, 0), yi, y_step, A)
            elif nn and grad_tiles_by_channels_apply(dt, gy_part, gs, out_hw, co):
                grad_tiles_by_channels(b, kb, dt, gy_part, gi, gs, co, yi, y_step)
            else:
                with block_images(b, count) as j:  # stores along Y's rows: o inner when nn
                    if nn:
                        with loop(b, 0, nrows, "ty") as ty, loop(b, 0, tw, "tx") as tx, \
                                loop(b, 0, co, "co") as o:
                            y_tile(b, j, o, ty, tx)
                    else:
                        with loop(b, 0, co, "co") as o, loop(b, 0, nrows, "ty") as ty, \
                                loop(b, 0, tw, "tx") as tx:
                            y_tile(b, j, o, ty, tx)
            beta = _accumulate(b, dt, n0, start, ty0)
            # dU[xi]^T (ci x co) (+)= V[xi] (ci x T) @ Y[xi] (T x co), one call for the 16
            fast = None if not nn else _block_gemm(dt, ci, co, ld, (ld, 1), co, co,
                                                   (v_step, y_step, u_step), accumulates=True)
            if fast is not None:
                _call_block_gemm(lw, b, kb, fast, (vi, yi, ui), beta)
            for xi in range(nxi if fast is None else 0):
                if nn:  # dU[xi]^T (ci x co) (+)= V[xi] (ci x T) @ Y[xi] (T x co)
                    cv.gemm(b, kb, NOTRANS, NOTRANS, ci, co, ld, vi, xi * v_step, ld,
                            yi, xi * y_step, co, beta, ui, xi * u_step, co)
                else:  # dU[xi] (co x ci) (+)= Y[xi] (co x T) @ V[xi]^T
                    cv.gemm(b, kb, NOTRANS, TRANS, co, ci, ld, yi, xi * y_step, ld,
                            vi, xi * v_step, ld, beta, ui, xi * u_step, ci)

        def block(b, n0, count):
            _over_parts(b, part, n0, count, rows, full_parts, tail_rows)

        walk_blocks(b, kb, g, nb, split, ids[-1], block)
        if split is None:
            weight_out(b, kb, dt, ui, u_step, oi, (i64(0), i64(co)), ci, co, nn)
        lw.calls.append(called_kernel(lw, kb.finish(b), split, reduce=reduce))
    return True


def _block_gemm(dt, m, n, k, a_strides, ldb, ldc, steps, accumulates=False):
    """The generated function (graphc.backends.cpu.winograd_gemm) for a block's 16 products
    c[xi] (m x n) (+)= a[xi] (m x k, element strides `a_strides`) @ b[xi] (k x n, rows ldb
    apart), c's rows ldc apart, the matrices `steps` (a, b, c) apart; None where the 16 BLAS
    calls stay."""
    if dt is not float32:
        return None
    return winograd_gemm.plan(m, n, k, *a_strides, ldb, ldc, *steps, accumulates)


def _call_block_gemm(lw, b, kb, gemm, operands, beta, forked: bool = False) -> None:
    """One call of `gemm` on the kernel operands (a, b, c) from their first matrix
    (`forked`: its 16 products over the cores, winograd_gemm.function)."""
    fn = winograd_gemm.function(lw.module, gemm, forked)
    b.call(fn, [kb.pointer(b, k, i64(0)) for k in operands] + [beta])


def _accumulate(b, dt, n0, start, ty0):
    """The GEMMs' beta: 0 for the first part of the kernel's (or share's) first block, which
    writes dU, 1 for the rest, which add to it."""
    zero, one = const(dt, 0.0), const(dt, 1.0)
    if all(isinstance(v, int) for v in (n0, start, ty0)):
        return zero if (n0, ty0) == (start, 0) else one
    first = b.and_(b.icmp_signed("==", as_i64(n0), as_i64(start)),
                   b.icmp_signed("==", as_i64(ty0), i64(0)))
    return b.select(first, zero, one)


def _weight_out_kernel(lw, locs, recipe, split, co, ci, u_step, nn):
    """The reduce kernel of a split weight gradient: over its rows (output channels)
    [rows_lo, rows_hi), share 0's dU += the other shares' (in share order), then gw. `nn`:
    dU is transposed ([xi][c][o], WEIGHT_GRAD_NN)."""
    dt = locs[0].type.dtype
    kb, ids = image_kernel(lw, "conv2d_winograd_weight_out", locs, recipe)
    b = kb.begin()
    if b is None:
        return kb.kernel
    ui, ctrl = ids[3], ids[-1]
    o_range = conv_threads.unit_range(b, kb, ctrl, conv_threads.ROWS_LO)
    copy = split.copy_bytes // dt.itemsize
    with loop(b, 1, kb.load(b, ctrl, i64(conv_threads.SHARES)), "share") as s:
        frm = b.mul(s, i64(copy))
        with loop(b, 0, ALPHA * ALPHA, "xi") as xi:
            outer, inner = ((0, ci), o_range) if nn else (o_range, (0, ci))
            with loop(b, *outer, "u") as u:
                row = iadd(b, imul(b, xi, u_step), imul(b, u, co if nn else ci))
                with loop(b, *inner, "v") as v:
                    at = b.add(row, v)
                    total = b.fadd(kb.load(b, ui, at), kb.load(b, ui, b.add(frm, at)))
                    kb.store(b, ui, at, total)
    weight_out(b, kb, dt, ui, u_step, ids[2], o_range, ci, co, nn)
    return kb.finish(b)


def weight_out(b, kb, dt, ui, u_step, oi, o_range, ci, co, nn) -> None:
    """gw[o, c] = G^T dU[., o, c] G (3x3 from the 16 transform-domain sums) for the output
    channels o in `o_range`. `nn`: dU stored transposed, at [xi][c][o], walked in squares of
    winograd_filters.OUT_SQUARE channels so that neither its reads nor gw's writes stride
    over the whole matrix (512 x 512 channels, c inner: 16 streams 2 KiB apart per step; the
    whole kernel took 22 ms, 15 ms in squares). float32 filters FILTER_LANES a vector where
    they can (winograd_filters.filters_by_vectors: along dU's rows, each filter's 9 taps one
    store after a transpose in registers): the 512-channel weight gradient 7.0 -> 5.4 ms.
    A large gw is stored non-temporally (STREAMED_GW), drained before the kernel goes on;
    from a transposed dU, a block of output channels at a time (WEIGHT_OUT_BLOCKS)."""
    def sums(b, o, c, vector: bool = False):  # filter (o, c)'s 16 sums, or FILTER_LANES'
        du = filter_at(b, co, ci, o, c, nn)
        at = [[iadd(b, du, (r * ALPHA + s) * u_step) for s in range(ALPHA)] for r in range(ALPHA)]
        if vector:
            return [[b.load(kb.pointer(b, ui, p), typ=FILTER_VECTOR, align=4) for p in row]
                    for row in at]
        return [[kb.load(b, ui, p) for p in row] for row in at]

    def one(b, o, c):
        w = sandwich(b, dt, GT, sums(b, o, c))
        base = imul(b, iadd(b, imul(b, o, ci), c), 9)
        for r in range(3):
            for s in range(3):
                kb.store(b, oi, iadd(b, base, r * 3 + s), w[r][s])

    stream = STREAMED_GW and streamed(dt, co, ci)

    def vector(b, o, c):
        w = sandwich(b, dt, GT, sums(b, o, c, vector=True))
        store_filter_taps(b, kb, oi, ci, o, c, nn, [v for row in w for v in row],
                          streaming=stream)

    filters_by_vectors(b, dt, o_range, ci, nn, one, vector, blocks_outer=WEIGHT_OUT_BLOCKS)
    if stream:
        kb.drain(b)


def _filter_kernel(lw, locs, recipe, u_step, g, flip, transposed):
    """The filter transform as a kernel of its own (on the Winograd kernel's locs), run once
    before a split kernel's shares (or before a kernel not split); forked over w's output
    channels where large enough (kernels.forks: 16 x O x C elements written)."""
    kb, ids = image_kernel(lw, "conv2d_winograd_filter", locs, recipe)
    b = kb.begin(parallel=True, work=ALPHA * ALPHA * g.o * g.c)
    if b is None:
        return kb.kernel
    filter_transform(b, kb, locs[0].type.dtype, ids[1], ids[3], u_step, g, flip, transposed,
                     kb.outer_range(b, g.o))
    return kb.finish(b)
