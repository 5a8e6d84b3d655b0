/* Expert parallelism: the router's global expert ids turned into this rank's through the caller's expert map
 * (-1 = not on this rank), ahead of the routed experts' kernels (src/api/moe.c). */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/common/check.cuh"
#include "cuda/common/ptr_check.h"
#include "cuda/moe/moe.h"

namespace {

__global__ void k3_moe_map_ids_kernel(const int32_t *__restrict__ ids, int32_t n, const int32_t *__restrict__ map,
                                      int32_t global_experts, int32_t *__restrict__ local) {
    const int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n) return;
    const int32_t g = ids[i];
    local[i] = g >= 0 && g < global_experts ? map[g] : -1;
}

} // namespace

extern "C" k3_status k3_cuda_moe_map_ids_launch(k3_ctx *ctx, const int32_t *ids, int32_t n, const int32_t *map,
                                                int32_t global_experts, int32_t *local, void *stream) {
    const void *ptrs[] = {map};
    const char *names[] = {"expert_map"};
    K3_TRY(k3_cuda_check_device_ptrs(ctx, stream, "moe run", 1, ptrs, names));
    k3_moe_map_ids_kernel<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(ids, n, map, global_experts,
                                                                                         local);
    K3_CUDA_LAUNCH_CHECK(ctx, "the expert-map kernel");
    return K3_STATUS_SUCCESS;
}
