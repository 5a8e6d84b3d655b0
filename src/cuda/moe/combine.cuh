/* The combine: out = bf16(sum over a token's slots of GEMM2's outputs), in slot order (deterministic). */
#ifndef K3_CUDA_MOE_COMBINE_CUH
#define K3_CUDA_MOE_COMBINE_CUH

#include <stdint.h>
#include "core/bf16.h"
#include "cuda/common/pdl.cuh"
#include "cuda/moe/params.cuh"
#include "cuda/moe/trace.cuh"

namespace {

/* out[t, c] = bf16(sum over slots j in order of pair_out[t * top_k + j, c]); ids outside [0, E) add nothing.
 * The loads of up to COMBINE_BATCH slots go out before their adds (a loop over slots with a data-dependent skip
 * waited for each load in turn), and the first batch's ids are read before the PDL wait. */
constexpr int COMBINE_BATCH = 16;
/* Which of the slots j0 .. j0 + COMBINE_BATCH - 1 of token t have an id in [0, E) (bit u: slot j0 + u). */
__device__ __forceinline__ uint32_t combine_ok(const moe_params &P, int64_t t, int j0) {
    uint32_t ok = 0u;
#pragma unroll
    for (int u = 0; u < COMBINE_BATCH; u++) {
        const int j = j0 + u;
        const int32_t e = j < P.top_k ? __ldg(P.ids + t * P.top_k + j) : -1;
        ok |= (uint32_t)(e >= 0 && e < P.ne) << u;
    }
    return ok;
}
/* s plus those slots' pair outputs of column c, in slot order. Every slot below top_k is loaded, used or not (a
 * skipped slot's row of pair_out is workspace that nothing wrote this call), so that the loads do not wait for the
 * ids: ptxas then issues a whole batch before its first add, where loads predicated on the ids went out in
 * dependent groups, a round trip each (SASS, bench/NOTES-moe.md). */
__device__ __forceinline__ float combine_add(const moe_params &P, int64_t t, int64_t c, int j0, uint32_t ok, float s) {
    float v[COMBINE_BATCH];
#pragma unroll
    for (int u = 0; u < COMBINE_BATCH; u++)
        v[u] = j0 + u < P.top_k ? __ldcg(P.pair_out + (t * P.top_k + j0 + u) * P.L + c) : 0.0f;
#pragma unroll
    for (int u = 0; u < COMBINE_BATCH; u++) /* a skipped slot adds nothing (not even +0: a -0 sum stays -0) */
        if (ok >> u & 1u) s = __fadd_rn(s, v[u]);
    return s;
}
__global__ void k3_moe_combine_kernel(const moe_params P, int64_t m, uint16_t *__restrict__ out,
                                      float *__restrict__ out_f32) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    K3_MT_BEGIN;
    if (idx >= m * P.L) return;
    const int64_t t = idx / P.L, c = idx % P.L;
    /* The first slots' ids before the PDL wait: topk_ids is the caller's, complete before this call's first kernel
     * (the dispatch, or the folded GEMM1) began, as that kernel is launched plainly; so after the wait only the
     * pair_out loads remain (one round trip instead of two) */
    const uint32_t ok0 = combine_ok(P, t, 0);
    k3_pdl_wait();
    K3_MT_STAMP(1);
    k3_pdl_launch(); /* a PDL kernel after the call (the latent block's RMSNorm) may come up */
    float s = combine_add(P, t, c, 0, ok0, 0.0f);
    for (int j0 = COMBINE_BATCH; j0 < P.top_k; j0 += COMBINE_BATCH) s = combine_add(P, t, c, j0, combine_ok(P, t, j0), s);
    out[idx] = k3_f32_to_bf16_bits(s);
    if (out_f32) out_f32[idx] = s;
    K3_MT_END(cb, 2);
}

} // namespace

#endif
