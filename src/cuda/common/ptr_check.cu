/* Refuses host memory given to a CUDA-context MoE / router / latent run: a kernel reading a malloc'ed pointer
 * would fault (or read garbage) asynchronously, long after the call returned. The check is a host-side
 * attribute query (no sync, no device work); it is skipped while the stream is being captured, so it never
 * disturbs a CUDA-graph capture. */
#include <cuda_runtime.h>

#include "cuda/common/ptr_check.h"

extern "C" k3_status k3_cuda_check_device_ptrs(k3_ctx *ctx, void *stream, const char *what, int32_t n,
                                               const void *const *ptrs, const char *const *names) {
    if (ctx->skip_pointer_checks) return K3_STATUS_SUCCESS; /* the caller vouches (k3_ctx_options) */
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
        cudaGetLastError(); /* a failed query must not linger as the sticky last error */
        return K3_STATUS_SUCCESS;
    }
    for (int32_t i = 0; i < n; i++) {
        if (!ptrs[i]) continue; /* optional pointers were checked by the caller */
        cudaPointerAttributes a;
        if (cudaPointerGetAttributes(&a, ptrs[i]) != cudaSuccess) {
            cudaGetLastError();
            continue; /* unknown to the runtime: let the launch decide rather than refuse valid memory */
        }
        if (a.type == cudaMemoryTypeUnregistered)
            return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT,
                           "%s: %s is host memory; a CUDA context takes device (or managed / registered) memory",
                           what, names[i]);
    }
    return K3_STATUS_SUCCESS;
}
