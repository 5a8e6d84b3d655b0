/* GEMM1 of the routed experts: the gate and up rows of an expert slot against its tokens, the activation in the
 * epilogue, one rounding to BF16 (or the W4A4 requantization). */
#ifndef K3_CUDA_MOE_GEMM1_CUH
#define K3_CUDA_MOE_GEMM1_CUH

#include <stdint.h>
#include "core/act.h"
#include "core/bf16.h"
#include "cuda/common/pdl.cuh"
#include "cuda/moe/fold.cuh"
#include "cuda/moe/mainloop_async.cuh"
#include "cuda/moe/trace.cuh"

namespace {

/* ASYNC (NVFP4, NT <= 2): the cp.async ring in dynamic shared memory (g1_dyn_bytes); the split-K partial
 * sums of each warp then go to the start of its own ring, which is dead after its main loop. */
template <int SETS>
constexpr size_t g1_dyn_bytes() { return (size_t)G1_WARPS * as_warp_uint4<SETS, G1_STAGES>() * 16; }
/* A cp.async GEMM1 launch's dynamic shared memory: the ring, then (fold, early routing) the routing state. */
template <int SETS, bool ROUTED>
constexpr size_t g1_smem_bytes() { return g1_dyn_bytes<SETS>() + (ROUTED ? fold_dyn_bytes() : 0); }
/* Blocks per SM the register budget is sized for: the cp.async kernel at NT 1 (no activation ring: 30 KB of
 * shared memory per block) fits 4 without spills in the loop; NT 2 keeps 3. Denser instances were slower or no
 * faster, even where they took a grid to one wave (bench/NOTES-moe.md). */
constexpr int g1_min_blocks(bool async, int nt) { return async && nt == 1 ? 4 : G1_MIN_BLOCKS; }

/* Direct output (top_k 1): the tokens whose id is outside [0, E) reach no GEMM2 block, so their rows of out get
 * the combine's zeros here, spread over GEMM1's blocks (GEMM2 writes only after GEMM1 has completed). */
__device__ __forceinline__ void zero_skipped_tokens(const moe_params &P) {
    const int64_t nb = (int64_t)gridDim.x * gridDim.y, b = (int64_t)blockIdx.y * gridDim.x + blockIdx.x;
    for (int64_t t = b; t < P.np; t += nb) {
        const int32_t e = __ldg(P.ids + t);
        if (e >= 0 && e < P.ne) continue;
        for (int64_t c = threadIdx.x; c < P.L; c += blockDim.x) {
            P.out[t * P.L + c] = 0;
            if (P.out_f32) P.out_f32[t * P.L + c] = 0.0f;
        }
    }
}


/* A warp's split-K partial sums in shared memory: row (s * NT + nt) * 4 + c (the accumulator index) of 32 lanes,
 * rows 33 floats apart, so both the stores (one row per instruction) and the epilogue's reads (4 rows x 8 lanes
 * per instruction) are free of bank conflicts. */
template <int SETS, int NT>
__host__ __device__ constexpr int red_floats() { return SETS * NT * 4 * 33; }

/*
 * GEMM1: a block owns 16 gate (and 16 up) rows of one expert slot; its 4 warps split K. The split-K sum and the
 * epilogue run on all 4 warps: every warp stores its partials (in its own dead ring), one block
 * barrier, then each thread sums and finishes one (token, row) output per token tile: token nl = tid / 16, row
 * r = tid % 16, so a W4A4 block's 16 rows are one half-warp. The sum is warp 0 + warp 1 + warp 2 + warp 3 in
 * that order, whichever thread computes it (deterministic). No barrier after the last pass. Why: with warp 0
 * alone summing and running the epilogue for all 16 x 8 x NT outputs, warps 1-3 waited at a second barrier,
 * and barrier stalls were a large share of GEMM1's cycles (ncu, bench/NOTES-moe.md).
 * PAIR (gated, cp.async, W4A16): the block owns 8 outputs, and their gate rows (MMA rows 0-7) and up rows (8-15)
 * share ONE 16-row tile, so a lane holds both halves of its outputs (accumulators c0/c1 gate, c2/c3 up). Half the
 * work per block, twice the blocks: for grids that would otherwise leave SMs idle (fewer blocks than a wave),
 * where every warp's serial chunk walk, not the bytes, set the time (bench/NOTES-moe.md).
 */
/* GEMM1, before it reads anything the dispatch (or W4A4 quantization) wrote: wait for it, then let GEMM2 come up (after
 * the wait: pdl.cuh), and (direct output) zero the rows of the tokens that no GEMM2 block writes. */
__device__ __forceinline__ void g1_after_dispatch(const moe_params &P) {
    k3_pdl_wait();
    k3_pdl_launch();
    if (P.direct) zero_skipped_tokens(P);
}

template <int FMT, bool GATED, int NT, bool ASYNC, bool FOLD, bool PAIR, bool EARLY = false>
__global__ void __launch_bounds__(G1_WARPS * 32, g1_min_blocks(ASYNC, NT)) k3_moe_gemm1_kernel(const moe_params P) {
    static_assert(!FOLD || ASYNC, "the fold borrows the cp.async ring for its bitmap");
    static_assert(!PAIR || (GATED && ASYNC), "paired tiles: gated cp.async kernels only");
    static_assert(!EARLY || (ASYNC && NT == 1 && !FOLD && !PAIR && FMT == FMT_NVFP4),
                  "early routing: the unfolded NT 1 cp.async kernel");
    constexpr int SETS = GATED && !PAIR ? 2 : 1;
    static_assert(!EARLY || (FOLD_E / 32 + FOLD_E / 2) * 4 <= g1_dyn_bytes<SETS>(), "fold_find's counts fit the ring");
    constexpr int OUTS = PAIR ? 8 : 16; /* outputs (columns of a) per block */
    constexpr int RED = red_floats<SETS, NT>();
    constexpr bool RED_S = !ASYNC && FMT == FMT_BF16; /* FP4 register ring: the dead activation ring holds them */
    static_assert(ASYNC || FMT == FMT_BF16 || x_ring_uint4<FMT, NT>() * 4 >= RED, "partials fit the x ring");
    static_assert(!ASYNC || as_warp_uint4<SETS, G1_STAGES>() * 4 >= RED, "partials fit the cp.async ring");
    __shared__ float red_s[RED_S ? G1_WARPS * RED : 1];
    __shared__ uint4 xring[ASYNC ? 1 : G1_WARPS][ASYNC ? 1 : x_ring_uint4<FMT, NT>()];
    extern __shared__ uint4 k3_moe_dyn[];
    K3_MT_BEGIN;
    /* FOLD: the routing state after the ring (fold_dyn_bytes); the bitmap in warp 0's ring (dead: fold_find's last
     * barrier comes before the ring fill below) */
    fold_smem &fs = *reinterpret_cast<fold_smem *>(k3_moe_dyn + g1_dyn_bytes<SETS>() / 16);
    uint32_t *const bm = reinterpret_cast<uint32_t *>(k3_moe_dyn);
    int32_t fid[2] = {-1, -1}, e, p0 = 0, cnt = 0;
    /* EARLY: the first wave (early_blocks, block-uniform) routes itself from topk_ids (fold_find, fold_list) before
     * its PDL wait, so its weights stream while the dispatch kernel runs; it waits before its first store, as GEMM2
     * relies on (pdl.cuh) */
    bool early = false;
    if constexpr (EARLY) early = (int64_t)blockIdx.y * gridDim.x + blockIdx.x < P.early_blocks;
    if (early) {
        /* the touched experts are the dispatch's units unless an expert has more pairs than a unit (fs.over: this
         * block then takes the dispatch's unit after its wait, as the later waves do) */
        early = (int)blockIdx.x < fold_find<G1_WARPS * 32, true>(P, blockIdx.x, bm, fs, fid) && !fs.over;
        if (early) e = fs.e;
    }
    /* everything below reads the dispatch (and W4A4 quantization) output, or (fold: launched without PDL, so the wait
     * is a no-op) the caller's topk_ids */
    if (!early) g1_after_dispatch(P);
    const int slot = blockIdx.x;
    if (!early && slot_leaves<FOLD, G1_WARPS * 32>(P, slot, bm, fs, fid, e, p0, cnt)) {
        K3_MT_END(g1, 6);
        return; /* block-uniform */
    }
    K3_MT_STAMP(1);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
    const int64_t i0 = (int64_t)blockIdx.y * OUTS;
    const uint64_t pol = k3_policy_evict_first();
    const uint8_t *wexp = P.w13 + (size_t)e * P.w13_eb;
    const uint8_t *sexp = FMT == FMT_BF16 ? nullptr : P.w13s + (size_t)e * P.w13_sb;
    const int64_t row_bytes = FMT == FMT_BF16 ? P.L * 2 : P.L / 2;

    const uint8_t *wrow[SETS][2];
    int64_t row[SETS][2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if constexpr (PAIR) { /* MMA row g: output i0 + g's gate row; row g + 8: its up row */
            const int64_t i = i0 + g;
            row[0][h] = h == 0 ? (P.interleaved ? 2 * i : i) : (P.interleaved ? 2 * i + 1 : P.I + i);
        } else {
            const int64_t i = i0 + g + 8 * h;
            row[0][h] = GATED && P.interleaved ? 2 * i : i;
            if (GATED) row[SETS - 1][h] = P.interleaved ? 2 * i + 1 : P.I + i;
        }
#pragma unroll
        for (int s = 0; s < SETS; s++) wrow[s][h] = wexp + row[s][h] * row_bytes;
    }
    /* ASYNC: the first pass's weights start streaming now, before the routing reads below */
    uint4 *const ring = k3_moe_dyn + warp * as_warp_uint4<SETS, G1_STAGES>();
    nv_feed<SETS> f;
    int kc0 = 0, kcs = 1, kn = 0;
    if constexpr (ASYNC) {
        k_split(P.L, warp, G1_WARPS, kc0, kcs, kn);
        nv_feed_init<SETS>(f, wrow, row, sexp, P.layout, P.L, kc0, kcs, kn, q);
        nv_fill<SETS, G1_STAGES>(ring, f, lane);
    }
    K3_MT_STAMP(2);
    if (FOLD || early) fold_list<G1_WARPS * 32>(e, fs, fid, p0, cnt); /* while the ring fills: smem, registers */
    float alpha[2] = {1.0f, 1.0f}, inv_gs = 1.0f, gs2 = 1.0f;
    if (FMT == FMT_NVFP4) {
        alpha[0] = P.sep ? __ldg(P.w13_s2 + 2 * e) : __ldg(P.w13_s2 + e);
        alpha[1] = P.sep ? __ldg(P.w13_s2 + 2 * e + 1) : alpha[0];
    }
    if (P.w4a4) {
        inv_gs = 1.0f / (1.0f / __ldg(P.w13_in + e)); /* the CPU's (1 / gs) with gs = 1 / input_scale */
        gs2 = 1.0f / __ldg(P.w2_in + e);
    }
    const k3_act_desc act = P.act;
    /* where warp w's partials live: its own ring, dead after its main loop (BF16: red_s) */
    auto red_of = [&](int w) -> float * {
        if constexpr (ASYNC) return (float *)(k3_moe_dyn + w * as_warp_uint4<SETS, G1_STAGES>());
        else if constexpr (RED_S) return red_s + w * RED;
        else return (float *)xring[w];
    };
    /* this thread's output of every token tile (token nl, row r) is accumulator csrc of lane src in each warp
     * (PAIR: 64 threads, 4 tokens per warp; the up half is accumulator csrc + 2 of the same lane) */
    constexpr int TOKW = PAIR ? 4 : 2; /* tokens per warp in the epilogue */
    const int nl = PAIR ? tid >> 3 : tid >> 4, r = PAIR ? tid & 7 : tid & 15;
    const int src = (r & 7) * 4 + (nl >> 1), csrc = PAIR ? nl & 1 : (r >> 3) * 2 + (nl & 1);
    K3_MT_STAMP(3);

    for (int pass = 0; pass < cnt; pass += NT * 8) {
        float acc[SETS][NT][4];
        const uint16_t *brow[NT];
        uint32_t xok = 0; /* bit nt: this lane's row of token tile nt is a token (else padding: zero-filled) */
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int s = 0; s < SETS; s++) acc[s][nt][0] = acc[s][nt][1] = acc[s][nt][2] = acc[s][nt][3] = 0.0f;
            /* padding lanes keep a real address (the last token's row) but copy nothing */
            xok |= (uint32_t)(pass + nt * 8 + g < cnt) << nt;
            const int64_t pp = p0 + min(pass + nt * 8 + g, cnt - 1);
            if (FOLD || early) /* W4A16 only */
                brow[nt] = P.x + (int64_t)((int32_t)fs.list[pp - p0] / P.top_k) * P.L;
            else
                brow[nt] = P.w4a4 ? P.xq + pp * P.L : P.x + (int64_t)(__ldcg(P.list + pp) / P.top_k) * P.L;
        }
        const int ntv = min(NT, (cnt - pass + 7) / 8);
        if constexpr (ASYNC) {
            if (pass > 0) nv_fill<SETS, G1_STAGES>(ring, f, lane);
            mma_range_nv_async<SETS, NT, G1_STAGES>(f, wrow, row, sexp, P.layout, P.L, brow, xok, ntv, kc0, kcs, warp,
                                                    G1_WARPS, q, ring, acc);
        } else {
            mma_any<FMT, SETS, NT, G1_DEPTH, false>(wrow, row, sexp, P.layout, P.L, brow, xok, ntv, warp, G1_WARPS, q,
                                                    pol, xring[warp], acc);
        }

        if (pass == 0) K3_MT_STAMP(4);
        /* split-K: every warp's partials to shared memory, then each thread sums its outputs in warp order */
        {
            float *red = red_of(warp);
#pragma unroll
            for (int s = 0; s < SETS; s++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int c = 0; c < 4; c++) red[((s * NT + nt) * 4 + c) * 33 + lane] = acc[s][nt][c];
        }
        __syncthreads();
        if (pass == 0) K3_MT_STAMP(5);
        if (early && pass == 0) g1_after_dispatch(P);
        /* epilogue: this thread's (token pass + nt * 8 + nl, row i0 + r) */
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            /* warp-uniform: none of the warp's tokens exists (PAIR: warps 2-3 hold no outputs) */
            if ((PAIR && warp * TOKW >= 8) || pass + nt * 8 + TOKW * warp >= cnt) break;
            constexpr int HALVES = GATED ? 2 : 1;
            float v[HALVES]; /* gate (or the only), up */
#pragma unroll
            for (int u = 0; u < HALVES; u++) {
                const int idx = (((PAIR ? 0 : u) * NT + nt) * 4 + csrc + (PAIR ? 2 * u : 0)) * 33 + src;
                float t = red_of(0)[idx];
#pragma unroll
                for (int w = 1; w < G1_WARPS; w++) t = __fadd_rn(t, red_of(w)[idx]);
                v[u] = __fmul_rn(t, acc_scale<FMT>()); /* exact */
            }
            const float hg = k3_round_bf16(__fmul_rn(__fmul_rn(v[0], inv_gs), alpha[0]));
            float o;
            if (GATED) {
                const float hu = k3_round_bf16(__fmul_rn(__fmul_rn(v[HALVES - 1], inv_gs), alpha[1]));
                o = k3_act_gated(&act, hg, hu);
            } else {
                o = k3_act_relu2(hg);
            }
            if (!PAIR && P.w4a4) { /* PAIR: W4A16 only (the plan: src/plan/moe_plan.c) */
                /* NVFP4 requantization of this tile's 16-wide block of the token (CPU: src/core/fp4.c): its 16 rows are
                 * this half-warp */
                float am = fabsf(o);
#pragma unroll
                for (int m = 1; m <= 8; m *= 2) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, m));
                const float sf = k3_e4m3_decode(k3_e4m3_encode(__fdiv_rn(__fmul_rn(gs2, am), 6.0f)));
                o = sf == 0.0f ? 0.0f : __fmul_rn(e2m1f(k3_e2m1_encode(__fdiv_rn(__fmul_rn(o, gs2), sf))), sf);
            }
            const int n = pass + nt * 8 + nl;
            if (n < cnt) P.a[(int64_t)(p0 + n) * P.I + a_col<FMT>(i0 + r)] = k3_f32_to_bf16_bits(o);
        }
        if (pass + NT * 8 < cnt) __syncthreads(); /* another pass reuses the partials' buffers (the rings) */
    }
    K3_MT_END(g1, 6);
}

} // namespace

#endif
