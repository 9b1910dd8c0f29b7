/* vendor_dnn.h: NVIDIA's cuDNN behind graphc's convolution entries, when it is present.
 *
 * The CUDA build (src/vendor_dnn.cu) dlopens libcudnn.so.9 (or .8) at the first convolution
 * (e.g. already loaded from the nvidia-cudnn wheel: graphc.backends.cuda.rt preloads it)
 * unless GRAPHC_CUDA_LIBS=0, and runs the forward, data-gradient and filter-gradient passes
 * it runs faster than graphc's kernels through cuDNN's convolution API; graphc's own kernels
 * (kernels/conv.cu) stay the fallback and the reference. Nothing is linked against cuDNN and
 * no cuDNN header is needed: the entry points are declared in vendor_dnn.cu by their
 * documented C ABI. The emulation never loads it (the stubs below), so CI always runs
 * graphc's kernels.
 *
 * Invariants:
 * - float32 stays float32: every convolution descriptor asks for CUDNN_FMA_MATH (no TF32),
 *   as PyTorch with torch.backends.cudnn.allow_tf32 = False;
 * - results are deterministic, and cuDNN runs a pass only where it is faster: when a workspace
 *   query (gc_conv2d_workspace_size: the cuda backend's lowering, never inside a stream
 *   capture) first meets a (descriptor, pass), cudnnFind*Algorithm times cuDNN's algorithms
 *   and the fastest that cuDNN marks CUDNN_DETERMINISTIC, with a workspace within
 *   kMaxWorkspace, and that is neither FFT nor Winograd (their float32 error is past the
 *   rounding rule: vendor_dnn.cu's sums_only) is compared with graphc's own kernels, timed the same way on scratch
 *   buffers; the faster is remembered (as PyTorch's cudnn.benchmark remembers its choice).
 *   A pass no query has met runs graphc's kernels;
 * - `conv_workspace` is what cuDNN needs on top of nothing: the entry reports the larger of
 *   it and graphc's own kernels' need, so a call cuDNN does not take still has its workspace;
 * - the handle of a thread is created once per device context (gc_device_reset drops it).
 */
#ifndef GRAPHC_RT_VENDOR_DNN_H
#define GRAPHC_RT_VENDOR_DNN_H

#include "common.h"

namespace gc_vendor {

enum class ConvPass { forward, backward_data, backward_filter };

#ifdef GC_EMULATION
inline bool conv_takes(const gc_conv2d_desc &, ConvPass, int64_t) { return false; }
inline int64_t conv_workspace(const gc_conv2d_desc &, ConvPass) { return 0; }
inline gc_status conv_forward(const gc_conv2d_desc &, const float *, const float *,
                              const float *, float *, void *, int64_t, gc_stream) {
    return GC_ERROR_NOT_SUPPORTED;
}
inline gc_status conv_backward_data(const gc_conv2d_desc &, const float *, const float *,
                                    float *, void *, int64_t, gc_stream) {
    return GC_ERROR_NOT_SUPPORTED;
}
inline gc_status conv_backward_filter(const gc_conv2d_desc &, const float *, const float *,
                                      float *, void *, int64_t, gc_stream) {
    return GC_ERROR_NOT_SUPPORTED;
}
inline const char *conv_provider(const gc_conv2d_desc &, ConvPass) {
    return "graphc's kernels (cuDNN not used: the emulation runs graphc's kernels)";
}
inline void dnn_reset() {}
#else
/* whether cuDNN runs this pass with a workspace of `workspace_bytes` (a choice a workspace
 * query made; never choosing here) */
bool conv_takes(const gc_conv2d_desc &d, ConvPass pass, int64_t workspace_bytes);
/* the workspace cuDNN's chosen algorithm needs (0 when cuDNN does not take the pass); makes
 * the choice on first use (timing both libraries: outside any stream capture) */
int64_t conv_workspace(const gc_conv2d_desc &d, ConvPass pass);
/* y = conv(x, w) (+ bias per output channel when bias is not NULL) */
gc_status conv_forward(const gc_conv2d_desc &d, const float *x, const float *w,
                       const float *bias, float *y, void *workspace, int64_t workspace_bytes,
                       gc_stream stream);
gc_status conv_backward_data(const gc_conv2d_desc &d, const float *dy, const float *w,
                             float *dx, void *workspace, int64_t workspace_bytes,
                             gc_stream stream);
gc_status conv_backward_filter(const gc_conv2d_desc &d, const float *x, const float *dy,
                               float *dw, void *workspace, int64_t workspace_bytes,
                               gc_stream stream);
/* one sentence: what runs this pass (cuDNN's algorithm number, or why graphc's kernels) */
const char *conv_provider(const gc_conv2d_desc &d, ConvPass pass);
/* after cudaDeviceReset: the handles belong to the old context */
void dnn_reset();
#endif

} /* namespace gc_vendor */

#endif /* GRAPHC_RT_VENDOR_DNN_H */
