/* C-callable launchers of the GPU router (src/cuda/router/logits.cu and select.cu), called by src/api/router.c for
 * CUDA contexts. CUDA builds only; they allocate, synchronize and read back nothing (CUDA-graph capturable). */
#ifndef K3_CUDA_ROUTER_ROUTER_H
#define K3_CUDA_ROUTER_ROUTER_H

#include <stddef.h>

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device workspace of the two launches below for up to max_tokens tokens: the fp32 logits [max_tokens, E];
 * SIZE_MAX when that size does not fit in size_t (or a field is not positive). */
size_t k3_cuda_router_ws_bytes(const k3_router_desc *d);
/* Once per plan, on the current device: lets the logits kernels use up to the device's shared memory per block,
 * and returns that limit in *smem_max (the plan passes it to k3_cuda_router_run_logits). */
k3_status k3_cuda_router_prepare(k3_ctx *ctx, const k3_router_desc *d, size_t *smem_max);
/* The router of k3_router_run on CUDA, in two launches: the logits into ws on `stream`, then the selection from
 * them on `stream` (right behind the logits, with PDL) or on another stream that the caller ordered after the logits
 * (e.g. by an event). Bitwise the CPU router's ids and weights (same summation order, same sigmoid/exp from
 * core/router_math.h, same selection and NaN rules). The caller validated every argument and checked the pointers
 * (k3_cuda_check_device_ptrs). */
k3_status k3_cuda_router_run_logits(k3_ctx *ctx, const k3_router_desc *d, size_t smem_max, int64_t m, const void *x,
                                    const void *gate, void *ws, void *stream);
k3_status k3_cuda_router_run_select(k3_ctx *ctx, const k3_router_desc *d, int64_t m, const float *bias,
                                    int32_t *topk_ids, float *topk_weights, const void *ws, void *stream);

#ifdef __cplusplus
}
#endif
#endif
