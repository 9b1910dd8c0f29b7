"""winograd_gemm: one generated function for a Winograd block's 16 transform-domain GEMMs.

graphc.backends.cpu.conv_winograd multiplies, per block of tiles, 16 independent matrices:
`c[xi] (m x n) (+)= a[xi] (m x k) @ b[xi] (k x n)` for the 16 transform-domain positions xi
(forward and input gradient: m output channels, k input channels, n tiles; weight gradient:
m and n channels, k tiles). One BLAS call each costs the BLAS's interface, its packing of
both operands into panels, and its driver: on ResNet-18's shapes ([64 x 64] @ [64 x 64] to
[512 x 512] @ [512 x 128]) OpenBLAS ran them at 107-160 GFLOP/s where it runs large SGEMM at
~190 on one core (docs/performance.md, "ResNet-18, ninth session").

This module generates, per shape, one function

    void graphc_winograd_gemm_<shape>(ptr a, ptr b, ptr c, float beta)

that runs all 16 products without packing: c is cut into tiles of `rows` x (`vectors` x
LANES) (LANES floats to a vector register), each tile's sums kept in registers through a
block of K_BLOCK steps of k, every step loading `vectors` vectors of b's row and
broadcasting one element of a per tile row (any element strides for a). The panel's block
of b stays in L1 for all its row blocks. b's rows are contiguous (leading dimension `ldb`),
or b is stored panel by panel (`b_panel`: each panel's rows in a block of their own, which
keeps wide rows' blocks from sharing a few of L1's sets), c's rows `ldc` apart; the 16
matrices of each operand `*_step` elements apart. `beta` is 0
(c = a @ b) or 1 (c += a @ b: the weight gradient's blocks after the first).

Rounding: each element of c sums k in blocks of K_BLOCK (one chain of fused multiply-adds
each, in order), each block's sum added to c, as a BLAS blocks k (its KC); for k <= K_BLOCK
(the weight gradient's blocks of 64 tiles, the 64-channel layers) the same sums as
OpenBLAS's, bit for bit (benchmarks/winograd_gemm.py prints the difference). Judged by
distance from a float64 run (tests/test_cpu_winograd_gemm.py, test_cpu_conv_winograd.py).

`plan(..., products=...)`: a function running another number of products, one shape
(graphc.backends.cpu.conv_row_split's one product of a stride-2 convolution's image).

`plan(...)` decides (None: the BLAS calls stay): an AVX-512 host (graphc.backends.cpu.
small_gemm.lanes() 16; AVX2 hosts keep the BLAS: not measured there), n a whole number of
vectors, k within MAX_K, an
accumulated c within MAX_ACCUMULATED_C (larger ones measured slower than the BLAS), ENABLED.
The caller keeps float64 on the BLAS. `function(module, gemm)` emits the function once per
module and shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from graphc.backends.cpu import kernels
from graphc.backends.cpu.gemm_panels import counted
from graphc.backends.cpu.small_gemm import lanes
from graphc.backends.cpu.small_gemm_tile import broadcast_fma, fma_intrinsic, prefetch_intrinsic
from graphc.backends.cpu.values import F32, I64, PTR, i64, loop

__all__ = ["BlockGemm", "MAX_K", "POSITIONS", "available", "function", "plan"]

POSITIONS = 16  # F(2x2, 3x3): 4 x 4 transform-domain positions, one product each
# k summed in registers per block (each block's sums added to c, as a BLAS's KC): the
# panel's block of b, K_BLOCK x 64 floats (16 KB), stays in L1 for all its row blocks
# (1 thread, alone, [512 x 512] @ [512 x 128]: blocks of 64 at 145 GFLOP/s, 128 at 112,
# 256 at 123, k whole at 132)
K_BLOCK = 64
MAX_K = 512  # the longest k measured and tested: ResNet-18's widest, [512 x 512] @ [512 x 128]
# An accumulating product (beta 1: the weight gradient's) with c larger than this keeps the
# BLAS. [256 x 64] @ [64 x 256] alone (benchmarks/winograd_gemm.py, the same c every call)
# ran at 120-145 GFLOP/s against the BLAS's 121-141, but inside the weight-gradient kernel
# (256 channels at 8x8, batch 32, 1 thread, 31 alternated rounds, three runs) the kernel
# took 8.6-9.0 ms against 10.1-10.5 with the BLAS. The 512-channel layer (dU 1 MB a
# position) reads V through the transpose flag (conv_winograd.WIDE_CHANNELS): the NN form
# with this kernel measured the same as that, within the noise
MAX_ACCUMULATED_C = 256 * 256
LANES = 16  # AVX-512: 16 floats a vector register
# register tiles: 24 accumulators of the 32 vector registers, the rest for b's vectors and
# a's broadcasts (6 rows x 4 vectors where n allows)
ACCUMULATORS = 24
# b stored panel by panel (plan's `b_panel`): PANEL_COLUMNS columns of every row of b, then
# the next panel's. A panel's block of b (K_BLOCK rows) is then 16 KB in a row, where rows
# of 512 floats put its 256 lines in 8 of L1's 64 sets (rows of 256: 16 sets), 32 a set
# against 12 ways. Taken by conv_winograd_wide_grad's Vt (rows of 512 channels: its kernel
# 10.38 -> 9.71 ms). The NN weight gradient's Y at 256 channels gained alone ([256 x 64] @
# [64 x 256], 123 -> 159 GFLOP/s) but not inside its kernel (Y fresh in L2): not taken there
PANEL_COLUMNS = 64
# A product of 2 to ROWS_OVER_PANELS panels runs, per block of k, each row block over all
# its panels (a's block of the row block read from memory once, the panels' blocks of b,
# 2 x 16 KB, kept in L1), not each panel over all row blocks (a read once per panel). At
# 512 channels (M = U @ V, [512 x 512] @ [512 x 128], U 16 MB from memory, read twice):
# alone 180 -> 229 GFLOP/s; the forward's and input gradient's kernels (batch 32, 1 thread)
# 6.78 -> 6.40 and 6.98 -> 6.80 ms; 256 channels ([256 x 256] @ [256 x 128]) the same within
# the noise. Wider products (conv_winograd_wide_grad's 8 panels of Vt) keep panels outermost.
# 0: panels outermost everywhere (A/B runs)
ROWS_OVER_PANELS = 2
ENABLED = True  # False: every block keeps its BLAS calls (A/B runs, benchmarks)


@dataclass(frozen=True)
class BlockGemm:
    """`products` (POSITIONS) products c[xi] (m x n) (+)= a[xi] (m x k) @ b[xi] (k x n):
    a's element strides (a_row, a_col), b's rows ldb apart (contiguous), c's rows ldc apart;
    matrix xi of each operand at xi * its step; tiles of `rows` x `vectors` registers of
    `lanes`."""

    m: int
    n: int
    k: int
    a_row: int
    a_col: int
    ldb: int
    ldc: int
    a_step: int
    b_step: int
    c_step: int
    rows: int
    vectors: int
    lanes: int
    k_block: int = 0
    products: int = POSITIONS
    b_panel: int = 0

    @property
    def name(self) -> str:
        count = "" if self.products == POSITIONS else f"_p{self.products}"
        count += f"_bp{self.b_panel}" if self.b_panel else ""
        return (f"graphc_winograd_gemm_{self.m}x{self.n}x{self.k}_a{self.a_row}_{self.a_col}"
                f"_b{self.ldb}_c{self.ldc}_s{self.a_step}_{self.b_step}_{self.c_step}"
                f"_t{self.rows}x{self.vectors}x{self.lanes}_k{self.k_block}{count}")


def available() -> bool:
    """Whether `plan` can take any float32 product on this host (ENABLED, AVX-512)."""
    return ENABLED and lanes() == LANES


def plan(m: int, n: int, k: int, a_row: int, a_col: int, ldb: int, ldc: int, a_step: int,
         b_step: int, c_step: int, accumulates: bool = False, *, vectors: int | None = None,
         k_block: int | None = None, max_k: int | None = None,
         products: int = POSITIONS, max_c: int | None = None,
         b_panel: int = 0) -> BlockGemm | None:
    """The generated function for a block's float32 products, or None where the BLAS calls
    stay (see the module docstring). `accumulates`: the products add to c (beta 1 in some
    calls). `vectors`, `k_block`, `max_k`: the tile's width in vector registers (default:
    4 where n allows, else 2, else 1), K_BLOCK and MAX_K, for benchmarks; `products`: how
    many products a call runs; `max_c`: the largest accumulated c taken (default
    MAX_ACCUMULATED_C; graphc.backends.cpu.conv_winograd_wide_grad's products of 128 tiles
    read and write their c half as often as the 64-tile blocks that limit was measured on);
    `b_panel`: b stored panel by panel (PANEL_COLUMNS columns of its k rows, rows `ldb`
    apart, the panels b_panel elements apart; None unless the tile is PANEL_COLUMNS wide)."""
    width = LANES if available() else 0
    if not width or not all(type(d) is int for d in (m, n, k, a_row, a_col, ldb, ldc)):
        return None
    if n % width or k > (max_k or MAX_K) or k < 1 or m < 1:
        return None
    if accumulates and m * n > (max_c or MAX_ACCUMULATED_C) and max_k is None:
        return None
    panel = n // width
    if vectors is None:
        vectors = next(v for v in (4, 2, 1) if panel % v == 0)
    if panel % vectors or (b_panel and vectors * width != PANEL_COLUMNS):
        return None
    most = ACCUMULATORS // vectors
    rows = -(-m // -(-m // most))  # as many rows as the registers hold, split evenly
    return BlockGemm(m, n, k, a_row, a_col, ldb, ldc, a_step, b_step, c_step, rows, vectors,
                     width, min(k, k_block or K_BLOCK), products, b_panel)


def function(module: ir.Module, gemm: BlockGemm, forked: bool = False) -> ir.Function:
    """The module's function for `gemm` (emitted on first use): void(ptr a, ptr b, ptr c,
    float beta). `forked`: the 16 products split over libgomp's team, 8 a thread on two
    (kernels.forked_range; each product computed by the same code, the same bits), for a
    block the caller runs on one thread: a kernel not split over its images, such as
    ResNet-18's 512-channel layers, whose batch is one block."""
    name = gemm.name + (".forked" if forked else "")
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    if forked:
        return kernels.forked_range(module, _positions(module, gemm, gemm.name + ".range",
                                                       ranged=True), name, gemm.products)
    return _positions(module, gemm, name)


def _positions(module: ir.Module, gemm: BlockGemm, name: str,
               ranged: bool = False) -> ir.Function:
    """`name(a, b, c, beta)`: the 16 products; `ranged`: `name(a, b, c, beta, lo, hi)`,
    products lo to hi - 1."""
    params = [PTR, PTR, PTR, F32] + ([I64, I64] if ranged else [])
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), name)
    for arg in fn.args[:3]:
        arg.add_attribute("noalias")
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    a, bm, c, beta = fn.args[:4]
    accumulate = b.fcmp_ordered("!=", beta, ir.Constant(F32, 0.0))
    with loop(b, fn.args[4], fn.args[5], "xi") if ranged else \
            counted(b, gemm.products, "xi") as xi:
        operands = [b.gep(p, [b.mul(xi, i64(step))], inbounds=True, source_etype=F32)
                    for p, step in ((a, gemm.a_step), (bm, gemm.b_step), (c, gemm.c_step))]
        _product(b, gemm, *operands, accumulate)
    b.ret_void()
    return fn


def _product(b: ir.IRBuilder, g: BlockGemm, a, bm, c, accumulate) -> None:
    """One product: panels of c (runtime loop), in each k block by block (K_BLOCK), in each
    block the full row blocks (runtime loop), then the remaining rows (one smaller tile):
    the panel's block of b (K_BLOCK x vectors x lanes floats) stays in L1 for its row
    blocks. (Row blocks outermost, each over all panels, measured the same within the
    noise: docs/performance.md, "ResNet-18, ninth session".) With 2 to ROWS_OVER_PANELS
    panels, k blocks outermost, in each the row blocks, each over all panels. Either order
    sums each element of c the same way: the same bits."""
    width = g.vectors * g.lanes
    panels = g.n // width
    k_blocks = [(k0, min(g.k_block, g.k - k0), accumulate if k0 == 0 else True)
                for k0 in range(0, g.k, g.k_block)]
    if 1 < panels <= ROWS_OVER_PANELS:
        for k0, count, adding in k_blocks:
            def over_panels(row0, rows: int, k0=k0, count=count, adding=adding) -> None:
                with counted(b, panels, "panel") as panel:
                    _tile(b, g, a, bm, c, row0, b.mul(panel, i64(width)), rows, k0, count,
                          adding)

            _row_blocks(b, g, over_panels)
        return
    with counted(b, panels, "panel") as panel:
        col = b.mul(panel, i64(width))
        for k0, count, adding in k_blocks:
            def in_panel(row0, rows: int, k0=k0, count=count, adding=adding) -> None:
                _tile(b, g, a, bm, c, row0, col, rows, k0, count, adding)

            _row_blocks(b, g, in_panel)


def _row_blocks(b: ir.IRBuilder, g: BlockGemm, emit) -> None:
    """`emit(first row, rows)` for the full row blocks (a runtime loop), then the remaining
    rows (one smaller tile)."""
    full, rest = divmod(g.m, g.rows)
    if full:
        with counted(b, full, "block") as block:
            emit(b.mul(block, i64(g.rows)), g.rows)
    if rest:
        emit(i64(full * g.rows), rest)


def _tile(b: ir.IRBuilder, g: BlockGemm, a, bm, c, row0, col0, rows: int, k0: int,
          count: int, accumulate) -> None:
    """c[row0 : row0 + rows, col0 : col0 + vectors * lanes] (+)= a[rows, :] @ b[:, cols]
    over k in [k0, k0 + count): the sums in registers (phi nodes through the loop), then
    stored or added. First the next row block's part of a is prefetched (a read row by
    row): at 512 channels U (16 MB) comes from memory, rows 2 KB apart, which the hardware
    prefetchers missed (the forward's kernel, 4x4 planes, batch 32: 11.1-11.5 -> 8.8-9.3 ms,
    two in-process A/B runs; 128 and 256 channels the same within 3%)."""
    vec = ir.VectorType(F32, g.lanes)
    if g.a_col == 1:
        _prefetch_rows(b, g, a, b.add(row0, i64(rows)), k0, count)
    zero = ir.Constant(vec, [0.0] * g.lanes)
    splat_mask = ir.Constant(ir.VectorType(ir.IntType(32), g.lanes), [0] * g.lanes)
    fma = fma_intrinsic(b.module, vec)
    pre = b.block
    body = b.append_basic_block("k.body")
    b.branch(body)
    b.position_at_end(body)
    k = b.phi(I64, name="k")
    k.add_incoming(i64(k0), pre)
    sums = [[b.phi(vec, name=f"s{r}_{v}") for v in range(g.vectors)] for r in range(rows)]
    for row in sums:
        for s in row:
            s.add_incoming(zero, pre)
    b_row = b.add(b.mul(k, i64(g.ldb)), _panel_start(b, g, col0))
    bvecs = [b.load(b.gep(bm, [b.add(b_row, i64(v * g.lanes))], inbounds=True,
                          source_etype=F32), typ=vec, align=4)
             for v in range(g.vectors)]
    a_col = b.mul(k, i64(g.a_col))
    new = broadcast_fma(b, a, row0, rows, g.a_row, a_col, bvecs, sums, fma, splat_mask)
    nxt = b.add(k, i64(1), name="k.next")
    nxt.flags.append("nuw")
    for row, row_new in zip(sums, new):
        for s, s_new in zip(row, row_new):
            s.add_incoming(s_new, body)
    k.add_incoming(nxt, body)
    end = b.append_basic_block("k.end")
    b.cbranch(b.icmp_unsigned("<", nxt, i64(k0 + count)), body, end)
    b.position_at_end(end)
    for r, row in enumerate(new):
        at = b.add(b.mul(b.add(row0, i64(r)), i64(g.ldc)), col0)
        for v, value in enumerate(row):
            pointer = b.gep(c, [b.add(at, i64(v * g.lanes))], inbounds=True, source_etype=F32)
            # beta 1 adds to c; beta 0 stores (c's old contents, maybe not numbers, unused)
            old = b.load(pointer, typ=vec, align=4)
            total = b.fadd(old, value)
            if accumulate is not True:
                total = b.select(accumulate, total, value)
            b.store(total, pointer, align=4)


def _panel_start(b: ir.IRBuilder, g: BlockGemm, col0):
    """Where b's columns from col0 (a panel's first) start in b's row 0: col0 itself, or
    with `b_panel`, the panel's own block (col0 / PANEL_COLUMNS * b_panel)."""
    if not g.b_panel:
        return col0
    return b.mul(b.udiv(col0, i64(PANEL_COLUMNS)), i64(g.b_panel))


def _prefetch_rows(b: ir.IRBuilder, g: BlockGemm, a, row0, k0: int, count: int) -> None:
    """Prefetch a's rows [row0, row0 + rows) over k [k0, k0 + count): the next tile's
    broadcasts (past a's last row it fetches what follows, which never faults)."""
    prefetch = prefetch_intrinsic(b.module)
    lines = range(0, count, 64 // 4)
    for r in range(g.rows):
        start = b.add(b.mul(b.add(row0, i64(r)), i64(g.a_row)), i64(k0))
        for line in lines:
            at = b.gep(a, [b.add(start, i64(line))], source_etype=F32)  # not inbounds
            b.call(prefetch, [at, ir.Constant(ir.IntType(32), 0),
                              ir.Constant(ir.IntType(32), 3), ir.Constant(ir.IntType(32), 1)])
