/* Shared by the specialized BF16 GEMM kernels: memory-access and PDL primitives (inline PTX, sm_90+), and the
 * launch templates that src/cuda/gemm_launch.cu dispatches to (instantiated from src/plan/gemm_configs.def in
 * gemm_skinny.cu and gemm_mma.cu). */
#ifndef K3_CUDA_GEMM_KERNELS_CUH
#define K3_CUDA_GEMM_KERNELS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/gemm.h"

/* L2 policy for data read exactly once (the weights): evict first, so they do not push out x or the
 * neighbouring kernels' working set. */
__device__ __forceinline__ uint64_t k3_policy_evict_first(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

/* Weights: streamed, read-only for the kernel's life; no L1 allocation, L2 evict-first. */
__device__ __forceinline__ uint4 k3_ld_stream(const void *p, uint64_t policy) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy));
    return v;
}

/* Activations: re-read by many blocks; the read-only (caching) path. Only valid after k3_grid_wait(). */
__device__ __forceinline__ uint4 k3_ld_cached(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Programmatic dependent launch. wait: blocks until the preceding grid finished and its writes are visible
 * (a no-op when launched without the PDL attribute). launch_dependents: lets the next grid start its prologue. */
__device__ __forceinline__ void k3_grid_wait(void) { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void k3_grid_launch_dependents(void) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/* BF16 bits <-> fp32 (exact widening; round-to-nearest-even narrowing). */
__device__ __forceinline__ float k3_bf16_to_f32_dev(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }
__device__ __forceinline__ uint16_t k3_f32_to_bf16_dev(float f) {
    uint16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

/* Launch configuration shared by both kernel families. */
static inline cudaError_t k3_gemm_launch_cfg_init(cudaLaunchConfig_t *lc, cudaLaunchAttribute *attr, dim3 grid,
                                                  dim3 block, cudaStream_t stream, int pdl) {
    lc->gridDim = grid;
    lc->blockDim = block;
    lc->dynamicSmemBytes = 0;
    lc->stream = stream;
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    lc->attrs = attr;
    lc->numAttrs = pdl ? 1 : 0;
    return cudaSuccess;
}

/* One per configuration in src/plan/gemm_configs.def. The args were validated by k3_cuda_gemm_launch. */
template <int THREADS, int ROWS, int UNROLL, int STATIC_K>
cudaError_t k3_skinny_launch(const k3_gemm_args *a, cudaStream_t stream, int pdl);
template <int WARPS, int TILES, int UNROLL, int CLUSTER_K>
cudaError_t k3_mma_launch(const k3_gemm_args *a, cudaStream_t stream, int pdl);

#endif
