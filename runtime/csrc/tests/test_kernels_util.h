/* test_kernels_util.h: what the test_kernels*.cu programs share: device buffers through the
 * public ABI (gc_malloc / gc_memcpy_*), seeded random data, tolerant comparisons and status
 * checks that count failures. Each program's main returns failures() != 0.
 *
 * Only the public header is used, so the checks hold for either build of the library.
 */
#ifndef GC_TEST_KERNELS_UTIL_H
#define GC_TEST_KERNELS_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "graphc_rt.h"

namespace test {

inline int &failure_count() {
    static int count = 0;
    return count;
}
inline int failures() { return failure_count(); }

#define TEST_CHECK(cond, ...)                                          \
    do {                                                               \
        if (!(cond)) {                                                 \
            ++::test::failure_count();                                 \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);       \
            fprintf(stderr, __VA_ARGS__);                              \
            fprintf(stderr, "\n");                                     \
        }                                                              \
    } while (0)

/* a status must be `want`; on failure the last-error text must name `function` */
inline void expect_status(gc_status got, gc_status want, const char *function,
                          const char *what) {
    TEST_CHECK(got == want, "%s: status %d (%s), expected %d; last error: %s", what, (int)got,
               gc_status_string(got), (int)want, gc_last_error());
    if (want != GC_SUCCESS && got == want)
        TEST_CHECK(strstr(gc_last_error(), function) != nullptr,
                   "%s: the error message does not name %s: '%s'", what, function,
                   gc_last_error());
}
#define EXPECT_OK(call) ::test::expect_status((call), GC_SUCCESS, "", #call)

/* a device copy of a host vector; get() copies back */
template <class T>
struct Device {
    T *ptr = nullptr;
    size_t count = 0;
    explicit Device(const std::vector<T> &host) : count(host.size()) {
        EXPECT_OK(gc_malloc((void **)&ptr, (int64_t)(count * sizeof(T))));
        if (count) EXPECT_OK(gc_memcpy_h2d(ptr, host.data(), (int64_t)(count * sizeof(T)), nullptr));
    }
    explicit Device(size_t n, T fill = T()) : Device(std::vector<T>(n, fill)) {}
    Device(const Device &) = delete;
    Device &operator=(const Device &) = delete;
    ~Device() { gc_free(ptr); }
    std::vector<T> get() const {
        std::vector<T> host(count);
        EXPECT_OK(gc_stream_synchronize(nullptr));
        if (count) EXPECT_OK(gc_memcpy_d2h(host.data(), ptr, (int64_t)(count * sizeof(T)), nullptr));
        return host;
    }
};

/* deterministic data in [lo, hi) (a 64-bit LCG; the seed names the test case) */
inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
    std::vector<float> v(n);
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (size_t i = 0; i < n; ++i) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = lo + (hi - lo) * (float)((s >> 40) / 16777216.0);
    }
    return v;
}

/* |got - want| <= atol + rtol * |want| elementwise, NaN matching NaN; reports the first miss */
inline bool all_close(const std::vector<float> &got, const std::vector<double> &want,
                      double rtol, double atol, const char *what) {
    if (got.size() != want.size()) {
        TEST_CHECK(false, "%s: %zu values, expected %zu", what, got.size(), want.size());
        return false;
    }
    for (size_t i = 0; i < got.size(); ++i) {
        const bool both_nan = isnan(got[i]) && isnan(want[i]);
        const bool ok = both_nan || (!isnan(got[i]) && !isnan(want[i]) &&
                                     fabs(got[i] - want[i]) <= atol + rtol * fabs(want[i])) ||
                        (isinf(want[i]) && got[i] == want[i]);
        if (!ok) {
            TEST_CHECK(false, "%s: element %zu is %.9g, expected %.9g", what, i, got[i], want[i]);
            return false;
        }
    }
    return true;
}

template <class T>
inline bool all_equal(const std::vector<T> &got, const std::vector<T> &want, const char *what) {
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
        if (got[i] != want[i]) {
            TEST_CHECK(false, "%s: element %zu is %lld, expected %lld", what, i,
                       (long long)got[i], (long long)want[i]);
            return false;
        }
    }
    TEST_CHECK(got.size() == want.size(), "%s: %zu values, expected %zu", what, got.size(),
               want.size());
    return got.size() == want.size();
}

inline int finish(const char *program) {
    if (failures() == 0) printf("%s: all passed\n", program);
    else fprintf(stderr, "%s: %d failure(s)\n", program, failures());
    return failures() != 0;
}

} /* namespace test */

#endif /* GC_TEST_KERNELS_UTIL_H */
