/* The public routed-experts (MoE) API: descriptor defaults, plan validation, run-time checks, CPU dispatch. */
#include "api/moe_internal.h"
#include "api/ptr_align.h"
#include "core/act_check.h"
#include "cuda/moe/moe.h"
#include "plan/linear_plan.h"
#include "plan/moe_plan.h"
#include "plan/table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bounds that keep every size and index computation far from overflow (int32 pair indices, size_t bytes). */
#define K3_MOE_MAX_EXPERTS 65536
#define K3_MOE_MAX_TOPK 32
#define K3_MOE_MAX_TOKENS 65536
#define K3_MOE_MAX_DIM (INT64_C(1) << 24)
#define K3_MOE_MAX_EXPERT_ELEMS (INT64_C(1) << 40)
#define K3_MOE_FORCE_ALL                                                                                     \
    (K3_MOE_FORCE_NO_FOLD | K3_MOE_FORCE_NO_PAIR | K3_MOE_FORCE_NO_TILES | K3_MOE_FORCE_NO_EARLY |                 \
     K3_MOE_FORCE_NO_BALANCE)

struct k3_moe_plan {
    k3_ctx *ctx;
    k3_cpu_moe cpu;  /* cpu.d is the validated descriptor on every backend */
    int32_t is_cuda; /* CUDA context: run through src/cuda/moe/ */
    k3_cuda_moe cuda;
    k3_moe_launch *launch; /* [max_tokens + 1], indexed by m: the CUDA launches (CUDA or simulated contexts) */
    size_t ws_bytes;
    size_t ws_backend; /* the backend's part of ws_bytes (an expert map's local ids follow it) */
};

void k3_moe_desc_init(k3_moe_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->num_experts = 896;
    d->top_k = 16;
    d->hidden = 3584;
    d->inter = 384;
    d->format = K3_WEIGHT_NVFP4;
    d->scale_layout = K3_SCALE_LINEAR;
    d->w13_separate_scale_2 = 0;
    d->mode = K3_MOE_W4A16;
    k3_act_desc_k3(&d->act);
    d->max_tokens = 16;
}

static const char *format_name(k3_weight_format f) {
    return f == K3_WEIGHT_BF16 ? "BF16" : f == K3_WEIGHT_NVFP4 ? "NVFP4" : "MXFP4";
}

k3_status k3_moe_desc_check(k3_ctx *ctx, const k3_moe_desc *d, const char *what) {
    K3_CHECK_ARG(ctx, d->num_experts >= 1 && d->num_experts <= K3_MOE_MAX_EXPERTS,
                 "%s: num_experts must be in [1, %d] (got %d)", what, K3_MOE_MAX_EXPERTS, (int)d->num_experts);
    /* with an expert map the router chooses among global_experts: top_k may exceed this rank's E */
    const int32_t ne = d->global_experts > d->num_experts ? d->global_experts : d->num_experts;
    const int32_t kmax = ne < K3_MOE_MAX_TOPK ? ne : K3_MOE_MAX_TOPK;
    K3_CHECK_ARG(ctx, d->top_k >= 1 && d->top_k <= kmax,
                 "%s: top_k must be in [1, min(num_experts or global_experts, %d)] = [1, %d] (got %d)", what, K3_MOE_MAX_TOPK, (int)kmax,
                 (int)d->top_k);
    K3_CHECK_ARG(ctx, d->format == K3_WEIGHT_BF16 || d->format == K3_WEIGHT_NVFP4 || d->format == K3_WEIGHT_MXFP4,
                 "%s: format %d is unknown (expected K3_WEIGHT_BF16, K3_WEIGHT_NVFP4 or K3_WEIGHT_MXFP4)", what,
                 (int)d->format);
    K3_CHECK_ARG(ctx, d->hidden > 0 && d->hidden <= K3_MOE_MAX_DIM, "%s: hidden (L) must be in [1, %lld] (got %lld)",
                 what, (long long)K3_MOE_MAX_DIM, (long long)d->hidden);
    K3_CHECK_ARG(ctx, d->inter > 0 && d->inter <= K3_MOE_MAX_DIM, "%s: inter (I) must be in [1, %lld] (got %lld)", what,
                 (long long)K3_MOE_MAX_DIM, (long long)d->inter);
    if (d->format != K3_WEIGHT_BF16) {
        const int64_t bs = d->format == K3_WEIGHT_NVFP4 ? 16 : 32;
        K3_CHECK_ARG(ctx, d->hidden % bs == 0, "%s: hidden (L) must be a multiple of the %s block size %lld (got %lld)",
                     what, format_name(d->format), (long long)bs, (long long)d->hidden);
        K3_CHECK_ARG(ctx, d->inter % bs == 0, "%s: inter (I) must be a multiple of the %s block size %lld (got %lld)",
                     what, format_name(d->format), (long long)bs, (long long)d->inter);
    }
    K3_CHECK_ARG(ctx, d->scale_layout == K3_SCALE_LINEAR || d->scale_layout == K3_SCALE_SWIZZLED,
                 "%s: scale_layout %d is unknown (expected K3_SCALE_LINEAR or K3_SCALE_SWIZZLED)", what,
                 (int)d->scale_layout);
    K3_CHECK_ARG(ctx, d->mode == K3_MOE_W4A16 || d->mode == K3_MOE_W4A4,
                 "%s: mode %d is unknown (expected K3_MOE_W4A16 or K3_MOE_W4A4)", what, (int)d->mode);
    K3_CHECK_ARG(ctx, d->mode != K3_MOE_W4A4 || d->format == K3_WEIGHT_NVFP4,
                 "%s: mode W4A4 needs NVFP4 weights (format is %s)", what, format_name(d->format));
    k3_status st = k3_act_check(ctx, &d->act);
    if (st != K3_STATUS_SUCCESS) {
        char msg[K3_ERROR_MAX];
        memcpy(msg, ctx->last_error, sizeof msg);
        return k3_fail(ctx, st, "%s: act: %s", what, msg);
    }
    K3_CHECK_ARG(ctx, d->w13_separate_scale_2 == 0 || d->w13_separate_scale_2 == 1,
                 "%s: w13_separate_scale_2 must be 0 or 1 (got %d)", what, (int)d->w13_separate_scale_2);
    K3_CHECK_ARG(ctx, !d->w13_separate_scale_2 || d->format == K3_WEIGHT_NVFP4,
                 "%s: w13_separate_scale_2 = 1 needs NVFP4 weights (format is %s)", what, format_name(d->format));
    K3_CHECK_ARG(ctx, !d->w13_separate_scale_2 || d->act.kind != K3_ACT_RELU2_NO_MUL,
                 "%s: w13_separate_scale_2 = 1 needs a gated activation (relu2 has no gate/up halves)", what);
    K3_CHECK_ARG(ctx, (d->force_shape & ~K3_MOE_FORCE_ALL) == 0,
                 "%s: force_shape 0x%x has unknown bits (expected K3_MOE_FORCE_* bits, 0x%x)", what,
                 (unsigned)d->force_shape, (unsigned)K3_MOE_FORCE_ALL);
    K3_CHECK_ARG(ctx, d->max_tokens >= 1 && d->max_tokens <= K3_MOE_MAX_TOKENS,
                 "%s: max_tokens must be in [1, %d] (got %lld)", what, K3_MOE_MAX_TOKENS, (long long)d->max_tokens);
    K3_CHECK_ARG(ctx, d->global_experts == 0 || (d->global_experts >= d->num_experts &&
                                                  d->global_experts <= K3_MOE_MAX_EXPERTS),
                 "%s: global_experts must be 0 (no expert map) or in [num_experts = %d, %d] (got %d)", what,
                 (int)d->num_experts, K3_MOE_MAX_EXPERTS, (int)d->global_experts);
    K3_CHECK_ARG(ctx, d->global_experts == 0 || d->top_k <= d->global_experts,
                 "%s: top_k (%d) must be <= global_experts (%d)", what, (int)d->top_k, (int)d->global_experts);
    K3_CHECK_ARG(ctx, 2 * d->inter * d->hidden <= K3_MOE_MAX_EXPERT_ELEMS / d->num_experts,
                 "%s: E * 2I * L = %d * %lld * %lld elements is too large", what, (int)d->num_experts,
                 (long long)(2 * d->inter), (long long)d->hidden);
    return K3_STATUS_SUCCESS;
}

k3_status k3_moe_weights_check(k3_ctx *ctx, const k3_moe_desc *d, const k3_moe_weights *w, const char *what) {
    K3_CHECK_ARG(ctx, w != NULL, "%s: weights is NULL", what);
    K3_CHECK_ARG(ctx, w->w13 != NULL, "%s: weights w13 is NULL", what);
    K3_CHECK_ARG(ctx, w->w2 != NULL, "%s: weights w2 is NULL", what);
    if (d->format != K3_WEIGHT_BF16) {
        K3_CHECK_ARG(ctx, w->w13_scale != NULL, "%s: weights w13_scale is NULL (required for %s)", what,
                     format_name(d->format));
        K3_CHECK_ARG(ctx, w->w2_scale != NULL, "%s: weights w2_scale is NULL (required for %s)", what,
                     format_name(d->format));
    }
    if (d->format == K3_WEIGHT_NVFP4) {
        K3_CHECK_ARG(ctx, w->w13_scale_2 != NULL, "%s: weights w13_scale_2 is NULL (required for NVFP4)", what);
        K3_CHECK_ARG(ctx, w->w2_scale_2 != NULL, "%s: weights w2_scale_2 is NULL (required for NVFP4)", what);
    }
    K3_CHECK_ARG(ctx, d->global_experts == 0 || w->expert_map != NULL,
                 "%s: weights expert_map is NULL (global_experts is %d: the map of global ids to this rank's)", what,
                 (int)d->global_experts);
    K3_CHECK_ARG(ctx, k3_aligned(w->expert_map, 4), "%s: weights expert_map (%p) is not 4-byte aligned (int32)", what,
                 (const void *)w->expert_map);
    if (d->mode == K3_MOE_W4A4) {
        K3_CHECK_ARG(ctx, w->w13_input_scale != NULL, "%s: weights w13_input_scale is NULL (required for W4A4)", what);
        K3_CHECK_ARG(ctx, w->w2_input_scale != NULL, "%s: weights w2_input_scale is NULL (required for W4A4)", what);
    }
    /* the CPU backend reads BF16 weights as uint16 and the global scales as float (packed FP4 and block scales
     * are bytes) */
    if (d->format == K3_WEIGHT_BF16) {
        K3_CHECK_ARG(ctx, k3_aligned(w->w13, 2), "%s: weights w13 (%p) is not 2-byte aligned (BF16)", what, w->w13);
        K3_CHECK_ARG(ctx, k3_aligned(w->w2, 2), "%s: weights w2 (%p) is not 2-byte aligned (BF16)", what, w->w2);
    }
    const struct {
        const float *p;
        const char *name;
    } f32s[] = {{w->w13_scale_2, "w13_scale_2"},
                {w->w2_scale_2, "w2_scale_2"},
                {w->w13_input_scale, "w13_input_scale"},
                {w->w2_input_scale, "w2_input_scale"}};
    for (size_t i = 0; i < sizeof f32s / sizeof f32s[0]; i++)
        K3_CHECK_ARG(ctx, k3_aligned(f32s[i].p, sizeof(float)), "%s: weights %s (%p) is not 4-byte aligned (F32)", what,
                     f32s[i].name, (const void *)f32s[i].p);
    return K3_STATUS_SUCCESS;
}

/* Every m's CUDA launch, resolved once (src/plan/moe_plan.h): on CUDA contexts with the device's SM count, on a
 * simulated capability with its count or that of the device the architecture's table was tuned on; plain CPU
 * contexts have none. */
static k3_status moe_plan_launches(k3_ctx *ctx, k3_moe_plan *p) {
    int32_t sms = ctx->arch.sm_count;
    if (!p->is_cuda) {
        if (!ctx->arch.simulated) return K3_STATUS_SUCCESS;
        if (sms <= 0) {
            const k3_table *t = NULL;
            K3_TRY(k3_linear_ctx_table(ctx, &t));
            sms = t ? t->key.sm_count : 0;
        }
        if (sms <= 0) return K3_STATUS_SUCCESS;
    } else if (sms <= 0) {
        return k3_fail(ctx, K3_STATUS_INTERNAL_ERROR, "moe plan: the device reports no multiprocessors");
    }
    k3_table_moe tuning;
    K3_TRY(k3_moe_ctx_tuning(ctx, &tuning));
    const k3_moe_desc *d = &p->cpu.d;
    p->launch = (k3_moe_launch *)calloc((size_t)d->max_tokens + 1, sizeof *p->launch);
    if (!p->launch) return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "moe plan: out of host memory");
    for (int64_t m = 1; m <= d->max_tokens; m++) K3_TRY(k3_moe_launch_resolve(ctx, d, sms, &tuning, m, &p->launch[m]));
    return K3_STATUS_SUCCESS;
}

k3_status k3_moe_plan_create(k3_ctx *ctx, const k3_moe_desc *d, k3_moe_plan **out) {
    if (!ctx) return K3_STATUS_INVALID_ARGUMENT;
    k3_clear_error(ctx);
    K3_CHECK_ARG(ctx, out != NULL, "moe plan: out is NULL");
    *out = NULL;
    K3_CHECK_ARG(ctx, d != NULL, "moe plan: descriptor is NULL");
    K3_TRY(k3_moe_desc_check(ctx, d, "moe plan"));
#ifndef K3_HAVE_CUDA
    if (ctx->backend != K3_BACKEND_CPU)
        return k3_fail(ctx, K3_STATUS_UNSUPPORTED, "moe plan: this build has no CUDA MoE backend");
#endif
    k3_moe_plan *p = (k3_moe_plan *)calloc(1, sizeof *p);
    if (!p) return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "moe plan: out of host memory");
    k3_status st = k3_cpu_moe_prepare(&p->cpu, d);
    if (st != K3_STATUS_SUCCESS) {
        free(p);
        return k3_fail(ctx, st, "moe plan: cannot size the block scales (%s)", k3_status_string(st));
    }
    p->ctx = ctx;
    p->ws_bytes = k3_cpu_moe_workspace_size(&p->cpu);
#ifdef K3_HAVE_CUDA
    if (ctx->backend != K3_BACKEND_CPU) {
        st = k3_cuda_moe_prepare(ctx, &p->cuda, d);
        if (st != K3_STATUS_SUCCESS) {
            free(p);
            return st; /* the message is set */
        }
        p->is_cuda = 1;
        p->ws_bytes = k3_cuda_moe_ws_bytes(&p->cuda);
    }
#endif
    /* with an expert map, the run's local ids follow the backend's part of the workspace (16-byte aligned) */
    p->ws_backend = p->ws_bytes;
    if (d->global_experts > 0) p->ws_bytes += 16 + (size_t)d->max_tokens * (size_t)d->top_k * sizeof(int32_t);
    st = moe_plan_launches(ctx, p);
    if (st != K3_STATUS_SUCCESS) {
        k3_moe_plan_destroy(p);
        return st;
    }
    *out = p;
    return K3_STATUS_SUCCESS;
}

void k3_moe_plan_destroy(k3_moe_plan *plan) {
    if (!plan) return;
    free(plan->launch);
    free(plan);
}

const k3_moe_launch *k3_moe_plan_launch(const k3_moe_plan *plan, int64_t m) {
    if (!plan || !plan->launch || m < 1 || m > plan->cpu.d.max_tokens) return NULL;
    return &plan->launch[m];
}

k3_status k3_moe_plan_kernel(const k3_moe_plan *plan, int64_t m, k3_moe_launch_info *out) {
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    k3_ctx *ctx = plan->ctx;
    k3_clear_error(ctx);
    K3_CHECK_ARG(ctx, out != NULL, "moe plan kernel: out is NULL");
    K3_CHECK_ARG(ctx, m >= 1 && m <= plan->cpu.d.max_tokens,
                 "moe plan kernel: m must be in [1, max_tokens = %lld] (got %lld)", (long long)plan->cpu.d.max_tokens,
                 (long long)m);
    if (plan->launch) {
        k3_moe_launch_describe(&plan->launch[m], out);
    } else {
        memset(out, 0, sizeof *out);
        snprintf(out->gemm1, sizeof out->gemm1, "cpu");
        snprintf(out->gemm2, sizeof out->gemm2, "cpu");
    }
    return K3_STATUS_SUCCESS;
}

k3_status k3_moe_workspace_size(const k3_moe_plan *plan, size_t *out_bytes) {
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    k3_clear_error(plan->ctx);
    K3_CHECK_ARG(plan->ctx, out_bytes != NULL, "moe workspace size: out_bytes is NULL");
    *out_bytes = plan->ws_bytes;
    return K3_STATUS_SUCCESS;
}

k3_status k3_moe_run(k3_moe_plan *plan, int64_t m, const void *x, const int32_t *topk_ids, const float *topk_weights,
                     const k3_moe_weights *w, void *out, float *out_f32, void *ws, size_t ws_bytes, void *stream) {
    (void)stream; /* ignored by the CPU backend, which runs synchronously on the caller's thread */
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    k3_ctx *ctx = plan->ctx;
    const k3_moe_desc *d = &plan->cpu.d;
    k3_clear_error(ctx);
    K3_CHECK_ARG(ctx, m <= d->max_tokens,
                 "moe run: too many tokens for this plan: m = %lld, the plan was made for max_tokens = %lld (plan for "
                 "M, or run the batch in pieces of at most max_tokens)",
                 (long long)m, (long long)d->max_tokens);
    K3_CHECK_ARG(ctx, m >= 1 && m <= d->max_tokens, "moe run: m must be in [1, max_tokens = %lld] (got %lld)",
                 (long long)d->max_tokens, (long long)m);
    K3_CHECK_ARG(ctx, x != NULL, "moe run: x is NULL");
    K3_CHECK_ARG(ctx, topk_ids != NULL, "moe run: topk_ids is NULL");
    K3_CHECK_ARG(ctx, topk_weights != NULL, "moe run: topk_weights is NULL");
    K3_CHECK_ARG(ctx, out != NULL, "moe run: out is NULL");
    K3_TRY(k3_moe_weights_check(ctx, d, w, "moe run"));
    K3_CHECK_ARG(ctx, k3_aligned(x, 2), "moe run: x (%p) is not 2-byte aligned (BF16)", x);
    K3_CHECK_ARG(ctx, k3_aligned(topk_ids, 4), "moe run: topk_ids (%p) is not 4-byte aligned (int32)",
                 (const void *)topk_ids);
    K3_CHECK_ARG(ctx, k3_aligned(topk_weights, 4), "moe run: topk_weights (%p) is not 4-byte aligned (F32)",
                 (const void *)topk_weights);
    K3_CHECK_ARG(ctx, k3_aligned(out, 2), "moe run: out (%p) is not 2-byte aligned (BF16)", out);
    K3_CHECK_ARG(ctx, k3_aligned(out_f32, 4), "moe run: out_f32 (%p) is not 4-byte aligned (F32)", (void *)out_f32);
    K3_CHECK_ARG(ctx, ws_bytes >= plan->ws_bytes,
                 "moe run: ws_bytes is %zu, the plan needs %zu (k3_moe_workspace_size)", ws_bytes, plan->ws_bytes);
    K3_CHECK_ARG(ctx, ws != NULL, "moe run: ws is NULL (the plan needs %zu bytes)", plan->ws_bytes);
    /* ids are not checked: one outside [0, E) (-1 for an expert on another rank) contributes nothing, on both
     * backends (device ids could not be read without a sync) */
    if (d->global_experts > 0) { /* global ids -> this rank's, into the workspace's tail */
        int32_t *local = (int32_t *)(((uintptr_t)ws + plan->ws_backend + 15u) & ~(uintptr_t)15u);
        const int32_t np = (int32_t)(m * d->top_k);
#ifdef K3_HAVE_CUDA
        if (plan->is_cuda)
            K3_TRY(k3_cuda_moe_map_ids_launch(ctx, topk_ids, np, w->expert_map, d->global_experts, local, stream));
        else
#endif
            k3_cpu_moe_map_ids(topk_ids, np, w->expert_map, d->global_experts, local);
        topk_ids = local;
    }
#ifdef K3_HAVE_CUDA
    if (plan->is_cuda)
        return k3_cuda_moe_run(ctx, &plan->cuda, &plan->launch[m], m, x, topk_ids, topk_weights, w, out, out_f32, ws,
                               stream);
#endif
    k3_cpu_moe_run(&plan->cpu, m, (const uint16_t *)x, topk_ids, topk_weights, w, (uint16_t *)out, out_f32, ws);
    return K3_STATUS_SUCCESS;
}
