#include "plan/kda_tuning.h"

/* SM90: measured with `k3 bench kda` on the H200 (bench/RESULTS.md, 2026-11-29): the F_AB kernel with 2 output
 * rows per block was faster than with 1 at every M = 1..16 (24.7-25.8 us vs 25.6-29.0 us for the whole
 * overlapped projection), and the overlap was faster than the sequential path at every M through 16, so it applies
 * through 16. Other architectures have not been measured: they use the upstream B300 crossover (14) and one row
 * per run_n block. */
void k3_kda_tuning_for(k3_table_id table, k3_kda_tuning *out) {
    const int sm90 = table == K3_TABLE_SM90;
    out->overlap_max_tokens = sm90 ? 16 : 14;
    out->run_n_shape[0] = K3_KDA_RUN_N_ROWS1;
    for (int m = 1; m <= 16; m++)
        out->run_n_shape[m] = !sm90 ? K3_KDA_RUN_N_ROWS1 : m <= 8 ? K3_KDA_RUN_N_NARROW : K3_KDA_RUN_N_ROWS2;
    /* SM90: with the table's own kernel for 6144 x 7168 (`mma w8_t1_u2_l`, 22.1-22.5 us alone, vs cuBLASLt's
     * 23.5-25.3) the overlap costs +1.9..+7.1 us at M 4-8: its one wave fills every SM, so the branch waits; with
     * cuBLASLt's (96 blocks, one per SM, 36 SMs idle) +0.3..+1.1 us. At M 1-3 the two are close, and which is
     * faster depended on the H200 instance (session 10): where cuBLASLt's QKVG took 23.9 us alone, the overlap
     * with it was 24.2 / 24.6-25.0 / 24.6-24.7 us at M 1 / 2 / 3 and with the table's 24.3 / 25.3 / 25.5; where it
     * took 25.3, 25.8 / 26.0 / 25.8 against 24.5 / 25.1 / 25.3 (0.757 x the cuBLAS chain at M 1). So: the table
     * at M 1 (within 0.1 us where it is not faster, and it keeps the overlap <= 0.75 x the chain), cuBLASLt from
     * M 2 (bench/NOTES-kda.md). Re-measured in session 12 with the table's faster `w8_t1_u2_l_h2` (22.0 us
     * alone): the same picture, the overlap with it 24.3-29.5 us at M 1-8 against 24.2-25.4 with cuBLASLt's. */
    /* Session 13: the table's QKVG became `w4_t1_u4_l_h2_pp` (21.2-21.4 us alone at M 1-4; 138 registers x 128
     * threads: three blocks per SM, 384 blocks on 396 slots). Beside three of them an SM has 10,240 registers left,
     * less than one hidden / 16-thread run_n block needs (448 threads x 32-68 registers), so the branch waited for
     * the few SMs holding two: +1.5 (M 1) .. +3.5 us over QKVG alone. The narrow run_n block (128 threads, <= 80
     * registers) fits beside three on every SM, and it prefetches its x into L1 in one round trip. With the
     * table's QKVG the overlap then measured 22.09 / 22.27 / 22.51 / 22.74 / 23.98 us at M 1-5 (+0.87..+1.42 over
     * QKVG alone at M 1-4, +2.41 at M 5), against 24.6-25.1 with cuBLASLt's QKVG (the previous choice from M 2).
     * At M 6-8 it lost to that (25.97-27.95 vs 25.1-25.2: its registers spill from M 5), so from M 6 the previous
     * choice stays (bench/NOTES-kda.md, session 13). */
    /* Session 14: the table's QKVG became `w2_t1_u4_c2_l_h2` at M 1-8 (768 two-warp blocks, 136 registers: 20.4-21.0
     * us alone) and the narrow kernel takes two tokens per iteration above 4 (94 registers, fits beside six of
     * those blocks). The overlap with them measured 22.65 / 22.95 / 23.44 / 24.17 us at M 5-8 against 25.1-25.3 with
     * cuBLASLt's QKVG and the two-row F_AB; from M 9 the table's QKVG (168 registers x 128 threads, three per SM)
     * leaves no room beside it (32.8-39.7 us). So: the table and the narrow kernel through M 8, cuBLASLt from M 9
     * (bench/NOTES-kda.md, session 14). */
    for (int m = 0; m <= 16; m++)
        out->qkvg_kernel[m] = !sm90 || m <= 8 ? K3_KERNEL_AUTO : K3_KERNEL_FALLBACK;
}
