/* Tensor-core small-M BF16 GEMM for decode: y[m, n] = x[m, k] w[n, k]^T (+ residual), fp32 accumulation. One block
 * per TILES x 16 weight rows (and cluster rank of a K split); the tile itself, and why it is laid out as it is, is
 * in mma_tile.cuh. */
#include "cuda/mma_tile.cuh"

namespace {

/* MINB > 1 caps registers so that MINB blocks fit on an SM. Measured on the H200 (bench/NOTES-gemm.md): what
 * counts is blocks resident per SM (bytes in flight) and a grid that fits in one wave; e.g. w8_t1_u4 takes 138
 * registers at M <= 8 (one 256-thread block per SM), 128 with MINB 2 (two). The M 9-16 instances (two token
 * tiles) need more registers than the M <= 8 ones, so without a cap they lose a block per SM. */
template <int WARPS, int TILES, int UNROLL, int CLUSTER_K, int PF, int MINB, int L2B, int PIPE, int NT>
__global__ void __launch_bounds__(WARPS * 32, MINB)
    k3_mma_kernel(const uint16_t *__restrict__ x, int64_t x_stride, const uint16_t *__restrict__ w,
                  const uint16_t *residual, uint16_t *y, int64_t y_stride, int32_t m, int32_t n, int32_t k) {
    k3_mma_tile<WARPS, TILES, UNROLL, CLUSTER_K, PF, L2B, PIPE, NT>(x, x_stride, w, residual, y, y_stride, m, n, k);
}

template <int WARPS, int TILES, int UNROLL, int CLUSTER_K, int PF, int MINB, int L2B, int PIPE, int NT>
cudaError_t k3_mma_launch_nt(const k3_gemm_args *a, cudaStream_t stream, int pdl) {
    cudaLaunchConfig_t lc;
    cudaLaunchAttribute attr[2];
    k3_gemm_launch_cfg_init(&lc, attr, dim3((unsigned)((a->n + TILES * 16 - 1) / (TILES * 16)), CLUSTER_K),
                            dim3(WARPS * 32), stream, pdl);
    if (CLUSTER_K > 1) { /* the K-splitting blocks of one row tile form a cluster */
        attr[lc.numAttrs].id = cudaLaunchAttributeClusterDimension;
        attr[lc.numAttrs].val.clusterDim.x = 1;
        attr[lc.numAttrs].val.clusterDim.y = CLUSTER_K;
        attr[lc.numAttrs].val.clusterDim.z = 1;
        lc.numAttrs++;
    }
    return cudaLaunchKernelEx(&lc, k3_mma_kernel<WARPS, TILES, UNROLL, CLUSTER_K, PF, MINB, L2B, PIPE, NT>,
                              static_cast<const uint16_t *>(a->x), (int64_t)a->x_stride,
                              static_cast<const uint16_t *>(a->w), static_cast<const uint16_t *>(a->residual),
                              static_cast<uint16_t *>(a->y), (int64_t)a->y_stride, (int32_t)a->m, (int32_t)a->n,
                              (int32_t)a->k);
}

} // namespace

template <int WARPS, int TILES, int UNROLL, int CLUSTER_K, int PF, int MINB, int L2B, int PIPE>
cudaError_t k3_mma_launch(const k3_gemm_args *a, cudaStream_t stream, int pdl) {
    static_assert(CLUSTER_K >= 1 && CLUSTER_K <= 8, "portable cluster size");
    static_assert(PF >= 0 && PF != K3_PF_HEAD && PF < K3_PF_HEAD + 100,
                  "PF: 0, 1..K3_PF_ALL-1 steps, K3_PF_ALL, or K3_PF_HEAD + 1..99 steps");
    if (a->m <= 8) return k3_mma_launch_nt<WARPS, TILES, UNROLL, CLUSTER_K, PF, MINB, L2B, PIPE, 1>(a, stream, pdl);
    if (a->m <= 16) return k3_mma_launch_nt<WARPS, TILES, UNROLL, CLUSTER_K, PF, MINB, L2B, PIPE, 2>(a, stream, pdl);
    return cudaErrorInvalidValue;
}

#define K3_GEMM_SKINNY(nm, thr, rows, unroll, sk)
#define K3_GEMM_MMA(nm, warps, tiles, unroll, cluster_k, pf, minb, l2b, pipe) \
    template cudaError_t k3_mma_launch<warps, tiles, unroll, cluster_k, pf, minb, l2b, pipe>(const k3_gemm_args *, \
                                                                                            cudaStream_t, int);
#include "plan/gemm_configs.def"
#undef K3_GEMM_SKINNY
#undef K3_GEMM_MMA
