/* Per-architecture tuning data of the KDA projection (measured numbers, not constants of nature). */
#ifndef K3_PLAN_KDA_TUNING_H
#define K3_PLAN_KDA_TUNING_H

#include "k3.h"

typedef struct k3_kda_tuning {
    int64_t overlap_max_tokens;  /* overlap the aux branch for m <= this */
    int32_t run_n_shape[17];          /* index m (1..16): the run_n block shape, K3_KDA_RUN_N_ROWS1/ROWS2/NARROW/SLICED */
    int32_t qkvg_kernel[17];          /* index m (1..16): K3_KERNEL_AUTO (the linear plan's table) or
                                         K3_KERNEL_FALLBACK (cuBLASLt) for QKVG */
} k3_kda_tuning;

/* The tuning for a table id; architectures without measurements get the defaults (overlap through 14, the
 * crossover measured upstream on B300). */
void k3_kda_tuning_for(k3_table_id table, k3_kda_tuning *out);

#endif
