/* The latent-MoE block's per-architecture choices (src/plan/latent_tuning.c), per token count: the stream schedule
 * AUTO resolves to, and whether the RMSNorm lets the up projection come up early. Data, measured on the
 * architecture it names; an architecture without a measurement gets the defaults (SHARED_BESIDE, no early up
 * projection, at every m). */
#ifndef K3_PLAN_LATENT_TUNING_H
#define K3_PLAN_LATENT_TUNING_H

#include <stdint.h>

#include "k3.h"

#define K3_LATENT_TUNING_MAX_M 32 /* the CUDA block's max_tokens */
/* The highest k3_latent_schedule value: the one bound that validation, the CLI and the tests loop to. */
#define K3_LATENT_SCHEDULE_LAST K3_LATENT_SCHEDULE_LOGITS_FIRST

typedef struct k3_latent_tuning {
    k3_latent_schedule schedule[K3_LATENT_TUNING_MAX_M + 1]; /* index m (1..32): what AUTO runs (never AUTO) */
    uint8_t norm_trigger[K3_LATENT_TUNING_MAX_M + 1];        /* index m (1..32): 1 = the RMSNorm triggers after its
                                                                wait */
} k3_latent_tuning;

/* The tuning of a projection table's architecture (K3_TABLE_NONE and unmeasured ones: the defaults). */
void k3_latent_tuning_for_table(k3_table_id table, k3_latent_tuning *out);

#endif
