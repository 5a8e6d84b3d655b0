/* The one place that turns a compute capability (real or simulated) into facts. No other file tests
 * compute capability; kernels choose instructions by __CUDA_ARCH__ in src/cuda/common/fma.cuh only. */
#ifndef K3_ARCH_ARCH_H
#define K3_ARCH_ARCH_H

#include "k3.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills the capability-derived facts of *out (cc, sm_version, has_*, table); leaves device fields zero. */
void k3_arch_facts(int32_t major, int32_t minor, k3_arch_info *out);

#ifdef __cplusplus
}
#endif
#endif
