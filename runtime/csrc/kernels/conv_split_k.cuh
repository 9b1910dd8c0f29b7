/* conv_split_k.cuh: split-K for conv.cu's implicit GEMMs (the forward and the stride-1 input
 * gradient), included by conv.cu only.
 *
 * A convolution whose output tiles are few (the 512-channel 4x4 layers of a CIFAR ResNet: 16
 * tiles of 128 x 128 against 132 SMs; gemm_tile_count counts the tiles of the shape
 * launch_gemm_tiles picks) leaves most of the GPU idle, each block walking a long
 * K. Split-K cuts K into `splits` chunks: batch entry z = group * splits + s of the tile kernel
 * computes chunk s of group g into its own partial matrix (rows_g x columns) in the
 * workspace, then sum_k_splits_kernel adds the partials in split order, adds the bias and
 * writes NCHW: deterministic (no atomics), bit-identical on every run on one device.
 * Invariants: a chunk is a multiple of kTileK, so a split's k steps never cross into the next
 * one and a split past K reads zeros (the operands' own bounds); the split count is a function
 * of the shape and the device's SM count only, and gc_conv2d_workspace_size asks the same
 * function as the entries.
 */
#ifndef GC_CONV_SPLIT_K_CUH
#define GC_CONV_SPLIT_K_CUH

#ifndef GC_EMULATION
#include <atomic>
#endif

namespace {

constexpr int64_t kMinSplitK = 128; /* k per split at least: 16 steps of the tile kernel */
constexpr int64_t kMaxSplitsK = 32;
constexpr int kMaxDevicesCached = 64;
/* The emulation's stand-in (and the fallback when the query fails): an H100's and H200's SM
 * count, so the emulated tests take the same split paths as those GPUs. */
constexpr int32_t kDefaultMultiprocessors = 132;

/* The current device's SM count, asked once per device. */
inline int32_t multiprocessor_count() {
#ifdef GC_EMULATION
    return kDefaultMultiprocessors;
#else
    static std::atomic<int32_t> cached[kMaxDevicesCached]; /* 0: not asked yet */
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevicesCached)
        return kDefaultMultiprocessors;
    int32_t count = cached[device].load(std::memory_order_relaxed);
    if (count == 0) {
        int value = 0;
        if (cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, device) !=
                cudaSuccess || value <= 0)
            value = kDefaultMultiprocessors;
        count = value;
        cached[device].store(count, std::memory_order_relaxed);
    }
    return count;
#endif
}

struct KSplit {
    int64_t splits, chunk; /* chunk: k per split, a multiple of kTileK */
};

/* How many chunks of k a GEMM of `tiles` output tiles runs in: enough blocks for one wave
 * (the implicit views' 128-row tile kernels run one block an SM; the 64-row ones fit two,
 * so theirs fill half the slots: not retuned without a GPU measurement) when the tiles are
 * fewer than half the SMs, each chunk at least kMinSplitK long; 1 otherwise. */
inline KSplit k_split(int64_t tiles, int64_t k) {
    KSplit s{1, k};
    if (tiles <= 0 || k <= 0) return s;
    int64_t splits = multiprocessor_count() / tiles;
    if (splits > k / kMinSplitK) splits = k / kMinSplitK;
    if (splits > kMaxSplitsK) splits = kMaxSplitsK;
    if (splits < 2) return s;
    int64_t chunk = (k + splits - 1) / splits;
    chunk = (chunk + kTileK - 1) / kTileK * kTileK;
    s.splits = (k + chunk - 1) / chunk;
    s.chunk = chunk;
    return s;
}

/* 128 x 128 tiles of a (rows x columns) product times `groups`: the weight gradient's plan
 * (conv_filter_grad.cuh) counts these whatever its GEMM runs on (cuBLAS on a GPU), so its
 * splits, and with them its rounding, do not follow the tile kernel's choice of shape. */
inline int64_t tile_count(int64_t rows, int64_t columns, int64_t groups) {
    return ((rows + kTileM - 1) / kTileM) * ((columns + kTileN - 1) / kTileN) * groups;
}

/* the forward's implicit GEMM: (c_out/groups) x (n * P) per group, K = (c_in/groups) kh kw;
 * its tiles are those launch_gemm_tiles runs (64 rows when c_out/groups <= 64) */
inline KSplit forward_k_split(const gc_conv2d_desc &d) {
    return k_split(gemm_tile_count(d.c_out / d.groups, d.n * d.out_h * d.out_w, d.groups),
                   (d.c_in / d.groups) * d.kh * d.kw);
}

/* the stride-1 input gradient: (c_in/groups) x (n * H * W) per group, K' = (c_out/groups) kh kw */
inline KSplit dgrad_k_split(const gc_conv2d_desc &d) {
    return k_split(gemm_tile_count(d.c_in / d.groups, d.n * d.h * d.w, d.groups),
                   (d.c_out / d.groups) * d.kh * d.kw);
}

/* partial matrices of every (group, split): splits * (the whole output) floats */
inline int64_t split_k_workspace_bytes(const KSplit &s, int64_t output_elements) {
    return s.splits > 1 ? s.splits * output_elements * (int64_t)sizeof(float) : 0;
}

/* An operand of a group's GEMM seen through split-K: batch entry z is (group z / splits,
 * split z % splits), and the split's k starts at its chunk. */
template <class Operand>
struct SplitK {
    static constexpr bool K_CONTIGUOUS = Operand::K_CONTIGUOUS;
    static constexpr int MIN_BLOCKS = Operand::MIN_BLOCKS;
    using Cursor = typename Operand::Cursor;
    Operand op;
    int64_t splits, chunk;
    int64_t k0; /* the selected split's first k */

    __device__ void select(int64_t z) {
        op.select(z / splits);
        k0 = z % splits * chunk;
    }
    __device__ Cursor start(int64_t outer, int64_t inner) const {
        return K_CONTIGUOUS ? op.start(outer, inner + k0) : op.start(outer + k0, inner);
    }
    __device__ void advance(Cursor &c) const { op.advance(c); }
    __device__ void load4(const Cursor &c, float (&v)[4]) const { op.load4(c, v); }
};

/* out (NCHW: images x channels x plane) = the partials of its (group, row, column) added in
 * split order, plus bias[channel] when there is one. partial: matrix z = group * splits + s is
 * rows_g x columns, column = image * plane + pixel. */
__global__ void sum_k_splits_kernel(int64_t total, int64_t splits, int64_t rows_g,
                                    int64_t channels, int64_t plane, const float *partial,
                                    const float *bias, float *out) {
    const int64_t columns = total / channels; /* images * plane */
    for (int64_t i = global_thread_index(); i < total; i += global_thread_count()) {
        const int64_t pixel = i % plane, channel = (i / plane) % channels;
        const int64_t column = (i / (plane * channels)) * plane + pixel;
        const int64_t group = channel / rows_g, row = channel % rows_g;
        const float *at = partial + ((group * splits) * rows_g + row) * columns + column;
        float sum = 0.0f;
        for (int64_t s = 0; s < splits; ++s) sum += at[s * rows_g * columns];
        out[i] = bias ? sum + bias[channel] : sum;
    }
}

/* One split-K GEMM (rows_g x columns per group) into the partials, then their sum into out. */
template <class OpA, class OpB>
gc_status launch_split_k(const OpA &a, const OpB &b, const KSplit &split, int64_t groups,
                         int64_t rows_g, int64_t columns, int64_t plane, float *partial,
                         const float *bias, float *out, gc_stream stream, const char *fn) {
    const SplitK<OpA> split_a{a, split.splits, split.chunk, 0};
    const SplitK<OpB> split_b{b, split.splits, split.chunk, 0};
    const MatrixOutput to_partial = matrix_output(partial, columns, rows_g * columns, rows_g,
                                                  columns, 1.0f, 0.0f, nullptr, 0);
    GC_TRY(launch_gemm_tiles(split_a, split_b, to_partial, rows_g, columns, split.chunk,
                             groups * split.splits, stream, fn));
    const int64_t total = groups * rows_g * columns;
    GC_LAUNCH(sum_k_splits_kernel, grid_1d(total), dim3(kThreads, 1, 1), 0, stream)(
        total, split.splits, rows_g, groups * rows_g, plane, partial, bias, out);
    GC_CHECK_LAUNCH(fn);
    return GC_SUCCESS;
}

} /* namespace */

#endif /* GC_CONV_SPLIT_K_CUH */
