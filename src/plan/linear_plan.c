/* Plan-time resolution of {M -> kernel + configuration}: the table, the forced override, the fallback. */
#include "plan/linear_plan.h"

#include <stdio.h>
#include <string.h>

k3_status k3_linear_ctx_parse_embedded(k3_ctx *ctx) {
    const char *text = k3_table_embedded_text(ctx->arch.table);
    k3_table *t = NULL;
    if (text) {
        char source[64], err[512];
        snprintf(source, sizeof source, "embedded %s", k3_table_name(ctx->arch.table));
        k3_status st = k3_table_parse(text, source, &t, err, sizeof err);
        if (st == K3_STATUS_OUT_OF_MEMORY) return k3_fail(ctx, st, "out of host memory parsing %s", source);
        if (st != K3_STATUS_SUCCESS)
            return k3_fail(ctx, K3_STATUS_INTERNAL_ERROR, "the library's own table does not parse (%s)", err);
    }
    k3_table_destroy(ctx->table);
    ctx->table = t;
    return K3_STATUS_SUCCESS;
}

k3_status k3_linear_ctx_table(k3_ctx *ctx, const k3_table **out) {
    *out = ctx->table;
    return K3_STATUS_SUCCESS;
}

static const char *kernel_word(k3_kernel k) { return k == K3_KERNEL_SKINNY ? "skinny" : "mma"; }

/* A forced SKINNY/MMA choice: the named configuration, else the table's (when it is that kernel), else the
 * kernel's first registry configuration that can run every m of the plan. */
static k3_status resolve_forced_config(k3_ctx *ctx, const k3_linear_desc *d, struct k3_linear_plan *p,
                                       const k3_table_row *row) {
    const k3_kernel kern = d->force_kernel;
    const char *why = NULL;
    if (d->force_config) {
        const k3_gemm_config *cfg = k3_gemm_config_find(kern, d->force_config);
        if (!cfg)
            return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT,
                           "force_config '%s' is not a %s configuration of this build (see `k3 plan --configs`)",
                           d->force_config, kernel_word(kern));
        if (!k3_gemm_config_supports(cfg, p->n, p->k, p->max_m, p->x_stride, &why))
            return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT,
                           "forced %s %s cannot run n=%lld k=%lld max_m=%lld x_stride=%lld: %s", kernel_word(kern),
                           cfg->name, (long long)p->n, (long long)p->k, (long long)p->max_m,
                           (long long)p->x_stride, why ? why : "unsupported");
        for (int64_t m = 1; m <= p->max_m; m++) p->choice[m] = (k3_table_choice){kern, cfg, 0};
        return K3_STATUS_SUCCESS;
    }
    int32_t count = 0;
    const k3_gemm_config *all = k3_gemm_configs(&count);
    const k3_gemm_config *first = NULL;
    for (int32_t i = 0; i < count && !first; i++)
        if (all[i].kernel == kern && k3_gemm_config_supports(&all[i], p->n, p->k, p->max_m, p->x_stride, &why))
            first = &all[i];
    if (!first)
        return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT,
                       "no %s configuration can run n=%lld k=%lld max_m=%lld x_stride=%lld (last reason: %s)",
                       kernel_word(kern), (long long)p->n, (long long)p->k, (long long)p->max_m,
                       (long long)p->x_stride, why ? why : "none compiled");
    for (int64_t m = 1; m <= p->max_m; m++) {
        const k3_table_choice *t = row ? &row->m[m] : NULL;
        if (t && t->kernel == kern && k3_gemm_config_supports(t->cfg, p->n, p->k, m, p->x_stride, NULL))
            p->choice[m] = *t;
        else
            p->choice[m] = (k3_table_choice){kern, first, 0};
    }
    return K3_STATUS_SUCCESS;
}

static k3_status resolve_forced_fallback(k3_ctx *ctx, const k3_linear_desc *d, struct k3_linear_plan *p) {
    int32_t algo = 0;
    if (d->force_config) {
        const char *s = d->force_config;
        int ok = s[0] == 'h' && s[1] >= '0' && s[1] <= '9' && s[2] == '\0';
        if (!ok || s[1] - '0' > K3_TABLE_MAX_ALGO)
            return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT,
                           "force_config '%s' for the fallback must be hI (I in 0..%d: the I-th cuBLASLt heuristic "
                           "algorithm) or NULL",
                           s, K3_TABLE_MAX_ALGO);
        algo = s[1] - '0';
    }
    for (int64_t m = 1; m <= p->max_m; m++) p->choice[m] = (k3_table_choice){K3_KERNEL_FALLBACK, NULL, algo};
    return K3_STATUS_SUCCESS;
}

k3_status k3_linear_plan_resolve(k3_ctx *ctx, const k3_linear_desc *d, struct k3_linear_plan *p) {
    const k3_table *t = NULL;
    K3_TRY(k3_linear_ctx_table(ctx, &t));
    snprintf(p->table, sizeof p->table, "%s", t ? t->source : "none");
    const k3_table_row *row = t ? k3_table_find(t, p->n, p->k) : NULL;

    if (d->force_kernel != K3_KERNEL_AUTO) {
        if (d->accum == K3_ACCUM_FP64 && d->force_kernel != K3_KERNEL_FALLBACK)
            return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT,
                           "accum FP64 is the CPU reference's; forced kernel %s accumulates in fp32 (use FP32)",
                           kernel_word(d->force_kernel));
        k3_status st = d->force_kernel == K3_KERNEL_FALLBACK ? resolve_forced_fallback(ctx, d, p)
                                                              : resolve_forced_config(ctx, d, p, row);
        if (st != K3_STATUS_SUCCESS) return st;
        for (int64_t m = 1; m <= p->max_m; m++) p->source[m] = K3_CHOICE_FORCED;
        return K3_STATUS_SUCCESS;
    }
    if (d->force_config)
        return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT,
                       "force_config '%s' needs force_kernel (SKINNY, MMA or FALLBACK); with AUTO the table decides",
                       d->force_config);

    for (int64_t m = 1; m <= p->max_m; m++) {
        const k3_table_choice c = row ? row->m[m] : (k3_table_choice){K3_KERNEL_AUTO, NULL, 0};
        if (c.kernel == K3_KERNEL_AUTO) {
            p->choice[m] = (k3_table_choice){K3_KERNEL_FALLBACK, NULL, 0};
            p->source[m] = K3_CHOICE_UNLISTED;
            continue;
        }
        const char *why = NULL;
        if (c.kernel != K3_KERNEL_FALLBACK && !k3_gemm_config_supports(c.cfg, p->n, p->k, m, p->x_stride, &why)) {
            /* the table was measured with dense x; this plan's stride rules the configuration out */
            k3_log(ctx, K3_LOG_INFO, "%s: %s %s cannot run %lld x %lld at m=%lld with x_stride %lld (%s): fallback",
                   p->table, kernel_word(c.kernel), c.cfg->name, (long long)p->n, (long long)p->k, (long long)m,
                   (long long)p->x_stride, why ? why : "unsupported");
            p->choice[m] = (k3_table_choice){K3_KERNEL_FALLBACK, NULL, 0};
            p->source[m] = K3_CHOICE_DEMOTED;
            continue;
        }
        p->choice[m] = c;
        p->source[m] = K3_CHOICE_TABLE;
    }
    return K3_STATUS_SUCCESS;
}

const k3_table_choice *k3_linear_plan_choice(const struct k3_linear_plan *p, int64_t m, k3_choice_source *source) {
    if (!p || m < 1 || m > p->max_m) return NULL;
    if (source) *source = p->source[m];
    return &p->choice[m];
}
