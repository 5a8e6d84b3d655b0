/* A latent-MoE block's random host weights for the CPU tests (test_latent.c, test_latent_tp.c, test_latent_dp.c, gpu_latent_tp.c): the
 * experts from moe_data.h, a BF16 (or F32) router gate with an optional correction bias, the latent projections,
 * the norm and the shared experts, each with rms ~ 1/sqrt(K). The index of the router's experts is the router's
 * own E (router.num_experts), which an expert-parallel descriptor keeps above the experts'. */
#ifndef K3_TESTS_LATENT_DATA_H
#define K3_TESTS_LATENT_DATA_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe_data.h"
#include "test_util.h"

typedef struct lat_data {
    moe_data md;
    void *gate;
    float *bias;
    uint16_t *down, *norm, *up, *sgu, *sdown;
    k3_latent_moe_weights w;
} lat_data;

static inline void ld_make(lat_data *ld, const k3_latent_moe_desc *d, k3t_rng *r, int with_bias) {
    memset(ld, 0, sizeof *ld);
    const int64_t h = d->hidden, l = d->experts.hidden, is = d->shared_inter;
    const int64_t sr = (d->shared_act.kind == K3_ACT_RELU2_NO_MUL ? 1 : 2) * is;
    const int32_t e = d->router.num_experts;
    md_make(&ld->md, &d->experts, r);
    if (d->router.gate_dtype == K3_DTYPE_F32) {
        float *g = (float *)malloc(sizeof(float) * (size_t)(e * h));
        for (int64_t i = 0; i < e * h; i++) g[i] = (float)(k3t_normal(r) / sqrt((double)h));
        ld->gate = g;
    } else {
        ld->gate = md_bf16_normal(r, e * h, 1.0 / sqrt((double)h));
    }
    if (with_bias) {
        ld->bias = (float *)malloc(sizeof(float) * (size_t)e);
        for (int32_t i = 0; i < e; i++) ld->bias[i] = 0.1f * k3t_uniform(r);
    }
    ld->down = md_bf16_normal(r, l * h, 1.0 / sqrt((double)h));
    ld->norm = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)l);
    for (int64_t i = 0; i < l; i++) ld->norm[i] = k3_bf16_from_f32((float)(1.0 + 0.2 * k3t_normal(r)));
    ld->up = md_bf16_normal(r, h * l, 1.0 / sqrt((double)l));
    if (is > 0) {
        ld->sgu = md_bf16_normal(r, sr * h, 1.0 / sqrt((double)h));
        ld->sdown = md_bf16_normal(r, h * is, 1.0 / sqrt((double)is));
    }
    ld->w.gate = ld->gate;
    ld->w.bias = ld->bias;
    ld->w.down_proj = ld->down;
    ld->w.experts = ld->md.w;
    ld->w.norm = ld->norm;
    ld->w.up_proj = ld->up;
    ld->w.shared_gate_up = ld->sgu;
    ld->w.shared_down = ld->sdown;
}

/* A plan of d on ctx: created (want SUCCESS), or refused with want and a message containing needle, and no plan. */
static inline void ld_expect_plan(k3_ctx *ctx, const char *what, const k3_latent_moe_desc *d, k3_status want,
                                  const char *needle) {
    k3_latent_moe_plan *p = NULL;
    const k3_status st = k3_latent_moe_plan_create(ctx, d, &p);
    CHECK(st == want && (want == K3_STATUS_SUCCESS || (!p && strstr(k3_ctx_last_error(ctx), needle))),
          "%s: %s (%s)", what, k3_status_string(st), k3_ctx_last_error(ctx));
    k3_latent_moe_plan_destroy(p);
}

/* A plan's workspace in host memory, filled with a pattern (a stage must not depend on what it holds). */
static inline void *ld_ws(k3_latent_moe_plan *p, size_t *bytes) {
    *bytes = 0;
    k3_latent_moe_workspace_size(p, bytes);
    void *ws = malloc(*bytes ? *bytes : 1);
    if (ws) memset(ws, 0xa5, *bytes);
    return ws;
}

static inline void ld_free(lat_data *ld) {
    md_free(&ld->md);
    free(ld->gate);
    free(ld->bias);
    free(ld->down);
    free(ld->norm);
    free(ld->up);
    free(ld->sgu);
    free(ld->sdown);
}

#endif
