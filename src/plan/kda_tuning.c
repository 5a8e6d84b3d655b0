#include "plan/kda_tuning.h"

/* SM90, measured with `k3 bench kda` on H200s (the history and the numbers: bench/NOTES-kda.md, sessions 9-16):
 * - the overlap beats the sequential path at every M through 16, so it applies through 16;
 * - M 1-8: the linear plan's table kernel for QKVG (`w2_t1_u4_c2_l_h2`: 768 two-warp blocks of 136 registers, one
 *   wave, 20.4-21.1 us alone) with the sliced F_AB blocks (128 threads, <= 104 registers, about one per SM: the
 *   branch adds the least to the busiest SM) and f_b started by PDL: +0.7..+0.9 us over QKVG alone at M 1-8,
 *   against +0.8..+3.1 with the narrow blocks (one row each) and 24.6-25.3 us with cuBLASLt's QKVG;
 * - M 9-16: the table's QKVG (168 registers x 128 threads, three per SM) leaves no room for the branch (32.8-39.7
 *   us), so cuBLASLt's QKVG (96 one-SM blocks, 36 SMs idle) with the two-row F_AB blocks.
 * Other architectures have not been measured: the upstream B300 crossover (14), one row per F_AB block and the
 * table's QKVG. */
void k3_kda_tuning_for(k3_table_id table, k3_kda_tuning *out) {
    const int sm90 = table == K3_TABLE_SM90;
    out->overlap_max_tokens = sm90 ? 16 : 14;
    out->run_n_shape[0] = K3_KDA_RUN_N_ROWS1;
    for (int m = 1; m <= 16; m++)
        out->run_n_shape[m] = !sm90 ? K3_KDA_RUN_N_ROWS1 : m <= 8 ? K3_KDA_RUN_N_SLICED : K3_KDA_RUN_N_ROWS2;
    for (int m = 0; m <= 16; m++)
        out->qkvg_kernel[m] = !sm90 || m <= 8 ? K3_KERNEL_AUTO : K3_KERNEL_FALLBACK;
}
