/* k3_cuda_gemm_launch: validates a configuration against the call's arguments and dispatches to the compiled
 * template instance (the table below is generated from the same src/plan/gemm_configs.def as the registry). */
#include <string.h>

#include "cuda/common/check.cuh"
#include "cuda/gemm/kernels.cuh"

namespace {

typedef cudaError_t (*k3_gemm_launch_fn)(const k3_gemm_args *, cudaStream_t, int);
typedef cudaError_t (*k3_gemm_prepare_fn)(void);

struct k3_gemm_instance {
    k3_kernel kernel;
    const char *name;
    k3_gemm_launch_fn fn;
    k3_gemm_prepare_fn prepare; /* NULL: nothing to set up */
};

const k3_gemm_instance k3_instances[] = {
#define K3_GEMM_SKINNY(nm, thr, rows, unroll, sk) \
    {K3_KERNEL_SKINNY, #nm, &k3_skinny_launch<thr, rows, unroll, sk>, nullptr},
#define K3_GEMM_MMA(nm, warps, tiles, unroll, cluster_k, pf, minb, l2b, pipe) \
    {K3_KERNEL_MMA, #nm, &k3_mma_launch<warps, tiles, unroll, cluster_k, pf, minb, l2b, pipe>, nullptr},
#define K3_GEMM_MMA_WT(nm, warps, tiles, unroll, minb) \
    {K3_KERNEL_MMA, #nm, &k3_mma_wt_launch<warps, tiles, unroll, minb>, nullptr},
#define K3_GEMM_MMA_BULK(nm, warps, bk, smem_kb, cluster_k) \
    {K3_KERNEL_MMA, #nm, &k3_mma_bulk_launch<warps, bk, smem_kb, cluster_k>, \
     &k3_mma_bulk_prepare<warps, bk, smem_kb, cluster_k>},
#include "plan/gemm_configs.def"
#undef K3_GEMM_SKINNY
#undef K3_GEMM_MMA
#undef K3_GEMM_MMA_WT
#undef K3_GEMM_MMA_BULK
};

bool k3_aligned(const void *p, size_t a) { return ((uintptr_t)p % a) == 0; }

/* The compiled instance of a registry entry, or NULL. */
const k3_gemm_instance *k3_instance_of(const k3_gemm_config *cfg) {
    int32_t count = 0;
    const k3_gemm_config *base = k3_gemm_configs(&count);
    const ptrdiff_t idx = cfg - base;
    if (idx < 0 || idx >= count || idx >= (ptrdiff_t)(sizeof k3_instances / sizeof k3_instances[0])) return NULL;
    const k3_gemm_instance *inst = &k3_instances[idx];
    return inst->kernel == cfg->kernel && strcmp(inst->name, cfg->name) == 0 ? inst : NULL;
}

} // namespace

extern "C" k3_status k3_cuda_gemm_prepare(k3_ctx *ctx, const k3_gemm_config *cfg) {
    K3_CHECK_ARG(ctx, cfg != NULL, "k3_cuda_gemm_prepare: cfg is NULL");
    const k3_gemm_instance *inst = k3_instance_of(cfg);
    K3_CHECK_ARG(ctx, inst != NULL, "k3_cuda_gemm_prepare: %s is not an entry of the registry", cfg->name);
    if (!inst->prepare) return K3_STATUS_SUCCESS;
    /* a function attribute belongs to the current device: set it on the context's, then restore the caller's */
    int prev = 0;
    cudaError_t e = cudaGetDevice(&prev);
    if (e == cudaSuccess && prev != ctx->device) e = cudaSetDevice(ctx->device);
    if (e == cudaSuccess) e = inst->prepare();
    if (prev != ctx->device) {
        const cudaError_t r = cudaSetDevice(prev);
        if (e == cudaSuccess) e = r;
    }
    if (e != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "set-up of mma %s (its shared-memory ring) failed: %s", cfg->name,
                       cudaGetErrorString(e));
    return K3_STATUS_SUCCESS;
}

extern "C" k3_status k3_cuda_gemm_launch(k3_ctx *ctx, const k3_gemm_config *cfg, const k3_gemm_args *a,
                                         void *stream, int32_t pdl) {
    K3_CHECK_ARG(ctx, cfg != NULL, "k3_cuda_gemm_launch: cfg is NULL");
    K3_CHECK_ARG(ctx, a != NULL, "k3_cuda_gemm_launch: args is NULL");
    int32_t count = 0;
    const k3_gemm_config *base = k3_gemm_configs(&count);
    const ptrdiff_t idx = cfg - base;
    K3_CHECK_ARG(ctx, idx >= 0 && idx < count && idx < (ptrdiff_t)(sizeof k3_instances / sizeof k3_instances[0]),
                 "k3_cuda_gemm_launch: cfg is not an entry of the registry (use k3_gemm_config_find)");
    const k3_gemm_instance *inst = &k3_instances[idx];
    K3_CHECK_ARG(ctx, inst->kernel == cfg->kernel && strcmp(inst->name, cfg->name) == 0,
                 "k3_cuda_gemm_launch: registry entry %s does not match the compiled instance %s", cfg->name,
                 inst->name);
    K3_CHECK_ARG(ctx, a->m >= 1 && a->m <= cfg->max_m, "k3_cuda_gemm_launch: m = %lld, expected 1..%d for %s",
                 (long long)a->m, (int)cfg->max_m, cfg->name);
    const char *why = NULL;
    K3_CHECK_ARG(ctx, k3_gemm_config_supports(cfg, a->n, a->k, a->m, a->x_stride, &why),
                 "k3_cuda_gemm_launch: %s cannot run n = %lld, k = %lld, x_stride = %lld: %s", cfg->name,
                 (long long)a->n, (long long)a->k, (long long)a->x_stride, why ? why : "unsupported");
    K3_CHECK_ARG(ctx, a->x != NULL && k3_aligned(a->x, 16), "k3_cuda_gemm_launch: x must be a 16-byte aligned device pointer");
    K3_CHECK_ARG(ctx, a->w != NULL && k3_aligned(a->w, 16), "k3_cuda_gemm_launch: w must be a 16-byte aligned device pointer");
    K3_CHECK_ARG(ctx, a->y != NULL && k3_aligned(a->y, 2), "k3_cuda_gemm_launch: y must be a 2-byte aligned device pointer");
    K3_CHECK_ARG(ctx, a->residual == NULL || k3_aligned(a->residual, 2),
                 "k3_cuda_gemm_launch: residual must be NULL or a 2-byte aligned device pointer");
    K3_CHECK_ARG(ctx, a->y_stride >= a->n, "k3_cuda_gemm_launch: y_stride = %lld, expected >= n = %lld",
                 (long long)a->y_stride, (long long)a->n);
    K3_CHECK_ARG(ctx, pdl == 0 || pdl == 1, "k3_cuda_gemm_launch: pdl = %d, expected 0 or 1", (int)pdl);

    cudaError_t e = inst->fn(a, static_cast<cudaStream_t>(stream), pdl);
    if (e != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of %s %s failed: %s",
                       cfg->kernel == K3_KERNEL_MMA ? "mma" : "skinny", cfg->name, cudaGetErrorString(e));
    K3_CUDA_LAUNCH_CHECK(ctx, cfg->name);
    return K3_STATUS_SUCCESS;
}
