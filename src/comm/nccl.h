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
/* NCCL's version code (e.g. 22307 for 2.23.7) of the loaded library. */
int32_t k3_nccl_version(const k3_nccl *n);

#ifdef __cplusplus
}
#endif
#endif
