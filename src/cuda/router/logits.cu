/*
 * The GPU router's logits (src/cuda/router/router.h): the CPU router's (src/cpu/router.c) bit for bit.
 *
 * The CPU's order: 128 partial sums per (token, expert) dot product, partial sum l taking the 8-element pieces l,
 * l + 128, ... in order, every step one fused multiply-add, then the CPU's tree. One thread per partial sum, so a
 * piece is one 16-byte load of a BF16 gate row and the dependent chains are short (h / 1024 pieces); each block
 * holds EPT experts x TOK tokens so that a gate piece serves TOK tokens and an x piece EPT experts. From 3 tokens
 * the staged kernel copies the block's rows of x into shared memory once for four such groups; at 1 token (BF16)
 * the bulk kernel has the copy engine bring each block's gate rows into shared memory. Launched with PDL; x, the
 * previous kernel's output, is read after the wait through the coherent path. Rows that are not whole aligned
 * pieces take a scalar kernel.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/common/bulk_copy.cuh"
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

/* The bulk logits, for m <= LG_BULK_MAX_M (TOK = m) and BF16 gates: one block per SM takes `rows` consecutive
 * experts, and its first thread asks the copy engine for all of their gate rows at once (before the PDL wait:
 * weights never depend on the previous kernel), then for the m rows of x (after it). Each row lands on its own
 * mbarrier, so a group starts on a row as soon as it is in. The one-group kernel holds every gate byte in flight
 * too, but in registers, 7 blocks of 128 threads per SM; here the bytes in flight cost no registers and the block's
 * threads only compute. The sums are k3_router_logits_kernel's (thread l of a group is partial sum l, same order,
 * same bits). Needs h % 8 == 0, 16-byte aligned x and gate, rows <= LG_BULK_MAX_ROWS and lg_bulk_smem(...) bytes
 * of dynamic shared memory. */
constexpr int LG_BULK_GROUPS = 4;
constexpr int LG_BULK_MAX_ROWS = 16;
constexpr int LG_BULK_BAR_PIECES = (1 + LG_BULK_MAX_ROWS) * 8 / 16 + 1; /* 16-byte units of barriers ahead of x */
template <int TOK>
__global__ void __launch_bounds__(LG_BULK_GROUPS *LG_LANES, 1)
    k3_router_logits_bulk_kernel(const uint16_t *__restrict__ x, const uint16_t *__restrict__ gate, int32_t m,
                                 int32_t ne, int64_t h, int32_t rows, float *__restrict__ logits) {
    /* the mbarriers (x, then one per gate row), [TOK][h / 8] pieces of x, [rows][h / 8] pieces of the gate, then
     * [rows x TOK][128] partial sums; all of it dynamic, so that the plan may allow the device's whole opt-in */
    extern __shared__ uint4 lg_bulk_smem_base[];
    uint64_t *bars = reinterpret_cast<uint64_t *>(lg_bulk_smem_base);
    uint4 *lg_bulk = lg_bulk_smem_base + LG_BULK_BAR_PIECES;
    const int npieces = (int)(h / LG_PIECE), e0 = blockIdx.x * rows, nrows = min(rows, ne - e0), mt = min(m, TOK);
    uint4 *xs = lg_bulk, *gs = lg_bulk + (size_t)TOK * npieces;
    float *part = reinterpret_cast<float *>(gs + (size_t)rows * npieces);
    const uint32_t row_bytes = (uint32_t)h * (uint32_t)sizeof(uint16_t);
    if (threadIdx.x == 0) {
        for (int r = 0; r <= nrows; r++) k3_mbar_init(&bars[r]);
        k3_mbar_init_fence();
        const uint64_t pol = k3_policy_evict_first();
        for (int r = 0; r < nrows; r++)
            k3_bulk_copy_g2s(gs + (size_t)r * npieces, gate + (int64_t)(e0 + r) * h, row_bytes, &bars[1 + r], pol);
    }
    k3_pdl_wait(); /* x comes from the previous kernel */
    k3_pdl_launch();
    if (threadIdx.x == 0) k3_bulk_copy_g2s(xs, x, row_bytes * (uint32_t)mt, &bars[0], k3_policy_evict_last());
    __syncthreads(); /* the barriers are initialized before anyone waits on them */

    const int l = threadIdx.x % LG_LANES, g = threadIdx.x / LG_LANES;
    const int nsteps = l < npieces ? (npieces - 1 - l) / LG_LANES + 1 : 0;
    k3_mbar_wait(&bars[0], 0);
    for (int q = g; q < nrows * TOK; q += LG_BULK_GROUPS) {
        const int r = q / TOK, t = q % TOK;
        if (t >= mt) continue; /* the whole group skips a token past m */
        k3_mbar_wait(&bars[1 + r], 0);
        const uint4 *gr = gs + (size_t)r * npieces + l, *xr = xs + (size_t)t * npieces + l;
        float acc = 0.0f;
        for (int s = 0; s < nsteps; s++) {
            float gf[LG_PIECE], xf[LG_PIECE];
            bf16x8_to_f32(gr[s * LG_LANES], gf);
            bf16x8_to_f32(xr[s * LG_LANES], xf);
#pragma unroll
            for (int i = 0; i < LG_PIECE; i++) acc = __fmaf_rn(xf[i], gf[i], acc);
        }
        part[q * LG_LANES + l] = acc;
    }
    __syncthreads();
    const int w = threadIdx.x / 32, i = threadIdx.x % 32;
    for (int q = w; q < nrows * TOK; q += (int)blockDim.x / 32) {
        const int r = q / TOK, t = q % TOK;
        if (t >= mt) continue;
        const float v = lg_tree_row(part + q * LG_LANES, i);
        if (i == 0) logits[(int64_t)t * ne + e0 + r] = v;
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

/* The bulk kernel takes ceil(E / SMs) experts per block, so that the grid is one block per SM (every row requested
 * in the first wave). It runs at m 1 only (one instance, TOK 1): at m 2-4 it was no faster than the one-group and
 * staged kernels, and two blocks per SM lost in the block (bench/NOTES-block.md). */
constexpr int LG_BULK_MAX_M = 1;
/* Its dynamic shared memory for `rows` experts: the barriers, x's row, the gate rows, the partial sums (rows <= 16,
 * h bounded by the router). */
size_t lg_bulk_smem(int rows, int64_t h) {
    return (size_t)LG_BULK_BAR_PIECES * 16 + (size_t)(LG_BULK_MAX_M + rows) * (size_t)h * sizeof(uint16_t) +
           (size_t)rows * (size_t)LG_BULK_MAX_M * LG_LANES * sizeof(float);
}

/* The bulk kernel where it applies (BF16 gates, m <= LG_BULK_MAX_M, its rows and shared memory within bounds);
 * the staged kernel where it applies (m >= LG_STAGED_MIN_M, its shared memory within what the plan allowed);
 * otherwise one 128-thread group per block with tokens and experts by m: one (expert, token) pair per thread at
 * m 1, more of both as m grows (each gate piece serves TOK tokens, each x piece EPT experts); NB pieces of each row
 * in flight. */
template <typename G>
cudaError_t launch_logits(const uint16_t *x, const G *gate, int64_t m, int32_t ne, int64_t h, size_t smem_max,
                          int32_t sm_count, float *logits, cudaStream_t s) {
    if constexpr (sizeof(G) == sizeof(uint16_t)) {
        if (m <= LG_BULK_MAX_M && sm_count > 0) {
            const int rows = (int)((ne + (int64_t)sm_count - 1) / sm_count);
            const size_t smem = lg_bulk_smem(rows, h);
            if (rows <= LG_BULK_MAX_ROWS && smem <= smem_max)
                return k3_launch_pdl(k3_router_logits_bulk_kernel<LG_BULK_MAX_M>,
                                     dim3((unsigned)((ne + rows - 1) / rows)), dim3(LG_BULK_GROUPS * LG_LANES), smem, s,
                                     x, gate, (int32_t)m, ne, h, (int32_t)rows, logits);
        }
    }
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

/* Lets every staged instance of gate type G (and for BF16 gates every bulk one) ask for up to `most` bytes (one
 * value for all plans on a device, so that a plan made later never lowers what an earlier one needs). */
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
    if constexpr (sizeof(G) == sizeof(uint16_t))
        return cudaFuncSetAttribute(k3_router_logits_bulk_kernel<LG_BULK_MAX_M>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, most);
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
    const int32_t sms = ctx->arch.sm_count;
    const cudaError_t e =
        pieces ? (f32 ? launch_logits<float>(xb, (const float *)gate, m, ne, h, smem_max, sms, logits, s)
                      : launch_logits<uint16_t>(xb, (const uint16_t *)gate, m, ne, h, smem_max, sms, logits, s))
               : (f32 ? launch_logits_scalar<float>(xb, (const float *)gate, m, ne, h, logits, s)
                      : launch_logits_scalar<uint16_t>(xb, (const uint16_t *)gate, m, ne, h, logits, s));
    if (e != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of the router logits kernel failed: %s", cudaGetErrorString(e));
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
