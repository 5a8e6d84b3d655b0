/* The public router API: descriptor defaults, plan validation, run-time checks, dispatch to the backend. */
#include "core/internal.h"
#include "api/ptr_align.h"
#include "api/router_internal.h"
#include "cpu/cpu.h"
#include "cuda/common/fork_join.h"
#include "cuda/common/ptr_check.h"
#include "cuda/router/router.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Bounds that keep every size computation far from overflow: E * H gate elements < 2^36, max_tokens * E
 * logits < 2^28 (the CUDA workspace), max_tokens * H elements of x < 2^40. */
#define K3_ROUTER_MAX_EXPERTS 4096
#define K3_ROUTER_MAX_TOPK 32
#define K3_ROUTER_MAX_TOKENS 65536
#define K3_ROUTER_MAX_HIDDEN (INT64_C(1) << 24)
#define K3_ROUTER_WS_ALIGN ((size_t)64) /* the CPU scratch starts at the caller's first aligned byte */

struct k3_router_plan {
    k3_ctx *ctx;
    k3_router_desc desc;
    int32_t is_cuda; /* CUDA context: the kernels of src/cuda/router/ (logits.cu, select.cu), logits in the workspace */
    size_t ws_bytes; /* CPU: one token's [E] logits in the caller's workspace, so plans are reentrant */
    size_t cuda_smem_max; /* CUDA: the shared memory per block the logits kernels may ask for on the plan's device */
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
    K3_CHECK_ARG(ctx, d->hidden >= 1 && d->hidden <= K3_ROUTER_MAX_HIDDEN,
                 "router hidden must be in [1, %lld] (got %lld)", (long long)K3_ROUTER_MAX_HIDDEN,
                 (long long)d->hidden);
    K3_CHECK_ARG(ctx, d->gate_dtype == K3_DTYPE_BF16 || d->gate_dtype == K3_DTYPE_F32,
                 "router gate_dtype %d is unknown (expected K3_DTYPE_BF16 or K3_DTYPE_F32)", (int)d->gate_dtype);
    K3_CHECK_ARG(ctx, d->renormalize == 0 || d->renormalize == 1, "router renormalize must be 0 or 1 (got %d)",
                 (int)d->renormalize);
    K3_CHECK_ARG(ctx, isfinite(d->scaling_factor) && d->scaling_factor > 0.0f,
                 "router scaling_factor must be finite and > 0 (got %g)", (double)d->scaling_factor);
    K3_CHECK_ARG(ctx, d->max_tokens >= 1 && d->max_tokens <= K3_ROUTER_MAX_TOKENS,
                 "router max_tokens must be in [1, %d] (got %lld)", K3_ROUTER_MAX_TOKENS, (long long)d->max_tokens);
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
    size_t ws_bytes = 0, smem_max = 0;
    if (ctx->backend == K3_BACKEND_CPU) {
        ws_bytes = (size_t)d->num_experts * sizeof(float) + K3_ROUTER_WS_ALIGN; /* E <= 4096: no overflow */
    }
#ifdef K3_HAVE_CUDA
    else {
        ws_bytes = k3_cuda_router_ws_bytes(d);
        if (ws_bytes == SIZE_MAX)
            return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT,
                           "router plan: the workspace of max_tokens %lld x num_experts %d logits overflows size_t",
                           (long long)d->max_tokens, (int)d->num_experts);
        K3_TRY(k3_cuda_router_prepare(ctx, d, &smem_max));
    }
#endif
    k3_router_plan *p = (k3_router_plan *)calloc(1, sizeof *p);
    if (!p) return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "router plan: out of host memory");
    p->ctx = ctx;
    p->desc = *d;
    p->is_cuda = ctx->backend != K3_BACKEND_CPU;
    p->ws_bytes = ws_bytes;
    p->cuda_smem_max = smem_max;
    *out = p;
    return K3_STATUS_SUCCESS;
}

void k3_router_plan_destroy(k3_router_plan *plan) {
    free(plan);
}

k3_status k3_router_workspace_size(const k3_router_plan *plan, size_t *out_bytes) {
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    k3_clear_error(plan->ctx);
    K3_CHECK_ARG(plan->ctx, out_bytes != NULL, "router workspace size: out_bytes is NULL");
    *out_bytes = plan->ws_bytes;
    return K3_STATUS_SUCCESS;
}

/* Every run-time rule of k3_router_run (the message on the plan's context). */
static k3_status router_run_check(const k3_router_plan *plan, int64_t m, const void *x, const void *gate,
                                  const float *bias, const int32_t *topk_ids, const float *topk_weights,
                                  const void *ws, size_t ws_bytes) {
    k3_ctx *ctx = plan->ctx;
    const k3_router_desc *d = &plan->desc;
    K3_CHECK_ARG(ctx, m <= d->max_tokens,
                 "router run: too many tokens for this plan: m = %lld, the plan was made for max_tokens = %lld (plan for "
                 "M, or run the batch in pieces of at most max_tokens)",
                 (long long)m, (long long)d->max_tokens);
    K3_CHECK_ARG(ctx, m >= 1 && m <= d->max_tokens, "router run: m must be in [1, max_tokens = %lld] (got %lld)",
                 (long long)d->max_tokens, (long long)m);
    K3_CHECK_ARG(ctx, x != NULL, "router run: x is NULL");
    K3_CHECK_ARG(ctx, gate != NULL, "router run: gate is NULL");
    K3_CHECK_ARG(ctx, topk_ids != NULL, "router run: topk_ids is NULL");
    K3_CHECK_ARG(ctx, topk_weights != NULL, "router run: topk_weights is NULL");
    /* refuse rather than ignore: a caller passing a bias to a softmax router expects it to matter */
    K3_CHECK_ARG(ctx, bias == NULL || d->kind == K3_ROUTER_SIGMOID_NOAUX_TC,
                 "router run: bias is only used by SIGMOID_NOAUX_TC; pass NULL for a SOFTMAX router");
    /* the tensors are read and written as their element types: a misaligned pointer would be undefined */
    const size_t gate_align = d->gate_dtype == K3_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
    K3_CHECK_ARG(ctx, k3_aligned(x, sizeof(uint16_t)), "router run: x (%p) is not 2-byte aligned (BF16)", x);
    K3_CHECK_ARG(ctx, k3_aligned(gate, gate_align), "router run: gate (%p) is not %zu-byte aligned (%s)", gate,
                 gate_align, d->gate_dtype == K3_DTYPE_F32 ? "F32" : "BF16");
    K3_CHECK_ARG(ctx, k3_aligned(bias, sizeof(float)), "router run: bias (%p) is not 4-byte aligned (F32)",
                 (const void *)bias);
    K3_CHECK_ARG(ctx, k3_aligned(topk_ids, sizeof(int32_t)), "router run: topk_ids (%p) is not 4-byte aligned (int32)",
                 (void *)topk_ids);
    K3_CHECK_ARG(ctx, k3_aligned(topk_weights, sizeof(float)),
                 "router run: topk_weights (%p) is not 4-byte aligned (F32)", (void *)topk_weights);
    K3_CHECK_ARG(ctx, ws_bytes >= plan->ws_bytes,
                 "router run: ws_bytes is %zu, the plan needs %zu (k3_router_workspace_size)", ws_bytes,
                 plan->ws_bytes);
    K3_CHECK_ARG(ctx, ws != NULL, "router run: ws is NULL (the plan needs %zu bytes, k3_router_workspace_size)",
                 plan->ws_bytes);
    return K3_STATUS_SUCCESS;
}

k3_status k3_router_run(k3_router_plan *plan, int64_t m, const void *x, const void *gate, const float *bias,
                        int32_t *topk_ids, float *topk_weights, void *ws, size_t ws_bytes, void *stream) {
    int forked;
    return k3_router_run_split(plan, m, x, gate, bias, topk_ids, topk_weights, ws, ws_bytes, stream, NULL, &forked);
}

k3_status k3_router_run_split(k3_router_plan *plan, int64_t m, const void *x, const void *gate, const float *bias,
                              int32_t *topk_ids, float *topk_weights, void *ws, size_t ws_bytes, void *stream,
                              struct k3_fork_join *select_fj, int *forked) {
    *forked = 0;
    if (!plan) return K3_STATUS_INVALID_ARGUMENT;
    k3_ctx *ctx = plan->ctx;
    const k3_router_desc *d = &plan->desc;
    k3_clear_error(ctx);
    K3_TRY(router_run_check(plan, m, x, gate, bias, topk_ids, topk_weights, ws, ws_bytes));
#ifdef K3_HAVE_CUDA
    if (plan->is_cuda) {
        const void *ptrs[] = {x, gate, bias, topk_ids, topk_weights, ws};
        const char *names[] = {"x", "gate", "bias", "topk_ids", "topk_weights", "ws"};
        K3_TRY(k3_cuda_check_device_ptrs(ctx, stream, "router run", 6, ptrs, names));
        K3_TRY(k3_cuda_router_run_logits(ctx, d, plan->cuda_smem_max, m, x, gate, ws, stream));
        void *select_stream = stream;
        if (select_fj) {
            K3_TRY(k3_fork_join_fork(ctx, select_fj, stream));
            *forked = 1;
            select_stream = k3_fork_join_aux(select_fj);
        }
        return k3_cuda_router_run_select(ctx, d, m, bias, topk_ids, topk_weights, ws, select_stream);
    }
#endif
    K3_CHECK_ARG(ctx, select_fj == NULL, "router run: a second stream for the selection needs a CUDA context");
    const uintptr_t at = ((uintptr_t)ws + (K3_ROUTER_WS_ALIGN - 1)) & ~(uintptr_t)(K3_ROUTER_WS_ALIGN - 1);
    float *scratch = (float *)(void *)at;
    k3_cpu_router(d, m, (const uint16_t *)x, gate, bias, topk_ids, topk_weights, scratch);
    return K3_STATUS_SUCCESS;
}
