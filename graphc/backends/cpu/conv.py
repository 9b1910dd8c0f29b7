"""conv: lowering of convolution, pooling and batch normalisation (called by the Lowerer).

The CPU code generator's lowering of the image ops (values <- scalars <- kernels <- conv,
used by codegen's `Lowerer`, passed in as `lw`: its Locations, kernel list, scratch, BLAS):

- `conv2d` (THNN's SpatialConvolutionMM, ../shared/SEEDS.md section 3): im2col into backend
  scratch (`(C*kH*kW) x (H_out*W_out)` per image, the groups' row blocks one after the
  other), then one BLAS GEMM per group `W_g (O/g x K) @ cols_g (K x P)` writing the image's
  NCHW output directly. Images whose planes have fewer than THIN_COLUMNS output positions go
  in blocks (`images_per_block`): one im2col of the block's images side by side and one GEMM
  over all their columns, whose result is copied out to NCHW. A 1x1 kernel with stride 1
  and no padding reads the image itself as the columns (one image per GEMM).
  Depthwise convolutions take direct loops instead, forward and both gradients
  (graphc.backends.cpu.conv_direct). Bias and activation are the fused node's epilogue
  (codegen).
- `conv2d_input_grad`: per image or block, one GEMM per group `cols_g = W_g^T @ gy_g` (a
  block's gradients gathered into one matrix first), then col2im adds every column entry
  back into its input position (overlaps accumulate, in the kernel offset order of the numpy
  kernel); a pointwise 1x1 GEMM writes the input gradient itself.
- `conv2d_weight_grad`: per image or block, im2col then `gw_g^T += cols_g @ gy_g^T` (beta 0
  for the first, 1 after), so the batch accumulates inside the GEMM. Where O/g <= 128 < K
  the GEMM computes the transposed gradient `gw_g^T += cols_g @ gy_g^T` in scratch, copied
  out in tiles at the end: OpenBLAS runs that [K x O] orientation 10-25% faster on such
  shapes (ResNet-18 CIFAR's 64- and 128-channel layers; measured 1-thread CPU time).
- The temporaries of a convolution kernel (columns, a block's result or gradients) live in
  one backend scratch region that all convolution kernels of the module share (`workspace`).
- `max_pool2d` (values and int64 flat H*W indices), `max_pool2d_grad` (a scatter-add by the
  indices; an index out of the plane makes the call fail clearly), `avg_pool2d` and
  `avg_pool2d_grad` (PyTorch's divisors: count_include_pad, divisor_override, ceil_mode).
- `batch_norm` forward: per channel, float64 mean and biased variance (two passes) in
  training, the running statistics in eval; `invstd = 1/sqrt(var + eps)`; the output, mean
  and invstd rounded to the input's dtype, as the numpy kernel does.

Invariants: the geometry (which output rows and columns a kernel offset reaches, which taps
a pooling window has, the divisors) is computed here in Python and passed to the kernels as
constant tables, so no kernel reads outside its tensors and padding is never materialised.
Max pooling keeps the first maximum of a window in row-major order, and a NaN wins (the
last NaN), as the numpy kernel and PyTorch's CPU kernel do. Inputs may be strided views
(im2col and pooling read through strides); GEMM operands and outputs that BLAS cannot read
or write in place are copied through contiguous scratch.
"""

from __future__ import annotations

import math
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

from llvmlite import ir

from graphc.backends.cpu.kernels import KernelBuilder
from graphc.backends.cpu.scalars import const, convert
from graphc.backends.cpu.values import (
    F64,
    I32,
    I64,
    REG,
    Loc,
    as_i64,
    contiguous,
    contiguous_strides,
    i64,
    loop,
    unsupported,
)
from graphc.ir.graph import Node
from graphc.ir.printer import format_node
from graphc.types import TensorType, float32, float64

__all__ = ["avg_pool2d", "avg_pool2d_grad", "batch_norm", "conv2d", "conv2d_input_grad",
           "conv2d_weight_grad", "max_pool2d", "max_pool2d_grad"]

_ROW, _NOTRANS, _TRANS = 101, 111, 112


# ---- helpers ---------------------------------------------------------------------------------
def iadd(b, *terms) -> ir.Value:
    """Sum of i64 terms (ints or values), folding the constants."""
    k, vals = 0, []
    for t in terms:
        if isinstance(t, int):
            k += t
        else:
            vals.append(t)
    out = None
    for v in vals:
        out = v if out is None else b.add(out, v)
    if out is None:
        return i64(k)
    return b.add(out, i64(k)) if k else out


def imul(b, x, k: int):
    if isinstance(x, int):
        return x * k
    return x if k == 1 else (0 if k == 0 else b.mul(x, i64(k)))


class Table:
    """A constant i64 table indexed at run time (folded to a constant when uniform)."""

    def __init__(self, lw, values) -> None:
        self.values = [int(v) for v in values]
        self.uniform = len(set(self.values)) == 1
        if not self.uniform:
            ty = ir.ArrayType(I64, len(self.values))
            gv = ir.GlobalVariable(lw.module, ty, name=lw.name("table"))
            gv.global_constant = True
            gv.linkage = "internal"
            gv.initializer = ir.Constant(ty, self.values)
            self.gv, self.ty = gv, ty

    def __call__(self, b, index):
        if self.uniform:
            return self.values[0]
        if isinstance(index, int):
            return self.values[index]
        p = b.gep(self.gv, [i64(0), index], inbounds=True, source_etype=self.ty)
        return b.load(p, typ=I64)


def _estrides(loc: Loc) -> tuple[int, ...]:
    item = loc.type.dtype.itemsize
    return tuple(s // item for s in loc.strides)


def _is_contiguous(loc: Loc) -> bool:
    t = loc.type
    want = contiguous_strides(t.shape, t.dtype.itemsize)
    return all(n == 1 or s == w for n, s, w in zip(t.shape, loc.strides, want))


def contiguous_in(lw, loc: Loc) -> Loc:
    """`loc`, or a contiguous copy of it in scratch."""
    if _is_contiguous(loc):
        return loc
    tmp = lw.scratch_loc(loc.type)
    lw.copy(loc, tmp, "pack")
    return tmp


@contextmanager
def contiguous_out(lw, loc: Loc):
    """Yield a contiguous Loc to write; copied to `loc` afterwards when it is not one."""
    if _is_contiguous(loc):
        yield loc
        return
    tmp = lw.scratch_loc(loc.type)
    yield tmp
    lw.copy(tmp, loc, "unpack")


def image_kernel(lw, name: str, locs: list[Loc]):
    """A KernelBuilder whose operands are `locs` (element addressing by hand)."""
    kb = KernelBuilder(lw, lw.name(name), (1,))
    ids = [kb.operand(loc, (0,)) for loc in locs]
    return kb, ids


def _fadd(b, x, y, reassoc=False):
    r = b.fadd(x, y)
    if reassoc:
        r.flags.extend(("reassoc", "nsz"))
    return r


def _taps(n: int, out: int, k: int, s: int, p: int, d: int):
    """Per output position o: the range [lo, hi) of kernel taps t whose input position
    o*s - p + t*d lies in [0, n)."""
    lo, hi = [], []
    for o in range(out):
        start = o * s - p
        ts = [t for t in range(k) if 0 <= start + t * d < n]
        lo.append(ts[0] if ts else 0)
        hi.append(ts[-1] + 1 if ts else 0)
    return lo, hi


def out_ranges(n: int, out: int, k: int, s: int, p: int, d: int):
    """Per kernel tap t: the range [lo, hi) of output positions o whose input position
    o*s - p + t*d lies in [0, n)."""
    lo, hi = [], []
    for t in range(k):
        os_ = [o for o in range(out) if 0 <= o * s - p + t * d < n]
        lo.append(os_[0] if os_ else 0)
        hi.append(os_[-1] + 1 if os_ else 0)
    return lo, hi


# ---- convolution -----------------------------------------------------------------------------
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


def _geometry(x_t: TensorType, w_shape, out_hw, attrs) -> Geometry:
    n = x_t.shape[0] if x_t.ndim == 4 else 1
    c, h, w = x_t.shape[-3:]
    o, _, kh, kw = w_shape
    return Geometry(n, c, h, w, o, attrs["groups"], kh, kw, out_hw[0], out_hw[1],
                 tuple(attrs["stride"]), tuple(attrs["padding"]), tuple(attrs["dilation"]))


def image_strides(loc: Loc) -> tuple[int, int, int, int]:
    """Element strides (n, c, h, w) of a batched or unbatched image tensor."""
    s = _estrides(loc)
    return (0,) + s if len(s) == 3 else s


class _Conv:
    """Shared pieces of the three convolution kernels."""

    def __init__(self, lw, node: Node, g: Geometry, dt) -> None:
        if dt not in (float32, float64):
            raise unsupported(node, f"{node.op} of {dt.name}")
        if lw.blas is None:  # the executable resolves a BLAS for matmul graphs only
            from graphc.backends.cpu.blas import resolve_blas

            lw.blas = resolve_blas()
        self.lw, self.node, self.g, self.dt = lw, node, g, dt
        self.gemm_fn = lw._blas_function(dt, "gemm")
        self.iT = I64 if lw.blas.ilp64 else I32
        self.fty = REG[dt.name]
        sh, sw = g.stride
        ph, pw = g.padding
        dh, dw = g.dilation
        self.oh_rng = [Table(lw, t) for t in out_ranges(g.h, g.ho, g.kh, sh, ph, dh)]
        self.ow_rng = [Table(lw, t) for t in out_ranges(g.w, g.wo, g.kw, sw, pw, dw)]

    def gemm(self, b, kb, trans_a, trans_b, m, n, k, a, a_off, lda, bb, b_off, ldb, beta, c,
             c_off, ldc):
        iT, fty = self.iT, self.fty
        beta = ir.Constant(fty, beta) if isinstance(beta, float) else beta
        b.call(self.gemm_fn, [
            ir.Constant(I32, _ROW), ir.Constant(I32, trans_a), ir.Constant(I32, trans_b),
            ir.Constant(iT, m), ir.Constant(iT, n), ir.Constant(iT, k), ir.Constant(fty, 1.0),
            kb.pointer(b, a, as_i64(a_off)), ir.Constant(iT, lda),
            kb.pointer(b, bb, as_i64(b_off)), ir.Constant(iT, ldb), beta,
            kb.pointer(b, c, as_i64(c_off)), ir.Constant(iT, ldc)])

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


# Images per GEMM: one image's GEMM with fewer than THIN_COLUMNS output positions (columns)
# runs at half of BLAS's speed (ResNet's 4x4 layer: [512 x 4608] @ [4608 x 16] at 62 GFLOP/s,
# 105 as one GEMM over blocks of 32 images, 1-thread CPU time), so such images go in blocks of
# BLOCK_COLUMNS columns, at the price of copying the block's result (or gradient) between
# the GEMM's layout and NCHW. At 64 columns and more that copy costs what the GEMM gains.
THIN_COLUMNS = 64
BLOCK_COLUMNS = 512

_WORKSPACES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # lowerer -> [at, n]


def workspace(lw, dt, *shapes) -> list[Loc]:
    """Contiguous temporaries for one convolution kernel, in backend scratch that every
    convolution kernel of the module shares: kernels run one after another and keep nothing
    there between calls, so the scratch is the largest need, not the sum."""
    sizes = [-(-math.prod(s) * dt.itemsize // 64) * 64 for s in shapes]
    need = sum(sizes)
    ws = _WORKSPACES.get(lw)
    if ws is None or ws[1] < need:
        if ws is not None and ws[0] + ws[1] == lw.scratch:  # still the last: grow in place
            lw.scratch = ws[0]
        ws = [lw.add_scratch(need), need]
        _WORKSPACES[lw] = ws
    locs, at = [], lw.plan.arena_bytes + ws[0]
    for shape, n in zip(shapes, sizes):
        locs.append(contiguous("arena", 0, at, TensorType(tuple(shape), dt)))
        at += n
    return locs


def images_per_block(g: Geometry) -> int:
    """How many images one GEMM covers (see BLOCK_COLUMNS)."""
    if g.p >= THIN_COLUMNS or g.n <= 1:
        return 1
    return min(g.n, -(-BLOCK_COLUMNS // g.p))


def _over_blocks(b, n: int, nb: int, body) -> None:
    """body(b, first image, images) for each block of `nb` images, then the partial last
    block (its size a constant too, so every GEMM has constant sizes)."""
    full, tail = divmod(n, nb)
    if full == 1:
        body(b, 0, nb)
    elif full:
        with loop(b, 0, full, "block") as k:
            body(b, b.mul(k, i64(nb)), nb)
    if tail:
        body(b, full * nb, tail)


@contextmanager
def _images(b, count: int):
    """The images j of a block (no loop for a block of one image)."""
    if count == 1:
        yield 0
    else:
        with loop(b, 0, count, "img") as j:
            yield j


def _gather_grad(b, kb, g: Geometry, gi, gs, n0, count, dst) -> None:
    """dst[o, j*P + q] = gy[n0 + j, o, q]: a block of output gradients as one matrix."""
    ld = count * g.p
    with _images(b, count) as j:
        src_img = imul(b, iadd(b, n0, j), gs[0])
        with loop(b, 0, g.o, "o") as o:
            src = iadd(b, src_img, imul(b, o, gs[1]))
            at = iadd(b, imul(b, o, ld), imul(b, j, g.p))
            with loop(b, 0, g.p, "q") as q:
                kb.store(b, dst, b.add(at, q), kb.load(b, gi, b.add(src, q)))


def conv2d(lw, node: Node, x: Loc, w: Loc, out: Loc, attrs: dict) -> None:
    """out = conv2d(x, w) (out contiguous or not: see `contiguous_out`)."""
    g = _geometry(x.type, w.type.shape, out.type.shape[-2:], attrs)
    from graphc.backends.cpu import conv_direct

    if conv_direct.conv2d(lw, node, g, x, w, out):
        return
    cv = _Conv(lw, node, g, x.type.dtype)
    w = contiguous_in(lw, w)
    xs = image_strides(x)
    nb = images_per_block(g)
    direct = nb == 1 and g.pointwise and xs[3] == 1 and xs[2] == g.w and xs[1] == g.p
    with contiguous_out(lw, out) as dst:
        shapes = ([] if direct else [(g.c * g.kh * g.kw, nb * g.p)]) + \
            ([(g.o, nb * g.p)] if nb > 1 else [])
        temps = workspace(lw, cv.dt, *shapes)
        kb, ids = image_kernel(lw, "conv2d", [x, w, dst] + temps)
        xi, wi, oi = ids[:3]
        cols = None if direct else ids[3]
        tmp = ids[-1] if nb > 1 else None
        b = kb.begin()

        def block(b, n0, count):
            ld = count * g.p
            if direct:
                src, src_img, ldb = xi, imul(b, n0, xs[0]), xs[1]
            else:
                src, src_img, ldb = cols, 0, ld
                with _images(b, count) as j:
                    cv.im2col(b, kb, xi, xs, imul(b, iadd(b, n0, j), xs[0]), cols,
                              imul(b, j, g.p), ld)
            c, c_img, ldc = (tmp, 0, ld) if tmp is not None else \
                (oi, imul(b, n0, g.o * g.p), g.p)
            for grp in range(g.groups):
                cv.gemm(b, kb, _NOTRANS, _NOTRANS, g.og, ld, g.k,
                        wi, grp * g.og * g.k, g.k,
                        src, iadd(b, src_img, grp * g.k * ldb), ldb, 0.0,
                        c, iadd(b, c_img, grp * g.og * ldc), ldc)
            if tmp is not None:  # columns j*P.. of the block's result are image n0 + j
                with _images(b, count) as j:
                    dst_img = imul(b, iadd(b, n0, j), g.o * g.p)
                    with loop(b, 0, g.o, "o") as o:
                        at = iadd(b, dst_img, imul(b, o, g.p))
                        frm = iadd(b, imul(b, o, ld), imul(b, j, g.p))
                        with loop(b, 0, g.p, "q") as q:
                            kb.store(b, oi, b.add(at, q), kb.load(b, tmp, b.add(frm, q)))

        _over_blocks(b, g.n, nb, block)
        lw.calls.append(kb.finish(b))


def grad_image(lw, loc: Loc, g: Geometry) -> tuple[Loc, tuple]:
    """A grad_output readable as one (O x H_out*W_out) matrix per image: (loc, strides)."""
    s = image_strides(loc)
    if not (s[3] == 1 or g.wo == 1) or not (s[2] == g.wo or g.ho == 1) or s[1] < g.p:
        loc = contiguous_in(lw, loc)
        s = image_strides(loc)
    return loc, s


def conv2d_input_grad(lw, node: Node) -> None:
    gy, w = node.inputs
    out = lw.locs[node.outputs[0]]
    g = _geometry(out.type, w.type.shape, gy.type.shape[-2:], node.attrs)
    from graphc.backends.cpu import conv_direct

    if conv_direct.conv2d_input_grad(lw, node, g):
        return
    cv = _Conv(lw, node, g, gy.type.dtype)
    wl = contiguous_in(lw, lw.locs[w])
    gl, gs = grad_image(lw, lw.locs[gy], g)
    nb = images_per_block(g)
    direct = nb == 1 and g.pointwise  # the columns are the image gradient itself
    with contiguous_out(lw, out) as dst:
        shapes = ([] if direct else [(g.c * g.kh * g.kw, nb * g.p)]) + \
            ([(g.o, nb * g.p)] if nb > 1 else [])
        temps = workspace(lw, cv.dt, *shapes)
        kb, ids = image_kernel(lw, "conv2d_input_grad", [gl, wl, dst] + temps)
        gi, wi, oi = ids[:3]
        cols = oi if direct else ids[3]
        gyt = ids[-1] if nb > 1 else None
        b = kb.begin()

        def block(b, n0, count):
            ld = count * g.p
            if gyt is not None:
                _gather_grad(b, kb, g, gi, gs, n0, count, gyt)
                a, a_img, lda = gyt, 0, ld
            else:
                a, a_img, lda = gi, imul(b, n0, gs[0]), gs[1]
            cols_img = imul(b, n0, g.c * g.h * g.w) if direct else 0
            for grp in range(g.groups):
                cv.gemm(b, kb, _TRANS, _NOTRANS, g.k, ld, g.og,
                        wi, grp * g.og * g.k, g.k,
                        a, iadd(b, a_img, grp * g.og * lda), lda, 0.0,
                        cols, iadd(b, cols_img, grp * g.k * ld), ld)
            if not direct:
                with _images(b, count) as j:
                    cv.col2im(b, kb, cols, oi, imul(b, iadd(b, n0, j), g.c * g.h * g.w),
                              imul(b, j, g.p), ld)

        _over_blocks(b, g.n, nb, block)
        lw.calls.append(kb.finish(b))


def conv2d_weight_grad(lw, node: Node) -> None:
    gy, x = node.inputs
    out = lw.locs[node.outputs[0]]
    g = _geometry(x.type, out.type.shape, gy.type.shape[-2:], node.attrs)
    if g.n == 0:
        return lw.fill(out, 0.0, "conv2d_weight_grad_zero")
    from graphc.backends.cpu import conv_direct

    if conv_direct.conv2d_weight_grad(lw, node, g):
        return
    cv = _Conv(lw, node, g, x.type.dtype)
    xl = lw.locs[x]
    xs = image_strides(xl)
    nb = images_per_block(g)
    direct = nb == 1 and g.pointwise and xs[3] == 1 and xs[2] == g.w and xs[1] == g.p
    gl, gs = grad_image(lw, lw.locs[gy], g)
    transposed = g.og <= 128 and g.k > g.og  # see the module docstring
    with contiguous_out(lw, out) as dst:
        shapes = ([(g.groups, g.k, g.og)] if transposed else []) + \
            ([] if direct else [(g.c * g.kh * g.kw, nb * g.p)]) + \
            ([(g.o, nb * g.p)] if nb > 1 else [])
        temps = workspace(lw, cv.dt, *shapes)
        kb, ids = image_kernel(lw, "conv2d_weight_grad", [gl, xl, dst] + temps)
        gi, xi, oi = ids[:3]
        gwt = ids[3] if transposed else None
        cols = None if direct else ids[3 + transposed]
        gyt = ids[-1] if nb > 1 else None
        b = kb.begin()
        zero, one = const(cv.dt, 0.0), const(cv.dt, 1.0)

        def block(b, n0, count):
            ld = count * g.p
            if direct:
                src, src_img, ldb = xi, imul(b, n0, xs[0]), xs[1]
            else:
                src, src_img, ldb = cols, 0, ld
                with _images(b, count) as j:
                    cv.im2col(b, kb, xi, xs, imul(b, iadd(b, n0, j), xs[0]), cols,
                              imul(b, j, g.p), ld)
            if gyt is not None:
                _gather_grad(b, kb, g, gi, gs, n0, count, gyt)
                a, a_img, lda = gyt, 0, ld
            else:
                a, a_img, lda = gi, imul(b, n0, gs[0]), gs[1]
            # the first block writes the gradient, the later ones add to it (in the GEMM)
            beta = (zero if n0 == 0 else one) if isinstance(n0, int) else \
                b.select(b.icmp_signed("==", n0, i64(0)), zero, one)
            for grp in range(g.groups):
                if transposed:  # gw_g^T (K x O/g) += cols_g @ gy_g^T
                    cv.gemm(b, kb, _NOTRANS, _TRANS, g.k, g.og, ld,
                            src, iadd(b, src_img, grp * g.k * ldb), ldb,
                            a, iadd(b, a_img, grp * g.og * lda), lda, beta,
                            gwt, grp * g.k * g.og, g.og)
                else:  # gw_g (O/g x K) += gy_g @ cols_g^T
                    cv.gemm(b, kb, _NOTRANS, _TRANS, g.og, g.k, ld,
                            a, iadd(b, a_img, grp * g.og * lda), lda,
                            src, iadd(b, src_img, grp * g.k * ldb), ldb, beta,
                            oi, grp * g.og * g.k, g.k)

        _over_blocks(b, g.n, nb, block)
        if transposed:
            _untranspose(b, kb, g, gwt, oi)
        lw.calls.append(kb.finish(b))


def _untranspose(b, kb, g: Geometry, gwt, gw, tile: int = 32) -> None:
    """gw[grp, o, k] = gwt[grp, k, o], in tiles of `tile` k's (both sides stay in cache)."""
    with loop(b, 0, g.groups, "grp") as grp, loop(b, 0, -(-g.k // tile), "tile") as t:
        k_lo = b.mul(t, i64(tile))
        k_hi = b.add(k_lo, i64(tile))
        k_hi = b.select(b.icmp_signed("<", k_hi, i64(g.k)), k_hi, i64(g.k))
        with loop(b, 0, g.og, "o") as o:
            to = iadd(b, imul(b, grp, g.og * g.k), imul(b, o, g.k))
            frm = iadd(b, imul(b, grp, g.k * g.og), o)
            with loop(b, k_lo, k_hi, "k") as k:
                kb.store(b, gw, b.add(to, k), kb.load(b, gwt, iadd(b, frm, imul(b, k, g.og))))


# ---- pooling ---------------------------------------------------------------------------------
def _planes(loc: Loc):
    """(sizes, element strides) of the leading dims of an (N, C, H, W) / (C, H, W) tensor."""
    s = _estrides(loc)
    return loc.type.shape[:-2], s[:-2], s[-2], s[-1]


@contextmanager
def _over_planes(b, sizes, strides_list):
    """Loops over the leading dims; yields each operand's plane offset."""
    offs = [0] * len(strides_list)
    stack = []
    for d, n in enumerate(sizes):
        cm = loop(b, 0, n, f"p{d}")
        i = cm.__enter__()
        stack.append(cm)
        offs = [iadd(b, o, imul(b, i, s[d])) for o, s in zip(offs, strides_list)]
    yield offs
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


def _pool_tables(lw, in_hw, out_hw, kernel_size, stride, padding, dilation):
    rows = [Table(lw, t) for t in _taps(in_hw[0], out_hw[0], kernel_size[0], stride[0],
                                        padding[0], dilation[0])]
    cols = [Table(lw, t) for t in _taps(in_hw[1], out_hw[1], kernel_size[1], stride[1],
                                        padding[1], dilation[1])]
    return rows, cols


def max_pool2d(lw, node: Node) -> None:
    (x,), (vals, idx) = node.inputs, node.outputs
    a = node.attrs
    dt = x.type.dtype
    h, w = x.type.shape[-2:]
    ho, wo = vals.type.shape[-2:]
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a["dilation"]
    rows, cols = _pool_tables(lw, (h, w), (ho, wo), a["kernel_size"], a["stride"],
                              a["padding"], a["dilation"])
    lx, lv, li = lw.locs[x], lw.locs[vals], lw.locs[idx]
    kb, (xi, vi, ii) = image_kernel(lw, "max_pool2d", [lx, lv, li])
    sizes, xs, xsh, xsw = _planes(lx)
    _, vs, vsh, vsw = _planes(lv)
    _, is_, ish, isw = _planes(li)
    b = kb.begin()
    with b.goto_entry_block():
        best = b.alloca(REG[dt.name], name="best")
        where = b.alloca(I64, name="where")

    def better(v, m):
        if dt.is_floating:
            return b.or_(b.fcmp_ordered(">", v, m), b.fcmp_unordered("!=", v, v))
        return b.icmp_signed(">", v, m)

    full = all(t.uniform for t in rows + cols) and (rows[0].values[0], rows[1].values[0],
                                                    cols[0].values[0], cols[1].values[0]) \
        == (0, a["kernel_size"][0], 0, a["kernel_size"][1])
    with _over_planes(b, sizes, [xs, vs, is_]) as (xo, vo, io):
        if full:  # every tap of every window is inside: tap by tap, a select per output
            # over the row of outputs (an inner loop that vectorises, no branches)
            with loop(b, 0, ho, "oh") as oh:
                ih0 = iadd(b, imul(b, oh, sh), -ph)
                vrow = iadd(b, vo, imul(b, oh, vsh))
                irow = iadd(b, io, imul(b, oh, ish))
                for i in range(a["kernel_size"][0]):
                    ih = iadd(b, ih0, i * dh)
                    for j in range(a["kernel_size"][1]):
                        with loop(b, 0, wo, "ow") as ow:
                            iw = iadd(b, imul(b, ow, sw), j * dw - pw)
                            v = kb.load(b, xi, iadd(b, xo, imul(b, ih, xsh), imul(b, iw, xsw)))
                            flat = iadd(b, imul(b, ih, w), iw)
                            vat = iadd(b, vrow, imul(b, ow, vsw))
                            iat = iadd(b, irow, imul(b, ow, isw))
                            if i or j:
                                m = kb.load(b, vi, vat)
                                up = better(v, m)
                                v = b.select(up, v, m)
                                flat = b.select(up, flat, kb.load(b, ii, iat))
                            kb.store(b, vi, vat, v)
                            kb.store(b, ii, iat, flat)
        else:
            with loop(b, 0, ho, "oh") as oh:
                i_lo, i_hi = (t(b, oh) for t in rows)
                ih0 = iadd(b, imul(b, oh, sh), -ph)
                with loop(b, 0, wo, "ow") as ow:
                    j_lo, j_hi = (t(b, ow) for t in cols)
                    iw0 = iadd(b, imul(b, ow, sw), -pw)
                    ih = iadd(b, ih0, imul(b, i_lo, dh))
                    iw = iadd(b, iw0, imul(b, j_lo, dw))
                    b.store(kb.load(b, xi, iadd(b, xo, imul(b, ih, xsh), imul(b, iw, xsw))), best)
                    b.store(as_i64(iadd(b, imul(b, ih, w), iw)), where)
                    with loop(b, i_lo, i_hi, "ki") as i:
                        ih = iadd(b, ih0, imul(b, i, dh))
                        with loop(b, j_lo, j_hi, "kj") as j:
                            iw = iadd(b, iw0, imul(b, j, dw))
                            v = kb.load(b, xi, iadd(b, xo, imul(b, ih, xsh), imul(b, iw, xsw)))
                            m = b.load(best)
                            up = better(v, m)
                            b.store(b.select(up, v, m), best)
                            b.store(b.select(up, iadd(b, imul(b, ih, w), iw), b.load(where)),
                                    where)
                    kb.store(b, vi, iadd(b, vo, imul(b, oh, vsh), imul(b, ow, vsw)), b.load(best))
                    kb.store(b, ii, iadd(b, io, imul(b, oh, ish), imul(b, ow, isw)),
                             b.load(where))
    lw.calls.append(kb.finish(b))


def max_pool2d_grad(lw, node: Node) -> None:
    (g, idx), out = node.inputs, node.outputs[0]
    dt = out.type.dtype
    h, w = out.type.shape[-2:]
    ho, wo = g.type.shape[-2:]
    lg, li = lw.locs[g], lw.locs[idx]
    with contiguous_out(lw, lw.locs[out]) as lo:
        kb, (gi, ii, oi) = image_kernel(lw, "max_pool2d_grad", [lg, li, lo])
        kb.kernel.status = True
        lw.errors.append(f"max_pool2d_grad: an index is out of the {h}x{w} plane (0..."
                         f"{h * w - 1}) in node {format_node(node)}"
                         f"{' at ' + node.loc if node.loc else ''}")
        code = len(lw.errors)
        sizes, gs, gsh, gsw = _planes(lg)
        _, is_, ish, isw = _planes(li)
        os_ = contiguous_strides(sizes, h * w)
        b = kb.begin()
        with b.goto_entry_block():
            status = b.alloca(I32, name="status")
        b.store(ir.Constant(I32, 0), status)
        with loop(b, 0, out.type.numel, "zero") as q:
            kb.store(b, oi, q, const(dt, 0.0))
        with _over_planes(b, sizes, [gs, is_, os_]) as (go, io, oo):
            with loop(b, 0, ho, "oh") as oh:
                with loop(b, 0, wo, "ow") as ow:
                    k = kb.load(b, ii, iadd(b, io, imul(b, oh, ish), imul(b, ow, isw)))
                    v = kb.load(b, gi, iadd(b, go, imul(b, oh, gsh), imul(b, ow, gsw)))
                    inside = b.and_(b.icmp_signed(">=", k, i64(0)),
                                    b.icmp_signed("<", k, i64(h * w)))
                    b.store(b.select(inside, b.load(status), ir.Constant(I32, code)), status)
                    at = as_i64(iadd(b, oo, b.select(inside, k, i64(0))))
                    v = b.select(inside, v, const(dt, 0.0))
                    kb.store(b, oi, at, b.fadd(kb.load(b, oi, at), v))
        b.ret(b.load(status))
        lw.calls.append(kb.kernel)


def _avg_divisors(lw, in_hw, out_hw, a):
    """(row table, column table) whose product is each window's divisor, or None with an
    override (see graphc.ops.pool._avg_divisor)."""
    if a["divisor_override"] is not None:
        return None
    tabs = []
    for n, o, k, s, p in zip(in_hw, out_hw, a["kernel_size"], a["stride"], a["padding"]):
        sizes = []
        for q in range(o):
            start = q * s - p
            end = min(start + k, n + p)
            sizes.append(end - start if a["count_include_pad"] else min(end, n) - max(start, 0))
        tabs.append(Table(lw, sizes))
    return tabs


def _divisor(b, dt, divs, oh, ow, override):
    if divs is None:
        return const(dt, float(override))
    row, col = divs[0](b, oh), divs[1](b, ow)
    if isinstance(row, int) and isinstance(col, int):
        return const(dt, float(row * col))
    return b.sitofp(b.mul(as_i64(row), as_i64(col)), REG[dt.name])


def avg_pool2d(lw, node: Node) -> None:
    x, out = node.inputs[0], node.outputs[0]
    a = node.attrs
    dt = x.type.dtype
    h, w = x.type.shape[-2:]
    ho, wo = out.type.shape[-2:]
    (sh, sw), (ph, pw) = a["stride"], a["padding"]
    rows, cols = _pool_tables(lw, (h, w), (ho, wo), a["kernel_size"], a["stride"],
                              a["padding"], (1, 1))
    divs = _avg_divisors(lw, (h, w), (ho, wo), a)
    lx, lo = lw.locs[x], lw.locs[out]
    kb, (xi, oi) = image_kernel(lw, "avg_pool2d", [lx, lo])
    sizes, xs, xsh, xsw = _planes(lx)
    _, os_, osh, osw = _planes(lo)
    b = kb.begin()
    with b.goto_entry_block():
        acc = b.alloca(REG[dt.name], name="acc")
    with _over_planes(b, sizes, [xs, os_]) as (xo, oo):
        with loop(b, 0, ho, "oh") as oh:
            i_lo, i_hi = (t(b, oh) for t in rows)
            ih0 = iadd(b, imul(b, oh, sh), -ph)
            with loop(b, 0, wo, "ow") as ow:
                j_lo, j_hi = (t(b, ow) for t in cols)
                iw0 = iadd(b, imul(b, ow, sw), -pw)
                b.store(const(dt, 0.0), acc)
                with loop(b, i_lo, i_hi, "ki") as i:
                    row = iadd(b, xo, imul(b, iadd(b, ih0, i), xsh))
                    with loop(b, j_lo, j_hi, "kj") as j:
                        v = kb.load(b, xi, iadd(b, row, imul(b, iadd(b, iw0, j), xsw)))
                        b.store(b.fadd(b.load(acc), v), acc)
                d = _divisor(b, dt, divs, oh, ow, a["divisor_override"])
                kb.store(b, oi, iadd(b, oo, imul(b, oh, osh), imul(b, ow, osw)),
                         b.fdiv(b.load(acc), d))
    lw.calls.append(kb.finish(b))


def avg_pool2d_grad(lw, node: Node) -> None:
    g, out = node.inputs[0], node.outputs[0]
    a = node.attrs
    dt = out.type.dtype
    h, w = out.type.shape[-2:]
    ho, wo = g.type.shape[-2:]
    (sh, sw), (ph, pw) = a["stride"], a["padding"]
    rows, cols = _pool_tables(lw, (h, w), (ho, wo), a["kernel_size"], a["stride"],
                              a["padding"], (1, 1))
    divs = _avg_divisors(lw, (h, w), (ho, wo), a)
    lg = lw.locs[g]
    with contiguous_out(lw, lw.locs[out]) as lo:
        kb, (gi, oi) = image_kernel(lw, "avg_pool2d_grad", [lg, lo])
        sizes, gs, gsh, gsw = _planes(lg)
        os_ = contiguous_strides(sizes, h * w)
        b = kb.begin()
        with loop(b, 0, out.type.numel, "zero") as q:
            kb.store(b, oi, q, const(dt, 0.0))
        with _over_planes(b, sizes, [gs, os_]) as (go, oo):
            with loop(b, 0, ho, "oh") as oh:
                i_lo, i_hi = (t(b, oh) for t in rows)
                ih0 = iadd(b, imul(b, oh, sh), -ph)
                with loop(b, 0, wo, "ow") as ow:
                    j_lo, j_hi = (t(b, ow) for t in cols)
                    iw0 = iadd(b, imul(b, ow, sw), -pw)
                    d = _divisor(b, dt, divs, oh, ow, a["divisor_override"])
                    v = b.fdiv(kb.load(b, gi, iadd(b, go, imul(b, oh, gsh), imul(b, ow, gsw))),
                               d)
                    with loop(b, i_lo, i_hi, "ki") as i:
                        row = iadd(b, oo, imul(b, iadd(b, ih0, i), w))
                        with loop(b, j_lo, j_hi, "kj") as j:
                            at = as_i64(iadd(b, row, iadd(b, iw0, j)))
                            kb.store(b, oi, at, b.fadd(kb.load(b, oi, at), v))
        lw.calls.append(kb.finish(b))


# ---- batch_norm ------------------------------------------------------------------------------
def batch_norm(lw, node: Node) -> None:
    x, weight, bias, rmean, rvar = node.inputs
    out, mean_v, invstd_v = node.outputs
    dt = x.type.dtype
    if dt not in (float32, float64):
        raise unsupported(node, f"batch_norm of {dt.name}")
    training, eps = node.attrs["training"], node.attrs["eps"]
    n, c = x.type.shape[:2]
    s = math.prod(x.type.shape[2:])
    count = n * s
    lx = contiguous_in(lw, lw.locs[x])
    params = [lw.locs[v] for v in (weight, bias, rmean, rvar)]
    pstr = [_estrides(p)[0] if p.type.ndim else 0 for p in params]
    with contiguous_out(lw, lw.locs[out]) as lo:
        locs = [lx, *params, lo, lw.locs[mean_v], lw.locs[invstd_v]]
        kb, (xi, wi, bi, rmi, rvi, oi, mi, ii) = image_kernel(lw, "batch_norm", locs)
        ms, is_ = (_estrides(lw.locs[v])[0] for v in (mean_v, invstd_v))
        b = kb.begin()
        with b.goto_entry_block():
            acc = b.alloca(F64, name="acc")

        def over(b, ch, fn):
            with loop(b, 0, n, "n") as k:
                base = b.add(b.mul(k, i64(c * s)), b.mul(ch, i64(s)))
                with loop(b, 0, s, "s") as q:
                    fn(b, b.add(base, q))

        def wide(v):
            return convert(b, v, dt, float64)

        with loop(b, 0, c, "c") as ch:
            if training:
                b.store(ir.Constant(F64, 0.0), acc)
                over(b, ch, lambda b, at: b.store(
                    _fadd(b, b.load(acc), convert(b, kb.load(b, xi, at), dt, float64), True),
                    acc))
                mean = b.fdiv(b.load(acc), ir.Constant(F64, float(count)))
                b.store(ir.Constant(F64, 0.0), acc)

                def sq(b, at):
                    d = b.fsub(convert(b, kb.load(b, xi, at), dt, float64), mean)
                    b.store(_fadd(b, b.load(acc), b.fmul(d, d), True), acc)

                over(b, ch, sq)
                var = b.fdiv(b.load(acc), ir.Constant(F64, float(count)))
            else:
                mean = wide(kb.load(b, rmi, imul(b, ch, pstr[2])))
                var = wide(kb.load(b, rvi, imul(b, ch, pstr[3])))
            root = lw.scalars.intrinsic(b, "llvm.sqrt", float64,
                                        b.fadd(var, ir.Constant(F64, float(eps))))
            invstd = b.fdiv(ir.Constant(F64, 1.0), root)
            scale = b.fmul(invstd, wide(kb.load(b, wi, imul(b, ch, pstr[0]))))
            shift = wide(kb.load(b, bi, imul(b, ch, pstr[1])))

            def norm(b, at):
                v = b.fsub(convert(b, kb.load(b, xi, at), dt, float64), mean)
                kb.store(b, oi, at, convert(b, b.fadd(b.fmul(v, scale), shift), float64, dt))

            over(b, ch, norm)
            kb.store(b, mi, imul(b, ch, ms), convert(b, mean, float64, dt))
            kb.store(b, ii, imul(b, ch, is_), convert(b, invstd, float64, dt))
        lw.calls.append(kb.finish(b))
