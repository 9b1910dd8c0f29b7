"""conv_direct: convolutions lowered as direct loops, without im2col or a GEMM.

Called first by graphc.backends.cpu.conv's three convolution lowerings; each function returns
False when its node does not take a direct path (conv then uses im2col + GEMM).

- **Depthwise** (groups == C_in == C_out, MobileNet's): a GEMM per channel would have one row
  and K = kH*kW. Instead, per image and channel, the plane is copied into a zero-padded plane
  in the conv workspace (its border zeroed once per kernel), so no tap needs a bounds test,
  and every output sums all its taps in registers (`_correlate`, the inner loop over output
  columns vectorised). Forward: any stride and dilation. Input gradient (stride 1, padding
  at most (k-1)*dilation): the correlation of the output gradient, zero-padded by
  (k-1)*dilation - padding, with the flipped kernel; at other strides each tap adds
  w * gy into a zero-padded plane whose interior is the gradient.
  Weight gradient: per channel, every tap's sum of gy * padded input over the batch in one
  pass (reassociable sums, which LLVM vectorises into partial sums).

- **Few rows** (fewer than FEW_ROWS output channels per group, at most MAX_DIRECT_TAPS taps:
  LeNet-5's first layer, depthwise with a channel multiplier): the same loops, forward and
  weight gradient, per group over its C/groups padded planes (the input gradient keeps
  im2col + GEMM).

On more than one core the image loop (the output-channel loop of the weight gradient: each
channel's gradient is one thread's, no partial sums) is split over the threads, each with
its own padded planes (graphc.backends.cpu.conv_threads).

Convolutions with C_in <= 8 at stride 1 (ResNet's stem, LeNet's first layer) go to
graphc.backends.cpu.conv_few_channels (forward) and conv_few_channels_grad (weight
gradient) instead, whose explicit vector tiles (several output channels sharing each input
load) run 1.8-2.5x faster than these loops or im2col + GEMM; these loops, vectorised by
LLVM one output channel at a time, ran at 52 GFLOP/s there against 70 for im2col + GEMM.
The few-rows loops still serve groups, strides and C_in > 8. The input gradient of other
convolutions with C_in <= 8 and at most 32 output channels (stride 1, no padding: LeNet-5's
second layer) is graphc.backends.cpu.conv_input_grad_lanes' (called from here, first).

Sums run in tap order (c, i, j), not in numpy's order: results are judged by distance from
a float64 run (docs/performance.md, "Rounding"; tests/test_cpu_conv_paths.py).
"""

from __future__ import annotations

from contextlib import contextmanager

from graphc.backends.cpu import conv_input_grad_lanes
from graphc.backends.cpu.conv_im2col import grad_image
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
from graphc.backends.cpu.scalars import const
from graphc.backends.cpu.values import i64, loop
from graphc.types import float32, float64


def _depthwise(g, dt) -> bool:
    return g.groups == g.c == g.o and g.groups > 1 and dt in (float32, float64)


# Few output channels per group: a GEMM with fewer rows than this runs far below BLAS's speed
# (LeNet-5's first layer, [6 x 25] @ [25 x 784] per image, ran at ~20 GFLOP/s), so such
# convolutions, with at most MAX_DIRECT_TAPS taps per output (summed in registers), take the
# direct loops too, forward and weight gradient.
FEW_ROWS = 16
MAX_DIRECT_TAPS = 64


def _few_rows(g, dt) -> bool:
    return (g.og < FEW_ROWS and g.cg * g.kh * g.kw <= MAX_DIRECT_TAPS
            and dt in (float32, float64))


def _fma(b, acc, x, y):
    """acc + x*y, contractible into one fused multiply-add."""
    m = b.fmul(x, y)
    m.flags.append("contract")
    r = b.fadd(acc, m)
    r.flags.append("contract")
    return r


def conv2d(lw, node, g, x, w, out) -> bool:
    dt = x.type.dtype
    if _depthwise(g, dt) or _few_rows(g, dt):
        _grouped_forward(lw, g, x, w, out, dt)
        return True
    return False


@contextmanager
def _count(b, n: int, name: str):
    """`for i in range(n)`, no loop for n == 1 (depthwise: one channel a group)."""
    if n == 1:
        yield 0
    else:
        with loop(b, 0, n, name) as i:
            yield i


def _pad_plane(b, kb, src, base, strides, hw, dst, wp, top, left, dst_base=0) -> None:
    """dst[dst_base + (r + top)*wp + left + q] = src[base + r*strides[0] + q*strides[1]] (the
    border of dst, zeroed once per kernel, stays zero)."""
    with loop(b, 0, hw[0], "pr") as r:
        row = iadd(b, base, imul(b, r, strides[0]))
        at = iadd(b, dst_base, imul(b, r, wp), top * wp + left)
        with loop(b, 0, hw[1], "pq") as q:
            kb.store(b, dst, b.add(at, q), kb.load(b, src, iadd(b, row, imul(b, q, strides[1]))))


def _zero(b, kb, op, count, dt) -> None:
    with loop(b, 0, count, "zero") as q:
        kb.store(b, op, q, const(dt, 0.0))


def _taps(g, flip=False):
    """(weight index, row offset in taps of the padded plane, column offset) per tap."""
    (dh, dw) = g.dilation
    out = []
    for i in range(g.kh):
        for j in range(g.kw):
            ii, jj = (g.kh - 1 - i, g.kw - 1 - j) if flip else (i, j)
            out.append((i * g.kw + j, ii * dh, jj * dw))
    return out


def _correlate(b, kb, g, plane, wp, weights, taps, rows, cols, stride, store) -> None:
    """store(b, r, q, sum over taps of weight * plane[(r*sh + di)*wp + q*sw + dj]) for every
    output position (r, q) of a rows x cols plane, the taps summed in registers."""
    sh, sw = stride
    with loop(b, 0, rows, "r") as r:
        with loop(b, 0, cols, "q") as q:
            at = iadd(b, imul(b, r, sh * wp), imul(b, q, sw))
            acc = None
            for wv, (_, di, dj) in zip(weights, taps):
                v = kb.load(b, plane, iadd(b, at, di * wp + dj))
                acc = b.fmul(wv, v) if acc is None else _fma(b, acc, wv, v)
            store(b, r, q, acc)


def _grouped_forward(lw, g, x, w, out, dt) -> None:
    """Per image and group: the group's C/groups input planes copied into zero-padded planes,
    then each of its O/groups outputs sums all C/groups * kH * kW taps in registers. At
    stride 1 the sums run over rows of the padded width (one flat loop that vectorises
    whatever W_out is; the columns past W_out are dropped when the rows are copied out, and
    the last taps read into the zeroed slack after the planes) where that pays (see `flat`)."""
    xs = image_strides(x)
    w = contiguous_in(lw, w)
    (ph, pw) = g.padding
    hp, wp = g.h + 2 * ph, g.w + 2 * pw
    # flat where it paid (1-thread CPU time): planes narrower than 8 (depthwise 7x7: 368 ->
    # 331 us) and many taps on widths not a multiple of 8 (LeNet's 28 wide, 25 taps: 451 ->
    # 297 us); no gain was measured for depthwise 3x3 on 14x14, which keeps the rows
    flat = g.stride == (1, 1) and (g.wo < 8 or (g.wo % 8 != 0 and g.cg * g.kh * g.kw >= 16))
    slack = (g.kw - 1) * g.dilation[1] if flat else 0
    shapes = [(g.cg * hp * wp + slack,)] + ([(g.ho * wp,)] if flat else [])
    split, temps = temporaries(lw, dt, shapes, g.n, g.n * g.o * g.cg * g.kh * g.kw * g.p)
    # a tap of channel c reads the padded plane c rows of hp further down
    taps = [(c * g.kh * g.kw + t, c * hp + di, dj) for c in range(g.cg) for t, di, dj in _taps(g)]
    name = "conv2d_depthwise" if _depthwise(g, dt) else "conv2d_direct"
    with contiguous_out(lw, out) as dst:
        kb, ids = image_kernel(lw, name, [x, w, dst] + temps,
                               ("forward", g.key(), split is not None))
        xi, wi, oi, pi = ids[:4]
        b = kb.begin()
        if b is None:  # built before for a node of the same geometry
            return lw.calls.append(called_kernel(lw, kb.kernel, split))
        _zero(b, kb, pi, g.cg * hp * wp + slack, dt)
        with units_loop(b, kb, split, ids[-1], g.n, "n") as n, \
                loop(b, 0, g.groups, "grp") as grp:
            with _count(b, g.cg, "pc") as c:
                ch = iadd(b, imul(b, grp, g.cg), c)
                _pad_plane(b, kb, xi, iadd(b, imul(b, n, xs[0]), imul(b, ch, xs[1])),
                           xs[2:], (g.h, g.w), pi, wp, ph, pw, imul(b, c, hp * wp))
            with _count(b, g.og, "o") as oo:
                o = iadd(b, imul(b, grp, g.og), oo)
                weights = [kb.load(b, wi, iadd(b, imul(b, o, len(taps)), t))
                           for t, _, _ in taps]
                plane = imul(b, iadd(b, imul(b, n, g.o), o), g.p)
                if flat:
                    _correlate_rows(b, kb, pi, wp, weights, taps, g.ho * wp, ids[4])
                    with loop(b, 0, g.ho, "r") as r:
                        to = iadd(b, plane, imul(b, r, g.wo))
                        frm = imul(b, r, wp)
                        with loop(b, 0, g.wo, "q") as q:
                            kb.store(b, oi, b.add(to, q), kb.load(b, ids[4], b.add(frm, q)))
                else:
                    def store(b, r, q, v, plane=plane):
                        kb.store(b, oi, iadd(b, plane, imul(b, r, g.wo), q), v)

                    _correlate(b, kb, g, pi, wp, weights, taps, g.ho, g.wo, g.stride, store)
        lw.calls.append(called_kernel(lw, kb.finish(b), split))


def _correlate_rows(b, kb, plane, wp, weights, taps, count, dst) -> None:
    """dst[q] = sum over taps of weight * plane[q + di*wp + dj] for q < count (stride 1)."""
    with loop(b, 0, count, "p") as q:
        acc = None
        for wv, (_, di, dj) in zip(weights, taps):
            v = kb.load(b, plane, iadd(b, q, di * wp + dj))
            acc = b.fmul(wv, v) if acc is None else _fma(b, acc, wv, v)
        kb.store(b, dst, q, acc)


def conv2d_input_grad(lw, node, g) -> bool:
    """Depthwise, stride 1, padding at most the kernel's reach: gx is the correlation of the
    output gradient, zero-padded by (k-1)*d - pad, with the flipped kernel."""
    gy, w = node.inputs
    dt = gy.type.dtype
    (dh, dw), (ph, pw) = g.dilation, g.padding
    top, left = (g.kh - 1) * dh - ph, (g.kw - 1) * dw - pw
    if not _depthwise(g, dt):  # few channels: conv_input_grad_lanes, else im2col + GEMM
        return conv_input_grad_lanes.conv2d_input_grad(lw, node, g)
    if not (g.stride == (1, 1) and top >= 0 and left >= 0):
        _depthwise_input_grad_scatter(lw, node, g, dt)
        return True
    gl, gs = grad_image(lw, lw.locs[gy], g)
    wl = contiguous_in(lw, lw.locs[w])
    hg, wg = g.h + (g.kh - 1) * dh, g.w + (g.kw - 1) * dw
    split, temps = temporaries(lw, dt, [(hg, wg)], g.n, g.n * g.c * g.kh * g.kw * g.h * g.w)
    taps = _taps(g, flip=True)
    with contiguous_out(lw, lw.locs[node.outputs[0]]) as dst:
        kb, ids = image_kernel(lw, "conv2d_depthwise_input_grad", [gl, wl, dst] + temps,
                               ("correlate", g.key(), split is not None))
        gi, wi, oi, pi = ids[:4]
        b = kb.begin()
        if b is None:
            lw.calls.append(called_kernel(lw, kb.kernel, split))
            return True
        _zero(b, kb, pi, hg * wg, dt)
        with units_loop(b, kb, split, ids[-1], g.n, "n") as n, loop(b, 0, g.c, "c") as c:
            _pad_plane(b, kb, gi, iadd(b, imul(b, n, gs[0]), imul(b, c, gs[1])),
                       gs[2:], (g.ho, g.wo), pi, wg, top, left)
            weights = [kb.load(b, wi, iadd(b, imul(b, c, g.kh * g.kw), t)) for t, _, _ in taps]
            plane = imul(b, iadd(b, imul(b, n, g.c), c), g.h * g.w)

            def store(b, r, q, v):
                kb.store(b, oi, iadd(b, plane, imul(b, r, g.w), q), v)

            _correlate(b, kb, g, pi, wg, weights, taps, g.h, g.w, (1, 1), store)
        lw.calls.append(called_kernel(lw, kb.finish(b), split))
    return True


def _depthwise_input_grad_scatter(lw, node, g, dt) -> None:
    """Depthwise input gradient at any stride: per channel, every tap adds w * gy into a
    zero-padded plane (no bounds tests, constant trip counts), whose interior is then gx."""
    gy, w = node.inputs
    gl, gs = grad_image(lw, lw.locs[gy], g)
    wl = contiguous_in(lw, lw.locs[w])
    (sh, sw), (ph, pw) = g.stride, g.padding
    hp, wp = g.h + 2 * ph, g.w + 2 * pw
    split, temps = temporaries(lw, dt, [(hp, wp)], g.n, g.n * g.c * g.kh * g.kw * g.p)
    with contiguous_out(lw, lw.locs[node.outputs[0]]) as dst:
        kb, ids = image_kernel(lw, "conv2d_depthwise_input_grad", [gl, wl, dst] + temps,
                               ("scatter", g.key(), split is not None))
        gi, wi, oi, pi = ids[:4]
        b = kb.begin()
        if b is None:
            return lw.calls.append(called_kernel(lw, kb.kernel, split))
        with units_loop(b, kb, split, ids[-1], g.n, "n") as n, loop(b, 0, g.c, "c") as c:
            _zero(b, kb, pi, hp * wp, dt)
            src = iadd(b, imul(b, n, gs[0]), imul(b, c, gs[1]))
            for t, di, dj in _taps(g):
                wv = kb.load(b, wi, iadd(b, imul(b, c, g.kh * g.kw), t))
                with loop(b, 0, g.ho, "r") as r:
                    row = iadd(b, imul(b, r, sh * wp), di * wp + dj)
                    gy_row = iadd(b, src, imul(b, r, gs[2]))
                    with loop(b, 0, g.wo, "q") as q:
                        at = iadd(b, row, imul(b, q, sw))
                        v = kb.load(b, gi, iadd(b, gy_row, imul(b, q, gs[3])))
                        kb.store(b, pi, at, _fma(b, kb.load(b, pi, at), wv, v))
            plane = imul(b, iadd(b, imul(b, n, g.c), c), g.h * g.w)
            with loop(b, 0, g.h, "ih") as ih:
                to = iadd(b, plane, imul(b, ih, g.w))
                frm = iadd(b, imul(b, ih, wp), ph * wp + pw)
                with loop(b, 0, g.w, "iw") as iw:
                    kb.store(b, oi, b.add(to, iw), kb.load(b, pi, b.add(frm, iw)))
        lw.calls.append(called_kernel(lw, kb.finish(b), split))


def conv2d_weight_grad(lw, node, g) -> bool:
    """Depthwise or few rows: per (output channel, input channel of its group), every tap's
    sum over the batch's output positions of gy * the padded input, all taps in one pass
    (reassociable sums)."""
    gy, x = node.inputs
    dt = x.type.dtype
    if not (_depthwise(g, dt) or _few_rows(g, dt)):
        return False
    gl, gs = grad_image(lw, lw.locs[gy], g)
    xl = lw.locs[x]
    xs = image_strides(xl)
    (ph, pw), (sh, sw) = g.padding, g.stride
    hp, wp = g.h + 2 * ph, g.w + 2 * pw
    # stride 1: the output gradient goes into rows of width Wp too (zeros past Wo), so the
    # whole plane is one flat loop over p' = r*Wp + q (one long sum per tap, not one per row);
    # taps then read up to (kW-1)*dW past the padded plane, into its zeroed slack
    flat = g.stride == (1, 1)
    slack = (g.kw - 1) * g.dilation[1] if flat else 0
    shapes = [(hp * wp + slack,)] + ([(g.ho * wp,)] if flat else [])
    # split over the output channels: each share writes its own rows of the gradient
    split, temps = temporaries(lw, dt, shapes, g.o, g.n * g.o * g.cg * g.kh * g.kw * g.p)
    taps = _taps(g)
    with contiguous_out(lw, lw.locs[node.outputs[0]]) as dst:
        name = "conv2d_depthwise_weight_grad" if _depthwise(g, dt) else \
            "conv2d_direct_weight_grad"
        kb, ids = image_kernel(lw, name, [gl, xl, dst] + temps,
                               ("weight_grad", g.key(), split is not None))
        gi, xi, oi, pi = ids[:4]
        b = kb.begin()
        if b is None:
            lw.calls.append(called_kernel(lw, kb.kernel, split))
            return True
        with b.goto_entry_block():
            accs = [b.alloca(const(dt, 0.0).type, name=f"acc{t}") for t, _, _ in taps]
        _zero(b, kb, pi, hp * wp + slack, dt)
        if flat:
            _zero(b, kb, ids[4], g.ho * wp, dt)

        def accumulate(b, gv, at):
            for acc, (_, di, dj) in zip(accs, taps):
                v = kb.load(b, pi, iadd(b, at, di * wp + dj))
                s = _fma(b, b.load(acc), gv, v)
                s.flags.extend(("reassoc", "nsz"))
                b.store(s, acc)

        with units_loop(b, kb, split, ids[-1], g.o, "o") as o, loop(b, 0, g.cg, "c") as c:
            for acc in accs:
                b.store(const(dt, 0.0), acc)
            group = o if g.og == 1 else b.udiv(o, i64(g.og))
            ch = iadd(b, imul(b, group, g.cg), c)  # the input channel
            with loop(b, 0, g.n, "n") as n:
                _pad_plane(b, kb, xi, iadd(b, imul(b, n, xs[0]), imul(b, ch, xs[1])),
                           xs[2:], (g.h, g.w), pi, wp, ph, pw)
                gy_plane = iadd(b, imul(b, n, gs[0]), imul(b, o, gs[1]))
                if flat:
                    _pad_plane(b, kb, gi, gy_plane, gs[2:], (g.ho, g.wo), ids[4], wp, 0, 0)
                    with loop(b, 0, g.ho * wp, "p") as q:
                        accumulate(b, kb.load(b, ids[4], q), q)
                else:
                    with loop(b, 0, g.ho, "r") as r, loop(b, 0, g.wo, "q") as q:
                        gv = kb.load(b, gi, iadd(b, gy_plane, imul(b, r, gs[2]),
                                                 imul(b, q, gs[3])))
                        accumulate(b, gv, iadd(b, imul(b, r, sh * wp), imul(b, q, sw)))
            at = imul(b, iadd(b, imul(b, o, g.cg), c), g.kh * g.kw)
            for acc, (t, _, _) in zip(accs, taps):
                kb.store(b, oi, iadd(b, at, t), b.load(acc))
        lw.calls.append(called_kernel(lw, kb.finish(b), split))
    return True
