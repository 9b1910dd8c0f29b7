/* softmax_loss.cu: gc_softmax_fwd_f32 / gc_softmax_bwd_f32 over (outer, dim, inner) and
 * gc_nll_loss_fwd_f32 / gc_nll_loss_bwd_f32.
 *
 * Softmax subtracts the row maximum before exponentiating (no overflow for any finite input);
 * inner == 1 runs one block per row with block reductions, inner > 1 blocks of 32
 * neighbouring (outer, inner) columns (neighbouring threads read neighbouring addresses)
 * times 8 slices of dim merged in shared memory.
 * NLL forward runs one block over all n * inner targets and accumulates the loss and the
 * picked weights in double, so reductions are deterministic; it writes *bad_target = 0, then
 * 1 + the flat position of the first target outside [0, classes) that is not
 * ignore_index is found (that target's loss and weight count 0). Mean with a total weight of
 * 0 is 0 / 0 = NaN, as PyTorch. NLL backward overwrites every element of dx (a gather: no
 * separate zeroing, no atomics); ignored and bad targets get 0.
 */
#include "kernel_util.cuh"

using namespace gc_kernels;

namespace {

struct MaxOp {
    __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};

/* ---- softmax ---------------------------------------------------------------------------- */
__global__ void softmax_rows_kernel(int64_t rows, int64_t dim, bool log, const float *x,
                                    float *y) {
    __shared__ float scratch[kThreads];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float *in = x + row * dim;
        float *out = y + row * dim;
        float local_max = -INFINITY;
        for (int64_t e = threadIdx.x; e < dim; e += blockDim.x) local_max = MaxOp()(local_max, in[e]);
        const float row_max = block_reduce(local_max, MaxOp(), scratch);
        float local_sum = 0.0f;
        for (int64_t e = threadIdx.x; e < dim; e += blockDim.x) local_sum += expf(in[e] - row_max);
        const float sum = block_reduce(local_sum, SumOp(), scratch);
        const float log_sum = logf(sum), inv_sum = 1.0f / sum;
        for (int64_t e = threadIdx.x; e < dim; e += blockDim.x)
            out[e] = log ? in[e] - row_max - log_sum : expf(in[e] - row_max) * inv_sum;
    }
}

/* inner > 1: blocks of 32 neighbouring (outer, inner) columns (coalesced loads) times
 * kColumnRows slices of dim, the slices' max and sum merged in slice order through shared
 * memory (deterministic), every slice then writing its part of the column. */
constexpr int kColumnRows = kThreads / 32;

inline dim3 column_grid(int64_t columns) {
    int64_t groups = (columns + 31) / 32;
    if (groups > kMaxBlocks) groups = kMaxBlocks;
    return dim3((unsigned)(groups > 0 ? groups : 1), 1, 1);
}

/* every slice gets the merge of all slices' values of its column, in slice order */
template <class Combine>
__device__ float merge_slices(float value, Combine combine, float (*scratch)[32]) {
    const int cx = threadIdx.x % 32, slice = threadIdx.x / 32;
    scratch[slice][cx] = value;
    __syncthreads();
    float result = scratch[0][cx];
    for (int r = 1; r < kColumnRows; ++r) result = combine(result, scratch[r][cx]);
    __syncthreads(); /* scratch is reused right after */
    return result;
}

__global__ void softmax_columns_kernel(int64_t outer, int64_t dim, int64_t inner, bool log,
                                       const float *x, float *y) {
    __shared__ float scratch[kColumnRows][32];
    const int cx = threadIdx.x % 32, slice = threadIdx.x / 32;
    const int64_t columns = outer * inner, groups = (columns + 31) / 32;
    for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) { /* uniform across the block */
        const int64_t i = g * 32 + cx;
        const bool inside = i < columns;
        const int64_t start = inside ? (i / inner) * dim * inner + i % inner : 0;
        const float *in = x + start;
        float local_max = -INFINITY;
        if (inside)
            for (int64_t e = slice; e < dim; e += kColumnRows) local_max = MaxOp()(local_max, in[e * inner]);
        const float col_max = merge_slices(local_max, MaxOp(), scratch);
        float local_sum = 0.0f;
        if (inside)
            for (int64_t e = slice; e < dim; e += kColumnRows) local_sum += expf(in[e * inner] - col_max);
        const float sum = merge_slices(local_sum, SumOp(), scratch);
        const float log_sum = logf(sum), inv_sum = 1.0f / sum;
        if (inside)
            for (int64_t e = slice; e < dim; e += kColumnRows)
                y[start + e * inner] = log ? in[e * inner] - col_max - log_sum
                                           : expf(in[e * inner] - col_max) * inv_sum;
    }
}

/* softmax: dx = y * (dy - sum(dy * y)); log-softmax: dx = dy - exp(y) * sum(dy) */
__device__ inline float softmax_grad_term(bool log, float y, float dy) { return log ? dy : dy * y; }
__device__ inline float softmax_grad(bool log, float y, float dy, float sum) {
    return log ? dy - expf(y) * sum : y * (dy - sum);
}

__global__ void softmax_bwd_rows_kernel(int64_t rows, int64_t dim, bool log, const float *y,
                                        const float *dy, float *dx) {
    __shared__ float scratch[kThreads];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const int64_t base = row * dim;
        float local = 0.0f;
        for (int64_t e = threadIdx.x; e < dim; e += blockDim.x)
            local += softmax_grad_term(log, y[base + e], dy[base + e]);
        const float sum = block_reduce(local, SumOp(), scratch);
        for (int64_t e = threadIdx.x; e < dim; e += blockDim.x)
            dx[base + e] = softmax_grad(log, y[base + e], dy[base + e], sum);
    }
}

__global__ void softmax_bwd_columns_kernel(int64_t outer, int64_t dim, int64_t inner, bool log,
                                           const float *y, const float *dy, float *dx) {
    __shared__ float scratch[kColumnRows][32];
    const int cx = threadIdx.x % 32, slice = threadIdx.x / 32;
    const int64_t columns = outer * inner, groups = (columns + 31) / 32;
    for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
        const int64_t i = g * 32 + cx;
        const bool inside = i < columns;
        const int64_t start = inside ? (i / inner) * dim * inner + i % inner : 0;
        float local = 0.0f;
        if (inside)
            for (int64_t e = slice; e < dim; e += kColumnRows)
                local += softmax_grad_term(log, y[start + e * inner], dy[start + e * inner]);
        const float sum = merge_slices(local, SumOp(), scratch);
        if (inside)
            for (int64_t e = slice; e < dim; e += kColumnRows) {
                const int64_t at = start + e * inner;
                dx[at] = softmax_grad(log, y[at], dy[at], sum);
            }
    }
}

gc_status check_softmax(const char *fn, int64_t outer, int64_t dim, int64_t inner,
                        const void *in, const void *in2, const void *out) {
    if (outer < 0 || dim < 0 || inner < 0)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT,
                       "%s: outer, dim and inner must be >= 0, got %lld, %lld, %lld", fn,
                       (long long)outer, (long long)dim, (long long)inner);
    if (outer * dim * inner > 0 && (in == nullptr || in2 == nullptr || out == nullptr))
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: a tensor pointer is NULL", fn);
    return GC_SUCCESS;
}

/* ---- NLL -------------------------------------------------------------------------------- */
struct MinIndexOp {
    __device__ int64_t operator()(int64_t a, int64_t b) const { return b < a ? b : a; }
};

__global__ void nll_fwd_kernel(int64_t count, int64_t classes, int64_t inner, const float *x,
                               const int64_t *target, const float *weight, int64_t ignore_index,
                               gc_reduction reduction, float *out, float *total_weight,
                               int64_t *bad_target) {
    __shared__ double scratch[kThreads];
    __shared__ int64_t index_scratch[kThreads];
    double loss_sum = 0.0, weight_sum = 0.0;
    int64_t first_bad = count; /* count: none */
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
        const int64_t t = target[i];
        float loss = 0.0f;
        if (t != ignore_index) {
            if (t < 0 || t >= classes) {
                first_bad = i < first_bad ? i : first_bad;
            } else {
                const float w = weight ? weight[t] : 1.0f;
                loss = -x[(i / inner) * classes * inner + t * inner + i % inner] * w;
                weight_sum += w;
                loss_sum += loss;
            }
        }
        if (reduction == GC_REDUCTION_NONE) out[i] = loss;
    }
    loss_sum = block_reduce(loss_sum, SumOp(), scratch);
    weight_sum = block_reduce(weight_sum, SumOp(), scratch);
    first_bad = block_reduce(first_bad, MinIndexOp(), index_scratch);
    if (threadIdx.x == 0) {
        if (reduction == GC_REDUCTION_SUM) out[0] = (float)loss_sum;
        if (reduction == GC_REDUCTION_MEAN) out[0] = (float)(loss_sum / weight_sum);
        if (total_weight) total_weight[0] = (float)weight_sum;
        if (bad_target) bad_target[0] = first_bad < count ? first_bad + 1 : 0;
    }
}

__global__ void nll_bwd_kernel(int64_t n, int64_t classes, int64_t inner, const float *dy,
                               const int64_t *target, const float *weight,
                               const float *total_weight, int64_t ignore_index,
                               gc_reduction reduction, float *dx) {
    const int64_t total = n * classes * inner;
    for (int64_t i = global_thread_index(); i < total; i += global_thread_count()) {
        const int64_t j = i % inner, c = (i / inner) % classes, sample = i / (classes * inner);
        const int64_t flat = sample * inner + j;
        const int64_t t = target[flat];
        float value = 0.0f;
        if (t == c && t != ignore_index) { /* t == c also puts t inside [0, classes) */
            const float w = weight ? weight[t] : 1.0f;
            float scale = reduction == GC_REDUCTION_NONE ? dy[flat] : dy[0];
            if (reduction == GC_REDUCTION_MEAN) scale /= total_weight[0];
            value = -w * scale;
        }
        dx[i] = value;
    }
}

gc_status check_nll(const char *fn, int64_t n, int64_t classes, int64_t inner,
                    gc_reduction reduction) {
    if (n < 0 || classes < 0 || inner < 0)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT,
                       "%s: n, classes and inner must be >= 0, got %lld, %lld, %lld", fn,
                       (long long)n, (long long)classes, (long long)inner);
    if (reduction != GC_REDUCTION_NONE && reduction != GC_REDUCTION_MEAN &&
        reduction != GC_REDUCTION_SUM)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT,
                       "%s: reduction must be GC_REDUCTION_NONE, _MEAN or _SUM (0, 1, 2), got %d",
                       fn, (int)reduction);
    return GC_SUCCESS;
}

} /* namespace */

extern "C" gc_status gc_softmax_fwd_f32(int64_t outer, int64_t dim, int64_t inner, int32_t log,
                                        const float *x, float *y, gc_stream stream) {
    const char *fn = "gc_softmax_fwd_f32";
    GC_TRY(check_softmax(fn, outer, dim, inner, x, x, y));
    if (outer * dim * inner == 0) return GC_SUCCESS;
    if (inner == 1) {
        const int64_t blocks = outer < kMaxBlocks ? outer : kMaxBlocks;
        GC_LAUNCH(softmax_rows_kernel, dim3((unsigned)blocks, 1, 1), dim3(kThreads, 1, 1), 0,
                  stream)(outer, dim, log != 0, x, y);
    } else {
        GC_LAUNCH(softmax_columns_kernel, column_grid(outer * inner), dim3(kThreads, 1, 1), 0,
                  stream)(outer, dim, inner, log != 0, x, y);
    }
    GC_CHECK_LAUNCH(fn);
    return GC_SUCCESS;
}

extern "C" gc_status gc_softmax_bwd_f32(int64_t outer, int64_t dim, int64_t inner, int32_t log,
                                        const float *y, const float *dy, float *dx,
                                        gc_stream stream) {
    const char *fn = "gc_softmax_bwd_f32";
    GC_TRY(check_softmax(fn, outer, dim, inner, y, dy, dx));
    if (outer * dim * inner == 0) return GC_SUCCESS;
    if (inner == 1) {
        const int64_t blocks = outer < kMaxBlocks ? outer : kMaxBlocks;
        GC_LAUNCH(softmax_bwd_rows_kernel, dim3((unsigned)blocks, 1, 1), dim3(kThreads, 1, 1), 0,
                  stream)(outer, dim, log != 0, y, dy, dx);
    } else {
        GC_LAUNCH(softmax_bwd_columns_kernel, column_grid(outer * inner), dim3(kThreads, 1, 1), 0,
                  stream)(outer, dim, inner, log != 0, y, dy, dx);
    }
    GC_CHECK_LAUNCH(fn);
    return GC_SUCCESS;
}

extern "C" gc_status gc_nll_loss_fwd_f32(int64_t n, int64_t classes, int64_t inner,
                                         const float *x, const int64_t *target,
                                         const float *weight, int64_t ignore_index,
                                         gc_reduction reduction, float *out,
                                         float *total_weight, int64_t *bad_target,
                                         gc_stream stream) {
    const char *fn = "gc_nll_loss_fwd_f32";
    GC_TRY(check_nll(fn, n, classes, inner, reduction));
    const int64_t count = n * inner;
    GC_REQUIRE(out != nullptr || (reduction == GC_REDUCTION_NONE && count == 0),
               "out is NULL");
    GC_REQUIRE(count == 0 || (target != nullptr && (x != nullptr || classes == 0)),
               "x and target must not be NULL for %lld targets", (long long)count);
    /* one block: the reductions are deterministic and the empty case still writes out */
    GC_LAUNCH(nll_fwd_kernel, dim3(1, 1, 1), dim3(kThreads, 1, 1), 0, stream)(
        count, classes, inner, x, target, weight, ignore_index, reduction, out, total_weight,
        bad_target);
    GC_CHECK_LAUNCH(fn);
    return GC_SUCCESS;
}

extern "C" gc_status gc_nll_loss_bwd_f32(int64_t n, int64_t classes, int64_t inner,
                                         const float *dy, const int64_t *target,
                                         const float *weight, const float *total_weight,
                                         int64_t ignore_index, gc_reduction reduction,
                                         float *dx, gc_stream stream) {
    const char *fn = "gc_nll_loss_bwd_f32";
    GC_TRY(check_nll(fn, n, classes, inner, reduction));
    const int64_t total = n * classes * inner;
    if (total == 0) return GC_SUCCESS;
    GC_REQUIRE(dy != nullptr && target != nullptr && dx != nullptr,
               "dy, target and dx must not be NULL (got %p, %p, %p)", (const void *)dy,
               (const void *)target, (void *)dx);
    GC_REQUIRE(reduction != GC_REDUCTION_MEAN || total_weight != nullptr,
               "total_weight is NULL but the mean reduction divides by it; pass the forward's "
               "total_weight");
    GC_LAUNCH(nll_bwd_kernel, grid_1d(total), dim3(kThreads, 1, 1), 0, stream)(
        n, classes, inner, dy, target, weight, total_weight, ignore_index, reduction, dx);
    GC_CHECK_LAUNCH(fn);
    return GC_SUCCESS;
}
