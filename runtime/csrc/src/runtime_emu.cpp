/* runtime_emu.cpp: the library, device, memory, stream, event, module and launch parts of
 * the graphc_rt.h ABI for the emulation build (libgraphc_rt_emu.so).
 *
 * Invariants: there is one device, the host; "device" memory is host memory from
 * posix_memalign at its exact size (AddressSanitizer sees overruns); everything is
 * synchronous, so streams and events only need to be valid handles (events record host time);
 * a module is a g++-built shared object whose kernels were exported with GC_EMU_EXPORT.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "common.h"

namespace {

struct Stream { int unused = 0; };
struct Event {
    bool recorded = false;
    std::chrono::steady_clock::time_point time;
};

/* Handles this library gave out and has not destroyed: a stale or foreign handle is an
 * invalid argument, not a crash. */
class HandleSet {
  public:
    void add(void *handle) {
        std::lock_guard<std::mutex> lock(mutex_);
        handles_.insert(handle);
    }
    bool remove(void *handle) {
        std::lock_guard<std::mutex> lock(mutex_);
        return handles_.erase(handle) == 1;
    }
    bool contains(void *handle) {
        std::lock_guard<std::mutex> lock(mutex_);
        return handles_.count(handle) == 1;
    }

  private:
    std::mutex mutex_;
    std::unordered_set<void *> handles_;
};

/* ---- the sticky mode: a CUDA context's sticky errors, emulated --------------------------
 * GRAPHC_EMU_STICKY=1 (read at each fault): a kernel fault leaves the "context" unusable, as
 * an illegal address does on a GPU. The faulting launch and every later device call return
 * GC_ERROR_DEVICE_LOST naming the first fault, until gc_device_reset(), which frees every
 * device allocation (gone, as with cudaDeviceReset) and makes the context usable again.
 * GRAPHC_EMU_STICKY=unrecoverable: the same, but the reset fails too. Without the mode a
 * fault is reported by its launch only and nothing is lost. */
struct Context {
    std::mutex mutex;
    bool lost = false;
    std::string first_fault;
    std::unordered_set<void *> allocations; /* gc_malloc'ed and not freed: what a reset frees */
};

Context &context() {
    static Context c;
    return c;
}

const char *sticky_mode() {
    const char *mode = getenv("GRAPHC_EMU_STICKY");
    return mode && *mode && strcmp(mode, "0") != 0 ? mode : nullptr;
}

gc_status lost_status(const char *function) {
    Context &c = context();
    std::lock_guard<std::mutex> lock(c.mutex);
    return gc_fail(GC_ERROR_DEVICE_LOST,
                   "%s: the CUDA context is unusable since an earlier kernel fault (%s); every "
                   "call fails until gc_device_reset() recreates it, and every device "
                   "allocation is lost with it (the emulation's sticky mode, "
                   "GRAPHC_EMU_STICKY)", function, c.first_fault.c_str());
}

bool context_lost() {
    Context &c = context();
    std::lock_guard<std::mutex> lock(c.mutex);
    return c.lost;
}

#define GC_EMU_ALIVE()                                             \
    do {                                                           \
        if (context_lost()) return lost_status(__func__);          \
    } while (0)

HandleSet &live_streams() {
    static HandleSet set;
    return set;
}
HandleSet &live_events() {
    static HandleSet set;
    return set;
}

gc_status check_stream(gc_stream stream, const char *function) {
    if (stream && !live_streams().contains(stream))
        return gc_fail(GC_ERROR_INVALID_ARGUMENT,
                       "%s: stream %p is not a live gc_stream; pass NULL (the default stream) "
                       "or one from gc_stream_create",
                       function, stream);
    return GC_SUCCESS;
}

Event *live_event(gc_event event) {
    return event && live_events().contains(event) ? static_cast<Event *>(event) : nullptr;
}

gc_status check_copy(void *dst, const void *src, int64_t bytes, gc_stream stream,
                     const char *function) {
    if (context_lost()) return lost_status(function);
    GC_TRY(check_stream(stream, function));
    if (bytes < 0)
        return gc_fail(GC_ERROR_INVALID_ARGUMENT, "%s: bytes is %lld; expected >= 0", function,
                       (long long)bytes);
    if (bytes > 0 && (!dst || !src))
        return gc_fail(GC_ERROR_INVALID_ARGUMENT,
                       "%s: a NULL pointer (dst %p, src %p) for %lld bytes", function, dst, src,
                       (long long)bytes);
    if (bytes > 0) memmove(dst, src, (size_t)bytes);
    return GC_SUCCESS;
}

} /* namespace */

struct gc_function_s {
    gc_emu::Entry entry;
    std::string name;
};

struct gc_module_s {
    void *handle;
    std::string path;
    std::vector<gc_function_s *> functions;
};

extern "C" {

const char *gc_runtime_kind(void) { return "emulation"; }

gc_status gc_device_count(int32_t *count) {
    GC_REQUIRE(count, "count is NULL");
    *count = 1;
    return GC_SUCCESS;
}

gc_status gc_set_device(int32_t device) {
    GC_REQUIRE(device == 0, "device %d does not exist; the emulation has one device, 0", device);
    return GC_SUCCESS;
}

gc_status gc_device_properties(int32_t device, char *name, int64_t capacity, int32_t *major,
                               int32_t *minor, int64_t *total_memory_bytes,
                               int32_t *multiprocessor_count) {
    GC_REQUIRE(device == 0, "device %d does not exist; the emulation has one device, 0", device);
    GC_REQUIRE(capacity >= 0 && (capacity == 0 || name), "name %p with capacity %lld", name,
               (long long)capacity);
    if (capacity > 0) {
        strncpy(name, "graphc emulation (host CPU)", (size_t)capacity);
        name[capacity - 1] = '\0';
    }
    if (major) *major = 8; /* the lowest architecture the CUDA build targets */
    if (minor) *minor = 0;
    if (total_memory_bytes)
        *total_memory_bytes = (int64_t)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE);
    if (multiprocessor_count) *multiprocessor_count = 1; /* blocks run one after another */
    return GC_SUCCESS;
}

gc_status gc_device_synchronize(void) {
    GC_EMU_ALIVE();
    return GC_SUCCESS;
}

gc_status gc_driver_version(int32_t *driver, int32_t *runtime) {
    GC_REQUIRE(driver && runtime, "driver and runtime must not be NULL");
    *driver = *runtime = 0; /* no CUDA driver or runtime is involved */
    return GC_SUCCESS;
}

/* Without a sticky fault (see the sticky mode above) nothing is recreated and "device"
 * memory stays valid; after one, every device allocation is freed, as cudaDeviceReset does. */
gc_status gc_device_reset(void) {
    Context &c = context();
    std::lock_guard<std::mutex> lock(c.mutex);
    if (!c.lost) return GC_SUCCESS;
    const char *mode = sticky_mode();
    if (mode && strcmp(mode, "unrecoverable") == 0)
        return gc_fail(GC_ERROR_DEVICE_LOST, "gc_device_reset: the context cannot be recreated "
                       "(GRAPHC_EMU_STICKY=unrecoverable); it is unusable since an earlier "
                       "kernel fault (%s)", c.first_fault.c_str());
    for (void *p : c.allocations) free(p);
    c.allocations.clear();
    c.lost = false;
    c.first_fault.clear();
    return GC_SUCCESS;
}

gc_status gc_malloc(void **ptr, int64_t bytes) {
    GC_REQUIRE(ptr, "ptr is NULL");
    GC_REQUIRE(bytes >= 0, "bytes is %lld; expected >= 0", (long long)bytes);
    *ptr = nullptr;
    GC_EMU_ALIVE();
    if (bytes == 0) return GC_SUCCESS;
    if (posix_memalign(ptr, 256, (size_t)bytes) != 0) {
        *ptr = nullptr;
        return gc_fail(GC_ERROR_OUT_OF_MEMORY, "gc_malloc: cannot allocate %lld bytes",
                       (long long)bytes);
    }
    Context &c = context();
    std::lock_guard<std::mutex> lock(c.mutex);
    c.allocations.insert(*ptr);
    return GC_SUCCESS;
}

gc_status gc_free(void *ptr) {
    if (!ptr) return GC_SUCCESS;
    {
        Context &c = context();
        std::lock_guard<std::mutex> lock(c.mutex);
        GC_REQUIRE(c.allocations.erase(ptr) == 1,
                   "%p is not a live device allocation (freed already, lost in a device reset, "
                   "or not from gc_malloc)", ptr);
    }
    free(ptr);
    return GC_SUCCESS;
}

gc_status gc_memcpy_h2d(void *dst, const void *src, int64_t bytes, gc_stream stream) {
    GC_TRY(check_copy(dst, src, bytes, stream, __func__));
    gc_count_transfer(true, bytes);
    return GC_SUCCESS;
}

gc_status gc_memcpy_d2h(void *dst, const void *src, int64_t bytes, gc_stream stream) {
    GC_TRY(check_copy(dst, src, bytes, stream, __func__));
    gc_count_transfer(false, bytes);
    return GC_SUCCESS;
}

gc_status gc_memcpy_d2d(void *dst, const void *src, int64_t bytes, gc_stream stream) {
    return check_copy(dst, src, bytes, stream, __func__);
}

gc_status gc_memset(void *dst, int32_t byte_value, int64_t bytes, gc_stream stream) {
    GC_EMU_ALIVE();
    GC_TRY(check_stream(stream, __func__));
    GC_REQUIRE(bytes >= 0, "bytes is %lld; expected >= 0", (long long)bytes);
    GC_REQUIRE(bytes == 0 || dst, "dst is NULL for %lld bytes", (long long)bytes);
    if (bytes > 0) memset(dst, byte_value, (size_t)bytes);
    return GC_SUCCESS;
}

gc_status gc_host_alloc(void **ptr, int64_t bytes) {
    GC_REQUIRE(ptr, "ptr is NULL");
    GC_REQUIRE(bytes >= 0, "bytes is %lld; expected >= 0", (long long)bytes);
    *ptr = nullptr;
    if (bytes == 0) return GC_SUCCESS;
    if (posix_memalign(ptr, 4096, (size_t)bytes) != 0) {
        *ptr = nullptr;
        return gc_fail(GC_ERROR_OUT_OF_MEMORY, "gc_host_alloc: cannot allocate %lld bytes",
                       (long long)bytes);
    }
    return GC_SUCCESS;
}

gc_status gc_host_free(void *ptr) {
    free(ptr);
    return GC_SUCCESS;
}

gc_status gc_stream_create(gc_stream *stream) {
    GC_REQUIRE(stream, "stream is NULL");
    GC_EMU_ALIVE();
    Stream *created = new Stream();
    live_streams().add(created);
    *stream = created;
    return GC_SUCCESS;
}

gc_status gc_stream_destroy(gc_stream stream) {
    GC_REQUIRE(stream && live_streams().remove(stream),
               "%p is not a live gc_stream (NULL, destroyed or foreign)", stream);
    delete static_cast<Stream *>(stream);
    return GC_SUCCESS;
}

gc_status gc_stream_synchronize(gc_stream stream) {
    GC_EMU_ALIVE();
    return check_stream(stream, __func__);
}

gc_status gc_event_create(gc_event *event) {
    GC_REQUIRE(event, "event is NULL");
    Event *created = new Event();
    live_events().add(created);
    *event = created;
    return GC_SUCCESS;
}

gc_status gc_event_destroy(gc_event event) {
    GC_REQUIRE(event && live_events().remove(event),
               "%p is not a live gc_event (NULL, destroyed or foreign)", event);
    delete static_cast<Event *>(event);
    return GC_SUCCESS;
}

gc_status gc_event_record(gc_event event, gc_stream stream) {
    GC_EMU_ALIVE();
    Event *e = live_event(event);
    GC_REQUIRE(e, "%p is not a live gc_event", event);
    GC_TRY(check_stream(stream, __func__));
    e->recorded = true;
    e->time = std::chrono::steady_clock::now();
    return GC_SUCCESS;
}

gc_status gc_event_synchronize(gc_event event) {
    GC_REQUIRE(live_event(event), "%p is not a live gc_event", event);
    return GC_SUCCESS;
}

gc_status gc_event_elapsed_ms(float *ms, gc_event start, gc_event end) {
    GC_REQUIRE(ms, "ms is NULL");
    Event *first = live_event(start), *last = live_event(end);
    GC_REQUIRE(first && last, "start %p and end %p must be live gc_events", start, end);
    GC_REQUIRE(first->recorded && last->recorded,
               "both events must be recorded first (start %s, end %s)",
               first->recorded ? "recorded" : "not recorded",
               last->recorded ? "recorded" : "not recorded");
    *ms = std::chrono::duration<float, std::milli>(last->time - first->time).count();
    return GC_SUCCESS;
}

/* Launches run as they are issued, so there is nothing to record: capture is refused and the
 * caller runs its work directly (the cuda backend does). */
gc_status gc_graph_begin_capture(gc_stream stream) {
    GC_TRY(check_stream(stream, __func__));
    return gc_fail(GC_ERROR_NOT_SUPPORTED,
                   "gc_graph_begin_capture: the emulation runs launches as they are issued "
                   "and records no CUDA graph; run the work directly");
}

gc_status gc_graph_end_capture(gc_graph *graph, gc_stream stream) {
    GC_REQUIRE(graph, "graph is NULL");
    *graph = nullptr;
    GC_TRY(check_stream(stream, __func__));
    return gc_fail(GC_ERROR_NOT_SUPPORTED, "gc_graph_end_capture: no capture in the emulation");
}

gc_status gc_graph_launch(gc_graph graph, gc_stream stream) {
    (void)graph;
    GC_TRY(check_stream(stream, __func__));
    return gc_fail(GC_ERROR_NOT_SUPPORTED, "gc_graph_launch: no CUDA graphs in the emulation");
}

gc_status gc_graph_destroy(gc_graph graph) {
    GC_REQUIRE(!graph, "%p is not a gc_graph (the emulation makes none)", (void *)graph);
    return GC_SUCCESS;
}

gc_status gc_module_load(gc_module *module, const char *path) {
    GC_REQUIRE(module && path, "module %p and path %p must not be NULL", (void *)module, path);
    GC_EMU_ALIVE();
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle)
        return gc_fail(GC_ERROR_MODULE,
                       "gc_module_load: cannot load '%s' (expected a shared object built with "
                       "g++ against gc_emu.h): %s",
                       path, dlerror());
    *module = new gc_module_s{handle, path, {}};
    return GC_SUCCESS;
}

gc_status gc_module_unload(gc_module module) {
    GC_REQUIRE(module, "module is NULL");
    for (gc_function_s *function : module->functions) delete function;
    dlclose(module->handle);
    delete module;
    return GC_SUCCESS;
}

gc_status gc_module_function(gc_function *function, gc_module module, const char *name) {
    GC_REQUIRE(function && module && name, "function, module and name must not be NULL");
    std::string symbol = std::string(name) + GC_EMU_ENTRY_SUFFIX;
    void *entry = dlsym(module->handle, symbol.c_str());
    if (!entry)
        return gc_fail(GC_ERROR_MODULE,
                       "gc_module_function: '%s' has no kernel '%s' (symbol %s; is the kernel "
                       "followed by GC_EMU_EXPORT(%s)?)",
                       module->path.c_str(), name, symbol.c_str(), name);
    module->functions.push_back(
        new gc_function_s{reinterpret_cast<gc_emu::Entry>(entry), name});
    *function = module->functions.back();
    return GC_SUCCESS;
}

gc_status gc_launch(gc_function function, const int64_t grid[3], const int64_t block[3],
                    int64_t shared_bytes, void **args, gc_stream stream) {
    GC_REQUIRE(function && grid && block, "function, grid and block must not be NULL");
    GC_EMU_ALIVE();
    GC_TRY(check_stream(stream, __func__));
    GC_REQUIRE(grid[0] >= 1 && grid[0] <= 0x7fffffff && grid[1] >= 1 && grid[1] <= 65535 &&
                   grid[2] >= 1 && grid[2] <= 65535,
               "%s: grid (%lld, %lld, %lld) out of range; expected x in [1, 2^31 - 1], y and "
               "z in [1, 65535]",
               function->name.c_str(), (long long)grid[0], (long long)grid[1],
               (long long)grid[2]);
    GC_REQUIRE(block[0] >= 1 && block[1] >= 1 && block[2] >= 1 && block[2] <= 64 &&
                   block[0] * block[1] * block[2] <= gc_emu::kMaxBlockThreads,
               "%s: block (%lld, %lld, %lld) must have 1 to %d threads (z <= 64)",
               function->name.c_str(), (long long)block[0], (long long)block[1],
               (long long)block[2], gc_emu::kMaxBlockThreads);
    GC_REQUIRE(shared_bytes >= 0 && shared_bytes <= gc_emu::kMaxSharedBytes,
               "%s: shared_bytes %lld; expected 0 to %lld", function->name.c_str(),
               (long long)shared_bytes, (long long)gc_emu::kMaxSharedBytes);
    gc_emu::clear_fault();
    function->entry(grid, block, shared_bytes, args);
    GC_CHECK_LAUNCH(function->name.c_str());
    return GC_SUCCESS;
}

} /* extern "C" */

gc_status gc_emu::check_launch(const char *what) {
    const char *pending = gc_emu::pending_fault();
    if (!pending) return context_lost() ? lost_status(what) : GC_SUCCESS;
    const std::string fault = pending;
    gc_emu::clear_fault();
    if (!sticky_mode()) return gc_fail(GC_ERROR_EMULATION, "%s: %s", what, fault.c_str());
    Context &c = context();
    std::lock_guard<std::mutex> lock(c.mutex);
    if (!c.lost) {
        c.lost = true;
        c.first_fault = std::string(what) + ": " + fault;
    }
    return gc_fail(GC_ERROR_DEVICE_LOST,
                   "%s: %s; the CUDA context is now unusable, as after a kernel fault on a GPU "
                   "(the emulation's sticky mode, GRAPHC_EMU_STICKY): every later call fails "
                   "until gc_device_reset() recreates it, and every device allocation is lost "
                   "with it", what, fault.c_str());
}
