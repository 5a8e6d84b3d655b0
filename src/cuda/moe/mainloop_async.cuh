/* The NVFP4 main loop through a cp.async shared-memory ring, and the split of K over a block's warps. */
#ifndef K3_CUDA_MOE_MAINLOOP_ASYNC_CUH
#define K3_CUDA_MOE_MAINLOOP_ASYNC_CUH

#include <stdint.h>
#include "cuda/common/cp_async.cuh"
#include "cuda/moe/mainloop_ring.cuh"

namespace {

/* ---- NVFP4 main loop through a cp.async shared-memory ring ---------------------------------------------
 * Why: the loads of the register ring (mainloop_ring.cuh) share one scoreboard, and SASS waits on a scoreboard
 * until ALL its loads are back; the wait for chunk t therefore also waited for the refills issued after it, so
 * only about one chunk was really in flight per warp (bench/NOTES-moe.md). cp.async groups complete in
 * order and `cp.async.wait_group N` waits for exactly the older ones: S - 1 chunks (weights and block scales)
 * stay in flight while one is decoded. Each lane copies and reads back only its own bytes, so no barrier is
 * needed. Per warp and stage: weights [SETS * 2][32] x 16 B, the 4-byte word holding the lane's two scale
 * bytes [SETS * 2][32] x 4 B. The activations are NOT in the ring: a token tile's 8 rows would take 2 KB per
 * stage although at decode sizes an expert has one or two tokens (the other rows zero-filled), and that shared
 * memory cost GEMM1 blocks per SM. They are read straight into registers (plain coherent L1-cached
 * loads: every block of an SM reads the same few token rows) at the start of their chunk, with an L1
 * prefetch S - 1 chunks ahead. Used when the scale words are 4-byte aligned (swizzled layout, or
 * cols % 64 == 0 with an aligned scale pointer) and NT <= 2. */
/* Ring depths (chunks; S - 1 in flight per warp). GEMM1 was faster at 3 stages than at 4: more requests in flight
 * only lengthen the queues (bench/NOTES-moe.md). */
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
 * (measured faster than without the hint: bench/NOTES-moe.md). */
__device__ __forceinline__ void nv_cp_w16(void *smem, const void *gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

/* The producer side of one lane's ring: its addresses at the warp's first chunk and the byte steps from one
 * of its chunks to the next; chunk k's address is base + k * step, one IMAD.WIDE each. Why: recomputing
 * row * row_bytes + chunk * 64 and the scale offsets in 64 bits for every chunk was a large share of the loop's
 * instructions, and a post-incremented pointer costs several per address (the cp.async keeps reading its address
 * registers, so ptxas copies them first; SASS, bench/NOTES-moe.md). */
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
/* Padding lanes (no token) load nothing: their registers keep the zeros the caller set once per pass. Clearing
 * them every chunk cost instructions; loading the last token's row into them instead multiplied the L1 wavefronts
 * of a one-token tile (bench/NOTES-moe.md). */
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
/* The L1 prefetch of a chunk's activation line, issued with the chunk's weight copies (S - 1 chunks ahead), so
 * that nv_load_x hits L1 (without it GEMM1 was slower: bench/NOTES-moe.md). */
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
 * warps of a block read adjacent 64-byte pieces of each row at about the same time, which nv_cp_w16's 256-byte
 * hint relies on; a contiguous range per warp was slower: bench/NOTES-moe.md). The 16-element tail steps are
 * split j % parts == part. */
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

} // namespace

#endif
