/* conv_strided_dgrad.cuh: the input gradient of a strided convolution (stride > 1), included
 * by conv.cu only (after conv_fast_divisor.cuh).
 *
 * The images of a pass are GEMM columns, so one GEMM per group covers them all:
 *   col_g[K, I*P] = W_g^T[K, c_out/groups] @ dy_g[c_out/groups, I*P]
 * with K = (c_in/groups) * kh * kw, P = out_h * out_w and I the images of the pass. One launch
 * first copies the pass's dy into rows (dy_rows_kernel: row c holds channel c of every image
 * of the pass side by side), so the product is ONE plain strided-batched GEMM over the groups
 * (gc_gemm_strided_batched_f32: cuBLAS where loaded, graphc's tile kernel otherwise; W_g^T
 * through the transpose flag); the column matrices of all groups stack into one
 * col[c_in * kh * kw, I*P] in the workspace, and ONE col2im launch gathers dx for all I images
 * (each dx element sums the column entries that read it, in (ki, kj) order: deterministic,
 * no atomics; its index arithmetic divides by multiplies, FastDivisor).
 * A pass takes as many images as fit kDgradWorkspaceBudget (at least one), so the workspace
 * is a function of the shape alone: images_per_pass * (c_in * kh * kw + c_out) * P floats
 * (the columns, then the dy rows 256-byte aligned).
 * Invariants: a column matrix row is (ci * kh + ki) * kw + kj with ci the full input channel;
 * column = image * P + oh * out_w + ow within the pass; one pass's dx and dy hold fewer than
 * 2^31 elements (the kernels count in 32 bits; larger images are refused, not truncated).
 */
#ifndef GC_CONV_STRIDED_DGRAD_CUH
#define GC_CONV_STRIDED_DGRAD_CUH

namespace {

/* Workspace the strided input gradient may take before it runs its images in several passes
 * (each pass a copy of dy, a GEMM and a col2im launch). */
constexpr int64_t kDgradWorkspaceBudget = (int64_t)64 << 20;

/* How many images one pass of the strided input gradient covers: all of them when their
 * column matrices and dy rows fit kDgradWorkspaceBudget, else as many as fit, at least one. */
inline int64_t dgrad_images_per_pass(const gc_conv2d_desc &d) {
    const int64_t per_image = (d.c_in * d.kh * d.kw + d.c_out) * d.out_h * d.out_w *
                              (int64_t)sizeof(float);
    int64_t images = per_image > 0 ? kDgradWorkspaceBudget / per_image : d.n;
    if (images < 1) images = 1;
    return images < d.n ? images : d.n;
}

/* the column matrices of a pass's images, rounded to 64 floats (the dy rows follow) */
inline int64_t dgrad_column_floats(const gc_conv2d_desc &d) {
    return round_up(dgrad_images_per_pass(d) * d.c_in * d.kh * d.kw * d.out_h * d.out_w, 64);
}

inline int64_t strided_dgrad_workspace_bytes(const gc_conv2d_desc &d) {
    const int64_t dy_floats = dgrad_images_per_pass(d) * d.c_out * d.out_h * d.out_w;
    return (dgrad_column_floats(d) + dy_floats) * (int64_t)sizeof(float);
}

/* rows[c][image * P + p] = dy[image][c][p] for the `count` elements of a pass's dy */
__global__ void dy_rows_kernel(FastDivisor plane, FastDivisor channels, uint32_t images,
                               uint32_t count, const float *dy, float *rows) {
    const uint32_t step = gridDim.x * blockDim.x;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step) {
        const uint32_t row = plane.quotient(i), p = i - row * plane.divisor;
        const uint32_t image = channels.quotient(row), c = row - image * channels.divisor;
        rows[((int64_t)c * images + image) * plane.divisor + p] = dy[i];
    }
}

/* What col2im_kernel divides by. */
struct Col2im {
    gc_conv2d_desc d;
    FastDivisor width, height, channels; /* w, h, c_in: dx's index digits */
    FastDivisor stride_h, stride_w;
    int64_t columns; /* I * P */
};

/* dx of a pass's images (`count` elements) from the stacked column matrices: the transpose
 * of im2col. A tap (ki, kj) reads dx's element when ih + pad_h - ki * dilation_h is a
 * non-negative multiple of stride_h below out_h * stride_h (and the same along w). */
__global__ void col2im_kernel(Col2im a, uint32_t count, const float *col, float *dx) {
    const gc_conv2d_desc &d = a.d;
    const uint32_t step = gridDim.x * blockDim.x;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step) {
        const uint32_t row = a.width.quotient(i), iw = i - row * a.width.divisor;
        const uint32_t plane = a.height.quotient(row), ih = row - plane * a.height.divisor;
        const uint32_t image = a.channels.quotient(plane), ci = plane - image * a.channels.divisor;
        const float *image_col = col + (int64_t)image * d.out_h * d.out_w;
        float sum = 0.0f;
        for (int32_t ki = 0; ki < (int32_t)d.kh; ++ki) {
            const int32_t oh_scaled = (int32_t)(ih + d.pad_h - ki * d.dilation_h);
            if (oh_scaled < 0) continue;
            const uint32_t oh = a.stride_h.quotient((uint32_t)oh_scaled);
            if (oh * a.stride_h.divisor != (uint32_t)oh_scaled || oh >= (uint32_t)d.out_h) continue;
            for (int32_t kj = 0; kj < (int32_t)d.kw; ++kj) {
                const int32_t ow_scaled = (int32_t)(iw + d.pad_w - kj * d.dilation_w);
                if (ow_scaled < 0) continue;
                const uint32_t ow = a.stride_w.quotient((uint32_t)ow_scaled);
                if (ow * a.stride_w.divisor != (uint32_t)ow_scaled || ow >= (uint32_t)d.out_w)
                    continue;
                sum += image_col[(((int64_t)ci * d.kh + ki) * d.kw + kj) * a.columns +
                                 oh * d.out_w + ow];
            }
        }
        dx[i] = sum;
    }
}

/* The strided input gradient: per pass one dy copy, one GEMM (the groups as its batch) and
 * one col2im launch. The caller has checked the descriptor, pointers and workspace. */
gc_status strided_dgrad(const gc_conv2d_desc &d, const float *dy, const float *weight,
                        float *dx, float *workspace, gc_stream stream, const char *fn) {
    const int64_t c_out_g = d.c_out / d.groups, k = (d.c_in / d.groups) * d.kh * d.kw;
    const int64_t p_count = d.out_h * d.out_w, dx_image = d.c_in * d.h * d.w;
    const int64_t per_pass = dgrad_images_per_pass(d);
    const int64_t largest = std::max(dx_image, d.c_out * p_count) * per_pass;
    if (largest >= ((int64_t)1 << 31) || d.h + d.pad_h >= ((int64_t)1 << 31) ||
        d.w + d.pad_w >= ((int64_t)1 << 31))
        return gc_fail(GC_ERROR_NOT_SUPPORTED, "%s: a pass of %lld images holds %lld elements "
                       "of dx or dy, past the 2^31 this kernel counts; split the batch", fn,
                       (long long)per_pass, (long long)largest);
    float *col = workspace, *dy_rows = workspace + dgrad_column_floats(d);
    Col2im a;
    a.d = d;
    a.width = FastDivisor::of(d.w);
    a.height = FastDivisor::of(d.h);
    a.channels = FastDivisor::of(d.c_in);
    a.stride_h = FastDivisor::of(d.stride_h);
    a.stride_w = FastDivisor::of(d.stride_w);
    const FastDivisor plane = FastDivisor::of(p_count), channels = FastDivisor::of(d.c_out);
    for (int64_t image0 = 0; image0 < d.n; image0 += per_pass) {
        const int64_t images = d.n - image0 < per_pass ? d.n - image0 : per_pass;
        const int64_t columns = images * p_count, dy_count = images * d.c_out * p_count;
        GC_LAUNCH(dy_rows_kernel, grid_1d(dy_count), dim3(kThreads, 1, 1), 0, stream)(
            plane, channels, (uint32_t)images, (uint32_t)dy_count, dy + image0 * d.c_out * p_count,
            dy_rows);
        GC_CHECK_LAUNCH(fn);
        /* op(A) = W_g^T (k x c_out_g): W_g is stored (c_out_g, k), so A is transposed */
        GC_TRY(gc_gemm_strided_batched_f32(1, 0, k, columns, c_out_g, 1.0f, weight, k,
                                           c_out_g * k, dy_rows, columns, c_out_g * columns,
                                           0.0f, col, columns, k * columns, d.groups, stream));
        a.columns = columns;
        GC_LAUNCH(col2im_kernel, grid_1d(images * dx_image), dim3(kThreads, 1, 1), 0, stream)(
            a, (uint32_t)(images * dx_image), col, dx + image0 * dx_image);
        GC_CHECK_LAUNCH(fn);
    }
    return GC_SUCCESS;
}

} /* namespace */

#endif /* GC_CONV_STRIDED_DGRAD_CUH */
