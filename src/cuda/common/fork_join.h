/* A reusable fork/join of one auxiliary stream, created at plan time:
 *   fork(main): record `fork` on main, aux waits for it   -> work queued on aux now runs after main's prefix
 *   join(main): record `join` on aux, main waits for it   -> main's suffix runs after the aux branch
 * fork also gives the aux stream the main stream's priority; events are created with timing disabled. No
 * allocation, no sync, no host decision at run time, so the pattern records into a CUDA graph as a fork and a join
 * edge when main is being captured. */
#ifndef K3_CUDA_FORK_JOIN_H
#define K3_CUDA_FORK_JOIN_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3_fork_join k3_fork_join;

k3_status k3_fork_join_create(k3_ctx *ctx, k3_fork_join **out);
void k3_fork_join_destroy(k3_fork_join *fj);
/* The auxiliary stream (a cudaStream_t) on which branch work is queued between fork and join. */
void *k3_fork_join_aux(const k3_fork_join *fj);
k3_status k3_fork_join_fork(k3_ctx *ctx, k3_fork_join *fj, void *main_stream);
k3_status k3_fork_join_join(k3_ctx *ctx, k3_fork_join *fj, void *main_stream);

#ifdef __cplusplus
}
#endif
#endif
