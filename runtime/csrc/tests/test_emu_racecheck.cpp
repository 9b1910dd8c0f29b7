/* test_emu_racecheck.cpp: the emulation's checking modes find planted bugs, as a program.
 *
 *   test_emu_racecheck           every check below; exit 0 when all are right
 *   test_emu_racecheck planted   runs the planted shared-memory race once and prints the
 *                                report (gc_last_error()); exit 0 if it was reported
 *
 * The program sets GRAPHC_EMU_RACECHECK=1 and GRAPHC_EMU_SCHEDULE=random:SEED (SEED 1 unless
 * the variable is already set) before its first launch. Race checks need the instrumented
 * build (`make racecheck`: compiled with -fsanitize=thread, linked with the emu-checked
 * library); the AddressSanitizer build of `make check` runs the rest (warp calls, the random
 * order) and says which checks it skipped.
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

#ifdef __SANITIZE_THREAD__
static const bool kInstrumented = true;
#else
static const bool kInstrumented = false;
#endif

/* ---- kernels ----------------------------------------------------------------------------- */
/* THE PLANTED RACE: thread 0 sums the block's values from shared memory, but no barrier
 * separates the other threads' stores from its loads. */
__global__ void racy_block_sum(const float *x, float *out) {
    __shared__ float partial[64];
    const int t = threadIdx.x;
    partial[t] = x[blockIdx.x * 64 + t];
    /* missing: __syncthreads(); */
    if (t == 0) {
        float sum = 0.0f;
        for (int i = 0; i < 64; ++i) sum += partial[i];
        out[blockIdx.x] = sum;
    }
}

/* the same with its barrier: correct */
__global__ void block_sum(const float *x, float *out) {
    __shared__ float partial[64];
    const int t = threadIdx.x;
    partial[t] = x[blockIdx.x * 64 + t];
    __syncthreads();
    if (t == 0) {
        float sum = 0.0f;
        for (int i = 0; i < 64; ++i) sum += partial[i];
        out[blockIdx.x] = sum;
    }
}

/* every block's thread 0 stores to out[0]: a write-write race between blocks */
__global__ void racy_global_store(float *out) {
    if (threadIdx.x == 0) out[0] = (float)blockIdx.x;
}

/* every thread of every block adds to one counter (and exchanges, maxes, swaps other
 * words): atomics never race */
__global__ void atomic_count(float *counter, int *tickets) {
    atomicAdd(counter, 1.0f);
    atomicExch(counter + 1, (float)threadIdx.x);
    atomicMax(tickets + 257, (int)threadIdx.x);
    atomicCAS(tickets + 258, 0, 1);
    int ticket = atomicAdd(tickets, 1);
    tickets[1 + blockIdx.x * blockDim.x + threadIdx.x] = ticket;
}

/* lane 0 stores, lane 1 loads the same shared word: racy without __syncwarp, fine with it */
__global__ void warp_handoff(int *out, int synchronise) {
    __shared__ int word[32];
    const int lane = threadIdx.x;
    if (lane == 0) word[0] = 42;
    if (synchronise) __syncwarp();
    if (lane == 1) out[0] = word[0];
}

/* half the warp shuffles at one call, the other half at another, both with a full mask */
__global__ void divergent_shuffle(int *out) {
    const int lane = threadIdx.x;
    int v;
    if (lane < 16)
        v = __shfl_sync(0xffffffffu, lane, 0);
    else
        v = __shfl_sync(0xffffffffu, lane, 1);
    out[lane] = v;
}

/* lane 0 and lane 16 keep their own half-warp masks: legal, must not be reported */
__global__ void half_warp_shuffles(int *out) {
    const int lane = threadIdx.x;
    const unsigned mask = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    out[lane] = __shfl_sync(mask, lane, 0, 16);
}

/* each thread draws a ticket: the in-order emulation hands them out by thread index */
__global__ void draw_tickets(int *tickets) {
    tickets[1 + threadIdx.x] = atomicAdd(tickets, 1);
}

/* cp.async: each thread copies x[t] into the stage, waits for it, then reads its neighbour's
 * slot; without the barrier after the waits, the neighbour's copy may not have landed */
__global__ void pipeline_shift(const float *x, float *out, int synchronise) {
    __shared__ __align__(16) float stage[64];
    const int t = threadIdx.x;
    __pipeline_memcpy_async(&stage[t], &x[t], sizeof(float));
    __pipeline_commit();
    __pipeline_wait_prior(0);
    if (synchronise) __syncthreads();
    out[t] = stage[(t + 1) % 64];
}

/* reads its own slot of the (0xff-filled) dynamic stage before and after waiting: a copy lands
 * at the wait, not when it is issued */
__global__ void pipeline_early_read(const float *x, float *out) {
    GC_DYNAMIC_SHARED(float, stage);
    const int t = threadIdx.x;
    __pipeline_memcpy_async(&stage[4 * t], &x[4 * t], 4 * sizeof(float));
    __pipeline_commit();
    __pipeline_memcpy_async(&stage[256 + t], &x[t], sizeof(float));
    __pipeline_commit();
    out[3 * t] = stage[4 * t];         /* before any wait: not landed */
    __pipeline_wait_prior(1);          /* the first group only */
    out[3 * t + 1] = stage[4 * t + 3]; /* landed */
    out[3 * t + 2] = stage[256 + t];   /* the second group: not yet */
    __pipeline_wait_prior(0);
}

/* ---- launchers --------------------------------------------------------------------------- */
static gc_status run_racy_block_sum(const float *x, float *out) {
    GC_LAUNCH(racy_block_sum, dim3(2), dim3(64), 0, nullptr)(x, out);
    GC_CHECK_LAUNCH("racy_block_sum test");
    return GC_SUCCESS;
}

static gc_status run_block_sum(const float *x, float *out) {
    GC_LAUNCH(block_sum, dim3(2), dim3(64), 0, nullptr)(x, out);
    GC_CHECK_LAUNCH("block_sum test");
    return GC_SUCCESS;
}

static gc_status run_racy_global_store(float *out) {
    GC_LAUNCH(racy_global_store, dim3(3), dim3(32), 0, nullptr)(out);
    GC_CHECK_LAUNCH("racy_global_store test");
    return GC_SUCCESS;
}

static gc_status run_atomic_count(float *counter, int *tickets) {
    GC_LAUNCH(atomic_count, dim3(4), dim3(64), 0, nullptr)(counter, tickets);
    GC_CHECK_LAUNCH("atomic_count test");
    return GC_SUCCESS;
}

static gc_status run_warp_handoff(int *out, int synchronise) {
    GC_LAUNCH(warp_handoff, dim3(1), dim3(32), 0, nullptr)(out, synchronise);
    GC_CHECK_LAUNCH("warp_handoff test");
    return GC_SUCCESS;
}

static gc_status run_divergent_shuffle(int *out) {
    GC_LAUNCH(divergent_shuffle, dim3(1), dim3(32), 0, nullptr)(out);
    GC_CHECK_LAUNCH("divergent_shuffle test");
    return GC_SUCCESS;
}

static gc_status run_half_warp_shuffles(int *out) {
    GC_LAUNCH(half_warp_shuffles, dim3(1), dim3(32), 0, nullptr)(out);
    GC_CHECK_LAUNCH("half_warp_shuffles test");
    return GC_SUCCESS;
}

static gc_status run_draw_tickets(int *tickets) {
    GC_LAUNCH(draw_tickets, dim3(1), dim3(64), 0, nullptr)(tickets);
    GC_CHECK_LAUNCH("draw_tickets test");
    return GC_SUCCESS;
}

static gc_status run_pipeline_shift(const float *x, float *out, int synchronise) {
    GC_LAUNCH(pipeline_shift, dim3(1), dim3(64), 0, nullptr)(x, out, synchronise);
    GC_CHECK_LAUNCH("pipeline_shift test");
    return GC_SUCCESS;
}

static gc_status run_pipeline_early_read(const float *x, float *out) {
    GC_LAUNCH(pipeline_early_read, dim3(1), dim3(64), 320 * sizeof(float), nullptr)(x, out);
    GC_CHECK_LAUNCH("pipeline_early_read test");
    return GC_SUCCESS;
}

static void expect_report(gc_status status, const char *test, const char *const *fragments) {
    CHECK(status == GC_ERROR_EMULATION, "%s: status %d, expected GC_ERROR_EMULATION", test,
          (int)status);
    for (const char *const *fragment = fragments; *fragment; ++fragment)
        CHECK(strstr(gc_last_error(), *fragment), "%s: '%s' not in '%s'", test, *fragment,
              gc_last_error());
}

static void expect_clean(gc_status status, const char *test) {
    CHECK(status == GC_SUCCESS, "%s: %s", test, gc_last_error());
}

/* ---- checks ------------------------------------------------------------------------------ */
static void check_races() {
    std::vector<float> x(128, 1.0f), sums(2, 0.0f);
    const char *shared_race[] = {"racy_block_sum test", "racecheck: kernel racy_block_sum",
                                 "race on __shared__ memory", "by thread (", "of block (",
                                 "test_emu_racecheck.cpp:", "no __syncthreads() orders them",
                                 nullptr};
    expect_report(run_racy_block_sum(x.data(), sums.data()), "planted shared race",
                  shared_race);
    expect_clean(run_block_sum(x.data(), sums.data()), "block sum with its barrier");
    CHECK(sums[0] == 64.0f && sums[1] == 64.0f, "block sums %f %f", sums[0], sums[1]);

    std::vector<float> one(1, 0.0f);
    const char *global_race[] = {"racecheck: kernel racy_global_store", "write-write race",
                                 "global memory at", "different blocks", nullptr};
    expect_report(run_racy_global_store(one.data()), "cross-block store", global_race);

    std::vector<float> counter(2, 0.0f);
    std::vector<int> tickets(1 + 256 + 2, 0);
    expect_clean(run_atomic_count(counter.data(), tickets.data()), "atomics");
    CHECK(counter[0] == 256.0f && tickets[0] == 256 && tickets[257] == 63 && tickets[258] == 1,
          "atomic results %f %d %d %d", counter[0], tickets[0], tickets[257], tickets[258]);

    std::vector<int> word(1, 0);
    const char *warp_race[] = {"racecheck: kernel warp_handoff", "thread (0,0,0)",
                               "thread (1,0,0)", nullptr};
    expect_report(run_warp_handoff(word.data(), 0), "warp handoff without __syncwarp",
                  warp_race);
    expect_clean(run_warp_handoff(word.data(), 1), "warp handoff with __syncwarp");
    CHECK(word[0] == 42, "handed off %d", word[0]);

    /* a library kernel, instrumented in the checked library: a block reduction with its
     * barriers (gc_reduce_f32 over rows: kernel_util.cuh's block_reduce) */
    std::vector<float> rows(3 * 1000), reduced(3, 0.0f);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = (float)(i % 7);
    expect_clean(gc_reduce_f32(GC_REDUCE_SUM, 3, 1000, 1, rows.data(), reduced.data(), nullptr),
                 "gc_reduce_f32 (library block reduction)");
    float expected = 0.0f;
    for (int i = 0; i < 1000; ++i) expected += (float)(i % 7);
    CHECK(reduced[0] == expected, "row sum %f, expected %f", reduced[0], expected);
}

static void check_pipeline_race() {
    std::vector<float> x(64), out(64, 0.0f);
    for (int i = 0; i < 64; ++i) x[i] = (float)i;
    const char *race[] = {"racecheck: kernel pipeline_shift", "race on __shared__ memory",
                          "__pipeline_wait_prior", "no __syncthreads() orders them", nullptr};
    expect_report(run_pipeline_shift(x.data(), out.data(), 0), "cp.async without a barrier",
                  race);
    expect_clean(run_pipeline_shift(x.data(), out.data(), 1), "cp.async with its barrier");
    CHECK(out[0] == 1.0f && out[63] == 0.0f, "shifted %f %f", out[0], out[63]);
}

static void check_pipeline_landing() {
    std::vector<float> x(256), out(3 * 64, 0.0f);
    for (int i = 0; i < 256; ++i) x[i] = (float)i;
    expect_clean(run_pipeline_early_read(x.data(), out.data()), "cp.async early read");
    CHECK(out[3 * 5] != out[3 * 5] && out[3 * 5 + 1] == 23.0f && out[3 * 5 + 2] != out[3 * 5 + 2],
          "thread 5 read %f before its wait (expected the unlanded NaN fill), %f after "
          "(expected 23), %f from the group not waited for (expected NaN)", out[15], out[16],
          out[17]);
}

static void check_warp_calls() {
    std::vector<int> lanes(32, -1);
    const char *divergent[] = {"divergent_shuffle test", "warp 0 lane",
                               "test_emu_racecheck.cpp:", "which that mask names",
                               "every lane of the mask must make the same call", nullptr};
    expect_report(run_divergent_shuffle(lanes.data()), "divergent shuffles", divergent);
    expect_clean(run_half_warp_shuffles(lanes.data()), "half-warp shuffles");
    CHECK(lanes[3] == 0 && lanes[20] == 16, "half-warp shuffles gave %d %d", lanes[3],
          lanes[20]);
}

static void check_random_order() {
    /* in order, thread t would draw ticket t; a random order hands them out shuffled */
    std::vector<int> tickets(1 + 64, 0);
    expect_clean(run_draw_tickets(tickets.data()), "tickets");
    int out_of_order = 0;
    for (int t = 0; t < 64; ++t) out_of_order += tickets[1 + t] != t;
    CHECK(tickets[0] == 64 && out_of_order > 0, "%d tickets, %d out of thread order: the "
          "order is not random", tickets[0], out_of_order);
}

static int planted_only() {
    std::vector<float> x(128, 1.0f), sums(2, 0.0f);
    gc_status status = run_racy_block_sum(x.data(), sums.data());
    printf("%s\n%s\n", gc_status_string(status), gc_last_error());
    return status == GC_ERROR_EMULATION ? 0 : 1;
}

int main(int argc, char **argv) {
    setenv("GRAPHC_EMU_RACECHECK", "1", 1);
    setenv("GRAPHC_EMU_SCHEDULE", "random:1", 0);
    if (argc > 1) {
        if (strcmp(argv[1], "planted") == 0 && kInstrumented) return planted_only();
        fprintf(stderr, "usage: %s [planted] (planted: the instrumented build only)\n",
                argv[0]);
        return 2;
    }
    if (kInstrumented) {
        printf("test_emu_racecheck: planting races: the reports on stderr are expected\n");
        fflush(stdout);
        check_races();
        check_pipeline_race();
    }
    else
        printf("test_emu_racecheck: not instrumented (built without -fsanitize=thread): race "
               "checks skipped; `make racecheck` runs them\n");
    check_warp_calls();
    check_random_order();
    check_pipeline_landing();
    if (failures) {
        fprintf(stderr, "test_emu_racecheck: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_emu_racecheck: all %s\n",
           kInstrumented ? "planted bugs found, correct kernels clean"
                         : "warp-call and schedule checks passed");
    return 0;
}
