/* The cuBLASLt fallback of the linear plan (src/cuda/gemm/cublaslt.cu): one matmul descriptor per plan,
 * layouts per M, the heuristic's top algorithms per M chosen once at plan time. CUDA builds only. */
#ifndef K3_CUDA_CUBLASLT_H
#define K3_CUDA_CUBLASLT_H

#include <stddef.h>

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

#define K3_LT_MAX_M 32   /* layouts are made for every m in 1..max_m */
#define K3_LT_KEEP_ALGOS 4 /* the heuristic's top algorithms kept per m (tables name them h0..h3) */

typedef struct k3_lt_plan k3_lt_plan;

/* BF16 y[m, n] (row stride y_stride) = x[m, k] (row stride x_stride) . w[n, k]^T (+ residual), fp32 compute,
 * for every m in 1..max_m; y_f32 != 0: y (and the residual) in fp32 instead, unrounded (a tensor-parallel rank's
 * partial sum). Pointers are assumed 16-byte aligned (the run call checks). */
k3_status k3_lt_plan_create(k3_ctx *ctx, int64_t n, int64_t k, int64_t max_m, int64_t x_stride, int64_t y_stride,
                            int32_t y_f32, k3_lt_plan **out);
void k3_lt_plan_destroy(k3_lt_plan *p);
/* How many heuristic algorithms were kept for m (>= 1 after a successful create). */
int32_t k3_lt_algo_count(const k3_lt_plan *p, int64_t m);
/* cuBLASLt's id of kept algorithm `algo` for m (descriptions only), -1 when out of range. */
int32_t k3_lt_algo_id(const k3_lt_plan *p, int64_t m, int32_t algo);
/* The largest workspace any kept algorithm needs. */
size_t k3_lt_workspace_size(const k3_lt_plan *p);
/* Enqueues one matmul; residual (may alias y) is added through beta = 1. No allocation, no sync. */
k3_status k3_lt_run(k3_ctx *ctx, const k3_lt_plan *p, int64_t m, int32_t algo, const void *x, const void *w,
                    const void *residual, void *y, void *ws, size_t ws_bytes, void *stream);

#ifdef __cplusplus
}
#endif
#endif
