/* The C-callable surface of the CUDA backend. Every function here exists in both builds: the real one in
 * the .cu files of src/cuda/, and src/api/cuda_absent.c (CPU-only builds), which answers K3_STATUS_NOT_AVAILABLE. */
#ifndef K3_CUDA_BACKEND_H
#define K3_CUDA_BACKEND_H

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the library was built with the CUDA backend. */
int32_t k3_cuda_built(void);
/* Number of visible CUDA devices (0 when none or no CUDA build). Never fails. */
int32_t k3_cuda_device_count(void);
/* Reads the device's name, capability, SM count, L2 and versions into out (capability facts from src/arch). */
k3_status k3_cuda_device_query(k3_ctx *ctx, int32_t device, k3_arch_info *out);
/* Creates the per-context CUDA state (sets the device, cuBLASLt handle) into ctx->cuda. */
k3_status k3_cuda_state_create(k3_ctx *ctx);
void k3_cuda_state_destroy(struct k3_cuda_state *state);

#ifdef __cplusplus
}
#endif
#endif
