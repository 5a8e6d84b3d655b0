/* The expert GEMMs' main loops over registers: BF16 weights, and FP4 weights through a register ring of chunks
 * in flight per lane (the path for MXFP4, BF16, and NVFP4 where the cp.async ring cannot run). */
#ifndef K3_CUDA_MOE_MAINLOOP_RING_CUH
#define K3_CUDA_MOE_MAINLOOP_RING_CUH

#include <stdint.h>
#include "cuda/common/mma.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/moe/fp4_decode.cuh"
#include "cuda/moe/nvfp4_decode.cuh"

namespace {

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
 * checks are needed here. The register ring's chunk body (the cp.async ring's, with the activations in
 * registers, is mma_chunk_nv_rx in mainloop_async.cuh). */
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

/* FP4 version of the main loop: D chunks (weights and scales) per lane in a register ring; a slot is refilled
 * right after it is decoded, so D - 1 loads are issued ahead of a chunk's MMAs (the loads share one scoreboard,
 * so fewer are really in flight: why NVFP4 prefers the cp.async ring, mainloop_async.cuh). The activations come
 * through a shared-memory ring (x_issue) XD - 1 chunks ahead, so no chunk waits on L2.
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

} // namespace

#endif
