/* The public latent-MoE block API: descriptor defaults, plan validation, run-time checks, and the dispatch to the
 * CPU block (src/cpu/latent.c) or the CUDA composition (src/api/latent_gpu.c). */
#include "api/moe_internal.h"
#include "api/latent_gpu.h"
#include "api/ptr_align.h"
#include "core/act.h"
#include "core/act_check.h"
#include "plan/latent_tuning.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K3_LATENT_MAX_DIM (INT64_C(1) << 24)
#define K3_LATENT_MAX_RANKS 1024


struct k3_latent_moe_plan {
    k3_ctx *ctx;
    k3_cpu_latent cpu;      /* cpu.d is the validated descriptor on every backend */
    k3_latent_gpu *gpu;     /* CUDA contexts only (NULL on CPU): src/api/latent_gpu.c */
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
    d->parallel.layout = K3_PARALLEL_NONE;
    d->parallel.rank = 0;
    d->parallel.size = 1;
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
    if (d->experts.global_experts > 0)
        K3_CHECK_ARG(ctx, d->router.num_experts == d->experts.global_experts,
                     "latent plan: router.num_experts (%d) must equal experts.global_experts (%d): the router chooses "
                     "among every rank's experts",
                     (int)d->router.num_experts, (int)d->experts.global_experts);
    else
        K3_CHECK_ARG(ctx, d->router.num_experts == d->experts.num_experts,
                     "latent plan: router.num_experts (%d) must equal experts.num_experts (%d)",
                     (int)d->router.num_experts, (int)d->experts.num_experts);
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
    const k3_parallel_desc *pd = &d->parallel;
    K3_CHECK_ARG(ctx, pd->layout == K3_PARALLEL_NONE || pd->layout == K3_PARALLEL_TP || pd->layout == K3_PARALLEL_EP,
                 "latent plan: parallel.layout must be K3_PARALLEL_NONE, _TP or _EP (got %d)", (int)pd->layout);
    K3_CHECK_ARG(ctx, pd->layout != K3_PARALLEL_EP || d->experts.global_experts > 0,
                 "latent plan: an EP rank needs experts.global_experts (the router's expert count) and an expert_map in "
                 "its weights");
    K3_CHECK_ARG(ctx, !pd->nccl_comm || pd->layout != K3_PARALLEL_NONE,
                 "latent plan: parallel.nccl_comm is for a TP or EP layout (layout is NONE)");
    K3_CHECK_ARG(ctx, !pd->nccl_comm || ctx->backend != K3_BACKEND_CPU,
                 "latent plan: parallel.nccl_comm needs a CUDA context (on the CPU backend, run the stages and sum the "
                 "partials)");
    K3_CHECK_ARG(ctx, d->schedule >= K3_LATENT_SCHEDULE_AUTO && d->schedule <= K3_LATENT_SCHEDULE_LAST,
                 "latent plan: schedule must be a k3_latent_schedule (AUTO, SHARED_BESIDE, ROUTER_BESIDE, SERIAL, "
                 "SELECT_BESIDE or LOGITS_FIRST; got %d)",
                 (int)d->schedule);
    K3_CHECK_ARG(ctx, pd->tokens == K3_TOKENS_REPLICATED || pd->tokens == K3_TOKENS_PER_RANK,
                 "latent plan: parallel.tokens must be K3_TOKENS_REPLICATED or K3_TOKENS_PER_RANK (got %d)",
                 (int)pd->tokens);
    /* one rank of NONE already sees all its tokens: PER_RANK names a split, so it belongs to TP or EP */
    K3_CHECK_ARG(ctx, pd->tokens != K3_TOKENS_PER_RANK || pd->layout != K3_PARALLEL_NONE,
                 "latent plan: parallel.tokens PER_RANK is for a TP or EP layout (layout is NONE; a TP or EP plan of "
                 "size 1 takes it)");
    if (pd->layout == K3_PARALLEL_NONE)
        K3_CHECK_ARG(ctx, pd->rank == 0 && pd->size == 1,
                     "latent plan: parallel.layout NONE means rank 0 of size 1 (got rank %d of size %d)",
                     (int)pd->rank, (int)pd->size);
    else
        K3_CHECK_ARG(ctx, pd->size >= 1 && pd->size <= K3_LATENT_MAX_RANKS && pd->rank >= 0 && pd->rank < pd->size,
                     "latent plan: parallel needs 1 <= size <= %d and 0 <= rank < size (got rank %d of size %d)",
                     K3_LATENT_MAX_RANKS, (int)pd->rank, (int)pd->size);
    K3_CHECK_ARG(ctx, pd->tokens != K3_TOKENS_PER_RANK || d->max_tokens >= pd->size,
                 "latent plan: parallel.tokens PER_RANK runs on the size * m gathered tokens, so max_tokens (%lld) must "
                 "be at least size (%d)",
                 (long long)d->max_tokens, (int)pd->size);
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
        st = k3_latent_gpu_create(ctx, &dd, &p->gpu);
        if (st != K3_STATUS_SUCCESS) {
            free(p);
            return st; /* the message is set */
        }
        p->ws_bytes = k3_latent_gpu_ws_bytes(p->gpu);
    }
#endif
    *out = p;
    return K3_STATUS_SUCCESS;
}

void k3_latent_moe_plan_destroy(k3_latent_moe_plan *plan) {
    if (!plan) return;
#ifdef K3_HAVE_CUDA
    k3_latent_gpu_destroy(plan->gpu);
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

/* What a call reads and writes: the whole block (PRE | POST) or one stage. */
enum { LAT_PRE = 1, LAT_POST = 2, LAT_ALL = 3 };

/* The run-time checks of k3_latent_moe_run and k3_latent_moe_run_stage (what = "latent run" or "latent stage"). */
static k3_status latent_check_run(k3_latent_moe_plan *plan, const char *what, int parts, int64_t m, const void *x,
                                  const k3_latent_moe_weights *w, const void *residual, const void *y,
                                  const float *partial, const int32_t *topk_ids, const float *topk_weights,
                                  const void *ws, size_t ws_bytes) {
    k3_ctx *ctx = plan->ctx;
    const k3_latent_moe_desc *d = &plan->cpu.d;
    const int pre = (parts & LAT_PRE) != 0, post = (parts & LAT_POST) != 0;
    K3_CHECK_ARG(ctx, m <= d->max_tokens,
                 "%s: too many tokens for this plan: m = %lld, the plan was made for max_tokens = %lld (plan for "
                 "M, or run the batch in pieces of at most max_tokens)",
                 what, (long long)m, (long long)d->max_tokens);
    K3_CHECK_ARG(ctx, m >= 1 && m <= d->max_tokens, "%s: m must be in [1, max_tokens = %lld] (got %lld)", what,
                 (long long)d->max_tokens, (long long)m);
    K3_CHECK_ARG(ctx, !pre || x != NULL, "%s: x is NULL", what);
    K3_CHECK_ARG(ctx, !post || y != NULL, "%s: y is NULL", what);
    K3_CHECK_ARG(ctx, parts == LAT_ALL || partial != NULL, "%s: partial is NULL (k3_latent_moe_partial_count floats)",
                 what);
    K3_CHECK_ARG(ctx, w != NULL, "%s: weights is NULL", what);
    if (pre) {
        K3_CHECK_ARG(ctx, w->gate != NULL, "%s: weights gate is NULL", what);
        K3_CHECK_ARG(ctx, w->bias == NULL || d->router.kind == K3_ROUTER_SIGMOID_NOAUX_TC,
                     "%s: weights bias is only used by SIGMOID_NOAUX_TC; pass NULL for a SOFTMAX router", what);
        K3_CHECK_ARG(ctx, w->down_proj != NULL, "%s: weights down_proj is NULL", what);
        if (d->shared_inter > 0) {
            K3_CHECK_ARG(ctx, w->shared_gate_up != NULL, "%s: weights shared_gate_up is NULL (shared_inter is %lld)",
                         what, (long long)d->shared_inter);
            K3_CHECK_ARG(ctx, w->shared_down != NULL, "%s: weights shared_down is NULL (shared_inter is %lld)", what,
                         (long long)d->shared_inter);
        }
        char where[64];
        snprintf(where, sizeof where, "%s: experts", what);
        K3_TRY(k3_moe_weights_check(ctx, &d->experts, &w->experts, where));
    }
    if (post) {
        K3_CHECK_ARG(ctx, w->norm != NULL, "%s: weights norm is NULL", what);
        K3_CHECK_ARG(ctx, w->up_proj != NULL, "%s: weights up_proj is NULL", what);
    }
    {
        /* every tensor is read or written as its element type (the workspace is aligned inside) */
        const size_t gate_align = d->router.gate_dtype == K3_DTYPE_F32 ? 4 : 2;
        const int shared = pre && d->shared_inter > 0;
        const struct {
            const void *p;
            size_t align;
            const char *name;
        } ptrs[] = {{pre ? x : NULL, 2, "x"},
                    {post ? y : NULL, 2, "y"},
                    {post ? residual : NULL, 2, "residual"},
                    {partial, 4, "partial"},
                    {pre ? topk_ids : NULL, 4, "topk_ids"},
                    {pre ? topk_weights : NULL, 4, "topk_weights"},
                    {pre ? w->gate : NULL, gate_align, "weights gate"},
                    {pre ? w->bias : NULL, 4, "weights bias"},
                    {pre ? w->down_proj : NULL, 2, "weights down_proj"},
                    {post ? w->norm : NULL, 2, "weights norm"},
                    {post ? w->up_proj : NULL, 2, "weights up_proj"},
                    {shared ? w->shared_gate_up : NULL, 2, "weights shared_gate_up"},
                    {shared ? w->shared_down : NULL, 2, "weights shared_down"}};
        for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
            K3_CHECK_ARG(ctx, k3_aligned(ptrs[i].p, ptrs[i].align), "%s: %s (%p) is not %zu-byte aligned", what,
                         ptrs[i].name, ptrs[i].p, ptrs[i].align);
    }
    K3_CHECK_ARG(ctx, ws_bytes >= plan->ws_bytes, "%s: ws_bytes is %zu, the plan needs %zu (k3_latent_moe_workspace_size)",
                 what, ws_bytes, plan->ws_bytes);
    K3_CHECK_ARG(ctx, ws != NULL, "%s: ws is NULL (the plan needs %zu bytes)", what, plan->ws_bytes);
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
#ifdef K3_HAVE_CUDA
    const int reduces = plan->gpu && k3_latent_gpu_reduces(plan->gpu);
#else
    const int reduces = 0;
#endif
    if (d->parallel.tokens == K3_TOKENS_PER_RANK) {
        /* the block runs on the gathered tokens: they are what max_tokens counts (an m outside [1, max_tokens] is
         * refused below; inside it, m * size <= 2^26 cannot overflow) */
        const int64_t gathered = m >= 1 && m <= d->max_tokens ? m * (int64_t)d->parallel.size : 0;
        K3_CHECK_ARG(ctx, gathered <= d->max_tokens,
                     "latent run: too many tokens for this plan: %d ranks of m = %lld tokens gather %lld, the plan "
                     "was made for max_tokens = %lld (it counts the gathered tokens: plan for size * m, or run the "
                     "batch in pieces of at most max_tokens / size per rank)",
                     (int)d->parallel.size, (long long)m, (long long)gathered, (long long)d->max_tokens);
    }
    K3_CHECK_ARG(ctx, d->parallel.size == 1 || reduces,
                 "latent run: this plan is rank %d of %d without a communicator: its u is a partial sum, which the norm "
                 "must not see; run k3_latent_moe_run_stage PRE_REDUCE, sum the partials across the ranks, then "
                 "POST_REDUCE (or give the plan parallel.nccl_comm)",
                 (int)d->parallel.rank, (int)d->parallel.size);
    K3_TRY(latent_check_run(plan, "latent run", LAT_ALL, m, x, w, residual, y, NULL, topk_ids, topk_weights, ws,
                            ws_bytes));
#ifdef K3_HAVE_CUDA
    if (reduces)
        return k3_latent_gpu_run_reduced(ctx, plan->gpu, d, m, x, w, residual, y, topk_ids, topk_weights, ws, stream);
    if (plan->gpu)
        return k3_latent_gpu_run(ctx, plan->gpu, d, m, x, w, residual, y, topk_ids, topk_weights, ws, stream);
#endif
    k3_cpu_latent_run(&plan->cpu, m, (const uint16_t *)x, w, (const uint16_t *)residual, (uint16_t *)y, topk_ids,
                      topk_weights, ws, NULL, NULL);
    return K3_STATUS_SUCCESS;
}

k3_status k3_latent_moe_partial_count(const k3_latent_moe_plan *plan, int64_t m, size_t *out_count) {
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    const k3_latent_moe_desc *d = &plan->cpu.d;
    k3_clear_error(plan->ctx);
    K3_CHECK_ARG(plan->ctx, out_count != NULL, "latent partial count: out_count is NULL");
    K3_CHECK_ARG(plan->ctx, m >= 1 && m <= d->max_tokens,
                 "latent partial count: m must be in [1, max_tokens = %lld] (got %lld)", (long long)d->max_tokens,
                 (long long)m);
    /* m <= 65536 and the widths <= 2^24: no overflow */
    *out_count = k3_latent_partial_floats(d, m);
    return K3_STATUS_SUCCESS;
}

k3_status k3_latent_moe_plan_schedule_at(const k3_latent_moe_plan *plan, int64_t m, k3_latent_schedule *out) {
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    k3_clear_error(plan->ctx);
    K3_CHECK_ARG(plan->ctx, out != NULL, "latent plan schedule: out is NULL");
    K3_CHECK_ARG(plan->ctx, m >= 1 && m <= plan->cpu.d.max_tokens,
                 "latent plan schedule: m must be in [1, max_tokens = %lld] (got %lld)",
                 (long long)plan->cpu.d.max_tokens, (long long)m);
#ifdef K3_HAVE_CUDA
    if (plan->gpu) {
        *out = k3_latent_gpu_schedule(plan->gpu, m);
        return K3_STATUS_SUCCESS;
    }
#endif
    *out = K3_LATENT_SCHEDULE_SERIAL; /* the CPU backend runs the parts in one order */
    return K3_STATUS_SUCCESS;
}

k3_status k3_latent_moe_plan_schedule(const k3_latent_moe_plan *plan, k3_latent_schedule *out) {
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    return k3_latent_moe_plan_schedule_at(plan, plan->cpu.d.max_tokens, out);
}

k3_status k3_latent_moe_run_stage(k3_latent_moe_plan *plan, k3_latent_stage stage, int64_t m, const void *x,
                                  const k3_latent_moe_weights *w, const void *residual, void *y, float *partial,
                                  int32_t *topk_ids, float *topk_weights, void *ws, size_t ws_bytes, void *stream) {
    (void)stream;
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    k3_ctx *ctx = plan->ctx;
    k3_clear_error(ctx);
    K3_CHECK_ARG(ctx, stage == K3_LATENT_PRE_REDUCE || stage == K3_LATENT_POST_REDUCE,
                 "latent stage: stage must be K3_LATENT_PRE_REDUCE or K3_LATENT_POST_REDUCE (got %d)", (int)stage);
    const int parts = stage == K3_LATENT_PRE_REDUCE ? LAT_PRE : LAT_POST;
    K3_TRY(latent_check_run(plan, "latent stage", parts, m, x, w, residual, y, partial, topk_ids, topk_weights, ws,
                            ws_bytes));
#ifdef K3_HAVE_CUDA
    if (plan->gpu)
        return parts == LAT_PRE
                   ? k3_latent_gpu_run_pre(ctx, plan->gpu, &plan->cpu.d, m, x, w, partial, topk_ids, topk_weights,
                                           ws, stream)
                   : k3_latent_gpu_run_post(ctx, plan->gpu, &plan->cpu.d, m, partial, w, residual, y, ws, stream);
#endif
    if (parts == LAT_PRE)
        k3_cpu_latent_run_pre(&plan->cpu, m, (const uint16_t *)x, w, partial, topk_ids, topk_weights, ws);
    else
        k3_cpu_latent_run_post(&plan->cpu, m, partial, w, (const uint16_t *)residual, (uint16_t *)y, ws);
    return K3_STATUS_SUCCESS;
}

const k3_cpu_latent *k3_latent_moe_plan_cpu(const k3_latent_moe_plan *plan) { return plan ? &plan->cpu : NULL; }
