/* test_kernels_conv.cu: the conv2d entries against direct double-precision loops: forward
 * through im2col + GEMM and through the implicit GEMM (with and without bias; split-K when
 * its tiles are few, bit-identical on a rerun), backward data (implicit for stride 1, split-K
 * when its tiles are few; for stride > 1 a copy of dy into rows, one GEMM over every
 * image's columns, then one col2im), backward filter (over a batch: overwritten, not accumulated; explicit columns and
 * one batched GEMM, split along N*P when long, in passes past the column budget: 64 KiB in
 * the emulation, so small shapes take several; bit-identical on a rerun) and the bias
 * gradient, with stride, padding, dilation and groups (depthwise included); then descriptor,
 * workspace and pointer errors.
 */
#include "test_kernels_util.h"

using test::Device;

namespace {

/* whether the CUDA build runs this pass through cuDNN (gc_conv2d_provider names it first) */
bool by_cudnn(const gc_conv2d_desc *d, gc_conv2d_pass pass) {
    return strncmp(gc_conv2d_provider(d, pass), "cuDNN", 5) == 0;
}

struct Conv {
    gc_conv2d_desc d;
    int64_t x_size() const { return d.n * d.c_in * d.h * d.w; }
    int64_t w_size() const { return d.c_out * (d.c_in / d.groups) * d.kh * d.kw; }
    int64_t y_size() const { return d.n * d.c_out * d.out_h * d.out_w; }
};

gc_conv2d_desc make_desc(int64_t n, int64_t c_in, int64_t h, int64_t w, int64_t c_out,
                         int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                         int64_t dh, int64_t dw, int64_t groups) {
    gc_conv2d_desc d = {n, c_in, h, w, c_out, kh, kw, sh, sw, ph, pw, dh, dw, groups, 0, 0};
    return d;
}

/* Visits every (output, tap) pair: f(x index, weight index, y index). */
template <class F>
void for_each_tap(const gc_conv2d_desc &d, F f) {
    const int64_t cin_g = d.c_in / d.groups, cout_g = d.c_out / d.groups;
    for (int64_t b = 0; b < d.n; ++b)
        for (int64_t co = 0; co < d.c_out; ++co)
            for (int64_t oh = 0; oh < d.out_h; ++oh)
                for (int64_t ow = 0; ow < d.out_w; ++ow)
                    for (int64_t ci = 0; ci < cin_g; ++ci)
                        for (int64_t ki = 0; ki < d.kh; ++ki)
                            for (int64_t kj = 0; kj < d.kw; ++kj) {
                                const int64_t ih = oh * d.stride_h - d.pad_h + ki * d.dilation_h;
                                const int64_t iw = ow * d.stride_w - d.pad_w + kj * d.dilation_w;
                                if (ih < 0 || ih >= d.h || iw < 0 || iw >= d.w) continue;
                                const int64_t channel = (co / cout_g) * cin_g + ci;
                                f(((b * d.c_in + channel) * d.h + ih) * d.w + iw,
                                  ((co * cin_g + ci) * d.kh + ki) * d.kw + kj,
                                  ((b * d.c_out + co) * d.out_h + oh) * d.out_w + ow);
                            }
}

void run_conv(gc_conv2d_desc desc, uint64_t seed, const char *name) {
    EXPECT_OK(gc_conv2d_check(&desc));
    const Conv c{desc};
    const gc_conv2d_desc &d = c.d;
    const std::vector<float> x = test::random_floats(c.x_size(), seed);
    const std::vector<float> w = test::random_floats(c.w_size(), seed + 1);
    const std::vector<float> bias = test::random_floats(d.c_out, seed + 2);
    const std::vector<float> dy = test::random_floats(c.y_size(), seed + 3);
    std::vector<double> y_ref(c.y_size()), dx_ref(c.x_size(), 0.0), dw_ref(c.w_size(), 0.0);
    std::vector<double> db_ref(d.c_out, 0.0);
    for_each_tap(d, [&](int64_t xi, int64_t wi, int64_t yi) {
        y_ref[yi] += (double)x[xi] * w[wi];
        dx_ref[xi] += (double)dy[yi] * w[wi];
        dw_ref[wi] += (double)dy[yi] * x[xi];
    });
    std::vector<double> y_bias_ref(y_ref);
    const int64_t p = d.out_h * d.out_w;
    for (int64_t i = 0; i < c.y_size(); ++i) {
        y_bias_ref[i] += bias[(i / p) % d.c_out];
        db_ref[(i / p) % d.c_out] += dy[i];
    }

    /* where cuDNN runs a pass (the CUDA build, vendor_dnn.h), the workspace is the larger of
     * its need and graphc's kernels': at least what graphc's kernels need */
    const bool dnn_fwd = by_cudnn(&d, GC_CONV2D_FWD_IMPLICIT);
    int64_t ws_bytes = -1;
    EXPECT_OK(gc_conv2d_workspace_size(&d, GC_CONV2D_FWD_IM2COL, &ws_bytes));
    const int64_t column_bytes = d.c_in * d.kh * d.kw * p * 4;
    TEST_CHECK(dnn_fwd ? ws_bytes >= column_bytes : ws_bytes == column_bytes,
               "%s: workspace %lld bytes", name, (long long)ws_bytes);
    int64_t implicit_bytes = -1;
    EXPECT_OK(gc_conv2d_workspace_size(&d, GC_CONV2D_FWD_IMPLICIT, &implicit_bytes));
    TEST_CHECK(dnn_fwd || implicit_bytes == 0 || implicit_bytes % (c.y_size() * 4) == 0,
               "%s: the implicit GEMM's workspace (%lld bytes) is none or whole split-K "
               "partials of y", name, (long long)implicit_bytes);
    Device<float> dxv(x), dwv(w), dbias(bias), ddy(dy), ws(ws_bytes / 4 + 1, NAN);
    Device<float> implicit_ws(implicit_bytes / 4 + 1, NAN);
    char what[160];
    const double rtol = 1e-5, atol = 1e-5 * (double)(d.kh * d.kw * d.c_in);

    Device<float> y1(c.y_size(), NAN), y2(c.y_size(), NAN), y3(c.y_size(), NAN);
    EXPECT_OK(gc_conv2d_fwd_f32(&d, GC_CONV2D_FWD_IM2COL, dxv.ptr, dwv.ptr, dbias.ptr, y1.ptr,
                                ws.ptr, ws_bytes, nullptr));
    snprintf(what, sizeof what, "%s: forward im2col + bias", name);
    test::all_close(y1.get(), y_bias_ref, rtol, atol, what);
    EXPECT_OK(gc_conv2d_fwd_f32(&d, GC_CONV2D_FWD_IMPLICIT, dxv.ptr, dwv.ptr, dbias.ptr, y2.ptr,
                                implicit_ws.ptr, implicit_bytes, nullptr));
    snprintf(what, sizeof what, "%s: forward implicit + bias", name);
    test::all_close(y2.get(), y_bias_ref, rtol, atol, what);
    EXPECT_OK(gc_conv2d_fwd_f32(&d, GC_CONV2D_FWD_IMPLICIT, dxv.ptr, dwv.ptr, nullptr, y3.ptr,
                                implicit_ws.ptr, implicit_bytes, nullptr));
    const std::vector<float> first = y3.get();
    EXPECT_OK(gc_conv2d_fwd_f32(&d, GC_CONV2D_FWD_IMPLICIT, dxv.ptr, dwv.ptr, nullptr, y3.ptr,
                                implicit_ws.ptr, implicit_bytes, nullptr));
    TEST_CHECK(memcmp(first.data(), y3.get().data(), first.size() * 4) == 0,
               "%s: a rerun of the implicit forward is not bit-identical", name);
    snprintf(what, sizeof what, "%s: forward implicit, no bias", name);
    test::all_close(y3.get(), y_ref, rtol, atol, what);

    Device<float> dx(c.x_size(), NAN), dw(c.w_size(), NAN), db(d.c_out, NAN);
    int64_t data_bytes = -1;
    EXPECT_OK(gc_conv2d_workspace_size(&d, GC_CONV2D_BWD_DATA, &data_bytes));
    /* every image's column matrix (rounded to 64 floats), then every image's dy rows: one
     * pass */
    const int64_t strided_bytes = (d.n * column_bytes + 255) / 256 * 256 + c.y_size() * 4;
    if ((d.stride_h > 1 || d.stride_w > 1) && !by_cudnn(&d, GC_CONV2D_BWD_DATA))
        TEST_CHECK(data_bytes == strided_bytes, "%s: input-gradient workspace %lld bytes, "
                   "expected %lld", name, (long long)data_bytes, (long long)strided_bytes);
    Device<float> data_ws(data_bytes / 4 + 1, NAN);
    EXPECT_OK(gc_conv2d_bwd_data_f32(&d, ddy.ptr, dwv.ptr, dx.ptr, data_ws.ptr, data_bytes,
                                     nullptr));
    snprintf(what, sizeof what, "%s: backward data", name);
    const std::vector<float> dx_first = dx.get();
    test::all_close(dx_first, dx_ref, rtol, atol, what);
    EXPECT_OK(gc_conv2d_bwd_data_f32(&d, ddy.ptr, dwv.ptr, dx.ptr, data_ws.ptr, data_bytes,
                                     nullptr));
    TEST_CHECK(memcmp(dx_first.data(), dx.get().data(), dx_first.size() * 4) == 0,
               "%s: a rerun of the input gradient is not bit-identical", name);
    int64_t filter_bytes = -1;
    EXPECT_OK(gc_conv2d_workspace_size(&d, GC_CONV2D_BWD_FILTER, &filter_bytes));
    Device<float> filter_ws(filter_bytes / 4 + 1, NAN);
    EXPECT_OK(gc_conv2d_bwd_filter_f32(&d, dxv.ptr, ddy.ptr, dw.ptr, filter_ws.ptr, filter_bytes,
                                       nullptr));
    snprintf(what, sizeof what, "%s: backward filter", name);
    const std::vector<float> dw_first = dw.get();
    test::all_close(dw_first, dw_ref, rtol, 1e-5 * (double)(d.n * p), what);
    EXPECT_OK(gc_conv2d_bwd_filter_f32(&d, dxv.ptr, ddy.ptr, dw.ptr, filter_ws.ptr, filter_bytes,
                                       nullptr));
    TEST_CHECK(memcmp(dw_first.data(), dw.get().data(), dw_first.size() * 4) == 0,
               "%s: a rerun of the weight gradient is not bit-identical", name);
    EXPECT_OK(gc_conv2d_bwd_bias_f32(&d, ddy.ptr, db.ptr, nullptr));
    snprintf(what, sizeof what, "%s: backward bias", name);
    test::all_close(db.get(), db_ref, rtol, 1e-5 * (double)(d.n * p), what);
}

void test_errors() {
    const gc_status bad = GC_ERROR_INVALID_ARGUMENT;
    gc_conv2d_desc d = make_desc(1, 4, 5, 5, 6, 3, 3, 1, 1, 0, 0, 1, 1, 3);
    test::expect_status(gc_conv2d_check(&d), bad, "gc_conv2d_check", "groups not dividing c_in");
    d = make_desc(1, 2, 3, 3, 2, 5, 5, 1, 1, 0, 0, 1, 1, 1);
    test::expect_status(gc_conv2d_check(&d), bad, "gc_conv2d_check", "kernel larger than input");
    d = make_desc(1, 2, 5, 5, 2, 3, 3, 0, 1, 0, 0, 1, 1, 1);
    test::expect_status(gc_conv2d_check(&d), bad, "gc_conv2d_check", "zero stride");
    d = make_desc(1, 2, 5, 5, 2, 3, 3, 1, 1, -1, 0, 1, 1, 1);
    test::expect_status(gc_conv2d_check(&d), bad, "gc_conv2d_check", "negative padding");
    test::expect_status(gc_conv2d_check(nullptr), bad, "gc_conv2d_check", "NULL desc");

    d = make_desc(2, 2, 5, 5, 2, 3, 3, 2, 2, 1, 1, 1, 1, 1);
    EXPECT_OK(gc_conv2d_check(&d));
    TEST_CHECK(d.out_h == 3 && d.out_w == 3, "out size %lldx%lld, expected 3x3",
               (long long)d.out_h, (long long)d.out_w);
    int64_t bytes = 0, data_bytes = 0;
    EXPECT_OK(gc_conv2d_workspace_size(&d, GC_CONV2D_FWD_IM2COL, &bytes));
    EXPECT_OK(gc_conv2d_workspace_size(&d, GC_CONV2D_BWD_DATA, &data_bytes));
    test::expect_status(gc_conv2d_workspace_size(&d, (gc_conv2d_pass)7, &bytes), bad,
                        "gc_conv2d_workspace_size", "bad pass");
    Device<float> x(2 * 2 * 25, 1.0f), w(2 * 2 * 9, 1.0f), y(2 * 2 * 9, 0.0f), ws(bytes / 4, 0.0f);
    test::expect_status(gc_conv2d_fwd_f32(&d, GC_CONV2D_FWD_IM2COL, x.ptr, w.ptr, nullptr, y.ptr,
                                          ws.ptr, bytes - 4, nullptr),
                        GC_ERROR_WORKSPACE, "gc_conv2d_fwd_f32", "workspace too small");
    test::expect_status(gc_conv2d_bwd_data_f32(&d, y.ptr, w.ptr, x.ptr, nullptr, 0, nullptr),
                        GC_ERROR_WORKSPACE, "gc_conv2d_bwd_data_f32", "no workspace");
    {   /* the strided input gradient takes both images' column matrices */
        Device<float> data_ws(data_bytes / 4, 0.0f);
        test::expect_status(gc_conv2d_bwd_data_f32(&d, y.ptr, w.ptr, x.ptr, data_ws.ptr,
                                                   data_bytes - 4, nullptr),
                            GC_ERROR_WORKSPACE, "gc_conv2d_bwd_data_f32",
                            "workspace of one image short");
    }
    {   /* a weight gradient long enough to split needs its partials' workspace */
        gc_conv2d_desc big = make_desc(4, 1, 40, 40, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1);
        EXPECT_OK(gc_conv2d_check(&big));
        int64_t filter_bytes = 0;
        EXPECT_OK(gc_conv2d_workspace_size(&big, GC_CONV2D_BWD_FILTER, &filter_bytes));
        TEST_CHECK(filter_bytes > 0, "a split weight gradient needs a workspace, got %lld bytes",
                   (long long)filter_bytes);
        Device<float> bx(4 * 1600, 1.0f), bdy(4 * 1600, 1.0f), bw(9, 0.0f);
        test::expect_status(gc_conv2d_bwd_filter_f32(&big, bx.ptr, bdy.ptr, bw.ptr, nullptr, 0,
                                                     nullptr),
                            GC_ERROR_WORKSPACE, "gc_conv2d_bwd_filter_f32", "no workspace");
    }
    test::expect_status(gc_conv2d_fwd_f32(&d, GC_CONV2D_BWD_DATA, x.ptr, w.ptr, nullptr, y.ptr,
                                          ws.ptr, bytes, nullptr),
                        bad, "gc_conv2d_fwd_f32", "a backward pass given to the forward");
    test::expect_status(gc_conv2d_fwd_f32(&d, GC_CONV2D_FWD_IMPLICIT, nullptr, w.ptr, nullptr,
                                          y.ptr, nullptr, 0, nullptr),
                        bad, "gc_conv2d_fwd_f32", "NULL x");
    gc_conv2d_desc stale = d;
    stale.out_h = 4;
    test::expect_status(gc_conv2d_bwd_data_f32(&stale, y.ptr, w.ptr, x.ptr, ws.ptr,
                                               data_bytes, nullptr),
                        bad, "gc_conv2d_bwd_data_f32", "out_h not what the geometry gives");
    test::expect_status(gc_conv2d_bwd_bias_f32(&d, y.ptr, nullptr, nullptr), bad,
                        "gc_conv2d_bwd_bias_f32", "NULL dbias");
}

} /* namespace */

int main() {
    run_conv(make_desc(2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1), 10, "3x3 pad 1");
    run_conv(make_desc(2, 4, 9, 8, 6, 3, 2, 2, 1, 1, 2, 2, 1, 2), 20,
             "3x2 stride 2x1 pad 1x2 dilation 2x1 groups 2");
    run_conv(make_desc(1, 3, 8, 7, 3, 2, 2, 3, 2, 0, 1, 1, 2, 3), 30, "depthwise stride 3x2");
    run_conv(make_desc(3, 5, 4, 4, 7, 1, 1, 1, 1, 0, 0, 1, 1, 1), 40, "1x1 odd channels");
    /* N*P = 3 * 29 * 23 pixels: the weight gradient splits them (3 splits of 672, partials in
     * the workspace, the last split 15 pixels short), 3 passes in the emulation; out_w = 23:
     * runs of 4 pixels cross row and image ends */
    run_conv(make_desc(3, 2, 31, 25, 3, 3, 3, 1, 1, 0, 0, 1, 1, 1), 50, "weight grad split");
    /* the weight gradient: 2 splits in one pass (1150 pixels, the last split 574); 2 splits
     * of 544 in 3 passes of 184, 184, 176 with groups 2 and stride 2; depthwise, 2 splits in
     * 3 passes (the emulation's column budget; one pass on a GPU) */
    run_conv(make_desc(2, 1, 25, 27, 2, 3, 3, 1, 1, 0, 0, 1, 1, 1), 53,
             "weight grad 2 splits, one pass, odd sizes");
    run_conv(make_desc(4, 4, 33, 31, 6, 3, 3, 2, 2, 1, 1, 1, 1, 2), 56,
             "weight grad 2 splits, 3 passes, stride 2, groups 2");
    run_conv(make_desc(2, 3, 24, 24, 3, 3, 3, 1, 1, 1, 1, 1, 1, 3), 58,
             "weight grad depthwise, 2 splits, 3 passes");
    /* on a GPU (a 64 MiB column budget): 9 * 2^20 pixels, 256 splits of 36864, whose 72 MiB
     * of columns take 2 passes; far too slow for the emulation, which takes passes above */
    if (strcmp(gc_runtime_kind(), "cuda") == 0)
        run_conv(make_desc(9, 1, 1024, 1024, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1), 59,
                 "weight grad 2 passes of a GPU's budget, 1x1");
    run_conv(make_desc(2, 2, 9, 3, 5, 3, 3, 2, 2, 1, 1, 1, 1, 1), 60, "out_w 2: short rows");
    /* stride 1: the input gradient is the implicit transposed-convolution GEMM */
    run_conv(make_desc(2, 4, 9, 7, 6, 3, 2, 1, 1, 1, 2, 2, 1, 2), 70,
             "stride 1 dilation 2x1 pad 1x2 groups 2 (implicit input gradient)");
    /* stride > 1: the input gradient is one GEMM over every image's columns + one col2im;
     * P = 4 (float4 loads of dy), P = 3 and P = 1 (4 columns cross images) */
    run_conv(make_desc(3, 6, 8, 8, 4, 3, 3, 2, 2, 1, 1, 1, 1, 2), 80,
             "stride 2 pad 1 groups 2, P 16, 3 images");
    run_conv(make_desc(5, 3, 7, 5, 4, 3, 3, 3, 2, 1, 0, 1, 1, 1), 90,
             "stride 3x2 pad 1x0 odd sizes, P 3x2, 5 images");
    run_conv(make_desc(6, 4, 5, 5, 6, 2, 2, 3, 3, 0, 0, 2, 2, 2), 100,
             "stride 3 dilation 2 groups 2, P 1, 6 images");
    /* split-K (tiles far fewer than the emulation's 132 SMs, K >= 256): the implicit forward
     * (K = 44 * 9 = 396: 3 splits of 136, the last 124) and the stride-1 input gradient
     * (K' = 44 * 9: 3 splits), partials added in split order, bias in the sum */
    run_conv(make_desc(2, 88, 5, 6, 88, 3, 3, 1, 1, 1, 1, 1, 1, 2), 110,
             "split-K groups 2 pad 1 odd sizes");
    run_conv(make_desc(3, 40, 6, 5, 36, 3, 3, 1, 1, 2, 1, 2, 1, 1), 120,
             "split-K dilation 2x1 pad 2x1, K 360, K' 324");
    run_conv(make_desc(2, 64, 7, 7, 24, 2, 2, 2, 2, 0, 0, 1, 1, 1), 130,
             "split-K forward stride 2 (K 256), strided input gradient");
    test_errors();
    return test::finish("test_kernels_conv");
}
