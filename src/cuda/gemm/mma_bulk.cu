/* Tensor-core small-M BF16 GEMM whose weights stream through a shared-memory ring filled by the copy engine:
 * y[m, n] = x[m, k] w[n, k]^T (+ residual), fp32 accumulation. For shapes whose grid is about one block per SM
 * (2112 x 7168: 132 tiles of 16 rows; 1536 x 7168: 96), where the register-pipelined kernel (mma.cu) holds too
 * few bytes in flight per SM, and HBM idles while a kernel's blocks drain and the next kernel waits.
 *
 * A block owns one 16-row weight tile over its K range (the CLUSTER_K blocks of a cluster split K, reduced as in
 * mma.cu: gemm/mma_reduce.cuh). The last warp is the producer: for each ring stage, lane r asks the copy engine for
 * weight row r's BK elements (one bulk copy per row, completing the stage's mbarrier). The first STAGES stages are
 * asked for before griddepcontrol.wait, so under PDL they stream while the previous kernel drains. The WARPS
 * consumer warps each take a fixed slice of every stage's 32-element chunks, in the register kernel's k map: 16-byte
 * shared-memory loads of weight rows g and g + 8, and x (small, read from L2 by every block) loaded into registers
 * one stage ahead, never copied. A consumer thread arrives on the slot's named barrier when done with it; the
 * producer syncs on that barrier before refilling the slot.
 * Why so: the copy engine's cost is per request (bench/NOTES-gemm.md): one thread issuing every copy, or copies of
 * 1 KB, or x rows copied per stage each made the kernel slower than mma.cu; 16 copies of 3.5 KB per stage, issued
 * by one warp instruction, made it faster. Why named barriers: with mbarrier arrivals releasing the slots,
 * racecheck reported the refills as racing the reads (it does not relate those arrivals to the copies).
 * Rows past n copy row n - 1 and are never stored; tokens past m load zeros. Sums: per warp in K order, then warp
 * order, then rank order: bitwise reproducible. Needs k % (BK * CLUSTER_K) == 0 (the registry's k_align). */
#include "cuda/common/bulk_copy.cuh"
#include "cuda/gemm/mma_reduce.cuh"
#include "cuda/gemm/mma_tile.cuh"

namespace {

/* Bytes per weight row of a ring stage of BK K elements in shared memory: padded by 64 bytes, so that the two rows
 * a quarter warp reads with one 16-byte load each (rows g and g + 1 at the same 64 bytes) fall in distinct banks. */
constexpr int bulk_row_bytes(int bk) { return bk * 2 + 64; }
/* Bytes of one ring stage: the 16 weight rows. */
constexpr int bulk_stage_bytes(int bk) { return 16 * bulk_row_bytes(bk); }
/* Stages that fit in SMEM_KB kilobytes (at least 2). */
constexpr int bulk_stages(int bk, int smem_kb) {
    return smem_kb * 1024 / bulk_stage_bytes(bk) < 2 ? 2 : smem_kb * 1024 / bulk_stage_bytes(bk);
}

__device__ __forceinline__ uint4 k3_lds128(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

template <int WARPS, int BK, int SMEM_KB, int CLUSTER_K, int NT>
__global__ void __launch_bounds__((WARPS + 1) * 32, 1)
    k3_mma_bulk_kernel(const uint16_t *__restrict__ x, int64_t x_stride, const uint16_t *__restrict__ w,
                       const uint16_t *residual, uint16_t *y, int64_t y_stride, int32_t m, int32_t n, int32_t k) {
    constexpr int STAGES = bulk_stages(BK, SMEM_KB);
    constexpr int SB = bulk_stage_bytes(BK), ROW = bulk_row_bytes(BK);
    constexpr int THREADS = (WARPS + 1) * 32;
    constexpr int CPW = BK / 32 / WARPS; /* 32-element K chunks per consumer warp and stage */
    static_assert(BK % (32 * WARPS) == 0, "the consumer warps split a stage's chunks evenly");
    static_assert(sizeof(k3_mma_red_buf<WARPS, 1, NT>) <= STAGES * SB, "the reduction buffer reuses the ring");
    extern __shared__ __align__(128) unsigned char bulk_ring[];
    static_assert(STAGES <= 15, "a named barrier (1..15) per ring slot");
    __shared__ __align__(8) uint64_t full[STAGES];
    __shared__ __align__(8) uint64_t part_bar;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int row0 = blockIdx.x * 16;
    const int nst = k / (BK * CLUSTER_K); /* stages of this block */
    const int k0 = CLUSTER_K > 1 ? (int)blockIdx.y * nst * BK : 0;
    k3_mma_split_begin<CLUSTER_K, 16>(&part_bar, m, tid);

    /* The producer warp: lane r copies weight row r of a stage (lane 0 announcing the stage's bytes first), so a
     * stage is 16 copies issued by one warp instruction. */
    auto issue_w = [&](int i, uint64_t pol) {
        uint64_t *bar = &full[i % STAGES];
        if (lane == 0) k3_mbar_arrive_expect_tx(bar, 16u * BK * 2u);
        __syncwarp();
        if (lane < 16) {
            const int row = min(row0 + lane, n - 1);
            k3_bulk_copy_g2s_tx(bulk_ring + (i % STAGES) * SB + lane * ROW,
                                w + (size_t)row * (size_t)k + k0 + (size_t)i * BK, BK * 2u, bar, pol);
        }
    };
    const int head = min(nst, STAGES);
    if (warp == WARPS) {
        if (lane == 0) {
            for (int s = 0; s < STAGES; s++) k3_mbar_init(&full[s]); /* the producer's arrival, with the bytes */
            k3_mbar_init_fence();
        }
        __syncwarp();
        const uint64_t pol = k3_policy_evict_first();
        for (int i = 0; i < head; i++) issue_w(i, pol); /* weights never depend on the previous kernel */
    }
    __syncthreads(); /* the barriers are initialized before anyone waits on them */
    /* As mma.cu: the next kernel may launch once every block is here; its own wait orders it after us. */
    k3_pdl_launch();
    k3_pdl_wait(); /* x and residual come from the previous kernel */

    float acc[1][NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[0][nt][i] = 0.0f;

    if (warp == WARPS) {
        const uint64_t pol = k3_policy_evict_first();
        for (int i = STAGES; i < nst; i++) {
            /* the slot is free once every consumer thread has arrived on its named barrier (1 + slot) after reading it;
             * then the consumers' reads (generic proxy) are ordered before the copy engine's writes (async proxy) */
            asm volatile("bar.sync %0, %1;" ::"r"(1 + i % STAGES), "r"(THREADS) : "memory");
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            issue_w(i, pol);
        }
    } else {
        /* Operands in the register kernel's k map (mma.cu's file comment): lane (g, q) reads 16 bytes at 8q of each
         * 32-element chunk, of weight rows g and g + 8 from the ring and of token g (+ 8) from x, which stays in
         * registers one stage ahead (x is small and read from L2 by every block; only the weights take copies). */
        const int g = lane >> 2, q = lane & 3;
        const uint16_t *xrow[NT];
        bool xok[NT];
        k3_mma_lane_tokens<NT>(xrow, xok, x, x_stride, m, g, q);
        const int c_end = (k0 + nst * BK) / 32;    /* this block's last chunk + 1 */
        const int c_first = k0 / 32 + warp * CPW; /* this warp's first chunk of stage 0 */
        uint4 xa[CPW][NT], xb[CPW][NT];
        k3_mma_load_x<CPW, NT>(xa, xrow, xok, c_first, c_end);
        const uint32_t lane_off = (uint32_t)(g * ROW + warp * CPW * 64 + q * 16);
        for (int i = 0; i < nst; i++) {
            const int s = i % STAGES;
            k3_mma_load_x<CPW, NT>(xb, xrow, xok, c_first + (i + 1) * (BK / 32), c_end); /* the next stage's */
            k3_mbar_wait(&full[s], (uint32_t)((i / STAGES) & 1));
            const uint32_t base = (uint32_t)__cvta_generic_to_shared(bulk_ring) + (uint32_t)(s * SB) + lane_off;
#pragma unroll
            for (int j = 0; j < CPW; j++) {
                const uint4 lo = k3_lds128(base + (uint32_t)(j * 64)), hi = k3_lds128(base + (uint32_t)(8 * ROW + j * 64));
#pragma unroll
                for (int nt = 0; nt < NT; nt++) k3_mma_chunk(acc[0][nt], lo, hi, xa[j][nt]);
            }
            /* release the slot where the producer will refill it (a named barrier: every consumer thread arrives) */
            if (i + STAGES < nst) asm volatile("bar.arrive %0, %1;" ::"r"(1 + s), "r"(THREADS) : "memory");
#pragma unroll
            for (int j = 0; j < CPW; j++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) xa[j][nt] = xb[j][nt];
        }
    }

    /* Every copy has landed and been read (the consumers waited for all nst stages): the ring is free. */
    __syncthreads();
    auto &red = *reinterpret_cast<k3_mma_red_buf<WARPS, 1, NT> *>(bulk_ring);
    if (warp < WARPS) k3_mma_store_partials<WARPS, 1, NT>(red, acc, warp, lane >> 2, lane & 3);
    __syncthreads();
    k3_mma_reduce_store<WARPS, 1, NT, CLUSTER_K, THREADS>(red, &part_bar, residual, y, y_stride, m, n, row0, tid);
}

/* The ring's dynamic shared memory (bytes) of a configuration. */
template <int BK, int SMEM_KB>
constexpr int bulk_ring_bytes() {
    return bulk_stages(BK, SMEM_KB) * bulk_stage_bytes(BK);
}

template <int WARPS, int BK, int SMEM_KB, int CLUSTER_K, int NT>
cudaError_t k3_mma_bulk_launch_nt(const k3_gemm_args *a, cudaStream_t stream, int pdl) {
    constexpr int bytes = bulk_ring_bytes<BK, SMEM_KB>();
    auto kernel = k3_mma_bulk_kernel<WARPS, BK, SMEM_KB, CLUSTER_K, NT>;
    cudaLaunchConfig_t lc;
    cudaLaunchAttribute attr[2];
    k3_gemm_launch_cfg_init(&lc, attr, dim3((unsigned)((a->n + 15) / 16), CLUSTER_K), dim3((WARPS + 1) * 32), stream,
                            pdl);
    lc.dynamicSmemBytes = (size_t)bytes;
    k3_gemm_launch_cfg_cluster_k(&lc, attr, CLUSTER_K); /* the K-splitting blocks of one row tile form a cluster */
    return k3_mma_launch_ex(&lc, kernel, a);
}

} // namespace

/* Lets both token-tile instances ask for the ring (over the default 48 KB of dynamic shared memory) on the current
 * device: an attribute of the functions, set once when a plan is made (k3_cuda_gemm_prepare), not per launch. */
template <int WARPS, int BK, int SMEM_KB, int CLUSTER_K>
cudaError_t k3_mma_bulk_prepare(void) {
    constexpr int bytes = bulk_ring_bytes<BK, SMEM_KB>();
    cudaError_t e = cudaFuncSetAttribute(k3_mma_bulk_kernel<WARPS, BK, SMEM_KB, CLUSTER_K, 1>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(k3_mma_bulk_kernel<WARPS, BK, SMEM_KB, CLUSTER_K, 2>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    return e;
}

template <int WARPS, int BK, int SMEM_KB, int CLUSTER_K>
cudaError_t k3_mma_bulk_launch(const k3_gemm_args *a, cudaStream_t stream, int pdl) {
    static_assert(CLUSTER_K >= 1 && CLUSTER_K <= 8, "portable cluster size");
    static_assert(SMEM_KB >= 1 && SMEM_KB <= 226, "the ring must fit an SM90 block's shared memory");
    if (a->m <= 8) return k3_mma_bulk_launch_nt<WARPS, BK, SMEM_KB, CLUSTER_K, 1>(a, stream, pdl);
    if (a->m <= 16) return k3_mma_bulk_launch_nt<WARPS, BK, SMEM_KB, CLUSTER_K, 2>(a, stream, pdl);
    return cudaErrorInvalidValue;
}

#define K3_GEMM_SKINNY(nm, thr, rows, unroll, sk)
#define K3_GEMM_MMA(nm, warps, tiles, unroll, cluster_k, pf, minb, l2b, pipe)
#define K3_GEMM_MMA_WT(nm, warps, tiles, unroll, minb)
#define K3_GEMM_MMA_BULK(nm, warps, bk, smem_kb, cluster_k)                                                        \
    template cudaError_t k3_mma_bulk_launch<warps, bk, smem_kb, cluster_k>(const k3_gemm_args *, cudaStream_t, int); \
    template cudaError_t k3_mma_bulk_prepare<warps, bk, smem_kb, cluster_k>(void);
#include "plan/gemm_configs.def"
#undef K3_GEMM_SKINNY
#undef K3_GEMM_MMA
#undef K3_GEMM_MMA_WT
#undef K3_GEMM_MMA_BULK
