/* gemm.cu: the GEMM entries of graphc_rt.h (gc_gemm_f32, gc_gemm_strided_batched_f32,
 * gc_gemm_tf32_f32).
 *
 * FP32 runs the SIMT tile kernel (128 x 128 block tile, 8 x 8 per thread): with a 3-stage
 * cp.async pipeline (gemm_pipeline.cuh) when k spans at least 3 k steps (24), otherwise
 * gemm_tile.cuh's register double buffering (64 x 128 tiles when m <= 64). TF32 runs
 * a wmma tensor-core kernel in the CUDA build (64 x 64 block tile, 4 warps of 32 x 32, inputs
 * rounded with __float_to_tf32, FP32 accumulation); the emulation has no tensor cores, so
 * there the same entry rounds A and B to TF32 as they are loaded and runs the SIMT kernel.
 * Where the process can load cuBLAS (CUDA build, not GRAPHC_CUDA_LIBS=0), each entry hands
 * the validated product to it instead (src/vendor_blas.h); gc_gemm_provider says which runs.
 * Invariants: every argument is validated before any launch; m, n or batch == 0 launches
 * nothing; k == 0 scales C by beta; beta == 0 never reads C (NaN in C is overwritten).
 */
#include <stdio.h>
#include <string.h>

#include "gemm_pipeline.cuh"
#include "gemm_tile.cuh"
#include "vendor_blas.h"

#ifndef GC_EMULATION
#include <mma.h>
#endif

using namespace gc_kernels;

namespace {

/* The BLAS rules for one operand: op(X) is rows x cols, stored transposed when trans. */
gc_status check_matrix(const char *fn, const char *name, int trans, int64_t rows, int64_t cols,
                       const void *p, int64_t ld, bool used) {
    const int64_t stored_cols = trans ? rows : cols;
    const int64_t min_ld = stored_cols > 1 ? stored_cols : 1;
    if (ld < min_ld)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT,
                       "%s: ld%s = %lld is smaller than the %lld columns of %s as stored (%s); "
                       "pass ld%s >= %lld", fn, name, (long long)ld, (long long)stored_cols,
                       name, trans ? "transposed" : "not transposed", name, (long long)min_ld);
    if (used && p == nullptr)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: %s is NULL but the product reads it",
                       fn, name);
    return GC_SUCCESS;
}

gc_status check_gemm(const char *fn, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n,
                     int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                     const float *c, int64_t ldc) {
    if (m < 0 || n < 0 || k < 0)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT,
                       "%s: sizes must be >= 0, got m = %lld, n = %lld, k = %lld", fn,
                       (long long)m, (long long)n, (long long)k);
    const bool any_output = m > 0 && n > 0;
    gc_status s = check_matrix(fn, "a", trans_a, m, k, a, lda, any_output && k > 0);
    if (s != GC_SUCCESS) return s;
    s = check_matrix(fn, "b", trans_b, k, n, b, ldb, any_output && k > 0);
    if (s != GC_SUCCESS) return s;
    return check_matrix(fn, "c", 0, m, n, c, ldc, any_output);
}

template <bool TRANS_A, bool TRANS_B, bool TF32>
gc_status run_simt(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                   int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b, float beta,
                   float *c, int64_t ldc, int64_t stride_c, int64_t batch, gc_stream stream,
                   const char *what) {
    /* op(A) is m x k: stored (m, k) has k contiguous; stored (k, m) has m contiguous */
    const auto op_a = matrix_operand<!TRANS_A, TF32>(a, lda, stride_a, TRANS_A ? k : m,
                                                     TRANS_A ? m : k);
    const auto op_b = matrix_operand<TRANS_B, TF32>(b, ldb, stride_b, TRANS_B ? n : k,
                                                    TRANS_B ? k : n);
    const MatrixOutput out = matrix_output(c, ldc, stride_c, m, n, alpha, beta, nullptr, 0);
    if constexpr (!TF32) { /* TF32 rounds its values in registers: no cp.async */
        if (gemm_pipeline_fits(k))
            return launch_gemm_pipeline(op_a, op_b, out, m, n, k, batch, stream, what);
    }
    return launch_gemm_tiles(op_a, op_b, out, m, n, k, batch, stream, what);
}

template <bool TF32>
gc_status dispatch_simt(int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                        float alpha, const float *a, int64_t lda, int64_t stride_a,
                        const float *b, int64_t ldb, int64_t stride_b, float beta, float *c,
                        int64_t ldc, int64_t stride_c, int64_t batch, gc_stream stream,
                        const char *what) {
#define GC_RUN_SIMT(TA, TB)                                                                    \
    run_simt<TA, TB, TF32>(m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,  \
                           stride_c, batch, stream, what)
    if (trans_a) return trans_b ? GC_RUN_SIMT(true, true) : GC_RUN_SIMT(true, false);
    return trans_b ? GC_RUN_SIMT(false, true) : GC_RUN_SIMT(false, false);
#undef GC_RUN_SIMT
}

#ifndef GC_EMULATION
/* ---- TF32 tensor cores (CUDA build only) -------------------------------------------------- */
constexpr int kWmmaTileM = 64, kWmmaTileN = 64, kWmmaTileK = 16, kWmmaThreads = 128;
constexpr int kWmmaPad = 4; /* keeps rows 16-byte multiples and fragment pointers 32-aligned */

template <class OpA, class OpB>
__global__ void __launch_bounds__(kWmmaThreads)
gemm_tf32_wmma_kernel(OpA a, OpB b, MatrixOutput out, int64_t k) {
    using namespace nvcuda;
    __shared__ __align__(128) float a_s[kWmmaTileM][kWmmaTileK + kWmmaPad]; /* (m, k) */
    __shared__ __align__(128) float b_s[kWmmaTileK][kWmmaTileN + kWmmaPad]; /* (k, n) */
    __shared__ __align__(128) float c_s[kWmmaTileM][kWmmaTileN + kWmmaPad];

    a.select(0);
    b.select(0);
    out.select(0);
    const int tid = threadIdx.x, warp = tid / 32, warp_m = warp / 2, warp_n = warp % 2;
    const int64_t m0 = (int64_t)blockIdx.y * kWmmaTileM, n0 = (int64_t)blockIdx.x * kWmmaTileN;

    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[2][2];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    for (int64_t k0 = 0; k0 < k; k0 += kWmmaTileK) {
        for (int part = 0; part < 2; ++part) { /* 64 x 16 = 2 x 128 threads x 4 values */
            const int idx = tid + part * kWmmaThreads;
            float v[4];
            if (OpA::K_CONTIGUOUS) {
                a.load4(m0 + idx / 4, k0 + (idx % 4) * 4, v);
                for (int i = 0; i < 4; ++i) a_s[idx / 4][(idx % 4) * 4 + i] = v[i];
            } else {
                a.load4(k0 + idx / 16, m0 + (idx % 16) * 4, v);
                for (int i = 0; i < 4; ++i) a_s[(idx % 16) * 4 + i][idx / 16] = v[i];
            }
            if (OpB::K_CONTIGUOUS) {
                b.load4(n0 + idx / 4, k0 + (idx % 4) * 4, v);
                for (int i = 0; i < 4; ++i) b_s[(idx % 4) * 4 + i][idx / 4] = v[i];
            } else {
                b.load4(k0 + idx / 16, n0 + (idx % 16) * 4, v);
                for (int i = 0; i < 4; ++i) b_s[idx / 16][(idx % 16) * 4 + i] = v[i];
            }
        }
        __syncthreads();
        for (int kk = 0; kk < kWmmaTileK; kk += 8) {
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major>
                a_frag[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major>
                b_frag[2];
            for (int i = 0; i < 2; ++i) {
                wmma::load_matrix_sync(a_frag[i], &a_s[warp_m * 32 + i * 16][kk],
                                       kWmmaTileK + kWmmaPad);
                for (int e = 0; e < a_frag[i].num_elements; ++e)
                    a_frag[i].x[e] = wmma::__float_to_tf32(a_frag[i].x[e]);
                wmma::load_matrix_sync(b_frag[i], &b_s[kk][warp_n * 32 + i * 16],
                                       kWmmaTileN + kWmmaPad);
                for (int e = 0; e < b_frag[i].num_elements; ++e)
                    b_frag[i].x[e] = wmma::__float_to_tf32(b_frag[i].x[e]);
            }
            for (int i = 0; i < 2; ++i)
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a_frag[i], b_frag[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(&c_s[warp_m * 32 + i * 16][warp_n * 32 + j * 16], acc[i][j],
                                    kWmmaTileN + kWmmaPad, wmma::mem_row_major);
    __syncthreads();
    for (int idx = tid; idx < kWmmaTileM * kWmmaTileN / 4; idx += kWmmaThreads) {
        const int row = idx / (kWmmaTileN / 4), col = (idx % (kWmmaTileN / 4)) * 4;
        const float v[4] = {c_s[row][col], c_s[row][col + 1], c_s[row][col + 2],
                            c_s[row][col + 3]};
        out.store4(m0 + row, n0 + col, v);
    }
}

template <bool TRANS_A, bool TRANS_B>
gc_status run_wmma(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                   const float *b, int64_t ldb, float beta, float *c, int64_t ldc,
                   gc_stream stream) {
    auto op_a = matrix_operand<!TRANS_A>(a, lda, 0, TRANS_A ? k : m, TRANS_A ? m : k);
    auto op_b = matrix_operand<TRANS_B>(b, ldb, 0, TRANS_B ? n : k, TRANS_B ? k : n);
    const MatrixOutput out = matrix_output(c, ldc, 0, m, n, alpha, beta, nullptr, 0);
    const int64_t tiles_m = (m + kWmmaTileM - 1) / kWmmaTileM;
    if (tiles_m > kMaxGridYZ)
        return gc_fail(GC_ERROR_NOT_SUPPORTED, "gc_gemm_tf32_f32: m = %lld rows exceed the "
                       "%lld this GEMM grid covers; split the product", (long long)m,
                       (long long)(kMaxGridYZ * kWmmaTileM));
    const dim3 grid((unsigned)((n + kWmmaTileN - 1) / kWmmaTileN), (unsigned)tiles_m, 1);
    const auto kernel = &gemm_tf32_wmma_kernel<decltype(op_a), decltype(op_b)>;
    GC_LAUNCH(kernel, grid, dim3(kWmmaThreads, 1, 1), 0, stream)(op_a, op_b, out, k);
    GC_CHECK_LAUNCH("gc_gemm_tf32_f32");
    return GC_SUCCESS;
}
#endif /* GC_EMULATION */

} /* namespace */

extern "C" gc_status gc_gemm_f32(int32_t trans_a, int32_t trans_b, int64_t m, int64_t n,
                                 int64_t k, float alpha, const float *a, int64_t lda,
                                 const float *b, int64_t ldb, float beta, float *c, int64_t ldc,
                                 gc_stream stream) {
    const char *fn = "gc_gemm_f32";
    const gc_status s = check_gemm(fn, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
    if (s != GC_SUCCESS || m == 0 || n == 0) return s;
    if (gc_vendor::gemm_takes(false, m, n, k, 1))
        return gc_vendor::gemm({false, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0,
                                beta, c, ldc, 0, 1}, stream);
    return dispatch_simt<false>(trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c,
                                ldc, 0, 1, stream, fn);
}

extern "C" gc_status gc_gemm_strided_batched_f32(int32_t trans_a, int32_t trans_b, int64_t m,
                                                 int64_t n, int64_t k, float alpha,
                                                 const float *a, int64_t lda, int64_t stride_a,
                                                 const float *b, int64_t ldb, int64_t stride_b,
                                                 float beta, float *c, int64_t ldc,
                                                 int64_t stride_c, int64_t batch,
                                                 gc_stream stream) {
    const char *fn = "gc_gemm_strided_batched_f32";
    gc_status s = check_gemm(fn, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
    if (s != GC_SUCCESS) return s;
    GC_REQUIRE(batch >= 0, "batch must be >= 0, got %lld", (long long)batch);
    GC_REQUIRE(stride_a >= 0 && stride_b >= 0,
               "stride_a and stride_b must be >= 0 (0 broadcasts), got %lld and %lld",
               (long long)stride_a, (long long)stride_b);
    const int64_t c_extent = m > 0 && n > 0 ? (m - 1) * ldc + n : 0;
    GC_REQUIRE(batch <= 1 || stride_c >= c_extent,
               "stride_c = %lld makes the %lld output matrices overlap (each spans %lld "
               "elements); pass stride_c >= %lld", (long long)stride_c, (long long)batch,
               (long long)c_extent, (long long)c_extent);
    if (m == 0 || n == 0 || batch == 0) return GC_SUCCESS;
    if (gc_vendor::gemm_takes(false, m, n, k, batch))
        return gc_vendor::gemm({false, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b,
                                ldb, stride_b, beta, c, ldc, stride_c, batch}, stream);
    return dispatch_simt<false>(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb,
                                stride_b, beta, c, ldc, stride_c, batch, stream, fn);
}

extern "C" gc_status gc_gemm_tf32_f32(int32_t trans_a, int32_t trans_b, int64_t m, int64_t n,
                                      int64_t k, float alpha, const float *a, int64_t lda,
                                      const float *b, int64_t ldb, float beta, float *c,
                                      int64_t ldc, gc_stream stream) {
    const char *fn = "gc_gemm_tf32_f32";
    const gc_status s = check_gemm(fn, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
    if (s != GC_SUCCESS || m == 0 || n == 0) return s;
    if (gc_vendor::gemm_takes(true, m, n, k, 1))
        return gc_vendor::gemm({true, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0,
                                beta, c, ldc, 0, 1}, stream);
#ifdef GC_EMULATION
    return dispatch_simt<true>(trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c,
                               ldc, 0, 1, stream, fn);
#else
    if (trans_a)
        return trans_b ? run_wmma<true, true>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream)
                       : run_wmma<true, false>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                                               stream);
    return trans_b ? run_wmma<false, true>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream)
                   : run_wmma<false, false>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream);
#endif
}

extern "C" const char *gc_gemm_provider(int32_t tf32, int64_t m, int64_t n, int64_t k) {
    thread_local char text[640];
    if (gc_vendor::gemm_takes(tf32 != 0, m, n, k, 1)) {
        snprintf(text, sizeof text, "%s", gc_vendor::blas_status());
        return text;
    }
    const char *kernel;
#ifdef GC_EMULATION
    kernel = tf32 ? "graphc SIMT tile kernel with TF32 rounding (the emulation has no tensor "
                    "cores)" : nullptr;
#else
    kernel = tf32 ? "graphc wmma TF32 tensor-core kernel" : nullptr;
#endif
    if (!kernel)
        kernel = gemm_pipeline_fits(k) ? "graphc SIMT tile kernel, 3-stage cp.async pipeline"
                                       : "graphc SIMT tile kernel, register double buffering";
    const char *status = gc_vendor::blas_status();
    const bool loaded = strncmp(status, "cuBLAS from", 11) == 0;
    snprintf(text, sizeof text, "%s (%s%s)", kernel, status,
             loaded ? ": not used for this shape (k == 0 or a size past 2^31)" : "");
    return text;
}
