/* Tensor-core BF16 GEMM for small K (k <= 32 * UNROLL): y[m, n] = x[m, k] w[n, k]^T (+ residual), fp32
 * accumulation; the whole-K warp tiles of src/plan/gemm_configs.def (K3_GEMM_MMA_WT, names n<W>_t<T>_u<U>).
 *
 * Why a second tensor-core kernel: under PDL a decode GEMM's time is set by what it does after
 * griddepcontrol.wait, since everything before the wait overlaps the previous kernel. gemm_mma.cu splits K over a
 * block's warps, so after the wait it loads x, multiplies, and then adds the warps' partial sums through shared
 * memory behind a barrier. When K is small (1536x128, the KDA f_b projection), every weight a warp needs fits in
 * its registers, so here each warp owns its own 16 * TILES weight rows over all of K:
 * - before the wait: all of the warp's weights (UNROLL chunks of 32 elements per row) into registers;
 * - after it: one round trip for x, the chunks' MMAs on independent accumulators (no chain of dependent MMAs),
 *   a tree of adds, and the sums stored straight from the MMA's C fragments (no shared memory, no barrier).
 * On the H200 these configurations beat every split-K one on 1536x128 at every M measured, and the tuned SM90
 * table chooses them for all three K = 128 shapes at every M (the measurements: bench/NOTES-gemm.md, whole-K warp
 * tiles).
 * The operand layout, the k map and the loads are those of gemm_mma_tile.cuh. The sums differ in order from the
 * split-K kernel's (chunks added pairwise here), so the bits differ between the two families; each is
 * deterministic. */
#include "cuda/gemm/mma_tile.cuh"

namespace {

template <int WARPS, int TILES, int UNROLL, int MINB, int NT>
__global__ void __launch_bounds__(WARPS * 32, MINB)
    k3_mma_wt_kernel(const uint16_t *__restrict__ x, int64_t x_stride, const uint16_t *__restrict__ w,
                     const uint16_t *residual, uint16_t *y, int64_t y_stride, int32_t m, int32_t n, int32_t k) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int row0 = ((int)blockIdx.x * WARPS + warp) * TILES * 16;
    const int chunks = k / 32; /* <= UNROLL (validated at launch); the chunks past it read nothing and hold zeros */
    /* (a warp wholly past n still runs, reading row n - 1, so that every thread reaches the PDL trigger) */
    const uint16_t *wrow[TILES][2];
    k3_mma_lane_rows<TILES>(wrow, w, n, k, row0, g, q);
    const uint16_t *xrow[NT];
    bool xok[NT];
    k3_mma_lane_tokens<NT>(xrow, xok, x, x_stride, m, g, q);

    uint4 wv[UNROLL][TILES][2], xv[UNROLL][NT];
    k3_mma_load_w<UNROLL, TILES, 0>(wv, wrow, 0, chunks, k3_policy_evict_first());
    k3_pdl_launch(); /* the next kernel may start its blocks (and its weight loads) now */
    k3_pdl_wait();   /* x and residual come from the previous kernel */
    k3_mma_load_x<UNROLL, NT>(xv, xrow, xok, 0, chunks);

    float acc[UNROLL][TILES][NT][4] = {};
#pragma unroll
    for (int j = 0; j < UNROLL; j++)
#pragma unroll
        for (int t = 0; t < TILES; t++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) k3_mma_chunk(acc[j][t][nt], wv[j][t][0], wv[j][t][1], xv[j][nt]);
    /* chunk sums added pairwise: ((0 + 1) + (2 + 3)) for UNROLL 4 */
#pragma unroll
    for (int s = 1; s < UNROLL; s *= 2)
#pragma unroll
        for (int j = 0; j + s < UNROLL; j += 2 * s)
#pragma unroll
            for (int t = 0; t < TILES; t++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[j][t][nt][i] += acc[j + s][t][nt][i];

    /* C fragment: c0 / c1 = row g, tokens 2q / 2q + 1; c2 / c3 = row g + 8. */
#pragma unroll
    for (int t = 0; t < TILES; t++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = row0 + t * 16 + g + (i >> 1) * 8, tk = nt * 8 + 2 * q + (i & 1);
                if (row < n && tk < m) {
                    const size_t o = (size_t)tk * (size_t)y_stride + (size_t)row;
                    float v = acc[0][t][nt][i];
                    if (residual) v += k3_bf16_to_f32_dev(residual[o]); /* plain load: residual may alias y */
                    y[o] = k3_f32_to_bf16_dev(v);
                }
            }
}

template <int WARPS, int TILES, int UNROLL, int MINB, int NT>
cudaError_t k3_mma_wt_launch_nt(const k3_gemm_args *a, cudaStream_t stream, int pdl) {
    constexpr int ROWS = WARPS * TILES * 16;
    cudaLaunchConfig_t lc;
    cudaLaunchAttribute attr[1];
    k3_gemm_launch_cfg_init(&lc, attr, dim3((unsigned)((a->n + ROWS - 1) / ROWS)), dim3(WARPS * 32), stream, pdl);
    return k3_mma_launch_ex(&lc, k3_mma_wt_kernel<WARPS, TILES, UNROLL, MINB, NT>, a);
}

} // namespace

template <int WARPS, int TILES, int UNROLL, int MINB>
cudaError_t k3_mma_wt_launch(const k3_gemm_args *a, cudaStream_t stream, int pdl) {
    static_assert(UNROLL >= 1 && UNROLL <= 8, "whole-K warp tiles: k <= 256");
    /* k <= 32 * UNROLL and k % 32 == 0: the registry's max_k and k_align, checked by k3_cuda_gemm_launch */
    if (a->m <= 8) return k3_mma_wt_launch_nt<WARPS, TILES, UNROLL, MINB, 1>(a, stream, pdl);
    if (a->m <= 16) return k3_mma_wt_launch_nt<WARPS, TILES, UNROLL, MINB, 2>(a, stream, pdl);
    return cudaErrorInvalidValue;
}

#define K3_GEMM_SKINNY(nm, thr, rows, unroll, sk)
#define K3_GEMM_MMA(nm, warps, tiles, unroll, cluster_k, pf, minb, l2b, pipe)
#define K3_GEMM_MMA_WT(nm, warps, tiles, unroll, minb) \
    template cudaError_t k3_mma_wt_launch<warps, tiles, unroll, minb>(const k3_gemm_args *, cudaStream_t, int);
#define K3_GEMM_MMA_BULK(nm, warps, bk, smem_kb, cluster_k)
#include "plan/gemm_configs.def"
#undef K3_GEMM_SKINNY
#undef K3_GEMM_MMA
#undef K3_GEMM_MMA_WT
#undef K3_GEMM_MMA_BULK
