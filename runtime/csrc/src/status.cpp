/* status.cpp: the parts of the library ABI both builds share: the thread-local last error
 * (gc_fail, gc_last_error), gc_status_string, gc_abi_version and the host-device transfer
 * counters (gc_count_transfer, gc_transfer_bytes).
 *
 * Invariant: gc_last_error() returns this thread's message of its latest failing call ("" if
 * none has failed); successful calls leave it alone. The counters are process-wide atomics.
 */
#include <stdarg.h>
#include <stdio.h>

#include <atomic>

#include "common.h"

namespace {
thread_local char tls_last_error[1024];
std::atomic<int64_t> h2d_total{0}, d2h_total{0};
}

void gc_count_transfer(bool to_device, int64_t bytes) {
    (to_device ? h2d_total : d2h_total).fetch_add(bytes, std::memory_order_relaxed);
}

gc_status gc_fail(gc_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(tls_last_error, sizeof tls_last_error, fmt, args);
    va_end(args);
    return status;
}

extern "C" {

int32_t gc_abi_version(void) { return GC_ABI_VERSION; }

const char *gc_last_error(void) { return tls_last_error; }

gc_status gc_transfer_bytes(int64_t *h2d_bytes, int64_t *d2h_bytes) {
    GC_REQUIRE(h2d_bytes && d2h_bytes, "h2d_bytes and d2h_bytes must not be NULL");
    *h2d_bytes = h2d_total.load(std::memory_order_relaxed);
    *d2h_bytes = d2h_total.load(std::memory_order_relaxed);
    return GC_SUCCESS;
}

gc_status gc_transfer_bytes_reset(void) {
    h2d_total.store(0, std::memory_order_relaxed);
    d2h_total.store(0, std::memory_order_relaxed);
    return GC_SUCCESS;
}

const char *gc_status_string(gc_status status) {
    switch (status) {
    case GC_SUCCESS: return "GC_SUCCESS: no error";
    case GC_ERROR_INVALID_ARGUMENT: return "GC_ERROR_INVALID_ARGUMENT: an invalid argument";
    case GC_ERROR_OUT_OF_MEMORY: return "GC_ERROR_OUT_OF_MEMORY: out of device memory";
    case GC_ERROR_NO_DEVICE: return "GC_ERROR_NO_DEVICE: no CUDA device or driver";
    case GC_ERROR_LAUNCH: return "GC_ERROR_LAUNCH: a kernel launch failed";
    case GC_ERROR_CUDA: return "GC_ERROR_CUDA: a CUDA runtime or driver error";
    case GC_ERROR_NOT_SUPPORTED: return "GC_ERROR_NOT_SUPPORTED: not supported by this build";
    case GC_ERROR_WORKSPACE: return "GC_ERROR_WORKSPACE: the workspace is too small";
    case GC_ERROR_EMULATION: return "GC_ERROR_EMULATION: the emulation found a fault";
    case GC_ERROR_MODULE: return "GC_ERROR_MODULE: a module or function could not be loaded";
    case GC_ERROR_DEVICE_LOST:
        return "GC_ERROR_DEVICE_LOST: a sticky CUDA error; the context must be reset";
    }
    return "unknown gc_status";
}

} /* extern "C" */
