"""conv_epilogue: a fused conv2d body's elementwise epilogue, applied per image inside the
im2col convolution kernel (graphc.backends.cpu.conv, `fused_conv2d`).

A fused node `fused(conv2d, add, relu, ...)` used to run as two kernels: the convolution
wrote its whole output, then one elementwise kernel read it back (the conv2d case's bias:
a second pass over 16.7 MB, 21% of its kernel time at one thread). Here the epilogue's
operands are added to the convolution's image kernel (each with its element strides over
(n, o, h, w), broadcast as the fused body reads it) and, right after an image's GEMM (or its
block's copy-out), every element of that image goes through the body (`Body.evaluate`, the
same rendering as codegen's elementwise kernels), while the image's output is in cache.

Invariants: the convolution result is read and the outputs written at the same element, so
an output that is the result itself (in place) is safe; rows and columns are one loop where
every operand allows it, so the inner loop runs over the whole plane and vectorises.
"""

from __future__ import annotations

from graphc.backends.cpu.image_kernels import iadd, imul
from graphc.backends.cpu.scalars import convert
from graphc.backends.cpu.values import broadcast_strides, i64, loop

__all__ = ["apply_epilogue", "epilogue_operands"]


def epilogue_operands(lw, kb, body, out_shape, c: int):
    """Operands of a fused epilogue in an image kernel (`c`: the convolution result's):
    ((leaves: ref -> operand, outputs: [(ref, operand, dtype)], strides: operand -> the
    element strides over (n, o, h, w), the output shape padded to 4 dims), and the recipe
    part its code depends on."""
    node = body.node
    shape4 = (1,) * (4 - len(out_shape)) + tuple(out_shape)

    def strides_of(loc):
        item = loc.type.dtype.itemsize
        s = broadcast_strides(loc.type.shape, tuple(st // item for st in loc.strides),
                              tuple(out_shape))
        return (0,) * (4 - len(s)) + tuple(s)

    used = {r for _, args, _ in body.instrs[1:] for r in args} | set(body.outputs)
    leaves, strides = {}, {}
    for r in sorted(used):
        if r == body.n:
            leaves[r] = c
            strides[c] = strides_of(kb.operands[c].loc)
        elif r < body.n:
            loc = lw.locs[node.inputs[r]]
            leaves[r] = kb.operand(loc, (0,))
            strides[leaves[r]] = strides_of(loc)
    outs = []
    for ref, v in zip(body.outputs, node.outputs):
        k = kb.operand(lw.locs[v], (0,))
        strides[k] = strides_of(lw.locs[v])
        outs.append((ref, k, v.type.dtype))
    recipe = (body.recipe("conv_epilogue", 1, None), shape4,
              tuple(sorted(strides.items())))
    return (leaves, outs, strides, shape4), recipe


def apply_epilogue(lw, kb, b, body, epilogue, n) -> None:
    """The fused epilogue over image `n` (all its channels and positions)."""
    leaves, outs, strides, (_, o_n, h_n, w_n) = epilogue
    # rows and columns as one loop where every operand allows (the inner loop then runs
    # over the whole plane; LLVM unrolled a 32-column loop and vectorised across rows)
    flat = all(s[2] == s[3] * w_n for s in strides.values())
    rows, cols = (1, h_n * w_n) if flat else (h_n, w_n)
    with loop(b, 0, o_n, "eo") as o, loop(b, 0, rows, "eh") as h, loop(b, 0, cols, "ew") as q:
        offsets = [i64(0)] * len(kb.operands)
        for k, s in strides.items():
            offsets[k] = iadd(b, imul(b, n, s[0]), imul(b, o, s[1]), imul(b, h, s[2]),
                              imul(b, q, s[3]))
        env = body.evaluate(lw, kb, b, offsets, leaves, len(body.instrs), body.outputs)
        for ref, k, dt in outs:
            kb.store(b, k, offsets[k], convert(b, env[ref], body.types[ref].dtype, dt))
