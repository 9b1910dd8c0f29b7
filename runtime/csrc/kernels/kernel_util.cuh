/* kernel_util.cuh: small helpers shared by the kernel sources of runtime/csrc/kernels.
 *
 * Everything here compiles in both builds (nvcc, and g++ against the emulation header), so it
 * uses only what the emulation supports: threadIdx/blockIdx/blockDim/gridDim, __syncthreads,
 * static __shared__ arrays. Invariants:
 *   - every 1-D kernel of this directory runs kThreads threads per block (block_reduce and
 *     the grid-stride loops rely on it);
 *   - grids are capped (kMaxBlocks) and kernels stride over their range, so any count fits;
 *   - NaN tests use x != x (the same in device code and in g++).
 */
#ifndef GC_KERNEL_UTIL_CUH
#define GC_KERNEL_UTIL_CUH

#include <stdint.h>

#include "common.h"
#include "graphc_rt.h"

#ifdef GC_EMULATION
#define GC_UNROLL
#else
#define GC_UNROLL _Pragma("unroll")
#endif

#ifndef __align__
#define __align__(n) alignas(n)
#endif

namespace gc_kernels {

constexpr int kThreads = 256;
/* enough blocks to fill an H100 several times over; kernels stride past it */
constexpr int64_t kMaxBlocks = 4096;

inline dim3 grid_1d(int64_t count) {
    int64_t blocks = (count + kThreads - 1) / kThreads;
    if (blocks < 1) blocks = 1;
    if (blocks > kMaxBlocks) blocks = kMaxBlocks;
    return dim3((unsigned)blocks, 1, 1);
}

/* the first index of this thread and the stride of a grid-stride loop over a 1-D grid */
__device__ inline int64_t global_thread_index() {
    return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ inline int64_t global_thread_count() { return (int64_t)gridDim.x * blockDim.x; }

__device__ inline bool is_nan(float x) { return x != x; }

/* Reduce one value per thread of a kThreads block; every thread gets the result. `scratch`
 * is a __shared__ array of kThreads elements; every thread of the block must call this. */
template <class T, class Combine>
__device__ T block_reduce(T value, Combine combine, T *scratch) {
    const int tid = threadIdx.x;
    scratch[tid] = value;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half >>= 1) {
        if (tid < half) scratch[tid] = combine(scratch[tid], scratch[tid + half]);
        __syncthreads();
    }
    T result = scratch[0];
    __syncthreads(); /* scratch may be reused right after */
    return result;
}

struct SumOp {
    template <class T>
    __device__ T operator()(T a, T b) const { return a + b; }
};

} /* namespace gc_kernels */

#endif /* GC_KERNEL_UTIL_CUH */
