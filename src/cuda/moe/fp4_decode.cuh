/* FP4 (E2M1 codes times a block scale) and BF16 weight operands of the expert GEMMs' MMA fragments. */
#ifndef K3_CUDA_MOE_FP4_DECODE_CUH
#define K3_CUDA_MOE_FP4_DECODE_CUH

#include <stdint.h>
#include "core/formats.h"
#include "cuda/common/loads.cuh"
#include "cuda/moe/config.cuh"

namespace {

/* E2M1 code (low nibble) -> fp32: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; sign in bit 3. */
__device__ __forceinline__ float e2m1f(uint32_t c) {
    const uint32_t k = c & 7u;
    const uint32_t bits = k < 2u ? (k ? 0x3f000000u : 0u) : (((126u + (k >> 1)) << 23) | ((k & 1u) << 22));
    return __uint_as_float(bits | ((c & 8u) << 28));
}

/* Two fp32 -> packed BF16 (lo in the low half), round to nearest even. */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* Four FP4 codes (16 bits: elements p .. p + 3, low nibble first) times a block scale -> two BF16x2. */
__device__ __forceinline__ void fp4x4(uint32_t two, float sf, uint32_t &lo, uint32_t &hi) {
    lo = pack_bf16x2(e2m1f(two) * sf, e2m1f(two >> 4) * sf);
    hi = pack_bf16x2(e2m1f(two >> 8) * sf, e2m1f(two >> 12) * sf);
}

template <int FMT>
__device__ __forceinline__ float scale_at(const uint8_t *sexp, int32_t layout, int64_t row, int64_t blk,
                                          int64_t scale_cols) {
    const uint8_t c = __ldg(sexp + k3_scale_offset_hd((k3_scale_layout)layout, row, blk, scale_cols));
    return FMT == FMT_NVFP4 ? k3_e4m3_decode(c) : k3_ue8m0_decode(c);
}

/* BF16 weights: one row's operands for the 8 steps of 128-element chunk c: a[2s] = elements p, p+1;
 * a[2s+1] = p+2, p+3 (the per-step map). */
__device__ __forceinline__ void load_bf16_chunk(const uint8_t *wrow, int c, int q, uint64_t pol, uint32_t (&a)[16]) {
    const uint8_t *p = wrow + ((int64_t)c * 128 + 32 * q) * 2;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint4 v = k3_ld_stream(p + 16 * j, pol);
        a[4 * j] = v.x, a[4 * j + 1] = v.y, a[4 * j + 2] = v.z, a[4 * j + 3] = v.w;
    }
}

/* One weight row's operands for the 16-element tail step at k0 (elements k0 + 4q .. + 3). */
template <int FMT>
__device__ __forceinline__ void decode_step(const uint8_t *wrow, const uint8_t *sexp, int32_t layout, int64_t row,
                                            int64_t cols, int64_t k0, int q, uint32_t &lo, uint32_t &hi) {
    const int64_t p = k0 + 4 * q;
    if (FMT == FMT_BF16) {
        const uint2 v = __ldg((const uint2 *)(wrow + p * 2));
        lo = v.x, hi = v.y;
    } else {
        const uint32_t two = __ldg((const unsigned short *)(wrow + p / 2));
        const int64_t bs = FMT == FMT_NVFP4 ? 16 : 32;
        fp4x4(two, scale_at<FMT>(sexp, layout, row, p / bs, cols / bs), lo, hi);
    }
}

/* L2 loads (.cg): GEMM2 reads GEMM1's output in the same call (PDL, see pdl.cuh) */
__device__ __forceinline__ uint2 ld_b(const uint16_t *brow, int64_t p) {
    return brow ? __ldcg((const uint2 *)(brow + p)) : make_uint2(0u, 0u);
}

} // namespace

#endif
