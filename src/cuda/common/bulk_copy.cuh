/* One-dimensional bulk copies (the copy engine, global -> shared) completed on an mbarrier, for kernels that want
 * a whole block's bytes in flight at once without holding them in registers (the router's small-m logits, the
 * bulk GEMM's shared-memory ring). SM90+;
 * callers compile these only for __CUDA_ARCH__ >= 900 (the library ships sm_90a and later). */
#ifndef K3_CUDA_BULK_COPY_CUH
#define K3_CUDA_BULK_COPY_CUH

#include <stdint.h>

/* Initializes the mbarrier at bar for one arriving thread. After the last one, k3_mbar_init_fence; the block
 * synchronizes before any other thread waits on them. */
__device__ __forceinline__ void k3_mbar_init(uint64_t *bar) {
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
}
/* Makes the initializations visible to the copy engine (the async proxy) before the first copy names them. */
__device__ __forceinline__ void k3_mbar_init_fence(void) {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* One arrival on bar that also announces `bytes` of copies (k3_bulk_copy_g2s_tx) completing the same phase: for a
 * barrier that several copies complete together. */
__device__ __forceinline__ void k3_mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
}

/* A bulk copy (k3_bulk_copy_g2s's rules) whose bytes count against a k3_mbar_arrive_expect_tx made for them, by this
 * thread or another: several copies (from several lanes) may complete one barrier's phase. */
__device__ __forceinline__ void k3_bulk_copy_g2s_tx(void *smem, const void *gmem, uint32_t bytes, uint64_t *bar,
                                                    uint64_t policy) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem), b = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, "
                 "[%3], %4;" ::"r"(s),
                 "l"(gmem), "r"(bytes), "r"(b), "l"(policy)
                 : "memory");
}

/* Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from gmem to smem; the mbarrier's phase completes
 * when they have landed. One thread arrives for the barrier and announces the bytes in the same step, so one
 * barrier takes one copy. `policy` is an L2 cache policy (createpolicy), e.g. evict-first for bytes read once. */
__device__ __forceinline__ void k3_bulk_copy_g2s(void *smem, const void *gmem, uint32_t bytes, uint64_t *bar,
                                                 uint64_t policy) {
    k3_mbar_arrive_expect_tx(bar, bytes);
    k3_bulk_copy_g2s_tx(smem, gmem, bytes, bar, policy);
}

/* Waits until the mbarrier's phase of the given parity has completed (its copies have landed and are visible). */
__device__ __forceinline__ void k3_mbar_wait(uint64_t *bar, uint32_t parity) {
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(bar);
    uint32_t done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(b), "r"(parity)
                     : "memory");
}

#endif
