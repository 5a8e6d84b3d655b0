/* Memory-access primitives of the kernels (inline PTX, sm_90+): streamed weights with L2 policies and prefetch
 * hints, activations written by the previous kernel, read-only data, L2 prefetch; BF16 conversions. */
#ifndef K3_CUDA_COMMON_LOADS_CUH
#define K3_CUDA_COMMON_LOADS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* L2 policy for data read exactly once (the weights): evict first, so they do not push out x or the
 * neighbouring kernels' working set. */
__device__ __forceinline__ uint64_t k3_policy_evict_first(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
/* L2 policy for data many blocks read (x): evict last. */
__device__ __forceinline__ uint64_t k3_policy_evict_last(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
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

/* Weights as k3_ld_stream, plus (L2B = 256; 0 = no hint) the L2 prefetch-size hint .L2::256B: on a miss the L2
 * fetches the whole aligned 256-byte block from DRAM, not only the sectors asked for. The MMA kernel's lanes ask
 * for 64 bytes of a row per instruction (4 lanes x 16 B; the next 64 bytes come from the following instruction),
 * so without the hint one 128-byte line can become two separate DRAM reads; the skinny kernel's warps already ask
 * for 512 contiguous bytes. */
template <int L2B>
__device__ __forceinline__ uint4 k3_ld_stream_pf(const void *p, uint64_t policy) {
    static_assert(L2B == 0 || L2B == 256, "L2 prefetch size: 0 or 256 bytes");
    uint4 v;
    if constexpr (L2B == 256)
        asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p), "l"(policy));
    else
        v = k3_ld_stream(p, policy);
    return v;
}

/* Activations written by the previous kernel: an ordinary (coherent, L1-cacheable) load, issued only after
 * k3_pdl_wait(). NOT the non-coherent .nc path: under PDL this kernel is already running while its producer
 * writes x, so x is not invariant for the kernel's lifetime, and an .nc load may be served stale lines that an
 * earlier kernel left in the SM's cache (seen on the H200, bench/NOTES-gemm.md: a chain whose direct run differed in
 * the last bits from its graph replays). griddepcontrol.wait makes the producer's writes visible to ordinary loads. */
__device__ __forceinline__ uint4 k3_ld_act(const void *p) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

/* Read-only data through the non-coherent (.nc) path: valid only for data no kernel writes while this one runs
 * (under PDL that excludes the previous kernel's outputs: use k3_ld_act for those). */
__device__ __forceinline__ uint4 k3_ld_cached(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Asks the copy engine to bring `bytes` (a multiple of 16, from a 16-byte aligned address) of global memory into
 * L2; a hint with no completion to wait for and no register or shared-memory cost. Issued ahead of the demand
 * loads it puts more DRAM requests in flight than the register double buffer holds, and it may be issued before
 * griddepcontrol.wait: weights never depend on the previous kernel. Each request has a fixed cost, so requests of
 * a few hundred bytes cost large shapes more than they hide (bench/NOTES-gemm.md): keep them to KBs. */
__device__ __forceinline__ void k3_prefetch_l2(const void *p, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes));
}

/* BF16 bits <-> fp32 (exact widening; round-to-nearest-even narrowing). */
__device__ __forceinline__ float k3_bf16_to_f32_dev(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }
__device__ __forceinline__ uint16_t k3_f32_to_bf16_dev(float f) {
    uint16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

#endif
