/* test_kernels_nn.cu: pooling, softmax/log-softmax, NLL loss and batch norm against CPU loops:
 * max pooling with dilation, padding and a ceil-mode output size (first maximum, NaN wins,
 * -inf windows), its scatter backward; average pooling with and without count_include_pad
 * and with divisor_override, and its backward; softmax along rows and along a strided middle
 * axis; NLL with class weights, ignore_index, every reduction and a bad target; batch norm in
 * training and inference; argument errors.
 */
#include "test_kernels_util.h"

using test::Device;

namespace {

gc_pool2d_desc pool_desc(int64_t planes, int64_t h, int64_t w, int64_t out_h, int64_t out_w,
                         int64_t k, int64_t s, int64_t p, int64_t dil, int32_t include_pad,
                         int64_t divisor) {
    gc_pool2d_desc d = {planes, h, w, out_h, out_w, k, k, s, s, p, p, dil, dil, include_pad,
                        divisor};
    return d;
}

void test_max_pool() {
    /* 7x7, kernel 3, stride 2, pad 1, dilation 1: ceil mode gives 4x4 (floor would give 4 too);
     * 8x8 with kernel 2 stride 3 ceil mode: 3x3 whose last window hangs off the edge */
    const gc_pool2d_desc cases[] = {pool_desc(3, 7, 7, 4, 4, 3, 2, 1, 1, 0, 0),
                                    pool_desc(2, 8, 8, 3, 3, 2, 3, 0, 1, 0, 0),
                                    pool_desc(2, 9, 8, 3, 3, 3, 2, 1, 2, 0, 0)};
    uint64_t seed = 100;
    for (const gc_pool2d_desc &d : cases) {
        std::vector<float> x = test::random_floats(d.planes * d.h * d.w, seed++);
        x[5] = NAN;                                        /* NaN wins its windows */
        x[d.h * d.w + 1] = x[d.h * d.w + 2] = 7.0f;        /* a tie: the first maximum */
        for (int64_t i = 0; i < d.h * d.w; ++i) x[(d.planes - 1) * d.h * d.w + i] = -INFINITY;
        const int64_t outputs = d.planes * d.out_h * d.out_w;
        std::vector<double> y_ref(outputs), dx_ref(x.size(), 0.0);
        std::vector<int64_t> idx_ref(outputs);
        const std::vector<float> dy = test::random_floats(outputs, seed++);
        for (int64_t o = 0; o < outputs; ++o) {
            const int64_t ow = o % d.out_w, oh = (o / d.out_w) % d.out_h, pl = o / (d.out_w * d.out_h);
            float best = -INFINITY;
            int64_t best_i = -1;
            for (int64_t ki = 0; ki < d.kh; ++ki)
                for (int64_t kj = 0; kj < d.kw; ++kj) {
                    const int64_t ih = oh * d.stride_h - d.pad_h + ki * d.dilation_h;
                    const int64_t iw = ow * d.stride_w - d.pad_w + kj * d.dilation_w;
                    if (ih < 0 || ih >= d.h || iw < 0 || iw >= d.w) continue;
                    const float v = x[pl * d.h * d.w + ih * d.w + iw];
                    if (best_i < 0 || v > best || isnan(v)) { best = v; best_i = ih * d.w + iw; }
                }
            y_ref[o] = best;
            idx_ref[o] = best_i;
            dx_ref[pl * d.h * d.w + best_i] += dy[o];
        }
        Device<float> dxv(x), y(outputs, 0.0f), ddy(dy), dx(x.size(), NAN);
        Device<int64_t> idx(outputs, 0);
        EXPECT_OK(gc_max_pool2d_fwd_f32(&d, dxv.ptr, y.ptr, idx.ptr, nullptr));
        test::all_close(y.get(), y_ref, 0, 0, "max pool forward");
        test::all_equal(idx.get(), idx_ref, "max pool indices");
        EXPECT_OK(gc_max_pool2d_bwd_f32(&d, ddy.ptr, idx.ptr, dx.ptr, nullptr));
        test::all_close(dx.get(), dx_ref, 1e-6, 1e-6, "max pool backward");
    }
}

void test_avg_pool() {
    const gc_pool2d_desc cases[] = {pool_desc(2, 7, 7, 4, 4, 3, 2, 1, 1, 1, 0),
                                    pool_desc(2, 7, 7, 4, 4, 3, 2, 1, 1, 0, 0),
                                    pool_desc(3, 8, 6, 3, 2, 3, 3, 1, 1, 1, 5),
                                    pool_desc(1, 5, 5, 3, 3, 2, 2, 0, 1, 0, 0)};
    uint64_t seed = 200;
    for (const gc_pool2d_desc &d : cases) {
        const std::vector<float> x = test::random_floats(d.planes * d.h * d.w, seed++);
        const int64_t outputs = d.planes * d.out_h * d.out_w;
        const std::vector<float> dy = test::random_floats(outputs, seed++);
        std::vector<double> y_ref(outputs, 0.0), dx_ref(x.size(), 0.0);
        for (int64_t o = 0; o < outputs; ++o) {
            const int64_t ow = o % d.out_w, oh = (o / d.out_w) % d.out_h, pl = o / (d.out_w * d.out_h);
            const int64_t h0 = oh * d.stride_h - d.pad_h, w0 = ow * d.stride_w - d.pad_w;
            const int64_t h1 = std::min(h0 + d.kh, d.h + d.pad_h), w1 = std::min(w0 + d.kw, d.w + d.pad_w);
            int64_t inside = 0;
            for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h1, d.h); ++ih)
                for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w1, d.w); ++iw) ++inside;
            const double divisor = d.divisor_override ? (double)d.divisor_override
                                   : d.count_include_pad ? (double)((h1 - h0) * (w1 - w0))
                                                         : (double)inside;
            for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h1, d.h); ++ih)
                for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w1, d.w); ++iw) {
                    y_ref[o] += x[pl * d.h * d.w + ih * d.w + iw] / divisor;
                    dx_ref[pl * d.h * d.w + ih * d.w + iw] += dy[o] / divisor;
                }
        }
        Device<float> dxv(x), y(outputs, NAN), ddy(dy), dx(x.size(), NAN);
        EXPECT_OK(gc_avg_pool2d_fwd_f32(&d, dxv.ptr, y.ptr, nullptr));
        test::all_close(y.get(), y_ref, 1e-5, 1e-6, "avg pool forward");
        EXPECT_OK(gc_avg_pool2d_bwd_f32(&d, ddy.ptr, dx.ptr, nullptr));
        test::all_close(dx.get(), dx_ref, 1e-5, 1e-6, "avg pool backward");
    }
    gc_pool2d_desc dilated = pool_desc(1, 5, 5, 2, 2, 2, 2, 0, 2, 0, 0);
    Device<float> buf(25, 0.0f);
    test::expect_status(gc_avg_pool2d_fwd_f32(&dilated, buf.ptr, buf.ptr, nullptr),
                        GC_ERROR_INVALID_ARGUMENT, "gc_avg_pool2d_fwd_f32", "dilated avg pool");
    gc_pool2d_desc zero_kernel = pool_desc(1, 5, 5, 2, 2, 0, 2, 0, 1, 0, 0);
    test::expect_status(gc_max_pool2d_fwd_f32(&zero_kernel, buf.ptr, buf.ptr, nullptr, nullptr),
                        GC_ERROR_INVALID_ARGUMENT, "gc_max_pool2d_fwd_f32", "zero kernel");
}

void test_softmax() {
    const int64_t shapes[][3] = {{3, 5, 1}, {2, 300, 1}, {2, 4, 3}, {1, 1, 7}};
    uint64_t seed = 300;
    for (const auto &s : shapes)
        for (int log = 0; log < 2; ++log) {
            const int64_t outer = s[0], dim = s[1], inner = s[2], total = outer * dim * inner;
            std::vector<float> x = test::random_floats(total, seed++, -30.0f, 30.0f);
            x[0] = 80.0f; /* exp(80) overflows float: the max subtraction must avoid it */
            const std::vector<float> dy = test::random_floats(total, seed++);
            std::vector<double> y_ref(total), dx_ref(total);
            for (int64_t o = 0; o < outer; ++o)
                for (int64_t in = 0; in < inner; ++in) {
                    auto at = [&](int64_t e) { return (o * dim + e) * inner + in; };
                    double mx = -INFINITY, sum = 0.0;
                    for (int64_t e = 0; e < dim; ++e) mx = std::max(mx, (double)x[at(e)]);
                    for (int64_t e = 0; e < dim; ++e) sum += exp(x[at(e)] - mx);
                    for (int64_t e = 0; e < dim; ++e)
                        y_ref[at(e)] = log ? x[at(e)] - mx - ::log(sum) : exp(x[at(e)] - mx) / sum;
                    double dot = 0.0;
                    for (int64_t e = 0; e < dim; ++e) dot += log ? dy[at(e)] : dy[at(e)] * y_ref[at(e)];
                    for (int64_t e = 0; e < dim; ++e)
                        dx_ref[at(e)] = log ? dy[at(e)] - exp(y_ref[at(e)]) * dot
                                            : y_ref[at(e)] * (dy[at(e)] - dot);
                }
            Device<float> dxv(x), y(total, NAN), ddy(dy), dx(total, NAN);
            EXPECT_OK(gc_softmax_fwd_f32(outer, dim, inner, log, dxv.ptr, y.ptr, nullptr));
            test::all_close(y.get(), y_ref, 1e-5, 1e-6, log ? "log-softmax forward" : "softmax forward");
            std::vector<float> y_host(y_ref.begin(), y_ref.end());
            Device<float> dyv(y_host);
            EXPECT_OK(gc_softmax_bwd_f32(outer, dim, inner, log, dyv.ptr, ddy.ptr, dx.ptr, nullptr));
            test::all_close(dx.get(), dx_ref, 1e-5, 1e-5, log ? "log-softmax backward" : "softmax backward");
        }
    test::expect_status(gc_softmax_fwd_f32(-1, 2, 1, 0, nullptr, nullptr, nullptr),
                        GC_ERROR_INVALID_ARGUMENT, "gc_softmax_fwd_f32", "negative outer");
}

void test_nll() {
    const int64_t n = 3, classes = 4, inner = 2, count = n * inner, ignore = -100;
    const std::vector<float> x = test::random_floats(n * classes * inner, 400, -3.0f, 0.0f);
    const std::vector<float> weight = {0.5f, 1.0f, 2.0f, 1.5f};
    const std::vector<int64_t> target = {0, 3, ignore, 2, 1, 3};
    const std::vector<float> dy_none = test::random_floats(count, 401);
    Device<float> dxv(x), dw(weight), total(1, NAN), dy_sum(std::vector<float>{0.75f});
    Device<int64_t> dt(target), bad(1, 99);
    for (int weighted = 0; weighted < 2; ++weighted) {
        std::vector<double> loss(count, 0.0), picked(count, 0.0);
        double loss_sum = 0.0, weight_sum = 0.0;
        for (int64_t i = 0; i < count; ++i) {
            if (target[i] == ignore) continue;
            picked[i] = weighted ? weight[target[i]] : 1.0;
            loss[i] = -x[(i / inner) * classes * inner + target[i] * inner + i % inner] * picked[i];
            loss_sum += loss[i];
            weight_sum += picked[i];
        }
        const float *wp = weighted ? dw.ptr : nullptr;
        for (int r = 0; r < 3; ++r) {
            const gc_reduction red = (gc_reduction)r;
            Device<float> out(red == GC_REDUCTION_NONE ? count : 1, NAN);
            EXPECT_OK(gc_nll_loss_fwd_f32(n, classes, inner, dxv.ptr, dt.ptr, wp, ignore, red,
                                          out.ptr, total.ptr, bad.ptr, nullptr));
            const std::vector<double> want =
                red == GC_REDUCTION_NONE ? loss
                : red == GC_REDUCTION_SUM ? std::vector<double>{loss_sum}
                                          : std::vector<double>{loss_sum / weight_sum};
            test::all_close(out.get(), want, 1e-6, 1e-6, "nll forward");
            test::all_close(total.get(), {weight_sum}, 1e-6, 0, "nll total weight");
            test::all_equal(bad.get(), {0}, "nll bad_target with all targets valid");
            Device<float> dx(n * classes * inner, NAN), dyv(dy_none);
            const float *dy = red == GC_REDUCTION_NONE ? dyv.ptr : dy_sum.ptr;
            EXPECT_OK(gc_nll_loss_bwd_f32(n, classes, inner, dy, dt.ptr, wp, total.ptr, ignore,
                                          red, dx.ptr, nullptr));
            std::vector<double> dx_ref(n * classes * inner, 0.0);
            for (int64_t i = 0; i < count; ++i) {
                if (target[i] == ignore) continue;
                double scale = red == GC_REDUCTION_NONE ? dy_none[i] : 0.75;
                if (red == GC_REDUCTION_MEAN) scale /= weight_sum;
                dx_ref[(i / inner) * classes * inner + target[i] * inner + i % inner] = -picked[i] * scale;
            }
            test::all_close(dx.get(), dx_ref, 1e-6, 1e-7, "nll backward");
        }
    }
    /* a bad target: reported as 1 + its flat position (the first), counted as 0 */
    Device<int64_t> bad_targets(std::vector<int64_t>{0, 1, 4, 1, 7, 2});
    Device<float> out(1, NAN);
    EXPECT_OK(gc_nll_loss_fwd_f32(n, classes, inner, dxv.ptr, bad_targets.ptr, nullptr, ignore,
                                  GC_REDUCTION_SUM, out.ptr, total.ptr, bad.ptr, nullptr));
    test::all_equal(bad.get(), {3}, "nll bad_target = 1 + position of the first bad target");
    test::all_close(total.get(), {4.0}, 0, 0, "nll total weight skips the bad targets");
    /* -1 is out of range too when it is not ignore_index (position 1 -> reported 2) */
    Device<int64_t> minus_one(std::vector<int64_t>{0, -1, 1, 1, 2, 2});
    EXPECT_OK(gc_nll_loss_fwd_f32(n, classes, inner, dxv.ptr, minus_one.ptr, nullptr, ignore,
                                  GC_REDUCTION_SUM, out.ptr, total.ptr, bad.ptr, nullptr));
    test::all_equal(bad.get(), {2}, "nll bad_target for a target of -1");
    /* mean over nothing but ignored targets: 0 / 0 */
    Device<int64_t> ignored(std::vector<int64_t>(count, ignore));
    EXPECT_OK(gc_nll_loss_fwd_f32(n, classes, inner, dxv.ptr, ignored.ptr, nullptr, ignore,
                                  GC_REDUCTION_MEAN, out.ptr, total.ptr, nullptr, nullptr));
    test::all_close(out.get(), {NAN}, 0, 0, "nll mean with every target ignored is NaN");
    test::expect_status(gc_nll_loss_fwd_f32(n, classes, inner, dxv.ptr, dt.ptr, nullptr, ignore,
                                            (gc_reduction)3, out.ptr, total.ptr, nullptr, nullptr),
                        GC_ERROR_INVALID_ARGUMENT, "gc_nll_loss_fwd_f32", "bad reduction");
    test::expect_status(gc_nll_loss_bwd_f32(n, classes, inner, out.ptr, dt.ptr, nullptr, nullptr,
                                            ignore, GC_REDUCTION_MEAN, dxv.ptr, nullptr),
                        GC_ERROR_INVALID_ARGUMENT, "gc_nll_loss_bwd_f32", "mean without total");
}

void test_batch_norm() {
    const int64_t n = 3, c = 4, hw = 5, total = n * c * hw;
    const double eps = 1e-5;
    const std::vector<float> x = test::random_floats(total, 500, -2.0f, 3.0f);
    const std::vector<float> weight = test::random_floats(c, 501, 0.5f, 1.5f);
    const std::vector<float> bias = test::random_floats(c, 502);
    const std::vector<float> rmean = test::random_floats(c, 503);
    const std::vector<float> rvar = test::random_floats(c, 504, 0.5f, 2.0f);
    const std::vector<float> dy = test::random_floats(total, 505);
    Device<float> dxv(x), dw(weight), db(bias), drm(rmean), drv(rvar), ddy(dy);
    for (int training = 0; training < 2; ++training) {
        std::vector<double> mean(c, 0.0), invstd(c), y_ref(total), dx_ref(total);
        std::vector<double> dw_ref(c, 0.0), db_ref(c, 0.0);
        auto at = [&](int64_t b, int64_t ch, int64_t j) { return (b * c + ch) * hw + j; };
        for (int64_t ch = 0; ch < c; ++ch) {
            double var = 0.0;
            if (training) {
                for (int64_t b = 0; b < n; ++b)
                    for (int64_t j = 0; j < hw; ++j) mean[ch] += x[at(b, ch, j)] / (double)(n * hw);
                for (int64_t b = 0; b < n; ++b)
                    for (int64_t j = 0; j < hw; ++j)
                        var += pow(x[at(b, ch, j)] - mean[ch], 2) / (double)(n * hw);
            } else {
                mean[ch] = rmean[ch];
                var = rvar[ch];
            }
            invstd[ch] = 1.0 / sqrt(var + eps);
            for (int64_t b = 0; b < n; ++b)
                for (int64_t j = 0; j < hw; ++j) {
                    const double xhat = (x[at(b, ch, j)] - mean[ch]) * invstd[ch];
                    y_ref[at(b, ch, j)] = xhat * weight[ch] + bias[ch];
                    db_ref[ch] += dy[at(b, ch, j)];
                    dw_ref[ch] += dy[at(b, ch, j)] * xhat;
                }
            const double m = (double)(n * hw);
            for (int64_t b = 0; b < n; ++b)
                for (int64_t j = 0; j < hw; ++j) {
                    const double xhat = (x[at(b, ch, j)] - mean[ch]) * invstd[ch];
                    dx_ref[at(b, ch, j)] = weight[ch] * invstd[ch] *
                                           (dy[at(b, ch, j)] - db_ref[ch] / m - xhat * dw_ref[ch] / m);
                }
        }
        Device<float> y(total, NAN), sm(c, NAN), si(c, NAN);
        EXPECT_OK(gc_batch_norm_fwd_f32(n, c, hw, training, eps, dxv.ptr, dw.ptr, db.ptr, drm.ptr,
                                        drv.ptr, y.ptr, sm.ptr, si.ptr, nullptr));
        test::all_close(y.get(), y_ref, 1e-5, 1e-5, training ? "bn train forward" : "bn eval forward");
        test::all_close(sm.get(), mean, 1e-5, 1e-6, "bn save_mean");
        test::all_close(si.get(), invstd, 1e-5, 1e-6, "bn save_invstd");
        if (!training) continue;
        Device<float> dx(total, NAN), gw(c, NAN), gb(c, NAN);
        EXPECT_OK(gc_batch_norm_bwd_f32(n, c, hw, dxv.ptr, ddy.ptr, dw.ptr, sm.ptr, si.ptr, dx.ptr,
                                        gw.ptr, gb.ptr, nullptr));
        test::all_close(dx.get(), dx_ref, 1e-4, 1e-5, "bn backward dx");
        test::all_close(gw.get(), dw_ref, 1e-5, 1e-5, "bn backward dweight");
        test::all_close(gb.get(), db_ref, 1e-5, 1e-5, "bn backward dbias");
    }
    test::expect_status(gc_batch_norm_fwd_f32(n, c, hw, 0, eps, dxv.ptr, nullptr, nullptr,
                                              nullptr, nullptr, dxv.ptr, nullptr, nullptr,
                                              nullptr),
                        GC_ERROR_INVALID_ARGUMENT, "gc_batch_norm_fwd_f32",
                        "inference without running statistics");
}

} /* namespace */

int main() {
    test_max_pool();
    test_avg_pool();
    test_softmax();
    test_nll();
    test_batch_norm();
    return test::finish("test_kernels_nn");
}
