/* The registry of compiled routed-experts (MoE) kernel instances (src/plan/moe_configs.def): data shared by the
 * plan, which resolves every launch shape against it, and the CUDA launcher, which instantiates exactly these.
 * Usable without CUDA. */
#ifndef K3_PLAN_MOE_CONFIGS_H
#define K3_PLAN_MOE_CONFIGS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Kernel facts the plan needs (the CUDA launcher checks them against the kernels' own constants). */
#define K3_MOE_G1_WARPS 4    /* warps of a GEMM1 block (they split K) */
#define K3_MOE_G2_WARPS 4    /* warps of a GEMM2 block (4 row tiles, or one tile split 4 ways along K) */
#define K3_MOE_G2_WIDE_KS 8  /* the wide GEMM2 split: 8 warps over K */
#define K3_MOE_FOLD_NP 256   /* the most (token, slot) pairs the self-routing kernels can hold */
#define K3_MOE_FOLD_E 4096   /* the most experts the self-routing kernels' bitmap can hold */

typedef struct k3_moe_g1_config {
    const char *name;
    int32_t format; /* k3_weight_format */
    int32_t gated, nt, async, fold, pair, early;
    int32_t blocks_per_sm;
} k3_moe_g1_config;

typedef struct k3_moe_g2_config {
    const char *name;
    int32_t format;
    int32_t nt, ks, async, fold, min_blocks, direct, tiles;
    int32_t blocks_per_sm;
} k3_moe_g2_config;

/* Every compiled instance, in registry order; *count receives the number. */
const k3_moe_g1_config *k3_moe_g1_configs(int32_t *count);
const k3_moe_g2_config *k3_moe_g2_configs(int32_t *count);
/* The registry index of the instance with exactly these attributes, or -1. */
int32_t k3_moe_g1_find(int32_t format, int32_t gated, int32_t nt, int32_t async, int32_t fold, int32_t pair,
                       int32_t early);
int32_t k3_moe_g2_find(int32_t format, int32_t nt, int32_t ks, int32_t async, int32_t fold, int32_t min_blocks,
                       int32_t direct, int32_t tiles);

#ifdef __cplusplus
}
#endif
#endif
