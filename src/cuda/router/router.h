/* C-callable launcher of the GPU router (src/cuda/router/router.cu), called by src/api/router.c for CUDA
 * contexts. CUDA builds only; it allocates, synchronizes and reads back nothing (CUDA-graph capturable). */
#ifndef K3_CUDA_ROUTER_ROUTER_H
#define K3_CUDA_ROUTER_ROUTER_H

#include <stddef.h>

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device workspace of k3_cuda_router_run for up to max_tokens tokens: the fp32 logits [max_tokens, E];
 * SIZE_MAX when that size does not fit in size_t (or a field is not positive). */
size_t k3_cuda_router_ws_bytes(const k3_router_desc *d);
/* The router of k3_router_run on `stream`; bitwise the CPU router's ids and weights (same summation order,
 * same sigmoid/exp from core/router_math.h, same selection and NaN rules). Arguments were validated. */
k3_status k3_cuda_router_run(k3_ctx *ctx, const k3_router_desc *d, int64_t m, const void *x, const void *gate,
                             const float *bias, int32_t *topk_ids, float *topk_weights, void *ws, void *stream);


#ifdef __cplusplus
}
#endif
#endif
