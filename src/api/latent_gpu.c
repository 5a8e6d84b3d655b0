/* The latent-MoE block composed on a CUDA context (see latent_gpu.h). CUDA builds only. */
#include "api/latent_gpu.h"

#ifdef K3_HAVE_CUDA
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/moe_internal.h"
#include "api/ptr_align.h"
#include "api/router_internal.h"
#include "comm/nccl.h"
#include "core/act.h"
#include "cuda/common/fork_join.h"
#include "cuda/common/ptr_check.h"
#include "cuda/gemm/cublaslt.h"
#include "cuda/latent/kernels.h"
#include "plan/latent_tuning.h"

/* Re-prefixes the message a sub-check left on the context. */
static k3_status prefix_error(k3_ctx *ctx, k3_status st, const char *prefix) {
    char msg[K3_ERROR_MAX];
    memcpy(msg, ctx->last_error, sizeof msg);
    return k3_fail(ctx, st, "%s: %s", prefix, msg);
}

#define LATENT_WS_ALIGN ((size_t)256)

static size_t latent_align_up(size_t v) { return (v + (LATENT_WS_ALIGN - 1)) & ~(LATENT_WS_ALIGN - 1); }

/* Saturating size arithmetic for the workspace layout: SIZE_MAX stands for "overflowed" and stays so. */
static size_t latent_add(size_t a, size_t b) {
    return a == SIZE_MAX || b == SIZE_MAX || b > SIZE_MAX - a ? SIZE_MAX : a + b;
}
static size_t latent_mul3(size_t a, size_t b, size_t c) {
    if (a == SIZE_MAX || b == SIZE_MAX || c == SIZE_MAX) return SIZE_MAX;
    if (b && a > SIZE_MAX / b) return SIZE_MAX;
    const size_t ab = a * b;
    if (c && ab > SIZE_MAX / c) return SIZE_MAX;
    return ab * c;
}
static size_t latent_align_up_checked(size_t v) {
    return v > SIZE_MAX - (LATENT_WS_ALIGN - 1) ? SIZE_MAX : latent_align_up(v);
}

struct k3_latent_gpu {
    int64_t sr; /* rows of shared_gate_up */
    k3_router_plan *router;
    k3_moe_plan *moe;
    k3_linear_plan *down, *up, *sgu;
    k3_lt_plan *sdown_f32; /* the shared down projection with fp32 output: a rank's partial (the stage API) */
    k3_nccl *nccl;         /* the caller's communicator (library-driven TP), or NULL */
    k3_fork_join *fj;        /* the second stream of the schedules, or NULL (none of them puts anything beside) */
    k3_fork_join *fj_select; /* the router's selection beside the down projection (SELECT_BESIDE), or NULL */
    /* index m (1..max_tokens), resolved at plan time: the schedule (never AUTO), and whether the RMSNorm lets the
     * up projection come up early (the architecture's data, plan/latent_tuning.c) */
    k3_latent_schedule schedule[K3_LATENT_TUNING_MAX_M + 1];
    int32_t norm_trigger[K3_LATENT_TUNING_MAX_M + 1];
    size_t ws_router, ws_moe, ws_down, ws_up, ws_sgu, ws_sdown_f32;
    /* offsets into the workspace, from its first LATENT_WS_ALIGN-aligned byte */
    size_t o_ids, o_wts, o_router, o_xl, o_mo, o_moe, o_v, o_z, o_g, o_a, o_down, o_up, o_sgu,
        o_sdown_f32, o_partial, o_xg, o_local, total;
};

void k3_latent_gpu_destroy(k3_latent_gpu *p) {
    if (!p) return;
    k3_router_plan_destroy(p->router);
    k3_moe_plan_destroy(p->moe);
    k3_linear_plan_destroy(p->down);
    k3_linear_plan_destroy(p->up);
    k3_linear_plan_destroy(p->sgu);
    k3_lt_plan_destroy(p->sdown_f32);
    k3_nccl_close(p->nccl);
    k3_fork_join_destroy(p->fj);
    k3_fork_join_destroy(p->fj_select);
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

/* Whether schedule s forks the second stream (the shared experts, or with ROUTER_BESIDE the router, beside the
 * routed path). */
static int latent_forks_shared(k3_latent_schedule s, int shared) {
    return s == K3_LATENT_SCHEDULE_ROUTER_BESIDE ||
           (shared && (s == K3_LATENT_SCHEDULE_SHARED_BESIDE || s == K3_LATENT_SCHEDULE_SELECT_BESIDE ||
                       s == K3_LATENT_SCHEDULE_LOGITS_FIRST));
}
/* Whether schedule s runs the router's selection on the third stream. */
static int latent_select_beside(k3_latent_schedule s) {
    return s == K3_LATENT_SCHEDULE_SELECT_BESIDE || s == K3_LATENT_SCHEDULE_LOGITS_FIRST;
}

/* d: validated, its router and experts max_tokens equal to the block's. */
k3_status k3_latent_gpu_create(k3_ctx *ctx, const k3_latent_moe_desc *d, k3_latent_gpu **out) {
    *out = NULL;
    if (d->max_tokens > 32)
        return k3_fail(ctx, K3_STATUS_UNSUPPORTED,
                       "latent plan: the CUDA block runs up to 32 tokens (its BF16 projections use the linear plan, "
                       "max_m <= 32); got max_tokens = %lld",
                       (long long)d->max_tokens);
    k3_latent_gpu *p = (k3_latent_gpu *)calloc(1, sizeof *p);
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
    if (st == K3_STATUS_SUCCESS && is > 0) {
        st = k3_lt_plan_create(ctx, h, is, mt, is, h, 1, &p->sdown_f32);
        if (st == K3_STATUS_SUCCESS) p->ws_sdown_f32 = k3_lt_workspace_size(p->sdown_f32);
        else st = prefix_error(ctx, st, "latent plan: shared down projection (fp32 partial)");
    }
    /* AUTO: the architecture's measured choice per m (plan/latent_tuning.c); the streams any m needs, made now */
    k3_latent_tuning tuning;
    k3_latent_tuning_for_table(ctx->arch.table, &tuning);
    int need_fj = 0, need_select = 0;
    for (int64_t m = 1; m <= mt; m++) {
        k3_latent_schedule s = d->schedule != K3_LATENT_SCHEDULE_AUTO ? d->schedule : tuning.schedule[m];
        if (s == K3_LATENT_SCHEDULE_SHARED_BESIDE && is == 0) s = K3_LATENT_SCHEDULE_SERIAL;
        p->schedule[m] = s;
        p->norm_trigger[m] = tuning.norm_trigger[m];
        need_fj |= latent_forks_shared(s, is > 0);
        need_select |= latent_select_beside(s);
    }
    if (st == K3_STATUS_SUCCESS && need_fj) st = k3_fork_join_create(ctx, &p->fj);
    if (st == K3_STATUS_SUCCESS && need_select) st = k3_fork_join_create(ctx, &p->fj_select);
    if (st == K3_STATUS_SUCCESS && d->parallel.nccl_comm)
        st = k3_nccl_open(ctx, d->parallel.nccl_comm, d->parallel.rank, d->parallel.size, "latent plan", &p->nccl);
    if (st != K3_STATUS_SUCCESS) {
        k3_latent_gpu_destroy(p);
        return st;
    }
    /* every buffer starts on a LATENT_WS_ALIGN boundary (mt <= 32 and dims <= 2^24: no overflow) */
    const size_t k = (size_t)d->experts.top_k;
    size_t o = 0;
    p->o_ids = o, o += latent_align_up((size_t)mt * k * 4);
    p->o_wts = o, o += latent_align_up((size_t)mt * k * 4);
    p->o_router = o, o += latent_align_up(p->ws_router);
    p->o_xl = o, o += latent_align_up((size_t)(mt * l) * 2);
    p->o_mo = o, o += latent_align_up((size_t)(mt * l) * 2);
    p->o_moe = o, o += latent_align_up(p->ws_moe);
    p->o_v = o, o += latent_align_up((size_t)(mt * l) * 2);
    p->o_z = o, o += latent_align_up((size_t)(mt * h) * 2);
    p->o_g = o, o += latent_align_up((size_t)(mt * p->sr) * 2);
    p->o_a = o, o += latent_align_up((size_t)(mt * is) * 2);
    p->o_down = o, o += latent_align_up(p->ws_down);
    p->o_up = o, o += latent_align_up(p->ws_up);
    p->o_sgu = o, o += latent_align_up(p->ws_sgu);
    p->o_sdown_f32 = o, o += latent_align_up(p->ws_sdown_f32);
    /* the block's partial between its two stages, at max_tokens (PER_RANK tokens: that of the gathered rows) */
    p->o_partial = o, o += latent_align_up(k3_latent_partial_floats(d, mt) * 4);
    p->o_xg = p->o_local = o;
    if (p->nccl && d->parallel.tokens == K3_TOKENS_PER_RANK) {
        /* the gathered x [max_tokens, H] and this rank's reduce-scattered partial, at most max_tokens / size rows */
        const size_t xg = latent_mul3((size_t)mt, (size_t)h, 2);
        const size_t local = latent_mul3(k3_latent_partial_floats(d, mt / d->parallel.size), 4, 1);
        p->o_xg = o;
        o = latent_add(o, latent_align_up_checked(xg));
        p->o_local = o;
        o = latent_add(o, latent_align_up_checked(local));
        if (o == SIZE_MAX || o > SIZE_MAX - LATENT_WS_ALIGN) {
            k3_latent_gpu_destroy(p);
            return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT,
                           "latent plan: the workspace of the gathered tokens overflows size_t (max_tokens %lld, "
                           "hidden %lld)",
                           (long long)mt, (long long)h);
        }
    }
    p->total = o;
    *out = p;
    return K3_STATUS_SUCCESS;
}

/* The caller's workspace need not be aligned: the layout starts at its first aligned byte. */
size_t k3_latent_gpu_ws_bytes(const k3_latent_gpu *p) { return p->total + LATENT_WS_ALIGN; }

/* The shared experts on stream s: gate_up, the activation, the down projection into out (unrounded fp32), and
 * where t is given (the whole block) t = bf16(bf16(out) + residual), the up projection's residual. */
static k3_status latent_shared(k3_ctx *ctx, const k3_latent_gpu *p, const k3_latent_moe_desc *d, int64_t m,
                               const void *x, const k3_latent_moe_weights *w, float *out, const void *residual,
                               uint16_t *t, uint8_t *base, void *s) {
    const int64_t is = d->shared_inter;
    uint16_t *g = (uint16_t *)(base + p->o_g), *a = (uint16_t *)(base + p->o_a);
    k3_status st = k3_linear_run(p->sgu, m, x, w->shared_gate_up, NULL, g, base + p->o_sgu, p->ws_sgu, s);
    if (st == K3_STATUS_SUCCESS) st = k3_cuda_latent_act_launch(ctx, g, m, is, p->sr, &d->shared_act, a, s);
    if (st == K3_STATUS_SUCCESS)
        st = k3_lt_run(ctx, p->sdown_f32, m, 0, a, w->shared_down, NULL, out, base + p->o_sdown_f32, p->ws_sdown_f32,
                       s);
    /* the whole block: the up projection's residual t, made here so it costs the routed path nothing */
    if (st == K3_STATUS_SUCCESS && t)
        st = k3_cuda_latent_addend_launch(ctx, out, (const uint16_t *)residual, m * d->hidden, t, s);
    return st;
}

/* Which join latent_join is asked for: the one before the experts (ROUTER_BESIDE) or the last one (the others that
 * fork: before the up projection in the whole block, which adds the branch's t, and at the end of PRE_REDUCE). */
enum { LATENT_JOIN_EXPERTS = 1, LATENT_JOIN_LAST = 2 };

/* Joins the second stream back into `stream` where the plan's schedule has its join; passes st on (a join is made
 * even after a failure, so a capture is never left with an open branch). */
static k3_status latent_join(k3_ctx *ctx, const k3_latent_gpu *p, k3_latent_schedule sc, int where, k3_status st,
                             void *stream) {
    if (!latent_forks_shared(sc, p->sr > 0)) return st;
    const int at = sc == K3_LATENT_SCHEDULE_ROUTER_BESIDE ? LATENT_JOIN_EXPERTS : LATENT_JOIN_LAST;
    if (at != where) return st;
    const k3_status js = k3_fork_join_join(ctx, p->fj, stream);
    return st != K3_STATUS_SUCCESS ? st : js;
}

/* The block up to its fp32 partial, in the plan's schedule: the router (ids, wts), the down projection (xl), the
 * shared experts (into partial after u; with SHARED_BESIDE still running on the second stream when this returns:
 * the caller's latent_join(LATENT_JOIN_LAST) waits for them) and the routed experts (mo, u = partial [m, L]). */
static k3_status latent_front(k3_ctx *ctx, const k3_latent_gpu *p, const k3_latent_moe_desc *d, int64_t m,
                              const void *x, const k3_latent_moe_weights *w, const void *residual, uint16_t *t,
                              int32_t *ids, float *wts, uint16_t *xl, uint16_t *mo, float *partial, uint8_t *base,
                              k3_latent_schedule sc, void *stream) {
    const int shared = d->shared_inter > 0;
    float *u = partial, *so = partial + m * d->experts.hidden;
    k3_status st = K3_STATUS_SUCCESS;
    void *router_s = stream;
    const int shared_late = sc == K3_LATENT_SCHEDULE_LOGITS_FIRST; /* forked after the router's logits */
    int shared_forked = 0;
    if (latent_forks_shared(sc, shared) && !shared_late) {
        K3_TRY(k3_fork_join_fork(ctx, p->fj, stream));
        shared_forked = 1;
        void *aux = k3_fork_join_aux(p->fj);
        if (sc == K3_LATENT_SCHEDULE_ROUTER_BESIDE) router_s = aux;
        else st = latent_shared(ctx, p, d, m, x, w, so, residual, t, base, aux);
    } else if (shared && !shared_late) {
        st = latent_shared(ctx, p, d, m, x, w, so, residual, t, base, stream);
    }
    /* SELECT_BESIDE, LOGITS_FIRST: the selection on fj_select's stream, joined before the experts (also after a
     * failure once forked, so a capture is never left with an open branch) */
    int select_forked = 0;
    if (st == K3_STATUS_SUCCESS)
        st = k3_router_run_split(p->router, m, x, w->gate, w->bias, ids, wts, base + p->o_router, p->ws_router,
                                 router_s, latent_select_beside(sc) ? p->fj_select : NULL, &select_forked);
    if (st == K3_STATUS_SUCCESS && shared_late && shared) {
        st = k3_fork_join_fork(ctx, p->fj, stream);
        shared_forked = st == K3_STATUS_SUCCESS;
        if (st == K3_STATUS_SUCCESS)
            st = latent_shared(ctx, p, d, m, x, w, so, residual, t, base, k3_fork_join_aux(p->fj));
    }
    if (st == K3_STATUS_SUCCESS)
        st = k3_linear_run(p->down, m, x, w->down_proj, NULL, xl, base + p->o_down, p->ws_down, stream);
    if (select_forked) {
        const k3_status js = k3_fork_join_join(ctx, p->fj_select, stream);
        if (st == K3_STATUS_SUCCESS) st = js;
    }
    if (st == K3_STATUS_SUCCESS && shared && sc == K3_LATENT_SCHEDULE_ROUTER_BESIDE)
        st = latent_shared(ctx, p, d, m, x, w, so, residual, t, base, stream);
    st = latent_join(ctx, p, sc, LATENT_JOIN_EXPERTS, st, stream);
    if (st == K3_STATUS_SUCCESS)
        st = k3_moe_run(p->moe, m, xl, ids, wts, &w->experts, mo, u, base + p->o_moe, p->ws_moe, stream);
    /* on success every forking schedule has forked; after a failure, join only a fork that was made */
    if (st != K3_STATUS_SUCCESS && shared_forked) (void)latent_join(ctx, p, sc, LATENT_JOIN_LAST, st, stream);
    return st;
}

/* The block of k3_latent_moe_run on `stream` (topk_ids / topk_weights / residual may be NULL); arguments were
 * validated by the caller. The kernels of PRE_REDUCE then POST_REDUCE on the workspace's partial (u and the
 * shared experts' fp32 output), so a rank's block (the stages, or NCCL, one rank included) gives this block's
 * bits. The block ends with the up projection: its residual is the shared branch's t (or the caller's residual). */
k3_status k3_latent_gpu_run(k3_ctx *ctx, const k3_latent_gpu *p, const k3_latent_moe_desc *d, int64_t m,
                            const void *x, const k3_latent_moe_weights *w, const void *residual, void *y,
                            int32_t *topk_ids, float *topk_weights, void *ws, void *stream) {
    const int64_t l = d->experts.hidden, is = d->shared_inter;
    uint8_t *base = (uint8_t *)(((uintptr_t)ws + (LATENT_WS_ALIGN - 1)) & ~(uintptr_t)(LATENT_WS_ALIGN - 1));
    int32_t *ids = topk_ids ? topk_ids : (int32_t *)(base + p->o_ids);
    float *wts = topk_weights ? topk_weights : (float *)(base + p->o_wts);
    uint16_t *xl = (uint16_t *)(base + p->o_xl), *mo = (uint16_t *)(base + p->o_mo), *v = (uint16_t *)(base + p->o_v);
    uint16_t *z = (uint16_t *)(base + p->o_z);
    float *partial = (float *)(base + p->o_partial);
    {
        const void *ptrs[] = {x, y, residual, ws, w->gate, w->down_proj, w->norm, w->up_proj, w->shared_gate_up,
                              w->shared_down};
        const char *names[] = {"x", "y", "residual", "ws", "gate", "down_proj", "norm", "up_proj", "shared_gate_up",
                               "shared_down"};
        K3_TRY(k3_cuda_check_device_ptrs(ctx, stream, "latent run", 10, ptrs, names));
    }
    /* with shared experts their branch ends with t = bf16(s + residual) in z's buffer, the up projection's residual */
    uint16_t *t = is > 0 ? z : NULL;
    K3_TRY(latent_front(ctx, p, d, m, x, w, residual, t, ids, wts, xl, mo, partial, base, p->schedule[m], stream));
    k3_status st = k3_cuda_latent_rmsnorm_launch(ctx, partial, (const uint16_t *)w->norm, m, l, d->rms_eps, v,
                                                 p->norm_trigger[m], stream);
    st = latent_join(ctx, p, p->schedule[m], LATENT_JOIN_LAST, st, stream);
    if (st != K3_STATUS_SUCCESS) return st;
    return k3_linear_run(p->up, m, v, w->up_proj, t ? (const void *)t : residual, y, base + p->o_up, p->ws_up, stream);
}

/* PRE_REDUCE on `stream`: the routed path writes u into partial (the experts' fp32 sum), the shared branch its
 * unrounded fp32 output into partial + m * L (cuBLASLt with an fp32 D), in the plan's schedule. */
k3_status k3_latent_gpu_run_pre(k3_ctx *ctx, const k3_latent_gpu *p, const k3_latent_moe_desc *d, int64_t m,
                                    const void *x, const k3_latent_moe_weights *w, float *partial, int32_t *topk_ids,
                                    float *topk_weights, void *ws, void *stream) {
    uint8_t *base = (uint8_t *)(((uintptr_t)ws + (LATENT_WS_ALIGN - 1)) & ~(uintptr_t)(LATENT_WS_ALIGN - 1));
    int32_t *ids = topk_ids ? topk_ids : (int32_t *)(base + p->o_ids);
    float *wts = topk_weights ? topk_weights : (float *)(base + p->o_wts);
    uint16_t *xl = (uint16_t *)(base + p->o_xl), *mo = (uint16_t *)(base + p->o_mo);
    if (!k3_aligned(partial, 16))
        return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT, "latent stage: partial (%p) is not 16-byte aligned (CUDA)",
                       (const void *)partial);
    {
        const void *ptrs[] = {x, partial, ws, w->gate, w->down_proj, w->shared_gate_up, w->shared_down};
        const char *names[] = {"x", "partial", "ws", "gate", "down_proj", "shared_gate_up", "shared_down"};
        K3_TRY(k3_cuda_check_device_ptrs(ctx, stream, "latent stage", 7, ptrs, names));
    }
    K3_TRY(latent_front(ctx, p, d, m, x, w, NULL, NULL, ids, wts, xl, mo, partial, base, p->schedule[m], stream));
    return latent_join(ctx, p, p->schedule[m], LATENT_JOIN_LAST, K3_STATUS_SUCCESS, stream);
}

/* POST_REDUCE on `stream`: RMSNorm of the summed u, the up projection, and the sum with the summed shared output. */
k3_status k3_latent_gpu_run_post(k3_ctx *ctx, const k3_latent_gpu *p, const k3_latent_moe_desc *d, int64_t m,
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
    /* t = bf16(bf16(s) + residual) from the summed shared output, as the whole block's shared branch makes it */
    if (is > 0) K3_TRY(k3_cuda_latent_addend_launch(ctx, partial + m * l, (const uint16_t *)residual, m * h, z, stream));
    K3_TRY(k3_cuda_latent_rmsnorm_launch(ctx, partial, (const uint16_t *)w->norm, m, l, d->rms_eps, v,
                                         p->norm_trigger[m], stream));
    return k3_linear_run(p->up, m, v, w->up_proj, is > 0 ? (const void *)z : residual, y, base + p->o_up, p->ws_up,
                         stream);
}

int k3_latent_gpu_reduces(const k3_latent_gpu *p) { return p && p->nccl; }

k3_latent_schedule k3_latent_gpu_schedule(const k3_latent_gpu *p, int64_t m) { return p->schedule[m]; }

/* PER_RANK tokens: gather the ranks' x, PRE_REDUCE on the gathered rows, reduce-scatter this rank's rows of the
 * partial (u and shared, one NCCL group), POST_REDUCE on them. m is this rank's count; size * m <= max_tokens was
 * checked by the caller. */
static k3_status latent_gpu_run_per_rank(k3_ctx *ctx, const k3_latent_gpu *p, const k3_latent_moe_desc *d,
                                         int64_t m, const void *x, const k3_latent_moe_weights *w,
                                         const void *residual, void *y, int32_t *topk_ids, float *topk_weights,
                                         void *ws, void *stream) {
    const int64_t h = d->hidden, l = d->experts.hidden, k = d->experts.top_k;
    const int64_t size = d->parallel.size, rank = d->parallel.rank, mg = size * m;
    uint8_t *base = (uint8_t *)(((uintptr_t)ws + (LATENT_WS_ALIGN - 1)) & ~(uintptr_t)(LATENT_WS_ALIGN - 1));
    float *partial = (float *)(base + p->o_partial), *local = (float *)(base + p->o_local);
    uint16_t *xg = (uint16_t *)(base + p->o_xg);
    int32_t *ids = (int32_t *)(base + p->o_ids);
    float *wts = (float *)(base + p->o_wts);
    {
        /* PRE_REDUCE below checks the workspace copies; these are the caller's own buffers */
        const void *ptrs[] = {x, topk_ids, topk_weights};
        const char *names[] = {"x", "topk_ids", "topk_weights"};
        K3_TRY(k3_cuda_check_device_ptrs(ctx, stream, "latent run", 3, ptrs, names));
    }
    K3_TRY(k3_nccl_allgather_bf16(ctx, p->nccl, x, xg, (size_t)(m * h), stream));
    K3_TRY(k3_latent_gpu_run_pre(ctx, p, d, mg, xg, w, partial, ids, wts, ws, stream));
    /* rank r's block of each reduce-scatter is its rows [r m, (r + 1) m) of u, then of the shared output */
    const int shared = d->shared_inter > 0;
    K3_TRY(k3_nccl_reduce_scatter2_f32(ctx, p->nccl, partial, local, (size_t)(m * l), shared ? partial + mg * l : NULL,
                                       shared ? local + m * l : NULL, shared ? (size_t)(m * h) : 0, stream));
    /* the routing of this rank's own tokens, for the caller */
    if (topk_ids)
        K3_TRY(k3_cuda_latent_copy(ctx, topk_ids, ids + rank * m * k, (size_t)(m * k) * sizeof(int32_t), stream));
    if (topk_weights)
        K3_TRY(k3_cuda_latent_copy(ctx, topk_weights, wts + rank * m * k, (size_t)(m * k) * sizeof(float), stream));
    return k3_latent_gpu_run_post(ctx, p, d, m, local, w, residual, y, ws, stream);
}

k3_status k3_latent_gpu_run_reduced(k3_ctx *ctx, const k3_latent_gpu *p, const k3_latent_moe_desc *d, int64_t m,
                                    const void *x, const k3_latent_moe_weights *w, const void *residual, void *y,
                                    int32_t *topk_ids, float *topk_weights, void *ws, void *stream) {
    if (d->parallel.tokens == K3_TOKENS_PER_RANK)
        return latent_gpu_run_per_rank(ctx, p, d, m, x, w, residual, y, topk_ids, topk_weights, ws, stream);
    uint8_t *base = (uint8_t *)(((uintptr_t)ws + (LATENT_WS_ALIGN - 1)) & ~(uintptr_t)(LATENT_WS_ALIGN - 1));
    float *partial = (float *)(base + p->o_partial);
    const size_t count = k3_latent_partial_floats(d, m);
    K3_TRY(k3_latent_gpu_run_pre(ctx, p, d, m, x, w, partial, topk_ids, topk_weights, ws, stream));
    K3_TRY(k3_nccl_allreduce_f32(ctx, p->nccl, partial, count, stream));
    return k3_latent_gpu_run_post(ctx, p, d, m, partial, w, residual, y, ws, stream);
}
#endif /* K3_HAVE_CUDA */
