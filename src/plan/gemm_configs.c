/* The registry of compiled GEMM configurations (data only, no CUDA): built from src/plan/gemm_configs.def,
 * the same list the CUDA launcher instantiates. */
#include "plan/gemm_configs.h"

#include <stddef.h>
#include <string.h>

/* Largest M per kernel family: the skinny kernel keeps M x rows fp32 accumulators in registers (M is a
 * template parameter up to 8); the MMA kernel covers up to two n8 token tiles. */
#define K3_SKINNY_MAX_M 8
#define K3_MMA_MAX_M 16
#define K3_SKINNY_K_ALIGN 8 /* one 16-byte vector of BF16 */
#define K3_MMA_K_ALIGN 32   /* one K chunk: 4 lanes x 8 BF16 per MMA row */

static const k3_gemm_config k3_configs[] = {
#define K3_GEMM_SKINNY(nm, thr, rows, unroll, sk) \
    {K3_KERNEL_SKINNY, #nm, (thr), (rows), (unroll), 1, K3_SKINNY_MAX_M, K3_SKINNY_K_ALIGN, (sk), 1, 0},
#define K3_GEMM_MMA(nm, warps, tiles, unroll, cluster_k, pf, minb, l2b, pipe)                                         \
    {K3_KERNEL_MMA, #nm, 32 * (warps), 16 * (tiles), (unroll), (warps), K3_MMA_MAX_M, K3_MMA_K_ALIGN, 0, (cluster_k), \
     0},
/* whole-K warp tiles: the warps split N (k_split 1), and K is at most the k_unroll chunks a warp holds */
#define K3_GEMM_MMA_WT(nm, warps, tiles, unroll, minb)                                                                \
    {K3_KERNEL_MMA, #nm, 32 * (warps), 16 * (tiles) * (warps), (unroll), 1, K3_MMA_MAX_M, K3_MMA_K_ALIGN, 0, 1,      \
     32 * (unroll)},
/* the bulk ring: 16 rows per block, stages of bk K elements (bk / 32 K chunks), whole stages per cluster rank */
#define K3_GEMM_MMA_BULK(nm, warps, bk, smem_kb, cluster_k)                                                           \
    {K3_KERNEL_MMA, #nm, 32 * ((warps) + 1), 16, (bk) / 32, (warps), K3_MMA_MAX_M, (bk) * (cluster_k), 0,             \
     (cluster_k), 0},
#include "plan/gemm_configs.def"
#undef K3_GEMM_SKINNY
#undef K3_GEMM_MMA
#undef K3_GEMM_MMA_WT
#undef K3_GEMM_MMA_BULK
};

_Static_assert(sizeof k3_configs / sizeof k3_configs[0] == K3_GEMM_CONFIG_COUNT, "the registry's count is its list's");

const k3_gemm_config *k3_gemm_configs(int32_t *count) {
    if (count) *count = (int32_t)(sizeof k3_configs / sizeof k3_configs[0]);
    return k3_configs;
}

const k3_gemm_config *k3_gemm_config_find(k3_kernel kernel, const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < sizeof k3_configs / sizeof k3_configs[0]; i++)
        if (k3_configs[i].kernel == kernel && strcmp(k3_configs[i].name, name) == 0) return &k3_configs[i];
    return NULL;
}

int32_t k3_gemm_config_supports(const k3_gemm_config *cfg, int64_t n, int64_t k, int64_t max_m, int64_t x_stride,
                                const char **why) {
    const char *dummy;
    if (!why) why = &dummy;
    *why = NULL;
    if (!cfg) {
        *why = "no configuration";
        return 0;
    }
    if (n < 1 || k < 1) {
        *why = "n and k must be >= 1";
        return 0;
    }
    /* Grid sizes and in-row offsets are 32-bit inside the kernels (row bases are 64-bit). */
    if (n > INT32_MAX / 2 || k > INT32_MAX / 2) {
        *why = "n or k too large for the kernels' 32-bit indexing";
        return 0;
    }
    if (max_m < 1 || max_m > cfg->max_m) {
        *why = cfg->kernel == K3_KERNEL_SKINNY ? "m exceeds the configuration's max_m (skinny: 8)"
                                               : "m exceeds the configuration's max_m (mma: 16)";
        return 0;
    }
    if (k % cfg->k_align != 0) {
        *why = cfg->k_align == K3_MMA_K_ALIGN      ? "k must be a multiple of 32 for this configuration"
               : cfg->k_align == K3_SKINNY_K_ALIGN ? "k must be a multiple of 8 for this configuration"
                                                   : "k must be a multiple of the stage x cluster_k for this "
                                                     "configuration (the bulk kernel's whole ring stages per rank)";
        return 0;
    }
    if (cfg->max_k != 0 && k > cfg->max_k) {
        *why = "k exceeds the configuration's max_k (a whole-K warp tile holds k_unroll x 32 elements of K)";
        return 0;
    }
    if (cfg->static_k != 0 && k != cfg->static_k) {
        *why = "k differs from the configuration's compiled (static) k";
        return 0;
    }
    if (x_stride < k) {
        *why = "x_stride must be >= k";
        return 0;
    }
    /* x rows are read in 16-byte vectors, whatever the configuration's K chunk. */
    if (x_stride % 8 != 0) {
        *why = "x_stride must be a multiple of 8 elements (16-byte aligned rows)";
        return 0;
    }
    return 1;
}
