"""small_gemm_tile: a generated small GEMM's description and its register tile.

`SmallGemm` says which kernel graphc.backends.cpu.small_gemm chose (sizes, a's strides, how
b is read, the tile, the order of the loops, the fused addends); graphc.backends.cpu.
small_gemm_kernel emits its loops over panels and row blocks, and each tile of c through
`emit_tile`: rows x (vectors x lanes) sums in vector registers through a block of k (one
broadcast of a per row and `vectors` loads of b's row per k: `broadcast_fma`), stored into c
(`store_tile`) with the addends of a fused epilogue in the last block's stores.

Rounding: every element of c sums k in blocks of K_BLOCK (in order, fused multiply-adds in
registers), each block's sum added to c, as a BLAS blocks k (its KC): the error grows with
K_BLOCK + k / K_BLOCK rather than with k (measured: as close to a float64 run as OpenBLAS
or closer, k up to 16384). The order differs from the BLAS's, judged by distance from a
float64 run (docs/performance.md, "Rounding"; tests/test_cpu_small_gemm.py). A k known per
call runs the same blocks, counted at run time (`per_call_k_blocks`), so the same sums.

Sizes are static ints or, where known per call, i64 values of the kernel's arguments
(`as_i64` takes either). Also used by graphc.backends.cpu.winograd_gemm (`broadcast_fma`,
the intrinsics).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from graphc.backends.cpu.gemm_panels import counted
from graphc.backends.cpu.values import F32, I64, PTR, i64, loop

__all__ = ["K_BLOCK", "SmallGemm", "as_i64", "block_sums", "broadcast_fma", "emit_tile",
           "fma_intrinsic", "per_call_k_blocks", "prefetch_intrinsic", "store_tile"]

K_BLOCK = 256  # k summed in registers per block; blocks' sums added in c (a BLAS's KC)


@dataclass(frozen=True)
class SmallGemm:
    """One generated product: c[m, n] = a[m, k] @ b[k, n]; a's element strides (sa_row,
    sa_col), b's leading dimension ldb (its rows contiguous), c row-major; tiles of `rows`
    x `vectors` vector registers of `lanes` floats."""

    m: int
    n: int
    k: int
    sa_row: int
    sa_col: int
    ldb: int
    rows: int
    vectors: int
    lanes: int
    ldb_t: int = 0  # b read transposed in place: (k, j) at j * ldb_t + k, ldb unused
    k_outer: bool = False  # a long k: each block of k over all row blocks of a panel
    ldc: int = 0  # c's rows this many floats apart (a chunk of c's columns); 0: n
    # operands added to c in the last block's stores, in order (graphc.backends.cpu.
    # gemm_addends): "row" an [n] vector (a bias), "full" c's layout (a residual)
    addends: tuple[str, ...] = ()
    # b copied panel-major into scratch first (`operands`): panel p's k rows of vectors x
    # lanes floats one after another, p * k * vectors * lanes floats on; ldb unused
    b_panels: bool = False
    # a triangular: "lower" (a[i, k] = 0 for k > i: a causal head's P or dS), "upper" (0 for
    # k < i: their transposes); each row block sums only the k its rows can see (k within
    # one K_BLOCK). The terms skipped are exact zeros times b
    triangle: str = ""
    # only c's lower triangle (j <= i, and what shares a tile with it) is read: row blocks
    # wholly above a panel's first column are skipped (a causal head's scores, dP)
    lower_c: bool = False
    # the k-outer kernel prefetches, at each k, a's element prefetch_a[0] rows below the row
    # block's first and prefetch_a[1] k ahead (PREFETCH_A_ROWS, PREFETCH_A_K); None: none
    prefetch_a: tuple[int, int] | None = None
    # a "full" addend's lines of the tile asked for before the block of k whose stores add
    # it (small_gemm PREFETCH_ADDENDS): its rows then arrive while the block's sums run
    prefetch_addends: bool = False
    # one row chunk of a product whose m (this symbolic size) is known per call: m is the
    # most rows a call computes, and the call's own count comes as an argument (row_chunks)
    chunk_of: object = None
    # the first block of k added to what c holds too (a BLAS's beta 1: a convolution's
    # weight gradient summed over the batch's images); the k-outer kernel only
    accumulate: bool = False

    @property
    def name(self) -> str:
        b = f"bt{self.ldb_t}" if self.ldb_t else "bp" if self.b_panels else f"b{self.ldb}"
        order = ("_ko" if self.k_outer else "") + (f"_c{self.ldc}" if self.ldc else "")
        order += f"_{self.triangle}" if self.triangle else ""
        order += "_lowc" if self.lower_c else ""
        order += "_acc" if self.accumulate else ""
        order += "".join(f"_{kind}" for kind in self.addends)
        if self.prefetch_a:
            order += f"_pf{self.prefetch_a[0]}_{self.prefetch_a[1]}"
        order += "_pfadd" if self.prefetch_addends and "full" in self.addends else ""
        dims = "x".join(str(d) if type(d) is int else letter  # known per call: an argument
                        for d, letter in ((self.m, "M"), (self.n, "N"), (self.k, "K")))
        dims = f"M{dims}" if self.chunk_of is not None else dims  # at most m rows a call
        return (f"graphc_small_sgemm_{dims}_a{self.sa_row}_{self.sa_col}"
                f"_{b}_t{self.rows}x{self.vectors}x{self.lanes}{order}")

    @property
    def per_call(self) -> tuple[str, ...]:
        """The dims ("m", "k") known only per call: the kernel takes each as a trailing i64
        argument (`size_arguments`), in this order."""
        return tuple(d for d in ("m", "n", "k") if type(getattr(self, d)) is not int
                     or (d == "m" and self.chunk_of is not None))


def fma_intrinsic(module: ir.Module, vec: ir.VectorType) -> ir.Function:
    """llvm.fma on vectors (llvmlite's IRBuilder.fma takes scalars only)."""
    name = f"llvm.fma.v{vec.count}f32"
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(vec, [vec, vec, vec]), name)


def prefetch_intrinsic(module: ir.Module) -> ir.Function:
    """llvm.prefetch.p0(pointer, rw, locality, cache type), declared once per module."""
    return module.globals.get("llvm.prefetch.p0") or ir.Function(
        module, ir.FunctionType(ir.VoidType(), [PTR] + [ir.IntType(32)] * 3),
        "llvm.prefetch.p0")


def broadcast_fma(b: ir.IRBuilder, a, row0, rows: int, a_row: int, a_col, bvecs: list,
                  sums: list, fma, splat_mask) -> list:
    """One k step of a register tile: for each of `rows` rows, a[row0 + r, k] (at
    (row0 + r) * a_row + a_col) broadcast to a vector and multiplied into `bvecs` (b's row k)
    with the row's sums added; returns the new sums, rows lists of len(bvecs) vectors."""
    vec = bvecs[0].type
    new = []
    for r in range(rows):
        at = b.add(b.mul(b.add(row0, i64(r)), i64(a_row)), a_col)
        x = b.load(b.gep(a, [at], inbounds=True, source_etype=F32), typ=F32, align=4)
        splat = b.shuffle_vector(b.insert_element(ir.Constant(vec, ir.Undefined), x, i64(0)),
                                 ir.Constant(vec, ir.Undefined), splat_mask)
        new.append([b.call(fma, [splat, bv, s]) for bv, s in zip(bvecs, sums[r])])
    return new


def emit_tile(b: ir.IRBuilder, g: SmallGemm, a, source, c, row0, col0, rows: int,
          addends=(), c_at=None) -> None:
    """c[row0 : row0 + rows, col0 : col0 + vectors * lanes] = a[rows, :] @ b[:, cols]: the
    sums of K_BLOCK consecutive k in registers, each block's added to c (the first stored),
    as a BLAS blocks k: the rounding error grows with K_BLOCK + k / K_BLOCK, not with k.
    `source`: (pointer, leading dimension, first column) b's columns are read from.
    `addends` go into the last block's stores (that block peeled off the loop). `c_at`:
    (row, column) the tile's first element lies at in c, where not (row0, col0)."""
    crow, ccol = (row0, col0) if c_at is None else c_at
    if type(g.k) is not int:  # k known per call: the same blocks, counted at run time
        first, full, rest = per_call_k_blocks(b, g.k)
        store_tile(b, g, c, crow, ccol, block_sums(b, g, a, source, row0, rows, i64(0), first))
        with loop(b, 0, full, "kblock") as block:
            start = b.add(b.mul(block, i64(K_BLOCK)), first)
            sums = block_sums(b, g, a, source, row0, rows, start, K_BLOCK)
            store_tile(b, g, c, crow, ccol, sums, accumulate=True)
        with b.if_then(b.icmp_unsigned("!=", rest, i64(0))):
            sums = block_sums(b, g, a, source, row0, rows, b.sub(g.k, rest), rest)
            store_tile(b, g, c, crow, ccol, sums, accumulate=True)
        return _add_addends(b, g, c, crow, ccol, rows, addends)
    first = min(g.k, K_BLOCK)
    full, rest = divmod(g.k - first, K_BLOCK)
    ahead = addends if g.prefetch_addends else ()  # asked for before the block adding them
    if g.triangle:  # one block of k, from/to the diagonal of the block's rows
        start, stop = i64(0), i64(g.k)
        if g.triangle == "lower":  # the block's last row sees k up to itself
            last = b.add(row0, i64(rows))
            stop = b.select(b.icmp_signed("<", last, stop), last, stop)
        else:  # its first row sees k from itself on (at least one k: the rest are zeros)
            start = b.select(b.icmp_signed("<", row0, i64(g.k - 1)), row0, i64(g.k - 1))
        sums = block_sums(b, g, a, source, row0, rows, start, g.k, stop)
        return store_tile(b, g, c, crow, ccol, sums)
    if not (full or rest):
        _prefetch_full_addends(b, g, ahead, crow, ccol, rows)
    store_tile(b, g, c, crow, ccol, block_sums(b, g, a, source, row0, rows, i64(0), first),
           addends=() if full or rest else addends)
    looped = full - 1 if addends and full and not rest else full
    if looped:
        with counted(b, looped, "kblock") as block:
            start = b.add(b.mul(block, i64(K_BLOCK)), i64(first))
            sums = block_sums(b, g, a, source, row0, rows, start, K_BLOCK)
            store_tile(b, g, c, crow, ccol, sums, accumulate=True)
    if looped < full:  # the last full block, with the addends
        _prefetch_full_addends(b, g, ahead, crow, ccol, rows)
        sums = block_sums(b, g, a, source, row0, rows, i64(first + looped * K_BLOCK), K_BLOCK)
        store_tile(b, g, c, crow, ccol, sums, accumulate=True, addends=addends)
    if rest:
        _prefetch_full_addends(b, g, ahead, crow, ccol, rows)
        sums = block_sums(b, g, a, source, row0, rows, i64(g.k - rest), rest)
        store_tile(b, g, c, crow, ccol, sums, accumulate=True, addends=addends)


def block_sums(b: ir.IRBuilder, g: SmallGemm, a, source, row0, rows: int, start,
                count, stop=None) -> list:
    """The tile's sums over k in [start, start + count) (count >= 1, an int or an i64 value;
    or to `stop`, a value above start), as phi nodes through the loop: rows lists of
    `vectors` vectors."""
    bm, ldb, col0 = source
    vec = ir.VectorType(F32, g.lanes)
    zero = ir.Constant(vec, [0.0] * g.lanes)
    mask = ir.Constant(ir.VectorType(ir.IntType(32), g.lanes), [0] * g.lanes)
    fma = fma_intrinsic(b.module, vec)
    pre = b.block
    stop = b.add(start, as_i64(count)) if stop is None else stop
    body = b.append_basic_block("k.body")
    b.branch(body)
    b.position_at_end(body)
    k = b.phi(I64, name="k")
    k.add_incoming(start, pre)
    sums = [[b.phi(vec, name=f"s{r}_{v}") for v in range(g.vectors)] for r in range(rows)]
    for row in sums:
        for s in row:
            s.add_incoming(zero, pre)
    b_row = b.add(b.mul(k, i64(ldb)), col0)
    bvecs = [b.load(b.gep(bm, [b.add(b_row, i64(v * g.lanes))], inbounds=True,
                          source_etype=F32), typ=vec, align=4)
             for v in range(g.vectors)]
    a_col = b.mul(k, i64(g.sa_col))
    if g.k_outer and g.prefetch_a:
        _prefetch_a(b, g, a, row0, k)
    new = broadcast_fma(b, a, row0, rows, g.sa_row, a_col, bvecs, sums, fma, mask)
    nxt = b.add(k, i64(1), name="k.next")
    nxt.flags.append("nuw")
    end = b.append_basic_block("k.end")
    for row, row_new in zip(sums, new):
        for s, s_new in zip(row, row_new):
            s.add_incoming(s_new, body)
    k.add_incoming(nxt, body)
    b.cbranch(b.icmp_unsigned("<", nxt, stop), body, end)
    b.position_at_end(end)
    return new


def _prefetch_a(b: ir.IRBuilder, g: SmallGemm, a, row0, k) -> None:
    """Prefetch a's element g.prefetch_a[0] rows below row0, g.prefetch_a[1] k ahead of k
    (into every cache level; past a's end it touches what follows, which never faults)."""
    rows, ahead = g.prefetch_a
    at = b.add(b.mul(b.add(row0, i64(rows)), i64(g.sa_row)),
               b.mul(b.add(k, i64(ahead)), i64(g.sa_col)))
    prefetch = prefetch_intrinsic(b.module)
    pointer = b.gep(a, [at], source_etype=F32)  # not inbounds: it may lie past a
    b.call(prefetch, [pointer] + [ir.Constant(ir.IntType(32), v) for v in (0, 3, 1)])


def _prefetch_full_addends(b: ir.IRBuilder, g: SmallGemm, addends, row0, col0,
                           rows: int) -> None:
    """Ask for each "full" addend's lines of the tile at (row0, col0) (c's layout: a
    residual), a line per 64 bytes of each row, into every cache level; a "row" addend (a
    bias) is read by every tile and stays in cache."""
    prefetch = prefetch_intrinsic(b.module)
    flags = [ir.Constant(ir.IntType(32), v) for v in (0, 3, 1)]
    for kind, source in addends:
        if kind != "full":
            continue
        for r in range(rows):
            at = b.add(b.mul(b.add(row0, i64(r)), as_i64(g.ldc or g.n)), col0)
            for offset in range(0, g.vectors * g.lanes, 16):
                pointer = b.gep(source, [b.add(at, i64(offset))], inbounds=True,
                                source_etype=F32)
                b.call(prefetch, [pointer] + flags)


def _add_addends(b: ir.IRBuilder, g: SmallGemm, c, row0, col0, rows: int, addends) -> None:
    """Each of `addends` added to the tile of c just stored (a k known per call, whose last
    block is found at run time): c + addend in the order store_tile adds them, so the same
    bits as adding them in the last block's stores."""
    if not addends:
        return
    vec = ir.VectorType(F32, g.lanes)
    unused = [[ir.Constant(vec, ir.Undefined)] * g.vectors for _ in range(rows)]
    store_tile(b, g, c, row0, col0, unused, accumulate=True, addends=addends, sums_too=False)


def store_tile(b: ir.IRBuilder, g: SmallGemm, c, row0, col0, sums: list,
           accumulate: bool = False, addends=(), sums_too: bool = True) -> None:
    """The tile's sums into c (`accumulate`: added to what c holds; not `sums_too`: c as it
    is), then each of `addends` ((kind, pointer): "row" read at the column, "full" at c's
    element) added in order: the same additions, in the same order, as the unfused
    epilogue's over the stored c."""
    vec = sums[0][0].type
    for r, row in enumerate(sums):
        at = b.add(b.mul(b.add(row0, i64(r)), as_i64(g.ldc or g.n)), col0)
        for v, value in enumerate(row):
            where = b.add(at, i64(v * g.lanes))
            pointer = b.gep(c, [where], inbounds=True, source_etype=F32)
            if accumulate:
                held = b.load(pointer, typ=vec, align=4)
                value = b.fadd(held, value) if sums_too else held
            for kind, source in addends:
                index = where if kind == "full" else b.add(col0, i64(v * g.lanes))
                addend = b.gep(source, [index], inbounds=True, source_etype=F32)
                value = b.fadd(value, b.load(addend, typ=vec, align=4))
            b.store(value, pointer, align=4)


def per_call_k_blocks(b: ir.IRBuilder, k) -> tuple:
    """(first block's k, full K_BLOCKs after it, the rest) of a k known per call, as emit_tile
    and small_gemm_kernel._emit_k_outer split a static k: i64 values."""
    first = b.select(b.icmp_unsigned("<", k, i64(K_BLOCK)), k, i64(K_BLOCK))
    after = b.sub(k, first)
    return first, b.udiv(after, i64(K_BLOCK)), b.urem(after, i64(K_BLOCK))


def as_i64(x) -> ir.Value:
    """An i64 size: a static int as a constant, one known per call (an i64 value) as is."""
    return x if isinstance(x, ir.Value) else i64(x)
