"""small_gemm: generated register-blocked kernels for thin and medium float32 GEMMs.

A recurrent layer's step multiplies a batch of a few rows by its weight: [16 x 128] @
[128 x 512] forward, [16 x 512] @ [512 x 128] for the input gradient, 32 times a layer,
each step waiting for the one before. At these sizes OpenBLAS's fixed cost per call (its
interface checks, copying both operands into its packed panels, its driver) is a large
share of ~2 MFLOP, and it ran them at ~100 GFLOP/s where it runs large GEMMs at ~190 (one
thread, AVX-512 host, 2026-11-25). The same holds for attention's per-head products with
an operand read transposed (Q K^T, dO V^T: 64 x 64 x 32 in the GPT), where OpenBLAS packs
the transposed operand on every call (MAX_TRANSPOSED_BLOCK), and for products of many rows
by a narrow b (MEDIUM_N, MEDIUM_K: a transformer's 1024 x 128 x 128 projections), where the
packing is not repaid either. This module generates, per shape, one function

    void graphc_small_sgemm_<m>x<n>x<k>_<a strides>_<ldb>(ptr a, ptr b, ptr c)

that computes c[m, n] = a[m, k] @ b[k, n] with b's rows contiguous (leading dimension ldb)
and c row-major, without packing: c is cut into tiles of `rows` x (`vectors` x LANES)
(LANES floats to a vector register: 16 with AVX-512, 8 with AVX2), each tile's sums stay
in registers through a block of k, every step of which loads `vectors` vectors of b's
row k and broadcasts one element of a per tile row (any element strides for a: a
transposed view costs nothing). Tiles run panel by panel (a panel is `vectors` x LANES
columns of c), so each panel of b is read from cache once per row block. A small block's b
read transposed (attention's K^T, its k contiguous) is copied panel by panel onto the
kernel's stack, LANES x LANES squares transposed in registers (PANEL_COPY_MAX_K); a
medium product's b is copied panel-major into scratch before the call (`b_panels`: each
panel's rows one after another; graphc.backends.cpu.gemm_panels), other transposed b whole
and row-major. A weight gradient x^T @ dy
(a read transposed, k the tokens: LONG_K_MIN) turns the loops around (`k_outer`): block
of k by block, each over all panels, a panel's block of b copied contiguous onto the stack
first and read from L1 by all the panel's row blocks, a's line 32 k ahead prefetched at
each k (PREFETCH_A_K: x's rows lie 4 * m bytes apart, cold when the backward reads them);
its columns come in chunks of COLUMN_CHUNK (c's rows ldc apart) that the cores share, or
from 512 rows its rows in chunks of K_OUTER_ROW_CHUNK. A
fused epilogue of only bias and residual adds (graphc.backends.cpu.gemm_addends) is added in
the row-ordered kernel's stores of the last block of k: one pointer argument per addend
after c (`with_addends`). For a
causal attention head (graphc.backends.cpu.attention_small) the row-ordered kernel skips
what lies past the diagonal: a triangular a's zero terms (`triangle`), or the row blocks
wholly above a panel of a c read only on and below its diagonal (`lower_c`).

Rounding: every element of c sums k in blocks of K_BLOCK (in order, fused multiply-adds in
registers), each block's sum added to c, as a BLAS blocks k (its KC): the error grows with
K_BLOCK + k / K_BLOCK rather than with k (measured: as close to a float64 run as OpenBLAS
or closer, k up to 16384). The order differs from the BLAS's, judged by distance from a
float64 run (docs/performance.md, "Rounding";
tests/test_cpu_small_gemm.py).

Sizes known per call (a symbolic graph's batch, graphc.backends.cpu.runtime_sizes): one of
m, n, k may be symbolic (`per_call_tile`): the tile is the one the trace's size takes, the
kernel takes that size as a trailing i64 argument (`size_arguments`) and is named with its
letter (`graphc_small_sgemm_Mx16x64_...`); see per_call_tile for how each bounds its loops.

`tile_for(m, n, k, ...)` decides (None: the BLAS call stays), `row_chunks` splits a product
of many rows into calls of ROW_CHUNK rows (a loop graphc's threads share, where the BLAS
would have threaded the one call), `column_chunks` a weight gradient's columns, `function(cg,
...)` emits the kernel once per module and
shape. Used by graphc.backends.cpu.codegen's matmul lowering.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llvmlite import ir

from graphc.backends.cpu import gemm_panels, llvm, small_gemm_columns
from graphc.backends.cpu.gemm_panels import copy_transposed, counted
from graphc.backends.cpu.traced_sizes import chunks, traced
from graphc.backends.cpu.values import F32, I64, PTR, Loc, i64, loop, size
from graphc.types import TensorType, float32

__all__ = ["MAX_THIN", "SmallGemm", "broadcast_fma", "column_chunks", "fma_intrinsic",
           "function", "lanes", "operands", "per_call_tile", "prefetch_intrinsic", "row_chunks",
           "size_arguments", "tile_for", "tile_rows", "with_addends"]

# the kernel serves products whose m or n is at most this. Tried: 32 (GPT's attention
# heads, 64 x 64 x 32, with their transposed operands packed; MobileNet's classifier):
# 1.5-1.6x OpenBLAS's speed alone, but the steps moved within the noise (in-process A/B,
# each variant compiled afresh, 1 thread, CPU time, load 3-9: GPT 55.1 against 55.1-55.9
# ms, MobileNet 13.6 against 13.8, the CharLSTM 8.0-8.1 against 7.7-8.2)
MAX_THIN = 16
# ...and a product whose b is read transposed (a BLAS "T" flag: attention's Q K^T and the
# backward's dO V^T, per head) with m and n both at most this: OpenBLAS's "NT" path packs
# the transposed operand on every call and ran GPT's 64 x 64 x 32 heads at ~50 GFLOP/s
# (4.7-5.2 us a head; its "NN" path 3.6 us), where the generated kernel after one copy of
# the whole batch's b runs them in 2.5-3 us with the copy (issue 14, eighth session, in the
# GPT step: docs/performance.md "GPT step, eighth session"). Products read as laid out keep
# the BLAS at these sizes (64 x 32 x 64 "NN": the BLAS 1.9 us, the kernel 3.4).
MAX_TRANSPOSED_BLOCK = 64
# such a block's b, k contiguous, up to this k: each panel copied row-major on the kernel's
# stack (k x 32 floats, in L1 for the panel's tiles) instead of one pass copying the whole
# batch's b^T into scratch first (GPT: 70-130 us a layer, 1.1-2 us a head)
PANEL_COPY_MAX_K = 256
# ...and, on AVX-512 hosts, a product with a read row by row (its k contiguous), n and k
# at most these: GPT's 1024 x 128 x 128 projections and 1024 x 128 x 512 second Linear,
# forward and input gradient. OpenBLAS ran them at 110-150 GFLOP/s, the kernel at 150-170
# (packing b where it is read transposed, 14-61 us): in the GPT step -1.2 to -3.4 ms of
# ~55 (eighth session). n up to 512 since b is copied panel-major first (graphc.backends.
# cpu.gemm_panels): GPT's 1024 x 512 x 128 (linear1 forward, linear2's input gradient)
# 137-151 -> 159-176 GFLOP/s alone with the copy, and with linear1's GELU run in its row
# chunks (graphc.backends.cpu.gemm_epilogue) -2.7 ms in the step (ninth session; in place,
# b's rows 2 KB apart, the kernel had been no faster than the BLAS). Not taken:
# a read transposed (a weight gradient's x^T @ dy: broadcasts k rows apart, 1.8x slower),
# fewer than 2 * ROW_CHUNK rows (64 x 32 x 64: the BLAS 1.9 us, the kernel 3.4).
# k up to 1024 where b (k x n floats) stays within MEDIUM_B_BYTES, in L2 (issue 14, MLP
# 784-256-256-10 b64's first Linear, W [256 x 784] @ x^T [784 x 64] with x^T packed: alone
# 188 -> 129 us, OpenBLAS 136 GFLOP/s, the kernel 199; docs/performance.md "The MLP's first
# layer"). GPT's [512 x 1024] @ [1024 x 128] (b 512 KB) stays out
MEDIUM_N = 512
MEDIUM_K = 1024
MEDIUM_B_BYTES = 256 << 10
MEDIUM_A_BYTES = 1 << 20  # a's rows beyond this come in whole ROW_CHUNKs (each in cache)
ROW_CHUNK = 128  # rows of a medium product per kernel call: the calls fork over the cores
# ...and, on AVX-512 hosts, a weight gradient: a read transposed (x^T, its m contiguous) with
# a long k (the tokens), m at most LONG_K_MAX_M and n at most LONG_K_MAX_N (GPT's [128 x
# 1024] @ [1024 x 128 | 512]). OpenBLAS ran them at ~125-145 GFLOP/s, the kernel at 150-180
# (one thread, alone; docs/performance.md "GPT step, eighth session"): it walks k block by
# block over the panels, each panel's block of b copied contiguous first (_emit_k_outer).
# m up to 512 (linear1's [512 x 1024] @ [1024 x 128], a = dh^T 2 KB a row) since the kernel
# prefetches a (PREFETCH_A_K): alone, swept from cache, 1387 -> 1018 us against OpenBLAS's
# 1098 (without the prefetch it lost to the BLAS, hot and cold; ninth session)
LONG_K_MIN = 512
LONG_K_MAX_M = 512
LONG_K_MAX_N = 512
# ...and a short k (a small batch: the MLP b64's dh^T @ x, k = 64) with m and n up to 1024,
# n in two-vector panels: alone, 256 x 256 x 64 OpenBLAS 138 -> the kernel 171 GFLOP/s, k 32
# 115 -> 182, k 128 169 -> 201, m or n 1024 ~143 -> 163-174; 256 x 784 x 64 (one-vector
# panels) 164 -> 155: kept in the BLAS (docs/performance.md "The MLP's first layer")
SHORT_K_MIN = 32
SHORT_K_MAX = 128
SHORT_K_MIN_M = 128
SHORT_K_MAX_MN = 1024
COLUMN_CHUNK = 64  # columns of c per call of a weight gradient: the calls fork over the cores
# ...but a weight gradient of 512 rows or more (GPT's linear1, [512 x 1024] @ [1024 x 128])
# goes in chunks of this many rows instead (0: columns): each column chunk read all of
# a = dh^T, which the product before wrote in row chunks of tokens, half of it in the other
# core's cache; alone 799 / 448 -> 740 / 367 us (one / two threads), after that product
# 767 / 569 -> 754 / 418 (docs/performance.md, "GPT and ResNet-18 on two threads")
K_OUTER_ROW_CHUNK = 256
# the k-outer kernel's software prefetch of a (x^T: each k step's broadcasts read a line of x
# 4 * m bytes from the last, which the hardware fetched late): at every k, the element of a
# PREFETCH_A_ROWS rows below the row block's last and PREFETCH_A_K k ahead (None: none).
# The step's three shapes alone, one thread, operands swept from cache (benchmarks/
# weight_grad_cold.py, docs/performance.md "GPT's weight gradients read cold"): 128 x 128
# 415 -> 308 us, 128 x 512 1036 -> 913, 512 x 128 1387 -> 1018 (OpenBLAS 1098); hot too
PREFETCH_A_ROWS = 0
PREFETCH_A_K: int | None = 32
MAX_WORK = 1 << 23  # m*n*k above this goes to the BLAS (its packing pays off there)
MIN_K = 16  # below: too little work per tile to hide the tile's stores
K_BLOCK = 256  # k summed in registers per block; blocks' sums added in c (a BLAS's KC)
NO_TRANSPOSE = 111  # CBLAS's flag for an operand read as laid out


def lanes() -> int:
    """float32 lanes of the host's vector registers: 16 with AVX-512, 8 with AVX2, else 0
    (no generated kernel: the BLAS serves)."""
    host = llvm.host_target()
    if host.has_feature("avx512f"):
        return 16
    if host.has_feature("avx2") and host.has_feature("fma"):
        return 8
    return 0


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
    # one row chunk of a product whose m (this symbolic size) is known per call: m is the
    # most rows a call computes, and the call's own count comes as an argument (row_chunks)
    chunk_of: object = None

    @property
    def name(self) -> str:
        b = f"bt{self.ldb_t}" if self.ldb_t else "bp" if self.b_panels else f"b{self.ldb}"
        order = ("_ko" if self.k_outer else "") + (f"_c{self.ldc}" if self.ldc else "")
        order += f"_{self.triangle}" if self.triangle else ""
        order += "_lowc" if self.lower_c else ""
        order += "".join(f"_{kind}" for kind in self.addends)
        if self.prefetch_a:
            order += f"_pf{self.prefetch_a[0]}_{self.prefetch_a[1]}"
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


def tile_for(m: int, n: int, k: int, sa_row: int, sa_col: int, ldb: int,
             b_transposed: bool = False) -> SmallGemm | None:
    """The generated kernel for this float32 product, or None where the BLAS call stays:
    sizes known per call, a single row (a GEMV), n not a whole number of vectors, a product
    neither thin (m and n both above MAX_THIN, or too large: MAX_WORK) nor a small block
    with b read transposed (`b_transposed`, m and n both at most MAX_TRANSPOSED_BLOCK) nor
    medium (MEDIUM_N, MEDIUM_K, 2 * ROW_CHUNK rows or more, a read row by row, AVX-512),
    with too short a k (MIN_K), a host without AVX2/FMA. A batch known per call as m or k
    (a symbolic size, the others static) takes the kernel the trace's size would take, built
    for every size (`per_call_tile`)."""
    width = lanes()
    if not width or not all(type(d) is int for d in (sa_row, sa_col)):
        return None
    if not all(type(d) is int for d in (m, n, k)):
        return per_call_tile(m, n, k, sa_row, sa_col, ldb, b_transposed)
    if type(ldb) is not int:
        return None
    if m < 2 or n % width:
        return None
    small = min(m, n) <= MAX_THIN or (b_transposed and max(m, n) <= MAX_TRANSPOSED_BLOCK)
    medium = (width == 16 and sa_col == 1 and n <= MEDIUM_N and k <= MEDIUM_K
              and k * n * 4 <= MEDIUM_B_BYTES
              and m >= 2 * ROW_CHUNK and (m % ROW_CHUNK == 0 or m * k * 4 <= MEDIUM_A_BYTES))
    tokens = (width == 16 and sa_row == 1 and not b_transposed and k >= LONG_K_MIN
              and m <= LONG_K_MAX_M and n <= LONG_K_MAX_N)
    long_k = tokens or (width == 16 and sa_row == 1 and not b_transposed
                        and SHORT_K_MIN <= k <= SHORT_K_MAX and SHORT_K_MIN_M <= m
                        and max(m, n) <= SHORT_K_MAX_MN and n % (2 * width) == 0)
    if long_k and not small:
        # a weight gradient x^T @ dy: each block of k runs over all the row blocks of a
        # panel, so the panel's block of b stays in L1 (_emit_k_outer)
        vectors = 2 if (n // width) % 2 == 0 else 1
        rows = tile_rows(m, vectors, width)
        # a prefetched for the long k only (a short k's a, 64 rows of x, was measured without)
        prefetch = (rows - 1 + PREFETCH_A_ROWS, PREFETCH_A_K) \
            if tokens and PREFETCH_A_K is not None else None
        return SmallGemm(m, n, k, sa_row, sa_col, ldb, rows, vectors, width, k_outer=True,
                         prefetch_a=prefetch)
    if m < 2 or n % width or not (small or medium) or (m * n * k > MAX_WORK and not medium) \
            or k < MIN_K:
        return None
    panel = n // width
    # two vectors a row where the panel allows (measured on 16 x 512 x 128 and 16 x 128 x
    # 512: 8 x 2 tiles 179-184 GFLOP/s, 16 x 1 162, 6 x 4 168-178, 12 x 2 168-174), then as
    # many rows as the registers hold, split evenly (16 rows: two tiles of 8, not 12 + 4)
    vectors = 2 if panel % 2 == 0 else 1
    return SmallGemm(m, n, k, sa_row, sa_col, ldb, tile_rows(m, vectors, width), vectors,
                     width)


def per_call_tile(m, n, k, sa_row: int, sa_col: int, ldb: int,
                  b_transposed: bool = False) -> SmallGemm | None:
    """The kernel of a product whose m, n or k (one of them: the batch of a graph with
    symbolic sizes, graphc.backends.cpu.runtime_sizes) is known only per call, or None (the
    BLAS stays): the tile `tile_for` chooses at that dim's size in the trace (so the call at
    the traced shape runs the static graph's kernel), emitted for every size. The kernel
    takes the dim as an argument: m bounds its loop over row blocks, the rows past the last
    full block run in tiles of 16, 8, 4, 2 and 1 rows as the rest's bits say
    (`_each_row_block`); k bounds its blocks of K_BLOCK (the same blocks, so the same sums,
    as a static k's); n bounds its loop over panels, the last n % width columns computed
    into the stack and copied (b read transposed only, packed by graphc.backends.cpu.
    small_gemm_columns). Not taken: two dims known per call, a size with no trace's value,
    n known per call with b read in place or by the k-outer kernel."""
    per_call = [d for d, v in zip("mnk", (m, n, k)) if type(v) is not int]
    size = {"m": m, "n": n, "k": k}[per_call[0]] if len(per_call) == 1 else None
    hint = traced(size)
    if hint is None or (size is n and not b_transposed):
        return None
    tile = tile_for(hint if size is m else m, hint if size is n else n,
                    hint if size is k else k, sa_row, sa_col, traced(ldb), b_transposed)
    if tile is None or (size is n and tile.k_outer):
        return None
    if size is k:
        return replace(tile, k=k)
    if size is n:
        return replace(tile, n=n)
    rows = (24 if tile.lanes == 16 else 12) // tile.vectors  # no even split of an unknown m
    prefetch = tile.prefetch_a and (rows - 1 + PREFETCH_A_ROWS, tile.prefetch_a[1])
    return replace(tile, m=m, rows=rows, prefetch_a=prefetch)


def size_arguments(b: ir.IRBuilder, g: SmallGemm, a_offset=None) -> list:
    """The i64 arguments a call of g's kernel passes after its pointers: each dim known per
    call (`SmallGemm.per_call`), read from the call's sizes table; a row chunk's rows
    (`chunk_of`: at most g.m, fewer in the last chunk) from the chunk's offset into a
    (`a_offset`, elements: its first row times a's row stride)."""
    if g.chunk_of is None:
        return [size(b, getattr(g, d)) for d in g.per_call]
    left = b.sub(size(b, g.chunk_of), b.udiv(a_offset, i64(g.sa_row)))
    return [b.select(b.icmp_signed("<", left, i64(g.m)), left, i64(g.m))]


def tile_rows(m: int, vectors: int, width: int) -> int:
    """As many rows as the registers hold, split evenly over m (m = 64, two vectors of 16
    lanes: tiles of 11 rows)."""
    most = (24 if width == 16 else 12) // vectors  # accumulators of 32 / 16 registers
    return -(-m // -(-m // most))


_tile_rows = tile_rows  # the name row_chunks uses (another helper's function)


def row_chunks(g: SmallGemm) -> tuple[int, SmallGemm] | None:
    """(count, the kernel of one chunk) where g's rows split into chunks of ROW_CHUNK rows
    (a weight gradient's: K_OUTER_ROW_CHUNK) that threads can share (each element is summed
    by the same instructions either way), else None: fewer than two chunks, or rows not a
    whole number of them. An m known per call takes chunks where its traced size has two or
    more: their count per call (traced_sizes.chunks), each call's rows an argument
    (`size_arguments`)."""
    if type(g.m) is not int and not g.k_outer and g.sa_row \
            and (traced(g.m) or 0) >= 2 * ROW_CHUNK:  # m known per call: the last one short
        return chunks(g.m, ROW_CHUNK), replace(
            g, m=ROW_CHUNK, rows=_tile_rows(ROW_CHUNK, g.vectors, g.lanes), chunk_of=g.m)
    chunk = K_OUTER_ROW_CHUNK if g.k_outer else ROW_CHUNK
    if type(g.m) is not int or not chunk or g.m < 2 * chunk or g.m % chunk:
        return None
    rows = _tile_rows(chunk, g.vectors, g.lanes)
    prefetch = g.prefetch_a and (rows - 1 + PREFETCH_A_ROWS, g.prefetch_a[1])
    return g.m // chunk, replace(g, m=chunk, rows=rows, prefetch_a=prefetch)


def column_chunks(g: SmallGemm) -> tuple[int, SmallGemm] | None:
    """(count, the kernel of one chunk) where a weight gradient's (k_outer) columns split
    into chunks of COLUMN_CHUNK columns that threads can share (each element of c is summed
    by the same instructions either way; a is read by every chunk), else None."""
    if not g.k_outer or g.n < 2 * COLUMN_CHUNK or g.n % COLUMN_CHUNK \
            or COLUMN_CHUNK % (g.vectors * g.lanes):
        return None
    return g.n // COLUMN_CHUNK, replace(g, n=COLUMN_CHUNK, ldc=g.ldc or g.n)


def operands(lw, dt, m: int, n: int, k: int, sa: list, b, sb: list, sb_shape: list,
             lay_b: tuple):
    """For graphc.backends.cpu.codegen's GEMM: (SmallGemm, b's Loc, b's element strides)
    where the generated kernel takes this product, else None. A b read transposed (a
    BLAS "T" flag: a transposed view, such as a Linear layer's `x.T` in the order
    graphc.passes.gemm_order picks) is first copied row-major into the backend's scratch
    (k*n floats: 8 KB for a [128 x 16] batch of activations)."""
    if dt is not float32 or lay_b is None:
        return None
    packed = lay_b[0] != NO_TRANSPOSE
    tile = tile_for(m, n, k, sa[-2], sa[-1], n if packed else lay_b[1], packed)
    if tile is None:
        return None
    if "n" in tile.per_call:  # b's panels copied, the last one padded with zeros
        return small_gemm_columns.pack(lw, tile, b, sb) if packed else None
    m, k = traced(m), traced(k)  # a size known per call: the choices its trace's size makes
    if packed and sb[-2] == 1 and max(m, n) <= MAX_TRANSPOSED_BLOCK and k <= PANEL_COPY_MAX_K \
            and type(tile.k) is int:
        return replace(tile, ldb=0, ldb_t=sb[-1]), b, sb  # each panel copied in the kernel
    if gemm_panels.PANEL_MAJOR_B and len(sb_shape) == 2 and not tile.k_outer \
            and min(m, n) > MAX_THIN and m >= 2 * ROW_CHUNK and type(tile.k) is int:
        return gemm_panels.pack(lw, tile, b, sb)  # medium: b's panels contiguous
    if packed:
        t = TensorType(tuple(sb_shape), dt)
        item = dt.itemsize
        src = Loc(b.base, b.index, b.offset, tuple(s * item for s in sb), t)
        b = lw.scratch_loc(t)
        lw.copy(src, b, "gemm_pack")
        sb = [s // item for s in b.strides]
    return replace(tile, ldb=sb[-2]), b, sb


def with_addends(g: SmallGemm, addends: tuple) -> tuple[SmallGemm, tuple]:
    """(g adding `addends` (graphc.backends.cpu.gemm_addends: (kind, Loc), ...) in its last
    stores, the addends it takes): all of them, or none for the k-outer kernel. With k known
    per call they are added after the last block (`_add_addends`: the same sums)."""
    taken = () if g.k_outer or "n" in g.per_call else tuple(addends)
    return replace(g, addends=tuple(kind for kind, _ in taken)), taken


def function(cg, gemm: SmallGemm) -> ir.Function:
    """The module's function for `gemm` (emitted on first use): void(ptr a, ptr b, ptr c,
    one ptr per addend, one i64 per dim known per call)."""
    existing = cg.module.globals.get(gemm.name)
    if existing is not None:
        return existing
    if gemm.addends and gemm.k_outer:
        raise ValueError(f"small_gemm {gemm.name}: addends are for the row-ordered kernel")
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
    `addends`: (kind, pointer) added to c by the last block's stores (`_store`)."""
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
        _tile(b, replace(g, ldc=width), a, source, panel_copy, row0, col, rows,
              c_at=(i64(0), i64(0)))
        for r in range(rows):
            at = b.add(b.mul(b.add(row0, i64(r)), _value(g.ldc or g.n)), col)
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
    """_tile, but with `lower_c` only where a row of the block reaches the panel."""
    if not g.lower_c:
        return _tile(b, g, a, source, c, row0, col0, rows, addends)
    with b.if_then(b.icmp_signed(">", b.add(row0, i64(rows)), col0)):
        _tile(b, g, a, source, c, row0, col0, rows, addends)


def _emit_k_outer(b: ir.IRBuilder, g: SmallGemm, a, bm, c, panel_copy) -> None:
    """Panels of c (runtime loop); in each, k block by block (K_BLOCK, the first block
    stored, the others added), each block over all the panel's row blocks: the panel's
    block of b (K_BLOCK x vectors x lanes floats, 32 KB) is read from memory once and from
    L1 by the other row blocks, where _emit's order reads all of k per row block. Each
    element of c sums the same blocks in the same order as _emit's (same rounding)."""
    width = g.vectors * g.lanes
    panels = g.n // width

    def every_panel(start, count, accumulate: bool) -> None:
        with counted(b, panels, "panel") as panel:
            col = b.mul(panel, i64(width))
            _packed_row_blocks(b, g, a, bm, c, col, panel_copy, start, count, accumulate)

    if type(g.k) is not int:  # the same blocks, counted at run time
        first, full, rest = _k_blocks(b, g.k)
        every_panel(i64(0), first, False)
        with loop(b, 0, full, "kblock") as block:
            every_panel(b.add(b.mul(block, i64(K_BLOCK)), first), K_BLOCK, True)
        with b.if_then(b.icmp_unsigned("!=", rest, i64(0))):
            every_panel(b.sub(g.k, rest), rest, True)
        return
    first = min(g.k, K_BLOCK)
    full, rest = divmod(g.k - first, K_BLOCK)
    every_panel(i64(0), first, False)
    if full:
        with counted(b, full, "kblock") as block:
            every_panel(b.add(b.mul(block, i64(K_BLOCK)), i64(first)), K_BLOCK, True)
    if rest:
        every_panel(i64(g.k - rest), rest, True)


def _k_blocks(b: ir.IRBuilder, k) -> tuple:
    """(first block's k, full K_BLOCKs after it, the rest) of a k known per call, as _tile
    and _emit_k_outer split a static k: i64 values."""
    first = b.select(b.icmp_unsigned("<", k, i64(K_BLOCK)), k, i64(K_BLOCK))
    after = b.sub(k, first)
    return first, b.udiv(after, i64(K_BLOCK)), b.urem(after, i64(K_BLOCK))


def _value(x) -> ir.Value:
    """An i64 size: a static int as a constant, one known per call (an i64 value) as is."""
    return x if isinstance(x, ir.Value) else i64(x)


def _count(b: ir.IRBuilder, count, name: str):
    """`for i in range(count)`: a static count >= 1, or an i64 value."""
    return counted(b, count, name) if type(count) is int else loop(b, 0, count, name)


def _packed_row_blocks(b: ir.IRBuilder, g: SmallGemm, a, bm, c, col, panel_copy, start,
                       count, accumulate: bool) -> None:
    """b's rows [start, start + count) of the panel at column `col` copied contiguous into
    `panel_copy` (count x vectors x lanes floats), then every row block over them."""
    width = g.vectors * g.lanes
    vec = ir.VectorType(F32, g.lanes)
    with _count(b, count, "pk") as kk:
        src = b.add(b.mul(b.add(start, kk), i64(g.ldb)), col)
        dst = b.mul(kk, i64(width))
        for v in range(g.vectors):
            x = b.load(b.gep(bm, [b.add(src, i64(v * g.lanes))], inbounds=True,
                             source_etype=F32), typ=vec, align=4)
            b.store(x, b.gep(panel_copy, [b.add(dst, i64(v * g.lanes))], inbounds=True,
                             source_etype=F32), align=64)
    # the packed block's row kk holds b's row start + kk: k's row is at (k - start) * width,
    # one inbounds gep from the block itself (a base pointer `start` rows before the stack
    # buffer would lie outside it, and an inbounds gep from there is poison in LLVM)
    offset = b.sub(i64(0), b.mul(start, i64(width)))
    _row_blocks(b, g, a, (panel_copy, width, offset), c, start, count, accumulate, col)


def _row_blocks(b: ir.IRBuilder, g: SmallGemm, a, source, c, start, count,
                accumulate: bool, col) -> None:
    """For k in [start, start + count): every row block of c's panel at column `col`, b's
    columns read from `source` (_each_row_block), its sums stored into c or added."""

    def row_block(row0, rows: int) -> None:
        sums = _block_sums(b, g, a, source, row0, rows, start, count)
        _store(b, g, c, row0, col, sums, accumulate=accumulate)

    _each_row_block(b, g, row_block, "rblock")


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


def _tile(b: ir.IRBuilder, g: SmallGemm, a, source, c, row0, col0, rows: int,
          addends=(), c_at=None) -> None:
    """c[row0 : row0 + rows, col0 : col0 + vectors * lanes] = a[rows, :] @ b[:, cols]: the
    sums of K_BLOCK consecutive k in registers, each block's added to c (the first stored),
    as a BLAS blocks k: the rounding error grows with K_BLOCK + k / K_BLOCK, not with k.
    `source`: (pointer, leading dimension, first column) b's columns are read from.
    `addends` go into the last block's stores (that block peeled off the loop). `c_at`:
    (row, column) the tile's first element lies at in c, where not (row0, col0)."""
    crow, ccol = (row0, col0) if c_at is None else c_at
    if type(g.k) is not int:  # k known per call: the same blocks, counted at run time
        first, full, rest = _k_blocks(b, g.k)
        _store(b, g, c, crow, ccol, _block_sums(b, g, a, source, row0, rows, i64(0), first))
        with loop(b, 0, full, "kblock") as block:
            start = b.add(b.mul(block, i64(K_BLOCK)), first)
            sums = _block_sums(b, g, a, source, row0, rows, start, K_BLOCK)
            _store(b, g, c, crow, ccol, sums, accumulate=True)
        with b.if_then(b.icmp_unsigned("!=", rest, i64(0))):
            sums = _block_sums(b, g, a, source, row0, rows, b.sub(g.k, rest), rest)
            _store(b, g, c, crow, ccol, sums, accumulate=True)
        return _add_addends(b, g, c, crow, ccol, rows, addends)
    first = min(g.k, K_BLOCK)
    full, rest = divmod(g.k - first, K_BLOCK)
    if g.triangle:  # one block of k, from/to the diagonal of the block's rows
        start, stop = i64(0), i64(g.k)
        if g.triangle == "lower":  # the block's last row sees k up to itself
            last = b.add(row0, i64(rows))
            stop = b.select(b.icmp_signed("<", last, stop), last, stop)
        else:  # its first row sees k from itself on (at least one k: the rest are zeros)
            start = b.select(b.icmp_signed("<", row0, i64(g.k - 1)), row0, i64(g.k - 1))
        sums = _block_sums(b, g, a, source, row0, rows, start, g.k, stop)
        return _store(b, g, c, crow, ccol, sums)
    _store(b, g, c, crow, ccol, _block_sums(b, g, a, source, row0, rows, i64(0), first),
           addends=() if full or rest else addends)
    looped = full - 1 if addends and full and not rest else full
    if looped:
        with counted(b, looped, "kblock") as block:
            start = b.add(b.mul(block, i64(K_BLOCK)), i64(first))
            sums = _block_sums(b, g, a, source, row0, rows, start, K_BLOCK)
            _store(b, g, c, crow, ccol, sums, accumulate=True)
    if looped < full:  # the last full block, with the addends
        sums = _block_sums(b, g, a, source, row0, rows, i64(first + looped * K_BLOCK), K_BLOCK)
        _store(b, g, c, crow, ccol, sums, accumulate=True, addends=addends)
    if rest:
        sums = _block_sums(b, g, a, source, row0, rows, i64(g.k - rest), rest)
        _store(b, g, c, crow, ccol, sums, accumulate=True, addends=addends)


def _block_sums(b: ir.IRBuilder, g: SmallGemm, a, source, row0, rows: int, start,
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
    stop = b.add(start, _value(count)) if stop is None else stop
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


def _add_addends(b: ir.IRBuilder, g: SmallGemm, c, row0, col0, rows: int, addends) -> None:
    """Each of `addends` added to the tile of c just stored (a k known per call, whose last
    block is found at run time): c + addend in the order _store adds them, so the same
    bits as adding them in the last block's stores."""
    if not addends:
        return
    vec = ir.VectorType(F32, g.lanes)
    unused = [[ir.Constant(vec, ir.Undefined)] * g.vectors for _ in range(rows)]
    _store(b, g, c, row0, col0, unused, accumulate=True, addends=addends, sums_too=False)


def _store(b: ir.IRBuilder, g: SmallGemm, c, row0, col0, sums: list,
           accumulate: bool = False, addends=(), sums_too: bool = True) -> None:
    """The tile's sums into c (`accumulate`: added to what c holds; not `sums_too`: c as it
    is), then each of `addends` ((kind, pointer): "row" read at the column, "full" at c's
    element) added in order: the same additions, in the same order, as the unfused
    epilogue's over the stored c."""
    vec = sums[0][0].type
    for r, row in enumerate(sums):
        at = b.add(b.mul(b.add(row0, i64(r)), _value(g.ldc or g.n)), col0)
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
