/*
 * Routed experts on the GPU with FP4 (NVFP4, MXFP4) or BF16 weights, tensor-core mma.sync m16n8k16 on SM90+
 * (no FP4 MMA exists on Hopper, so the E2M1 codes are expanded to BF16 in registers: code * block scale is
 * exact in BF16, at most 6 significant bits).
 *
 * Launch sequence (all on the caller's stream, no host sync, grids sized for the worst case so the launches
 * need no knowledge of the routing, CUDA-graph capturable):
 *   dispatch   (moe_dispatch.cu) topk_ids -> per-expert offsets, units (an expert's pairs in runs of one pass,
 *              8 * NT), grouped (token, slot) list;
 *              at decode sizes (W4A16 on the NVFP4 cp.async kernels, m * top_k <= FOLD_NP, grids of <= 2 waves:
 *              shape_of) not launched: GEMM1 and GEMM2 derive the same from topk_ids per block (fold_find,
 *              fold_list), and GEMM1 is then the call's first kernel
 *   [W4A4]     x quantized per (expert, token) pair with the expert's input scale -> xq[pair] (q * sf, exact
 *              in BF16; the 1 / gs factor is applied to the GEMM1 accumulator instead)
 *   GEMM1      grid (units, I / 16 row tiles): max_units (min(E, m * top_k), plus m * top_k / (8 * NT) where m
 *              exceeds a pass; the fold: min(E, m * top_k) slots, one per touched expert); slots past the count
 *              exit. Behind the dispatch kernel at decode sizes (W4A16, grids of 2-8 waves: shape_of), the first
 *              wave finds its unit from topk_ids as the fold does (early routing), so its weights stream while the
 *              dispatch runs; it waits for the dispatch only before its first store.
 *              A block owns 16 gate rows AND the matching 16 up rows, so the activation runs in the epilogue:
 *              h = bf16(acc * scale_2), act in fp32, one rounding (BF16, or the W4A4 NVFP4 requantization of
 *              the 16-wide block this tile is) -> a[pair, I]. Its 4 warps split K, summed in a fixed order.
 *              Paired tiles (W4A16, NT 1, where twice the grid still fits one wave: EP16 M 1): grid (slots, I / 8),
 *              the gate and up rows of 8 outputs in one 16-row tile, bitwise the same a.
 *   GEMM2      grid (slots, L / 64): each warp 16 rows of W2 (the unfolded NT 1 cp.async instance: 32 or 64 rows,
 *              grid (slots, L / 128 or L / 256): G2_T2_MINB), or (long K: I >= 1024) grid (slots, L / 16):
 *              a block per 16 rows, its 4 warps splitting K (8 warps in 256-thread blocks where the grid is at
 *              most 2 blocks per SM: EP16 M 1); out_pair = weight * ((a . W2^T) * scale_2) in fp32 ->
 *              pair_out[token * top_k + slot, L]
 *   combine    out = bf16(sum over slots in order): deterministic, no float atomics. At top_k 1 (cp.async GEMM2)
 *              there is one slot per token and GEMM2 writes out itself (bf16(0 + out_pair), the same bits): no
 *              combine launch; GEMM1 zeroes the rows of tokens whose id is outside [0, E), as the combine did.
 * Weights as the MMA's M dimension (16-row tiles), the expert's tokens as N (8 per MMA, NT MMAs per pass):
 * every weight byte is loaded once per pass, and a pass covers 8 * NT tokens of an expert (NT from m), so at
 * decode sizes each touched expert's weights are streamed once per call, or once per unit for an expert with
 * more tokens than a pass takes (its units run side by side; the later reads mostly hit L2).
 *
 * Fragment mapping (as in gemm_mma.cu): lane (g = lane / 4, q = lane % 4) holds A[g][2q, 2q+1, 2q+8, 2q+9]
 * (and row g + 8) and B[same k][token g]. Logical k (2q, 2q+1 | 2q+8, 2q+9) of step s maps to the physical
 * elements p .. p + 3 with p = 128 c + 32 q + 4 s in a 128-element chunk c (s = 0..7: the lane reads 16
 * consecutive bytes of FP4 per row and chunk: one or two whole scale blocks), or p = k0 + 4 q in a 16-element
 * tail step at k0. The map depends on k alone, so A and B always meet at the same physical k. That is the BF16
 * weights' map; FP4 chunks use the one described above mma_range_fp4 (pairs p + i, p + i + 4, so the E2M1 ->
 * BF16 expansion is a few integer ops per register), with a register ring of several chunks (weights and
 * block scales) in flight per lane. Measurements and the diagnosis: bench/NOTES-moe.md.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "core/act.h"
#include "core/bf16.h"
#include "core/formats.h"
#include "cuda/check.cuh"
#include "cuda/gemm_kernels.cuh"
#include "cuda/mma.cuh"
#include "cuda/moe.h"
#include "cuda/cp_async.cuh"
#include "cuda/nvfp4_decode.cuh"
#include "cuda/pdl.cuh"

namespace {

constexpr int G1_WARPS = 4; /* split-K warps of a GEMM1 block */
constexpr int G2_WARPS = 4; /* warps of a GEMM2 block: 4 tiles of 16 rows, or 1 tile split 4 ways along K */
constexpr int G1_DEPTH = 3; /* FP4 chunks in flight per lane (GEMM1: 4 rows per chunk, 64 bytes + scales) */
constexpr int G2_DEPTH = 8; /* GEMM2: 2 rows per chunk, 32 bytes + scales */
constexpr int G2_MIN_BLOCKS = 3;
constexpr int G1_MIN_BLOCKS = 3; /* occupancy: <= 168 registers, 12 warps per SM (see NOTES-moe.md) */
constexpr int ALIGN = 256;

enum { FMT_BF16 = 0, FMT_NVFP4 = 1, FMT_MXFP4 = 2 };

/* E2M1 code (low nibble) -> fp32: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; sign in bit 3. */
__device__ __forceinline__ float e2m1f(uint32_t c) {
    const uint32_t k = c & 7u;
    const uint32_t bits = k < 2u ? (k ? 0x3f000000u : 0u) : (((126u + (k >> 1)) << 23) | ((k & 1u) << 22));
    return __uint_as_float(bits | ((c & 8u) << 28));
}

/* Two fp32 -> packed BF16 (lo in the low half), round to nearest even. */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* Four FP4 codes (16 bits: elements p .. p + 3, low nibble first) times a block scale -> two BF16x2. */
__device__ __forceinline__ void fp4x4(uint32_t two, float sf, uint32_t &lo, uint32_t &hi) {
    lo = pack_bf16x2(e2m1f(two) * sf, e2m1f(two >> 4) * sf);
    hi = pack_bf16x2(e2m1f(two >> 8) * sf, e2m1f(two >> 12) * sf);
}

template <int FMT>
__device__ __forceinline__ float scale_at(const uint8_t *sexp, int32_t layout, int64_t row, int64_t blk,
                                          int64_t scale_cols) {
    const uint8_t c = __ldg(sexp + k3_scale_offset_hd((k3_scale_layout)layout, row, blk, scale_cols));
    return FMT == FMT_NVFP4 ? k3_e4m3_decode(c) : k3_ue8m0_decode(c);
}

/* BF16 weights: one row's operands for the 8 steps of 128-element chunk c: a[2s] = elements p, p+1;
 * a[2s+1] = p+2, p+3 (the per-step map). */
__device__ __forceinline__ void load_bf16_chunk(const uint8_t *wrow, int c, int q, uint64_t pol, uint32_t (&a)[16]) {
    const uint8_t *p = wrow + ((int64_t)c * 128 + 32 * q) * 2;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint4 v = k3_ld_stream(p + 16 * j, pol);
        a[4 * j] = v.x, a[4 * j + 1] = v.y, a[4 * j + 2] = v.z, a[4 * j + 3] = v.w;
    }
}

/* One weight row's operands for the 16-element tail step at k0 (elements k0 + 4q .. + 3). */
template <int FMT>
__device__ __forceinline__ void decode_step(const uint8_t *wrow, const uint8_t *sexp, int32_t layout, int64_t row,
                                            int64_t cols, int64_t k0, int q, uint32_t &lo, uint32_t &hi) {
    const int64_t p = k0 + 4 * q;
    if (FMT == FMT_BF16) {
        const uint2 v = __ldg((const uint2 *)(wrow + p * 2));
        lo = v.x, hi = v.y;
    } else {
        const uint32_t two = __ldg((const unsigned short *)(wrow + p / 2));
        const int64_t bs = FMT == FMT_NVFP4 ? 16 : 32;
        fp4x4(two, scale_at<FMT>(sexp, layout, row, p / bs, cols / bs), lo, hi);
    }
}

/* L2 loads (.cg): GEMM2 reads GEMM1's output in the same call (PDL, see pdl.cuh) */
__device__ __forceinline__ uint2 ld_b(const uint16_t *brow, int64_t p) {
    return brow ? __ldcg((const uint2 *)(brow + p)) : make_uint2(0u, 0u);
}

template <int FMT, int SETS, int NT, bool XP = false>
__device__ __forceinline__ void mma_tail(const uint8_t *const (&wrow)[SETS][2], const int64_t (&row)[SETS][2],
                                         const uint8_t *sexp, int32_t layout, int64_t cols,
                                         const uint16_t *const (&brow)[NT], int ntv, int c0, int cstep, int q,
                                         float (&acc)[SETS][NT][4]);

/*
 * BF16 weights: the partial products of SETS row sets (16 rows each: this lane's rows g and g + 8) against NT
 * token groups of 8 over the K range this warp owns: chunks c0, c0 + cstep, ... of 128, and the 16-element
 * tail steps j with j % cstep == c0. ntv = token groups that have at least one token (warp-uniform). (FP4
 * weights take mma_range_fp4 below.)
 */
template <int SETS, int NT>
__device__ __forceinline__ void mma_range_bf16(const uint8_t *const (&wrow)[SETS][2], const int64_t (&row)[SETS][2],
                                               int64_t cols, const uint16_t *const (&brow)[NT], int ntv, int c0,
                                               int cstep, int q, uint64_t pol, float (&acc)[SETS][NT][4]) {
    const int chunks = (int)(cols / 128);
    for (int c = c0; c < chunks; c += cstep) {
        uint32_t a[SETS][2][16];
#pragma unroll
        for (int s = 0; s < SETS; s++)
#pragma unroll
            for (int h = 0; h < 2; h++) load_bf16_chunk(wrow[s][h], c, q, pol, a[s][h]);
#pragma unroll
        for (int st = 0; st < 8; st++) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                if (nt >= ntv) break;
                const uint2 xv = ld_b(brow[nt], (int64_t)c * 128 + 32 * q + 4 * st);
#pragma unroll
                for (int s = 0; s < SETS; s++)
                    k3_mma_bf16_16816(acc[s][nt], a[s][0][2 * st], a[s][1][2 * st], a[s][0][2 * st + 1], a[s][1][2 * st + 1],
                             xv.x, xv.y);
            }
        }
    }
    mma_tail<FMT_BF16, SETS, NT>(wrow, row, nullptr, 0, cols, brow, ntv, c0, cstep, q, acc);
}

/* ---- FP4 main loop: deep register pipeline, cheap decode --------------------------------------------------
 * Why: a lane must keep several chunks (weights AND their block scales) in flight to cover HBM latency, and the
 * E2M1 -> BF16 expansion must cost a few integer ops per byte or the SM issue rate, not HBM, sets the speed.
 * FP4 chunks use their own logical -> physical k map: lane q's 16 bytes of chunk c are 4 words j of 8 elements
 * P = 128 c + 32 q + 8 j; register a[4 j + i] holds elements (P + i, P + i + 4), so one shift-and-mask turns
 * a word into BF16 pairs; step st = 2 j + h uses a[2 st] (k 2q, 2q+1) and a[2 st + 1] (k 2q+8, 2q+9), and the
 * activations are permuted to match (byte_perm of one 16-byte load). */

/* e4m3 block scale times 2^117 as BF16x2 (exact: 4 significant bits, 2^108 .. 2^126): times the 2^-126 of
 * the raw pairs (nvfp4_decode.cuh), the operands are weight * 2^-9; the accumulators are multiplied back by NV_ACC
 * (2^9, exact). */
constexpr float NV_ACC = 512.0f;
__device__ __forceinline__ void nv_scales_bf16x2(uint32_t two, uint32_t &s0, uint32_t &s1) {
    float f0, f1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    /* the hardware e4m3 -> f16 conversion (exact, subnormals and NaN included) */
    uint32_t h2;
    asm("{ .reg .b16 t; cvt.u16.u32 t, %1; cvt.rn.f16x2.e4m3x2 %0, t; }" : "=r"(h2) : "r"(two));
    asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %2; cvt.f32.f16 %0, lo; cvt.f32.f16 %1, hi; }"
        : "=f"(f0), "=f"(f1)
        : "r"(h2));
#else
    f0 = k3_e4m3_decode((uint8_t)(two & 0xffu)), f1 = k3_e4m3_decode((uint8_t)(two >> 8));
#endif
    /* both scales in one BF16x2 (exact: 4 significant bits), times 2^117 by one BF16x2 multiply (exact, no
     * overflow: 448 * 2^117 < 2^126); each half is then broadcast, which ptxas folds into the consuming
     * multiply's operand (.H0_H0 / .H1_H1), so no instruction is spent on it */
    const uint32_t p = k3_mul_bf16x2(pack_bf16x2(f0, f1), 0x7a007a00u);
    asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %2; mov.b32 %0, {lo, lo}; mov.b32 %1, {hi, hi}; }"
        : "=r"(s0), "=r"(s1)
        : "r"(p));
}

/* A lane's scale byte(s) of one row and chunk -> what decode_fp4_word multiplies by: NVFP4, the two blocks'
 * scales (words 0-1, 2-3) as BF16x2 times 2^117; MXFP4, the one scale as fp32 bits (both entries). */
template <int FMT>
__device__ __forceinline__ void fp4_scales(uint32_t sc, uint32_t (&out)[2]) {
    if (FMT == FMT_NVFP4) nv_scales_bf16x2(sc, out[0], out[1]);
    else out[0] = out[1] = __float_as_uint(k3_ue8m0_decode((uint8_t)sc));
}

__device__ __forceinline__ uint32_t word_of(uint4 v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

/* One word (8 E2M1 codes, elements P .. P + 7) -> a[i] = elements (P + i, P + i + 4), the FP4 chunk map. */
template <int FMT>
__device__ __forceinline__ void decode_fp4_word(uint32_t w, uint32_t sc, uint32_t (&a)[4]) {
    if (FMT == FMT_NVFP4) {
        k3_nv_decode_word(w, a);
#pragma unroll
        for (int i = 0; i < 4; i++) a[i] = k3_mul_bf16x2(a[i], sc);
    } else {
        const float sf = __uint_as_float(sc);
#pragma unroll
        for (int i = 0; i < 4; i++) a[i] = pack_bf16x2(e2m1f(w >> (4 * i)) * sf, e2m1f(w >> (4 * i + 16)) * sf);
    }
}

/* Byte offset of the first scale this lane needs in chunk 0 of row `row` (scale_off), and the offset step per
 * chunk (scale_step): NVFP4 needs blocks 8c + 2q and + 1 (adjacent bytes in both layouts), MXFP4 block 4c + q. */
template <int FMT>
__device__ __forceinline__ int64_t scale_off(int32_t layout, int64_t row, int64_t cols, int q) {
    const int64_t bs = FMT == FMT_NVFP4 ? 16 : 32;
    return k3_scale_offset_hd((k3_scale_layout)layout, row, FMT == FMT_NVFP4 ? 2 * q : q, cols / bs);
}
template <int FMT>
__device__ __forceinline__ int64_t scale_step(int32_t layout) {
    const bool swz = (k3_scale_layout)layout == K3_SCALE_SWIZZLED;
    return FMT == FMT_NVFP4 ? (swz ? 1024 : 8) : (swz ? 512 : 4);
}

template <int FMT, int SETS>
__device__ __forceinline__ void load_fp4_chunk(const uint8_t *const (&wrow)[SETS][2],
                                               const uint8_t *const (&srow)[SETS][2], int64_t sstep, int c, int q,
                                               uint64_t pol, uint4 (&w)[SETS][2], uint32_t (&sc)[SETS][2]) {
#pragma unroll
    for (int s = 0; s < SETS; s++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            w[s][h] = k3_ld_stream(wrow[s][h] + (int64_t)c * 64 + 16 * q, pol);
            const uint8_t *sp = srow[s][h] + (int64_t)c * sstep;
            /* NVFP4: the two scale bytes in ONE 16-bit load (their offset is even in both layouts). Two byte
             * loads need an op to merge them, which the compiler places right after the loads: that op waited
             * a full HBM latency at every ring refill (seen in the SASS), defeating the ring. Nothing may touch
             * a ring register between its load and its decode. */
            sc[s][h] = FMT == FMT_NVFP4 ? (uint32_t)__ldg((const unsigned short *)sp) : (uint32_t)__ldg(sp);
        }
}

/* The 16-element tail steps (cols % 128) in the per-step map of decode_step: shared by both main loops. XP:
 * the activations are stored pair-permuted (a_col): elements p .. p + 3 (p % 8 = 0 or 4) are the low or the
 * high halves of the 8-element group's four words. */
template <int FMT, int SETS, int NT, bool XP>
__device__ __forceinline__ void mma_tail(const uint8_t *const (&wrow)[SETS][2], const int64_t (&row)[SETS][2],
                                         const uint8_t *sexp, int32_t layout, int64_t cols,
                                         const uint16_t *const (&brow)[NT], int ntv, int c0, int cstep, int q,
                                         float (&acc)[SETS][NT][4]) {
    const int chunks = (int)(cols / 128);
    const int tail = (int)((cols % 128) / 16);
    for (int j = c0; j < tail; j += cstep) {
        const int64_t k0 = (int64_t)chunks * 128 + 16 * j;
        uint32_t lo[SETS][2], hi[SETS][2];
#pragma unroll
        for (int s = 0; s < SETS; s++)
#pragma unroll
            for (int h = 0; h < 2; h++) decode_step<FMT>(wrow[s][h], sexp, layout, row[s][h], cols, k0, q, lo[s][h], hi[s][h]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            if (nt >= ntv) break;
            uint2 xv;
            if constexpr (XP) {
                const int64_t p = k0 + 4 * q;
                const uint4 g8 = brow[nt] ? __ldcg((const uint4 *)(brow[nt] + (p & ~(int64_t)7))) : make_uint4(0, 0, 0, 0);
                const uint32_t sel = (p & 4) ? 0x7632u : 0x5410u;
                xv = make_uint2(__byte_perm(g8.x, g8.y, sel), __byte_perm(g8.z, g8.w, sel));
            } else {
                xv = ld_b(brow[nt], k0 + 4 * q);
            }
#pragma unroll
            for (int s = 0; s < SETS; s++) k3_mma_bf16_16816(acc[s][nt], lo[s][0], lo[s][1], hi[s][0], hi[s][1], xv.x, xv.y);
        }
    }
}

/* The NVFP4 tail steps (cols % 128): decoded exact, so brought to the ring's 2^-9 scale (exact) and added
 * after the chunks. */
template <int SETS, int NT, bool XP = false>
__device__ __forceinline__ void nv_tail(const uint8_t *const (&wrow)[SETS][2], const int64_t (&row)[SETS][2],
                                        const uint8_t *sexp, int32_t layout, int64_t cols,
                                        const uint16_t *const (&brow)[NT], int ntv, int c0, int cstep, int q,
                                        float (&acc)[SETS][NT][4]) {
    float t[SETS][NT][4];
#pragma unroll
    for (int s = 0; s < SETS; s++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) t[s][nt][0] = t[s][nt][1] = t[s][nt][2] = t[s][nt][3] = 0.0f;
    mma_tail<FMT_NVFP4, SETS, NT, XP>(wrow, row, sexp, layout, cols, brow, ntv, c0, cstep, q, t);
#pragma unroll
    for (int s = 0; s < SETS; s++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[s][nt][k] = __fadd_rn(acc[s][nt][k], __fmul_rn(t[s][nt][k], 1.0f / NV_ACC));
}

/* Activation (B operand) ring depth in shared memory, per warp: XD - 1 chunks of x in flight ahead of the
 * MMAs (L2 latency is shorter than HBM's, so fewer than the weights' D). Sized so a block's ring stays
 * <= 32 KB: 4 warps x XD x NT x 2 KB. */
template <int NT>
__host__ __device__ constexpr int x_depth() { return NT == 1 ? 3 : (NT == 2 ? 2 : 1); }
template <int FMT, int NT>
__host__ __device__ constexpr int x_ring_uint4() { return FMT == FMT_BF16 ? 1 : x_depth<NT>() * NT * 4 * 32; }

/* cp.async of this lane's 64 bytes of chunk cc (elements cc * 128 + 32 q .. + 31) of each valid token row
 * into ring slot `slot` ([slot][nt][j][lane] of 16 bytes: conflict-free), then one commit (always, so the
 * group count per chunk is fixed). A lane reads back only what it wrote: no warp barrier needed. */
template <int NT>
__device__ __forceinline__ void x_issue(uint4 *xs, const uint16_t *const (&brow)[NT], uint32_t xok, int ntv, int cc,
                                        int q, int slot, int lane, bool valid) {
    if (valid) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            if (nt >= ntv) break;
#pragma unroll
            for (int j = 0; j < 4; j++)
                k3_cp_async16_zfill(xs + ((slot * NT + nt) * 4 + j) * 32 + lane,
                                    brow[nt] + (int64_t)cc * 128 + 32 * q + 8 * j, (xok >> nt & 1u) * 16u);
        }
    }
    k3_cp_async_commit();
}

/* One k16 pair of one token tile in the FP4 chunk map: the lane's 16 bytes of activations (8 elements) permuted
 * into the B fragments of the map's pairs (p + i, p + i + 4), then two MMAs per row set. XP: the activations are
 * stored in that order already (a_col: GEMM1 writes GEMM2's activations so), its words are the fragments. */
template <int SETS, int NT, bool XP = false>
__device__ __forceinline__ void mma_fp4_tile(float (&acc)[SETS][NT][4], int nt, const uint32_t (&a)[SETS][2][4],
                                             const uint4 x) {
    const uint32_t b00 = XP ? x.x : __byte_perm(x.x, x.z, 0x5410), b01 = XP ? x.y : __byte_perm(x.x, x.z, 0x7632);
    const uint32_t b10 = XP ? x.z : __byte_perm(x.y, x.w, 0x5410), b11 = XP ? x.w : __byte_perm(x.y, x.w, 0x7632);
#pragma unroll
    for (int s = 0; s < SETS; s++) {
        k3_mma_bf16_16816(acc[s][nt], a[s][0][0], a[s][1][0], a[s][0][1], a[s][1][1], b00, b01);
        k3_mma_bf16_16816(acc[s][nt], a[s][0][2], a[s][1][2], a[s][0][3], a[s][1][3], b10, b11);
    }
}

/* The four k16 steps of one 128-wide FP4 chunk: each step's weight words (SETS row sets x 2 halves) decoded to
 * BF16 fragments and multiplied into the accumulators of the ntv token tiles. xc: the chunk's activations in
 * shared memory at this lane's first 16 bytes ([nt][j][lane] of 16 bytes). The padding lanes of a token tile
 * (no token: bit nt of xok clear) had zeros copied in (cp.async zero-fill, no global read), so no per-lane
 * checks are needed here. Both FP4 main loops use it. */
template <int FMT, int SETS, int NT, bool XP = false>
__device__ __forceinline__ void mma_chunk_fp4(const uint4 (&cw)[SETS][2], const uint32_t (&cs)[SETS][2][2],
                                              const uint4 *xc, int ntv, float (&acc)[SETS][NT][4]) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t a[SETS][2][4];
#pragma unroll
        for (int s = 0; s < SETS; s++)
#pragma unroll
            for (int h = 0; h < 2; h++) decode_fp4_word<FMT>(word_of(cw[s][h], j), cs[s][h][j >> 1], a[s][h]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            if (nt > 0 && nt >= ntv) break; /* warp-uniform; ntv >= 1 */
            mma_fp4_tile<SETS, NT, XP>(acc, nt, a, xc[(nt * 4 + j) * 32]);
        }
    }
}

/* FP4 version of the main loop: D chunks (weights and scales) in flight per lane in a register ring; a slot is
 * refilled right after it is decoded, so D - 1 loads are outstanding while a chunk's MMAs issue. The
 * activations come through a shared-memory ring (x_issue) XD - 1 chunks ahead, so no chunk waits on L2.
 * WAIT: k3_pdl_wait() after the weight ring is filled and before the first activation load (GEMM2: its
 * weights stream while GEMM1 drains). For NVFP4 the accumulators come out scaled by 1 / NV_ACC. */
template <int FMT, int SETS, int NT, int D, bool WAIT, bool XP = false>
__device__ __forceinline__ void mma_range_fp4(const uint8_t *const (&wrow)[SETS][2], const int64_t (&row)[SETS][2],
                                              const uint8_t *sexp, int32_t layout, int64_t cols,
                                              const uint16_t *const (&brow)[NT], uint32_t xok, int ntv, int c0,
                                              int cstep, int q, uint64_t pol, uint4 *xs, float (&acc)[SETS][NT][4]) {
    constexpr int XD = x_depth<NT>();
    const int chunks = (int)(cols / 128);
    const int lane = threadIdx.x & 31;
    const uint8_t *srow[SETS][2];
    const int64_t sstep = scale_step<FMT>(layout);
#pragma unroll
    for (int s = 0; s < SETS; s++)
#pragma unroll
        for (int h = 0; h < 2; h++) srow[s][h] = sexp + scale_off<FMT>(layout, row[s][h], cols, q);
    uint4 bw[D][SETS][2];
    uint32_t bsc[D][SETS][2];
#pragma unroll
    for (int d = 0; d < D; d++)
        if (c0 + d * cstep < chunks) load_fp4_chunk<FMT, SETS>(wrow, srow, sstep, c0 + d * cstep, q, pol, bw[d], bsc[d]);
    if (WAIT) k3_pdl_wait();
#pragma unroll
    for (int i = 0; i < XD - 1; i++) x_issue<NT>(xs, brow, xok, ntv, c0 + i * cstep, q, i, lane, c0 + i * cstep < chunks);
    int xslot = 0; /* ring slot of the chunk being consumed */
    for (int c = c0; c < chunks; c += D * cstep) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            const int cc = c + d * cstep;
            if (cc >= chunks) break; /* warp-uniform */
            /* the slot's raw words move out (16 B + scales per row) so the slot is refilled at once; they are
             * decoded one word (2 MMA steps) at a time, which keeps 8 instead of 32 BF16x2 registers per row set
             * live (occupancy) */
            uint4 cw[SETS][2];
            uint32_t cs[SETS][2][2];
#pragma unroll
            for (int s = 0; s < SETS; s++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    cw[s][h] = bw[d][s][h];
                    fp4_scales<FMT>(bsc[d][s][h], cs[s][h]);
                }
            if (cc + D * cstep < chunks)
                load_fp4_chunk<FMT, SETS>(wrow, srow, sstep, cc + D * cstep, q, pol, bw[d], bsc[d]);
            const int ahead = cc + (XD - 1) * cstep;
            x_issue<NT>(xs, brow, xok, ntv, ahead, q, (xslot + XD - 1) % XD, lane, ahead < chunks);
            k3_cp_async_wait<XD - 1>(); /* this chunk's activations have landed */
            const uint4 *xc = xs + xslot * NT * 4 * 32 + lane;
            xslot = xslot + 1 == XD ? 0 : xslot + 1;
            mma_chunk_fp4<FMT, SETS, NT, XP>(cw, cs, xc, ntv, acc);
        }
    }
    k3_cp_async_wait<0>(); /* only empty groups can be left; keeps the ring clean for the next pass */
    if (FMT == FMT_NVFP4 && (cols % 128) != 0) {
        nv_tail<SETS, NT, XP>(wrow, row, sexp, layout, cols, brow, ntv, c0, cstep, q, acc);
    } else {
        mma_tail<FMT, SETS, NT, XP>(wrow, row, sexp, layout, cols, brow, ntv, c0, cstep, q, acc);
    }
}

/* ---- NVFP4 main loop through a cp.async shared-memory ring ---------------------------------------------
 * Why: register loads of the ring above share one scoreboard, and SASS waits on a scoreboard until ALL its
 * loads are back; the wait for chunk t therefore also waited for the refills issued after it, so only about
 * one chunk was really in flight per warp (bench/NOTES-moe.md, session 8). cp.async groups complete in
 * order and `cp.async.wait_group N` waits for exactly the older ones: S - 1 chunks (weights and block scales)
 * stay in flight while one is decoded. Each lane copies and reads back only its own bytes, so no barrier is
 * needed. Per warp and stage: weights [SETS * 2][32] x 16 B, the 4-byte word holding the lane's two scale
 * bytes [SETS * 2][32] x 4 B. The activations are NOT in the ring (session 13): a token tile's 8 rows took
 * 2 KB per stage although at decode sizes an expert has 1-2 tokens (7 of 8 rows zero-filled), which capped
 * GEMM1 at 3 blocks per SM (2 at NT 2). They are read straight into registers (plain coherent L1-cached
 * loads: every block of an SM reads the same few token rows) at the start of their chunk, with an L1
 * prefetch S - 1 chunks ahead. Used when the scale words are 4-byte aligned (swizzled layout, or
 * cols % 64 == 0 with an aligned scale pointer) and NT <= 2. */
/* Ring depths (chunks; S - 1 in flight per warp). GEMM1 at S = 3 measured 3-5% faster than 4 at every point (more
 * requests in flight only lengthen the queues; bench/NOTES-moe.md, session 13). */
constexpr int G1_STAGES = 3;
constexpr int G2_STAGES = 4;
template <int SETS>
__host__ __device__ constexpr int as_stage_uint4() { return SETS * 80; }
template <int SETS, int S>
__host__ __device__ constexpr int as_warp_uint4() { return S * as_stage_uint4<SETS>(); }

__device__ __forceinline__ void k3_cp_async4(void *smem, const void *gmem) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(gmem) : "memory");
}

/* The weights' 16-byte copy with the L2 prefetch-size hint (256-byte blocks): the 4 warps of a block read 4
 * adjacent 64-byte chunks of each row at about the same time, so one DRAM read of 256 bytes serves all four
 * (session 13: GEMM1 2-3% faster than without the hint). */
__device__ __forceinline__ void nv_cp_w16(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

/* The producer side of one lane's ring: its addresses at the warp's first chunk and the byte steps from one
 * of its chunks to the next; chunk k's address is base + k * step, one IMAD.WIDE each. Why: recomputing
 * row * row_bytes + chunk * 64 and the scale offsets in 64 bits for every chunk cost ~130 of the loop's 579
 * instructions (SASS, session 8); a post-incremented pointer costs 4 (the cp.async keeps reading its address
 * registers, so ptxas copies them first). */
template <int SETS>
struct nv_feed {
    const uint8_t *w[SETS][2];  /* weights: 16 bytes per row and chunk */
    const uint8_t *sw[SETS][2]; /* the aligned 4-byte word holding the lane's two scale bytes */
    int sbyte[SETS][2];         /* where the lane's two scale bytes sit in their word: constant along the row */
    uint32_t wstep, sstep;
    int n;                      /* this warp's chunks */
};

template <typename T>
__device__ __forceinline__ const T *at_step(const T *base, uint32_t k, uint32_t step) {
    return (const T *)((const uint8_t *)base + (uint64_t)(k * step)); /* < 4 GB: one expert's slice */
}

/* The weight side of a warp's range: the n chunks c0, c0 + cstep, ... of the rows row[s][h]. */
template <int SETS>
__device__ __forceinline__ void nv_feed_init(nv_feed<SETS> &f, const uint8_t *const (&wrow)[SETS][2],
                                             const int64_t (&row)[SETS][2], const uint8_t *sexp, int32_t layout,
                                             int64_t cols, int c0, int cstep, int n, int q) {
    f.n = n;
    const int64_t sstep = scale_step<FMT_NVFP4>(layout);
#pragma unroll
    for (int s = 0; s < SETS; s++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t off = scale_off<FMT_NVFP4>(layout, row[s][h], cols, q);
            f.sbyte[s][h] = (int)(off & 2);
            f.sw[s][h] = sexp + (off & ~(int64_t)3) + (int64_t)c0 * sstep;
            f.w[s][h] = wrow[s][h] + (int64_t)c0 * 64 + 16 * q;
        }
    f.wstep = 64u * (uint32_t)cstep, f.sstep = (uint32_t)(sstep * cstep);
}

template <int SETS>
__device__ __forceinline__ void nv_issue_w(uint4 *stage, const nv_feed<SETS> &f, uint32_t k, int lane) {
    uint32_t *sc = (uint32_t *)(stage + SETS * 64);
#pragma unroll
    for (int s = 0; s < SETS; s++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            nv_cp_w16(stage + (s * 2 + h) * 32 + lane, at_step(f.w[s][h], k, f.wstep));
            k3_cp_async4(sc + (s * 2 + h) * 32 + lane, at_step(f.sw[s][h], k, f.sstep));
        }
}

/* The ring fill: the first S - 1 chunks' weights, one commit each (always, so the group count is fixed). */
template <int SETS, int S>
__device__ __forceinline__ void nv_fill(uint4 *ring, const nv_feed<SETS> &f, int lane) {
#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        if (i < f.n) nv_issue_w<SETS>(ring + i * as_stage_uint4<SETS>(), f, i, lane);
        k3_cp_async_commit();
    }
}

/* This lane's activations of one chunk: 64 contiguous bytes of its token row per token tile (padding lanes:
 * zeros, no load). Plain ld.global (coherent: GEMM2 reads GEMM1's output after its PDL wait). */
__device__ __forceinline__ uint4 ld_x16(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
/* Padding lanes (no token) load nothing: their registers keep the zeros the caller set once per pass (clearing
 * them per chunk cost 8 register clears per chunk; loading the last token's row into them instead cost 4x the L1
 * wavefronts of a one-token tile, EP16 M 8 +1.5 us: session 18). */
template <int NT>
__device__ __forceinline__ void nv_load_x(const uint8_t *const (&xp)[NT], uint32_t xok, int ntv, uint32_t k,
                                          uint32_t xstep, uint4 (&xv)[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        if ((nt == 0 || nt < ntv) && (xok >> nt & 1u)) {
            const uint8_t *p = at_step(xp[nt], k, xstep);
#pragma unroll
            for (int j = 0; j < 4; j++) xv[nt][j] = ld_x16(p + 16 * j);
        }
    }
}
/* The L1 prefetch of a chunk's activation line, issued with the chunk's weight copies (S - 1 chunks ahead);
 * session 13: without it GEMM1 was 5-8% slower. */
template <int NT>
__device__ __forceinline__ void nv_prefetch_x(const uint8_t *const (&xp)[NT], uint32_t xok, int ntv, uint32_t k,
                                              uint32_t xstep) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        if ((nt == 0 || nt < ntv) && (xok >> nt & 1u))
            asm volatile("prefetch.global.L1 [%0];" ::"l"(at_step(xp[nt], k, xstep)));
}

/* One 128-wide NVFP4 chunk with the activations in registers (xv[nt][j]: this lane's 16 bytes of word j). */
template <int SETS, int NT, bool XP = false>
__device__ __forceinline__ void mma_chunk_nv_rx(const uint4 (&cw)[SETS][2], const uint32_t (&cs)[SETS][2][2],
                                                const uint4 (&xv)[NT][4], int ntv, float (&acc)[SETS][NT][4]) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t a[SETS][2][4];
#pragma unroll
        for (int s = 0; s < SETS; s++)
#pragma unroll
            for (int h = 0; h < 2; h++) decode_fp4_word<FMT_NVFP4>(word_of(cw[s][h], j), cs[s][h][j >> 1], a[s][h]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            if (nt > 0 && nt >= ntv) break; /* warp-uniform; ntv >= 1 */
            mma_fp4_tile<SETS, NT, XP>(acc, nt, a, xv[nt][j]);
        }
    }
}

/* The main loop after nv_fill (the caller fills the ring first, so the weights stream while it reads the
 * routing, or waits for the previous kernel). Accumulators come out scaled by 1 / NV_ACC. The chunk loop is
 * unrolled by the ring depth, so every stage address is a constant offset. */
template <int SETS, int NT, int S, bool XP = false>
__device__ __forceinline__ void mma_range_nv_async(const nv_feed<SETS> &f, const uint8_t *const (&wrow)[SETS][2],
                                                   const int64_t (&row)[SETS][2], const uint8_t *sexp,
                                                   int32_t layout, int64_t cols, const uint16_t *const (&brow)[NT],
                                                   uint32_t xok, int ntv, int c0, int cstep, int tc0, int tcs,
                                                   int q, uint4 *ring, float (&acc)[SETS][NT][4]) {
    constexpr int SU = as_stage_uint4<SETS>();
    const int n = f.n;
    const int lane = threadIdx.x & 31;
    const uint8_t *xp[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) xp[nt] = (const uint8_t *)(brow[nt] + (int64_t)c0 * 128 + 32 * q);
    const uint32_t xstep = 256u * (uint32_t)cstep;
#pragma unroll
    for (int i = 0; i < S - 1; i++)
        if (i < n) nv_prefetch_x<NT>(xp, xok, ntv, i, xstep);
    uint4 xv[NT][4]; /* padding lanes: zeros for the whole pass (nv_load_x) */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int j = 0; j < 4; j++) xv[nt][j] = make_uint4(0u, 0u, 0u, 0u);
    for (int i0 = 0; i0 < n; i0 += S) {
#pragma unroll
        for (int d = 0; d < S; d++) {
            if (i0 + d >= n) break; /* warp-uniform */
            /* this chunk's activations first (L1 hits, or L2), then refill the stage consumed one chunk ago with
             * chunk i0 + d + S - 1 */
            nv_load_x<NT>(xp, xok, ntv, i0 + d, xstep, xv);
            uint4 *refill = ring + ((d + S - 1) % S) * SU;
            const uint32_t ka = i0 + d + S - 1;
            if (ka < (uint32_t)n) {
                nv_issue_w<SETS>(refill, f, ka, lane);
                nv_prefetch_x<NT>(xp, xok, ntv, ka, xstep);
            }
            k3_cp_async_commit();
            k3_cp_async_wait<S - 1>(); /* chunk i0 + d's group (and every older one) has landed */
            const uint4 *stage = ring + d * SU;
            const uint8_t *sc = (const uint8_t *)(stage + SETS * 64);
            uint4 cw[SETS][2];
            uint32_t cs[SETS][2][2];
#pragma unroll
            for (int s = 0; s < SETS; s++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    cw[s][h] = stage[(s * 2 + h) * 32 + lane];
                    nv_scales_bf16x2(*(const uint16_t *)(sc + ((s * 2 + h) * 32 + lane) * 4 + f.sbyte[s][h]),
                                     cs[s][h][0], cs[s][h][1]);
                }
            mma_chunk_nv_rx<SETS, NT, XP>(cw, cs, xv, ntv, acc);
        }
    }
    k3_cp_async_wait<0>(); /* only empty groups can be left; the ring is clean for the next pass */
    if ((cols % 128) != 0) nv_tail<SETS, NT, XP>(wrow, row, sexp, layout, cols, brow, ntv, tc0, tcs, q, acc);
}

/* A warp's chunks of a K split into `parts` warps: every parts-th chunk from chunk `part` (interleaved: the
 * warps of a block read adjacent 64-byte pieces of each row at about the same time; a contiguous range per
 * warp was measured 2-8% slower in session 13). The 16-element tail steps are split j % parts == part. */
__device__ __forceinline__ void k_split(int64_t cols, int part, int parts, int &c0, int &cstep, int &n) {
    const int chunks = (int)(cols / 128);
    c0 = part, cstep = parts, n = part < chunks ? (chunks - part + parts - 1) / parts : 0;
}

/* The main loop of either kind; FP4 accumulators are scaled by 1 / acc_scale<FMT>(). */
template <int FMT>
__device__ __forceinline__ constexpr float acc_scale() { return FMT == FMT_NVFP4 ? NV_ACC : 1.0f; }

/* The register-ring / BF16 main loops (the cp.async ring is called by the kernels directly: they fill it
 * before reading the routing or waiting for the previous kernel). */
template <int FMT, int SETS, int NT, int D, bool WAIT, bool XP = false>
__device__ __forceinline__ void mma_any(const uint8_t *const (&wrow)[SETS][2], const int64_t (&row)[SETS][2],
                                        const uint8_t *sexp, int32_t layout, int64_t cols,
                                        const uint16_t *const (&brow)[NT], uint32_t xok, int ntv, int c0, int cstep,
                                        int q, uint64_t pol, uint4 *xs, float (&acc)[SETS][NT][4]) {
    if (FMT == FMT_BF16) {
        if (WAIT) k3_pdl_wait();
        mma_range_bf16<SETS, NT>(wrow, row, cols, brow, ntv, c0, cstep, q, pol, acc);
    } else {
        mma_range_fp4<FMT, SETS, NT, D, WAIT, XP>(wrow, row, sexp, layout, cols, brow, xok, ntv, c0, cstep, q, pol,
                                                  xs, acc);
    }
}

/* Everything a GEMM1 / GEMM2 launch needs (by value: kernel parameters). */
struct moe_params {
    int64_t L, I;
    int32_t top_k, ne, layout, sep, interleaved, w4a4;
    k3_act_desc act;
    const uint16_t *x;                       /* [m, L] */
    const int32_t *ids;                      /* [m, top_k] */
    const float *wts;                        /* [m, top_k] */
    const int32_t *offs, *active, *act_off, *n_active, *list;
    const float *wsort;                      /* [np] wts[list[p]] (the dispatch path) */
    int32_t np;                              /* pairs (m * top_k) */
    const uint16_t *xq;                      /* W4A4: [np, L] grouped, q * sf */
    uint16_t *a;                             /* [np, I] grouped */
    float *pair_out;                         /* [np, L] by pair index */
    int32_t direct;                          /* shape_of direct: GEMM2 writes out (and out_f32), not pair_out */
    uint16_t *out;                           /* [m, L] (direct) */
    float *out_f32;                          /* [m, L] or NULL (direct) */
    const uint8_t *w13, *w13s, *w2, *w2s;
    size_t w13_eb, w13_sb, w2_eb, w2_sb;
    const float *w13_s2, *w2_s2, *w13_in, *w2_in;
    int64_t early_blocks;                    /* GEMM1 EARLY: blocks below this linear index route themselves */
    int32_t tpu;                             /* the dispatch's pairs per unit (GEMM1 EARLY) */
};

/*
 * The dispatch folded into the GEMMs at decode sizes (session 14b). Why: the dispatch kernel was a whole launch
 * (~3.6-4.7 us of every call) in front of GEMM1, which could not start its weight stream before it finished. At
 * np <= FOLD_NP pairs each GEMM1 / GEMM2 block (NTH = 128 or 256 threads) derives what it needs from topk_ids
 * itself (FOLD_NP / NTH pairs per thread, kept in registers), with the dispatch kernel's exact order:
 *   fold_find: the touched experts as a bitmap (integer atomicOr in shared memory), the slot-th set bit = the
 *              slot-th active expert in ascending id order, and their count (= n_active);
 *   fold_list: p0 = valid pairs with a smaller id (= offs[e]), cnt = pairs of e, and e's pair indices ascending
 *              (= list[p0 ..]): ballots over 32-pair chunks in pair order.
 * So p0, cnt and the list (hence every output row and every sum) are the dispatch's: bitwise the same results.
 * GEMM2 recomputes them before its PDL wait (topk_ids is two or more kernels back: complete, see pdl.cuh).
 * The bitmap is dead before the weight ring fills, so it lives in the ring: the fold exists only in the NVFP4 cp.async
 * kernels, as their FOLD instances. Why instances and not a run-time flag: with the flag, the points that do not
 * fold ran 1-15 us slower (TP8 M 4 GEMM2 +1.5 us, M 16 +13; bench/NOTES-moe.md session 15), so those points run
 * kernels without a line of the fold's code.
 */
constexpr int FOLD_NP = 256;  /* pair indices fit a byte; two pairs per thread of a 128-thread block, one of 256 */
constexpr int FOLD_E = 4096;  /* bitmap words: 128, at most 4 per lane of the warp that scans them */
static_assert(G1_WARPS * 32 * 2 == FOLD_NP && G2_WARPS * 32 * 2 == FOLD_NP, "two pairs per thread");
template <int NTH>
__host__ __device__ constexpr int fold_ppt() { /* pairs per thread */
    static_assert(NTH == FOLD_NP / 2 || NTH == FOLD_NP, "fold: 128- or 256-thread blocks");
    return FOLD_NP / NTH;
}

struct fold_smem {
    int32_t cc[FOLD_NP / 32]; /* pairs of e in each 32-pair chunk */
    int32_t lt[FOLD_NP / 32]; /* per warp: valid pairs with an id below e */
    int32_t e, n_act;
    uint8_t list[FOLD_NP];    /* e's pair indices, ascending */
    int32_t over;             /* fold_find COUNT: an expert has more than P.tpu pairs */
};
/* Dynamic shared memory a folded launch adds after its ring: fold_smem. As static shared memory, its 320 bytes cost
 * the cp.async GEMM2 a block per SM (TP8 M 16 +18 us, bench/NOTES-moe.md session 14). */
constexpr size_t fold_dyn_bytes() { return (sizeof(fold_smem) + 15) / 16 * 16; }

/* Block-wide (every thread of an NTH-thread block calls it). id[h]: this thread's pair h * NTH + tid (h < PPT), -1
 * when absent or out of [0, E) (and for h >= PPT). Returns the touched-expert count; fs.e holds the slot-th touched
 * expert when slot < that count.
 * COUNT (GEMM1's early routing): also fs.over = 1 when an expert has more than P.tpu pairs, i.e. when the dispatch's
 * units are not the touched experts (per-expert counts as 16-bit halves of the words after the bitmap). */
template <int NTH, bool COUNT = false>
__device__ __forceinline__ int32_t fold_find(const moe_params &P, int slot, uint32_t *bm, fold_smem &fs,
                                             int32_t (&id)[2]) {
    constexpr int PPT = fold_ppt<NTH>();
    const int tid = threadIdx.x, lane = tid & 31;
    const int nw = (P.ne + 31) >> 5;
    for (int i = tid; i < nw; i += NTH) bm[i] = 0u;
    uint32_t *const cw = bm + FOLD_E / 32;
    if constexpr (COUNT) {
        for (int i = tid; i < (P.ne + 1) >> 1; i += NTH) cw[i] = 0u;
        if (tid == 0) fs.over = 0;
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int i = h * NTH + tid;
        const int32_t v = h < PPT && i < P.np ? __ldcg(P.ids + i) : -1;
        id[h] = v >= 0 && v < P.ne ? v : -1;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < PPT; h++)
        if (id[h] >= 0) {
            atomicOr(&bm[id[h] >> 5], 1u << (id[h] & 31));
            if constexpr (COUNT) {
                const uint32_t sh = (uint32_t)(id[h] & 1) * 16u, old = atomicAdd(&cw[id[h] >> 1], 1u << sh) >> sh;
                if ((int32_t)(old & 0xffffu) >= P.tpu) atomicOr(&fs.over, 1); /* atomic: racecheck-clean */
            }
        }
    __syncthreads();
    if (tid < 32) {
        const int wpl = (nw + 31) >> 5, w0 = lane * wpl;
        int c = 0;
        for (int j = 0; j < wpl; j++)
            if (w0 + j < nw) c += __popc(bm[w0 + j]);
        int incl = c;
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        if (slot >= incl - c && slot < incl) { /* this lane's words hold the slot-th set bit */
            int r = slot - (incl - c);
            for (int j = 0; j < wpl; j++) {
                uint32_t w = bm[w0 + j];
                const int pc = __popc(w);
                if (r < pc) {
                    for (; r > 0; r--) w &= w - 1u;
                    fs.e = (w0 + j) * 32 + __ffs(w) - 1;
                    break;
                }
                r -= pc;
            }
        }
        if (lane == 31) fs.n_act = incl;
    }
    __syncthreads();
    return fs.n_act;
}

/* Block-wide, after fold_find (e = fs.e valid). p0, cnt and fs.list as the dispatch's offs / list. */
template <int NTH>
__device__ __forceinline__ void fold_list(int32_t e, fold_smem &fs, const int32_t (&id)[2], int32_t &p0,
                                          int32_t &cnt) {
    constexpr int PPT = fold_ppt<NTH>(), W = NTH / 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    unsigned b[2];
    int nlt = 0;
#pragma unroll
    for (int h = 0; h < PPT; h++) {
        b[h] = __ballot_sync(0xffffffffu, id[h] == e);
        nlt += __popc(__ballot_sync(0xffffffffu, id[h] >= 0 && id[h] < e));
    }
    if (lane == 0) {
#pragma unroll
        for (int h = 0; h < PPT; h++) fs.cc[h * W + warp] = __popc(b[h]);
        fs.lt[warp] = nlt;
    }
    __syncthreads();
    /* chunk c = pairs 32 c .. 32 c + 31: this thread's pair h lies in chunk h * W + warp */
    int base[2] = {0, 0}, tot = 0;
#pragma unroll
    for (int c = 0; c < FOLD_NP / 32; c++) {
        const int v = fs.cc[c];
#pragma unroll
        for (int h = 0; h < PPT; h++) base[h] += c < h * W + warp ? v : 0;
        tot += v;
    }
    p0 = 0;
#pragma unroll
    for (int w = 0; w < W; w++) p0 += fs.lt[w];
    cnt = tot;
    const unsigned below = (1u << lane) - 1u;
#pragma unroll
    for (int h = 0; h < PPT; h++)
        if (id[h] == e) fs.list[base[h] + __popc(b[h] & below)] = (uint8_t)(h * NTH + tid);
    __syncthreads();
}

/* Block-wide: e = the expert of this block's slot (fold_find: a touched expert; the dispatch path: a unit); true
 * when the slot is past them and the block leaves (block-uniform, before any barrier of the caller). The dispatch
 * path also gives the unit's first pair p0 and pair count (the fold: fold_list, later); its four loads go out
 * together (act_off holds an entry past the grid's last slot: layout_of). */
template <bool FOLD, int NTH>
__device__ __forceinline__ bool slot_leaves(const moe_params &P, int slot, uint32_t *bm, fold_smem &fs,
                                            int32_t (&fid)[2], int32_t &e, int32_t &p0, int32_t &cnt) {
    if constexpr (FOLD) {
        if (fold_find<NTH>(P, slot, bm, fs, fid) <= slot) return true;
        e = fs.e;
        return false;
    } else {
        const int32_t n_act = __ldcg(P.n_active);
        e = __ldcg(P.active + slot);
        p0 = __ldcg(P.act_off + slot);
        cnt = __ldcg(P.act_off + slot + 1) - p0;
        return slot >= n_act;
    }
}

/* ASYNC (NVFP4, NT <= 2): the cp.async ring in dynamic shared memory (g1_dyn_bytes); the split-K partial
 * sums of each warp then go to the start of its own ring, which is dead after its main loop. */
template <int SETS>
constexpr size_t g1_dyn_bytes() { return (size_t)G1_WARPS * as_warp_uint4<SETS, G1_STAGES>() * 16; }
/* A cp.async GEMM1 launch's dynamic shared memory: the ring, then (fold, early routing) the routing state. */
template <int SETS, bool ROUTED>
constexpr size_t g1_smem_bytes() { return g1_dyn_bytes<SETS>() + (ROUTED ? fold_dyn_bytes() : 0); }
/* Blocks per SM the register budget is sized for: the cp.async kernel at NT 1 (no activation ring: 30 KB of
 * shared memory per block) fits 4 at 128 registers, no spills in the loop; NT 2 keeps 3 (162 registers). Denser
 * instances were slower or no faster even where they took a grid to one wave (5 at 96 registers: session 13 and
 * EP16 M 3 in session 18; 6 at 80, paired or not: session 18): the loops already keep the integer pipe half busy. */
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

/* GEMM2's activations (GEMM1's output `a`, FP4 formats) are stored pair-permuted: in each 8-element group,
 * element e at position e < 4 ? 2e : 2e - 7, so the 32-bit words of a 16-byte load are the B fragments of the FP4
 * chunk map's pairs (p + i, p + i + 4) as they stand (mma_fp4_tile XP): GEMM2 saves the 16 byte permutations per
 * chunk that the user's activations cost GEMM1, ~15% of its integer-pipe work (the pipe that bounds these loops:
 * ncu, session 18). BF16 weights pair elements (p, p + 1): no permutation. `a` is internal to a call. */
template <int FMT>
constexpr bool A_PERM = FMT != FMT_BF16;
template <int FMT>
__device__ __forceinline__ int64_t a_col(int64_t i) {
    if constexpr (!A_PERM<FMT>) return i;
    const int64_t e = i & 7;
    return (i & ~(int64_t)7) | (e < 4 ? 2 * e : 2 * e - 7);
}

/* A warp's split-K partial sums in shared memory: row (s * NT + nt) * 4 + c (the accumulator index) of 32 lanes,
 * rows 33 floats apart, so both the stores (one row per instruction) and the epilogue's reads (4 rows x 8 lanes
 * per instruction) are free of bank conflicts. */
template <int SETS, int NT>
__host__ __device__ constexpr int red_floats() { return SETS * NT * 4 * 33; }

/*
 * GEMM1: a block owns 16 gate (and 16 up) rows of one expert slot; its 4 warps split K. The split-K sum and the
 * epilogue run on all 4 warps (session 14): every warp stores its partials (in its own dead ring), one block
 * barrier, then each thread sums and finishes one (token, row) output per token tile: token nl = tid / 16, row
 * r = tid % 16, so a W4A4 block's 16 rows are one half-warp. The sum is warp 0 + warp 1 + warp 2 + warp 3 in
 * that order, as warp 0 alone did before (bitwise the same output). No barrier after the last pass. Why: ncu
 * (session 13) put 1.68 of GEMM1's ~7.8 cycles per issued instruction on barriers: warps 1-3 waited at a second
 * barrier while warp 0 alone summed and ran the epilogue for all 16 x 8 x NT outputs.
 * PAIR (gated, cp.async, W4A16): the block owns 8 outputs, and their gate rows (MMA rows 0-7) and up rows (8-15)
 * share ONE 16-row tile, so a lane holds both halves of its outputs (accumulators c0/c1 gate, c2/c3 up). Half the
 * work per block, twice the blocks: for grids that would otherwise leave SMs idle (EP16 M 1: 192 blocks on 132
 * SMs), where every warp's serial chunk walk, not the bytes, set the time (bench/NOTES-moe.md, session 17).
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
    if (!early && slot_leaves<FOLD, G1_WARPS * 32>(P, slot, bm, fs, fid, e, p0, cnt)) return; /* block-uniform */
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
            if (!PAIR && P.w4a4) { /* PAIR: W4A16 only (shape_of) */
                /* NVFP4 requantization of this tile's 16-wide block of the token (CPU: nvfp4_block): its 16 rows are
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
}

/* KS = 1: each warp owns a 16-row tile and the whole K (short K: I / 128 small). KS = G2_WARPS: the block owns
 * one tile and its warps split K, summed in warp order (long K with few experts: more blocks, more bytes in
 * flight). KS = G2_WIDE_KS (NVFP4 cp.async, NT 1): the same with twice the warps (256-thread blocks), where the
 * grid leaves SMs idle (EP16 M 1: 224 blocks): each warp's serial chunk walk halves, as GEMM1's paired tiles do. */
constexpr int G2_WIDE_KS = 8;
template <int KS>
constexpr int g2_warps() { return KS > G2_WARPS ? KS : G2_WARPS; }
/* The ring's stages of the KS 1 GEMM2 with `tiles` row tiles per warp: four tiles take two stages, the shared
 * memory of two tiles' four (40 KB per block), since the ring's depth hardly matters (session 20, the probe). */
constexpr int g2_stages(int tiles) { return tiles == 4 ? 2 : G2_STAGES; }
template <int KS, int TILES = 1>
constexpr size_t g2_dyn_bytes() { return (size_t)g2_warps<KS>() * as_warp_uint4<TILES, g2_stages(TILES)>() * 16; }
/* The dispatch path's epilogue lookups of a pass (its pair indices, then their routing weights: two dependent round
 * trips after the main loop) go to shared memory with the ring's first chunk instead: 8 (pair, weight) per warp
 * after the rings. NT 1 only (at NT 2 the split-K instance then spilled 28 bytes); where the fold routes, the pair
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
 * a half or a quarter of the block rows. Bitwise the one-tile result (each row's chunk order is the same). Measured on
 * the H200 (session 21, same-call A/B):
 * - two tiles (5 blocks per SM, 40 KB ring, 96 / 94 registers, no spills) against one: TP8 M 4 / 8 / 12 / 16 / 32
 *   65.2 / 106.7 / 147.9 / 187.2 / 315.5 -> 61.9 / 103.9 / 143.9 / 182.7 / 312.4 us, M 2 -0.7, M 64 within +-1.5;
 * - four tiles (4 blocks per SM, two stages, 128 registers, 8 bytes spilled) against two, three runs: M 12 / 16 /
 *   32 / 64 -0.8 / -2.2 / -9.0 / -15.8 us, M 8 -0.2, but M 2 +1.5 and M 4 +0.6: four tiles pay where the two-tile
 *   grid is many waves (G2_T4_WAVES), two where it is a few.
 * M 1 folds and EP16 splits K: neither takes these instances. */
constexpr int G2_T2_MINB = 5, G2_T4_MINB = 4;
constexpr int64_t G2_T4_WAVES = 6; /* TP8: M 8 5.0 waves of the two-tile grid (neutral), M 12 7.2 (-0.8 us) */
/* Blocks per SM of the cp.async GEMM2 (a block's ring: 20 KB): KS 1 at NT 1 (TP8: 3 chunks per warp, the
 * block's life is mostly its fixed latency) 6 (74 registers); NT 2 (spills in the loop at 80 registers) and
 * split-K (EP16) 5. Measured in session 13 against 4, 5 and 6 for all. The wide split: 2 (its grids are
 * <= 2 blocks per SM, shape_of). */
constexpr int g2_min_blocks(bool async, int nt, int ks) {
    return !async ? G2_MIN_BLOCKS : (ks == G2_WIDE_KS ? 2 : (ks == 1 && nt == 1 ? 6 : 5));
}
/* The denser instances shape_of picks for grids past a wave of the default (the cp.async kernels at NT 1):
 * split-K at 7 blocks per SM (72 registers, no spills), KS 1 at 8 (64 registers, a few spilled). MINB = 0 in
 * the kernel template: g2_min_blocks. */
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
    /* PDL: the dispatch lists (two kernels back, complete: see pdl.cuh), or with the fold topk_ids (likewise),
     * are read before the wait, and the weight ring is filled before it too (nv_fill, or mma_any<..., true>);
     * GEMM1's output a only after it */
    k3_pdl_launch();
    const int slot = blockIdx.x;
    int32_t e, p0 = 0, cnt = 0, fid[2] = {-1, -1};
    if (slot_leaves<FOLD, NW * 32>(P, slot, bm, fs, fid, e, p0, cnt)) return; /* block-uniform */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int64_t r0 = KS > 1 ? (int64_t)blockIdx.y * 16 : ((int64_t)blockIdx.y * G2_WARPS + warp) * 16 * TILES;
    /* KS = 1: warp-uniform, KS > 1: block-uniform. Fold: an idle warp leaves only after fold_list (block barriers) */
    const bool idle = r0 >= P.L;
    if (idle && !FOLD) return;
    const uint64_t pol = k3_policy_evict_first();
    const uint8_t *wexp = P.w2 + (size_t)e * P.w2_eb;
    const uint8_t *sexp = FMT == FMT_BF16 ? nullptr : P.w2s + (size_t)e * P.w2_sb;
    const int64_t row_bytes = FMT == FMT_BF16 ? P.I * 2 : P.I / 2;
    const uint8_t *wrow[SETS][2];
    int64_t row[SETS][2];
#pragma unroll
    for (int s = 0; s < SETS; s++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            row[s][h] = r0 + 16 * s + g + 8 * h; /* a warp's tiles exist together (L % (16 * TILES) == 0: shape_of) */
            wrow[s][h] = wexp + row[s][h] * row_bytes;
        }
    float alpha = FMT == FMT_NVFP4 ? __ldg(P.w2_s2 + e) : 1.0f;
    const float inv_gs = P.w4a4 ? 1.0f / (1.0f / __ldg(P.w2_in + e)) : 1.0f;
    uint4 *const ring = k3_moe_dyn + warp * as_warp_uint4<SETS, STG>();
    /* ASYNC and g2_epi: this warp's first-pass (pair, weight) copies (g2_smem_bytes); the warps that store outputs
     * ask for them with their ring's first chunk (list and wsort are the dispatch's: two kernels back, complete) */
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
    if constexpr (FOLD) {
        fold_list<NW * 32>(e, fs, fid, p0, cnt); /* while the ring fills: shared memory and registers only */
        if (idle) return;
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
}

/* W4A4: x of every grouped (expert, token) pair NVFP4-quantized with gs = 1 / w13_input_scale[e]; one block
 * per pair slot (slots past the valid count exit), one thread per 16-element block. Stores q * sf (exact in
 * BF16): the 1 / gs factor is applied after GEMM1. */
__global__ void __launch_bounds__(128) k3_moe_quant_x_kernel(const moe_params P) {
    k3_pdl_wait();
    k3_pdl_launch();
    const int32_t pp = blockIdx.x;
    if (pp >= __ldcg(P.offs + P.ne)) return;
    const int32_t pair = __ldcg(P.list + pp), e = __ldg(P.ids + pair);
    const float gs = 1.0f / __ldg(P.w13_in + e);
    const uint16_t *xr = P.x + (int64_t)(pair / P.top_k) * P.L;
    uint16_t *out = const_cast<uint16_t *>(P.xq) + (int64_t)pp * P.L;
    for (int64_t b = threadIdx.x; b < P.L / 16; b += blockDim.x) {
        float v[16], amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            v[i] = k3_bf16_bits_to_f32(__ldg(xr + b * 16 + i));
            const float a = fabsf(v[i]);
            amax = a > amax ? a : amax;
        }
        const float sf = k3_e4m3_decode(k3_e4m3_encode(__fdiv_rn(__fmul_rn(gs, amax), 6.0f)));
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const float qv = sf == 0.0f ? 0.0f : __fmul_rn(e2m1f(k3_e2m1_encode(__fdiv_rn(__fmul_rn(v[i], gs), sf))), sf);
            out[b * 16 + i] = k3_f32_to_bf16_bits(qv);
        }
    }
}

/* out[t, c] = bf16(sum over slots j in order of pair_out[t * top_k + j, c]); ids outside [0, E) add nothing.
 * The loads of up to COMBINE_BATCH slots go out before their adds (a loop over slots with a data-dependent skip
 * waited for each load in turn; session 19), and the first batch's ids are read before the PDL wait (session 22). */
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
 * ids: in the first batch (top_k <= 16) ptxas then issues all 16 before the first add (SASS; predicated on the ids
 * it issued them in three groups, i.e. three round trips after GEMM2). */
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
    if (idx >= m * P.L) return;
    const int64_t t = idx / P.L, c = idx % P.L;
    /* The first slots' ids before the PDL wait: topk_ids is the caller's, complete before this call's first kernel
     * (the dispatch, or the folded GEMM1) began, as that kernel is launched plainly; so after the wait only the
     * pair_out loads remain (one round trip instead of two) */
    const uint32_t ok0 = combine_ok(P, t, 0);
    k3_pdl_wait();
    float s = combine_add(P, t, c, 0, ok0, 0.0f);
    for (int j0 = COMBINE_BATCH; j0 < P.top_k; j0 += COMBINE_BATCH) s = combine_add(P, t, c, j0, combine_ok(P, t, j0), s);
    out[idx] = k3_f32_to_bf16_bits(s);
    if (out_f32) out_f32[idx] = s;
}

size_t align_up(size_t v) { return (v + (ALIGN - 1)) & ~(size_t)(ALIGN - 1); }
/* a and pair_out start on 64 KB boundaries of the device address space (the workspace base is aligned so too) */
constexpr size_t ALIGN_BUF = 65536;
size_t align_buf(size_t v) { return (v + (ALIGN_BUF - 1)) & ~(size_t)(ALIGN_BUF - 1); }

/* The dispatch path's block rows (units) for `np` pairs in runs of at most `tpu` (k3_cuda_moe_dispatch): one per
 * touched expert, plus at most np / tpu more. The workspace is sized for the smallest tpu (8), shape_of's grids
 * for the call's. */
int64_t max_units(int64_t e, int64_t np, int64_t tpu) { return (e < np ? e : np) + np / tpu; }

/* The carve-up of the device workspace (offsets from its ALIGN_BUF-aligned start). */
struct ws_layout {
    size_t offs, cur, active, act_off, n_active, list, wsort, xq, a, pair_out, total;
};

ws_layout layout_of(const k3_cuda_moe *p) {
    const k3_moe_desc *d = &p->d;
    const size_t e = (size_t)d->num_experts, np = (size_t)(d->max_tokens * d->top_k);
    ws_layout s;
    size_t o = 0;
    s.offs = o, o += align_up((e + 1) * 4);
    s.cur = o, o += align_up(e * 4);
    s.n_active = o, o += align_up(4);
    s.list = o, o += align_up(np * 4);
    s.xq = o, o += d->mode == K3_MOE_W4A4 ? align_up(np * (size_t)d->hidden * 2) : 0;
    o = align_buf(o);
    s.a = o, o += align_up(np * (size_t)d->inter * 2);
    o = align_buf(o);
    s.pair_out = o, o += align_up(np * (size_t)d->hidden * 4);
    /* the dispatch's units, last: inserted before n_active, act_off shifted a and pair_out by 3.75 KB, and TP8 m
     * 2-4 ran 1.3-2.7 us slower (session 19, same call, bitwise the same work): the buffers' placement matters */
    const size_t units = (size_t)max_units((int64_t)e, (int64_t)np, 8);
    s.active = o, o += align_up(units * 4);
    s.act_off = o, o += align_up((units + 1) * 4);
    s.wsort = o, o += align_up(np * 4);
    s.total = o;
    return s;
}

/* GEMM1 launch: with PDL behind the dispatch (or W4A4 quantization); plainly when it is the call's first kernel
 * (fold), fully ordered after whatever the caller ran, as the dispatch kernel is (the combine reads topk_ids before
 * its PDL wait: pdl.cuh). */
cudaError_t launch_g1(void (*kernel)(moe_params), dim3 grid, size_t smem, bool fold, cudaStream_t s,
                      const moe_params &P) {
    if (!fold) return k3_launch_pdl(kernel, grid, dim3(G1_WARPS * 32), smem, s, P);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = dim3(G1_WARPS * 32), cfg.dynamicSmemBytes = smem, cfg.stream = s;
    return cudaLaunchKernelEx(&cfg, kernel, P);
}

/* The cp.async instances (NVFP4): their ring, plus the routing state when the launch folds. Paired tiles
 * (shape_of) exist for the gated NT 1 kernel only. */
template <bool GATED, int NT, bool PAIR>
cudaError_t launch_g1_async_p(dim3 grid, bool fold, const moe_params &P, cudaStream_t s) {
    constexpr int SETS = GATED && !PAIR ? 2 : 1;
    return fold ? launch_g1(k3_moe_gemm1_kernel<FMT_NVFP4, GATED, NT, true, true, PAIR>, grid,
                            g1_smem_bytes<SETS, true>(), true, s, P)
                : launch_g1(k3_moe_gemm1_kernel<FMT_NVFP4, GATED, NT, true, false, PAIR>, grid,
                            g1_smem_bytes<SETS, false>(), false, s, P);
}
/* The early-routing instance (NT 1, unpaired, unfolded): its routing state follows the ring, as the fold's. */
template <bool GATED>
constexpr auto g1_early_kernel = k3_moe_gemm1_kernel<FMT_NVFP4, GATED, 1, true, false, false, true>;
template <bool GATED, int NT>
cudaError_t launch_g1_async(dim3 grid, bool fold, bool pair, bool early, const moe_params &P, cudaStream_t s) {
    if (early) { /* shape_of: NT 1, unfolded, unpaired */
        if constexpr (NT == 1)
            if (!fold && !pair)
                return launch_g1(g1_early_kernel<GATED>, grid, g1_smem_bytes<GATED ? 2 : 1, true>(), false, s, P);
        return cudaErrorInvalidValue;
    }
    if constexpr (GATED && NT == 1)
        if (pair) return launch_g1_async_p<GATED, NT, true>(grid, fold, P, s);
    if (pair) return cudaErrorInvalidValue;
    return launch_g1_async_p<GATED, NT, false>(grid, fold, P, s);
}
/* One cp.async GEMM2 instance: its ring, plus the routing state when it folds. */
template <int NT, int KS, int MINB, bool FOLD, bool DIRECT, int TILES = 1>
constexpr auto g2_async_kernel = k3_moe_gemm2_kernel<FMT_NVFP4, NT, KS, true, FOLD, MINB, DIRECT, TILES>;
template <int NT, int KS, int MINB, bool FOLD, int TILES = 1>
cudaError_t launch_g2_one(dim3 grid, const moe_params &P, cudaStream_t s) {
    const size_t smem = g2_smem_bytes<NT, KS, FOLD, TILES>();
    const dim3 block(g2_warps<KS>() * 32);
    return P.direct ? k3_launch_pdl(g2_async_kernel<NT, KS, MINB, FOLD, true, TILES>, grid, block, smem, s, P)
                    : k3_launch_pdl(g2_async_kernel<NT, KS, MINB, FOLD, false, TILES>, grid, block, smem, s, P);
}
template <int NT, int KS, int MINB = 0>
cudaError_t launch_g2_async(dim3 grid, bool fold, const moe_params &P, cudaStream_t s) {
    return fold ? launch_g2_one<NT, KS, MINB, true>(grid, P, s) : launch_g2_one<NT, KS, MINB, false>(grid, P, s);
}
/* The dense NT 1 instances (shape_of): KS 1 only past two waves, where the fold never applies (its grids are
 * at most FOLD_WAVES waves), so that instance exists unfolded only. */
template <int KS>
cudaError_t launch_g2_dense(dim3 grid, bool fold, const moe_params &P, cudaStream_t s) {
    if constexpr (KS == 1) return fold ? cudaErrorInvalidValue : launch_g2_one<1, 1, G2_DENSE_K1, false>(grid, P, s);
    else return launch_g2_async<1, KS, G2_DENSE_SPLIT>(grid, fold, P, s);
}

/* fold: shape_of folds only where both GEMMs take the cp.async ring, so the other instances never fold. */
template <int FMT, bool GATED>
cudaError_t launch_gemm1_nt(int nt, bool async, bool fold, bool pair, bool early, dim3 grid, const moe_params &P,
                            cudaStream_t s) {
    if constexpr (FMT == FMT_NVFP4) {
        if (async && nt == 1) return launch_g1_async<GATED, 1>(grid, fold, pair, early, P, s);
        if (async && nt == 2) return launch_g1_async<GATED, 2>(grid, fold, pair, early, P, s);
    }
    if (fold || pair || early) return cudaErrorInvalidValue;
    if (nt == 1) return launch_g1(k3_moe_gemm1_kernel<FMT, GATED, 1, false, false, false>, grid, 0, false, s, P);
    if (nt == 2) return launch_g1(k3_moe_gemm1_kernel<FMT, GATED, 2, false, false, false>, grid, 0, false, s, P);
    return launch_g1(k3_moe_gemm1_kernel<FMT, GATED, 4, false, false, false>, grid, 0, false, s, P);
}

template <int FMT, int KS>
cudaError_t launch_gemm2_nt(int nt, bool async, bool fold, bool dense, dim3 grid, const moe_params &P,
                            cudaStream_t s) {
    if constexpr (FMT == FMT_NVFP4) {
        if (async && nt == 1 && dense) return launch_g2_dense<KS>(grid, fold, P, s);
        if (async && nt == 1) return launch_g2_async<1, KS>(grid, fold, P, s);
        if (async && nt == 2) return launch_g2_async<2, KS>(grid, fold, P, s);
    }
    if (fold || dense || P.direct) return cudaErrorInvalidValue; /* shape_of: cp.async instances only */
    const dim3 block(G2_WARPS * 32);
    if (nt == 1) return k3_launch_pdl(k3_moe_gemm2_kernel<FMT, 1, KS, false, false>, grid, block, 0, s, P);
    if (nt == 2) return k3_launch_pdl(k3_moe_gemm2_kernel<FMT, 2, KS, false, false>, grid, block, 0, s, P);
    return k3_launch_pdl(k3_moe_gemm2_kernel<FMT, 4, KS, false, false>, grid, block, 0, s, P);
}

/* The launch shapes of one call (host-only: from m, the descriptor and the scale pointers' alignment). */
struct launch_shape {
    int nt;             /* token tiles per pass */
    bool gated, g2_split, as1, as2;
    dim3 g1, g2;
    bool fold;          /* the GEMMs route themselves (no dispatch kernel) */
    bool pair;          /* GEMM1 blocks of 8 outputs, gate and up rows in one tile (k3_moe_gemm1_kernel PAIR) */
    bool early;         /* GEMM1's first wave routes itself from topk_ids (k3_moe_gemm1_kernel EARLY) */
    int64_t early_blocks; /* that wave: blocks per SM (launch bounds) x SMs */
    bool wide;          /* GEMM2 split-K over G2_WIDE_KS warps (256-thread blocks) */
    bool g2_dense;      /* GEMM2 at NT 1 in its denser instance (G2_DENSE_SPLIT / G2_DENSE_K1 blocks per SM) */
    bool direct;        /* top_k 1 with the cp.async GEMM2: it writes out itself, no combine kernel */
    int32_t g2_tiles;   /* GEMM2 KS 1 row tiles per warp: 1, or 2 / 4 (G2_T2_MINB) */
    int32_t tpu;        /* the dispatch's tokens per unit (its pairs per unit) */
};

/* GEMM1 and (with_g2) GEMM2 of one call. The cp.async ring, the fold, paired tiles and the wide split exist only
 * for NVFP4; shape_of sets them only there. */
template <int FMT>
cudaError_t launch_fmt(const launch_shape &sh, bool with_g2, const moe_params &P, cudaStream_t s) {
    cudaError_t err = sh.gated ? launch_gemm1_nt<FMT, true>(sh.nt, sh.as1, sh.fold, sh.pair, sh.early, sh.g1, P, s)
                               : launch_gemm1_nt<FMT, false>(sh.nt, sh.as1, sh.fold, sh.pair, sh.early, sh.g1, P, s);
    if (err != cudaSuccess || !with_g2) return err;
    if (sh.g2_tiles > 1) { /* shape_of: NVFP4 cp.async, NT 1, KS 1, unfolded */
        if constexpr (FMT == FMT_NVFP4)
            return sh.g2_tiles == 4 ? launch_g2_one<1, 1, G2_T4_MINB, false, 4>(sh.g2, P, s)
                                    : launch_g2_one<1, 1, G2_T2_MINB, false, 2>(sh.g2, P, s);
        return cudaErrorInvalidValue;
    }
    if (sh.wide) { /* shape_of: NVFP4 cp.async, NT 1, split K */
        if constexpr (FMT == FMT_NVFP4)
            if (sh.as2 && sh.nt == 1 && sh.g2_split) return launch_g2_async<1, G2_WIDE_KS>(sh.g2, sh.fold, P, s);
        return cudaErrorInvalidValue;
    }
    return sh.g2_split ? launch_gemm2_nt<FMT, G2_WARPS>(sh.nt, sh.as2, sh.fold, sh.g2_dense, sh.g2, P, s)
                       : launch_gemm2_nt<FMT, 1>(sh.nt, sh.as2, sh.fold, sh.g2_dense, sh.g2, P, s);
}

/* The cp.async kernels use more than the default 48 KB of dynamic shared memory: allowed once per plan, for the
 * ring alone and (the FOLD instances) the ring plus the routing state. */
cudaError_t allow_smem(void (*kernel)(moe_params), size_t bytes) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}
template <bool GATED, int NT>
cudaError_t allow_g1(void) {
    constexpr int SETS = GATED ? 2 : 1;
    cudaError_t e =
        allow_smem(k3_moe_gemm1_kernel<FMT_NVFP4, GATED, NT, true, false, false>, g1_smem_bytes<SETS, false>());
    if (e == cudaSuccess)
        e = allow_smem(k3_moe_gemm1_kernel<FMT_NVFP4, GATED, NT, true, true, false>, g1_smem_bytes<SETS, true>());
    if constexpr (NT == 1)
        if (e == cudaSuccess) e = allow_smem(g1_early_kernel<GATED>, g1_smem_bytes<SETS, true>());
    return e;
}
template <int NT, int KS, int MINB, bool FOLD, int TILES = 1>
cudaError_t allow_g2_one(void) {
    const size_t smem = g2_smem_bytes<NT, KS, FOLD, TILES>();
    const cudaError_t e = allow_smem(g2_async_kernel<NT, KS, MINB, FOLD, false, TILES>, smem);
    return e != cudaSuccess ? e : allow_smem(g2_async_kernel<NT, KS, MINB, FOLD, true, TILES>, smem);
}
template <int NT, int KS, int MINB = 0>
cudaError_t allow_g2(void) {
    const cudaError_t e = allow_g2_one<NT, KS, MINB, false>();
    return e != cudaSuccess ? e : allow_g2_one<NT, KS, MINB, true>();
}
cudaError_t allow_async_smem(void) {
    cudaError_t e = allow_g1<true, 1>();
    if (e == cudaSuccess) e = allow_g1<true, 2>();
    if (e == cudaSuccess) e = allow_g1<false, 1>();
    if (e == cudaSuccess) e = allow_g1<false, 2>();
    if (e == cudaSuccess) e = allow_g2<1, 1>();
    if (e == cudaSuccess) e = allow_g2<2, 1>();
    if (e == cudaSuccess) e = allow_g2<1, G2_WARPS>();
    if (e == cudaSuccess) e = allow_g2<1, G2_WARPS, G2_DENSE_SPLIT>();
    if (e == cudaSuccess) e = allow_g2_one<1, 1, G2_DENSE_K1, false>(); /* unfolded only (launch_g2_dense) */
    if (e == cudaSuccess) e = allow_g2<2, G2_WARPS>();
    if (e == cudaSuccess) e = allow_g2<1, G2_WIDE_KS>();
    if (e == cudaSuccess) e = allow_g2_one<1, 1, G2_T2_MINB, false, 2>();
    if (e == cudaSuccess) e = allow_g2_one<1, 1, G2_T4_MINB, false, 4>();
    return e;
}

/* The cp.async ring copies the 4-byte word holding a lane's two NVFP4 scale bytes: those words must be
 * aligned (swizzled layout: always; linear: cols / 16 a multiple of 4 and an aligned base). */
bool async_ok(int32_t layout, int64_t cols, const void *scales) {
    return ((uintptr_t)scales & 3u) == 0 && ((k3_scale_layout)layout == K3_SCALE_SWIZZLED || (cols / 16) % 4 == 0);
}

/* The fold costs every block a longer prologue (the ids load, the bitmap, the scan, barriers: ~1 us per block
 * under load), paid once per wave of blocks, against one dispatch kernel less. Measured (session 14b, H200):
 * grids of <= 1.5 waves gained (EP16 M 1 -3.6 us, M 4 -1.0 to -1.4, TP8 M 1 -1.1), grids of >= 2.9 waves lost
 * (TP8 M 4 +3.4 us, EP16 M 16 +7.7, TP8 M 16 +43). So: only where GEMM1 and GEMM2 each fit FOLD_WAVES waves
 * (blocks per SM as their launch bounds). Host-only and independent of the routing (graph capturable). */
constexpr int FOLD_WAVES = 2;

/* GEMM1's early routing (shape_of: its first wave routes itself while the dispatch kernel runs) only where GEMM1's
 * grid is at most this many waves. Measured (session 22, H200, same-call A/B, two runs): TP8 M 2 / 3 / 4 / 8 -2.3 /
 * -1.3 / -1.1 / -1.0 us (GEMM1 grids of 1.5-5.9 waves), EP16 M 8 / 12 / 16 -1.3 / -0.3..-0.9 / -0.4..-0.6 (3.3-6.5
 * waves); TP8 M 12 (9.8 waves) +-0.8; but TP8 M 16 +0.9..+1.7 and EP16 M 32 / 64 +0.7..+2.0 / +2.3..+4.0 (13-23
 * waves): the gain is a fixed amount, the cost grows with the waves. */
constexpr int EARLY_WAVES = 8;

/* Tokens per pass of the cp.async ring kernels (session 19, H200, `k3 bench moe`, graph replay, random routing unless
 * `--hot`, which gives one expert every token). At decode the touched experts have 1-2 tokens each, so a wider tile
 * only costs registers (GEMM1 NT 2: 162, 3 blocks per SM; NT 1: 122, 4):
 *   - NT 1 instead of NT 2 at m 12 / 16: TP8 182.8 / 236.7 -> 148.3 / 188.7 us, EP16 88.5 / 110.6 -> 80.1 / 92.3;
 *     instead of the register ring's NT 4 at m 24 - 64: 2.3-2.4x faster.
 *   - Hot, NT 1 pays extra passes: TP8 is still faster everywhere, but EP16 (one expert touched) went 34.6 / 39.4 ->
 *     51.7 / 55.3 us at m 12 / 16 (against NT 2) and 140 / 169 -> 152 / 200 at m 48 / 64 (against NT 4).
 *   - Past m 64, NT 1 is still 10-20% faster than NT 2 up to m 256 (random), but 1.6x slower hot on EP16; so NT 2.
 *   - NT 2 beat the register ring's NT 4 at every m measured, 96 to 4096, random and hot (m 4096: TP8 13.05 -> 7.63
 *     ms, EP16 6.01 -> 3.50 ms). The NT 4 kernels stay for what the cp.async ring cannot take (MXFP4, BF16, and
 *     NVFP4 scales whose words are not aligned). */
constexpr int64_t NT1_MAX_M = 64;

/* GEMM2's block rows at KS 1: L / 16 row tiles, `tiles` per warp, G2_WARPS warps per block. */
int64_t g2_block_rows(int64_t hidden, int tiles) { return (hidden / 16 + tiles * G2_WARPS - 1) / (tiles * G2_WARPS); }

/* `no`: the K3_CUDA_MOE_NO_* bits of k3_cuda_moe_run_stages (tests: the same call in another launch shape), else 0. */
launch_shape shape_of(const k3_cuda_moe *p, int32_t sm_count, int64_t m, const k3_moe_weights *w, int32_t no) {
    const bool no_fold = (no & K3_CUDA_MOE_NO_FOLD) != 0, no_pair = (no & K3_CUDA_MOE_NO_PAIR) != 0;
    const bool no_t2 = (no & K3_CUDA_MOE_NO_T2) != 0, no_early = (no & K3_CUDA_MOE_NO_EARLY) != 0;
    const k3_moe_desc *d = &p->d;
    const int32_t np = (int32_t)(m * d->top_k);
    const int32_t slots = np < d->num_experts ? np : d->num_experts;
    launch_shape sh;
    /* NVFP4 with aligned scale words (per GEMM): the cp.async ring (NT <= 2) is possible */
    const bool nv = d->format == K3_WEIGHT_NVFP4;
    const bool al1 = nv && async_ok((int32_t)d->scale_layout, d->hidden, w->w13_scale);
    const bool al2 = nv && async_ok((int32_t)d->scale_layout, d->inter, w->w2_scale);
    const bool nv_ok = al1 && al2;
    /* token tiles per pass (8 tokens each); an expert with more tokens takes more passes. The register-ring kernels
     * cover every expert's tokens in one pass up to m 16 (a token's ids being distinct); the cp.async ring runs
     * NT 1 through m NT1_MAX_M and NT 2 past it (measured: NT1_MAX_M). */
    sh.nt = nv_ok ? (m <= NT1_MAX_M ? 1 : 2) : (m <= 8 ? 1 : (m <= 16 ? 2 : 4));
    sh.gated = d->act.kind != K3_ACT_RELU2_NO_MUL;
    sh.g1 = dim3((unsigned)slots, (unsigned)(d->inter / 16));
    /* GEMM2 splits K across the block's warps when K has at least 2 chunks of 128 per warp (EP16: I = 3072):
     * 4x the blocks (one expert alone then fills the GPU) and a quarter of the serial chunk walk per warp */
    sh.g2_split = d->inter / 128 >= 2 * G2_WARPS;
    sh.g2 = dim3((unsigned)slots,
                 (unsigned)(sh.g2_split ? d->hidden / 16 : g2_block_rows(d->hidden, 1)));
    /* NVFP4 at decode sizes (NT <= 2): the cp.async ring where the scale words are aligned */
    sh.as1 = al1 && sh.nt <= 2;
    sh.as2 = al2 && sh.nt <= 2;
    const int64_t sms = sm_count > 0 ? sm_count : 132;
    const int64_t per1 = g1_min_blocks(sh.as1, sh.nt);
    const int64_t per2 = g2_min_blocks(sh.as2, sh.nt, sh.g2_split ? G2_WARPS : 1);
    /* GEMM1 in paired tiles (8 outputs per block) where twice the blocks still fit one wave: each warp's serial
     * chunk walk halves at no cost in waves (EP16 M 1: 384 blocks on 528 slots; GEMM1 -1.4 us, session 17). Not at
     * W4A4: its requantization needs a block's 16 outputs (one NVFP4 block) in one half-warp. */
    sh.pair = !no_pair && sh.gated && sh.as1 && sh.nt == 1 && d->mode != K3_MOE_W4A4 &&
              (int64_t)sh.g1.x * (d->inter / 8) <= sms * per1;
    if (sh.pair) sh.g1.y = (unsigned)(d->inter / 8);
    /* GEMM2 split over twice the warps where its grid is at most 2 blocks per SM (EP16 M 1: 224 blocks; GEMM2
     * -1.0 us, session 17). Its sum has 8 terms instead of 4: not bitwise the 4-warp result. */
    sh.wide = sh.g2_split && sh.as2 && sh.nt == 1 && (int64_t)sh.g2.x * sh.g2.y <= 2 * sms;
    const int64_t blocks2 = (int64_t)sh.g2.x * sh.g2.y;
    const bool small = (int64_t)sh.g1.x * sh.g1.y <= FOLD_WAVES * sms * per1 && blocks2 <= FOLD_WAVES * sms * per2;
    sh.fold = !no_fold && d->mode != K3_MOE_W4A4 && sh.as1 && sh.as2 && np <= FOLD_NP && d->num_experts <= FOLD_E &&
              small;
    /* Denser GEMM2 blocks where the default's grid spills past a wave (session 18, same-call A/B on the H200):
     * split-K over one wave (EP16 M 3, 672 blocks on 660 slots: -2.2 us; M 4 -0.7; M 8 -0.3); KS 1 over two
     * waves (TP8 M 2 / 3 / 4 / 8: -0.6 / -1.1 / -0.7 / -2.0 us), which never folds (FOLD_WAVES). Not nearer: the
     * 7-block split-K kernel made EP16 M 2 (448 blocks) 2.5 us slower, the 8-block KS 1 kernel TP8 M 1 (896
     * blocks) 1 us slower. The KS 1 one runs only where several row tiles per warp do not (g2_tiles below). */
    sh.g2_dense = sh.as2 && sh.nt == 1 && !sh.wide && blocks2 > (sh.g2_split ? 1 : 2) * sms * per2 &&
                  (sh.g2_split || !sh.fold);
    /* top_k 1: one slot per token, so the combine is a conversion that GEMM2 can do in its epilogue (EP16 M 1-8
     * -0.6..-1.0 us, session 18); only the cp.async GEMM2 has that instance (decode sizes) */
    sh.direct = d->top_k == 1 && sh.as2;
    /* The dispatch path: one block row per unit, an expert's pairs in runs of one pass (8 * NT), so an expert with
     * more tokens than a pass takes is spread over blocks, not passes of one block (session 19: EP16 with one
     * expert touched, m 12 / 16 / 64: 51.9 / 55.6 / 201.8 -> 32.2 / 35.0 / 82.5 us). That costs the grid
     * pairs / (8 * NT) more slots (blocks that exit at once: TP8 m 64 +2-3%), so only where m > 8 * NT, i.e. where
     * distinct ids can give an expert more than a pass; below, a unit is a whole expert (duplicate ids: passes).
     * The fold keeps one slot per touched expert and its passes (small grids only). */
    sh.tpu = m > 8 * sh.nt ? 8 * sh.nt : (np > 0 ? np : 1);
    if (!sh.fold) sh.g1.x = sh.g2.x = (unsigned)max_units(d->num_experts, np, sh.tpu);
    /* Where the dispatch kernel stays (grids past FOLD_WAVES), GEMM1's first wave finds its unit from topk_ids
     * itself (fold_find, fold_list; topk_ids is complete, the dispatch kernel being launched plainly) before its PDL
     * wait, so its weights stream while the dispatch runs; a block whose expert has more pairs than a unit (tpu)
     * takes the dispatch's unit after its wait instead (then the units are not the experts). Only the first wave
     * (blocks per SM as the launch bounds x SMs): a later block would pay that prologue after the dispatch has
     * finished (the fold's lesson, FOLD_WAVES); and only for grids of at most EARLY_WAVES waves (measured). */
    sh.early = !no_early && !sh.fold && !sh.pair && d->mode != K3_MOE_W4A4 && sh.as1 && sh.nt == 1 && np <= FOLD_NP &&
               d->num_experts <= FOLD_E && (int64_t)sh.g1.x * sh.g1.y <= EARLY_WAVES * sms * per1;
    sh.early_blocks = sh.early ? sms * per1 : 0;
    /* Two or four row tiles per warp in the unfolded KS 1 NT 1 cp.async GEMM2 (G2_T2_MINB: TP8 M 2-64 -0.7..-16 us
     * against one), four where the two-tile grid is more than G2_T4_WAVES waves. They replace the KS 1 dense instance
     * too (g2_dense above), which then runs only with one tile (K3_CUDA_MOE_NO_T2: tests compare bitwise). */
    sh.g2_tiles = 1;
    if (!no_t2 && !sh.g2_split && sh.as2 && sh.nt == 1 && !sh.fold && !sh.wide) {
        const bool four = d->hidden % 64 == 0 &&
                          (int64_t)sh.g2.x * g2_block_rows(d->hidden, 2) > G2_T4_WAVES * sms * G2_T2_MINB;
        sh.g2_tiles = four ? 4 : 2;
        sh.g2.y = (unsigned)g2_block_rows(d->hidden, sh.g2_tiles);
    }
    return sh;
}

} // namespace

extern "C" int k3_cuda_moe_folds(const k3_ctx *ctx, const k3_cuda_moe *p, int64_t m, const k3_moe_weights *w) {
    return shape_of(p, ctx->arch.sm_count, m, w, 0).fold ? 1 : 0;
}

extern "C" int k3_cuda_moe_pairs(const k3_ctx *ctx, const k3_cuda_moe *p, int64_t m, const k3_moe_weights *w) {
    return shape_of(p, ctx->arch.sm_count, m, w, 0).pair ? 1 : 0;
}

extern "C" int k3_cuda_moe_g2_tiles(const k3_ctx *ctx, const k3_cuda_moe *p, int64_t m, const k3_moe_weights *w) {
    return shape_of(p, ctx->arch.sm_count, m, w, 0).g2_tiles;
}

extern "C" int k3_cuda_moe_early(const k3_ctx *ctx, const k3_cuda_moe *p, int64_t m, const k3_moe_weights *w) {
    return shape_of(p, ctx->arch.sm_count, m, w, 0).early ? 1 : 0;
}

extern "C" k3_status k3_cuda_moe_prepare(k3_ctx *ctx, k3_cuda_moe *p, const k3_moe_desc *d) {
    memset(p, 0, sizeof *p);
    p->d = *d;
    const int64_t l = d->hidden, inter = d->inter;
    if (l % 32 != 0 || inter % 32 != 0)
        return k3_fail(ctx, K3_STATUS_UNSUPPORTED,
                       "moe plan: the CUDA kernels need hidden (L) and inter (I) to be multiples of 32 (got L = %lld, "
                       "I = %lld)",
                       (long long)l, (long long)inter);
    if (inter / 16 > 65535 || l / 16 > 65535)
        return k3_fail(ctx, K3_STATUS_UNSUPPORTED, "moe plan: L = %lld or I = %lld is too large for the CUDA grid",
                       (long long)l, (long long)inter);
    if ((int64_t)d->max_tokens * d->top_k > INT32_MAX / 2)
        return k3_fail(ctx, K3_STATUS_UNSUPPORTED, "moe plan: max_tokens * top_k is too large for the CUDA kernels");
    p->w1_rows = k3_act_width_factor(d->act.kind) * inter;
    if (d->format == K3_WEIGHT_NVFP4) {
        const cudaError_t e = allow_async_smem();
        if (e != cudaSuccess)
            return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "moe plan: cannot raise the shared-memory limit of the NVFP4 "
                           "expert kernels: %s", cudaGetErrorString(e));
    }
    if (d->format == K3_WEIGHT_BF16) {
        p->w13_expert_bytes = (size_t)(p->w1_rows * l) * 2u;
        p->w2_expert_bytes = (size_t)(l * inter) * 2u;
        return K3_STATUS_SUCCESS;
    }
    const k3_fp4_format fmt = d->format == K3_WEIGHT_NVFP4 ? K3_FP4_NVFP4 : K3_FP4_MXFP4;
    p->w13_expert_bytes = (size_t)(p->w1_rows * l / 2);
    p->w2_expert_bytes = (size_t)(l * inter / 2);
    k3_status st = k3_fp4_scale_bytes(fmt, d->scale_layout, p->w1_rows, l, &p->w13_scale_bytes);
    if (st == K3_STATUS_SUCCESS) st = k3_fp4_scale_bytes(fmt, d->scale_layout, l, inter, &p->w2_scale_bytes);
    if (st != K3_STATUS_SUCCESS) return k3_fail(ctx, st, "moe plan: cannot size the block scales");
    return K3_STATUS_SUCCESS;
}

extern "C" size_t k3_cuda_moe_ws_bytes(const k3_cuda_moe *p) { return layout_of(p).total + ALIGN_BUF; }

extern "C" k3_status k3_cuda_moe_run(k3_ctx *ctx, const k3_cuda_moe *p, int64_t m, const void *x,
                                     const int32_t *topk_ids, const float *topk_weights, const k3_moe_weights *w,
                                     void *out, float *out_f32, void *ws, void *stream) {
    return k3_cuda_moe_run_stages(ctx, p, m, x, topk_ids, topk_weights, w, out, out_f32, ws, stream,
                                  K3_CUDA_MOE_STAGE_ALL);
}

extern "C" k3_status k3_cuda_moe_run_stages(k3_ctx *ctx, const k3_cuda_moe *p, int64_t m, const void *x,
                                            const int32_t *topk_ids, const float *topk_weights,
                                            const k3_moe_weights *w, void *out, float *out_f32, void *ws,
                                            void *stream, int32_t stages) {
    const k3_moe_desc *d = &p->d;
    cudaStream_t s = (cudaStream_t)stream;
    const int32_t no = stages & (K3_CUDA_MOE_NO_FOLD | K3_CUDA_MOE_NO_PAIR | K3_CUDA_MOE_NO_T2 | K3_CUDA_MOE_NO_EARLY);
    stages &= ~no;
    const ws_layout L = layout_of(p);
    uint8_t *base = (uint8_t *)(((uintptr_t)ws + (ALIGN_BUF - 1)) & ~(uintptr_t)(ALIGN_BUF - 1));
    const int32_t np = (int32_t)(m * d->top_k);

    /* 16-byte loads: the weight bases (every expert's slice and row is then aligned, L and I being multiples
     * of 32) and x */
    if ((((uintptr_t)w->w13 | (uintptr_t)w->w2 | (uintptr_t)x) & 15u) != 0)
        return k3_fail(ctx, K3_STATUS_INVALID_ARGUMENT, "moe run: x, w13 and w2 must be 16-byte aligned on CUDA");

    {
        const void *ptrs[] = {x, topk_ids, topk_weights, out, out_f32, ws, w->w13, w->w2, w->w13_scale, w->w2_scale,
                              w->w13_scale_2, w->w2_scale_2, w->w13_input_scale, w->w2_input_scale};
        const char *names[] = {"x", "topk_ids", "topk_weights", "out", "out_f32", "ws", "w13", "w2", "w13_scale",
                               "w2_scale", "w13_scale_2", "w2_scale_2", "w13_input_scale", "w2_input_scale"};
        K3_TRY(k3_cuda_check_device_ptrs(ctx, stream, "moe run", (int32_t)(sizeof ptrs / sizeof ptrs[0]), ptrs, names));
    }
    moe_params P;
    memset(&P, 0, sizeof P);
    P.L = d->hidden, P.I = d->inter;
    P.top_k = d->top_k, P.ne = d->num_experts, P.layout = (int32_t)d->scale_layout;
    P.sep = d->w13_separate_scale_2, P.interleaved = d->act.kind == K3_ACT_SWIGLUOAI, P.w4a4 = d->mode == K3_MOE_W4A4;
    P.act = d->act;
    P.x = (const uint16_t *)x, P.ids = topk_ids, P.wts = topk_weights;
    P.offs = (const int32_t *)(base + L.offs), P.active = (const int32_t *)(base + L.active);
    P.act_off = (const int32_t *)(base + L.act_off);
    P.n_active = (const int32_t *)(base + L.n_active), P.list = (const int32_t *)(base + L.list);
    P.wsort = (const float *)(base + L.wsort);
    P.xq = P.w4a4 ? (const uint16_t *)(base + L.xq) : nullptr;
    P.a = (uint16_t *)(base + L.a);
    P.pair_out = (float *)(base + L.pair_out);
    P.out = (uint16_t *)out, P.out_f32 = out_f32;
    P.w13 = (const uint8_t *)w->w13, P.w13s = (const uint8_t *)w->w13_scale;
    P.w2 = (const uint8_t *)w->w2, P.w2s = (const uint8_t *)w->w2_scale;
    P.w13_eb = p->w13_expert_bytes, P.w13_sb = p->w13_scale_bytes;
    P.w2_eb = p->w2_expert_bytes, P.w2_sb = p->w2_scale_bytes;
    P.w13_s2 = w->w13_scale_2, P.w2_s2 = w->w2_scale_2, P.w13_in = w->w13_input_scale, P.w2_in = w->w2_input_scale;

    /* decode sizes (W4A16, grids of about a wave: shape_of): no dispatch kernel, the GEMMs route themselves
     * (fold_find); prefill, many-wave grids and W4A4 (its quantization kernel reads the lists) keep it, and so
     * does K3_CUDA_MOE_NO_FOLD (tests). The stage cut after the dispatch still runs the kernel alone, for
     * reference: with the fold it is not part of the call. */
    const launch_shape sh = shape_of(p, ctx->arch.sm_count, m, w, no);
    P.np = np;
    P.direct = sh.direct;
    P.early_blocks = sh.early_blocks;
    P.tpu = sh.tpu;
    if (!sh.fold || stages <= K3_CUDA_MOE_STAGE_DISPATCH)
        K3_TRY(k3_cuda_moe_dispatch(ctx, topk_ids, np, d->num_experts, sh.tpu, (int32_t *)(base + L.offs),
                                    (int32_t *)(base + L.cur), (int32_t *)(base + L.active),
                                    (int32_t *)(base + L.act_off), (int32_t *)(base + L.n_active),
                                    (int32_t *)(base + L.list), topk_weights, (float *)(base + L.wsort), stream));
    if (stages <= K3_CUDA_MOE_STAGE_DISPATCH) return K3_STATUS_SUCCESS;
    if (P.w4a4) {
        const cudaError_t qe = k3_launch_pdl(k3_moe_quant_x_kernel, dim3((unsigned)np), dim3(128), 0, s, P);
        if (qe != cudaSuccess)
            return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of the moe W4A4 x quantization kernel failed: %s",
                           cudaGetErrorString(qe));
    }
    const bool g2 = stages >= K3_CUDA_MOE_STAGE_GEMM2;
    cudaError_t err = d->format == K3_WEIGHT_NVFP4   ? launch_fmt<FMT_NVFP4>(sh, g2, P, s)
                      : d->format == K3_WEIGHT_MXFP4 ? launch_fmt<FMT_MXFP4>(sh, g2, P, s)
                                                     : launch_fmt<FMT_BF16>(sh, g2, P, s);
    if (err != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of the moe expert GEMMs failed: %s", cudaGetErrorString(err));
    if (stages < K3_CUDA_MOE_STAGE_ALL || P.direct) return K3_STATUS_SUCCESS;
    const int64_t total = m * d->hidden;
    err = k3_launch_pdl(k3_moe_combine_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), 0, s, P, m,
                        (uint16_t *)out, out_f32);
    if (err != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of the moe combine kernel failed: %s", cudaGetErrorString(err));
    return K3_STATUS_SUCCESS;
}
