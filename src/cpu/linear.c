/*
 * The CPU BF16 linear: y = x W^T (+ residual), the reference for the GPU GEMM plans.
 *
 * Products of two BF16 values are exact in fp32 (8-bit significands), so the two modes differ only in how
 * the sum is formed: fp64 sums sequentially in double (the oracle); fp32 keeps K3_LIN_LANES independent
 * partial sums (so the compiler vectorizes without -ffast-math) that are combined in a fixed order, so results
 * are deterministic and independent of m and of the other rows in the batch.
 */
#include "cpu/cpu.h"

#include <math.h>
#include <string.h>

#include "core/bf16.h"

#define K3_LIN_LANES 16 /* independent fp32 partial sums per dot product */
#define K3_LIN_TOK 4    /* tokens sharing one pass over a weight row (the row stays in L1) */

/* Combines the lanes pairwise in a fixed tree order. */
static inline float lin_reduce(const float *acc) {
    float t[K3_LIN_LANES];
    for (int l = 0; l < K3_LIN_LANES; l++) t[l] = acc[l];
    for (int w = K3_LIN_LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) t[l] += t[l + w];
    return t[0];
}

/* out[t] = sum_k x_t[k] w[k] for nt <= K3_LIN_TOK tokens, fp32 lanes. */
static void lin_dot_f32(int nt, int64_t k, const uint16_t *const *xs, const uint16_t *w, float *out) {
    float acc[K3_LIN_TOK][K3_LIN_LANES];
    memset(acc, 0, sizeof acc);
    const int64_t kv = k - k % K3_LIN_LANES;
    if (nt == K3_LIN_TOK) {
        /* the common decode case, spelled out with a constant token count so the loops fully unroll */
        const uint16_t *x0 = xs[0], *x1 = xs[1], *x2 = xs[2], *x3 = xs[3];
        for (int64_t kk = 0; kk < kv; kk += K3_LIN_LANES) {
            for (int l = 0; l < K3_LIN_LANES; l++) {
                const float wf = k3_bf16_bits_to_f32(w[kk + l]);
                acc[0][l] += k3_bf16_bits_to_f32(x0[kk + l]) * wf;
                acc[1][l] += k3_bf16_bits_to_f32(x1[kk + l]) * wf;
                acc[2][l] += k3_bf16_bits_to_f32(x2[kk + l]) * wf;
                acc[3][l] += k3_bf16_bits_to_f32(x3[kk + l]) * wf;
            }
        }
    } else {
        for (int t = 0; t < nt; t++) {
            const uint16_t *x = xs[t];
            float *a = acc[t];
            for (int64_t kk = 0; kk < kv; kk += K3_LIN_LANES)
                for (int l = 0; l < K3_LIN_LANES; l++)
                    a[l] += k3_bf16_bits_to_f32(x[kk + l]) * k3_bf16_bits_to_f32(w[kk + l]);
        }
    }
    for (int t = 0; t < nt; t++) {
        /* the tail (k % lanes elements) goes to the lanes of the same index, keeping one fixed order */
        for (int64_t kk = kv; kk < k; kk++)
            acc[t][kk - kv] += k3_bf16_bits_to_f32(xs[t][kk]) * k3_bf16_bits_to_f32(w[kk]);
        out[t] = lin_reduce(acc[t]);
    }
}

/* The fp32 path: y = bf16(x w^T + residual), or with yf the unrounded sums (no residual) into yf instead. */
static void lin_f32(int64_t m, int64_t n, int64_t k, const uint16_t *x, int64_t x_stride, const uint16_t *w,
                    const uint16_t *residual, uint16_t *y, float *yf, int64_t y_stride) {
    for (int64_t i0 = 0; i0 < m; i0 += K3_LIN_TOK) {
        const int nt = (int)(m - i0 < K3_LIN_TOK ? m - i0 : K3_LIN_TOK);
        const uint16_t *xs[K3_LIN_TOK];
        for (int t = 0; t < nt; t++) xs[t] = x + (i0 + t) * x_stride;
        for (int64_t j = 0; j < n; j++) {
            float s[K3_LIN_TOK];
            lin_dot_f32(nt, k, xs, w + j * k, s);
            for (int t = 0; t < nt; t++) {
                const int64_t o = (i0 + t) * y_stride + j;
                if (yf) {
                    yf[o] = s[t];
                    continue;
                }
                float v = s[t];
                /* read before the write: residual may alias y */
                if (residual) v += k3_bf16_bits_to_f32(residual[o]);
                y[o] = k3_f32_to_bf16_bits(v);
            }
        }
    }
}

/* double -> bf16 with a single round-to-nearest-even. Going through float could round twice: when the float
 * lands exactly on a bf16 midpoint but the double was not there, the tie is decided by the double instead. */
static inline uint16_t lin_f64_to_bf16(double s) {
    const float f = (float)s;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0xffffu) == 0x8000u && (double)f != s && (u & 0x7f800000u) != 0x7f800000u) {
        const uint16_t hi = (uint16_t)(u >> 16);
        /* away from zero when |s| > |f| (the magnitude grows by one bf16 ulp), else toward zero */
        return (fabs(s) > fabs((double)f)) ? (uint16_t)(hi + 1u) : hi;
    }
    return k3_f32_to_bf16_bits(f);
}

static void lin_f64(int64_t m, int64_t n, int64_t k, const uint16_t *x, int64_t x_stride, const uint16_t *w,
                    const uint16_t *residual, uint16_t *y, int64_t y_stride) {
    for (int64_t i = 0; i < m; i++) {
        const uint16_t *xr = x + i * x_stride;
        for (int64_t j = 0; j < n; j++) {
            const uint16_t *wr = w + j * k;
            double s = 0.0;
            for (int64_t kk = 0; kk < k; kk++)
                s += (double)k3_bf16_bits_to_f32(xr[kk]) * (double)k3_bf16_bits_to_f32(wr[kk]);
            const int64_t o = i * y_stride + j;
            if (residual) s += (double)k3_bf16_bits_to_f32(residual[o]);
            y[o] = lin_f64_to_bf16(s);
        }
    }
}

void k3_cpu_linear(int64_t m, int64_t n, int64_t k, const uint16_t *x, int64_t x_stride, const uint16_t *w,
                   const uint16_t *residual, uint16_t *y, int64_t y_stride, k3_accum accum) {
    if (accum == K3_ACCUM_FP64)
        lin_f64(m, n, k, x, x_stride, w, residual, y, y_stride);
    else
        lin_f32(m, n, k, x, x_stride, w, residual, y, NULL, y_stride);
}

void k3_cpu_linear_f32out(int64_t m, int64_t n, int64_t k, const uint16_t *x, int64_t x_stride, const uint16_t *w,
                          float *y, int64_t y_stride) {
    lin_f32(m, n, k, x, x_stride, w, NULL, NULL, y, y_stride);
}
