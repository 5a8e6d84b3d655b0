/* The CUDA error check of the bench/ probes (standalone programs, outside the library's build): in a function that
 * returns int, prints the failing call's error with its place and returns 1. */
#ifndef K3_BENCH_PROBE_CHECK_H
#define K3_BENCH_PROBE_CHECK_H

#include <cstdio>

#include <cuda_runtime.h>

#define CK(x)                                                                                                      \
    do {                                                                                                           \
        cudaError_t e_ = (x);                                                                                      \
        if (e_ != cudaSuccess) {                                                                                   \
            printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);                       \
            return 1;                                                                                              \
        }                                                                                                          \
    } while (0)

#endif
