/*
 * Internal number-format helpers: the scalar codecs as inline functions (one definition for host C and CUDA
 * device code, like bf16.h), the FP4 scale-layout offset, and NVFP4 fake quantization.
 *
 * Decisions (documented once here; include/k3.h states the public contract):
 * - E4M3 (OCP E4M3FN): bias 7, subnormals, max 448, no infinity; 0x7F / 0xFF are NaN. Encoding rounds to
 *   nearest even and saturates every finite or infinite magnitude above 448 to +-448; NaN encodes as
 *   0x7F with the input's sign bit. The sign of zero is kept (-0.0 and tiny negatives give 0x80).
 * - E2M1: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (codes 0..7), sign in bit 3. Rounding follows the RNE
 *   thresholds of docs/model.md section 5; magnitudes above 6 (and infinity) saturate to 6. The sign is kept
 *   for values that round to zero (-0.1 gives 0x8, like a hardware cvt), so encode(decode(c)) == c for all
 *   16 codes. E2M1 has no NaN: NaN encodes as +-0 (every threshold comparison is false). k3_fp4_quantize
 *   never reaches that case because it rejects non-finite input.
 * - UE8M0: value 2^(c - 127), 0xFF = NaN, no zero and no sign.
 */
#ifndef K3_CORE_FORMATS_H
#define K3_CORE_FORMATS_H

#include <stdint.h>
#include <string.h>

#include "k3.h"
#include "core/bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Elements per block and bytes of scale per block. */
#define K3_NVFP4_BLOCK 16
#define K3_MXFP4_BLOCK 32
/* The swizzled 128x4 layout pads rows to this and scale columns to 4. */
#define K3_SWIZZLE_ROWS 128
#define K3_SWIZZLE_COLS 4

/* 1 when a [rows, scale_cols] block-scale matrix has the same shape in the linear and the swizzled layouts (rows a
   multiple of 128 and scale columns of 4, as every real K3 shape is): such a shape cannot say which layout a file
   holds (engines keep swizzled scales in that 3-D shape too), so a reader must be told. */
static inline int k3_scale_shape_ambiguous(int64_t rows, int64_t scale_cols) {
    return rows % K3_SWIZZLE_ROWS == 0 && scale_cols % K3_SWIZZLE_COLS == 0;
}

/* ---- E4M3 ---------------------------------------------------------------------------------------- */
K3_HD float k3_e4m3_decode(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    uint32_t e = (c >> 3) & 15u, m = c & 7u;
    if (e == 15u && m == 7u) return k3_bits_f32(sign | 0x7fc00000u);
    if (e == 0u) return k3_bits_f32(sign | k3_f32_bits((float)m * (1.0f / 512.0f))); /* m * 2^-9, exact */
    return k3_bits_f32(sign | ((e + 120u) << 23) | (m << 20));                    /* rebias 7 -> 127 */
}

K3_HD uint8_t k3_e4m3_encode(float x) {
    uint32_t u = k3_f32_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu); /* NaN */
    if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* >= 448 (and inf): saturate */
    if (a >= 0x3c800000u) {                              /* >= 2^-6: normal; RNE on the 20 dropped bits */
        a += 0x7ffffu + ((a >> 20) & 1u);
        return (uint8_t)(sign | ((a >> 20) - (120u << 3))); /* a carry into the exponent is still right */
    }
    /* subnormal: code = RNE(|x| * 2^9) with |x| = m * 2^(E-23), i.e. m shifted right by 14 - E >= 21 */
    int32_t ex = (int32_t)(a >> 23) - 127;
    if (ex < -11) return sign; /* below 2^-11 (< half of 2^-9): zero */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t s = (uint32_t)(14 - ex);
    uint32_t q = m >> s, r = m & ((1u << s) - 1u), half = 1u << (s - 1u);
    q += (r > half) || (r == half && (q & 1u));
    return (uint8_t)(sign | q); /* q == 8 is 2^-6, the smallest normal code: still right */
}

/* ---- E2M1 ---------------------------------------------------------------------------------------- */
K3_HD float k3_e2m1_decode(uint8_t c) {
    /* magnitude code k: 0, 0.5, 1, 1.5, 2, 3, 4, 6 */
    uint32_t k = c & 7u;
    float mag = k < 4u ? 0.5f * (float)k : (float)(2u << ((k - 4u) >> 1)) * (1.0f + 0.5f * (float)(k & 1u));
    return (c & 8u) ? -mag : mag;
}

/* RNE by thresholds: ties at 0.25, 1.25, 2.5, 5 go down (to the even code), at 0.75, 1.75, 3.5 go up. */
K3_HD uint8_t k3_e2m1_encode(float x) {
    uint32_t u = k3_f32_bits(x);
    float a = k3_bits_f32(u & 0x7fffffffu);
    uint32_t k = (uint32_t)(a > 0.25f) + (uint32_t)(a >= 0.75f) + (uint32_t)(a > 1.25f) + (uint32_t)(a >= 1.75f) +
                 (uint32_t)(a > 2.5f) + (uint32_t)(a >= 3.5f) + (uint32_t)(a > 5.0f);
    return (uint8_t)(((u >> 28) & 8u) | k);
}

/* ---- UE8M0 --------------------------------------------------------------------------------------- */
K3_HD float k3_ue8m0_decode(uint8_t c) {
    if (c == 0xffu) return k3_bits_f32(0x7fc00000u);
    if (c == 0u) return k3_bits_f32(0x00400000u); /* 2^-127 is an fp32 subnormal */
    return k3_bits_f32((uint32_t)c << 23);
}

/*
 * The MXFP4 scale code of a block with absolute maximum `amax` (finite, >= 0): the OCP MX rule
 * shared_exp = floor(log2(amax)) - 2 (2 = the largest E2M1 exponent), code = shared_exp + 127 clamped to
 * [0, 254]. A zero (or fp32-subnormal) amax gives code 0. Elements then round as e2m1(x / 2^shared_exp); a
 * block whose amax mantissa exceeds 1.5 saturates its largest elements to 6 (the known cost of the rule).
 */
K3_HD uint8_t k3_ue8m0_scale_for_amax(float amax) {
    int32_t biased = (int32_t)((k3_f32_bits(amax) >> 23) & 0xffu); /* floor(log2) + 127 for normals */
    int32_t code = biased - 2;
    return (uint8_t)(code < 0 ? 0 : (code > 254 ? 254 : code));
}

/* 1 / 2^(code - 127) as an exact fp32 power of two (code 0..253; the encoder never exceeds 252). */
K3_HD float k3_ue8m0_inv(uint8_t code) { return k3_bits_f32((uint32_t)(254 - code) << 23); }

/* IEEE binary16 bits -> fp32 (exact; used to read F16 tensors). */
K3_HD float k3_f16_bits_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu;
    if (e == 31u) return k3_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0u) return k3_bits_f32(sign | k3_f32_bits((float)m * (1.0f / 16777216.0f))); /* m * 2^-24 */
    return k3_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* ---- layouts and fake quantization (src/core/fp4.c) ---------------------------------------------- */

/* k3_scale_offset's formula (below) as an inline usable in device code, so GPU kernels read the block scales
 * with the same layout arithmetic as the host; scale_cols is the unpadded scale-column count. */
K3_HD int64_t k3_scale_offset_hd(k3_scale_layout layout, int64_t row, int64_t col, int64_t scale_cols) {
    if (layout != K3_SCALE_SWIZZLED) return row * scale_cols + col;
    const int64_t kp = (scale_cols + K3_SWIZZLE_COLS - 1) / K3_SWIZZLE_COLS * K3_SWIZZLE_COLS;
    return ((row / 128) * (kp / 4) + col / 4) * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + col % 4;
}

/* Index (in bytes) of the scale of weight row `row`, scale column `col` (= K index / block size) within
 * one matrix's scale buffer whose unpadded scale-column count is `scale_cols`. `rows` is the unpadded row
 * count (the linear layout does not need it; it is accepted so callers need not care which layout they use).
 * Swizzled 128x4: ((row/128) * (Kp/4) + col/4) * 512 + (row%32) * 16 + ((row%128)/32) * 4 + col%4 with
 * Kp = scale_cols rounded up to 4. */
int64_t k3_scale_offset(k3_scale_layout layout, int64_t row, int64_t col, int64_t rows, int64_t scale_cols);

/* NVFP4 quantize-dequantize of one row of n floats (n % 16 == 0) with the given global scale gs:
 *   sf = e4m3((gs * amax_block) / 6); q = e2m1((x * gs) / sf) (q = 0 when sf == 0);
 *   out = (q * sf) * (1 / gs)   -- the multiplication by the fp32 value 1/gs is what k3_fp4_dequantize
 *                                  does with global_scale_inv, so the result is bit-identical to it.
 * Exactly the rounding points of k3_fp4_quantize (which uses gs = 2688 / amax(matrix)). x and out may alias.
 * Non-finite input propagates (a NaN block gives NaN outputs); the caller owns the data. */
void k3_nvfp4_fake_quant(const float *x, int64_t n, float gs, float *out);

/* The NVFP4 global scale k3_fp4_quantize uses for a matrix of absolute maximum amax: 2688 / amax,
 * 1 for amax == 0, clamped to FLT_MAX when amax is so small that the quotient overflows. */
float k3_nvfp4_global_scale(float amax);

#ifdef __cplusplus
}
#endif
#endif
