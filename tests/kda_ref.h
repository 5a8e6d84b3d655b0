/* An independent fp64 evaluation of the KDA projection for tests: plain loops over the bf16 inputs. */
#ifndef K3_TEST_KDA_REF_H
#define K3_TEST_KDA_REF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "test_util.h"

static inline double kref_bf16(uint16_t b) { return k3t_bf16_to_f32(b); }

/* Round a double to bf16 (via fp32 then RNE on the bits; inputs here are finite). */
static inline uint16_t kref_to_bf16(double v) {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* qkvg[m, qrows], fab[m, frows] (f64), g1[m, grows] (f64, from bf16-rounded f_a). */
static inline void kref_kda(int64_t m, int64_t hidden, int64_t qrows, int64_t frows, int64_t grows,
                            const uint16_t *x, const uint16_t *wp, const uint16_t *wfb, double *qkvg, double *fab,
                            double *g1) {
    for (int64_t i = 0; i < m; i++) {
        for (int64_t r = 0; r < qrows + frows; r++) {
            double s = 0;
            for (int64_t k = 0; k < hidden; k++) s += kref_bf16(x[i * hidden + k]) * kref_bf16(wp[r * hidden + k]);
            if (r < qrows) qkvg[i * qrows + r] = s;
            else fab[i * frows + (r - qrows)] = s;
        }
        for (int64_t r = 0; r < grows; r++) {
            double s = 0;
            for (int64_t k = 0; k < 128; k++)
                s += kref_bf16(kref_to_bf16(fab[i * frows + k])) * kref_bf16(wfb[r * 128 + k]);
            g1[i * grows + r] = s;
        }
    }
}

/* Relative L2 error of bf16 outputs (row stride ld, cols c, rows m) against the fp64 reference rounded once to
 * bf16 (row stride ldr), restricted to columns [c0, c0 + c); NaN anywhere gives +inf. Rounding the reference to
 * the output's precision measures the kernel's own error: against the unrounded reference the bf16 output
 * rounding alone is ~1.6e-3 and, over the 12 beta columns of a few tokens, fluctuates past 2e-3. */
static inline double kref_rel_l2(int64_t m, int64_t c0, int64_t c, const uint16_t *y, int64_t ld, const double *ref,
                                 int64_t ldr) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = c0; j < c0 + c; j++) {
            double v = kref_bf16(y[i * ld + j]), r = kref_bf16(kref_to_bf16(ref[i * ldr + j]));
            if (v != v) return 1.0 / 0.0;
            num += (v - r) * (v - r);
            den += r * r;
        }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
