/* graphc_rt.h: the one public header of graphc's CUDA runtime library.
 *
 * A flat C ABI, the single source of truth for every binding (graphc/backends/cuda/rt.py is
 * checked against this file by a test). Conventions:
 *   - every name starts with gc_ / GC_; kernels carry their dtype as a suffix (_f32);
 *   - sizes, counts, strides and leading dimensions are int64_t, in elements unless the name
 *     says bytes;
 *   - matrices and tensors are row-major (C order), NCHW for images;
 *   - the stream is the last argument (NULL = the default stream);
 *   - every function returns a gc_status; on failure gc_last_error() describes it (the
 *     message is thread-local and stays until the next failing call on that thread);
 *   - nothing is allocated behind the caller's back: scratch space is a caller-provided
 *     workspace whose size is queried first;
 *   - every kernel launch is checked; invalid arguments are rejected before any launch.
 *
 * Two builds share these sources and this ABI: libgraphc_rt.so (nvcc, sm_80/sm_90 + PTX)
 * and libgraphc_rt_emu.so (g++ against runtime/csrc/emu/, CUDA threads as fibers on the
 * host; "device" memory is host memory). gc_runtime_kind() tells them apart.
 */
#ifndef GRAPHC_RT_H
#define GRAPHC_RT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GC_ABI_VERSION 2

typedef enum gc_status {
    GC_SUCCESS = 0,
    GC_ERROR_INVALID_ARGUMENT = 1, /* a null pointer, a negative size, inconsistent shapes */
    GC_ERROR_OUT_OF_MEMORY = 2,
    GC_ERROR_NO_DEVICE = 3,        /* no CUDA device or driver */
    GC_ERROR_LAUNCH = 4,           /* a kernel launch failed */
    GC_ERROR_CUDA = 5,             /* any other CUDA runtime/driver error */
    GC_ERROR_NOT_SUPPORTED = 6,    /* valid, but not implemented by this build */
    GC_ERROR_WORKSPACE = 7,        /* the workspace given is smaller than the size queried */
    GC_ERROR_EMULATION = 8,        /* emulation found a fault: a barrier reached by part of a
                                      block, a block too large, a stack overflow */
    GC_ERROR_MODULE = 9,           /* a module or function could not be loaded or found */
    GC_ERROR_DEVICE_LOST = 10      /* a sticky CUDA error (a kernel faulted: illegal address,
                                      trap, ...): the context is unusable, every later call
                                      fails until gc_device_reset() recreates it, and every
                                      device allocation, stream, event, graph and module of
                                      the process is lost with it */
} gc_status;

typedef void *gc_stream; /* cudaStream_t in the CUDA build */
typedef void *gc_event;  /* cudaEvent_t in the CUDA build */
typedef struct gc_module_s *gc_module;
typedef struct gc_function_s *gc_function;
typedef struct gc_graph_s *gc_graph; /* cudaGraphExec_t in the CUDA build */

/* ---- library ------------------------------------------------------------------------- */
int32_t gc_abi_version(void);                /* GC_ABI_VERSION of the build */
const char *gc_runtime_kind(void);           /* "cuda" or "emulation" */
const char *gc_status_string(gc_status status);
const char *gc_last_error(void);             /* "" when no call on this thread has failed */

/* ---- devices ------------------------------------------------------------------------- */
gc_status gc_device_count(int32_t *count);
gc_status gc_set_device(int32_t device);
/* name: NUL-terminated, truncated to capacity bytes; major/minor: compute capability */
gc_status gc_device_properties(int32_t device, char *name, int64_t capacity, int32_t *major,
                               int32_t *minor, int64_t *total_memory_bytes,
                               int32_t *multiprocessor_count);
gc_status gc_device_synchronize(void);
/* driver: the CUDA version the installed driver supports (cudaDriverGetVersion, 1000 * major
 * + 10 * minor; 0 without a driver); runtime: the version this library was built with (the
 * static CUDA runtime needs a driver at least that new). Emulation: both 0. */
gc_status gc_driver_version(int32_t *driver, int32_t *runtime);
/* After GC_ERROR_DEVICE_LOST: destroy the context (cudaDeviceReset) and create a fresh one on
 * the same device. Everything allocated before is gone (pointers must not be freed again).
 * Emulation: nothing is lost; returns GC_SUCCESS. */
gc_status gc_device_reset(void);

/* ---- memory -------------------------------------------------------------------------- */
gc_status gc_malloc(void **ptr, int64_t bytes); /* 256-byte aligned; bytes == 0 gives NULL */
gc_status gc_free(void *ptr);                   /* NULL is accepted */
gc_status gc_memcpy_h2d(void *dst, const void *src, int64_t bytes, gc_stream stream);
gc_status gc_memcpy_d2h(void *dst, const void *src, int64_t bytes, gc_stream stream);
gc_status gc_memcpy_d2d(void *dst, const void *src, int64_t bytes, gc_stream stream);
gc_status gc_memset(void *dst, int32_t byte_value, int64_t bytes, gc_stream stream);
/* page-locked host memory (cudaMallocHost; emulation: 4096-byte aligned host memory): copies
 * from and to it run asynchronously on their stream and at full bus speed */
gc_status gc_host_alloc(void **ptr, int64_t bytes); /* bytes == 0 gives NULL */
gc_status gc_host_free(void *ptr);                  /* NULL is accepted */
/* Bytes copied by gc_memcpy_h2d and gc_memcpy_d2h (all threads) since the last reset:
 * host-device traffic, as tests count it per call. */
gc_status gc_transfer_bytes(int64_t *h2d_bytes, int64_t *d2h_bytes);
gc_status gc_transfer_bytes_reset(void);

/* ---- streams and events -------------------------------------------------------------- */
gc_status gc_stream_create(gc_stream *stream);
gc_status gc_stream_destroy(gc_stream stream);
gc_status gc_stream_synchronize(gc_stream stream);
gc_status gc_event_create(gc_event *event);
gc_status gc_event_destroy(gc_event event);
gc_status gc_event_record(gc_event event, gc_stream stream);
gc_status gc_event_synchronize(gc_event event);
gc_status gc_event_elapsed_ms(float *ms, gc_event start, gc_event end);

/* ---- CUDA graphs ----------------------------------------------------------------------
 * gc_graph_begin_capture starts capturing the work issued to `stream` (a stream of
 * gc_stream_create, not NULL) by this thread: launches, library calls and memsets are recorded,
 * not run, until gc_graph_end_capture instantiates them as one replayable graph. A failed
 * capture ends it and returns an error (nothing ran). gc_graph_launch replays the graph on
 * `stream` with the same arguments (same addresses) as captured. Emulation: capture is
 * GC_ERROR_NOT_SUPPORTED (launches run as they are issued); callers run the work directly. */
gc_status gc_graph_begin_capture(gc_stream stream);
gc_status gc_graph_end_capture(gc_graph *graph, gc_stream stream);
gc_status gc_graph_launch(gc_graph graph, gc_stream stream);
gc_status gc_graph_destroy(gc_graph graph);

/* ---- generated kernels ----------------------------------------------------------------
 * CUDA build: `path` is a PTX or cubin file (cudaLibraryLoadFromFile); a function is a
 * __global__ kernel declared extern "C". Emulation build: `path` is a shared object compiled with g++
 * against runtime/csrc/emu/gc_emu.h and linked with libgraphc_rt_emu.so; the function `name`
 * is found as the symbol `name` + GC_EMU_ENTRY_SUFFIX, which GC_EMU_EXPORT(name) in the
 * emulation header defines next to the kernel.
 * gc_launch: `args` holds one pointer per kernel parameter, pointing at its value (as
 * cuLaunchKernel); grid and block are {x, y, z}. */
#define GC_EMU_ENTRY_SUFFIX "__gc_emu_entry"
gc_status gc_module_load(gc_module *module, const char *path);
gc_status gc_module_unload(gc_module module);
gc_status gc_module_function(gc_function *function, gc_module module, const char *name);
gc_status gc_launch(gc_function function, const int64_t grid[3], const int64_t block[3],
                    int64_t shared_bytes, void **args, gc_stream stream);

/* ---- GEMM -----------------------------------------------------------------------------
 * C[m, n] = alpha * op(A) @ op(B) + beta * C, row-major; op(X) = X^T when trans_x != 0.
 * A is (m, k) (or (k, m) transposed) with leading dimension lda, and so on. beta == 0
 * ignores C's old contents (NaN included). Any m, n, k >= 0; k == 0 scales C by beta. */
gc_status gc_gemm_f32(int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                      float beta, float *c, int64_t ldc, gc_stream stream);
/* batch GEMMs at fixed strides between consecutive matrices (a stride may be 0: broadcast) */
gc_status gc_gemm_strided_batched_f32(int32_t trans_a, int32_t trans_b, int64_t m, int64_t n,
                                      int64_t k, float alpha, const float *a, int64_t lda,
                                      int64_t stride_a, const float *b, int64_t ldb,
                                      int64_t stride_b, float beta, float *c, int64_t ldc,
                                      int64_t stride_c, int64_t batch, gc_stream stream);
/* tensor cores, inputs rounded to TF32 (emulation: the same rounding, SIMT arithmetic) */
gc_status gc_gemm_tf32_f32(int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                           float alpha, const float *a, int64_t lda, const float *b,
                           int64_t ldb, float beta, float *c, int64_t ldc, gc_stream stream);
/* What the GEMM entries above run for an m x n x k product (tf32 != 0: gc_gemm_tf32_f32's
 * choice; 0: gc_gemm_f32's and gc_gemm_strided_batched_f32's), in words, with why cuBLAS is or
 * is not used, e.g. "cuBLAS from libcublas.so.13" or "graphc SIMT tile kernel, 3-stage
 * cp.async pipeline (cuBLAS not used: the emulation runs graphc's kernels)". The CUDA build
 * dlopens libcublas at its first GEMM when the process can load it, unless GRAPHC_CUDA_LIBS=0.
 * The text is valid until this thread's next call. */
const char *gc_gemm_provider(int32_t tf32, int64_t m, int64_t n, int64_t k);

/* ---- convolution ----------------------------------------------------------------------
 * x: (n, c_in, h, w); weight: (c_out, c_in / groups, kh, kw); y: (n, c_out, out_h, out_w)
 * with out_h = (h + 2 pad_h - dilation_h (kh - 1) - 1) / stride_h + 1 (and so for w);
 * gc_conv2d_check fills out_h/out_w and validates the rest. */
typedef struct gc_conv2d_desc {
    int64_t n, c_in, h, w;
    int64_t c_out, kh, kw;
    int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups;
    int64_t out_h, out_w;
} gc_conv2d_desc;

typedef enum gc_conv2d_pass { /* graphc's kernels for each (kernels/conv.cu says more) */
    GC_CONV2D_FWD_IM2COL = 0,   /* im2col + GEMM per image, bias fused after the GEMM */
    GC_CONV2D_FWD_IMPLICIT = 1, /* implicit GEMM (split along k when small) */
    GC_CONV2D_BWD_DATA = 2,     /* implicit GEMM at stride 1, else one GEMM + col2im */
    GC_CONV2D_BWD_FILTER = 3    /* implicit GEMM over the batch (split when its tiles are few) */
} gc_conv2d_pass;

gc_status gc_conv2d_check(gc_conv2d_desc *desc);
/* In the CUDA build with cuDNN loaded, the first query of a (desc, pass) also chooses who runs
 * the pass by timing cuDNN and graphc's kernels on scratch buffers (it allocates, launches and
 * synchronises: never call it inside a stream capture); the size covers either. */
gc_status gc_conv2d_workspace_size(const gc_conv2d_desc *desc, gc_conv2d_pass pass,
                                   int64_t *bytes);
/* bias may be NULL; pass is GC_CONV2D_FWD_IM2COL or GC_CONV2D_FWD_IMPLICIT */
gc_status gc_conv2d_fwd_f32(const gc_conv2d_desc *desc, gc_conv2d_pass pass, const float *x,
                            const float *weight, const float *bias, float *y, void *workspace,
                            int64_t workspace_bytes, gc_stream stream);
gc_status gc_conv2d_bwd_data_f32(const gc_conv2d_desc *desc, const float *dy,
                                 const float *weight, float *dx, void *workspace,
                                 int64_t workspace_bytes, gc_stream stream);
/* dweight is overwritten (not accumulated into) */
gc_status gc_conv2d_bwd_filter_f32(const gc_conv2d_desc *desc, const float *x,
                                   const float *dy, float *dweight, void *workspace,
                                   int64_t workspace_bytes, gc_stream stream);
gc_status gc_conv2d_bwd_bias_f32(const gc_conv2d_desc *desc, const float *dy, float *dbias,
                                 gc_stream stream);
/* What runs a convolution pass, in words: "cuDNN 91002 from libcudnn.so.9, forward algorithm
 * 1, ..." or "graphc's kernels (why cuDNN does not)". The CUDA build dlopens cuDNN at its first
 * convolution when the process can load it, unless GRAPHC_CUDA_LIBS=0; the emulation never
 * does. The text is valid until this thread's next call. */
const char *gc_conv2d_provider(const gc_conv2d_desc *desc, gc_conv2d_pass pass);

/* ---- pooling --------------------------------------------------------------------------
 * planes = n * c images of h x w; the caller gives out_h/out_w (ceil_mode is the caller's).
 * Max pooling records, per output, the flat h*w position of the winner in its plane (the
 * first maximum; NaN wins), as graphc's max_pool2d op. Backward passes overwrite dx. */
typedef struct gc_pool2d_desc {
    int64_t planes, h, w, out_h, out_w;
    int64_t kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
    int32_t count_include_pad; /* average pooling only */
    int64_t divisor_override;  /* average pooling only; 0: none */
} gc_pool2d_desc;

gc_status gc_max_pool2d_fwd_f32(const gc_pool2d_desc *desc, const float *x, float *y,
                                int64_t *indices, gc_stream stream);
gc_status gc_max_pool2d_bwd_f32(const gc_pool2d_desc *desc, const float *dy,
                                const int64_t *indices, float *dx, gc_stream stream);
gc_status gc_avg_pool2d_fwd_f32(const gc_pool2d_desc *desc, const float *x, float *y,
                                gc_stream stream);
gc_status gc_avg_pool2d_bwd_f32(const gc_pool2d_desc *desc, const float *dy, float *dx,
                                gc_stream stream);

/* ---- softmax and losses ---------------------------------------------------------------
 * A tensor seen as (outer, dim, inner); softmax runs along `dim`. log != 0: log-softmax. */
gc_status gc_softmax_fwd_f32(int64_t outer, int64_t dim, int64_t inner, int32_t log,
                             const float *x, float *y, gc_stream stream);
/* y: the forward's output; dx = y * (dy - sum(dy * y)) or dy - exp(y) * sum(dy) for log */
gc_status gc_softmax_bwd_f32(int64_t outer, int64_t dim, int64_t inner, int32_t log,
                             const float *y, const float *dy, float *dx, gc_stream stream);

typedef enum gc_reduction { GC_REDUCTION_NONE = 0, GC_REDUCTION_MEAN = 1,
                            GC_REDUCTION_SUM = 2 } gc_reduction;
/* x: (n, classes, inner) log-probabilities; target: (n, inner) class indices; weight:
 * (classes,) or NULL (all ones). out: (n, inner) for GC_REDUCTION_NONE, else one value;
 * total_weight: one value (the sum of the picked weights). Targets equal to ignore_index
 * count nothing. *bad_target (device int64, may be NULL) receives 0 when every other target
 * is in [0, classes), else 1 + the flat position (in target) of the first one that is not;
 * a bad target's loss and weight count 0. weight, out and total_weight: NULL weight means
 * all ones; NULL total_weight is not written. */
gc_status gc_nll_loss_fwd_f32(int64_t n, int64_t classes, int64_t inner, const float *x,
                              const int64_t *target, const float *weight,
                              int64_t ignore_index, gc_reduction reduction, float *out,
                              float *total_weight, int64_t *bad_target, gc_stream stream);
/* dy: shaped like out; dx (n, classes, inner) is overwritten */
gc_status gc_nll_loss_bwd_f32(int64_t n, int64_t classes, int64_t inner, const float *dy,
                              const int64_t *target, const float *weight,
                              const float *total_weight, int64_t ignore_index,
                              gc_reduction reduction, float *dx, gc_stream stream);

/* ---- batch norm -----------------------------------------------------------------------
 * x: (n, c, hw). training != 0: batch statistics (biased variance), else running_mean and
 * running_var. save_mean/save_invstd (c,) receive the statistics used (invstd =
 * 1/sqrt(var + eps)). The running statistics are not updated here (the graph does it). */
gc_status gc_batch_norm_fwd_f32(int64_t n, int64_t c, int64_t hw, int32_t training, double eps,
                                const float *x, const float *weight, const float *bias,
                                const float *running_mean, const float *running_var, float *y,
                                float *save_mean, float *save_invstd, gc_stream stream);
/* training-mode backward; dweight/dbias may be NULL */
gc_status gc_batch_norm_bwd_f32(int64_t n, int64_t c, int64_t hw, const float *x,
                                const float *dy, const float *weight, const float *save_mean,
                                const float *save_invstd, float *dx, float *dweight,
                                float *dbias, gc_stream stream);

/* ---- reductions -----------------------------------------------------------------------
 * x seen as (outer, extent, inner), reduced along extent into y (outer, inner). */
typedef enum gc_reduce_op { GC_REDUCE_SUM = 0, GC_REDUCE_MEAN = 1, GC_REDUCE_MAX = 2,
                            GC_REDUCE_MIN = 3, GC_REDUCE_PROD = 4 } gc_reduce_op;
gc_status gc_reduce_f32(gc_reduce_op op, int64_t outer, int64_t extent, int64_t inner,
                        const float *x, float *y, gc_stream stream);
/* index of the first maximum (is_min == 0) or minimum along extent; NaN wins */
gc_status gc_arg_reduce_f32(int32_t is_min, int64_t outer, int64_t extent, int64_t inner,
                            const float *x, int64_t *y, gc_stream stream);

/* ---- elementwise and data movement -----------------------------------------------------
 * (Fused elementwise work is generated per graph; these are the fixed kernels.) */
gc_status gc_fill_f32(float *dst, float value, int64_t count, gc_stream stream);
/* y = alpha * x + y */
gc_status gc_axpy_f32(int64_t count, float alpha, const float *x, float *y, gc_stream stream);
/* dst (contiguous) = src viewed with `shape` and element `src_strides` (any sign, 0 ok);
 * element_bytes is 1, 2, 4 or 8; ndim <= 8 */
gc_status gc_copy_strided(int32_t ndim, const int64_t *shape, const void *src,
                          const int64_t *src_strides, void *dst, int32_t element_bytes,
                          gc_stream stream);
/* `count` device-to-device copies, dst[i] <- src[i] (bytes[i] each), in one launch per 32:
 * the host arrays are read during the call (the pointers travel as kernel parameters), the
 * copies run concurrently, so no copy may write what another of the call reads */
gc_status gc_memcpy_d2d_batch(void *const *dst, const void *const *src, const int64_t *bytes,
                              int64_t count, gc_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* GRAPHC_RT_H */
