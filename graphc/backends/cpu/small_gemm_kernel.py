"""small_gemm_kernel: the function of a generated small GEMM, its loops around the tiles.

`function(cg, gemm)` emits, once per module and SmallGemm (graphc.backends.cpu.
small_gemm_tile), void(ptr a, ptr b, ptr c, one ptr per addend, one i64 per size known per
call). Its loops, in one of two orders:
- row-ordered (`_emit`): panels of c (vectors x lanes columns), in each every row block
  (`_each_row_block`: full blocks of `rows` rows, then the rest) summing all of k in its
  tile (small_gemm_tile.emit_tile). b read transposed in place (`ldb_t`) is copied panel by
  panel onto the stack first; b's panels copied into scratch (`b_panels`) are read in
  order; with n known per call the last panel's tiles are computed on the stack and their
  columns copied into c (`_panel`'s tail).
- k-outer (`_emit_k_outer`, a weight gradient's long or short k): block of k by block, each
  over all panels, a panel's block of b copied contiguous onto the stack first and read from
  L1 by all its row blocks; each element of c sums the same blocks in the same order as the
  row-ordered kernel's (the same rounding).
Choosing the kernel is graphc.backends.cpu.small_gemm's.
"""

from __future__ import annotations

from dataclasses import replace

from llvmlite import ir

from graphc.backends.cpu.gemm_panels import copy_transposed, count_loop, counted
from graphc.backends.cpu.small_gemm_tile import (
    K_BLOCK,
    SmallGemm,
    as_i64,
    block_sums,
    emit_tile,
    per_call_k_blocks,
    store_tile,
)
from graphc.backends.cpu.values import F32, I64, PTR, i64, loop

__all__ = ["function"]


def function(cg, gemm: SmallGemm) -> ir.Function:
    """The module's function for `gemm` (emitted on first use): void(ptr a, ptr b, ptr c,
    one ptr per addend, one i64 per dim known per call)."""
    existing = cg.module.globals.get(gemm.name)
    if existing is not None:
        return existing
    if gemm.addends and gemm.k_outer:
        raise ValueError(f"small_gemm {gemm.name}: addends are for the row-ordered kernel")
    if gemm.accumulate and not gemm.k_outer:
        raise ValueError(f"small_gemm {gemm.name}: accumulate is for the k-outer kernel")
    if gemm.triangle and (gemm.k_outer or gemm.k > K_BLOCK or gemm.addends or gemm.per_call):
        raise ValueError(f"small_gemm {gemm.name}: a triangular a is for the row-ordered "
                         f"kernel with k in one block, without addends, sizes all static")
    if len(gemm.per_call) > 1 or (gemm.ldb_t and "k" in gemm.per_call) \
            or ("n" in gemm.per_call and (not gemm.b_panels or gemm.addends)):
        raise ValueError(f"small_gemm {gemm.name}: one size known per call: m, k with b read "
                         f"in place or from scratch, or n with b's panels copied and no addends")
    pointers = 3 + len(gemm.addends)
    fn = ir.Function(cg.module, ir.FunctionType(
        ir.VoidType(), [PTR] * pointers + [I64] * len(gemm.per_call)), gemm.name)
    for arg in fn.args[:pointers]:
        arg.add_attribute("noalias")
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    panel = None
    if gemm.ldb_t or gemm.k_outer or "n" in gemm.per_call:
        # one panel of b, k (a block of k) x (vectors x lanes) floats, row-major; with n
        # known per call, a row block's tile of the last panel (rows x vectors x lanes)
        rows = gemm.rows if "n" in gemm.per_call else K_BLOCK if type(gemm.k) is not int else \
            min(gemm.k, K_BLOCK) if gemm.k_outer else gemm.k
        stack = b.alloca(F32, size=i64(rows * gemm.vectors * gemm.lanes), name="panel")
        stack.align = 64
        # llvmlite's alloca gives a typed float*, which takes no vector stores: as opaque
        panel = b.inttoptr(b.ptrtoint(stack, I64), PTR)
    # the code reads each size known per call from its argument (an i64 value in g)
    emitted = replace(gemm, **dict(zip(gemm.per_call, fn.args[pointers:])))
    _emit(b, emitted, *fn.args[:3], panel, list(zip(gemm.addends, fn.args[3:pointers])))
    b.ret_void()
    return fn


# ---- the kernel's code ------------------------------------------------------------------------
def _emit(b: ir.IRBuilder, g: SmallGemm, a, bm, c, panel_copy=None, addends=()) -> None:
    """Panels of c (runtime loop), in each the full row blocks (runtime loop) then the
    remaining rows (one smaller tile). With b read transposed (`ldb_t`), each panel of b is
    first copied row-major into `panel_copy` (on the stack, in L1 for the panel's tiles).
    `addends`: (kind, pointer) added to c by the last block's stores (`store_tile`)."""
    if g.k_outer:
        return _emit_k_outer(b, g, a, bm, c, panel_copy)
    width = g.vectors * g.lanes
    if type(g.n) is not int:  # n known per call: whole panels, then the last columns
        full = b.udiv(g.n, i64(width))
        with loop(b, 0, full, "panel") as panel:
            _panel(b, g, a, bm, c, panel, panel_copy, addends)
        tail = b.sub(g.n, b.mul(full, i64(width)))
        with b.if_then(b.icmp_unsigned("!=", tail, i64(0))):
            _panel(b, g, a, bm, c, full, panel_copy, addends, tail)
        return
    with counted(b, g.n // width, "panel") as panel:
        _panel(b, g, a, bm, c, panel, panel_copy, addends)


def _panel(b: ir.IRBuilder, g: SmallGemm, a, bm, c, panel, panel_copy, addends,
           tail=None) -> None:
    """Every row block of c's panel number `panel`. `tail` (an i64 value, n known per call):
    only that many of the panel's columns lie in c; each row block's tile is computed into
    `panel_copy` (on the stack) and those columns copied into c."""
    width = g.vectors * g.lanes
    col = b.mul(panel, i64(width))
    source = (bm, g.ldb, col)
    if g.ldb_t:
        copy_transposed(b, bm, g.ldb_t, col, panel_copy, g.k, width, g.lanes)
        source = (panel_copy, width, i64(0))
    elif g.b_panels:  # the panel's rows one after another, read in order (in L1 or L2)
        source = (bm, width, b.mul(panel, i64(g.k * width)))

    def row_block(row0, rows: int) -> None:
        if tail is None:
            return _tile_needed(b, g, a, source, c, row0, col, rows, addends)
        emit_tile(b, replace(g, ldc=width), a, source, panel_copy, row0, col, rows,
              c_at=(i64(0), i64(0)))
        for r in range(rows):
            at = b.add(b.mul(b.add(row0, i64(r)), as_i64(g.ldc or g.n)), col)
            with loop(b, 0, tail, "tcol") as j:
                x = b.load(b.gep(panel_copy, [b.add(i64(r * width), j)], inbounds=True,
                                 source_etype=F32), typ=F32, align=4)
                b.store(x, b.gep(c, [b.add(at, j)], inbounds=True, source_etype=F32),
                        align=4)

    _each_row_block(b, g, row_block)


def _each_row_block(b: ir.IRBuilder, g: SmallGemm, body, name: str = "block") -> None:
    """body(first row, rows) for each row block of c: the full blocks of g.rows rows
    (runtime loop), then the rest: one smaller tile where m is static; where m is known per
    call (an i64 value), a tile of 2^j rows for each bit j the rest has, largest first."""
    if type(g.m) is int:
        full, rest = divmod(g.m, g.rows)
        if full:
            with counted(b, full, name) as block:
                body(b.mul(block, i64(g.rows)), g.rows)
        if rest:
            body(i64(full * g.rows), rest)
        return
    full = b.udiv(g.m, i64(g.rows))
    with loop(b, 0, full, name) as block:
        body(b.mul(block, i64(g.rows)), g.rows)
    done = b.mul(full, i64(g.rows))
    rest = b.sub(g.m, done)
    for bit in reversed(range((g.rows - 1).bit_length())):
        part = 1 << bit
        with b.if_then(b.icmp_unsigned("!=", b.and_(rest, i64(part)), i64(0))):
            body(b.add(done, b.and_(rest, i64(-2 * part))), part)  # after the larger parts


def _tile_needed(b: ir.IRBuilder, g: SmallGemm, a, source, c, row0, col0, rows: int,
                 addends) -> None:
    """emit_tile, but with `lower_c` only where a row of the block reaches the panel."""
    if not g.lower_c:
        return emit_tile(b, g, a, source, c, row0, col0, rows, addends)
    with b.if_then(b.icmp_signed(">", b.add(row0, i64(rows)), col0)):
        emit_tile(b, g, a, source, c, row0, col0, rows, addends)


def _emit_k_outer(b: ir.IRBuilder, g: SmallGemm, a, bm, c, panel_copy) -> None:
    """Panels of c (runtime loop); in each, k block by block (K_BLOCK, the first block
    stored, or added where g.accumulate, the others added), each block over all the panel's
    row blocks: the panel's block of b (K_BLOCK x vectors x lanes floats, 32 KB) is read
    from memory once and from L1 by the other row blocks, where _emit's order reads all of
    k per row block. Each element of c sums the same blocks in the same order as _emit's
    (same rounding)."""
    width = g.vectors * g.lanes
    panels = g.n // width

    def every_panel(start, count, accumulate: bool) -> None:
        with counted(b, panels, "panel") as panel:
            col = b.mul(panel, i64(width))
            _packed_row_blocks(b, g, a, bm, c, col, panel_copy, start, count, accumulate)

    if type(g.k) is not int:  # the same blocks, counted at run time
        first, full, rest = per_call_k_blocks(b, g.k)
        every_panel(i64(0), first, g.accumulate)
        with loop(b, 0, full, "kblock") as block:
            every_panel(b.add(b.mul(block, i64(K_BLOCK)), first), K_BLOCK, True)
        with b.if_then(b.icmp_unsigned("!=", rest, i64(0))):
            every_panel(b.sub(g.k, rest), rest, True)
        return
    first = min(g.k, K_BLOCK)
    full, rest = divmod(g.k - first, K_BLOCK)
    every_panel(i64(0), first, g.accumulate)
    if full:
        with counted(b, full, "kblock") as block:
            every_panel(b.add(b.mul(block, i64(K_BLOCK)), i64(first)), K_BLOCK, True)
    if rest:
        every_panel(i64(g.k - rest), rest, True)


def _packed_row_blocks(b: ir.IRBuilder, g: SmallGemm, a, bm, c, col, panel_copy, start,
                       count, accumulate: bool) -> None:
    """b's rows [start, start + count) of the panel at column `col` copied contiguous into
    `panel_copy` (count x vectors x lanes floats), then every row block over them. A b read
    transposed (`ldb_t`, a static count) is copied by gemm_panels.copy_transposed from its
    element (start, 0) on."""
    width = g.vectors * g.lanes
    if g.ldb_t:
        first = b.gep(bm, [start], inbounds=True, source_etype=F32)
        copy_transposed(b, first, g.ldb_t, col, panel_copy, count, width, g.lanes)
    else:
        _copy_rows(b, g, bm, col, panel_copy, start, count)
    # the packed block's row kk holds b's row start + kk: k's row is at (k - start) * width,
    # one inbounds gep from the block itself (a base pointer `start` rows before the stack
    # buffer would lie outside it, and an inbounds gep from there is poison in LLVM)
    offset = b.sub(i64(0), b.mul(start, i64(width)))
    _row_blocks(b, g, a, (panel_copy, width, offset), c, start, count, accumulate, col)


def _copy_rows(b: ir.IRBuilder, g: SmallGemm, bm, col, panel_copy, start, count) -> None:
    """panel_copy[kk, :] = b's row start + kk, columns [col, col + vectors x lanes)."""
    width = g.vectors * g.lanes
    vec = ir.VectorType(F32, g.lanes)
    with count_loop(b, count, "pk") as kk:
        src = b.add(b.mul(b.add(start, kk), i64(g.ldb)), col)
        dst = b.mul(kk, i64(width))
        for v in range(g.vectors):
            x = b.load(b.gep(bm, [b.add(src, i64(v * g.lanes))], inbounds=True,
                             source_etype=F32), typ=vec, align=4)
            b.store(x, b.gep(panel_copy, [b.add(dst, i64(v * g.lanes))], inbounds=True,
                             source_etype=F32), align=64)


def _row_blocks(b: ir.IRBuilder, g: SmallGemm, a, source, c, start, count,
                accumulate: bool, col) -> None:
    """For k in [start, start + count): every row block of c's panel at column `col`, b's
    columns read from `source` (_each_row_block), its sums stored into c or added."""

    def row_block(row0, rows: int) -> None:
        sums = block_sums(b, g, a, source, row0, rows, start, count)
        store_tile(b, g, c, row0, col, sums, accumulate=accumulate)

    _each_row_block(b, g, row_block, "rblock")
