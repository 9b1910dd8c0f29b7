/* gemm_pipeline.cuh: the SGEMM tile kernel with a multistage cp.async pipeline (sm_80+).
 *
 * The same 128 x 128 block tile, 8 x 8 register tile per thread, shared-memory layout and
 * arithmetic as gemm_tile.cuh's gemm_tile_kernel, but operand tiles travel global -> shared
 * memory with asynchronous copies (`__pipeline_memcpy_async`, cuda_pipeline.h), kStages k
 * steps in flight, instead of through registers: the loads of step s + kStages - 1 are issued
 * before step s's arithmetic and no register holds them meanwhile. One barrier per k step:
 *
 *   prologue: issue steps 0 .. kStages-2, one commit group each
 *   step s:   wait for group s (this thread's copies of step s have landed)
 *             __syncthreads  (every thread's copies of step s are visible, and every thread
 *                             has finished step s-1, whose stage is the one refilled next)
 *             issue step s + kStages - 1 into stage (s - 1) % kStages; commit (possibly empty,
 *             so group g always holds step g)
 *             multiply-accumulate from stage s % kStages
 *
 * Operands are gemm_tile.cuh's MatrixOperand (row-major matrices; not conv.cu's implicit
 * views, whose loads are computed): a row whose free dimension is contiguous (A transposed,
 * B not) moves 16 bytes a copy when float4-aligned, 4 bytes a value otherwise; a k-contiguous
 * one moves 4 bytes a value, transposed into the k-major stage as it lands. Values outside
 * the matrix are stored as zeros directly. TF32 rounding needs the values in registers, so
 * the TF32 entry keeps gemm_tile_kernel.
 *
 * Emulation: gc_emu.h performs a thread's copies when it waits for them, so a missing wait or
 * barrier shows as wrong results, and racecheck (emu-checked build) sees the stage writes.
 * Invariants: as gemm_tile_kernel (any m, n, k >= 0; beta == 0 never reads C); every thread
 * reaches every barrier; the last wait drains every group before the block ends.
 */
#ifndef GC_GEMM_PIPELINE_CUH
#define GC_GEMM_PIPELINE_CUH

#include "gemm_tile.cuh"

#ifndef GC_EMULATION
#include <cuda_pipeline.h>
#endif

namespace gc_kernels {

constexpr int kStages = 3;

/* This thread's 4 values of one operand tile step into `stage` (kTileK x (128 + pad), k-major
 * as gemm_tile_kernel's tiles), at the positions store_tile<Operand> would write them. */
template <bool K_CONTIG>
__device__ inline void copy_tile_async(const MatrixOperand<K_CONTIG, false> &op,
                                       const typename MatrixOperand<K_CONTIG, false>::Cursor &c,
                                       float (*stage)[kTileM + kTilePad]) {
    const int tid = threadIdx.x;
    if (K_CONTIG) { /* 4 consecutive k of row tid / 2: a column of the k-major stage */
        GC_UNROLL
        for (int i = 0; i < 4; ++i) {
            float *dst = &stage[(tid % 2) * 4 + i][tid / 2];
            if (i < c.left)
                __pipeline_memcpy_async(dst, c.at + i, sizeof(float));
            else
                *dst = 0.0f;
        }
        return;
    }
    float *dst = &stage[tid / 32][(tid % 32) * 4]; /* 4 consecutive free indices at one k */
    const int32_t cols = c.left & 7;
    const bool row_in = c.left >= 8;
    if (row_in && cols == 4 && op.vector_loads) {
        __pipeline_memcpy_async(dst, c.at, 4 * sizeof(float));
        return;
    }
    GC_UNROLL
    for (int i = 0; i < 4; ++i) {
        if (row_in && i < cols)
            __pipeline_memcpy_async(dst + i, c.at + i, sizeof(float));
        else
            dst[i] = 0.0f;
    }
}

template <bool KA, bool KB, class Out>
__global__ void __launch_bounds__(kTileThreads, 2)
gemm_pipeline_kernel(MatrixOperand<KA, false> a, MatrixOperand<KB, false> b, Out out, int64_t k,
                     int64_t z_base) {
    __shared__ __align__(16) float a_tile[kStages][kTileK][kTileM + kTilePad];
    __shared__ __align__(16) float b_tile[kStages][kTileK][kTileN + kTilePad];

    const int64_t z = z_base + blockIdx.z;
    a.select(z);
    b.select(z);
    out.select(z);
    const int64_t m0 = (int64_t)blockIdx.y * kTileM, n0 = (int64_t)blockIdx.x * kTileN;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;

    float acc[8][8];
    GC_UNROLL
    for (int i = 0; i < 8; ++i) {
        GC_UNROLL
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    }

    const int steps = (int)((k + kTileK - 1) / kTileK); /* k < 2^31: launch_gemm_pipeline */
    auto cursor_a = tile_cursor(a, m0);
    auto cursor_b = tile_cursor(b, n0);
    GC_UNROLL
    for (int s = 0; s < kStages - 1; ++s) { /* the cursors then point at step kStages - 1 */
        if (s < steps) {
            copy_tile_async(a, cursor_a, a_tile[s]);
            copy_tile_async(b, cursor_b, b_tile[s]);
            a.advance(cursor_a);
            b.advance(cursor_b);
        }
        __pipeline_commit();
    }

    int cur = 0, next = kStages - 1; /* the stages of step and of step + kStages - 1 */
    for (int step = 0; step < steps; ++step) {
        __pipeline_wait_prior(kStages - 2); /* group `step` has landed */
        __syncthreads();
        if (step + kStages - 1 < steps) { /* into the stage step - 1 used: all are past it */
            copy_tile_async(a, cursor_a, a_tile[next]);
            copy_tile_async(b, cursor_b, b_tile[next]);
            a.advance(cursor_a);
            b.advance(cursor_b);
        }
        __pipeline_commit();
        next = cur; /* step + 1 + kStages - 1 reuses the stage of step */
        GC_UNROLL
        for (int kk = 0; kk < kTileK; ++kk) {
            const float4 a_lo = *reinterpret_cast<const float4 *>(&a_tile[cur][kk][ty * 4]);
            const float4 a_hi = *reinterpret_cast<const float4 *>(&a_tile[cur][kk][64 + ty * 4]);
            const float4 b_lo = *reinterpret_cast<const float4 *>(&b_tile[cur][kk][tx * 4]);
            const float4 b_hi = *reinterpret_cast<const float4 *>(&b_tile[cur][kk][64 + tx * 4]);
            const float av[8] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w, a_hi.x, a_hi.y, a_hi.z, a_hi.w};
            const float bv[8] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
            GC_UNROLL
            for (int i = 0; i < 8; ++i) {
                GC_UNROLL
                for (int j = 0; j < 8; ++j) acc[i][j] += av[i] * bv[j];
            }
        }
        cur = cur == kStages - 1 ? 0 : cur + 1;
    }
    __pipeline_wait_prior(0); /* only empty groups are left: nothing lands after the block */

    GC_UNROLL
    for (int i = 0; i < 8; ++i) {
        const int64_t row = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
        const float lo[4] = {acc[i][0], acc[i][1], acc[i][2], acc[i][3]};
        const float hi[4] = {acc[i][4], acc[i][5], acc[i][6], acc[i][7]};
        out.store4(row, n0 + tx * 4, lo);
        out.store4(row, n0 + 64 + tx * 4, hi);
    }
}

/* Whether the pipelined kernel runs a product of k: at least kStages k steps, so the
 * pipeline fills; shorter products keep gemm_tile_kernel (register double buffering). */
inline bool gemm_pipeline_fits(int64_t k) { return k >= (int64_t)kStages * kTileK; }

/* As launch_gemm_tiles, with the pipelined kernel (launch_tile_grid). */
template <bool KA, bool KB, class Out>
gc_status launch_gemm_pipeline(const MatrixOperand<KA, false> &a,
                               const MatrixOperand<KB, false> &b, const Out &out, int64_t m,
                               int64_t n, int64_t k, int64_t batch, gc_stream stream,
                               const char *what) {
    return launch_tile_grid(&gemm_pipeline_kernel<KA, KB, Out>, a, b, out, m, n, k, batch,
                            stream, what);
}

} /* namespace gc_kernels */

#endif /* GC_GEMM_PIPELINE_CUH */
