/* conv.cu: 2-D convolution (NCHW, weight (c_out, c_in / groups, kh, kw)): gc_conv2d_check,
 * gc_conv2d_workspace_size, the forward (im2col + GEMM or implicit GEMM), backward data
 * (implicit GEMM, or GEMM + col2im), backward filter (explicit columns + one batched GEMM)
 * and the bias gradient, with stride, padding, dilation and groups.
 *
 * Per group g, with K = (c_in / groups) * kh * kw and P = out_h * out_w:
 *   forward      y_g[c_out/groups, P] = W_g[c_out/groups, K] @ col_g[K, P] + bias_g
 *   backward data  stride 1: dx_g = W_g^T @ dy through a transposed-convolution view, one
 *                implicit GEMM over all images; otherwise (conv_strided_dgrad.cuh) dy copied
 *                into rows, one strided-batched GEMM col_g[K, n*P] = W_g^T @ dy_g over all
 *                images (the images are GEMM columns; cuBLAS where loaded) into the
 *                workspace, then one col2im launch per pass of at most 64 MiB of columns and
 *                dy rows (a gather: each dx element sums the column entries that read it;
 *                deterministic, no atomics)
 *   backward filter dW_g = dy_g[c_out/groups, N*P] @ col_g^T[N*P, K] (conv_filter_grad.cuh):
 *                N*P split into ranges summed apart; one launch copies every range's
 *                columns of x and dy into the workspace (pixels contiguous), one strided-
 *                batched GEMM (cuBLAS where loaded) makes each range's partial dW, and the
 *                partials are added in split order (deterministic); in passes past 64 MiB
 * The groups are the batch (blockIdx.z) of gemm_tile.cuh's kernel. The im2col forward works
 * one image at a time through a column buffer of c_in * kh * kw * P floats (the workspace);
 * the implicit GEMMs read x (or dy) through an im2col view instead, over all images at once
 * (their GEMM columns are n * P), and split K when their tiles are fewer than half the SMs
 * (conv_split_k.cuh: partials in the workspace, added in split order with the bias); their
 * cursors hoist the index math out of the k loop (divisions once per thread, then adds).
 * The weight gradient's workspace holds the column matrices and the split partials.
 * Invariants: the descriptor is re-checked by every entry (out_h/out_w must be what
 * gc_conv2d_check computes); a workspace smaller than gc_conv2d_workspace_size gives
 * GC_ERROR_WORKSPACE before any launch; every result is bit-identical on a rerun on one device.
 */
#include <stdio.h>

#include <algorithm>

#include "gemm_tile.cuh"
#include "vendor_dnn.h"

using namespace gc_kernels;

#include "conv_split_k.cuh"
#include "conv_fast_divisor.cuh"
#include "conv_filter_grad.cuh"
#include "conv_strided_dgrad.cuh"

namespace {

/* The column matrix of one image: col[(ci * kh + ki) * kw + kj][oh * out_w + ow]. */
__global__ void im2col_kernel(gc_conv2d_desc d, const float *x, float *col) {
    const int64_t p_count = d.out_h * d.out_w, total = d.c_in * d.kh * d.kw * p_count;
    for (int64_t i = global_thread_index(); i < total; i += global_thread_count()) {
        const int64_t p = i % p_count, row = i / p_count;
        const int64_t kj = row % d.kw, ki = (row / d.kw) % d.kh, ci = row / (d.kw * d.kh);
        const int64_t ih = (p / d.out_w) * d.stride_h - d.pad_h + ki * d.dilation_h;
        const int64_t iw = (p % d.out_w) * d.stride_w - d.pad_w + kj * d.dilation_w;
        col[i] = (ih >= 0 && ih < d.h && iw >= 0 && iw < d.w) ? x[(ci * d.h + ih) * d.w + iw]
                                                              : 0.0f;
    }
}

/* The k step of a GEMM tile (kTileK) as digits of the im2col row index k = (ci * kh + ki) * kw
 * + kj: whole planes, ki * dilation_h and kj * dilation_w (computed once on the host), so the
 * cursors below step k with adds and compares only. */
struct KStep {
    int64_t planes; /* step of ci, in elements of x (a multiple of h * w) */
    int32_t dh, dw; /* step of ki * dilation_h and of kj * dilation_w */
};

inline KStep k_step(const gc_conv2d_desc &d, int64_t count, int64_t plane_size) {
    KStep s;
    s.planes = count / (d.kh * d.kw) * plane_size;
    s.dh = (int32_t)((count / d.kw) % d.kh * d.dilation_h);
    s.dw = (int32_t)(count % d.kw * d.dilation_w);
    return s;
}

/* x through an im2col view, as the B operand (K x n*P) of one group's GEMM. A thread's 4
 * columns are fixed for the whole k loop: start() decomposes them once (divisions), then
 * advance() steps k by digits and load4() computes each address with adds and multiplies.
 * Columns past the first one's output row (a row end when out_w % 4 != 0, or the last
 * image) take a slower path that decomposes them again. */
struct ImplicitConvInput {
    static constexpr bool K_CONTIGUOUS = false; /* 4 consecutive output pixels per load */
    static constexpr int MIN_BLOCKS = 1;        /* the cursor needs ~10 more registers */
    gc_conv2d_desc d;
    const float *x;
    int64_t channel0; /* first input channel of the selected group */
    KStep step;

    __device__ void select(int64_t group) { channel0 = group * (d.c_in / d.groups); }

    struct Cursor {
        const float *plane; /* x at the first column's image, channel channel0 + ci */
        int64_t column;     /* the first of the 4 columns */
        int32_t ih0, iw0;   /* the first column's oh * stride_h - pad_h, ow * stride_w - pad_w */
        int32_t dh, dw;     /* ki * dilation_h, kj * dilation_w of the current k */
        int32_t k_left;     /* rows of the GEMM left from the current k (<= 0: none) */
        int32_t run;        /* columns (0..4) that share the first one's output row */
    };

    __device__ Cursor start(int64_t kidx, int64_t column) const {
        Cursor c;
        const int64_t k_count = (d.c_in / d.groups) * d.kh * d.kw;
        const int64_t p_count = d.out_h * d.out_w, columns = d.n * p_count;
        const int64_t ci = kidx / (d.kh * d.kw);
        c.k_left = (int32_t)(k_count - kidx);
        c.dh = (int32_t)((kidx / d.kw) % d.kh * d.dilation_h);
        c.dw = (int32_t)(kidx % d.kw * d.dilation_w);
        c.column = column;
        const int64_t image = column < columns ? column / p_count : 0;
        const int64_t p = column % p_count, ow = p % d.out_w;
        c.plane = x + ((image * d.c_in + channel0 + ci) * d.h) * d.w;
        c.ih0 = (int32_t)((p / d.out_w) * d.stride_h - d.pad_h);
        c.iw0 = (int32_t)(ow * d.stride_w - d.pad_w);
        int64_t run = d.out_w - ow < columns - column ? d.out_w - ow : columns - column;
        c.run = column < columns ? (int32_t)(run < 4 ? run : 4) : 0;
        return c;
    }

    __device__ void advance(Cursor &c) const {
        c.k_left -= kTileK;
        c.plane += step.planes;
        c.dh += step.dh;
        c.dw += step.dw;
        if (c.dw >= d.kw * d.dilation_w) { c.dw -= (int32_t)(d.kw * d.dilation_w); c.dh += (int32_t)d.dilation_h; }
        if (c.dh >= d.kh * d.dilation_h) { c.dh -= (int32_t)(d.kh * d.dilation_h); c.plane += d.h * d.w; }
    }

    __device__ void load4(const Cursor &c, float (&v)[4]) const {
        GC_UNROLL
        for (int i = 0; i < 4; ++i) v[i] = 0.0f;
        if (c.k_left <= 0) return;
        const int64_t ih = c.ih0 + c.dh;
        if (ih >= 0 && ih < d.h) {
            const float *row = c.plane + ih * d.w;
            GC_UNROLL
            for (int i = 0; i < 4; ++i) {
                const int64_t iw = c.iw0 + c.dw + i * d.stride_w;
                if (i < c.run && iw >= 0 && iw < d.w) v[i] = row[iw];
            }
        }
        if (c.run < 4) load_rest(c, v);
    }

    /* columns past the first one's output row: decomposed again (divisions) */
    __device__ void load_rest(const Cursor &c, float (&v)[4]) const {
        const int64_t p_count = d.out_h * d.out_w, columns = d.n * p_count;
        const int64_t image0 = c.column / p_count;
        GC_UNROLL
        for (int i = 1; i < 4; ++i) { /* constant indices: v stays in registers */
            const int64_t col = c.column + i;
            if (i < c.run || col >= columns) continue;
            const int64_t p = col % p_count;
            const int64_t ih = (p / d.out_w) * d.stride_h - d.pad_h + c.dh;
            const int64_t iw = (p % d.out_w) * d.stride_w - d.pad_w + c.dw;
            if (ih >= 0 && ih < d.h && iw >= 0 && iw < d.w)
                v[i] = c.plane[(col / p_count - image0) * d.c_in * d.h * d.w + ih * d.w + iw];
        }
    }
};

/* ---- the input gradient with stride 1: one implicit GEMM per group over all images -------
 * dx_g[c_in/groups, N*H*W] = W_g^T[c_in/groups, K'] @ dy_view[K', N*H*W], K' = (c_out/groups)
 * * kh * kw: with stride 1, dx(ih, iw) reads dy(ih + pad_h - ki * dilation_h, iw + pad_w -
 * kj * dilation_w) (no divisions; a strided convolution keeps GEMM + col2im per image, whose
 * taps are all useful). */
struct WeightT { /* W_g^T as the A operand: (ci, k' = (co, ki, kj)) */
    static constexpr bool K_CONTIGUOUS = true;
    static constexpr int MIN_BLOCKS = 1;
    const float *w;
    int64_t c_in_g, taps, k_count, base; /* taps = kh * kw; base: the group's first weight */
    int64_t group_size;                  /* c_out_g * c_in_g * taps */

    __device__ void select(int64_t group) { base = group * group_size; }

    struct Cursor {
        const float *at; /* W at (co, ci, tap) */
        int32_t tap, left;
    };
    __device__ Cursor start(int64_t row, int64_t kk) const {
        Cursor c;
        c.tap = (int32_t)(kk % taps);
        c.at = w + base + ((kk / taps) * c_in_g + row) * taps + c.tap;
        c.left = row < c_in_g ? (int32_t)(k_count - kk) : INT32_MIN / 2;
        return c;
    }
    __device__ void advance(Cursor &c) const {
        c.at += kTileK;
        c.tap += kTileK;
        c.left -= kTileK;
        while (c.tap >= taps) { c.tap -= (int32_t)taps; c.at += (c_in_g - 1) * taps; }
    }
    __device__ void load4(const Cursor &c, float (&v)[4]) const {
        GC_UNROLL
        for (int i = 0; i < 4; ++i) {
            v[i] = 0.0f;
            if (i >= c.left) continue;
            const float *a = c.at + i;
            for (int64_t t = c.tap + i; t >= taps; t -= taps) a += (c_in_g - 1) * taps;
            v[i] = *a;
        }
    }
};

/* dy through the transposed-convolution view, as the B operand (K' x N*H*W); stride 1 only.
 * The same cursor scheme as ImplicitConvInput, over dy's planes. */
struct ImplicitDgradInput {
    static constexpr bool K_CONTIGUOUS = false;
    static constexpr int MIN_BLOCKS = 1;
    gc_conv2d_desc d;
    const float *dy;
    int64_t channel0; /* first output channel of the selected group */
    KStep step;

    __device__ void select(int64_t group) { channel0 = group * (d.c_out / d.groups); }

    struct Cursor {
        const float *plane; /* dy at the first column's image, channel channel0 + co */
        int64_t column;
        int32_t oh0, ow0;   /* the first column's ih + pad_h, iw + pad_w */
        int32_t dh, dw;     /* ki * dilation_h, kj * dilation_w of the current k' */
        int32_t k_left, run;
    };

    __device__ Cursor start(int64_t kidx, int64_t column) const {
        Cursor c;
        const int64_t k_count = (d.c_out / d.groups) * d.kh * d.kw;
        const int64_t hw = d.h * d.w, columns = d.n * hw;
        const int64_t co = kidx / (d.kh * d.kw);
        c.k_left = (int32_t)(k_count - kidx);
        c.dh = (int32_t)((kidx / d.kw) % d.kh * d.dilation_h);
        c.dw = (int32_t)(kidx % d.kw * d.dilation_w);
        c.column = column;
        const int64_t image = column < columns ? column / hw : 0;
        const int64_t p = column % hw, iw = p % d.w;
        c.plane = dy + (image * d.c_out + channel0 + co) * d.out_h * d.out_w;
        c.oh0 = (int32_t)(p / d.w + d.pad_h);
        c.ow0 = (int32_t)(iw + d.pad_w);
        const int64_t run = d.w - iw < columns - column ? d.w - iw : columns - column;
        c.run = column < columns ? (int32_t)(run < 4 ? run : 4) : 0;
        return c;
    }

    __device__ void advance(Cursor &c) const {
        c.k_left -= kTileK;
        c.plane += step.planes;
        c.dh += step.dh;
        c.dw += step.dw;
        if (c.dw >= d.kw * d.dilation_w) { c.dw -= (int32_t)(d.kw * d.dilation_w); c.dh += (int32_t)d.dilation_h; }
        if (c.dh >= d.kh * d.dilation_h) { c.dh -= (int32_t)(d.kh * d.dilation_h); c.plane += d.out_h * d.out_w; }
    }

    __device__ void load4(const Cursor &c, float (&v)[4]) const {
        GC_UNROLL
        for (int i = 0; i < 4; ++i) v[i] = 0.0f;
        if (c.k_left <= 0) return;
        const int64_t oh = c.oh0 - c.dh;
        if (oh >= 0 && oh < d.out_h) {
            const float *row = c.plane + oh * d.out_w;
            GC_UNROLL
            for (int i = 0; i < 4; ++i) {
                const int64_t ow = c.ow0 - c.dw + i;
                if (i < c.run && ow >= 0 && ow < d.out_w) v[i] = row[ow];
            }
        }
        if (c.run < 4) load_rest(c, v);
    }

    __device__ void load_rest(const Cursor &c, float (&v)[4]) const {
        const int64_t hw = d.h * d.w, columns = d.n * hw;
        const int64_t image0 = c.column / hw;
        GC_UNROLL
        for (int i = 1; i < 4; ++i) { /* constant indices: v stays in registers */
            const int64_t col = c.column + i;
            if (i < c.run || col >= columns) continue;
            const int64_t p = col % hw;
            const int64_t oh = p / d.w + d.pad_h - c.dh, ow = p % d.w + d.pad_w - c.dw;
            if (oh >= 0 && oh < d.out_h && ow >= 0 && ow < d.out_w)
                v[i] = c.plane[(col / hw - image0) * d.c_out * d.out_h * d.out_w +
                               oh * d.out_w + ow];
        }
    }
};

/* One group's GEMM result (c_in/groups x N*H*W) written into NCHW dx. */
struct DxOutput {
    gc_conv2d_desc d;
    float *dx;
    int64_t channel0;

    __device__ void select(int64_t group) { channel0 = group * (d.c_in / d.groups); }

    __device__ void store4(int64_t row, int64_t column, const float (&v)[4]) const {
        const int64_t hw = d.h * d.w, columns = d.n * hw;
        if (row >= d.c_in / d.groups) return;
        GC_UNROLL
        for (int i = 0; i < 4; ++i) {
            const int64_t c = column + i;
            if (c >= columns) break;
            dx[((c / hw) * d.c_in + channel0 + row) * hw + c % hw] = v[i];
        }
    }
};

bool implicit_dgrad(const gc_conv2d_desc &d) { return d.stride_h == 1 && d.stride_w == 1; }

/* One group's GEMM result (c_out/groups x n*P) written into NCHW y with the bias added. */
struct ConvOutput {
    gc_conv2d_desc d;
    float *y;
    const float *bias;
    int64_t channel0; /* first output channel of the selected group */

    __device__ void select(int64_t group) { channel0 = group * (d.c_out / d.groups); }

    __device__ void store4(int64_t row, int64_t column, const float (&v)[4]) const {
        const int64_t p_count = d.out_h * d.out_w, columns = d.n * p_count;
        if (row >= d.c_out / d.groups) return;
        const int64_t channel = channel0 + row;
        const float add = bias ? bias[channel] : 0.0f;
        GC_UNROLL
        for (int i = 0; i < 4; ++i) {
            const int64_t c = column + i;
            if (c >= columns) break;
            y[((c / p_count) * d.c_out + channel) * p_count + c % p_count] = v[i] + add;
        }
    }
};

__global__ void bias_grad_kernel(gc_conv2d_desc d, const float *dy, float *dbias) {
    __shared__ float scratch[kThreads];
    const int64_t p_count = d.out_h * d.out_w, m = d.n * p_count;
    for (int64_t channel = blockIdx.x; channel < d.c_out; channel += gridDim.x) {
        float local = 0.0f;
        for (int64_t e = threadIdx.x; e < m; e += blockDim.x)
            local += dy[((e / p_count) * d.c_out + channel) * p_count + e % p_count];
        const float sum = block_reduce(local, SumOp(), scratch);
        if (threadIdx.x == 0) dbias[channel] = sum;
    }
}

int64_t column_buffer_bytes(const gc_conv2d_desc &d) {
    return d.c_in * d.kh * d.kw * d.out_h * d.out_w * (int64_t)sizeof(float);
}

/* the forward's workspace: a column buffer (im2col) or the split-K partials (implicit) */
int64_t forward_workspace_bytes(const gc_conv2d_desc &d, gc_conv2d_pass pass) {
    if (pass == GC_CONV2D_FWD_IM2COL) return column_buffer_bytes(d);
    return split_k_workspace_bytes(forward_k_split(d), d.n * d.c_out * d.out_h * d.out_w);
}

/* the input gradient's workspace: the split-K partials (stride 1) or the column matrices */
int64_t dgrad_workspace_bytes(const gc_conv2d_desc &d) {
    if (!implicit_dgrad(d)) return strided_dgrad_workspace_bytes(d);
    return split_k_workspace_bytes(dgrad_k_split(d), d.n * d.c_in * d.h * d.w);
}

/* gc_conv2d_check's rules, reported under the caller's name; fills out_h/out_w. */
gc_status check_desc(const char *fn, gc_conv2d_desc *d) {
    if (d == nullptr) return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: desc is NULL", fn);
    if (d->n < 0 || d->c_in <= 0 || d->h <= 0 || d->w <= 0 || d->c_out <= 0 || d->kh <= 0 ||
        d->kw <= 0)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: expected n >= 0 and c_in, h, w, c_out, "
                       "kh, kw > 0, got n=%lld c_in=%lld h=%lld w=%lld c_out=%lld kh=%lld "
                       "kw=%lld", fn, (long long)d->n, (long long)d->c_in, (long long)d->h,
                       (long long)d->w, (long long)d->c_out, (long long)d->kh, (long long)d->kw);
    if (d->stride_h <= 0 || d->stride_w <= 0 || d->dilation_h <= 0 || d->dilation_w <= 0 ||
        d->pad_h < 0 || d->pad_w < 0)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: expected stride and dilation > 0 and "
                       "padding >= 0, got stride %lldx%lld, dilation %lldx%lld, padding "
                       "%lldx%lld", fn, (long long)d->stride_h, (long long)d->stride_w,
                       (long long)d->dilation_h, (long long)d->dilation_w, (long long)d->pad_h,
                       (long long)d->pad_w);
    if (d->groups <= 0 || d->c_in % d->groups != 0 || d->c_out % d->groups != 0)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: groups = %lld must be > 0 and divide "
                       "c_in = %lld and c_out = %lld", fn, (long long)d->groups,
                       (long long)d->c_in, (long long)d->c_out);
    const int64_t span_h = d->dilation_h * (d->kh - 1) + 1, span_w = d->dilation_w * (d->kw - 1) + 1;
    if (span_h > d->h + 2 * d->pad_h || span_w > d->w + 2 * d->pad_w)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: the dilated kernel (%lldx%lld) is larger "
                       "than the padded input (%lldx%lld)", fn, (long long)span_h,
                       (long long)span_w, (long long)(d->h + 2 * d->pad_h),
                       (long long)(d->w + 2 * d->pad_w));
    d->out_h = (d->h + 2 * d->pad_h - span_h) / d->stride_h + 1;
    d->out_w = (d->w + 2 * d->pad_w - span_w) / d->stride_w + 1;
    return GC_SUCCESS;
}

/* Re-checks a caller's descriptor into `checked` (out_h/out_w must match) and the workspace. */
gc_status check_call(const char *fn, const gc_conv2d_desc *desc, gc_conv2d_desc *checked,
                     int64_t workspace_needed, const void *workspace, int64_t workspace_bytes) {
    if (desc == nullptr) return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: desc is NULL", fn);
    *checked = *desc;
    GC_TRY(check_desc(fn, checked));
    if (checked->out_h != desc->out_h || checked->out_w != desc->out_w)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: desc has out_h x out_w = %lldx%lld but "
                       "its geometry gives %lldx%lld; call gc_conv2d_check on it first", fn,
                       (long long)desc->out_h, (long long)desc->out_w,
                       (long long)checked->out_h, (long long)checked->out_w);
    if (workspace_needed > 0 && (workspace == nullptr || workspace_bytes < workspace_needed))
        return gc_fail(GC_ERROR_WORKSPACE, "%s: the workspace (%p, %lld bytes) is smaller than "
                       "the %lld bytes gc_conv2d_workspace_size asks for", fn, workspace,
                       (long long)workspace_bytes, (long long)workspace_needed);
    return GC_SUCCESS;
}

gc_status require_pointers(const char *fn, const void *a, const void *b, const void *c) {
    if (a == nullptr || b == nullptr || c == nullptr)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: a tensor pointer is NULL (got %p, %p, "
                       "%p)", fn, a, b, c);
    return GC_SUCCESS;
}

gc_status launch_im2col(const gc_conv2d_desc &d, const float *x_image, float *col,
                        gc_stream stream, const char *fn) {
    const int64_t total = d.c_in * d.kh * d.kw * d.out_h * d.out_w;
    GC_LAUNCH(im2col_kernel, grid_1d(total), dim3(kThreads, 1, 1), 0, stream)(d, x_image, col);
    GC_CHECK_LAUNCH(fn);
    return GC_SUCCESS;
}

} /* namespace */

extern "C" gc_status gc_conv2d_check(gc_conv2d_desc *desc) {
    return check_desc("gc_conv2d_check", desc);
}

extern "C" gc_status gc_conv2d_workspace_size(const gc_conv2d_desc *desc, gc_conv2d_pass pass,
                                              int64_t *bytes) {
    const char *fn = "gc_conv2d_workspace_size";
    GC_REQUIRE(bytes != nullptr, "bytes is NULL");
    gc_conv2d_desc checked;
    GC_TRY(check_call(fn, desc, &checked, 0, nullptr, 0));
    /* the larger of graphc's kernels' need and cuDNN's (vendor_dnn.h), so either can run */
    using gc_vendor::ConvPass;
    switch (pass) {
    case GC_CONV2D_FWD_IMPLICIT:
    case GC_CONV2D_FWD_IM2COL:
        *bytes = std::max(forward_workspace_bytes(checked, pass),
                          gc_vendor::conv_workspace(checked, ConvPass::forward));
        return GC_SUCCESS;
    case GC_CONV2D_BWD_DATA:
        *bytes = std::max(dgrad_workspace_bytes(checked),
                          gc_vendor::conv_workspace(checked, ConvPass::backward_data));
        return GC_SUCCESS;
    case GC_CONV2D_BWD_FILTER:
        *bytes = std::max(filter_workspace_bytes(checked),
                          gc_vendor::conv_workspace(checked, ConvPass::backward_filter));
        return GC_SUCCESS;
    default:
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: pass must be a gc_conv2d_pass (0..3), "
                       "got %d", fn, (int)pass);
    }
}

extern "C" gc_status gc_conv2d_fwd_f32(const gc_conv2d_desc *desc, gc_conv2d_pass pass,
                                       const float *x, const float *weight, const float *bias,
                                       float *y, void *workspace, int64_t workspace_bytes,
                                       gc_stream stream) {
    const char *fn = "gc_conv2d_fwd_f32";
    GC_REQUIRE(pass == GC_CONV2D_FWD_IM2COL || pass == GC_CONV2D_FWD_IMPLICIT,
               "pass must be GC_CONV2D_FWD_IM2COL or GC_CONV2D_FWD_IMPLICIT, got %d", (int)pass);
    gc_conv2d_desc d;
    const bool im2col = pass == GC_CONV2D_FWD_IM2COL;
    GC_TRY(check_call(fn, desc, &d, 0, nullptr, 0));
    GC_TRY(check_call(fn, desc, &d, forward_workspace_bytes(d, pass), workspace,
                      workspace_bytes));
    if (d.n == 0) return GC_SUCCESS;
    GC_TRY(require_pointers(fn, x, weight, y));
    if (gc_vendor::conv_takes(d, gc_vendor::ConvPass::forward, workspace_bytes))
        return gc_vendor::conv_forward(d, x, weight, bias, y, workspace, workspace_bytes, stream);
    const int64_t c_out_g = d.c_out / d.groups, k = (d.c_in / d.groups) * d.kh * d.kw;
    const int64_t p_count = d.out_h * d.out_w;
    const auto op_w = matrix_operand<true>(weight, k, c_out_g * k, c_out_g, k);
    if (!im2col) {
        const ImplicitConvInput op_x{d, x, 0, k_step(d, kTileK, d.h * d.w)};
        const KSplit split = forward_k_split(d);
        if (split.splits > 1)
            return launch_split_k(op_w, op_x, split, d.groups, c_out_g, d.n * p_count, p_count,
                                  static_cast<float *>(workspace), bias, y, stream, fn);
        const ConvOutput out{d, y, bias, 0};
        return launch_gemm_tiles(op_w, op_x, out, c_out_g, d.n * p_count, k, d.groups, stream,
                                 fn);
    }
    float *col = static_cast<float *>(workspace);
    for (int64_t image = 0; image < d.n; ++image) {
        GC_TRY(launch_im2col(d, x + image * d.c_in * d.h * d.w, col, stream, fn));
        const auto op_col = matrix_operand<false>(col, p_count, k * p_count, k, p_count);
        const MatrixOutput out = matrix_output(y + image * d.c_out * p_count, p_count,
                                               c_out_g * p_count, c_out_g, p_count, 1.0f, 0.0f,
                                               bias, c_out_g);
        GC_TRY(launch_gemm_tiles(op_w, op_col, out, c_out_g, p_count, k, d.groups, stream, fn));
    }
    return GC_SUCCESS;
}

extern "C" gc_status gc_conv2d_bwd_data_f32(const gc_conv2d_desc *desc, const float *dy,
                                            const float *weight, float *dx, void *workspace,
                                            int64_t workspace_bytes, gc_stream stream) {
    const char *fn = "gc_conv2d_bwd_data_f32";
    gc_conv2d_desc d;
    GC_TRY(check_call(fn, desc, &d, 0, nullptr, 0));
    GC_TRY(check_call(fn, desc, &d, dgrad_workspace_bytes(d), workspace, workspace_bytes));
    if (d.n == 0) return GC_SUCCESS;
    GC_TRY(require_pointers(fn, dy, weight, dx));
    if (gc_vendor::conv_takes(d, gc_vendor::ConvPass::backward_data, workspace_bytes))
        return gc_vendor::conv_backward_data(d, dy, weight, dx, workspace, workspace_bytes,
                                             stream);
    if (implicit_dgrad(d)) {
        const int64_t c_out_g = d.c_out / d.groups;
        const int64_t c_in_g = d.c_in / d.groups, taps = d.kh * d.kw;
        const WeightT op_wt{weight, c_in_g, taps, c_out_g * taps, 0, c_out_g * c_in_g * taps};
        const ImplicitDgradInput op_dy{d, dy, 0, k_step(d, kTileK, d.out_h * d.out_w)};
        const KSplit split = dgrad_k_split(d);
        if (split.splits > 1)
            return launch_split_k(op_wt, op_dy, split, d.groups, c_in_g, d.n * d.h * d.w,
                                  d.h * d.w, static_cast<float *>(workspace), nullptr, dx,
                                  stream, fn);
        const DxOutput out{d, dx, 0};
        return launch_gemm_tiles(op_wt, op_dy, out, c_in_g, d.n * d.h * d.w, c_out_g * taps,
                                 d.groups, stream, fn);
    }
    return strided_dgrad(d, dy, weight, dx, static_cast<float *>(workspace), stream, fn);
}

extern "C" gc_status gc_conv2d_bwd_filter_f32(const gc_conv2d_desc *desc, const float *x,
                                              const float *dy, float *dweight, void *workspace,
                                              int64_t workspace_bytes, gc_stream stream) {
    const char *fn = "gc_conv2d_bwd_filter_f32";
    gc_conv2d_desc d;
    GC_TRY(check_call(fn, desc, &d, 0, nullptr, 0));
    const int64_t needed = filter_workspace_bytes(d);
    GC_TRY(check_call(fn, desc, &d, needed, workspace, workspace_bytes));
    GC_REQUIRE(dweight != nullptr, "dweight is NULL");
    const int64_t k = (d.c_in / d.groups) * d.kh * d.kw;
    if (d.n == 0) return gc_fill_f32(dweight, 0.0f, d.c_out * k, stream); /* no images: 0 */
    GC_TRY(require_pointers(fn, x, dy, dweight));
    if (gc_vendor::conv_takes(d, gc_vendor::ConvPass::backward_filter, workspace_bytes))
        return gc_vendor::conv_backward_filter(d, x, dy, dweight, workspace, workspace_bytes,
                                               stream);
    return filter_gradient(d, x, dy, dweight, static_cast<float *>(workspace), stream, fn);
}

extern "C" gc_status gc_conv2d_bwd_bias_f32(const gc_conv2d_desc *desc, const float *dy,
                                            float *dbias, gc_stream stream) {
    const char *fn = "gc_conv2d_bwd_bias_f32";
    gc_conv2d_desc d;
    GC_TRY(check_call(fn, desc, &d, 0, nullptr, 0));
    GC_REQUIRE(dbias != nullptr && (dy != nullptr || d.n == 0),
               "dy and dbias must not be NULL (got %p, %p)", (const void *)dy, (void *)dbias);
    const int64_t blocks = d.c_out < kMaxBlocks ? d.c_out : kMaxBlocks;
    GC_LAUNCH(bias_grad_kernel, dim3((unsigned)blocks, 1, 1), dim3(kThreads, 1, 1), 0, stream)(
        d, dy, dbias);
    GC_CHECK_LAUNCH(fn);
    return GC_SUCCESS;
}

extern "C" const char *gc_conv2d_provider(const gc_conv2d_desc *desc, gc_conv2d_pass pass) {
    static thread_local char text[800];
    if (!desc) return "gc_conv2d_provider: desc is NULL";
    gc_conv2d_desc d = *desc;
    if (check_desc("gc_conv2d_provider", &d) != GC_SUCCESS) {
        snprintf(text, sizeof text, "an invalid descriptor: %s", gc_last_error());
        return text;
    }
    using gc_vendor::ConvPass;
    const ConvPass p = pass == GC_CONV2D_BWD_DATA     ? ConvPass::backward_data
                       : pass == GC_CONV2D_BWD_FILTER ? ConvPass::backward_filter
                                                      : ConvPass::forward;
    snprintf(text, sizeof text, "%s%s", gc_vendor::conv_provider(d, p),
             gc_kernels::two_block_tiles() ? "; graphc's 128-row implicit tiles bounded for two "
                                             "blocks an SM (GRAPHC_CUDA_TILE_BLOCKS=2)" : "");
    return text;
}
