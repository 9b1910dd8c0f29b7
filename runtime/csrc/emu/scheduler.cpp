/* scheduler.cpp: the emulation core behind gc_emu.h: fibers, the per-block scheduler, warp
 * exchanges and the fault record.
 *
 * Invariants:
 *   - one Scheduler per OS thread (thread_local); a launch runs all its blocks on the
 *     calling thread, so a fiber never migrates between OS threads (compilers cache
 *     thread-local addresses) and __shared__ (static thread_local) is per block;
 *   - a block is run in passes: every runnable fiber runs until it waits at a barrier or
 *     exits; after a pass nothing is runnable, so each waiting barrier either completes now or
 *     never: the latter is recorded as a fault (no hang is possible);
 *   - warp exchanges use two slot buffers alternating by generation: a lane can be at most
 *     one exchange ahead of its slowest peer, so it never overwrites a slot still to be read;
 *   - fiber stacks are mmap'ed once per OS thread (kStackBytes each, a PROT_NONE guard page
 *     below) and reused; every switch is announced to AddressSanitizer when it is on;
 *   - the checking modes (emu_internal.h) change only this: the order fibers resume in
 *     (random mode: shuffled every pass, and a fiber may be preempted at an instrumented
 *     memory access, which yields it for one pass), the lanes of a warp exchange are checked
 *     to agree, and racecheck.cpp hears of launches, blocks and completed barriers.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "emu_internal.h"
#include "gc_emu.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define GC_EMU_ASAN 1
#endif

#if !defined(__x86_64__)
#error "the graphc emulation's fiber switch is written for x86-64 (System V ABI) only"
#endif

/* gc_emu_switch(save, next): saves the callee-saved registers on the current stack, stores
 * the stack pointer in *save and resumes the stack `next` (saved the same way).
 * gc_emu_fiber_start: a new fiber's first return address; calls r13(r12). */
extern "C" void gc_emu_switch(void **save, void *next);
extern "C" void gc_emu_fiber_start();
asm(R"(
    .text
    .globl gc_emu_switch
    .hidden gc_emu_switch
    .type gc_emu_switch, @function
gc_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size gc_emu_switch, .-gc_emu_switch

    .globl gc_emu_fiber_start
    .hidden gc_emu_fiber_start
    .type gc_emu_fiber_start, @function
gc_emu_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size gc_emu_fiber_start, .-gc_emu_fiber_start
)");

namespace gc_emu {

__thread ThreadIndex current;

namespace detail {

__thread bool hooks_active;

namespace {

Modes parse_modes() {
    Modes m;
    const char *race = getenv("GRAPHC_EMU_RACECHECK");
    if (race && *race && strcmp(race, "0") != 0) {
        m.racecheck = true;
        m.race_is_fault = strcmp(race, "warn") != 0;
        if (strcmp(race, "1") != 0 && strcmp(race, "warn") != 0)
            m.error = std::string("GRAPHC_EMU_RACECHECK='") + race +
                      "' is not understood; expected 1 (a race fails the launch), warn (races "
                      "are only reported) or 0";
    }
    const char *schedule = getenv("GRAPHC_EMU_SCHEDULE");
    if (schedule && *schedule && strcmp(schedule, "in-order") != 0) {
        char *end = nullptr;
        if (strncmp(schedule, "random:", 7) == 0 && schedule[7]) {
            unsigned long long seed = strtoull(schedule + 7, &end, 10);
            if (*end == '\0') {
                m.random = true;
                m.seed = seed;
            }
        }
        if (!m.random)
            m.error = std::string("GRAPHC_EMU_SCHEDULE='") + schedule +
                      "' is not understood; expected random:SEED (SEED a decimal integer) or "
                      "in-order";
    }
    return m;
}

/* xorshift64*, seeded per OS thread from the mode's seed (splitmix64 of it) */
__thread uint64_t tls_random_state;

} /* namespace */

const Modes &modes() {
    static const Modes parsed = parse_modes();
    return parsed;
}

uint64_t next_random() {
    uint64_t x = tls_random_state;
    if (x == 0) {
        uint64_t z = modes().seed + 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        x = (z ^ (z >> 31)) | 1u;
    }
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    tls_random_state = x;
    return x * 0x2545f4914f6cdd1dull;
}

} /* namespace detail */

using detail::modes;

namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kGuardBytes = 4096;

/* kYielded: gave the other fibers one pass (__activemask, or preempted at a memory access by
 * the random schedule) and runs again after it */
enum class State : unsigned char { kRunnable, kYielded, kAtBlockBarrier, kAtWarpBarrier, kExited };

struct Fiber {
    void *sp = nullptr;
    char *stack = nullptr; /* lowest usable address; the guard page lies below */
    State state = State::kExited;
    bool preempted = false; /* stopped at a memory access, not at a barrier or exit */
    uint3 thread_idx{0, 0, 0};
    void *fake_stack = nullptr; /* AddressSanitizer's per-fiber state */
    /* cp.async copies issued and not yet waited for; each tagged with its commit group */
    std::vector<PipelineCopy> pipeline;
    uint64_t committed = 0; /* groups committed: the uncommitted copies carry this number */
    /* the copies its __pipeline_wait_prior is performing: per fiber, since the random
     * schedule may switch fibers in the middle of that copy loop */
    std::vector<PipelineCopy> landing;
};

struct Warp {
    alignas(16) unsigned char slots[2][kWarpSize][kSlotBytes];
    unsigned generation = 0;
    unsigned arrived = 0;       /* lanes waiting at the current exchange */
    unsigned required = 0;      /* union of the masks they gave */
    unsigned last_arrived = 0;  /* lanes that took part in the last completed exchange */
    /* each waiting lane's call: mask and source line (file NULL: __syncwarp, which lanes may
     * reach from different places); compared in the checking modes */
    unsigned lane_mask[kWarpSize];
    const char *lane_file[kWarpSize];
    int lane_line[kWarpSize];
};

struct Scheduler {
    std::vector<Fiber> fibers; /* grows to the largest block seen */
    Warp warps[kMaxBlockThreads / kWarpSize];
    int threads = 0;  /* in the running block */
    int running = -1; /* fiber index, -1 in the scheduler */
    void *scheduler_sp = nullptr;
    KernelBody body = nullptr;
    const void *closure = nullptr;
    unsigned char *dynamic_shared = nullptr;
    int64_t dynamic_shared_bytes = 0;
    bool stacks_dirty = false; /* a faulted block left fibers mid-kernel */
    void *fake_stack = nullptr;
    const void *stack_bottom = nullptr;
    size_t stack_size = 0;
    std::vector<std::pair<void *, size_t>> stack_regions; /* mmap'ed, unmapped at thread exit */
    std::vector<int> order; /* random mode: the order of the next pass */

    ~Scheduler() {
        for (auto &region : stack_regions) munmap(region.first, region.second);
    }
};

__thread Scheduler *tls_scheduler;             /* fast access from the fibers */
thread_local std::unique_ptr<Scheduler> tls_owner; /* frees it when the thread exits */
thread_local std::string tls_fault;

Scheduler &scheduler() {
    if (!tls_scheduler) {
        tls_owner.reset(new Scheduler());
        tls_scheduler = tls_owner.get();
    }
    return *tls_scheduler;
}

Scheduler &running_scheduler(const char *what) {
    Scheduler *s = tls_scheduler;
    if (!s || s->running < 0) {
        fprintf(stderr, "graphc emulation: %s called outside a kernel launch\n", what);
        abort();
    }
    return *s;
}

void grow_fibers(Scheduler &s, int count) {
    int have = (int)s.fibers.size();
    if (count <= have) return;
    size_t each = kStackBytes + kGuardBytes;
    size_t bytes = each * (size_t)(count - have);
    void *region = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (region == MAP_FAILED) {
        fprintf(stderr, "graphc emulation: cannot map %zu bytes of fiber stacks\n", bytes);
        abort();
    }
    s.stack_regions.emplace_back(region, bytes);
    s.fibers.resize(count);
    for (int i = have; i < count; ++i) {
        char *base = static_cast<char *>(region) + each * (size_t)(i - have);
        mprotect(base, kGuardBytes, PROT_NONE);
        s.fibers[i].stack = base + kGuardBytes;
    }
}

void asan_start_switch(void **fake_stack, const void *bottom, size_t size) {
#ifdef GC_EMU_ASAN
    __sanitizer_start_switch_fiber(fake_stack, bottom, size);
#else
    (void)fake_stack, (void)bottom, (void)size;
#endif
}

void asan_finish_switch(void *fake_stack, const void **bottom_old, size_t *size_old) {
#ifdef GC_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake_stack, bottom_old, size_old);
#else
    (void)fake_stack, (void)bottom_old, (void)size_old;
#endif
}

/* Fiber side: back to the scheduler; `exiting` fibers never come back. */
void yield(Scheduler &s, Fiber &f, bool exiting) {
    asan_start_switch(exiting ? nullptr : &f.fake_stack, s.stack_bottom, s.stack_size);
    gc_emu_switch(&f.sp, s.scheduler_sp);
    asan_finish_switch(f.fake_stack, &s.stack_bottom, &s.stack_size);
}

void land_copy(const PipelineCopy &c) {
    memcpy(c.dst, c.src, c.bytes - c.zfill);
    memset(static_cast<char *>(c.dst) + (c.bytes - c.zfill), 0, c.zfill);
}

extern "C" void gc_emu_fiber_main(Fiber *f) {
    Scheduler &s = *tls_scheduler;
    asan_finish_switch(nullptr, &s.stack_bottom, &s.stack_size);
    s.body(s.closure);
    for (const PipelineCopy &c : f->pipeline) land_copy(c); /* never waited for: lands now */
    f->pipeline.clear();
    f->state = State::kExited;
    yield(s, *f, true);
    __builtin_unreachable();
}

/* Lays out a fresh frame that gc_emu_switch "returns" into gc_emu_fiber_start from. */
void prepare(Fiber &f) {
    /* stacks lie 260 KiB apart: without a per-fiber offset every fiber's frames would map to
     * the same L1 cache sets */
    size_t color = (size_t)(&f - tls_scheduler->fibers.data()) % 64 * 64;
    uintptr_t top = (reinterpret_cast<uintptr_t>(f.stack) + kStackBytes - color) & ~uintptr_t(15);
    void **slot = reinterpret_cast<void **>(top - 8); /* return address: rsp+8 is aligned */
    *slot = reinterpret_cast<void *>(&gc_emu_fiber_start);
    void **regs = slot - 6; /* popped as r15, r14, r13, r12, rbx, rbp */
    regs[0] = nullptr;
    regs[1] = nullptr;
    regs[2] = reinterpret_cast<void *>(&gc_emu_fiber_main);
    regs[3] = &f;
    regs[4] = nullptr;
    regs[5] = nullptr;
    f.sp = regs;
    f.fake_stack = nullptr;
}

void resume(Scheduler &s, int index) {
    Fiber &f = s.fibers[index];
    current.thread_idx = f.thread_idx;
    s.running = index;
    asan_start_switch(&s.fake_stack, f.stack, kStackBytes);
    gc_emu_switch(&s.scheduler_sp, f.sp);
    asan_finish_switch(s.fake_stack, nullptr, nullptr);
    s.running = -1;
}

unsigned existing_lanes(const Scheduler &s, int warp) {
    int lanes = s.threads - warp * kWarpSize;
    return lanes >= kWarpSize ? 0xffffffffu : (1u << lanes) - 1u;
}

void set_fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void set_fault(const char *fmt, ...) {
    char message[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    tls_fault = message;
}

bool same_call(const Warp &warp, int a, int b) {
    if (warp.lane_mask[a] != warp.lane_mask[b] || warp.lane_line[a] != warp.lane_line[b])
        return false;
    const char *fa = warp.lane_file[a], *fb = warp.lane_file[b];
    return fa == fb || (fa && fb && strcmp(fa, fb) == 0);
}

/* The checking modes: every lane of a completing exchange calls with a mask naming itself,
 * and the lanes its mask names that take part made the same call (same source line, same
 * mask), as CUDA requires of __shfl*_sync and the votes; __syncwarp is exempt (lanes may
 * reach different __syncwarp calls). Records a fault and returns false otherwise. */
bool check_warp_calls(const Scheduler &s, int w, const char *kernel) {
    const Warp &warp = s.warps[w];
    int first = __builtin_ctz(warp.arrived);
    bool uniform = true;
    for (unsigned lanes = warp.arrived; lanes && uniform; lanes &= lanes - 1)
        uniform = same_call(warp, first, __builtin_ctz(lanes));
    if (uniform && (!warp.lane_file[first] || (warp.lane_mask[first] & warp.arrived) ==
                                                  warp.arrived))
        return true;
    for (unsigned lanes = warp.arrived; lanes; lanes &= lanes - 1) {
        int lane = __builtin_ctz(lanes);
        if (!warp.lane_file[lane]) continue;
        if (!(warp.lane_mask[lane] >> lane & 1u)) {
            set_fault("kernel %s block (%u,%u,%u): warp %d lane %d calls a warp function at "
                      "%s:%d with mask 0x%08x, which does not name the lane itself",
                      kernel, current.block_idx.x, current.block_idx.y, current.block_idx.z, w,
                      lane, warp.lane_file[lane], warp.lane_line[lane], warp.lane_mask[lane]);
            return false;
        }
        for (unsigned named = warp.lane_mask[lane] & warp.arrived; named; named &= named - 1) {
            int other = __builtin_ctz(named);
            if (same_call(warp, lane, other)) continue;
            char where[256];
            if (warp.lane_file[other])
                snprintf(where, sizeof where, "a warp function at %s:%d with mask 0x%08x",
                         warp.lane_file[other], warp.lane_line[other], warp.lane_mask[other]);
            else
                snprintf(where, sizeof where, "__syncwarp(0x%08x)", warp.lane_mask[other]);
            set_fault("kernel %s block (%u,%u,%u): warp %d lane %d calls a warp function at "
                      "%s:%d with mask 0x%08x, but lane %d, which that mask names, calls %s: "
                      "every lane of the mask must make the same call",
                      kernel, current.block_idx.x, current.block_idx.y, current.block_idx.z, w,
                      lane, warp.lane_file[lane], warp.lane_line[lane], warp.lane_mask[lane],
                      other, where);
            return false;
        }
    }
    return true;
}

/* After a pass: completes the warp exchanges that can complete; records a fault for one
 * that never can. Returns whether any fiber became runnable; false with a fault set stops. */
bool release_warps(Scheduler &s, const char *kernel, int *fault) {
    bool released = false;
    for (int w = 0; w * kWarpSize < s.threads; ++w) {
        Warp &warp = s.warps[w];
        if (!warp.arrived) continue;
        unsigned missing = warp.required & existing_lanes(s, w) & ~warp.arrived;
        unsigned stuck = 0; /* missing lanes that can never arrive */
        for (unsigned lanes = missing; lanes; lanes &= lanes - 1) {
            State state = s.fibers[w * kWarpSize + __builtin_ctz(lanes)].state;
            if (state == State::kExited || state == State::kAtBlockBarrier)
                stuck |= lanes & -lanes;
        }
        /* a yielded lane still has to come: wait for it, also before reporting a stuck lane
         * (the report then does not depend on the schedule) */
        if (missing & ~stuck) continue;
        if (stuck) {
            int lane = __builtin_ctz(stuck);
            const Fiber &f = s.fibers[w * kWarpSize + lane];
            set_fault("kernel %s block (%u,%u,%u): a warp function (__shfl*/__ballot/__any/"
                      "__all/__syncwarp) in warp %d waits for mask 0x%08x but lane %d %s "
                      "(lanes arrived 0x%08x)",
                      kernel, current.block_idx.x, current.block_idx.y, current.block_idx.z, w,
                      warp.required, lane,
                      f.state == State::kExited ? "has exited" : "waits at __syncthreads()",
                      warp.arrived);
            *fault = 1;
            return false;
        }
        if (modes().checking() && !check_warp_calls(s, w, kernel)) {
            *fault = 1;
            return false;
        }
        warp.last_arrived = warp.arrived;
        for (unsigned lanes = warp.arrived; lanes; lanes &= lanes - 1)
            s.fibers[w * kWarpSize + __builtin_ctz(lanes)].state = State::kRunnable;
        warp.arrived = 0;
        warp.required = 0;
        warp.generation++;
        released = true;
    }
    return released;
}

/* random mode: a pass resumes the fibers in a fresh random order */
void resume_shuffled(Scheduler &s) {
    s.order.resize(s.threads);
    for (int i = 0; i < s.threads; ++i) s.order[i] = i;
    for (int i = s.threads - 1; i > 0; --i)
        std::swap(s.order[i], s.order[detail::next_random() % (uint64_t)(i + 1)]);
    for (int i : s.order)
        if (s.fibers[i].state == State::kRunnable) resume(s, i);
}

bool run_block(Scheduler &s, const char *kernel, bool random) {
    for (;;) {
        if (random) {
            resume_shuffled(s);
        } else {
            for (int i = 0; i < s.threads; ++i)
                if (s.fibers[i].state == State::kRunnable) resume(s, i);
        }
        int exited = 0, at_barrier = 0;
        for (int i = 0; i < s.threads; ++i) {
            exited += s.fibers[i].state == State::kExited;
            at_barrier += s.fibers[i].state == State::kAtBlockBarrier;
        }
        if (exited == s.threads) return true;
        bool yielded = false;
        for (int i = 0; i < s.threads; ++i)
            if (s.fibers[i].state == State::kYielded) {
                s.fibers[i].state = State::kRunnable;
                yielded = true;
            }
        int fault = 0;
        bool released = release_warps(s, kernel, &fault);
        if (fault) return false;
        if (released || yielded) continue;
        if (at_barrier == s.threads) {
            for (int i = 0; i < s.threads; ++i) s.fibers[i].state = State::kRunnable;
            if (detail::hooks_active) detail::race_barrier();
            continue;
        }
        set_fault("kernel %s block (%u,%u,%u): __syncthreads() reached by %d of %d threads "
                  "(%d exited, %d waiting in a warp function): a barrier in divergent code",
                  kernel, current.block_idx.x, current.block_idx.y, current.block_idx.z,
                  at_barrier, s.threads, exited, s.threads - exited - at_barrier);
        return false;
    }
}

bool check_configuration(const char *kernel, dim3 grid, dim3 block, int64_t shared_bytes) {
    uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (threads == 0 || threads > (uint64_t)kMaxBlockThreads || block.z > 64) {
        set_fault("kernel %s: block (%u,%u,%u) has %llu threads; expected 1 to %d (z <= 64)",
                  kernel, block.x, block.y, block.z, (unsigned long long)threads,
                  kMaxBlockThreads);
        return false;
    }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
        grid.z > 65535) {
        set_fault("kernel %s: grid (%u,%u,%u) is out of range; expected x in [1, 2^31 - 1], "
                  "y and z in [1, 65535]",
                  kernel, grid.x, grid.y, grid.z);
        return false;
    }
    if (shared_bytes < 0 || shared_bytes > kMaxSharedBytes) {
        set_fault("kernel %s: %lld bytes of dynamic shared memory; expected 0 to %lld", kernel,
                  (long long)shared_bytes, (long long)kMaxSharedBytes);
        return false;
    }
    return true;
}

} /* namespace */

bool run_grid(const char *kernel, dim3 grid, dim3 block, int64_t shared_bytes, KernelBody body,
              const void *closure) {
    Scheduler &s = scheduler();
    if (s.body) {
        set_fault("kernel %s: launched from inside another kernel (dynamic parallelism is not "
                  "emulated)", kernel);
        return false;
    }
    if (!check_configuration(kernel, grid, block, shared_bytes)) return false;
    const detail::Modes &m = modes();
    if (!m.error.empty()) {
        set_fault("kernel %s: %s", kernel, m.error.c_str());
        return false;
    }
    int threads = (int)(block.x * block.y * block.z);
    grow_fibers(s, threads);
#ifdef GC_EMU_ASAN
    if (s.stacks_dirty)
        for (Fiber &f : s.fibers) __asan_unpoison_memory_region(f.stack, kStackBytes);
#endif
    s.stacks_dirty = false;
    std::vector<unsigned char> shared((size_t)shared_bytes);
    s.dynamic_shared = shared.empty() ? nullptr : shared.data();
    s.dynamic_shared_bytes = shared_bytes;
    s.body = body;
    s.closure = closure;
    s.threads = threads;
    current.block_dim = {block.x, block.y, block.z};
    current.grid_dim = {grid.x, grid.y, grid.z};
    const bool checking = m.checking();
    if (checking) detail::race_launch_begin(kernel, grid, block, s.dynamic_shared, shared_bytes);
    uint32_t block_sequence = 0;
    bool ok = true;
    for (unsigned z = 0; ok && z < grid.z; ++z)
        for (unsigned y = 0; ok && y < grid.y; ++y)
            for (unsigned x = 0; ok && x < grid.x; ++x) {
                current.block_idx = {x, y, z};
                for (int i = 0; i < threads; ++i) {
                    Fiber &f = s.fibers[i];
                    f.thread_idx = {i % block.x, i / block.x % block.y, i / (block.x * block.y)};
                    f.state = State::kRunnable;
                    f.preempted = false;
                    f.pipeline.clear(); /* a faulted block may have left copies */
                    f.committed = 0;
                    prepare(f);
                }
                for (int w = 0; w * kWarpSize < threads; ++w) {
                    Warp &warp = s.warps[w];
                    warp.generation = warp.arrived = warp.required = warp.last_arrived = 0;
                }
                if (!shared.empty()) memset(shared.data(), 0xff, shared.size());
                if (checking) detail::race_block_begin(block_sequence++);
                detail::hooks_active = checking;
                ok = run_block(s, kernel, m.random);
                detail::hooks_active = false;
            }
    if (checking) detail::race_launch_end();
    s.stacks_dirty = !ok;
    s.body = nullptr;
    s.closure = nullptr;
    s.dynamic_shared = nullptr;
    return ok;
}

const char *pending_fault() { return tls_fault.empty() ? nullptr : tls_fault.c_str(); }
void clear_fault() { tls_fault.clear(); }
void record_fault(const char *message) { tls_fault = message; }

void *dynamic_shared() { return running_scheduler("dynamic shared memory").dynamic_shared; }

void pipeline_copy_async(void *dst, const void *src, size_t bytes, size_t zfill) {
    Scheduler &s = running_scheduler("__pipeline_memcpy_async()");
    Fiber &f = s.fibers[s.running];
    if ((bytes != 4 && bytes != 8 && bytes != 16) || zfill > bytes ||
        reinterpret_cast<uintptr_t>(dst) % bytes || reinterpret_cast<uintptr_t>(src) % bytes) {
        if (tls_fault.empty()) /* the first one is the fault */
            set_fault("thread (%u,%u,%u) of block (%u,%u,%u): __pipeline_memcpy_async(%p, %p, "
                      "%zu, %zu): the size must be 4, 8 or 16 bytes, both addresses aligned "
                      "to it, and zfill at most the size", f.thread_idx.x, f.thread_idx.y,
                      f.thread_idx.z, current.block_idx.x, current.block_idx.y,
                      current.block_idx.z, dst, src, bytes, zfill);
        return;
    }
    f.pipeline.push_back({dst, src, (uint32_t)bytes, (uint32_t)zfill, f.committed});
}

void pipeline_commit() {
    Scheduler &s = running_scheduler("__pipeline_commit()");
    ++s.fibers[s.running].committed;
}

size_t pipeline_take(size_t prior, const PipelineCopy **copies) {
    Scheduler &s = running_scheduler("__pipeline_wait_prior()");
    Fiber &f = s.fibers[s.running];
    std::vector<PipelineCopy> &ready = f.landing;
    ready.clear();
    const uint64_t done = f.committed > prior ? f.committed - prior : 0; /* groups < done */
    size_t kept = 0;
    for (const PipelineCopy &c : f.pipeline) {
        if (c.group < done)
            ready.push_back(c);
        else
            f.pipeline[kept++] = c;
    }
    f.pipeline.resize(kept);
    *copies = ready.data();
    return ready.size();
}

void syncthreads() {
    Scheduler &s = running_scheduler("__syncthreads()");
    Fiber &f = s.fibers[s.running];
    f.state = State::kAtBlockBarrier;
    yield(s, f, false);
}

unsigned lane_id() { return (unsigned)running_scheduler("a warp function").running % kWarpSize; }

unsigned active_mask() {
    Scheduler &s = running_scheduler("__activemask()");
    Fiber &f = s.fibers[s.running];
    int warp = s.running / kWarpSize;
    /* let the rest of the warp run to its next barrier or exit: one pass, more while the
     * random schedule holds a lane preempted on its way */
    for (bool waiting = true; waiting;) {
        f.state = State::kYielded;
        yield(s, f, false);
        waiting = false;
        for (int lane = 0; lane < kWarpSize && warp * kWarpSize + lane < s.threads; ++lane)
            waiting |= s.fibers[warp * kWarpSize + lane].preempted;
    }
    unsigned mask = 0;
    for (int lane = 0; lane < kWarpSize && warp * kWarpSize + lane < s.threads; ++lane)
        if (s.fibers[warp * kWarpSize + lane].state != State::kExited) mask |= 1u << lane;
    return mask;
}

Exchange warp_exchange(unsigned mask, const void *value, size_t bytes, const char *file,
                       int line) {
    Scheduler &s = running_scheduler("a warp function");
    Fiber &f = s.fibers[s.running];
    unsigned lane = (unsigned)s.running % kWarpSize;
    Warp &warp = s.warps[s.running / kWarpSize];
    unsigned parity = warp.generation & 1u;
    memcpy(warp.slots[parity][lane], value, bytes);
    warp.arrived |= 1u << lane;
    warp.required |= mask | 1u << lane;
    warp.lane_mask[lane] = mask;
    warp.lane_file[lane] = file;
    warp.lane_line[lane] = line;
    f.state = State::kAtWarpBarrier;
    yield(s, f, false);
    return Exchange{&warp.slots[parity][0][0], warp.last_arrived};
}

void syncwarp(unsigned mask) {
    unsigned char nothing = 0;
    warp_exchange(mask, &nothing, 0, nullptr, 0);
}

namespace detail {

int running_fiber() { return tls_scheduler->running; }

unsigned warp_generation(int warp) { return tls_scheduler->warps[warp].generation; }

bool in_fiber_stack(uintptr_t address) {
    for (const auto &region : tls_scheduler->stack_regions)
        if (address - reinterpret_cast<uintptr_t>(region.first) < region.second) return true;
    return false;
}

void maybe_preempt() {
    /* one instrumented access in 8 gives the CPU to the other fibers for one pass */
    if (next_random() % 8 != 0) return;
    Scheduler &s = *tls_scheduler;
    Fiber &f = s.fibers[s.running];
    f.state = State::kYielded;
    f.preempted = true;
    yield(s, f, false);
    f.preempted = false;
}

} /* namespace detail */

} /* namespace gc_emu */
