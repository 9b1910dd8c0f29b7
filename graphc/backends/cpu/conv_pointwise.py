"""conv_pointwise: the three passes of a strided 1x1 convolution as kernels of their own.

ResNet's downsample shortcuts are 1x1 convolutions at stride 2 with no padding: per image a
GEMM `out (O x P) = w (O x C) @ xs (C x P)`, where xs is every s-th row and column of the
image (P = H_out * W_out). graphc.backends.cpu.conv lowered them through im2col (a strided
copy into columns, then a GEMM per image or per block of images), col2im for the input
gradient (the whole gradient zeroed, then the GEMM's columns added into it) and a per-image
transposed copy of gy for the weight gradient; this module runs them as one generated
register-tiled product per block of images (`PointwiseGemm`, graphc.backends.cpu.
small_gemm_tile's broadcast FMA tiles) whose operands are addressed image by image, so no
result or gradient is copied between layouts:

- forward: each block's subsampled images packed as (C x P) planes of vectors of 16
  positions (one or more input rows shuffled into one register: `_subsampled`), then
  `out[n] = w @ xs[n]` written straight into the NCHW output, the block's images side by
  side as the product's columns;
- input gradient: `cols[n] (C x P) = w^T @ gy[n]` (gy read in place), then each input row
  of gx written once: the even rows the columns' values shuffled between zeros, the others
  zeros (`_spread`), while the block's columns are in cache (no zeroing pass, no
  read-modify-write);
- weight gradient: `gw (O x C) (+)= gy[n] (O x P) @ xs[n]^T (P x C)`, a block's xs^T packed
  by transposing 16 x 16 squares of subsampled vectors in registers, gy broadcast from
  where it lies; the product runs k over the block's images and positions, beta 0 for the
  kernel's (or share's) first block and 1 after; split over the cores, the shares' partial
  gradients are added in share order after (as conv.py's weight gradient).

Taken (`takes`) for float32 on a host with 16-float vector registers (winograd_gemm's
AVX-512 test), stride s >= 2 equal in both dimensions, planes exactly s times the output
(H = s * H_out, W = s * W_out, W <= MAX_ROW), contiguous NCHW operands, P a whole number of
16-position vectors or a divisor of 16 (and, for the weight gradient, C a multiple of 16);
static sizes. `ENABLED = False` keeps conv.py's im2col path (A/B runs).

Rounding: every element sums its k (C, O, or the block's N * P) in blocks of up to K_BLOCK
steps (fused multiply-adds in order), the blocks' sums added in c, as a BLAS blocks k;
judged by distance from a float64 run (tests/test_cpu_conv_pointwise.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from graphc.backends.cpu import conv_threads, winograd_gemm
from graphc.backends.cpu.conv_blocks import walk_blocks
from graphc.backends.cpu.conv_workspace import workspace
from graphc.backends.cpu.gemm_panels import counted
from graphc.backends.cpu.image_kernels import (
    called_kernel,
    iadd,
    image_kernel,
    imul,
    is_contiguous,
)
from graphc.backends.cpu.small_gemm_tile import broadcast_fma, fma_intrinsic
from graphc.backends.cpu.values import (
    F32,
    I64,
    PTR,
    as_i64,
    i64,
    lane_mask,
    loop,
    square_transposed,
)
from graphc.types import float32

__all__ = ["ENABLED", "PointwiseGemm", "conv2d", "conv2d_input_grad", "conv2d_weight_grad",
           "gemm_function", "plan_gemm", "takes"]

ENABLED = True  # False: conv.py's im2col path (A/B runs, benchmarks)
LANES = 16  # floats a vector register (the AVX-512 hosts winograd_gemm serves)
MAX_ROW = 64  # the widest input row shuffled in registers (`_subsampled`, `_spread`)
K_BLOCK = 128  # k steps summed in registers before the tile is added to c
ACCUMULATORS = 24  # of the 32 vector registers (winograd_gemm's tiles)
# the bytes of one block's packed operand or columns (the block's images): a block stays in
# L2 while the product walks it
BLOCK_BYTES = 256 << 10


@dataclass(frozen=True)
class PointwiseGemm:
    """c (+)= a @ b, the k index (kn, kq) and the column index (jn, jq) each two-level
    (images, then positions or channels within one):

    a[r, (kn, kq)] at r * a_row + kn * a_kn + kq * a_kq;
    b[(kn, kq), (jn, jq)] at kn * b_kn + kq * b_kq + jn * b_jn + jq (jq contiguous);
    c[r, (jn, jq)] at r * c_row + jn * c_jn + jq.

    m rows, kn x kq steps of k, jn x jq columns (jq a multiple of `lanes`: a vector never
    spans two images); tiles of `rows` x `vectors` registers; k summed in registers over
    blocks of `k_block` steps (whole kq runs of k_block // kq images where kq < k_block)."""

    m: int
    kn: int
    kq: int
    jn: int
    jq: int
    a_row: int
    a_kn: int
    a_kq: int
    b_kn: int
    b_kq: int
    b_jn: int
    c_row: int
    c_jn: int
    rows: int
    vectors: int
    k_block: int
    lanes: int = LANES

    @property
    def name(self) -> str:
        return (f"graphc_pointwise_gemm_{self.m}_k{self.kn}x{self.kq}_j{self.jn}x{self.jq}"
                f"_a{self.a_row}_{self.a_kn}_{self.a_kq}_b{self.b_kn}_{self.b_kq}_{self.b_jn}"
                f"_c{self.c_row}_{self.c_jn}_t{self.rows}x{self.vectors}_kb{self.k_block}")


def plan_gemm(m: int, kn: int, kq: int, jn: int, jq: int, a_row: int, a_kn: int, a_kq: int,
              b_kn: int, b_kq: int, b_jn: int, c_row: int, c_jn: int) -> PointwiseGemm:
    """The tile and k blocks for a product (the caller checked jq % LANES == 0)."""
    vectors_total = jn * jq // LANES
    vectors = next(v for v in (4, 2, 1) if vectors_total % v == 0)
    most = ACCUMULATORS // vectors
    rows = -(-m // -(-m // most))  # as many rows as the registers hold, split evenly
    if kq >= K_BLOCK:
        k_block = next(d for d in range(K_BLOCK, 0, -1) if kq % d == 0)
    else:
        images = next(d for d in range(max(1, K_BLOCK // kq), 0, -1) if kn % d == 0)
        k_block = images * kq
    return PointwiseGemm(m, kn, kq, jn, jq, a_row, a_kn, a_kq, b_kn, b_kq, b_jn, c_row,
                         c_jn, rows, vectors, k_block)


def gemm_function(module: ir.Module, g: PointwiseGemm) -> ir.Function:
    """The module's `void name(ptr a, ptr b, ptr c, float beta)` for `g` (emitted on first
    use): beta 0 writes c, beta 1 adds to it."""
    existing = module.globals.get(g.name)
    if existing is not None:
        return existing
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, F32]), g.name)
    for arg in fn.args[:3]:
        arg.add_attribute("noalias")
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    a, bm, c, beta = fn.args
    accumulate = b.fcmp_ordered("!=", beta, ir.Constant(F32, 0.0))
    width = g.vectors * g.lanes
    full, rest = divmod(g.m, g.rows)
    with counted(b, g.jn * g.jq // width, "panel") as panel:
        b_cols, c_cols = [], []  # each vector's column offset in b and in c
        for v in range(g.vectors):
            j = b.add(b.mul(panel, i64(width)), i64(v * g.lanes))
            jn, jq = b.udiv(j, i64(g.jq)), b.urem(j, i64(g.jq))
            b_cols.append(b.add(b.mul(jn, i64(g.b_jn)), jq))
            c_cols.append(b.add(b.mul(jn, i64(g.c_jn)), jq))

        def blocks(kn0, kq0, count, first):
            adding = accumulate if first else True
            if full:
                with counted(b, full, "block") as block:
                    _tile(b, g, a, bm, c, b.mul(block, i64(g.rows)), g.rows, kn0, kq0,
                          count, b_cols, c_cols, adding)
            if rest:
                _tile(b, g, a, bm, c, i64(full * g.rows), rest, kn0, kq0, count, b_cols,
                      c_cols, adding)

        if g.kq >= g.k_block:  # per image, its kq in blocks
            blocks(i64(0), 0, g.k_block, True)
            for kq0 in range(g.k_block, g.kq, g.k_block):
                blocks(i64(0), kq0, g.k_block, False)
            if g.kn > 1:
                with loop(b, 1, g.kn, "kn") as kn:
                    for kq0 in range(0, g.kq, g.k_block):
                        blocks(kn, kq0, g.k_block, False)
        else:  # whole runs of kq, k_block // kq images a block
            images = g.k_block // g.kq
            blocks(i64(0), 0, g.k_block, True)
            if g.kn > images:
                with counted(b, g.kn // images - 1, "kgroup") as group:
                    kn0 = b.mul(b.add(group, i64(1)), i64(images))
                    blocks(kn0, 0, g.k_block, False)
    b.ret_void()
    return fn


def _tile(b, g: PointwiseGemm, a, bm, c, row0, rows: int, kn0, kq0: int, count: int,
          b_cols, c_cols, accumulate) -> None:
    """c[row0 : row0 + rows, the panel's vectors] (+)= a @ b over `count` steps of k from
    (kn0, kq0): the sums in registers (one loop over kq per image of the block, unrolled
    over the images: no division in the loop), then stored or added."""
    vec = ir.VectorType(F32, g.lanes)
    zero = ir.Constant(vec, [0.0] * g.lanes)
    sums = [[zero] * g.vectors for _ in range(rows)]
    if count > g.kq:  # a run of whole images
        for image in range(count // g.kq):
            sums = _k_run(b, g, a, bm, row0, rows, b.add(kn0, i64(image)), 0, g.kq, b_cols,
                          sums)
    else:
        sums = _k_run(b, g, a, bm, row0, rows, kn0, kq0, count, b_cols, sums)
    for r, row in enumerate(sums):
        at = b.mul(b.add(row0, i64(r)), i64(g.c_row))
        for col, value in zip(c_cols, row):
            pointer = b.gep(c, [b.add(at, col)], inbounds=True, source_etype=F32)
            # beta 1 adds to c; beta 0 stores (c's old contents, maybe not numbers, unused)
            old = b.load(pointer, typ=vec, align=4)
            total = b.fadd(old, value)
            if accumulate is not True:
                total = b.select(accumulate, total, value)
            b.store(total, pointer, align=4)


def _k_run(b, g: PointwiseGemm, a, bm, row0, rows: int, kn, kq0: int, count: int, b_cols,
           sums_in: list) -> list:
    """The tile's sums `sums_in` plus a[rows, (kn, kq)] * b[(kn, kq), cols] for kq in
    [kq0, kq0 + count), in order (phi nodes through one loop); returns the new sums."""
    vec = ir.VectorType(F32, g.lanes)
    splat_mask = ir.Constant(ir.VectorType(ir.IntType(32), g.lanes), [0] * g.lanes)
    fma = fma_intrinsic(b.module, vec)
    b_image = b.mul(kn, i64(g.b_kn))
    a_image = b.mul(kn, i64(g.a_kn))
    pre = b.block
    body = b.append_basic_block("k.body")
    b.branch(body)
    b.position_at_end(body)
    t = b.phi(I64, name="t")
    t.add_incoming(i64(0), pre)
    sums = [[b.phi(vec, name=f"s{r}_{v}") for v in range(g.vectors)] for r in range(rows)]
    for row, row_in in zip(sums, sums_in):
        for s, s_in in zip(row, row_in):
            s.add_incoming(s_in, pre)
    kq = b.add(t, i64(kq0))
    b_row = b.add(b_image, b.mul(kq, i64(g.b_kq)))
    bvecs = [b.load(b.gep(bm, [b.add(b_row, col)], inbounds=True, source_etype=F32),
                    typ=vec, align=4) for col in b_cols]
    a_col = b.add(a_image, b.mul(kq, i64(g.a_kq)))
    new = broadcast_fma(b, a, row0, rows, g.a_row, a_col, bvecs, sums, fma, splat_mask)
    nxt = b.add(t, i64(1), name="t.next")
    nxt.flags.append("nuw")
    for row, row_new in zip(sums, new):
        for s, s_new in zip(row, row_new):
            s.add_incoming(s_new, body)
    t.add_incoming(nxt, body)
    end = b.append_basic_block("k.end")
    b.cbranch(b.icmp_unsigned("<", nxt, i64(count)), body, end)
    b.position_at_end(end)
    return new


def takes(g, dt, *locs) -> bool:
    """Whether this module's kernels serve the convolution `g` (see the module docstring)."""
    if not ENABLED or dt is not float32 or not winograd_gemm.available():
        return False
    s = g.stride[0]
    if (g.kh, g.kw) != (1, 1) or g.padding != (0, 0) or g.dilation != (1, 1) or \
            g.groups != 1 or g.stride != (s, s) or s < 2:
        return False
    if not all(type(d) is int for d in (g.n, g.c, g.h, g.w, g.o, g.ho, g.wo)):
        return False
    if (g.h, g.w) != (s * g.ho, s * g.wo) or g.w > MAX_ROW or g.p % LANES or \
            not (g.wo % LANES == 0 or LANES % g.wo == 0):
        return False
    return all(is_contiguous(loc) for loc in locs)


def _images(g, floats: int) -> int:
    """Images per block: as many as BLOCK_BYTES of `floats` floats an image hold (>= 1)."""
    return max(1, min(g.n, BLOCK_BYTES // (4 * floats)))


def _subsampled(b, kb, x: int, g, plane, u) -> ir.Value:
    """The 16 positions [16u, 16u + 16) of one subsampled plane (x[plane + s*i*W + s*j]) as
    one vector: from one input row (W_out a multiple of 16) or 16 / W_out rows, each loaded
    as a vector and shuffled (its every s-th lane), the rows' pieces joined pairwise."""
    s, width = g.stride[0], g.w
    if g.wo % LANES == 0:
        per_row = g.wo // LANES
        i, j0 = b.udiv(u, i64(per_row)), b.mul(b.urem(u, i64(per_row)), i64(LANES))
        at = iadd(b, plane, imul(b, i, s * width), imul(b, j0, s))
        row = b.load(kb.pointer(b, x, at), typ=ir.VectorType(F32, LANES * s), align=4)
        return b.shuffle_vector(row, ir.Constant(row.type, ir.Undefined),
                                lane_mask([lane * s for lane in range(LANES)]))
    per = LANES // g.wo
    row_t = ir.VectorType(F32, width)
    first = b.mul(u, i64(per))
    rows = [b.load(kb.pointer(b, x, iadd(b, plane, imul(b, b.add(first, i64(t)), s * width))),
                   typ=row_t, align=4) for t in range(per)]
    picks = [lane * s for lane in range(g.wo)]
    parts = [b.shuffle_vector(rows[t], rows[t + 1], lane_mask(picks + [width + p for p in picks]))
             for t in range(0, per, 2)]
    while len(parts) > 1:
        n = parts[0].type.count
        parts = [b.shuffle_vector(parts[t], parts[t + 1], lane_mask(list(range(2 * n))))
                 for t in range(0, len(parts), 2)]
    return parts[0]


def _pack(b, kb, g, xi: int, n0, count: int, pi: int) -> None:
    """pack[(j*C + c)*P + q] = x[n0 + j, c, s*i, s*j'] (q = i*W_out + j'): the block's
    subsampled planes, 16 positions a store."""
    plane_size = g.h * g.w
    with loop(b, 0, count * g.c, "plane") as r:
        plane = iadd(b, imul(b, n0, g.c * plane_size), imul(b, r, plane_size))
        with loop(b, 0, g.p // LANES, "u") as u:
            v = _subsampled(b, kb, xi, g, plane, u)
            at = iadd(b, imul(b, r, g.p), imul(b, u, LANES))
            b.store(v, kb.pointer(b, pi, at), align=4)


def _pack_transposed(b, kb, g, xi: int, n0, count: int, pi: int) -> None:
    """pack[(j*P + q)*C + c] = x[n0 + j, c, s*i, s*j']: the block's subsampled planes
    transposed, by squares of 16 channels x 16 positions in registers."""
    plane_size = g.h * g.w
    with loop(b, 0, count, "img") as j, loop(b, 0, g.c // LANES, "cg") as cg:
        image = imul(b, b.add(as_i64(n0), j), g.c * plane_size)
        with loop(b, 0, g.p // LANES, "u") as u:
            vecs = [_subsampled(b, kb, xi, g,
                                iadd(b, image, imul(b, b.add(b.mul(cg, i64(LANES)), i64(ch)),
                                                    plane_size)), u)
                    for ch in range(LANES)]
            for lane, v in enumerate(square_transposed(b, vecs)):
                q = b.add(b.mul(u, i64(LANES)), i64(lane))
                at = iadd(b, imul(b, b.add(b.mul(j, i64(g.p)), q), g.c), imul(b, cg, LANES))
                b.store(v, kb.pointer(b, pi, at), align=4)


def _spread(b, kb, g, ci: int, oi: int, n0, count: int) -> None:
    """gx[n0 + j, c, s*i + t, :] for the block's images, each input row written once: row
    t = 0 the columns' row i (cols[(j*C + c)*P + i*W_out + j']) at lanes s*j', zeros
    between; rows t > 0 zeros."""
    s, width, wo = g.stride[0], g.w, g.wo
    zero_in = ir.Constant(ir.VectorType(F32, wo), [0.0] * wo)
    zero_row = ir.Constant(ir.VectorType(F32, width), [0.0] * width)
    spread = lane_mask([iw // s if iw % s == 0 else wo for iw in range(width)])
    with loop(b, 0, count * g.c * g.ho, "row") as r:  # (j, c, i): the same order both sides
        v = b.load(kb.pointer(b, ci, imul(b, r, wo)), typ=zero_in.type, align=4)
        at = iadd(b, imul(b, n0, g.c * g.h * g.w), imul(b, r, s * width))
        b.store(b.shuffle_vector(v, zero_in, spread), kb.pointer(b, oi, at), align=4)
        for t in range(1, s):
            b.store(zero_row, kb.pointer(b, oi, iadd(b, at, t * width)), align=4)


def _gemm_call(lw, b, kb, gemm: PointwiseGemm, operands, beta) -> None:
    fn = gemm_function(lw.module, gemm)
    b.call(fn, [kb.pointer(b, k, as_i64(at)) for k, at in operands] + [beta])


def conv2d(lw, node, g, x, w, out) -> bool:
    """out = conv2d(x, w) for a strided 1x1 convolution `takes` serves, or False."""
    dt = x.type.dtype
    if not takes(g, dt, x, w, out):
        return False
    nb = _images(g, g.c * g.p)
    shapes = [(nb * g.c * g.p,)]
    split = conv_threads.plan_split(lw, dt, shapes, -(-g.n // nb), g.n * g.o * g.c * g.p)
    temps = workspace(lw, dt, *shapes) if split is None else split.locs + [split.control]
    kb, ids = image_kernel(lw, "conv2d_pointwise", [x, w, out] + temps,
                           ("pointwise", g.key(), split is not None))
    xi, wi, oi, pi = ids[:4]
    b = kb.begin()
    if b is None:  # built before for a node of the same geometry
        lw.calls.append(called_kernel(lw, kb.kernel, split))
        return True

    def block(b, n0, count):
        _pack(b, kb, g, xi, n0, count, pi)
        gemm = plan_gemm(g.o, 1, g.c, count, g.p, a_row=g.c, a_kn=0, a_kq=1, b_kn=0,
                         b_kq=g.p, b_jn=g.c * g.p, c_row=g.p, c_jn=g.o * g.p)
        _gemm_call(lw, b, kb, gemm, [(wi, 0), (pi, 0), (oi, imul(b, n0, g.o * g.p))],
                   ir.Constant(F32, 0.0))

    walk_blocks(b, kb, g, nb, split, ids[-1], block)
    lw.calls.append(called_kernel(lw, kb.finish(b), split))
    return True


def conv2d_input_grad(lw, node, g) -> bool:
    """gx of a strided 1x1 convolution `takes` serves (see the module docstring), or False."""
    gy, w = node.inputs
    gl, wl, out = lw.locs[gy], lw.locs[w], lw.locs[node.outputs[0]]
    dt = gl.type.dtype
    if not takes(g, dt, gl, wl, out):
        return False
    nb = _images(g, g.c * g.p)
    shapes = [(nb * g.c * g.p,)]
    split = conv_threads.plan_split(lw, dt, shapes, -(-g.n // nb), g.n * g.o * g.c * g.p)
    temps = workspace(lw, dt, *shapes) if split is None else split.locs + [split.control]
    kb, ids = image_kernel(lw, "conv2d_input_grad_pointwise", [gl, wl, out] + temps,
                           ("pointwise", g.key(), split is not None))
    gi, wi, oi, ci = ids[:4]
    b = kb.begin()
    if b is None:
        lw.calls.append(called_kernel(lw, kb.kernel, split))
        return True

    def block(b, n0, count):
        gemm = plan_gemm(g.c, 1, g.o, count, g.p, a_row=1, a_kn=0, a_kq=g.c, b_kn=0,
                         b_kq=g.p, b_jn=g.o * g.p, c_row=g.p, c_jn=g.c * g.p)
        _gemm_call(lw, b, kb, gemm, [(wi, 0), (gi, imul(b, n0, g.o * g.p)), (ci, 0)],
                   ir.Constant(F32, 0.0))
        _spread(b, kb, g, ci, oi, n0, count)

    walk_blocks(b, kb, g, nb, split, ids[-1], block)
    lw.calls.append(called_kernel(lw, kb.finish(b), split))
    return True


def conv2d_weight_grad(lw, node, g) -> bool:
    """gw of a strided 1x1 convolution `takes` serves (see the module docstring), or False.
    Split over the cores, each share sums its blocks into its own partial gradient (share
    0 into gw, share s into its copy of a workspace `partial`), added in share order by a
    reduce kernel (`_sum_shares`), as conv.py's weight gradient does."""
    gy, x = node.inputs
    gl, xl, out = lw.locs[gy], lw.locs[x], lw.locs[node.outputs[0]]
    dt = xl.type.dtype
    if not takes(g, dt, gl, xl, out) or g.c % LANES or g.n < 1:
        return False
    nb = _images(g, g.c * g.p)
    shapes = [(nb * g.p * g.c,)]
    split = conv_threads.plan_split(lw, dt, shapes + [(g.o, g.c)], -(-g.n // nb),
                                    g.n * g.o * g.c * g.p, rows=-(-g.o * g.c // SUM_CHUNK))
    temps = workspace(lw, dt, *shapes) if split is None else split.locs + [split.control]
    locs = [gl, xl, out] + temps
    kb, ids = image_kernel(lw, "conv2d_weight_grad_pointwise", locs,
                           ("pointwise", g.key(), split is not None))
    gi, xi, oi, pi = ids[:4]
    swap = None if split is None else (out, split.locs[-1])
    reduce = None if split is None else _sum_shares(lw, g, locs, split)
    b = kb.begin()
    if b is None:
        lw.calls.append(called_kernel(lw, kb.kernel, split, swap=swap, reduce=reduce))
        return True
    # the first image this call walks (its share's): its block writes gw, the later add
    first = i64(0) if split is None else \
        b.mul(conv_threads.unit_range(b, kb, ids[-1])[0], i64(nb))
    zero, one = ir.Constant(F32, 0.0), ir.Constant(F32, 1.0)

    def block(b, n0, count):
        _pack_transposed(b, kb, g, xi, n0, count, pi)
        gemm = plan_gemm(g.o, count, g.p, 1, g.c, a_row=g.p, a_kn=g.o * g.p, a_kq=1,
                         b_kn=g.p * g.c, b_kq=g.c, b_jn=0, c_row=g.c, c_jn=0)
        beta = b.select(b.icmp_signed("==", as_i64(n0), first), zero, one)
        _gemm_call(lw, b, kb, gemm, [(gi, imul(b, n0, g.o * g.p)), (pi, 0), (oi, 0)], beta)

    walk_blocks(b, kb, g, nb, split, ids[-1], block)
    lw.calls.append(called_kernel(lw, kb.finish(b), split, swap=swap, reduce=reduce))
    return True


SUM_CHUNK = 1024  # elements of gw a reduce kernel's row adds (its rows split over the cores)


def _sum_shares(lw, g, locs, split):
    """The reduce kernel of a split weight gradient: over its rows [rows_lo, rows_hi) of
    SUM_CHUNK elements, gw += the partial gradient of share s, for s = 1, 2, ... in order."""
    kb, ids = image_kernel(lw, "conv2d_weight_grad_pointwise_sum", locs, ("sum", g.key()))
    oi, part, ctrl = ids[2], ids[-2], ids[-1]
    b = kb.begin()
    if b is None:
        return kb.kernel
    lo, hi = conv_threads.unit_range(b, kb, ctrl, conv_threads.ROWS_LO)
    shares = kb.load(b, ctrl, i64(conv_threads.SHARES))
    total = g.o * g.c
    end = b.mul(hi, i64(SUM_CHUNK))
    end = b.select(b.icmp_signed("<", end, i64(total)), end, i64(total))
    copy = split.copy_bytes // 4
    with loop(b, 1, shares, "share") as s:
        frm = b.mul(s, i64(copy))
        with loop(b, b.mul(lo, i64(SUM_CHUNK)), end, "e") as e:
            kb.store(b, oi, e, b.fadd(kb.load(b, oi, e), kb.load(b, part, b.add(frm, e))))
    return kb.finish(b)
