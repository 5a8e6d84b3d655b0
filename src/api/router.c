/* The public router API: descriptor defaults, plan validation, run-time checks, dispatch to the backend. */
#include "core/internal.h"
#include "cpu/cpu.h"
#include "cuda/router/router.h"

#include <math.h>
#include <stdlib.h>

#define K3_ROUTER_MAX_EXPERTS 4096
#define K3_ROUTER_MAX_TOPK 32

struct k3_router_plan {
    k3_ctx *ctx;
    k3_router_desc desc;
    float *scratch; /* [E] logits / probabilities of one token; made here so run calls allocate nothing */
    int32_t is_cuda; /* CUDA context: the kernels of src/cuda/router/router.cu, logits in the workspace */
};

void k3_router_desc_init(k3_router_desc *d) {
    if (!d) return;
    d->kind = K3_ROUTER_SIGMOID_NOAUX_TC;
    d->num_experts = 896;
    d->top_k = 16;
    d->hidden = 7168;
    d->gate_dtype = K3_DTYPE_BF16;
    d->renormalize = 1;
    d->scaling_factor = 1.0f;
    d->max_tokens = 16;
}

static k3_status router_check_desc(k3_ctx *ctx, const k3_router_desc *d) {
    K3_CHECK_ARG(ctx, d->kind == K3_ROUTER_SIGMOID_NOAUX_TC || d->kind == K3_ROUTER_SOFTMAX,
                 "router kind %d is unknown (expected 0 = SIGMOID_NOAUX_TC or 1 = SOFTMAX)", (int)d->kind);
    K3_CHECK_ARG(ctx, d->num_experts >= 1 && d->num_experts <= K3_ROUTER_MAX_EXPERTS,
                 "router num_experts must be in [1, %d] (got %d)", K3_ROUTER_MAX_EXPERTS, (int)d->num_experts);
    const int32_t kmax = d->num_experts < K3_ROUTER_MAX_TOPK ? d->num_experts : K3_ROUTER_MAX_TOPK;
    K3_CHECK_ARG(ctx, d->top_k >= 1 && d->top_k <= kmax,
                 "router top_k must be in [1, min(num_experts, %d)] = [1, %d] (got %d)", K3_ROUTER_MAX_TOPK,
                 (int)kmax, (int)d->top_k);
    K3_CHECK_ARG(ctx, d->hidden > 0, "router hidden must be > 0 (got %lld)", (long long)d->hidden);
    K3_CHECK_ARG(ctx, d->gate_dtype == K3_DTYPE_BF16 || d->gate_dtype == K3_DTYPE_F32,
                 "router gate_dtype %d is unknown (expected K3_DTYPE_BF16 or K3_DTYPE_F32)", (int)d->gate_dtype);
    K3_CHECK_ARG(ctx, d->renormalize == 0 || d->renormalize == 1, "router renormalize must be 0 or 1 (got %d)",
                 (int)d->renormalize);
    K3_CHECK_ARG(ctx, isfinite(d->scaling_factor) && d->scaling_factor > 0.0f,
                 "router scaling_factor must be finite and > 0 (got %g)", (double)d->scaling_factor);
    K3_CHECK_ARG(ctx, d->max_tokens >= 1, "router max_tokens must be >= 1 (got %lld)", (long long)d->max_tokens);
    return K3_STATUS_SUCCESS;
}

k3_status k3_router_plan_create(k3_ctx *ctx, const k3_router_desc *d, k3_router_plan **out) {
    if (!ctx) return K3_STATUS_INVALID_ARGUMENT;
    k3_clear_error(ctx);
    K3_CHECK_ARG(ctx, out != NULL, "router plan: out is NULL");
    *out = NULL;
    K3_CHECK_ARG(ctx, d != NULL, "router plan: descriptor is NULL");
    K3_TRY(router_check_desc(ctx, d));
#ifndef K3_HAVE_CUDA
    if (ctx->backend != K3_BACKEND_CPU)
        return k3_fail(ctx, K3_STATUS_UNSUPPORTED, "router plan: this build has no CUDA router");
#endif
    k3_router_plan *p = (k3_router_plan *)calloc(1, sizeof *p);
    float *scratch = (float *)malloc((size_t)d->num_experts * sizeof(float));
    if (!p || !scratch) {
        free(p);
        free(scratch);
        return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "router plan: out of host memory");
    }
    p->ctx = ctx;
    p->desc = *d;
    p->scratch = scratch;
    p->is_cuda = ctx->backend != K3_BACKEND_CPU;
    *out = p;
    return K3_STATUS_SUCCESS;
}

void k3_router_plan_destroy(k3_router_plan *plan) {
    if (!plan) return;
    free(plan->scratch);
    free(plan);
}

k3_status k3_router_workspace_size(const k3_router_plan *plan, size_t *out_bytes) {
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    k3_clear_error(plan->ctx);
    K3_CHECK_ARG(plan->ctx, out_bytes != NULL, "router workspace size: out_bytes is NULL");
    *out_bytes = 0; /* the CPU scratch lives in the plan */
#ifdef K3_HAVE_CUDA
    if (plan->is_cuda) *out_bytes = k3_cuda_router_ws_bytes(&plan->desc);
#endif
    return K3_STATUS_SUCCESS;
}

k3_status k3_router_run(k3_router_plan *plan, int64_t m, const void *x, const void *gate, const float *bias,
                        int32_t *topk_ids, float *topk_weights, void *ws, size_t ws_bytes, void *stream) {
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    k3_ctx *ctx = plan->ctx;
    const k3_router_desc *d = &plan->desc;
    k3_clear_error(ctx);
    K3_CHECK_ARG(ctx, m >= 1 && m <= d->max_tokens, "router run: m must be in [1, max_tokens = %lld] (got %lld)",
                 (long long)d->max_tokens, (long long)m);
    K3_CHECK_ARG(ctx, x != NULL, "router run: x is NULL");
    K3_CHECK_ARG(ctx, gate != NULL, "router run: gate is NULL");
    K3_CHECK_ARG(ctx, topk_ids != NULL, "router run: topk_ids is NULL");
    K3_CHECK_ARG(ctx, topk_weights != NULL, "router run: topk_weights is NULL");
    /* refuse rather than ignore: a caller passing a bias to a softmax router expects it to matter */
    K3_CHECK_ARG(ctx, bias == NULL || d->kind == K3_ROUTER_SIGMOID_NOAUX_TC,
                 "router run: bias is only used by SIGMOID_NOAUX_TC; pass NULL for a SOFTMAX router");
#ifdef K3_HAVE_CUDA
    if (plan->is_cuda) {
        const size_t need = k3_cuda_router_ws_bytes(d);
        K3_CHECK_ARG(ctx, ws_bytes >= need, "router run: ws_bytes is %zu, the plan needs %zu (k3_router_workspace_size)",
                     ws_bytes, need);
        K3_CHECK_ARG(ctx, ws != NULL, "router run: ws is NULL (the plan needs %zu bytes)", need);
        return k3_cuda_router_run(ctx, d, m, x, gate, bias, topk_ids, topk_weights, ws, stream);
    }
#endif
    k3_cpu_router(d, m, (const uint16_t *)x, gate, bias, topk_ids, topk_weights, plan->scratch);
    return K3_STATUS_SUCCESS;
}
