/*
 * The GPU router: the CPU router (src/cpu/router.c) reproduced bit for bit.
 *
 * 1. Logits: the CPU's order, 128 partial sums per (token, expert) dot product, partial sum l taking the 8-element
 *    pieces l, l + 128, ... in order, every step one fused multiply-add, then the CPU's tree. One thread per partial
 *    sum, so a piece is one 16-byte load of a BF16 gate row and the dependent chains are short (h / 1024 pieces);
 *    each block holds EPT experts x TOK tokens so that a gate piece serves TOK tokens and an x piece EPT experts.
 *    From 3 tokens the staged kernel copies the block's rows of x into shared memory once for four such groups.
 *    Launched with PDL; x, the previous kernel's output, is read after the wait through the coherent path. Rows
 *    that are not whole aligned pieces take a scalar kernel.
 * 2. Selection, one block per token, launched with PDL (it reads the logits after its wait, through L2): keys as
 *    on the CPU (sigmoid from core/router_math.h, + bias, NaN -> -inf; or softmax probabilities with the CPU's
 *    sequential sum), then the top_k with ties to the lower id, by exact methods that all give the sequence the
 *    CPU's stable insertion selection produces: for sigmoid keys with E <= 1024 and top_k <= 16, warp sorts of 32
 *    keys merged in pairs; otherwise, for 257..1024 experts, warp sorts of 128 keys ranked by counting, or top_k
 *    rounds of a block arg-max.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "core/router_math.h"
#include "cuda/common/check.cuh"
#include "cuda/common/cp_async.cuh"
#include "cuda/router/router.h"
#include "cuda/common/loads.cuh"
#include "cuda/common/pdl.cuh"

namespace {

constexpr int LG_LANES = 128; /* the CPU's K3_RT_LANES: one thread per partial sum */
constexpr int LG_PIECE = 8;   /* the CPU's K3_RT_PIECE: consecutive elements a partial sum takes at a time */
/* The staged logits kernel's 128-thread groups per block. */
constexpr int LG_STAGED_GROUPS = 4;
constexpr int SEL_THREADS = 256;
constexpr int SEL_SORT_MAX = SEL_THREADS / 32 * 128; /* experts the sorting selection takes: 128 per warp */
/* Below this many experts the top_k arg-max rounds are faster than the sorts: the sorts' fixed chain of 28 shuffle
 * steps costs more than a few rounds over few keys (measured faster at E 56, slower at E 896, sizes in between not
 * measured: bench/NOTES-moe.md). */
constexpr int SEL_SORT_MIN = 257;
/* The merging selection (sigmoid keys): one key per thread, 32 keys per warp, lists of the 16 best merged in pairs. */
constexpr int MSEL_MAX_EXPERTS = 1024;
constexpr int MSEL_MAX_K = 16;

/* Eight BF16 values (one 16-byte piece) widened to fp32. */
__device__ __forceinline__ void bf16x8_to_f32(uint4 v, float (&f)[LG_PIECE]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++)
        f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
}

/* A piece of LG_PIECE gate elements in registers: one 16-byte load for BF16, two for fp32. */
template <typename G>
struct gate_piece {
    static constexpr int Q = LG_PIECE * (int)sizeof(G) / 16;
    uint4 v[Q];
    __device__ __forceinline__ void load(const G *p, uint64_t pol) {
#pragma unroll
        for (int q = 0; q < Q; q++) v[q] = k3_ld_stream(p + q * (16 / (int)sizeof(G)), pol);
    }
    __device__ __forceinline__ void to_f32(float (&f)[LG_PIECE]) const {
        if constexpr (sizeof(G) == 2) {
            bf16x8_to_f32(v[0], f);
        } else {
#pragma unroll
            for (int q = 0; q < Q; q++)
                f[4 * q] = __uint_as_float(v[q].x), f[4 * q + 1] = __uint_as_float(v[q].y),
                f[4 * q + 2] = __uint_as_float(v[q].z), f[4 * q + 3] = __uint_as_float(v[q].w);
        }
    }
};

/* The first NB steps' pieces of a thread's EPT gate rows (step b is b x 128 pieces into the row). */
template <typename G, int NB, int EPT>
__device__ __forceinline__ void lg_gate_first(gate_piece<G> (&gp)[NB][EPT], const G *const (&grow)[EPT], int nsteps,
                                              uint64_t pol) {
#pragma unroll
    for (int b = 0; b < NB; b++)
        if (b < nsteps)
#pragma unroll
            for (int e = 0; e < EPT; e++) gp[b][e].load(grow[e] + (int64_t)b * LG_LANES * LG_PIECE, pol);
}

/* One (expert, token) dot product's 128 partial sums (row[0..127], in shared memory) in the CPU's tree, on the
 * warp that sums it: l += l + 64, l += l + 32, then l += l + w for w = 16 .. 1 by shuffles. Lane 0 holds the sum. */
__device__ __forceinline__ float lg_tree_row(const float *row, int i) {
    const float a = __fadd_rn(row[i], row[i + 64]), b = __fadd_rn(row[i + 32], row[i + 96]);
    float v = __fadd_rn(a, b);
#pragma unroll
    for (int o = 16; o >= 1; o /= 2) v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}

/* The 128 partial sums of each of the block's NP (expert, token) dot products meet in the CPU's tree (lg_tree_row).
 * Pair p is expert e0 + p / TOK, token t0 + p % TOK; only real experts and tokens are stored. Every thread must call
 * it. */
template <int NP, int TOK>
__device__ __forceinline__ void lg_tree_store(const float *acc, int e0, int t0, int32_t ne, int32_t m,
                                              float *__restrict__ logits) {
    __shared__ float part[NP][LG_LANES];
#pragma unroll
    for (int p = 0; p < NP; p++) part[p][threadIdx.x] = acc[p];
    __syncthreads();
    const int w = threadIdx.x / 32, i = threadIdx.x % 32;
    for (int p = w; p < NP; p += LG_LANES / 32) {
        const float v = lg_tree_row(part[p], i);
        const int e = e0 + p / TOK, t = t0 + p % TOK;
        if (i == 0 && e < ne && t < m) logits[(int64_t)t * ne + e] = v;
    }
}

/* The logits of EPT experts x TOK tokens per 128-thread block; thread l is partial sum l, i.e. pieces l, l + 128,
 * ... of every row. Needs h % 8 == 0 and 16-byte aligned x and gate. The gate does not depend on the previous
 * kernel, so the first NB pieces of each row are asked for before the PDL wait in the source (ptxas still places the
 * wait first; an L2 prefetch before it made the whole block slower: bench/NOTES-block.md); x (the previous kernel's
 * output) is read after it, through the coherent path. Rows past ne and m repeat the last row (computed, never
 * stored). */
template <typename G, int EPT, int TOK, int NB>
__global__ void __launch_bounds__(LG_LANES)
    k3_router_logits_kernel(const uint16_t *__restrict__ x, const G *__restrict__ gate, int32_t m, int32_t ne,
                            int64_t h, float *__restrict__ logits) {
    const int l = threadIdx.x;
    const int e0 = blockIdx.x * EPT, t0 = blockIdx.y * TOK;
    const int64_t npieces = h / LG_PIECE;
    const int nsteps = l < npieces ? (int)((npieces - 1 - l) / LG_LANES + 1) : 0;
    const uint64_t pol = k3_policy_evict_first();
    const G *grow[EPT];
#pragma unroll
    for (int e = 0; e < EPT; e++) grow[e] = gate + (int64_t)min(e0 + e, ne - 1) * h + (int64_t)l * LG_PIECE;
    const uint16_t *xrow[TOK];
#pragma unroll
    for (int t = 0; t < TOK; t++) xrow[t] = x + (int64_t)min(t0 + t, m - 1) * h + (int64_t)l * LG_PIECE;

    gate_piece<G> gp[NB][EPT];
    lg_gate_first(gp, grow, nsteps, pol);
    k3_pdl_wait(); /* x comes from the previous kernel */
    k3_pdl_launch();

    float acc[EPT * TOK];
#pragma unroll
    for (int p = 0; p < EPT * TOK; p++) acc[p] = 0.0f;
    for (int s0 = 0; s0 < nsteps; s0 += NB) {
        if (s0 > 0)
#pragma unroll
            for (int b = 0; b < NB; b++)
                if (s0 + b < nsteps)
#pragma unroll
                    for (int e = 0; e < EPT; e++) gp[b][e].load(grow[e] + (int64_t)(s0 + b) * LG_LANES * LG_PIECE, pol);
#pragma unroll
        for (int b = 0; b < NB; b++) {
            if (s0 + b >= nsteps) break;
            const int64_t off = (int64_t)(s0 + b) * LG_LANES * LG_PIECE;
            float gf[EPT][LG_PIECE];
#pragma unroll
            for (int e = 0; e < EPT; e++) gp[b][e].to_f32(gf[e]);
#pragma unroll
            for (int t = 0; t < TOK; t++) {
                float xf[LG_PIECE];
                bf16x8_to_f32(k3_ld_act(xrow[t] + off), xf);
#pragma unroll
                for (int e = 0; e < EPT; e++)
#pragma unroll
                    for (int i = 0; i < LG_PIECE; i++) acc[e * TOK + t] = __fmaf_rn(xf[i], gf[e][i], acc[e * TOK + t]);
            }
        }
    }
    lg_tree_store<EPT * TOK, TOK>(acc, e0, t0, ne, m, logits);
}

/* The staged logits, for m >= 3: LG_STAGED_GROUPS groups of 128 threads per block, each group EPT experts, thread l
 * of a group partial sum l as in k3_router_logits_kernel (same order, same bits). The block's TOK rows of x are
 * copied once into shared memory and every group reads them there: one copy of x per block from L2 instead of one
 * per 128 threads, and more warps per SM than the one-group kernel's registers allow. Each thread keeps NB
 * pieces of each of its gate rows in flight, refilling a slot as soon as it is converted. After the sums the x
 * space holds the partial sums for the trees. HP > 0: rows of exactly HP pieces (h = 8 HP), known when compiled, so
 * the loop unrolls and the shared-memory offsets are constants (fewer instructions: the kernel is issue-bound). Needs
 * h % 8 == 0, 16-byte aligned x and gate, and lg_staged_smem(...) bytes of dynamic shared memory. */
template <typename G, int EPT, int TOK, int NB, int HP>
__global__ void __launch_bounds__(LG_STAGED_GROUPS *LG_LANES, 1)
    k3_router_logits_staged_kernel(const uint16_t *__restrict__ x, const G *__restrict__ gate, int32_t m, int32_t ne,
                                   int64_t h, float *__restrict__ logits) {
    /* [TOK][h / 8] pieces of x; then [groups x EPT x TOK][128] partial sums */
    extern __shared__ uint4 lg_stage[];
    constexpr int NP = EPT * TOK;
    const int l = threadIdx.x % LG_LANES, g = threadIdx.x / LG_LANES;
    const int eb = blockIdx.x * LG_STAGED_GROUPS * EPT, t0 = blockIdx.y * TOK;
    const int npieces = HP > 0 ? HP : (int)(h / LG_PIECE);
    const int nsteps = (HP > 0 && HP % LG_LANES == 0) ? HP / LG_LANES
                                                      : (l < npieces ? (npieces - 1 - l) / LG_LANES + 1 : 0);
    const uint64_t pol = k3_policy_evict_first();
    const G *grow[EPT];
#pragma unroll
    for (int e = 0; e < EPT; e++)
        grow[e] = gate + (int64_t)min(eb + g * EPT + e, ne - 1) * h + (int64_t)l * LG_PIECE;
    k3_pdl_wait(); /* x comes from the previous kernel */
    k3_pdl_launch();

    gate_piece<G> gp[NB][EPT];
    lg_gate_first(gp, grow, nsteps, pol);
#pragma unroll
    for (int t = 0; t < TOK; t++) {
        /* rows past m are zeros, read from nowhere (computed, never stored) */
        const uint16_t *src = x + (int64_t)min(t0 + t, m - 1) * h;
        const bool real = t0 + t < m;
        for (int p = threadIdx.x; p < npieces; p += (int)blockDim.x)
            k3_cp_async16_zfill(&lg_stage[t * npieces + p], src + (int64_t)p * LG_PIECE, real ? 16u : 0u);
    }
    k3_cp_async_commit();
    k3_cp_async_wait<0>();
    __syncthreads();

    float acc[NP];
#pragma unroll
    for (int p = 0; p < NP; p++) acc[p] = 0.0f;
#pragma unroll(HP > 0 ? 64 : 1)
    for (int s0 = 0; s0 < nsteps; s0 += NB) {
#pragma unroll
        for (int b = 0; b < NB; b++) {
            const int s = s0 + b;
            if (s >= nsteps) break;
            float gf[EPT][LG_PIECE];
#pragma unroll
            for (int e = 0; e < EPT; e++) gp[b][e].to_f32(gf[e]);
            if (s + NB < nsteps)
#pragma unroll
                for (int e = 0; e < EPT; e++) gp[b][e].load(grow[e] + (int64_t)(s + NB) * LG_LANES * LG_PIECE, pol);
            const int piece = l + s * LG_LANES;
#pragma unroll
            for (int t = 0; t < TOK; t++) {
                float xf[LG_PIECE];
                bf16x8_to_f32(lg_stage[t * npieces + piece], xf);
#pragma unroll
                for (int e = 0; e < EPT; e++)
#pragma unroll
                    for (int i = 0; i < LG_PIECE; i++) acc[e * TOK + t] = __fmaf_rn(xf[i], gf[e][i], acc[e * TOK + t]);
            }
        }
    }
    __syncthreads(); /* every group is done with x: its space takes the partial sums */
    float *part = reinterpret_cast<float *>(lg_stage);
#pragma unroll
    for (int p = 0; p < NP; p++) part[(g * NP + p) * LG_LANES + l] = acc[p];
    __syncthreads();
    const int w = threadIdx.x / 32, i = threadIdx.x % 32;
    for (int q = w; q < LG_STAGED_GROUPS * NP; q += (int)blockDim.x / 32) {
        const float v = lg_tree_row(part + q * LG_LANES, i);
        const int e = eb + (q / NP) * EPT + (q % NP) / TOK, t = t0 + q % TOK;
        if (i == 0 && e < ne && t < m) logits[(int64_t)t * ne + e] = v;
    }
}

/* The same order element by element, for rows that are not whole 16-byte pieces (h % 8 != 0 or unaligned x or
 * gate): one expert and TOK tokens per block. x is read after the wait through L2 (__ldcg): the compiler would
 * otherwise take the read-only (.nc) path for it, which under PDL may serve lines older than the producer's writes. */
template <typename G, int TOK>
__global__ void __launch_bounds__(LG_LANES)
    k3_router_logits_scalar_kernel(const uint16_t *__restrict__ x, const G *__restrict__ gate, int32_t m,
                                   int32_t ne, int64_t h, float *__restrict__ logits) {
    const int l = threadIdx.x, e = blockIdx.x, t0 = blockIdx.y * TOK;
    const G *g = gate + (int64_t)e * h;
    k3_pdl_wait();
    k3_pdl_launch();
    float acc[TOK];
#pragma unroll
    for (int t = 0; t < TOK; t++) acc[t] = 0.0f;
    for (int64_t k0 = (int64_t)l * LG_PIECE; k0 < h; k0 += (int64_t)LG_LANES * LG_PIECE)
        for (int64_t k = k0; k < k0 + LG_PIECE && k < h; k++) {
            float gv;
            if constexpr (sizeof(G) == 2) gv = k3_bf16_to_f32_dev(g[k]);
            else gv = g[k];
#pragma unroll
            for (int t = 0; t < TOK; t++)
                acc[t] = __fmaf_rn(k3_bf16_to_f32_dev(__ldcg(x + (int64_t)min(t0 + t, m - 1) * h + k)), gv, acc[t]);
        }
    lg_tree_store<TOK, TOK>(acc, e, t0, ne, m, logits);
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

/* The sigmoid selection for E <= 1024 and top_k <= 16, one block per token, one expert per thread (blockDim = 32 x
 * a power of two): each warp sorts its 32 packed keys, then the warps' lists of their 16 best are merged in pairs
 * (a bitonic merge of one list against the other reversed) until one list is left; its first top_k are the CPU's
 * sequence (keys are unique: ids differ; padding packs to 0, below every key). The weights' sum runs in the CPU's
 * order on lane 0's register chain, the divisions in parallel. */
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
        const bool mine = lane < k;
        const int id = mine ? sel_id(lists[cur][0][lane]) : 0;
        const float w = mine ? sg[id] : 0.0f;
        float sum = 0.0f;
        for (int j = 0; j < k; j++) sum = __fadd_rn(sum, __shfl_sync(0xffffffffu, w, j));
        if (mine) {
            const float out = renorm ? __fmul_rn(__fdiv_rn(w, __fadd_rn(sum, 1e-20f)), scaling) : __fmul_rn(w, scaling);
            ids[t * k + lane] = id;
            wts[t * k + lane] = out;
        }
    }
}

/* The staged kernel's blocking by m: experts per group, tokens per block (m >= LG_STAGED_MIN_M). At E 896 a grid of
 * 112 blocks (one per SM: the copy of x and 512 threads of registers fill it) through m 8, then 112 per 8 tokens. */
constexpr int64_t LG_STAGED_MIN_M = 3; /* below, the one-group kernel, with every gate byte in flight, is faster */
/* The row length the staged kernel is also compiled for: K3's hidden size. */
constexpr int LG_HP = 7168 / LG_PIECE;
struct lg_staged_shape {
    int ept, tok;
    bool rows; /* h = 8 LG_HP: the instance compiled for that length */
};
lg_staged_shape lg_staged_for(int64_t m, int64_t h) {
    const bool rows = h == (int64_t)LG_HP * LG_PIECE;
    if (m <= 4) return {2, 4, rows};
    if (m <= 8) return {2, 8, rows};
    return {4, 8, rows};
}
/* Its dynamic shared memory: x's rows, or the partial sums of the trees where those are larger (small h). */
size_t lg_staged_smem(lg_staged_shape sh, int64_t h) {
    const size_t xb = (size_t)sh.tok * (size_t)h * sizeof(uint16_t);
    const size_t tb = (size_t)LG_STAGED_GROUPS * (size_t)(sh.ept * sh.tok) * LG_LANES * sizeof(float);
    return xb > tb ? xb : tb;
}
template <typename G>
using lg_kernel_t = void (*)(const uint16_t *, const G *, int32_t, int32_t, int64_t, float *);
template <typename G, int EPT, int TOK, int NB>
lg_kernel_t<G> lg_staged_rows(bool rows) {
    return rows ? k3_router_logits_staged_kernel<G, EPT, TOK, NB, LG_HP>
                : k3_router_logits_staged_kernel<G, EPT, TOK, NB, 0>;
}
/* NB: pieces of each gate row in flight (halved for fp32 gates, two loads a piece). */
template <typename G>
lg_kernel_t<G> lg_staged_kernel_for(lg_staged_shape sh) {
    constexpr int Q = LG_PIECE * (int)sizeof(G) / 16;
    if (sh.ept == 2 && sh.tok == 4) return lg_staged_rows<G, 2, 4, 4 / Q>(sh.rows);
    if (sh.ept == 2) return lg_staged_rows<G, 2, 8, 4 / Q>(sh.rows);
    return lg_staged_rows<G, 4, 8, 2 / Q>(sh.rows);
}

/* The staged kernel where it applies (m >= LG_STAGED_MIN_M, its shared memory within what the plan allowed);
 * otherwise one 128-thread group per block with tokens and experts by m: one (expert, token) pair per thread at
 * m 1, more of both as m grows (each gate piece serves TOK tokens, each x piece EPT experts); NB pieces of each row
 * in flight. */
template <typename G>
cudaError_t launch_logits(const uint16_t *x, const G *gate, int64_t m, int32_t ne, int64_t h, size_t smem_max,
                          float *logits, cudaStream_t s) {
    if (m >= LG_STAGED_MIN_M) {
        const lg_staged_shape sh = lg_staged_for(m, h);
        const size_t smem = lg_staged_smem(sh, h);
        if (smem <= smem_max) {
            const int per_block = LG_STAGED_GROUPS * sh.ept;
            const dim3 grid((unsigned)((ne + per_block - 1) / per_block), (unsigned)((m + sh.tok - 1) / sh.tok));
            return k3_launch_pdl(lg_staged_kernel_for<G>(sh), grid, dim3(LG_STAGED_GROUPS * LG_LANES), smem, s, x, gate,
                                 (int32_t)m, ne, h, logits);
        }
    }
    constexpr int Q = LG_PIECE * (int)sizeof(G) / 16; /* 16-byte loads per piece: NB shrinks for fp32 gates */
#define K3_LG_LAUNCH(EPT, TOK, NB)                                                                                    \
    return k3_launch_pdl(k3_router_logits_kernel<G, EPT, TOK, (NB) / Q>,                                              \
                         dim3((unsigned)((ne + (EPT)-1) / (EPT)), (unsigned)((m + (TOK)-1) / (TOK))), dim3(LG_LANES), \
                         0, s, x, gate, (int32_t)m, ne, h, logits)
    if (m == 1) K3_LG_LAUNCH(1, 1, 8);
    if (m == 2) K3_LG_LAUNCH(1, 2, 8);
    if (m <= 4) K3_LG_LAUNCH(2, 4, 8);
    if (m <= 8) K3_LG_LAUNCH(2, 8, 8);
    K3_LG_LAUNCH(4, 16, 2);
#undef K3_LG_LAUNCH
}

/* Lets every staged instance of gate type G ask for up to `most` bytes (one value for all plans on a device, so
 * that a plan made later never lowers what an earlier one needs). */
template <typename G>
cudaError_t allow_staged_smem(int most) {
    for (const bool rows : {false, true}) {
        const lg_staged_shape shapes[] = {{2, 4, rows}, {2, 8, rows}, {4, 8, rows}};
        for (const lg_staged_shape &sh : shapes) {
            const cudaError_t e =
                cudaFuncSetAttribute(lg_staged_kernel_for<G>(sh), cudaFuncAttributeMaxDynamicSharedMemorySize, most);
            if (e != cudaSuccess) return e;
        }
    }
    return cudaSuccess;
}

template <typename G>
cudaError_t launch_logits_scalar(const uint16_t *x, const G *gate, int64_t m, int32_t ne, int64_t h, float *logits,
                                 cudaStream_t s) {
    constexpr int TOK = 4;
    return k3_launch_pdl(k3_router_logits_scalar_kernel<G, TOK>, dim3((unsigned)ne, (unsigned)((m + TOK - 1) / TOK)),
                         dim3(LG_LANES), 0, s, x, gate, (int32_t)m, ne, h, logits);
}

} // namespace

extern "C" size_t k3_cuda_router_ws_bytes(const k3_router_desc *d) {
    /* the plan bounds both factors; checked anyway, since a wrapped size would let the kernel write past ws */
    if (d->max_tokens < 1 || d->num_experts < 1) return SIZE_MAX;
    const size_t mt = (size_t)d->max_tokens, e = (size_t)d->num_experts;
    if (mt > SIZE_MAX / sizeof(float) / e) return SIZE_MAX;
    return mt * e * sizeof(float);
}

extern "C" k3_status k3_cuda_router_prepare(k3_ctx *ctx, const k3_router_desc *d, size_t *smem_max) {
    *smem_max = 0;
    int dev = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e == cudaSuccess && optin > 0)
        e = d->gate_dtype == K3_DTYPE_F32 ? allow_staged_smem<float>(optin) : allow_staged_smem<uint16_t>(optin);
    if (e != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "router plan: cannot raise the shared-memory limit of the logits "
                       "kernel: %s", cudaGetErrorString(e));
    *smem_max = optin > 0 ? (size_t)optin : 0;
    return K3_STATUS_SUCCESS;
}

/* The fp32 logits into ws. */
static k3_status router_logits(k3_ctx *ctx, const k3_router_desc *d, size_t smem_max, int64_t m, const void *x,
                               const void *gate, float *logits, cudaStream_t s) {
    const int32_t ne = d->num_experts;
    const int64_t h = d->hidden;
    const bool f32 = d->gate_dtype == K3_DTYPE_F32;
    const bool pieces = h % LG_PIECE == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)gate & 15) == 0;
    const uint16_t *xb = (const uint16_t *)x;
    const cudaError_t e =
        pieces ? (f32 ? launch_logits<float>(xb, (const float *)gate, m, ne, h, smem_max, logits, s)
                      : launch_logits<uint16_t>(xb, (const uint16_t *)gate, m, ne, h, smem_max, logits, s))
               : (f32 ? launch_logits_scalar<float>(xb, (const float *)gate, m, ne, h, logits, s)
                      : launch_logits_scalar<uint16_t>(xb, (const uint16_t *)gate, m, ne, h, logits, s));
    if (e != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of the router logits kernel failed: %s", cudaGetErrorString(e));
    return K3_STATUS_SUCCESS;
}

/* The selection from the logits in ws. With PDL: behind the logits kernel on the same stream it waits for it, then
 * reads the logits through L2 (__ldcg), so its launch gap is hidden; behind an event (another stream) the wait
 * returns at once. */
static k3_status router_select(k3_ctx *ctx, const k3_router_desc *d, int64_t m, const float *bias,
                               const float *logits, int32_t *topk_ids, float *topk_weights, cudaStream_t s) {
    const int32_t ne = d->num_experts;
    const float *b = d->kind == K3_ROUTER_SIGMOID_NOAUX_TC ? bias : NULL;
    cudaError_t e;
    if (d->kind != K3_ROUTER_SOFTMAX && ne <= MSEL_MAX_EXPERTS && d->top_k <= MSEL_MAX_K) {
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

static k3_status router_check_m(k3_ctx *ctx, int64_t m) {
    if (m > (int64_t)65535 * 4)
        return k3_fail(ctx, K3_STATUS_UNSUPPORTED, "router run: the CUDA router takes at most %d tokens per call (got %lld)",
                       65535 * 4, (long long)m);
    return K3_STATUS_SUCCESS;
}

extern "C" k3_status k3_cuda_router_run_logits(k3_ctx *ctx, const k3_router_desc *d, size_t smem_max, int64_t m,
                                               const void *x, const void *gate, void *ws, void *stream) {
    K3_TRY(router_check_m(ctx, m));
    return router_logits(ctx, d, smem_max, m, x, gate, (float *)ws, (cudaStream_t)stream);
}

extern "C" k3_status k3_cuda_router_run_select(k3_ctx *ctx, const k3_router_desc *d, int64_t m, const float *bias,
                                               int32_t *topk_ids, float *topk_weights, const void *ws,
                                               void *stream) {
    K3_TRY(router_check_m(ctx, m));
    return router_select(ctx, d, m, bias, (const float *)ws, topk_ids, topk_weights, (cudaStream_t)stream);
}
