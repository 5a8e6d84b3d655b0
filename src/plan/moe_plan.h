/* The routed experts' launch plan: every launch-shape decision of a CUDA k3_moe_run, resolved once per token count m
 * at plan time from the descriptor, the device's SM count, the architecture's MoE tuning rows (tables/<arch>.txt)
 * and the registry of compiled instances (moe_configs.def). A run call looks its row up and launches it.
 * Pure host code: a CPU context with a simulated capability resolves the same rows (`k3 plan --moe`). */
#ifndef K3_PLAN_MOE_PLAN_H
#define K3_PLAN_MOE_PLAN_H

#include "core/internal.h"

struct k3_table_moe; /* plan/table.h: the moe rows of a table */

#ifdef __cplusplus
extern "C" {
#endif

/* One m's launch sequence: [dispatch] -> [W4A4 x quantization] -> GEMM1 -> GEMM2 -> [combine]. */
typedef struct k3_moe_launch {
    int32_t g1, g2;                /* registry indices (k3_moe_g1_configs / k3_moe_g2_configs) */
    uint32_t g1_grid[2], g2_grid[2];
    int32_t tpu;                   /* the dispatch's pairs per unit (an expert's pairs in runs of at most tpu) */
    int64_t early_blocks;          /* GEMM1 early routing: blocks below this linear index route themselves */
    int32_t nt;                    /* 8-token tiles per pass */
    uint8_t dispatch;              /* 1: the dispatch kernel runs (0: the GEMMs route themselves, the fold) */
    uint8_t fold, pair, early, wide, dense, direct, combine;
    uint8_t g2_split;              /* GEMM2's warps split K */
    uint8_t g2_tiles;              /* GEMM2 16-row tiles per warp */
    int32_t g1_per_sm;             /* the folded GEMM1's blocks per SM cap (0: none) */
} k3_moe_launch;

/* The tuning a plan resolves against: the context's table when it has moe rows, else the embedded table of the
 * context's architecture; *out->present == 0 when neither has them (then the plan takes the generic kernels:
 * dispatch, register ring, NT 4, one row tile per warp). */
k3_status k3_moe_ctx_tuning(k3_ctx *ctx, struct k3_table_moe *out);

/*
 * The launch of m tokens (1 <= m <= d->max_tokens) for a validated descriptor on a device of sm_count SMs (> 0),
 * with the K3_MOE_FORCE_* bits of d->force_shape applied. INTERNAL_ERROR with a message when the registry lacks an
 * instance the rules ask for (a bug: the registry and these rules must agree, which test_moe_plan checks).
 */
k3_status k3_moe_launch_resolve(k3_ctx *ctx, const k3_moe_desc *d, int32_t sm_count, const struct k3_table_moe *t,
                                int64_t m, k3_moe_launch *out);

/* The public description of a resolved launch. */
void k3_moe_launch_describe(const k3_moe_launch *l, k3_moe_launch_info *out);

#ifdef __cplusplus
}
#endif
#endif
