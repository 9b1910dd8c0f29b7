/* test_runtime.cpp: the runtime ABI and the emulation's CUDA semantics, as a program that
 * exits non-zero when any check fails (run by `make check` under AddressSanitizer).
 *
 * Covers: ABI version and kind, status strings, the thread-local last error, memory copies
 * and memset, streams and events, GC_LAUNCH with multi-dimensional grids and blocks, kernel
 * templates, static and dynamic shared memory, warp shuffles/votes (whole and partial warps,
 * sub-warp widths),
 * atomics, a launch fault reported through GC_CHECK_LAUNCH, the host-device transfer
 * counters, pinned host memory, the driver version, device reset and the refused CUDA graph
 * capture of the emulation.
 */
#include <stdio.h>
#include <string.h>

#include <vector>

#include "common.h"

static int failures = 0;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
            ++failures;                                                    \
        }                                                                  \
    } while (0)

#define CHECK_OK(call) CHECK((call) == GC_SUCCESS, "%s: %s", #call, gc_last_error())

/* ---- kernels ------------------------------------------------------------------------------ */
__global__ void scale_2d(const float *x, float *y, int rows, int cols, float factor) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < rows && col < cols) y[row * cols + col] = factor * x[row * cols + col];
}

template <int kFactor, int kOffset>
__global__ void affine_int(int *values, int count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) values[i] = values[i] * kFactor + kOffset;
}

/* one sum per block through a static __shared__ tree (blockDim.x a power of two <= 256) */
__global__ void block_sum_static(const float *x, float *sums) {
    __shared__ float partial[256];
    unsigned t = threadIdx.x;
    partial[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) partial[t] += partial[t + half];
        __syncthreads();
    }
    if (t == 0) sums[blockIdx.x] = partial[0];
}

/* the same through dynamic shared memory sized at launch */
__global__ void block_sum_dynamic(const float *x, float *sums) {
    GC_DYNAMIC_SHARED(float, partial);
    unsigned t = threadIdx.x;
    partial[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) partial[t] += partial[t + half];
        __syncthreads();
    }
    if (t == 0) sums[blockIdx.x] = partial[0];
}

/* per warp: shfl_down sum, shfl_xor max, shfl_up inclusive scan, ballot of odd values,
 * broadcast of lane 3; any number of threads per block (a partial last warp included) */
__global__ void warp_functions(const int *x, int *sum, int *max_out, int *scan, unsigned *ballot,
                               int *broadcast, int threads) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= threads) return;
    unsigned mask = __activemask();
    int lane = threadIdx.x % warpSize;
    int warp = i / warpSize;
    int value = x[i];
    int total = value;
    for (int offset = 16; offset > 0; offset /= 2) {
        int other = __shfl_down_sync(mask, total, offset); /* undefined from absent lanes */
        if (lane + offset < 32 && (mask >> (lane + offset) & 1u)) total += other;
    }
    int largest = value;
    for (int offset = 16; offset > 0; offset /= 2) {
        int other = __shfl_xor_sync(mask, largest, offset);
        if (mask >> (lane ^ offset) & 1u) largest = other > largest ? other : largest;
    }
    int prefix = value;
    for (int offset = 1; offset < 32; offset *= 2) {
        int before = __shfl_up_sync(mask, prefix, offset);
        if (lane >= offset) prefix += before;
    }
    unsigned odd = __ballot_sync(mask, value & 1);
    int third = __shfl_sync(mask, value, 3);
    if (!__all_sync(mask, value >= 0) || __any_sync(mask, value < 0)) return;
    __syncwarp(mask);
    scan[i] = prefix;
    broadcast[i] = third;
    if (lane == 0) {
        sum[warp] = total;
        max_out[warp] = largest;
        ballot[warp] = odd;
    }
}

/* sub-warp shuffles (width 8): the segment's first lane, a butterfly, a shift down */
__global__ void segment_shuffles(int *first, int *swapped, int *next) {
    int value = 100 + (int)threadIdx.x;
    first[threadIdx.x] = __shfl_sync(0xffffffffu, value, 0, 8);
    swapped[threadIdx.x] = __shfl_xor_sync(0xffffffffu, value, 4, 8);
    next[threadIdx.x] = __shfl_down_sync(0xffffffffu, value, 1, 8);
}

__global__ void atomic_counts(const int *bins, int count, int *histogram, float *total,
                              unsigned long long *big, int *largest) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    atomicAdd(&histogram[bins[i]], 1);
    atomicAdd(total, 0.5f);
    atomicAdd(big, 1ull << 33);
    atomicMax(largest, bins[i]);
}

/* ---- host-side launchers in the kernel files' style --------------------------------------- */
static gc_status launch_scale(const float *x, float *y, int rows, int cols, float factor) {
    dim3 block(8, 4);
    dim3 grid((unsigned)gc_ceil_div(cols, block.x), (unsigned)gc_ceil_div(rows, block.y));
    GC_LAUNCH(scale_2d, grid, block, 0, nullptr)(x, y, rows, cols, factor);
    GC_CHECK_LAUNCH("scale_2d");
    return GC_SUCCESS;
}

static gc_status launch_oversized_block() {
    GC_LAUNCH(scale_2d, dim3(1), dim3(2048), 0, nullptr)(nullptr, nullptr, 0, 0, 1.0f);
    GC_CHECK_LAUNCH("oversized block");
    return GC_SUCCESS;
}

/* ---- checks ------------------------------------------------------------------------------- */
static void test_library() {
    CHECK(gc_abi_version() == GC_ABI_VERSION, "abi %d", gc_abi_version());
    CHECK(strcmp(gc_runtime_kind(), "emulation") == 0, "kind %s", gc_runtime_kind());
    for (int s = GC_SUCCESS; s <= GC_ERROR_DEVICE_LOST; ++s)
        CHECK(strncmp(gc_status_string((gc_status)s), "GC_", 3) == 0, "status %d", s);
    CHECK(strcmp(gc_status_string((gc_status)99), "unknown gc_status") == 0, "unknown");
    CHECK(gc_malloc(nullptr, 16) == GC_ERROR_INVALID_ARGUMENT, "NULL ptr accepted");
    CHECK(strstr(gc_last_error(), "gc_malloc") && strstr(gc_last_error(), "ptr is NULL"),
          "last error '%s'", gc_last_error());
    void *p = nullptr;
    CHECK(gc_malloc(&p, -1) == GC_ERROR_INVALID_ARGUMENT, "negative size accepted");
    CHECK(strstr(gc_last_error(), "-1"), "last error '%s'", gc_last_error());
    int32_t count = 0, major = 0, minor = 0, sms = 0;
    int64_t memory = 0;
    char name[8];
    CHECK_OK(gc_device_count(&count));
    CHECK(count == 1, "count %d", count);
    CHECK_OK(gc_device_properties(0, name, sizeof name, &major, &minor, &memory, &sms));
    CHECK(strlen(name) == 7 && major == 8 && memory > 0, "name '%s' major %d", name, major);
    CHECK(gc_set_device(1) == GC_ERROR_INVALID_ARGUMENT, "device 1 accepted");
}

static void test_memory_streams_events() {
    const int n = 1000;
    std::vector<float> host(n), back(n, -1.0f);
    for (int i = 0; i < n; ++i) host[i] = (float)i * 0.25f;
    void *a = nullptr, *b = nullptr, *none = &a;
    gc_stream stream = nullptr;
    gc_event start = nullptr, end = nullptr;
    CHECK_OK(gc_malloc(&none, 0));
    CHECK(none == nullptr, "0 bytes gave %p", none);
    CHECK_OK(gc_malloc(&a, n * sizeof(float)));
    CHECK_OK(gc_malloc(&b, n * sizeof(float)));
    CHECK(((uintptr_t)a & 255) == 0, "%p not 256-byte aligned", a);
    CHECK_OK(gc_stream_create(&stream));
    CHECK_OK(gc_event_create(&start));
    CHECK_OK(gc_event_create(&end));
    CHECK_OK(gc_event_record(start, stream));
    CHECK_OK(gc_memcpy_h2d(a, host.data(), n * sizeof(float), stream));
    CHECK_OK(gc_memcpy_d2d(b, a, n * sizeof(float), stream));
    CHECK_OK(gc_memset(a, 0, n * sizeof(float), nullptr));
    CHECK_OK(gc_memcpy_d2h(back.data(), b, n * sizeof(float), stream));
    CHECK_OK(gc_event_record(end, stream));
    CHECK_OK(gc_stream_synchronize(stream));
    CHECK_OK(gc_event_synchronize(end));
    float ms = -1.0f;
    CHECK_OK(gc_event_elapsed_ms(&ms, start, end));
    CHECK(ms >= 0.0f, "elapsed %f", ms);
    CHECK(back == host, "round trip differs");
    CHECK_OK(gc_memcpy_d2h(back.data(), a, n * sizeof(float), nullptr));
    CHECK(back[0] == 0.0f && back[n - 1] == 0.0f, "memset left %f", back[n - 1]);
    CHECK(gc_memcpy_h2d(a, nullptr, 4, nullptr) == GC_ERROR_INVALID_ARGUMENT, "NULL src");
    CHECK_OK(gc_stream_destroy(stream));
    CHECK(gc_stream_destroy(stream) == GC_ERROR_INVALID_ARGUMENT, "double destroy accepted");
    CHECK(gc_memset(a, 0, 4, stream) == GC_ERROR_INVALID_ARGUMENT, "dead stream accepted");
    CHECK(strstr(gc_last_error(), "gc_memset"), "last error '%s'", gc_last_error());
    CHECK_OK(gc_event_destroy(start));
    CHECK_OK(gc_event_destroy(end));
    CHECK_OK(gc_free(a));
    CHECK_OK(gc_free(b));
    CHECK_OK(gc_free(nullptr));
}

static void test_launches() {
    const int rows = 13, cols = 37;
    std::vector<float> x(rows * cols), y(rows * cols, 0.0f);
    for (int i = 0; i < rows * cols; ++i) x[i] = (float)i;
    CHECK_OK(launch_scale(x.data(), y.data(), rows, cols, 3.0f));
    bool scaled = true;
    for (int i = 0; i < rows * cols; ++i) scaled = scaled && y[i] == 3.0f * (float)i;
    CHECK(scaled, "scale_2d wrong");

    std::vector<int> values(100);
    for (int i = 0; i < 100; ++i) values[i] = i;
    auto *affine = &affine_int<3, -7>;
    GC_LAUNCH(affine, dim3(2), dim3(64), 0, nullptr)(values.data(), 100);
    CHECK(gc_emu::pending_fault() == nullptr, "fault %s", gc_emu::pending_fault());
    CHECK(values[0] == -7 && values[99] == 3 * 99 - 7, "affine %d %d", values[0], values[99]);

    CHECK(launch_oversized_block() == GC_ERROR_EMULATION, "a 2048-thread block ran");
    CHECK(strstr(gc_last_error(), "oversized block") && strstr(gc_last_error(), "2048"),
          "last error '%s'", gc_last_error());
}

static void test_shared_memory() {
    const int blocks = 5, threads = 128;
    std::vector<float> x(blocks * threads), sums(blocks, 0.0f), dynamic_sums(blocks, 0.0f);
    for (int i = 0; i < blocks * threads; ++i) x[i] = (float)(i % 17);
    GC_LAUNCH(block_sum_static, dim3(blocks), dim3(threads), 0, nullptr)(x.data(), sums.data());
    GC_LAUNCH(block_sum_dynamic, dim3(blocks), dim3(threads), threads * sizeof(float),
              nullptr)(x.data(), dynamic_sums.data());
    for (int b = 0; b < blocks; ++b) {
        float expected = 0.0f;
        for (int t = 0; t < threads; ++t) expected += x[b * threads + t];
        CHECK(sums[b] == expected, "block %d static sum %f, expected %f", b, sums[b], expected);
        CHECK(dynamic_sums[b] == expected, "block %d dynamic sum %f", b, dynamic_sums[b]);
    }
}

static void test_warp_functions(int threads, int block) {
    int warps = (threads + 31) / 32;
    std::vector<int> x(threads), scan(threads), broadcast(threads);
    std::vector<int> sum(warps), largest(warps);
    std::vector<unsigned> ballot(warps);
    for (int i = 0; i < threads; ++i) x[i] = (i * 7919) % 101;
    GC_LAUNCH(warp_functions, dim3((unsigned)gc_ceil_div(threads, block)), dim3(block), 0,
              nullptr)(x.data(), sum.data(), largest.data(), scan.data(), ballot.data(),
                       broadcast.data(), threads);
    CHECK(gc_emu::pending_fault() == nullptr, "fault %s", gc_emu::pending_fault());
    for (int w = 0; w < warps; ++w) {
        int first = w * 32, last = first + 32 < threads ? first + 32 : threads;
        int expected_sum = 0, expected_max = 0, running = 0;
        unsigned expected_ballot = 0;
        for (int i = first; i < last; ++i) {
            expected_max = x[i] > expected_max ? x[i] : expected_max;
            running += x[i];
            CHECK(scan[i] == running, "threads %d: scan[%d] %d, expected %d", threads, i,
                  scan[i], running);
            CHECK(broadcast[i] == x[first + 3 < last ? first + 3 : i], "broadcast[%d]", i);
            if (x[i] & 1) expected_ballot |= 1u << (i - first);
        }
        expected_sum = running;
        CHECK(sum[w] == expected_sum, "threads %d warp %d: sum %d, expected %d", threads, w,
              sum[w], expected_sum);
        CHECK(largest[w] == expected_max, "warp %d: max %d, expected %d", w, largest[w],
              expected_max);
        CHECK(ballot[w] == expected_ballot, "warp %d: ballot %08x, expected %08x", w, ballot[w],
              expected_ballot);
    }
}

static void test_segment_shuffles() {
    int first[32], swapped[32], next[32];
    GC_LAUNCH(segment_shuffles, dim3(1), dim3(32), 0, nullptr)(first, swapped, next);
    for (int lane = 0; lane < 32; ++lane) {
        int segment = lane & ~7;
        CHECK(first[lane] == 100 + segment, "lane %d: first %d", lane, first[lane]);
        CHECK(swapped[lane] == 100 + (lane ^ 4), "lane %d: xor %d", lane, swapped[lane]);
        int expected_next = lane + 1 < segment + 8 ? lane + 1 : lane;
        CHECK(next[lane] == 100 + expected_next, "lane %d: down %d", lane, next[lane]);
    }
}

static void test_atomics() {
    const int count = 1000;
    std::vector<int> bins(count), histogram(10, 0);
    for (int i = 0; i < count; ++i) bins[i] = i % 10;
    float total = 0.0f;
    unsigned long long big = 0;
    int largest = -1;
    GC_LAUNCH(atomic_counts, dim3(4), dim3(256), 0, nullptr)(bins.data(), count,
                                                             histogram.data(), &total, &big,
                                                             &largest);
    for (int b = 0; b < 10; ++b) CHECK(histogram[b] == 100, "bin %d: %d", b, histogram[b]);
    CHECK(total == 500.0f, "total %f", total);
    CHECK(big == 1000ull << 33, "big %llu", big);
    CHECK(largest == 9, "largest %d", largest);
}

static void test_transfers_pinned_and_graphs() {
    const int64_t n = 1000;
    CHECK_OK(gc_transfer_bytes_reset());
    float *pinned = nullptr, *device = nullptr;
    CHECK_OK(gc_host_alloc((void **)&pinned, n * 4));
    CHECK(pinned && ((uintptr_t)pinned & 4095) == 0, "pinned %p", (void *)pinned);
    CHECK_OK(gc_malloc((void **)&device, n * 4));
    for (int64_t i = 0; i < n; ++i) pinned[i] = (float)i;
    gc_stream stream = nullptr;
    CHECK_OK(gc_stream_create(&stream));
    CHECK_OK(gc_memcpy_h2d(device, pinned, n * 4, stream));
    CHECK_OK(gc_memcpy_d2d(device, device, 8, stream)); /* device to device: not counted */
    CHECK_OK(gc_memcpy_d2h(pinned, device, 40, stream));
    CHECK(gc_memcpy_h2d(device, nullptr, 4, stream) == GC_ERROR_INVALID_ARGUMENT, "NULL src");
    int64_t h2d = -1, d2h = -1;
    CHECK_OK(gc_transfer_bytes(&h2d, &d2h));
    CHECK(h2d == n * 4 && d2h == 40, "h2d %lld d2h %lld", (long long)h2d, (long long)d2h);
    CHECK_OK(gc_transfer_bytes_reset());
    CHECK_OK(gc_transfer_bytes(&h2d, &d2h));
    CHECK(h2d == 0 && d2h == 0, "after reset: h2d %lld d2h %lld", (long long)h2d, (long long)d2h);
    CHECK(gc_transfer_bytes(nullptr, &d2h) == GC_ERROR_INVALID_ARGUMENT, "NULL accepted");

    CHECK(gc_graph_begin_capture(stream) == GC_ERROR_NOT_SUPPORTED, "emulated capture");
    CHECK(strstr(gc_last_error(), "run the work directly"), "'%s'", gc_last_error());
    gc_graph graph = nullptr;
    CHECK(gc_graph_end_capture(&graph, stream) == GC_ERROR_NOT_SUPPORTED && !graph, "end");
    CHECK_OK(gc_graph_destroy(nullptr));

    int32_t driver = -1, runtime = -1;
    CHECK_OK(gc_driver_version(&driver, &runtime));
    CHECK(driver == 0 && runtime == 0, "driver %d runtime %d", driver, runtime);
    CHECK_OK(gc_device_reset()); /* nothing is lost in the emulation */
    CHECK_OK(gc_memcpy_d2h(pinned, device, 4, stream));
    CHECK(pinned[0] == 0.0f, "device memory lost by the emulated reset");
    CHECK_OK(gc_stream_destroy(stream));
    CHECK_OK(gc_free(device));
    CHECK_OK(gc_host_free(pinned));
    CHECK_OK(gc_host_free(nullptr));
}

int main() {
    test_library();
    test_transfers_pinned_and_graphs();
    test_memory_streams_events();
    test_launches();
    test_shared_memory();
    test_warp_functions(96, 96);   /* three whole warps */
    test_warp_functions(200, 64);  /* a partial warp in a partial block */
    test_segment_shuffles();
    test_atomics();
    if (failures) {
        fprintf(stderr, "test_runtime: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_runtime: all checks passed\n");
    return 0;
}
