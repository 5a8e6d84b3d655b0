#include "plan/kda_tuning.h"

/* SM90 numbers come from `k3 bench kda` on the H200 (bench/RESULTS.md). Other architectures have not been
 * measured: they use the defaults, i.e. the upstream B300 overlap crossover (14) and one row per run_n block. */
void k3_kda_tuning_for(k3_table_id table, k3_kda_tuning *out) {
    out->overlap_max_tokens = 14;
    out->run_n_rows_per_block[0] = 1;
    for (int m = 1; m <= 16; m++) out->run_n_rows_per_block[m] = 1;
    (void)table;
}
