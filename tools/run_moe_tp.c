/* k3 run moe --tp N / --ep N: the block (or the experts alone) as N tensor- or expert-parallel ranks in this
 * process, on shards cut here from the full weights (TP: the experts' w13 gate and up rows sliced alike, w2's
 * columns; EP: contiguous ranges of whole experts with their expert maps; both: the shared experts' gate_up rows
 * and down columns, the router and latent projections whole). The ranks' fp32 partials are summed in
 * rank order, as an all-reduce would, and finished as the library says: the latent block through its two stages
 * (k3_latent_moe_run_stage), the experts alone by one BF16 rounding of the summed fp32 output. CPU backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "run_moe.h"

/* Rows [gate slice; up slice] of `mats` matrices of 2 * half rows of row_bytes: rows [r0, r0 + n) of each half. */
/* Records a buffer the shard owns and its size (for copies to a device). */
static uint8_t *keep(k3_run_shard *r, uint8_t *p, size_t bytes) {
    if (p && r->nown < K3_RUN_SHARD_BUFS) r->own[r->nown] = p, r->own_bytes[r->nown++] = bytes;
    return p;
}

static uint8_t *cut_gated(k3_run_shard *r, const void *src, int64_t mats, int64_t half, size_t row_bytes, int64_t r0,
                          int64_t n) {
    uint8_t *dst = keep(r, (uint8_t *)malloc((size_t)(mats * 2 * n) * row_bytes + 1), (size_t)(mats * 2 * n) * row_bytes);
    const uint8_t *s = (const uint8_t *)src;
    for (int64_t e = 0; dst && e < mats; e++)
        for (int64_t g = 0; g < 2; g++)
            memcpy(dst + (size_t)((e * 2 + g) * n) * row_bytes, s + (size_t)(e * 2 * half + g * half + r0) * row_bytes,
                   (size_t)n * row_bytes);
    return dst;
}

/* Bytes [c0, c0 + n) of each of `rows` rows of row_bytes. */
static uint8_t *cut_cols(k3_run_shard *r, const void *src, int64_t rows, size_t row_bytes, size_t c0, size_t n) {
    uint8_t *dst = keep(r, (uint8_t *)malloc((size_t)rows * n + 1), (size_t)rows * n);
    for (int64_t i = 0; dst && i < rows; i++) memcpy(dst + (size_t)i * n, (const uint8_t *)src + (size_t)i * row_bytes + c0, n);
    return dst;
}

void k3_run_shard_free(k3_run_shard *r) {
    free(r->w13), free(r->w13s), free(r->w2), free(r->w2s), free(r->sgu), free(r->sdown);
    free(r->g13), free(r->g2), free(r->in13), free(r->in2), free(r->map);
    memset(r, 0, sizeof *r);
}

size_t k3_run_shard_bytes(const k3_run_shard *r, const void *p) {
    for (int i = 0; p && i < r->nown; i++)
        if (r->own[i] == p) return r->own_bytes[i];
    return 0;
}

void k3_run_shard_desc(const k3_latent_moe_desc *ld, const run_setup *s, const k3_run_shard *cut, int32_t rank,
                       int32_t n, int ep, k3_latent_moe_desc *out) {
    *out = *ld;
    out->parallel.layout = ep ? K3_PARALLEL_EP : K3_PARALLEL_TP, out->parallel.rank = rank, out->parallel.size = n;
    out->shared_inter = s->is / n;
    if (ep) out->experts.num_experts = cut->ne, out->experts.global_experts = s->e;
    else out->experts.inter = s->inter / n;
}

/* EP: rank `rank` of n holds the whole experts [rank * E / n, (rank + 1) * E / n): contiguous slices of every
   stacked buffer, and its expert map. */
static int ep_cut_experts(const run_setup *s, int32_t rank, int32_t n, k3_run_shard *r) {
    const k3_moe_desc *d = &s->md;
    const int64_t e = s->e, e0 = rank * e / n, e1 = (rank + 1) * e / n, ne = e1 - e0;
    const int64_t l = s->l, in = s->inter, w1 = (d->act.kind == K3_ACT_RELU2_NO_MUL ? 1 : 2) * in;
    const k3_moe_weights *w = &s->mw;
    size_t b13, b2, s13 = 0, s2 = 0; /* bytes per expert (either scale layout keeps an expert's scales together) */
    if (d->format == K3_WEIGHT_BF16) {
        b13 = (size_t)(w1 * l) * 2, b2 = (size_t)(l * in) * 2;
    } else {
        const k3_fp4_format ff = d->format == K3_WEIGHT_NVFP4 ? K3_FP4_NVFP4 : K3_FP4_MXFP4;
        b13 = (size_t)(w1 * l / 2), b2 = (size_t)(l * in / 2);
        if (k3_fp4_scale_bytes(ff, d->scale_layout, w1, l, &s13) != K3_STATUS_SUCCESS ||
            k3_fp4_scale_bytes(ff, d->scale_layout, l, in, &s2) != K3_STATUS_SUCCESS)
            return 0;
    }
    r->e0 = (int32_t)e0, r->ne = (int32_t)ne;
    r->w13 = cut_cols(r, w->w13, 1, (size_t)e * b13, (size_t)e0 * b13, (size_t)ne * b13);
    r->w2 = cut_cols(r, w->w2, 1, (size_t)e * b2, (size_t)e0 * b2, (size_t)ne * b2);
    if (s13) {
        r->w13s = cut_cols(r, w->w13_scale, 1, (size_t)e * s13, (size_t)e0 * s13, (size_t)ne * s13);
        r->w2s = cut_cols(r, w->w2_scale, 1, (size_t)e * s2, (size_t)e0 * s2, (size_t)ne * s2);
        if (!r->w13s || !r->w2s) return 0;
    }
    const size_t f = sizeof(float), f13 = (d->w13_separate_scale_2 ? 2 : 1) * f;
    if (w->w13_scale_2) {
        r->g13 = cut_cols(r, w->w13_scale_2, 1, (size_t)e * f13, (size_t)e0 * f13, (size_t)ne * f13);
        r->g2 = cut_cols(r, w->w2_scale_2, 1, (size_t)e * f, (size_t)e0 * f, (size_t)ne * f);
        if (!r->g13 || !r->g2) return 0;
    }
    if (w->w13_input_scale) {
        r->in13 = cut_cols(r, w->w13_input_scale, 1, (size_t)e * f, (size_t)e0 * f, (size_t)ne * f);
        r->in2 = cut_cols(r, w->w2_input_scale, 1, (size_t)e * f, (size_t)e0 * f, (size_t)ne * f);
        if (!r->in13 || !r->in2) return 0;
    }
    r->map = (int32_t *)(void *)keep(r, (uint8_t *)malloc(sizeof(int32_t) * (size_t)e), sizeof(int32_t) * (size_t)e);
    if (!r->map || !r->w13 || !r->w2) return 0;
    for (int64_t g = 0; g < e; g++) r->map[g] = g >= e0 && g < e1 ? (int32_t)(g - e0) : -1;
    r->mw = *w;
    r->mw.w13 = r->w13, r->mw.w13_scale = r->w13s, r->mw.w2 = r->w2, r->mw.w2_scale = r->w2s;
    if (r->g13) r->mw.w13_scale_2 = (const float *)(void *)r->g13, r->mw.w2_scale_2 = (const float *)(void *)r->g2;
    if (r->in13)
        r->mw.w13_input_scale = (const float *)(void *)r->in13, r->mw.w2_input_scale = (const float *)(void *)r->in2;
    r->mw.expert_map = r->map;
    return 1;
}

/* 0 after printing why the weights cannot be split n ways (ep: by whole experts). */
int k3_run_tp_check(const run_setup *s, int32_t n, int ep) {
    const k3_moe_desc *d = &s->md;
    if (ep) {
        if (n > s->e) {
            fprintf(stderr, CMD ": --ep %d: more ranks than the %d experts\n", (int)n, (int)s->e);
            return 0;
        }
        if (s->latent && s->is % n != 0) {
            fprintf(stderr, CMD ": --ep %d: the shared experts' intermediate Is = %lld is not a multiple of %d (EP "
                                "ranks split the shared experts as TP does)\n",
                    (int)n, (long long)s->is, (int)n);
            return 0;
        }
        return 1;
    }
    const int64_t block = d->format == K3_WEIGHT_NVFP4 ? 16 : d->format == K3_WEIGHT_MXFP4 ? 32 : 1;
    if (d->act.kind == K3_ACT_RELU2_NO_MUL || d->act.kind == K3_ACT_SWIGLUOAI) {
        fprintf(stderr, CMD ": --tp needs w13 rows as [gate; up] (--act %s is not split here)\n",
                k3_act_name(d->act.kind));
        return 0;
    }
    if (d->format != K3_WEIGHT_BF16 && d->scale_layout != K3_SCALE_LINEAR) {
        fprintf(stderr, CMD ": --tp needs linear block scales (swizzled ones cannot be cut by columns)\n");
        return 0;
    }
    if (s->inter % n != 0 || (s->inter / n) % block != 0) {
        fprintf(stderr,
                CMD ": --tp %d: the experts' intermediate I = %lld must split into %d slices of a multiple of %lld "
                    "(the block size)\n",
                (int)n, (long long)s->inter, (int)n, (long long)block);
        return 0;
    }
    if (s->latent && s->is % n != 0) {
        fprintf(stderr, CMD ": --tp %d: the shared experts' intermediate Is = %lld is not a multiple of %d\n", (int)n,
                (long long)s->is, (int)n);
        return 0;
    }
    return 1;
}

int k3_run_shard_cut(const run_setup *s, int32_t rank, int32_t n, int ep, k3_run_shard *r) {
    memset(r, 0, sizeof *r);
    const k3_moe_desc *d = &s->md;
    const int64_t e = s->e, l = s->l, in = s->inter, ir = in / n, h = s->h, is = s->is, isr = is / n;
    const k3_moe_weights *w = &s->mw;
    if (ep) {
        if (!ep_cut_experts(s, rank, n, r)) return 0;
    } else if (d->format == K3_WEIGHT_BF16) {
        r->w13 = cut_gated(r, w->w13, e, in, (size_t)l * 2, rank * ir, ir);
        r->w2 = cut_cols(r, w->w2, e * l, (size_t)in * 2, (size_t)(rank * ir) * 2, (size_t)ir * 2);
    } else {
        const int64_t bs = d->format == K3_WEIGHT_NVFP4 ? 16 : 32;
        r->w13 = cut_gated(r, w->w13, e, in, (size_t)l / 2, rank * ir, ir);
        r->w13s = cut_gated(r, w->w13_scale, e, in, (size_t)(l / bs), rank * ir, ir);
        r->w2 = cut_cols(r, w->w2, e * l, (size_t)in / 2, (size_t)(rank * ir) / 2, (size_t)ir / 2);
        r->w2s = cut_cols(r, w->w2_scale, e * l, (size_t)(in / bs), (size_t)(rank * ir / bs), (size_t)(ir / bs));
        if (!r->w13s || !r->w2s) return 0;
    }
    if (!ep) {
        r->mw = *w;
        r->mw.w13 = r->w13, r->mw.w13_scale = r->w13s, r->mw.w2 = r->w2, r->mw.w2_scale = r->w2s;
    }
    if (s->latent) {
        r->lw = s->lw;
        r->lw.experts = r->mw;
        if (is > 0) {
            r->sgu = cut_gated(r, s->lw.shared_gate_up, 1, is, (size_t)h * 2, rank * isr, isr);
            r->sdown = cut_cols(r, s->lw.shared_down, h, (size_t)is * 2, (size_t)(rank * isr) * 2, (size_t)isr * 2);
            if (!r->sgu || !r->sdown) return 0;
            r->lw.shared_gate_up = r->sgu, r->lw.shared_down = r->sdown;
        }
    }
    return r->w13 && r->w2;
}

static int tp_fail(k3_ctx *ctx, const char *what, int32_t rank, k3_status st) {
    fprintf(stderr, CMD ": rank %d: %s: %s: %s\n", (int)rank, what, k3_status_string(st), k3_ctx_last_error(ctx));
    return 0;
}

/* The latent block as n ranks: each PRE_REDUCE, the partials summed, rank 0's POST_REDUCE. */
static int tp_latent(k3_ctx *ctx, const k3_latent_moe_desc *ld, const run_setup *s, int32_t n, int ep, const void *x,
                     uint16_t *y, int32_t *ids, float *wts) {
    int ok = 1;
    float *sum = NULL, *part = NULL;
    void *ws = NULL;
    k3_latent_moe_plan *p0 = NULL;
    size_t count = 0, wsb = 0;
    for (int32_t r = 0; r < n && ok; r++) {
        k3_run_shard cut;
        k3_latent_moe_desc d;
        k3_latent_moe_plan *p = NULL;
        k3_status st;
        const int cut_ok = k3_run_shard_cut(s, r, n, ep, &cut);
        k3_run_shard_desc(ld, s, &cut, r, n, ep, &d);
        if (!cut_ok) {
            fprintf(stderr, CMD ": --tp: out of host memory cutting rank %d's shard\n", (int)r);
            ok = 0;
        } else if ((st = k3_latent_moe_plan_create(ctx, &d, &p)) != K3_STATUS_SUCCESS) {
            ok = tp_fail(ctx, "latent-MoE plan", r, st);
        } else {
            size_t b = 0;
            k3_latent_moe_workspace_size(p, &b);
            if (!sum) {
                k3_latent_moe_partial_count(p, s->m, &count);
                sum = (float *)calloc(count, sizeof(float));
                part = (float *)malloc(count * sizeof(float));
            }
            if (b > wsb) {
                free(ws);
                ws = malloc(b);
                wsb = ws ? b : 0;
            }
            if (!sum || !part || !ws) {
                fprintf(stderr, CMD ": --tp: out of host memory\n");
                ok = 0;
            } else if ((st = k3_latent_moe_run_stage(p, K3_LATENT_PRE_REDUCE, s->m, x, &cut.lw, NULL, NULL, part,
                                                     r == 0 ? ids : NULL, r == 0 ? wts : NULL, ws, wsb, NULL)) !=
                       K3_STATUS_SUCCESS) {
                ok = tp_fail(ctx, "PRE_REDUCE", r, st);
            } else {
                for (size_t i = 0; i < count; i++) sum[i] += part[i];
            }
        }
        k3_run_shard_free(&cut);
        if (r == 0) p0 = p; /* POST_REDUCE reads only the replicated norm and up projection */
        else k3_latent_moe_plan_destroy(p);
    }
    if (ok) {
        const k3_status st = k3_latent_moe_run_stage(p0, K3_LATENT_POST_REDUCE, s->m, NULL, &s->lw, NULL, y, sum, NULL,
                                                     NULL, ws, wsb, NULL);
        if (st != K3_STATUS_SUCCESS) ok = tp_fail(ctx, "POST_REDUCE", 0, st);
    }
    k3_latent_moe_plan_destroy(p0);
    free(sum), free(part), free(ws);
    return ok;
}

/* The experts alone as n ranks: each one's fp32 output (its slice of I), summed, one BF16 rounding. */
static int tp_experts(k3_ctx *ctx, const run_setup *s, int32_t n, int ep, const void *x, const int32_t *ids,
                      const float *wts, uint16_t *y) {
    const size_t cnt = (size_t)(s->m * s->l);
    float *sum = (float *)calloc(cnt, sizeof(float)), *part = (float *)malloc(cnt * sizeof(float));
    uint16_t *scratch = (uint16_t *)malloc(cnt * sizeof(uint16_t));
    int ok = sum && part && scratch;
    if (!ok) fprintf(stderr, CMD ": --tp: out of host memory\n");
    for (int32_t r = 0; r < n && ok; r++) {
        k3_run_shard cut;
        k3_moe_desc d = s->md;
        d.max_tokens = s->m;
        k3_moe_plan *p = NULL;
        void *ws = NULL;
        size_t wsb = 0;
        k3_status st;
        const int cut_ok = k3_run_shard_cut(s, r, n, ep, &cut);
        if (ep) d.num_experts = cut.ne, d.global_experts = s->e;
        else d.inter = s->inter / n;
        if (!cut_ok) {
            fprintf(stderr, CMD ": --tp: out of host memory cutting rank %d's shard\n", (int)r);
            ok = 0;
        } else if ((st = k3_moe_plan_create(ctx, &d, &p)) != K3_STATUS_SUCCESS) {
            ok = tp_fail(ctx, "MoE plan", r, st);
        } else {
            k3_moe_workspace_size(p, &wsb);
            if (!(ws = malloc(wsb ? wsb : 1))) {
                fprintf(stderr, CMD ": --tp: out of host memory\n");
                ok = 0;
            } else if ((st = k3_moe_run(p, s->m, x, ids, wts, &cut.mw, scratch, part, ws, wsb, NULL)) !=
                       K3_STATUS_SUCCESS) {
                ok = tp_fail(ctx, "MoE run", r, st);
            } else {
                for (size_t i = 0; i < cnt; i++) sum[i] += part[i];
            }
        }
        free(ws);
        k3_moe_plan_destroy(p);
        k3_run_shard_free(&cut);
    }
    for (size_t i = 0; ok && i < cnt; i++) y[i] = k3_bf16_from_f32(sum[i]);
    free(sum), free(part), free(scratch);
    return ok;
}

int k3_run_tp(k3_ctx *ctx, const k3_latent_moe_desc *ld, const run_setup *s, int32_t n, int ep, const void *x,
              const int32_t *ids, const float *wts, uint16_t *y, int32_t *out_ids, float *out_wts) {
    if (ld) return tp_latent(ctx, ld, s, n, ep, x, y, out_ids, out_wts);
    return tp_experts(ctx, s, n, ep, x, ids, wts, y);
}
