/*
 * The CPU backend's internal entry points: plain C reference routines called by the public API layer
 * (src/api/). None of them validates its arguments (the plans do) and none allocates.
 */
#ifndef K3_CPU_CPU_H
#define K3_CPU_CPU_H

#include <stdint.h>

#include "k3.h"

/* ---------------------------------------------------------------- linear (src/cpu/linear.c) ---- */

/* y[m, n] = x[m, k] . w[n, k]^T (+ residual[m, n]); BF16 bits in and out; fp32 or fp64 accumulation; the
   residual is added in the accumulator type before the single BF16 rounding. Strides in elements (x_stride for
   x, y_stride for y and the residual; w is dense [n, k]). residual may be NULL; it may alias y (same stride).
   No validation (callers validate). */
void k3_cpu_linear(int64_t m, int64_t n, int64_t k, const uint16_t *x, int64_t x_stride, const uint16_t *w,
                   const uint16_t *residual, uint16_t *y, int64_t y_stride, k3_accum accum);
/* The same fp32 sums (lanes, order) left unrounded: y [m, n] fp32; bf16 of it is k3_cpu_linear's FP32 output. */
void k3_cpu_linear_f32out(int64_t m, int64_t n, int64_t k, const uint16_t *x, int64_t x_stride, const uint16_t *w,
                          float *y, int64_t y_stride);

/* ---------------------------------------------------------------- router (src/cpu/router.c) ---- */

/* The router for m tokens (see k3_router_run); logits in fp32 (fp32 products, fp32 sum in a fixed order).
   x [m, d->hidden] BF16 (dense rows), gate [E, hidden] in d->gate_dtype, bias [E] or NULL (noaux_tc only).
   Writes topk_ids / topk_weights [m, top_k]. scratch holds E floats. NaN logits count as the lowest possible
   choice (they are picked only after every finite one, lowest id first) and give weight 0. */
void k3_cpu_router(const k3_router_desc *d, int64_t m, const uint16_t *x, const void *gate, const float *bias,
                   int32_t *topk_ids, float *topk_weights, float *scratch /* [E] */);

/* ---------------------------------------------------------------- MoE (src/cpu/moe.c, src/cpu/latent.c) -- */
/* (section owned by the MoE work; see the file comments of moe.c and latent.c for the exact rounding points) */

/* A validated routed-experts descriptor plus what the run derives from it once. */
typedef struct k3_cpu_moe {
    k3_moe_desc d;
    int64_t w1_rows;                          /* rows of W13 per expert: 2I (gated) or I (RELU2_NO_MUL) */
    int64_t block;                            /* FP4 block size (16 or 32), 0 for BF16 weights */
    size_t w13_expert_bytes, w2_expert_bytes; /* weight bytes of one expert */
    size_t w13_scale_bytes, w2_scale_bytes;   /* block-scale bytes of one expert (swizzle padding included) */
    float fp4_lut[16];                        /* e2m1 code -> value */
    float scale_lut[256];                     /* e4m3 (NVFP4) or ue8m0 (MXFP4) code -> value */
} k3_cpu_moe;

/* Fills p from a descriptor the caller has validated (only k3_fp4_scale_bytes can fail). */
k3_status k3_cpu_moe_prepare(k3_cpu_moe *p, const k3_moe_desc *d);
/* Workspace bytes of k3_cpu_moe_run for d.max_tokens tokens (any alignment of ws is accepted). */
size_t k3_cpu_moe_workspace_size(const k3_cpu_moe *p);
/* The routed experts for m tokens (see k3_moe_run); ids must be in [0, E). out and out_f32 may each be NULL. */
void k3_cpu_moe_run(const k3_cpu_moe *p, int64_t m, const uint16_t *x, const int32_t *ids, const float *wts,
                    const k3_moe_weights *w, uint16_t *out, float *out_f32, void *ws);

/* Expert parallelism: local[i] = map[ids[i]] for ids in [0, global_experts), else -1 (i < n). */
void k3_cpu_moe_map_ids(const int32_t *ids, int32_t n, const int32_t *map, int32_t global_experts, int32_t *local);

/* A validated latent-MoE block descriptor (router and experts take the block's max_tokens). */
typedef struct k3_cpu_latent {
    k3_latent_moe_desc d;
    k3_cpu_moe experts;
    int64_t shared_rows; /* rows of shared_gate_up: width factor of shared_act * Is (0 without shared experts) */
} k3_cpu_latent;

/* Stages of the block, in order, for a progress/timing callback (the demo's per-stage times). */
enum { K3_LATENT_STAGE_ROUTER, K3_LATENT_STAGE_DOWN, K3_LATENT_STAGE_EXPERTS, K3_LATENT_STAGE_NORM_UP,
       K3_LATENT_STAGE_SHARED, K3_LATENT_STAGE_COUNT };
/* Called right after each stage finishes (the output sum counts with SHARED). */
typedef void (*k3_cpu_stage_fn)(void *user, int32_t stage);

size_t k3_cpu_latent_workspace_size(const k3_cpu_latent *p);
/* The whole block for m tokens (see k3_latent_moe_run). residual, topk_ids and topk_weights may be NULL;
   mark (may be NULL) is called after each stage. */
void k3_cpu_latent_run(const k3_cpu_latent *p, int64_t m, const uint16_t *x, const k3_latent_moe_weights *w,
                       const uint16_t *residual, uint16_t *y, int32_t *topk_ids, float *topk_weights, void *ws,
                       k3_cpu_stage_fn mark, void *mark_user);
/* The block's halves around a cross-rank reduction (k3_latent_moe_run_stage). pre: steps 1-3 and 6, u [m, L]
   then fp32(s) [m, H] (when shared_inter > 0) into partial; post: steps 4, 5 and 7 from a (reduced) partial. Run
   one after the other on one rank, they give k3_cpu_latent_run's bits. */
void k3_cpu_latent_run_pre(const k3_cpu_latent *p, int64_t m, const uint16_t *x, const k3_latent_moe_weights *w,
                           float *partial, int32_t *topk_ids, float *topk_weights, void *ws);
void k3_cpu_latent_run_post(const k3_cpu_latent *p, int64_t m, const float *partial, const k3_latent_moe_weights *w,
                            const uint16_t *residual, uint16_t *y, void *ws);

#endif
