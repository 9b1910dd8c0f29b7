/* conv_strided_dgrad.cuh: the input gradient of a strided convolution (stride > 1), included
 * by conv.cu only (it uses conv.cu's gc_conv2d_desc helpers and the tile kernel).
 *
 * The images of a pass are GEMM columns, so one GEMM per group covers them all:
 *   col_g[K, I*P] = W_g^T[K, c_out/groups] @ dy_g[c_out/groups, I*P]
 * with K = (c_in/groups) * kh * kw, P = out_h * out_w and I the images of the pass; dy is read
 * in place (DyColumns), the column matrices of all groups stack into one
 * col[c_in * kh * kw, I*P] in the workspace, and ONE col2im launch gathers dx for all I images
 * (each dx element sums the column entries that read it: deterministic, no atomics).
 * A pass takes as many images as fit kDgradWorkspaceBudget (at least one), so the workspace
 * is a function of the shape alone: images_per_pass * c_in * kh * kw * P floats.
 * Invariants: a column matrix row is (ci * kh + ki) * kw + kj with ci the full input channel;
 * column = image * P + oh * out_w + ow within the pass.
 */
#ifndef GC_CONV_STRIDED_DGRAD_CUH
#define GC_CONV_STRIDED_DGRAD_CUH

namespace {

/* Workspace the strided input gradient may take before it runs its images in several passes
 * (each pass a GEMM launch and a col2im launch). */
constexpr int64_t kDgradWorkspaceBudget = (int64_t)64 << 20;

/* How many images one pass of the strided input gradient covers: all of them when their
 * column matrices fit kDgradWorkspaceBudget, else as many as fit, at least one. */
inline int64_t dgrad_images_per_pass(const gc_conv2d_desc &d) {
    const int64_t per_image = d.c_in * d.kh * d.kw * d.out_h * d.out_w * (int64_t)sizeof(float);
    int64_t images = per_image > 0 ? kDgradWorkspaceBudget / per_image : d.n;
    if (images < 1) images = 1;
    return images < d.n ? images : d.n;
}

inline int64_t strided_dgrad_workspace_bytes(const gc_conv2d_desc &d) {
    return dgrad_images_per_pass(d) * d.c_in * d.kh * d.kw * d.out_h * d.out_w *
           (int64_t)sizeof(float);
}

/* dy of one group over a pass's images as the B operand (c_out/groups x I*P), read in place:
 * row co, column image * P + p is dy[image][channel0 + co][p]. */
struct DyColumns {
    static constexpr bool K_CONTIGUOUS = false; /* 4 consecutive pixels per load */
    static constexpr int MIN_BLOCKS = 1; /* with 2, ptxas spills on sm_90 */
    gc_conv2d_desc d;
    const float *dy;   /* at the pass's first image */
    int64_t columns;   /* I * P */
    bool vector_loads; /* P % 4 == 0 and dy 16-byte aligned: 4 columns are one float4 */
    int64_t channel0;  /* first output channel of the selected group */

    __device__ void select(int64_t group) { channel0 = group * (d.c_out / d.groups); }

    struct Cursor {
        const float *at; /* dy at (the first column's image, channel0 + co, p) */
        int32_t p;       /* the first column's pixel in its image */
        int32_t left;    /* 8 * (rows of the GEMM left from the current co) + the columns
                          * (0..4) inside the matrix: >= 8 <=> a row is left (one register) */
    };

    __device__ Cursor start(int64_t co, int64_t column) const {
        const int64_t p_count = d.out_h * d.out_w, inside = column < columns ? column : 0;
        Cursor c;
        c.p = (int32_t)(inside % p_count);
        c.at = dy + ((inside / p_count) * d.c_out + channel0 + co) * p_count + c.p;
        const int64_t cols = columns - column;
        c.left = (int32_t)(d.c_out / d.groups - co) * 8 +
                 (cols < 0 ? 0 : cols > 4 ? 4 : (int32_t)cols);
        return c;
    }

    __device__ void advance(Cursor &c) const {
        c.at += kTileK * d.out_h * d.out_w;
        c.left -= 8 * kTileK;
    }

    __device__ void load4(const Cursor &c, float (&v)[4]) const {
        GC_UNROLL
        for (int i = 0; i < 4; ++i) v[i] = 0.0f;
        if (c.left < 8) return;
        const int32_t cols = c.left & 7;
        if (vector_loads && cols == 4) { /* p % 4 == 0 and P % 4 == 0: one image */
            const float4 q = *reinterpret_cast<const float4 *>(c.at);
            v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
            return;
        }
        const int64_t p_count = d.out_h * d.out_w;
        GC_UNROLL
        for (int i = 0; i < 4; ++i) {
            if (i >= cols) continue;
            const float *a = c.at + i;
            for (int64_t q = c.p + i; q >= p_count; q -= p_count) /* into the next image */
                a += (d.c_out - 1) * p_count;
            v[i] = *a;
        }
    }
};

/* dx of a pass's images from the stacked column matrices: the transpose of im2col. */
__global__ void col2im_kernel(gc_conv2d_desc d, int64_t images, const float *col, float *dx) {
    const int64_t p_count = d.out_h * d.out_w, columns = images * p_count;
    const int64_t image_size = d.c_in * d.h * d.w, total = images * image_size;
    for (int64_t i = global_thread_index(); i < total; i += global_thread_count()) {
        const int64_t image = i / image_size, at = i % image_size;
        const int64_t iw = at % d.w, ih = (at / d.w) % d.h, ci = at / (d.w * d.h);
        const float *image_col = col + image * p_count;
        float sum = 0.0f;
        for (int64_t ki = 0; ki < d.kh; ++ki) {
            const int64_t oh_scaled = ih + d.pad_h - ki * d.dilation_h;
            if (oh_scaled < 0 || oh_scaled % d.stride_h != 0) continue;
            const int64_t oh = oh_scaled / d.stride_h;
            if (oh >= d.out_h) continue;
            for (int64_t kj = 0; kj < d.kw; ++kj) {
                const int64_t ow_scaled = iw + d.pad_w - kj * d.dilation_w;
                if (ow_scaled < 0 || ow_scaled % d.stride_w != 0) continue;
                const int64_t ow = ow_scaled / d.stride_w;
                if (ow >= d.out_w) continue;
                sum += image_col[((ci * d.kh + ki) * d.kw + kj) * columns + oh * d.out_w + ow];
            }
        }
        dx[i] = sum;
    }
}

/* The strided input gradient: per pass one GEMM launch (the groups as its batch) and one
 * col2im launch. The caller has checked the descriptor, pointers and workspace. */
gc_status strided_dgrad(const gc_conv2d_desc &d, const float *dy, const float *weight,
                        float *dx, float *col, gc_stream stream, const char *fn) {
    const int64_t c_out_g = d.c_out / d.groups, k = (d.c_in / d.groups) * d.kh * d.kw;
    const int64_t p_count = d.out_h * d.out_w, dx_image = d.c_in * d.h * d.w;
    const int64_t per_pass = dgrad_images_per_pass(d);
    /* op(A) = W_g^T (k x c_out_g): W_g is stored (c_out_g, k), so A is transposed */
    const auto op_wt = matrix_operand<false>(weight, k, c_out_g * k, c_out_g, k);
    for (int64_t image0 = 0; image0 < d.n; image0 += per_pass) {
        const int64_t images = d.n - image0 < per_pass ? d.n - image0 : per_pass;
        const int64_t columns = images * p_count;
        const float *dy_pass = dy + image0 * d.c_out * p_count;
        const DyColumns op_dy{d, dy_pass, columns,
                              p_count % 4 == 0 && (uintptr_t)dy_pass % 16 == 0, 0};
        const MatrixOutput out = matrix_output(col, columns, k * columns, k, columns, 1.0f,
                                               0.0f, nullptr, 0);
        GC_TRY(launch_gemm_tiles(op_wt, op_dy, out, k, columns, c_out_g, d.groups, stream, fn));
        GC_LAUNCH(col2im_kernel, grid_1d(images * dx_image), dim3(kThreads, 1, 1), 0, stream)(
            d, images, col, dx + image0 * dx_image);
        GC_CHECK_LAUNCH(fn);
    }
    return GC_SUCCESS;
}

} /* namespace */

#endif /* GC_CONV_STRIDED_DGRAD_CUH */
