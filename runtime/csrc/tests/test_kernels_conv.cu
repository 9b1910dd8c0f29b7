/* test_kernels_conv.cu: the conv2d entries against direct double-precision loops: forward
 * through im2col + GEMM and through the implicit GEMM (with and without bias; split-K when
 * its tiles are few, bit-identical on a rerun), backward data (implicit for stride 1, split-K
 * when its tiles are few; for stride > 1 a copy of dy into rows, one GEMM over every
 * image's columns, then one col2im), backward filter (over a batch: overwritten, not accumulated; explicit columns and
 * one batched GEMM, split along N*P when long, in passes past the column budget: 64 KiB in
 * the emulation, so small shapes take several; bit-identical on a rerun) and the bias
 * gradient, with stride, padding, dilation and groups (depthwise included); the implicit
 * GEMMs' 64-row tiles (at most 64 GEMM rows) and 128-row ones, split-K on and off, and the
 * two tile shapes bit-identical on the channels they share; then descriptor, workspace and
 * pointer errors.
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

/* The first 64 channels of a forward (c_out 64 against 65) and of a stride-1 input gradient
 * (c_in 64 against 65), the 65th channel's weights appended: 64 rows run the 64-row tile
 * kernel, 65 the 128-row one, and both sum each output's products in the same order, with
 * the same split-K (the tiles along the columns are as many), so the shared channels must be
 * bit-identical. `other`: the channels on the far side (K = other * 9: split-K from 256). */
void test_tile_shapes_agree(int64_t n, int64_t other, int64_t h, int64_t w, uint64_t seed,
                            const char *name) {
    gc_conv2d_desc fwd[2], bwd[2];
    for (int wide = 0; wide < 2; ++wide) {
        fwd[wide] = make_desc(n, other, h, w, 64 + wide, 3, 3, 1, 1, 1, 1, 1, 1, 1);
        bwd[wide] = make_desc(n, 64 + wide, h, w, other, 3, 3, 1, 1, 1, 1, 1, 1, 1);
        EXPECT_OK(gc_conv2d_check(&fwd[wide]));
        EXPECT_OK(gc_conv2d_check(&bwd[wide]));
    }
    if (by_cudnn(&fwd[0], GC_CONV2D_FWD_IMPLICIT) || by_cudnn(&fwd[1], GC_CONV2D_FWD_IMPLICIT) ||
        by_cudnn(&bwd[0], GC_CONV2D_BWD_DATA) || by_cudnn(&bwd[1], GC_CONV2D_BWD_DATA)) {
        printf("test_tile_shapes_agree %s: skipped, cuDNN runs one of the passes\n", name);
        return;
    }
    const int64_t plane = h * w, taps = 9;
    const std::vector<float> x = test::random_floats(n * other * plane, seed);
    const std::vector<float> dy = test::random_floats(n * other * plane, seed + 1);
    /* forward weights (c_out, other, 3, 3): channel 64 appended at the end */
    const std::vector<float> w_fwd = test::random_floats(65 * other * taps, seed + 2);
    /* input-gradient weights (other, c_in, 3, 3): c_in 64 is w_bwd without each row's last
     * channel */
    const std::vector<float> w_bwd = test::random_floats(other * 65 * taps, seed + 3);
    std::vector<float> w_bwd64;
    for (int64_t co = 0; co < other; ++co)
        w_bwd64.insert(w_bwd64.end(), w_bwd.begin() + co * 65 * taps,
                       w_bwd.begin() + (co * 65 + 64) * taps);
    std::vector<float> y[2], dx[2];
    for (int wide = 0; wide < 2; ++wide) {
        int64_t bytes = -1;
        EXPECT_OK(gc_conv2d_workspace_size(&fwd[wide], GC_CONV2D_FWD_IMPLICIT, &bytes));
        Device<float> dxv(x), dw(w_fwd), out(n * (64 + wide) * plane, NAN), ws(bytes / 4 + 1);
        EXPECT_OK(gc_conv2d_fwd_f32(&fwd[wide], GC_CONV2D_FWD_IMPLICIT, dxv.ptr, dw.ptr, nullptr,
                                    out.ptr, ws.ptr, bytes, nullptr));
        y[wide] = out.get();
        EXPECT_OK(gc_conv2d_workspace_size(&bwd[wide], GC_CONV2D_BWD_DATA, &bytes));
        Device<float> ddy(dy), dwt(wide ? w_bwd : w_bwd64), grad(n * (64 + wide) * plane, NAN);
        Device<float> data_ws(bytes / 4 + 1);
        EXPECT_OK(gc_conv2d_bwd_data_f32(&bwd[wide], ddy.ptr, dwt.ptr, grad.ptr, data_ws.ptr,
                                         bytes, nullptr));
        dx[wide] = grad.get();
    }
    int64_t forward_differ = 0, data_differ = 0;
    for (int64_t b = 0; b < n; ++b)
        for (int64_t c = 0; c < 64; ++c)
            for (int64_t p = 0; p < plane; ++p) {
                const int64_t narrow = (b * 64 + c) * plane + p, wide = (b * 65 + c) * plane + p;
                forward_differ += memcmp(&y[0][narrow], &y[1][wide], 4) != 0;
                data_differ += memcmp(&dx[0][narrow], &dx[1][wide], 4) != 0;
            }
    TEST_CHECK(forward_differ == 0, "%s: %lld forward outputs of the 64-row tiles differ from "
               "the 128-row tiles'", name, (long long)forward_differ);
    TEST_CHECK(data_differ == 0, "%s: %lld input-gradient outputs of the 64-row tiles differ "
               "from the 128-row tiles'", name, (long long)data_differ);
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
    /* 64-row tiles (the GEMM's rows, c_out/groups forward and c_in/groups for the stride-1
     * input gradient, <= 64) and 128-row ones (65 and up), split-K on and off in each:
     * c_out 64, K 45 (forward: 64 rows, no split; input gradient: 5 rows, K' 576 split);
     * c_in 64, c_out 20 (forward: K 576 split; input gradient: 64 rows, K' 180, no split);
     * 65 both ways (128 rows, both split); 70 rows with K 27 / K' 27 (128 rows, no split);
     * groups 2 of 64 output and 65 input channels (forward 64 rows, input gradient 65) */
    run_conv(make_desc(2, 5, 6, 7, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1), 140,
             "64 output channels: 64-row tiles, forward unsplit, odd sizes");
    run_conv(make_desc(2, 64, 5, 6, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1), 150,
             "64 input channels: 64-row tiles, input gradient unsplit");
    run_conv(make_desc(1, 65, 5, 5, 65, 3, 3, 1, 1, 1, 1, 1, 1, 1), 160,
             "65 channels: 128-row tiles, split-K");
    run_conv(make_desc(1, 3, 6, 5, 70, 3, 3, 1, 1, 1, 1, 1, 1, 1), 170,
             "70 output channels: 128-row tiles, forward unsplit");
    run_conv(make_desc(1, 70, 5, 6, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1), 180,
             "70 input channels: 128-row tiles, input gradient unsplit");
    run_conv(make_desc(2, 130, 4, 5, 128, 3, 3, 1, 1, 1, 1, 1, 1, 2), 190,
             "groups 2: 64 rows forward, 65 rows input gradient, split-K");
    test_tile_shapes_agree(2, 3, 7, 5, 200, "K 27, no split");
    test_tile_shapes_agree(1, 40, 5, 6, 210, "K 360, split-K");
    test_errors();
    return test::finish("test_kernels_conv");
}
