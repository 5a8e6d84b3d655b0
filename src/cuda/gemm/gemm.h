/* C-callable launchers of the specialized BF16 GEMM kernels (skinny CUDA-core, tensor-core small-M).
 * Called by the linear plan (src/api/linear.c); the configuration comes from src/plan/gemm_configs.h. */
#ifndef K3_CUDA_GEMM_H
#define K3_CUDA_GEMM_H

#include "core/internal.h"
#include "plan/gemm_configs.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3_gemm_args {
    int64_t m, n, k;
    const void *x;        /* BF16 [m, k], row stride x_stride elements */
    int64_t x_stride;
    const void *w;        /* BF16 [n, k], contiguous */
    const void *residual; /* BF16 [m, n] with row stride y_stride, or NULL; may alias y */
    void *y;              /* BF16 [m, n], row stride y_stride */
    int64_t y_stride;
} k3_gemm_args;

/* The one-time set-up cfg needs on the context's device before its first launch there (the bulk kernels: their
 * shared-memory ring over the default limit; nothing for the others). Idempotent; the linear plan calls it for every
 * configuration it chooses, when it is made. */
k3_status k3_cuda_gemm_prepare(k3_ctx *ctx, const k3_gemm_config *cfg);

/* Launches cfg on `stream` (a cudaStream_t), which k3_cuda_gemm_prepare has set up on this device. pdl != 0
 * launches with programmatic dependent launch so the weight prefetch overlaps the previous kernel's tail. No
 * allocation, no sync; the launch is checked. */
k3_status k3_cuda_gemm_launch(k3_ctx *ctx, const k3_gemm_config *cfg, const k3_gemm_args *a, void *stream,
                              int32_t pdl);

#ifdef __cplusplus
}
#endif
#endif
