/* Lossless FP4 format changes (see convert_fp4.h). */
#include "convert_fp4.h"

#include <math.h>

#include "core/formats.h"

/* 1 when the n codes at byte `at` (two a byte) are all +-0 (E2M1 magnitude bits 0). */
static int codes_zero(const uint8_t *codes, size_t at, size_t nbytes) {
    for (size_t i = 0; i < nbytes; i++)
        if (codes[at + i] & 0x77u) return 0;
    return 1;
}

void k3_convert_mx_span(const uint8_t *codes, const uint8_t *scales, int64_t rows, int64_t cols,
                        k3_convert_span *span) {
    const int64_t nb = cols / 32;
    span->any = 0;
    span->emin = span->emax = 0;
    span->min_row = span->min_blk = span->max_row = span->max_blk = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            if (codes_zero(codes, (size_t)(r * (cols / 2) + b * 16), 16)) continue;
            const int e = (int)scales[r * nb + b] - 127;
            if (!span->any || e < span->emin) span->emin = e, span->min_row = r, span->min_blk = b;
            if (!span->any || e > span->emax) span->emax = e, span->max_row = r, span->max_blk = b;
            span->any = 1;
        }
}

int k3_convert_mx_base(const k3_convert_span *span, int *base) {
    *base = span->any ? span->emax - 8 : 0;
    return !span->any || span->emax - span->emin <= K3_CONVERT_MAX_SPAN;
}

/* E4M3 bits of 2^k, -9 <= k <= 8: normal (k + 7) << 3 from 2^-6 up, subnormal m * 2^-9 below. */
static uint8_t e4m3_pow2(int k) { return k >= -6 ? (uint8_t)((k + 7) << 3) : (uint8_t)(1u << (k + 9)); }

void k3_convert_mx_to_nv(const uint8_t *scales, int64_t rows, int64_t cols, int base, uint8_t *out) {
    const int64_t nb = cols / 32;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const int k = (int)scales[r * nb + b] - 127 - base;
            const uint8_t c = (k >= -9 && k <= 8) ? e4m3_pow2(k) : 0;
            out[r * 2 * nb + 2 * b] = c;
            out[r * 2 * nb + 2 * b + 1] = c;
        }
}

int k3_convert_nv_to_mx(const uint8_t *codes, const uint8_t *scales, float scale_2, int64_t rows, int64_t cols,
                        uint8_t *out, k3_convert_inexact *bad) {
    const int64_t nb = cols / 32;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            double s[2];
            int zero[2];
            for (int h = 0; h < 2; h++) {
                /* both factors have at most 24 significant bits: the product is exact in double */
                s[h] = (double)k3_e4m3_decode(scales[r * 2 * nb + 2 * b + h]) * (double)scale_2;
                zero[h] = codes_zero(codes, (size_t)(r * (cols / 2) + b * 16 + h * 8), 8);
            }
            uint8_t u = 0;
            if (!zero[0] || !zero[1]) {
                const double v = zero[0] ? s[1] : s[0];
                const char *why = NULL;
                int ex = 0;
                if (!zero[0] && !zero[1] && s[0] != s[1]) why = "the two 16-blocks' effective scales differ";
                else if (!(v > 0.0)) why = "a block with non-zero codes has a scale that is not positive";
                else if (frexp(v, &ex) != 0.5) why = "the effective scale is not a power of two";
                else if (ex - 1 < -127 || ex - 1 > 127) why = "the power of two is outside UE8M0's 2^-127 .. 2^127";
                if (why) {
                    bad->row = r, bad->blk = b, bad->s0 = s[0], bad->s1 = s[1], bad->why = why;
                    return 0;
                }
                u = (uint8_t)(ex - 1 + 127);
            }
            out[r * nb + b] = u;
        }
    return 1;
}
