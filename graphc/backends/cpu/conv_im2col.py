"""conv_im2col: a convolution's geometry and the im2col path's emitter.

- `Geometry`: the sizes of one convolution (batch, channels, planes, kernel, groups, stride,
  padding, dilation) as every CPU convolution path reads them (graphc.backends.cpu.conv
  builds it from the node; conv_direct, conv_few_channels(_grad) and conv_winograd take it),
  with the derived sizes of the im2col matrices (`k` rows of one group's columns, `p`
  output positions of one image) and `key()`, its part of a kernel recipe.
- `Conv`: the code the GEMM-based kernels share (the im2col lowerings of
  graphc.backends.cpu.conv, and conv_winograd's GEMMs): `gemm` (a call of the BLAS's cblas
  GEMM, row-major, NOTRANS/TRANS, on kernel operands; graphc's own k-outer kernel where
  graphc.backends.cpu.small_gemm.in_place takes the product), `im2col` (one image's columns:
  `cols[(c*kH + i)*kW + j, oh*W_out + ow] = x[c, oh*s - p + i*d, ow*s - p + j*d]`, 0 in the
  padding) and `col2im` (the reverse scatter-add into a zeroed input gradient, overlaps
  accumulating in the kernel offset order of the numpy kernel). Both take input rows up to
  ROW_LANES wide one vector at a time (`_im2col_rows`, `_col2im_rows`; the same bits): on
  ResNet-18's stride-2 layers (batch 32, 1 thread, one-op kernels, 15 alternated rounds,
  load ~6) the 3x3 input gradients 8.92 -> 7.87, 7.38 -> 6.78, 7.54 -> 7.11 ms (64, 128,
  256 channels in), the forwards 7.11 -> 6.94, 7.02 -> 6.63, 9.55 -> 8.52, the weight
  gradients 7.55 -> 7.60, 7.39 -> 7.24, 9.38 -> 8.51; the 1x1 kernels within 0.1 ms.
- `grad_image`: an output gradient readable as one (O x H_out*W_out) matrix per image.

Invariant: which output rows and columns a kernel offset reaches is computed in Python
(`out_ranges`, as constant tables), so im2col and col2im never read or write outside their
tensors and padding is never materialised.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from llvmlite import ir

from graphc.backends.cpu import small_gemm
from graphc.backends.cpu.image_kernels import (
    Table,
    contiguous_in,
    iadd,
    image_strides,
    imul,
    out_ranges,
)
from graphc.backends.cpu.scalars import const
from graphc.backends.cpu.values import I32, I64, REG, Loc, as_i64, i64, loop, unsupported
from graphc.ir.graph import Node
from graphc.types import float32, float64

__all__ = ["NOTRANS", "ROW_MAJOR", "TRANS", "Conv", "Geometry", "grad_image"]

ROW_MAJOR, NOTRANS, TRANS = 101, 111, 112


@dataclass
class Geometry:
    n: int
    c: int
    h: int
    w: int
    o: int
    groups: int
    kh: int
    kw: int
    ho: int
    wo: int
    stride: tuple
    padding: tuple
    dilation: tuple

    @property
    def cg(self) -> int:
        return self.c // self.groups

    @property
    def og(self) -> int:
        return self.o // self.groups

    @property
    def k(self) -> int:  # rows of one group's columns
        return self.cg * self.kh * self.kw

    @property
    def p(self) -> int:  # output positions of one image
        return self.ho * self.wo

    @property
    def pointwise(self) -> bool:  # the image is its own im2col
        return (self.kh, self.kw) == (1, 1) and self.stride == (1, 1) and \
            self.padding == (0, 0)

    def key(self) -> tuple:
        """The geometry as a kernel recipe's part (every field)."""
        return dataclasses.astuple(self)


class Conv:
    """Shared pieces of the three convolution kernels."""

    def __init__(self, lw, node: Node, g: Geometry, dt) -> None:
        if dt not in (float32, float64):
            raise unsupported(node, f"{node.op} of {dt.name}")
        if lw.blas is None:  # the executable resolves a BLAS for matmul graphs only
            from graphc.backends.cpu.blas import resolve_blas

            lw.blas = resolve_blas()
        self.lw, self.node, self.g, self.dt = lw, node, g, dt
        self.gemm_fn = lw.blas_function(dt, "gemm")
        self.iT = I64 if lw.blas.ilp64 else I32
        self.fty = REG[dt.name]
        sh, sw = g.stride
        ph, pw = g.padding
        dh, dw = g.dilation
        self.oh_rng = [Table(lw, t) for t in out_ranges(g.h, g.ho, g.kh, sh, ph, dh)]
        self.ow_rng = [Table(lw, t) for t in out_ranges(g.w, g.wo, g.kw, sw, pw, dw)]

    def gemm(self, b, kb, trans_a, trans_b, m, n, k, a, a_off, lda, bb, b_off, ldb, beta, c,
             c_off, ldc):
        """c = a @ b + beta * c (beta 0.0, 1.0 or an f32/f64 value of the two), a and b
        read as TRANS/NOTRANS say: a generated kernel where small_gemm.in_place takes it
        (beta known here, or one call of each, chosen per call), else the BLAS."""
        pointers = [kb.pointer(b, x, as_i64(offset)) for x, offset in
                    ((a, a_off), (bb, b_off), (c, c_off))]
        a_strides = (1, lda) if trans_a == TRANS else (lda, 1)
        tile = None if isinstance(beta, float) and beta not in (0.0, 1.0) else \
            small_gemm.in_place(self.lw, self.dt, m, n, k, *a_strides, ldb, ldc,
                                trans_b == TRANS)
        if tile is not None:
            return self._generated_gemm(b, tile, pointers, beta)
        iT, fty = self.iT, self.fty
        beta = ir.Constant(fty, beta) if isinstance(beta, float) else beta
        b.call(self.gemm_fn, [
            ir.Constant(I32, ROW_MAJOR), ir.Constant(I32, trans_a), ir.Constant(I32, trans_b),
            ir.Constant(iT, m), ir.Constant(iT, n), ir.Constant(iT, k), ir.Constant(fty, 1.0),
            pointers[0], ir.Constant(iT, lda), pointers[1], ir.Constant(iT, ldb), beta,
            pointers[2], ir.Constant(iT, ldc)])

    def _generated_gemm(self, b, tile, pointers: list, beta) -> None:
        """The call of `tile`'s kernel (small_gemm.function): c stored (beta 0.0) or added
        to (1.0); beta a value: each kernel, chosen by it at run time."""
        if isinstance(beta, float):
            fn = small_gemm.function(self.lw, dataclasses.replace(tile, accumulate=beta == 1.0))
            b.call(fn, pointers)
            return
        stored, added = (small_gemm.function(self.lw, dataclasses.replace(tile, accumulate=x))
                         for x in (False, True))
        with b.if_else(b.fcmp_ordered("==", beta, ir.Constant(beta.type, 0.0))) as (zero, one):
            with zero:
                b.call(stored, pointers)
            with one:
                b.call(added, pointers)

    def _rows(self, b, fn):
        """fn(b, row, c, i, j) for every column row (c, i, j), row = (c*kH + i)*kW + j."""
        g = self.g
        with loop(b, 0, g.c, "ch") as c:
            with loop(b, 0, g.kh, "ki") as i:
                with loop(b, 0, g.kw, "kj") as j:
                    row = b.add(b.mul(b.add(b.mul(c, i64(g.kh)), i), i64(g.kw)), j)
                    fn(b, row, c, i, j)

    def im2col(self, b, kb, x, xs, x_img, cols, cols_img=0, ld=None) -> None:
        """cols[row, cols_img + oh*W_out + ow] = x[c, ih, iw] (0 in the padding) for image
        offset x_img; `ld` is the row stride of cols (H_out*W_out for one image)."""
        g = self.g
        sh, sw = g.stride
        ph, pw = g.padding
        dh, dw = g.dilation
        zero = const(self.dt, 0.0)
        ld = g.p if ld is None else ld
        if BY_ROWS and xs[3] == 1 and g.w <= ROW_LANES and g.kh * g.kw <= ROW_TAPS:
            return self._im2col_rows(b, kb, x, xs, x_img, cols, cols_img, ld)

        def fn(b, row, c, i, j):
            base = iadd(b, b.mul(row, i64(ld)), cols_img)
            oh_lo, oh_hi = (t(b, i) for t in self.oh_rng)
            ow_lo, ow_hi = (t(b, j) for t in self.ow_rng)
            with loop(b, 0, imul(b, oh_lo, g.wo), "z0") as q:
                kb.store(b, cols, b.add(base, q), zero)
            with loop(b, imul(b, oh_hi, g.wo), g.p, "z1") as q:
                kb.store(b, cols, b.add(base, q), zero)
            with loop(b, oh_lo, oh_hi, "oh") as oh:
                ih = iadd(b, imul(b, oh, sh), imul(b, i, dh), -ph)
                dst = b.add(base, b.mul(oh, i64(g.wo)))
                src = iadd(b, x_img, imul(b, c, xs[1]), imul(b, ih, xs[2]),
                           imul(b, iadd(b, imul(b, j, dw), -pw), xs[3]))
                with loop(b, 0, ow_lo, "z2") as ow:
                    kb.store(b, cols, b.add(dst, ow), zero)
                with loop(b, ow_lo, ow_hi, "ow") as ow:
                    v = kb.load(b, x, iadd(b, src, imul(b, ow, sw * xs[3])))
                    kb.store(b, cols, b.add(dst, ow), v)
                with loop(b, ow_hi, g.wo, "z3") as ow:
                    kb.store(b, cols, b.add(dst, ow), zero)

        self._rows(b, fn)

    def _im2col_rows(self, b, kb, x, xs, x_img, cols, cols_img, ld) -> None:
        """im2col one input row at a time (contiguous rows of at most ROW_LANES elements):
        for each channel, tap row i and output row oh, the input row it reads is loaded as
        one vector and each tap j's W_out columns are one shuffle of it (0 in the padding),
        stored as one vector; the output rows no input row reaches are zero-filled."""
        g = self.g
        sh, sw = g.stride
        ph, pw = g.padding
        dh, dw = g.dilation
        lanes, wo = g.w, g.wo
        row_t = ir.VectorType(self.fty, lanes)
        zero_row = ir.Constant(row_t, [0.0] * lanes)
        zero = const(self.dt, 0.0)
        masks = []  # per tap column j: where each output column reads (lanes: zero)
        for j in range(g.kw):
            source = [ow * sw + j * dw - pw for ow in range(wo)]
            masks.append(ir.Constant(ir.VectorType(ir.IntType(32), wo),
                                     [s if 0 <= s < lanes else lanes for s in source]))
        with loop(b, 0, g.c, "ch") as c:
            for i in range(g.kh):
                oh_lo, oh_hi = (t(b, i) for t in self.oh_rng)
                for j in range(g.kw):  # the rows no input row reaches: zero
                    base = iadd(b, imul(b, iadd(b, imul(b, c, g.kh * g.kw), i * g.kw + j),
                                        ld), cols_img)
                    with loop(b, 0, oh_lo * wo, "z0") as q:
                        kb.store(b, cols, b.add(base, q), zero)
                    with loop(b, oh_hi * wo, g.p, "z1") as q:
                        kb.store(b, cols, b.add(base, q), zero)
                if oh_lo >= oh_hi:
                    continue
                with loop(b, oh_lo, oh_hi, "oh") as oh:
                    ih = iadd(b, imul(b, oh, sh), i * dh - ph)
                    src = iadd(b, x_img, imul(b, c, xs[1]), imul(b, ih, xs[2]))
                    row = b.load(kb.pointer(b, x, src), typ=row_t, align=4)
                    for j in range(g.kw):
                        r = iadd(b, imul(b, c, g.kh * g.kw), i * g.kw + j)
                        dst = iadd(b, cols_img, imul(b, r, ld), imul(b, oh, wo))
                        b.store(b.shuffle_vector(row, zero_row, masks[j]),
                                kb.pointer(b, cols, dst), align=4)

    def col2im(self, b, kb, cols, gx, gx_img, cols_img=0, ld=None) -> None:
        """gx[c, ih, iw] += cols[row, cols_img + oh*W_out + ow] over the in-bounds entries
        (gx contiguous per image, zeroed first; `ld` the row stride of cols)."""
        g = self.g
        ld = g.p if ld is None else ld
        sh, sw = g.stride
        ph, pw = g.padding
        dh, dw = g.dilation
        with loop(b, 0, g.c * g.h * g.w, "zero") as q:
            kb.store(b, gx, b.add(gx_img, q), const(self.dt, 0.0))
        if self._by_rows():
            return self._col2im_rows(b, kb, cols, gx, gx_img, cols_img, ld)

        def fn(b, row, c, i, j):
            base = iadd(b, b.mul(row, i64(ld)), cols_img)
            oh_lo, oh_hi = (t(b, i) for t in self.oh_rng)
            ow_lo, ow_hi = (t(b, j) for t in self.ow_rng)
            with loop(b, oh_lo, oh_hi, "oh") as oh:
                ih = iadd(b, imul(b, oh, sh), imul(b, i, dh), -ph)
                src = b.add(base, b.mul(oh, i64(g.wo)))
                dst = iadd(b, gx_img, imul(b, c, g.h * g.w), imul(b, ih, g.w),
                           iadd(b, imul(b, j, dw), -pw))
                with loop(b, ow_lo, ow_hi, "ow") as ow:
                    at = b.add(dst, imul(b, ow, sw))
                    kb.store(b, gx, at, b.fadd(kb.load(b, gx, at),
                                               kb.load(b, cols, b.add(src, ow))))

        self._rows(b, fn)


    def _by_rows(self) -> bool:
        """Whether col2im takes `_col2im_rows`: input rows of at most ROW_LANES elements,
        no dilation along them, at most ROW_TAPS kernel taps (one body each)."""
        g = self.g
        return BY_ROWS and g.w <= ROW_LANES and g.dilation[1] == 1 and \
            g.kh * g.kw <= ROW_TAPS

    def _col2im_rows(self, b, kb, cols, gx, gx_img, cols_img, ld) -> None:
        """col2im one input row at a time: for each channel, tap row i and output row oh,
        the input row it reaches is loaded as one vector, each tap j's W_out column entries
        are shuffled to their input columns (stride apart) and added to the lanes they
        reach (a select keeps the others, signed zeros included), and the row stored.
        Every element receives its terms in the scalar loop's order (tap row, then tap
        column), so the same bits."""
        g = self.g
        sh, sw = g.stride
        ph, pw = g.padding
        dh = g.dilation[0]
        lanes, wo = g.w, g.wo
        row_t = ir.VectorType(self.fty, lanes)
        cols_t = ir.VectorType(self.fty, wo)
        zero = ir.Constant(cols_t, [0.0] * wo)
        taps = []  # per tap column j: (shuffle mask, lanes it reaches) or None
        for j in range(g.kw):
            source = [(iw + pw - j) // sw if (iw + pw - j) % sw == 0 and
                      0 <= (iw + pw - j) // sw < wo else None for iw in range(lanes)]
            if all(s is None for s in source):
                taps.append(None)
                continue
            mask = ir.Constant(ir.VectorType(ir.IntType(32), lanes),
                               [wo if s is None else s for s in source])
            reach = ir.Constant(ir.VectorType(ir.IntType(1), lanes),
                                [int(s is not None) for s in source])
            taps.append((mask, reach))
        with loop(b, 0, g.c, "ch") as c:
            plane = iadd(b, gx_img, imul(b, c, g.h * g.w))
            for i in range(g.kh):
                oh_lo, oh_hi = (t(b, i) for t in self.oh_rng)
                if oh_lo >= oh_hi:
                    continue
                with loop(b, oh_lo, oh_hi, "oh") as oh:
                    ih = iadd(b, imul(b, oh, sh), i * dh - ph)
                    at = kb.pointer(b, gx, iadd(b, plane, imul(b, ih, g.w)))
                    row = b.load(at, typ=row_t, align=4)
                    for j, tap in enumerate(taps):
                        if tap is None:
                            continue
                        r = iadd(b, imul(b, c, g.kh * g.kw), i * g.kw + j)
                        src = iadd(b, cols_img, imul(b, r, ld), imul(b, oh, wo))
                        v = b.load(kb.pointer(b, cols, src), typ=cols_t, align=4)
                        v = b.shuffle_vector(v, zero, tap[0])
                        row = b.select(tap[1], b.fadd(row, v), row)
                    b.store(row, at, align=4)


# im2col and col2im by rows (Conv._im2col_rows, _col2im_rows) for input rows up to ROW_LANES
# elements and kernels of up to ROW_TAPS taps; False: the scalar loops (A/B runs)
BY_ROWS = True
ROW_LANES = 64
ROW_TAPS = 9


def grad_image(lw, loc: Loc, g: Geometry) -> tuple[Loc, tuple]:
    """A grad_output readable as one (O x H_out*W_out) matrix per image: (loc, strides)."""
    s = image_strides(loc)
    if not (s[3] == 1 or g.wo == 1) or not (s[2] == g.wo or g.ho == 1) or s[1] < g.p:
        loc = contiguous_in(lw, loc)
        s = image_strides(loc)
    return loc, s
