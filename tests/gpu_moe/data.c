/* gpu_moe: the experts' test data (weights quantized on the host, routings) and its device copies. */
#ifdef K3_HAVE_CUDA
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_moe/gpu_moe.h"

void fill_routing(const mcase *c, int32_t route, k3t_rng *rng, int32_t *ids, float *wts) {
    const int32_t M = (int32_t)c->c.m, K = (int32_t)c->c.shape[1], E = (int32_t)c->c.shape[0];
    for (int32_t t = 0; t < M; t++) {
        int32_t *row = ids + (int64_t)t * K;
        float sum = 0.0f;
        for (int32_t j = 0; j < K; j++) {
            int32_t e;
            int dup;
            do { /* distinct experts per token, as a router gives (except ROUTE_DUP) */
                if (route == ROUTE_DUP) {
                    e = 3 % E;
                    break;
                }
                if (route == ROUTE_ONE_EXPERT && j == 0) e = 3 % E;
                else if (route == ROUTE_LOW_EXPERTS) e = (int32_t)(k3t_next(rng) % (uint64_t)(K + 1 < E ? K + 1 : E));
                else e = (int32_t)(k3t_next(rng) % (uint64_t)E);
                dup = 0;
                for (int32_t i = 0; i < j; i++) dup |= row[i] == e;
            } while (dup);
            row[j] = e;
            wts[(int64_t)t * K + j] = 0.1f + 0.9f * (0.5f + 0.5f * k3t_uniform(rng));
            sum += wts[(int64_t)t * K + j];
        }
        for (int32_t j = 0; j < K; j++) wts[(int64_t)t * K + j] /= sum;
        if (route != ROUTE_EP) continue;
        for (int32_t j = 0; j < K; j++) { /* the weights stay the router's: the dropped share is another rank's */
            const int32_t h = (int32_t)(((int64_t)t * K + j) % 7);
            if (t == 1 || h == 1) row[j] = -1;
            else if (h == 4) row[j] = t % 2 ? E : E + 100;
            else if (h == 6 && t % 5 == 0) row[j] = INT32_MIN;
        }
    }
}

int moe_data_make(moe_data *md, const mcase *c, k3t_rng *rng) {
    memset(md, 0, sizeof *md);
    k3_moe_desc *d = &md->d;
    k3_moe_desc_init(d);
    const int64_t E = c->c.shape[0], L = c->c.shape[2], I = c->c.shape[3];
    d->num_experts = (int32_t)E, d->top_k = (int32_t)c->c.shape[1], d->hidden = L, d->inter = I, d->format = c->fmt;
    d->scale_layout = c->layout, d->w13_separate_scale_2 = c->sep, d->mode = c->mode, d->max_tokens = c->c.m;
    if (c->act == K3_ACT_SITU) k3_act_desc_k3(&d->act);
    else k3_act_desc_init(&d->act, c->act);
    if (c->act == K3_ACT_SILU) d->act.limit = 7.0f; /* exercise the clamp */
    const int64_t w1 = (c->act == K3_ACT_RELU2_NO_MUL ? 1 : 2) * I;
    const int fp4 = c->fmt != K3_WEIGHT_BF16;
    md->w13_b = (size_t)(E * w1 * L) * (fp4 ? 1 : 4) / 2;
    md->w2_b = (size_t)(E * L * I) * (fp4 ? 1 : 4) / 2;
    if (fp4) {
        const k3_fp4_format f = c->fmt == K3_WEIGHT_NVFP4 ? K3_FP4_NVFP4 : K3_FP4_MXFP4;
        size_t a = 0, b = 0;
        if (k3_fp4_scale_bytes(f, c->layout, w1, L, &a) != K3_STATUS_SUCCESS ||
            k3_fp4_scale_bytes(f, c->layout, L, I, &b) != K3_STATUS_SUCCESS)
            return 0;
        md->w13s_b = a * (size_t)E, md->w2s_b = b * (size_t)E;
    }
    md->w13 = (uint8_t *)malloc(md->w13_b), md->w2 = (uint8_t *)malloc(md->w2_b);
    md->w13s = (uint8_t *)malloc(md->w13s_b + 1), md->w2s = (uint8_t *)malloc(md->w2s_b + 1);
    md->s13 = (float *)malloc((size_t)E * 8), md->s2 = (float *)malloc((size_t)E * 4);
    md->in13 = (float *)malloc((size_t)E * 4), md->in2 = (float *)malloc((size_t)E * 4);
    if (!md->w13 || !md->w2 || !md->w13s || !md->w2s || !md->s13 || !md->s2 || !md->in13 || !md->in2) return 0;
    if (fp4) {
        /* random codes; scales keep the dot products O(1): e4m3 codes 0x28..0x40 (0.25 .. 2), ue8m0 124..129 */
        k3t_fill_bytes(rng, md->w13, md->w13_b);
        k3t_fill_bytes(rng, md->w2, md->w2_b);
        const int nv = c->fmt == K3_WEIGHT_NVFP4;
        for (size_t i = 0; i < md->w13s_b; i++) md->w13s[i] = (uint8_t)(nv ? 0x28 + k3t_next(rng) % 25 : 124 + k3t_next(rng) % 6);
        for (size_t i = 0; i < md->w2s_b; i++) md->w2s[i] = (uint8_t)(nv ? 0x28 + k3t_next(rng) % 25 : 124 + k3t_next(rng) % 6);
    } else {
        uint16_t *a = (uint16_t *)(void *)md->w13, *b = (uint16_t *)(void *)md->w2;
        for (int64_t i = 0; i < E * w1 * L; i++) a[i] = k3t_rand_bf16(rng, 2.0f / sqrtf((float)L));
        for (int64_t i = 0; i < E * L * I; i++) b[i] = k3t_rand_bf16(rng, 2.0f / sqrtf((float)I));
    }
    for (int64_t e = 0; e < E; e++) {
        md->s13[2 * e] = (0.7f + 0.3f * k3t_uniform(rng)) / sqrtf((float)L);
        md->s13[2 * e + 1] = c->sep ? (0.7f + 0.3f * k3t_uniform(rng)) / sqrtf((float)L) : md->s13[2 * e];
        md->s2[e] = (0.7f + 0.3f * k3t_uniform(rng)) / sqrtf((float)I);
        md->in13[e] = (1.0f + 0.2f * k3t_uniform(rng)) / 2688.0f;
        md->in2[e] = (3.0f + 0.5f * k3t_uniform(rng)) / 2688.0f;
    }
    if (!c->sep) /* shared scale_2: [E] */
        for (int64_t e = 0; e < E; e++) md->s13[e] = md->s13[2 * e];
    md->hw.w13 = md->w13, md->hw.w2 = md->w2;
    md->hw.w13_scale = fp4 ? md->w13s : NULL, md->hw.w2_scale = fp4 ? md->w2s : NULL;
    md->hw.w13_scale_2 = c->fmt == K3_WEIGHT_NVFP4 ? md->s13 : NULL;
    md->hw.w2_scale_2 = c->fmt == K3_WEIGHT_NVFP4 ? md->s2 : NULL;
    md->hw.w13_input_scale = c->mode == K3_MOE_W4A4 ? md->in13 : NULL;
    md->hw.w2_input_scale = c->mode == K3_MOE_W4A4 ? md->in2 : NULL;
    md->dw.w13 = k3t_dup(md->w13, md->w13_b);
    md->dw.w2 = k3t_dup(md->w2, md->w2_b);
    md->dw.w13_scale = fp4 ? k3t_dup(md->w13s, md->w13s_b) : NULL;
    md->dw.w2_scale = fp4 ? k3t_dup(md->w2s, md->w2s_b) : NULL;
    md->dw.w13_scale_2 = md->hw.w13_scale_2 ? (const float *)k3t_dup(md->s13, (size_t)E * 8) : NULL;
    md->dw.w2_scale_2 = md->hw.w2_scale_2 ? (const float *)k3t_dup(md->s2, (size_t)E * 4) : NULL;
    md->dw.w13_input_scale = md->hw.w13_input_scale ? (const float *)k3t_dup(md->in13, (size_t)E * 4) : NULL;
    md->dw.w2_input_scale = md->hw.w2_input_scale ? (const float *)k3t_dup(md->in2, (size_t)E * 4) : NULL;
    return md->dw.w13 && md->dw.w2;
}

void moe_data_free(moe_data *md) {
    free(md->w13), free(md->w2), free(md->w13s), free(md->w2s), free(md->s13), free(md->s2), free(md->in13), free(md->in2);
    cudaFree((void *)md->dw.w13), cudaFree((void *)md->dw.w2), cudaFree((void *)md->dw.w13_scale);
    cudaFree((void *)md->dw.w2_scale), cudaFree((void *)md->dw.w13_scale_2), cudaFree((void *)md->dw.w2_scale_2);
    cudaFree((void *)md->dw.w13_input_scale), cudaFree((void *)md->dw.w2_input_scale);
}

const char *fmt_name(k3_weight_format f) {
    return f == K3_WEIGHT_NVFP4 ? "nvfp4" : f == K3_WEIGHT_MXFP4 ? "mxfp4" : "bf16";
}
#endif
