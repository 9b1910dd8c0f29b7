/* gemm_tile.cuh: the SIMT SGEMM tile kernel, generic over where its operands come from.
 *
 * C[m, n] = op(A)[m, k] @ op(B)[k, n] computed by blocks of 256 threads over a TILE_M x 128
 * tile of C, stepping k by 8 through double-buffered shared memory (one barrier per step).
 * Two tile shapes, chosen per product by tile_rows(m):
 *   TILE_M = 128 (kTileM): each thread owns an 8 x 8 register tile made of 4 x 4 quarters at
 *       rows {4ty, 64 + 4ty} and columns {4tx, 64 + 4tx};
 *   TILE_M = 64 (kTileMNarrow, when m <= 64: a 128-row tile would compute half its rows for
 *       nothing, e.g. every 64-channel convolution): a 4 x 8 register tile at rows {4ty} and
 *       the same columns; the first 128 threads load the A tile, all 256 the B tile.
 * Either way a thread's shared-memory reads are float4 and conflict-free, and every output
 * sums its k products in the same order (k ascending, one accumulator), so the two shapes
 * give bit-identical results.
 *
 * Operands are policies (a plain row-major matrix, or conv.cu's implicit im2col views):
 *   static constexpr bool K_CONTIGUOUS; true when 4 consecutive k of one row/column are
 *       adjacent in memory (A not transposed, B transposed);
 *   static constexpr int MIN_BLOCKS; the resident blocks per SM to bound registers for;
 *   void select(int64_t z): move to batch entry z (blockIdx.z plus a base);
 *   struct Cursor; Cursor start(int64_t outer, int64_t inner): where this thread's 4 values
 *       of the first k step start (outer, inner as the matrix is stored: (k, free) or
 *       (free, k)); everything about the fixed free coordinate is computed here, once;
 *   void advance(Cursor &): move the cursor kTileK along k (no divisions: conv.cu's views
 *       step their mixed-radix indices by precomputed digits);
 *   void load4(const Cursor &, float (&v)[4]): 4 values along the contiguous dimension,
 *       zeros outside the matrix.
 * The output policy has select(z) and store4(row, col, const float (&v)[4]) (4 consecutive
 * columns of C; it applies alpha/beta/bias and its own bounds checks).
 * Invariants: any m, n, k >= 0 (k == 0 gives a zero product); beta == 0 never reads C;
 * no thread leaves before the last barrier (the emulation reports partial barriers).
 */
#ifndef GC_GEMM_TILE_CUH
#define GC_GEMM_TILE_CUH

#include <stdlib.h>
#include <string.h>

#include "kernel_util.cuh"

namespace gc_kernels {

constexpr int kTileM = 128, kTileN = 128, kTileK = 8, kTileThreads = 256, kTilePad = 4;
constexpr int kTileMNarrow = 64; /* the tile rows for products of at most 64 rows */
/* grid.y and grid.z are limited to 65535 blocks */
constexpr int64_t kMaxGridYZ = 65535;

/* The rounding of cvt.rna.tf32.f32: to 10 mantissa bits, ties away from zero. */
__device__ inline float round_to_tf32(float x) {
    uint32_t bits = __float_as_uint(x);
    if ((bits & 0x7f800000u) != 0x7f800000u) { /* finite: round; inf/NaN pass through */
        bits += 0x1000u;
        bits &= 0xffffe000u;
    }
    return __uint_as_float(bits);
}

/* A row-major matrix (outer x inner with leading dimension ld) as a GEMM operand. */
template <bool K_CONTIG, bool TF32>
struct MatrixOperand {
    static constexpr bool K_CONTIGUOUS = K_CONTIG;
    static constexpr int MIN_BLOCKS = 2; /* blocks per SM the kernel is register-bounded for */
    const float *base;
    const float *p;
    int64_t ld, batch_stride, outer_n, inner_n;
    bool vector_loads; /* ld, batch_stride and base allow aligned float4 loads */

    __device__ void select(int64_t z) { p = base + z * batch_stride; }

    /* `at`: the address of the first value. `left` (K_CONTIG): the k left before the end of
     * the row (<= 0 past it; far below 0 for a row outside); not K_CONTIG: 8 * (the k left) +
     * how many of the 4 columns are inside (a prefix): one register either way */
    struct Cursor {
        const float *at;
        int32_t left;
    };
    __device__ Cursor start(int64_t outer, int64_t inner) const {
        Cursor c;
        c.at = p + outer * ld + inner;
        if (K_CONTIG) {
            c.left = outer < outer_n ? (int32_t)(inner_n - inner) : INT32_MIN / 2;
        } else {
            const int64_t cols = inner_n - inner;
            c.left = (int32_t)(outer_n - outer) * 8 + (cols < 0 ? 0 : cols > 4 ? 4 : (int32_t)cols);
        }
        return c;
    }
    __device__ void advance(Cursor &c) const {
        c.at += K_CONTIG ? (int64_t)kTileK : kTileK * ld;
        c.left -= K_CONTIG ? kTileK : 8 * kTileK;
    }
    __device__ void load4(const Cursor &c, float (&v)[4]) const {
        const int32_t cols = c.left & 7; /* not K_CONTIG; c.left >= 8 <=> a k is left */
        const bool all = K_CONTIG ? c.left >= 4 : c.left >= 8 && cols == 4;
        if (all && vector_loads) {
            const float4 q = *reinterpret_cast<const float4 *>(c.at);
            v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
        } else {
            GC_UNROLL
            for (int i = 0; i < 4; ++i) {
                const bool in = K_CONTIG ? i < c.left : c.left >= 8 && i < cols;
                v[i] = in ? c.at[i] : 0.0f;
            }
        }
        if (TF32) {
            GC_UNROLL
            for (int i = 0; i < 4; ++i) v[i] = round_to_tf32(v[i]);
        }
    }

    __device__ void load4(int64_t outer, int64_t inner, float (&v)[4]) const {
        if (outer < outer_n && vector_loads && inner + 3 < inner_n) {
            const float4 q = *reinterpret_cast<const float4 *>(p + outer * ld + inner);
            v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
        } else {
            GC_UNROLL
            for (int i = 0; i < 4; ++i)
                v[i] = (outer < outer_n && inner + i < inner_n) ? p[outer * ld + inner + i]
                                                                  : 0.0f;
        }
        if (TF32) {
            GC_UNROLL
            for (int i = 0; i < 4; ++i) v[i] = round_to_tf32(v[i]);
        }
    }
};

/* C = alpha * product + beta * C (+ bias[row]) into a row-major matrix. */
struct MatrixOutput {
    float *base;
    float *c;
    const float *bias_base; /* per-row bias or NULL */
    const float *bias;
    int64_t ldc, batch_stride, bias_stride, m, n;
    float alpha, beta;
    bool vector_stores;

    __device__ void select(int64_t z) {
        c = base + z * batch_stride;
        bias = bias_base ? bias_base + z * bias_stride : nullptr;
    }

    __device__ void store4(int64_t row, int64_t col, const float (&v)[4]) const {
        if (row >= m) return;
        const float add = bias ? bias[row] : 0.0f;
        float *out = c + row * ldc + col;
        if (vector_stores && col + 3 < n) {
            float4 q = make_float4(alpha * v[0] + add, alpha * v[1] + add, alpha * v[2] + add,
                                   alpha * v[3] + add);
            if (beta != 0.0f) {
                const float4 old = *reinterpret_cast<const float4 *>(out);
                q.x += beta * old.x; q.y += beta * old.y; q.z += beta * old.z;
                q.w += beta * old.w;
            }
            *reinterpret_cast<float4 *>(out) = q;
            return;
        }
        GC_UNROLL
        for (int i = 0; i < 4; ++i) {
            if (col + i >= n) break;
            float r = alpha * v[i] + add;
            if (beta != 0.0f) r += beta * out[i];
            out[i] = r;
        }
    }
};

/* The tile rows for a product of m rows: 64 when m fits in 64 (half the work of a 128-row
 * tile, twice the blocks), 128 otherwise. */
inline int tile_rows(int64_t m) { return m <= kTileMNarrow ? kTileMNarrow : kTileM; }

/* Output tiles of a (rows x columns) product per batch entry times `batch`, with the tile
 * rows launch_gemm_tiles chooses for it. */
inline int64_t gemm_tile_count(int64_t rows, int64_t columns, int64_t batch) {
    const int64_t tile_m = tile_rows(rows);
    return ((rows + tile_m - 1) / tile_m) * ((columns + kTileN - 1) / kTileN) * batch;
}

/* Global -> registers -> shared for one 8 x WIDTH operand tile (WIDTH: 128, or 64 for a
 * narrow A tile, loaded by the first 2 * WIDTH threads); the thread layout depends on which
 * dimension is contiguous so global loads stay coalesced. This thread's cursor over the
 * tile's k steps: */
template <class Operand, int WIDTH = kTileM>
__device__ inline typename Operand::Cursor tile_cursor(const Operand &op, int64_t free0) {
    const int tid = threadIdx.x;
    if (Operand::K_CONTIGUOUS) return op.start(free0 + tid / 2, (tid % 2) * 4);
    return op.start(tid / (WIDTH / 4), free0 + (tid % (WIDTH / 4)) * 4);
}

template <class Operand, int WIDTH = kTileM>
__device__ inline void store_tile(float (*tile)[WIDTH + kTilePad], const float (&reg)[4]) {
    const int tid = threadIdx.x;
    if (Operand::K_CONTIGUOUS) {
        GC_UNROLL
        for (int i = 0; i < 4; ++i) tile[(tid % 2) * 4 + i][tid / 2] = reg[i];
    } else {
        *reinterpret_cast<float4 *>(&tile[tid / (WIDTH / 4)][(tid % (WIDTH / 4)) * 4]) =
            make_float4(reg[0], reg[1], reg[2], reg[3]);
    }
}

/* The blocks per SM a tile kernel's registers are bounded for: the operands' MIN_BLOCKS (two
 * 256-thread blocks, at most 128 registers a thread; one for conv.cu's implicit views, whose
 * cursors need more); the narrow tile's 32 accumulators leave room for two blocks at least. */
template <int TILE_M, class OpA, class OpB>
constexpr int tile_min_blocks() {
    constexpr int least = OpA::MIN_BLOCKS < OpB::MIN_BLOCKS ? OpA::MIN_BLOCKS : OpB::MIN_BLOCKS;
    return TILE_M == kTileM ? least : (least < 2 ? 2 : least);
}

/* A tile kernel's register bound: its operands' (tile_min_blocks), or, opted into with
 * GRAPHC_CUDA_TILE_BLOCKS=2 for the 128-row tiles whose operands bound them for one block
 * (conv.cu's implicit views: 147-165 registers, 8 warps an SM), two blocks: at most 128
 * registers, which spills 48-96 bytes a thread on sm_90 (ptxas-check exempts this variant
 * by its name). Whether two blocks' latency hiding beats the spills is for a GPU to
 * measure (docs/performance.md, "GPU, eleventh session"). */
struct OperandsBound {
    template <int TILE_M, class OpA, class OpB>
    static constexpr int blocks() { return tile_min_blocks<TILE_M, OpA, OpB>(); }
};
struct TwoBlocksSpilling {
    template <int TILE_M, class OpA, class OpB>
    static constexpr int blocks() { return 2; }
};

/* Whether GRAPHC_CUDA_TILE_BLOCKS=2 asks for TwoBlocksSpilling (read once per process). */
inline bool two_block_tiles() {
    static const bool asked = [] {
        const char *setting = getenv("GRAPHC_CUDA_TILE_BLOCKS");
        return setting != nullptr && strcmp(setting, "2") == 0;
    }();
    return asked;
}

/* ptxas-check: no spills for either tile shape (with OperandsBound) */
template <int TILE_M, class OpA, class OpB, class Out, class Bound = OperandsBound>
__global__ void __launch_bounds__(kTileThreads, (Bound::template blocks<TILE_M, OpA, OpB>()))
gemm_tile_kernel(OpA a, OpB b, Out out, int64_t k, int64_t z_base) {
    static_assert(TILE_M == kTileM || TILE_M == kTileMNarrow, "tile rows: 128 or 64");
    constexpr int kRowQuarters = TILE_M / 64; /* 4 x 4 quarters of the register tile in rows */
    __shared__ __align__(16) float a_tile[2][kTileK][TILE_M + kTilePad];
    __shared__ __align__(16) float b_tile[2][kTileK][kTileN + kTilePad];

    const int64_t z = z_base + blockIdx.z;
    a.select(z);
    b.select(z);
    out.select(z);
    const int64_t m0 = (int64_t)blockIdx.y * TILE_M, n0 = (int64_t)blockIdx.x * kTileN;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    /* every thread loads B; the A tile takes 2 * TILE_M threads (all of them at 128 rows) */
    const bool loads_a = TILE_M == kTileM || (int)threadIdx.x < 2 * TILE_M;

    float acc[4 * kRowQuarters][8];
    GC_UNROLL
    for (int i = 0; i < 4 * kRowQuarters; ++i) {
        GC_UNROLL
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    }

    const int steps = (int)((k + kTileK - 1) / kTileK); /* k < 2^31: launch_gemm_tiles */
    float reg_a[4] = {0.0f, 0.0f, 0.0f, 0.0f}, reg_b[4];
    auto cursor_a = tile_cursor<OpA, TILE_M>(a, m0);
    auto cursor_b = tile_cursor(b, n0);
    if (steps > 0) {
        if (loads_a) {
            a.load4(cursor_a, reg_a);
            store_tile<OpA, TILE_M>(a_tile[0], reg_a);
        }
        b.load4(cursor_b, reg_b);
        store_tile<OpB>(b_tile[0], reg_b);
    }
    __syncthreads();

    for (int step = 0; step < steps; ++step) {
        const int cur = step & 1;
        const bool more = step + 1 < steps;
        if (more) { /* the next tile's global loads overlap this tile's arithmetic */
            if (loads_a) {
                a.advance(cursor_a);
                a.load4(cursor_a, reg_a);
            }
            b.advance(cursor_b);
            b.load4(cursor_b, reg_b);
        }
        GC_UNROLL
        for (int kk = 0; kk < kTileK; ++kk) {
            float av[4 * kRowQuarters];
            GC_UNROLL
            for (int q = 0; q < kRowQuarters; ++q) {
                const float4 a4 =
                    *reinterpret_cast<const float4 *>(&a_tile[cur][kk][q * 64 + ty * 4]);
                av[4 * q] = a4.x; av[4 * q + 1] = a4.y; av[4 * q + 2] = a4.z; av[4 * q + 3] = a4.w;
            }
            const float4 b_lo = *reinterpret_cast<const float4 *>(&b_tile[cur][kk][tx * 4]);
            const float4 b_hi = *reinterpret_cast<const float4 *>(&b_tile[cur][kk][64 + tx * 4]);
            const float bv[8] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
            GC_UNROLL
            for (int i = 0; i < 4 * kRowQuarters; ++i) {
                GC_UNROLL
                for (int j = 0; j < 8; ++j) acc[i][j] += av[i] * bv[j];
            }
        }
        if (more) {
            if (loads_a) store_tile<OpA, TILE_M>(a_tile[cur ^ 1], reg_a);
            store_tile<OpB>(b_tile[cur ^ 1], reg_b);
        }
        __syncthreads();
    }

    GC_UNROLL
    for (int i = 0; i < 4 * kRowQuarters; ++i) {
        const int64_t row = m0 + (i / 4) * 64 + ty * 4 + i % 4;
        const float lo[4] = {acc[i][0], acc[i][1], acc[i][2], acc[i][3]};
        const float hi[4] = {acc[i][4], acc[i][5], acc[i][6], acc[i][7]};
        out.store4(row, n0 + tx * 4, lo);
        out.store4(row, n0 + 64 + tx * 4, hi);
    }
}

/* Launch a TILE_M x kTileN tile kernel (this one, or gemm_pipeline.cuh's) over an m x n
 * output for `batch` entries (blockIdx.z, chunked at 65535), after the size checks the
 * kernels' 32-bit cursors and the grid need. The caller has validated the rest; m, n,
 * batch > 0. */
template <int TILE_M = kTileM, class Kernel, class OpA, class OpB, class Out>
gc_status launch_tile_grid(Kernel kernel, const OpA &a, const OpB &b, const Out &out,
                           int64_t m, int64_t n, int64_t k, int64_t batch, gc_stream stream,
                           const char *what) {
    const int64_t tiles_m = (m + TILE_M - 1) / TILE_M, tiles_n = (n + kTileN - 1) / kTileN;
    if (k >= (int64_t)1 << 27)
        return gc_fail(GC_ERROR_NOT_SUPPORTED, "%s: k = %lld exceeds the 2^27 this GEMM's "
                       "cursors count (8 * k in 32 bits); split the product", what, (long long)k);
    if (tiles_m > kMaxGridYZ)
        return gc_fail(GC_ERROR_NOT_SUPPORTED, "%s: m = %lld rows exceed the %lld this GEMM "
                       "grid covers; split the product", what, (long long)m,
                       (long long)(kMaxGridYZ * TILE_M));
    for (int64_t z0 = 0; z0 < batch; z0 += kMaxGridYZ) {
        const int64_t chunk = batch - z0 < kMaxGridYZ ? batch - z0 : kMaxGridYZ;
        const dim3 grid((unsigned)tiles_n, (unsigned)tiles_m, (unsigned)chunk);
        GC_LAUNCH(kernel, grid, dim3(kTileThreads, 1, 1), 0, stream)(a, b, out, k, z0);
        GC_CHECK_LAUNCH(what);
    }
    return GC_SUCCESS;
}

/* Launch the tile kernel (launch_tile_grid) with the tile rows tile_rows(m) chooses (and
 * the register bound GRAPHC_CUDA_TILE_BLOCKS asks for, where it differs). */
template <class OpA, class OpB, class Out>
gc_status launch_gemm_tiles(const OpA &a, const OpB &b, const Out &out, int64_t m, int64_t n,
                            int64_t k, int64_t batch, gc_stream stream, const char *what) {
    if (tile_rows(m) == kTileMNarrow)
        return launch_tile_grid<kTileMNarrow>(&gemm_tile_kernel<kTileMNarrow, OpA, OpB, Out>, a,
                                              b, out, m, n, k, batch, stream, what);
    if constexpr (tile_min_blocks<kTileM, OpA, OpB>() < 2) {
        if (two_block_tiles())
            return launch_tile_grid<kTileM>(
                &gemm_tile_kernel<kTileM, OpA, OpB, Out, TwoBlocksSpilling>, a, b, out, m, n, k,
                batch, stream, what);
    }
    return launch_tile_grid<kTileM>(&gemm_tile_kernel<kTileM, OpA, OpB, Out>, a, b, out, m, n,
                                    k, batch, stream, what);
}

/* Whether a pointer and the element strides used with it allow aligned float4 access. */
inline bool vector_friendly(const void *p, int64_t ld, int64_t batch_stride) {
    return ((uintptr_t)p % 16 == 0) && ld % 4 == 0 && batch_stride % 4 == 0;
}

template <bool K_CONTIG, bool TF32 = false>
MatrixOperand<K_CONTIG, TF32> matrix_operand(const float *p, int64_t ld, int64_t batch_stride,
                                             int64_t outer_n, int64_t inner_n) {
    MatrixOperand<K_CONTIG, TF32> op;
    op.base = op.p = p;
    op.ld = ld;
    op.batch_stride = batch_stride;
    op.outer_n = outer_n;
    op.inner_n = inner_n;
    op.vector_loads = vector_friendly(p, ld, batch_stride);
    return op;
}

inline MatrixOutput matrix_output(float *c, int64_t ldc, int64_t batch_stride, int64_t m,
                                  int64_t n, float alpha, float beta, const float *bias,
                                  int64_t bias_stride) {
    MatrixOutput out;
    out.base = out.c = c;
    out.bias_base = out.bias = bias;
    out.ldc = ldc;
    out.batch_stride = batch_stride;
    out.bias_stride = bias_stride;
    out.m = m;
    out.n = n;
    out.alpha = alpha;
    out.beta = beta;
    out.vector_stores = vector_friendly(c, ldc, batch_stride);
    return out;
}

} /* namespace gc_kernels */

#endif /* GC_GEMM_TILE_CUH */
