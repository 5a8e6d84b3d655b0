/* Tensor-core small-M BF16 GEMM for decode: y[m, n] = x[m, k] w[n, k]^T (+ residual), fp32 accumulation.
 *
 * AB swapped: weight rows are the MMA's M dimension (16-row tiles), tokens its N dimension (one n8 tile for
 * m <= 8, two for m <= 16); mma.sync.m16n8k16 BF16 -> fp32. A block owns TILES x 16 weight rows; its WARPS warps
 * split K (each takes groups of UNROLL consecutive 32-element chunks, interleaved), and their partial sums
 * are added through shared memory in a fixed order (bitwise reproducible).
 *
 * Operands go from global memory straight into registers with 16-byte loads, no shared-memory staging
 * (the cp.async + ldmatrix pipeline of the issue is NOT what this file ships). Why that is equivalent:
 * a dot product does not depend on the order of its K terms, so any bijection between the MMA's logical k
 * (0..15) and the physical k of a chunk works as long as A (weights) and B (activations) use the same one.
 * Lane (g = lane / 4, q = lane % 4) holds, by the PTX fragment layout, A[g][2q, 2q+1, 2q+8, 2q+9] (and row g+8)
 * and B[2q, 2q+1, 2q+8, 2q+9][g]. It loads 8 consecutive physical k at 8q .. 8q+7 of the chunk, for weight
 * rows g and g+8 and for token g; the first MMA maps logical (2q, 2q+1, 2q+8, 2q+9) to physical 8q + (0..3),
 * the second to 8q + (4..7). The map depends on k alone (never on the row or token), so A[r][k] always meets
 * B[k][c] with the same physical k: every product of the dot product appears exactly once.
 * Memory-level parallelism comes from loading the next step's operands into registers before the current step
 * is multiplied (one or two steps in flight per warp: PIPE below) and from L2 prefetch (PF), instead of a
 * multi-stage cp.async pipeline. */
#include "cuda/gemm_kernels.cuh"
#include "cuda/mma.cuh"

namespace {

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

/* The MMAs of one group: two k16 steps per 32-element chunk (the k map of the file comment). */
template <int UNROLL, int TILES, int NT>
__device__ __forceinline__ void k3_mma_group(float (&acc)[TILES][NT][4], const uint4 (&wv)[UNROLL][TILES][2],
                                             const uint4 (&xv)[UNROLL][NT]) {
#pragma unroll
    for (int j = 0; j < UNROLL; j++)
#pragma unroll
        for (int t = 0; t < TILES; t++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint4 lo = wv[j][t][0], hi = wv[j][t][1], xq = xv[j][nt];
                k3_mma_bf16_16816(acc[t][nt], lo.x, hi.x, lo.y, hi.y, xq.x, xq.y);
                k3_mma_bf16_16816(acc[t][nt], lo.z, hi.z, lo.w, hi.w, xq.z, xq.w);
            }
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

    /* This lane's weight rows: g and g + 8 of every tile; rows past n read row n-1 and are never stored. */
    const uint16_t *wrow[TILES][2];
#pragma unroll
    for (int t = 0; t < TILES; t++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int row = row0 + t * 16 + h * 8 + g;
            row = row < n ? row : n - 1;
            wrow[t][h] = w + (size_t)row * (size_t)k + q * 8;
        }
    /* This lane's tokens: g (+ 8 for the second n tile); absent tokens contribute zeros, loaded from nowhere. */
    const uint16_t *xrow[NT];
    bool xok[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int tok = nt * 8 + g;
        xok[nt] = tok < m;
        xrow[nt] = x + (size_t)(xok[nt] ? tok : 0) * (size_t)x_stride + q * 8;
    }

    float acc[TILES][NT][4];
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
     * (measured: bench/NOTES-gemm.md, session 13). */
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
     * loads into registers, one request per weight row, from lanes 0..ROWS-1. Measured (H200, bench/NOTES-gemm.md,
     * session 8): it pays a few percent on small and mid shapes only; on large shapes the in-loop requests (64-256
     * bytes each) cost more than they hide, so those configurations stay without it. Head only (PF = K3_PF_HEAD + H):
     * the H steps after the PIPE loaded ones, at the start, nothing in the loop. Under PDL a block starts when a block
     * of the previous kernel leaves, so these requests fill the DRAM while that kernel's last blocks drain and before
     * our griddepcontrol.wait returns (a timeline of 3584x7168 showed blocks leaving over ~3 us and the wait returning
     * ~0.75 us after the last). Measured (session 12): 32-64 KB per block gains 3-5% on the 51-60 MB shapes; 128 KB per
     * block loses 10-15%. */
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
         * the memory barrier of cluster.sync() cost 12-14% of the stall cycles of 144x7168 (ncu); without it
         * 144x7168 went from 2.10 / 2.30 / 2.65 to 1.88 / 2.11 / 2.53 us at M 1 / 8 / 16 (bench/NOTES-gemm.md,
         * session 12). A sender may leave with its stores in flight: they complete on rank 0's barrier, and
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
