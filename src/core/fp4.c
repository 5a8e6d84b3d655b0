/*
 * NVFP4 and MXFP4 quantize / dequantize on the host (checkpoint conversion, test oracles), batched over
 * matrices, with linear or 128x4-swizzled scale layouts. Rounding points are those of docs/model.md section 5;
 * the per-block steps below are shared with k3_nvfp4_fake_quant so both give bit-identical results.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "core/formats.h"

/* E2M1 code -> value, for the dequantize inner loop. */
static const float k3_e2m1_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static int64_t block_of(k3_fp4_format fmt) { return fmt == K3_FP4_NVFP4 ? K3_NVFP4_BLOCK : K3_MXFP4_BLOCK; }
static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

int64_t k3_scale_offset(k3_scale_layout layout, int64_t row, int64_t col, int64_t rows, int64_t scale_cols) {
    (void)rows;
    return k3_scale_offset_hd(layout, row, col, scale_cols); /* one formula for host and device */
}

float k3_nvfp4_global_scale(float amax) {
    if (!(amax > 0.0f)) return 1.0f;
    float gs = 2688.0f / amax; /* 448 * 6 */
    return gs <= FLT_MAX ? gs : FLT_MAX;
}

/* One NVFP4 block of 16: returns the e4m3 scale code and writes the 16 E2M1 codes. */
static inline uint8_t nvfp4_block(const float *x, float gs, uint8_t *codes) {
    float amax = 0.0f;
    for (int i = 0; i < K3_NVFP4_BLOCK; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    uint8_t sf = k3_e4m3_encode((gs * amax) / 6.0f);
    float sfv = k3_e4m3_decode(sf);
    if (sfv == 0.0f) { /* a zero block (or one below the smallest scale): scale 0, all-zero codes */
        memset(codes, 0, K3_NVFP4_BLOCK);
        return sf & 0x7fu;
    }
    for (int i = 0; i < K3_NVFP4_BLOCK; i++) codes[i] = k3_e2m1_encode((x[i] * gs) / sfv);
    return sf;
}

/* One MXFP4 block of 32: returns the ue8m0 scale code and writes the 32 E2M1 codes. */
static inline uint8_t mxfp4_block(const float *x, uint8_t *codes) {
    float amax = 0.0f;
    for (int i = 0; i < K3_MXFP4_BLOCK; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    uint8_t s = k3_ue8m0_scale_for_amax(amax);
    float inv = k3_ue8m0_inv(s); /* an exact power of two: x * inv is exact unless it is far below 0.25 */
    for (int i = 0; i < K3_MXFP4_BLOCK; i++) codes[i] = k3_e2m1_encode(x[i] * inv);
    return s;
}

void k3_nvfp4_fake_quant(const float *x, int64_t n, float gs, float *out) {
    float gs_inv = 1.0f / gs;
    uint8_t codes[K3_NVFP4_BLOCK];
    for (int64_t b = 0; b + K3_NVFP4_BLOCK <= n; b += K3_NVFP4_BLOCK) {
        float sfv = k3_e4m3_decode(nvfp4_block(x + b, gs, codes));
        for (int i = 0; i < K3_NVFP4_BLOCK; i++) out[b + i] = (k3_e2m1_values[codes[i]] * sfv) * gs_inv;
    }
}

/* Validates the common arguments; fills the per-matrix element, packed and scale sizes. */
static k3_status check_shape(k3_fp4_format fmt, k3_scale_layout layout, int64_t batch, int64_t rows, int64_t cols,
                             size_t *scale_bytes) {
    if (fmt != K3_FP4_NVFP4 && fmt != K3_FP4_MXFP4) return K3_STATUS_INVALID_ARGUMENT;
    if (layout != K3_SCALE_LINEAR && layout != K3_SCALE_SWIZZLED) return K3_STATUS_INVALID_ARGUMENT;
    int64_t blk = block_of(fmt);
    if (batch < 1 || rows < 1 || cols < blk || cols % blk != 0) return K3_STATUS_INVALID_ARGUMENT;
    /* every count below must fit comfortably: batch * rows * cols elements and their fp32 bytes */
    const int64_t lim = INT64_MAX / 8;
    if (rows > lim / cols || batch > lim / (rows * cols)) return K3_STATUS_INVALID_ARGUMENT;
    if ((uint64_t)(batch * rows * cols) > (uint64_t)(SIZE_MAX / 8)) return K3_STATUS_INVALID_ARGUMENT;
    int64_t sc = cols / blk;
    int64_t per = layout == K3_SCALE_LINEAR ? rows * sc
                                            : round_up(rows, K3_SWIZZLE_ROWS) * round_up(sc, K3_SWIZZLE_COLS);
    if (per > lim / batch) return K3_STATUS_INVALID_ARGUMENT; /* padded scales of the whole batch */
    *scale_bytes = (size_t)per;
    return K3_STATUS_SUCCESS;
}

/* The shape plus the pointers of a quantize / dequantize call: all buffers present, and a global scale exactly
 * for NVFP4. */
static k3_status check_call(k3_fp4_format fmt, k3_scale_layout layout, int64_t batch, int64_t rows, int64_t cols,
                            const float *x, const uint8_t *packed, const uint8_t *scales, const float *global_scale_inv,
                            size_t *scale_bytes) {
    k3_status st = check_shape(fmt, layout, batch, rows, cols, scale_bytes);
    if (st != K3_STATUS_SUCCESS) return st;
    if (!x || !packed || !scales) return K3_STATUS_INVALID_ARGUMENT;
    if ((fmt == K3_FP4_NVFP4) != (global_scale_inv != NULL)) return K3_STATUS_INVALID_ARGUMENT;
    return K3_STATUS_SUCCESS;
}

k3_status k3_fp4_scale_bytes(k3_fp4_format fmt, k3_scale_layout layout, int64_t rows, int64_t cols,
                             size_t *out_bytes) {
    if (!out_bytes) return K3_STATUS_INVALID_ARGUMENT;
    size_t sb = 0;
    k3_status st = check_shape(fmt, layout, 1, rows, cols, &sb);
    if (st != K3_STATUS_SUCCESS) return st;
    *out_bytes = sb;
    return K3_STATUS_SUCCESS;
}

/* amax of n floats; 0 when one of them is NaN or infinite (FP4 cannot represent those). */
static int finite_amax(const float *x, int64_t n, float *amax_out) {
    float amax = 0.0f;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        bad |= !(a <= FLT_MAX);
        amax = a > amax ? a : amax;
    }
    *amax_out = amax;
    return !bad;
}

k3_status k3_fp4_quantize(k3_fp4_format fmt, k3_scale_layout layout, int64_t batch, int64_t rows, int64_t cols,
                          const float *x, uint8_t *packed, uint8_t *scales, float *global_scale_inv) {
    size_t sb = 0;
    k3_status st = check_call(fmt, layout, batch, rows, cols, x, packed, scales, global_scale_inv, &sb);
    if (st != K3_STATUS_SUCCESS) return st;
    const int64_t n = rows * cols, blk = block_of(fmt), sc = cols / blk;

    /* Check the whole input first so a failure leaves no half-written output behind it. */
    float amax = 0.0f;
    for (int64_t b = 0; b < batch; b++)
        if (!finite_amax(x + b * n, n, &amax)) return K3_STATUS_INVALID_ARGUMENT;

    uint8_t codes[K3_MXFP4_BLOCK];
    for (int64_t b = 0; b < batch; b++) {
        const float *xb = x + b * n;
        uint8_t *pb = packed + b * (n / 2), *sbuf = scales + (size_t)b * sb;
        float gs = 1.0f;
        if (fmt == K3_FP4_NVFP4) {
            finite_amax(xb, n, &amax);
            gs = k3_nvfp4_global_scale(amax);
            global_scale_inv[b] = 1.0f / gs;
        }
        if (layout == K3_SCALE_SWIZZLED) memset(sbuf, 0, sb); /* padding rows/columns read as scale 0 */
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = xb + r * cols;
            uint8_t *pr = pb + r * (cols / 2);
            for (int64_t c = 0; c < sc; c++) {
                const float *xc = xr + c * blk;
                uint8_t s = fmt == K3_FP4_NVFP4 ? nvfp4_block(xc, gs, codes) : mxfp4_block(xc, codes);
                sbuf[k3_scale_offset(layout, r, c, rows, sc)] = s;
                uint8_t *pc = pr + c * (blk / 2);
                for (int64_t i = 0; i < blk / 2; i++) pc[i] = (uint8_t)(codes[2 * i] | (codes[2 * i + 1] << 4));
            }
        }
    }
    return K3_STATUS_SUCCESS;
}

k3_status k3_fp4_dequantize(k3_fp4_format fmt, k3_scale_layout layout, int64_t batch, int64_t rows, int64_t cols,
                            const uint8_t *packed, const uint8_t *scales, const float *global_scale_inv, float *x) {
    size_t sb = 0;
    k3_status st = check_call(fmt, layout, batch, rows, cols, x, packed, scales, global_scale_inv, &sb);
    if (st != K3_STATUS_SUCCESS) return st;
    const int64_t n = rows * cols, blk = block_of(fmt), sc = cols / blk;
    for (int64_t b = 0; b < batch; b++) {
        const uint8_t *pb = packed + b * (n / 2), *sbuf = scales + (size_t)b * sb;
        float *xb = x + b * n;
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *pr = pb + r * (cols / 2);
            float *xr = xb + r * cols;
            for (int64_t c = 0; c < sc; c++) {
                uint8_t s = sbuf[k3_scale_offset(layout, r, c, rows, sc)];
                const uint8_t *pc = pr + c * (blk / 2);
                float *xc = xr + c * blk;
                if (fmt == K3_FP4_NVFP4) {
                    float sv = k3_e4m3_decode(s), gi = global_scale_inv[b];
                    for (int64_t i = 0; i < blk / 2; i++) {
                        xc[2 * i] = (k3_e2m1_values[pc[i] & 15u] * sv) * gi;
                        xc[2 * i + 1] = (k3_e2m1_values[pc[i] >> 4] * sv) * gi;
                    }
                } else {
                    float sv = k3_ue8m0_decode(s);
                    for (int64_t i = 0; i < blk / 2; i++) {
                        xc[2 * i] = k3_e2m1_values[pc[i] & 15u] * sv;
                        xc[2 * i + 1] = k3_e2m1_values[pc[i] >> 4] * sv;
                    }
                }
            }
        }
    }
    return K3_STATUS_SUCCESS;
}
