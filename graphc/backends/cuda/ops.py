"""ops: the per-op lowerings of the cuda backend and `LOWERINGS`, its one table of them.

`LOWERINGS` maps op names to `lower(lowerer, node)` (tinygrad's `code_for_op`; movement,
indexing and random ops come from graphc.backends.cuda.movement, batch_norm from
graphc.backends.cuda.norms); an elementwise op renders
through cudagen.SCALAR_LOWERINGS instead; `lower_node` is the shared prologue
(graphc.backends.common.lower_node). The kernels of fused bodies and generated reductions
are written by graphc.backends.cuda.fused_kernels (`lower_fused` here picks the form).

Each function appends the node's kernels (graphc.backends.cuda.lowering.KernelText, text from
graphc.backends.cuda.cudagen) or runtime library calls to the Lowerer, reading inputs where
`lowerer.layouts` places them and writing its outputs' (contiguous) layouts. See
graphc.backends.cuda.lowering for what is lowered and how memory is laid out.
Invariants: a kernel writes each output element from exactly one thread (scatters included:
their outputs gather their contributions in index order, so results are deterministic); no
kernel uses float atomics; index checks set an error word instead of reading
out of bounds; float32 is the library's dtype, other dtypes take generated kernels.
"""

from __future__ import annotations

import ctypes
import math

from graphc import config
from graphc.backends import common
from graphc.backends.cuda import cudagen, fused_kernels, reductions, rt
from graphc.backends.cuda.fused_kernels import lower_map
from graphc.backends.cuda.lowering import (
    Addr,
    CudaLoweringError,
    Layout,
    Lowerer,
    unsupported,
)
from graphc.backends.cuda.movement import MOVEMENT_LOWERINGS
from graphc.backends.cuda.norms import lower_batch_norm
from graphc.ir.graph import Node
from graphc.ops.fused import FusedBody
from graphc.types import TensorType


def _coords(n: int, prefix: str = "c") -> list[str]:
    return [f"{prefix}{d}" for d in range(n)]


# ---- fused groups ---------------------------------------------------------------------------
def lower_fused(lw: Lowerer, node: Node) -> None:
    fb = FusedBody.of_node(node)
    n_in = fb.n_inputs
    anchor = fb.anchor
    if anchor is not None and anchor.op in REFUSALS:  # a bucket's wait fused with its update
        raise unsupported(node, f"{anchor.op} inside a fused body: {REFUSALS[anchor.op]}")
    if anchor is not None:  # a contraction with an elementwise epilogue
        tmp = lw.scratch_layout(fb.types[n_in])
        contraction = Node(anchor.op, [node.inputs[a] for a in anchor.args], anchor.attrs, [])
        EPILOGUE_ANCHOR_LOWERINGS[anchor.op](lw, contraction, [tmp])
        if n_in in fb.outputs:
            raise unsupported(node, "an epilogue group that returns its raw contraction")
        return fused_kernels.map_with(lw, node, fb, tmp)
    if fb.ending is not None:
        return fused_kernels.reduce_group(lw, node, fb)
    fused_kernels.map_body(lw, node, fb)


# ---- library-backed ops ----------------------------------------------------------------------
def _f32(layout: Layout) -> bool:
    return layout.type.dtype.name == "float32"


def _gemm_operand(layout: Layout, rows: int, cols: int, strides, batch_strides, batch):
    """(trans, ld, batch stride) reading a (rows, cols) matrix from `strides` at every index
    of the flattened `batch`, or None: the batch strides must be those of one step (0 when
    broadcast) over the whole row-major batch."""
    sr, sc = strides
    if sc == 1 and (sr >= max(cols, 1) or rows == 1):
        trans, ld = 0, max(sr if rows > 1 else cols, 1)
    elif sr == 1 and (sc >= max(rows, 1) or cols == 1):
        trans, ld = 1, max(sc if cols > 1 else rows, 1)
    else:
        return None
    sized = [d for d in range(len(batch)) if batch[d] > 1]
    step = batch_strides[sized[-1]] if sized else 0
    for d in sized:
        if batch_strides[d] != step * math.prod(batch[d + 1:]):
            return None
    return trans, ld, step


def lower_matmul(lw: Lowerer, node: Node, outs=None) -> None:
    a_l, b_l = (lw.layouts[v] for v in node.inputs[:2])
    out = (outs or [lw.layouts[v] for v in node.outputs])[0]
    ta, tb = a_l.type, b_l.type
    k_dim = ta.shape[-1]
    a_shape = ta.shape if ta.ndim >= 2 else (1, k_dim)
    a_str = a_l.strides if ta.ndim >= 2 else (0, a_l.strides[0])
    b_shape = tb.shape if tb.ndim >= 2 else (k_dim, 1)
    b_str = b_l.strides if tb.ndim >= 2 else (b_l.strides[0], 1)
    m, n = a_shape[-2], b_shape[-1]
    batch = out.type.shape[:max(out.type.ndim - (ta.ndim >= 2) - (tb.ndim >= 2), 0)]
    nb = math.prod(batch)

    def batch_strides(shape, strides):
        pad = len(batch) - (len(shape) - 2)
        return tuple(0 if d < pad or shape[d - pad] == 1 else strides[d - pad]
                     for d in range(len(batch)))

    ga = _gemm_operand(a_l, m, k_dim, a_str[-2:], batch_strides(a_shape, a_str), batch)
    gb = _gemm_operand(b_l, k_dim, n, b_str[-2:], batch_strides(b_shape, b_str), batch)
    if _f32(a_l) and ga and gb:
        if nb <= 1 and not config.cuda_allow_tf32() and _split_k(m, n, k_dim) > 1:
            return _gemm_split_k(lw, node, ga, gb, m, n, k_dim, a_l, b_l, out)
        if nb <= 1:
            # TF32 tensor cores only when asked (GRAPHC_CUDA_ALLOW_TF32): float32 by default
            gemm = "gc_gemm_tf32_f32" if config.cuda_allow_tf32() else "gc_gemm_f32"
            lw.call(gemm, ga[0], gb[0], m, n, k_dim, 1.0, Addr(a_l.offset), ga[1],
                    Addr(b_l.offset), gb[1], 0.0, Addr(out.offset), max(n, 1), None)
        else:
            lw.call("gc_gemm_strided_batched_f32", ga[0], gb[0], m, n, k_dim, 1.0,
                    Addr(a_l.offset), ga[1], ga[2], Addr(b_l.offset), gb[1], gb[2], 0.0,
                    Addr(out.offset), max(n, 1), m * n, nb, None)
        return
    # any dtype and layout: one thread per output element
    kt = lw.new_kernel(node, out.type.numel)
    kt.lines += cudagen.decompose(batch + (m, n), "gi")
    bc = _coords(len(batch))
    nd = len(batch)
    a_full = Layout(a_l.offset, batch_strides(a_shape, a_str) + tuple(a_str[-2:]),
                    TensorType(batch + (m, k_dim), ta.dtype))
    b_full = Layout(b_l.offset, batch_strides(b_shape, b_str) + tuple(b_str[-2:]),
                    TensorType(batch + (k_dim, n), tb.dtype))
    ct = cudagen.ctype(out.type.dtype)
    acc = "double" if ct == "float" else ct
    kt.lines.append(f"{acc} acc = 0;")
    kt.lines.append(f"for (long long t = 0; t < {k_dim}LL; ++t) {{")
    kt.lines.append(f"  acc += ({acc}){kt.at(a_full, bc + [f'c{nd}', 't'])} * "
                    f"({acc}){kt.at(b_full, bc + ['t', f'c{nd + 1}'])};")
    kt.lines.append("}")
    kt.lines.append(f"(({ct} *){kt.ptr(out.offset)})[gi] = ({ct})acc;")
    lw.emit(kt)


GEMM_TILE = 128  # the library GEMM's block tile (runtime/csrc/kernels/gemm_tile.cuh)
SPLIT_K_MIN = 256  # at least this much of k per split


def _split_k(m: int, n: int, k: int) -> int:
    """How many slices of k a float32 GEMM is cut into: enough blocks for two per SM of an
    H100 when its 128 x 128 tiles are few and k is long (skinny shapes), else 1."""
    tiles = -(-m // GEMM_TILE) * -(-n // GEMM_TILE)
    if tiles >= 132 or not tiles:
        return 1
    return max(1, min(-(-2 * 132 // max(tiles, 1)), k // SPLIT_K_MIN, 64))


def _gemm_split_k(lw: Lowerer, node: Node, ga, gb, m: int, n: int, k: int, a_l: Layout,
                  b_l: Layout, out: Layout) -> None:
    """Split-K: slice s of k as entry s of one strided-batched GEMM into scratch partials (the
    remainder of k in one more GEMM), then a kernel adds the partials in slice order into
    `out` (deterministic; no atomics)."""
    splits = _split_k(m, n, k)
    kc, rest = k // splits, k % splits
    slots, mn = splits + (rest > 0), m * n
    partial = lw.scratch(4 * slots * mn)
    step_a = kc if ga[0] == 0 else kc * ga[1]  # A (m, k) row-major: columns; transposed: rows
    step_b = kc * gb[1] if gb[0] == 0 else kc
    lw.call("gc_gemm_strided_batched_f32", ga[0], gb[0], m, n, kc, 1.0, Addr(a_l.offset), ga[1],
            step_a, Addr(b_l.offset), gb[1], step_b, 0.0, Addr(partial), n, mn, splits, None)
    if rest:
        lw.call("gc_gemm_f32", ga[0], gb[0], m, n, rest, 1.0,
                Addr(a_l.offset + 4 * splits * step_a), ga[1],
                Addr(b_l.offset + 4 * splits * step_b), gb[1], 0.0,
                Addr(partial + 4 * splits * mn), n, None)
    kt = lw.new_kernel(node, mn)
    p = kt.ptr(partial)
    kt.lines.append(f"float acc = ((float *){p})[gi];")
    kt.lines.append(f"for (int s = 1; s < {slots}; ++s) acc += ((float *){p})[s * {mn}LL + gi];")
    kt.lines.append(f"((float *){kt.ptr(out.offset)})[gi] = acc;")
    lw.emit(kt)


def _nchw(shape: tuple[int, ...]) -> tuple[int, ...]:
    """An unbatched (C, H, W) image as the batch of one the library takes."""
    return shape if len(shape) == 4 else (1,) + tuple(shape)


def _conv_desc(x: TensorType, w: TensorType, y: TensorType, attrs: dict) -> rt.Conv2dDesc:
    (sh, sw), (ph, pw), (dh, dw) = attrs["stride"], attrs["padding"], attrs["dilation"]
    xs, ys = _nchw(x.shape), _nchw(y.shape)
    return rt.Conv2dDesc(xs[0], xs[1], xs[2], xs[3], w.shape[0], w.shape[2], w.shape[3], sh,
                         sw, ph, pw, dh, dw, attrs["groups"], ys[2], ys[3])


def _workspace(lw: Lowerer, desc, which: str):
    size = ctypes.c_int64(0)
    try:
        runtime = rt.runtime_library()
        runtime.gc_conv2d_workspace_size(ctypes.byref(desc), rt.CONV2D_PASS[which],
                                         ctypes.byref(size))
    except rt.CudaRuntimeError:
        raise
    return Addr(lw.scratch(size.value)), size.value


def _need_f32(node: Node, layouts) -> None:
    if not all(_f32(layout) for layout in layouts):
        raise unsupported(node, f"{node.op} on {layouts[0].type.dtype.name} (float32 only)")


def lower_conv2d(lw: Lowerer, node: Node, outs=None) -> None:
    x, w = (lw.contiguous(lw.layouts[v], node) for v in node.inputs[:2])
    y = (outs or [lw.layouts[v] for v in node.outputs])[0]
    _need_f32(node, [x, w])
    desc = _conv_desc(x.type, w.type, y.type, node.attrs)
    # the implicit GEMM: one launch over all images, no column buffer (runtime/csrc conv.cu)
    ws, nbytes = _workspace(lw, desc, "GC_CONV2D_FWD_IMPLICIT")
    lw.call("gc_conv2d_fwd_f32", ctypes.byref(desc), rt.CONV2D_PASS["GC_CONV2D_FWD_IMPLICIT"],
            Addr(x.offset), Addr(w.offset), None, Addr(y.offset), ws, nbytes, None,
            keep=(desc,))


def lower_conv2d_input_grad(lw: Lowerer, node: Node) -> None:
    dy, w = (lw.contiguous(lw.layouts[v], node) for v in node.inputs[:2])
    dx = lw.layouts[node.outputs[0]]
    _need_f32(node, [dy, w])
    desc = _conv_desc(dx.type, w.type, dy.type, node.attrs)
    ws, nbytes = _workspace(lw, desc, "GC_CONV2D_BWD_DATA")
    lw.call("gc_conv2d_bwd_data_f32", ctypes.byref(desc), Addr(dy.offset), Addr(w.offset),
            Addr(dx.offset), ws, nbytes, None, keep=(desc,))


def lower_conv2d_weight_grad(lw: Lowerer, node: Node) -> None:
    dy, x = (lw.contiguous(lw.layouts[v], node) for v in node.inputs[:2])
    dw = lw.layouts[node.outputs[0]]
    _need_f32(node, [dy, x])
    desc = _conv_desc(x.type, dw.type, dy.type, node.attrs)
    ws, nbytes = _workspace(lw, desc, "GC_CONV2D_BWD_FILTER")
    lw.call("gc_conv2d_bwd_filter_f32", ctypes.byref(desc), Addr(x.offset), Addr(dy.offset),
            Addr(dw.offset), ws, nbytes, None, keep=(desc,))


def _pool_desc(x_shape, y_shape, attrs: dict, dilation=(1, 1)) -> rt.Pool2dDesc:
    kh, kw = attrs["kernel_size"]
    (sh, sw), (ph, pw) = attrs["stride"], attrs["padding"]
    dh, dw = attrs.get("dilation", dilation)
    override = attrs.get("divisor_override") or 0
    return rt.Pool2dDesc(math.prod(x_shape[:-2]), x_shape[-2], x_shape[-1], y_shape[-2],
                         y_shape[-1], kh, kw, sh, sw, ph, pw, dh, dw,
                         int(bool(attrs.get("count_include_pad", True))), override)


def lower_pool(lw: Lowerer, node: Node) -> None:
    ins = [lw.contiguous(lw.layouts[v], node) for v in node.inputs]
    outs = [lw.layouts[v] for v in node.outputs]
    _need_f32(node, ins[:1])
    op, attrs = node.op, node.attrs
    if op == "max_pool2d":
        desc = _pool_desc(ins[0].type.shape, outs[0].type.shape, attrs)
        lw.call("gc_max_pool2d_fwd_f32", ctypes.byref(desc), Addr(ins[0].offset),
                Addr(outs[0].offset), Addr(outs[1].offset), None, keep=(desc,))
    elif op == "avg_pool2d":
        desc = _pool_desc(ins[0].type.shape, outs[0].type.shape, attrs)
        lw.call("gc_avg_pool2d_fwd_f32", ctypes.byref(desc), Addr(ins[0].offset),
                Addr(outs[0].offset), None, keep=(desc,))
    elif op == "max_pool2d_grad":
        gy, dx = ins[0], outs[0]
        forward = _producer(lw, node.inputs[1])
        if forward is None or forward.op != "max_pool2d":
            return _max_pool_grad_scan(lw, node, gy, ins[1], dx)
        # the library gathers over the forward's windows (deterministic, no atomics)
        desc = _pool_desc(dx.type.shape, gy.type.shape, forward.attrs)
        lw.call("gc_max_pool2d_bwd_f32", ctypes.byref(desc), Addr(gy.offset),
                Addr(ins[1].offset), Addr(dx.offset), None, keep=(desc,))
    else:  # avg_pool2d_grad
        desc = _pool_desc(outs[0].type.shape, ins[0].type.shape, attrs)
        lw.call("gc_avg_pool2d_bwd_f32", ctypes.byref(desc), Addr(ins[0].offset),
                Addr(outs[0].offset), None, keep=(desc,))


def _producer(lw: Lowerer, value) -> Node | None:
    """The scheduled node that computes `value` (None for a graph input)."""
    for n in lw.plan.schedule:
        if value in n.outputs:
            return n
    return None


def _max_pool_grad_scan(lw: Lowerer, node: Node, gy: Layout, indices: Layout,
                        dx: Layout) -> None:
    """max_pool2d_grad whose indices do not come from a max_pool2d in this graph (windows
    unknown): each input element scans its plane's outputs in order (O(h*w*out_h*out_w)),
    summing in double as the reference's bincount: deterministic, no atomics."""
    plane_in = dx.type.shape[-2] * dx.type.shape[-1]
    plane_out = gy.type.shape[-2] * gy.type.shape[-1]
    k = lw.new_kernel(node, dx.type.numel)
    g, ix = k.ptr(gy.offset), k.ptr(indices.offset)
    k.lines.append(f"long long at = gi % {plane_in}LL, base = (gi / {plane_in}LL) * "
                   f"{plane_out}LL; double acc = 0.0;")
    k.lines.append(f"for (long long o = base; o < base + {plane_out}LL; ++o)")
    k.lines.append(f"  if (((long long *){ix})[o] == at) acc += ((float *){g})[o];")
    k.lines.append(f"((float *){k.ptr(dx.offset)})[gi] = (float)acc;")
    lw.emit(k)


def lower_softmax(lw: Lowerer, node: Node) -> None:
    """The library's block-per-row kernel for contiguous float32 rows (inner == 1) that are
    many enough to fill the device; otherwise the generated online softmax."""
    x, y = lw.layouts[node.inputs[0]], lw.layouts[node.outputs[0]]
    shape = x.type.shape
    dim = node.attrs["dim"] % max(len(shape), 1)
    rows = math.prod(shape[:dim])
    if _f32(x) and x.contiguous and shape and dim == len(shape) - 1 and \
            reductions.split_for(rows, shape[dim], 256) == 1:
        lw.call("gc_softmax_fwd_f32", rows, shape[dim], 1, int(node.op == "log_softmax"),
                Addr(x.offset), Addr(y.offset), None)
        return
    fused_kernels.reduction(lw, node, FusedBody.of_node(node), 0, 0, x.type, node.op,
                            dict(node.attrs), y)


def lower_reduce(lw: Lowerer, node: Node) -> None:
    """A generated cooperative reduction, or the library's conv bias gradient
    (`_bias_sum_by_library`)."""
    x, y = lw.layouts[node.inputs[0]], lw.layouts[node.outputs[0]]
    shape = x.type.shape
    if fused_kernels.bias_sum_by_library(lw, node):
        n, c, h, w = shape
        desc = rt.Conv2dDesc(n, 1, h, w, c, 1, 1, 1, 1, 0, 0, 1, 1, 1, h, w)
        lw.call("gc_conv2d_bwd_bias_f32", ctypes.byref(desc), Addr(x.offset), Addr(y.offset),
                None, keep=(desc,))
        return
    fused_kernels.reduction(lw, node, FusedBody.of_node(node), 0, 0, x.type, node.op,
                            dict(node.attrs), y)


_NLL_REDUCTION = {"none": 0, "mean": 1, "sum": 2}


def lower_nll(lw: Lowerer, node: Node) -> None:
    ins = [lw.contiguous(lw.layouts[v], node) for v in node.inputs]
    outs = [lw.layouts[v] for v in node.outputs]
    _need_f32(node, ins[:1])
    attrs = node.attrs
    red = _NLL_REDUCTION[attrs["reduction"]]
    if node.op == "nll_loss":
        shape = ins[0].type.shape
        n, classes, inner = (1, shape[0], 1) if len(shape) == 1 else \
            (shape[0], shape[1], math.prod(shape[2:]))
        bad = lw.error_word(f"nll_loss: a target is out of bounds (node {format_op(node)})")
        _nll_forward(lw, node, n, classes, inner, ins, outs, red, bad)
    else:
        shape = attrs["input_shape"]
        n, classes, inner = (1, shape[0], 1) if len(shape) == 1 else \
            (shape[0], shape[1], math.prod(shape[2:]))
        lw.call("gc_nll_loss_bwd_f32", n, classes, inner, Addr(ins[0].offset),
                Addr(ins[1].offset), Addr(ins[2].offset), Addr(ins[3].offset),
                attrs["ignore_index"], red, Addr(outs[0].offset), None)


def _nll_forward(lw: Lowerer, node: Node, n: int, classes: int, inner: int, ins, outs,
                 red: int, bad: int) -> None:
    """The NLL loss as a cooperative reduction over the n * inner targets: states (loss sum,
    weight sum, a bad target seen) in double and int64, split into chunks when long (the
    library's gc_nll_loss_fwd_f32 runs one block)."""
    x, target, weight = ins
    ignore = node.attrs["ignore_index"]

    def update(k) -> list[str]:
        xp, tp, wp = (k.ptr(v.offset) for v in (x, target, weight))
        pick = f"(r / {inner}LL) * {classes * inner}LL + t * {inner}LL + r % {inner}LL"
        lines = [f"long long t = ((long long *){tp})[r]; double gc_l = 0.0;",
                 f"if (t != {ignore}LL) {{",
                 f"  if (t < 0 || t >= {classes}LL) bad = 1LL;",
                 "  else {",
                 f"    double w = (double)((float *){wp})[t];",
                 f"    gc_l = -(double)((float *){xp})[{pick}] * w;",
                 "    loss += gc_l; wsum += w;",
                 "  }",
                 "}"]
        if red == _NLL_REDUCTION["none"]:
            lines.append(f"((float *){k.ptr(outs[0].offset)})[r] = (float)gc_l;")
        return lines

    def merge() -> list[str]:
        return ["loss += o_loss; wsum += o_wsum; bad = bad > o_bad ? bad : o_bad;"]

    def finish(k) -> list[str]:
        lines = [f"((float *){k.ptr(outs[1].offset)})[0] = (float)wsum;",
                 f"if (bad) ((long long *){k.ptr(bad)})[0] = 1;"]
        if red == _NLL_REDUCTION["mean"]:
            lines.append(f"((float *){k.ptr(outs[0].offset)})[0] = (float)(loss / wsum);")
        elif red == _NLL_REDUCTION["sum"]:
            lines.append(f"((float *){k.ptr(outs[0].offset)})[0] = (float)loss;")
        return lines

    states = [("loss", "double", "0.0"), ("wsum", "double", "0.0"), ("bad", "long long", "0LL")]
    reducer = reductions.Reducer(states, update, merge, finish)
    reductions.reduce_kernels(lw, node, 1, ((), []), n * inner, None, reducer)


def format_op(node: Node) -> str:
    from graphc.ir.printer import format_node

    return format_node(node)


# ---- the lowering table: op name -> lower(lowerer, node) -----------------------------------
LOWERINGS = {
    "fused": lower_fused, "full": lower_map, "arange": lower_map,
    "matmul": lower_matmul, "conv2d": lower_conv2d,
    "conv2d_input_grad": lower_conv2d_input_grad,
    "conv2d_weight_grad": lower_conv2d_weight_grad, "max_pool2d": lower_pool,
    "avg_pool2d": lower_pool, "max_pool2d_grad": lower_pool, "avg_pool2d_grad": lower_pool,
    "softmax": lower_softmax, "log_softmax": lower_softmax, "nll_loss": lower_nll,
    "nll_loss_backward": lower_nll, "batch_norm": lower_batch_norm,
    "reduce_sum": lower_reduce, "reduce_mean": lower_reduce, "reduce_max": lower_reduce,
    "reduce_min": lower_reduce, "reduce_prod": lower_reduce,
    **MOVEMENT_LOWERINGS,
}
# the anchors of GEMM/conv epilogues (OpDef.epilogue_anchor): lower(lowerer, node, outs)
# computes the anchor's result into outs[0] for the fused epilogue to read
EPILOGUE_ANCHOR_LOWERINGS = {"matmul": lower_matmul, "conv2d": lower_conv2d}
# registry ops this backend declines on purpose, with the reason (none today)
REFUSALS: dict[str, str] = {
    name: "collectives on GPUs go through NCCL, which is designed (docs/distributed.md) but not "
          "built: no GPU was available to build and test it; compile a DDP step for the cpu "
          "backend"
    for name in ("all_reduce", "all_reduce_start", "all_reduce_wait")
}
REFUSALS.update({name: "made only by the cpu pipeline's fuse_attention pass (the cuda pipeline "
                       "keeps the matmul/softmax chain), so no cuda graph holds it"
                 for name in ("attention", "attention_backward")})
REFUSALS["batch_norm_relu"] = ("made only by the cpu pipeline's fuse_batch_norm_relu pass "
                               "(the cuda pipeline keeps batch_norm and the fused ReLU), so no "
                               "cuda graph holds it")
REFUSALS["batch_norm_relu_backward"] = ("made only by the cpu pipeline's "
                                        "fuse_batch_norm_backward pass (the cuda pipeline keeps "
                                        "the fused nodes), so no cuda graph holds it")
REFUSALS["conv2d_channel_sums"] = ("made only by the cpu pipeline's fuse_conv_channel_sums pass "
                                   "(the cuda pipeline keeps conv2d and batch_norm), so no cuda "
                                   "graph holds it")


def lower_node(lw: Lowerer, node: Node) -> None:
    """Append the kernels and calls of one scheduled node (nothing for one whose reduction
    an earlier node's kernel computed: `Lowerer.ahead`)."""
    if id(node) in lw.ahead:
        lw.place(node)
        return
    lowering = common.find_lowering(node.op, LOWERINGS, cudagen.SCALAR_LOWERINGS, lower_map)
    common.lower_node(lw, node, lowering, CudaLoweringError)


__all__ = ["EPILOGUE_ANCHOR_LOWERINGS", "LOWERINGS", "REFUSALS", "lower_node"]
