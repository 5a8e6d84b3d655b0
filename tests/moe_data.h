/*
 * Random routed-expert weights and inputs for the MoE tests, drawn directly in each storage format: BF16 values,
 * or random FP4 codes with random block-scale codes (e4m3 or ue8m0) and per-expert global scales chosen so a
 * dequantized weight has rms ~ 1/sqrt(K). Swizzled scale buffers have their padding filled with NaN codes, so
 * a read of the padding shows up as NaN in the output.
 */
#ifndef K3_TESTS_MOE_DATA_H
#define K3_TESTS_MOE_DATA_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k3.h"
#include "ref_moe.h"
#include "test_util.h"

typedef struct moe_data {
    k3_moe_weights w;
    void *w13, *w2;
    uint8_t *w13s, *w2s;
    float *s2_13, *s2_2, *is13, *is2;
} moe_data;

/* Fills one [E, rows, cols] weight and its scales in d's format (global scales into *s2, e per expert or
 * 2 per expert when sep). */
static inline void md_fill_matrix(const k3_moe_desc *d, k3t_rng *r, int64_t rows, int64_t cols, int sep, void **wt,
                                  uint8_t **sc, float **s2) {
    const int64_t e = d->num_experts;
    if (d->format == K3_WEIGHT_BF16) {
        uint16_t *w = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(e * rows * cols));
        const double sd = 1.0 / sqrt((double)cols);
        for (int64_t i = 0; i < e * rows * cols; i++) w[i] = k3_bf16_from_f32((float)(k3t_normal(r) * sd));
        *wt = w;
        *sc = NULL;
        *s2 = NULL;
        return;
    }
    const int64_t bs = d->format == K3_WEIGHT_NVFP4 ? 16 : 32, scols = cols / bs;
    const int64_t per = ref_scale_bytes(d->scale_layout, rows, cols, bs);
    uint8_t *w = (uint8_t *)malloc((size_t)(e * rows * cols / 2));
    for (int64_t i = 0; i < e * rows * cols / 2; i++) w[i] = (uint8_t)(k3t_next(r) >> 56);
    uint8_t *s = (uint8_t *)malloc((size_t)(e * per));
    memset(s, d->format == K3_WEIGHT_NVFP4 ? 0x7f : 0xff, (size_t)(e * per)); /* NaN padding */
    /* rms of a uniformly random E2M1 code is sqrt(68.5 / 8) ~ 2.93 */
    const double target = 1.0 / sqrt((double)cols) / 2.93;
    for (int64_t x = 0; x < e; x++)
        for (int64_t rr = 0; rr < rows; rr++)
            for (int64_t c = 0; c < scols; c++) {
                const int64_t off = d->scale_layout == K3_SCALE_LINEAR ? rr * scols + c : ref_swizzle(rr, c, scols);
                uint8_t code;
                if (d->format == K3_WEIGHT_NVFP4)
                    code = (uint8_t)(0x30 + (k3t_next(r) >> 60)); /* 0.5 .. 3.75 */
                else
                    code = (uint8_t)(127 + (int)floor(log2(target)) + (int)(k3t_next(r) % 3) - 1);
                s[x * per + off] = code;
            }
    float *g = NULL;
    if (d->format == K3_WEIGHT_NVFP4) {
        const int64_t n = e * (sep ? 2 : 1);
        g = (float *)malloc(sizeof(float) * (size_t)n);
        /* the block scales above average ~1.1 */
        for (int64_t i = 0; i < n; i++) g[i] = (float)(target / 1.1 * (0.75 + 0.5 * (k3t_uniform(r) * 0.5 + 0.5)));
    }
    *wt = w;
    *sc = s;
    *s2 = g;
}

static inline void md_make(moe_data *md, const k3_moe_desc *d, k3t_rng *r) {
    memset(md, 0, sizeof *md);
    const int64_t w1 = (d->act.kind == K3_ACT_RELU2_NO_MUL ? 1 : 2) * d->inter;
    md_fill_matrix(d, r, w1, d->hidden, d->w13_separate_scale_2, &md->w13, &md->w13s, &md->s2_13);
    md_fill_matrix(d, r, d->hidden, d->inter, 0, &md->w2, &md->w2s, &md->s2_2);
    if (d->mode == K3_MOE_W4A4) {
        md->is13 = (float *)malloc(sizeof(float) * (size_t)d->num_experts);
        md->is2 = (float *)malloc(sizeof(float) * (size_t)d->num_experts);
        /* ModelOpt's input_scale = amax / 2688 with amax ~ 4 for N(0,1) inputs and ~ 2 for the activations */
        for (int32_t e = 0; e < d->num_experts; e++) {
            md->is13[e] = (float)(4.0 / 2688.0 * (0.8 + 0.4 * (k3t_uniform(r) * 0.5 + 0.5)));
            md->is2[e] = (float)(2.0 / 2688.0 * (0.8 + 0.4 * (k3t_uniform(r) * 0.5 + 0.5)));
        }
    }
    md->w.w13 = md->w13;
    md->w.w13_scale = md->w13s;
    md->w.w13_scale_2 = md->s2_13;
    md->w.w13_input_scale = md->is13;
    md->w.w2 = md->w2;
    md->w.w2_scale = md->w2s;
    md->w.w2_scale_2 = md->s2_2;
    md->w.w2_input_scale = md->is2;
}

static inline void md_free(moe_data *md) {
    free(md->w13);
    free(md->w2);
    free(md->w13s);
    free(md->w2s);
    free(md->s2_13);
    free(md->s2_2);
    free(md->is13);
    free(md->is2);
}

/* BF16 x [n] ~ N(0, sd^2). */
static inline uint16_t *md_bf16_normal(k3t_rng *r, int64_t n, double sd) {
    uint16_t *x = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = k3_bf16_from_f32((float)(k3t_normal(r) * sd));
    return x;
}

/* Routing for m tokens: k distinct random experts per token, weights in [0.05, 1). */
static inline void md_route(k3t_rng *r, int64_t m, int32_t e, int32_t k, int32_t *ids, float *wts) {
    for (int64_t t = 0; t < m; t++)
        for (int32_t j = 0; j < k; j++) {
            int32_t id, dup;
            do {
                id = (int32_t)(k3t_next(r) % (uint64_t)e);
                dup = 0;
                for (int32_t i = 0; i < j; i++) dup |= ids[t * k + i] == id;
            } while (dup);
            ids[t * k + j] = id;
            wts[t * k + j] = 0.05f + 0.95f * (k3t_uniform(r) * 0.5f + 0.5f);
        }
}

#endif
