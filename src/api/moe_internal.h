/* Internal API-layer helpers of the MoE and latent-MoE plans: shared validation, the CPU form of a plan. */
#ifndef K3_API_MOE_INTERNAL_H
#define K3_API_MOE_INTERNAL_H

#include "core/internal.h"
#include "cpu/cpu.h"

/* Every plan-time rule of k3_moe_desc (the message names the field and what was expected; `what` prefixes it,
 * e.g. "moe plan" or "latent plan: experts"). */
k3_status k3_moe_desc_check(k3_ctx *ctx, const k3_moe_desc *d, const char *what);
/* The run-time pointer rules of k3_moe_weights for a plan's format and mode (`what` prefixes the message). */
k3_status k3_moe_weights_check(k3_ctx *ctx, const k3_moe_desc *d, const k3_moe_weights *w, const char *what);

/* The CUDA launch a plan resolved for m tokens, or NULL (a plain CPU plan, or m out of range): the benchmark's
 * per-stage cuts (k3_cuda_moe_run_stages) run the plan's own launch. */
const struct k3_moe_launch *k3_moe_plan_launch(const k3_moe_plan *plan, int64_t m);

/* Floats of a rank's fp32 partial for m tokens (k3_latent_moe_partial_count): u [m, L], then the shared output
 * [m, H] when the block has shared experts. d validated: no overflow. */
static inline size_t k3_latent_partial_floats(const k3_latent_moe_desc *d, int64_t m) {
    return (size_t)m * (size_t)(d->experts.hidden + (d->shared_inter > 0 ? d->hidden : 0));
}

/* The CPU form of a latent-MoE plan (for tools that run its stages one by one, e.g. the demo's timings). */
const k3_cpu_latent *k3_latent_moe_plan_cpu(const k3_latent_moe_plan *plan);

#endif
