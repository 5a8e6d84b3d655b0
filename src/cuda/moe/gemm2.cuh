/* GEMM2 of the routed experts: W2 rows of an expert slot against GEMM1's activations, weighted by the routing
 * weight, into per-(token, slot) fp32 outputs (or, at top_k 1, into out directly). */
#ifndef K3_CUDA_MOE_GEMM2_CUH
#define K3_CUDA_MOE_GEMM2_CUH

#include <stdint.h>
#include "core/bf16.h"
#include "cuda/common/pdl.cuh"
#include "cuda/moe/fold.cuh"
#include "cuda/moe/mainloop_async.cuh"
#include "cuda/moe/trace.cuh"

namespace {

/* KS = 1: each warp owns a 16-row tile and the whole K (short K: I / 128 small). KS = G2_WARPS: the block owns
 * one tile and its warps split K, summed in warp order (long K with few experts: more blocks, more bytes in
 * flight). KS = G2_WIDE_KS (NVFP4 cp.async, NT 1): the same with twice the warps (256-thread blocks), where the
 * grid leaves SMs idle (fewer blocks than a wave): each warp's serial chunk walk halves, as GEMM1's paired tiles
 * do. Its sum has 8 terms, not 4: deterministic, but not bitwise the 4-warp result. */
constexpr int G2_WIDE_KS = 8;
template <int KS>
constexpr int g2_warps() { return KS > G2_WARPS ? KS : G2_WARPS; }
/* The ring's stages of the KS 1 GEMM2 with `tiles` row tiles per warp: four tiles take two stages, the shared
 * memory of two tiles' four (40 KB per block), since the ring's depth hardly matters there (bench/NOTES-moe.md). */
constexpr int g2_stages(int tiles) { return tiles == 4 ? 2 : G2_STAGES; }
template <int KS, int TILES = 1>
constexpr size_t g2_dyn_bytes() { return (size_t)g2_warps<KS>() * as_warp_uint4<TILES, g2_stages(TILES)>() * 16; }
/* The dispatch path's epilogue lookups of a pass (its pair indices, then their routing weights: two dependent round
 * trips after the main loop) go to shared memory with the ring's first chunk instead: 8 (pair, weight) per warp
 * after the rings. NT 1 only (at NT 2 the split-K instance then spilled); where the fold routes, the pair
 * indices are in fold_smem already. */
template <int NT, bool FOLD>
constexpr bool g2_epi() { return NT == 1 && !FOLD; }
/* A cp.async GEMM2 launch's dynamic shared memory: the rings, then the fold's routing state or the epi copies. */
template <int NT, int KS, bool FOLD, int TILES = 1>
constexpr size_t g2_smem_bytes() {
    return g2_dyn_bytes<KS, TILES>() + (FOLD ? fold_dyn_bytes() : 0) +
           (g2_epi<NT, FOLD>() ? (size_t)g2_warps<KS>() * 64 : 0);
}
/* TILES = 2 or 4 row tiles per warp in the unfolded KS 1 cp.async GEMM2 (every tile's chunks in each ring stage, as
 * GEMM1's gate and up sets), so a block's routing prologue, setup and epilogue lookups serve 2 or 4 times the bytes;
 * a half or a quarter of the block rows. Bitwise the one-tile result (each row's chunk order is the same). Two
 * tiles (5 blocks per SM, 40 KB ring) were faster than one or level at every point measured; four (4 blocks per
 * SM, two stages) pay where the two-tile grid is many waves, since each block's fixed cost is then paid half as
 * often, and lose where it is a few (the plan's rule: the table key g2_t4_waves; bench/NOTES-moe.md). Folded
 * launches and split-K take neither. */
constexpr int G2_T2_MINB = 5, G2_T4_MINB = 4;
/* Blocks per SM of the cp.async GEMM2 (a block's ring: 20 KB): 6 for KS 1 at NT 1 (short K: a warp walks few
 * chunks, so a block's life is mostly its fixed latency); 5 for NT 2 (at 6 it spills in the loop) and split-K.
 * Chosen against 4, 5 and 6 for all (bench/NOTES-moe.md). The wide split: 2 (the plan gives it grids of at most
 * wide_blocks_per_sm blocks per SM). */
constexpr int g2_min_blocks(bool async, int nt, int ks) {
    return !async ? G2_MIN_BLOCKS : (ks == G2_WIDE_KS ? 2 : (ks == 1 && nt == 1 ? 6 : 5));
}
/* The denser instances the plan picks for grids past the table's dense_split_waves / dense_k1_waves waves of the
 * default (the cp.async kernels at NT 1): split-K at 7 blocks per SM, KS 1 at 8 (GEMM2 is lean enough in
 * registers: bench/NOTES-moe.md). MINB = 0 in the kernel template: g2_min_blocks. */
constexpr int G2_DENSE_SPLIT = 7, G2_DENSE_K1 = 8;

template <int FMT, int NT, int KS, bool ASYNC, bool FOLD, int MINB = 0, bool DIRECT = false, int TILES = 1>
__global__ void __launch_bounds__(g2_warps<KS>() * 32, MINB ? MINB : g2_min_blocks(ASYNC, NT, KS))
    k3_moe_gemm2_kernel(const moe_params P) {
    static_assert(TILES == 1 || ((TILES == 2 || TILES == 4) && ASYNC && KS == 1 && NT == 1 && !FOLD),
                  "TILES: the KS 1 NT 1 cp.async instance");
    static_assert(TILES == 1 || MINB == (TILES == 2 ? G2_T2_MINB : G2_T4_MINB), "TILES: its own blocks per SM");
    constexpr int STG = g2_stages(TILES);
    constexpr int SETS = TILES;
    static_assert(!FOLD || ASYNC, "the fold borrows the cp.async ring for its bitmap");
    static_assert(KS != G2_WIDE_KS || (ASYNC && NT == 1), "the wide split: NVFP4 cp.async at NT 1 only");
    static_assert(!DIRECT || ASYNC, "direct output: the NVFP4 cp.async instances only");
    constexpr int NW = g2_warps<KS>();
    constexpr int RED = NT * 4 * 32;
    __shared__ float red_s[ASYNC || KS == 1 ? 1 : (KS - 1) * RED];
    __shared__ uint4 xring[ASYNC ? 1 : G2_WARPS][ASYNC ? 1 : x_ring_uint4<FMT, NT>()];
    extern __shared__ uint4 k3_moe_dyn[];
    /* FOLD: as in GEMM1 */
    fold_smem &fs = *reinterpret_cast<fold_smem *>(k3_moe_dyn + g2_dyn_bytes<KS, TILES>() / 16);
    uint32_t *const bm = reinterpret_cast<uint32_t *>(k3_moe_dyn);
    /* PDL: the dispatch lists (two or more kernels back, complete: pdl.cuh), or with the fold topk_ids (likewise),
     * are read before the wait, and the weight ring is filled before it too (nv_fill, or mma_any<..., true>);
     * GEMM1's output a only after it */
    K3_MT_BEGIN;
    k3_pdl_launch();
    const int slot = blockIdx.x;
    int32_t e, p0 = 0, cnt = 0, fid[2] = {-1, -1};
    if (slot_leaves<FOLD, NW * 32>(P, slot, bm, fs, fid, e, p0, cnt)) {
        K3_MT_END(g2, 3);
        return; /* block-uniform */
    }
    K3_MT_STAMP(1);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int64_t r0 = KS > 1 ? (int64_t)blockIdx.y * 16 : ((int64_t)blockIdx.y * G2_WARPS + warp) * 16 * TILES;
    /* KS = 1: warp-uniform, KS > 1: block-uniform. Fold: an idle warp leaves only after fold_list (block barriers) */
    const bool idle = r0 >= P.L;
    if (idle && !FOLD) {
        K3_MT_END(g2, 3);
        return;
    }
    const uint64_t pol = k3_policy_evict_first();
    const uint8_t *wexp = P.w2 + (size_t)e * P.w2_eb;
    const uint8_t *sexp = FMT == FMT_BF16 ? nullptr : P.w2s + (size_t)e * P.w2_sb;
    const int64_t row_bytes = FMT == FMT_BF16 ? P.I * 2 : P.I / 2;
    /* a warp's tiles exist together: L % (16 * TILES) == 0 (L % 32: k3_cuda_moe_prepare; four tiles only at
     * L % 64: the plan) */
    const uint8_t *wrow[SETS][2];
    int64_t row[SETS][2];
#pragma unroll
    for (int s = 0; s < SETS; s++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            row[s][h] = r0 + 16 * s + g + 8 * h;
            wrow[s][h] = wexp + row[s][h] * row_bytes;
        }
    float alpha = FMT == FMT_NVFP4 ? __ldg(P.w2_s2 + e) : 1.0f;
    const float inv_gs = P.w4a4 ? 1.0f / (1.0f / __ldg(P.w2_in + e)) : 1.0f;
    uint4 *const ring = k3_moe_dyn + warp * as_warp_uint4<SETS, STG>();
    /* ASYNC and g2_epi: this warp's first-pass (pair, weight) copies (g2_smem_bytes); the warps that store outputs
     * ask for them with their ring's first chunk (list and wsort are the dispatch's: two or more kernels back) */
    constexpr bool EPI = ASYNC && g2_epi<NT, FOLD>();
    int32_t *const epi_pair = reinterpret_cast<int32_t *>(k3_moe_dyn + g2_dyn_bytes<KS, TILES>() / 16) + warp * 16;
    float *const epi_wt = reinterpret_cast<float *>(epi_pair + 8);
    nv_feed<SETS> f;
    int kc0 = 0, kcs = 1, kn = 0;
    if constexpr (ASYNC) {
        /* the weights stream while GEMM1 drains; its output a is read only after the wait */
        if (!idle) {
            if constexpr (EPI)
                if ((KS == 1 || warp == 0) && lane < 8 && lane < cnt) {
                    k3_cp_async4(epi_pair + lane, P.list + p0 + lane);
                    k3_cp_async4(epi_wt + lane, P.wsort + p0 + lane);
                }
            k_split(P.I, KS > 1 ? warp : 0, KS, kc0, kcs, kn);
            nv_feed_init<SETS>(f, wrow, row, sexp, P.layout, P.I, kc0, kcs, kn, q);
            nv_fill<SETS, STG>(ring, f, lane);
        }
        k3_pdl_wait();
    }
    K3_MT_STAMP(2);
    if constexpr (FOLD) {
        fold_list<NW * 32>(e, fs, fid, p0, cnt); /* while the ring fills: shared memory and registers only */
        if (idle) {
            K3_MT_END(g2, 3);
            return;
        }
    }

    for (int pass = 0; pass < cnt; pass += NT * 8) {
        float acc[SETS][NT][4];
        const uint16_t *brow[NT];
        uint32_t xok = 0;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int s = 0; s < SETS; s++) acc[s][nt][0] = acc[s][nt][1] = acc[s][nt][2] = acc[s][nt][3] = 0.0f;
            xok |= (uint32_t)(pass + nt * 8 + g < cnt) << nt;
            brow[nt] = P.a + (int64_t)(p0 + min(pass + nt * 8 + g, cnt - 1)) * P.I; /* as in GEMM1 */
        }
        const int ntv = min(NT, (cnt - pass + 7) / 8);
        if constexpr (ASYNC) {
            if (pass > 0) nv_fill<SETS, STG>(ring, f, lane);
            mma_range_nv_async<SETS, NT, STG, true>(f, wrow, row, sexp, P.layout, P.I, brow, xok, ntv, kc0, kcs,
                                                          KS > 1 ? warp : 0, KS, q, ring, acc);
        } else {
            mma_any<FMT, 1, NT, G2_DEPTH, true, A_PERM<FMT>>(wrow, row, sexp, P.layout, P.I, brow, xok, ntv,
                                                             KS > 1 ? warp : 0, KS, q, pol, xring[warp], acc);
        }
        if (KS > 1) {
            if (warp > 0) {
                float *red = ASYNC ? (float *)ring : red_s + (warp - 1) * RED;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int c = 0; c < 4; c++) red[(nt * 4 + c) * 32 + lane] = acc[0][nt][c];
            }
            __syncthreads();
            if (warp == 0) {
#pragma unroll
                for (int w = 1; w < KS; w++) {
                    const float *red =
                        ASYNC ? (const float *)(k3_moe_dyn + w * as_warp_uint4<1, G2_STAGES>()) : red_s + (w - 1) * RED;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int c = 0; c < 4; c++) acc[0][nt][c] = __fadd_rn(acc[0][nt][c], red[(nt * 4 + c) * 32 + lane]);
                }
            }
        }
        if (KS == 1 || warp == 0) {
            if constexpr (EPI) __syncwarp(); /* the lanes' epi copies landed (the loop's last wait) */
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int n = pass + nt * 8 + 2 * q + (c & 1);
                    if (n >= cnt) continue;
                    int32_t pair;
                    float wt;
                    if constexpr (FOLD) {
                        pair = (int32_t)fs.list[n];
                        wt = __ldg(P.wts + pair);
                    } else if (EPI && pass == 0) {
                        pair = epi_pair[n], wt = epi_wt[n];
                    } else {
                        pair = __ldcg(P.list + p0 + n), wt = __ldcg(P.wsort + p0 + n);
                    }
#pragma unroll
                    for (int st = 0; st < SETS; st++) {
                        const float dot =
                            __fmul_rn(__fmul_rn(__fmul_rn(acc[st][nt][c], acc_scale<FMT>()), inv_gs), alpha);
                        const float v = __fmul_rn(wt, dot);
                        const int64_t o = (int64_t)pair * P.L + r0 + 16 * st + g + 8 * (c >> 1);
                        if constexpr (DIRECT) { /* top_k 1: pair = token; the combine's sum of one term, 0 + v */
                            const float sum = __fadd_rn(0.0f, v);
                            P.out[o] = k3_f32_to_bf16_bits(sum);
                            if (P.out_f32) P.out_f32[o] = sum;
                        } else {
                            P.pair_out[o] = v;
                        }
                    }
                }
        }
        if (KS > 1) __syncthreads(); /* red is reused by the next pass */
    }
    K3_MT_END(g2, 3);
}

} // namespace

#endif
