/* Tensor-core small-M BF16 GEMM for decode: y[m, n] = x[m, k] w[n, k]^T (+ residual), fp32 accumulation.
 *
 * AB swapped: weight rows are the MMA's M dimension (16-row tiles), tokens its N dimension (one n8 tile for
 * m <= 8, two for m <= 16); mma.sync.m16n8k16 BF16 -> fp32. A block owns TILES x 16 weight rows; its WARPS warps
 * split K (each takes groups of UNROLL consecutive 32-element chunks, interleaved), and their partial sums
 * are added through shared memory in a fixed order (bitwise reproducible).
 *
 * Operands go from global memory straight into registers with 16-byte loads, no shared-memory staging
 * (not the cp.async + ldmatrix pipeline of the public small-M design this kernel follows). Why that is equivalent:
 * a dot product does not depend on the order of its K terms, so any bijection between the MMA's logical k
 * (0..15) and the physical k of a chunk works as long as A (weights) and B (activations) use the same one.
 * Lane (g = lane / 4, q = lane % 4) holds, by the PTX fragment layout, A[g][2q, 2q+1, 2q+8, 2q+9] (and row g+8)
 * and B[2q, 2q+1, 2q+8, 2q+9][g]. It loads 8 consecutive physical k at 8q .. 8q+7 of the chunk, for weight
 * rows g and g+8 and for token g; the first MMA maps logical (2q, 2q+1, 2q+8, 2q+9) to physical 8q + (0..3),
 * the second to 8q + (4..7). The map depends on k alone (never on the row or token), so A[r][k] always meets
 * B[k][c] with the same physical k: every product of the dot product appears exactly once.
 * Memory-level parallelism comes from loading the next step's operands into registers before the current step
 * is multiplied (one or two steps in flight per warp: PIPE) and from L2 prefetch (PF), instead of a multi-stage
 * cp.async pipeline. The loads and the K loop live in gemm_mma_tile.cuh (shared with the KDA one-launch kernel),
 * the reduction epilogue and the cluster split in gemm/mma_reduce.cuh (shared with the bulk kernel, mma_bulk.cu);
 * this file holds the kernel and its launchers. */
#include "cuda/gemm/mma_reduce.cuh"
#include "cuda/gemm/mma_tile.cuh"

namespace {

/* MINB > 1 caps registers so that MINB blocks fit on an SM. Measured on the H200 (bench/NOTES-gemm.md): what
 * counts is blocks resident per SM (bytes in flight) and a grid that fits in one wave; e.g. w8_t1_u4 takes 138
 * registers at M <= 8 (one 256-thread block per SM), 128 with MINB 2 (two). The M 9-16 instances (two token
 * tiles) need more registers than the M <= 8 ones, so without a cap they lose a block per SM. */
template <int WARPS, int TILES, int UNROLL, int CLUSTER_K, int PF, int MINB, int L2B, int PIPE, int NT>
__global__ void __launch_bounds__(WARPS * 32, MINB)
    k3_mma_kernel(const uint16_t *__restrict__ x, int64_t x_stride, const uint16_t *__restrict__ w,
                  const uint16_t *residual, uint16_t *y, int64_t y_stride, int32_t m, int32_t n, int32_t k) {
    constexpr int ROWS = TILES * 16;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int row0 = blockIdx.x * ROWS;
    /* K range of this block: the CLUSTER_K blocks of a cluster (blockIdx.y) split K, whole chunks each. */
    const int chunks = k / 32;
    const int per_rank = (chunks + CLUSTER_K - 1) / CLUSTER_K;
    const int c_lo = CLUSTER_K > 1 ? (int)blockIdx.y * per_rank : 0;
    const int c_hi = CLUSTER_K > 1 ? min(chunks, c_lo + per_rank) : chunks;
    const uint64_t pol = k3_policy_evict_first();
    /* K split over a cluster: rank 0 receives the other ranks' partials (gemm/mma_reduce.cuh) */
    __shared__ __align__(8) uint64_t part_bar;
    k3_mma_split_begin<CLUSTER_K, ROWS>(&part_bar, m, tid);

    float acc[TILES][NT][4];
    k3_mma_tile_accumulate<WARPS, TILES, UNROLL, PF, L2B, PIPE, NT>(acc, x, x_stride, w, m, n, k, row0, c_lo, c_hi,
                                                                    tid, pol);

    /* Partial sums per warp, added in warp order (and over the cluster in rank order) */
    __shared__ k3_mma_red_buf<WARPS, TILES, NT> red;
    k3_mma_store_partials<WARPS, TILES, NT>(red, acc, warp, g, q);
    __syncthreads();
    k3_mma_reduce_store<WARPS, TILES, NT, CLUSTER_K, WARPS * 32>(red, &part_bar, residual, y, y_stride, m, n, row0,
                                                                 tid);
}

template <int WARPS, int TILES, int UNROLL, int CLUSTER_K, int PF, int MINB, int L2B, int PIPE, int NT>
cudaError_t k3_mma_launch_nt(const k3_gemm_args *a, cudaStream_t stream, int pdl) {
    cudaLaunchConfig_t lc;
    cudaLaunchAttribute attr[2];
    k3_gemm_launch_cfg_init(&lc, attr, dim3((unsigned)((a->n + TILES * 16 - 1) / (TILES * 16)), CLUSTER_K),
                            dim3(WARPS * 32), stream, pdl);
    k3_gemm_launch_cfg_cluster_k(&lc, attr, CLUSTER_K); /* the K-splitting blocks of one row tile form a cluster */
    return k3_mma_launch_ex(&lc, k3_mma_kernel<WARPS, TILES, UNROLL, CLUSTER_K, PF, MINB, L2B, PIPE, NT>, a);
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
#define K3_GEMM_MMA_WT(nm, warps, tiles, unroll, minb)
#define K3_GEMM_MMA_BULK(nm, warps, bk, smem_kb, cluster_k)
#include "plan/gemm_configs.def"
#undef K3_GEMM_SKINNY
#undef K3_GEMM_MMA
#undef K3_GEMM_MMA_WT
#undef K3_GEMM_MMA_BULK
