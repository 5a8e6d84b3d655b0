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
 * cp.async pipeline. The loads and the K loop live in gemm_mma_tile.cuh (shared with the KDA one-launch kernel);
 * this file holds the kernel's cluster split, its reduction epilogue and the launchers. */
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
    constexpr int SR = ROWS + 4; /* padded token stride of the reduction buffer: conflict-free fragment stores */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int row0 = blockIdx.x * ROWS;
    /* K range of this block: the CLUSTER_K blocks of a cluster (blockIdx.y) split K, whole chunks each. */
    const int chunks = k / 32;
    const int per_rank = (chunks + CLUSTER_K - 1) / CLUSTER_K;
    const int c_lo = CLUSTER_K > 1 ? (int)blockIdx.y * per_rank : 0;
    const int c_hi = CLUSTER_K > 1 ? min(chunks, c_lo + per_rank) : chunks;
    const uint64_t pol = k3_policy_evict_first();
    /* K split over a cluster: rank 0 receives the other ranks' partials by st.async, counted by an mbarrier in
     * its shared memory. Distributed shared memory may be written only once its block has started, so every
     * thread arrives here, at its start (relaxed: no memory ordering), and waits for the whole cluster just
     * before the epilogue's remote stores, by when every block has long arrived; rank 0 initializes the barrier
     * and announces the bytes to expect before its arrive, so every rank that has waited may send. */
    constexpr int PART = NT * 8 * TILES * 16;
    __shared__ __align__(8) uint64_t part_bar;
    if constexpr (CLUSTER_K > 1) {
        if (blockIdx.y == 0 && tid == 0) {
            const uint32_t bar = (uint32_t)__cvta_generic_to_shared(&part_bar);
            const uint32_t bytes = (uint32_t)((CLUSTER_K - 1) * m * TILES * 16 * 4);
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
        }
        asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    }

    float acc[TILES][NT][4];
    k3_mma_tile_accumulate<WARPS, TILES, UNROLL, PF, L2B, PIPE, NT>(acc, x, x_stride, w, m, n, k, row0, c_lo, c_hi,
                                                                    tid, pol);

    /* Partial sums per warp -> red[warp][token][row]; C fragment: c0/c1 = row g, tokens 2q/2q+1; c2/c3 = row g+8. */
    __shared__ float red[WARPS][NT * 8][SR];
#pragma unroll
    for (int t = 0; t < TILES; t++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int r = t * 16 + g, tk = nt * 8 + 2 * q;
            red[warp][tk][r] = acc[t][nt][0];
            red[warp][tk + 1][r] = acc[t][nt][1];
            red[warp][tk][r + 8] = acc[t][nt][2];
            red[warp][tk + 1][r + 8] = acc[t][nt][3];
        }
    __syncthreads();
    const int outs = m * ROWS; /* m <= NT * 8 (validated at launch) */
    if constexpr (CLUSTER_K == 1) {
        for (int e = tid; e < outs; e += WARPS * 32) {
            const int tk = e / ROWS, r = e % ROWS, row = row0 + r;
            if (row < n) {
                float s = 0.0f;
#pragma unroll
                for (int wi = 0; wi < WARPS; wi++) s += red[wi][tk][r];
                const size_t o = (size_t)tk * (size_t)y_stride + (size_t)row;
                if (residual) s += k3_bf16_to_f32_dev(residual[o]); /* plain load: residual may alias y */
                y[o] = k3_f32_to_bf16_dev(s);
            }
        }
    } else {
        /* Block partial (sum over warps); the other ranks send theirs into rank 0's shared memory with st.async,
         * whose bytes complete rank 0's mbarrier (set up at the kernel's start), then leave; rank 0 waits on that
         * barrier alone, adds the partials in rank order (deterministic) and stores y. No cluster-wide release:
         * the memory barrier of cluster.sync() was a large share of the stall cycles of the small-N shapes, and
         * 144x7168 ran faster at every M without it (bench/NOTES-gemm.md, the st.async K-split epilogue).
         * A sender may leave with its stores in flight: they complete on rank 0's barrier, and
         * rank 0, whose shared memory they target, waits for all of them. */
        __shared__ float part[CLUSTER_K][PART];
        const int rank = (int)blockIdx.y; /* the cluster spans blockIdx.y: rank = blockIdx.y */
        asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); /* rank 0 has started, its barrier is set */
        const uint32_t bar_local = (uint32_t)__cvta_generic_to_shared(&part_bar);
        uint32_t bar_remote = 0, part_remote = 0; /* rank 0's barrier and this rank's slot there */
        if (rank != 0) {
            asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(bar_remote) : "r"(bar_local));
            asm volatile("mapa.shared::cluster.u32 %0, %1, 0;"
                         : "=r"(part_remote)
                         : "r"((uint32_t)__cvta_generic_to_shared(&part[rank][0])));
        }
        for (int e = tid; e < outs; e += WARPS * 32) {
            const int tk = e / ROWS, r = e % ROWS;
            float s = 0.0f;
#pragma unroll
            for (int wi = 0; wi < WARPS; wi++) s += red[wi][tk][r];
            if (rank == 0) {
                part[0][e] = s;
            } else { /* an asynchronous remote store that completes its bytes on rank 0's barrier: no fence */
                const uint32_t dst = part_remote + (uint32_t)e * 4u;
                asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(dst),
                             "r"(__float_as_uint(s)), "r"(bar_remote)
                             : "memory");
            }
        }
        if (rank == 0) {
            __syncthreads(); /* rank 0's own partials */
            uint32_t done = 0;
            while (!done)
                asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0; "
                             "selp.u32 %0, 1, 0, p; }"
                             : "=r"(done)
                             : "r"(bar_local)
                             : "memory");
            for (int e = tid; e < outs; e += WARPS * 32) {
                const int tk = e / ROWS, r = e % ROWS, row = row0 + r;
                float s = 0.0f;
#pragma unroll
                for (int rk = 0; rk < CLUSTER_K; rk++) s += part[rk][e];
                if (row < n) {
                    const size_t o = (size_t)tk * (size_t)y_stride + (size_t)row;
                    if (residual) s += k3_bf16_to_f32_dev(residual[o]);
                    y[o] = k3_f32_to_bf16_dev(s);
                }
            }
        }
    }
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
#include "plan/gemm_configs.def"
#undef K3_GEMM_SKINNY
#undef K3_GEMM_MMA
#undef K3_GEMM_MMA_WT
