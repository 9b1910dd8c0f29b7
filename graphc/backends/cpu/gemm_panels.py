"""gemm_panels: copies of b's panels for small_gemm's generated kernels, and the loop they
are written with.

A panel is `vectors` x `lanes` columns of b (32 floats on AVX-512 hosts), the columns one
tile of c reads. A kernel reads a panel's k rows one after another; where b's rows lie ldb
floats apart (2 KB for the GPT's [128 x 512] weights) a 16 KB panel maps onto a few of L1's
sets and never stays there. So:
- `pack` (a medium product, small_gemm.operands) copies b panel-major into the backend's
  scratch before the product's row chunks: panel p's k rows contiguous, p * k * width
  floats on (`SmallGemm.b_panels`), from b read row-major or transposed (a Linear's W^T);
- `copy_transposed` copies one panel of a b read transposed (attention's K^T) onto a
  kernel's stack, lanes x lanes squares transposed in registers (`transposed`).
Both copy each element once and change no value.
"""

from __future__ import annotations

from dataclasses import replace

from llvmlite import ir

from graphc.backends.cpu.kernels import KernelBuilder
from graphc.backends.cpu.values import F32, I64, PTR, Loc, i64, loop, square_transposed
from graphc.types import TensorType

__all__ = ["PANEL_MAJOR_B", "copy_columns", "copy_transposed", "count_loop", "counted", "pack",
           "two_pointer_function"]

# a medium product's b copied panel-major into scratch first (one copy before the row
# chunks; `SmallGemm.b_panels`): each tile then reads its panel's rows one after another.
# Read in place, a panel's rows lie ldb apart, 2 KB at n = 512, which maps a 16 KB panel
# onto 4 of L1's 64 sets: it never stayed in L1. Alone, one thread, 1024-row products
# (issue 14, ninth session): 1024 x 512 x 128 147-159 -> 161-170 GFLOP/s, 1024 x 128 x 128
# 154-160 -> 173-186, 1024 x 128 x 512 152 -> 170 (OpenBLAS 132-144)
PANEL_MAJOR_B = True


def pack(lw, tile, b: Loc, sb: list) -> tuple:
    """(tile reading b panel-major, the panels' Loc in scratch, their element strides): one
    kernel copying b (element strides `sb`: rows contiguous, or columns for a b read
    transposed) panel by panel, appended to the Lowerer `lw`'s calls."""
    width = tile.vectors * tile.lanes
    k, n = tile.k, tile.n
    panels = lw.shared_scratch_loc(TensorType((n // width, k, width), b.type.dtype))
    fn = _pack_function(lw, k, n, width, tile.lanes, sb)
    kb = KernelBuilder(lw, lw.name("gemm_pack"), (), ("gemm_panels", fn.name))
    source, target = kb.operand(b, ()), kb.operand(panels, ())
    bld = kb.begin()
    if bld is None:
        lw.calls.append(kb.kernel)
    else:
        bld.call(fn, [kb.pointer(bld, source, i64(0)), kb.pointer(bld, target, i64(0))])
        lw.calls.append(kb.finish(bld))
    return replace(tile, ldb=width, b_panels=True), panels, [width, 1]


def two_pointer_function(cg, name: str) -> tuple[ir.Function, ir.IRBuilder | None]:
    """`void name(ptr noalias, ptr noalias)` (nounwind, noinline) new in cg's module with a
    builder at its entry, or (the function the module already has, None)."""
    existing = cg.module.globals.get(name)
    if existing is not None:
        return existing, None
    fn = ir.Function(cg.module, ir.FunctionType(ir.VoidType(), [PTR, PTR]), name)
    for arg in fn.args:
        arg.add_attribute("noalias")
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


def _pack_function(cg, k: int, n: int, width: int, lanes: int, sb: list) -> ir.Function:
    """void(ptr b, ptr panels): b [k, n] (element strides sb) copied panel-major."""
    transposed_b = sb[-1] != 1
    name = f"graphc_gemm_panels_{k}x{n}_w{width}x{lanes}_" + (
        f"bt{sb[-1]}" if transposed_b else f"b{sb[-2]}")
    fn, b = two_pointer_function(cg, name)
    if b is None:
        return fn
    source, panels = fn.args
    vec = ir.VectorType(F32, lanes)
    with counted(b, n // width, "panel") as p:
        col = b.mul(p, i64(width))
        target = b.gep(panels, [b.mul(p, i64(k * width))], inbounds=True, source_etype=F32)
        if transposed_b:
            copy_transposed(b, source, sb[-1], col, target, k, width, lanes)
        else:
            with counted(b, k, "pk") as kk:
                row = b.add(b.mul(kk, i64(sb[-2])), col)
                at = b.mul(kk, i64(width))
                for v in range(0, width, lanes):
                    x = b.load(b.gep(source, [b.add(row, i64(v))], inbounds=True,
                                     source_etype=F32), typ=vec, align=4)
                    b.store(x, b.gep(target, [b.add(at, i64(v))], inbounds=True,
                                     source_etype=F32), align=4)
    b.ret_void()
    return fn


def copy_transposed(b: ir.IRBuilder, bm, ldb_t: int, col, panel_copy, k: int, width: int,
                    lanes: int) -> None:
    """panel_copy[kk, jj] = b[kk, col + jj] for the panel's `width` columns, b's element
    (kk, j) at j * ldb_t + kk: squares of lanes x lanes read as vectors along k (each a
    column of the panel) and transposed in registers; element by element where k is not
    whole squares."""
    vec = ir.VectorType(F32, lanes)
    if k % lanes:
        return copy_columns(b, bm, ldb_t, col, panel_copy, k, width, width)
    with counted(b, width // lanes, "psq") as square:
        j0 = b.mul(square, i64(lanes))
        with counted(b, k // lanes, "pkq") as kq:
            k0 = b.mul(kq, i64(lanes))
            columns = []
            for j in range(lanes):
                at = b.add(b.mul(b.add(b.add(col, j0), i64(j)), i64(ldb_t)), k0)
                columns.append(b.load(b.gep(bm, [at], inbounds=True, source_etype=F32),
                                      typ=vec, align=4))
            for kk, row in enumerate(square_transposed(b, columns)):
                at = b.add(b.mul(b.add(k0, i64(kk)), i64(width)), j0)
                b.store(row, b.gep(panel_copy, [at], inbounds=True, source_etype=F32),
                        align=4)


def copy_columns(b: ir.IRBuilder, bm, ldb_t: int, col, panel_copy, k: int, width: int,
                 columns) -> None:
    """panel_copy[kk, jj] = b[kk, col + jj] for jj < `columns` (an int, or an i64 value known
    per call), element by element: b's element (kk, j) at j * ldb_t + kk, the panel's rows
    `width` floats apart."""
    with count_loop(b, columns, "pcol") as jj:
        row = b.mul(b.add(col, jj), i64(ldb_t))
        with counted(b, k, "pk") as kk:
            x = b.load(b.gep(bm, [b.add(row, kk)], inbounds=True, source_etype=F32),
                       typ=F32, align=4)
            at = b.add(b.mul(kk, i64(width)), jj)
            b.store(x, b.gep(panel_copy, [at], inbounds=True, source_etype=F32), align=4)


class counted:
    """`for i in range(count)` with a known count >= 1 (a do-while loop; no loop at 1)."""

    def __init__(self, b: ir.IRBuilder, count: int, name: str) -> None:
        self.b, self.count, self.name = b, count, name

    def __enter__(self) -> ir.Value:
        b = self.b
        if self.count == 1:
            return i64(0)
        self.pre = b.block
        self.body = b.append_basic_block(f"{self.name}.body")
        b.branch(self.body)
        b.position_at_end(self.body)
        self.i = b.phi(I64, name=self.name)
        self.i.add_incoming(i64(0), self.pre)
        return self.i

    def __exit__(self, *exc) -> None:
        if self.count == 1 or exc[0] is not None:
            return
        b = self.b
        nxt = b.add(self.i, i64(1), name=f"{self.name}.next")
        nxt.flags.append("nuw")
        self.i.add_incoming(nxt, b.block)
        end = b.append_basic_block(f"{self.name}.end")
        b.cbranch(b.icmp_unsigned("<", nxt, i64(self.count)), self.body, end)
        b.position_at_end(end)


def count_loop(b: ir.IRBuilder, count, name: str):
    """`for i in range(count)`: a static count >= 1 (`counted`), or an i64 value (values.loop,
    which also runs no iteration at 0)."""
    return counted(b, count, name) if type(count) is int else loop(b, 0, count, name)
