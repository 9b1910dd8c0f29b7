/* elementwise.cu: the fixed elementwise and data-movement kernels of graphc_rt.h: gc_fill_f32,
 * gc_axpy_f32 (y = alpha * x + y), gc_copy_strided (a strided view gathered into a
 * contiguous buffer) and gc_memcpy_d2d_batch (many device copies in one launch: a compiled
 * call's outputs taken out of its arena cost one launch instead of one copy each).
 *
 * All are grid-stride loops over the element count (kernel_util.cuh), so any count >= 0 fits
 * a capped grid; count == 0 launches nothing. gc_copy_strided moves whole elements of 1, 2,
 * 4 or 8 bytes and accepts any stride sign (0 broadcasts); ndim == 0 copies one element.
 */
#include "kernel_util.cuh"

using namespace gc_kernels;

namespace {

constexpr int kMaxDims = 8;

struct StridedView {
    int32_t ndim;
    int64_t shape[kMaxDims];
    int64_t strides[kMaxDims];
};

__global__ void fill_kernel(float *dst, float value, int64_t count) {
    for (int64_t i = global_thread_index(); i < count; i += global_thread_count()) dst[i] = value;
}

__global__ void axpy_kernel(int64_t count, float alpha, const float *x, float *y) {
    for (int64_t i = global_thread_index(); i < count; i += global_thread_count())
        y[i] = alpha * x[i] + y[i];
}

/* dst[i] = src[offset(i)], where offset walks i's row-major coordinates with the strides */
template <class Element>
__global__ void copy_strided_kernel(StridedView view, const Element *src, Element *dst,
                                    int64_t count) {
    for (int64_t i = global_thread_index(); i < count; i += global_thread_count()) {
        int64_t rest = i, offset = 0;
        for (int d = view.ndim - 1; d >= 0; --d) {
            offset += (rest % view.shape[d]) * view.strides[d];
            rest /= view.shape[d];
        }
        dst[i] = src[offset];
    }
}

template <class Element>
gc_status launch_copy(const StridedView &view, const void *src, void *dst, int64_t count,
                      gc_stream stream) {
    const auto kernel = &copy_strided_kernel<Element>;
    GC_LAUNCH(kernel, grid_1d(count), dim3(kThreads, 1, 1), 0, stream)(
        view, static_cast<const Element *>(src), static_cast<Element *>(dst), count);
    GC_CHECK_LAUNCH("gc_copy_strided");
    return GC_SUCCESS;
}

constexpr int kBatchCopies = 32; /* copies per launch (their pointers: kernel parameters) */
#ifdef GC_EMULATION
constexpr int64_t kBatchBlocks = 1; /* blocks run one after another there: more add fibers */
#else
constexpr int64_t kBatchBlocks = 128; /* blocks per copy at most */
#endif

struct CopyBatch {
    const unsigned char *src[kBatchCopies];
    unsigned char *dst[kBatchCopies];
    int64_t bytes[kBatchCopies];
};

/* copy blockIdx.y of the batch; its blocks stride over it 16 bytes a thread where both ends
 * are 16-byte aligned (moves of whole bytes: the values' bits are kept) */
__global__ void copy_batch_kernel(CopyBatch batch) {
    const int c = blockIdx.y;
    const unsigned char *src = batch.src[c];
    unsigned char *dst = batch.dst[c];
    const int64_t bytes = batch.bytes[c];
    const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    int64_t done = 0;
    if ((((uintptr_t)src | (uintptr_t)dst) & 15) == 0) {
        const int64_t vectors = bytes / 16;
        for (int64_t i = first; i < vectors; i += step)
            reinterpret_cast<uint4 *>(dst)[i] = reinterpret_cast<const uint4 *>(src)[i];
        done = vectors * 16;
    }
    for (int64_t i = done + first; i < bytes; i += step) dst[i] = src[i];
}

} /* namespace */

extern "C" gc_status gc_memcpy_d2d_batch(void *const *dst, const void *const *src,
                                         const int64_t *bytes, int64_t count,
                                         gc_stream stream) {
    GC_REQUIRE(count >= 0, "count must be >= 0, got %lld", (long long)count);
    GC_REQUIRE(count == 0 || (dst != nullptr && src != nullptr && bytes != nullptr),
               "dst, src and bytes must not be NULL for %lld copies", (long long)count);
    for (int64_t i = 0; i < count; ++i) { /* all checked before anything is launched */
        GC_REQUIRE(bytes[i] >= 0, "bytes[%lld] must be >= 0, got %lld", (long long)i,
                   (long long)bytes[i]);
        GC_REQUIRE(bytes[i] == 0 || (dst[i] != nullptr && src[i] != nullptr),
                   "copy %lld of %lld bytes: dst and src must not be NULL (got dst = %p, "
                   "src = %p)", (long long)i, (long long)bytes[i], dst[i], src[i]);
    }
    CopyBatch batch;
    int used = 0;
    int64_t widest = 0;
    for (int64_t i = 0; i <= count; ++i) {
        if (i == count || used == kBatchCopies) { /* launch what is gathered */
            if (used > 0) {
                int64_t blocks = (widest / 16 + kThreads - 1) / kThreads;
                blocks = blocks < 1 ? 1 : blocks > kBatchBlocks ? kBatchBlocks : blocks;
                GC_LAUNCH(copy_batch_kernel, dim3((unsigned)blocks, (unsigned)used, 1),
                          dim3(kThreads, 1, 1), 0, stream)(batch);
                GC_CHECK_LAUNCH("gc_memcpy_d2d_batch");
            }
            used = 0;
            widest = 0;
            if (i == count) break;
        }
        if (bytes[i] == 0) continue;
        batch.src[used] = static_cast<const unsigned char *>(src[i]);
        batch.dst[used] = static_cast<unsigned char *>(dst[i]);
        batch.bytes[used] = bytes[i];
        widest = bytes[i] > widest ? bytes[i] : widest;
        ++used;
    }
    return GC_SUCCESS;
}

extern "C" gc_status gc_fill_f32(float *dst, float value, int64_t count, gc_stream stream) {
    GC_REQUIRE(count >= 0, "count must be >= 0, got %lld", (long long)count);
    GC_REQUIRE(dst != nullptr || count == 0, "dst is NULL but count is %lld", (long long)count);
    if (count == 0) return GC_SUCCESS;
    GC_LAUNCH(fill_kernel, grid_1d(count), dim3(kThreads, 1, 1), 0, stream)(dst, value, count);
    GC_CHECK_LAUNCH("gc_fill_f32");
    return GC_SUCCESS;
}

extern "C" gc_status gc_axpy_f32(int64_t count, float alpha, const float *x, float *y,
                                 gc_stream stream) {
    GC_REQUIRE(count >= 0, "count must be >= 0, got %lld", (long long)count);
    GC_REQUIRE((x != nullptr && y != nullptr) || count == 0,
               "x and y must not be NULL (got x = %p, y = %p) for count %lld", (const void *)x,
               (void *)y, (long long)count);
    if (count == 0) return GC_SUCCESS;
    GC_LAUNCH(axpy_kernel, grid_1d(count), dim3(kThreads, 1, 1), 0, stream)(count, alpha, x, y);
    GC_CHECK_LAUNCH("gc_axpy_f32");
    return GC_SUCCESS;
}

extern "C" gc_status gc_copy_strided(int32_t ndim, const int64_t *shape, const void *src,
                                     const int64_t *src_strides, void *dst,
                                     int32_t element_bytes, gc_stream stream) {
    GC_REQUIRE(ndim >= 0 && ndim <= kMaxDims, "ndim must be in [0, %d], got %d", kMaxDims,
               (int)ndim);
    GC_REQUIRE(ndim == 0 || (shape != nullptr && src_strides != nullptr),
               "shape and src_strides must not be NULL for ndim = %d", (int)ndim);
    GC_REQUIRE(element_bytes == 1 || element_bytes == 2 || element_bytes == 4 ||
                   element_bytes == 8,
               "element_bytes must be 1, 2, 4 or 8, got %d", (int)element_bytes);
    StridedView view;
    view.ndim = ndim;
    int64_t count = 1;
    for (int d = 0; d < ndim; ++d) {
        GC_REQUIRE(shape[d] >= 0, "shape[%d] must be >= 0, got %lld", d, (long long)shape[d]);
        view.shape[d] = shape[d];
        view.strides[d] = src_strides[d];
        count *= shape[d];
    }
    if (count == 0) return GC_SUCCESS;
    GC_REQUIRE(src != nullptr && dst != nullptr,
               "src and dst must not be NULL (got src = %p, dst = %p) for %lld elements", src,
               dst, (long long)count);
    switch (element_bytes) {
    case 1: return launch_copy<uint8_t>(view, src, dst, count, stream);
    case 2: return launch_copy<uint16_t>(view, src, dst, count, stream);
    case 4: return launch_copy<uint32_t>(view, src, dst, count, stream);
    default: return launch_copy<uint64_t>(view, src, dst, count, stream);
    }
}
