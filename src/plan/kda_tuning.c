#include "plan/kda_tuning.h"

#include <string.h>

/* SM90, measured with `k3 bench kda` on H200s (the history and the numbers: bench/NOTES-kda.md, sessions 9-26):
 * - every m 1-16: the whole projection in one launch (K3_KDA_RUN_N_FUSED, src/cuda/kda/fused.cu): QKVG tiles three
 *   to a block on 128 SMs, F_AB and f_b on the other 4 (session 26: -0.1..+0.4 us over the faster QKVG alone at
 *   m 9-14 and +0.4..+0.9 at m 1-8, against +2.6..+3.5 and +0.7..+1.0 for the two-stream overlaps below);
 *   its QKVG tiles ask two weight steps into L2 before their PDL wait at m 1-4 and one from m 5 (session 26: one
 *   step was 0.15-0.25 us slower at m 1-4, 0.1-0.2 us faster at m 5-8 and ~0.2 us faster at m 9-16; none and four
 *   steps were 0.4-1.4 us slower at m 1-8);
 * - where it does not fit the device (k3_kda_tuning_drop_fused): m 1-8 the linear plan's table kernel for QKVG
 *   (`w2_t1_u4_c2_l_h2`, 768 two-warp blocks, one wave) with the sliced F_AB blocks (128 threads, about one per SM)
 *   and f_b started by PDL; m 9-16 cuBLASLt's QKVG (96 one-SM blocks, 36 SMs idle) with the two-row F_AB blocks,
 *   since the table's m 9-16 QKVG (168 registers x 128 threads, three per SM) leaves no room for a branch block;
 * - the overlap beats the sequential path at every m through 16, so it applies through 16.
 * Other architectures have not been measured: the upstream B300 crossover (14), one row per F_AB block and the
 * table's QKVG. */
void k3_kda_tuning_for(k3_table_id table, k3_kda_tuning *out) {
    const int sm90 = table == K3_TABLE_SM90;
    out->overlap_max_tokens = sm90 ? 16 : 14;
    out->run_n_shape[0] = K3_KDA_RUN_N_ROWS1;
    for (int m = 1; m <= 16; m++) out->run_n_shape[m] = sm90 ? K3_KDA_RUN_N_FUSED : K3_KDA_RUN_N_ROWS1;
    for (int m = 0; m <= 16; m++) out->qkvg_kernel[m] = K3_KERNEL_AUTO;
    for (int m = 0; m <= 16; m++) out->fused_head_steps[m] = sm90 && m >= 5 ? 1 : 2;
}

void k3_kda_tuning_drop_fused(k3_kda_tuning *t) {
    for (int m = 1; m <= 16; m++)
        if (t->run_n_shape[m] == K3_KDA_RUN_N_FUSED) {
            t->run_n_shape[m] = m <= 8 ? K3_KDA_RUN_N_SLICED : K3_KDA_RUN_N_ROWS2;
            t->qkvg_kernel[m] = m <= 8 ? K3_KERNEL_AUTO : K3_KERNEL_FALLBACK;
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
