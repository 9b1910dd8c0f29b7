/* vendor_dnn.cu: cuDNN, loaded at run time, behind gc_conv2d_fwd_f32, gc_conv2d_bwd_data_f32
 * and gc_conv2d_bwd_filter_f32 (CUDA build only; see vendor_dnn.h for the contract).
 *
 * graphc's layouts are cuDNN's NCHW tensors and KCRS filters, so a gc_conv2d_desc maps onto
 * one tensor descriptor per activation, one filter descriptor and one convolution descriptor
 * (cross-correlation, as PyTorch's conv2d; groups through cudnnSetConvolutionGroupCount).
 * Descriptors are made per call (host work only) and destroyed after it; the algorithm is
 * chosen once per (descriptor, pass) and remembered.
 */
#include "vendor_dnn.h"
#include "vendor_load.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <array>
#include <atomic>
#include <map>
#include <mutex>

namespace gc_vendor {
namespace {

/* cuDNN's C ABI (cudnn_ops.h, cudnn_cnn.h), declared here so no cuDNN header is needed */
typedef struct CudnnContext *CudnnHandle;
typedef void *CudnnDesc;      /* tensor, filter and convolution descriptors */
typedef int CudnnStatus;      /* CUDNN_STATUS_SUCCESS = 0 */
constexpr int kNCHW = 0;      /* CUDNN_TENSOR_NCHW */
constexpr int kFloat = 0;     /* CUDNN_DATA_FLOAT */
constexpr int kCrossCorrelation = 1; /* CUDNN_CROSS_CORRELATION */
constexpr int kFmaMath = 3;   /* CUDNN_FMA_MATH: float32 arithmetic, no TF32 */
constexpr int kDeterministic = 1; /* CUDNN_DETERMINISTIC */
constexpr int kAlgoCount = 16;    /* more than any of the three passes has */
constexpr size_t kMaxWorkspace = 256u << 20;

struct AlgoPerf { /* cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t: one layout */
    int algo;
    CudnnStatus status;
    float time;
    size_t memory;
    int determinism;
    int math_type;
    int reserved[3];
};

using CreateFn = CudnnStatus (*)(CudnnHandle *);
using SetStreamFn = CudnnStatus (*)(CudnnHandle, cudaStream_t);
using ErrorStringFn = const char *(*)(CudnnStatus);
using VersionFn = size_t (*)();
using CreateDescFn = CudnnStatus (*)(CudnnDesc *);
using DestroyDescFn = CudnnStatus (*)(CudnnDesc);
using SetTensorFn = CudnnStatus (*)(CudnnDesc, int, int, int, int, int, int);
using SetFilterFn = CudnnStatus (*)(CudnnDesc, int, int, int, int, int, int);
using SetConvFn = CudnnStatus (*)(CudnnDesc, int, int, int, int, int, int, int, int);
using SetConvIntFn = CudnnStatus (*)(CudnnDesc, int);
using AlgoFn = CudnnStatus (*)(CudnnHandle, CudnnDesc, CudnnDesc, CudnnDesc, CudnnDesc, int,
                               int *, AlgoPerf *);
using WorkspaceFn = CudnnStatus (*)(CudnnHandle, CudnnDesc, CudnnDesc, CudnnDesc, CudnnDesc,
                                    int, size_t *);
using ConvFn = CudnnStatus (*)(CudnnHandle, const void *, CudnnDesc, const void *, CudnnDesc,
                               const void *, CudnnDesc, int, void *, size_t, const void *,
                               CudnnDesc, void *);
using AddTensorFn = CudnnStatus (*)(CudnnHandle, const void *, CudnnDesc, const void *,
                                    const void *, CudnnDesc, void *);

struct Cudnn {
    bool loaded = false;
    char status[512] = "";
    CreateFn create = nullptr;
    SetStreamFn set_stream = nullptr;
    ErrorStringFn error_string = nullptr;
    VersionFn version = nullptr;
    CreateDescFn create_tensor = nullptr, create_filter = nullptr, create_conv = nullptr;
    DestroyDescFn destroy_tensor = nullptr, destroy_filter = nullptr, destroy_conv = nullptr;
    SetTensorFn set_tensor = nullptr;
    SetFilterFn set_filter = nullptr;
    SetConvFn set_conv = nullptr;
    SetConvIntFn set_groups = nullptr, set_math = nullptr;
    AlgoFn find[3] = {};           /* indexed by ConvPass: cudnnFind*Algorithm (timed) */
    WorkspaceFn workspace[3] = {}; /* indexed by ConvPass */
    ConvFn run[3] = {};            /* indexed by ConvPass */
    AddTensorFn add_tensor = nullptr;
};

Cudnn dnn;
std::once_flag dnn_once;
std::atomic<uint64_t> context_generation{1}; /* bumped by dnn_reset() */

void load() {
    static const char *const names[] = {"libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"};
    const char *name = nullptr;
    void *library = open_first(names, 3, "cuDNN", "every convolution", dnn.status,
                               sizeof dnn.status, &name);
    if (!library) return;
    bool missing = false;
    dnn.create = (CreateFn)symbol(library, "cudnnCreate", &missing);
    dnn.set_stream = (SetStreamFn)symbol(library, "cudnnSetStream", &missing);
    dnn.error_string = (ErrorStringFn)symbol(library, "cudnnGetErrorString", &missing);
    dnn.version = (VersionFn)symbol(library, "cudnnGetVersion", &missing);
    dnn.create_tensor = (CreateDescFn)symbol(library, "cudnnCreateTensorDescriptor", &missing);
    dnn.create_filter = (CreateDescFn)symbol(library, "cudnnCreateFilterDescriptor", &missing);
    dnn.create_conv = (CreateDescFn)symbol(library, "cudnnCreateConvolutionDescriptor",
                                           &missing);
    dnn.destroy_tensor = (DestroyDescFn)symbol(library, "cudnnDestroyTensorDescriptor",
                                               &missing);
    dnn.destroy_filter = (DestroyDescFn)symbol(library, "cudnnDestroyFilterDescriptor",
                                               &missing);
    dnn.destroy_conv = (DestroyDescFn)symbol(library, "cudnnDestroyConvolutionDescriptor",
                                             &missing);
    dnn.set_tensor = (SetTensorFn)symbol(library, "cudnnSetTensor4dDescriptor", &missing);
    dnn.set_filter = (SetFilterFn)symbol(library, "cudnnSetFilter4dDescriptor", &missing);
    dnn.set_conv = (SetConvFn)symbol(library, "cudnnSetConvolution2dDescriptor", &missing);
    dnn.set_groups = (SetConvIntFn)symbol(library, "cudnnSetConvolutionGroupCount", &missing);
    dnn.set_math = (SetConvIntFn)symbol(library, "cudnnSetConvolutionMathType", &missing);
    static const char *const algo_names[3] = {"cudnnFindConvolutionForwardAlgorithm",
                                              "cudnnFindConvolutionBackwardDataAlgorithm",
                                              "cudnnFindConvolutionBackwardFilterAlgorithm"};
    static const char *const workspace_names[3] = {
        "cudnnGetConvolutionForwardWorkspaceSize", "cudnnGetConvolutionBackwardDataWorkspaceSize",
        "cudnnGetConvolutionBackwardFilterWorkspaceSize"};
    static const char *const run_names[3] = {"cudnnConvolutionForward",
                                             "cudnnConvolutionBackwardData",
                                             "cudnnConvolutionBackwardFilter"};
    for (int p = 0; p < 3; ++p) {
        dnn.find[p] = (AlgoFn)symbol(library, algo_names[p], &missing);
        dnn.workspace[p] = (WorkspaceFn)symbol(library, workspace_names[p], &missing);
        dnn.run[p] = (ConvFn)symbol(library, run_names[p], &missing);
    }
    dnn.add_tensor = (AddTensorFn)symbol(library, "cudnnAddTensor", &missing);
    if (missing) {
        snprintf(dnn.status, sizeof dnn.status, "cuDNN not used: %s lacks an entry point "
                 "graphc calls (the convolution API of cuDNN 8 or 9)", name);
        return;
    }
    dnn.loaded = true;
    snprintf(dnn.status, sizeof dnn.status, "cuDNN %zu from %s", dnn.version(), name);
}

bool loaded() {
    std::call_once(dnn_once, load);
    return dnn.loaded;
}

/* set while graphc's own kernels are timed: conv_takes says no, conv_workspace 0 */
thread_local bool own_only = false;

struct ThreadHandle {
    CudnnHandle handle = nullptr;
    uint64_t generation = 0;
};
thread_local ThreadHandle thread_handle;

gc_status dnn_failure(const char *what, CudnnStatus status) {
    return gc_fail(GC_ERROR_CUDA, "%s: cuDNN failed with status %d (%s); GRAPHC_CUDA_LIBS=0 "
                   "runs graphc's own kernels instead", what, status, dnn.error_string(status));
}

#define DNN_TRY(what, call)                                   \
    do {                                                      \
        const CudnnStatus dnn_status_ = (call);               \
        if (dnn_status_ != 0) return dnn_failure(what, dnn_status_); \
    } while (0)

gc_status handle_for(gc_stream stream, CudnnHandle *out) {
    ThreadHandle &t = thread_handle;
    const uint64_t generation = context_generation.load();
    if (!t.handle || t.generation != generation) {
        CudnnHandle handle = nullptr;
        DNN_TRY("cudnnCreate", dnn.create(&handle));
        t.handle = handle;
        t.generation = generation;
    }
    DNN_TRY("cudnnSetStream", dnn.set_stream(t.handle, static_cast<cudaStream_t>(stream)));
    *out = t.handle;
    return GC_SUCCESS;
}

/* the descriptors of one convolution: x (n, c_in, h, w), w (c_out, c_in/groups, kh, kw),
 * y (n, c_out, out_h, out_w); destroyed with the object */
struct Descriptors {
    CudnnDesc x = nullptr, w = nullptr, y = nullptr, conv = nullptr;
    ~Descriptors() {
        if (x) dnn.destroy_tensor(x);
        if (y) dnn.destroy_tensor(y);
        if (w) dnn.destroy_filter(w);
        if (conv) dnn.destroy_conv(conv);
    }
    gc_status make(const gc_conv2d_desc &d) {
        DNN_TRY("cudnnCreateTensorDescriptor", dnn.create_tensor(&x));
        DNN_TRY("cudnnCreateTensorDescriptor", dnn.create_tensor(&y));
        DNN_TRY("cudnnCreateFilterDescriptor", dnn.create_filter(&w));
        DNN_TRY("cudnnCreateConvolutionDescriptor", dnn.create_conv(&conv));
        DNN_TRY("cudnnSetTensor4dDescriptor", dnn.set_tensor(x, kNCHW, kFloat, (int)d.n,
                                                             (int)d.c_in, (int)d.h, (int)d.w));
        DNN_TRY("cudnnSetTensor4dDescriptor",
                dnn.set_tensor(y, kNCHW, kFloat, (int)d.n, (int)d.c_out, (int)d.out_h,
                               (int)d.out_w));
        DNN_TRY("cudnnSetFilter4dDescriptor",
                dnn.set_filter(w, kFloat, kNCHW, (int)d.c_out, (int)(d.c_in / d.groups),
                               (int)d.kh, (int)d.kw));
        DNN_TRY("cudnnSetConvolution2dDescriptor",
                dnn.set_conv(conv, (int)d.pad_h, (int)d.pad_w, (int)d.stride_h, (int)d.stride_w,
                             (int)d.dilation_h, (int)d.dilation_w, kCrossCorrelation, kFloat));
        DNN_TRY("cudnnSetConvolutionGroupCount", dnn.set_groups(conv, (int)d.groups));
        DNN_TRY("cudnnSetConvolutionMathType", dnn.set_math(conv, kFmaMath));
        return GC_SUCCESS;
    }
    /* the descriptor arguments of pass p's algorithm query, workspace query and call, in
     * cuDNN's order: forward (x, w, conv, y), data (w, dy, conv, dx), filter (x, dy, conv, dw) */
    void order(ConvPass p, CudnnDesc out[4]) const {
        if (p == ConvPass::forward) { out[0] = x; out[1] = w; out[2] = conv; out[3] = y; }
        else if (p == ConvPass::backward_data) { out[0] = w; out[1] = y; out[2] = conv; out[3] = x; }
        else { out[0] = x; out[1] = y; out[2] = conv; out[3] = w; }
    }
};

struct Choice {
    bool usable = false;
    int algo = 0;
    size_t workspace = 0;
    char text[640] = "";
};

using Key = std::array<int64_t, 17>;
std::mutex choices_lock;
std::map<Key, Choice> choices;

Key key_of(const gc_conv2d_desc &d, ConvPass p) {
    return {d.n, d.c_in, d.h, d.w, d.c_out, d.kh, d.kw, d.stride_h, d.stride_w, d.pad_h,
            d.pad_w, d.dilation_h, d.dilation_w, d.groups, d.out_h, d.out_w, (int64_t)p};
}

bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* Whether pass p's algorithm only orders the products' sums differently from a direct
 * convolution (implicit GEMM, GEMM, direct): FFT and Winograd algorithms transform the
 * operands, and their float32 error measured 4x a direct one's on an H200 (1.7e-6 against
 * 4.3e-7 from a float64 reference, 64->64 3x3), past graphc's rule of at most twice eager's
 * error (docs/performance.md). Values are cuDNN's cudnnConvolution*Algo_t. */
bool sums_only(ConvPass p, int algo) {
    switch (p) {
    case ConvPass::forward: return algo >= 0 && algo <= 3;      /* IMPLICIT*, GEMM, DIRECT */
    case ConvPass::backward_data: return algo == 0 || algo == 1; /* ALGO_0, ALGO_1 */
    default: return algo == 0 || algo == 1 || algo == 3;         /* ALGO_0, ALGO_1, ALGO_3 */
    }
}

const char *const kPassNames[3] = {"forward", "backward data", "backward filter"};

/* Milliseconds graphc's own kernels take for pass p of d (the fastest of three runs after a
 * warm-up, on zeroed scratch buffers, through the public entry with cuDNN held off); a
 * negative value when the scratch cannot be had. */
float own_kernel_ms(const gc_conv2d_desc &d, ConvPass p) {
    own_only = true;
    const int64_t x_n = d.n * d.c_in * d.h * d.w, y_n = d.n * d.c_out * d.out_h * d.out_w;
    const int64_t w_n = d.c_out * (d.c_in / d.groups) * d.kh * d.kw;
    const gc_conv2d_pass pass = p == ConvPass::forward ? GC_CONV2D_FWD_IMPLICIT
                                : p == ConvPass::backward_data ? GC_CONV2D_BWD_DATA
                                                               : GC_CONV2D_BWD_FILTER;
    int64_t ws_bytes = 0;
    float *x = nullptr, *w = nullptr, *y = nullptr;
    void *ws = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    float best = -1.0f;
    const bool ready =
        gc_conv2d_workspace_size(&d, pass, &ws_bytes) == GC_SUCCESS &&
        cudaMalloc(&x, x_n * 4) == cudaSuccess && cudaMalloc(&w, w_n * 4) == cudaSuccess &&
        cudaMalloc(&y, y_n * 4) == cudaSuccess &&
        (ws_bytes == 0 || cudaMalloc(&ws, ws_bytes) == cudaSuccess) &&
        cudaMemset(x, 0, x_n * 4) == cudaSuccess && cudaMemset(w, 0, w_n * 4) == cudaSuccess &&
        cudaMemset(y, 0, y_n * 4) == cudaSuccess &&
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess &&
        cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess;
    for (int round = 0; ready && round < 4; ++round) {
        cudaEventRecord(start, stream);
        const gc_status s = p == ConvPass::forward
            ? gc_conv2d_fwd_f32(&d, pass, x, w, nullptr, y, ws, ws_bytes, stream)
            : p == ConvPass::backward_data
            ? gc_conv2d_bwd_data_f32(&d, y, w, x, ws, ws_bytes, stream)
            : gc_conv2d_bwd_filter_f32(&d, x, y, w, ws, ws_bytes, stream);
        cudaEventRecord(stop, stream);
        float ms = 0.0f;
        if (s != GC_SUCCESS || cudaEventSynchronize(stop) != cudaSuccess ||
            cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
            best = -1.0f;
            break;
        }
        if (round > 0 && (best < 0 || ms < best)) best = ms; /* round 0: the warm-up */
    }
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
    cudaFree(x);
    cudaFree(w);
    cudaFree(y);
    cudaFree(ws);
    cudaGetLastError(); /* a failed allocation leaves no error behind */
    own_only = false;
    return best;
}

/* Pass p's provider for d, chosen on first use (a workspace query: never inside a capture):
 * cuDNN's fastest deterministic algorithm within kMaxWorkspace (cudnnFind*Algorithm times
 * them all), taken only when it beats graphc's own kernels timed the same way. */
Choice choose(const gc_conv2d_desc &d, ConvPass p) {
    const Key key = key_of(d, p);
    {
        std::lock_guard<std::mutex> guard(choices_lock);
        auto found = choices.find(key);
        if (found != choices.end()) return found->second;
    }
    Choice c;
    const int64_t sizes[] = {d.n, d.c_in, d.h, d.w, d.c_out, d.out_h, d.out_w, d.groups,
                             d.n * d.c_in * d.h * d.w, d.n * d.c_out * d.out_h * d.out_w};
    bool small = true;
    for (int64_t s : sizes) small = small && fits_int(s);
    CudnnHandle handle;
    Descriptors desc;
    CudnnDesc args[4];
    AlgoPerf perf[kAlgoCount];
    int count = 0;
    const int pi = (int)p;
    if (!small) {
        snprintf(c.text, sizeof c.text, "graphc's kernels (a size exceeds cuDNN's 32-bit ints)");
    } else if (handle_for(nullptr, &handle) != GC_SUCCESS || desc.make(d) != GC_SUCCESS) {
        snprintf(c.text, sizeof c.text, "graphc's kernels (cuDNN refused the descriptors: %s)",
                 gc_last_error());
    } else {
        desc.order(p, args);
        const CudnnStatus s = dnn.find[pi](handle, args[0], args[1], args[2], args[3],
                                           kAlgoCount, &count, perf);
        cudaGetLastError();
        const AlgoPerf *pick = nullptr;
        for (int i = 0; s == 0 && i < count && !pick; ++i)
            if (perf[i].status == 0 && perf[i].determinism == kDeterministic &&
                perf[i].memory <= kMaxWorkspace && sums_only(p, perf[i].algo))
                pick = &perf[i];
        const float own_ms = own_kernel_ms(d, p);
        if (!pick) {
            snprintf(c.text, sizeof c.text, "graphc's kernels (%.3f ms; no deterministic, "
                     "non-FFT, non-Winograd cuDNN %s algorithm within %zu MiB)", own_ms,
                     kPassNames[pi], kMaxWorkspace >> 20);
        } else if (own_ms >= 0 && own_ms <= pick->time) {
            snprintf(c.text, sizeof c.text, "graphc's kernels (%.3f ms; cuDNN's fastest "
                     "deterministic %s algorithm, %d, %.3f ms)", own_ms, kPassNames[pi],
                     pick->algo, pick->time);
        } else {
            c.usable = true;
            c.algo = pick->algo;
            c.workspace = pick->memory;
            snprintf(c.text, sizeof c.text, "%s, %s algorithm %d, %zu bytes of workspace "
                     "(%.3f ms; graphc's kernels %.3f ms)", dnn.status, kPassNames[pi],
                     c.algo, c.workspace, pick->time, own_ms);
        }
    }
    std::lock_guard<std::mutex> guard(choices_lock);
    return choices.emplace(key, c).first->second;
}

/* the remembered choice; none (graphc's kernels) before a workspace query made one */
Choice chosen(const gc_conv2d_desc &d, ConvPass p) {
    std::lock_guard<std::mutex> guard(choices_lock);
    auto found = choices.find(key_of(d, p));
    return found == choices.end() ? Choice() : found->second;
}

gc_status run(const gc_conv2d_desc &d, ConvPass p, const void *a, const void *b, void *out,
              void *workspace, int64_t workspace_bytes, gc_stream stream) {
    const Choice c = chosen(d, p);
    if (!c.usable || (int64_t)c.workspace > workspace_bytes)
        return gc_fail(GC_ERROR_NOT_SUPPORTED, "cuDNN does not take this convolution: %s",
                       c.text);
    CudnnHandle handle;
    GC_TRY(handle_for(stream, &handle));
    Descriptors desc;
    GC_TRY(desc.make(d));
    CudnnDesc args[4];
    desc.order(p, args);
    const float one = 1.0f, zero = 0.0f;
    DNN_TRY(kPassNames[(int)p], dnn.run[(int)p](handle, &one, args[0], a, args[1], b, args[2],
                                                c.algo, workspace, c.workspace, &zero, args[3],
                                                out));
    return GC_SUCCESS;
}

} /* namespace */

bool conv_takes(const gc_conv2d_desc &d, ConvPass pass, int64_t workspace_bytes) {
    if (own_only || !loaded()) return false;
    const Choice c = chosen(d, pass); /* never chosen here: a call may be inside a capture */
    return c.usable && (int64_t)c.workspace <= workspace_bytes;
}

int64_t conv_workspace(const gc_conv2d_desc &d, ConvPass pass) {
    if (own_only || !loaded()) return 0;
    const Choice c = choose(d, pass);
    return c.usable ? (int64_t)c.workspace : 0;
}

gc_status conv_forward(const gc_conv2d_desc &d, const float *x, const float *w,
                       const float *bias, float *y, void *workspace, int64_t workspace_bytes,
                       gc_stream stream) {
    GC_TRY(run(d, ConvPass::forward, x, w, y, workspace, workspace_bytes, stream));
    if (!bias) return GC_SUCCESS;
    CudnnHandle handle;
    GC_TRY(handle_for(stream, &handle));
    Descriptors desc;
    GC_TRY(desc.make(d));
    CudnnDesc b = nullptr;
    DNN_TRY("cudnnCreateTensorDescriptor", dnn.create_tensor(&b));
    const CudnnStatus set = dnn.set_tensor(b, kNCHW, kFloat, 1, (int)d.c_out, 1, 1);
    const float one = 1.0f;
    const CudnnStatus added = set != 0 ? set : dnn.add_tensor(handle, &one, b, bias, &one,
                                                             desc.y, y);
    dnn.destroy_tensor(b);
    if (added != 0) return dnn_failure("cudnnAddTensor (the bias)", added);
    return GC_SUCCESS;
}

gc_status conv_backward_data(const gc_conv2d_desc &d, const float *dy, const float *w,
                             float *dx, void *workspace, int64_t workspace_bytes,
                             gc_stream stream) {
    return run(d, ConvPass::backward_data, w, dy, dx, workspace, workspace_bytes, stream);
}

gc_status conv_backward_filter(const gc_conv2d_desc &d, const float *x, const float *dy,
                               float *dw, void *workspace, int64_t workspace_bytes,
                               gc_stream stream) {
    return run(d, ConvPass::backward_filter, x, dy, dw, workspace, workspace_bytes, stream);
}

const char *conv_provider(const gc_conv2d_desc &d, ConvPass pass) {
    static thread_local char text[700];
    if (!loaded())
        snprintf(text, sizeof text, "graphc's kernels (%s)", dnn.status);
    else
        snprintf(text, sizeof text, "%s", choose(d, pass).text);
    return text;
}

void dnn_reset() { context_generation.fetch_add(1); }

} /* namespace gc_vendor */
