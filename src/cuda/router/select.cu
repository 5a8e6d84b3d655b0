/*
 * The GPU router's selection (src/cuda/router/router.h): the CPU router's (src/cpu/router.c) bit for bit.
 *
 * One block per token, launched with PDL (it reads the logits after its wait, through L2): keys as on the CPU
 * (sigmoid from core/router_math.h, + bias, NaN -> -inf; or softmax probabilities with the CPU's sequential sum),
 * then the top_k with ties to the lower id, by exact methods that all give the sequence the CPU's stable insertion
 * selection produces: for sigmoid keys with E <= 1024, top_k <= 32 and at least top_k warps of keys, a threshold
 * from the warps' best keys and a ranking of the few keys past it; for other sigmoid cases with top_k <= 16, warp
 * sorts of 32 keys merged in pairs; otherwise, for 257..1024 experts, warp sorts of 128 keys ranked by counting, or
 * top_k rounds of a block arg-max.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "core/router_math.h"
#include "cuda/common/check.cuh"
#include "cuda/router/router.h"
#include "cuda/common/pdl.cuh"

namespace {

constexpr int SEL_THREADS = 256;
constexpr int SEL_SORT_MAX = SEL_THREADS / 32 * 128; /* experts the sorting selection takes: 128 per warp */
/* Below this many experts the top_k arg-max rounds are faster than the sorts: the sorts' fixed chain of 28 shuffle
 * steps costs more than a few rounds over few keys (measured faster at E 56, slower at E 896, sizes in between not
 * measured: bench/NOTES-moe.md). */
constexpr int SEL_SORT_MIN = 257;
/* The threshold selection (sigmoid keys): one key per thread; up to 32 winners, ranked by one warp's lanes. */
constexpr int TSEL_MAX_EXPERTS = 1024;
constexpr int TSEL_MAX_K = 32;
/* The merging selection (sigmoid keys): one key per thread, 32 keys per warp, lists of the 16 best merged in pairs. */
constexpr int MSEL_MAX_EXPERTS = 1024;
constexpr int MSEL_MAX_K = 16;

/* (value, id) arg-max with ties to the lower id; a NaN value marks an expert already taken. */
__device__ __forceinline__ bool better(float v, int id, float bv, int bid) {
    return bid < 0 || v > bv || (v == bv && id < bid);
}

/* A key and its expert id as one 64-bit integer whose order is the selection's: larger key first, then lower id
 * (the float's bits made order-preserving; -0 taken as +0, since the keys compare as floats; no NaN keys here). */
__device__ __forceinline__ uint64_t sel_pack(float v, int id) {
    uint32_t u = __float_as_uint(__fadd_rn(v, 0.0f)); /* -0 + 0 = +0 */
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)u << 32) | (uint32_t)(0xffffffffu - (uint32_t)id);
}
__device__ __forceinline__ int sel_id(uint64_t p) { return (int)(0xffffffffu - (uint32_t)p); }

/* Lanes 0..k-1 of one warp hold the winners in rank order (id, sigmoid): the weights' sum runs in the CPU's order on
 * lane 0's register chain, the divisions in parallel; every lane of the warp calls it. */
__device__ __forceinline__ void sel_write_winners(int lane, int32_t k, int id, float w, int32_t renorm, float scaling,
                                                  int64_t t, int32_t *__restrict__ ids, float *__restrict__ wts) {
    float sum = 0.0f;
    for (int j = 0; j < k; j++) sum = __fadd_rn(sum, __shfl_sync(0xffffffffu, w, j));
    if (lane < k) {
        const float out = renorm ? __fmul_rn(__fdiv_rn(w, __fadd_rn(sum, 1e-20f)), scaling) : __fmul_rn(w, scaling);
        ids[t * k + lane] = id;
        wts[t * k + lane] = out;
    }
}

/* A threshold candidate's rank: its count of better candidates (keys are unique). */
__device__ __forceinline__ int sel_rank(const uint64_t *cand, int nc, uint64_t c) {
    int rank = 0;
    for (int o = 0; o < nc; o++) rank += cand[o] > c; /* every thread reads the same entry */
    return rank;
}

/* Sorts the warp's 128 packed keys (4 per lane, element 4 lane + r) into descending order: a bitonic network, the
 * pairs 1 and 2 apart inside a lane, the others between lanes by shuffles. */
__device__ __forceinline__ void sel_warp_sort128(uint64_t (&a)[4], int lane) {
#pragma unroll
    for (int k = 2; k <= 128; k *= 2)
#pragma unroll
        for (int j = k / 2; j >= 1; j /= 2) {
            if (j >= 4) {
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const int i = lane * 4 + r;
                    const uint64_t o = __shfl_xor_sync(0xffffffffu, a[r], j / 4);
                    const bool lower = (i & j) == 0, take_max = lower == ((i & k) == 0);
                    a[r] = take_max ? (o > a[r] ? o : a[r]) : (o < a[r] ? o : a[r]);
                }
            } else {
#pragma unroll
                for (int r = 0; r < 4; r++)
                    if ((r & j) == 0) {
                        const int i = lane * 4 + r;
                        const uint64_t x = a[r], y = a[r + j];
                        const bool desc = (i & k) == 0; /* this pair's larger value goes to the lower index */
                        a[r] = desc ? (x > y ? x : y) : (x < y ? x : y);
                        a[r + j] = desc ? (x > y ? y : x) : (x < y ? y : x);
                    }
            }
        }
}

__global__ void __launch_bounds__(SEL_THREADS)
    k3_router_select_kernel(const float *logits, const float *__restrict__ bias, int32_t ne,
                            int32_t k, int32_t softmax, int32_t renorm, float scaling, int32_t *__restrict__ ids,
                            float *__restrict__ wts) {
    extern __shared__ float keys[]; /* [ne] choice keys, then (sigmoid) [ne] the sigmoids the weights use */
    float *sg = keys + ne;
    __shared__ float red_v[SEL_THREADS / 32];
    __shared__ int red_i[SEL_THREADS / 32];
    __shared__ int sel[32];
    __shared__ float sel_v[32];
    __shared__ uint64_t cand[SEL_THREADS]; /* each warp's first k (k <= 32: 8 k <= SEL_THREADS) */
    __shared__ float s_scalar;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t t = blockIdx.x;
    const float *lg = logits + t * ne;
    /* launched with PDL behind the logits kernel: its logits are read after the wait, through L2 (__ldcg) */
    k3_pdl_wait();
    k3_pdl_launch();

    if (!softmax) {
        for (int e = tid; e < ne; e += SEL_THREADS) {
            /* each sigmoid once, in parallel: the weights below reuse it (computing them on one thread costs
             * top_k serial sigmoids per token) */
            const float l = __ldcg(lg + e), sgm = k3_rm_sigmoid(l);
            const float key = __fadd_rn(sgm, bias ? bias[e] : 0.0f);
            keys[e] = isnan(key) ? -INFINITY : key;
            sg[e] = isnan(l) ? 0.0f : sgm;
        }
    } else {
        /* NaN logits -> -inf; the maximum (exact, so any reduction order gives it) */
        float mx = -INFINITY;
        for (int e = tid; e < ne; e += SEL_THREADS) {
            float l = __ldcg(lg + e);
            l = isnan(l) ? -INFINITY : l;
            keys[e] = l;
            mx = fmaxf(mx, l);
        }
        for (int o = 16; o >= 1; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        if (lane == 0) red_v[warp] = mx;
        __syncthreads();
        mx = red_v[0];
        for (int w = 1; w < SEL_THREADS / 32; w++) mx = fmaxf(mx, red_v[w]);
        for (int e = tid; e < ne; e += SEL_THREADS) keys[e] = keys[e] == mx ? 1.0f : k3_rm_exp(__fsub_rn(keys[e], mx));
        __syncthreads();
        if (tid == 0) { /* the CPU's sequential sum, then its reciprocal */
            float sum = 0.0f;
            for (int e = 0; e < ne; e++) sum = __fadd_rn(sum, keys[e]);
            s_scalar = __fdiv_rn(1.0f, sum);
        }
        __syncthreads();
        const float inv = s_scalar;
        for (int e = tid; e < ne; e += SEL_THREADS) keys[e] = __fmul_rn(keys[e], inv);
    }
    __syncthreads();

    if (ne >= SEL_SORT_MIN && ne <= SEL_SORT_MAX) {
        /* Each warp sorts its slice (<= 128 experts; padding packs to 0, below every key) and offers its first k;
         * each of the 8 warps' k candidates gets its rank by counting the better ones (keys are unique: ids differ).
         * Any expert of the global top k is in its slice's top k: the CPU's sequence exactly. */
        constexpr int NW = SEL_THREADS / 32;
        const int chunk = (ne + NW - 1) / NW, w0 = warp * chunk, w1 = min(ne, w0 + chunk);
        uint64_t a[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int e = w0 + lane * 4 + r;
            a[r] = e < w1 ? sel_pack(keys[e], e) : 0ull;
        }
        sel_warp_sort128(a, lane);
#pragma unroll
        for (int r = 0; r < 4; r++)
            if (lane * 4 + r < k) cand[warp * k + lane * 4 + r] = a[r];
        __syncthreads();
        if (tid < NW * k && cand[tid] != 0ull) {
            const uint64_t c = cand[tid];
            const int rank = sel_rank(cand, NW * k, c);
            if (rank < k) sel[rank] = sel_id(c), sel_v[rank] = keys[sel_id(c)];
        }
        __syncthreads();
    } else {
        for (int j = 0; j < k; j++) {
            float bv = 0.0f;
            int bid = -1;
            for (int e = tid; e < ne; e += SEL_THREADS) {
                const float v = keys[e];
                if (!isnan(v) && better(v, e, bv, bid)) bv = v, bid = e;
            }
            for (int o = 16; o >= 1; o /= 2) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const int oi = __shfl_xor_sync(0xffffffffu, bid, o);
                if (oi >= 0 && better(ov, oi, bv, bid)) bv = ov, bid = oi;
            }
            if (lane == 0) red_v[warp] = bv, red_i[warp] = bid;
            __syncthreads();
            if (tid == 0) {
                for (int w = 1; w < SEL_THREADS / 32; w++)
                    if (red_i[w] >= 0 && better(red_v[w], red_i[w], bv, bid)) bv = red_v[w], bid = red_i[w];
                sel[j] = bid; /* k <= E, so an untaken expert always exists */
                sel_v[j] = bv;
                keys[bid] = __int_as_float(0x7fc00000); /* taken */
            }
            __syncthreads();
        }
    }

    if (tid == 0) {
        float w[32];
        float sum = 0.0f;
        for (int j = 0; j < k; j++) {
            if (softmax) {
                w[j] = sel_v[j];
            } else {
                w[j] = sg[sel[j]];
            }
            sum = __fadd_rn(sum, w[j]);
        }
        if (softmax) {
            const float scale = renorm ? __fdiv_rn(scaling, sum) : scaling;
            for (int j = 0; j < k; j++) w[j] = __fmul_rn(w[j], scale);
        } else if (renorm) {
            const float den = __fadd_rn(sum, 1e-20f);
            for (int j = 0; j < k; j++) w[j] = __fmul_rn(__fdiv_rn(w[j], den), scaling);
        } else {
            for (int j = 0; j < k; j++) w[j] = __fmul_rn(w[j], scaling);
        }
        for (int j = 0; j < k; j++) {
            ids[t * k + j] = sel[j];
            wts[t * k + j] = w[j];
        }
    }
}

/* The sigmoid selection for E <= 1024 and top_k <= 16, one block per token, one expert per thread (blockDim = 32 x
 * a power of two): each warp sorts its 32 packed keys, then the warps' lists of their 16 best are merged in pairs
 * (a bitonic merge of one list against the other reversed) until one list is left; its first top_k are the CPU's
 * sequence (keys are unique: ids differ; padding packs to 0, below every key). */
__global__ void __launch_bounds__(MSEL_MAX_EXPERTS)
    k3_router_select_merge_kernel(const float *logits, const float *__restrict__ bias, int32_t ne, int32_t k,
                                  int32_t renorm, float scaling, int32_t *__restrict__ ids, float *__restrict__ wts) {
    __shared__ float sg[MSEL_MAX_EXPERTS];
    __shared__ uint64_t lists[2][MSEL_MAX_EXPERTS / 32][MSEL_MAX_K];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t t = blockIdx.x;
    const float b = bias && tid < ne ? bias[tid] : 0.0f; /* a weight: not written by the previous kernel */
    k3_pdl_wait(); /* the logits come from the previous kernel: read after the wait, through L2 */
    k3_pdl_launch();
    uint64_t v = 0ull;
    if (tid < ne) {
        const float l = __ldcg(logits + t * ne + tid), sgm = k3_rm_sigmoid(l);
        const float key = __fadd_rn(sgm, b);
        sg[tid] = isnan(l) ? 0.0f : sgm;
        v = sel_pack(isnan(key) ? -INFINITY : key, tid);
    }
    /* bitonic sort of the warp's 32 keys, descending */
#pragma unroll
    for (int kk = 2; kk <= 32; kk *= 2)
#pragma unroll
        for (int j = kk / 2; j >= 1; j /= 2) {
            const uint64_t o = __shfl_xor_sync(0xffffffffu, v, j);
            const bool take_max = ((lane & j) == 0) == ((lane & kk) == 0);
            v = take_max ? (o > v ? o : v) : (o < v ? o : v);
        }
    if (lane < MSEL_MAX_K) lists[0][warp][lane] = v;
    __syncthreads();
    int cur = 0;
    for (int n = (int)(blockDim.x / 32); n > 1; n /= 2) {
        if (warp < n / 2) {
            /* list 2w descending in lanes 0..15, list 2w + 1 ascending in lanes 16..31: a bitonic sequence */
            v = lane < MSEL_MAX_K ? lists[cur][2 * warp][lane] : lists[cur][2 * warp + 1][31 - lane];
#pragma unroll
            for (int j = 16; j >= 1; j /= 2) {
                const uint64_t o = __shfl_xor_sync(0xffffffffu, v, j);
                v = (lane & j) == 0 ? (o > v ? o : v) : (o < v ? o : v);
            }
            if (lane < MSEL_MAX_K) lists[cur ^ 1][warp][lane] = v;
        }
        cur ^= 1;
        __syncthreads();
    }
    if (warp == 0) {
        const int id = lane < k ? sel_id(lists[cur][0][lane]) : 0;
        sel_write_winners(lane, k, id, lane < k ? sg[id] : 0.0f, renorm, scaling, t, ids, wts);
    }
}

/* The threshold selection for sigmoid keys, E <= 1024, top_k <= 32 and at least top_k warps of keys; one block per
 * token, one expert per thread (blockDim = 32 x the warps of keys). Why it is exact: the k-th best of the warps' best
 * keys, th, is reached by k distinct keys, so the k-th best key overall is >= th and every winner is a candidate
 * (key >= th); and every key better than a candidate is a candidate too, so a candidate's count of better
 * candidates is its rank among all keys (keys are unique: ids differ; padding packs to 0, below th). Its cost is a
 * warp reduction, two barriers and a ranking of the few candidates (~20-40 at E 896, k 16 for random keys; equal
 * keys can make them hundreds, ranked by as many threads), where the merge needs a sort and five merge levels. */
__global__ void __launch_bounds__(TSEL_MAX_EXPERTS)
    k3_router_select_threshold_kernel(const float *logits, const float *__restrict__ bias, int32_t ne, int32_t k,
                                      int32_t renorm, float scaling, int32_t *__restrict__ ids,
                                      float *__restrict__ wts) {
    __shared__ uint64_t warp_best[TSEL_MAX_EXPERTS / 32];
    __shared__ uint64_t cand[TSEL_MAX_EXPERTS];
    __shared__ float cand_sg[TSEL_MAX_EXPERTS];
    __shared__ int32_t win_id[TSEL_MAX_K];
    __shared__ float win_sg[TSEL_MAX_K];
    __shared__ uint64_t s_th;
    __shared__ int s_count;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = (int)(blockDim.x / 32);
    const int64_t t = blockIdx.x;
    const float b = bias && tid < ne ? bias[tid] : 0.0f; /* a weight: not written by the previous kernel */
    if (tid == 0) s_count = 0;
    k3_pdl_wait(); /* the logits come from the previous kernel: read after the wait, through L2 */
    k3_pdl_launch();
    uint64_t v = 0ull;
    float sg = 0.0f;
    if (tid < ne) {
        const float l = __ldcg(logits + t * ne + tid), sgm = k3_rm_sigmoid(l);
        const float key = __fadd_rn(sgm, b);
        sg = isnan(l) ? 0.0f : sgm;
        v = sel_pack(isnan(key) ? -INFINITY : key, tid);
    }
    /* the warp's best: the largest high word, and among equal high words the lowest lane, which holds the lowest id
     * and so the largest low word */
    const uint32_t hi = (uint32_t)(v >> 32);
    const uint32_t hmax = __reduce_max_sync(0xffffffffu, hi);
    if (lane == __ffs(__ballot_sync(0xffffffffu, hi == hmax)) - 1) warp_best[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const uint64_t mine = lane < nw ? warp_best[lane] : 0ull;
        int better = 0;
        for (int o = 0; o < nw; o++) better += warp_best[o] > mine; /* every lane reads the same entry */
        if (lane < nw && better == k - 1) s_th = mine;
    }
    __syncthreads();
    const bool is_cand = tid < ne && v >= s_th;
    const uint32_t ballot = __ballot_sync(0xffffffffu, is_cand);
    int base = 0;
    if (lane == 0 && ballot != 0u) base = atomicAdd(&s_count, __popc(ballot)); /* any order: ranks decide */
    base = __shfl_sync(0xffffffffu, base, 0);
    if (is_cand) {
        const int p = base + __popc(ballot & ((1u << lane) - 1u));
        cand[p] = v;
        cand_sg[p] = sg;
    }
    __syncthreads();
    const int nc = s_count; /* >= k: the k best warps' best keys */
    if (nc <= 32) {
        if (warp != 0) return;
        if (lane < nc) {
            const uint64_t c = cand[lane];
            const int rank = sel_rank(cand, nc, c);
            if (rank < k) win_id[rank] = sel_id(c), win_sg[rank] = cand_sg[lane];
        }
        __syncwarp();
    } else {
        if (tid < nc) { /* nc <= ne <= blockDim.x */
            const uint64_t c = cand[tid];
            const int rank = sel_rank(cand, nc, c);
            if (rank < k) win_id[rank] = sel_id(c), win_sg[rank] = cand_sg[tid];
        }
        __syncthreads();
        if (warp != 0) return;
    }
    sel_write_winners(lane, k, lane < k ? win_id[lane] : 0, lane < k ? win_sg[lane] : 0.0f, renorm, scaling, t, ids,
                      wts);
}

} // namespace

/* The selection from the logits in ws. With PDL: behind the logits kernel on the same stream it waits for it, then
 * reads the logits through L2 (__ldcg), so its launch gap is hidden; behind an event (another stream) the wait
 * returns at once. */
static k3_status router_select(k3_ctx *ctx, const k3_router_desc *d, int64_t m, const float *bias,
                               const float *logits, int32_t *topk_ids, float *topk_weights, cudaStream_t s) {
    const int32_t ne = d->num_experts;
    const float *b = d->kind == K3_ROUTER_SIGMOID_NOAUX_TC ? bias : NULL;
    cudaError_t e;
    const unsigned key_warps = (unsigned)((ne + 31) / 32);
    if (d->kind != K3_ROUTER_SOFTMAX && ne <= TSEL_MAX_EXPERTS && d->top_k <= TSEL_MAX_K &&
        key_warps >= (unsigned)d->top_k) {
        e = k3_launch_pdl(k3_router_select_threshold_kernel, dim3((unsigned)m), dim3(key_warps * 32), 0, s, logits, b,
                          ne, d->top_k, (int32_t)d->renormalize, d->scaling_factor, topk_ids, topk_weights);
    } else if (d->kind != K3_ROUTER_SOFTMAX && ne <= MSEL_MAX_EXPERTS && d->top_k <= MSEL_MAX_K) {
        unsigned lists = 1;
        while (lists * 32 < (unsigned)ne) lists *= 2;
        e = k3_launch_pdl(k3_router_select_merge_kernel, dim3((unsigned)m), dim3(lists * 32), 0, s, logits, b, ne,
                          d->top_k, (int32_t)d->renormalize, d->scaling_factor, topk_ids, topk_weights);
    } else {
        e = k3_launch_pdl(k3_router_select_kernel, dim3((unsigned)m), dim3(SEL_THREADS), (size_t)ne * 2 * sizeof(float),
                          s, logits, b, ne, d->top_k, (int32_t)(d->kind == K3_ROUTER_SOFTMAX),
                          (int32_t)d->renormalize, d->scaling_factor, topk_ids, topk_weights);
    }
    if (e != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of the router select kernel failed: %s", cudaGetErrorString(e));
    return K3_STATUS_SUCCESS;
}

/* m is at most the plan's max_tokens (the API's bound, 65536), well inside grid.x's range. */
extern "C" k3_status k3_cuda_router_run_select(k3_ctx *ctx, const k3_router_desc *d, int64_t m, const float *bias,
                                               int32_t *topk_ids, float *topk_weights, const void *ws,
                                               void *stream) {
    return router_select(ctx, d, m, bias, (const float *)ws, topk_ids, topk_weights, (cudaStream_t)stream);
}
