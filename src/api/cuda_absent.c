/* CPU-only builds: the CUDA backend's entry points, each answering "not available". */
#include "cuda/backend.h"

int32_t k3_cuda_built(void) { return 0; }

int32_t k3_cuda_device_count(void) { return 0; }

k3_status k3_cuda_device_query(k3_ctx *ctx, int32_t device, k3_arch_info *out) {
    (void)device;
    (void)out;
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "this build of k3kernels has no CUDA backend (built without nvcc)");
}

k3_status k3_cuda_state_create(k3_ctx *ctx) {
    return k3_fail(ctx, K3_STATUS_NOT_AVAILABLE, "this build of k3kernels has no CUDA backend (built without nvcc)");
}

void k3_cuda_state_destroy(struct k3_cuda_state *state) { (void)state; }
