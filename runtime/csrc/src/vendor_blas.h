/* vendor_blas.h: NVIDIA's cuBLAS behind graphc's GEMM entries, when it is present.
 *
 * The CUDA build (src/vendor_blas.cu) dlopens libcublas at the first GEMM (libcublas.so.13,
 * .12, .so: whichever the process can load, e.g. already loaded from the nvidia-cublas wheel)
 * unless GRAPHC_CUDA_LIBS=0, and runs the products it can take through it; graphc's own
 * kernels stay the fallback and the reference. Nothing is linked against cuBLAS and no cuBLAS
 * header is needed: the few entry points are declared here by their documented C ABI.
 * The emulation never loads it (the stubs below), so CI always runs graphc's kernels.
 *
 * Invariants: a product cuBLAS does not take (a size past its 32-bit ints, k == 0, a failed
 * load) runs graphc's kernel with the same results contract (beta == 0 never reads C); the
 * handle of a thread is created once per device context (gc_device_reset drops it) with its
 * own workspace, so a stream capture allocates nothing (creating them is not capturable: the
 * cuda backend's first call of an executable runs its launch list directly, and a capture
 * that fails falls back to that direct list); math mode is cuBLAS's default (no
 * TF32 unless the TF32 entry asks for it), so gc_gemm_f32 stays float32 as in PyTorch.
 */
#ifndef GRAPHC_RT_VENDOR_BLAS_H
#define GRAPHC_RT_VENDOR_BLAS_H

#include "common.h"

namespace gc_vendor {

struct GemmArgs {
    bool tf32;
    int32_t trans_a, trans_b;
    int64_t m, n, k;
    float alpha;
    const float *a;
    int64_t lda, stride_a;
    const float *b;
    int64_t ldb, stride_b;
    float beta;
    float *c;
    int64_t ldc, stride_c, batch; /* batch 1 with zero strides: a plain GEMM */
};

#ifdef GC_EMULATION
inline bool gemm_takes(bool, int64_t, int64_t, int64_t, int64_t) { return false; }
inline gc_status gemm(const GemmArgs &, gc_stream) { return GC_ERROR_NOT_SUPPORTED; }
inline const char *blas_status() {
    return "cuBLAS not used: the emulation runs graphc's kernels";
}
inline void reset() {}
#else
/* whether cuBLAS runs this product (loading it on first use) */
bool gemm_takes(bool tf32, int64_t m, int64_t n, int64_t k, int64_t batch);
/* runs a product gemm_takes accepted */
gc_status gemm(const GemmArgs &args, gc_stream stream);
/* one sentence: which library is used, or why none is */
const char *blas_status();
/* after cudaDeviceReset: the handles belong to the old context */
void reset();
#endif

} /* namespace gc_vendor */

#endif /* GRAPHC_RT_VENDOR_BLAS_H */
