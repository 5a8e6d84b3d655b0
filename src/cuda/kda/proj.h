/* The two small KDA projection kernels (docs/gemm-plan.md, the KDA projection overlap), C-callable. */
#ifndef K3_CUDA_KDA_PROJ_H
#define K3_CUDA_KDA_PROJ_H

#include "core/internal.h"
#include "plan/kda_tuning.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Compile-time limits of the kernels (validated by the plan). */
#define K3_KDA_MAX_TOKENS 16
#define K3_KDA_FA_DIM 128 /* run_k: 16 lanes x 8 elements */

/* run_n: fab[m, rows] = x[m, hidden] . w[rows, hidden]^T; one block spans all of K. shape (K3_KDA_RUN_N_*):
 * ROWS1 / ROWS2 = hidden / 16 threads (16 elements each), one / two rows per block; hidden % 512 == 0 and
 * hidden <= 8192. NARROW = 128 threads (hidden / 1024 eight-element vectors each), one row per block, hidden %
 * 1024 == 0. */
/* SLICED = 128 threads = 16 rows x 8 lanes over one K slice per block, about one block per SM, the slices' partial
 * sums added by a group's last block; its state (partials, counts that are zero between launches) is the plan's,
 * so the runs of one plan must be ordered on the GPU. */
typedef struct k3_cuda_kda_sliced {
    float *part;     /* [slices][16 tokens][rows] */
    uint32_t *count; /* [groups] */
    int groups, slices;
    int nv_max; /* 8-element vectors in the largest slice (the shared x per token: nv_max x 16 bytes) */
} k3_cuda_kda_sliced;
k3_status k3_cuda_kda_sliced_create(k3_ctx *ctx, int64_t hidden, int64_t rows, k3_cuda_kda_sliced **out);
void k3_cuda_kda_sliced_destroy(k3_cuda_kda_sliced *sl);
k3_status k3_cuda_kda_run_n(k3_ctx *ctx, int64_t m, const void *x, int64_t hidden, const void *w, int64_t rows,
                            int32_t shape, const k3_cuda_kda_sliced *sl, void *fab, void *stream);
/* run_k: g1[m, rows] = fa[m, 0:128] . w[rows, 128]^T, fa rows fa_stride elements apart (the fab buffer).
 * after_shape: the shape of the run_n launched just before on this stream (0 if none). After a SLICED one, which
 * triggers it, run_k is launched with programmatic dependent launch: its weights load while run_n finishes. */
k3_status k3_cuda_kda_run_k(k3_ctx *ctx, int64_t m, const void *fa, int64_t fa_stride, const void *w, int64_t rows,
                            int32_t after_shape, void *g1, void *stream);

/* The whole projection in one launch (K3_KDA_RUN_N_FUSED, kda_fused.cu): QKVG tiles three to a block on
 * layout.qkvg_blocks SMs, F_AB and F_B on layout.branch_blocks more; its tagged partial sums and launch epoch are the
 * plan's, so the runs of one plan must be ordered on the GPU. */
typedef struct k3_cuda_kda_fused {
    k3_kda_fused_layout layout;
    unsigned long long *part; /* [branch blocks][F_AB tiles][16 tokens][16 rows]: epoch << 32 | fp32 bits */
    uint32_t *epoch;          /* the last completed launch's epoch (0: none yet) */
} k3_cuda_kda_fused;
k3_status k3_cuda_kda_fused_create(k3_ctx *ctx, const k3_kda_fused_layout *layout, k3_cuda_kda_fused **out);
void k3_cuda_kda_fused_destroy(k3_cuda_kda_fused *f);
/* qkvg[m, qkvg_rows], fab[m, fab_rows] and g1[m, fb_rows] from x[m, hidden], the packed weight and W_fb[fb_rows,
 * 128], on `stream`, launched with programmatic dependent launch; head_steps (1..K3_KDA_FUSED_MAX_HEAD_STEPS) is the
 * tuning's fused_head_steps[m]. */
k3_status k3_cuda_kda_fused_run(k3_ctx *ctx, const k3_cuda_kda_fused *f, int64_t m, int32_t head_steps,
                                const void *x, const void *w_packed, const void *w_fb, void *qkvg, void *fab,
                                void *g1, void *stream);

#ifdef __cplusplus
}
#endif
#endif
