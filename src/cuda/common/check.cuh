/* Error checking for CUDA runtime calls and kernel launches: every failure becomes a status + message. */
#ifndef K3_CUDA_CHECK_CUH
#define K3_CUDA_CHECK_CUH

#include <cuda_runtime.h>

#include "core/internal.h"

#define K3_CUDA_TRY(ctx, call)                                                                               \
    do {                                                                                                     \
        cudaError_t k3_e_ = (call);                                                                          \
        if (k3_e_ != cudaSuccess)                                                                            \
            return k3_fail((ctx), K3_STATUS_CUDA_ERROR, "%s failed: %s (%s:%d)", #call,                      \
                           cudaGetErrorString(k3_e_), __FILE__, __LINE__);                                   \
    } while (0)

/* After a launch: catches configuration errors without synchronizing. */
#define K3_CUDA_LAUNCH_CHECK(ctx, what)                                                                      \
    do {                                                                                                     \
        cudaError_t k3_e_ = cudaGetLastError();                                                              \
        if (k3_e_ != cudaSuccess)                                                                            \
            return k3_fail((ctx), K3_STATUS_CUDA_ERROR, "launch of %s failed: %s", (what),                   \
                           cudaGetErrorString(k3_e_));                                                       \
    } while (0)

#endif
