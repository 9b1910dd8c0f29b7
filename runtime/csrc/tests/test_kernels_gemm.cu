/* test_kernels_gemm.cu: gc_gemm_f32, gc_gemm_strided_batched_f32 and gc_gemm_tf32_f32 against
 * a double-precision CPU loop: odd and tile-crossing shapes (k >= 24: the cp.async pipeline,
 * shorter: the register-buffered kernel, with 64-row tiles for m <= 64), every transpose
 * pair, padded leading dimensions, misaligned pointers (scalar loads), alpha/beta, beta == 0
 * over NaN, k == 0, batch broadcasting, TF32 rounding, and argument errors.
 */
#include "test_kernels_util.h"

using test::Device;

namespace {

struct Case {
    int trans_a, trans_b;
    int64_t m, n, k, pad; /* pad: extra leading-dimension elements */
    float alpha, beta;
    int offset; /* floats added to every pointer (1: not 16-byte aligned) */
};

/* op(X)[r][c] of a row-major matrix with leading dimension ld */
inline double element(const std::vector<float> &x, int64_t base, int trans, int64_t ld,
                      int64_t r, int64_t c, bool tf32) {
    float v = trans ? x[base + c * ld + r] : x[base + r * ld + c];
    if (tf32) { /* cvt.rna.tf32.f32: 10 mantissa bits, ties away from zero */
        uint32_t bits;
        memcpy(&bits, &v, 4);
        bits = (bits + 0x1000u) & 0xffffe000u;
        memcpy(&v, &bits, 4);
    }
    return v;
}

std::vector<double> reference(const Case &t, const std::vector<float> &a, int64_t lda,
                              int64_t sa, const std::vector<float> &b, int64_t ldb, int64_t sb,
                              const std::vector<float> &c, int64_t ldc, int64_t sc,
                              int64_t batch, bool tf32) {
    std::vector<double> out(c.begin(), c.end());
    for (int64_t z = 0; z < batch; ++z)
        for (int64_t i = 0; i < t.m; ++i)
            for (int64_t j = 0; j < t.n; ++j) {
                double acc = 0.0;
                for (int64_t p = 0; p < t.k; ++p)
                    acc += element(a, t.offset + z * sa, t.trans_a, lda, i, p, tf32) *
                           element(b, t.offset + z * sb, t.trans_b, ldb, p, j, tf32);
                const int64_t at = t.offset + z * sc + i * ldc + j;
                out[at] = t.alpha * acc + (t.beta != 0.0f ? t.beta * (double)c[at] : 0.0);
            }
    return out;
}

/* runs one case as a plain GEMM (batch 1), a batched GEMM (batch 3, A broadcast), or TF32 */
enum Mode { PLAIN, BATCHED, TF32 };

void run_case(const Case &t, Mode mode, uint64_t seed) {
    const int64_t lda = (t.trans_a ? t.m : t.k) + t.pad, ldb = (t.trans_b ? t.k : t.n) + t.pad;
    const int64_t ldc = t.n + t.pad;
    const int64_t a_rows = t.trans_a ? t.k : t.m, b_rows = t.trans_b ? t.n : t.k;
    const int64_t batch = mode == BATCHED ? 3 : 1;
    const int64_t sa = 0, sb = b_rows * ldb, sc = t.m * ldc; /* A broadcast over the batch */
    const std::vector<float> a = test::random_floats(t.offset + a_rows * lda + 1, seed);
    const std::vector<float> b = test::random_floats(t.offset + batch * sb + 1, seed + 1);
    std::vector<float> c = test::random_floats(t.offset + batch * sc + 1, seed + 2);
    if (t.beta == 0.0f)
        for (float &v : c) v = NAN; /* beta == 0 must not read C */
    Device<float> da(a), db(b), dc(c);
    gc_status s;
    if (mode == PLAIN)
        s = gc_gemm_f32(t.trans_a, t.trans_b, t.m, t.n, t.k, t.alpha, da.ptr + t.offset, lda,
                        db.ptr + t.offset, ldb, t.beta, dc.ptr + t.offset, ldc, nullptr);
    else if (mode == TF32)
        s = gc_gemm_tf32_f32(t.trans_a, t.trans_b, t.m, t.n, t.k, t.alpha, da.ptr + t.offset,
                             lda, db.ptr + t.offset, ldb, t.beta, dc.ptr + t.offset, ldc,
                             nullptr);
    else
        s = gc_gemm_strided_batched_f32(t.trans_a, t.trans_b, t.m, t.n, t.k, t.alpha,
                                        da.ptr + t.offset, lda, sa, db.ptr + t.offset, ldb, sb,
                                        t.beta, dc.ptr + t.offset, ldc, sc, batch, nullptr);
    char what[160];
    snprintf(what, sizeof what, "%s gemm ta=%d tb=%d m=%lld n=%lld k=%lld pad=%lld alpha=%g "
             "beta=%g offset=%d", mode == PLAIN ? "fp32" : mode == TF32 ? "tf32" : "batched",
             t.trans_a, t.trans_b, (long long)t.m, (long long)t.n, (long long)t.k,
             (long long)t.pad, t.alpha, t.beta, t.offset);
    test::expect_status(s, GC_SUCCESS, "", what);
    /* cuBLAS rounds a TF32 product's inputs its own way (not necessarily cvt.rna; on an H100
     * one case was 4.8e-4 from the cvt.rna reference): there, the float32 reference within
     * TF32's 2^-10 per product (|a|, |b| <= 1) */
    const bool vendor_tf32 = mode == TF32 && strstr(gc_gemm_provider(1, t.m, t.n, t.k),
                                                     "cuBLAS") != nullptr;
    std::vector<double> want = reference(t, a, lda, sa, b, ldb, sb, c, ldc, sc, batch,
                                         mode == TF32 && !vendor_tf32);
    std::vector<float> got = dc.get();
    /* elements outside C's m x n windows (padding, offset) must be untouched: NaN stays NaN */
    if (vendor_tf32)
        test::all_close(got, want, 1.0 / 1024, (double)(t.k + 1) / 1024, what);
    else
        test::all_close(got, want, 1e-5, 1e-5 * (double)(t.k + 1), what);
}

void test_shapes() {
    /* k >= 24 runs the cp.async pipeline (gemm_pipeline.cuh): exactly 3 steps, a partial last
     * step, more steps than stages, tiles crossing in m and n; shorter k the register-buffered
     * kernel, with 64-row tiles for m <= 64 (1, 7, 33, 64) and 128-row ones above (65, 130) */
    const int64_t shapes[][3] = {{1, 1, 1},   {7, 13, 5},    {33, 65, 17}, {130, 129, 19},
                                 {64, 64, 16}, {65, 70, 11}, {9, 5, 24},   {37, 131, 29},
                                 {130, 67, 77}, {3, 2, 203}};
    uint64_t seed = 1;
    for (const auto &shape : shapes)
        for (int ta = 0; ta < 2; ++ta)
            for (int tb = 0; tb < 2; ++tb) {
                const Case plain{ta, tb, shape[0], shape[1], shape[2], 0, 1.0f, 0.0f, 0};
                run_case(plain, PLAIN, seed++);
                const Case scaled{ta, tb, shape[0], shape[1], shape[2], 3, 1.5f, -0.5f, 1};
                run_case(scaled, PLAIN, seed++);
            }
    run_case(Case{0, 0, 33, 65, 17, 1, 2.0f, 0.0f, 0}, BATCHED, seed++);
    run_case(Case{1, 1, 7, 13, 5, 0, 1.0f, 1.0f, 1}, BATCHED, seed++);
    run_case(Case{0, 1, 129, 33, 45, 1, 1.0f, 0.5f, 1}, BATCHED, seed++);
    run_case(Case{1, 0, 20, 36, 50, 0, 1.0f, 0.0f, 0}, BATCHED, seed++);
    run_case(Case{0, 1, 20, 36, 12, 0, 1.0f, 0.25f, 0}, TF32, seed++);
    run_case(Case{1, 0, 5, 3, 9, 2, -1.0f, 0.0f, 1}, TF32, seed++);
    run_case(Case{0, 0, 40, 70, 33, 0, 1.0f, 0.0f, 0}, TF32, seed++); /* k >= 24: no pipeline */
    run_case(Case{1, 1, 72, 40, 20, 1, 1.0f, 0.0f, 1}, TF32, seed++); /* 128-row tiles */
    run_case(Case{0, 1, 65, 129, 21, 0, 1.0f, 0.0f, 0}, BATCHED, seed++); /* 128-row tiles */
}

void test_k_zero_scales_c() {
    std::vector<float> c = {1.0f, 2.0f, NAN, 4.0f};
    Device<float> dc(c);
    EXPECT_OK(gc_gemm_f32(0, 0, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 2.0f, dc.ptr, 2, nullptr));
    test::all_close(dc.get(), {2.0, 4.0, NAN, 8.0}, 0, 0, "k == 0 scales C by beta");
    EXPECT_OK(gc_gemm_f32(0, 0, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, dc.ptr, 2, nullptr));
    test::all_close(dc.get(), {0.0, 0.0, 0.0, 0.0}, 0, 0, "k == 0, beta == 0 zeroes C (NaN too)");
}

void test_tf32_rounds_inputs() {
    /* 1 + 2^-12 rounds to 1 in TF32 (10 mantissa bits); 1 + 2^-11 (a tie) rounds away to
     * 1 + 2^-10 */
    Device<float> a(std::vector<float>{1.0f + ldexpf(1.0f, -12), 1.0f + ldexpf(1.0f, -11)});
    Device<float> b(std::vector<float>{1.0f, 1.0f}), c(2, 0.0f);
    EXPECT_OK(gc_gemm_tf32_f32(0, 0, 2, 1, 1, 1.0f, a.ptr, 1, b.ptr, 1, 0.0f, c.ptr, 1, nullptr));
    const std::vector<float> got = c.get();
    if (strstr(gc_gemm_provider(1, 2, 1, 1), "cuBLAS")) {
        /* cuBLAS may use TF32 but need not (it ran this shape in float32 on an H200): either
         * rounding of the inputs is right */
        TEST_CHECK((got[0] == 1.0f || got[0] == 1.0f + ldexpf(1.0f, -12)) &&
                       (got[1] == 1.0f + ldexpf(1.0f, -10) || got[1] == 1.0f + ldexpf(1.0f, -11)),
                   "tf32 through cuBLAS: got %.9g and %.9g", got[0], got[1]);
        return;
    }
    TEST_CHECK(got[0] == 1.0f && got[1] == 1.0f + ldexpf(1.0f, -10),
               "tf32 rounding: got %.9g and %.9g, expected 1 and 1 + 2^-10", got[0], got[1]);
}

void test_errors() {
    Device<float> a(64, 1.0f), b(64, 1.0f), c(64, 0.0f);
    const gc_status bad = GC_ERROR_INVALID_ARGUMENT;
    test::expect_status(gc_gemm_f32(0, 0, -1, 2, 2, 1.0f, a.ptr, 2, b.ptr, 2, 0.0f, c.ptr, 2,
                                    nullptr), bad, "gc_gemm_f32", "negative m");
    test::expect_status(gc_gemm_f32(0, 0, 4, 4, 5, 1.0f, a.ptr, 4, b.ptr, 4, 0.0f, c.ptr, 4,
                                    nullptr), bad, "gc_gemm_f32", "lda < k");
    test::expect_status(gc_gemm_f32(1, 0, 4, 4, 2, 1.0f, a.ptr, 3, b.ptr, 4, 0.0f, c.ptr, 4,
                                    nullptr), bad, "gc_gemm_f32", "lda < m for transposed A");
    test::expect_status(gc_gemm_f32(0, 1, 4, 4, 2, 1.0f, a.ptr, 2, b.ptr, 1, 0.0f, c.ptr, 4,
                                    nullptr), bad, "gc_gemm_f32", "ldb < k for transposed B");
    test::expect_status(gc_gemm_f32(0, 0, 4, 4, 2, 1.0f, a.ptr, 2, b.ptr, 4, 0.0f, c.ptr, 3,
                                    nullptr), bad, "gc_gemm_f32", "ldc < n");
    test::expect_status(gc_gemm_f32(0, 0, 2, 2, 2, 1.0f, nullptr, 2, b.ptr, 2, 0.0f, c.ptr, 2,
                                    nullptr), bad, "gc_gemm_f32", "NULL a");
    test::expect_status(gc_gemm_tf32_f32(0, 0, 2, 2, 2, 1.0f, a.ptr, 2, b.ptr, 2, 0.0f, nullptr,
                                         2, nullptr), bad, "gc_gemm_tf32_f32", "NULL c");
    test::expect_status(gc_gemm_strided_batched_f32(0, 0, 2, 2, 2, 1.0f, a.ptr, 2, -4, b.ptr, 2,
                                                    4, 0.0f, c.ptr, 2, 4, 2, nullptr),
                        bad, "gc_gemm_strided_batched_f32", "negative stride_a");
    test::expect_status(gc_gemm_strided_batched_f32(0, 0, 2, 2, 2, 1.0f, a.ptr, 2, 4, b.ptr, 2,
                                                    4, 0.0f, c.ptr, 2, 2, 2, nullptr),
                        bad, "gc_gemm_strided_batched_f32", "overlapping outputs");
    test::expect_status(gc_gemm_strided_batched_f32(0, 0, 2, 2, 2, 1.0f, a.ptr, 2, 4, b.ptr, 2,
                                                    4, 0.0f, c.ptr, 2, 4, -1, nullptr),
                        bad, "gc_gemm_strided_batched_f32", "negative batch");
    /* empty products are fine and touch nothing */
    EXPECT_OK(gc_gemm_f32(0, 0, 0, 5, 3, 1.0f, nullptr, 3, nullptr, 5, 0.0f, nullptr, 5, nullptr));
    EXPECT_OK(gc_gemm_strided_batched_f32(0, 0, 2, 2, 2, 1.0f, a.ptr, 2, 4, b.ptr, 2, 4, 0.0f,
                                          c.ptr, 2, 4, 0, nullptr));
}

} /* namespace */

int main() {
    test_shapes();
    test_k_zero_scales_c();
    test_tf32_rounds_inputs();
    test_errors();
    return test::finish("test_kernels_gemm");
}
