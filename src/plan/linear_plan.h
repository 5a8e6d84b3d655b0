/* The linear plan: {M -> kernel + configuration} resolved once at plan time from the context's table, with
 * the forced-kernel override. The public entry points are in src/api/linear.c; tools and tests read the
 * resolved choices through k3_linear_plan_choice(). */
#ifndef K3_PLAN_LINEAR_PLAN_H
#define K3_PLAN_LINEAR_PLAN_H

#include "plan/table.h"

#ifdef __cplusplus
extern "C" {
#endif

#define K3_LINEAR_MAX_M K3_TABLE_MAX_M /* desc.max_m is 1..32 */

/* Where a per-M choice came from. */
typedef enum k3_choice_source {
    K3_CHOICE_TABLE = 0,    /* the table's row for (N, K, M) */
    K3_CHOICE_UNLISTED = 1, /* no table, or (N, K) or M not listed: the fallback */
    K3_CHOICE_FORCED = 2,   /* desc.force_kernel */
    K3_CHOICE_DEMOTED = 3,  /* the table's configuration cannot run this plan's strides: the fallback */
} k3_choice_source;

struct k3_lt_plan; /* src/cuda/gemm/cublaslt.h */

struct k3_linear_plan {
    k3_ctx *ctx;
    int64_t n, k, max_m;
    int64_t x_stride, y_stride; /* resolved (never 0) */
    k3_accum accum;
    k3_kernel force_kernel;
    int32_t pdl;                /* launch specialized kernels with programmatic dependent launch */
    k3_table_choice choice[K3_LINEAR_MAX_M + 1];
    k3_choice_source source[K3_LINEAR_MAX_M + 1];
    char table[128];            /* the table consulted: "embedded sm90", a file path, or "none" */
    struct k3_lt_plan *lt;      /* CUDA contexts where some M uses the fallback; else NULL */
    size_t ws_bytes;
};

/*
 * Fills p->choice / p->source for m = 1..p->max_m (p's shape, strides, accum and force_kernel already set and
 * validated) from the context's table and d->force_kernel / d->force_config. Reads the context's table only
 * (parsed when the context was made), so plans may be created by several threads at once. Errors:
 * INVALID_ARGUMENT (a forced choice that cannot run, naming why), OUT_OF_MEMORY.
 */
k3_status k3_linear_plan_resolve(k3_ctx *ctx, const k3_linear_desc *d, struct k3_linear_plan *p);

/* The resolved choice for m (NULL when m is outside 1..max_m); *source (optional) receives where it came from. */
const k3_table_choice *k3_linear_plan_choice(const struct k3_linear_plan *p, int64_t m, k3_choice_source *source);

/* The table plans on ctx consult now: NULL when the architecture has none. Never changes the context. */
k3_status k3_linear_ctx_table(k3_ctx *ctx, const k3_table **out);

/* Parses the embedded table of the context's architecture into ctx->table (replacing any table there; NULL
 * when the architecture has none). Called by k3_ctx_create and k3_ctx_load_table(ctx, NULL, ...), never by a
 * plan, so that concurrent plan creation on one context only reads it. Errors: INTERNAL_ERROR (an embedded
 * table that does not parse: a build bug), OUT_OF_MEMORY. */
k3_status k3_linear_ctx_parse_embedded(k3_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
