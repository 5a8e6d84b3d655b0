/* Programmatic dependent launch (PDL) and cp.async helpers of the MoE kernels (src/cuda/moe_*.cu).
 * Why PDL: a decode MoE step is 3-4 short dependent kernels; with PDL the next kernel's blocks are resident
 * (and GEMM2 has its first weight chunks in flight) when the previous one drains, instead of paying a launch
 * gap per boundary. Rule kept by every MoE kernel: griddepcontrol.wait comes BEFORE launch_dependents, so
 * when a kernel starts, every kernel two or more steps back has completed and flushed (what GEMM2 relies on
 * to read the dispatch lists before its own wait). Data written in this call is read with L2 (.cg) loads. */
#ifndef K3_CUDA_MOE_PDL_CUH
#define K3_CUDA_MOE_PDL_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* Blocks until the previous kernel in the stream has completed and its writes are visible (a no-op when the
 * kernel was not launched with programmatic serialization). */
__device__ __forceinline__ void k3_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Lets the next kernel (launched with programmatic serialization) start its blocks. */
__device__ __forceinline__ void k3_pdl_launch(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* 16 bytes global -> shared, through L2 only (the data was written by an earlier kernel of this call). */
__device__ __forceinline__ void k3_cp_async16(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void k3_cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void k3_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

#ifdef __CUDACC__
/* A launch with programmatic stream serialization (PDL): the kernel may start before the previous kernel in
 * the stream completes, and must call k3_pdl_wait before reading that kernel's output. Captured into CUDA
 * graphs as a programmatic edge. */
template <typename... Params, typename... Args>
static inline cudaError_t k3_launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                        cudaStream_t s, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}
#endif

#endif
