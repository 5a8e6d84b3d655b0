/*
 * The CPU router (docs/model.md section 3): fp32 logits, then sigmoid noaux_tc or softmax, top-k, weights.
 *
 * Determinism choices:
 * - logits: fused multiply-adds into K3_RT_LANES fixed partial sums combined in a fixed tree order;
 * - top-k: a stable insertion selection over ids in ascending order, so equal keys keep the lower id first;
 * - NaN: a NaN logit (or a NaN choice from a NaN bias) is the lowest possible key (-inf), so it is picked only
 *   after every other expert, lowest id first; its weight is 0 (sigmoid) or its probability is 0 (softmax).
 */
#include "cpu/cpu.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "core/bf16.h"
#include "core/router_math.h" /* sigmoid / exp shared bit-for-bit with the CUDA router */

/* The logits' summation order, shared with the CUDA router: element k goes to partial sum (k / K3_RT_PIECE) %
 * K3_RT_LANES, each partial sum takes its elements in ascending k, every step one fused multiply-add (a single
 * rounding), and the partial sums meet in a fixed tree. Pieces of 8 elements are one 16-byte load of a BF16 row on
 * the GPU; 128 partial sums keep each dependent chain short (56 steps at hidden 7168), at 8 per piece. */
#define K3_RT_LANES 128
#define K3_RT_PIECE 8

/* Halves first: l += l + 64, then l += l + 32, ..., l += l + 1 (the GPU: across its four warps through shared
 * memory, then shuffles inside one warp). */
static inline float rt_reduce(float *t) {
    for (int w = K3_RT_LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) t[l] += t[l + w];
    return t[0];
}

/* fma(x, g, a) for BF16 x and g: their product has at most 16 significant bits, so the rounded product p is exact
 * whenever it is a normal finite number (or either factor is zero or not finite), and a + p then rounds once, as the
 * fused operation does; only an underflowing or overflowing product needs the (slower) fmaf. */
static inline float rt_fma_bf16(float x, float g, float a) {
    const float p = x * g, ap = fabsf(p);
    if ((ap >= FLT_MIN && ap <= FLT_MAX) || x == 0.0f || g == 0.0f || !isfinite(x) || !isfinite(g)) return a + p;
    return fmaf(x, g, a);
}

static float rt_dot_bf16(const uint16_t *x, const uint16_t *g, int64_t h) {
    float acc[K3_RT_LANES] = {0};
    for (int64_t k0 = 0, piece = 0; k0 < h; k0 += K3_RT_PIECE, piece++) {
        float *a = &acc[piece % K3_RT_LANES];
        const int64_t k1 = k0 + K3_RT_PIECE < h ? k0 + K3_RT_PIECE : h;
        for (int64_t k = k0; k < k1; k++) *a = rt_fma_bf16(k3_bf16_bits_to_f32(x[k]), k3_bf16_bits_to_f32(g[k]), *a);
    }
    return rt_reduce(acc);
}

static float rt_dot_f32(const uint16_t *x, const float *g, int64_t h) {
    float acc[K3_RT_LANES] = {0};
    for (int64_t k0 = 0, piece = 0; k0 < h; k0 += K3_RT_PIECE, piece++) {
        float *a = &acc[piece % K3_RT_LANES];
        const int64_t k1 = k0 + K3_RT_PIECE < h ? k0 + K3_RT_PIECE : h;
        for (int64_t k = k0; k < k1; k++) *a = fmaf(k3_bf16_bits_to_f32(x[k]), g[k], *a);
    }
    return rt_reduce(acc);
}

/* Keeps the k largest keys seen so far in ids/vals, sorted descending; a new key must be strictly larger to
 * pass an equal one, and ids arrive in ascending order, so ties resolve to the lower id. */
static inline void rt_offer(int32_t e, float key, int32_t k, int32_t *cnt, int32_t *ids, float *vals) {
    if (*cnt == k && !(key > vals[k - 1])) return;
    int32_t pos = *cnt < k ? *cnt : k - 1;
    while (pos > 0 && key > vals[pos - 1]) {
        vals[pos] = vals[pos - 1];
        ids[pos] = ids[pos - 1];
        pos--;
    }
    vals[pos] = key;
    ids[pos] = e;
    if (*cnt < k) (*cnt)++;
}

static void rt_token_sigmoid(const k3_router_desc *d, const float *logits, const float *bias, int32_t *ids,
                             float *w) {
    const int32_t E = d->num_experts, k = d->top_k;
    float vals[32];
    int32_t cnt = 0;
    for (int32_t e = 0; e < E; e++) {
        float key = k3_rm_sigmoid(logits[e]) + (bias ? bias[e] : 0.0f);
        if (isnan(key)) key = -INFINITY;
        rt_offer(e, key, k, &cnt, ids, vals);
    }
    float sum = 0.0f;
    for (int32_t j = 0; j < k; j++) {
        const float l = logits[ids[j]];
        w[j] = isnan(l) ? 0.0f : k3_rm_sigmoid(l); /* the unbiased score */
        sum += w[j];
    }
    if (d->renormalize) {
        const float den = sum + 1e-20f;
        for (int32_t j = 0; j < k; j++) w[j] = w[j] / den * d->scaling_factor;
    } else {
        for (int32_t j = 0; j < k; j++) w[j] *= d->scaling_factor;
    }
}

/* probs overwrites logits (the scratch row). */
static void rt_token_softmax(const k3_router_desc *d, float *logits, int32_t *ids, float *w) {
    const int32_t E = d->num_experts, k = d->top_k;
    float mx = -INFINITY;
    for (int32_t e = 0; e < E; e++) {
        if (isnan(logits[e])) logits[e] = -INFINITY;
        if (logits[e] > mx) mx = logits[e];
    }
    float sum = 0.0f;
    for (int32_t e = 0; e < E; e++) {
        /* the maximum itself gets exactly 1, so an infinite maximum (or a row of -inf) stays well defined */
        const float p = logits[e] == mx ? 1.0f : k3_rm_exp(logits[e] - mx);
        logits[e] = p;
        sum += p;
    }
    const float inv = 1.0f / sum; /* sum >= 1: the maximum contributes 1 */
    float vals[32];
    int32_t cnt = 0;
    for (int32_t e = 0; e < E; e++) {
        logits[e] *= inv;
        rt_offer(e, logits[e], k, &cnt, ids, vals);
    }
    float tsum = 0.0f;
    for (int32_t j = 0; j < k; j++) {
        w[j] = vals[j];
        tsum += w[j];
    }
    const float scale = d->renormalize ? d->scaling_factor / tsum : d->scaling_factor; /* tsum >= the max > 0 */
    for (int32_t j = 0; j < k; j++) w[j] *= scale;
}

void k3_cpu_router(const k3_router_desc *d, int64_t m, const uint16_t *x, const void *gate, const float *bias,
                   int32_t *topk_ids, float *topk_weights, float *scratch) {
    const int64_t h = d->hidden;
    const int32_t E = d->num_experts, k = d->top_k;
    for (int64_t t = 0; t < m; t++) {
        const uint16_t *xt = x + t * h;
        if (d->gate_dtype == K3_DTYPE_F32) {
            const float *g = (const float *)gate;
            for (int32_t e = 0; e < E; e++) scratch[e] = rt_dot_f32(xt, g + (int64_t)e * h, h);
        } else {
            const uint16_t *g = (const uint16_t *)gate;
            for (int32_t e = 0; e < E; e++) scratch[e] = rt_dot_bf16(xt, g + (int64_t)e * h, h);
        }
        if (d->kind == K3_ROUTER_SOFTMAX)
            rt_token_softmax(d, scratch, topk_ids + t * k, topk_weights + t * k);
        else
            rt_token_sigmoid(d, scratch, bias, topk_ids + t * k, topk_weights + t * k);
    }
}
