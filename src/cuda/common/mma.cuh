/* The tensor-core instruction of the decode kernels (the GEMM plan's MMA kernel and the MoE expert GEMMs):
 * mma.sync m16n8k16 with BF16 inputs and fp32 accumulation in place, c += a . b. Warp-synchronous; the fragment
 * layouts are the PTX ones (each caller's file says how it maps K onto them). */
#ifndef K3_CUDA_MMA_CUH
#define K3_CUDA_MMA_CUH

#include <stdint.h>

__device__ __forceinline__ void k3_mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                  uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

#endif
