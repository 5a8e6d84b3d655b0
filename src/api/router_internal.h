/* Internal form of k3_router_run for compositions (the latent block): the same checks and bits, with the choice of
 * running the selection on a second stream. */
#ifndef K3_API_ROUTER_INTERNAL_H
#define K3_API_ROUTER_INTERNAL_H

#include "core/internal.h"

struct k3_fork_join;

/* k3_router_run. With select_fj (CUDA contexts only; NULL: k3_router_run itself): the logits on `stream`, then a
 * fork of select_fj from `stream`, then the selection on the fork's auxiliary stream, so that what the caller
 * queues on `stream` next runs beside the selection. topk_ids / topk_weights are complete only after the caller
 * joins select_fj back into its stream, which it must do whenever the fork was made (a failure after it
 * included), so that a capture is never left with an open branch: *forked (never NULL) says whether it was. */
k3_status k3_router_run_split(k3_router_plan *plan, int64_t m, const void *x, const void *gate, const float *bias,
                              int32_t *topk_ids, float *topk_weights, void *ws, size_t ws_bytes, void *stream,
                              struct k3_fork_join *select_fj, int *forked);

#endif
