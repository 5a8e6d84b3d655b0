#include "plan/kda_tuning.h"

/* SM90: measured with `k3 bench kda` on the H200 (bench/RESULTS.md, 2026-11-29): the F_AB kernel with 2 output
 * rows per block was faster than with 1 at every M = 1..16 (24.7-25.8 us vs 25.6-29.0 us for the whole
 * overlapped projection), and the overlap was faster than the sequential path at every M through 16, so it applies
 * through 16. Other architectures have not been measured: they use the upstream B300 crossover (14) and one row
 * per run_n block. */
void k3_kda_tuning_for(k3_table_id table, k3_kda_tuning *out) {
    const int sm90 = table == K3_TABLE_SM90;
    out->overlap_max_tokens = sm90 ? 16 : 14;
    out->run_n_rows_per_block[0] = 1;
    for (int m = 1; m <= 16; m++) out->run_n_rows_per_block[m] = sm90 ? 2 : 1;
    /* SM90, session 9: with the table's own kernels for 6144 x 7168 (22.3-22.5 us alone, vs cuBLASLt's 24-25) the
     * overlap cost +1.9..+7.1 us at M 1-8, with cuBLASLt's (96 blocks, one per SM, 36 SMs idle) +0.3..+1.1 us;
     * so the overlapped projection is fastest with cuBLASLt for QKVG at M >= 2 and within noise at M 1. */
    out->qkvg_kernel = sm90 ? K3_KERNEL_FALLBACK : K3_KERNEL_AUTO;
}
