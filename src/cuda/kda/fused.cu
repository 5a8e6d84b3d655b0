/* The KDA projection in one launch (K3_KDA_RUN_N_FUSED): QKVG, F_AB and F_B by one grid whose SMs are split
 * between the two jobs, instead of two streams sharing every SM.
 *
 * Why (bench/NOTES-kda.md, the one launch): under a streaming GEMM each SM gets about the same share of the memory
 * system, whatever it keeps in flight, so the branch costs QKVG what it adds to the SMs it shares. From m 9 the
 * table's QKVG (w4_t1_u4_l_h2: 384 blocks of 4 warps x 168 registers, three per SM) fills every SM's registers, and
 * its 384 tiles on 132 SMs are uneven anyway (120 SMs hold three, 12 hold two: a third of 12 SMs idles). Grouping
 * the tiles three to a block (one 384-thread block per SM) puts the same three tiles per SM on 128 SMs and leaves 4
 * SMs whole to the branch, whose bytes (F_AB 2 MB, f_b 0.4 MB, x) about fill them for as long.
 *
 * Block b < qkvg_blocks: three QKVG tiles of 16 rows, each by four warps, with the tile code and summation order of
 * the linear plan's w4_t1_u4_l_h2 (gemm_mma_tile.cuh; only the head prefetch differs, per m): qkvg is that kernel's,
 * bit for bit. Right after their griddepcontrol.wait these blocks also ask the branch's weights into L2 (4 KB requests
 * spread over them), so the branch SMs read them from L2.
 * Block b >= qkvg_blocks (a branch block, bb = b - qkvg_blocks of nbb):
 * 1. F_AB over its share of K (nbb near-equal chunk ranges): x's slice staged in shared memory (dynamic, xs_bytes),
 *    warp group j (4 warps) holds F_AB tiles j, j + 3, j + 6 and its warps split the chunks, two register groups of
 *    weights in flight; the group's sums per tile go to part[bb][tile] as 8-byte words tagged with the launch's epoch
 *    (the last completed launch's, read after griddepcontrol.wait, plus one).
 * 2. Every thread reads the words of its fab elements from every branch block, again until all carry this epoch:
 *    the reads are the wait (no count, no fence: tag and value are one single-copy-atomic store). The wait needs
 *    every branch block resident; they wait only for each other and the QKVG blocks, which never wait, free SMs for
 *    any that are not. Then its warps ask for their f_b weight fragments (two 16-row tiles each at most).
 * 3. fab = the branch blocks' sums added in block order (the same bits in every block), rounded to bf16 as stored;
 *    f_a kept in shared memory; block 0 stores fab and makes this epoch the last completed one (every branch block
 *    read the old one before storing its words, which block 0 has seen).
 * 4. g1 = f_a . W_fb^T: 16-row tiles over the branch warps; K = 128 = four chunks, each with its own accumulator,
 *    added pairwise, stored directly.
 * Launched with programmatic dependent launch, like the GEMM kernels: every block triggers the next launch and
 * waits for the previous grid between its weight and x loads. */
#include <stdint.h>
#include <stdlib.h>

#include "cuda/common/check.cuh"
#include "cuda/gemm/mma_tile.cuh"
#include "cuda/kda/proj.h"

namespace {

/* The QKVG tile configuration: w4_t1_u4_l_h2 (src/plan/gemm_configs.def), the SM90 table's 6144x7168 at m 9-16. Its
 * head prefetch (the weight steps asked into L2 before griddepcontrol.wait) is a template parameter of the kernel,
 * chosen per m by the table's kda rows (HEAD_STEPS, read into fused_head_steps); it does not change the arithmetic, so
 * qkvg keeps that configuration's bits. */
constexpr int KF_WARPS = 4, KF_UNROLL = 4, KF_L2B = 256, KF_PIPE = 1;
constexpr int KF_THREADS = K3_KDA_FUSED_TILES_PER_BLOCK * KF_WARPS * 32; /* 384: one block per SM at <= 168 regs */
constexpr int KF_SR = 16 + 4;               /* padded row stride of the reduction buffer (as the GEMM kernel's) */
constexpr int KF_FA_SR = K3_KDA_FA_DIM + 8; /* f_a row stride in shared memory (bf16 elements) */
/* The branch's F_AB: each warp group holds 3 F_AB tiles (fab_rows <= 144: 9 tiles over the 3 groups), 2 chunks per
 * step, two register groups in flight (x comes from shared memory, so only weights take registers). */
constexpr int KF_FAB_TILES = 3, KF_FAB_UNROLL = 2;
extern __shared__ uint4 kf_dyn_smem[];

/* The MMAs of one group of U chunks (at chunk offset c of the staged x slice, nc chunks long; chunks at or past nc
 * hold zero weights and read x at chunk 0, so they add exact zeros) for the warp's 3 tiles. The k map is the GEMM
 * kernel's: lane (g, q) holds 8 consecutive k at 8q of a chunk for weight rows g, g + 8 and token g. */
template <int U, int NT>
__device__ __forceinline__ void kf_fab_group(float (&acc)[KF_FAB_TILES][NT][4], const uint4 (&wv)[U][KF_FAB_TILES][2],
                                             const uint16_t *xs, int xs_stride, int c, int nc, int g, int q) {
#pragma unroll
    for (int j = 0; j < U; j++) {
        const int cc = c + j < nc ? c + j : 0;
        uint4 xq[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            xq[nt] = *reinterpret_cast<const uint4 *>(xs + (nt * 8 + g) * xs_stride + cc * 32 + q * 8);
#pragma unroll
        for (int t = 0; t < KF_FAB_TILES; t++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) k3_mma_chunk(acc[t][nt], wv[j][t][0], wv[j][t][1], xq[nt]);
    }
}

/* Diagnostic builds only (-DK3_KDA_FUSED_TRACE; bench/kda_fused_trace.c prints them): globaltimer stamps per block
 * of the last two launches (slot = the block's launch count & 1, counted per block index, so one launch's blocks
 * agree): [0] start, [1] the branch's F_AB sums stored, [2] the branch's reads of them done, [3] end, [4] the
 * branch's fab summed, [5] the branch's griddepcontrol.wait returned, [6] its x slice staged. Kept in thread 0's
 * registers, stored at the block's end. */
#ifdef K3_KDA_FUSED_TRACE
__device__ unsigned long long kf_trace[2][160][8];
__device__ unsigned int kf_launches[160];
#define K3_KF_TRACE_DECL                                                                                         \
    unsigned long long kf_t_[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                      \
    const unsigned kf_n_ = threadIdx.x == 0 && blockIdx.x < 160 ? atomicAdd(&kf_launches[blockIdx.x], 1u) : 0u
#define K3_KF_STAMP(i) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(kf_t_[i]))
#define K3_KF_TRACE_FLUSH()                                                                                      \
    do {                                                                                                         \
        if (threadIdx.x == 0 && blockIdx.x < 160)                                                                \
            for (int i_ = 0; i_ < 8; i_++) kf_trace[kf_n_ & 1u][blockIdx.x][i_] = kf_t_[i_];                     \
    } while (0)
#else
#define K3_KF_TRACE_DECL ((void)0)
#define K3_KF_STAMP(i) ((void)0)
#define K3_KF_TRACE_FLUSH() ((void)0)
#endif

struct kf_args {
    const uint16_t *x, *w, *w_fb;
    uint16_t *qkvg, *fab, *g1;
    unsigned long long *part; /* tagged partial sums: launch epoch << 32 | fp32 bits */
    uint32_t *epoch;          /* the epoch of the last completed launch */
    int m, hidden, qkvg_rows, fab_rows, fb_rows, qkvg_blocks, xs_stride;
};

__device__ __forceinline__ uint32_t kf_ld_relaxed_u32(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long kf_ld_relaxed_u64(const unsigned long long *p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void kf_st_relaxed_u64(unsigned long long *p, unsigned long long v) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* Barrier of one tile's four warps (ids 1..3; 0 is __syncthreads). */
__device__ __forceinline__ void kf_tile_sync(int tile) {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + tile), "r"(KF_WARPS * 32) : "memory");
}

/* A tile's epilogue, in two halves around kf_tile_sync: each warp stores its partial sums into red_w[token][row]
 * (C fragment: c0/c1 = row g, tokens 2q/2q+1; c2/c3 = row g+8), then kf_tile_sum adds the four warps' sums of one
 * (token, row) in warp order from 0, as the GEMM kernel's epilogue does (the same bits). */
template <int NT>
__device__ __forceinline__ void kf_tile_partials(float (&red_w)[NT * 8][KF_SR], const float (&acc)[NT][4], int lane) {
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int tk = nt * 8 + 2 * q;
        red_w[tk][g] = acc[nt][0];
        red_w[tk + 1][g] = acc[nt][1];
        red_w[tk][g + 8] = acc[nt][2];
        red_w[tk + 1][g + 8] = acc[nt][3];
    }
}

template <int NT>
__device__ __forceinline__ float kf_tile_sum(const float (&red)[KF_WARPS][NT * 8][KF_SR], int tk, int r) {
    float s = 0.0f;
#pragma unroll
    for (int wi = 0; wi < KF_WARPS; wi++) s += red[wi][tk][r];
    return s;
}

/* The branch's weights (F_AB rows, then f_b) asked into L2 by the QKVG blocks, 4 KB per request spread over them:
 * DRAM serves each SM about the same share, and a branch SM that also had to fetch them would end its F_AB after
 * QKVG; from L2 its loads only cross to the SM. Asked for right after griddepcontrol.wait (k3_mma_tile_accumulate's
 * after_wait), not at the block's start: there the requests competed with the previous launch's last blocks, which
 * decide when the wait returns. */
struct kf_branch_prefetch {
    const kf_args *a;
    int tid;
    __device__ __forceinline__ void operator()() const {
        const size_t fab_bytes = (size_t)a->fab_rows * (size_t)a->hidden * 2, fb_bytes = (size_t)a->fb_rows * 256;
        const size_t reqs = (fab_bytes + fb_bytes + 4095) / 4096;
        const size_t stride = (size_t)KF_THREADS * a->qkvg_blocks;
        for (size_t i = blockIdx.x + (size_t)tid * a->qkvg_blocks; i < reqs; i += stride) {
            const size_t off = i * 4096;
            if (off < fab_bytes)
                k3_prefetch_l2((const char *)(a->w + (size_t)a->qkvg_rows * (size_t)a->hidden) + off,
                               (uint32_t)min((size_t)4096, fab_bytes - off));
            else
                k3_prefetch_l2((const char *)a->w_fb + (off - fab_bytes),
                               (uint32_t)min((size_t)4096, fb_bytes - (off - fab_bytes)));
        }
    }
};

template <int NT, int PF>
__global__ void __launch_bounds__(KF_THREADS, 1) kda_fused_kernel(const kf_args a) {
    __shared__ float red[K3_KDA_FUSED_TILES_PER_BLOCK][KF_WARPS][NT * 8][KF_SR];
    __shared__ __align__(16) uint16_t fa_s[16][KF_FA_SR];
    const int tid = threadIdx.x, tile = tid / (KF_WARPS * 32), ttid = tid % (KF_WARPS * 32);
    const int packed = a.qkvg_rows + a.fab_rows, chunks = a.hidden / 32;
    const uint64_t pol = k3_policy_evict_first();
    float acc[1][NT][4];
    K3_KF_TRACE_DECL;
    K3_KF_STAMP(0);

    if ((int)blockIdx.x < a.qkvg_blocks) { /* three QKVG tiles */
        const int row0 = ((int)blockIdx.x * K3_KDA_FUSED_TILES_PER_BLOCK + tile) * 16;
        k3_mma_tile_accumulate<KF_WARPS, 1, KF_UNROLL, PF, KF_L2B, KF_PIPE, NT>(
            acc, a.x, a.hidden, a.w, a.m, packed, a.hidden, row0, 0, chunks, ttid, pol, kf_branch_prefetch{&a, tid});
        kf_tile_partials<NT>(red[tile][ttid >> 5], acc[0], ttid & 31);
        kf_tile_sync(tile);
        for (int e = ttid; e < a.m * 16; e += KF_WARPS * 32) {
            const int tk = e / 16, r = e % 16;
            const float s = kf_tile_sum<NT>(red[tile], tk, r);
            a.qkvg[(size_t)tk * (size_t)a.qkvg_rows + (size_t)(row0 + r)] = k3_f32_to_bf16_dev(s);
        }
        K3_KF_STAMP(3);
        K3_KF_TRACE_FLUSH();
        return;
    }

    /* ---- a branch block ---- */
    const int bb = (int)blockIdx.x - a.qkvg_blocks, nbb = (int)gridDim.x - a.qkvg_blocks;
    const int lane = tid & 31, gw = bb * (KF_THREADS / 32) + tid / 32, gwarps = nbb * (KF_THREADS / 32);
    const int g = lane >> 2, q = lane & 3, fbtiles = a.fb_rows / 16, ftiles = a.fab_rows / 16;
    for (int i = tid; i < 16 * KF_FA_SR; i += KF_THREADS) (&fa_s[0][0])[i] = 0; /* tokens >= m multiply zeros */

    /* 1. F_AB over this block's K range: warp group `tile` takes F_AB tiles tile, tile + 3, tile + 6 (rows past
     * fab_rows read the last row and are never stored), its 4 warps split the chunks; x's slice is staged in shared
     * memory, so the registers hold two groups of weights in flight and no x */
    const int c_lo = bb * chunks / nbb, c_hi = (bb + 1) * chunks / nbb, nc = c_hi - c_lo;
    uint32_t epoch = 0;
    uint16_t *xs = reinterpret_cast<uint16_t *>(kf_dyn_smem); /* [16 tokens][xs_stride] */
    {
        const int w4 = ttid >> 5;
        const uint16_t *wrow[KF_FAB_TILES][2];
#pragma unroll
        for (int t = 0; t < KF_FAB_TILES; t++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                wrow[t][h] = a.w + (size_t)(a.qkvg_rows + min((tile + 3 * t) * 16 + h * 8 + g, a.fab_rows - 1)) *
                                       (size_t)a.hidden + q * 8;
        constexpr int U = KF_FAB_UNROLL, STEP = KF_WARPS * KF_FAB_UNROLL;
        uint4 wa[U][KF_FAB_TILES][2], wb[U][KF_FAB_TILES][2];
        int c0 = c_lo + w4 * U;
        k3_mma_load_w<U, KF_FAB_TILES, KF_L2B>(wa, wrow, c0, c_hi, pol);
        k3_mma_load_w<U, KF_FAB_TILES, KF_L2B>(wb, wrow, c0 + STEP, c_hi, pol);
        k3_pdl_launch();
        k3_pdl_wait(); /* x, and the previous launch's epoch, come from the previous kernels */
        epoch = kf_ld_relaxed_u32(a.epoch) + 1u;
        K3_KF_STAMP(5);
        for (int i = tid; i < 16 * (nc * 4); i += KF_THREADS) { /* 16-byte vectors; tokens >= m: zeros */
            const int tk = i / (nc * 4), v = i - tk * (nc * 4);
            *reinterpret_cast<uint4 *>(xs + tk * a.xs_stride + v * 8) =
                tk < a.m ? k3_ld_act(a.x + (size_t)tk * (size_t)a.hidden + (size_t)c_lo * 32 + v * 8)
                         : make_uint4(0, 0, 0, 0);
        }
        __syncthreads();
        K3_KF_STAMP(6);
        float fa[KF_FAB_TILES][NT][4] = {};
        for (; c0 < c_hi; c0 += 2 * STEP) { /* steps past c_hi hold zero weights: they add exact zeros */
            kf_fab_group<U, NT>(fa, wa, xs, a.xs_stride, c0 - c_lo, nc, g, q);
            if (c0 + STEP >= c_hi) break;
            k3_mma_load_w<U, KF_FAB_TILES, KF_L2B>(wa, wrow, c0 + 2 * STEP, c_hi, pol);
            kf_fab_group<U, NT>(fa, wb, xs, a.xs_stride, c0 + STEP - c_lo, nc, g, q);
            k3_mma_load_w<U, KF_FAB_TILES, KF_L2B>(wb, wrow, c0 + 3 * STEP, c_hi, pol);
        }
        /* the group's four warps added per tile in warp order; this block's K range of each tile to part */
#pragma unroll
        for (int t = 0; t < KF_FAB_TILES; t++) {
            kf_tile_partials<NT>(red[tile][ttid >> 5], fa[t], ttid & 31);
            kf_tile_sync(tile);
            const int ft = tile + 3 * t;
            if (ft < ftiles) {
                unsigned long long *dst = a.part + (size_t)(bb * ftiles + ft) * 256;
                for (int e = ttid; e < a.m * 16; e += KF_WARPS * 32) {
                    const float s = kf_tile_sum<NT>(red[tile], e / 16, e % 16);
                    kf_st_relaxed_u64(dst + e, (unsigned long long)epoch << 32 | __float_as_uint(s));
                }
            }
            kf_tile_sync(tile); /* red is free for the next tile */
        }
    }
    K3_KF_STAMP(1);

    uint4 wf[K3_KDA_FUSED_MAX_FB_TILES][4][2]; /* this warp's f_b tiles */
    /* 3. fab = the branch blocks' K ranges added in block order, rounded as stored; f_a kept in shared memory. */
    {
        constexpr int EPT = (16 * K3_KDA_FUSED_MAX_FAB_ROWS + KF_THREADS - 1) / KF_THREADS;
        unsigned long long v[EPT][K3_KDA_FUSED_MAX_BRANCH_BLOCKS];
        const unsigned long long *src[EPT];
#pragma unroll
        for (int i = 0; i < EPT; i++) {
            const int e = tid + i * KF_THREADS, tk = e / a.fab_rows, r = e - tk * a.fab_rows;
            src[i] = e < a.m * a.fab_rows ? a.part + (size_t)(r / 16) * 256 + tk * 16 + r % 16 : nullptr;
#pragma unroll
            for (int j = 0; j < K3_KDA_FUSED_MAX_BRANCH_BLOCKS; j++) v[i][j] = (unsigned long long)(epoch - 1u) << 32;
        }
        /* every stale word read again (all of them at once) until each carries this launch's epoch: the reads are
         * the wait, no count, no fence (a word's tag and value are one 8-byte single-copy-atomic store) */
        for (bool stale = true; stale;) {
            stale = false;
#pragma unroll
            for (int i = 0; i < EPT; i++)
#pragma unroll
                for (int j = 0; j < K3_KDA_FUSED_MAX_BRANCH_BLOCKS; j++)
                    if (src[i] && j < nbb && (uint32_t)(v[i][j] >> 32) != epoch)
                        v[i][j] = kf_ld_relaxed_u64(src[i] + (size_t)j * ftiles * 256);
#pragma unroll
            for (int i = 0; i < EPT; i++)
#pragma unroll
                for (int j = 0; j < K3_KDA_FUSED_MAX_BRANCH_BLOCKS; j++)
                    stale |= src[i] && j < nbb && (uint32_t)(v[i][j] >> 32) != epoch;
        }
        K3_KF_STAMP(2);
        /* this warp's f_b weight fragments, asked for once the sums are read: they load while the sums are added
         * and stored (asked for before the wait, they did not fit in registers beside the words read: the spill
         * stores waited for them, and g1 read them back from local memory) */
#pragma unroll
        for (int i = 0; i < K3_KDA_FUSED_MAX_FB_TILES; i++) {
            const int tt = gw + i * gwarps;
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    wf[i][j][h] = tt < fbtiles ? k3_ld_stream(a.w_fb + (size_t)(tt * 16 + h * 8 + g) * K3_KDA_FA_DIM +
                                                                  j * 32 + q * 8,
                                                              pol)
                                               : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < EPT; i++) {
            const int e = tid + i * KF_THREADS, tk = e / a.fab_rows, r = e % a.fab_rows;
            float sum = __uint_as_float((uint32_t)v[i][0]);
#pragma unroll
            for (int j = 1; j < K3_KDA_FUSED_MAX_BRANCH_BLOCKS; j++)
                if (j < nbb) sum += __uint_as_float((uint32_t)v[i][j]);
            if (e < a.m * a.fab_rows) {
                const uint16_t b16 = k3_f32_to_bf16_dev(sum);
                if (r < K3_KDA_FA_DIM) fa_s[tk][r] = b16;
                if (bb == 0) a.fab[(size_t)tk * (size_t)a.fab_rows + r] = b16;
            }
        }
    }
    __syncthreads();
    /* Block 0 has seen every branch block's partial sums of this launch, each stored after its threads read the
     * epoch: no block of this launch reads it again, so this launch's epoch becomes the last completed one (the next
     * launch reads it after its griddepcontrol.wait). */
    if (bb == 0 && tid == 0) *a.epoch = epoch;
    K3_KF_STAMP(4);
    /* 4. g1 = f_a . W_fb^T: this warp's 16-row tiles (the plan gives every warp at most MAX_FB_TILES) */
#pragma unroll
    for (int i = 0; i < K3_KDA_FUSED_MAX_FB_TILES; i++) {
        const int tt = gw + i * gwarps;
        if (tt >= fbtiles) break;
        float c[4][NT][4] = {}; /* one accumulator per K chunk, added pairwise below */
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint4 xq = *reinterpret_cast<const uint4 *>(&fa_s[nt * 8 + g][j * 32 + q * 8]);
                k3_mma_chunk(c[j][nt], wf[i][j][0], wf[i][j][1], xq);
            }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int row = tt * 16 + g + (k >= 2 ? 8 : 0), tk = nt * 8 + 2 * q + (k & 1);
                const float sum = (c[0][nt][k] + c[1][nt][k]) + (c[2][nt][k] + c[3][nt][k]);
                if (tk < a.m) a.g1[(size_t)tk * (size_t)a.fb_rows + row] = k3_f32_to_bf16_dev(sum);
            }
    }
    K3_KF_STAMP(3);
    K3_KF_TRACE_FLUSH();
}

/* The kernel instances: [NT - 1][head steps - 1] (NT = 1 up to m 8). */
typedef void (*kf_kernel)(const kf_args);
constexpr kf_kernel kf_kernels[2][K3_KDA_FUSED_MAX_HEAD_STEPS] = {
    {kda_fused_kernel<1, K3_PF_HEAD + 1>, kda_fused_kernel<1, K3_PF_HEAD + 2>},
    {kda_fused_kernel<2, K3_PF_HEAD + 1>, kda_fused_kernel<2, K3_PF_HEAD + 2>}};

} // namespace

#ifdef K3_KDA_FUSED_TRACE
/* out: kf_trace ([2][160][8]); returns the number of launches block 0 has run (the last one's slot is (n - 1) & 1),
 * or 0 on failure */
extern "C" unsigned k3x_kda_fused_trace(unsigned long long *out) {
    unsigned n[160];
    if (cudaMemcpyFromSymbol(out, kf_trace, sizeof kf_trace) != cudaSuccess ||
        cudaMemcpyFromSymbol(n, kf_launches, sizeof n) != cudaSuccess)
        return 0;
    return n[0];
}
#endif

extern "C" k3_status k3_cuda_kda_fused_create(k3_ctx *ctx, const k3_kda_fused_layout *layout,
                                              k3_cuda_kda_fused **out) {
    *out = NULL;
    k3_cuda_kda_fused *f = (k3_cuda_kda_fused *)calloc(1, sizeof *f);
    if (!f) return k3_fail(ctx, K3_STATUS_OUT_OF_MEMORY, "out of host memory");
    f->layout = *layout;
    const size_t part =
        (size_t)layout->branch_blocks * (size_t)(layout->fab_rows / 16) * 256 * sizeof(unsigned long long);
    /* the staged x slice: above the 48 KB a launch gets by default */
    cudaError_t e = cudaSuccess;
    for (int nt = 0; nt < 2; nt++)
        for (int h = 0; h < K3_KDA_FUSED_MAX_HEAD_STEPS && e == cudaSuccess; h++)
            e = cudaFuncSetAttribute(kf_kernels[nt][h], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)layout->xs_bytes);
    if (e == cudaSuccess) e = cudaMalloc((void **)&f->part, part);
    if (e == cudaSuccess) e = cudaMalloc((void **)&f->epoch, sizeof(uint32_t));
    if (e == cudaSuccess) e = cudaMemset(f->epoch, 0, sizeof(uint32_t)); /* epoch 0: no launch yet */
    if (e == cudaSuccess) e = cudaMemset(f->part, 0, part);                   /* every tag 0: stale */
    if (e == cudaSuccess) e = cudaDeviceSynchronize(); /* plan time: zeros in place before any run */
    if (e != cudaSuccess) {
        k3_cuda_kda_fused_destroy(f);
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "kda one-launch projection: device buffers (%zu bytes): %s", part,
                       cudaGetErrorString(e));
    }
    *out = f;
    return K3_STATUS_SUCCESS;
}

extern "C" void k3_cuda_kda_fused_destroy(k3_cuda_kda_fused *f) {
    if (!f) return;
    if (f->part) cudaFree(f->part);
    if (f->epoch) cudaFree(f->epoch);
    free(f);
}

extern "C" k3_status k3_cuda_kda_fused_run(k3_ctx *ctx, const k3_cuda_kda_fused *f, int64_t m, int32_t head_steps,
                                           const void *x, const void *w_packed, const void *w_fb, void *qkvg,
                                           void *fab, void *g1, void *stream) {
    const k3_kda_fused_layout *l = &f->layout;
    if (m < 1 || m > K3_KDA_MAX_TOKENS || head_steps < 1 || head_steps > K3_KDA_FUSED_MAX_HEAD_STEPS)
        return k3_fail(ctx, K3_STATUS_INTERNAL_ERROR, "kda one-launch: unchecked m (%lld) or head steps (%d)",
                       (long long)m, (int)head_steps);
    const kf_args a = {(const uint16_t *)x, (const uint16_t *)w_packed, (const uint16_t *)w_fb, (uint16_t *)qkvg,
                       (uint16_t *)fab, (uint16_t *)g1, f->part, f->epoch, (int)m, (int)l->hidden,
                       (int)l->qkvg_rows, (int)l->fab_rows, (int)l->fb_rows, (int)l->qkvg_blocks,
                       (int)l->xs_stride};
    const dim3 grid((unsigned)(l->qkvg_blocks + l->branch_blocks)), block(KF_THREADS);
    const size_t smem = (size_t)l->xs_bytes;
    const cudaError_t e =
        k3_launch_pdl(kf_kernels[m <= 8 ? 0 : 1][head_steps - 1], grid, block, smem, (cudaStream_t)stream, a);
    if (e != cudaSuccess)
        return k3_fail(ctx, K3_STATUS_CUDA_ERROR, "launch of the kda one-launch projection failed: %s",
                       cudaGetErrorString(e));
    return K3_STATUS_SUCCESS;
}
