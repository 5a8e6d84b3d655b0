/* The KDA projection's per-m choices, read from the context's plan table (its kda rows, src/plan/table.h), and
 * the layout of the one-launch projection. */
#ifndef K3_PLAN_KDA_TUNING_H
#define K3_PLAN_KDA_TUNING_H

#include "k3.h"

struct k3_table_kda;

typedef struct k3_kda_tuning {
    int64_t overlap_max_tokens;       /* overlap the aux branch for m <= this */
    k3_kda_run_n run_n_shape[17];     /* index m (1..16): the run_n block shape, K3_KDA_RUN_N_ROWS1/ROWS2/NARROW/
                                         SLICED, or FUSED (the whole projection in one launch) */
    k3_kda_qkvg qkvg_kernel[17];      /* index m (1..16): K3_KDA_QKVG_TABLE (the linear plan's table) or
                                         K3_KDA_QKVG_CUBLASLT for QKVG */
    int32_t fused_head_steps[17];     /* index m (1..16), where the one launch runs: the QKVG tiles' weight steps
                                         asked into L2 before griddepcontrol.wait, 1..K3_KDA_FUSED_MAX_HEAD_STEPS
                                         (the bits do not depend on it) */
    k3_kda_run_n unfused_shape[17];   /* index m (1..16): what k3_kda_tuning_drop_fused puts in place of FUSED */
    k3_kda_qkvg unfused_qkvg[17];     /* index m (1..16): and the QKVG kernel beside it */
} k3_kda_tuning;

/* The tuning of a table's kda rows (rows->present must be 1). */
void k3_kda_tuning_from_rows(const struct k3_table_kda *rows, k3_kda_tuning *out);
/* The tuning plans on ctx use: the kda rows of the context's table (k3_linear_ctx_table), or, where a loaded table
 * has none, of the embedded table of the context's architecture; on an architecture without a table (a CPU
 * context without a simulated capability) the unmeasured defaults: overlap through 14, one-row F_AB blocks and the
 * table's QKVG at every m, two head steps. Errors as k3_linear_ctx_table's (with a message on ctx). */
k3_status k3_kda_tuning_for_ctx(k3_ctx *ctx, k3_kda_tuning *out);
/* Where the one-launch projection (K3_KDA_RUN_N_FUSED) cannot run on this device (k3_kda_fused_layout_for): the
 * table's unfused choice at those m. */
void k3_kda_tuning_drop_fused(k3_kda_tuning *t);

/* The grid of the one-launch projection (src/cuda/kda/fused.cu): QKVG tiles of 16 rows, TILES_PER_BLOCK to a
 * block (one block per SM), then branch blocks on the remaining SMs, each taking every F_AB tile over its share
 * of K (its x slice staged in xs_bytes of shared memory, rows xs_stride elements apart). */
#define K3_KDA_FUSED_TILES_PER_BLOCK 3
/* The linear plan's configuration whose tile code and summation order the QKVG tiles share (gemm_mma_tile.cuh) */
#define K3_KDA_FUSED_QKVG_CONFIG "w4_t1_u4_l_h2"
#define K3_KDA_FUSED_MAX_BRANCH_BLOCKS 4
#define K3_KDA_FUSED_MAX_FAB_ROWS 144 /* 9 F_AB tiles: 3 per warp group */
#define K3_KDA_FUSED_MAX_FB_TILES 2   /* 16-row f_b tiles per branch warp (registers held across the wait) */
#define K3_KDA_FUSED_MAX_XS_BYTES (100 * 1024)
#define K3_KDA_FUSED_MAX_HEAD_STEPS 2 /* head prefetch steps compiled (kernel instances 1..2) */
typedef struct k3_kda_fused_layout {
    int64_t hidden, qkvg_rows, fab_rows, fb_rows;
    int32_t qkvg_blocks, branch_blocks;
    int32_t xs_stride, xs_bytes;
} k3_kda_fused_layout;
/* 1 and *out when the one-launch projection fits this shape on a device of sm_count SMs (every block resident at
 * once: qkvg_rows / 48 + 2 <= sm_count), else 0 and a reason. */
int32_t k3_kda_fused_layout_for(int32_t sm_count, int64_t hidden, int64_t qkvg_rows, int64_t fab_rows,
                                int64_t fb_rows, int64_t fa_dim, k3_kda_fused_layout *out, const char **why);

#endif
