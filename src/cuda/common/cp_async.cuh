/* cp.async (global -> shared, asynchronous) helpers of the ring pipelines (MoE experts, router logits). */
#ifndef K3_CUDA_CP_ASYNC_CUH
#define K3_CUDA_CP_ASYNC_CUH

#include <stdint.h>

/* 16 bytes global -> shared, through L2 only (.cg): coherent, so also valid for data an earlier kernel of the
 * call wrote (after k3_pdl_wait). */
__device__ __forceinline__ void k3_cp_async16(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
/* The same, or with bytes = 0 sixteen zero bytes and no global read (padding rows: lanes that repeated a real
 * row's address made every SM hit the same L2 lines, 2.3-4x slower MoE GEMMs at M <= 8). */
__device__ __forceinline__ void k3_cp_async16_zfill(void *smem, const void *gmem, uint32_t bytes) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(bytes) : "memory");
}
__device__ __forceinline__ void k3_cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N>
__device__ __forceinline__ void k3_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

#endif
