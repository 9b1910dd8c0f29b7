/* batch_norm.cu: gc_batch_norm_fwd_f32 and gc_batch_norm_bwd_f32 over x seen as (n, c, hw).
 *
 * Training statistics run one block per channel with double accumulators and two passes
 * (mean, then the centred sum of squares: the biased variance, no cancellation);
 * inference is one elementwise pass with the running statistics. The backward (training
 * mode) is again one block per channel: dbias = sum(dy), dweight = sum(dy * xhat) and
 * dx = weight * invstd * (dy - dbias / m - xhat * dweight / m), m = n * hw.
 * NULL weight/bias mean 1/0 (no affine); NULL save_mean/save_invstd/dweight/dbias are not
 * written. Invariants: arguments validated before any launch; c == 0 or an empty x launches
 * nothing (training needs m > 0: its statistics would be 0/0).
 */
#include "kernel_util.cuh"

using namespace gc_kernels;

namespace {

__global__ void bn_train_fwd_kernel(int64_t n, int64_t c, int64_t hw, double eps,
                                    const float *x, const float *weight, const float *bias,
                                    float *y, float *save_mean, float *save_invstd) {
    __shared__ double scratch[kThreads];
    const int64_t m = n * hw;
    for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
        double local = 0.0;
        for (int64_t e = threadIdx.x; e < m; e += blockDim.x)
            local += x[((e / hw) * c + ch) * hw + e % hw];
        const double mean = block_reduce(local, SumOp(), scratch) / (double)m;
        local = 0.0;
        for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
            const double d = x[((e / hw) * c + ch) * hw + e % hw] - mean;
            local += d * d;
        }
        const double var = block_reduce(local, SumOp(), scratch) / (double)m;
        const double invstd = 1.0 / sqrt(var + eps);
        const float scale = (float)(invstd * (weight ? weight[ch] : 1.0f));
        const float shift = (float)((bias ? bias[ch] : 0.0f) - mean * scale);
        for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
            const int64_t at = ((e / hw) * c + ch) * hw + e % hw;
            y[at] = x[at] * scale + shift;
        }
        if (threadIdx.x == 0) {
            if (save_mean) save_mean[ch] = (float)mean;
            if (save_invstd) save_invstd[ch] = (float)invstd;
        }
    }
}

__global__ void bn_eval_fwd_kernel(int64_t n, int64_t c, int64_t hw, double eps,
                                   const float *x, const float *weight, const float *bias,
                                   const float *running_mean, const float *running_var, float *y,
                                   float *save_mean, float *save_invstd) {
    const int64_t total = n * c * hw;
    for (int64_t i = global_thread_index(); i < total; i += global_thread_count()) {
        const int64_t ch = (i / hw) % c;
        const double invstd = 1.0 / sqrt((double)running_var[ch] + eps);
        const double scale = invstd * (weight ? weight[ch] : 1.0f);
        y[i] = (float)((x[i] - (double)running_mean[ch]) * scale + (bias ? bias[ch] : 0.0f));
    }
    for (int64_t ch = global_thread_index(); ch < c; ch += global_thread_count()) {
        if (save_mean) save_mean[ch] = running_mean[ch];
        if (save_invstd) save_invstd[ch] = (float)(1.0 / sqrt((double)running_var[ch] + eps));
    }
}

__global__ void bn_bwd_kernel(int64_t n, int64_t c, int64_t hw, const float *x, const float *dy,
                              const float *weight, const float *save_mean,
                              const float *save_invstd, float *dx, float *dweight,
                              float *dbias) {
    __shared__ double scratch[kThreads];
    const int64_t m = n * hw;
    for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
        const float mean = save_mean[ch], invstd = save_invstd[ch];
        double local_dy = 0.0, local_dy_xhat = 0.0;
        for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
            const int64_t at = ((e / hw) * c + ch) * hw + e % hw;
            local_dy += dy[at];
            local_dy_xhat += (double)dy[at] * ((x[at] - mean) * invstd);
        }
        const double sum_dy = block_reduce(local_dy, SumOp(), scratch);
        const double sum_dy_xhat = block_reduce(local_dy_xhat, SumOp(), scratch);
        const float scale = (weight ? weight[ch] : 1.0f) * invstd;
        const float mean_dy = (float)(sum_dy / (double)m), mean_dy_xhat = (float)(sum_dy_xhat / (double)m);
        if (dx) {
            for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
                const int64_t at = ((e / hw) * c + ch) * hw + e % hw;
                const float xhat = (x[at] - mean) * invstd;
                dx[at] = scale * (dy[at] - mean_dy - xhat * mean_dy_xhat);
            }
        }
        if (threadIdx.x == 0) {
            if (dbias) dbias[ch] = (float)sum_dy;
            if (dweight) dweight[ch] = (float)sum_dy_xhat;
        }
    }
}

} /* namespace */

extern "C" gc_status gc_batch_norm_fwd_f32(int64_t n, int64_t c, int64_t hw, int32_t training,
                                           double eps, const float *x, const float *weight,
                                           const float *bias, const float *running_mean,
                                           const float *running_var, float *y, float *save_mean,
                                           float *save_invstd, gc_stream stream) {
    GC_REQUIRE(n >= 0 && c >= 0 && hw >= 0, "n, c and hw must be >= 0, got %lld, %lld, %lld",
               (long long)n, (long long)c, (long long)hw);
    GC_REQUIRE(eps >= 0.0, "eps must be >= 0, got %g", eps);
    if (c == 0) return GC_SUCCESS;
    GC_REQUIRE(!training || n * hw > 0,
               "training needs at least one value per channel, got n = %lld, hw = %lld",
               (long long)n, (long long)hw);
    GC_REQUIRE(training || (running_mean != nullptr && running_var != nullptr),
               "inference (training = 0) needs running_mean and running_var, got NULL");
    GC_REQUIRE(n * hw == 0 || (x != nullptr && y != nullptr), "x and y must not be NULL");
    if (training) {
        const int64_t blocks = c < kMaxBlocks ? c : kMaxBlocks;
        GC_LAUNCH(bn_train_fwd_kernel, dim3((unsigned)blocks, 1, 1), dim3(kThreads, 1, 1), 0,
                  stream)(n, c, hw, eps, x, weight, bias, y, save_mean, save_invstd);
    } else {
        GC_LAUNCH(bn_eval_fwd_kernel, grid_1d(n * c * hw > c ? n * c * hw : c),
                  dim3(kThreads, 1, 1), 0, stream)(n, c, hw, eps, x, weight, bias, running_mean,
                                                   running_var, y, save_mean, save_invstd);
    }
    GC_CHECK_LAUNCH("gc_batch_norm_fwd_f32");
    return GC_SUCCESS;
}

extern "C" gc_status gc_batch_norm_bwd_f32(int64_t n, int64_t c, int64_t hw, const float *x,
                                           const float *dy, const float *weight,
                                           const float *save_mean, const float *save_invstd,
                                           float *dx, float *dweight, float *dbias,
                                           gc_stream stream) {
    GC_REQUIRE(n >= 0 && c >= 0 && hw >= 0, "n, c and hw must be >= 0, got %lld, %lld, %lld",
               (long long)n, (long long)c, (long long)hw);
    if (c == 0) return GC_SUCCESS;
    GC_REQUIRE(n * hw > 0, "the backward needs at least one value per channel, got n = %lld, "
               "hw = %lld", (long long)n, (long long)hw);
    GC_REQUIRE(x != nullptr && dy != nullptr && dx != nullptr && save_mean != nullptr &&
                   save_invstd != nullptr,
               "x, dy, dx, save_mean and save_invstd must not be NULL");
    const int64_t blocks = c < kMaxBlocks ? c : kMaxBlocks;
    GC_LAUNCH(bn_bwd_kernel, dim3((unsigned)blocks, 1, 1), dim3(kThreads, 1, 1), 0, stream)(
        n, c, hw, x, dy, weight, save_mean, save_invstd, dx, dweight, dbias);
    GC_CHECK_LAUNCH("gc_batch_norm_bwd_f32");
    return GC_SUCCESS;
}
