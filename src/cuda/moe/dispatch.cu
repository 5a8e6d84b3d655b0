/*
 * MoE dispatch on the device, without a host sync: one block of 1024 threads turns topk_ids [np] into
 *   offs [E + 1]   exclusive prefix sums of the per-expert counts (offs[E] = valid pairs),
 *   units          a touched expert's pairs cut into units of at most `tpu` (the GEMMs' tokens per pass), in
 *                  ascending expert id, then pair order: active[u] = the unit's expert, act_off[u] = its first
 *                  pair (act_off[*n_active] = offs[E]), so a GEMM block reads its unit's expert, first pair and
 *                  count (act_off[u + 1] - act_off[u]) in one round trip; and an expert with more pairs than a
 *                  pass takes is spread over blocks instead of passes of one block (bench/NOTES-moe.md),
 *   list [np]      pair indices (token * top_k + slot) grouped by expert, ascending within an expert
 *                  (the CPU reference's counting-sort order).
 * Integer atomics only (counts), so the result is deterministic. The counters sit in shared memory up to
 * DISPATCH_SMEM_E experts, in cur [E] past that. The stable placement walks the pairs in chunks of 1024;
 * inside a chunk, warps take their turn in order (a __syncthreads per warp that has pairs), and within a warp
 * __match_any_sync ranks the lanes that share an expert. Every loop is bounded by np or E, so
 * decode sizes (np <= a few thousand: a few chunks) and prefill sizes (np = 4096 * 16: 64 chunks) both work.
 * Ids outside [0, E) are left out of every list.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/common/check.cuh"
#include "cuda/moe/moe.h"
#include "cuda/common/pdl.cuh"

namespace {

constexpr int DT = 1024;
static_assert(DT == 32 * 32, "the scan of warp totals is one warp wide");
/* The per-expert counters and placement cursors live in shared memory up to this many experts (32 KB), else in the
 * caller's cur [E]. Why: in global memory every step that touches them (the counting atomics, the scan's reads, and
 * each warp's turn in the placement, one after another) waited for an L2 round trip. */
constexpr int32_t DISPATCH_SMEM_E = 8192;

__global__ void __launch_bounds__(DT)
    k3_moe_dispatch_kernel(const int32_t *__restrict__ ids, int32_t np, int32_t ne, int32_t tpu,
                           int32_t *__restrict__ offs, int32_t *cur, int32_t *__restrict__ active,
                           int32_t *__restrict__ act_off, int32_t *__restrict__ n_active, int32_t *__restrict__ list,
                           const float *__restrict__ wts, float *__restrict__ wsort) {
    __shared__ unsigned long long wsum[DT / 32];
    extern __shared__ int32_t cnt_s[]; /* ne entries when ne <= DISPATCH_SMEM_E (the launch sizes it) */
    int32_t *const cnt = ne <= DISPATCH_SMEM_E ? cnt_s : cur;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* the next MoE kernel (launched with PDL) may bring its blocks up now: it waits for this one to finish.
     * This kernel itself is launched plainly (fully ordered after whatever the caller ran before), which GEMM1's
     * early routing and the combine rely on: they read topk_ids before their PDL waits (pdl.cuh). */
    k3_pdl_launch();

    /* 1. counts (in cnt) */
    for (int32_t e = tid; e < ne; e += DT) cnt[e] = 0;
    __syncthreads();
    for (int32_t i = tid; i < np; i += DT) {
        const int32_t e = ids[i];
        if (e >= 0 && e < ne) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();

    /* 2. one exclusive scan of (count, units) packed as (hi 32, lo 32) over contiguous per-thread segments */
    const int32_t seg = (ne + DT - 1) / DT;
    const int32_t s0 = min(ne, tid * seg), s1 = min(ne, s0 + seg);
    unsigned long long local = 0;
    for (int32_t e = s0; e < s1; e++) {
        const int32_t c = cnt[e];
        local += ((unsigned long long)c << 32) + (unsigned long long)((c + tpu - 1) / tpu);
    }
    /* warp-shuffle scan, then one scan of the 32 warp totals: two barriers instead of the twenty of a
     * block-wide Hillis-Steele scan (the dispatch is on the decode critical path) */
    unsigned long long incl = local;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
        const unsigned long long v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    if (lane == 31) wsum[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        unsigned long long t = wsum[lane];
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
            const unsigned long long v = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += v;
        }
        wsum[lane] = t; /* inclusive over warps */
    }
    __syncthreads();
    const unsigned long long total = wsum[DT / 32 - 1];
    unsigned long long run = incl - local + (warp > 0 ? wsum[warp - 1] : 0ull); /* exclusive */
    int32_t off = (int32_t)(run >> 32), u = (int32_t)(run & 0xffffffffull);
    for (int32_t e = s0; e < s1; e++) {
        const int32_t c = cnt[e];
        offs[e] = off;
        cnt[e] = off; /* becomes the placement cursor */
        for (int32_t k = 0; k < c; k += tpu) act_off[u] = off + k, active[u++] = e;
        off += c;
    }
    if (tid == DT - 1) {
        offs[ne] = (int32_t)(total >> 32);
        *n_active = (int32_t)(total & 0xffffffffull);
        act_off[total & 0xffffffffull] = (int32_t)(total >> 32);
    }
    __syncthreads();

    /* 3. stable placement */
    for (int32_t base = 0; base < np; base += DT) {
        const int32_t i = base + tid;
        const int32_t e = i < np ? ids[i] : -1;
        const bool valid = e >= 0 && e < ne;
        /* loaded here, beside ids [i], not in the warp's turn below: there each warp waited for its load in turn,
         * serialized across the block (bench/NOTES-moe.md) */
        const float wv = wsort != NULL && i < np ? wts[i] : 0.0f;
        const unsigned peers = __match_any_sync(0xffffffffu, valid ? e : -1 - lane);
        const unsigned lt = (1u << lane) - 1u;
        const int rank = __popc(peers & lt);
        const int leader = __ffs(peers) - 1;
        const int warps_used = min(DT / 32, (np - base + 31) / 32);
        for (int w = 0; w < warps_used; w++) {
            if (warp == w) {
                int32_t b = 0;
                if (valid && lane == leader) {
                    b = cnt[e];
                    cnt[e] = b + __popc(peers);
                }
                b = __shfl_sync(0xffffffffu, b, leader);
                if (valid) {
                    list[b + rank] = i;
                    if (wsort) wsort[b + rank] = wv;
                }
            }
            __syncthreads();
        }
    }
}

} // namespace

extern "C" k3_status k3_cuda_moe_dispatch(k3_ctx *ctx, const int32_t *ids, int32_t np, int32_t num_experts,
                                          int32_t tokens_per_unit, int32_t *offs, int32_t *cur, int32_t *active,
                                          int32_t *act_off, int32_t *n_active, int32_t *list, const float *wts,
                                          float *wsort, void *stream) {
    if (tokens_per_unit < 1)
        return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT, "moe dispatch: tokens_per_unit must be >= 1 (got %d)",
                       (int)tokens_per_unit);
    if ((wts == NULL) != (wsort == NULL))
        return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT, "moe dispatch: wts and wsort must both be given or both be NULL");
    const size_t smem = num_experts <= DISPATCH_SMEM_E ? (size_t)num_experts * 4 : 0;
    k3_moe_dispatch_kernel<<<1, DT, smem, (cudaStream_t)stream>>>(ids, np, num_experts, tokens_per_unit, offs, cur,
                                                                  active, act_off, n_active, list, wts, wsort);
    K3_CUDA_LAUNCH_CHECK(ctx, "moe dispatch kernel");
    return K3_STATUS_SUCCESS;
}
