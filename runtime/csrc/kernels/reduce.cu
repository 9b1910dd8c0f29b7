/* reduce.cu: gc_reduce_f32 (sum/mean/max/min/prod) and gc_arg_reduce_f32 over the middle axis
 * of x seen as (outer, extent, inner).
 *
 * Two layouts: inner == 1 gives one block per row (block-stride loop, then a block reduction);
 * inner > 1 gives blocks of 32 neighbouring (outer, inner) columns (neighbouring threads read
 * neighbouring addresses) times 8 slices of the extent, merged in slice order in shared
 * memory (deterministic). NaN propagates as numpy/torch do: max/min return NaN
 * when any element is NaN; arg-reduce returns the index of the first NaN, else of the first
 * maximum (minimum). An empty extent gives 0 (sum), NaN (mean), 1 (prod); max, min and the
 * arg-reductions have no identity, so an empty extent is an invalid argument.
 */
#include "kernel_util.cuh"

using namespace gc_kernels;

namespace {

struct SumReduce {
    __device__ static float identity() { return 0.0f; }
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct ProdReduce {
    __device__ static float identity() { return 1.0f; }
    __device__ float operator()(float a, float b) const { return a * b; }
};
/* once the accumulator is NaN it stays NaN: neither b > NaN nor NaN(b) replaces it */
struct MaxReduce {
    __device__ static float identity() { return -INFINITY; }
    __device__ float operator()(float a, float b) const { return (b > a || is_nan(b)) ? b : a; }
};
struct MinReduce {
    __device__ static float identity() { return INFINITY; }
    __device__ float operator()(float a, float b) const { return (b < a || is_nan(b)) ? b : a; }
};

template <class Op>
__global__ void reduce_rows_kernel(Op op, int64_t rows, int64_t extent, float scale,
                                   const float *x, float *y) {
    __shared__ float scratch[kThreads];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        float acc = Op::identity();
        for (int64_t e = threadIdx.x; e < extent; e += blockDim.x) acc = op(acc, x[row * extent + e]);
        acc = block_reduce(acc, op, scratch);
        if (threadIdx.x == 0) y[row] = acc * scale;
    }
}

/* 32 neighbouring columns a block (lane x = threadIdx.x % 32: coalesced loads) times
 * kColumnRows slices of the extent (one per warp), merged in slice order by slice 0. */
constexpr int kColumnRows = kThreads / 32;

inline dim3 column_grid(int64_t columns) {
    int64_t groups = (columns + 31) / 32;
    if (groups > kMaxBlocks) groups = kMaxBlocks;
    return dim3((unsigned)(groups > 0 ? groups : 1), 1, 1);
}

template <class Op>
__global__ void reduce_columns_kernel(Op op, int64_t outer, int64_t extent, int64_t inner,
                                      float scale, const float *x, float *y) {
    __shared__ float scratch[kColumnRows][32];
    const int cx = threadIdx.x % 32, slice = threadIdx.x / 32;
    const int64_t columns = outer * inner, groups = (columns + 31) / 32;
    for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) { /* uniform across the block */
        const int64_t i = g * 32 + cx;
        float acc = Op::identity();
        if (i < columns) {
            const float *column = x + (i / inner) * extent * inner + i % inner;
            for (int64_t e = slice; e < extent; e += kColumnRows) acc = op(acc, column[e * inner]);
        }
        scratch[slice][cx] = acc;
        __syncthreads();
        if (slice == 0 && i < columns) {
            for (int r = 1; r < kColumnRows; ++r) acc = op(acc, scratch[r][cx]);
            y[i] = acc * scale;
        }
        __syncthreads(); /* scratch is reused by the next group */
    }
}

template <class Op>
gc_status launch_reduce(Op op, int64_t outer, int64_t extent, int64_t inner, float scale,
                        const float *x, float *y, gc_stream stream) {
    if (inner == 1) {
        const int64_t blocks = outer < kMaxBlocks ? outer : kMaxBlocks;
        const auto kernel = &reduce_rows_kernel<Op>;
        GC_LAUNCH(kernel, dim3((unsigned)blocks, 1, 1), dim3(kThreads, 1, 1), 0, stream)(
            op, outer, extent, scale, x, y);
    } else {
        const auto kernel = &reduce_columns_kernel<Op>;
        GC_LAUNCH(kernel, column_grid(outer * inner), dim3(kThreads, 1, 1), 0, stream)(
            op, outer, extent, inner, scale, x, y);
    }
    GC_CHECK_LAUNCH("gc_reduce_f32");
    return GC_SUCCESS;
}

/* ---- arg-reduce ------------------------------------------------------------------------- */
struct ArgCandidate {
    float value;
    int64_t index; /* -1: none */
};

/* Which candidate wins: NaN first, then the larger (smaller) value, then the lower index. */
struct ArgBetter {
    bool is_min;
    __device__ ArgCandidate operator()(ArgCandidate a, ArgCandidate b) const {
        if (a.index < 0) return b;
        if (b.index < 0) return a;
        const bool a_nan = is_nan(a.value), b_nan = is_nan(b.value);
        if (a_nan || b_nan) {
            if (a_nan && b_nan) return b.index < a.index ? b : a;
            return a_nan ? a : b;
        }
        if (a.value == b.value) return b.index < a.index ? b : a;
        const bool b_wins = is_min ? b.value < a.value : b.value > a.value;
        return b_wins ? b : a;
    }
};

__global__ void arg_reduce_rows_kernel(ArgBetter better, int64_t rows, int64_t extent,
                                       const float *x, int64_t *y) {
    __shared__ ArgCandidate scratch[kThreads];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        ArgCandidate best = {0.0f, -1};
        for (int64_t e = threadIdx.x; e < extent; e += blockDim.x)
            best = better(best, ArgCandidate{x[row * extent + e], e});
        best = block_reduce(best, better, scratch);
        if (threadIdx.x == 0) y[row] = best.index;
    }
}

__global__ void arg_reduce_columns_kernel(ArgBetter better, int64_t outer, int64_t extent,
                                          int64_t inner, const float *x, int64_t *y) {
    __shared__ ArgCandidate scratch[kColumnRows][32];
    const int cx = threadIdx.x % 32, slice = threadIdx.x / 32;
    const int64_t columns = outer * inner, groups = (columns + 31) / 32;
    for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
        const int64_t i = g * 32 + cx;
        ArgCandidate best = {0.0f, -1};
        if (i < columns) {
            const float *column = x + (i / inner) * extent * inner + i % inner;
            for (int64_t e = slice; e < extent; e += kColumnRows)
                best = better(best, ArgCandidate{column[e * inner], e});
        }
        scratch[slice][cx] = best;
        __syncthreads();
        if (slice == 0 && i < columns) {
            for (int r = 1; r < kColumnRows; ++r) best = better(best, scratch[r][cx]);
            y[i] = best.index;
        }
        __syncthreads();
    }
}

gc_status check_shape(const char *fn, int64_t outer, int64_t extent, int64_t inner,
                      const void *x, const void *y) {
    if (outer < 0 || extent < 0 || inner < 0)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT,
                       "%s: outer, extent and inner must be >= 0, got %lld, %lld, %lld", fn,
                       (long long)outer, (long long)extent, (long long)inner);
    const bool any_output = outer > 0 && inner > 0;
    if (any_output && (y == nullptr || (extent > 0 && x == nullptr)))
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: x and y must not be NULL (got x = %p, "
                       "y = %p)", fn, x, y);
    return GC_SUCCESS;
}

} /* namespace */

extern "C" gc_status gc_reduce_f32(gc_reduce_op op, int64_t outer, int64_t extent,
                                   int64_t inner, const float *x, float *y, gc_stream stream) {
    const char *fn = "gc_reduce_f32";
    GC_TRY(check_shape(fn, outer, extent, inner, x, y));
    GC_REQUIRE(op >= GC_REDUCE_SUM && op <= GC_REDUCE_PROD,
               "op must be a gc_reduce_op (0..4), got %d", (int)op);
    GC_REQUIRE(extent > 0 || (op != GC_REDUCE_MAX && op != GC_REDUCE_MIN),
               "%s over an empty extent has no identity; reduce a non-empty axis",
               op == GC_REDUCE_MAX ? "max" : "min");
    if (outer == 0 || inner == 0) return GC_SUCCESS;
    switch (op) {
    case GC_REDUCE_SUM: return launch_reduce(SumReduce{}, outer, extent, inner, 1.0f, x, y, stream);
    case GC_REDUCE_MEAN:
        return launch_reduce(SumReduce{}, outer, extent, inner,
                             extent > 0 ? 1.0f / (float)extent : NAN, x, y, stream);
    case GC_REDUCE_MAX: return launch_reduce(MaxReduce{}, outer, extent, inner, 1.0f, x, y, stream);
    case GC_REDUCE_MIN: return launch_reduce(MinReduce{}, outer, extent, inner, 1.0f, x, y, stream);
    default: return launch_reduce(ProdReduce{}, outer, extent, inner, 1.0f, x, y, stream);
    }
}

extern "C" gc_status gc_arg_reduce_f32(int32_t is_min, int64_t outer, int64_t extent,
                                       int64_t inner, const float *x, int64_t *y,
                                       gc_stream stream) {
    const char *fn = "gc_arg_reduce_f32";
    GC_TRY(check_shape(fn, outer, extent, inner, x, y));
    GC_REQUIRE(extent > 0, "arg%s over an empty extent has no answer; reduce a non-empty axis",
               is_min ? "min" : "max");
    if (outer == 0 || inner == 0) return GC_SUCCESS;
    const ArgBetter better{is_min != 0};
    if (inner == 1) {
        const int64_t blocks = outer < kMaxBlocks ? outer : kMaxBlocks;
        GC_LAUNCH(arg_reduce_rows_kernel, dim3((unsigned)blocks, 1, 1), dim3(kThreads, 1, 1), 0,
                  stream)(better, outer, extent, x, y);
    } else {
        GC_LAUNCH(arg_reduce_columns_kernel, column_grid(outer * inner), dim3(kThreads, 1, 1), 0,
                  stream)(better, outer, extent, inner, x, y);
    }
    GC_CHECK_LAUNCH(fn);
    return GC_SUCCESS;
}
