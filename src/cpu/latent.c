/*
 * The Kimi-K3 latent-MoE block on the CPU (docs/model.md section 4). For each token x [H] (BF16), in this order and
 * with exactly these roundings (every "bf16(...)" is one round-to-nearest-even of an fp32 value):
 *   1. routing   ids, p = router(x)                      fp32 logits (k3_cpu_router)
 *   2. down      x_l = bf16(x . W_down^T)                fp32 accumulation          [L]
 *   3. experts   u   = sum_j p_j E_j(x_l)                fp32, NOT rounded (moe.c)   [L]
 *   4. RMSNorm   r   = 1 / sqrt(mean(u^2) + eps)         fp32 (sum of squares in index order)
 *                n   = bf16(u * r); v = bf16(n * norm)   norm is the BF16 weight [L]
 *   5. up        z   = bf16(v . W_up^T)                  fp32 accumulation          [H]
 *   6. shared    g   = bf16(x . W_gate_up^T)             [width * Is], the original x
 *                a   = bf16(shared_act(g))               fp32 math, one rounding    [Is]
 *                s   = bf16(a . W_shared_down^T)         [H]; s = 0 without shared experts
 *   7. output    y   = bf16((z + s) + residual)          fp32 adds, one rounding (no residual: bf16(z + s))
 * With shared experts absent and no residual, y = z exactly.
 */
#include "cpu/cpu.h"

#include <math.h>
#include <string.h>

#include "core/act.h"
#include "core/bf16.h"

#define K3_LAT_ALIGN 64

static size_t lat_align(size_t v) { return (v + (K3_LAT_ALIGN - 1)) & ~(size_t)(K3_LAT_ALIGN - 1); }

typedef struct lat_ws_layout {
    size_t ids, wts, rscratch, xl, u, v, z, g, gf, af, a, s, moe, total;
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
    s.total = o;
    return s;
}

size_t k3_cpu_latent_workspace_size(const k3_cpu_latent *p) { return lat_layout(p).total + K3_LAT_ALIGN; }

void k3_cpu_latent_run(const k3_cpu_latent *p, int64_t m, const uint16_t *x, const k3_latent_moe_weights *w,
                       const uint16_t *residual, uint16_t *y, int32_t *topk_ids, float *topk_weights, void *ws,
                       k3_cpu_stage_fn mark, void *mark_user) {
    const k3_latent_moe_desc *d = &p->d;
    const int64_t h = d->hidden, l = d->experts.hidden, is = d->shared_inter, sr = p->shared_rows;
    const lat_ws_layout s = lat_layout(p);
    uint8_t *base = (uint8_t *)(((uintptr_t)ws + (K3_LAT_ALIGN - 1)) & ~(uintptr_t)(K3_LAT_ALIGN - 1));
    int32_t *ids = topk_ids ? topk_ids : (int32_t *)(void *)(base + s.ids);
    float *wts = topk_weights ? topk_weights : (float *)(void *)(base + s.wts);
    float *rscratch = (float *)(void *)(base + s.rscratch), *u = (float *)(void *)(base + s.u);
    uint16_t *xl = (uint16_t *)(void *)(base + s.xl), *v = (uint16_t *)(void *)(base + s.v);
    uint16_t *z = (uint16_t *)(void *)(base + s.z), *g = (uint16_t *)(void *)(base + s.g);
    float *gf = (float *)(void *)(base + s.gf), *af = (float *)(void *)(base + s.af);
    uint16_t *a = (uint16_t *)(void *)(base + s.a), *sh = (uint16_t *)(void *)(base + s.s);

    /* 1-3: routing on the full-width x, the latent projection, the experts' fp32 sum */
    k3_cpu_router(&d->router, m, x, w->gate, w->bias, ids, wts, rscratch);
    if (mark) mark(mark_user, K3_LATENT_STAGE_ROUTER);
    k3_cpu_linear(m, l, h, x, h, (const uint16_t *)w->down_proj, NULL, xl, l, K3_ACCUM_FP32);
    if (mark) mark(mark_user, K3_LATENT_STAGE_DOWN);
    k3_cpu_moe_run(&p->experts, m, xl, ids, wts, &w->experts, NULL, u, base + s.moe);
    if (mark) mark(mark_user, K3_LATENT_STAGE_EXPERTS);

    /* 4: RMSNorm of the aggregated latent */
    const uint16_t *nw = (const uint16_t *)w->norm;
    for (int64_t t = 0; t < m; t++) {
        const float *ut = u + t * l;
        float ss = 0.0f;
        for (int64_t c = 0; c < l; c++) ss += ut[c] * ut[c];
        const float r = 1.0f / sqrtf(ss / (float)l + d->rms_eps);
        for (int64_t c = 0; c < l; c++)
            v[t * l + c] = k3_f32_to_bf16_bits(k3_round_bf16(ut[c] * r) * k3_bf16_bits_to_f32(nw[c]));
    }
    /* 5: back to the full width */
    k3_cpu_linear(m, h, l, v, l, (const uint16_t *)w->up_proj, NULL, z, h, K3_ACCUM_FP32);
    if (mark) mark(mark_user, K3_LATENT_STAGE_NORM_UP);

    /* 6: the shared experts on the original x */
    if (is > 0) {
        k3_cpu_linear(m, sr, h, x, h, (const uint16_t *)w->shared_gate_up, NULL, g, sr, K3_ACCUM_FP32);
        for (int64_t t = 0; t < m; t++) {
            for (int64_t c = 0; c < sr; c++) gf[c] = k3_bf16_bits_to_f32(g[t * sr + c]);
            k3_act_row(&d->shared_act, gf, af, is);
            for (int64_t c = 0; c < is; c++) a[t * is + c] = k3_f32_to_bf16_bits(af[c]);
        }
        k3_cpu_linear(m, h, is, a, is, (const uint16_t *)w->shared_down, NULL, sh, h, K3_ACCUM_FP32);
    }

    /* 7: one rounding of the fp32 sum */
    for (int64_t i = 0; i < m * h; i++) {
        float acc = k3_bf16_bits_to_f32(z[i]);
        if (is > 0) acc += k3_bf16_bits_to_f32(sh[i]);
        if (residual) acc += k3_bf16_bits_to_f32(residual[i]);
        y[i] = k3_f32_to_bf16_bits(acc);
    }
    if (mark) mark(mark_user, K3_LATENT_STAGE_SHARED);
}
