/* BF16 <-> fp32 as inline functions usable from host C and CUDA device code (one definition for both). */
#ifndef K3_CORE_BF16_H
#define K3_CORE_BF16_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define K3_HD __host__ __device__ __forceinline__
#else
#define K3_HD static inline
#endif

/* fp32 <-> its bit pattern (memcpy: no aliasing questions, a plain register move after compilation). */
K3_HD uint32_t k3_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
K3_HD float k3_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

K3_HD float k3_bf16_bits_to_f32(uint16_t b) { return k3_bits_f32((uint32_t)b << 16); }

/* Round-to-nearest-even; NaN stays a quiet NaN with its sign. */
K3_HD uint16_t k3_f32_to_bf16_bits(float f) {
    uint32_t u = k3_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The value after one BF16 rounding, as fp32. */
K3_HD float k3_round_bf16(float f) { return k3_bf16_bits_to_f32(k3_f32_to_bf16_bits(f)); }

#endif
