/* The NVFP4 E2M1 -> BF16 expansion of the MoE expert GEMMs (src/cuda/moe/), in a header so that the diagnostic
 * probes (bench/moe_ws_probe.cu) time exactly the library's per-word work. */
#ifndef K3_CUDA_MOE_NVFP4_DECODE_CUH
#define K3_CUDA_MOE_NVFP4_DECODE_CUH

#include <stdint.h>

/* The "raw pair" of NVFP4 codes i and i + 4 of word w: BF16 bit patterns worth code * 2^-126 (E2M1 with e = 0
 * lands on BF16 subnormals, which the BF16 FMA takes exactly): sign to bit 15, the 3 magnitude bits to 8..6,
 * i.e. u = w << (12 - 4 i), (u & 0x80008000) | ((u >> 6) & 0x01c001c0). k3_nv_decode_word computes it. */

/* BF16x2 a * b (+ -0, which keeps the sign of a zero product). Exact here: at most 6 significant bits. */
__device__ __forceinline__ uint32_t k3_mul_bf16x2(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u));
    return r;
}

/* Bit select (a & m) | (b & ~m) as ONE lop3 (ptxas emitted two for the C expression). */
__device__ __forceinline__ uint32_t k3_bitsel(uint32_t a, uint32_t b, uint32_t m) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xe2;" : "=r"(r) : "r"(a), "r"(m), "r"(b));
    return r;
}

__device__ __forceinline__ uint32_t k3_rotl(uint32_t x, int k) { return __funnelshift_l(x, x, k); }

/* NVFP4: one word (8 E2M1 codes, elements P .. P + 7) -> a[i] = BF16x2 (P + i, P + i + 4) worth code * 2^-126,
 * the raw pairs above in 11 integer ops instead of 16. Two rotations put every code's sign 9 bits
 * above its magnitude's low bit (x8: signs moved up 8, x2: magnitudes up 2); one bit-select per register pair
 * takes the signs of codes {0, 1, 4, 5} (lo) or {2, 3, 6, 7} (hi) from x8 and the rest from x2, whose sign
 * and magnitude fields of the pair's codes then do not collide; a rotation by a multiple of 4 and one mask
 * (sign bits 15 / 31, magnitude 8..6 / 24..22) give each register. (Checked equal to the shift-and-mask
 * formula before use, bench/NOTES-moe.md; every NVFP4 test output goes through it.) */
__device__ __forceinline__ void k3_nv_decode_word(uint32_t w, uint32_t (&a)[4]) {
    constexpr uint32_t M = 0x81c081c0u, KLO = 0x88008800u, KHI = 0x00880088u;
    const uint32_t x8 = k3_rotl(w, 8), x2 = k3_rotl(w, 2);
    const uint32_t lo = k3_bitsel(x8, x2, KLO), hi = k3_bitsel(x8, x2, KHI);
    a[0] = k3_rotl(lo, 4) & M, a[1] = lo & M, a[2] = k3_rotl(hi, 28) & M, a[3] = k3_rotl(hi, 24) & M;
}

#endif
