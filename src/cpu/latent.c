/*
 * The Kimi-K3 latent-MoE block on the CPU (docs/model.md section 4). For each token x [H] (BF16), in this order and
 * with exactly these roundings (every "bf16(...)" is one round-to-nearest-even of an fp32 value):
 *   1. routing   ids, p = router(x)                      fp32 logits (k3_cpu_router)
 *   2. down      x_l = bf16(x . W_down^T)                fp32 accumulation          [L]
 *   3. experts   u   = sum_j p_j E_j(x_l)                fp32, NOT rounded (moe.c)   [L]
 *   4. RMSNorm   r   = 1 / sqrt(mean(u^2) + eps)         fp32 (sum of squares in index order)
 *                n   = bf16(u * r); v = bf16(n * norm)   norm is the BF16 weight [L]
 *   5. shared    g   = bf16(x . W_gate_up^T)             [width * Is], the original x
 *                a   = bf16(shared_act(g))               fp32 math, one rounding    [Is]
 *                s   = bf16(a . W_shared_down^T)         [H]
 *   6. addend    t   = bf16(s + residual)                fp32 add, one rounding     [H]; t = s without a residual,
 *                                                        t = residual without shared experts
 *   7. up        y   = bf16(v . W_up^T + t)              fp32 accumulation, t added before the one rounding [H]
 * With shared experts absent and no residual, y = bf16(v . W_up^T). Why t is formed first: the up projection's
 * epilogue adds one BF16 residual, so on the GPU the block ends with the up projection and needs no separate sum
 * kernel after it (t is made on the shared experts' stream while the routed path runs).
 */
#include "cpu/cpu.h"

#include <math.h>
#include <string.h>

#include "core/act.h"
#include "core/bf16.h"

#define K3_LAT_ALIGN 64

static size_t lat_align(size_t v) { return (v + (K3_LAT_ALIGN - 1)) & ~(size_t)(K3_LAT_ALIGN - 1); }

typedef struct lat_ws_layout {
    size_t ids, wts, rscratch, xl, u, v, z, g, gf, af, a, s, moe, local, total;
} lat_ws_layout;

static lat_ws_layout lat_layout(const k3_cpu_latent *p) {
    const k3_latent_moe_desc *d = &p->d;
    const size_t mt = (size_t)d->max_tokens, k = (size_t)d->experts.top_k, e = (size_t)d->experts.num_experts;
    const size_t h = (size_t)d->hidden, l = (size_t)d->experts.hidden, is = (size_t)d->shared_inter;
    const size_t sr = (size_t)p->shared_rows;
    lat_ws_layout s;
    size_t o = 0;
    s.ids = o, o += lat_align(mt * k * sizeof(int32_t));
    s.wts = o, o += lat_align(mt * k * sizeof(float));
    s.rscratch = o, o += lat_align(e * sizeof(float));
    s.xl = o, o += lat_align(mt * l * sizeof(uint16_t));
    s.u = o, o += lat_align(mt * l * sizeof(float));
    s.v = o, o += lat_align(mt * l * sizeof(uint16_t));
    s.z = o, o += lat_align(mt * h * sizeof(uint16_t));
    s.g = o, o += lat_align(mt * sr * sizeof(uint16_t));
    s.gf = o, o += lat_align(sr * sizeof(float));
    s.af = o, o += lat_align(is * sizeof(float));
    s.a = o, o += lat_align(mt * is * sizeof(uint16_t));
    s.s = o, o += lat_align(mt * h * sizeof(uint16_t));
    s.moe = o, o += lat_align(k3_cpu_moe_workspace_size(&p->experts));
    s.local = o, o += d->experts.global_experts > 0 ? lat_align(mt * k * sizeof(int32_t)) : 0;
    s.total = o;
    return s;
}

size_t k3_cpu_latent_workspace_size(const k3_cpu_latent *p) { return lat_layout(p).total + K3_LAT_ALIGN; }

/* The workspace's buffers of one call. */
typedef struct lat_bufs {
    int32_t *ids, *local; /* local: the ids mapped to this rank's experts (expert parallelism) */
    float *wts, *rscratch, *u, *gf, *af;
    uint16_t *xl, *v, *z, *g, *a, *sh;
    void *moe;
} lat_bufs;

static lat_bufs lat_bind(const k3_cpu_latent *p, void *ws, int32_t *topk_ids, float *topk_weights) {
    const lat_ws_layout s = lat_layout(p);
    uint8_t *base = (uint8_t *)(((uintptr_t)ws + (K3_LAT_ALIGN - 1)) & ~(uintptr_t)(K3_LAT_ALIGN - 1));
    lat_bufs b;
    b.ids = topk_ids ? topk_ids : (int32_t *)(void *)(base + s.ids);
    b.wts = topk_weights ? topk_weights : (float *)(void *)(base + s.wts);
    b.rscratch = (float *)(void *)(base + s.rscratch), b.u = (float *)(void *)(base + s.u);
    b.xl = (uint16_t *)(void *)(base + s.xl), b.v = (uint16_t *)(void *)(base + s.v);
    b.z = (uint16_t *)(void *)(base + s.z), b.g = (uint16_t *)(void *)(base + s.g);
    b.gf = (float *)(void *)(base + s.gf), b.af = (float *)(void *)(base + s.af);
    b.a = (uint16_t *)(void *)(base + s.a), b.sh = (uint16_t *)(void *)(base + s.s);
    b.moe = base + s.moe;
    b.local = (int32_t *)(void *)(base + s.local);
    return b;
}

/* 1-3: routing on the full-width x, the latent projection, the experts' fp32 sum into u */
static void lat_routed(const k3_cpu_latent *p, int64_t m, const uint16_t *x, const k3_latent_moe_weights *w,
                       const lat_bufs *b, float *u, k3_cpu_stage_fn mark, void *mark_user) {
    const k3_latent_moe_desc *d = &p->d;
    const int64_t h = d->hidden, l = d->experts.hidden;
    k3_cpu_router(&d->router, m, x, w->gate, w->bias, b->ids, b->wts, b->rscratch);
    if (mark) mark(mark_user, K3_LATENT_STAGE_ROUTER);
    k3_cpu_linear(m, l, h, x, h, (const uint16_t *)w->down_proj, NULL, b->xl, l, K3_ACCUM_FP32);
    if (mark) mark(mark_user, K3_LATENT_STAGE_DOWN);
    const int32_t *ids = b->ids;
    if (d->experts.global_experts > 0) { /* the router chose among all ranks' experts */
        k3_cpu_moe_map_ids(b->ids, (int32_t)(m * d->experts.top_k), w->experts.expert_map, d->experts.global_experts,
                           b->local);
        ids = b->local;
    }
    k3_cpu_moe_run(&p->experts, m, b->xl, ids, b->wts, &w->experts, NULL, u, b->moe);
    if (mark) mark(mark_user, K3_LATENT_STAGE_EXPERTS);
}

/* 4 and 7: RMSNorm of the aggregated latent u, then back to the full width with the addend t (or NULL) added
   before the one rounding: y */
static void lat_norm_up(const k3_cpu_latent *p, int64_t m, const float *u, const k3_latent_moe_weights *w,
                        const lat_bufs *b, const uint16_t *addend, uint16_t *y) {
    const k3_latent_moe_desc *d = &p->d;
    const int64_t h = d->hidden, l = d->experts.hidden;
    const uint16_t *nw = (const uint16_t *)w->norm;
    for (int64_t t = 0; t < m; t++) {
        const float *ut = u + t * l;
        float ss = 0.0f;
        for (int64_t c = 0; c < l; c++) ss += ut[c] * ut[c];
        const float r = 1.0f / sqrtf(ss / (float)l + d->rms_eps);
        for (int64_t c = 0; c < l; c++)
            b->v[t * l + c] = k3_f32_to_bf16_bits(k3_round_bf16(ut[c] * r) * k3_bf16_bits_to_f32(nw[c]));
    }
    k3_cpu_linear(m, h, l, b->v, l, (const uint16_t *)w->up_proj, addend, y, h, K3_ACCUM_FP32);
}

/* 5: the shared experts on the original x: s = b->sh (BF16), or, when s_f32 is not NULL, its unrounded fp32 sums
   there instead (a rank's partial, rounded once after the cross-rank sum) */
static void lat_shared(const k3_cpu_latent *p, int64_t m, const uint16_t *x, const k3_latent_moe_weights *w,
                       const lat_bufs *b, float *s_f32) {
    const k3_latent_moe_desc *d = &p->d;
    const int64_t h = d->hidden, is = d->shared_inter, sr = p->shared_rows;
    k3_cpu_linear(m, sr, h, x, h, (const uint16_t *)w->shared_gate_up, NULL, b->g, sr, K3_ACCUM_FP32);
    for (int64_t t = 0; t < m; t++) {
        for (int64_t c = 0; c < sr; c++) b->gf[c] = k3_bf16_bits_to_f32(b->g[t * sr + c]);
        k3_act_row(&d->shared_act, b->gf, b->af, is);
        for (int64_t c = 0; c < is; c++) b->a[t * is + c] = k3_f32_to_bf16_bits(b->af[c]);
    }
    if (s_f32)
        k3_cpu_linear_f32out(m, h, is, b->a, is, (const uint16_t *)w->shared_down, s_f32, h);
    else
        k3_cpu_linear(m, h, is, b->a, is, (const uint16_t *)w->shared_down, NULL, b->sh, h, K3_ACCUM_FP32);
}

void k3_cpu_latent_run(const k3_cpu_latent *p, int64_t m, const uint16_t *x, const k3_latent_moe_weights *w,
                       const uint16_t *residual, uint16_t *y, int32_t *topk_ids, float *topk_weights, void *ws,
                       k3_cpu_stage_fn mark, void *mark_user) {
    const int64_t h = p->d.hidden, is = p->d.shared_inter;
    const lat_bufs b = lat_bind(p, ws, topk_ids, topk_weights);
    lat_routed(p, m, x, w, &b, b.u, mark, mark_user);
    const uint16_t *t = residual;
    if (is > 0) {
        lat_shared(p, m, x, w, &b, NULL);
        t = b.sh;
        if (residual) { /* 6: t = bf16(s + residual), in z's buffer */
            for (int64_t i = 0; i < m * h; i++)
                b.z[i] = k3_f32_to_bf16_bits(k3_bf16_bits_to_f32(b.sh[i]) + k3_bf16_bits_to_f32(residual[i]));
            t = b.z;
        }
    }
    if (mark) mark(mark_user, K3_LATENT_STAGE_SHARED);
    lat_norm_up(p, m, b.u, w, &b, t, y);
    if (mark) mark(mark_user, K3_LATENT_STAGE_NORM_UP);
}

void k3_cpu_latent_run_pre(const k3_cpu_latent *p, int64_t m, const uint16_t *x, const k3_latent_moe_weights *w,
                           float *partial, int32_t *topk_ids, float *topk_weights, void *ws) {
    const int64_t l = p->d.experts.hidden, is = p->d.shared_inter;
    const lat_bufs b = lat_bind(p, ws, topk_ids, topk_weights);
    lat_routed(p, m, x, w, &b, partial, NULL, NULL);
    if (is > 0) lat_shared(p, m, x, w, &b, partial + m * l);
}

void k3_cpu_latent_run_post(const k3_cpu_latent *p, int64_t m, const float *partial, const k3_latent_moe_weights *w,
                            const uint16_t *residual, uint16_t *y, void *ws) {
    const int64_t h = p->d.hidden, l = p->d.experts.hidden, is = p->d.shared_inter;
    const lat_bufs b = lat_bind(p, ws, NULL, NULL);
    const uint16_t *t = residual;
    if (is > 0) { /* 6: t = bf16(bf16(s) + residual): the summed shared output's one rounding, as in the whole block */
        const float *s = partial + m * l;
        for (int64_t i = 0; i < m * h; i++) {
            float acc = k3_round_bf16(s[i]);
            if (residual) acc += k3_bf16_bits_to_f32(residual[i]);
            b.z[i] = k3_f32_to_bf16_bits(acc);
        }
        t = b.z;
    }
    lat_norm_up(p, m, partial, w, &b, t, y);
}
