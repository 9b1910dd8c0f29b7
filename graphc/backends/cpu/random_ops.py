"""random_ops: the registry's random ops uniform, normal, dropout and bernoulli as CPU kernels.

Part of the top layer of the CPU code generator (codegen's `Lowerer` calls `lower_random`).
Each op becomes one kernel over its output's shape: the int64[2] [seed, offset] input is
read once before the loops (loop-invariant), the row-major element index i comes from a
virtual arange, and graphc.backends.cpu.philox renders element i of the eager stream:

- uniform(seed; shape, dtype):  out[i] = philox.uniform(i)                 bit for bit
- normal(seed; shape, dtype):   out[i] = philox.normal(i)       within philox.NORMAL_TOLERANCE
- dropout(x, seed; p):          out[i] = philox.dropout(i, x[i], p)         bit for bit
- bernoulli(p, seed):           out[i] = philox.bernoulli(i, p[i])          bit for bit

Invariants: the element index is row-major over the output whatever the output's or the
inputs' strides (so a strided or in-place output draws what eager draws); the seed operand has
explicit zero strides (its shape (2,) must not broadcast against the domain) and its second
word is read through its real element stride, so a seed that is a view still reads right.
"""

from __future__ import annotations

from graphc.backends.cpu import philox
from graphc.backends.cpu.kernels import KernelBuilder
from graphc.backends.cpu.values import collapse, contiguous_strides, i64
from graphc.ir.graph import Node
from graphc.types import int64

__all__ = ["RANDOM_OPS", "lower_random"]

RANDOM_OPS = ("uniform", "normal", "dropout", "bernoulli")


def lower_random(lw, node: Node) -> None:
    """Append to `lw.calls` the kernel computing the random op `node` (one of RANDOM_OPS)."""
    op = node.op
    out = node.outputs[0]
    shape = out.type.shape
    kb = KernelBuilder(lw, lw.name(op), shape)
    seed_v = node.inputs[0] if op in ("uniform", "normal") else node.inputs[1]
    seed_loc = lw.locs[seed_v]
    s = kb.operand(seed_loc, (0,) * len(shape))
    second = seed_loc.strides[0] // seed_loc.type.dtype.itemsize if seed_loc.strides else 1
    lin = kb.virtual(int64, 0, 1, contiguous_strides(shape, 1))
    x = kb.operand(lw.locs[node.inputs[0]]) if op in ("dropout", "bernoulli") else None
    o = kb.operand(lw.locs[out])
    b = kb.begin()
    seed, offset = kb.load(b, s, i64(0)), kb.load(b, s, i64(second))

    def leaf(b, offs):
        i = kb.load(b, lin, offs[lin])
        if op == "uniform":
            v = philox.uniform(b, seed, offset, i, node.attrs["dtype"])
        elif op == "normal":
            v = philox.normal(b, seed, offset, i, node.attrs["dtype"])
        elif op == "dropout":
            v = philox.dropout(b, seed, offset, i, kb.load(b, x, offs[x]), node.attrs["p"])
        else:
            v = philox.bernoulli(b, seed, offset, i, kb.load(b, x, offs[x]))
        kb.store(b, o, offs[o], v)

    kb.nest(b, *collapse(shape, [k.strides for k in kb.operands]), leaf)
    lw.calls.append(kb.finish(b))
