"""small_gemm_columns: b's panels for a generated product whose n (c's columns) is known
only per call.

A symbolic graph's Linear layer computed as W @ x^T (graphc.passes.gemm_order: the weight's
rows as m, so the batch is n) reads x transposed: b's element (kk, j) at j * ldb_t + kk,
ldb_t the layer's static input width. Its static twin copies b panel-major into scratch
first (graphc.backends.cpu.gemm_panels.pack); with n known per call, `pack` does the same
for the whole panels (n // width of them, each through gemm_panels.copy_transposed) and
copies the last n % width columns element by element into one more panel whose other
columns are zeros, so the kernel reads every panel as a whole (small_gemm's `_emit`: the
last panel's tile computed into the stack and its n % width columns copied into c). The
scratch holds k x (n + width) floats: at least the ceil(n / width) panels. Each element is
copied once; no value changes.
"""

from __future__ import annotations

from dataclasses import replace

from llvmlite import ir

from graphc.backends.cpu.gemm_panels import copy_columns, copy_transposed, counted
from graphc.backends.cpu.kernels import KernelBuilder
from graphc.backends.cpu.values import F32, I64, PTR, Loc, i64, loop, size
from graphc.types import TensorType

__all__ = ["pack"]


def pack(lw, tile, b: Loc, sb: list) -> tuple | None:
    """(tile reading b panel-major, the panels' Loc in scratch, their element strides) for
    a tile whose n is known per call and whose b is read transposed in place (its k
    contiguous: sb[-2] == 1, columns sb[-1] apart, a static count); None otherwise (the
    BLAS stays). Appends one kernel, the copy, to the Lowerer `lw`'s calls."""
    if sb[-2] != 1 or type(sb[-1]) is not int or len(b.type.shape) != 2:
        return None
    width = tile.vectors * tile.lanes
    panels = lw.scratch_loc(TensorType((tile.n + width, tile.k), b.type.dtype))
    fn = _pack_function(lw, tile.k, width, tile.lanes, sb[-1])
    kb = KernelBuilder(lw, lw.name("gemm_pack"), (), ("gemm_columns", fn.name, tile.n))
    source, target = kb.operand(b, ()), kb.operand(panels, ())
    bld = kb.begin()
    if bld is None:
        lw.calls.append(kb.kernel)
    else:
        bld.call(fn, [kb.pointer(bld, source, i64(0)), kb.pointer(bld, target, i64(0)),
                      size(bld, tile.n)])
        lw.calls.append(kb.finish(bld))
    return replace(tile, ldb=width, ldb_t=0, b_panels=True), panels, [width, 1]


def _pack_function(cg, k: int, width: int, lanes: int, ldb_t: int) -> ir.Function:
    """void(ptr b, ptr panels, i64 n): b [k, n] (element (kk, j) at j * ldb_t + kk) copied
    panel-major, the last panel's columns past n zeros."""
    name = f"graphc_gemm_panels_{k}xN_w{width}x{lanes}_bt{ldb_t}"
    existing = cg.module.globals.get(name)
    if existing is not None:
        return existing
    fn = ir.Function(cg.module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64]), name)
    for arg in fn.args[:2]:
        arg.add_attribute("noalias")
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    source, panels, n = fn.args
    full = b.udiv(n, i64(width))
    with loop(b, 0, full, "panel") as p:
        target = b.gep(panels, [b.mul(p, i64(k * width))], inbounds=True, source_etype=F32)
        copy_transposed(b, source, ldb_t, b.mul(p, i64(width)), target, k, width, lanes)
    col = b.mul(full, i64(width))
    tail = b.sub(n, col)
    with b.if_then(b.icmp_unsigned("!=", tail, i64(0))):
        target = b.gep(panels, [b.mul(full, i64(k * width))], inbounds=True, source_etype=F32)
        zero = ir.Constant(ir.VectorType(F32, lanes), [0.0] * lanes)
        with counted(b, k * width // lanes, "pzero") as v:
            b.store(zero, b.gep(target, [b.mul(v, i64(lanes))], inbounds=True,
                                source_etype=F32), align=4)
        copy_columns(b, source, ldb_t, col, target, k, width, tail)
    b.ret_void()
    return fn
