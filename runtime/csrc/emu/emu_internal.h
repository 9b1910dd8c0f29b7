/* emu_internal.h: what scheduler.cpp and racecheck.cpp share inside the emulation library (not
 * part of gc_emu.h: kernels never see it).
 *
 * The checking modes, chosen once per process from the environment:
 *   GRAPHC_EMU_RACECHECK=1        record every instrumented memory access between barriers and
 *                                 report conflicting ones (a fault: GC_ERROR_EMULATION);
 *                      =warn      the same reports on stderr, the launch still succeeds;
 *   GRAPHC_EMU_SCHEDULE=random:SEED  fibers resume in a seeded random order at every barrier
 *                                 and may be switched at instrumented memory operations;
 * either one also checks that the lanes of a warp function agree (same call, same mask).
 * Memory accesses reach the emulation only from code compiled with -fsanitize=thread (the
 * checked library, runtime/build/emu-checked, and modules compiled against it): that
 * compiler instrumentation calls the __tsan_* entry points racecheck.cpp defines. The default
 * library's kernels are not instrumented, so the default mode costs nothing.
 *
 * Invariants: the hooks run on the launching OS thread, inside a fiber of a running block
 * (hooks_active); everything here is per OS thread except the modes.
 */
#ifndef GRAPHC_EMU_INTERNAL_H
#define GRAPHC_EMU_INTERNAL_H

#include <stdint.h>

#include <string>

#include "gc_emu.h"

namespace gc_emu {
namespace detail {

struct Modes {
    bool racecheck = false;      /* GRAPHC_EMU_RACECHECK set (1 or warn) */
    bool race_is_fault = false;  /* 1: a race fails the launch; warn: only reported */
    bool random = false;         /* GRAPHC_EMU_SCHEDULE=random:SEED */
    uint64_t seed = 0;
    std::string error;           /* a value that is not understood: every launch faults */
    bool checking() const { return racecheck || random; }
};
const Modes &modes();

/* true while a fiber of a block runs and a checking mode is on: the hooks' fast exit */
extern __thread bool hooks_active;

/* ---- scheduler.cpp, for racecheck.cpp -------------------------------------------------- */
int running_fiber();                  /* the fiber of the running CUDA thread */
unsigned warp_generation(int warp);   /* completed warp exchanges of `warp` in this block */
bool in_fiber_stack(uintptr_t address);
void maybe_preempt();                 /* random mode: sometimes yield this fiber for a pass */
uint64_t next_random();               /* the seeded generator of this OS thread */

/* ---- racecheck.cpp, for scheduler.cpp -------------------------------------------------- */
void race_launch_begin(const char *kernel, dim3 grid, dim3 block, const void *dynamic_shared,
                       int64_t dynamic_shared_bytes);
void race_block_begin(uint32_t block_sequence); /* blocks numbered in launch order */
void race_barrier();                            /* a __syncthreads() completed */
void race_launch_end();

} /* namespace detail */
} /* namespace gc_emu */

#endif /* GRAPHC_EMU_INTERNAL_H */
