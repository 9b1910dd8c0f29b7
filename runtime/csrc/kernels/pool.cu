/* pool.cu: 2-D max and average pooling, forward and backward, over planes of h x w
 * (graphc_rt.h's gc_pool2d_desc; the caller chooses out_h/out_w, so ceil_mode is theirs).
 *
 * Max pooling: one thread per output; the winner is the first maximum in window order
 * (row by row), and a NaN always wins (a later NaN replaces an earlier one, as graphc's
 * max_pool2d and PyTorch's CPU kernel); the index is the flat ih * w + iw in its plane. A
 * window whose values are all -inf points at its first in-bounds element; a window entirely
 * in the padding gives -inf and index -1. The backward is a gather over the windows of the
 * desc (pass the forward's): each dx element sums, in output order and in double, the dy of the
 * windows that recorded it (deterministic, no atomics; other indices are never read back).
 * Average pooling (no dilation: it must be 1): PyTorch's divisor rules: the window clipped to
 * [-pad, size + pad) counts with count_include_pad, the in-bounds part without it, and
 * divisor_override replaces both. The backward is a gather: each dx element sums the dy of
 * the windows that contain it (deterministic, no atomics).
 */
#include "kernel_util.cuh"

using namespace gc_kernels;

namespace {

__global__ void max_pool_fwd_kernel(gc_pool2d_desc d, const float *x, float *y,
                                    int64_t *indices) {
    const int64_t total = d.planes * d.out_h * d.out_w;
    for (int64_t i = global_thread_index(); i < total; i += global_thread_count()) {
        const int64_t ow = i % d.out_w, oh = (i / d.out_w) % d.out_h, plane = i / (d.out_w * d.out_h);
        const float *in = x + plane * d.h * d.w;
        const int64_t h0 = oh * d.stride_h - d.pad_h, w0 = ow * d.stride_w - d.pad_w;
        float best = -INFINITY;
        int64_t best_index = -1;
        for (int64_t ki = 0; ki < d.kh; ++ki) {
            const int64_t ih = h0 + ki * d.dilation_h;
            if (ih < 0 || ih >= d.h) continue;
            for (int64_t kj = 0; kj < d.kw; ++kj) {
                const int64_t iw = w0 + kj * d.dilation_w;
                if (iw < 0 || iw >= d.w) continue;
                const float v = in[ih * d.w + iw];
                if (best_index < 0 || v > best || is_nan(v)) { /* strict >: first maximum */
                    best = v;
                    best_index = ih * d.w + iw;
                }
            }
        }
        y[i] = best;
        indices[i] = best_index;
    }
}

/* Deterministic backward: each input element gathers, in ascending output order (the order
 * of numpy's bincount in graphc's reference kernel), the outputs whose window contains it and
 * whose recorded winner it is; double accumulation; no atomics, so every run gives the same
 * bits. The window comes from the desc: pass the forward's. */
__global__ void max_pool_bwd_gather_kernel(gc_pool2d_desc d, const float *dy,
                                           const int64_t *indices, float *dx) {
    const int64_t total = d.planes * d.h * d.w, plane_size = d.h * d.w;
    for (int64_t i = global_thread_index(); i < total; i += global_thread_count()) {
        const int64_t at = i % plane_size, ih = at / d.w, iw = at % d.w;
        const int64_t base = (i / plane_size) * d.out_h * d.out_w;
        double acc = 0.0;
        for (int64_t a = d.kh - 1; a >= 0; --a) { /* a falling: oh rising */
            const int64_t t = ih + d.pad_h - a * d.dilation_h;
            if (t < 0 || t % d.stride_h != 0 || t / d.stride_h >= d.out_h) continue;
            const int64_t row = base + (t / d.stride_h) * d.out_w;
            for (int64_t b = d.kw - 1; b >= 0; --b) {
                const int64_t u = iw + d.pad_w - b * d.dilation_w;
                if (u < 0 || u % d.stride_w != 0 || u / d.stride_w >= d.out_w) continue;
                const int64_t o = row + u / d.stride_w;
                if (indices[o] == at) acc += dy[o];
            }
        }
        dx[i] = (float)acc;
    }
}

/* the divisor of output (oh, ow), PyTorch's rule */
__device__ inline float avg_divisor(const gc_pool2d_desc &d, int64_t oh, int64_t ow) {
    if (d.divisor_override != 0) return (float)d.divisor_override;
    int64_t h0 = oh * d.stride_h - d.pad_h, w0 = ow * d.stride_w - d.pad_w;
    int64_t h1 = h0 + d.kh < d.h + d.pad_h ? h0 + d.kh : d.h + d.pad_h;
    int64_t w1 = w0 + d.kw < d.w + d.pad_w ? w0 + d.kw : d.w + d.pad_w;
    if (d.count_include_pad) return (float)((h1 - h0) * (w1 - w0));
    h0 = h0 > 0 ? h0 : 0;
    w0 = w0 > 0 ? w0 : 0;
    h1 = h1 < d.h ? h1 : d.h;
    w1 = w1 < d.w ? w1 : d.w;
    return (float)((h1 - h0) * (w1 - w0));
}

__global__ void avg_pool_fwd_kernel(gc_pool2d_desc d, const float *x, float *y) {
    const int64_t total = d.planes * d.out_h * d.out_w;
    for (int64_t i = global_thread_index(); i < total; i += global_thread_count()) {
        const int64_t ow = i % d.out_w, oh = (i / d.out_w) % d.out_h, plane = i / (d.out_w * d.out_h);
        const float *in = x + plane * d.h * d.w;
        const int64_t h0 = oh * d.stride_h - d.pad_h, w0 = ow * d.stride_w - d.pad_w;
        const int64_t ih_begin = h0 > 0 ? h0 : 0, iw_begin = w0 > 0 ? w0 : 0;
        const int64_t ih_end = h0 + d.kh < d.h ? h0 + d.kh : d.h;
        const int64_t iw_end = w0 + d.kw < d.w ? w0 + d.kw : d.w;
        float sum = 0.0f;
        for (int64_t ih = ih_begin; ih < ih_end; ++ih)
            for (int64_t iw = iw_begin; iw < iw_end; ++iw) sum += in[ih * d.w + iw];
        y[i] = sum / avg_divisor(d, oh, ow);
    }
}

/* the outputs o whose window [o * stride - pad, o * stride - pad + k) contains position p */
__device__ inline void windows_containing(int64_t p, int64_t k, int64_t stride, int64_t pad,
                                          int64_t out, int64_t *first, int64_t *last) {
    *first = p + pad < k ? 0 : (p + pad - k) / stride + 1;
    const int64_t hi = (p + pad) / stride;
    *last = hi < out - 1 ? hi : out - 1;
}

__global__ void avg_pool_bwd_kernel(gc_pool2d_desc d, const float *dy, float *dx) {
    const int64_t total = d.planes * d.h * d.w;
    for (int64_t i = global_thread_index(); i < total; i += global_thread_count()) {
        const int64_t iw = i % d.w, ih = (i / d.w) % d.h, plane = i / (d.w * d.h);
        const float *grad = dy + plane * d.out_h * d.out_w;
        int64_t oh_first, oh_last, ow_first, ow_last;
        windows_containing(ih, d.kh, d.stride_h, d.pad_h, d.out_h, &oh_first, &oh_last);
        windows_containing(iw, d.kw, d.stride_w, d.pad_w, d.out_w, &ow_first, &ow_last);
        float sum = 0.0f;
        for (int64_t oh = oh_first; oh <= oh_last; ++oh)
            for (int64_t ow = ow_first; ow <= ow_last; ++ow)
                sum += grad[oh * d.out_w + ow] / avg_divisor(d, oh, ow);
        dx[i] = sum;
    }
}

gc_status check_pool(const char *fn, const gc_pool2d_desc *d, bool average) {
    if (d == nullptr) return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: desc is NULL", fn);
    if (d->planes < 0 || d->h < 0 || d->w < 0 || d->out_h < 0 || d->out_w < 0)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: planes, h, w, out_h and out_w must be "
                       ">= 0, got %lld, %lld, %lld, %lld, %lld", fn, (long long)d->planes,
                       (long long)d->h, (long long)d->w, (long long)d->out_h,
                       (long long)d->out_w);
    if (d->kh <= 0 || d->kw <= 0 || d->stride_h <= 0 || d->stride_w <= 0 || d->dilation_h <= 0 ||
        d->dilation_w <= 0)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: kernel size, stride and dilation must be "
                       "> 0, got kernel %lldx%lld, stride %lldx%lld, dilation %lldx%lld", fn,
                       (long long)d->kh, (long long)d->kw, (long long)d->stride_h,
                       (long long)d->stride_w, (long long)d->dilation_h,
                       (long long)d->dilation_w);
    if (d->pad_h < 0 || d->pad_w < 0)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: padding must be >= 0, got %lldx%lld", fn,
                       (long long)d->pad_h, (long long)d->pad_w);
    if (average && (d->dilation_h != 1 || d->dilation_w != 1))
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: average pooling has no dilation; set "
                       "dilation_h = dilation_w = 1 (got %lldx%lld)", fn,
                       (long long)d->dilation_h, (long long)d->dilation_w);
    return GC_SUCCESS;
}

gc_status check_pointers(const char *fn, int64_t count, const void *a, const void *b,
                         const void *c) {
    if (count > 0 && (a == nullptr || b == nullptr || c == nullptr))
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: a tensor pointer is NULL (got %p, %p, "
                       "%p)", fn, a, b, c);
    return GC_SUCCESS;
}

} /* namespace */

extern "C" gc_status gc_max_pool2d_fwd_f32(const gc_pool2d_desc *desc, const float *x, float *y,
                                           int64_t *indices, gc_stream stream) {
    const char *fn = "gc_max_pool2d_fwd_f32";
    GC_TRY(check_pool(fn, desc, false));
    const int64_t outputs = desc->planes * desc->out_h * desc->out_w;
    GC_TRY(check_pointers(fn, outputs, desc->h * desc->w > 0 ? (const void *)x : y, y, indices));
    if (outputs == 0) return GC_SUCCESS;
    GC_LAUNCH(max_pool_fwd_kernel, grid_1d(outputs), dim3(kThreads, 1, 1), 0, stream)(
        *desc, x, y, indices);
    GC_CHECK_LAUNCH(fn);
    return GC_SUCCESS;
}

extern "C" gc_status gc_max_pool2d_bwd_f32(const gc_pool2d_desc *desc, const float *dy,
                                           const int64_t *indices, float *dx, gc_stream stream) {
    const char *fn = "gc_max_pool2d_bwd_f32";
    GC_TRY(check_pool(fn, desc, false));
    const int64_t inputs = desc->planes * desc->h * desc->w;
    const int64_t outputs = desc->planes * desc->out_h * desc->out_w;
    GC_TRY(check_pointers(fn, inputs, dx, dx, dx));
    GC_TRY(check_pointers(fn, outputs, dy, indices, dy));
    if (inputs == 0) return GC_SUCCESS;
    GC_LAUNCH(max_pool_bwd_gather_kernel, grid_1d(inputs), dim3(kThreads, 1, 1), 0, stream)(
        *desc, dy, indices, dx);
    GC_CHECK_LAUNCH(fn);
    return GC_SUCCESS;
}

extern "C" gc_status gc_avg_pool2d_fwd_f32(const gc_pool2d_desc *desc, const float *x, float *y,
                                           gc_stream stream) {
    const char *fn = "gc_avg_pool2d_fwd_f32";
    GC_TRY(check_pool(fn, desc, true));
    const int64_t outputs = desc->planes * desc->out_h * desc->out_w;
    GC_TRY(check_pointers(fn, outputs, desc->h * desc->w > 0 ? (const void *)x : y, y, y));
    if (outputs == 0) return GC_SUCCESS;
    GC_LAUNCH(avg_pool_fwd_kernel, grid_1d(outputs), dim3(kThreads, 1, 1), 0, stream)(*desc, x, y);
    GC_CHECK_LAUNCH(fn);
    return GC_SUCCESS;
}

extern "C" gc_status gc_avg_pool2d_bwd_f32(const gc_pool2d_desc *desc, const float *dy,
                                           float *dx, gc_stream stream) {
    const char *fn = "gc_avg_pool2d_bwd_f32";
    GC_TRY(check_pool(fn, desc, true));
    const int64_t inputs = desc->planes * desc->h * desc->w;
    GC_TRY(check_pointers(fn, inputs, desc->out_h * desc->out_w > 0 ? (const void *)dy : dx, dx,
                          dx));
    if (inputs == 0) return GC_SUCCESS;
    GC_LAUNCH(avg_pool_bwd_kernel, grid_1d(inputs), dim3(kThreads, 1, 1), 0, stream)(*desc, dy, dx);
    GC_CHECK_LAUNCH(fn);
    return GC_SUCCESS;
}
