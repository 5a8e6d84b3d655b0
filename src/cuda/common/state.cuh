/* Per-context CUDA state. */
#ifndef K3_CUDA_STATE_CUH
#define K3_CUDA_STATE_CUH

#include <cublasLt.h>

#include "cuda/common/backend.h"

struct k3_cuda_state {
    int device;
    cublasLtHandle_t lt;
};

#endif
