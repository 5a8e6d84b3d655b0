/*
 * The GPU router: the CPU router (src/cpu/router.c) reproduced bit for bit.
 *
 * 1. Logits: 16 lanes per (token, expert) dot product, lane l summing the products of elements l, l + 16, ...
 *    in order (the CPU's K3_RT_LANES partial sums, the tail included, since element hv + i is lane i's last
 *    term), then the CPU's tree (lane l += lane l + w for w = 8, 4, 2, 1) through shuffles. Every product and
 *    sum is a separate __fmul_rn / __fadd_rn, so nvcc cannot fuse them (the host side is -ffp-contract=off).
 *    The order fixes one long dependent chain per lane, so the loads must run far ahead of it: the main kernel
 *    streams the block's gate rows and token rows through a cp.async ring of K chunks in shared memory
 *    (a loop of register loads exposed one DRAM latency per element step and was several times slower on the
 *    H200: bench/NOTES-moe.md). Rows that cannot be copied in 16-byte pieces use the register loop.
 *    The ring kernel is launched with PDL (its gate prefetch overlaps the previous kernel; x goes through L2 by
 *    cp.async, coherent after griddepcontrol.wait); the register loop reads x through the read-only path, so it
 *    starts only after its producer completed (a plain launch).
 * 2. Selection, one block per token, launched with PDL (it reads the logits after its wait, through L2): keys as
 *    on the CPU (sigmoid from core/router_math.h, + bias, NaN -> -inf; or softmax probabilities with the CPU's
 *    sequential sum), then the top_k by one of two exact methods with ties to the lower id, both giving the
 *    sequence the CPU's stable insertion selection produces: for 257..1024 experts each warp sorts its slice as
 *    packed (key, id) words and the warps' first top_k are ranked by counting; otherwise top_k rounds of a
 *    block arg-max. The weights' short sums run on one thread in the CPU's order.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "core/router_math.h"
#include "cuda/common/check.cuh"
#include "cuda/common/ptr_check.h"
#include "cuda/router/router.h"
#include "cuda/common/cp_async.cuh"
#include "cuda/common/pdl.cuh"

namespace {

constexpr int RT_LANES = 16;     /* the CPU's K3_RT_LANES */
constexpr int RT_EXPERTS = 16;   /* experts per logits block (16 groups of 16 lanes = 256 threads) */
constexpr int RT_TOKENS = 4;     /* tokens per logits block: each gate element loaded once serves 4 tokens */
constexpr int RT_UNROLL = 32;    /* gate elements in flight per lane */
constexpr int SEL_THREADS = 256;
constexpr int SEL_SORT_MAX = SEL_THREADS / 32 * 128; /* experts the sorting selection takes: 128 per warp */
/* Below this many experts the top_k arg-max rounds are faster than the sorts: the sorts' fixed chain of 28 shuffle
 * steps costs more than a few rounds over few keys (measured faster at E 56, slower at E 896, sizes in between not
 * measured: bench/NOTES-moe.md). */
constexpr int SEL_SORT_MIN = 257;

/* The ring kernel: 8 experts (8 groups of 16 lanes) x TOK tokens per block, K in chunks of RING_CHUNK(G)
 * elements, as many stages as fit the default 48 KB of dynamic shared memory (at most 10). */
constexpr int RING_EXPERTS = 8;
constexpr int RING_THREADS = RING_EXPERTS * RT_LANES;
constexpr int RING_SMEM_MAX = 48 * 1024;

__device__ __forceinline__ float bf16f(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }
__device__ __forceinline__ float gate_f(float g) { return g; }
__device__ __forceinline__ float gate_f(uint16_t g) { return bf16f(g); }

template <typename G>
__host__ __device__ constexpr int ring_chunk() { return 512 / (int)sizeof(G); } /* 1 KB of one gate row per stage and expert */
template <typename G, int TOK>
__host__ __device__ constexpr int ring_stage_bytes() { return RING_EXPERTS * ring_chunk<G>() * (int)sizeof(G) + TOK * ring_chunk<G>() * 2; }
template <typename G, int TOK>
__host__ __device__ constexpr int ring_stages() {
    return RING_SMEM_MAX / ring_stage_bytes<G, TOK>() < 10 ? RING_SMEM_MAX / ring_stage_bytes<G, TOK>() : 10;
}

/* A thread's share of the ring copies: its <= 2 gate pieces and <= 2 token pieces of every chunk (16 bytes each, at
 * the same offsets in every chunk), with their sources resolved once, so a chunk's copies cost a compare, an add and
 * the cp.async each (profiled: the copy loop's index arithmetic was a large share of the logits kernel's issue slots).
 * Rows past ne / m repeat the last row (never stored); pieces past h are skipped (the compute loop never reads them).
 * Every issue commits a group, empty past the last chunk, so the wait counts stay uniform. */
template <typename G, int TOK>
struct ring_copies {
    static constexpr int CH = ring_chunk<G>(), GP = CH * (int)sizeof(G) / 16, XP = CH * 2 / 16;
    static constexpr int NG = (RING_EXPERTS * GP + RING_THREADS - 1) / RING_THREADS;
    static constexpr int NX = (TOK * XP + RING_THREADS - 1) / RING_THREADS;
    const G *gsrc[NG];
    const uint16_t *xsrc[NX];
    int gk[NG], xk[NX]; /* the piece's first element within a chunk; -1: no piece */

    __device__ __forceinline__ ring_copies(const uint16_t *__restrict__ x, const G *__restrict__ gate, int32_t m,
                                           int32_t ne, int64_t h, int e0, int t0) {
#pragma unroll
        for (int i = 0; i < NG; i++) {
            const int p = threadIdx.x + i * RING_THREADS, r = p / GP, q = p % GP;
            gk[i] = p < RING_EXPERTS * GP ? q * (16 / (int)sizeof(G)) : -1;
            gsrc[i] = gate + (int64_t)min(e0 + r, ne - 1) * h + (gk[i] < 0 ? 0 : gk[i]);
        }
#pragma unroll
        for (int i = 0; i < NX; i++) {
            const int p = threadIdx.x + i * RING_THREADS, t = p / XP, q = p % XP;
            xk[i] = p < TOK * XP ? q * 8 : -1;
            xsrc[i] = x + (int64_t)min(t0 + t, m - 1) * h + (xk[i] < 0 ? 0 : xk[i]);
        }
    }
    /* Copies chunk c into ring slot c % S. */
    __device__ __forceinline__ void issue(unsigned char *smem, int c, int nchunks, int64_t h) const {
        constexpr int S = ring_stages<G, TOK>();
        if (c < nchunks) {
            unsigned char *st = smem + (size_t)(c % S) * ring_stage_bytes<G, TOK>();
            const int64_t k0 = (int64_t)c * CH;
#pragma unroll
            for (int i = 0; i < NG; i++)
                if (gk[i] >= 0 && k0 + gk[i] < h)
                    k3_cp_async16(st + (threadIdx.x + i * RING_THREADS) * 16, gsrc[i] + k0);
            unsigned char *xs = st + RING_EXPERTS * CH * sizeof(G);
#pragma unroll
            for (int i = 0; i < NX; i++)
                if (xk[i] >= 0 && k0 + xk[i] < h) k3_cp_async16(xs + (threadIdx.x + i * RING_THREADS) * 16, xsrc[i] + k0);
        }
        k3_cp_async_commit();
    }
};

/* Needs h % 8 == 0 and 16-byte aligned x and gate (every row then starts 16-byte aligned). */
template <typename G, int TOK>
__global__ void __launch_bounds__(RING_THREADS)
    k3_router_logits_ring_kernel(const uint16_t *__restrict__ x, const G *__restrict__ gate, int32_t m, int32_t ne,
                                 int64_t h, float *__restrict__ logits) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int CH = ring_chunk<G>(), S = ring_stages<G, TOK>();
    const int lane = threadIdx.x % RT_LANES, grp = threadIdx.x / RT_LANES;
    const int e0 = blockIdx.x * RING_EXPERTS, t0 = blockIdx.y * TOK;
    const int nchunks = (int)((h + CH - 1) / CH);

    /* The gate does not depend on the previous kernel: pull the first chunks' rows into L2 while it drains. */
    for (int p = threadIdx.x; p < RING_EXPERTS * (S - 1) * 8; p += RING_THREADS) {
        const int r = p % RING_EXPERTS, q = p / RING_EXPERTS; /* 128-byte lines of the first S-1 chunks */
        const int64_t k = (int64_t)q * (128 / (int)sizeof(G));
        if (k < h) asm volatile("prefetch.global.L2 [%0];" ::"l"(gate + (int64_t)min(e0 + r, ne - 1) * h + k));
    }
    k3_pdl_wait(); /* x comes from the previous kernel */
    k3_pdl_launch();

    const ring_copies<G, TOK> copies(x, gate, m, ne, h, e0, t0);
    for (int c = 0; c < S - 1; c++) copies.issue(smem, c, nchunks, h);
    float acc[TOK];
#pragma unroll
    for (int t = 0; t < TOK; t++) acc[t] = 0.0f;
    for (int c = 0; c < nchunks; c++) {
        k3_cp_async_wait<S - 2>(); /* this thread's pieces of chunk c have landed */
        __syncthreads();           /* everyone's have; and everyone is done with chunk c - 1, whose slot ... */
        copies.issue(smem, c + S - 1, nchunks, h); /* ... is refilled here */
        const unsigned char *st = smem + (size_t)(c % S) * ring_stage_bytes<G, TOK>();
        const G *gs = (const G *)st + grp * CH + lane;
        const uint16_t *xs = (const uint16_t *)(st + RING_EXPERTS * CH * sizeof(G)) + lane;
        const int64_t k0 = (int64_t)c * CH;
        if (k0 + CH <= h) {
#pragma unroll
            for (int j = 0; j < CH / RT_LANES; j++) {
                const float g = gate_f(gs[j * RT_LANES]);
#pragma unroll
                for (int t = 0; t < TOK; t++)
                    acc[t] = __fadd_rn(acc[t], __fmul_rn(bf16f(xs[t * CH + j * RT_LANES]), g));
            }
        } else {
            for (int j = 0; j < CH / RT_LANES && k0 + j * RT_LANES + lane < h; j++) {
                const float g = gate_f(gs[j * RT_LANES]);
#pragma unroll
                for (int t = 0; t < TOK; t++)
                    acc[t] = __fadd_rn(acc[t], __fmul_rn(bf16f(xs[t * CH + j * RT_LANES]), g));
            }
        }
    }
    k3_cp_async_wait<0>(); /* no copy may outlive the block (the trailing groups are empty) */
    const int e = e0 + grp;
#pragma unroll
    for (int t = 0; t < TOK; t++) {
        float v = acc[t];
#pragma unroll
        for (int w = RT_LANES / 2; w >= 1; w /= 2) v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, w, RT_LANES));
        if (lane == 0 && e < ne && t0 + t < m) logits[(int64_t)(t0 + t) * ne + e] = v;
    }
}

template <bool GATE_F32>
__global__ void __launch_bounds__(RT_LANES * RT_EXPERTS)
    k3_router_logits_kernel(const uint16_t *__restrict__ x, const void *__restrict__ gate, int32_t m, int32_t ne,
                            int64_t h, float *__restrict__ logits) {
    const int lane = threadIdx.x % RT_LANES;
    const int e = blockIdx.x * RT_EXPERTS + threadIdx.x / RT_LANES;
    const int t0 = blockIdx.y * RT_TOKENS;
    /* no early return: the whole 16-lane group must reach the shuffles (e is uniform within a group) */
    const bool active = e < ne;
    float acc[RT_TOKENS];
#pragma unroll
    for (int t = 0; t < RT_TOKENS; t++) acc[t] = 0.0f;
    if (active) {
        /* RT_UNROLL gate loads issued before the (strictly ordered) adds consume them: memory-level parallelism
         * for a kernel whose order of summation is fixed */
        for (int64_t k0 = lane; k0 < h; k0 += (int64_t)RT_LANES * RT_UNROLL) {
            float g[RT_UNROLL];
#pragma unroll
            for (int u = 0; u < RT_UNROLL; u++) {
                const int64_t k = k0 + (int64_t)RT_LANES * u;
                g[u] = k >= h ? 0.0f
                              : GATE_F32 ? __ldg((const float *)gate + (int64_t)e * h + k)
                                         : bf16f(__ldg((const uint16_t *)gate + (int64_t)e * h + k));
            }
#pragma unroll
            for (int u = 0; u < RT_UNROLL; u++) {
                const int64_t k = k0 + (int64_t)RT_LANES * u;
                if (k >= h) break;
#pragma unroll
                for (int t = 0; t < RT_TOKENS; t++)
                    if (t0 + t < m)
                        acc[t] = __fadd_rn(acc[t], __fmul_rn(bf16f(__ldg(x + (int64_t)(t0 + t) * h + k)), g[u]));
            }
        }
    }
#pragma unroll
    for (int t = 0; t < RT_TOKENS; t++) {
        float v = acc[t];
#pragma unroll
        for (int w = RT_LANES / 2; w >= 1; w /= 2) v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, w, RT_LANES));
        if (active && lane == 0 && t0 + t < m) logits[(int64_t)(t0 + t) * ne + e] = v;
    }
}

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
            int rank = 0;
            for (int o = 0; o < NW * k; o++) rank += cand[o] > c; /* every thread reads the same entry */
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

template <typename G, int TOK>
cudaError_t launch_ring_tok(const uint16_t *x, const G *gate, int64_t m, int32_t ne, int64_t h, float *logits,
                            cudaStream_t s) {
    const dim3 grid((unsigned)((ne + RING_EXPERTS - 1) / RING_EXPERTS), (unsigned)((m + TOK - 1) / TOK));
    const size_t smem = (size_t)ring_stages<G, TOK>() * ring_stage_bytes<G, TOK>();
    return k3_launch_pdl(k3_router_logits_ring_kernel<G, TOK>, grid, dim3(RING_THREADS), smem, s, x, gate,
                         (int32_t)m, ne, h, logits);
}

/* Tokens per block: each gate element read from shared memory serves TOK tokens; no idle token rows at m < 4. */
template <typename G>
cudaError_t launch_ring(const uint16_t *x, const G *gate, int64_t m, int32_t ne, int64_t h, float *logits,
                        cudaStream_t s) {
    if (m == 1) return launch_ring_tok<G, 1>(x, gate, m, ne, h, logits, s);
    if (m == 2) return launch_ring_tok<G, 2>(x, gate, m, ne, h, logits, s);
    if (m <= 4) return launch_ring_tok<G, 4>(x, gate, m, ne, h, logits, s);
    return launch_ring_tok<G, 8>(x, gate, m, ne, h, logits, s);
}

/* A plain launch: this kernel reads x through the read-only (.nc) path, which is only valid when the kernel
 * that wrote x has completed before this one starts (no PDL). */
cudaError_t launch_plain(bool f32, const uint16_t *x, const void *gate, int64_t m, int32_t ne, int64_t h,
                         float *logits, cudaStream_t s) {
    const dim3 grid((unsigned)((ne + RT_EXPERTS - 1) / RT_EXPERTS), (unsigned)((m + RT_TOKENS - 1) / RT_TOKENS));
    if (f32)
        k3_router_logits_kernel<true><<<grid, RT_LANES * RT_EXPERTS, 0, s>>>(x, gate, (int32_t)m, ne, h, logits);
    else
        k3_router_logits_kernel<false><<<grid, RT_LANES * RT_EXPERTS, 0, s>>>(x, gate, (int32_t)m, ne, h, logits);
    return cudaGetLastError();
}

} // namespace

extern "C" size_t k3_cuda_router_ws_bytes(const k3_router_desc *d) {
    /* the plan bounds both factors; checked anyway, since a wrapped size would let the kernel write past ws */
    if (d->max_tokens < 1 || d->num_experts < 1) return SIZE_MAX;
    const size_t mt = (size_t)d->max_tokens, e = (size_t)d->num_experts;
    if (mt > SIZE_MAX / sizeof(float) / e) return SIZE_MAX;
    return mt * e * sizeof(float);
}

extern "C" k3_status k3_cuda_router_run(k3_ctx *ctx, const k3_router_desc *d, int64_t m, const void *x,
                                        const void *gate, const float *bias, int32_t *topk_ids,
                                        float *topk_weights, void *ws, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    const int32_t ne = d->num_experts;
    if (m > (int64_t)65535 * RT_TOKENS)
        return k3_fail(ctx, K3_STATUS_UNSUPPORTED, "router run: the CUDA router takes at most %d tokens per call (got %lld)",
                       65535 * RT_TOKENS, (long long)m);
    {
        const void *ptrs[] = {x, gate, bias, topk_ids, topk_weights, ws};
        const char *names[] = {"x", "gate", "bias", "topk_ids", "topk_weights", "ws"};
        K3_TRY(k3_cuda_check_device_ptrs(ctx, stream, "router run", 6, ptrs, names));
    }
    float *logits = (float *)ws;
    const bool ring = d->hidden % 8 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)gate & 15) == 0;
    cudaError_t e = ring ? (d->gate_dtype == K3_DTYPE_F32
                                ? launch_ring<float>((const uint16_t *)x, (const float *)gate, m, ne, d->hidden, logits, s)
                                : launch_ring<uint16_t>((const uint16_t *)x, (const uint16_t *)gate, m, ne, d->hidden,
                                                        logits, s))
                         : launch_plain(d->gate_dtype == K3_DTYPE_F32, (const uint16_t *)x, gate, m, ne, d->hidden,
                                        logits, s);
    if (e != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of the router logits kernel failed: %s", cudaGetErrorString(e));
    /* with PDL: select waits for the logits kernel, then reads them through L2 (__ldcg), so its launch gap is hidden */
    e = k3_launch_pdl(k3_router_select_kernel, dim3((unsigned)m), dim3(SEL_THREADS), (size_t)ne * 2 * sizeof(float),
                      s, (const float *)logits, d->kind == K3_ROUTER_SIGMOID_NOAUX_TC ? bias : NULL, ne, d->top_k,
                      (int32_t)(d->kind == K3_ROUTER_SOFTMAX), (int32_t)d->renormalize, d->scaling_factor, topk_ids,
                      topk_weights);
    if (e != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of the router select kernel failed: %s", cudaGetErrorString(e));
    return K3_STATUS_SUCCESS;
}
