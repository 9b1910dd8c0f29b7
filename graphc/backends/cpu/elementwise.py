"""elementwise: the Lowerer's one-loop-nest kernels: elementwise maps, copies, fills, and
the movement and source ops built on them.

Part of the top layer of the CPU code generator (values <- scalars <- kernels <- codegen):
`ElementwiseLowering` is the base of graphc.backends.cpu.codegen's `Lowerer`, which sets
the attributes it reads (`locs`: where values live, `calls`: the driver's kernels in
order). It holds
- `elementwise`: a lone elementwise node or a fused body (from `start`) over the output's
  domain, operands broadcast by strides, large loops prefetching ahead
  (graphc.backends.cpu.prefetch), DDP's windows read combined and stored streaming
  (graphc.backends.cpu.collective_shm);
- `copy` and `fill`: dst = src over a domain (tiles transposed where the strides cross), and
  dst = a constant; every other lowering that needs a copy or a fill calls these;
- the lowerings of copy, reshape, permute / broadcast_to / slice (where the plan copies
  them), concat, full and arange (codegen's `LOWERINGS`).
Every kernel here forks over the cores when large (kernels.KernelBuilder.begin) and is
shared between nodes of the same recipe.
"""

from __future__ import annotations

import math

from graphc.backends.cpu.kernels import Body, Codegen, Combined, Kernel, KernelBuilder, filled
from graphc.backends.cpu.prefetch import prefetching_nest
from graphc.backends.cpu.scalars import convert
from graphc.backends.cpu.values import (
    Loc,
    Locations,
    broadcast_strides,
    collapse,
    contiguous_strides,
    transpose_tiles,
)
from graphc.ir.graph import Node

__all__ = ["ElementwiseLowering"]


class ElementwiseLowering(Codegen):
    """Elementwise, copy and fill kernels and the movement and source lowerings (see the
    module docstring); a base of codegen's `Lowerer`, which sets `locs` and `calls`."""

    locs: Locations  # where every value lives (values.Locations)
    calls: list[Kernel]  # the driver's program: every kernel, in schedule order

    # ---- elementwise ---------------------------------------------------------------------
    def lower_elementwise(self, node: Node) -> None:
        self.elementwise(node, Body(node), 0)

    def body_leaves(self, kb: KernelBuilder, body: Body, extra: dict[int, Loc], start: int,
                stop: int) -> dict[int, int]:
        leaves: dict[int, int] = {}
        used = {r for _, args, _ in body.instrs[start:stop] for r in args} | set(body.outputs)
        for r in sorted(used):
            if r in extra:
                leaves[r] = kb.operand(extra[r])
            elif r < body.n:
                leaves[r] = kb.operand(self.locs[body.node.inputs[r]])
        for k in range(start, stop):
            op, _, attrs = body.instrs[k]
            if op == "arange":
                t = body.types[body.n + k]
                leaves[body.n + k] = kb.virtual(
                    t.dtype, attrs["start"], attrs["step"],
                    broadcast_strides(t.shape, (1,), kb.shape))
        return leaves

    def elementwise(self, node: Node, body: Body, start: int,
                    extra: dict[int, Loc] | None = None,
                    combined: dict[int, Combined] | None = None,
                    streamed: frozenset[int] = frozenset()) -> None:
        """`extra`: refs read from other Locs; `combined`: refs rendered from several;
        `streamed`: output refs stored non-temporally (KernelBuilder.store)."""
        domain = node.outputs[0].type.shape
        combined = combined or {}
        recipe = body.recipe("map", start, extra)
        if combined or streamed:
            recipe += (sorted((ref, c.key) for ref, c in combined.items()), sorted(streamed))
        kb = KernelBuilder(self, self.name(node.op), domain, recipe)
        leaves = self.body_leaves(kb, body, extra or {}, start, len(body.instrs))
        reads = {ref: (tuple(kb.operand(loc) for loc in c.locs), c.combine)
                 for ref, c in combined.items()}
        outs = [kb.operand(self.locs[v]) for v in node.outputs]
        sizes, strides = collapse(domain, [o.strides for o in kb.operands])
        b = kb.begin(parallel=True)
        if b is None:  # built before (kernels.KernelBuilder.begin): called with these pointers
            return self.calls.append(kb.kernel)

        def leaf(b, offsets):
            env = body.evaluate(self, kb, b, offsets, leaves, len(body.instrs), body.outputs,
                                reads)
            for ref, k, v in zip(body.outputs, outs, node.outputs):
                val = convert(b, env[ref], body.types[ref].dtype, v.type.dtype)
                kb.store(b, k, offsets[k], val, streaming=ref in streamed)

        # large loops prefetch ahead, but not over DDP's windows (`combined`, whose outputs are
        # `streamed`): slower there (docs/distributed.md)
        if combined or not prefetching_nest(kb, b, sizes, strides, leaf, outputs=set(outs)):
            kb.nest(b, sizes, strides, leaf)
        if streamed:
            kb.drain(b)
        self.calls.append(kb.finish(b))

    def copy(self, src: Loc, dst: Loc, name: str = "copy", domain=None,
             dst_strides=None) -> None:
        """dst[...] = src[...] over `domain` (dst's shape by default)."""
        domain = dst.type.shape if domain is None else domain
        if math.prod(domain) == 0:
            return
        kb = KernelBuilder(self, self.name(name), domain, ("copy",))
        i = kb.operand(src)
        o = kb.operand(dst, dst_strides)
        sizes, strides = transpose_tiles(*collapse(domain, [op.strides for op in kb.operands]))
        b = kb.begin(parallel=True)
        if b is None:
            return self.calls.append(kb.kernel)

        def leaf(b, offsets):
            v = convert(b, kb.load(b, i, offsets[i]), src.type.dtype, dst.type.dtype)
            kb.store(b, o, offsets[o], v)

        kb.nest(b, sizes, strides, leaf)
        self.calls.append(kb.finish(b))

    def fill(self, dst: Loc, value, name: str = "full") -> None:
        kb = KernelBuilder(self, self.name(name), dst.type.shape, ("fill", value))
        o = kb.operand(dst)
        sizes, strides = collapse(dst.type.shape, [kb.operands[0].strides])
        b = kb.begin(parallel=True)
        if b is None:
            return self.calls.append(kb.kernel)
        kb.nest(b, sizes, strides,
                lambda b, offsets: kb.store(b, o, offsets[o], filled(b, dst.type.dtype, value)))
        self.calls.append(kb.finish(b))

    # ---- movement and sources ------------------------------------------------------------
    def lower_copy(self, node: Node) -> None:
        self.copy(self.locs[node.inputs[0]], self.locs[node.outputs[0]])

    def lower_reshape(self, node: Node) -> None:  # a reshape the plan copies
        x, out = node.inputs[0], node.outputs[0]
        dst = self.locs[out]
        item = out.type.dtype.itemsize
        self.copy(self.locs[x], dst, "reshape", x.type.shape,
                  tuple(s // item for s in contiguous_strides(x.type.shape, item)))

    def lower_view_copy(self, node: Node) -> None:
        """permute, broadcast_to or slice the plan copies: a copy out of the view."""
        out = node.outputs[0]
        self.copy(self.locs.view(node, out), self.locs[out])

    def lower_concat(self, node: Node) -> None:
        out = self.locs[node.outputs[0]]
        axis = node.attrs["axis"]
        at = 0
        for x in node.inputs:
            t = x.type
            if t.numel:
                dst = Loc(out.base, out.index, out.offset + at * out.strides[axis], out.strides,
                          t)
                self.copy(self.locs[x], dst, "concat")
            at += t.shape[axis]

    def lower_full(self, node: Node) -> None:
        self.fill(self.locs[node.outputs[0]], node.attrs["value"])

    def lower_arange(self, node: Node) -> None:
        out = node.outputs[0]
        kb = KernelBuilder(self, self.name("arange"), out.type.shape, ("arange",))
        v = kb.virtual(out.type.dtype, node.attrs["start"], node.attrs["step"], (1,))
        o = kb.operand(self.locs[out])
        b = kb.begin()
        if b is None:
            return self.calls.append(kb.kernel)
        kb.nest(b, *collapse(out.type.shape, [x.strides for x in kb.operands]),
                lambda b, offs: kb.store(b, o, offs[o], kb.load(b, v, offs[v])))
        self.calls.append(kb.finish(b))
