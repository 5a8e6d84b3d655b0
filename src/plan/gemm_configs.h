/* The registry of compiled GEMM kernel configurations: data shared by the plan (validation, tables, the
 * tuner's candidate list) and the CUDA kernels (which instantiate exactly these). Usable without CUDA. */
#ifndef K3_PLAN_GEMM_CONFIGS_H
#define K3_PLAN_GEMM_CONFIGS_H

#include "k3.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3_gemm_config {
    k3_kernel kernel;       /* K3_KERNEL_SKINNY or K3_KERNEL_MMA */
    const char *name;       /* unique within its kernel, as written in tables: "b256_o4_u2" */
    int32_t threads;        /* threads per block */
    int32_t rows_per_block; /* weight rows (outputs) per block */
    int32_t k_unroll;       /* skinny: 16-byte loads in flight per thread; mma: 32-element K chunks per warp step */
    int32_t k_split;        /* mma: K split over the block's warps (1 for the whole-K warp tiles); skinny: 1 */
    int32_t max_m;          /* the largest token count it supports */
    int32_t k_align;        /* K (and x's row stride) must be a multiple of this many elements */
    int32_t static_k;       /* 0 = any K that is a multiple of k_align; else K must equal this */
    int32_t cluster_k;      /* mma: blocks of a thread-block cluster splitting K (1 = none); skinny: 1 */
    int32_t max_k;          /* 0 = any K; else the largest K (whole-K warp tiles hold all of K in registers) */
} k3_gemm_config;

/* The number of compiled configurations, known at compile time (for fixed-size candidate lists). */
enum {
    K3_GEMM_CONFIG_COUNT = 0
#define K3_GEMM_SKINNY(...) +1
#define K3_GEMM_MMA(...) +1
#define K3_GEMM_MMA_WT(...) +1
#define K3_GEMM_MMA_BULK(...) +1
#include "plan/gemm_configs.def"
#undef K3_GEMM_SKINNY
#undef K3_GEMM_MMA
#undef K3_GEMM_MMA_WT
#undef K3_GEMM_MMA_BULK
};

/* Every compiled configuration; *count receives the number. The order is stable. */
const k3_gemm_config *k3_gemm_configs(int32_t *count);
/* The configuration of `kernel` called `name`, or NULL. */
const k3_gemm_config *k3_gemm_config_find(k3_kernel kernel, const char *name);
/* 1 when cfg can run y[m, n] = x[m, k] w[n, k]^T for every m <= max_m with these strides, else 0 and a reason. */
int32_t k3_gemm_config_supports(const k3_gemm_config *cfg, int64_t n, int64_t k, int64_t max_m, int64_t x_stride,
                                const char **why);

#ifdef __cplusplus
}
#endif
#endif
