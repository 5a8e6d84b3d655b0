#include "plan/kda_tuning.h"

#include <string.h>

#include "plan/linear_plan.h"
#include "plan/table.h"

_Static_assert(K3_KDA_FUSED_MAX_HEAD_STEPS == K3_TABLE_KDA_MAX_HEAD_STEPS, "the kda rows check the compiled head steps");

/* The choices are data: the kda rows of tables/<arch>.txt (format in src/plan/table.h). What was measured to
 * pick them, and the alternatives that lost, is in bench/NOTES-kda.md, beside the numbers it needs; a comment here
 * would only go stale when the table is retuned. */

void k3_kda_tuning_from_rows(const k3_table_kda *rows, k3_kda_tuning *out) {
    memset(out, 0, sizeof *out);
    out->overlap_max_tokens = rows->overlap_max_tokens;
    for (int m = 1; m <= K3_TABLE_KDA_MAX_M; m++) {
        out->run_n_shape[m] = rows->shape[m];
        out->qkvg_kernel[m] = rows->qkvg[m];
        out->fused_head_steps[m] = rows->head_steps[m];
        out->unfused_shape[m] = rows->unfused_shape[m];
        out->unfused_qkvg[m] = rows->unfused_qkvg[m];
    }
}

/* No table for the architecture: nothing measured, so nothing clever (no one launch, no sliced state). */
static void tuning_default(k3_kda_tuning *out) {
    memset(out, 0, sizeof *out);
    out->overlap_max_tokens = 14;
    for (int m = 1; m <= K3_TABLE_KDA_MAX_M; m++) {
        out->run_n_shape[m] = out->unfused_shape[m] = K3_KDA_RUN_N_ROWS1;
        out->qkvg_kernel[m] = out->unfused_qkvg[m] = K3_KDA_QKVG_TABLE;
        out->fused_head_steps[m] = 2;
    }
}

k3_status k3_kda_tuning_for_ctx(k3_ctx *ctx, k3_kda_tuning *out) {
    const k3_table *t = NULL;
    K3_TRY(k3_linear_ctx_table(ctx, &t));
    k3_table_kda rows;
    char err[600];
    const k3_status st = k3_table_sections_for(t, ctx->arch.table, NULL, &rows, err, sizeof err);
    if (st == K3_STATUS_OUT_OF_MEMORY) return k3_fail(ctx, st, "out of host memory parsing the embedded table");
    if (st != K3_STATUS_SUCCESS) return k3_fail(ctx, st, "%s", err);
    if (rows.present) k3_kda_tuning_from_rows(&rows, out);
    else tuning_default(out);
    return K3_STATUS_SUCCESS;
}

void k3_kda_tuning_drop_fused(k3_kda_tuning *t) {
    for (int m = 1; m <= K3_TABLE_KDA_MAX_M; m++)
        if (t->run_n_shape[m] == K3_KDA_RUN_N_FUSED) {
            t->run_n_shape[m] = t->unfused_shape[m];
            t->qkvg_kernel[m] = t->unfused_qkvg[m];
        }
}

int32_t k3_kda_fused_layout_for(int32_t sm_count, int64_t hidden, int64_t qkvg_rows, int64_t fab_rows,
                                int64_t fb_rows, int64_t fa_dim, k3_kda_fused_layout *out, const char **why) {
    const char *dummy;
    if (!why) why = &dummy;
    *why = NULL;
    const int64_t rows_per_block = 16 * K3_KDA_FUSED_TILES_PER_BLOCK;
    if (hidden % 32 != 0 || qkvg_rows % rows_per_block != 0 || fab_rows % 16 != 0 || fb_rows % 16 != 0 ||
        fa_dim != 128) {
        *why = "it needs hidden % 32 == 0, qkvg rows % 48 == 0, F_AB and f_b rows % 16 == 0 and f_a 128 wide";
        return 0;
    }
    const int64_t qkvg_blocks = qkvg_rows / rows_per_block;
    int64_t branch = (int64_t)sm_count - qkvg_blocks;
    if (branch > K3_KDA_FUSED_MAX_BRANCH_BLOCKS) branch = K3_KDA_FUSED_MAX_BRANCH_BLOCKS;
    if (branch < 2) {
        *why = "it needs qkvg rows / 48 + 2 SMs (one block per SM, every block resident at once)";
        return 0;
    }
    const int64_t branch_warps = branch * 4 * K3_KDA_FUSED_TILES_PER_BLOCK;
    if (fab_rows > K3_KDA_FUSED_MAX_FAB_ROWS || fb_rows > 16 * K3_KDA_FUSED_MAX_FB_TILES * branch_warps) {
        *why = "its branch blocks hold at most 144 F_AB rows and two 16-row f_b tiles per warp";
        return 0;
    }
    const int64_t chunks = hidden / 32;
    /* x slice of the largest K range: 16 tokens x its chunks x 32 elements, rows padded to 64 mod 128 bytes so the
     * MMA lanes' 16-byte reads (8 token rows x 4 offsets per quarter warp) fall in distinct banks */
    const int64_t max_chunks = (chunks + branch - 1) / branch;
    const int64_t stride = max_chunks * 32 + (max_chunks * 64 % 128 == 64 ? 0 : 32);
    const int64_t xs_bytes = 16 * stride * 2;
    if (xs_bytes > K3_KDA_FUSED_MAX_XS_BYTES) {
        *why = "its branch blocks' share of K (x staged in shared memory) would exceed 100 KB";
        return 0;
    }
    if (out) {
        memset(out, 0, sizeof *out);
        out->hidden = hidden, out->qkvg_rows = qkvg_rows, out->fab_rows = fab_rows, out->fb_rows = fb_rows;
        out->qkvg_blocks = (int32_t)qkvg_blocks, out->branch_blocks = (int32_t)branch;
        out->xs_stride = (int32_t)stride, out->xs_bytes = (int32_t)xs_bytes;
    }
    return 1;
}
