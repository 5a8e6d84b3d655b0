/* One tensor-parallel rank's shard of a latent-MoE block, cut on the host from the full block's weights the way
 * TP serves Kimi-K3: the experts' w13 gate and up rows sliced alike, w2's columns, the shared experts' gate_up rows
 * (gate and up alike) and shared_down's columns; the router and the latent projections are whole on every rank.
 * Or an EP rank's: a contiguous range of whole experts with its expert map, the shared experts cut as for TP.
 * Shared by the CPU and GPU stage tests (their expected values come from the unsharded block). */
#ifndef K3_TESTS_LATENT_SHARD_H
#define K3_TESTS_LATENT_SHARD_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k3.h"

/* Rows [gate slice; up slice] of `mats` matrices of 2 * rows_half rows of row_bytes: rows [r0, r0 + n) of each
 * half. NULL when src is NULL. */
static inline uint8_t *k3t_cut_gated_rows(const void *src, int64_t mats, int64_t rows_half, size_t row_bytes,
                                          int64_t r0, int64_t n) {
    if (!src) return NULL;
    uint8_t *dst = (uint8_t *)malloc((size_t)(mats * 2 * n) * row_bytes);
    const uint8_t *s = (const uint8_t *)src;
    for (int64_t e = 0; dst && e < mats; e++)
        for (int half = 0; half < 2; half++)
            memcpy(dst + (size_t)((e * 2 + half) * n) * row_bytes,
                   s + (size_t)(e * 2 * rows_half + half * rows_half + r0) * row_bytes, (size_t)n * row_bytes);
    return dst;
}

/* Bytes [c0, c0 + n) of each of `rows` rows of row_bytes. NULL when src is NULL. */
static inline uint8_t *k3t_cut_cols(const void *src, int64_t rows, size_t row_bytes, size_t c0, size_t n) {
    if (!src) return NULL;
    uint8_t *dst = (uint8_t *)malloc((size_t)rows * n);
    for (int64_t i = 0; dst && i < rows; i++)
        memcpy(dst + (size_t)i * n, (const uint8_t *)src + (size_t)i * row_bytes + c0, n);
    return dst;
}

typedef struct k3t_tp_shard {
    k3_latent_moe_desc d; /* the rank's descriptor: TP (I / size) or EP (its experts), Is / size either way */
    uint8_t *w13, *w13s, *w2, *w2s, *sgu, *sdown;
    int32_t *map; /* EP: the expert map [global E] (NULL for TP) */
    float *g13, *g2, *in13, *in2; /* EP: this rank's experts' global and input scales (NULL when absent) */
} k3t_tp_shard;

/* Cuts rank `rank` of `size` from the full block's host weights (linear scales; gated activations; I and Is
 * divisible by size, I / size a multiple of the FP4 block). */
static inline void k3t_tp_cut(k3t_tp_shard *s, const k3_latent_moe_desc *full, const k3_moe_weights *ex,
                              const void *sgu, const void *sdown, int32_t rank, int32_t size) {
    memset(s, 0, sizeof *s);
    const k3_moe_desc *fe = &full->experts;
    const int64_t e = fe->num_experts, l = fe->hidden, in = fe->inter, ir = in / size;
    const int64_t h = full->hidden, is = full->shared_inter, isr = is / size;
    s->d = *full;
    s->d.parallel.layout = K3_PARALLEL_TP;
    s->d.parallel.rank = rank;
    s->d.parallel.size = size;
    s->d.experts.inter = ir;
    s->d.shared_inter = isr;
    if (fe->format == K3_WEIGHT_BF16) {
        s->w13 = k3t_cut_gated_rows(ex->w13, e, in, (size_t)l * 2, rank * ir, ir);
        s->w2 = k3t_cut_cols(ex->w2, e * l, (size_t)in * 2, (size_t)(rank * ir) * 2, (size_t)ir * 2);
    } else {
        const int64_t bs = fe->format == K3_WEIGHT_NVFP4 ? 16 : 32;
        s->w13 = k3t_cut_gated_rows(ex->w13, e, in, (size_t)l / 2, rank * ir, ir);
        s->w13s = k3t_cut_gated_rows(ex->w13_scale, e, in, (size_t)(l / bs), rank * ir, ir);
        s->w2 = k3t_cut_cols(ex->w2, e * l, (size_t)in / 2, (size_t)(rank * ir) / 2, (size_t)ir / 2);
        s->w2s = k3t_cut_cols(ex->w2_scale, e * l, (size_t)(in / bs), (size_t)(rank * ir / bs), (size_t)(ir / bs));
    }
    s->sgu = k3t_cut_gated_rows(sgu, 1, is, (size_t)h * 2, rank * isr, isr);
    s->sdown = k3t_cut_cols(sdown, h, (size_t)is * 2, (size_t)(rank * isr) * 2, (size_t)isr * 2);
}

/* Expert parallelism: rank `rank` of `size` holds the whole experts [rank * E / size, (rank + 1) * E / size) (its
 * expert map sends the others to -1) and Is / size of the shared experts, as TP cuts them. */
static inline void k3t_ep_cut(k3t_tp_shard *s, const k3_latent_moe_desc *full, const k3_moe_weights *ex,
                              const void *sgu, const void *sdown, int32_t rank, int32_t size) {
    memset(s, 0, sizeof *s);
    const k3_moe_desc *fe = &full->experts;
    const int64_t e = fe->num_experts, l = fe->hidden, in = fe->inter, h = full->hidden, is = full->shared_inter;
    const int64_t isr = is / size, e0 = rank * e / size, e1 = (rank + 1) * e / size, n = e1 - e0;
    s->d = *full;
    s->d.parallel.layout = K3_PARALLEL_EP;
    s->d.parallel.rank = rank;
    s->d.parallel.size = size;
    s->d.experts.num_experts = (int32_t)n;
    s->d.experts.global_experts = (int32_t)e;
    s->d.shared_inter = isr;
    size_t b13, b2, s13 = 0, s2 = 0;
    if (fe->format == K3_WEIGHT_BF16) {
        b13 = (size_t)(2 * in * l) * 2, b2 = (size_t)(l * in) * 2;
    } else {
        const int64_t bs = fe->format == K3_WEIGHT_NVFP4 ? 16 : 32;
        b13 = (size_t)(2 * in * l / 2), b2 = (size_t)(l * in / 2), s13 = (size_t)(2 * in * l / bs),
        s2 = (size_t)(l * in / bs);
    }
    /* whole experts are contiguous slices of the stacked buffers */
    s->w13 = k3t_cut_cols(ex->w13, 1, (size_t)e * b13, (size_t)e0 * b13, (size_t)n * b13);
    s->w2 = k3t_cut_cols(ex->w2, 1, (size_t)e * b2, (size_t)e0 * b2, (size_t)n * b2);
    if (s13) {
        s->w13s = k3t_cut_cols(ex->w13_scale, 1, (size_t)e * s13, (size_t)e0 * s13, (size_t)n * s13);
        s->w2s = k3t_cut_cols(ex->w2_scale, 1, (size_t)e * s2, (size_t)e0 * s2, (size_t)n * s2);
    }
    const size_t f = sizeof(float), f13 = (fe->w13_separate_scale_2 ? 2 : 1) * f;
    s->g13 = (float *)(void *)k3t_cut_cols(ex->w13_scale_2, 1, (size_t)e * f13, (size_t)e0 * f13, (size_t)n * f13);
    s->g2 = (float *)(void *)k3t_cut_cols(ex->w2_scale_2, 1, (size_t)e * f, (size_t)e0 * f, (size_t)n * f);
    s->in13 = (float *)(void *)k3t_cut_cols(ex->w13_input_scale, 1, (size_t)e * f, (size_t)e0 * f, (size_t)n * f);
    s->in2 = (float *)(void *)k3t_cut_cols(ex->w2_input_scale, 1, (size_t)e * f, (size_t)e0 * f, (size_t)n * f);
    s->map = (int32_t *)malloc(sizeof(int32_t) * (size_t)e);
    for (int64_t g = 0; s->map && g < e; g++) s->map[g] = g >= e0 && g < e1 ? (int32_t)(g - e0) : -1;
    s->sgu = k3t_cut_gated_rows(sgu, 1, is, (size_t)h * 2, rank * isr, isr);
    s->sdown = k3t_cut_cols(sdown, h, (size_t)is * 2, (size_t)(rank * isr) * 2, (size_t)isr * 2);
}

/* The full block's weights with this shard's pieces in place (router, latent projections, scale_2 unchanged). */
static inline k3_latent_moe_weights k3t_tp_weights(const k3t_tp_shard *s, const k3_latent_moe_weights *full) {
    k3_latent_moe_weights w = *full;
    w.experts.w13 = s->w13;
    w.experts.w13_scale = s->w13s;
    w.experts.w2 = s->w2;
    w.experts.w2_scale = s->w2s;
    w.shared_gate_up = s->sgu;
    w.shared_down = s->sdown;
    if (s->map) { /* EP: this rank's experts' global and input scales, and the map */
        w.experts.w13_scale_2 = s->g13, w.experts.w2_scale_2 = s->g2;
        w.experts.w13_input_scale = s->in13, w.experts.w2_input_scale = s->in2;
        w.experts.expert_map = s->map;
    }
    return w;
}

static inline void k3t_tp_free(k3t_tp_shard *s) {
    free(s->w13);
    free(s->w13s);
    free(s->w2);
    free(s->w2s);
    free(s->sgu);
    free(s->sdown);
    free(s->map);
    free(s->g13);
    free(s->g2);
    free(s->in13);
    free(s->in2);
}

#endif
