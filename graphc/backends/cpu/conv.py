"""conv: the CPU backend's convolution lowerings (called by the Lowerer) and their dispatch.

The entry points of codegen's `Lowerer` (passed in as `lw`: its Locations, kernel list,
scratch, BLAS) for `conv2d` (and a fused `fused(conv2d, ...)` node), `conv2d_input_grad` and
`conv2d_weight_grad`. Each builds the node's `Geometry` and offers it to the special paths in
turn, the first that takes it building the kernel; the rest take im2col + BLAS GEMM, here:

- forward: at most 8 input channels at stride 1, register tiles
  (graphc.backends.cpu.conv_few_channels); depthwise convolutions and those with few output
  channels per group, direct loops (conv_direct); 3x3 stride 1 with 16 channels or more,
  Winograd's F(2x2, 3x3) (conv_winograd); 3x3 stride 2 padding 1, Winograd on the input's
  four phases (conv_polyphase); else `conv2d` (THNN's SpatialConvolutionMM,
  ../shared/SEEDS.md section 3): im2col into scratch (`(C*kH*kW) x (H_out*W_out)` per
  image, the groups' row blocks one after the other), then one GEMM per group
  `W_g (O/g x K) @ cols_g (K x P)` writing the image's NCHW output directly. Images whose
  planes have fewer than THIN_COLUMNS output positions go in blocks (conv_blocks): one
  im2col of the block's images side by side and one GEMM over all their columns, copied out
  to NCHW. A 1x1 kernel with stride 1 and no padding reads the image itself as the columns.
  One image's float32 GEMM (one group) may run as 16 row slabs in one generated call
  instead (conv_row_split: ResNet-18's stride-2 layers, where it beats OpenBLAS).
- input gradient: conv_direct, conv_winograd, conv_polyphase (stride 2, even input sizes),
  else per image or block one GEMM per group
  `cols_g = W_g^T @ gy_g` (a block's gradients gathered into one matrix first), then col2im
  adds every column entry back into its input position; a pointwise 1x1 GEMM writes the
  input gradient itself. Row slabs as the forward's, up to conv_row_split.INPUT_GRAD_MAX_N
  columns.
- weight gradient: conv_few_channels_grad, conv_direct, conv_winograd_wide_grad (Winograd
  for 512 channels and more on small planes), conv_winograd, conv_polyphase_grad (3x3
  stride 2 padding 1: Winograd on x's four phases), else per image or
  block im2col then `gw_g += gy_g @ cols_g^T` (beta 0 for the first, 1 after), so the batch
  accumulates inside the GEMM. Where O/g <= 128 < K the GEMM computes the transposed
  gradient `gw_g^T += cols_g @ gy_g^T` in scratch, copied out in tiles at the end: OpenBLAS
  runs that [K x O] orientation 10-25% faster on such shapes (ResNet-18 CIFAR's 64- and
  128-channel layers; measured 1-thread CPU time). One image's float32 GEMM (one group)
  may run as one call of winograd_gemm's generated function instead, always in that
  transposed form, from a per-image copy of gy^T (conv_row_split.plan_weight_grad:
  ResNet-18's stride-2 layers, 0.1-1.4 ms faster a kernel than OpenBLAS).
- A fused node `fused(conv2d, ...)` runs its elementwise epilogue per image inside the
  im2col kernel (`fused_conv2d`, graphc.backends.cpu.conv_epilogue); bias and activation on
  the other paths are codegen's elementwise kernel after it.
- On more than one core each kernel is built split over the threads where it pays
  (graphc.backends.cpu.conv_threads): its block loop walks one share's blocks, with its own
  copy of the temporaries; the weight gradient's shares sum into their own partials, added
  in share order by `_sum_shares`.

The family: image_kernels (the kernel building blocks convolution and pooling share),
conv_im2col (`Geometry`; `Conv`: GEMM calls, im2col, col2im), conv_blocks (images per GEMM
and the block walk), conv_workspace (the temporaries' scratch region, one per module),
conv_threads, conv_epilogue, and the paths above. Dependencies point one way: this module
imports them all and none of them imports it.

Invariants: the geometry (which output rows and columns a kernel offset reaches, the
divisors) is computed in Python and passed to the kernels as constant tables, so no kernel
reads outside its tensors and padding is never materialised. Inputs may be strided views
(im2col reads through strides); GEMM operands and outputs that BLAS cannot read or write in
place are copied through contiguous scratch. Every kernel is keyed by a recipe
(`image_kernel`: the path, the geometry or attributes, and each operand's type and strides),
so nodes that need the same code call one kernel (ResNet-18's step: 162 kernel functions ->
119, its module text 1.73M -> 0.75M characters).
"""

from __future__ import annotations

from llvmlite import ir

from graphc.backends.cpu import (
    conv_direct,
    conv_few_channels,
    conv_few_channels_grad,
    conv_pointwise,
    conv_polyphase,
    conv_polyphase_grad,
    conv_row_split,
    conv_threads,
    conv_winograd,
    conv_winograd_wide_grad,
)
from graphc.backends.cpu.conv_blocks import block_images, images_per_block, walk_blocks
from graphc.backends.cpu.conv_epilogue import apply_epilogue, epilogue_operands
from graphc.backends.cpu.conv_im2col import NOTRANS, TRANS, Conv, Geometry, grad_image
from graphc.backends.cpu.conv_workspace import workspace
from graphc.backends.cpu.image_kernels import (
    called_kernel,
    contiguous_in,
    contiguous_out,
    iadd,
    image_kernel,
    image_strides,
    imul,
    is_contiguous,
)
from graphc.backends.cpu.scalars import const
from graphc.backends.cpu.values import F32, Loc, as_i64, i64, loop, square_transposed
from graphc.ir.graph import Node
from graphc.types import TensorType, float32

__all__ = ["conv2d", "conv2d_input_grad", "conv2d_weight_grad"]


def _geometry(x_t: TensorType, w_shape, out_hw, attrs) -> Geometry:
    n = x_t.shape[0] if x_t.ndim == 4 else 1
    c, h, w = x_t.shape[-3:]
    o, _, kh, kw = w_shape
    return Geometry(n, c, h, w, o, attrs["groups"], kh, kw, out_hw[0], out_hw[1],
                 tuple(attrs["stride"]), tuple(attrs["padding"]), tuple(attrs["dilation"]))


def _gather_grad(b, kb, g: Geometry, gi, gs, n0, count, dst) -> None:
    """dst[o, j*P + q] = gy[n0 + j, o, q]: a block of output gradients as one matrix."""
    ld = count * g.p
    with block_images(b, count) as j:
        src_img = imul(b, iadd(b, n0, j), gs[0])
        with loop(b, 0, g.o, "o") as o:
            src = iadd(b, src_img, imul(b, o, gs[1]))
            at = iadd(b, imul(b, o, ld), imul(b, j, g.p))
            with loop(b, 0, g.p, "q") as q:
                kb.store(b, dst, b.add(at, q), kb.load(b, gi, b.add(src, q)))


def _units(g: Geometry, nb: int):
    """The blocks a kernel walks (a batch known per call: its images, one a block; else
    None, the kernel serial)."""
    return -(-g.n // nb) if type(g.n) is int else g.n if nb == 1 else None


def fused_conv2d(lw, node: Node, body) -> None:
    """A fused node whose body is conv2d then elementwise ops (bias, activation, residual
    add): on the im2col path the epilogue runs per image inside the convolution kernel, right
    after the image's GEMM, while its output is in cache (the conv2d case's bias was a second
    pass over 16.7 MB: 21% of the kernel time at one thread); elsewhere the convolution
    writes its result and one elementwise kernel applies the epilogue (codegen's `fused`)."""
    anchor = body.fused.anchor
    t = body.types[body.n]
    x, w = (lw.locs[node.inputs[r]] for r in anchor.args)
    same = [v for v in node.outputs if v.type == t]
    c = lw.locs[same[0]] if same else lw.scratch_loc(t)
    epilogue = None
    if body.fused.ending is None and is_contiguous(c) and \
            not any(op == "arange" for op, _, _ in body.instrs):
        body.check(1, len(body.instrs))
        epilogue = body
    if conv2d(lw, node, x, w, c, anchor.attrs, epilogue):
        return
    if body.fused.ending is not None:  # as codegen's `fused` does for every other anchor
        body.check(1, len(body.instrs) - 1)
        return lw.reduction(node, body, 1, {body.n: c})
    body.check(1, len(body.instrs))
    lw.elementwise(node, body, 1, {body.n: c})


def conv2d(lw, node: Node, x: Loc, w: Loc, out: Loc, attrs: dict, epilogue=None) -> bool:
    """out = conv2d(x, w) (out contiguous or not: see `contiguous_out`). `epilogue`: a fused
    body to apply per image on the im2col path (`fused_conv2d`); returns whether it did."""
    g = _geometry(x.type, w.type.shape, out.type.shape[-2:], attrs)
    applied = conv_few_channels.conv2d(lw, node, g, x, w, out, epilogue)
    if applied is not None:
        return applied
    if conv_direct.conv2d(lw, node, g, x, w, out) or \
            conv_winograd.conv2d(lw, node, g, x, w, out) or \
            conv_polyphase.conv2d(lw, node, g, x, w, out) or \
            conv_pointwise.conv2d(lw, node, g, x, w, out):  # strided 1x1 (conv_pointwise)
        return False
    cv = Conv(lw, node, g, x.type.dtype)
    w = contiguous_in(lw, w)
    xs = image_strides(x)
    nb = images_per_block(g)
    direct = nb == 1 and g.pointwise and xs[3] == 1 and xs[2] == g.w and xs[1] == g.p
    with contiguous_out(lw, out) as dst:
        shapes = ([] if direct else [(g.c * g.kh * g.kw, nb * g.p)]) + \
            ([(g.o, nb * g.p)] if nb > 1 else [])
        split = conv_threads.plan_split(lw, cv.dt, shapes, _units(g, nb),
                                        g.n * g.o * g.k * g.p)
        temps = workspace(lw, cv.dt, *shapes) if split is None else \
            split.locs + [split.control]
        kb, ids = image_kernel(lw, "conv2d", [x, w, dst] + temps)
        xi, wi, oi = ids[:3]
        cols = None if direct else ids[3]
        tmp = ids[4] if nb > 1 else None
        control = ids[-1]
        fused, extra = None, None
        if epilogue is not None:
            fused, extra = epilogue_operands(lw, kb, epilogue, out.type.shape, oi)
        kb.recipe = ("conv2d", ("im2col", g.key(), split is not None, extra),
                     tuple((op.loc.type, op.loc.strides) for op in kb.operands))
        b = kb.begin()
        if b is None:  # built before for a node of the same geometry
            lw.calls.append(called_kernel(lw, kb.kernel, split))
            return fused is not None

        def block(b, n0, count):
            ld = count * g.p
            if direct:
                src, src_img, ldb = xi, imul(b, n0, xs[0]), xs[1]
            else:
                src, src_img, ldb = cols, 0, ld
                with block_images(b, count) as j:
                    cv.im2col(b, kb, xi, xs, imul(b, iadd(b, n0, j), xs[0]), cols,
                              imul(b, j, g.p), ld)
            c, c_img, ldc = (tmp, 0, ld) if tmp is not None else \
                (oi, imul(b, n0, g.o * g.p), g.p)
            slabs = None if direct or nb > 1 or g.groups > 1 else \
                conv_row_split.plan(cv.dt, g.og, ld, g.k, g.k, 1, ldb, ldc)
            if slabs is not None:  # one image, 16 slabs of rows in one generated call
                conv_row_split.call(lw, b, kb, slabs, wi, 0, src, src_img, c, c_img)
            for grp in range(g.groups if slabs is None else 0):
                cv.gemm(b, kb, NOTRANS, NOTRANS, g.og, ld, g.k,
                        wi, grp * g.og * g.k, g.k,
                        src, iadd(b, src_img, grp * g.k * ldb), ldb, 0.0,
                        c, iadd(b, c_img, grp * g.og * ldc), ldc)
            if tmp is not None:  # columns j*P.. of the block's result are image n0 + j
                with block_images(b, count) as j:
                    dst_img = imul(b, iadd(b, n0, j), g.o * g.p)
                    with loop(b, 0, g.o, "o") as o:
                        at = iadd(b, dst_img, imul(b, o, g.p))
                        frm = iadd(b, imul(b, o, ld), imul(b, j, g.p))
                        with loop(b, 0, g.p, "q") as q:
                            kb.store(b, oi, b.add(at, q), kb.load(b, tmp, b.add(frm, q)))
            if fused is not None:  # the image's output is still in cache
                with block_images(b, count) as j:
                    apply_epilogue(lw, kb, b, epilogue, fused, iadd(b, n0, j))

        walk_blocks(b, kb, g, nb, split, control, block)
        lw.calls.append(called_kernel(lw, kb.finish(b), split))
        return fused is not None


def conv2d_input_grad(lw, node: Node) -> None:
    gy, w = node.inputs
    out = lw.locs[node.outputs[0]]
    g = _geometry(out.type, w.type.shape, gy.type.shape[-2:], node.attrs)
    if conv_direct.conv2d_input_grad(lw, node, g) or \
            conv_winograd.conv2d_input_grad(lw, node, g) or \
            conv_polyphase.conv2d_input_grad(lw, node, g) or \
            conv_pointwise.conv2d_input_grad(lw, node, g):  # strided 1x1 (conv_pointwise)
        return
    cv = Conv(lw, node, g, gy.type.dtype)
    wl = contiguous_in(lw, lw.locs[w])
    gl, gs = grad_image(lw, lw.locs[gy], g)
    nb = images_per_block(g)
    direct = nb == 1 and g.pointwise  # the columns are the image gradient itself
    with contiguous_out(lw, out) as dst:
        shapes = ([] if direct else [(g.c * g.kh * g.kw, nb * g.p)]) + \
            ([(g.o, nb * g.p)] if nb > 1 else [])
        split = conv_threads.plan_split(lw, cv.dt, shapes, _units(g, nb),
                                        g.n * g.o * g.k * g.p)
        temps = workspace(lw, cv.dt, *shapes) if split is None else \
            split.locs + [split.control]
        kb, ids = image_kernel(lw, "conv2d_input_grad", [gl, wl, dst] + temps,
                               ("im2col", g.key(), split is not None))
        gi, wi, oi = ids[:3]
        cols = oi if direct else ids[3]
        gyt = ids[4] if nb > 1 else None
        b = kb.begin()
        if b is None:
            return lw.calls.append(called_kernel(lw, kb.kernel, split))

        def block(b, n0, count):
            ld = count * g.p
            if gyt is not None:
                _gather_grad(b, kb, g, gi, gs, n0, count, gyt)
                a, a_img, lda = gyt, 0, ld
            else:
                a, a_img, lda = gi, imul(b, n0, gs[0]), gs[1]
            cols_img = imul(b, n0, g.c * g.h * g.w) if direct else 0
            slabs = None if direct or nb > 1 or g.groups > 1 else \
                conv_row_split.plan(cv.dt, g.k, ld, g.og, 1, g.k, lda, ld,
                                    max_n=conv_row_split.INPUT_GRAD_MAX_N)
            if slabs is not None:  # one image, 16 slabs of rows in one generated call
                conv_row_split.call(lw, b, kb, slabs, wi, 0, a, a_img, cols, cols_img)
            for grp in range(g.groups if slabs is None else 0):
                cv.gemm(b, kb, TRANS, NOTRANS, g.k, ld, g.og,
                        wi, grp * g.og * g.k, g.k,
                        a, iadd(b, a_img, grp * g.og * lda), lda, 0.0,
                        cols, iadd(b, cols_img, grp * g.k * ld), ld)
            if not direct:
                with block_images(b, count) as j:
                    cv.col2im(b, kb, cols, oi, imul(b, iadd(b, n0, j), g.c * g.h * g.w),
                              imul(b, j, g.p), ld)

        walk_blocks(b, kb, g, nb, split, ids[-1], block)
        lw.calls.append(called_kernel(lw, kb.finish(b), split))


def conv2d_weight_grad(lw, node: Node) -> None:
    gy, x = node.inputs
    out = lw.locs[node.outputs[0]]
    g = _geometry(x.type, out.type.shape, gy.type.shape[-2:], node.attrs)
    if g.n == 0:
        return lw.fill(out, 0.0, "conv2d_weight_grad_zero")
    if conv_few_channels_grad.conv2d_weight_grad(lw, node, g) or \
            conv_direct.conv2d_weight_grad(lw, node, g) or \
            conv_winograd_wide_grad.conv2d_weight_grad(lw, node, g) or \
            conv_winograd.conv2d_weight_grad(lw, node, g) or \
            conv_polyphase_grad.conv2d_weight_grad(lw, node, g) or \
            conv_pointwise.conv2d_weight_grad(lw, node, g):  # strided 1x1 (conv_pointwise)
        return
    cv = Conv(lw, node, g, x.type.dtype)
    xl = lw.locs[x]
    xs = image_strides(xl)
    nb = images_per_block(g)
    direct = nb == 1 and g.pointwise and xs[3] == 1 and xs[2] == g.w and xs[1] == g.p
    gl, gs = grad_image(lw, lw.locs[gy], g)
    # one image's gw^T += cols @ gy^T by the generated function (conv_row_split), gy^T copied
    fast = None if direct or nb > 1 or g.groups > 1 else \
        conv_row_split.plan_weight_grad(cv.dt, g.k, g.og, g.p)
    transposed = fast is not None or (g.og <= 128 and g.k > g.og)  # see the docstring
    with contiguous_out(lw, out) as dst:
        shapes = ([(g.groups, g.k, g.og)] if transposed else []) + \
            ([] if direct else [(g.c * g.kh * g.kw, nb * g.p)]) + \
            ([(g.o, nb * g.p)] if nb > 1 else []) + ([(g.p, g.o)] if fast else [])
        # split: each share sums its images into its own partial gradient (the transposed
        # one in its copy of the workspace; share s >= 1 of the other in a `partial`)
        partial = [] if transposed else [(g.o, g.k)]
        rows = g.groups * -(-g.k // SUM_TILE) if transposed else -(-g.o * g.k // SUM_CHUNK)
        split = conv_threads.plan_split(lw, cv.dt, shapes + partial, _units(g, nb),
                                        g.n * g.o * g.k * g.p, rows=rows)
        temps = workspace(lw, cv.dt, *shapes) if split is None else \
            split.locs + [split.control]
        locs = [gl, xl, dst] + temps
        kb, ids = image_kernel(lw, "conv2d_weight_grad", locs,
                               ("im2col", g.key(), split is not None))
        gi, xi, oi = ids[:3]
        gwt = ids[3] if transposed else None
        cols = None if direct else ids[3 + transposed]
        gyt = ids[3 + transposed + (not direct)] if nb > 1 else None
        gy_t = ids[3 + transposed + (not direct)] if fast else None  # gy^T (P x O)
        swap = None if split is None or transposed else (dst, split.locs[-1])
        reduce = None if split is None else _sum_shares(lw, g, locs, split, transposed)
        b = kb.begin()
        if b is None:
            return lw.calls.append(called_kernel(lw, kb.kernel, split, swap=swap, reduce=reduce))
        zero, one = const(cv.dt, 0.0), const(cv.dt, 1.0)
        first = []  # the first image of this call's blocks (set before the blocks are built)

        def block(b, n0, count):
            ld = count * g.p
            if direct:
                src, src_img, ldb = xi, imul(b, n0, xs[0]), xs[1]
            else:
                src, src_img, ldb = cols, 0, ld
                with block_images(b, count) as j:
                    cv.im2col(b, kb, xi, xs, imul(b, iadd(b, n0, j), xs[0]), cols,
                              imul(b, j, g.p), ld)
            if gyt is not None:
                _gather_grad(b, kb, g, gi, gs, n0, count, gyt)
                a, a_img, lda = gyt, 0, ld
            else:
                a, a_img, lda = gi, imul(b, n0, gs[0]), gs[1]
            # the first block writes the gradient, the later ones add to it (in the GEMM)
            start = first[0] if first else 0
            beta = (zero if n0 == start else one) if isinstance(n0, int) and \
                isinstance(start, int) else \
                b.select(b.icmp_signed("==", as_i64(n0), as_i64(start)), zero, one)
            if fast is not None:  # gw^T (K x O) (+)= cols @ gy^T, gy^T copied first
                _transposed_image(b, kb, g, a, a_img, lda, gy_t)
                conv_row_split.call(lw, b, kb, fast, src, src_img, gy_t, 0, gwt, 0, beta)
            for grp in range(g.groups if fast is None else 0):
                if transposed:  # gw_g^T (K x O/g) += cols_g @ gy_g^T
                    cv.gemm(b, kb, NOTRANS, TRANS, g.k, g.og, ld,
                            src, iadd(b, src_img, grp * g.k * ldb), ldb,
                            a, iadd(b, a_img, grp * g.og * lda), lda, beta,
                            gwt, grp * g.k * g.og, g.og)
                else:  # gw_g (O/g x K) += gy_g @ cols_g^T
                    cv.gemm(b, kb, NOTRANS, TRANS, g.og, g.k, ld,
                            a, iadd(b, a_img, grp * g.og * lda), lda,
                            src, iadd(b, src_img, grp * g.k * ldb), ldb, beta,
                            oi, grp * g.og * g.k, g.k)

        if split is not None:
            lo, _ = conv_threads.unit_range(b, kb, ids[-1])
            first.append(b.mul(lo, i64(nb)))
        walk_blocks(b, kb, g, nb, split, ids[-1], block)
        if transposed and split is None:
            _untranspose(b, kb, g, gwt, oi)
        lw.calls.append(called_kernel(lw, kb.finish(b), split, swap=swap, reduce=reduce))


def _transposed_image(b, kb, g: Geometry, gi, g_img, ld, dst, tile: int = 16) -> None:
    """dst[q, o] = gy[o, q] of one image (gy's rows `ld` apart from element g_img), in
    squares of `tile` (both sides stay in cache): float32 squares of 16 x 16 in vector
    registers where O and P are whole squares (the scalar squares cost 0.5-0.9 ms of
    ResNet-18's 7-8 ms stride-2 weight gradients), else element by element."""
    if kb.operands[gi].dtype is float32 and g.o % SQUARE == 0 and g.p % SQUARE == 0:
        return _transposed_squares(b, kb, g, gi, g_img, ld, dst)
    with loop(b, 0, -(-g.o // tile), "ot") as ot, loop(b, 0, -(-g.p // tile), "qt") as qt:
        o_lo, q_lo = b.mul(ot, i64(tile)), b.mul(qt, i64(tile))
        o_hi, q_hi = (_at_most(b, b.add(lo, i64(tile)), n) for lo, n in
                      ((o_lo, g.o), (q_lo, g.p)))
        with loop(b, q_lo, q_hi, "q") as q:
            row = b.mul(q, i64(g.o))
            with loop(b, o_lo, o_hi, "o") as o:
                at = iadd(b, g_img, imul(b, o, ld), q)
                kb.store(b, dst, b.add(row, o), kb.load(b, gi, at))


SQUARE = 16  # the vector transpose's squares: 16 float32 lanes (one AVX-512 register)


def _transposed_squares(b, kb, g: Geometry, gi, g_img, ld, dst) -> None:
    """_transposed_image by squares of SQUARE x SQUARE: SQUARE rows of gy loaded as vectors,
    transposed in registers (values.square_transposed), stored as SQUARE rows of dst."""
    n = SQUARE
    vec = ir.VectorType(F32, n)
    with loop(b, 0, g.o // n, "ot") as ot, loop(b, 0, g.p // n, "qt") as qt:
        o0, q0 = b.mul(ot, i64(n)), b.mul(qt, i64(n))
        rows = [b.load(kb.pointer(b, gi, iadd(b, g_img, imul(b, b.add(o0, i64(r)), ld), q0)),
                       typ=vec, align=4) for r in range(n)]
        for c, row in enumerate(square_transposed(b, rows)):
            at = b.add(b.mul(b.add(q0, i64(c)), i64(g.o)), o0)
            b.store(row, kb.pointer(b, dst, at), align=4)


def _at_most(b, v, n: int):
    return b.select(b.icmp_signed(">", v, i64(n)), i64(n), v)


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


# The weight gradient's partial sums (one per share of a split kernel) are added in tiles
# of SUM_TILE rows of the transposed gradient, or chunks of SUM_CHUNK elements.
SUM_TILE = 32
SUM_CHUNK = 1024


def _sum_shares(lw, g: Geometry, locs: list[Loc], split, transposed: bool):
    """The reduce kernel of a split weight gradient (conv_threads): over its rows [rows_lo,
    rows_hi), gw = the sum of the shares' partial gradients in share order (transposed:
    gw[grp, o, k] = sum_s gwt_s[grp, k, o]; else gw += partial_s for s >= 1)."""
    dt = locs[0].type.dtype
    kb, ids = image_kernel(lw, "conv2d_weight_grad_sum", locs, ("sum", g.key(), transposed))
    oi, part, ctrl = ids[2], ids[3] if transposed else ids[-2], ids[-1]
    b = kb.begin()
    if b is None:
        return kb.kernel
    lo, hi = conv_threads.unit_range(b, kb, ctrl, conv_threads.ROWS_LO)
    shares = kb.load(b, ctrl, i64(conv_threads.SHARES))
    copy = split.copy_bytes // dt.itemsize
    if not transposed:
        end = b.mul(hi, i64(SUM_CHUNK))
        end = b.select(b.icmp_signed("<", end, i64(g.o * g.k)), end, i64(g.o * g.k))
        with loop(b, 1, shares, "share") as s:
            frm = b.mul(s, i64(copy))
            with loop(b, b.mul(lo, i64(SUM_CHUNK)), end, "e") as e:
                v = b.fadd(kb.load(b, oi, e), kb.load(b, part, b.add(frm, e)))
                kb.store(b, oi, e, v)
        return kb.finish(b)
    tiles = -(-g.k // SUM_TILE)

    def tile_rows(b, s, first):  # gw[grp, o, k] (+)= gwt_s[grp, k, o] over tiles [lo, hi)
        with loop(b, lo, hi, "tile") as r:
            grp, t = b.udiv(r, i64(tiles)), b.urem(r, i64(tiles))
            k_lo = b.mul(t, i64(SUM_TILE))
            k_hi = b.add(k_lo, i64(SUM_TILE))
            k_hi = b.select(b.icmp_signed("<", k_hi, i64(g.k)), k_hi, i64(g.k))
            with loop(b, 0, g.og, "o") as o:
                to = iadd(b, imul(b, grp, g.og * g.k), imul(b, o, g.k))
                frm = iadd(b, imul(b, grp, g.k * g.og), o, b.mul(s, i64(copy)))
                with loop(b, k_lo, k_hi, "k") as k:
                    v = kb.load(b, part, iadd(b, frm, imul(b, k, g.og)))
                    if not first:
                        v = b.fadd(kb.load(b, oi, b.add(to, k)), v)
                    kb.store(b, oi, b.add(to, k), v)

    tile_rows(b, i64(0), True)
    with loop(b, 1, shares, "share") as s:
        tile_rows(b, s, False)
    return kb.finish(b)
