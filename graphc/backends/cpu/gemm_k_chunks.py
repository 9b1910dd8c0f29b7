"""gemm_k_chunks: a weight gradient summed over its k (the tokens) in chunks, then merged.

A weight gradient x^T @ dy with a long k and few columns (GPT's [128 x 1024] @ [1024 x 128],
17 a step: graphc.backends.cpu.small_gemm `k_chunks`) can be shared by the cores by c's
columns, but then each core reads all of x, half of it written by the other core a kernel
before (the rows of x and dy come from kernels forked over the tokens). Cut by k instead,
each chunk of tokens computes a whole [m x n] partial product into scratch, one after
another in a loop the cores share, and `merge` adds the partials into c in their order:

    c = ((p0 + p1) + p2) + ...

Rounding: each partial sums its k in blocks of K_BLOCK as the k-outer kernel does; c adds
the partials in chunk order, whatever the number of threads (the same bits on 1 and 2
threads). Against the unchunked kernel's ((b0 + b1) + b2) + b3 over blocks of k the order
differs, judged by distance from a float64 run (docs/performance.md, "Rounding";
tests/test_cpu_small_gemm.py).
"""

from __future__ import annotations

from llvmlite import ir

from graphc.backends.cpu.gemm_panels import counted, two_pointer_function
from graphc.backends.cpu.kernels import KernelBuilder
from graphc.backends.cpu.values import F32, Loc, i64

__all__ = ["merge"]


def merge(lw, partials: Loc, c: Loc, count: int, lanes: int) -> None:
    """Append to the Lowerer `lw`'s calls one kernel that sets c (contiguous, m x n floats,
    m * n a multiple of `lanes`) to the sum of the `count` partial products laid one after
    another in `partials`, added in their order."""
    elements = c.type.numel
    if count < 2 or elements % lanes:
        raise ValueError(f"gemm_k_chunks.merge: expected 2 or more partials of a whole number "
                         f"of {lanes}-float vectors, got {count} of {elements} floats")
    fn = _merge_function(lw, count, elements, lanes)
    kb = KernelBuilder(lw, lw.name("gemm_k_merge"), (), ("gemm_k_chunks", fn.name))
    source, target = kb.operand(partials, ()), kb.operand(c, ())
    bld = kb.begin()
    if bld is None:
        lw.calls.append(kb.kernel)
        return
    bld.call(fn, [kb.pointer(bld, source, i64(0)), kb.pointer(bld, target, i64(0))])
    lw.calls.append(kb.finish(bld))


def _merge_function(cg, count: int, elements: int, lanes: int) -> ir.Function:
    """void(ptr partials, ptr c): c[i] = ((p0[i] + p1[i]) + ...), p_j `elements` floats on."""
    name = f"graphc_gemm_k_merge_{count}x{elements}_v{lanes}"
    fn, b = two_pointer_function(cg, name)
    if b is None:
        return fn
    partials, c = fn.args
    vec = ir.VectorType(F32, lanes)
    with counted(b, elements // lanes, "merge") as i:
        at = b.mul(i, i64(lanes))
        total = None
        for j in range(count):
            x = b.load(b.gep(partials, [b.add(at, i64(j * elements))], inbounds=True,
                             source_etype=F32), typ=vec, align=4)
            total = x if total is None else b.fadd(total, x)
        b.store(total, b.gep(c, [at], inbounds=True, source_etype=F32), align=4)
    b.ret_void()
    return fn
