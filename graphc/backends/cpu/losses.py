"""losses: nll_loss and its gradient as CPU kernels (the lowerings codegen's table names).

Part of the top layer of the CPU code generator (codegen's `Lowerer` calls them). Each is
one status kernel over the rows of its input: (C,) is one row of shape (); (N, C, d1, ...)
has rows (N, d1, ...), the class dim being 1. A target out of range (and not
`ignore_index`) makes the call fail with an error naming the node (the kernel returns its
status after the loop: the sums are well defined whatever the targets). The totals are
accumulated in float64, then rounded once, as eager graphc does. Sizes, strides and class
counts may be symbolic (graphc.backends.cpu.runtime_sizes: `values.size`).
"""

from __future__ import annotations

import math

from llvmlite import ir

from graphc.backends.cpu.kernels import KernelBuilder
from graphc.backends.cpu.scalars import const, convert
from graphc.backends.cpu.values import F64, I32, Loc, for_range, i64, size
from graphc.ir.graph import Node
from graphc.ir.printer import format_node
from graphc.types import TensorType, float64

__all__ = ["nll_loss", "nll_loss_backward"]


def _nll_rows(x_t: TensorType) -> tuple[tuple[int, ...], int]:
    """(row shape, classes) of nll_loss's input (or its gradient) `x_t`: (C,) has one
    row of shape (); (N, C, d1, ...) has rows (N, d1, ...), the class dim being 1."""
    if x_t.ndim == 1:
        return (), x_t.shape[0]
    return (x_t.shape[0],) + x_t.shape[2:], x_t.shape[1]


def _x_strides(loc: Loc, rank: int) -> tuple[tuple[int, ...], int]:
    """(element strides over the row shape, class stride) of an (N, C, d...) location."""
    s = _strides(loc, rank)
    if rank == 1:
        return (), s[0]
    return (s[0],) + s[2:], s[1]


def _row_offset(b, row, shape: tuple[int, ...], strides: tuple[int, ...]):
    """The element offset of flat (row-major) index `row` over `shape` with `strides`."""
    total, rest = i64(0), row
    for d in range(len(shape) - 1, -1, -1):
        if strides[d] == 0 or shape[d] == 1:
            if d:
                rest = b.udiv(rest, size(b, shape[d]))
            continue
        coord = b.urem(rest, size(b, shape[d])) if d else rest
        total = b.add(total, b.mul(coord, size(b, strides[d])))
        if d:
            rest = b.udiv(rest, size(b, shape[d]))
    return total


def _nll_kernel(lw, node: Node, name: str, x_type: TensorType, reads: list[Loc],
                writes: list[Loc]):
    """A status kernel reading `reads` and writing `writes` (whole, strides 0):
    (kb, their operand ids, the status it returns for a target out of range)."""
    kb = KernelBuilder(lw, lw.name(name), (1,))
    kb.kernel.status = True
    ids = [kb.operand(loc, (0,)) for loc in reads + writes]
    lw.errors.append(f"{node.op}: a target is out of bounds (classes 0..."
                     f"{(x_type.shape[0] if x_type.ndim == 1 else x_type.shape[1]) - 1})"
                     f" in node {format_node(node)}"
                     f"{' at ' + node.loc if node.loc else ''}")
    return kb, ids, len(lw.errors)


def _strides(loc: Loc, rank: int) -> tuple[int, ...]:
    item = loc.type.dtype.itemsize
    s = tuple(x // item for x in loc.strides)
    return (0,) * (rank - len(s)) + s


def _pick(b, kb, node, t_id, w_id, t_offset, sw, classes, status, slot):
    """(safe class index, counted mask, weight) of the target at `t_offset`; a bad target
    stores `status` in the kernel's status `slot`."""
    ignore = node.attrs["ignore_index"]
    t = kb.load(b, t_id, t_offset)
    counted = b.icmp_signed("!=", t, i64(ignore))
    inside = b.and_(b.icmp_signed(">=", t, i64(0)), b.icmp_signed("<", t, size(b, classes)))
    bad = b.and_(counted, b.not_(inside))
    b.store(b.select(bad, ir.Constant(I32, status), b.load(slot)), slot)
    safe = b.select(inside, t, i64(0))
    counted = b.and_(counted, inside)
    w = kb.load(b, w_id, b.mul(safe, size(b, sw)))
    return safe, counted, w


def nll_loss(lw, node: Node) -> None:
    x, target, weight = node.inputs
    loss_v, total_v = node.outputs
    row_shape, classes = _nll_rows(x.type)
    lx, lt, lwt = lw.locs[x], lw.locs[target], lw.locs[weight]
    kb, (xi, ti, wi, li, twi), status = _nll_kernel(
        lw, node, "nll_loss", x.type, [lx, lt, lwt], [lw.locs[loss_v], lw.locs[total_v]])
    sx, sc = _x_strides(lx, x.type.ndim)
    st, sw = _strides(lt, len(row_shape)), _strides(lwt, 1)[0]
    reduction = node.attrs["reduction"]
    sl = _strides(lw.locs[loss_v], len(row_shape)) if reduction == "none" else ()
    dt = x.type.dtype
    b = kb.begin()
    with b.goto_entry_block():
        slot = b.alloca(I32, name="status")
        tot_w = b.alloca(F64, name="total_weight")
        tot = b.alloca(F64, name="total")
    b.store(ir.Constant(I32, 0), slot)
    b.store(ir.Constant(F64, 0.0), tot_w)
    b.store(ir.Constant(F64, 0.0), tot)
    with for_range(b, math.prod(row_shape), "row") as n:
        safe, counted, w = _pick(b, kb, node, ti, wi, _row_offset(b, n, row_shape, st), sw,
                                 classes, status, slot)
        w = b.select(counted, w, const(dt, 0.0))
        xv = kb.load(b, xi, b.add(_row_offset(b, n, row_shape, sx),
                                  b.mul(safe, size(b, sc))))
        v = b.fmul(b.fneg(xv), w)
        b.store(b.fadd(b.load(tot_w), convert(b, w, dt, float64)), tot_w)
        b.store(b.fadd(b.load(tot), convert(b, v, dt, float64)), tot)
        if reduction == "none":
            kb.store(b, li, _row_offset(b, n, row_shape, sl), v)
    total_w = convert(b, b.load(tot_w), float64, dt)
    kb.store(b, twi, i64(0), total_w)
    if reduction != "none":
        total = b.load(tot)
        if reduction == "mean":
            w64 = convert(b, total_w, dt, float64)
            total = b.select(b.fcmp_ordered("!=", w64, ir.Constant(F64, 0.0)),
                             b.fdiv(total, w64), ir.Constant(F64, math.nan))
        kb.store(b, li, i64(0), convert(b, total, float64, dt))
    b.ret(b.load(slot))
    lw.calls.append(kb.kernel)


def nll_loss_backward(lw, node: Node) -> None:
    g, target, weight, total_weight = node.inputs
    out = node.outputs[0]
    row_shape, classes = _nll_rows(out.type)
    lo = lw.locs[out]
    kb, (gi, ti, wi, twi, oi), status = _nll_kernel(
        lw, node, "nll_loss_backward", out.type,
        [lw.locs[g], lw.locs[target], lw.locs[weight], lw.locs[total_weight]], [lo])
    dt = out.type.dtype
    reduction = node.attrs["reduction"]
    st = _strides(lw.locs[target], len(row_shape))
    sw = _strides(lw.locs[weight], 1)[0]
    sg = _strides(lw.locs[g], len(row_shape)) if reduction == "none" else ()
    so, sc = _x_strides(lo, out.type.ndim)
    b = kb.begin()
    with b.goto_entry_block():
        slot = b.alloca(I32, name="status")
    b.store(ir.Constant(I32, 0), slot)
    with for_range(b, out.type.numel, "zero") as i:
        kb.store(b, oi, _row_offset(b, i, out.type.shape, _strides(
            lo, out.type.ndim)), const(dt, 0.0))
    with for_range(b, math.prod(row_shape), "row") as n:
        safe, counted, w = _pick(b, kb, node, ti, wi, _row_offset(b, n, row_shape, st), sw,
                                 classes, status, slot)
        scale = kb.load(b, gi, _row_offset(b, n, row_shape, sg)
                        if reduction == "none" else i64(0))
        if reduction == "mean":
            scale = b.fdiv(scale, kb.load(b, twi, i64(0)))
        v = b.select(counted, b.fmul(b.fneg(w), scale), const(dt, 0.0))
        kb.store(b, oi, b.add(_row_offset(b, n, row_shape, so),
                              b.mul(safe, size(b, sc))), v)
    b.ret(b.load(slot))
    lw.calls.append(kb.kernel)
