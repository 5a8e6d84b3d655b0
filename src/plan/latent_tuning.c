#include "plan/latent_tuning.h"

#include <string.h>

/* The choices are data. What was measured to pick them, and what lost, is in bench/NOTES-block.md; past m 16
 * (beyond what `k3 bench block` measures) the m 16 choice continues. */
typedef struct latent_tuning_range {
    int32_t m_lo, m_hi; /* inclusive */
    k3_latent_schedule schedule;
    uint8_t norm_trigger;
} latent_tuning_range;

static const latent_tuning_range sm90_rows[] = {
    {1, 1, K3_LATENT_SCHEDULE_LOGITS_FIRST, 1},
    {2, 4, K3_LATENT_SCHEDULE_LOGITS_FIRST, 0},
    {5, 8, K3_LATENT_SCHEDULE_SELECT_BESIDE, 0},
    {9, K3_LATENT_TUNING_MAX_M, K3_LATENT_SCHEDULE_LOGITS_FIRST, 0},
};

static void set_rows(k3_latent_tuning *out, const latent_tuning_range *r, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (int32_t m = r[i].m_lo; m <= r[i].m_hi; m++)
            if (m >= 1 && m <= K3_LATENT_TUNING_MAX_M) {
                out->schedule[m] = r[i].schedule;
                out->norm_trigger[m] = r[i].norm_trigger;
            }
}

void k3_latent_tuning_for_table(k3_table_id table, k3_latent_tuning *out) {
    memset(out, 0, sizeof *out);
    for (int m = 0; m <= K3_LATENT_TUNING_MAX_M; m++) out->schedule[m] = K3_LATENT_SCHEDULE_SHARED_BESIDE;
    if (table == K3_TABLE_SM90) set_rows(out, sm90_rows, sizeof sm90_rows / sizeof sm90_rows[0]);
}
