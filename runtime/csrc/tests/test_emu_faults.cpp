/* test_emu_faults.cpp: faults the emulation must report, as a program.
 *
 *   test_emu_faults                   checks every reported fault (and the sticky mode,
 *                                     GRAPHC_EMU_STICKY); exit 0 when all are right
 *   test_emu_faults partial_barrier   prints the partial-barrier message; exit 0 if reported
 *   test_emu_faults oob               writes one float past a gc_malloc'ed buffer inside a
 *                                     kernel: under AddressSanitizer the process dies with a
 *                                     heap-buffer-overflow report (exit 0 means unnoticed)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "common.h"

static int failures = 0;

#define CHECK(cond, ...)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                             \
            fprintf(stderr, "\n");                                                    \
            ++failures;                                                               \
        }                                                                             \
    } while (0)

/* in block 1 only, threads >= 40 leave before the barrier the others wait at */
__global__ void partial_barrier(float *out) {
    if (blockIdx.x == 1 && threadIdx.x >= 40) return;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}

/* lane 5 leaves; the others shuffle with a full mask that still names it */
__global__ void shuffle_with_exited_lane(int *out) {
    if (threadIdx.x == 5) return;
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1);
}

/* in one warp, half the lanes wait at __syncthreads, the other half at a warp shuffle */
__global__ void barrier_mismatch(int *out) {
    if (threadIdx.x < 16) {
        __syncthreads();
    } else {
        out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
    }
}

__global__ void fill_one_too_many(float *data, int count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= count) data[i] = 2.0f; /* the bug: <= */
}

__global__ void write_index(int *out) { out[threadIdx.x] = (int)threadIdx.x; }

static gc_status run_partial_barrier(float *out) {
    GC_LAUNCH(partial_barrier, dim3(3), dim3(64), 0, nullptr)(out);
    GC_CHECK_LAUNCH("partial_barrier test");
    return GC_SUCCESS;
}

static gc_status run_shuffle_with_exited_lane(int *out) {
    GC_LAUNCH(shuffle_with_exited_lane, dim3(1), dim3(32), 0, nullptr)(out);
    GC_CHECK_LAUNCH("exited-lane shuffle test");
    return GC_SUCCESS;
}

static gc_status run_barrier_mismatch(int *out) {
    GC_LAUNCH(barrier_mismatch, dim3(1), dim3(32), 0, nullptr)(out);
    GC_CHECK_LAUNCH("barrier mismatch test");
    return GC_SUCCESS;
}

static gc_status run_write_index(int *out) {
    GC_LAUNCH(write_index, dim3(1), dim3(64), 0, nullptr)(out);
    GC_CHECK_LAUNCH("write_index");
    return GC_SUCCESS;
}

static void expect_fault(gc_status status, const char *test, const char *const *fragments) {
    CHECK(status == GC_ERROR_EMULATION, "%s: status %d, expected GC_ERROR_EMULATION", test,
          (int)status);
    for (const char *const *fragment = fragments; *fragment; ++fragment)
        CHECK(strstr(gc_last_error(), *fragment), "%s: '%s' not in '%s'", test, *fragment,
              gc_last_error());
}

/* GRAPHC_EMU_STICKY=1: a fault is sticky as on a GPU until gc_device_reset, which frees
 * every device allocation; the first fault is named by every call in between */
static void check_sticky_mode() {
    setenv("GRAPHC_EMU_STICKY", "1", 1);
    void *kept = nullptr;
    CHECK(gc_malloc(&kept, 64) == GC_SUCCESS, "gc_malloc: %s", gc_last_error());
    std::vector<float> floats(3 * 64, 0.0f);
    CHECK(run_partial_barrier(floats.data()) == GC_ERROR_DEVICE_LOST,
          "sticky fault: status %s", gc_last_error());
    CHECK(strstr(gc_last_error(), "reached by 40 of 64 threads") &&
              strstr(gc_last_error(), "GRAPHC_EMU_STICKY"), "sticky fault: '%s'",
          gc_last_error());
    void *later = nullptr;
    CHECK(gc_malloc(&later, 64) == GC_ERROR_DEVICE_LOST && !later, "gc_malloc while lost");
    CHECK(strstr(gc_last_error(), "gc_malloc: the CUDA context is unusable since an earlier "
                                  "kernel fault (partial_barrier test: kernel partial_barrier"),
          "the first fault is named: '%s'", gc_last_error());
    std::vector<int> ints(64, -1);
    CHECK(run_write_index(ints.data()) == GC_ERROR_DEVICE_LOST, "a launch while lost");
    CHECK(gc_device_synchronize() == GC_ERROR_DEVICE_LOST, "synchronize while lost");
    setenv("GRAPHC_EMU_STICKY", "unrecoverable", 1);
    CHECK(gc_device_reset() == GC_ERROR_DEVICE_LOST, "an unrecoverable reset succeeded");
    setenv("GRAPHC_EMU_STICKY", "1", 1);
    CHECK(gc_device_reset() == GC_SUCCESS, "reset: %s", gc_last_error());
    CHECK(gc_free(kept) == GC_ERROR_INVALID_ARGUMENT, "a pointer lost in the reset was freed");
    CHECK(gc_malloc(&later, 64) == GC_SUCCESS && gc_free(later) == GC_SUCCESS,
          "memory after the reset: %s", gc_last_error());
    CHECK(run_write_index(ints.data()) == GC_SUCCESS && ints[63] == 63, "launch after reset");
    unsetenv("GRAPHC_EMU_STICKY");
}

static int check_all() {
    std::vector<float> floats(3 * 64, 0.0f);
    std::vector<int> ints(64, -1);
    const char *partial[] = {"partial_barrier test", "kernel partial_barrier", "block (1,0,0)",
                             "reached by 40 of 64 threads", "24 exited", nullptr};
    expect_fault(run_partial_barrier(floats.data()), "partial barrier", partial);
    CHECK(floats[0] == 1.0f && floats[64] == 0.0f, "block 0 %f, block 1 %f", floats[0],
          floats[64]);
    CHECK(floats[128] == 0.0f, "block 2 ran after the fault in block 1");

    const char *exited[] = {"exited-lane shuffle test", "warp 0", "lane 5 has exited",
                            "0xffffffff", nullptr};
    expect_fault(run_shuffle_with_exited_lane(ints.data()), "exited lane", exited);

    const char *mismatch[] = {"barrier mismatch test", "lane 0 waits at __syncthreads()",
                              nullptr};
    expect_fault(run_barrier_mismatch(ints.data()), "barrier mismatch", mismatch);

    /* after faults the fibers are reusable */
    CHECK(run_write_index(ints.data()) == GC_SUCCESS, "launch after faults: %s",
          gc_last_error());
    CHECK(ints[0] == 0 && ints[63] == 63, "write_index %d %d", ints[0], ints[63]);

    check_sticky_mode();
    if (failures) {
        fprintf(stderr, "test_emu_faults: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_emu_faults: all faults reported\n");
    return 0;
}

static int partial_barrier_only() {
    std::vector<float> out(3 * 64);
    gc_status status = run_partial_barrier(out.data());
    printf("%s\n%s\n", gc_status_string(status), gc_last_error());
    return status == GC_ERROR_EMULATION ? 0 : 1;
}

static int out_of_bounds() {
    const int count = 100;
    void *data = nullptr;
    if (gc_malloc(&data, count * sizeof(float)) != GC_SUCCESS) return 2;
    GC_LAUNCH(fill_one_too_many, dim3(1), dim3(128), 0, nullptr)(static_cast<float *>(data),
                                                                 count);
    gc_free(data);
    printf("the out-of-bounds write went unnoticed\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 1) return check_all();
    if (strcmp(argv[1], "partial_barrier") == 0) return partial_barrier_only();
    if (strcmp(argv[1], "oob") == 0) return out_of_bounds();
    fprintf(stderr, "usage: %s [partial_barrier|oob]\n", argv[0]);
    return 2;
}
