/* The public latent-MoE block API: descriptor defaults, plan validation, run-time checks, CPU dispatch. */
#include "api/moe_internal.h"
#include "core/act.h"
#include "core/act_check.h"
#include "cuda/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define K3_LATENT_MAX_DIM (INT64_C(1) << 24)

struct k3_latent_moe_plan {
    k3_ctx *ctx;
    k3_cpu_latent cpu;    /* cpu.d is the validated descriptor on every backend */
    k3_cuda_latent *cuda; /* CUDA context: the block of src/cuda/moe_latent.cu */
    size_t ws_bytes;
};

void k3_latent_moe_desc_init(k3_latent_moe_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->hidden = 7168;
    k3_router_desc_init(&d->router);
    k3_moe_desc_init(&d->experts);
    d->shared_inter = 768;
    k3_act_desc_k3(&d->shared_act);
    d->rms_eps = 1e-5f;
    d->max_tokens = 16;
}

/* Re-prefixes the message a sub-check left on the context. */
static k3_status prefix_error(k3_ctx *ctx, k3_status st, const char *prefix) {
    char msg[K3_ERROR_MAX];
    memcpy(msg, ctx->last_error, sizeof msg);
    return k3_fail(ctx, st, "%s: %s", prefix, msg);
}

static k3_status latent_check_desc(k3_ctx *ctx, const k3_latent_moe_desc *d) {
    K3_CHECK_ARG(ctx, d->hidden > 0 && d->hidden <= K3_LATENT_MAX_DIM,
                 "latent plan: hidden must be in [1, %lld] (got %lld)", (long long)K3_LATENT_MAX_DIM,
                 (long long)d->hidden);
    K3_CHECK_ARG(ctx, d->max_tokens >= 1 && d->max_tokens <= 65536,
                 "latent plan: max_tokens must be in [1, 65536] (got %lld)", (long long)d->max_tokens);
    K3_CHECK_ARG(ctx, d->router.hidden == d->hidden, "latent plan: router.hidden (%lld) must equal hidden (%lld)",
                 (long long)d->router.hidden, (long long)d->hidden);
    K3_CHECK_ARG(ctx, d->router.num_experts == d->experts.num_experts,
                 "latent plan: router.num_experts (%d) must equal experts.num_experts (%d)", (int)d->router.num_experts,
                 (int)d->experts.num_experts);
    K3_CHECK_ARG(ctx, d->router.top_k == d->experts.top_k,
                 "latent plan: router.top_k (%d) must equal experts.top_k (%d)", (int)d->router.top_k,
                 (int)d->experts.top_k);
    K3_TRY(k3_moe_desc_check(ctx, &d->experts, "latent plan: experts"));
    K3_CHECK_ARG(ctx, d->shared_inter >= 0 && d->shared_inter <= K3_LATENT_MAX_DIM,
                 "latent plan: shared_inter must be in [0, %lld] (0 = no shared experts; got %lld)",
                 (long long)K3_LATENT_MAX_DIM, (long long)d->shared_inter);
    if (d->shared_inter > 0) {
        k3_status st = k3_act_check(ctx, &d->shared_act);
        if (st != K3_STATUS_SUCCESS) return prefix_error(ctx, st, "latent plan: shared_act");
    }
    K3_CHECK_ARG(ctx, isfinite(d->rms_eps) && d->rms_eps > 0.0f, "latent plan: rms_eps must be finite and > 0 (got %g)",
                 (double)d->rms_eps);
    return K3_STATUS_SUCCESS;
}

k3_status k3_latent_moe_plan_create(k3_ctx *ctx, const k3_latent_moe_desc *d, k3_latent_moe_plan **out) {
    if (!ctx) return K3_STATUS_INVALID_ARGUMENT;
    k3_clear_error(ctx);
    K3_CHECK_ARG(ctx, out != NULL, "latent plan: out is NULL");
    *out = NULL;
    K3_CHECK_ARG(ctx, d != NULL, "latent plan: descriptor is NULL");
    /* the block's max_tokens governs its router and experts (their own max_tokens fields are not read) */
    k3_latent_moe_desc dd = *d;
    dd.router.max_tokens = dd.max_tokens;
    dd.experts.max_tokens = dd.max_tokens;
    K3_TRY(latent_check_desc(ctx, &dd));
    /* the router's own rules (its plan validates and then, on CUDA, reports UNSUPPORTED: that is fine here) */
    k3_router_plan *rp = NULL;
    k3_status st = k3_router_plan_create(ctx, &dd.router, &rp);
    k3_router_plan_destroy(rp);
    if (st != K3_STATUS_SUCCESS && !(st == K3_STATUS_UNSUPPORTED && ctx->backend != K3_BACKEND_CPU))
        return prefix_error(ctx, st, "latent plan");
    k3_clear_error(ctx);
#ifndef K3_HAVE_CUDA
    if (ctx->backend != K3_BACKEND_CPU)
        return k3_fail(ctx, K3_STATUS_UNSUPPORTED, "latent plan: this build has no CUDA MoE backend");
#endif

    k3_latent_moe_plan *p = (k3_latent_moe_plan *)calloc(1, sizeof *p);
    if (!p) return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "latent plan: out of host memory");
    p->cpu.d = dd;
    st = k3_cpu_moe_prepare(&p->cpu.experts, &dd.experts);
    if (st != K3_STATUS_SUCCESS) {
        free(p);
        return k3_fail(ctx, st, "latent plan: cannot size the experts' block scales (%s)", k3_status_string(st));
    }
    p->cpu.shared_rows = dd.shared_inter > 0 ? k3_act_width_factor(dd.shared_act.kind) * dd.shared_inter : 0;
    p->ctx = ctx;
    p->ws_bytes = k3_cpu_latent_workspace_size(&p->cpu);
#ifdef K3_HAVE_CUDA
    if (ctx->backend != K3_BACKEND_CPU) {
        st = k3_cuda_latent_create(ctx, &dd, &p->cuda);
        if (st != K3_STATUS_SUCCESS) {
            free(p);
            return st; /* the message is set */
        }
        p->ws_bytes = k3_cuda_latent_ws_bytes(p->cuda);
    }
#endif
    *out = p;
    return K3_STATUS_SUCCESS;
}

void k3_latent_moe_plan_destroy(k3_latent_moe_plan *plan) {
    if (!plan) return;
#ifdef K3_HAVE_CUDA
    k3_cuda_latent_destroy(plan->cuda);
#endif
    free(plan);
}

k3_status k3_latent_moe_workspace_size(const k3_latent_moe_plan *plan, size_t *out_bytes) {
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    k3_clear_error(plan->ctx);
    K3_CHECK_ARG(plan->ctx, out_bytes != NULL, "latent workspace size: out_bytes is NULL");
    *out_bytes = plan->ws_bytes;
    return K3_STATUS_SUCCESS;
}

k3_status k3_latent_moe_run(k3_latent_moe_plan *plan, int64_t m, const void *x, const k3_latent_moe_weights *w,
                            const void *residual, void *y, int32_t *topk_ids, float *topk_weights, void *ws,
                            size_t ws_bytes, void *stream) {
    (void)stream; /* ignored by the CPU backend, which runs synchronously on the caller's thread */
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    k3_ctx *ctx = plan->ctx;
    const k3_latent_moe_desc *d = &plan->cpu.d;
    k3_clear_error(ctx);
    K3_CHECK_ARG(ctx, m >= 1 && m <= d->max_tokens, "latent run: m must be in [1, max_tokens = %lld] (got %lld)",
                 (long long)d->max_tokens, (long long)m);
    K3_CHECK_ARG(ctx, x != NULL, "latent run: x is NULL");
    K3_CHECK_ARG(ctx, y != NULL, "latent run: y is NULL");
    K3_CHECK_ARG(ctx, w != NULL, "latent run: weights is NULL");
    K3_CHECK_ARG(ctx, w->gate != NULL, "latent run: weights gate is NULL");
    K3_CHECK_ARG(ctx, w->bias == NULL || d->router.kind == K3_ROUTER_SIGMOID_NOAUX_TC,
                 "latent run: weights bias is only used by SIGMOID_NOAUX_TC; pass NULL for a SOFTMAX router");
    K3_CHECK_ARG(ctx, w->down_proj != NULL, "latent run: weights down_proj is NULL");
    K3_CHECK_ARG(ctx, w->norm != NULL, "latent run: weights norm is NULL");
    K3_CHECK_ARG(ctx, w->up_proj != NULL, "latent run: weights up_proj is NULL");
    if (d->shared_inter > 0) {
        K3_CHECK_ARG(ctx, w->shared_gate_up != NULL,
                     "latent run: weights shared_gate_up is NULL (shared_inter is %lld)", (long long)d->shared_inter);
        K3_CHECK_ARG(ctx, w->shared_down != NULL, "latent run: weights shared_down is NULL (shared_inter is %lld)",
                     (long long)d->shared_inter);
    }
    K3_TRY(k3_moe_weights_check(ctx, &d->experts, &w->experts, "latent run: experts"));
    K3_CHECK_ARG(ctx, ws_bytes >= plan->ws_bytes,
                 "latent run: ws_bytes is %zu, the plan needs %zu (k3_latent_moe_workspace_size)", ws_bytes,
                 plan->ws_bytes);
    K3_CHECK_ARG(ctx, ws != NULL, "latent run: ws is NULL (the plan needs %zu bytes)", plan->ws_bytes);
#ifdef K3_HAVE_CUDA
    if (plan->cuda)
        return k3_cuda_latent_run(plan->cuda, m, x, w, residual, y, topk_ids, topk_weights, ws, stream);
#endif
    k3_cpu_latent_run(&plan->cpu, m, (const uint16_t *)x, w, (const uint16_t *)residual, (uint16_t *)y, topk_ids,
                      topk_weights, ws, NULL, NULL);
    return K3_STATUS_SUCCESS;
}

const k3_cpu_latent *k3_latent_moe_plan_cpu(const k3_latent_moe_plan *plan) { return plan ? &plan->cpu : NULL; }
