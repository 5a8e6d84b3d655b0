/* Device discovery and the per-context CUDA state. */
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "arch/arch.h"
#include "cuda/common/check.cuh"
#include "cuda/common/state.cuh"

extern "C" int32_t k3_cuda_built(void) { return 1; }

extern "C" int32_t k3_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver / no device: not an error for the caller */
        return 0;
    }
    return n;
}

extern "C" k3_status k3_cuda_device_query(k3_ctx *ctx, int32_t device, k3_arch_info *out) {
    int n = k3_cuda_device_count();
    if (device < 0 || device >= n)
        return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "CUDA device %d requested but %d device(s) visible",
                       (int)device, n);
    cudaDeviceProp p;
    K3_CUDA_TRY(ctx, cudaGetDeviceProperties(&p, device));
    k3_arch_facts(p.major, p.minor, out);
    out->simulated = 0;
    out->sm_count = p.multiProcessorCount;
    out->l2_bytes = p.l2CacheSize;
    int v = 0;
    K3_CUDA_TRY(ctx, cudaDriverGetVersion(&v));
    out->driver_version = v;
    K3_CUDA_TRY(ctx, cudaRuntimeGetVersion(&v));
    out->runtime_version = v;
    snprintf(out->device_name, sizeof out->device_name, "%.127s", p.name);
    return K3_STATUS_SUCCESS;
}

extern "C" k3_status k3_cuda_state_create(k3_ctx *ctx) {
    K3_CUDA_TRY(ctx, cudaSetDevice(ctx->device));
    k3_cuda_state *s = (k3_cuda_state *)calloc(1, sizeof *s);
    if (!s) return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "out of host memory");
    s->device = ctx->device;
    cublasStatus_t cs = cublasLtCreate(&s->lt);
    if (cs != CUBLAS_STATUS_SUCCESS) {
        free(s);
        return k3_fail(ctx, K3_STATUS_CUBLAS_ERROR, "cublasLtCreate failed: status %d", (int)cs);
    }
    ctx->cuda = s;
    return K3_STATUS_SUCCESS;
}

extern "C" void k3_cuda_state_destroy(k3_cuda_state *s) {
    if (!s) return;
    cublasLtDestroy(s->lt);
    free(s);
}
