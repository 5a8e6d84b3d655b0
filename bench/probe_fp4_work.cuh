/* The per-word work of the bench/ MoE probes (moe_ws_probe.cu, moe_persistent_probe.cu): what the library's NVFP4
 * loops do for every 32-bit word of weights, so that a probe's stream carries the library's instruction load. */
#ifndef K3_BENCH_PROBE_FP4_WORK_CUH
#define K3_BENCH_PROBE_FP4_WORK_CUH

#include <cstdint>

#include "../src/cuda/moe/nvfp4_decode.cuh" /* the library's decode, not a copy */

/* Decode 8 E2M1 codes to 4 BF16x2 registers, scale them, one m16n8k16 MMA into acc. */
__device__ __forceinline__ void word_work(uint32_t w, uint32_t sc, uint32_t b0, uint32_t b1, float (&acc)[4]) {
    uint32_t a[4];
    k3_nv_decode_word(w, a);
#pragma unroll
    for (int i = 0; i < 4; i++) a[i] = k3_mul_bf16x2(a[i], sc);
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* 16 bytes of weights: the work above on each word (WORK), or a token use that keeps the load alive. */
template <bool WORK>
__device__ __forceinline__ void use16(uint4 v, uint32_t sc, float (&acc)[4]) {
    if (WORK) {
        word_work(v.x, sc, 0x3f803f80u, 0x3f803f80u, acc);
        word_work(v.y, sc, 0x3f803f80u, 0x3f803f80u, acc);
        word_work(v.z, sc, 0x3f803f80u, 0x3f803f80u, acc);
        word_work(v.w, sc, 0x3f803f80u, 0x3f803f80u, acc);
    } else {
        acc[0] += __uint_as_float((v.x ^ v.y ^ v.z ^ v.w) & 0x3f800000u);
    }
}

#endif
