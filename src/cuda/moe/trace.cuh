/* Diagnostic builds only (-DK3_MOE_TRACE, read by `k3 bench block --trace` in such a build): globaltimer stamps per
 * block of GEMM1, GEMM2 and the combine, for the last two launches of each (slot = the block's own launch count &
 * 1, so the blocks of one launch agree while the grid stays the same). Thread 0 keeps them in registers and stores
 * them, with its SM id in the last word, when the block leaves. k3x_moe_trace (launch.cu) copies them out. In
 * other builds every macro is empty. The stamps:
 *   GEMM1: 0 start, 1 routed, 2 ring fill issued, 3 before the pass loop, 4 the first pass's main loop done,
 *          5 its partials synced, 6 end (a block that leaves: 0 and 6)
 *   GEMM2: 0 start, 1 routed, 2 PDL wait returned, 3 end
 *   combine: 0 start, 1 PDL wait returned, 2 end */
#ifndef K3_CUDA_MOE_TRACE_CUH
#define K3_CUDA_MOE_TRACE_CUH
#ifdef K3_MOE_TRACE
#include "cuda/moe/moe.h" /* MT_*: blocks traced per kernel (linear block index) and words per block */
__device__ unsigned long long mt_g1[2][MT_G1_BLOCKS][MT_WORDS], mt_g2[2][MT_G2_BLOCKS][MT_WORDS],
    mt_cb[2][MT_CB_BLOCKS][MT_WORDS];
__device__ unsigned int mt_g1n[MT_G1_BLOCKS], mt_g2n[MT_G2_BLOCKS], mt_cbn[MT_CB_BLOCKS];
/* at the kernel's start: the stamps' registers and stamp 0 */
#define K3_MT_BEGIN                                                                                              \
    unsigned long long mt_t_[MT_WORDS] = {0, 0, 0, 0, 0, 0, 0, 0};                                               \
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(mt_t_[0]))
#define K3_MT_STAMP(i) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(mt_t_[i]))
/* stamp i, then the block's stamps into kernel K's arrays (K: g1, g2 or cb) */
#define K3_MT_END(K, i)                                                                                          \
    do {                                                                                                         \
        K3_MT_STAMP(i);                                                                                          \
        const unsigned b_ = blockIdx.y * gridDim.x + blockIdx.x;                                                 \
        if (threadIdx.x == 0 && b_ < sizeof mt_##K##n / sizeof mt_##K##n[0]) {                                   \
            unsigned sm_;                                                                                        \
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm_));                                                     \
            mt_t_[MT_WORDS - 1] = sm_;                                                                           \
            const unsigned n_ = atomicAdd(&mt_##K##n[b_], 1u);                                                   \
            for (int i_ = 0; i_ < MT_WORDS; i_++) mt_##K[n_ & 1u][b_][i_] = mt_t_[i_];                           \
        }                                                                                                        \
    } while (0)
#else
#define K3_MT_BEGIN ((void)0)
#define K3_MT_STAMP(i) ((void)0)
#define K3_MT_END(K, i) ((void)0)
#endif
#endif
