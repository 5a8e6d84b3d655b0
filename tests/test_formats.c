/*
 * Number formats: scalar codecs against decoders/encoders written here from the bit-field definitions
 * (a nearest-value search, not thresholds or bit tricks), NVFP4/MXFP4 quantize/dequantize against a reference
 * quantizer written here, the swizzled layout against the reshape/permute definition, error budgets.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "core/formats.h"
#include "k3.h"
#include "test_util.h"

#define SEED 20240611ull

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- independent scalar references ---------------------------------------------------------------- */

/* E4M3FN from its fields: bias 7, subnormals m * 2^-9, e=15 m=7 is NaN. */
static double ref_e4m3_decode(uint8_t c) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return s ? -v : v;
}
/* E2M1 from its fields: bias 1, e=0 is subnormal m * 0.5. */
static double ref_e2m1_decode(uint8_t c) {
    int s = (c >> 3) & 1, e = (c >> 1) & 3, m = c & 1;
    double v = e == 0 ? 0.5 * m : ldexp(2 + m, e - 2); /* 2^(e-1) * (1 + m/2) */
    return s ? -v : v;
}

/* Nearest magnitude among codes 0..maxcode (ascending values); ties go to the even code; magnitudes past the
 * largest (and infinity) saturate. The input's sign goes to bit `signbit_mask`. */
static uint8_t ref_nearest(double x, double (*dec)(uint8_t), int maxcode, uint8_t signbit_mask) {
    double a = fabs(x);
    int best = maxcode;
    if (!isinf(a)) {
        double bd = INFINITY;
        for (int c = 0; c <= maxcode; c++) {
            double d = fabs(dec((uint8_t)c) - a);
            if (d < bd || (d == bd && (c & 1) == 0)) {
                bd = d;
                best = c;
            }
        }
    }
    return (uint8_t)(best | (signbit(x) ? signbit_mask : 0));
}
static uint8_t ref_e4m3(double x) { return ref_nearest(x, ref_e4m3_decode, 126, 0x80); }
static uint8_t ref_e2m1(double x) { return ref_nearest(x, ref_e2m1_decode, 7, 0x8); }

/* BF16 by comparing the two neighbours in double; ties to the even pattern; past the largest finite value by
 * half an ulp or more -> infinity (IEEE RNE overflow). */
static uint16_t ref_bf16(float x) {
    uint32_t u = bits(x);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    double vlo = fabs((double)from_bits((uint32_t)lo << 16));
    double vhi = ((hi & 0x7fff) == 0x7f80) ? ldexp(1.0, 128) : fabs((double)from_bits((uint32_t)hi << 16));
    double a = fabs((double)x);
    double dlo = a - vlo, dhi = vhi - a;
    if (dlo < dhi || (dlo == dhi && (lo & 1) == 0)) return lo;
    return hi;
}

/* ---- scalar codec tests ----------------------------------------------------------------------------- */

static void test_e4m3(k3t_rng *rng) {
    int exact = 1, rt = 1;
    for (int c = 0; c < 256; c++) {
        double want = ref_e4m3_decode((uint8_t)c);
        float got = k3_e4m3_to_f32((uint8_t)c);
        if (isnan(want)) {
            CHECK(isnan(got), "e4m3 code 0x%02x must decode to NaN, got %g", c, got);
            CHECK((k3_e4m3_from_f32(got) & 0x7f) == 0x7f, "e4m3 NaN 0x%02x re-encodes as NaN", c);
            continue;
        }
        if ((double)got != want || (signbit(got) != 0) != (signbit(want) != 0)) {
            exact = 0;
            fprintf(stderr, "e4m3 0x%02x: got %.9g want %.9g\n", c, got, want);
        }
        if (k3_e4m3_from_f32(got) != c) { /* includes 0x80 = -0 (the sign of zero is kept) */
            rt = 0;
            fprintf(stderr, "e4m3 encode(decode(0x%02x)) = 0x%02x\n", c, k3_e4m3_from_f32(got));
        }
    }
    CHECK(exact, "all 254 finite e4m3 codes decode exactly");
    CHECK(rt, "encode(decode(c)) == c for every non-NaN e4m3 code");
    CHECK(k3_e4m3_to_f32(0x7e) == 448.0f && k3_e4m3_to_f32(0x01) == ldexpf(1.0f, -9), "e4m3 max / min");

    /* every midpoint between neighbours (a tie), and a hair either side of it, both signs */
    int mism = 0;
    for (int c = 0; c < 126; c++) {
        float a = (float)ref_e4m3_decode((uint8_t)c), b = (float)ref_e4m3_decode((uint8_t)(c + 1));
        float mid = (float)(0.5 * ((double)a + (double)b)); /* <= 5 significant bits: exact */
        float probes[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int k = 0; k < 3; k++)
            for (int s = 0; s < 2; s++) {
                float x = s ? -probes[k] : probes[k];
                if (k3_e4m3_from_f32(x) != ref_e4m3(x)) {
                    if (mism++ < 5)
                        fprintf(stderr, "e4m3(%a) = 0x%02x want 0x%02x\n", x, k3_e4m3_from_f32(x), ref_e4m3(x));
                }
            }
    }
    /* random magnitudes from far below the smallest subnormal to far above the max */
    for (int i = 0; i < 200000; i++) {
        float x = ldexpf(1.0f + 0.5f * (k3t_uniform(rng) + 1.0f), (int)(k3t_next(rng) % 36) - 24);
        if (k3t_next(rng) & 1) x = -x;
        if (k3_e4m3_from_f32(x) != ref_e4m3(x) && mism++ < 5)
            fprintf(stderr, "e4m3(%a) = 0x%02x want 0x%02x\n", x, k3_e4m3_from_f32(x), ref_e4m3(x));
    }
    CHECK(mism == 0, "e4m3 encode matches nearest-even search on ties and 200k random values (%d mismatches)",
          mism);
    CHECK(k3_e4m3_from_f32(1.0625f) == 0x38, "e4m3 tie 1.0625 -> 1.0 (even)");
    CHECK(k3_e4m3_from_f32(1.1875f) == 0x3a, "e4m3 tie 1.1875 -> 1.25 (even)");
    CHECK(k3_e4m3_from_f32(ldexpf(1.0f, -10)) == 0x00, "e4m3 tie 2^-10 -> 0 (even)");
    CHECK(k3_e4m3_from_f32(ldexpf(3.0f, -10)) == 0x02, "e4m3 tie 1.5 * 2^-9 -> 2 * 2^-9 (even)");
    CHECK(k3_e4m3_from_f32(1e9f) == 0x7e && k3_e4m3_from_f32(-1e9f) == 0xfe, "e4m3 saturates to +-448");
    CHECK(k3_e4m3_from_f32(464.0f) == 0x7e && k3_e4m3_from_f32(449.0f) == 0x7e, "e4m3 just above 448");
    CHECK(k3_e4m3_from_f32(INFINITY) == 0x7e && k3_e4m3_from_f32(-INFINITY) == 0xfe, "e4m3 inf saturates");
    CHECK(k3_e4m3_from_f32(NAN) == 0x7f && k3_e4m3_from_f32(-NAN) == 0xff, "e4m3 NaN stays NaN");
    CHECK(isnan(k3_e4m3_to_f32(k3_e4m3_from_f32(NAN))), "e4m3 NaN round trip");
    CHECK(k3_e4m3_from_f32(-0.0f) == 0x80 && k3_e4m3_from_f32(-1e-30f) == 0x80, "e4m3 keeps the sign of zero");
    CHECK(k3_e4m3_from_f32(FLT_TRUE_MIN) == 0x00, "fp32 subnormal -> 0");
}

static void test_e2m1(k3t_rng *rng) {
    static const float table[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f}; /* docs/model.md section 5 */
    int ok = 1;
    for (int c = 0; c < 16; c++) {
        double want = ref_e2m1_decode((uint8_t)c);
        float got = k3_e2m1_to_f32((uint8_t)c);
        if ((double)got != want || (c >= 8) != (signbit(got) != 0) || fabsf(got) != table[c & 7]) ok = 0;
        if (k3_e2m1_from_f32(got) != c) ok = 0;
        if (k3_e2m1_to_f32((uint8_t)(c | 0xf0)) != got) ok = 0; /* only the low nibble is read */
    }
    CHECK(ok, "all 16 e2m1 codes decode exactly and re-encode to themselves (0x8 = -0)");
    /* the spec's ties */
    const float tie_in[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    const float tie_out[] = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f};
    for (int i = 0; i < 7; i++) {
        CHECK(k3_e2m1_to_f32(k3_e2m1_from_f32(tie_in[i])) == tie_out[i], "e2m1 tie %g -> %g (got %g)", tie_in[i],
              tie_out[i], k3_e2m1_to_f32(k3_e2m1_from_f32(tie_in[i])));
        CHECK(k3_e2m1_to_f32(k3_e2m1_from_f32(-tie_in[i])) == -tie_out[i], "e2m1 tie -%g", tie_in[i]);
    }
    CHECK(k3_e2m1_from_f32(1e9f) == 0x7 && k3_e2m1_from_f32(-1e9f) == 0xf, "e2m1 saturates to +-6");
    CHECK(k3_e2m1_from_f32(INFINITY) == 0x7 && k3_e2m1_from_f32(6.5f) == 0x7, "e2m1 inf / 6.5 -> 6");
    CHECK(k3_e2m1_from_f32(-0.1f) == 0x8 && k3_e2m1_from_f32(0.1f) == 0x0, "e2m1 keeps the sign of zero");
    int mism = 0;
    for (int i = 0; i < 100000; i++) {
        float x = 8.0f * k3t_uniform(rng);
        if (k3_e2m1_from_f32(x) != ref_e2m1(x) && mism++ < 5)
            fprintf(stderr, "e2m1(%a) = 0x%x want 0x%x\n", x, k3_e2m1_from_f32(x), ref_e2m1(x));
    }
    for (int c = 0; c < 7; c++) { /* a hair either side of each midpoint */
        float mid = 0.5f * (table[c] + table[c + 1]);
        float pr[2] = {nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int k = 0; k < 2; k++)
            if (k3_e2m1_from_f32(pr[k]) != ref_e2m1(pr[k])) mism++;
    }
    CHECK(mism == 0, "e2m1 encode matches nearest-even search (%d mismatches)", mism);
}

static void test_bf16_ue8m0(k3t_rng *rng) {
    CHECK(k3_bf16_from_f32(1.0f + ldexpf(1.0f, -8)) == 0x3f80, "bf16 tie 1 + 2^-8 -> 1 (even)");
    CHECK(k3_bf16_from_f32(1.0f + 3 * ldexpf(1.0f, -8)) == 0x3f82, "bf16 tie 1 + 3 * 2^-8 -> 1 + 2^-6 (even)");
    CHECK(k3_bf16_from_f32(-(1.0f + ldexpf(1.0f, -8))) == 0xbf80, "bf16 negative tie");
    CHECK(k3_bf16_from_f32(FLT_MAX) == 0x7f80, "bf16 FLT_MAX rounds to inf (RNE overflow)");
    CHECK(k3_bf16_from_f32(INFINITY) == 0x7f80 && k3_bf16_from_f32(-INFINITY) == 0xff80, "bf16 inf");
    uint16_t qn = k3_bf16_from_f32(NAN);
    CHECK((qn & 0x7f80) == 0x7f80 && (qn & 0x7f) != 0, "bf16 NaN stays NaN (0x%04x)", qn);
    CHECK(isnan(k3_bf16_to_f32(k3_bf16_from_f32(from_bits(0x7f800001u)))), "bf16 signalling NaN with low bits");
    CHECK(k3_bf16_from_f32(from_bits(0xff800001u)) & 0x8000, "bf16 NaN keeps its sign");
    int mism = 0;
    for (int i = 0; i < 200000; i++) {
        float x = from_bits((uint32_t)k3t_next(rng));
        if (isnan(x) || isinf(x)) continue;
        if (k3_bf16_from_f32(x) != ref_bf16(x) && mism++ < 5)
            fprintf(stderr, "bf16(%a) = 0x%04x want 0x%04x\n", x, k3_bf16_from_f32(x), ref_bf16(x));
    }
    for (uint32_t h = 0; h < 0x10000; h++) { /* every pattern decodes to itself << 16 and re-encodes */
        float v = k3_bf16_to_f32((uint16_t)h);
        if (bits(v) != h << 16) mism++;
        if (!isnan(v) && k3_bf16_from_f32(v) != h) mism++;
    }
    CHECK(mism == 0, "bf16 encode matches the neighbour comparison; all 65536 patterns round trip (%d)", mism);

    int ok = 1;
    for (int c = 0; c < 255; c++)
        if ((double)k3_ue8m0_to_f32((uint8_t)c) != ldexp(1.0, c - 127)) ok = 0;
    CHECK(ok, "ue8m0 codes 0..254 decode to 2^(c-127) exactly (incl. 2^-127, an fp32 subnormal)");
    CHECK(isnan(k3_ue8m0_to_f32(0xff)), "ue8m0 0xFF is NaN");

    /* F16 input decoding (k3 quant reads F16 tensors): every pattern against its fields */
    int f16_bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        int sgn = (int)(h >> 15), e = (int)((h >> 10) & 31), m = (int)(h & 1023);
        double want = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
        if (sgn) want = -want;
        float got = k3_f16_bits_to_f32((uint16_t)h);
        if (isnan(want) ? !isnan(got) : ((double)got != want || (signbit(got) != 0) != sgn)) f16_bad++;
    }
    CHECK(f16_bad == 0, "all 65536 F16 patterns decode exactly (%d bad)", f16_bad);
}

/* ---- FP4 reference quantizer ----------------------------------------------------------------------- */

/* Scales land at the linear offset r * sc + c here; the swizzle is tested separately against its definition. */
static void ref_quantize(k3_fp4_format fmt, int64_t rows, int64_t cols, const float *x, uint8_t *codes,
                         uint8_t *scales, float *gsi) {
    const int64_t blk = fmt == K3_FP4_NVFP4 ? 16 : 32, sc = cols / blk;
    float amax = 0.0f;
    for (int64_t i = 0; i < rows * cols; i++) amax = fmaxf(amax, fabsf(x[i]));
    float gs = amax > 0.0f ? 2688.0f / amax : 1.0f;
    if (fmt == K3_FP4_NVFP4) *gsi = 1.0f / gs;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < sc; c++) {
            const float *xb = x + r * cols + c * blk;
            float bmax = 0.0f;
            for (int64_t i = 0; i < blk; i++) bmax = fmaxf(bmax, fabsf(xb[i]));
            uint8_t s;
            double div;
            if (fmt == K3_FP4_NVFP4) {
                float sfin = (gs * bmax) / 6.0f;
                s = ref_e4m3(sfin);
                div = ref_e4m3_decode(s);
            } else {
                int e = 0;
                frexp(bmax, &e); /* bmax = m 2^e, m in [0.5, 1): floor(log2 bmax) = e - 1 */
                int code = bmax > 0.0f ? e - 1 - 2 + 127 : 0;
                s = (uint8_t)(code < 0 ? 0 : code > 254 ? 254 : code);
                div = ldexp(1.0, s - 127);
            }
            scales[r * sc + c] = s;
            for (int64_t i = 0; i < blk; i++) {
                uint8_t q = 0;
                if (div != 0.0) q = fmt == K3_FP4_NVFP4 ? ref_e2m1((float)((xb[i] * gs) / (float)div))
                                                        : ref_e2m1(xb[i] / div);
                codes[r * cols + c * blk + i] = q;
            }
        }
}

static int64_t ref_swizzle_offset(int64_t m, int64_t k, int64_t rows, int64_t sc) {
    /* view [Rp, Kp] as [Rp/128, 4, 32, Kp/4, 4] (m = a*128 + b*32 + c, k = d*4 + e), permute (0, 3, 2, 1, 4)
     * to [Rp/128, Kp/4, 32, 4, 4] and flatten */
    (void)rows;
    int64_t kp = (sc + 3) / 4 * 4;
    int64_t a = m / 128, b = (m % 128) / 32, c = m % 32, d = k / 4, e = k % 4;
    return (((a * (kp / 4) + d) * 32 + c) * 4 + b) * 4 + e;
}

static double rel_l2(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)a[i] * a[i];
    }
    return sqrt(num / den);
}

static void fill_normal(k3t_rng *rng, float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(scale * k3t_normal(rng));
}

/* Quantize with the library (linear layout), compare codes/scales/gsi with the reference exactly, and
 * dequantize against an fp64 evaluation of q * scale (* gsi). */
static void check_against_ref(k3_fp4_format fmt, int64_t batch, int64_t rows, int64_t cols, const float *x,
                              const char *what) {
    const int64_t blk = fmt == K3_FP4_NVFP4 ? 16 : 32, sc = cols / blk, n = rows * cols;
    uint8_t *packed = malloc((size_t)(batch * n / 2)), *scales = malloc((size_t)(batch * rows * sc));
    uint8_t *rcodes = malloc((size_t)n), *rscales = malloc((size_t)(rows * sc));
    float *gsi = malloc((size_t)batch * sizeof(float)), *y = malloc((size_t)(batch * n) * sizeof(float));
    k3_status st = k3_fp4_quantize(fmt, K3_SCALE_LINEAR, batch, rows, cols, x, packed, scales,
                                   fmt == K3_FP4_NVFP4 ? gsi : NULL);
    CHECK(st == K3_STATUS_SUCCESS, "%s: quantize", what);
    st = k3_fp4_dequantize(fmt, K3_SCALE_LINEAR, batch, rows, cols, packed, scales, fmt == K3_FP4_NVFP4 ? gsi : NULL,
                           y);
    CHECK(st == K3_STATUS_SUCCESS, "%s: dequantize", what);
    int bad_codes = 0, bad_scales = 0, bad_gsi = 0, bad_deq = 0;
    for (int64_t b = 0; b < batch; b++) {
        float rgsi = 0.0f;
        ref_quantize(fmt, rows, cols, x + b * n, rcodes, rscales, &rgsi);
        if (fmt == K3_FP4_NVFP4 && bits(rgsi) != bits(gsi[b])) bad_gsi++;
        for (int64_t i = 0; i < rows * sc; i++) bad_scales += rscales[i] != scales[b * rows * sc + i];
        for (int64_t i = 0; i < n; i++) {
            uint8_t byte = packed[b * n / 2 + i / 2];
            uint8_t q = (i & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 15);
            bad_codes += q != rcodes[i];
            double s = fmt == K3_FP4_NVFP4 ? ref_e4m3_decode(scales[b * rows * sc + i / blk])
                                           : ldexp(1.0, scales[b * rows * sc + i / blk] - 127);
            double v = ref_e2m1_decode(q) * s; /* exact in fp32 too */
            float want = fmt == K3_FP4_NVFP4 ? (float)(v * (double)gsi[b]) : (float)v;
            bad_deq += bits(want) != bits(y[b * n + i]) && !(want == 0.0f && y[b * n + i] == 0.0f);
        }
    }
    CHECK(bad_codes == 0 && bad_scales == 0 && bad_gsi == 0,
          "%s: codes/scales/global scales equal the reference (%d/%d/%d mismatches)", what, bad_codes, bad_scales,
          bad_gsi);
    CHECK(bad_deq == 0, "%s: dequantize equals q * scale (* 1/gs) evaluated in fp64 (%d mismatches)", what,
          bad_deq);
    free(packed);
    free(scales);
    free(rcodes);
    free(rscales);
    free(gsi);
    free(y);
}

static void test_fp4_reference(k3t_rng *rng) {
    int64_t rows = 48, cols = 256;
    float *x = malloc((size_t)(3 * rows * cols) * sizeof(float));
    fill_normal(rng, x, rows * cols, 1.0);
    /* a few exact ties and extreme values inside blocks */
    x[3] = 0.0f;
    x[17] = -x[16];
    x[100] = 40.0f;
    check_against_ref(K3_FP4_NVFP4, 1, rows, cols, x, "nvfp4 normal data");
    check_against_ref(K3_FP4_MXFP4, 1, rows, cols, x, "mxfp4 normal data");
    /* batch of three with very different ranges: each matrix gets its own global scale */
    fill_normal(rng, x, 3 * rows * cols, 1.0);
    for (int64_t i = 0; i < rows * cols; i++) {
        x[i] *= 1e-3f;
        x[2 * rows * cols + i] *= 1e3f;
    }
    check_against_ref(K3_FP4_NVFP4, 3, rows, cols, x, "nvfp4 batch 3");
    check_against_ref(K3_FP4_MXFP4, 3, rows, cols, x, "mxfp4 batch 3");
    free(x);
}

/* Error budgets on random normal data, and per-element bounds that follow from the formats:
 * - E2M1's largest gap is 2 (between 4 and 6), so an in-range element is off by at most 1 step unit;
 *   NVFP4's unit is sf/gs (the e4m3 scale may round down by < 1/16, pushing |x|gs/sf to < 6.4, which saturates
 *   to 6: still < 1 unit); MXFP4's OCP scale leaves |x|/scale < 8, saturating to 6: < 2 units.
 * - Relative L2: for Gaussian blocks the E2M1 grid gives ~0.09 (NVFP4, 16-element blocks with a fine e4m3
 *   scale) and ~0.12 (MXFP4, 32-element blocks with a power-of-two scale that wastes up to half the range).
 *   Budgets: 0.11 and 0.15; a broken rounding or scale shows up far above those. */
static void test_fp4_error_budget(k3t_rng *rng) {
    const int64_t batch = 2, rows = 128, cols = 512, n = batch * rows * cols;
    float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    uint8_t *packed = malloc((size_t)n / 2), *scales = malloc((size_t)(n / 16));
    float gsi[2];
    fill_normal(rng, x, n, 0.02);
    for (int f = 0; f < 2; f++) {
        k3_fp4_format fmt = f ? K3_FP4_MXFP4 : K3_FP4_NVFP4;
        const int64_t blk = f ? 32 : 16;
        CHECK(k3_fp4_quantize(fmt, K3_SCALE_LINEAR, batch, rows, cols, x, packed, scales, f ? NULL : gsi) ==
                  K3_STATUS_SUCCESS,
              "quantize");
        CHECK(k3_fp4_dequantize(fmt, K3_SCALE_LINEAR, batch, rows, cols, packed, scales, f ? NULL : gsi, y) ==
                  K3_STATUS_SUCCESS,
              "dequantize");
        double err = rel_l2(x, y, n), budget = f ? 0.15 : 0.11;
        printf("%s relative L2 error on N(0, 0.02^2) data: %.4f (budget %.2f)\n", f ? "mxfp4" : "nvfp4", err,
               budget);
        CHECK(err <= budget && err > 0.01, "%s relative L2 %.4f within (0.01, %.2f]", f ? "mxfp4" : "nvfp4", err,
              budget);
        int over = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t m = i / (rows * cols), blk_i = i / blk;
            double unit = f ? ldexp(1.0, scales[blk_i] - 127) * 2.0
                            : ref_e4m3_decode(scales[blk_i]) * (double)gsi[m];
            if (fabs((double)x[i] - y[i]) > unit * (1.0 + 1e-6)) over++;
        }
        CHECK(over == 0, "%s: every element within its step bound (%d over)", f ? "mxfp4" : "nvfp4", over);
    }
    free(x);
    free(y);
    free(packed);
    free(scales);
}

static void test_zero_blocks(void) {
    const int64_t rows = 2, cols = 64;
    float x[2 * 64] = {0};
    uint8_t packed[64], scales[512]; /* the swizzled layout pads 2 x 4 scales to 128 x 4 */
    float gsi[1] = {-1.0f}, y[128];
    for (int i = 0; i < 16; i++) x[i] = (float)(i - 8) * 0.25f; /* row 0 block 0 nonzero, the rest zero */
    x[40] = -0.0f;
    memset(packed, 0xAA, sizeof packed);
    memset(scales, 0xAA, sizeof scales);
    CHECK(k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, rows, cols, x, packed, scales, gsi) == 0, "q");
    int ok = 1;
    for (int b = 1; b < 8; b++) ok &= scales[b] == 0;
    for (int i = 8; i < 64; i++) ok &= packed[i] == 0;
    CHECK(ok, "nvfp4 zero blocks: scale 0 and all-zero codes");
    CHECK(k3_fp4_dequantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, rows, cols, packed, scales, gsi, y) == 0, "dq");
    ok = 1;
    for (int i = 16; i < 128; i++) ok &= y[i] == 0.0f && !isnan(y[i]);
    CHECK(ok, "nvfp4 zero blocks dequantize to 0, never NaN");

    memset(x, 0, sizeof x);
    CHECK(k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_SWIZZLED, 1, rows, cols, x, packed, scales, gsi) == 0, "q0");
    CHECK(gsi[0] == 1.0f, "all-zero nvfp4 matrix: global_scale_inv = 1 (got %g)", gsi[0]);
    CHECK(k3_fp4_dequantize(K3_FP4_NVFP4, K3_SCALE_SWIZZLED, 1, rows, cols, packed, scales, gsi, y) == 0, "dq0");
    ok = 1;
    for (int i = 0; i < 128; i++) ok &= y[i] == 0.0f;
    CHECK(ok, "all-zero nvfp4 matrix dequantizes to zeros");

    uint8_t mscales[4];
    CHECK(k3_fp4_quantize(K3_FP4_MXFP4, K3_SCALE_LINEAR, 1, rows, cols, x, packed, mscales, NULL) == 0, "mq0");
    ok = 1;
    for (int i = 0; i < 4; i++) ok &= mscales[i] == 0;
    for (int i = 0; i < 64; i++) ok &= packed[i] == 0;
    CHECK(ok, "all-zero mxfp4 matrix: scale code 0 and zero codes");
    CHECK(k3_fp4_dequantize(K3_FP4_MXFP4, K3_SCALE_LINEAR, 1, rows, cols, packed, mscales, NULL, y) == 0, "mdq0");
    ok = 1;
    for (int i = 0; i < 128; i++) ok &= y[i] == 0.0f;
    CHECK(ok, "all-zero mxfp4 matrix dequantizes to zeros");

    /* MXFP4 round trip is exact for values on the E2M1 grid times a power of two */
    for (int i = 0; i < 128; i++) x[i] = ldexpf(k3_e2m1_to_f32((uint8_t)(i % 16)), (i / 32) - 3); /* amax 6*2^k */
    CHECK(k3_fp4_quantize(K3_FP4_MXFP4, K3_SCALE_LINEAR, 1, rows, cols, x, packed, mscales, NULL) == 0, "mq");
    CHECK(k3_fp4_dequantize(K3_FP4_MXFP4, K3_SCALE_LINEAR, 1, rows, cols, packed, mscales, NULL, y) == 0, "mdq");
    ok = 1;
    for (int i = 0; i < 128; i++) ok &= y[i] == x[i];
    CHECK(ok, "mxfp4 round trip is exact for grid values");
}

static void test_swizzle(k3t_rng *rng) {
    const int64_t rows_list[] = {1, 31, 127, 128, 200, 300};
    const int64_t sc_list[] = {1, 3, 4, 6, 9};
    int bad = 0, perm_bad = 0;
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 5; b++) {
            int64_t rows = rows_list[a], sc = sc_list[b];
            int64_t rp = (rows + 127) / 128 * 128, kp = (sc + 3) / 4 * 4;
            size_t bytes = 0;
            CHECK(k3_fp4_scale_bytes(K3_FP4_NVFP4, K3_SCALE_SWIZZLED, rows, sc * 16, &bytes) == 0 &&
                      bytes == (size_t)(rp * kp),
                  "swizzled bytes rows %lld sc %lld: %zu want %lld", (long long)rows, (long long)sc, bytes,
                  (long long)(rp * kp));
            CHECK(k3_fp4_scale_bytes(K3_FP4_MXFP4, K3_SCALE_LINEAR, rows, sc * 32, &bytes) == 0 &&
                      bytes == (size_t)(rows * sc),
                  "linear bytes");
            unsigned char *seen = calloc((size_t)(rp * kp), 1);
            for (int64_t m = 0; m < rp; m++)
                for (int64_t k = 0; k < kp; k++) {
                    int64_t o = k3_scale_offset(K3_SCALE_SWIZZLED, m, k, rows, sc);
                    if (o != ref_swizzle_offset(m, k, rows, sc)) bad++;
                    if (o < 0 || o >= rp * kp || seen[o]++) perm_bad++;
                    if (m < rows && k < sc && k3_scale_offset(K3_SCALE_LINEAR, m, k, rows, sc) != m * sc + k) bad++;
                }
            free(seen);
        }
    CHECK(bad == 0, "swizzled offsets equal the reshape/permute definition (%d mismatches)", bad);
    CHECK(perm_bad == 0, "swizzled offsets are a permutation of the padded buffer (%d)", perm_bad);
    CHECK(k3_scale_offset(K3_SCALE_SWIZZLED, 33, 5, 200, 6) == (0 * 2 + 1) * 512 + 1 * 16 + 1 * 4 + 1,
          "swizzle worked example (m 33, k 5)");

    /* quantize in both layouts: the same scales at mapped places, zero padding, identical dequantization */
    for (int f = 0; f < 2; f++) {
        k3_fp4_format fmt = f ? K3_FP4_MXFP4 : K3_FP4_NVFP4;
        const int64_t batch = 2, rows = 130, cols = f ? 96 : 48, blk = f ? 32 : 16, sc = cols / blk, n = rows * cols;
        size_t sl = 0, ss = 0;
        k3_fp4_scale_bytes(fmt, K3_SCALE_LINEAR, rows, cols, &sl);
        k3_fp4_scale_bytes(fmt, K3_SCALE_SWIZZLED, rows, cols, &ss);
        float *x = malloc((size_t)(batch * n) * sizeof(float)), *y1 = malloc((size_t)(batch * n) * sizeof(float));
        float *y2 = malloc((size_t)(batch * n) * sizeof(float));
        uint8_t *p1 = malloc((size_t)(batch * n / 2)), *p2 = malloc((size_t)(batch * n / 2));
        uint8_t *s1 = malloc(sl * batch), *s2 = malloc(ss * batch);
        float g1[2], g2[2];
        fill_normal(rng, x, batch * n, 3.0);
        memset(s2, 0x5A, ss * batch);
        CHECK(k3_fp4_quantize(fmt, K3_SCALE_LINEAR, batch, rows, cols, x, p1, s1, f ? NULL : g1) == 0, "ql");
        CHECK(k3_fp4_quantize(fmt, K3_SCALE_SWIZZLED, batch, rows, cols, x, p2, s2, f ? NULL : g2) == 0, "qs");
        CHECK(!memcmp(p1, p2, (size_t)(batch * n / 2)), "packed codes do not depend on the scale layout");
        int mism = 0, pad = 0;
        for (int64_t b = 0; b < batch; b++) {
            unsigned char *used = calloc(ss, 1);
            for (int64_t m = 0; m < rows; m++)
                for (int64_t k = 0; k < sc; k++) {
                    int64_t o = ref_swizzle_offset(m, k, rows, sc);
                    used[o] = 1;
                    mism += s2[b * ss + o] != s1[b * sl + m * sc + k];
                }
            for (size_t o = 0; o < ss; o++) pad += !used[o] && s2[b * ss + o] != 0;
            free(used);
        }
        CHECK(mism == 0 && pad == 0, "%s: swizzled scales sit at the defined offsets (%d), padding is 0 (%d)",
              f ? "mxfp4" : "nvfp4", mism, pad);
        CHECK(k3_fp4_dequantize(fmt, K3_SCALE_LINEAR, batch, rows, cols, p1, s1, f ? NULL : g1, y1) == 0, "dl");
        CHECK(k3_fp4_dequantize(fmt, K3_SCALE_SWIZZLED, batch, rows, cols, p2, s2, f ? NULL : g2, y2) == 0, "ds");
        CHECK(!memcmp(y1, y2, (size_t)(batch * n) * sizeof(float)), "%s: linear and swizzled dequantize equal",
              f ? "mxfp4" : "nvfp4");
        free(x);
        free(y1);
        free(y2);
        free(p1);
        free(p2);
        free(s1);
        free(s2);
    }
}

static void test_fake_quant(k3t_rng *rng) {
    const int64_t n = 160;
    float x[160], y[160], z[160], ref[160], gsi;
    uint8_t packed[80], scales[10];
    fill_normal(rng, x, n, 0.5);
    x[7] = 0.0f;
    for (int i = 32; i < 48; i++) x[i] = 0.0f; /* a zero block */
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    CHECK(k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, 1, n, x, packed, scales, &gsi) == 0, "q");
    CHECK(k3_fp4_dequantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, 1, n, packed, scales, &gsi, y) == 0, "dq");
    k3_nvfp4_fake_quant(x, n, 2688.0f / amax, z);
    CHECK(!memcmp(y, z, sizeof y), "fake_quant equals quantize + dequantize of the same row (bitwise)");
    CHECK(bits(k3_nvfp4_global_scale(amax)) == bits(2688.0f / amax) && k3_nvfp4_global_scale(0.0f) == 1.0f,
          "global scale rule");
    /* gs = 1 (W4A4 with input_scale 1): against the reference rounding points */
    for (int64_t b = 0; b < n; b += 16) {
        float bmax = 0.0f;
        for (int i = 0; i < 16; i++) bmax = fmaxf(bmax, fabsf(x[b + i]));
        double sf = ref_e4m3_decode(ref_e4m3((1.0f * bmax) / 6.0f));
        for (int i = 0; i < 16; i++)
            ref[b + i] = sf == 0.0 ? 0.0f : (float)(ref_e2m1_decode(ref_e2m1((float)(x[b + i] / (float)sf))) * sf);
    }
    memcpy(z, x, sizeof z);
    k3_nvfp4_fake_quant(z, n, 1.0f, z); /* in place */
    int bad = 0;
    for (int i = 0; i < n; i++) bad += z[i] != ref[i];
    CHECK(bad == 0, "fake_quant with gs = 1, in place, equals the reference (%d mismatches)", bad);
}

static void test_bad_arguments(void) {
    float x[64] = {0}, g = 0.0f;
    uint8_t p[32], s[512];
    size_t bytes = 0;
    const k3_status IA = K3_STATUS_INVALID_ARGUMENT;
    CHECK(k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, 1, 24, x, p, s, &g) == IA, "nvfp4 cols 24");
    CHECK(k3_fp4_quantize(K3_FP4_MXFP4, K3_SCALE_LINEAR, 1, 1, 48, x, p, s, NULL) == IA, "mxfp4 cols 48");
    CHECK(k3_fp4_quantize(K3_FP4_MXFP4, K3_SCALE_LINEAR, 1, 1, 16, x, p, s, NULL) == IA, "mxfp4 cols 16");
    CHECK(k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, 1, 0, x, p, s, &g) == IA, "cols 0");
    CHECK(k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, 0, 16, x, p, s, &g) == IA, "rows 0");
    CHECK(k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 0, 1, 16, x, p, s, &g) == IA, "batch 0");
    CHECK(k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, -1, 1, 16, x, p, s, &g) == IA, "batch -1");
    CHECK(k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, 1, 16, NULL, p, s, &g) == IA, "NULL x");
    CHECK(k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, 1, 16, x, NULL, s, &g) == IA, "NULL packed");
    CHECK(k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, 1, 16, x, p, NULL, &g) == IA, "NULL scales");
    CHECK(k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, 1, 16, x, p, s, NULL) == IA, "nvfp4 NULL gsi");
    CHECK(k3_fp4_quantize(K3_FP4_MXFP4, K3_SCALE_LINEAR, 1, 1, 32, x, p, s, &g) == IA, "mxfp4 with a gsi");
    CHECK(k3_fp4_quantize((k3_fp4_format)7, K3_SCALE_LINEAR, 1, 1, 32, x, p, s, NULL) == IA, "bad format");
    CHECK(k3_fp4_quantize(K3_FP4_MXFP4, (k3_scale_layout)9, 1, 1, 32, x, p, s, NULL) == IA, "bad layout");
    CHECK(k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, INT64_MAX / 2, 1 << 20, 1 << 20, x, p, s, &g) == IA,
          "size overflow");
    CHECK(k3_fp4_dequantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, 1, 24, p, s, &g, x) == IA, "dq cols 24");
    CHECK(k3_fp4_dequantize(K3_FP4_MXFP4, K3_SCALE_LINEAR, 1, 1, 32, p, s, &g, x) == IA, "dq mxfp4 with gsi");
    CHECK(k3_fp4_dequantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, 1, 16, p, s, NULL, x) == IA, "dq nvfp4 NULL gsi");
    CHECK(k3_fp4_dequantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, 1, 16, NULL, s, &g, x) == IA, "dq NULL packed");
    CHECK(k3_fp4_dequantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, 1, 16, p, NULL, &g, x) == IA, "dq NULL scales");
    CHECK(k3_fp4_dequantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, 1, 16, p, s, &g, NULL) == IA, "dq NULL x");
    CHECK(k3_fp4_scale_bytes(K3_FP4_NVFP4, K3_SCALE_LINEAR, 4, 16, NULL) == IA, "scale_bytes NULL out");
    CHECK(k3_fp4_scale_bytes(K3_FP4_NVFP4, K3_SCALE_LINEAR, 4, 17, &bytes) == IA, "scale_bytes cols 17");
    CHECK(k3_fp4_scale_bytes(K3_FP4_NVFP4, K3_SCALE_LINEAR, 4, 32, &bytes) == 0 && bytes == 8, "scale_bytes 4x32");
    /* non-finite input cannot be represented: rejected, nothing silently wrong */
    x[5] = NAN;
    CHECK(k3_fp4_quantize(K3_FP4_NVFP4, K3_SCALE_LINEAR, 1, 4, 16, x, p, s, &g) == IA, "NaN input");
    x[5] = INFINITY;
    CHECK(k3_fp4_quantize(K3_FP4_MXFP4, K3_SCALE_LINEAR, 1, 2, 32, x, p, s, NULL) == IA, "Inf input");
}

int main(void) {
    printf("seed %llu\n", (unsigned long long)SEED);
    k3t_rng rng = {SEED};
    test_e4m3(&rng);
    test_e2m1(&rng);
    test_bf16_ue8m0(&rng);
    test_fp4_reference(&rng);
    test_fp4_error_budget(&rng);
    test_zero_blocks();
    test_swizzle(&rng);
    test_fake_quant(&rng);
    test_bad_arguments();
    return k3t_finish();
}
