/* gc_emu.h: CUDA C++ on the host, for the emulation build (libgraphc_rt_emu.so).
 *
 * Every kernel source is compiled by g++ with `-include gc_emu.h`. A launch runs the whole
 * grid on the calling OS thread before it returns: blocks one after another, each CUDA thread
 * of a block a fiber (its own stack, a hand-written context switch). Invariants:
 *   - a fiber only leaves the CPU at __syncthreads() or at a warp function (__shfl*_sync,
 *     __ballot_sync, __any_sync, __all_sync, __syncwarp), so everything between two barriers
 *     runs uninterrupted; atomics are still real atomics (other host threads may launch);
 *   - a barrier that cannot complete (some threads exited or wait at another barrier) is a
 *     fault recorded for GC_CHECK_LAUNCH (GC_ERROR_EMULATION), never a hang: the block is
 *     abandoned and no later block runs;
 *   - __shared__ variables are `static thread_local`: one copy per OS thread, reused block
 *     after block (not cleared between blocks: do not rely on zeroed shared memory); dynamic
 *     shared memory is allocated per launch at its exact size (AddressSanitizer sees
 *     overruns) and filled with 0xff bytes (NaN floats) before every block;
 *   - "device" memory is host memory; __CUDA_ARCH__ is not defined; warpSize is 32;
 *   - a warp function reading a lane that did not take part returns the caller's own value;
 *   - cp.async copies (__pipeline_memcpy_async) land when their thread waits for them
 *     (__pipeline_wait_prior), not when they are issued;
 *   - checking modes (GRAPHC_EMU_RACECHECK, GRAPHC_EMU_SCHEDULE; runtime/csrc/README.md) see
 *     memory accesses only in code compiled with -fsanitize=thread (the emu-checked build).
 * GC_EMU_EXPORT(name) after an extern "C" kernel makes it launchable through gc_launch.
 */
#ifndef GRAPHC_GC_EMU_H
#define GRAPHC_GC_EMU_H

#ifndef GC_EMULATION
#define GC_EMULATION 1
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <cstddef>
#include <memory> /* before __noinline__ below: libstdc++ spells an attribute with it */
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- qualifiers ------------------------------------------------------------------------ */
#define __global__
#define __device__
#define __host__
#define __constant__
#define __shared__ static thread_local
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* __restrict__ is already a g++ keyword. */

/* ---- vector types ---------------------------------------------------------------------- */
struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1)
        : x(x_), y(y_), z(z_) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
struct __align__(8) float2 { float x, y; };
struct float3 { float x, y, z; };
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) int2 { int x, y; };
struct int3 { int x, y, z; };
struct __align__(16) int4 { int x, y, z, w; };
struct __align__(8) uint2 { unsigned int x, y; };
struct __align__(16) uint4 { unsigned int x, y, z, w; };
struct __align__(16) double2 { double x, y; };

static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float3 make_float3(float x, float y, float z) { return {x, y, z}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline int2 make_int2(int x, int y) { return {x, y}; }
static inline int3 make_int3(int x, int y, int z) { return {x, y, z}; }
static inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return {x, y, z, w};
}
static inline double2 make_double2(double x, double y) { return {x, y}; }

/* ---- the runtime API's few names kernels use -------------------------------------------- */
typedef struct CUstream_st *cudaStream_t;
enum cudaError_t { cudaSuccess = 0 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <class Kernel>
static inline cudaError_t cudaFuncSetAttribute(Kernel, cudaFuncAttribute, int) {
    return cudaSuccess; /* emulation has no opt-in limit below its own (227 KiB) */
}

/* ---- the emulation core (emu/scheduler.cpp) --------------------------------------------- */
namespace gc_emu {

struct ThreadIndex { uint3 thread_idx, block_idx, block_dim, grid_dim; };
extern __thread ThreadIndex current; /* set by the scheduler before each fiber resumes */

constexpr int kWarpSize = 32;
constexpr size_t kSlotBytes = 16;      /* largest value a warp function exchanges */
constexpr int kMaxBlockThreads = 1024;
constexpr int64_t kMaxSharedBytes = 227 * 1024;

typedef void (*KernelBody)(const void *closure);

/* Runs the grid; on a fault (bad configuration, partial barrier) records it and returns
 * false. The record stays until clear_fault() (GC_CHECK_LAUNCH reads and clears it). */
bool run_grid(const char *kernel_name, dim3 grid, dim3 block, int64_t shared_bytes,
              KernelBody body, const void *closure);
const char *pending_fault(); /* NULL when none */
void clear_fault();
void record_fault(const char *message);

void *dynamic_shared();
void syncthreads();
unsigned lane_id();
unsigned active_mask();
void syncwarp(unsigned mask);

/* Deposits `bytes` of *value for this lane, waits for the lanes of `mask`, and returns the
 * 32 slots (kSlotBytes apart) and which lanes deposited. `file`:`line` is the call in the
 * kernel (NULL for __syncwarp): the checking modes require the lanes to agree on it. */
struct Exchange { const unsigned char *slots; unsigned arrived; };
Exchange warp_exchange(unsigned mask, const void *value, size_t bytes, const char *file,
                       int line);

template <class T>
inline T read_lane(unsigned mask, T value, int source_lane, const char *file, int line) {
    static_assert(sizeof(T) <= kSlotBytes && std::is_trivially_copyable<T>::value,
                  "warp shuffles take trivially copyable values of at most 16 bytes");
    Exchange exchange = warp_exchange(mask, &value, sizeof(T), file, line);
    if (source_lane < 0 || source_lane >= kWarpSize || !(exchange.arrived >> source_lane & 1u))
        return value;
    T result;
    memcpy(&result, exchange.slots + source_lane * kSlotBytes, sizeof(T));
    return result;
}

inline unsigned vote(unsigned mask, int predicate, const char *file, int line) {
    int flag = predicate != 0;
    Exchange exchange = warp_exchange(mask, &flag, sizeof flag, file, line);
    unsigned ballot = 0;
    for (int lane = 0; lane < kWarpSize; ++lane) {
        int lane_flag;
        memcpy(&lane_flag, exchange.slots + lane * kSlotBytes, sizeof lane_flag);
        if ((mask & exchange.arrived) >> lane & 1u && lane_flag) ballot |= 1u << lane;
    }
    return ballot;
}

/* ---- launching -------------------------------------------------------------------------- */
template <class... Params>
class Launcher {
  public:
    using Kernel = void (*)(Params...);
    Launcher(Kernel kernel, const char *name, dim3 grid, dim3 block, int64_t shared_bytes)
        : kernel_(kernel), name_(name), grid_(grid), block_(block), shared_bytes_(shared_bytes) {}

    template <class... Args>
    bool operator()(Args &&...args) const {
        static_assert(sizeof...(Args) == sizeof...(Params),
                      "GC_LAUNCH: the argument count differs from the kernel's parameters");
        Closure closure{kernel_, Arguments(std::forward<Args>(args)...)};
        return run_grid(name_, grid_, block_, shared_bytes_, &invoke, &closure);
    }

  private:
    using Arguments = std::tuple<std::decay_t<Params>...>;
    struct Closure { Kernel kernel; Arguments arguments; };
    static void invoke(const void *closure) {
        const Closure *c = static_cast<const Closure *>(closure);
        std::apply(c->kernel, c->arguments); /* every thread gets its own copy of the args */
    }
    Kernel kernel_;
    const char *name_;
    dim3 grid_, block_;
    int64_t shared_bytes_;
};

template <class... Params, class Stream>
inline Launcher<Params...> make_launcher(void (*kernel)(Params...), const char *name, dim3 grid,
                                         dim3 block, int64_t shared_bytes, Stream) {
    return Launcher<Params...>(kernel, name, grid, block, shared_bytes);
}

/* gc_launch's way into a generated kernel: args as cuLaunchKernel (one pointer per
 * parameter, pointing at its value); grid and block already validated by gc_launch. */
typedef void (*Entry)(const int64_t *grid, const int64_t *block, int64_t shared_bytes,
                      void **args);

template <class... Params, size_t... I>
inline void launch_packed(void (*kernel)(Params...), const char *name, const int64_t *grid,
                          const int64_t *block, int64_t shared_bytes, void **args,
                          std::index_sequence<I...>) {
    Launcher<Params...>(kernel, name, dim3(grid[0], grid[1], grid[2]),
                        dim3(block[0], block[1], block[2]),
                        shared_bytes)(*static_cast<std::decay_t<Params> *>(args[I])...);
}

template <class... Params>
inline void launch_packed(void (*kernel)(Params...), const char *name, const int64_t *grid,
                          const int64_t *block, int64_t shared_bytes, void **args) {
    launch_packed(kernel, name, grid, block, shared_bytes, args,
                  std::index_sequence_for<Params...>{});
}

} /* namespace gc_emu */

#define GC_EMU_EXPORT(name)                                                                \
    extern "C" __attribute__((visibility("default"))) void name##__gc_emu_entry(           \
        const int64_t *grid, const int64_t *block, int64_t shared_bytes, void **args) {   \
        ::gc_emu::launch_packed(name, #name, grid, block, shared_bytes, args);             \
    }

/* ---- built-in variables ----------------------------------------------------------------- */
#define threadIdx (::gc_emu::current.thread_idx)
#define blockIdx (::gc_emu::current.block_idx)
#define blockDim (::gc_emu::current.block_dim)
#define gridDim (::gc_emu::current.grid_dim)
#define warpSize 32

/* ---- synchronisation and warp functions ------------------------------------------------- */
static inline void __syncthreads() { ::gc_emu::syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { ::gc_emu::syncwarp(mask); }
static inline unsigned __activemask() { return ::gc_emu::active_mask(); }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* The trailing defaulted arguments name the caller's line (as std::source_location does), so
 * the checking modes can tell which call each lane makes. */
#define GC_EMU_CALL_SITE const char *gc_file = __builtin_FILE(), int gc_line = __builtin_LINE()
template <class T>
static inline T __shfl_sync(unsigned mask, T value, int source_lane, int width = warpSize,
                            GC_EMU_CALL_SITE) {
    int lane = (int)::gc_emu::lane_id();
    return ::gc_emu::read_lane(mask, value, (lane & ~(width - 1)) + (source_lane & (width - 1)),
                               gc_file, gc_line);
}
template <class T>
static inline T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = warpSize,
                               GC_EMU_CALL_SITE) {
    int lane = (int)::gc_emu::lane_id();
    int source = lane - (int)delta;
    return ::gc_emu::read_lane(mask, value, source < (lane & ~(width - 1)) ? lane : source,
                               gc_file, gc_line);
}
template <class T>
static inline T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = warpSize,
                                 GC_EMU_CALL_SITE) {
    int lane = (int)::gc_emu::lane_id();
    int source = lane + (int)delta;
    return ::gc_emu::read_lane(mask, value,
                               source >= (lane & ~(width - 1)) + width ? lane : source, gc_file,
                               gc_line);
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = warpSize,
                                GC_EMU_CALL_SITE) {
    int lane = (int)::gc_emu::lane_id();
    int source = lane ^ lane_mask;
    return ::gc_emu::read_lane(mask, value,
                               source >= (lane & ~(width - 1)) + width ? lane : source, gc_file,
                               gc_line);
}
static inline unsigned __ballot_sync(unsigned mask, int predicate, GC_EMU_CALL_SITE) {
    return ::gc_emu::vote(mask, predicate, gc_file, gc_line);
}
static inline int __any_sync(unsigned mask, int predicate, GC_EMU_CALL_SITE) {
    return ::gc_emu::vote(mask, predicate, gc_file, gc_line) != 0;
}
static inline int __all_sync(unsigned mask, int predicate, GC_EMU_CALL_SITE) {
    return ::gc_emu::vote(mask, !predicate, gc_file, gc_line) == 0;
}
#undef GC_EMU_CALL_SITE

/* ---- asynchronous copies (cuda_pipeline.h's primitives) ---------------------------------- */
/* __pipeline_memcpy_async queues a copy on this CUDA thread; __pipeline_commit closes the
 * current group; __pipeline_wait_prior(n) performs the copies of every committed group but the
 * newest n, here, in the waiting thread. So a copy lands no earlier than CUDA lets a kernel
 * rely on it: a thread that reads a stage before its wait reads stale data, another thread
 * sees it only after a barrier that follows the wait, and racecheck sees the shared-memory
 * writes at the wait (the copy loop below is in the kernel's object, so it is instrumented).
 * A copy never waited for lands when its thread exits. Sizes 4, 8 or 16 with both addresses
 * aligned to them, zfill <= size, as in CUDA; anything else is a launch fault. */
namespace gc_emu {
struct PipelineCopy {
    void *dst;
    const void *src;
    uint32_t bytes, zfill;
    uint64_t group;
};
void pipeline_copy_async(void *dst, const void *src, size_t bytes, size_t zfill);
void pipeline_commit();
/* takes this thread's copies of the committed groups older than the newest `prior` */
size_t pipeline_take(size_t prior, const PipelineCopy **copies);
} /* namespace gc_emu */

static inline void __pipeline_memcpy_async(void *__restrict__ dst_shared,
                                           const void *__restrict__ src_global,
                                           size_t size_and_align, size_t zfill = 0) {
    ::gc_emu::pipeline_copy_async(dst_shared, src_global, size_and_align, zfill);
}
static inline void __pipeline_commit() { ::gc_emu::pipeline_commit(); }
/* no loop-to-memcpy rewrite: a memcpy call would hide the accesses from racecheck */
__attribute__((optimize("no-tree-loop-distribute-patterns")))
static inline void __pipeline_wait_prior(size_t prior) {
    const ::gc_emu::PipelineCopy *copies;
    const size_t count = ::gc_emu::pipeline_take(prior, &copies);
    for (size_t i = 0; i < count; ++i) {
        unsigned char *dst = static_cast<unsigned char *>(copies[i].dst);
        const unsigned char *src = static_cast<const unsigned char *>(copies[i].src);
        const uint32_t keep = copies[i].bytes - copies[i].zfill;
        if (keep % 4 == 0) {
            for (uint32_t w = 0; w < keep / 4; ++w)
                reinterpret_cast<uint32_t *>(dst)[w] = reinterpret_cast<const uint32_t *>(src)[w];
        } else {
            for (uint32_t b = 0; b < keep; ++b) dst[b] = src[b];
        }
        for (uint32_t b = keep; b < copies[i].bytes; ++b) dst[b] = 0;
    }
}

/* ---- atomics ---------------------------------------------------------------------------- */
#define GC_EMU_INTEGER_ATOMICS(T)                                                              \
    static inline T atomicAdd(T *a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); } \
    static inline T atomicSub(T *a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); } \
    static inline T atomicAnd(T *a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_RELAXED); } \
    static inline T atomicOr(T *a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }   \
    static inline T atomicXor(T *a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_RELAXED); } \
    static inline T atomicExch(T *a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); } \
    static inline T atomicCAS(T *a, T expected, T desired) {                                   \
        __atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_RELAXED,            \
                                    __ATOMIC_RELAXED);                                         \
        return expected;                                                                       \
    }                                                                                          \
    static inline T atomicMax(T *a, T v) {                                                     \
        T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                          \
        while (old < v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED,     \
                                                       __ATOMIC_RELAXED)) {}                   \
        return old;                                                                            \
    }                                                                                          \
    static inline T atomicMin(T *a, T v) {                                                     \
        T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                          \
        while (v < old && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED,     \
                                                       __ATOMIC_RELAXED)) {}                   \
        return old;                                                                            \
    }
GC_EMU_INTEGER_ATOMICS(int)
GC_EMU_INTEGER_ATOMICS(unsigned int)
GC_EMU_INTEGER_ATOMICS(unsigned long long)
GC_EMU_INTEGER_ATOMICS(long long)
#undef GC_EMU_INTEGER_ATOMICS

template <class F, class Bits>
static inline F gc_emu_atomic_float_add(F *address, F value) {
    static_assert(sizeof(F) == sizeof(Bits), "float and bits differ in size");
    Bits *bits = reinterpret_cast<Bits *>(address);
    Bits old = __atomic_load_n(bits, __ATOMIC_RELAXED), desired;
    F old_value;
    do {
        memcpy(&old_value, &old, sizeof old);
        F sum = old_value + value;
        memcpy(&desired, &sum, sizeof desired);
    } while (!__atomic_compare_exchange_n(bits, &old, desired, true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return old_value;
}
static inline float atomicAdd(float *a, float v) {
    return gc_emu_atomic_float_add<float, uint32_t>(a, v);
}
static inline double atomicAdd(double *a, double v) {
    return gc_emu_atomic_float_add<double, uint64_t>(a, v);
}
static inline float atomicExch(float *a, float v) {
    float old;
    __atomic_exchange(a, &v, &old, __ATOMIC_RELAXED);
    return old;
}

/* ---- bits and conversions --------------------------------------------------------------- */
template <class To, class From>
static inline To gc_emu_bit_cast(From from) {
    static_assert(sizeof(To) == sizeof(From), "bit cast between different sizes");
    To to;
    memcpy(&to, &from, sizeof to);
    return to;
}
static inline int __float_as_int(float x) { return gc_emu_bit_cast<int>(x); }
static inline float __int_as_float(int x) { return gc_emu_bit_cast<float>(x); }
static inline unsigned __float_as_uint(float x) { return gc_emu_bit_cast<unsigned>(x); }
static inline float __uint_as_float(unsigned x) { return gc_emu_bit_cast<float>(x); }
static inline long long __double_as_longlong(double x) { return gc_emu_bit_cast<long long>(x); }
static inline double __longlong_as_double(long long x) { return gc_emu_bit_cast<double>(x); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __clzll(long long x) {
    return x == 0 ? 64 : __builtin_clzll((unsigned long long)x);
}
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline float __int2float_rn(int x) { return (float)x; }

template <class T>
static inline T __ldg(const T *p) { return *p; }

/* ---- math ------------------------------------------------------------------------------- */
/* expf, logf, tanhf, erff, fabsf, fmaxf, fminf, fmaf, sqrtf, INFINITY, NAN: <math.h>. */
/* glibc already declares __expf, __logf, ... (its own names for expf, logf, ...), so these
 * are macros rather than functions. */
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __log2f(x) log2f(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __powf(x, y) powf((x), (y))
#define __exp10f(x) powf(10.0f, (x))
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __fmaf_rn(float x, float y, float z) { return fmaf(x, y, z); }
static inline float __fadd_rn(float x, float y) { return x + y; }
static inline float __fmul_rn(float x, float y) { return x * y; }
static inline float __saturatef(float x) { return x != x ? 0.0f : fminf(fmaxf(x, 0.0f), 1.0f); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }

/* CUDA's global min/max: floating overloads as fminf/fmaxf, integers in their common type */
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
template <class A, class B,
          class = std::enable_if_t<std::is_integral<A>::value && std::is_integral<B>::value>>
static inline std::common_type_t<A, B> min(A a, B b) {
    return b < a ? (std::common_type_t<A, B>)b : (std::common_type_t<A, B>)a;
}
template <class A, class B,
          class = std::enable_if_t<std::is_integral<A>::value && std::is_integral<B>::value>>
static inline std::common_type_t<A, B> max(A a, B b) {
    return a < b ? (std::common_type_t<A, B>)b : (std::common_type_t<A, B>)a;
}

#endif /* GRAPHC_GC_EMU_H */
