"""conv_winograd_wide_grad: the Winograd weight gradient of wide layers on small planes.

conv_winograd's weight gradient (F(2x2, 3x3): `dU[xi] = sum over tiles Y[xi] V[xi]^T`,
then `gw[o, c] = G^T dU[., o, c] G`) runs ResNet-18's 512 x 512 layer (4x4 planes: 4 tiles
an image) as blocks of 64 tiles, 16 BLAS calls each reading V through the transpose flag and
adding into a 1 MB dU[xi]: 10.6-10.9 ms a call at batch 32 (1 thread), its GEMMs at 113
GFLOP/s where the same products alone run at 150. Its NN form (dU^T = V Y^T) lost the gain
in the last transform: `G^T dU G` from a transposed dU walks [xi][c][o] against gw's
[o][c][3][3] and took 3.8-7.4 ms instead of 1.1 (docs/performance.md, "512-channel weight
gradient, eleventh session").

This kernel computes dU in gw's own order from a *tile-major* V:
- `Vt[xi][t][c] = (B^T d B)[xi]` for every tile t of a block's images (the input transform
  written along the channels, each image's tiles unrolled: planes of at most
  MAX_IMAGE_TILES tiles; CHANNEL_VECTORS: 16 channels a vector, their whole planes
  transposed in registers; VT_PANELS: stored in panels of 64 channels, so that the GEMM's
  block of Vt does not crowd a few of L1's sets);
- `Y[xi][o][t] = (A gy A^T)[xi]` as conv_winograd's NT form lays it out;
- `dU[xi] (co x ci) (+)= Y[xi] (co x T) @ Vt[xi] (T x ci)`: one call of winograd_gemm's
  generated function for the 16 products, blocks of BLOCK_TILES tiles (k summed in
  chains of winograd_gemm.K_BLOCK = 64, each chain added to dU in order: the same sums as
  conv_winograd's 64-tile blocks with beta 1, so the same distance from float64);
- `gw = G^T dU G` by conv_winograd.weight_out, rows of dU as they lie, in a kernel of its
  own forked over the output channels;
- or, where the batch is one block (PANELS), both a panel of PANEL_CHANNELS output
  channels at a time in one kernel: the panel's products into a window of the workspace
  that stays in L2, transformed to gw right away, so dU (16.8 MB at 512 x 512) is never
  written to memory and read back, at the price of reading Vt (4 MB) once a panel (the
  512-channel weight gradient, batch 32, 1 thread: ~0.35 ms of ~6.9 a call).
On more than one core the 16 products go over the threads (8 positions a thread on two,
each thread the only writer of its dU[xi]: no private copies of dU, no reduce kernel) and
the last transform over the output channels; with PANELS the panels go over the threads,
each share in a window of its own. Where the batch is one block (ResNet-18's
512 x 512 layer at batch 32: nothing to split over images) the transforms before the GEMMs
fork too, each in a kernel of its own called first (conv_threads.channel_kernel,
FORKED_TRANSFORMS): Vt's over the input channels (vectors of CHANNEL_LANES channels a unit),
Y's over the output channels; each channel computed by the same code, so the same bits on any
thread count. Else they stay on the calling thread (~0.5 ms of ~9.7 at 512 channels).

Taken when (else conv_winograd's path): WIDE_GRAD, float32, a host where winograd_gemm
serves, 3x3 stride 1, dilation 1, groups 1, even output planes of at most
MAX_IMAGE_TILES tiles, conv_winograd.MIN_CHANNELS or more channels in and out, and
WIDE_CHANNELS or more in or out; the input channels a whole number of
vectors (winograd_gemm.plan).
"""

from __future__ import annotations

from llvmlite import ir

from graphc.backends.cpu import (
    conv_threads,
    conv_winograd,
    kernels,
    winograd_gemm,
    winograd_transforms,
)
from graphc.backends.cpu.conv_blocks import block_images, over_blocks
from graphc.backends.cpu.conv_workspace import workspace
from graphc.backends.cpu.image_kernels import (
    contiguous_out,
    iadd,
    image_kernel,
    image_strides,
    imul,
)
from graphc.backends.cpu.scalars import const
from graphc.backends.cpu.values import F32, as_i64, i64, loop, square_transposed
from graphc.backends.cpu.winograd_transforms import (
    ALPHA,
    BT,
    A,
    Tiles,
    planes_by_vectors,
    planes_by_vectors_apply,
    sandwich,
    spaced,
)
from graphc.types import float32

__all__ = ["BLOCK_TILES", "FORKED_TRANSFORMS", "MAX_IMAGE_TILES", "PANELS", "PANEL_CHANNELS",
           "WIDE_CHANNELS", "WIDE_GRAD", "conv2d_weight_grad"]

WIDE_GRAD = True  # False: conv_winograd's NT form through the BLAS (A/B runs)
# Tiles a block's GEMMs sum: two of winograd_gemm's K_BLOCK chains, so dU[xi] is read and
# written once per 128 tiles instead of once per 64 (512 x 512 channels at batch 32: one
# block). Longer chains would round further (conv_winograd, WEIGHT_GRAD_TILES).
BLOCK_TILES = 128
MAX_IMAGE_TILES = 16  # an image's tiles are unrolled in the input transform
# Channels in or out from which this kernel takes the weight gradient: ResNet-18's 512 x 512
# layer (4x4 planes), where conv_winograd's NT form ran its GEMMs at 113 GFLOP/s. Narrower
# layers keep conv_winograd's NN form (transposed dU, 16 x 16 squares in the last transform),
# which measured faster than the NT form there.
WIDE_CHANNELS = 512
# Vt's transform CHANNEL_LANES channels a vector, whole planes transposed in registers
# (_input_tiles_by_channel_vectors; 512 channels at 4x4, batch 32: the kernel 10.81 -> 10.12
# ms), and Vt stored in panels of winograd_gemm.PANEL_COLUMNS channels (Vt's rows of 512
# floats put the GEMM's block of b in 8 of L1's 64 sets: 10.38 -> 9.71 ms). False: channel
# by channel, rows of ci (A/B runs).
CHANNEL_VECTORS = True
VT_PANELS = True
# A batch of one block with forked GEMMs: Vt's transform forked over the input channels and
# Y's over the output channels, each a kernel of its own before the GEMMs' (the same bits).
# False: both inside the GEMMs' kernel, on the calling thread (A/B runs: benchmarks.
# step_threads --ab wide_grad_forks).
FORKED_TRANSFORMS = True
# A batch of one block: dU computed and transformed to gw a panel of PANEL_CHANNELS output
# channels at a time (_panels_kernel), the panel's 16 x PANEL_CHANNELS x ci sums kept in one
# window of the workspace that every panel reuses (512 KB at 16 x 512: in L2), so the
# 16.8 MB dU is never written to memory and read back; Vt (4 MB at 512 x 128 tiles) is
# read once a panel. On more than one core the panels go over the threads (each its own
# window). False: the 16 products of the whole dU, then weight_out's kernel (A/B runs).
PANELS = True
PANEL_CHANNELS = 16
# With PANELS, Y's transform too a panel at a time, right before the panel's products, into
# a window of its own (16 x PANEL_CHANNELS x tiles: 128 KB at 128 tiles), so Y (4 MB at 512
# channels) is not written to memory and read back either; on more than one core inside the
# panels' shares (no kernel of its own). False: Y of all output channels first (A/B runs).
PANEL_Y = True
# The panels' windows lie at the start of the room the whole dU and Y take without PANELS,
# so the module's convolution workspace (the arena) keeps its size: with windows only
# (a smaller arena) the step's *other* convolutions measured slower once
# (conv2d_channel_sums +7 ms, conv2d_input_grad +2.7; graphc.profile, 5 alternated rounds,
# load 3-4), with the same room not (the kernels 266.7 -> 262.9 ms); one run each, so
# maybe noise, but keeping the arena's size costs nothing.


def conv2d_weight_grad(lw, node, g) -> bool:
    """gw of a wide 3x3 stride-1 convolution on small planes (see the module docstring), or
    False."""
    gy, x = node.inputs
    dt = x.type.dtype
    ci, co, out_hw = g.c, g.o, (g.ho, g.wo)
    if not (WIDE_GRAD and dt is float32 and winograd_gemm.available()
            and all(type(d) is int for d in (ci, co, g.h, g.w, g.ho, g.wo))
            and (g.kh, g.kw) == (3, 3) and g.stride == (1, 1) and g.dilation == (1, 1)
            and g.groups == 1 and min(ci, co) >= conv_winograd.MIN_CHANNELS
            and max(ci, co) >= WIDE_CHANNELS
            and out_hw[0] % 2 == 0 and out_hw[1] % 2 == 0):
        return False
    th, tw = out_hw[0] // 2, out_hw[1] // 2
    tiles = th * tw
    if tiles > MAX_IMAGE_TILES:
        return False
    nb = max(1, BLOCK_TILES // tiles)
    nb = nb if type(g.n) is not int else min(g.n, nb)
    t_max = nb * tiles
    nxi = ALPHA * ALPHA
    u_step = spaced(co * ci)
    if _gemm(co, ci, t_max, u_step) is None:
        return False
    xl, gl = lw.locs[x], lw.locs[gy]
    xs, gs = image_strides(xl), image_strides(gl)
    in_hw, pad = (g.h, g.w), g.padding
    forked = kernels.forks(lw.openmp, kernels.gemm_work(nxi, co, ci, t_max))
    # a batch of one block: nothing to split over images, so the transforms fork over the
    # channels, in kernels of their own called before the GEMMs' kernel (more than one
    # thread only: on one they stay inside it)
    one_block = type(g.n) is int and nb >= g.n
    by_channels = forked and FORKED_TRANSFORMS and lw.most_threads() > 1 and one_block
    panel = PANEL_CHANNELS if PANELS and one_block and co % PANEL_CHANNELS == 0 else 0
    panel_y = bool(panel) and PANEL_Y
    du, y = nxi * u_step, nxi * spaced(co * t_max)
    if panel:  # windows of a panel (one a thread's share) in the whole dU's (and Y's) room
        slots = co // panel if by_channels else 1
        u_step = spaced(panel * ci)
        du = max(du, slots * nxi * u_step)  # (see PANEL_Y: the arena keeps its size)
        y = max(y, slots * nxi * spaced(panel * t_max)) if panel_y else y
    with contiguous_out(lw, lw.locs[node.outputs[0]]) as dst:
        temps = workspace(lw, dt, (du,), (nxi, spaced(ci * t_max)), (y,))
        locs = [gl, xl, dst] + temps
        recipe = (g.key(), ci, co, in_hw, out_hw, pad, forked, by_channels, panel, panel_y)
        whole = Tiles(0, g.n, 0, th, tw, t_max)
        if by_channels:
            transforms = _transform_kernels(lw, locs, recipe, dt, whole, (xs, gs), ci, co,
                                            in_hw, out_hw, pad)
            lw.calls.extend(transforms[:1] if panel_y else transforms)
        if panel:
            lw.calls.append(_panels_kernel(lw, locs, recipe, dt, whole, (xs, gs), g, panel,
                                           by_channels, panel_y))
            return True
        kb, ids = image_kernel(lw, "conv2d_winograd_wide_weight_grad", locs, recipe)
        gi, si, _, ui, vi, yi = ids
        b = kb.begin()
        if b is not None:
            def block(b, n0, count):
                ld = count * tiles
                v_step, y_step = spaced(ci * ld), spaced(co * ld)
                part = Tiles(n0, count, 0, th, tw, ld)
                gemm = _gemm(co, ci, ld, u_step)
                if not by_channels:  # else in kernels of their own, called before
                    _input_transform(b, kb, dt, part, si, xs, ci, in_hw, pad, vi, v_step,
                                     gemm.b_panel != 0)
                    _output_grad_tiles(b, kb, dt, part, gi, gs, co, out_hw, yi, y_step)
                fn = winograd_gemm.function(lw.module, gemm, forked)
                beta = _first_or_add(b, dt, n0)
                b.call(fn, [kb.pointer(b, k, i64(0)) for k in (yi, vi, ui)] + [beta])

            over_blocks(b, g.n, nb, block)
        lw.calls.append(kb.kernel if b is None else kb.finish(b))
        lw.calls.append(_weight_out_kernel(lw, locs, recipe, g, u_step))
    return True


def _panels_kernel(lw, locs, recipe, dt, whole: Tiles, strides, g, panel: int,
                   by_channels: bool, panel_y: bool):
    """A one-block batch's dU and gw by panels of `panel` output channels (PANELS): the
    panel's 16 products `dU[xi][o0 : o0 + panel] = Y[xi][o0 : o0 + panel] @ Vt[xi]` (rows
    of dU ci apart, the 16 matrices spaced(panel * ci) apart) into the share's window of
    the workspace, then conv_winograd.weight_out on those output channels. With
    `by_channels` (the transforms ran before, in kernels of their own) forked over the
    panels, each share's window at its first panel's place; else the transforms first,
    then every panel, on the calling thread. Each dU element is the same two chains of
    K_BLOCK tiles as the whole products', in the same order: the same bits. `panel_y`
    (PANEL_Y): the panel's Y computed first, into a window of its own."""
    xs, gs = strides
    ci, co, nxi = g.c, g.o, ALPHA * ALPHA
    u_step = spaced(panel * ci)
    y_step = spaced(panel * whole.ld) if panel_y else spaced(co * whole.ld)
    gemm = _gemm(co, ci, whole.ld, u_step, panel, y_step)
    kb, ids = image_kernel(lw, "conv2d_winograd_wide_weight_grad", locs, recipe)
    gi, si, oi, ui, vi, yi = ids
    b = kb.begin(parallel=by_channels, work=kernels.gemm_work(nxi, co, ci, whole.ld))
    if b is None:
        return kb.kernel
    if not by_channels:
        _input_transform(b, kb, dt, whole, si, xs, ci, (g.h, g.w), g.padding, vi,
                         spaced(ci * whole.ld), gemm.b_panel != 0)
    if not (by_channels or panel_y):
        _output_grad_tiles(b, kb, dt, whole, gi, gs, co, (g.ho, g.wo), yi, y_step)
    lo, hi = kb.outer_range(b, co // panel)
    window = imul(b, lo, nxi * u_step)  # the share's windows: its first panel's place
    y_window = imul(b, lo, nxi * y_step) if panel_y else None
    fn = winograd_gemm.function(lw.module, gemm)
    with loop(b, lo, hi, "panel") as p:
        o0 = imul(b, p, panel)
        channels = (o0, iadd(b, o0, panel))
        if panel_y:
            y_at = y_window
            _output_grad_tiles(b, _Shifted(kb, yi, b.sub(y_window, imul(b, o0, whole.ld))),
                               dt, whole, gi, gs, co, (g.ho, g.wo), yi, y_step, channels)
        else:
            y_at = imul(b, o0, whole.ld)
        b.call(fn, [kb.pointer(b, yi, y_at), kb.pointer(b, vi, i64(0)),
                    kb.pointer(b, ui, window), const(dt, 0.0)])
        in_window = _Shifted(kb, ui, b.sub(window, imul(b, o0, ci)))
        conv_winograd.weight_out(b, in_window, dt, ui, u_step, oi, channels, ci, co, False)
    return kb.finish(b)


class _Shifted:
    """A kernel builder whose operand `k` is addressed `shift` elements further on: a
    panel's window, which holds only the panel's rows, addressed by code that indexes by
    output channel (conv_winograd.weight_out's dU[xi][o][c], _output_grad_tiles' Y[xi][o][t])."""

    def __init__(self, kb, k: int, shift) -> None:
        self._kb, self._k, self._shift = kb, k, shift

    def __getattr__(self, name):
        return getattr(self._kb, name)

    def _at(self, b, k: int, offset):
        return iadd(b, offset, self._shift) if k == self._k else offset

    def pointer(self, b, k: int, offset):
        return self._kb.pointer(b, k, self._at(b, k, offset))

    def load(self, b, k: int, offset):
        return self._kb.load(b, k, self._at(b, k, offset))

    def store(self, b, k: int, offset, value, streaming: bool = False) -> None:
        self._kb.store(b, k, self._at(b, k, offset), value, streaming)


def _transform_kernels(lw, locs, recipe, dt, whole: Tiles, strides, ci, co, in_hw, out_hw,
                       pad) -> list:
    """The two transforms of a one-block batch `whole` as kernels of their own on `locs`
    (conv_threads.channel_kernel): Vt's forked over the input channels (units of
    CHANNEL_LANES channels where the vector form serves), Y's over the output channels.
    `strides`: x's and gy's element strides."""
    xs, gs = strides
    nxi = ALPHA * ALPHA
    v_step, y_step = spaced(ci * whole.ld), spaced(co * whole.ld)
    panels = _gemm(co, ci, whole.ld, spaced(co * ci)).b_panel != 0
    lanes = winograd_transforms.CHANNEL_LANES if _channel_vectors_apply(dt, xs, ci, in_hw) \
        else 1

    def input_share(b, kb, ids, units):
        _input_transform(b, kb, dt, whole, ids[1], xs, ci, in_hw, pad, ids[4], v_step,
                         panels, units)

    def output_share(b, kb, ids, channels):
        _output_grad_tiles(b, kb, dt, whole, ids[0], gs, co, out_hw, ids[5], y_step,
                           channels)

    return [conv_threads.channel_kernel(lw, "conv2d_winograd_wide_input", locs, recipe,
                                        ci // lanes, nxi * ci * whole.ld, input_share),
            conv_threads.channel_kernel(lw, "conv2d_winograd_wide_output_grad", locs, recipe,
                                        co, nxi * co * whole.ld, output_share)]


def _input_transform(b, kb, dt, part: Tiles, si, xs, ci, in_hw, pad, vi, v_step,
                     panels: bool, units=None) -> None:
    """Vt of the part: CHANNEL_LANES channels a vector where that serves, else channel by
    channel. `units`: only [lo, hi) of the loop's units (vectors of channels, or channels;
    a forked kernel's share)."""
    if _channel_vectors_apply(dt, xs, ci, in_hw):
        _input_tiles_by_channel_vectors(b, kb, dt, part, si, xs, ci, in_hw, pad, vi, v_step,
                                        panels, units)
    else:
        _input_tiles_by_channel(b, kb, dt, part, si, xs, ci, in_hw, pad, vi, v_step, panels,
                                units)


def _gemm(co: int, ci: int, ld: int, u_step: int, rows: int | None = None,
          y_step: int | None = None):
    """winograd_gemm's plan for a block of `ld` tiles: dU[xi] (co x ci) (+)= Y[xi] (co x
    ld, rows ld apart) @ Vt[xi] (ld x ci), Vt panel by panel where VT_PANELS; `rows`: only
    that many of dU's rows (a panel of output channels, _panels_kernel), Y's matrices
    `y_step` apart (default spaced(co * ld))."""
    width = winograd_gemm.PANEL_COLUMNS
    m, y_step = rows or co, y_step or spaced(co * ld)
    if VT_PANELS and ci % width == 0:
        return winograd_gemm.plan(m, ci, ld, ld, 1, width, ci, y_step, spaced(ci * ld),
                                  u_step, accumulates=True, max_c=co * ci,
                                  b_panel=ld * width)
    return winograd_gemm.plan(m, ci, ld, ld, 1, ci, ci, y_step, spaced(ci * ld), u_step,
                              accumulates=True, max_c=co * ci)


def _first_or_add(b, dt, n0):
    """The GEMMs' beta: 0 for the kernel's first block (it writes dU), 1 after."""
    zero, one = const(dt, 0.0), const(dt, 1.0)
    if isinstance(n0, int):
        return zero if n0 == 0 else one
    return b.select(b.icmp_signed("==", as_i64(n0), i64(0)), zero, one)


def _input_tiles_by_channel(b, kb, dt, part: Tiles, si, ss, ci, in_hw, pad, vi,
                            v_step, panels: bool = False, channels=None) -> None:
    """Vt[xi][t][c] = (B^T d B)[xi] for every 4x4 tile d (at stride 2, zero-padded by
    `pad`) of the part's images, channels innermost so the stores run along Vt's rows; an
    image's tiles unrolled, so which taps fall in the padding is known here (a zero, as
    the padded plane of winograd_transforms.input_tiles gives: the same sums). `channels`:
    only c in [lo, hi) (a forked kernel's share)."""
    tiles = part.nrows * part.tw
    with block_images(b, part.count) as j, loop(b, *(channels or (0, ci)), "ci") as c:
        plane = iadd(b, imul(b, iadd(b, part.n0, j), ss[0]), imul(b, c, ss[1]))
        pixels = {}

        def tap(row, col):
            if not (0 <= row < in_hw[0] and 0 <= col < in_hw[1]):
                return const(dt, 0.0)
            if (row, col) not in pixels:
                pixels[row, col] = kb.load(b, si, iadd(b, plane, row * ss[2] + col * ss[3]))
            return pixels[row, col]

        for t in range(tiles):
            ty, tx = divmod(t, part.tw)
            d = [[tap(2 * ty + r - pad[0], 2 * tx + s - pad[1]) for s in range(ALPHA)]
                 for r in range(ALPHA)]
            v = sandwich(b, dt, BT, d)
            at = _vt_at(b, part, iadd(b, imul(b, j, tiles), t), c, ci, panels)
            for xi in range(ALPHA * ALPHA):
                kb.store(b, vi, iadd(b, at, xi * v_step), v[xi // ALPHA][xi % ALPHA])


def _vt_at(b, part: Tiles, tile, c, ci: int, panels: bool):
    """Where Vt[0][tile][c] lies: rows of ci channels, or with `panels`, winograd_gemm.
    PANEL_COLUMNS channels of every tile, then the next panel's."""
    if not panels:
        return iadd(b, imul(b, tile, ci), c)
    width = winograd_gemm.PANEL_COLUMNS
    return iadd(b, imul(b, b.udiv(c, i64(width)), part.ld * width), imul(b, tile, width),
                b.urem(c, i64(width)))


def _channel_vectors_apply(dt, ss, ci: int, in_hw) -> bool:
    """Whether _input_tiles_by_channel_vectors serves: float32, whole vectors of input
    channels, each channel's plane contiguous and of at most CHANNEL_LANES elements."""
    lanes = winograd_transforms.CHANNEL_LANES
    return (CHANNEL_VECTORS and dt is float32 and ci % lanes == 0 and ss[3] == 1
            and ss[2] == in_hw[1] and in_hw[0] * in_hw[1] <= lanes)


def _input_tiles_by_channel_vectors(b, kb, dt, part: Tiles, si, ss, ci, in_hw, pad, vi,
                                    v_step, panels: bool, vectors=None) -> None:
    """_input_tiles_by_channel for CHANNEL_LANES channels at once: each channel's whole
    plane loaded as one vector, the CHANNEL_LANES planes transposed in registers
    (values.square_transposed) into one vector of channels per pixel, B^T d B on
    those vectors (a padded tap a zero vector), and each tile's 16 sums stored along Vt's
    row. The same additions in the same order per element (bit for bit), no scalar loads
    or stores. `vectors`: only the vectors of channels [lo, hi) (a forked kernel's share)."""
    lanes = winograd_transforms.CHANNEL_LANES
    pixels = in_hw[0] * in_hw[1]
    tiles = part.nrows * part.tw
    zero = ir.Constant(ir.VectorType(F32, lanes), [0.0] * lanes)
    widen = ir.Constant(ir.VectorType(ir.IntType(32), lanes),
                        list(range(pixels)) + [pixels] * (lanes - pixels))
    with block_images(b, part.count) as j, \
            loop(b, *(vectors or (0, ci // lanes)), "cb") as cb:
        c0 = imul(b, cb, lanes)
        first = iadd(b, imul(b, iadd(b, part.n0, j), ss[0]), imul(b, c0, ss[1]))
        planes = []
        for o in range(lanes):
            plane = b.load(kb.pointer(b, si, iadd(b, first, o * ss[1])),
                           typ=ir.VectorType(F32, pixels), align=4)
            if pixels < lanes:
                plane = b.shuffle_vector(plane, ir.Constant(plane.type, [0.0] * pixels),
                                         widen)
            planes.append(plane)
        pix = square_transposed(b, planes)  # pix[p]: the channels' pixel p

        def tap(row, col):
            inside = 0 <= row < in_hw[0] and 0 <= col < in_hw[1]
            return pix[row * in_hw[1] + col] if inside else zero

        for t in range(tiles):
            ty, tx = divmod(t, part.tw)
            d = [[tap(2 * ty + r - pad[0], 2 * tx + s - pad[1]) for s in range(ALPHA)]
                 for r in range(ALPHA)]
            v = sandwich(b, dt, BT, d)
            at = _vt_at(b, part, iadd(b, imul(b, j, tiles), t), c0, ci, panels)
            for xi in range(ALPHA * ALPHA):
                b.store(v[xi // ALPHA][xi % ALPHA],
                        kb.pointer(b, vi, iadd(b, at, xi * v_step)), align=4)


def _output_grad_tiles(b, kb, dt, part: Tiles, gi, gs, co, out_hw, yi, y_step,
                       channels=None) -> None:
    """Y[xi][o][t] = (A gy A^T)[xi] for every 2x2 block of the part's output gradient:
    planes_by_vectors where it serves (4 images of 4x4 planes a vector), else block by
    block. `channels`: only o in [lo, hi) (a forked kernel's share)."""
    if planes_by_vectors_apply(dt, part, gs, out_hw):
        return planes_by_vectors(b, kb, dt, part, gi, gs, co, out_hw, (0, 0), yi, y_step, A,
                                 channels)
    tiles = part.nrows * part.tw
    with block_images(b, part.count) as j, loop(b, *(channels or (0, co)), "co") as o:
        plane = iadd(b, imul(b, iadd(b, part.n0, j), gs[0]), imul(b, o, gs[1]))
        row = iadd(b, imul(b, o, part.ld), imul(b, j, tiles))
        for t in range(tiles):
            ty, tx = divmod(t, part.tw)
            at = iadd(b, plane, 2 * ty * gs[2] + 2 * tx * gs[3])
            d = [[kb.load(b, gi, iadd(b, at, r * gs[2] + s * gs[3])) for s in range(2)]
                 for r in range(2)]
            y = sandwich(b, dt, A, d)
            for xi in range(ALPHA * ALPHA):
                kb.store(b, yi, iadd(b, row, t + xi * y_step), y[xi // ALPHA][xi % ALPHA])


def _weight_out_kernel(lw, locs, recipe, g, u_step):
    """gw = G^T dU G (conv_winograd.weight_out, dU in [xi][o][c]) as a kernel of its own,
    forked over the output channels where large enough."""
    kb, ids = image_kernel(lw, "conv2d_winograd_wide_weight_out", locs, recipe)
    b = kb.begin(parallel=True, work=ALPHA * ALPHA * g.o * g.c)
    if b is None:
        return kb.kernel
    conv_winograd.weight_out(b, kb, locs[0].type.dtype, ids[3], u_step, ids[2],
                             kb.outer_range(b, g.o), g.c, g.o, False)
    return kb.finish(b)
