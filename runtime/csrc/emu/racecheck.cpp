/* racecheck.cpp: the emulation's race checker and its memory-access entry points.
 *
 * Code compiled with `g++ -fsanitize=thread` (the emu-checked library's kernels, test
 * programs and generated modules built for it; see runtime/csrc/README.md) calls
 * __tsan_read4(address), __tsan_write16(address), __tsan_atomic32_fetch_add(...), ... at
 * every memory access. This file is that runtime instead of ThreadSanitizer's: the accesses
 * of the CUDA threads of a running block are recorded, per 4-byte granule, in a shadow of
 * the memory (the last write and up to two reads, each with its thread, block, barrier
 * interval and warp-exchange generation), and two accesses race when
 *   - they touch a common byte, at least one writes, neither is an atomic;
 *   - they come from different threads of one block with no __syncthreads() between them
 *     (nor, for two lanes of one warp, a completed warp function), or from different blocks
 *     of one launch (global memory only: shared memory is per block).
 * Memory is told apart by address: fiber stacks (per-thread locals) are never checked;
 * `__shared__` variables (static thread_local in the emulation) are the TLS blocks of the
 * loaded modules, and the launch's dynamic shared memory is known; everything else is global.
 *
 * Invariants: nothing here is instrumented itself; every hook returns at once unless a block
 * of a launch runs in a checking mode (detail::hooks_active), so host code compiled with
 * instrumentation (argument checks, the test programs' main) costs a call and a test;
 * the shadow is per OS thread (a launch runs on one) and never cleared: every record carries
 * a stamp, and records older than the launch (global) or the block (shared) are ignored;
 * a race is reported once per pair of code addresses per launch, the first one also as the
 * launch's fault when GRAPHC_EMU_RACECHECK=1.
 */
#include <cxxabi.h>
#include <dlfcn.h>
#include <errno.h> /* program_invocation_short_name */
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "emu_internal.h"

extern "C" void *__tls_get_addr(void *); /* glibc, x86-64: {module id, offset} -> address */

namespace gc_emu {
namespace detail {
namespace {

constexpr int kGranuleShift = 2; /* 4-byte granules, a byte mask in each record */
constexpr int kPageShift = 12;
constexpr int kCellsPerPage = 1 << (kPageShift - kGranuleShift);
constexpr int kMaxReportsPerLaunch = 8;
constexpr size_t kMaxShadowPages = 8192; /* ~600 MB of shadow: dropped between launches */

enum class Space : unsigned char { kPrivate, kShared, kDynamicShared, kGlobal };

struct Access {
    uintptr_t pc;        /* return address of the hook: just after the access */
    uint32_t stamp;      /* barrier interval; 0 never happened */
    uint32_t block;      /* block sequence number in its launch */
    uint16_t fiber;      /* linear thread index in the block */
    uint16_t generation; /* completed warp exchanges of its warp */
    uint8_t mask;        /* bytes of the granule */
};

struct Cell {
    Access write;
    Access read[2]; /* two distinct readers: a later writer differs from one of them */
};

struct Page {
    Cell cells[kCellsPerPage];
};

struct TlsBlock {
    uintptr_t begin, end;
    std::string module;
};

struct RaceState {
    const char *kernel = nullptr;
    dim3 grid, block;
    uint32_t stamp = 0;          /* the running block's current barrier interval */
    uint32_t launch_stamp = 1;   /* first stamp of the running launch */
    uint32_t block_stamp = 1;    /* first stamp of the running block */
    uint32_t block_sequence = 0;
    uintptr_t dynamic_begin = 0;
    uint64_t dynamic_bytes = 0;
    std::vector<TlsBlock> tls;   /* sorted by begin */
    std::unordered_map<uintptr_t, std::unique_ptr<Page>> pages;
    uintptr_t last_page = ~uintptr_t(0);
    Page *last = nullptr;
    std::set<std::pair<uintptr_t, uintptr_t>> reported; /* code address pairs, this launch */
    long races = 0;              /* this launch */
    long accesses = 0;           /* this launch: none means the kernel is not instrumented */
};

bool warned_uninstrumented = false; /* once per process (a benign race between host threads) */

thread_local std::unique_ptr<RaceState> tls_owner;
__thread RaceState *tls_race;

RaceState &state() {
    if (!tls_race) {
        tls_owner.reset(new RaceState());
        tls_race = tls_owner.get();
    }
    return *tls_race;
}

/* ---- where an address lies ----------------------------------------------------------- */
/* collects (module id, size, name) of every module with TLS; the addresses come after, out of
 * the loader's lock: begin holds the module id until then */
int collect_tls(struct dl_phdr_info *info, size_t, void *data) {
    if (info->dlpi_tls_modid == 0) return 0;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr) &ph = info->dlpi_phdr[i];
        if (ph.p_type != PT_TLS || ph.p_memsz == 0) continue;
        const char *name = info->dlpi_name && *info->dlpi_name ? info->dlpi_name
                                                               : program_invocation_short_name;
        static_cast<std::vector<TlsBlock> *>(data)->push_back(
            TlsBlock{info->dlpi_tls_modid, ph.p_memsz, name});
    }
    return 0;
}

void locate_tls(std::vector<TlsBlock> &blocks) {
    for (TlsBlock &block : blocks) {
        size_t index[2] = {block.begin, 0};
        /* allocates this thread's block now if the module's TLS was never touched here, so
         * the ranges stay right for the whole launch */
        uintptr_t begin = reinterpret_cast<uintptr_t>(__tls_get_addr(index));
        block.end += begin;
        block.begin = begin;
    }
    std::sort(blocks.begin(), blocks.end(),
              [](const TlsBlock &a, const TlsBlock &b) { return a.begin < b.begin; });
}

const TlsBlock *find_tls(const RaceState &r, uintptr_t address) {
    auto after = std::upper_bound(r.tls.begin(), r.tls.end(), address,
                                  [](uintptr_t a, const TlsBlock &b) { return a < b.begin; });
    if (after == r.tls.begin()) return nullptr;
    const TlsBlock &block = *(after - 1);
    return address < block.end ? &block : nullptr;
}

Space classify(const RaceState &r, uintptr_t address) {
    if (in_fiber_stack(address)) return Space::kPrivate;
    if (address - r.dynamic_begin < r.dynamic_bytes) return Space::kDynamicShared;
    if (find_tls(r, address)) return Space::kShared;
    return Space::kGlobal;
}

Cell &cell(RaceState &r, uintptr_t granule) {
    uintptr_t page = granule >> (kPageShift - kGranuleShift);
    if (page != r.last_page) {
        std::unique_ptr<Page> &slot = r.pages[page];
        if (!slot) slot.reset(new Page()); /* zeroed: stamp 0 is "never" */
        r.last_page = page;
        r.last = slot.get();
    }
    return r.last->cells[granule & (kCellsPerPage - 1)];
}

/* ---- the report ------------------------------------------------------------------------ */
std::string code_location(uintptr_t pc) {
    Dl_info info;
    if (!dladdr(reinterpret_cast<void *>(pc), &info) || !info.dli_fname) {
        char text[32];
        snprintf(text, sizeof text, "0x%lx", (unsigned long)pc);
        return text;
    }
    /* the return address follows the access: pc - 1 lies in its instruction */
    uintptr_t offset = pc - 1 - reinterpret_cast<uintptr_t>(info.dli_fbase);
    char command[1200];
    snprintf(command, sizeof command, "addr2line -C -f -e '%s' 0x%lx 2>/dev/null",
             info.dli_fname, (unsigned long)offset);
    std::string where;
    if (!strchr(info.dli_fname, '\'')) {
        if (FILE *pipe = popen(command, "r")) {
            char function[600] = "", line[600] = "";
            if (fgets(function, sizeof function, pipe) && fgets(line, sizeof line, pipe)) {
                function[strcspn(function, "\n")] = '\0';
                line[strcspn(line, "\n")] = '\0';
                if (char *discriminator = strstr(line, " (discriminator")) *discriminator = '\0';
                if (strcmp(function, "??") != 0) where = function;
                const char *base = strrchr(line, '/');
                if (strncmp(line, "??", 2) != 0)
                    where += std::string(where.empty() ? "" : " at ") + (base ? base + 1 : line);
            }
            pclose(pipe);
        }
    }
    const char *module = strrchr(info.dli_fname, '/');
    char tail[600];
    snprintf(tail, sizeof tail, "%s+0x%lx", module ? module + 1 : info.dli_fname,
             (unsigned long)offset);
    return where.empty() ? std::string(tail) : where + " (" + tail + ")";
}

std::string thread_name(const RaceState &r, uint32_t block, unsigned fiber) {
    char text[128];
    snprintf(text, sizeof text, "thread (%u,%u,%u) of block (%u,%u,%u)", fiber % r.block.x,
             fiber / r.block.x % r.block.y, fiber / (r.block.x * r.block.y), block % r.grid.x,
             block / r.grid.x % r.grid.y, block / (r.grid.x * r.grid.y));
    return text;
}

std::string memory_name(const RaceState &r, uintptr_t address, Space space) {
    char text[600];
    if (space == Space::kDynamicShared) {
        snprintf(text, sizeof text, "dynamic shared memory + %lu",
                 (unsigned long)(address - r.dynamic_begin));
    } else if (space == Space::kShared) {
        const TlsBlock *tls = find_tls(r, address);
        const char *base = strrchr(tls->module.c_str(), '/');
        snprintf(text, sizeof text, "__shared__ memory at 0x%lx (the __shared__ variables of "
                 "%s + %lu)", (unsigned long)address, base ? base + 1 : tls->module.c_str(),
                 (unsigned long)(address - tls->begin));
    } else {
        snprintf(text, sizeof text, "global memory at 0x%lx", (unsigned long)address);
    }
    return text;
}

void report(RaceState &r, const Access &prior, bool prior_write, const Access &now,
            bool now_write, uintptr_t granule_address, Space space) {
    ++r.races;
    auto key = std::make_pair(prior.pc, now.pc);
    if (r.reported.count(key) || (int)r.reported.size() >= kMaxReportsPerLaunch) return;
    r.reported.insert(key);
    int first = __builtin_ctz(prior.mask & now.mask);
    uintptr_t address = granule_address + first;
    bool same_block = prior.block == now.block;
    std::string message =
        std::string("racecheck: kernel ") + r.kernel + ": " +
        (prior_write && now_write ? "write-write" : "read-write") + " race on " +
        memory_name(r, address, space) + ":\n    " + (prior_write ? "write" : "read ") +
        " by " + thread_name(r, prior.block, prior.fiber) + " at " +
        code_location(prior.pc) + "\n    " + (now_write ? "write" : "read ") + " by " +
        thread_name(r, now.block, now.fiber) + " at " + code_location(now.pc) + "\n    " +
        (same_block ? "no __syncthreads() orders them"
                    : "different blocks of one launch: nothing orders them (use atomics, or "
                      "split the kernel)");
    fprintf(stderr, "graphc emulation %s\n", message.c_str());
    if (modes().race_is_fault && !pending_fault()) record_fault(message.c_str());
}

/* Whether `prior` (valid from stamp `valid_from`) races with `now`; both touch the granule. */
bool races(const Access &prior, const Access &now, uint32_t valid_from) {
    if (prior.stamp < valid_from || !(prior.mask & now.mask)) return false;
    if (prior.block != now.block) return true;
    if (prior.fiber == now.fiber || prior.stamp != now.stamp) return false;
    return !(prior.fiber / kWarpSize == now.fiber / kWarpSize &&
             prior.generation != now.generation);
}

void record(uintptr_t address, size_t size, bool write, uintptr_t pc) {
    RaceState &r = *tls_race;
    ++r.accesses;
    Space space = classify(r, address);
    if (space == Space::kPrivate) return;
    uint32_t valid_from = space == Space::kGlobal ? r.launch_stamp : r.block_stamp;
    int fiber = running_fiber();
    Access now{pc, r.stamp, r.block_sequence, (uint16_t)fiber,
               (uint16_t)warp_generation(fiber / kWarpSize), 0};
    uintptr_t end = address + size;
    for (uintptr_t granule = address >> kGranuleShift; granule << kGranuleShift < end;
         ++granule) {
        uintptr_t lo = std::max(address, granule << kGranuleShift);
        uintptr_t hi = std::min(end, (granule + 1) << kGranuleShift);
        now.mask = (uint8_t)(((1u << (hi - lo)) - 1u) << (lo & 3u));
        Cell &c = cell(r, granule);
        uintptr_t base = granule << kGranuleShift;
        if (races(c.write, now, valid_from)) report(r, c.write, true, now, write, base, space);
        if (write) {
            for (const Access &read : c.read)
                if (races(read, now, valid_from)) report(r, read, false, now, true, base, space);
            c.write = now;
            continue;
        }
        /* keep two readers of distinct threads; replace this thread's, a stale or an older
         * interval's record */
        Access *slot = nullptr;
        for (Access &read : c.read)
            if (read.stamp < valid_from ||
                (read.block == now.block && read.fiber == now.fiber)) {
                slot = &read;
                break;
            }
        if (!slot) {
            Access &older = c.read[0].stamp <= c.read[1].stamp ? c.read[0] : c.read[1];
            if (older.stamp < now.stamp) slot = &older;
        }
        if (slot) *slot = now;
    }
}

inline void access(void *address, size_t size, bool write, void *pc) {
    if (!hooks_active) return;
    const Modes &m = modes();
    if (m.random) maybe_preempt();
    if (m.racecheck) record(reinterpret_cast<uintptr_t>(address), size, write,
                            reinterpret_cast<uintptr_t>(pc));
}

inline void atomic_access() {
    if (hooks_active && modes().random) maybe_preempt();
}

} /* namespace */

void race_launch_begin(const char *kernel, dim3 grid, dim3 block, const void *dynamic_shared,
                       int64_t dynamic_shared_bytes) {
    if (!modes().racecheck) return;
    RaceState &r = state();
    if (r.pages.size() > kMaxShadowPages) {
        r.pages.clear();
        r.last_page = ~uintptr_t(0);
        r.last = nullptr;
    }
    r.kernel = kernel;
    r.grid = grid;
    r.block = block;
    r.launch_stamp = ++r.stamp;
    r.block_stamp = r.stamp;
    r.dynamic_begin = reinterpret_cast<uintptr_t>(dynamic_shared);
    r.dynamic_bytes = dynamic_shared ? (uint64_t)dynamic_shared_bytes : 0;
    r.tls.clear();
    dl_iterate_phdr(collect_tls, &r.tls);
    locate_tls(r.tls);
    r.reported.clear();
    r.races = 0;
    r.accesses = 0;
}

void race_block_begin(uint32_t block_sequence) {
    if (!modes().racecheck) return;
    RaceState &r = *tls_race;
    r.block_sequence = block_sequence;
    r.block_stamp = ++r.stamp;
}

void race_barrier() {
    if (modes().racecheck) ++tls_race->stamp;
}

void race_launch_end() {
    if (!modes().racecheck) return;
    RaceState &r = *tls_race;
    if (r.accesses == 0 && !warned_uninstrumented) {
        warned_uninstrumented = true;
        fprintf(stderr, "graphc emulation: GRAPHC_EMU_RACECHECK is set but kernel %s made no "
                "instrumented memory access: it was compiled without -fsanitize=thread and "
                "is not checked (the library's kernels are instrumented in "
                "runtime/build/emu-checked/libgraphc_rt_emu.so; runtime/csrc/README.md)\n",
                r.kernel);
    }
    if (r.races > (long)r.reported.size())
        fprintf(stderr, "graphc emulation racecheck: kernel %s: %ld racing access pairs in all "
                "(%zu reported, one per pair of code locations%s)\n", r.kernel, r.races,
                r.reported.size(),
                (int)r.reported.size() >= kMaxReportsPerLaunch ? ", at most 8 per launch" : "");
}

} /* namespace detail */
} /* namespace gc_emu */

/* ---- the entry points g++ -fsanitize=thread calls -------------------------------------- *
 * One line each: the instrumentation names every size and flavour separately. */
using gc_emu::detail::access;
using gc_emu::detail::atomic_access;
#define GC_RET __builtin_return_address(0)

extern "C" {
__attribute__((visibility("default"))) void __tsan_init() {}
__attribute__((visibility("default"))) void __tsan_func_entry(void *) {}
__attribute__((visibility("default"))) void __tsan_func_exit() {}
__attribute__((visibility("default"))) void __tsan_vptr_update(void **, void *) {}
__attribute__((visibility("default"))) void __tsan_vptr_read(void **) {}

#define GC_ACCESS_HOOKS(N)                                                                     \
    __attribute__((visibility("default"))) void __tsan_read##N(void *a) { access(a, N, false, GC_RET); } \
    __attribute__((visibility("default"))) void __tsan_write##N(void *a) { access(a, N, true, GC_RET); } \
    __attribute__((visibility("default"))) void __tsan_unaligned_read##N(void *a) {            \
        access(a, N, false, GC_RET);                                                           \
    }                                                                                          \
    __attribute__((visibility("default"))) void __tsan_unaligned_write##N(void *a) {           \
        access(a, N, true, GC_RET);                                                            \
    }                                                                                          \
    __attribute__((visibility("default"))) void __tsan_volatile_read##N(void *a) {             \
        access(a, N, false, GC_RET);                                                           \
    }                                                                                          \
    __attribute__((visibility("default"))) void __tsan_volatile_write##N(void *a) {            \
        access(a, N, true, GC_RET);                                                            \
    }
GC_ACCESS_HOOKS(1)
GC_ACCESS_HOOKS(2)
GC_ACCESS_HOOKS(4)
GC_ACCESS_HOOKS(8)
GC_ACCESS_HOOKS(16)
#undef GC_ACCESS_HOOKS

__attribute__((visibility("default"))) void __tsan_read_range(void *a, unsigned long size) {
    access(a, size, false, GC_RET);
}
__attribute__((visibility("default"))) void __tsan_write_range(void *a, unsigned long size) {
    access(a, size, true, GC_RET);
}

/* atomics: performed (sequentially consistent), never recorded, a switch point when random */
#define GC_ATOMIC_HOOKS(N, T)                                                                  \
    __attribute__((visibility("default"))) T __tsan_atomic##N##_load(const volatile T *a, int) { \
        atomic_access();                                                                       \
        return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                           \
    }                                                                                          \
    __attribute__((visibility("default"))) void __tsan_atomic##N##_store(volatile T *a, T v, int) { \
        atomic_access();                                                                       \
        __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                              \
    }                                                                                          \
    __attribute__((visibility("default"))) T __tsan_atomic##N##_exchange(volatile T *a, T v, int) { \
        atomic_access();                                                                       \
        return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                    \
    }                                                                                          \
    GC_ATOMIC_RMW(N, T, fetch_add)                                                             \
    GC_ATOMIC_RMW(N, T, fetch_sub)                                                             \
    GC_ATOMIC_RMW(N, T, fetch_and)                                                             \
    GC_ATOMIC_RMW(N, T, fetch_or)                                                              \
    GC_ATOMIC_RMW(N, T, fetch_xor)                                                             \
    GC_ATOMIC_RMW(N, T, fetch_nand)                                                            \
    __attribute__((visibility("default"))) int __tsan_atomic##N##_compare_exchange_strong(     \
        volatile T *a, T *expected, T desired, int, int) {                                     \
        atomic_access();                                                                       \
        return __atomic_compare_exchange_n(a, expected, desired, false, __ATOMIC_SEQ_CST,      \
                                           __ATOMIC_SEQ_CST);                                  \
    }                                                                                          \
    __attribute__((visibility("default"))) int __tsan_atomic##N##_compare_exchange_weak(       \
        volatile T *a, T *expected, T desired, int, int) {                                     \
        atomic_access();                                                                       \
        return __atomic_compare_exchange_n(a, expected, desired, true, __ATOMIC_SEQ_CST,       \
                                           __ATOMIC_SEQ_CST);                                  \
    }                                                                                          \
    __attribute__((visibility("default"))) T __tsan_atomic##N##_compare_exchange_val(          \
        volatile T *a, T expected, T desired, int, int) {                                      \
        atomic_access();                                                                       \
        __atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_SEQ_CST,            \
                                    __ATOMIC_SEQ_CST);                                         \
        return expected;                                                                       \
    }
#define GC_ATOMIC_RMW(N, T, OP)                                                                \
    __attribute__((visibility("default"))) T __tsan_atomic##N##_##OP(volatile T *a, T v, int) { \
        atomic_access();                                                                       \
        return __atomic_##OP(a, v, __ATOMIC_SEQ_CST);                                          \
    }
GC_ATOMIC_HOOKS(8, unsigned char)
GC_ATOMIC_HOOKS(16, unsigned short)
GC_ATOMIC_HOOKS(32, unsigned int)
GC_ATOMIC_HOOKS(64, unsigned long)
#undef GC_ATOMIC_RMW
#undef GC_ATOMIC_HOOKS

__attribute__((visibility("default"))) void __tsan_atomic_thread_fence(int) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
__attribute__((visibility("default"))) void __tsan_atomic_signal_fence(int) {}
} /* extern "C" */
