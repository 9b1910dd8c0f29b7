/* conv_filter_grad.cuh: the weight gradient of a convolution (gc_conv2d_bwd_filter_f32),
 * included by conv.cu only (after conv_split_k.cuh, whose SM count it uses, and
 * conv_fast_divisor.cuh).
 *
 * Per group g, with K_g = (c_in/groups) * kh * kw and the pixels q = image * P + p of all
 * images (P = out_h * out_w):
 *   dW_g[c_out/groups, K_g] = sum over q of dy_g[:, q] col_g[:, q]^T
 * The pixels are cut into `splits` ranges of `chunk` (a function of the shape and the SM
 * count: filter_plan), each summed on its own into a partial dW, and the partials are added
 * in split order at the end (sum_filter_splits_kernel): deterministic, no atomics.
 * The column matrices are explicit: one launch of filter_columns_kernel copies, for every
 * split, its pixels' columns of x (im2col: row (ci * kh + ki) * kw + kj over all c_in) and of
 * dy (row c over all c_out) into the workspace, the pixels contiguous within a row, so the
 * product is ONE plain strided-batched GEMM (gc_gemm_strided_batched_f32: cuBLAS where it is
 * loaded, graphc's tile kernel otherwise) with batch entry z = split * groups + group:
 *   A_z = dy columns (c_out/groups x pixels), B_z = x columns (K_g x pixels, transposed),
 *   C_z = the split's partial dW rows of the group (or dW itself with one split).
 * The column matrices of every split take splits * chunk * (c_in kh kw + c_out) floats; past
 * kFilterPassBudget the splits' pixels run in passes (pass t covers pixels [t sub, (t+1) sub)
 * of every split; its GEMM adds onto the earlier passes' result with beta = 1), so the
 * workspace is bounded by the budget (at least 8 pixels a split and pass).
 * Rounding: each split sums `chunk` products per weight in order (128 pixels or more: a
 * long chunk's sequential sum broke the rounding rule on a GPU), then the splits are added in
 * order.
 * Invariants: chunk and sub are multiples of 8 (4-pixel groups never cross a split, and the
 * column rows stay 16-byte aligned); columns past the last pixel are zeros in both operands;
 * the plan is a function of the descriptor and the SM count only, and
 * gc_conv2d_workspace_size asks the same function as the entry.
 */
#ifndef GC_CONV_FILTER_GRAD_CUH
#define GC_CONV_FILTER_GRAD_CUH

namespace {

/* The column matrices one pass may take before the splits' pixels run in several passes.
 * The emulation uses a small one so its tests (small shapes) run several passes too. */
#ifdef GC_EMULATION
constexpr int64_t kFilterPassBudget = (int64_t)64 << 10;
#else
constexpr int64_t kFilterPassBudget = (int64_t)64 << 20;
#endif
/* pixels a split sums at least: each weight's products are summed in order within a split,
 * so the split's length bounds the rounding error's growth (a GPU run of 584 pixels a split,
 * in one pass, broke the rounding rule where 152-pixel passes kept it) */
constexpr int64_t kFilterMinChunk = 128;
constexpr int64_t kFilterMaxSplits = 256;
constexpr int64_t kFilterAlign = 8;      /* chunk and sub are multiples of it */

struct FilterPlan {
    int64_t splits, chunk; /* pixel ranges summed apart, then added in split order */
    int64_t passes, sub;   /* pass t covers pixels [t * sub, (t + 1) * sub) of each split */
    int64_t pixels;        /* n * out_h * out_w */
    int64_t rows;          /* x column rows: c_in * kh * kw (every group's) */
    int64_t partial_floats, dy_floats; /* workspace: [partials | dy columns | x columns] */
    int64_t column_floats;
};

/* How the weight gradient of d runs: splits enough for two blocks an SM of graphc's tile
 * kernel when the (c_out/groups x K_g) tiles are few (at least kFilterMinChunk pixels a
 * split), passes when the splits' columns exceed kFilterPassBudget. */
inline FilterPlan filter_plan(const gc_conv2d_desc &d) {
    FilterPlan f;
    const int64_t c_out_g = d.c_out / d.groups, k_g = (d.c_in / d.groups) * d.kh * d.kw;
    const int64_t tiles = tile_count(c_out_g, k_g, d.groups);
    f.pixels = d.n * d.out_h * d.out_w;
    f.rows = d.c_in * d.kh * d.kw;
    const int64_t slots = 2 * (int64_t)multiprocessor_count();
    int64_t splits = (slots + tiles - 1) / tiles;
    if (splits > f.pixels / kFilterMinChunk) splits = f.pixels / kFilterMinChunk;
    if (splits > kFilterMaxSplits) splits = kFilterMaxSplits;
    if (splits < 1) splits = 1;
    f.chunk = round_up((f.pixels + splits - 1) / splits, kFilterAlign);
    f.splits = f.pixels > 0 ? (f.pixels + f.chunk - 1) / f.chunk : 1;
    if (f.pixels == 0) { /* no images: the entry writes zeros, no workspace */
        f.passes = f.sub = f.partial_floats = f.dy_floats = f.column_floats = 0;
        return f;
    }
    const int64_t bytes_per_pixel = f.splits * (f.rows + d.c_out) * (int64_t)sizeof(float);
    int64_t sub_max = kFilterPassBudget / bytes_per_pixel / kFilterAlign * kFilterAlign;
    if (sub_max < kFilterAlign) sub_max = kFilterAlign;
    f.passes = (f.chunk + sub_max - 1) / sub_max;
    f.sub = round_up((f.chunk + f.passes - 1) / f.passes, kFilterAlign);
    f.passes = (f.chunk + f.sub - 1) / f.sub;
    /* regions rounded to 64 floats keep every one 256-byte aligned after an aligned base */
    f.partial_floats = f.splits > 1 ? round_up(f.splits * d.c_out * k_g, 64) : 0;
    f.dy_floats = round_up(f.splits * d.c_out * f.sub, 64);
    f.column_floats = f.splits * f.rows * f.sub;
    return f;
}

inline int64_t filter_workspace_bytes(const gc_conv2d_desc &d) {
    const FilterPlan f = filter_plan(d);
    return (f.partial_floats + f.dy_floats + f.column_floats) * (int64_t)sizeof(float);
}

/* What filter_columns_kernel needs for one pass. */
struct FilterPass {
    gc_conv2d_desc d;
    FastDivisor quads_per_split; /* 4-pixel groups of a split in this pass */
    FastDivisor plane, row;      /* out_h * out_w, out_w */
    int32_t quads;               /* splits * quads_per_split */
    int32_t chunk, first, count; /* first: this pass's first pixel of a split; count: its
                                  * pixels (sub, or the rest in the last pass) */
    int32_t pixels;              /* n * out_h * out_w */
    int64_t sub, rows;           /* the column rows' length (stride) and x's row count */
    bool vector_stores;          /* the columns' base is 16-byte aligned */
};

__device__ inline void store_quad(float *at, const float (&v)[4], bool vector) {
    if (vector) {
        *reinterpret_cast<float4 *>(at) = make_float4(v[0], v[1], v[2], v[3]);
        return;
    }
    GC_UNROLL
    for (int i = 0; i < 4; ++i) at[i] = v[i];
}

/* The columns of one pass: a thread owns 4 consecutive pixels of one split (decomposed once,
 * by multiplies), blockIdx.y one channel: x channel ci writes its kh * kw rows of the x
 * columns, dy channel c its row of the dy columns. Pixels outside the pass or past the last
 * image are zeros. Consecutive threads hold consecutive pixels, so both the reads (of one x
 * or dy row) and the writes (of one column row) are coalesced. */
__global__ void filter_columns_kernel(FilterPass a, const float *x, const float *dy,
                                      float *dy_columns, float *columns) {
    const gc_conv2d_desc &d = a.d;
    const uint32_t quad = blockIdx.x * blockDim.x + threadIdx.x;
    if (quad >= (uint32_t)a.quads) return; /* no barrier in this kernel */
    const uint32_t split = a.quads_per_split.quotient(quad);
    const int32_t r0 = (int32_t)(quad - split * a.quads_per_split.divisor) * 4;
    const uint32_t q0 = split * (uint32_t)a.chunk + (uint32_t)(a.first + r0);
    uint32_t image = a.plane.quotient(q0);
    uint32_t p = q0 - image * a.plane.divisor;
    uint32_t oh = a.row.quotient(p), ow = p - oh * a.row.divisor;
    const int64_t plane = (int64_t)d.h * d.w, out_plane = a.plane.divisor;
    int64_t x_at[4], dy_at[4]; /* x at (image, channel 0), dy at (image, channel 0, p) */
    int32_t ih0[4], iw0[4];
    bool in[4];
    GC_UNROLL
    for (int i = 0; i < 4; ++i) {
        in[i] = r0 + i < a.count && (int64_t)q0 + i < a.pixels;
        x_at[i] = (int64_t)image * d.c_in * plane;
        dy_at[i] = (int64_t)image * d.c_out * out_plane + p;
        ih0[i] = (int32_t)(oh * d.stride_h - d.pad_h);
        iw0[i] = (int32_t)(ow * d.stride_w - d.pad_w);
        ++p;
        if (++ow == (uint32_t)d.out_w) { /* the next output row, or the next image */
            ow = 0;
            if (++oh == (uint32_t)d.out_h) { oh = 0; p = 0; ++image; }
        }
    }
    const int64_t channels = d.c_in + d.c_out;
    for (int64_t channel = blockIdx.y; channel < channels; channel += gridDim.y) {
        float v[4];
        if (channel >= d.c_in) { /* a dy row */
            const int64_t c = channel - d.c_in;
            GC_UNROLL
            for (int i = 0; i < 4; ++i) v[i] = in[i] ? dy[dy_at[i] + c * out_plane] : 0.0f;
            store_quad(dy_columns + (split * d.c_out + c) * a.sub + r0, v, a.vector_stores);
            continue;
        }
        const float *x_channel = x + channel * plane;
        float *out = columns + (split * a.rows + channel * d.kh * d.kw) * a.sub + r0;
        for (int64_t ki = 0; ki < d.kh; ++ki) {
            for (int64_t kj = 0; kj < d.kw; ++kj) {
                GC_UNROLL
                for (int i = 0; i < 4; ++i) {
                    const int64_t ih = ih0[i] + ki * d.dilation_h, iw = iw0[i] + kj * d.dilation_w;
                    v[i] = in[i] && ih >= 0 && ih < d.h && iw >= 0 && iw < d.w
                               ? x_channel[x_at[i] + ih * d.w + iw]
                               : 0.0f;
                }
                store_quad(out, v, a.vector_stores);
                out += a.sub;
            }
        }
    }
}

/* dweight[i] = the splits' partials of element i added in split order */
__global__ void sum_filter_splits_kernel(int64_t splits, int64_t count, const float *partial,
                                         float *dweight) {
    for (int64_t i = global_thread_index(); i < count; i += global_thread_count()) {
        float sum = 0.0f;
        for (int64_t s = 0; s < splits; ++s) sum += partial[s * count + i];
        dweight[i] = sum;
    }
}

/* The weight gradient of a checked descriptor with n > 0 (the entry validated the workspace
 * against filter_workspace_bytes). */
gc_status filter_gradient(const gc_conv2d_desc &d, const float *x, const float *dy,
                          float *dweight, float *workspace, gc_stream stream, const char *fn) {
    const FilterPlan f = filter_plan(d);
    const int64_t c_out_g = d.c_out / d.groups, k_g = (d.c_in / d.groups) * d.kh * d.kw;
    if (f.pixels + f.chunk >= ((int64_t)1 << 31))
        return gc_fail(GC_ERROR_NOT_SUPPORTED, "%s: n * out_h * out_w = %lld pixels exceed the "
                       "2^31 this kernel counts; split the batch", fn, (long long)f.pixels);
    float *partial = workspace;
    float *dy_columns = workspace + f.partial_floats;
    float *columns = dy_columns + f.dy_floats;
    float *target = f.splits > 1 ? partial : dweight; /* z = split * groups + group */
    FilterPass a;
    a.d = d;
    a.plane = FastDivisor::of(d.out_h * d.out_w);
    a.row = FastDivisor::of(d.out_w);
    a.chunk = (int32_t)f.chunk;
    a.pixels = (int32_t)f.pixels;
    a.sub = f.sub;
    a.rows = f.rows;
    a.vector_stores = (uintptr_t)workspace % 16 == 0;
    const int64_t channels = d.c_in + d.c_out;
    for (int64_t pass = 0; pass < f.passes; ++pass) {
        a.first = (int32_t)(pass * f.sub);
        a.count = (int32_t)std::min(f.sub, f.chunk - pass * f.sub);
        const int64_t quads_per_split = (a.count + 3) / 4;
        a.quads_per_split = FastDivisor::of(quads_per_split);
        a.quads = (int32_t)(f.splits * quads_per_split);
        const dim3 grid((unsigned)((a.quads + kThreads - 1) / kThreads),
                        (unsigned)std::min<int64_t>(channels, kMaxGridYZ), 1);
        GC_LAUNCH(filter_columns_kernel, grid, dim3(kThreads, 1, 1), 0, stream)(
            a, x, dy, dy_columns, columns);
        GC_CHECK_LAUNCH(fn);
        GC_TRY(gc_gemm_strided_batched_f32(0, 1, c_out_g, k_g, a.count, 1.0f, dy_columns, f.sub,
                                           c_out_g * f.sub, columns, f.sub, k_g * f.sub,
                                           pass == 0 ? 0.0f : 1.0f, target, k_g, c_out_g * k_g,
                                           f.splits * d.groups, stream));
    }
    if (f.splits == 1) return GC_SUCCESS;
    GC_LAUNCH(sum_filter_splits_kernel, grid_1d(d.c_out * k_g), dim3(kThreads, 1, 1), 0,
              stream)(f.splits, d.c_out * k_g, partial, dweight);
    GC_CHECK_LAUNCH(fn);
    return GC_SUCCESS;
}

} /* namespace */

#endif /* GC_CONV_FILTER_GRAD_CUH */
