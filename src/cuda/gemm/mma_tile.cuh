/* The tensor-core small-M GEMM tile, shared by gemm_mma.cu's kernel and the KDA one-launch projection
 * (kda_fused.cu): the loads, the register pipeline and the MMAs that leave one warp's partial sums of a TILES x
 * 16-row weight tile over its share of K chunks in registers. The AB-swapped operand layout, the k map and the
 * pipeline are explained in gemm_mma.cu's file comment. */
#ifndef K3_CUDA_GEMM_MMA_TILE_CUH
#define K3_CUDA_GEMM_MMA_TILE_CUH

#include "cuda/gemm/kernels.cuh"
#include "cuda/common/mma.cuh"

/* This lane's (g = lane / 4, q = lane % 4) weight rows: g and g + 8 of every 16-row tile from row0, at its 8
 * elements of a 32-element chunk; rows past n read row n - 1 and must never be stored. */
template <int TILES>
__device__ __forceinline__ void k3_mma_lane_rows(const uint16_t *(&wrow)[TILES][2], const uint16_t *w, int n, int k,
                                                 int row0, int g, int q) {
#pragma unroll
    for (int t = 0; t < TILES; t++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int row = row0 + t * 16 + h * 8 + g;
            row = row < n ? row : n - 1;
            wrow[t][h] = w + (size_t)row * (size_t)k + q * 8;
        }
}

/* This lane's tokens: g (+ 8 for the second token tile); absent tokens (xok false) contribute zeros, loaded from
 * nowhere. */
template <int NT>
__device__ __forceinline__ void k3_mma_lane_tokens(const uint16_t *(&xrow)[NT], bool (&xok)[NT], const uint16_t *x,
                                                   int64_t x_stride, int m, int g, int q) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int tok = nt * 8 + g;
        xok[nt] = tok < m;
        xrow[nt] = x + (size_t)(xok[nt] ? tok : 0) * (size_t)x_stride + q * 8;
    }
}

/* One group of UNROLL chunks of this lane's weight rows (16 bytes per row and chunk); chunks at or past c_hi
 * read nothing and hold zeros. */
template <int UNROLL, int TILES, int L2B>
__device__ __forceinline__ void k3_mma_load_w(uint4 (&wv)[UNROLL][TILES][2], const uint16_t *const (&wrow)[TILES][2],
                                              int c, int c_hi, uint64_t pol) {
#pragma unroll
    for (int j = 0; j < UNROLL; j++)
#pragma unroll
        for (int t = 0; t < TILES; t++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                wv[j][t][h] =
                    c + j < c_hi ? k3_ld_stream_pf<L2B>(wrow[t][h] + (c + j) * 32, pol) : make_uint4(0, 0, 0, 0);
}

/* The same group's activations for this lane's tokens (absent tokens: zeros, loaded from nowhere). Coherent loads:
 * under PDL, x may be the previous kernel's output. */
template <int UNROLL, int NT>
__device__ __forceinline__ void k3_mma_load_x(uint4 (&xv)[UNROLL][NT], const uint16_t *const (&xrow)[NT],
                                              const bool (&xok)[NT], int c, int c_hi) {
#pragma unroll
    for (int j = 0; j < UNROLL; j++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            xv[j][nt] = xok[nt] && c + j < c_hi ? k3_ld_act(xrow[nt] + (c + j) * 32) : make_uint4(0, 0, 0, 0);
}

/* The two k16 MMAs of one 32-element chunk (the k map of gemm_mma.cu's file comment): lo and hi hold this lane's
 * 16 bytes of weight rows g and g + 8, xq its 16 bytes of token g. */
__device__ __forceinline__ void k3_mma_chunk(float (&acc)[4], const uint4 &lo, const uint4 &hi, const uint4 &xq) {
    k3_mma_bf16_16816(acc, lo.x, hi.x, lo.y, hi.y, xq.x, xq.y);
    k3_mma_bf16_16816(acc, lo.z, hi.z, lo.w, hi.w, xq.z, xq.w);
}

/* The MMAs of one group: k3_mma_chunk per chunk, tile and n tile. */
template <int UNROLL, int TILES, int NT>
__device__ __forceinline__ void k3_mma_group(float (&acc)[TILES][NT][4], const uint4 (&wv)[UNROLL][TILES][2],
                                             const uint4 (&xv)[UNROLL][NT]) {
#pragma unroll
    for (int j = 0; j < UNROLL; j++)
#pragma unroll
        for (int t = 0; t < TILES; t++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) k3_mma_chunk(acc[t][nt], wv[j][t][0], wv[j][t][1], xv[j][nt]);
}

/* In-loop L2 prefetch (PF_LOOP configurations): one request per weight row of the block for the UNROLL chunks of
 * this warp starting at chunk cp, from the lanes holding a row (pfrow[i] null for the others). */
template <int PF_ROWS>
__device__ __forceinline__ void k3_mma_prefetch_step(const uint16_t *const (&pfrow)[PF_ROWS], int cp, int c_hi,
                                                     int unroll) {
    if (cp < c_hi) {
        const uint32_t bytes = (uint32_t)min(unroll, c_hi - cp) * 64u;
#pragma unroll
        for (int i = 0; i < PF_ROWS; i++)
            if (pfrow[i]) k3_prefetch_l2(pfrow[i] + cp * 32, bytes);
    }
}

/* The default of k3_mma_tile_accumulate's after_wait: nothing. */
struct k3_mma_no_hook {
    __device__ __forceinline__ void operator()() const {}
};

/* The K loop of one tile: the warps 0..WARPS-1 of the tile (tid = thread index among them) split the chunks
 * [c_lo, c_hi) of weight rows row0 .. row0 + TILES * 16 - 1 (rows past n read row n - 1 and must not be stored) and
 * leave their partial sums in acc (C fragment: c0/c1 = row g, tokens 2q/2q+1; c2/c3 = row g+8). Triggers the next
 * PDL launch and waits for the previous grid between the weight and the x loads; after_wait() runs right after that
 * wait (the KDA one launch asks its branch's weights into L2 there). */
template <int WARPS, int TILES, int UNROLL, int PF, int L2B, int PIPE, int NT, class AfterWait = k3_mma_no_hook>
__device__ __forceinline__ void k3_mma_tile_accumulate(float (&acc)[TILES][NT][4], const uint16_t *__restrict__ x,
                                                       int64_t x_stride, const uint16_t *__restrict__ w, int m,
                                                       int n, int k, int row0, int c_lo, int c_hi, int tid,
                                                       uint64_t pol, AfterWait after_wait = AfterWait()) {
    constexpr int ROWS = TILES * 16;
    const int lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, q = lane & 3;
    const uint16_t *wrow[TILES][2];
    k3_mma_lane_rows<TILES>(wrow, w, n, k, row0, g, q);
    const uint16_t *xrow[NT];
    bool xok[NT];
    k3_mma_lane_tokens<NT>(xrow, xok, x, x_stride, m, g, q);

#pragma unroll
    for (int t = 0; t < TILES; t++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[t][nt][i] = 0.0f;

    /* Register groups of UNROLL chunks per warp (a step), pipelined in one of two ways (PIPE):
     * 1: the next step is loaded while the current one is multiplied, then copied into place. ptxas makes the
     *    copies wait on the scoreboard of every load just issued, so ONE step is in flight per warp, and the
     *    MMAs overlap it.
     * 2: two register groups A and B used in turn, no copies: both are in flight at the one wait per pair of
     *    steps (ptxas puts all these loads on one scoreboard), and the MMAs run between the waits.
     * 2 doubles the bytes in flight per warp but needs more registers; which wins depends on the configuration
     * (the measurements: bench/NOTES-gemm.md). */
    static_assert(PIPE == 1 || PIPE == 2, "pipe: 1 or 2 register groups in flight");
    const int step = WARPS * UNROLL;
    int c0 = c_lo + warp * UNROLL;
    uint4 wa[UNROLL][TILES][2], xa[UNROLL][NT], wb[UNROLL][TILES][2], xb[UNROLL][NT];
    k3_mma_load_w<UNROLL, TILES, L2B>(wa, wrow, c0, c_hi, pol);
    if constexpr (PIPE == 2) k3_mma_load_w<UNROLL, TILES, L2B>(wb, wrow, c0 + step, c_hi, pol);
    /* L2 prefetch (PF > 0): the registers hold one or two steps (UNROLL chunks per warp each) in flight, a few KB per
     * warp; prefetching the weights of later steps into L2 keeps more DRAM requests outstanding at no register cost,
     * and the demand loads then mostly hit L2. The block first asks for the PF steps after the PIPE steps loaded at the
     * start (the block's chunks are contiguous in every row, one request per row per 4 KB), or for its whole K range
     * (PF = K3_PF_ALL); then (PF < K3_PF_ALL) each warp asks, every step, for its own chunks PF steps after the step it
     * loads into registers, one request per weight row, from lanes 0..ROWS-1. It pays on small and mid shapes only
     * (bench/NOTES-gemm.md): on large shapes the in-loop requests (64-256 bytes each) cost more than they hide, so
     * those configurations stay without it. Head only (PF = K3_PF_HEAD + H):
     * the H steps after the PIPE loaded ones, at the start, nothing in the loop. Under PDL a block starts when a block
     * of the previous kernel leaves, so these requests fill the DRAM while that kernel's last blocks drain and before
     * our griddepcontrol.wait returns (the previous kernel's blocks leave over microseconds, and the wait returns only
     * after the last has). A few tens of KB per block pay on the mid-size shapes; much more is evicted from L2 before
     * the block reads it, and loses (bench/NOTES-gemm.md). */
    constexpr int PF_ROWS = (ROWS + 31) / 32;
    constexpr bool PF_LOOP = PF > 0 && PF < K3_PF_ALL; /* requests inside the loop too */
    constexpr int PF_STEPS = PF > K3_PF_HEAD ? PF - K3_PF_HEAD : PF; /* steps requested at the start */
    const uint16_t *pfrow[PF_ROWS];
    if constexpr (PF > 0) {
        const int p_lo = c_lo + PIPE * step;
        const int p_hi = PF == K3_PF_ALL ? c_hi : min(c_hi, c_lo + (PF_STEPS + PIPE) * step);
        for (int r = tid; r < ROWS; r += WARPS * 32) {
            const int row = row0 + r;
            if (row < n) {
                const uint16_t *base = w + (size_t)row * (size_t)k;
                for (int c = p_lo; c < p_hi; c += 64) /* 64 chunks = 4 KB per request */
                    k3_prefetch_l2(base + (size_t)c * 32, (uint32_t)min(p_hi - c, 64) * 64u);
            }
        }
        if constexpr (PF_LOOP)
#pragma unroll
            for (int i = 0; i < PF_ROWS; i++) {
                const int r = i * 32 + lane, row = row0 + r;
                pfrow[i] = r < ROWS && row < n ? w + (size_t)row * (size_t)k : nullptr;
            }
    }
    /* Let the next kernel launch now: it fires only once every block of this grid has reached this point (so
     * it never takes slots our blocks need), and the next kernel's own wait still orders its reads after our
     * completion; its blocks then prefetch their weights while ours finish. */
    k3_pdl_launch();
    k3_pdl_wait(); /* x and residual come from the previous kernel */
    after_wait();
    k3_mma_load_x<UNROLL, NT>(xa, xrow, xok, c0, c_hi);
    if constexpr (PIPE == 2) k3_mma_load_x<UNROLL, NT>(xb, xrow, xok, c0 + step, c_hi);

    /* Steps past c_hi hold zeros in both operands (their loads are predicated off): multiplying them adds exact
     * zeros, so only the loop exit needs to know where K ends. */
    if constexpr (PIPE == 1) {
        for (; c0 < c_hi; c0 += step) {
            if constexpr (PF_LOOP) k3_mma_prefetch_step<PF_ROWS>(pfrow, c0 + (PF + 1) * step, c_hi, UNROLL);
            k3_mma_load_w<UNROLL, TILES, L2B>(wb, wrow, c0 + step, c_hi, pol);
            k3_mma_load_x<UNROLL, NT>(xb, xrow, xok, c0 + step, c_hi);
            k3_mma_group<UNROLL, TILES, NT>(acc, wa, xa);
#pragma unroll
            for (int j = 0; j < UNROLL; j++) {
#pragma unroll
                for (int t = 0; t < TILES; t++)
#pragma unroll
                    for (int h = 0; h < 2; h++) wa[j][t][h] = wb[j][t][h];
#pragma unroll
                for (int nt = 0; nt < NT; nt++) xa[j][nt] = xb[j][nt];
            }
        }
    } else {
        for (; c0 < c_hi; c0 += 2 * step) {
            if constexpr (PF_LOOP) k3_mma_prefetch_step<PF_ROWS>(pfrow, c0 + (PF + 2) * step, c_hi, UNROLL);
            k3_mma_group<UNROLL, TILES, NT>(acc, wa, xa);
            if (c0 + step >= c_hi) break;
            k3_mma_load_w<UNROLL, TILES, L2B>(wa, wrow, c0 + 2 * step, c_hi, pol);
            k3_mma_load_x<UNROLL, NT>(xa, xrow, xok, c0 + 2 * step, c_hi);
            if constexpr (PF_LOOP) k3_mma_prefetch_step<PF_ROWS>(pfrow, c0 + (PF + 3) * step, c_hi, UNROLL);
            k3_mma_group<UNROLL, TILES, NT>(acc, wb, xb);
            k3_mma_load_w<UNROLL, TILES, L2B>(wb, wrow, c0 + 3 * step, c_hi, pol);
            k3_mma_load_x<UNROLL, NT>(xb, xrow, xok, c0 + 3 * step, c_hi);
        }
    }
}

#endif
