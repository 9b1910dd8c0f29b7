/* common.h: the internal header every runtime source and kernel file includes first.
 *
 * It is the contract between the runtime infrastructure and the kernels, identical in both
 * builds (nvcc -> libgraphc_rt.so, g++ + emu/gc_emu.h -> libgraphc_rt_emu.so):
 *   - gc_fail(status, fmt, ...) formats the thread-local last error (gc_last_error()) and
 *     returns status; GC_REQUIRE(cond, fmt, ...) returns GC_ERROR_INVALID_ARGUMENT naming the
 *     calling function when cond is false. Validate every argument BEFORE any launch.
 *   - GC_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...) launches; in emulation it
 *     runs the whole grid before returning. A kernel template with several arguments must be
 *     named through a pointer (auto *k = &gemm<64, 64>; GC_LAUNCH(k, ...)) because the macro
 *     would split its commas.
 *   - GC_CHECK_LAUNCH(what) follows every launch: it returns GC_ERROR_LAUNCH (CUDA:
 *     cudaGetLastError) or GC_ERROR_EMULATION (emulation: the scheduler's fault record, e.g.
 *     a barrier reached by part of a block; GC_ERROR_DEVICE_LOST in the emulation's sticky
 *     mode) with a message naming `what`.
 *   - GC_DYNAMIC_SHARED(type, name) declares the launch's dynamic shared memory in a kernel
 *     (16-byte aligned; CUDA: one name per type within a translation unit).
 *   - GC_EMULATION is defined in the emulation build only (e.g. the TF32 tensor-core GEMM
 *     falls back to SIMT arithmetic there); __CUDA_ARCH__ is never defined in emulation.
 */
#ifndef GRAPHC_RT_COMMON_H
#define GRAPHC_RT_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "graphc_rt.h"

#ifdef GC_EMULATION
#include "gc_emu.h"
#else
#include <cuda_runtime.h>
#endif

/* Formats the message into this thread's last-error buffer (truncated at 1 KiB) and returns
 * status. Defined in src/status.cpp. */
gc_status gc_fail(gc_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Adds `bytes` to the host-to-device (to_device) or device-to-host total that
 * gc_transfer_bytes reports; gc_memcpy_h2d/_d2h call it. Defined in src/status.cpp. */
void gc_count_transfer(bool to_device, int64_t bytes);

#define GC_REQUIRE(cond, fmt, ...)                                                          \
    do {                                                                                    \
        if (!(cond))                                                                        \
            return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: " fmt, __func__, ##__VA_ARGS__); \
    } while (0)

/* Propagates a failing gc_status (its message is already set). */
#define GC_TRY(expr)                            \
    do {                                        \
        gc_status gc_try_status_ = (expr);      \
        if (gc_try_status_ != GC_SUCCESS)       \
            return gc_try_status_;              \
    } while (0)

#ifdef GC_EMULATION

#define GC_LAUNCH(kernel, grid, block, shared_bytes, stream) \
    ::gc_emu::make_launcher((kernel), #kernel, (grid), (block), (shared_bytes), (stream))

namespace gc_emu {
/* After a launch: the emulation's fault record as GC_ERROR_EMULATION naming `what` (cleared),
 * or, in the sticky mode (GRAPHC_EMU_STICKY), GC_ERROR_DEVICE_LOST, as is every call after it
 * until gc_device_reset(). Defined in src/runtime_emu.cpp. */
gc_status check_launch(const char *what);
} /* namespace gc_emu */

#define GC_CHECK_LAUNCH(what) GC_TRY(::gc_emu::check_launch(what))

#define GC_DYNAMIC_SHARED(type, name) type *name = static_cast<type *>(::gc_emu::dynamic_shared())

#else /* CUDA */

#define GC_LAUNCH(kernel, grid, block, shared_bytes, stream) \
    kernel<<<(grid), (block), (shared_bytes), (cudaStream_t)(stream)>>>

#define GC_CHECK_LAUNCH(what)                                                           \
    do {                                                                                \
        cudaError_t gc_launch_error_ = cudaGetLastError();                              \
        if (gc_launch_error_ != cudaSuccess)                                            \
            return gc_fail(GC_ERROR_LAUNCH, "%s: kernel launch failed: %s (%s)", (what), \
                           cudaGetErrorString(gc_launch_error_),                        \
                           cudaGetErrorName(gc_launch_error_));                         \
    } while (0)

#define GC_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]

/* generated kernels export an emulation entry next to each kernel; nothing to do in CUDA */
#define GC_EMU_EXPORT(name)

#endif /* GC_EMULATION */

/* Ceiling division for grid sizes: gc_ceil_div(n, 256) blocks of 256 threads. */
static inline int64_t gc_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

#endif /* GRAPHC_RT_COMMON_H */
