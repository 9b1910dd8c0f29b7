"""sibling_sums: the lowering of a fused body that ends in several sums over the same axes
of one domain (made by graphc.passes.sibling_sums: a batch-norm backward's sum(g) and
sum(g * xhat) in one walk over g and x).

The body is elementwise instructions, then k >= 2 `reduce_sum`s over the same axes of
arguments of one shape D, none read inside the body (graphc.passes.sibling_sums.
is_sibling_sums). The kernel walks D
once, as graphc.backends.cpu.reductions walks a single reduction: each element's
instructions rendered once, the body's D-shaped outputs stored on the way, each sum
accumulated in its own register across an innermost reduced loop (rows prefetched,
graphc.backends.cpu.prefetch.row_prefetcher; rows past REDUCED_ROW_BLOCK elements a block
at a time, prefetch.blocked_rows) and added to its output after it. Each sum adds
the same values as the single-reduction kernel would, row by row in the same order; within a
row the additions are reassociated (vector registers), which LLVM may group otherwise with
several accumulators: float32 rounding of the order, no more.
"""

from __future__ import annotations

from graphc.backends.cpu.kernels import Body, KernelBuilder, reduction_loops, result_share
from graphc.backends.cpu.prefetch import blocked_rows, row_prefetcher
from graphc.backends.cpu.scalars import convert, reduction_combiner, reduction_identity
from graphc.backends.cpu.values import REG, collapse, contiguous_strides, loop, unsupported
from graphc.ir.graph import Node
from graphc.passes.sibling_sums import trailing_sums

__all__ = ["lower_sibling_sums"]

PREFETCH_ROWS = True  # graphc.backends.cpu.prefetch.row_prefetcher; False: benchmarks' A/B


def lower_sibling_sums(lw, node: Node, body: Body) -> None:
    """The kernel of a sibling-sums body (module docstring); `lw`: the Lowerer."""
    sums = trailing_sums(body.fused)
    first = sums[0]
    srcs = [body.instrs[s][1][0] for s in sums]
    reds = [body.n + s for s in sums]
    attrs = body.instrs[first][2]
    domain = body.types[srcs[0]].shape or (1,)
    kb = KernelBuilder(lw, lw.name("sibling_sums"), domain, body.recipe("sibling_sums", 0, {}))
    leaves = lw.body_leaves(kb, body, {}, 0, first)
    for src in srcs:
        if src < body.n:
            leaves.setdefault(src, kb.operand(lw.locs[node.inputs[src]]))
    value_of = dict(zip(body.outputs, node.outputs))
    stores = [(ref, kb.operand(lw.locs[v]), v) for ref, v in value_of.items()
              if ref not in reds]
    axes = tuple(attrs["axes"])
    keep = tuple(1 if d in axes else n for d, n in enumerate(domain))
    cstr = contiguous_strides(keep, 1)
    ostr = tuple(0 if d in axes else s for d, s in enumerate(cstr))
    outs = []
    for red in reds:
        if red not in value_of:
            raise unsupported(node, "a fused sum whose result is not an output")
        outs.append((kb.operand(lw.locs[value_of[red]], ostr), value_of[red].type.dtype))
    sizes, strides = collapse(domain, [x.strides for x in kb.operands])
    # a large one forks over a kept dim (a batch norm's channels; kernels.reduction_loops)
    sizes, strides, parallel = reduction_loops(lw, domain, sizes, strides, outs[0][0])
    b = kb.begin(parallel=parallel)
    if b is None:
        return lw.calls.append(kb.kernel)
    count = value_of[reds[0]].type.numel
    results = result_share(kb, b, sizes, strides, outs[0][0], count)
    for o, t in outs:
        with loop(b, *results, "init") as i:
            kb.store(b, o, i, reduction_identity("reduce_sum", t))
    combines = [reduction_combiner(lw.scalars, "reduce_sum", t) for _, t in outs]

    def element(b, offsets):
        env = body.evaluate(lw, kb, b, offsets, leaves, first, srcs + [r for r, _, _ in stores])
        for ref, k, v in stores:
            kb.store(b, k, offsets[k], convert(b, env[ref], body.types[ref].dtype,
                                               v.type.dtype))
        return [convert(b, env[src], body.types[src].dtype, t)
                for src, (_, t) in zip(srcs, outs)]

    o0 = outs[0][0]
    if sizes and strides[o0][-1] == 0:  # the innermost loop is reduced: sums in registers
        sizes, strides = blocked_rows(kb, sizes, strides)
        with b.goto_entry_block():
            accs = [b.alloca(REG[t.name], name=f"acc{j}") for j, (_, t) in enumerate(outs)]
        fetch = row_prefetcher(kb, sizes, strides, {k for _, k, _ in stores}) \
            if PREFETCH_ROWS else None

        def before(b, offsets):
            if fetch is not None:
                fetch(b, offsets)
            for acc, (_, t) in zip(accs, outs):
                b.store(reduction_identity("reduce_sum", t), acc)

        def leaf(b, offsets):
            for acc, combine, v in zip(accs, combines, element(b, offsets)):
                b.store(combine(b, b.load(acc), v, True), acc)

        def after(b, offsets, state):
            for acc, combine, (o, _) in zip(accs, combines, outs):
                old = kb.load(b, o, offsets[o])
                kb.store(b, o, offsets[o], combine(b, old, b.load(acc), False))

        kb.nest(b, sizes, strides, leaf, (before, after))
    else:
        def leaf(b, offsets):
            for combine, (o, _), v in zip(combines, outs, element(b, offsets)):
                kb.store(b, o, offsets[o], combine(b, kb.load(b, o, offsets[o]), v, False))

        kb.nest(b, sizes, strides, leaf)
    lw.calls.append(kb.finish(b))
