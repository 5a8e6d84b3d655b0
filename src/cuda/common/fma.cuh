/* The fp32-accumulating BF16 fused multiply-add, chosen at compile time per architecture (the ONE place).
 *
 * SM100+ has a mixed-precision FMA (PTX fma.rn.f32.bf16: BF16 operands, fp32 addend and result); emitting it
 * for sm_90 fails compilation. On SM90 each BF16 operand is widened to fp32 (a 16-bit shift, exact) and a
 * plain fma.rn.f32 follows. A BF16 x BF16 product is exact in fp32, so both forms round once, identically:
 * the same bits on every architecture for the same operation order.
 *
 * Operands travel as k3_bf16x8: 8 BF16 values (one 16-byte load). On SM100+ they stay packed; on SM90 they
 * are widened once at load time so a value reused across several products is converted only once. */
#ifndef K3_CUDA_FMA_CUH
#define K3_CUDA_FMA_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define K3_MIXED_BF16_FMA 1
#else
#define K3_MIXED_BF16_FMA 0
#endif

#if K3_MIXED_BF16_FMA
typedef struct {
    uint32_t h[4]; /* packed pairs: element 2i in the low half of h[i], 2i+1 in the high half */
} k3_bf16x8;

__device__ __forceinline__ k3_bf16x8 k3_bf16x8_from_u4(uint4 v) {
    k3_bf16x8 r;
    r.h[0] = v.x;
    r.h[1] = v.y;
    r.h[2] = v.z;
    r.h[3] = v.w;
    return r;
}

/* acc + a * b over one packed pair, low element first. */
__device__ __forceinline__ float k3_fma_bf16x2(uint32_t a, uint32_t b, float acc) {
    float d;
    asm("{\n\t.reg .b16 al, ah, bl, bh;\n\t"
        "mov.b32 {al, ah}, %1;\n\t"
        "mov.b32 {bl, bh}, %2;\n\t"
        "fma.rn.f32.bf16 %0, al, bl, %3;\n\t"
        "fma.rn.f32.bf16 %0, ah, bh, %0;\n\t}"
        : "=&f"(d)
        : "r"(a), "r"(b), "f"(acc));
    return d;
}

/* acc + sum_{i<8} a[i] * b[i], in element order (one rounding per step). */
__device__ __forceinline__ float k3_dot8_bf16(const k3_bf16x8 &a, const k3_bf16x8 &b, float acc) {
#pragma unroll
    for (int i = 0; i < 4; i++) acc = k3_fma_bf16x2(a.h[i], b.h[i], acc);
    return acc;
}
#else
typedef struct {
    float f[8];
} k3_bf16x8;

__device__ __forceinline__ k3_bf16x8 k3_bf16x8_from_u4(uint4 v) {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
    k3_bf16x8 r;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        r.f[2 * i] = __uint_as_float(u[i] << 16);             /* low BF16 -> fp32, exact */
        r.f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u); /* high BF16 -> fp32, exact */
    }
    return r;
}

__device__ __forceinline__ float k3_dot8_bf16(const k3_bf16x8 &a, const k3_bf16x8 &b, float acc) {
#pragma unroll
    for (int i = 0; i < 8; i++) acc = __fmaf_rn(a.f[i], b.f[i], acc);
    return acc;
}
#endif

#endif
