"""pool: lowering of pooling (called by the Lowerer; batch_norm: graphc.backends.cpu.batch_norm).

- `max_pool2d` (values and int64 flat H*W indices), `max_pool2d_grad` (a scatter-add by the
  indices; an index out of the plane makes the call fail clearly), `avg_pool2d` and
  `avg_pool2d_grad` (PyTorch's divisors: count_include_pad, divisor_override, ceil_mode).
- Max pooling's common shapes (windows inside the plane, at most `stride` taps along a row;
  gradients whose indices lie in blocks that tile the plane) take whole rows of outputs as
  vectors (graphc.backends.cpu.pool_vectors); a plane whose indices do not is scattered.

Invariants: a window's taps and the divisors are computed in Python (graphc.backends.cpu.
image_kernels: `window_taps`, `Table`) and passed to the kernels as constant tables, so no
kernel reads outside its tensors and padding is never materialised. Max pooling keeps the
first maximum of a window in row-major order, and a NaN wins (the last NaN), as the numpy
kernel and PyTorch's CPU kernel do. Inputs may be strided views (pooling reads through strides).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

from llvmlite import ir

from graphc.backends.cpu import conv_threads, pool_vectors
from graphc.backends.cpu.image_kernels import (
    Table,
    called_kernel,
    contiguous_out,
    element_strides,
    iadd,
    image_kernel,
    imul,
    window_taps,
)
from graphc.backends.cpu.scalars import const
from graphc.backends.cpu.values import (
    I32,
    I64,
    REG,
    Loc,
    as_i64,
    contiguous_strides,
    i64,
    loop,
)
from graphc.ir.graph import Node
from graphc.ir.printer import format_node

__all__ = ["avg_pool2d", "avg_pool2d_grad", "max_pool2d", "max_pool2d_grad"]

# ---- pooling ---------------------------------------------------------------------------------
def _recipe(node: Node) -> tuple:
    """A kernel recipe of these lowerings: each kernel's code follows from its op, its
    attributes and its operands' types and strides (which image_kernel adds)."""
    return (node.op, tuple(sorted(node.attrs.items())))


def _planes(loc: Loc):
    """(sizes, element strides) of the leading dims of an (N, C, H, W) / (C, H, W) tensor."""
    s = element_strides(loc)
    return loc.type.shape[:-2], s[:-2], s[-2], s[-1]


# A pooling kernel forks its images over the cores from this many window taps (output
# elements times taps) on: it is memory-bound, a few microseconds of fork and join is paid
# back well below conv_threads.MIN_SPLIT_MACS.
POOL_MIN_SPLIT_TAPS = 1 << 16


def _pool_split(lw, dt, sizes, out_elements: int, taps: int):
    """A conv_threads.Split over the images of a batched pooling kernel, or None."""
    if len(sizes) < 2:
        return None
    return conv_threads.plan_split(lw, dt, [], sizes[0], out_elements * taps,
                                   least=POOL_MIN_SPLIT_TAPS)


@contextmanager
def _over_planes(b, sizes, strides_list, first=None):
    """Loops over the leading dims; yields each operand's plane offset. `first`: the
    (lo, hi) of the first dim (a split kernel's share), else all of it."""
    offs = [0] * len(strides_list)
    stack = []
    for d, n in enumerate(sizes):
        cm = loop(b, *(first if d == 0 and first is not None else (0, n)), f"p{d}")
        i = cm.__enter__()
        stack.append(cm)
        offs = [iadd(b, o, imul(b, i, s[d])) for o, s in zip(offs, strides_list)]
    yield offs
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


def _pool_tables(lw, in_hw, out_hw, kernel_size, stride, padding, dilation):
    rows = [Table(lw, t) for t in window_taps(in_hw[0], out_hw[0], kernel_size[0], stride[0],
                                        padding[0], dilation[0])]
    cols = [Table(lw, t) for t in window_taps(in_hw[1], out_hw[1], kernel_size[1], stride[1],
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
    sizes, xs, xsh, xsw = _planes(lx)
    split = _pool_split(lw, dt, sizes, vals.type.numel, math.prod(a["kernel_size"]))
    control = [] if split is None else [split.control]
    kb, ids = image_kernel(lw, "max_pool2d", [lx, lv, li] + control,
                           _recipe(node) + (split is not None,))
    xi, vi, ii = ids[:3]
    _, vs, vsh, vsw = _planes(lv)
    _, is_, ish, isw = _planes(li)
    b = kb.begin()
    if b is None:  # built before for a node of the same geometry
        return lw.calls.append(called_kernel(lw, kb.kernel, split))
    first = None if split is None else conv_threads.unit_range(b, kb, ids[-1])
    with b.goto_entry_block():
        best = b.alloca(REG[dt.name], name="best")
        where = b.alloca(I64, name="where")

    def better(b, v, m):
        if dt.is_floating:
            return b.or_(b.fcmp_ordered(">", v, m), b.fcmp_unordered("!=", v, v))
        return b.icmp_signed(">", v, m)

    full = all(t.uniform for t in rows + cols) and (rows[0].values[0], rows[1].values[0],
                                                    cols[0].values[0], cols[1].values[0]) \
        == (0, a["kernel_size"][0], 0, a["kernel_size"][1])
    vectors = pool_vectors.ENABLED and \
        pool_vectors.forward_fits(full, (h, w), (ho, wo), a, (xsw, vsw, isw))
    with _over_planes(b, sizes, [xs, vs, is_], first) as (xo, vo, io):
        if vectors:  # whole rows of outputs as vectors (pool_vectors)
            pool_vectors.max_pool_rows(b, kb, dt, (xi, vi, ii), (xo, vo, io), (xsh, vsh, ish),
                                       w, (ho, wo), a, better)
        elif full:  # every tap of every window is inside: all taps of an output in registers,
            # selects instead of branches, the loop over output columns vectorised
            with loop(b, 0, ho, "oh") as oh, loop(b, 0, wo, "ow") as ow:
                m = at = None
                for i in range(a["kernel_size"][0]):
                    ih = iadd(b, imul(b, oh, sh), i * dh - ph)
                    for j in range(a["kernel_size"][1]):
                        iw = iadd(b, imul(b, ow, sw), j * dw - pw)
                        v = kb.load(b, xi, iadd(b, xo, imul(b, ih, xsh), imul(b, iw, xsw)))
                        flat = as_i64(iadd(b, imul(b, ih, w), iw))
                        if m is None:
                            m, at = v, flat
                        else:
                            up = better(b, v, m)
                            m, at = b.select(up, v, m), b.select(up, flat, at)
                kb.store(b, vi, iadd(b, vo, imul(b, oh, vsh), imul(b, ow, vsw)), m)
                kb.store(b, ii, iadd(b, io, imul(b, oh, ish), imul(b, ow, isw)), at)
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
                            up = better(b, v, m)
                            b.store(b.select(up, v, m), best)
                            b.store(b.select(up, iadd(b, imul(b, ih, w), iw), b.load(where)),
                                    where)
                    kb.store(b, vi, iadd(b, vo, imul(b, oh, vsh), imul(b, ow, vsw)), b.load(best))
                    kb.store(b, ii, iadd(b, io, imul(b, oh, ish), imul(b, ow, isw)),
                             b.load(where))
    lw.calls.append(called_kernel(lw, kb.finish(b), split))


def max_pool2d_grad(lw, node: Node) -> None:
    (g, idx), out = node.inputs, node.outputs[0]
    dt = out.type.dtype
    h, w = out.type.shape[-2:]
    ho, wo = g.type.shape[-2:]
    lg, li = lw.locs[g], lw.locs[idx]
    sizes, gs, gsh, gsw = _planes(lg)
    split = _pool_split(lw, dt, sizes, out.type.numel, 1)  # images over the cores
    with contiguous_out(lw, lw.locs[out]) as lo:
        kb, (gi, ii, oi, *control) = image_kernel(
            lw, "max_pool2d_grad", [lg, li, lo] + ([] if split is None else [split.control]))
        kb.kernel.status = True
        lw.errors.append(f"max_pool2d_grad: an index is out of the {h}x{w} plane (0..."
                         f"{h * w - 1}) in node {format_node(node)}"
                         f"{' at ' + node.loc if node.loc else ''}")
        code = len(lw.errors)
        _, is_, ish, isw = _planes(li)
        os_ = contiguous_strides(sizes, h * w)
        b = kb.begin()
        with b.goto_entry_block():
            status = b.alloca(I32, name="status")
        b.store(ir.Constant(I32, 0), status)
        first = None if split is None else conv_threads.unit_range(b, kb, control[0])

        def scatter(go, io, oo):  # the plane zeroed, then each gradient added at its index
            with loop(b, 0, h * w, "zero") as q:
                kb.store(b, oi, iadd(b, oo, q), const(dt, 0.0))
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

        gather = pool_vectors.ENABLED and \
            pool_vectors.grad_fits(dt, (h, w), (ho, wo), (gsw, isw))
        with _over_planes(b, sizes, [gs, is_, os_], first) as (go, io, oo):
            if gather:  # each input position gathers from its block's window (pool_vectors)
                matched = pool_vectors.max_pool_grad_rows(b, kb, dt, (gi, ii, oi), (go, io, oo),
                                                          (gsh, ish), (h, w), (ho, wo))
                with b.if_then(b.icmp_unsigned("!=", matched, i64(ho * wo)), likely=False):
                    scatter(go, io, oo)  # an index outside its block: the plane again
            else:
                scatter(go, io, oo)
        b.ret(b.load(status))
        lw.calls.append(called_kernel(lw, kb.kernel, split))


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


def _avg_geometry(lw, image, pooled, a: dict):
    """Average pooling's geometry between an `image` value and its `pooled` one: the pooled
    plane, stride, padding, per-position tap ranges (rows, cols) and divisor tables."""
    h, w = image.type.shape[-2:]
    ho, wo = pooled.type.shape[-2:]
    rows, cols = _pool_tables(lw, (h, w), (ho, wo), a["kernel_size"], a["stride"],
                              a["padding"], (1, 1))
    return (ho, wo), a["stride"], a["padding"], rows, cols, _avg_divisors(lw, (h, w), (ho, wo), a)


def avg_pool2d(lw, node: Node) -> None:
    x, out = node.inputs[0], node.outputs[0]
    a = node.attrs
    dt = x.type.dtype
    (ho, wo), (sh, sw), (ph, pw), rows, cols, divs = _avg_geometry(lw, x, out, a)
    lx, lo = lw.locs[x], lw.locs[out]
    sizes, xs, xsh, xsw = _planes(lx)
    split = _pool_split(lw, dt, sizes, out.type.numel, math.prod(a["kernel_size"]))
    control = [] if split is None else [split.control]
    kb, ids = image_kernel(lw, "avg_pool2d", [lx, lo] + control,
                           _recipe(node) + (split is not None,))
    xi, oi = ids[:2]
    _, os_, osh, osw = _planes(lo)
    b = kb.begin()
    if b is None:
        return lw.calls.append(called_kernel(lw, kb.kernel, split))
    first = None if split is None else conv_threads.unit_range(b, kb, ids[-1])
    with b.goto_entry_block():
        acc = b.alloca(REG[dt.name], name="acc")
    with _over_planes(b, sizes, [xs, os_], first) as (xo, oo):
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
    lw.calls.append(called_kernel(lw, kb.finish(b), split))


def avg_pool2d_grad(lw, node: Node) -> None:
    g, out = node.inputs[0], node.outputs[0]
    a = node.attrs
    dt = out.type.dtype
    h, w = out.type.shape[-2:]
    (ho, wo), (sh, sw), (ph, pw), rows, cols, divs = _avg_geometry(lw, out, g, a)
    lg = lw.locs[g]
    with contiguous_out(lw, lw.locs[out]) as lo:
        kb, (gi, oi) = image_kernel(lw, "avg_pool2d_grad", [lg, lo], _recipe(node))
        sizes, gs, gsh, gsw = _planes(lg)
        os_ = contiguous_strides(sizes, h * w)
        b = kb.begin()
        if b is None:
            return lw.calls.append(kb.kernel)
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

