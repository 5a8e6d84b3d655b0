/* The end of the tensor-core GEMM kernels with a K split (gemm_mma.cu's register-pipelined kernel and
 * gemm_mma_bulk.cu's shared-memory ring): the warps' partial sums added through shared memory in a fixed order,
 * and, where the blocks of a thread-block cluster split K too, the ranks' partials added in rank 0 (bitwise
 * reproducible), then the residual and the BF16 store. */
#ifndef K3_CUDA_GEMM_MMA_REDUCE_CUH
#define K3_CUDA_GEMM_MMA_REDUCE_CUH

#include <stdint.h>

#include "cuda/common/loads.cuh"

/* The padded token stride of the reduction buffer red[warp][token][row] (k3_mma_red_buf): conflict-free fragment
 * stores. */
__host__ __device__ constexpr int k3_mma_red_stride(int rows) { return rows + 4; }

/* K split over a cluster: rank 0 receives the other ranks' partials by st.async, counted by an mbarrier in
 * its shared memory. Distributed shared memory may be written only once its block has started, so every
 * thread arrives here, at its start (relaxed: no memory ordering), and waits for the whole cluster just
 * before the epilogue's remote stores, by when every block has long arrived; rank 0 initializes the barrier
 * and announces the bytes to expect before its arrive, so every rank that has waited may send. The cluster spans
 * blockIdx.y (rank = blockIdx.y). Every thread of the block calls it. */
template <int CLUSTER_K, int ROWS>
__device__ __forceinline__ void k3_mma_split_begin(uint64_t *part_bar, int m, int tid) {
    if constexpr (CLUSTER_K > 1) {
        if (blockIdx.y == 0 && tid == 0) {
            const uint32_t bar = (uint32_t)__cvta_generic_to_shared(part_bar);
            const uint32_t bytes = (uint32_t)((CLUSTER_K - 1) * m * ROWS * 4);
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
        }
        asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    }
}

/* One warp's partial sums (C fragments of TILES x NT MMA tiles) into red[warp][token][row]: c0/c1 = row g,
 * tokens 2q/2q+1; c2/c3 = row g+8. */
template <int WARPS, int TILES, int NT>
using k3_mma_red_buf = float[WARPS][NT * 8][k3_mma_red_stride(TILES * 16)];

template <int WARPS, int TILES, int NT>
__device__ __forceinline__ void k3_mma_store_partials(k3_mma_red_buf<WARPS, TILES, NT> &red,
                                                      const float (&acc)[TILES][NT][4], int warp, int g, int q) {
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
}

/* After a __syncthreads that follows every warp's k3_mma_store_partials: the sum over the WARPS warps in warp order,
 * over the cluster's ranks in rank order (CLUSTER_K > 1; part_bar set up by k3_mma_split_begin), + residual, stored
 * as BF16 into y[token][row0 + r] for rows < n. THREADS threads (tid 0..THREADS-1) share the work; every thread of
 * the block calls it. */
template <int WARPS, int TILES, int NT, int CLUSTER_K, int THREADS>
__device__ __forceinline__ void k3_mma_reduce_store(const k3_mma_red_buf<WARPS, TILES, NT> &red, uint64_t *part_bar,
                                                    const uint16_t *residual, uint16_t *y, int64_t y_stride, int m,
                                                    int n, int row0, int tid) {
    constexpr int ROWS = TILES * 16;
    constexpr int PART = NT * 8 * ROWS;
    const int outs = m * ROWS; /* m <= NT * 8 (validated at launch) */
    if constexpr (CLUSTER_K == 1) {
        for (int e = tid; e < outs; e += THREADS) {
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
        const uint32_t bar_local = (uint32_t)__cvta_generic_to_shared(part_bar);
        uint32_t bar_remote = 0, part_remote = 0; /* rank 0's barrier and this rank's slot there */
        if (rank != 0) {
            asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(bar_remote) : "r"(bar_local));
            asm volatile("mapa.shared::cluster.u32 %0, %1, 0;"
                         : "=r"(part_remote)
                         : "r"((uint32_t)__cvta_generic_to_shared(&part[rank][0])));
        }
        for (int e = tid; e < outs; e += THREADS) {
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
            for (int e = tid; e < outs; e += THREADS) {
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

#endif
