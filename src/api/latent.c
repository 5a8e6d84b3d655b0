/* The public latent-MoE block API: descriptor defaults, plan validation, run-time checks, CPU dispatch, and
 * the block's composition on CUDA contexts (sub-plans, workspace layout, launch order, the shared branch's
 * fork/join). */
#include "api/moe_internal.h"
#include "api/ptr_align.h"
#include "comm/nccl.h"
#include "core/act.h"
#include "core/act_check.h"
#ifdef K3_HAVE_CUDA
#include "cuda/common/fork_join.h"
#include "cuda/gemm/cublaslt.h"
#include "cuda/latent/kernels.h"
#include "cuda/common/ptr_check.h"
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K3_LATENT_MAX_DIM (INT64_C(1) << 24)
#define K3_LATENT_MAX_RANKS 1024

struct latent_gpu; /* CUDA builds: the composed block, below */

struct k3_latent_moe_plan {
    k3_ctx *ctx;
    k3_cpu_latent cpu;      /* cpu.d is the validated descriptor on every backend */
    struct latent_gpu *gpu; /* CUDA contexts only (NULL on CPU) */
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
    if (pd->layout == K3_PARALLEL_NONE)
        K3_CHECK_ARG(ctx, pd->rank == 0 && pd->size == 1,
                     "latent plan: parallel.layout NONE means rank 0 of size 1 (got rank %d of size %d)",
                     (int)pd->rank, (int)pd->size);
    else
        K3_CHECK_ARG(ctx, pd->size >= 1 && pd->size <= K3_LATENT_MAX_RANKS && pd->rank >= 0 && pd->rank < pd->size,
                     "latent plan: parallel needs 1 <= size <= %d and 0 <= rank < size (got rank %d of size %d)",
                     K3_LATENT_MAX_RANKS, (int)pd->rank, (int)pd->size);
    return K3_STATUS_SUCCESS;
}

#ifdef K3_HAVE_CUDA
/*
 * The block on a CUDA context, in the CPU block's order (src/cpu/latent.c) with the same rounding points:
 *   main stream:  router -> down = bf16(x W_down^T) -> experts (fp32 sum u) -> RMSNorm -> up = bf16(v W_up^T)
 *   aux stream:   shared gate_up = bf16(x W_gu^T) -> bf16(act) -> s = bf16(a W_sd^T)
 *   join, then    y = bf16((up + s) + residual)
 * The BF16 projections go through linear plans, the routed experts through a MoE plan, the router through a
 * router plan; the three elementwise steps are the kernels of src/cuda/latent/kernels.cu. The shared branch
 * depends on x alone, so it runs concurrently with the routed path, forked and joined by events and an aux stream
 * made at plan time (capturable: no allocation, no sync, no host decision at run time).
 */
#define LATENT_WS_ALIGN ((size_t)256)

static size_t latent_align_up(size_t v) { return (v + (LATENT_WS_ALIGN - 1)) & ~(LATENT_WS_ALIGN - 1); }

struct latent_gpu {
    int64_t sr; /* rows of shared_gate_up */
    k3_router_plan *router;
    k3_moe_plan *moe;
    k3_linear_plan *down, *up, *sgu, *sdown;
    k3_lt_plan *sdown_f32; /* the shared down projection with fp32 output: a rank's partial (the stage API) */
    k3_nccl *nccl;         /* the caller's communicator (library-driven TP), or NULL */
    size_t partial_count;  /* floats of the partial at max_tokens */
    k3_fork_join *fj;
    size_t ws_router, ws_moe, ws_down, ws_up, ws_sgu, ws_sdown, ws_sdown_f32;
    /* offsets into the workspace, from its first LATENT_WS_ALIGN-aligned byte */
    size_t o_ids, o_wts, o_router, o_xl, o_u, o_mo, o_moe, o_v, o_z, o_g, o_a, o_s, o_down, o_up, o_sgu, o_sdown,
        o_sdown_f32, o_partial, total;
};

static void latent_gpu_destroy(struct latent_gpu *p) {
    if (!p) return;
    k3_router_plan_destroy(p->router);
    k3_moe_plan_destroy(p->moe);
    k3_linear_plan_destroy(p->down);
    k3_linear_plan_destroy(p->up);
    k3_linear_plan_destroy(p->sgu);
    k3_linear_plan_destroy(p->sdown);
    k3_lt_plan_destroy(p->sdown_f32);
    k3_nccl_close(p->nccl);
    k3_fork_join_destroy(p->fj);
    free(p);
}

static k3_status latent_make_linear(k3_ctx *ctx, int64_t n, int64_t k, int64_t max_m, k3_linear_plan **plan,
                                    size_t *ws, const char *what) {
    k3_linear_desc ld;
    k3_linear_desc_init(&ld, n, k);
    ld.max_m = max_m;
    k3_status st = k3_linear_plan_create(ctx, &ld, plan);
    if (st == K3_STATUS_SUCCESS) st = k3_linear_workspace_size(*plan, ws);
    if (st != K3_STATUS_SUCCESS) {
        char msg[K3_ERROR_MAX];
        memcpy(msg, ctx->last_error, sizeof msg);
        return k3_fail(ctx, st, "latent plan: %s projection: %s", what, msg);
    }
    return K3_STATUS_SUCCESS;
}

/* d: validated, its router and experts max_tokens equal to the block's. */
static k3_status latent_gpu_create(k3_ctx *ctx, const k3_latent_moe_desc *d, struct latent_gpu **out) {
    *out = NULL;
    if (d->max_tokens > 32)
        return k3_fail(ctx, K3_STATUS_UNSUPPORTED,
                       "latent plan: the CUDA block runs up to 32 tokens (its BF16 projections use the linear plan, "
                       "max_m <= 32); got max_tokens = %lld",
                       (long long)d->max_tokens);
    struct latent_gpu *p = (struct latent_gpu *)calloc(1, sizeof *p);
    if (!p) return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "latent plan: out of host memory");
    const int64_t mt = d->max_tokens, h = d->hidden, l = d->experts.hidden, is = d->shared_inter;
    p->sr = is > 0 ? k3_act_width_factor(d->shared_act.kind) * is : 0;
    k3_status st = k3_router_plan_create(ctx, &d->router, &p->router);
    if (st == K3_STATUS_SUCCESS) st = k3_router_workspace_size(p->router, &p->ws_router);
    if (st == K3_STATUS_SUCCESS) st = k3_moe_plan_create(ctx, &d->experts, &p->moe);
    if (st == K3_STATUS_SUCCESS) st = k3_moe_workspace_size(p->moe, &p->ws_moe);
    if (st == K3_STATUS_SUCCESS) st = latent_make_linear(ctx, l, h, mt, &p->down, &p->ws_down, "down");
    if (st == K3_STATUS_SUCCESS) st = latent_make_linear(ctx, h, l, mt, &p->up, &p->ws_up, "up");
    if (st == K3_STATUS_SUCCESS && is > 0)
        st = latent_make_linear(ctx, p->sr, h, mt, &p->sgu, &p->ws_sgu, "shared gate_up");
    if (st == K3_STATUS_SUCCESS && is > 0)
        st = latent_make_linear(ctx, h, is, mt, &p->sdown, &p->ws_sdown, "shared down");
    if (st == K3_STATUS_SUCCESS && is > 0) {
        st = k3_lt_plan_create(ctx, h, is, mt, is, h, 1, &p->sdown_f32);
        if (st == K3_STATUS_SUCCESS) p->ws_sdown_f32 = k3_lt_workspace_size(p->sdown_f32);
        else st = prefix_error(ctx, st, "latent plan: shared down projection (fp32 partial)");
    }
    if (st == K3_STATUS_SUCCESS && is > 0) st = k3_fork_join_create(ctx, &p->fj);
    if (st == K3_STATUS_SUCCESS && d->parallel.nccl_comm)
        st = k3_nccl_open(ctx, d->parallel.nccl_comm, d->parallel.rank, d->parallel.size, "latent plan", &p->nccl);
    if (st != K3_STATUS_SUCCESS) {
        latent_gpu_destroy(p);
        return st;
    }
    /* every buffer starts on a LATENT_WS_ALIGN boundary (mt <= 32 and dims <= 2^24: no overflow) */
    const size_t k = (size_t)d->experts.top_k;
    size_t o = 0;
    p->o_ids = o, o += latent_align_up((size_t)mt * k * 4);
    p->o_wts = o, o += latent_align_up((size_t)mt * k * 4);
    p->o_router = o, o += latent_align_up(p->ws_router);
    p->o_xl = o, o += latent_align_up((size_t)(mt * l) * 2);
    p->o_u = o, o += latent_align_up((size_t)(mt * l) * 4);
    p->o_mo = o, o += latent_align_up((size_t)(mt * l) * 2);
    p->o_moe = o, o += latent_align_up(p->ws_moe);
    p->o_v = o, o += latent_align_up((size_t)(mt * l) * 2);
    p->o_z = o, o += latent_align_up((size_t)(mt * h) * 2);
    p->o_g = o, o += latent_align_up((size_t)(mt * p->sr) * 2);
    p->o_a = o, o += latent_align_up((size_t)(mt * is) * 2);
    p->o_s = o, o += latent_align_up((size_t)(mt * h) * 2);
    p->o_down = o, o += latent_align_up(p->ws_down);
    p->o_up = o, o += latent_align_up(p->ws_up);
    p->o_sgu = o, o += latent_align_up(p->ws_sgu);
    p->o_sdown = o, o += latent_align_up(p->ws_sdown);
    p->o_sdown_f32 = o, o += latent_align_up(p->ws_sdown_f32);
    p->partial_count = (size_t)mt * (size_t)(l + (is > 0 ? h : 0));
    p->o_partial = o, o += p->nccl ? latent_align_up(p->partial_count * 4) : 0;
    p->total = o;
    *out = p;
    return K3_STATUS_SUCCESS;
}

/* The caller's workspace need not be aligned: the layout starts at its first aligned byte. */
static size_t latent_gpu_ws_bytes(const struct latent_gpu *p) { return p->total + LATENT_WS_ALIGN; }

/* The block of k3_latent_moe_run on `stream` (topk_ids / topk_weights / residual may be NULL); arguments were
 * validated by the caller. */
static k3_status latent_gpu_run(k3_ctx *ctx, const struct latent_gpu *p, const k3_latent_moe_desc *d, int64_t m,
                                const void *x, const k3_latent_moe_weights *w, const void *residual, void *y,
                                int32_t *topk_ids, float *topk_weights, void *ws, void *stream) {
    const int64_t h = d->hidden, l = d->experts.hidden, is = d->shared_inter;
    uint8_t *base = (uint8_t *)(((uintptr_t)ws + (LATENT_WS_ALIGN - 1)) & ~(uintptr_t)(LATENT_WS_ALIGN - 1));
    int32_t *ids = topk_ids ? topk_ids : (int32_t *)(base + p->o_ids);
    float *wts = topk_weights ? topk_weights : (float *)(base + p->o_wts);
    uint16_t *xl = (uint16_t *)(base + p->o_xl), *mo = (uint16_t *)(base + p->o_mo), *v = (uint16_t *)(base + p->o_v);
    uint16_t *z = (uint16_t *)(base + p->o_z), *g = (uint16_t *)(base + p->o_g), *a = (uint16_t *)(base + p->o_a);
    uint16_t *sh = (uint16_t *)(base + p->o_s);
    float *u = (float *)(base + p->o_u);

    {
        const void *ptrs[] = {x, y, residual, ws, w->gate, w->down_proj, w->norm, w->up_proj, w->shared_gate_up,
                              w->shared_down};
        const char *names[] = {"x", "y", "residual", "ws", "gate", "down_proj", "norm", "up_proj", "shared_gate_up",
                               "shared_down"};
        K3_TRY(k3_cuda_check_device_ptrs(ctx, stream, "latent run", 10, ptrs, names));
    }
    k3_status st = K3_STATUS_SUCCESS;
    if (is > 0) { /* the shared experts: on the aux stream, concurrent with the routed path */
        st = k3_fork_join_fork(ctx, p->fj, stream);
        if (st != K3_STATUS_SUCCESS) return st;
        void *aux = k3_fork_join_aux(p->fj);
        st = k3_linear_run(p->sgu, m, x, w->shared_gate_up, NULL, g, base + p->o_sgu, p->ws_sgu, aux);
        if (st == K3_STATUS_SUCCESS) st = k3_cuda_latent_act_launch(ctx, g, m, is, p->sr, &d->shared_act, a, aux);
        if (st == K3_STATUS_SUCCESS)
            st = k3_linear_run(p->sdown, m, a, w->shared_down, NULL, sh, base + p->o_sdown, p->ws_sdown, aux);
    }
    if (st == K3_STATUS_SUCCESS)
        st = k3_router_run(p->router, m, x, w->gate, w->bias, ids, wts, base + p->o_router, p->ws_router, stream);
    if (st == K3_STATUS_SUCCESS)
        st = k3_linear_run(p->down, m, x, w->down_proj, NULL, xl, base + p->o_down, p->ws_down, stream);
    if (st == K3_STATUS_SUCCESS)
        st = k3_moe_run(p->moe, m, xl, ids, wts, &w->experts, mo, u, base + p->o_moe, p->ws_moe, stream);
    if (st == K3_STATUS_SUCCESS)
        st = k3_cuda_latent_rmsnorm_launch(ctx, u, (const uint16_t *)w->norm, m, l, d->rms_eps, v, stream);
    if (st == K3_STATUS_SUCCESS) st = k3_linear_run(p->up, m, v, w->up_proj, NULL, z, base + p->o_up, p->ws_up, stream);
    if (is > 0) { /* always join, so a capture is never left with an open branch */
        const k3_status js = k3_fork_join_join(ctx, p->fj, stream);
        if (st == K3_STATUS_SUCCESS) st = js;
    }
    if (st != K3_STATUS_SUCCESS) return st;
    return k3_cuda_latent_sum_launch(ctx, z, is > 0 ? sh : NULL, (const uint16_t *)residual, m * h, (uint16_t *)y,
                                     stream);
}

/* PRE_REDUCE on `stream`: the routed path writes u into partial (the experts' fp32 sum), the shared branch (aux
 * stream) its unrounded fp32 output into partial + m * L (cuBLASLt with an fp32 D). */
static k3_status latent_gpu_run_pre(k3_ctx *ctx, const struct latent_gpu *p, const k3_latent_moe_desc *d, int64_t m,
                                    const void *x, const k3_latent_moe_weights *w, float *partial, int32_t *topk_ids,
                                    float *topk_weights, void *ws, void *stream) {
    const int64_t l = d->experts.hidden, is = d->shared_inter;
    uint8_t *base = (uint8_t *)(((uintptr_t)ws + (LATENT_WS_ALIGN - 1)) & ~(uintptr_t)(LATENT_WS_ALIGN - 1));
    int32_t *ids = topk_ids ? topk_ids : (int32_t *)(base + p->o_ids);
    float *wts = topk_weights ? topk_weights : (float *)(base + p->o_wts);
    uint16_t *xl = (uint16_t *)(base + p->o_xl), *mo = (uint16_t *)(base + p->o_mo);
    uint16_t *g = (uint16_t *)(base + p->o_g), *a = (uint16_t *)(base + p->o_a);
        if (!k3_aligned(partial, 16))
        return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT, "latent stage: partial (%p) is not 16-byte aligned (CUDA)",
                       (const void *)partial);
    {
        const void *ptrs[] = {x, partial, ws, w->gate, w->down_proj, w->shared_gate_up, w->shared_down};
        const char *names[] = {"x", "partial", "ws", "gate", "down_proj", "shared_gate_up", "shared_down"};
        K3_TRY(k3_cuda_check_device_ptrs(ctx, stream, "latent stage", 7, ptrs, names));
    }
    k3_status st = K3_STATUS_SUCCESS;
    if (is > 0) {
        st = k3_fork_join_fork(ctx, p->fj, stream);
        if (st != K3_STATUS_SUCCESS) return st;
        void *aux = k3_fork_join_aux(p->fj);
        st = k3_linear_run(p->sgu, m, x, w->shared_gate_up, NULL, g, base + p->o_sgu, p->ws_sgu, aux);
        if (st == K3_STATUS_SUCCESS) st = k3_cuda_latent_act_launch(ctx, g, m, is, p->sr, &d->shared_act, a, aux);
        if (st == K3_STATUS_SUCCESS)
            st = k3_lt_run(ctx, p->sdown_f32, m, 0, a, w->shared_down, NULL, partial + m * l, base + p->o_sdown_f32,
                           p->ws_sdown_f32, aux);
    }
    if (st == K3_STATUS_SUCCESS)
        st = k3_router_run(p->router, m, x, w->gate, w->bias, ids, wts, base + p->o_router, p->ws_router, stream);
    if (st == K3_STATUS_SUCCESS)
        st = k3_linear_run(p->down, m, x, w->down_proj, NULL, xl, base + p->o_down, p->ws_down, stream);
    if (st == K3_STATUS_SUCCESS)
        st = k3_moe_run(p->moe, m, xl, ids, wts, &w->experts, mo, partial, base + p->o_moe, p->ws_moe, stream);
    if (is > 0) { /* always join, so a capture is never left with an open branch */
        const k3_status js = k3_fork_join_join(ctx, p->fj, stream);
        if (st == K3_STATUS_SUCCESS) st = js;
    }
    return st;
}

/* POST_REDUCE on `stream`: RMSNorm of the summed u, the up projection, and the sum with the summed shared output. */
static k3_status latent_gpu_run_post(k3_ctx *ctx, const struct latent_gpu *p, const k3_latent_moe_desc *d, int64_t m,
                                     const float *partial, const k3_latent_moe_weights *w, const void *residual,
                                     void *y, void *ws, void *stream) {
    const int64_t h = d->hidden, l = d->experts.hidden, is = d->shared_inter;
    uint8_t *base = (uint8_t *)(((uintptr_t)ws + (LATENT_WS_ALIGN - 1)) & ~(uintptr_t)(LATENT_WS_ALIGN - 1));
    uint16_t *v = (uint16_t *)(base + p->o_v), *z = (uint16_t *)(base + p->o_z);
    {
        const void *ptrs[] = {partial, y, residual, ws, w->norm, w->up_proj};
        const char *names[] = {"partial", "y", "residual", "ws", "norm", "up_proj"};
        K3_TRY(k3_cuda_check_device_ptrs(ctx, stream, "latent stage", 6, ptrs, names));
    }
    k3_status st = k3_cuda_latent_rmsnorm_launch(ctx, partial, (const uint16_t *)w->norm, m, l, d->rms_eps, v, stream);
    if (st == K3_STATUS_SUCCESS) st = k3_linear_run(p->up, m, v, w->up_proj, NULL, z, base + p->o_up, p->ws_up, stream);
    if (st != K3_STATUS_SUCCESS) return st;
    return k3_cuda_latent_sum_f32_launch(ctx, z, is > 0 ? partial + m * l : NULL, (const uint16_t *)residual, m * h,
                                         (uint16_t *)y, stream);
}
#endif /* K3_HAVE_CUDA */

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
        st = latent_gpu_create(ctx, &dd, &p->gpu);
        if (st != K3_STATUS_SUCCESS) {
            free(p);
            return st; /* the message is set */
        }
        p->ws_bytes = latent_gpu_ws_bytes(p->gpu);
    }
#endif
    *out = p;
    return K3_STATUS_SUCCESS;
}

void k3_latent_moe_plan_destroy(k3_latent_moe_plan *plan) {
    if (!plan) return;
#ifdef K3_HAVE_CUDA
    latent_gpu_destroy(plan->gpu);
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
    const int reduces = plan->gpu && plan->gpu->nccl;
#else
    const int reduces = 0;
#endif
    K3_CHECK_ARG(ctx, d->parallel.size == 1 || reduces,
                 "latent run: this plan is rank %d of %d without a communicator: its u is a partial sum, which the norm "
                 "must not see; run k3_latent_moe_run_stage PRE_REDUCE, sum the partials across the ranks, then "
                 "POST_REDUCE (or give the plan parallel.nccl_comm)",
                 (int)d->parallel.rank, (int)d->parallel.size);
    K3_TRY(latent_check_run(plan, "latent run", LAT_ALL, m, x, w, residual, y, NULL, topk_ids, topk_weights, ws,
                            ws_bytes));
#ifdef K3_HAVE_CUDA
    if (reduces) {
        const struct latent_gpu *p = plan->gpu;
        uint8_t *base = (uint8_t *)(((uintptr_t)ws + (LATENT_WS_ALIGN - 1)) & ~(uintptr_t)(LATENT_WS_ALIGN - 1));
        float *partial = (float *)(base + p->o_partial);
        const size_t count = (size_t)m * (size_t)(d->experts.hidden + (d->shared_inter > 0 ? d->hidden : 0));
        K3_TRY(latent_gpu_run_pre(ctx, p, d, m, x, w, partial, topk_ids, topk_weights, ws, stream));
        K3_TRY(k3_nccl_allreduce_f32(ctx, p->nccl, partial, count, stream));
        return latent_gpu_run_post(ctx, p, d, m, partial, w, residual, y, ws, stream);
    }
    if (plan->gpu)
        return latent_gpu_run(ctx, plan->gpu, d, m, x, w, residual, y, topk_ids, topk_weights, ws, stream);
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
    *out_count = (size_t)m * (size_t)(d->experts.hidden + (d->shared_inter > 0 ? d->hidden : 0));
    return K3_STATUS_SUCCESS;
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
                   ? latent_gpu_run_pre(ctx, plan->gpu, &plan->cpu.d, m, x, w, partial, topk_ids, topk_weights, ws,
                                        stream)
                   : latent_gpu_run_post(ctx, plan->gpu, &plan->cpu.d, m, partial, w, residual, y, ws, stream);
#endif
    if (parts == LAT_PRE)
        k3_cpu_latent_run_pre(&plan->cpu, m, (const uint16_t *)x, w, partial, topk_ids, topk_weights, ws);
    else
        k3_cpu_latent_run_post(&plan->cpu, m, partial, w, (const uint16_t *)residual, (uint16_t *)y, ws);
    return K3_STATUS_SUCCESS;
}

const k3_cpu_latent *k3_latent_moe_plan_cpu(const k3_latent_moe_plan *plan) { return plan ? &plan->cpu : NULL; }
