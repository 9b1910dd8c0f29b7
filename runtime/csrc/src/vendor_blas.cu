/* vendor_blas.cu: cuBLAS, loaded at run time, behind gc_gemm_f32, gc_gemm_strided_batched_f32
 * and gc_gemm_tf32_f32 (CUDA build only; see vendor_blas.h for the contract).
 *
 * Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS is called with the
 * operands swapped (B first), n and m exchanged, and the same transpose flags and leading
 * dimensions. Written without a GPU: it compiles with nvcc, and the emulation (which never
 * loads cuBLAS) cannot run it; docs/backends.md says so.
 */
#include "vendor_blas.h"
#include "vendor_load.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <mutex>

namespace gc_vendor {
namespace {

/* cuBLAS's C ABI (cublas_api.h), declared here so no cuBLAS header is needed */
typedef struct CublasContext *CublasHandle;
typedef int CublasStatus; /* CUBLAS_STATUS_SUCCESS = 0 */
constexpr int kOpN = 0, kOpT = 1;             /* cublasOperation_t */
constexpr int kDataR32F = 0;                  /* cudaDataType CUDA_R_32F */
constexpr int kComputeFastTF32 = 77;          /* CUBLAS_COMPUTE_32F_FAST_TF32 */
constexpr int kGemmDefault = -1;              /* CUBLAS_GEMM_DEFAULT */
constexpr size_t kWorkspaceBytes = 32u << 20; /* cuBLAS's own default on Hopper */

using CreateFn = CublasStatus (*)(CublasHandle *);
using SetStreamFn = CublasStatus (*)(CublasHandle, cudaStream_t);
using SetWorkspaceFn = CublasStatus (*)(CublasHandle, void *, size_t);
using SgemmFn = CublasStatus (*)(CublasHandle, int, int, int, int, int, const float *,
                                 const float *, int, const float *, int, const float *, float *,
                                 int);
using SgemmStridedFn = CublasStatus (*)(CublasHandle, int, int, int, int, int, const float *,
                                        const float *, int, long long, const float *, int,
                                        long long, const float *, float *, int, long long, int);
using GemmExFn = CublasStatus (*)(CublasHandle, int, int, int, int, int, const void *,
                                  const void *, int, int, const void *, int, int, const void *,
                                  void *, int, int, int, int);
using StatusStringFn = const char *(*)(CublasStatus);

struct Cublas {
    bool loaded = false;
    char status[512] = "";
    CreateFn create = nullptr;
    SetStreamFn set_stream = nullptr;
    SetWorkspaceFn set_workspace = nullptr;
    SgemmFn sgemm = nullptr;
    SgemmStridedFn sgemm_strided = nullptr;
    GemmExFn gemm_ex = nullptr;
    StatusStringFn status_string = nullptr; /* absent before cuBLAS 11.4: optional */
};

Cublas cublas;
std::once_flag cublas_once;
std::atomic<uint64_t> context_generation{1}; /* bumped by reset() */

void load() {
    static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    const char *name = nullptr;
    void *library = open_first(names, 3, "cuBLAS", "every GEMM", cublas.status,
                               sizeof cublas.status, &name);
    if (!library) return;
    bool missing = false;
    cublas.create = (CreateFn)symbol(library, "cublasCreate_v2", &missing);
    cublas.set_stream = (SetStreamFn)symbol(library, "cublasSetStream_v2", &missing);
    cublas.set_workspace = (SetWorkspaceFn)symbol(library, "cublasSetWorkspace_v2", &missing);
    cublas.sgemm = (SgemmFn)symbol(library, "cublasSgemm_v2", &missing);
    cublas.sgemm_strided = (SgemmStridedFn)symbol(library, "cublasSgemmStridedBatched", &missing);
    cublas.gemm_ex = (GemmExFn)symbol(library, "cublasGemmEx", &missing);
    cublas.status_string = (StatusStringFn)dlsym(library, "cublasGetStatusString");
    if (missing) {
        snprintf(cublas.status, sizeof cublas.status,
                 "cuBLAS not used: %s lacks an entry point graphc calls (cublasSetWorkspace_v2 "
                 "needs cuBLAS 11.2 or newer)", name);
        return;
    }
    cublas.loaded = true;
    snprintf(cublas.status, sizeof cublas.status, "cuBLAS from %s", name);
}

bool loaded() {
    std::call_once(cublas_once, load);
    return cublas.loaded;
}

/* this thread's handle in the current context, with its own workspace (so a CUDA-graph
 * capture allocates nothing); recreated after gc_device_reset (the old one died with its
 * context and is not destroyed) */
struct ThreadHandle {
    CublasHandle handle = nullptr;
    uint64_t generation = 0;
};
thread_local ThreadHandle thread_handle;

gc_status cublas_failure(const char *what, CublasStatus status) {
    return gc_fail(GC_ERROR_CUDA, "%s: cuBLAS failed with status %d (%s); GRAPHC_CUDA_LIBS=0 "
                   "runs graphc's own kernels instead", what, status,
                   cublas.status_string ? cublas.status_string(status) : "no status text");
}

gc_status handle_for(gc_stream stream, CublasHandle *out) {
    ThreadHandle &t = thread_handle;
    const uint64_t generation = context_generation.load();
    if (!t.handle || t.generation != generation) {
        CublasHandle handle = nullptr;
        CublasStatus s = cublas.create(&handle);
        if (s != 0) return cublas_failure("cublasCreate", s);
        void *workspace = nullptr;
        if (cudaMalloc(&workspace, kWorkspaceBytes) == cudaSuccess) {
            s = cublas.set_workspace(handle, workspace, kWorkspaceBytes);
            if (s != 0) return cublas_failure("cublasSetWorkspace", s);
        } else {
            cudaGetLastError(); /* cuBLAS then uses its own pool (not capture-safe) */
        }
        t.handle = handle;
        t.generation = generation;
    }
    const CublasStatus set = cublas.set_stream(t.handle, static_cast<cudaStream_t>(stream));
    if (set != 0) return cublas_failure("cublasSetStream", set);
    *out = t.handle;
    return GC_SUCCESS;
}

bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

} /* namespace */

bool gemm_takes(bool tf32, int64_t m, int64_t n, int64_t k, int64_t batch) {
    (void)tf32;
    return k > 0 && fits_int(m) && fits_int(n) && fits_int(k) && fits_int(batch) && loaded();
}

gc_status gemm(const GemmArgs &g, gc_stream stream) {
    if (!fits_int(g.lda) || !fits_int(g.ldb) || !fits_int(g.ldc))
        return gc_fail(GC_ERROR_NOT_SUPPORTED, "cuBLAS GEMM: a leading dimension exceeds 2^31");
    CublasHandle handle;
    GC_TRY(handle_for(stream, &handle));
    const int op_a = g.trans_a ? kOpT : kOpN, op_b = g.trans_b ? kOpT : kOpN;
    const int m = (int)g.m, n = (int)g.n, k = (int)g.k;
    CublasStatus s;
    const char *what;
    if (g.tf32) {
        what = "cublasGemmEx (TF32)";
        s = cublas.gemm_ex(handle, op_b, op_a, n, m, k, &g.alpha, g.b, kDataR32F, (int)g.ldb,
                           g.a, kDataR32F, (int)g.lda, &g.beta, g.c, kDataR32F, (int)g.ldc,
                           kComputeFastTF32, kGemmDefault);
    } else if (g.batch == 1) {
        what = "cublasSgemm";
        s = cublas.sgemm(handle, op_b, op_a, n, m, k, &g.alpha, g.b, (int)g.ldb, g.a,
                         (int)g.lda, &g.beta, g.c, (int)g.ldc);
    } else {
        what = "cublasSgemmStridedBatched";
        s = cublas.sgemm_strided(handle, op_b, op_a, n, m, k, &g.alpha, g.b, (int)g.ldb,
                                 g.stride_b, g.a, (int)g.lda, g.stride_a, &g.beta, g.c,
                                 (int)g.ldc, g.stride_c, (int)g.batch);
    }
    if (s != 0) return cublas_failure(what, s);
    return GC_SUCCESS;
}

const char *blas_status() {
    loaded();
    return cublas.status;
}

void reset() { context_generation.fetch_add(1); }

} /* namespace gc_vendor */
