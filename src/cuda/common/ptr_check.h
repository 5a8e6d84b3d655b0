/* The host-pointer check of the CUDA run calls (src/cuda/common/ptr_check.cu). CUDA builds only. */
#ifndef K3_CUDA_COMMON_PTR_CHECK_H
#define K3_CUDA_COMMON_PTR_CHECK_H

#include <stddef.h>

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* INVALID_ARGUMENT naming the first of the n pointers that is plain host memory (NULLs are skipped). Skipped
 * while `stream` is capturing. */
k3_status k3_cuda_check_device_ptrs(k3_ctx *ctx, void *stream, const char *what, int32_t n, const void *const *ptrs,
                                    const char *const *names);


#ifdef __cplusplus
}
#endif
#endif
