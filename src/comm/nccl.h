/* The caller's NCCL communicator, used by the plans that reduce across ranks (the latent block's library-driven
 * mode). The library never creates a communicator: it takes the caller's ncclComm_t and calls NCCL through the
 * libnccl already loaded in the process (the one the communicator came from), else loads libnccl.so.2. Builds
 * without NCCL's header (K3_HAVE_NCCL unset) answer NOT_AVAILABLE. */
#ifndef K3_COMM_NCCL_H
#define K3_COMM_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3_nccl k3_nccl;

/* Loads NCCL and checks that `comm` has `size` ranks, that this one is `rank`, and that it lives on the context's
 * device. NOT_AVAILABLE without NCCL (in the build or the process), COMM_ERROR when the communicator does not fit;
 * a message in the context either way. `what` prefixes the messages. */
k3_status k3_nccl_open(k3_ctx *ctx, void *comm, int32_t rank, int32_t size, const char *what, k3_nccl **out);
void k3_nccl_close(k3_nccl *n); /* NULL is accepted */
/* In-place fp32 sum of buf[count] over the ranks, queued on stream (capturable, as NCCL's collectives are). */
k3_status k3_nccl_allreduce_f32(k3_ctx *ctx, const k3_nccl *n, float *buf, size_t count, void *stream);
/* Gathers count BF16 values of every rank into recv[size * count] in rank order (out of place), queued on stream. */
k3_status k3_nccl_allgather_bf16(k3_ctx *ctx, const k3_nccl *n, const void *send, void *recv, size_t count,
                                 void *stream);
/* One NCCL group of two fp32 sum reduce-scatters, queued on stream: recv0[count0] gets block `rank` of the ranks'
 * summed send0[size * count0], then the same of send1 into recv1 (skipped when count1 is 0). The group is closed
 * even when a call inside it fails. */
k3_status k3_nccl_reduce_scatter2_f32(k3_ctx *ctx, const k3_nccl *n, const float *send0, float *recv0, size_t count0,
                                      const float *send1, float *recv1, size_t count1, void *stream);
/* NCCL's version code (e.g. 22307 for 2.23.7) of the loaded library. */
int32_t k3_nccl_version(const k3_nccl *n);

#ifdef __cplusplus
}
#endif
#endif
