/* runtime_cuda.cu: the library, device, memory, stream, event, module and launch parts of
 * the graphc_rt.h ABI for the CUDA build (libgraphc_rt.so).
 *
 * Invariants: only the CUDA runtime API is used (linked statically; modules go through
 * cudaLibraryLoadFromFile / cudaLibraryGetKernel / cudaLaunchKernel), so the library loads on
 * machines without a driver and reports GC_ERROR_NO_DEVICE there; every CUDA error becomes a
 * gc_status with a message naming the gc_ function, the CUDA error's name and text.
 */
#include <stdio.h>
#include <string.h>

#include <mutex>

#include "common.h"
#include "vendor_blas.h"
#include "vendor_dnn.h"

namespace {

/* Errors that leave the context unusable: every later call returns them until
 * cudaDeviceReset (the "sticky" errors of the CUDA programming guide). */
bool is_sticky(cudaError_t error) {
    switch (error) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
        return true;
    default:
        return false;
    }
}

/* The first sticky error since the context was created: every later report names it, so a
 * caller that only sees a later call fail still learns what went wrong first. */
std::mutex first_fault_mutex;
char first_fault[512] = "";

gc_status device_lost(cudaError_t error, const char *function, const char *what) {
    char first[512];
    {
        std::lock_guard<std::mutex> lock(first_fault_mutex);
        if (!first_fault[0])
            snprintf(first_fault, sizeof first_fault, "%s: %s: %s (%s)", function, what,
                     cudaGetErrorString(error), cudaGetErrorName(error));
        snprintf(first, sizeof first, "%s", first_fault);
    }
    return gc_fail(GC_ERROR_DEVICE_LOST,
                   "%s: %s: %s (%s); a kernel faulted earlier (this call may not be the one "
                   "at fault: CUDA reports a fault at the next synchronising call), and the "
                   "CUDA context is now unusable: every device allocation is lost; "
                   "gc_device_reset() recreates the context (first reported: %s)",
                   function, what, cudaGetErrorString(error), cudaGetErrorName(error), first);
}

gc_status cuda_status(cudaError_t error, const char *function, const char *what) {
    if (error == cudaSuccess) return GC_SUCCESS;
    if (is_sticky(error)) return device_lost(error, function, what);
    cudaGetLastError(); /* clear the sticky-free error so the next call starts clean */
    switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
        return gc_fail(GC_ERROR_NO_DEVICE,
                       "%s: %s: no usable CUDA device or driver (%s: %s); use the emulation "
                       "build (libgraphc_rt_emu.so) on machines without a GPU",
                       function, what, cudaGetErrorName(error), cudaGetErrorString(error));
    case cudaErrorMemoryAllocation:
        return gc_fail(GC_ERROR_OUT_OF_MEMORY, "%s: %s: out of device memory (%s)", function,
                       what, cudaGetErrorString(error));
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle:
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: %s: %s (%s)", function, what,
                       cudaGetErrorString(error), cudaGetErrorName(error));
    default:
        return gc_fail(GC_ERROR_CUDA, "%s: %s: %s (%s)", function, what,
                       cudaGetErrorString(error), cudaGetErrorName(error));
    }
}

#define GC_CUDA_TRY(call) GC_TRY(cuda_status((call), __func__, #call))

cudaStream_t as_stream(gc_stream stream) { return static_cast<cudaStream_t>(stream); }

gc_status copy(void *dst, const void *src, int64_t bytes, cudaMemcpyKind kind,
               gc_stream stream, const char *function) {
    if (bytes < 0)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: bytes is %lld; expected >= 0", function,
                       (long long)bytes);
    if (bytes == 0) return GC_SUCCESS;
    if (!dst || !src)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT,
                       "%s: a NULL pointer (dst %p, src %p) for %lld bytes", function, dst, src,
                       (long long)bytes);
    GC_TRY(cuda_status(cudaMemcpyAsync(dst, src, (size_t)bytes, kind, as_stream(stream)),
                       function, "cudaMemcpyAsync"));
    if (kind != cudaMemcpyDeviceToDevice)
        gc_count_transfer(kind == cudaMemcpyHostToDevice, bytes);
    return GC_SUCCESS;
}

} /* namespace */

extern "C" {

const char *gc_runtime_kind(void) { return "cuda"; }

gc_status gc_device_count(int32_t *count) {
    GC_REQUIRE(count, "count is NULL");
    int devices = 0;
    cudaError_t error = cudaGetDeviceCount(&devices);
    *count = error == cudaSuccess ? devices : 0;
    return cuda_status(error, __func__, "cudaGetDeviceCount");
}

gc_status gc_set_device(int32_t device) {
    GC_CUDA_TRY(cudaSetDevice(device));
    return GC_SUCCESS;
}

gc_status gc_device_properties(int32_t device, char *name, int64_t capacity, int32_t *major,
                               int32_t *minor, int64_t *total_memory_bytes,
                               int32_t *multiprocessor_count) {
    GC_REQUIRE(capacity >= 0 && (capacity == 0 || name), "name %p with capacity %lld", name,
               (long long)capacity);
    cudaDeviceProp properties;
    GC_CUDA_TRY(cudaGetDeviceProperties(&properties, device));
    if (capacity > 0) {
        strncpy(name, properties.name, (size_t)capacity);
        name[capacity - 1] = '\0';
    }
    if (major) *major = properties.major;
    if (minor) *minor = properties.minor;
    if (total_memory_bytes) *total_memory_bytes = (int64_t)properties.totalGlobalMem;
    if (multiprocessor_count) *multiprocessor_count = properties.multiProcessorCount;
    return GC_SUCCESS;
}

gc_status gc_device_synchronize(void) {
    GC_CUDA_TRY(cudaDeviceSynchronize());
    return GC_SUCCESS;
}

gc_status gc_driver_version(int32_t *driver, int32_t *runtime) {
    GC_REQUIRE(driver && runtime, "driver and runtime must not be NULL");
    int found = 0, built = 0;
    if (cudaDriverGetVersion(&found) != cudaSuccess) { /* 0 without a driver */
        cudaGetLastError();
        found = 0;
    }
    if (cudaRuntimeGetVersion(&built) != cudaSuccess) {
        cudaGetLastError();
        built = CUDART_VERSION;
    }
    *driver = found;
    *runtime = built;
    return GC_SUCCESS;
}

gc_status gc_device_reset(void) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) device = 0;
    GC_CUDA_TRY(cudaDeviceReset());
    gc_vendor::reset(); /* cuBLAS and cuDNN handles belonged to the old context */
    gc_vendor::dnn_reset();
    GC_CUDA_TRY(cudaSetDevice(device));
    GC_CUDA_TRY(cudaFree(nullptr)); /* create the new primary context now, not at first use */
    cudaGetLastError();
    std::lock_guard<std::mutex> lock(first_fault_mutex);
    first_fault[0] = '\0';
    return GC_SUCCESS;
}

gc_status gc_malloc(void **ptr, int64_t bytes) {
    GC_REQUIRE(ptr, "ptr is NULL");
    GC_REQUIRE(bytes >= 0, "bytes is %lld; expected >= 0", (long long)bytes);
    *ptr = nullptr;
    if (bytes == 0) return GC_SUCCESS;
    GC_CUDA_TRY(cudaMalloc(ptr, (size_t)bytes)); /* 256-byte aligned by CUDA */
    return GC_SUCCESS;
}

gc_status gc_free(void *ptr) {
    if (!ptr) return GC_SUCCESS;
    GC_CUDA_TRY(cudaFree(ptr));
    return GC_SUCCESS;
}

gc_status gc_memcpy_h2d(void *dst, const void *src, int64_t bytes, gc_stream stream) {
    return copy(dst, src, bytes, cudaMemcpyHostToDevice, stream, __func__);
}

gc_status gc_memcpy_d2h(void *dst, const void *src, int64_t bytes, gc_stream stream) {
    return copy(dst, src, bytes, cudaMemcpyDeviceToHost, stream, __func__);
}

gc_status gc_memcpy_d2d(void *dst, const void *src, int64_t bytes, gc_stream stream) {
    return copy(dst, src, bytes, cudaMemcpyDeviceToDevice, stream, __func__);
}

gc_status gc_memset(void *dst, int32_t byte_value, int64_t bytes, gc_stream stream) {
    GC_REQUIRE(bytes >= 0, "bytes is %lld; expected >= 0", (long long)bytes);
    GC_REQUIRE(bytes == 0 || dst, "dst is NULL for %lld bytes", (long long)bytes);
    if (bytes == 0) return GC_SUCCESS;
    GC_CUDA_TRY(cudaMemsetAsync(dst, byte_value, (size_t)bytes, as_stream(stream)));
    return GC_SUCCESS;
}

gc_status gc_host_alloc(void **ptr, int64_t bytes) {
    GC_REQUIRE(ptr, "ptr is NULL");
    GC_REQUIRE(bytes >= 0, "bytes is %lld; expected >= 0", (long long)bytes);
    *ptr = nullptr;
    if (bytes == 0) return GC_SUCCESS;
    GC_CUDA_TRY(cudaMallocHost(ptr, (size_t)bytes));
    return GC_SUCCESS;
}

gc_status gc_host_free(void *ptr) {
    if (!ptr) return GC_SUCCESS;
    GC_CUDA_TRY(cudaFreeHost(ptr));
    return GC_SUCCESS;
}

gc_status gc_stream_create(gc_stream *stream) {
    GC_REQUIRE(stream, "stream is NULL");
    cudaStream_t created;
    /* non-blocking: no implicit synchronisation with the legacy NULL stream */
    GC_CUDA_TRY(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
    *stream = created;
    return GC_SUCCESS;
}

gc_status gc_stream_destroy(gc_stream stream) {
    GC_REQUIRE(stream, "stream is NULL (the default stream cannot be destroyed)");
    GC_CUDA_TRY(cudaStreamDestroy(as_stream(stream)));
    return GC_SUCCESS;
}

gc_status gc_stream_synchronize(gc_stream stream) {
    GC_CUDA_TRY(cudaStreamSynchronize(as_stream(stream)));
    return GC_SUCCESS;
}

gc_status gc_event_create(gc_event *event) {
    GC_REQUIRE(event, "event is NULL");
    cudaEvent_t created;
    GC_CUDA_TRY(cudaEventCreate(&created));
    *event = created;
    return GC_SUCCESS;
}

gc_status gc_event_destroy(gc_event event) {
    GC_REQUIRE(event, "event is NULL");
    GC_CUDA_TRY(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
    return GC_SUCCESS;
}

gc_status gc_event_record(gc_event event, gc_stream stream) {
    GC_REQUIRE(event, "event is NULL");
    GC_CUDA_TRY(cudaEventRecord(static_cast<cudaEvent_t>(event), as_stream(stream)));
    return GC_SUCCESS;
}

gc_status gc_event_synchronize(gc_event event) {
    GC_REQUIRE(event, "event is NULL");
    GC_CUDA_TRY(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
    return GC_SUCCESS;
}

gc_status gc_event_elapsed_ms(float *ms, gc_event start, gc_event end) {
    GC_REQUIRE(ms && start && end, "ms, start and end must not be NULL");
    GC_CUDA_TRY(cudaEventElapsedTime(ms, static_cast<cudaEvent_t>(start),
                                     static_cast<cudaEvent_t>(end)));
    return GC_SUCCESS;
}

/* gc_graph is a cudaGraphExec_t. Capture mode "thread local": another thread's
 * capture-unsafe call (cudaMalloc, ...) does not invalidate this capture. */
gc_status gc_graph_begin_capture(gc_stream stream) {
    GC_REQUIRE(stream, "stream is NULL (the legacy default stream cannot be captured)");
    GC_CUDA_TRY(cudaStreamBeginCapture(as_stream(stream), cudaStreamCaptureModeThreadLocal));
    return GC_SUCCESS;
}

gc_status gc_graph_end_capture(gc_graph *graph, gc_stream stream) {
    GC_REQUIRE(graph && stream, "graph and stream must not be NULL");
    *graph = nullptr;
    cudaGraph_t captured = nullptr;
    cudaError_t error = cudaStreamEndCapture(as_stream(stream), &captured);
    if (error != cudaSuccess) {
        if (captured) cudaGraphDestroy(captured);
        return cuda_status(error, __func__, "cudaStreamEndCapture");
    }
    cudaGraphExec_t exec = nullptr;
    error = cudaGraphInstantiateWithFlags(&exec, captured, 0);
    cudaGraphDestroy(captured);
    GC_TRY(cuda_status(error, __func__, "cudaGraphInstantiateWithFlags"));
    *graph = reinterpret_cast<gc_graph>(exec);
    return GC_SUCCESS;
}

gc_status gc_graph_launch(gc_graph graph, gc_stream stream) {
    GC_REQUIRE(graph, "graph is NULL");
    GC_CUDA_TRY(cudaGraphLaunch(reinterpret_cast<cudaGraphExec_t>(graph), as_stream(stream)));
    return GC_SUCCESS;
}

gc_status gc_graph_destroy(gc_graph graph) {
    if (!graph) return GC_SUCCESS;
    GC_CUDA_TRY(cudaGraphExecDestroy(reinterpret_cast<cudaGraphExec_t>(graph)));
    return GC_SUCCESS;
}

/* gc_module is a cudaLibrary_t and gc_function a cudaKernel_t, both opaque pointers. */
gc_status gc_module_load(gc_module *module, const char *path) {
    GC_REQUIRE(module && path, "module %p and path %p must not be NULL", (void *)module, path);
    cudaLibrary_t library;
    cudaError_t error = cudaLibraryLoadFromFile(&library, path, nullptr, nullptr, 0, nullptr,
                                                nullptr, 0);
    if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver)
        return cuda_status(error, __func__, path);
    if (error != cudaSuccess) {
        cudaGetLastError();
        return gc_fail(GC_ERROR_MODULE, "gc_module_load: cannot load '%s' (PTX or cubin): %s (%s)",
                       path, cudaGetErrorString(error), cudaGetErrorName(error));
    }
    *module = reinterpret_cast<gc_module>(library);
    return GC_SUCCESS;
}

gc_status gc_module_unload(gc_module module) {
    GC_REQUIRE(module, "module is NULL");
    GC_CUDA_TRY(cudaLibraryUnload(reinterpret_cast<cudaLibrary_t>(module)));
    return GC_SUCCESS;
}

gc_status gc_module_function(gc_function *function, gc_module module, const char *name) {
    GC_REQUIRE(function && module && name, "function, module and name must not be NULL");
    cudaKernel_t kernel;
    cudaError_t error =
        cudaLibraryGetKernel(&kernel, reinterpret_cast<cudaLibrary_t>(module), name);
    if (error != cudaSuccess) {
        cudaGetLastError();
        return gc_fail(GC_ERROR_MODULE,
                       "gc_module_function: no kernel '%s' in the module (is it extern \"C\" "
                       "__global__?): %s (%s)",
                       name, cudaGetErrorString(error), cudaGetErrorName(error));
    }
    *function = reinterpret_cast<gc_function>(kernel);
    return GC_SUCCESS;
}

gc_status gc_launch(gc_function function, const int64_t grid[3], const int64_t block[3],
                    int64_t shared_bytes, void **args, gc_stream stream) {
    GC_REQUIRE(function && grid && block, "function, grid and block must not be NULL");
    GC_REQUIRE(grid[0] >= 1 && grid[0] <= 0x7fffffff && grid[1] >= 1 && grid[1] <= 65535 &&
                   grid[2] >= 1 && grid[2] <= 65535,
               "grid (%lld, %lld, %lld) out of range; expected x in [1, 2^31 - 1], y and z in "
               "[1, 65535]",
               (long long)grid[0], (long long)grid[1], (long long)grid[2]);
    GC_REQUIRE(block[0] >= 1 && block[1] >= 1 && block[2] >= 1 && block[2] <= 64 &&
                   block[0] * block[1] * block[2] <= 1024,
               "block (%lld, %lld, %lld) must have 1 to 1024 threads (z <= 64)",
               (long long)block[0], (long long)block[1], (long long)block[2]);
    GC_REQUIRE(shared_bytes >= 0, "shared_bytes is %lld; expected >= 0", (long long)shared_bytes);
    const void *kernel = reinterpret_cast<const void *>(function);
    if (shared_bytes > 48 * 1024)
        GC_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)shared_bytes));
    cudaError_t error = cudaLaunchKernel(
        kernel, dim3((unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2]),
        dim3((unsigned)block[0], (unsigned)block[1], (unsigned)block[2]), args,
        (size_t)shared_bytes, as_stream(stream));
    if (error != cudaSuccess) {
        if (is_sticky(error)) return device_lost(error, __func__, "cudaLaunchKernel");
        cudaGetLastError();
        return gc_fail(GC_ERROR_LAUNCH, "gc_launch: %s (%s)", cudaGetErrorString(error),
                       cudaGetErrorName(error));
    }
    return GC_SUCCESS;
}

} /* extern "C" */
