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
from 512 rows its rows in chunks of K_OUTER_ROW_CHUNK, or up to K_CHUNK_MAX_N columns its k
in K_CHUNKS chunks (`k_chunks`: partial products merged in order after). A
fused epilogue of only bias and residual adds (graphc.backends.cpu.gemm_addends) is added in
the row-ordered kernel's stores of the last block of k: one pointer argument per addend
after c (`with_addends`). For a
causal attention head (graphc.backends.cpu.attention_small) the row-ordered kernel skips
what lies past the diagonal: a triangular a's zero terms (`triangle`), or the row blocks
wholly above a panel of a c read only on and below its diagonal (`lower_c`).

Rounding: every element of c sums k in blocks of K_BLOCK, each block's sum added to c, as a
BLAS blocks k (graphc.backends.cpu.small_gemm_tile says more).

Sizes known per call (a symbolic graph's batch, graphc.backends.cpu.runtime_sizes): one of
m, n, k may be symbolic (`per_call_tile`): the tile is the one the trace's size takes, the
kernel takes that size as a trailing i64 argument (`size_arguments`) and is named with its
letter (`graphc_small_sgemm_Mx16x64_...`); see per_call_tile for how each bounds its loops.

Where the BLAS leaves the host's AVX-512 unused (graphc.backends.cpu.blas.avx512_unused:
numpy's OpenBLAS on AMD Zen 5), medium products have no bounds on n and k and start at
LARGE_MIN_ROWS rows (`large_products`), a read transposed is copied first (`copies_a`), and
a convolution's GEMMs take the k-outer kernel (`in_place`, graphc.backends.cpu.conv_im2col).

`tile_for(m, n, k, ...)` decides (None: the BLAS call stays), `row_chunks` splits a product
of many rows into calls of ROW_CHUNK rows (a loop graphc's threads share, where the BLAS
would have threaded the one call), `k_chunks` a narrow weight gradient's k, `column_chunks`
a weight gradient's columns, `function(cg,
...)` emits the kernel once per module and shape. Used by graphc.backends.cpu.codegen's
matmul lowering. The modules, dependencies pointing one way: small_gemm (the choice and the
call's sizes) -> small_gemm_kernel (`function`: the loops over panels and row blocks, the
k-outer order) -> small_gemm_tile (`SmallGemm`, the register tile: blocks of k, stores with
addends); small_gemm_columns packs b's panels where n is known per call.
"""

from __future__ import annotations

from dataclasses import replace

from llvmlite import ir

from graphc.backends.cpu import gemm_panels, llvm, small_gemm_columns
from graphc.backends.cpu.blas import avx512_unused
from graphc.backends.cpu.small_gemm_kernel import function
from graphc.backends.cpu.small_gemm_tile import K_BLOCK, SmallGemm
from graphc.backends.cpu.traced_sizes import chunks, traced
from graphc.backends.cpu.values import Loc, i64, size
from graphc.types import TensorType, float32

# SmallGemm and function (defined in small_gemm_tile and small_gemm_kernel) are named here
# too: small_gemm is where its users choose a kernel and have it emitted
__all__ = ["MAX_THIN", "SmallGemm", "column_chunks", "copies_a", "function", "in_place",
           "k_chunks", "lanes", "large_products", "operands", "per_call_tile", "row_chunks",
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
# ...without those three bounds (any n, k and b) where the BLAS leaves the host's AVX-512
# unused (graphc.backends.cpu.blas.avx512_unused: numpy's OpenBLAS runs Haswell's kernels
# on AMD Zen 5): SGEMM 1024 and 2048 ~128 -> ~230 GFLOP/s, one thread (docs/performance.md,
# "thirteenth session: graphc's own GEMM"). "auto": as the resolved BLAS says; "on" / "off"
# force the choice (tests, benchmarks' A/B; a string, so the pipeline cache's key sees it)
LARGE_PRODUCTS = "auto"
# ...and from this many rows, not 2 * ROW_CHUNK (one call, no row chunks below that): alone,
# one thread, OpenBLAS Haswell -> the kernel, GFLOP/s: LeNet-5's 64 x 400 x 120 103 -> 180,
# its weight gradient 120 x 400 x 64 (a^T) 104 -> 174, 64 x 256 x 784 111 -> 202, 32 x 1024
# x 256 93 -> 149, 128 x 128 x 256 (a^T) 109 -> 179
LARGE_MIN_ROWS = 32
MEDIUM_A_BYTES = 1 << 20  # a's rows beyond this come in whole ROW_CHUNKs (each in cache)
ROW_CHUNK = 128  # rows of a medium product per kernel call: the calls fork over the cores
# ...and, on AVX-512 hosts, a weight gradient: a read transposed (x^T, its m contiguous) with
# a long k (the tokens), m at most LONG_K_MAX_M and n at most LONG_K_MAX_N (GPT's [128 x
# 1024] @ [1024 x 128 | 512]). OpenBLAS ran them at ~125-145 GFLOP/s, the kernel at 150-180
# (one thread, alone; docs/performance.md "GPT step, eighth session"): it walks k block by
# block over the panels, each panel's block of b copied contiguous first (small_gemm_kernel).
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
# ...and a weight gradient of at most K_CHUNK_MAX_N columns (GPT's [128 x 1024] @ [1024 x
# 128], 17 a step) goes in K_CHUNKS chunks of its k (the tokens), each a whole partial
# product into scratch, merged in order after (graphc.backends.cpu.gemm_k_chunks; 0: its
# columns in chunks): a core then reads the tokens its own core wrote, not all of x
K_CHUNKS = 2
K_CHUNK_MAX_N = 128
# a residual added in a row-ordered kernel's last stores (gemm_addends' "full" kind: GPT's
# attention projection and second Linear, their c + x) asked for, each tile's rows of it,
# before the block of k that adds it: read at the stores, the residual's lines came late
PREFETCH_ADDENDS = True
MAX_WORK = 1 << 23  # m*n*k above this goes to the BLAS (its packing pays off there)
MIN_K = 16  # below: too little work per tile to hide the tile's stores
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


def large_products(blas) -> bool:
    """Whether medium products go without MEDIUM_N, MEDIUM_K and MEDIUM_B_BYTES's bounds:
    LARGE_PRODUCTS "on", or "auto" where `blas` leaves AVX-512 unused."""
    if LARGE_PRODUCTS not in ("auto", "on", "off"):
        raise ValueError(f"small_gemm.LARGE_PRODUCTS: 'auto', 'on' or 'off', "
                         f"not {LARGE_PRODUCTS!r}")
    return LARGE_PRODUCTS == "on" or (LARGE_PRODUCTS == "auto" and avx512_unused(blas))


def tile_for(m: int, n: int, k: int, sa_row: int, sa_col: int, ldb: int,
             b_transposed: bool = False, large: bool = False) -> SmallGemm | None:
    """The generated kernel for this float32 product, or None where the BLAS call stays:
    sizes known per call, a single row (a GEMV), n not a whole number of vectors, a product
    neither thin (m and n both above MAX_THIN, or too large: MAX_WORK) nor a small block
    with b read transposed (`b_transposed`, m and n both at most MAX_TRANSPOSED_BLOCK) nor
    medium (MEDIUM_N, MEDIUM_K, 2 * ROW_CHUNK rows or more, a read row by row, AVX-512;
    `large`: any n and k, LARGE_MIN_ROWS rows or more),
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
    bounded = n <= MEDIUM_N and k <= MEDIUM_K and k * n * 4 <= MEDIUM_B_BYTES
    medium = (width == 16 and sa_col == 1 and (bounded or large)
              and m >= (LARGE_MIN_ROWS if large else 2 * ROW_CHUNK)
              and (m % ROW_CHUNK == 0 or m * k * 4 <= MEDIUM_A_BYTES))
    tokens = (width == 16 and sa_row == 1 and not b_transposed and k >= LONG_K_MIN
              and m <= LONG_K_MAX_M and n <= LONG_K_MAX_N)
    long_k = tokens or (width == 16 and sa_row == 1 and not b_transposed
                        and SHORT_K_MIN <= k <= SHORT_K_MAX and SHORT_K_MIN_M <= m
                        and max(m, n) <= SHORT_K_MAX_MN and n % (2 * width) == 0)
    if long_k and not small:
        # a weight gradient x^T @ dy: each block of k runs over all the row blocks of a
        # panel, so the panel's block of b stays in L1 (small_gemm_kernel)
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
    (small_gemm_kernel); k bounds its blocks of K_BLOCK (the same blocks, so the same sums,
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
            g, m=ROW_CHUNK, rows=tile_rows(ROW_CHUNK, g.vectors, g.lanes), chunk_of=g.m)
    chunk = K_OUTER_ROW_CHUNK if g.k_outer else ROW_CHUNK
    if type(g.m) is not int or not chunk or g.m < 2 * chunk or g.m % chunk:
        return None
    rows = tile_rows(chunk, g.vectors, g.lanes)
    prefetch = g.prefetch_a and (rows - 1 + PREFETCH_A_ROWS, g.prefetch_a[1])
    return g.m // chunk, replace(g, m=chunk, rows=rows, prefetch_a=prefetch)


def k_chunks(g: SmallGemm) -> tuple[int, SmallGemm] | None:
    """(count, the kernel of one chunk) where a weight gradient's (k_outer) k splits into
    K_CHUNKS chunks of whole K_BLOCKs, each a partial product that graphc.backends.cpu.
    gemm_k_chunks merges in order after (the same bits on any number of threads), else None:
    more than K_CHUNK_MAX_N columns, sizes known per call, a k that is not K_CHUNKS whole
    blocks or more."""
    if not g.k_outer or K_CHUNKS < 2 or not all(type(d) is int for d in (g.m, g.n, g.k)) \
            or g.chunk_of is not None or g.ldc or g.n > K_CHUNK_MAX_N \
            or g.k % (K_CHUNKS * K_BLOCK):
        return None
    return K_CHUNKS, replace(g, k=g.k // K_CHUNKS)


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
    tile = tile_for(m, n, k, sa[-2], sa[-1], n if packed else lay_b[1], packed,
                    large_products(lw.blas))
    if tile is None:
        return None
    if "n" in tile.per_call:  # b's panels copied, the last one padded with zeros
        return small_gemm_columns.pack(lw, tile, b, sb) if packed else None
    m, k = traced(m), traced(k)  # a size known per call: the choices its trace's size makes
    if packed and sb[-2] == 1 and max(m, n) <= MAX_TRANSPOSED_BLOCK and k <= PANEL_COPY_MAX_K \
            and type(tile.k) is int:
        return replace(tile, ldb=0, ldb_t=sb[-1]), b, sb  # each panel copied in the kernel
    if gemm_panels.PANEL_MAJOR_B and len(sb_shape) == 2 and not tile.k_outer \
            and min(m, n) > MAX_THIN and type(tile.k) is int \
            and m >= (LARGE_MIN_ROWS if large_products(lw.blas) else 2 * ROW_CHUNK):
        return gemm_panels.pack(lw, tile, b, sb)  # medium: b's panels contiguous
    if packed:
        t = TensorType(tuple(sb_shape), dt)
        item = dt.itemsize
        src = Loc(b.base, b.index, b.offset, tuple(s * item for s in sb), t)
        b = lw.scratch_loc(t)
        lw.copy(src, b, "gemm_pack")
        sb = [s // item for s in b.strides]
    return replace(tile, ldb=sb[-2]), b, sb


def copies_a(lw, dt, m, n, k, sa: list, lay_b: tuple | None) -> bool:
    """Whether a float32 product with a read transposed (its m contiguous: a convolution's
    input gradient w^T @ dy) that no generated kernel takes as it lies, but a large one
    (`large_products`) takes with a row-major, is computed so: a copied first (m * k floats
    moved where the product does 2 * m * n * k flops)."""
    if dt is not float32 or lay_b is None or sa[-1] == 1 or not large_products(lw.blas) \
            or not all(type(d) is int for d in (m, n, k, *sa)):
        return False
    ldb = n if lay_b[0] != NO_TRANSPOSE else lay_b[1]
    b_transposed = lay_b[0] != NO_TRANSPOSE
    if tile_for(m, n, k, sa[-2], sa[-1], ldb, b_transposed, True) is not None:
        return False
    tile = tile_for(m, n, k, k, 1, ldb, b_transposed, True)
    return tile is not None and not tile.k_outer and min(m, n) > MAX_THIN


def in_place(lw, dt, m, n, k, sa_row, sa_col, ldb, ldc,
             b_transposed: bool = False) -> SmallGemm | None:
    """The k-outer kernel for a float32 product inside another kernel (a convolution's
    im2col GEMM, graphc.backends.cpu.conv_im2col's Conv.gemm) where `large_products`: b
    read in place (rows ldb apart, or `b_transposed`: columns ldb apart), each panel's
    block of k copied onto the stack first; c's rows ldc apart; else None (the BLAS call
    stays): sizes not static, n not whole vectors, k under MIN_K, m of one row."""
    if dt is not float32 or lanes() != 16 or not large_products(lw.blas) \
            or not all(type(d) is int for d in (m, n, k, sa_row, sa_col, ldb, ldc)) \
            or m < 2 or n % 16 or k < MIN_K:
        return None
    vectors = 2 if (n // 16) % 2 == 0 else 1
    return SmallGemm(m, n, k, sa_row, sa_col, 0 if b_transposed else ldb,
                     tile_rows(m, vectors, 16), vectors, 16, ldb_t=ldb if b_transposed else 0,
                     k_outer=True, ldc=ldc if ldc != n else 0)


def with_addends(g: SmallGemm, addends: tuple) -> tuple[SmallGemm, tuple]:
    """(g adding `addends` (graphc.backends.cpu.gemm_addends: (kind, Loc), ...) in its last
    stores, the addends it takes): all of them, or none for the k-outer kernel. With k known
    per call they are added after the last block (`_add_addends`: the same sums). A "full"
    addend's tile is prefetched before the block that adds it (PREFETCH_ADDENDS, k static)."""
    taken = () if g.k_outer or "n" in g.per_call else tuple(addends)
    kinds = tuple(kind for kind, _ in taken)
    prefetch = PREFETCH_ADDENDS and "full" in kinds and type(g.k) is int
    return replace(g, addends=kinds, prefetch_addends=prefetch), taken
