"""conv_input_grad_lanes: the input gradient of few-channel convolutions without a GEMM call.

The im2col path computes cols = W^T @ gy per image ([C*kH*kW x O] @ [O x H_out*W_out]) by a
BLAS call, then adds the columns back into gx (col2im). Where O, the GEMM's inner size, is
small (LeNet-5's second layer: 6 -> 16 channels 5x5 on 14x14, K = 16) the call runs far
below the core's peak (~75% of that kernel's 362 us in OpenBLAS). Here, per image, a tile
of `rows` rows of cols (taps (c, i, j)) x all the image's output positions (vectors of
16, a binary remainder) is summed in registers over the O channels (each gy vector loaded
once a channel, the tile's weights broadcast), stored to a buffer in L1, and its rows are
added at once into the image's input gradient, each output row as vectors (stride 1, no
padding: every position of a row lands in the plane). Positions beyond MAX_VECTORS
vectors a tile are cut into chunks.

Called first by conv_direct.conv2d_input_grad (returns False: not this path's node). The
sums run over o in order by fused multiply-adds, then col2im adds the taps in (c, i, j)
order as the im2col path does: judged by distance from a float64 run.
"""

from __future__ import annotations

from llvmlite import ir

from graphc.backends.cpu import conv_few_channels, small_gemm
from graphc.backends.cpu.conv_threads import temporaries, units_loop
from graphc.backends.cpu.image_kernels import (
    called_kernel,
    contiguous_in,
    contiguous_out,
    image_kernel,
    image_strides,
)
from graphc.backends.cpu.values import F32, i64, loop
from graphc.types import float32

__all__ = ["ENABLED", "conv2d_input_grad"]

ENABLED = True  # off: im2col + GEMM (benchmarks.lenet_kernels' "before")
MAX_OUT_CHANNELS = 32  # the GEMM's inner size up to which this path serves
ACCUMULATORS = 24
MAX_VECTORS = 8  # position vectors a tile (at least 3 rows of taps a tile)


def _fits(g, dt) -> bool:
    return ENABLED and small_gemm.lanes() == 16 and dt is float32 and g.groups == 1 and \
        g.stride == (1, 1) and g.padding == (0, 0) and g.c <= conv_few_channels.MAX_CHANNELS \
        and g.o <= MAX_OUT_CHANNELS and \
        all(type(d) is int for d in (g.c, g.h, g.w, g.o, g.ho, g.wo)) and min(g.ho, g.wo) >= 1


def _vector(width: int):
    return F32 if width == 1 else ir.VectorType(F32, width)


def conv2d_input_grad(lw, node, g) -> bool:
    gy, w = node.inputs
    dt = gy.type.dtype
    if not _fits(g, dt):
        return False
    gl = contiguous_in(lw, lw.locs[gy])  # each channel's positions one contiguous run
    gs = image_strides(gl)
    wl = contiguous_in(lw, lw.locs[w])
    taps = g.c * g.kh * g.kw
    split, temps = temporaries(lw, dt, [(taps * g.p,)], g.n, g.n * g.o * taps * g.p)
    with contiguous_out(lw, lw.locs[node.outputs[0]]) as dst:
        kb, ids = image_kernel(lw, "conv2d_input_grad_lanes", [gl, wl, dst] + temps,
                               ("lanes", g.key(), split is not None))
        gi, wi, oi, ci = ids[:4]
        b = kb.begin()
        if b is None:
            lw.calls.append(called_kernel(lw, kb.kernel, split))
            return True
        pieces = conv_few_channels.pieces(g.p, 16)
        chunks = [pieces[k:k + MAX_VECTORS] for k in range(0, len(pieces), MAX_VECTORS)]
        with units_loop(b, kb, split, ids[-1], g.n, "n") as n:
            image = b.mul(n, i64(g.c * g.h * g.w))
            with loop(b, 0, g.c * g.h * g.w, "zero") as q:
                kb.store(b, oi, b.add(image, q), ir.Constant(F32, 0.0))
            first = 0
            for chunk in chunks:
                rows = min(taps, ACCUMULATORS // len(chunk))
                full, rest = divmod(taps, rows)
                if full:
                    with loop(b, 0, full, "trows") as k:
                        _tile(b, kb, g, (gi, wi, ci), gs, n, b.mul(k, i64(rows)), rows,
                              first, chunk)
                if rest:
                    _tile(b, kb, g, (gi, wi, ci), gs, n, i64(full * rows), rest, first, chunk)
                first += sum(chunk)
            with loop(b, 0, taps, "col2im") as row:
                _add_row(b, kb, g, ci, oi, image, row)
        lw.calls.append(called_kernel(lw, kb.finish(b), split))
    return True


def _tile(b, kb, g, operands, gs, n, row0, rows: int, first: int, chunk) -> None:
    """cols[row0 + r, first + positions of chunk] = sum over o of w[o, row0 + r] * gy[n, o,
    position], in registers, stored to the buffer cols (rows of H_out*W_out)."""
    gi, wi, ci = operands
    taps = g.c * g.kh * g.kw
    starts = [first + sum(chunk[:k]) for k in range(len(chunk))]
    with b.goto_entry_block():
        accs = [[b.alloca(_vector(p)) for p in chunk] for _ in range(rows)]
    for per_row in accs:
        for acc, p in zip(per_row, chunk):
            b.store(ir.Constant(_vector(p), 0.0 if p == 1 else [0.0] * p), acc)
    with loop(b, 0, g.o, "go") as o:
        plane = b.add(b.mul(n, i64(gs[0])), b.mul(o, i64(gs[1])))
        inputs = [b.load(kb.pointer(b, gi, b.add(plane, i64(s))), typ=_vector(p), align=4)
                  for s, p in zip(starts, chunk)]
        for r in range(rows):
            weight = kb.load(b, wi, b.add(b.mul(o, i64(taps)), b.add(row0, i64(r))))
            for acc, x, p in zip(accs[r], inputs, chunk):
                wv = conv_few_channels.splat(b, weight, _vector(p))
                b.store(conv_few_channels.fma(b, wv, x, b.load(acc)), acc)
    for r in range(rows):
        at = b.mul(b.add(row0, i64(r)), i64(g.p))
        for acc, s in zip(accs[r], starts):
            b.store(b.load(acc), kb.pointer(b, ci, b.add(at, i64(s))), align=4)


def _add_row(b, kb, g, ci, oi, image, row) -> None:
    """gx[c, oh + i*dH, j*dW + ow] += cols[row, oh*W_out + ow] for the tap row = (c, i, j)."""
    c = b.udiv(row, i64(g.kh * g.kw))
    i = b.urem(b.udiv(row, i64(g.kw)), i64(g.kh))
    j = b.urem(row, i64(g.kw))
    origin = b.add(image, b.add(b.mul(c, i64(g.h * g.w)),
                                b.add(b.mul(i, i64(g.dilation[0] * g.w)),
                                      b.mul(j, i64(g.dilation[1])))))
    src = b.mul(row, i64(g.p))
    pieces = conv_few_channels.pieces(g.wo, 16)
    with loop(b, 0, g.ho, "oh") as oh:
        to = b.add(origin, b.mul(oh, i64(g.w)))
        frm = b.add(src, b.mul(oh, i64(g.wo)))
        for k, p in enumerate(pieces):
            s = sum(pieces[:k])
            at = kb.pointer(b, oi, b.add(to, i64(s)))
            v = b.load(kb.pointer(b, ci, b.add(frm, i64(s))), typ=_vector(p), align=4)
            b.store(b.fadd(b.load(at, typ=_vector(p), align=4), v), at, align=4)
