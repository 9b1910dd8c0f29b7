/* test_kernels_reduce.cu: gc_reduce_f32 / gc_arg_reduce_f32 (rows and strided columns, NaN
 * propagation, ties, empty extents) and gc_fill_f32 / gc_axpy_f32 / gc_copy_strided (every
 * element size, negative and zero strides, 0-d) against CPU loops, plus argument errors.
 */
#include "test_kernels_util.h"

using test::Device;

namespace {

double reduce_ref(gc_reduce_op op, const std::vector<float> &x, int64_t start, int64_t extent,
                  int64_t inner) {
    double acc = op == GC_REDUCE_PROD ? 1.0 : op == GC_REDUCE_MAX ? -INFINITY
                 : op == GC_REDUCE_MIN ? INFINITY : 0.0;
    for (int64_t e = 0; e < extent; ++e) {
        const double v = x[start + e * inner];
        if (op == GC_REDUCE_SUM || op == GC_REDUCE_MEAN) acc += v;
        else if (op == GC_REDUCE_PROD) acc *= v;
        else if (isnan(v) || isnan(acc)) acc = NAN;
        else acc = op == GC_REDUCE_MAX ? std::max(acc, v) : std::min(acc, v);
    }
    return op == GC_REDUCE_MEAN ? acc / (double)extent : acc;
}

int64_t arg_ref(bool is_min, const std::vector<float> &x, int64_t start, int64_t extent,
                int64_t inner) {
    int64_t best = 0;
    for (int64_t e = 1; e < extent; ++e) {
        const float v = x[start + e * inner], b = x[start + best * inner];
        if (isnan(b)) break;
        if (isnan(v) || (is_min ? v < b : v > b)) best = e;
    }
    return best;
}

void test_reductions() {
    const int64_t shapes[][3] = {{3, 700, 1}, {2, 5, 3}, {1, 1, 1}, {4, 33, 1}, {2, 9, 260}};
    uint64_t seed = 600;
    for (const auto &s : shapes) {
        const int64_t outer = s[0], extent = s[1], inner = s[2];
        std::vector<float> x = test::random_floats(outer * extent * inner, seed++, 0.5f, 1.5f);
        if (extent > 2) {
            x[inner * 2] = NAN;                             /* row/column 0 gets a NaN */
            x[extent * inner + 1 * inner] = 2.0f;           /* ties in row/column 1 */
            x[extent * inner + (extent - 1) * inner] = 2.0f;
        }
        std::vector<double> want(outer * inner);
        std::vector<int64_t> want_arg(outer * inner);
        for (int op = GC_REDUCE_SUM; op <= GC_REDUCE_PROD; ++op) {
            for (int64_t o = 0; o < outer; ++o)
                for (int64_t i = 0; i < inner; ++i)
                    want[o * inner + i] = reduce_ref((gc_reduce_op)op, x, o * extent * inner + i,
                                                     extent, inner);
            Device<float> dxv(x), y(outer * inner, -7.0f);
            EXPECT_OK(gc_reduce_f32((gc_reduce_op)op, outer, extent, inner, dxv.ptr, y.ptr, nullptr));
            char what[96];
            snprintf(what, sizeof what, "reduce op %d over (%lld, %lld, %lld)", op,
                     (long long)outer, (long long)extent, (long long)inner);
            test::all_close(y.get(), want, 1e-5, 1e-6, what);
        }
        for (int is_min = 0; is_min < 2; ++is_min) {
            for (int64_t o = 0; o < outer; ++o)
                for (int64_t i = 0; i < inner; ++i)
                    want_arg[o * inner + i] = arg_ref(is_min, x, o * extent * inner + i, extent, inner);
            Device<float> dxv(x);
            Device<int64_t> y(outer * inner, -7);
            EXPECT_OK(gc_arg_reduce_f32(is_min, outer, extent, inner, dxv.ptr, y.ptr, nullptr));
            test::all_equal(y.get(), want_arg, is_min ? "argmin" : "argmax");
        }
    }
    /* empty extents: sum 0, prod 1, mean NaN; max/min/arg have no identity */
    Device<float> y(2, -7.0f);
    EXPECT_OK(gc_reduce_f32(GC_REDUCE_SUM, 2, 0, 1, nullptr, y.ptr, nullptr));
    test::all_close(y.get(), {0.0, 0.0}, 0, 0, "sum of nothing");
    EXPECT_OK(gc_reduce_f32(GC_REDUCE_PROD, 2, 0, 1, nullptr, y.ptr, nullptr));
    test::all_close(y.get(), {1.0, 1.0}, 0, 0, "product of nothing");
    EXPECT_OK(gc_reduce_f32(GC_REDUCE_MEAN, 1, 0, 2, nullptr, y.ptr, nullptr));
    test::all_close(y.get(), {NAN, NAN}, 0, 0, "mean of nothing");
    test::expect_status(gc_reduce_f32(GC_REDUCE_MAX, 2, 0, 1, nullptr, y.ptr, nullptr),
                        GC_ERROR_INVALID_ARGUMENT, "gc_reduce_f32", "max of nothing");
    test::expect_status(gc_arg_reduce_f32(0, 2, 0, 1, nullptr, nullptr, nullptr),
                        GC_ERROR_INVALID_ARGUMENT, "gc_arg_reduce_f32", "argmax of nothing");
    test::expect_status(gc_reduce_f32((gc_reduce_op)9, 1, 1, 1, y.ptr, y.ptr, nullptr),
                        GC_ERROR_INVALID_ARGUMENT, "gc_reduce_f32", "unknown op");
    test::expect_status(gc_reduce_f32(GC_REDUCE_SUM, 1, 2, 1, nullptr, y.ptr, nullptr),
                        GC_ERROR_INVALID_ARGUMENT, "gc_reduce_f32", "NULL x");
}

void test_fill_axpy() {
    Device<float> buf(1000, 0.0f);
    EXPECT_OK(gc_fill_f32(buf.ptr, 2.5f, 999, nullptr));
    std::vector<double> want(1000, 2.5);
    want[999] = 0.0;
    test::all_close(buf.get(), want, 0, 0, "fill leaves the element past count alone");
    const std::vector<float> x = test::random_floats(1000, 700);
    Device<float> dxv(x);
    EXPECT_OK(gc_axpy_f32(1000, -3.0f, dxv.ptr, buf.ptr, nullptr));
    for (int i = 0; i < 1000; ++i) want[i] = -3.0 * x[i] + want[i];
    test::all_close(buf.get(), want, 1e-6, 1e-6, "axpy");
    EXPECT_OK(gc_fill_f32(nullptr, 1.0f, 0, nullptr));
    test::expect_status(gc_fill_f32(buf.ptr, 1.0f, -1, nullptr), GC_ERROR_INVALID_ARGUMENT,
                        "gc_fill_f32", "negative count");
    test::expect_status(gc_axpy_f32(3, 1.0f, nullptr, buf.ptr, nullptr),
                        GC_ERROR_INVALID_ARGUMENT, "gc_axpy_f32", "NULL x");
}

/* a (2, 3, 4) source read transposed, reversed and broadcast, for one element type */
template <class T>
void copy_case() {
    std::vector<T> src(24);
    for (int i = 0; i < 24; ++i) src[i] = (T)(i * 3 + 1);
    Device<T> dsrc(src);
    /* view (4, 3, 2) = permute(2, 1, 0) with dim 1 reversed and a broadcast leading dim */
    const int64_t shape[4] = {2, 4, 3, 2};
    const int64_t strides[4] = {0, 1, -4, 12};
    const T *origin = dsrc.ptr + 2 * 4; /* reversed dim 1 starts at its last index */
    Device<T> dst(2 * 4 * 3 * 2, (T)0);
    EXPECT_OK(gc_copy_strided(4, shape, origin, strides, dst.ptr, (int32_t)sizeof(T), nullptr));
    std::vector<T> want;
    for (int r = 0; r < 2; ++r)
        for (int a = 0; a < 4; ++a)
            for (int b = 0; b < 3; ++b)
                for (int c = 0; c < 2; ++c) want.push_back(src[8 + a - 4 * b + 12 * c]);
    test::all_equal(dst.get(), want, "copy_strided");
}

void test_copy_strided() {
    copy_case<uint8_t>();
    copy_case<int16_t>();
    copy_case<float>();
    copy_case<int64_t>();
    Device<int32_t> one(std::vector<int32_t>{42}), out(1, 0);
    EXPECT_OK(gc_copy_strided(0, nullptr, one.ptr, nullptr, out.ptr, 4, nullptr));
    test::all_equal(out.get(), {42}, "0-d copy");
    const int64_t shape[2] = {2, 0}, strides[2] = {1, 1};
    EXPECT_OK(gc_copy_strided(2, shape, nullptr, strides, nullptr, 4, nullptr));
    test::expect_status(gc_copy_strided(9, shape, one.ptr, strides, out.ptr, 4, nullptr),
                        GC_ERROR_INVALID_ARGUMENT, "gc_copy_strided", "ndim 9");
    test::expect_status(gc_copy_strided(1, shape, one.ptr, strides, out.ptr, 3, nullptr),
                        GC_ERROR_INVALID_ARGUMENT, "gc_copy_strided", "3-byte elements");
    const int64_t negative[1] = {-2};
    test::expect_status(gc_copy_strided(1, negative, one.ptr, strides, out.ptr, 4, nullptr),
                        GC_ERROR_INVALID_ARGUMENT, "gc_copy_strided", "negative size");
}

} /* namespace */

int main() {
    test_reductions();
    test_fill_axpy();
    test_copy_strided();
    return test::finish("test_kernels_reduce");
}
