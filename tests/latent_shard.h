/* One tensor-parallel rank's shard of a latent-MoE block, cut on the host from the full block's weights the way
 * TP serves Kimi-K3: the experts' w13 gate and up rows sliced alike, w2's columns, the shared experts' gate_up rows
 * (gate and up alike) and shared_down's columns; the router and the latent projections are whole on every rank.
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
    k3_latent_moe_desc d; /* the rank's descriptor: TP, rank of size, I / size and Is / size */
    uint8_t *w13, *w13s, *w2, *w2s, *sgu, *sdown;
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

/* The full block's weights with this shard's pieces in place (router, latent projections, scale_2 unchanged). */
static inline k3_latent_moe_weights k3t_tp_weights(const k3t_tp_shard *s, const k3_latent_moe_weights *full) {
    k3_latent_moe_weights w = *full;
    w.experts.w13 = s->w13;
    w.experts.w13_scale = s->w13s;
    w.experts.w2 = s->w2;
    w.experts.w2_scale = s->w2s;
    w.shared_gate_up = s->sgu;
    w.shared_down = s->sdown;
    return w;
}

static inline void k3t_tp_free(k3t_tp_shard *s) {
    free(s->w13);
    free(s->w13s);
    free(s->w2);
    free(s->w2s);
    free(s->sgu);
    free(s->sdown);
}

#endif
