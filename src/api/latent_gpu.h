/*
 * The latent-MoE block on a CUDA context, in the CPU block's order (src/cpu/latent.c) with the same rounding points:
 *   shared:  gate_up = bf16(x W_gu^T) -> bf16(act) -> s = a W_sd^T in fp32 -> t = bf16(bf16(s) + residual)
 *   routed:  router -> down = bf16(x W_down^T) -> experts (fp32 sum u) -> RMSNorm -> y = bf16(v W_up^T + t)
 *            (the up projection with t as its residual: the block's last kernel)
 * The BF16 projections go through linear plans, the routed experts through a MoE plan, the router through a
 * router plan; the elementwise steps are the kernels of src/cuda/latent/kernels.cu. The router, the down
 * projection and the shared branch depend on x alone; the plan's schedule (k3_latent_schedule) says which of them
 * runs on a second stream, forked and joined by events and an aux stream made at plan time (capturable: no
 * allocation, no sync, no host decision at run time). The stages of a rank (PRE_REDUCE /
 * POST_REDUCE) cut the same chain around the fp32 partial; with the caller's NCCL communicator, the run is both
 * stages around one in-place all-reduce of the partial in the workspace. Arguments were validated by
 * src/api/latent.c.
 */
#ifndef K3_API_LATENT_GPU_H
#define K3_API_LATENT_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

typedef struct k3_latent_gpu k3_latent_gpu;

#ifdef K3_HAVE_CUDA
/* d: validated, its router and experts max_tokens equal to the block's. */
k3_status k3_latent_gpu_create(k3_ctx *ctx, const k3_latent_moe_desc *d, k3_latent_gpu **out);
void k3_latent_gpu_destroy(k3_latent_gpu *p); /* NULL is accepted */
/* The caller's workspace need not be aligned: the layout starts at its first aligned byte. */
size_t k3_latent_gpu_ws_bytes(const k3_latent_gpu *p);
/* 1 when the plan holds the caller's communicator (the run reduces across the ranks itself). */
int k3_latent_gpu_reduces(const k3_latent_gpu *p);
/* The whole block on `stream` (topk_ids / topk_weights / residual may be NULL). */
k3_status k3_latent_gpu_run(k3_ctx *ctx, const k3_latent_gpu *p, const k3_latent_moe_desc *d, int64_t m,
                            const void *x, const k3_latent_moe_weights *w, const void *residual, void *y,
                            int32_t *topk_ids, float *topk_weights, void *ws, void *stream);
/* PRE_REDUCE: u into partial (the experts' fp32 sum), the shared branch's unrounded fp32 output after it. */
k3_status k3_latent_gpu_run_pre(k3_ctx *ctx, const k3_latent_gpu *p, const k3_latent_moe_desc *d, int64_t m,
                                const void *x, const k3_latent_moe_weights *w, float *partial, int32_t *topk_ids,
                                float *topk_weights, void *ws, void *stream);
/* POST_REDUCE: RMSNorm of the summed u, the up projection, and the sum with the summed shared output. */
k3_status k3_latent_gpu_run_post(k3_ctx *ctx, const k3_latent_gpu *p, const k3_latent_moe_desc *d, int64_t m,
                                 const float *partial, const k3_latent_moe_weights *w, const void *residual, void *y,
                                 void *ws, void *stream);
/* The schedule the plan resolved for runs of m tokens (never AUTO; 1 <= m <= max_tokens). */
k3_latent_schedule k3_latent_gpu_schedule(const k3_latent_gpu *p, int64_t m);
/* PRE_REDUCE, the all-reduce through the plan's communicator, POST_REDUCE. */
k3_status k3_latent_gpu_run_reduced(k3_ctx *ctx, const k3_latent_gpu *p, const k3_latent_moe_desc *d, int64_t m,
                                    const void *x, const k3_latent_moe_weights *w, const void *residual, void *y,
                                    int32_t *topk_ids, float *topk_weights, void *ws, void *stream);
#endif

#endif
