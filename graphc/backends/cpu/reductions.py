"""reductions: the Lowerer's reduction and softmax kernels.

Part of the top layer of the CPU code generator (values <- scalars <- kernels <- codegen):
`ReductionLowering` is a base of graphc.backends.cpu.codegen's `Lowerer`. It holds
- `reduction`: reduce_sum / mean / max / min / prod over any axes, keepdim or not, alone or
  ending a fused body (the body's elementwise instructions from `start` rendered per element
  read, its other outputs stored on the way): the output first set to the reduction's
  identity, then combined element by element (in a register across an innermost reduced
  loop, short rows prefetched: graphc.backends.cpu.prefetch.row_prefetcher, long ones a
  block at a time: prefetch.blocked_rows), a mean
  divided by the count at the end (a count known per call in a symbolic graph);
- `_rows`: softmax and log_softmax along `dim` (a fused body may feed them): in vector
  registers where the output row is contiguous (graphc.backends.cpu.rows), else three
  scalar passes per row (max, sum of exp, result);
- `lower_reduction`: the lowering of a lone reduction or row-wise op (codegen's `LOWERINGS`).
"""

from __future__ import annotations

import math

from graphc.backends.cpu import column_parts, rows
from graphc.backends.cpu.elementwise import ElementwiseLowering
from graphc.backends.cpu.kernels import Body, KernelBuilder, reduction_loops, result_share
from graphc.backends.cpu.prefetch import blocked_rows, row_prefetcher
from graphc.backends.cpu.scalars import const, convert, reduction_combiner, reduction_identity
from graphc.backends.cpu.values import (
    I1,
    REG,
    Loc,
    collapse,
    contiguous_strides,
    for_range,
    loop,
    size,
    unsupported,
)
from graphc.ir.graph import Node
from graphc.ops.registry import REGISTRY
from graphc.types import bool_

__all__ = ["ReductionLowering"]

PREFETCH_ROWS = True  # graphc.backends.cpu.prefetch.row_prefetcher; False: benchmarks' A/B


class ReductionLowering(ElementwiseLowering):
    """Reduction and softmax kernels (see the module docstring); a base of codegen's
    `Lowerer`. A fused body's leaves are read as the elementwise kernels read them
    (ElementwiseLowering.body_leaves)."""

    # ---- reductions and softmax ----------------------------------------------------------
    def reduction(self, node: Node, body: Body, start: int, extra: dict[int, Loc]) -> None:
        op, (src,), attrs = body.instrs[-1]
        red = body.n + len(body.instrs) - 1
        domain = body.types[src].shape or (1,)  # a 0-d input: one element
        kb = KernelBuilder(self, self.name(op), domain, body.recipe("reduce", start, extra))
        leaves = self.body_leaves(kb, body, extra, start, len(body.instrs) - 1)
        if src in extra or src < body.n:
            leaves.setdefault(src, kb.operand(extra[src] if src in extra
                                              else self.locs[node.inputs[src]]))
        stores = [(ref, kb.operand(self.locs[v]), v) for ref, v in zip(body.outputs,
                                                                        node.outputs)
                  if ref != red]
        out_v = node.outputs[body.outputs.index(red)] if red in body.outputs else None
        if out_v is None:
            raise unsupported(node, "a fused reduction whose result is not an output")
        if REGISTRY[op].row_wise:
            return self._rows(node, kb, body, src, leaves, stores, out_v, attrs)
        axes = tuple(attrs["axes"])
        keep = tuple(1 if d in axes else n for d, n in enumerate(domain))
        out_loc = self.locs[out_v]
        cstr = contiguous_strides(keep, 1)
        ostr = tuple(0 if d in axes else s for d, s in enumerate(cstr))
        acc_t = out_v.type.dtype
        # a large column sum forks over its rows into partial sums (column_parts)
        parts = column_parts.plan(self, domain, [x.strides for x in kb.operands] + [ostr],
                                  [acc_t], op)
        o = kb.operand(out_loc if parts is None else parts.locs[0], ostr)
        sizes, strides = collapse(domain, [x.strides for x in kb.operands])
        # a large one forks over a kept dim (kernels.reduction_loops: the same sums)
        sizes, strides, parallel = reduction_loops(self, domain, sizes, strides, o) \
            if parts is None else parts.loops(sizes, strides, [o])
        n = math.prod(domain[d] for d in axes)
        b = kb.begin(parallel=parallel)
        if b is None:  # the same kernel emitted before: call it, then this sum's own merge
            self.calls.append(kb.kernel)
            if parts is not None:
                self.calls.append(parts.merge(self, [(out_loc, op, n)]))
            return None
        ident = reduction_identity(op, acc_t)
        count = out_v.type.numel if parts is None else parts.count
        results = result_share(kb, b, sizes, strides, o, count)
        with loop(b, *results, "init") as i:
            kb.store(b, o, i, ident)
        combine = reduction_combiner(self.scalars, op, acc_t)

        def element(b, offsets):
            env = body.evaluate(self, kb, b, offsets, leaves, len(body.instrs) - 1,
                                [src] + [r for r, _, _ in stores])
            for ref, k, v in stores:
                kb.store(b, k, offsets[k],
                         convert(b, env[ref], body.types[ref].dtype, v.type.dtype))
            return convert(b, env[src], body.types[src].dtype, acc_t)

        inner_reduced = bool(sizes) and strides[o][-1] == 0
        if inner_reduced:
            sizes, strides = blocked_rows(kb, sizes, strides)  # long rows a block at a time
            with b.goto_entry_block():
                acc = b.alloca(REG[acc_t.name] if acc_t is not bool_ else I1, name="acc")
            # short rows C rows apart (a channel's planes): each row's start prefetches it
            fetch = row_prefetcher(kb, sizes, strides, {k for _, k, _ in stores}) \
                if PREFETCH_ROWS else None

            def before(b, offsets):
                if fetch is not None:
                    fetch(b, offsets)
                b.store(ident, acc)

            def leaf(b, offsets):
                b.store(combine(b, b.load(acc), element(b, offsets), True), acc)

            def after(b, offsets, state):
                old = kb.load(b, o, offsets[o])
                kb.store(b, o, offsets[o], combine(b, old, b.load(acc), False))

            kb.nest(b, sizes, strides, leaf, (before, after))
        else:
            def leaf(b, offsets):
                v = element(b, offsets)
                kb.store(b, o, offsets[o], combine(b, kb.load(b, o, offsets[o]), v, False))

            kb.nest(b, sizes, strides, leaf)
        if parts is not None:  # the partial rows added in part order, a mean divided
            self.calls.append(kb.finish(b))
            return self.calls.append(parts.merge(self, [(out_loc, op, n)]))
        if REGISTRY[op].reduction.mean:
            with loop(b, *results, "mean") as i:
                divisor = const(acc_t, n) if type(n) is int else \
                    b.sitofp(size(b, n), REG[acc_t.name])  # a count known per call
                kb.store(b, o, i, b.fdiv(kb.load(b, o, i), divisor))
        self.calls.append(kb.finish(b))

    def _rows(self, node, kb, body, src, leaves, stores, out_v, attrs) -> None:
        """softmax / log_softmax along `dim`: per row, max, sum of exp, then the result
        (graphc.backends.cpu.rows, in vector registers, where the output row is contiguous)."""
        if rows.lower_rows(self, node, kb, body, src, leaves, stores, out_v, attrs):
            return
        op = body.instrs[-1][0]
        domain = kb.shape
        dim = attrs["dim"] if body.types[src].ndim else 0
        y = kb.operand(self.locs[out_v]) if out_v.type.ndim else \
            kb.operand(self.locs[out_v], (1,))
        t = out_v.type.dtype
        order = [d for d in range(len(domain)) if d != dim]
        outer_sizes, outer_strides = collapse(tuple(domain[d] for d in order),
                                              [tuple(x.strides[d] for d in order)
                                               for x in kb.operands])
        row = domain[dim]
        row_strides = [x.strides[dim] for x in kb.operands]
        b = kb.begin()
        if b is None:
            return self.calls.append(kb.kernel)
        with b.goto_entry_block():
            m_acc = b.alloca(REG[t.name], name="max")
            s_acc = b.alloca(REG[t.name], name="sum")
        combine_max = reduction_combiner(self.scalars, "reduce_max", t)

        def at(b, offsets, j):
            return [o if s == 0 else b.add(o, j if s == 1 else b.mul(j, size(b, s)))
                    for o, s in zip(offsets, row_strides)]

        def leaf(b, offsets):
            b.store(const(t, -math.inf), m_acc)
            with for_range(b, row, "r1") as j:
                offs = at(b, offsets, j)
                env = body.evaluate(self, kb, b, offs, leaves, len(body.instrs) - 1,
                                    [src] + [r for r, _, _ in stores])
                for ref, k, v in stores:
                    kb.store(b, k, offs[k], convert(b, env[ref], body.types[ref].dtype,
                                                    v.type.dtype))
                v = convert(b, env[src], body.types[src].dtype, t)
                kb.store(b, y, offs[y], v)
                b.store(combine_max(b, b.load(m_acc), v, True), m_acc)
            m = b.load(m_acc)
            b.store(const(t, 0.0), s_acc)
            with for_range(b, row, "r2") as j:
                offs = at(b, offsets, j)
                e = self.scalars.mathlib(b, "exp", b.fsub(kb.load(b, y, offs[y]), m))
                if op == "softmax":
                    kb.store(b, y, offs[y], e)
                total = b.fadd(b.load(s_acc), e)
                total.flags.extend(("reassoc", "nsz"))
                b.store(total, s_acc)
            s = b.load(s_acc)
            log_s = self.scalars.mathlib(b, "log", s) if op == "log_softmax" else None
            with for_range(b, row, "r3") as j:
                offs = at(b, offsets, j)
                v = kb.load(b, y, offs[y])
                r = b.fdiv(v, s) if op == "softmax" else b.fsub(b.fsub(v, m), log_s)
                kb.store(b, y, offs[y], r)

        kb.nest(b, outer_sizes, outer_strides, leaf)
        self.calls.append(kb.finish(b))

    def lower_reduction(self, node: Node) -> None:
        """A lone reduction or row-wise op (softmax): a body of one instruction."""
        self.reduction(node, Body(node), 0, {})
