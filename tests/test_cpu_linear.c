/*
 * The CPU BF16 linear against an independent fp64 loop written here: fp64 mode must give the
 * same BF16 outputs (rel-L2 <= 1e-6, exact matches counted), fp32 mode stays within an fp32 error budget;
 * strides, the residual (separate and aliasing y), odd shapes, and batch independence.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu.h"
#include "test_util.h"

static k3t_rng rng;

/* ---- independent helpers (no library code) ---- */
static float t_bf16_to_f32(uint16_t b) { return k3t_bf16_to_f32(b); }

/* Rounds a double to bf16 (8 significant bits, round half to even) via frexp/nearbyint; normal range only. */
static uint16_t t_bf16_from_f64(double v) {
    if (v == 0.0) return signbit(v) ? 0x8000u : 0;
    int e;
    double mant = frexp(v, &e);                 /* v = mant * 2^e, 0.5 <= |mant| < 1 */
    double r = nearbyint(ldexp(mant, 8));       /* default rounding mode: to nearest, ties to even */
    union {
        uint32_t u;
        float f;
    } f;
    f.f = (float)ldexp(r, e - 8);               /* exactly representable in bf16, hence in float */
    return (uint16_t)(f.u >> 16);
}

static uint16_t rand_bf16(double scale) {
    union {
        uint32_t u;
        float f;
    } f;
    f.f = (float)(k3t_normal(&rng) * scale);
    return (uint16_t)(f.u >> 16); /* truncation is fine: any bf16 value will do as input */
}

static void fill(uint16_t *p, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) p[i] = rand_bf16(scale);
}

/* exact[i, j] = sum_k x w (+ r) in long double, summed in k order; also sum |x w| for error bounds. */
static void ref_linear(int64_t m, int64_t n, int64_t k, const uint16_t *x, int64_t xs, const uint16_t *w,
                       const uint16_t *res, int64_t ys, double *exact, double *absum) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            long double s = 0, a = 0;
            for (int64_t kk = 0; kk < k; kk++) {
                long double p = (long double)t_bf16_to_f32(x[i * xs + kk]) * t_bf16_to_f32(w[j * k + kk]);
                s += p;
                a += fabsl(p);
            }
            if (res) {
                s += t_bf16_to_f32(res[i * ys + j]);
                a += fabsf(t_bf16_to_f32(res[i * ys + j]));
            }
            exact[i * n + j] = (double)s;
            absum[i * n + j] = (double)a;
        }
}

typedef struct {
    int64_t m, n, k, xs, ys;
    int residual; /* 0 none, 1 separate, 2 aliasing y */
} shape;

/*
 * Runs one shape in both modes and checks:
 * - fp64 mode: bf16 output vs the independent rounding of the exact value: rel-L2 <= 1e-6, at most 1 bf16 ulp
 *   anywhere (only when the exact value sits on a rounding boundary), exact matches counted;
 * - fp32 mode: |y - exact| <= half a bf16 ulp of |exact| (the final rounding, <= 2^-8 relative) plus the fp32
 *   summation bound (k / 16 + 5) * 2^-24 * sum |x w| (16 lanes of k/16 sequential adds, a 4-level tree, the
 *   residual add); rel-L2 vs the reference bf16 <= 4e-3 (a couple of bf16 ulps at most);
 * - strides: the padding of y is untouched.
 */
static void run_shape(shape s, const char *label) {
    const int64_t m = s.m, n = s.n, k = s.k, xs = s.xs ? s.xs : k, ys = s.ys ? s.ys : n;
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(m * xs));
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(n * k));
    uint16_t *res = malloc(sizeof(uint16_t) * (size_t)(m * ys));
    uint16_t *y = malloc(sizeof(uint16_t) * (size_t)(m * ys));
    double *exact = malloc(sizeof(double) * (size_t)(m * n)), *absum = malloc(sizeof(double) * (size_t)(m * n));
    fill(x, m * xs, 1.0);
    fill(w, n * k, 1.0 / sqrt((double)k));
    fill(res, m * ys, 1.0);
    ref_linear(m, n, k, x, xs, w, s.residual ? res : NULL, ys, exact, absum);

    for (int mode = 0; mode < 2; mode++) {
        const k3_accum acc = mode ? K3_ACCUM_FP64 : K3_ACCUM_FP32;
        const uint16_t sentinel = 0x7fc1; /* a NaN pattern nobody computes */
        const uint16_t *r = NULL;
        if (s.residual == 1) {
            for (int64_t i = 0; i < m * ys; i++) y[i] = sentinel;
            r = res;
        } else if (s.residual == 2) {
            memcpy(y, res, sizeof(uint16_t) * (size_t)(m * ys)); /* y holds the residual and is overwritten */
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = n; j < ys; j++) y[i * ys + j] = sentinel;
            r = y;
        } else {
            for (int64_t i = 0; i < m * ys; i++) y[i] = sentinel;
        }
        k3_cpu_linear(m, n, k, x, xs, w, r, y, ys, acc);

        double num = 0, den = 0;
        int64_t exact_match = 0, off_by_one = 0, worse = 0, over_budget = 0, pad_touched = 0;
        for (int64_t i = 0; i < m; i++) {
            for (int64_t j = n; j < ys; j++) pad_touched += y[i * ys + j] != sentinel;
            for (int64_t j = 0; j < n; j++) {
                const double e = exact[i * n + j];
                const uint16_t want = t_bf16_from_f64(e), got = y[i * ys + j];
                const double g = t_bf16_to_f32(got), wv = t_bf16_to_f32(want);
                num += (g - wv) * (g - wv);
                den += wv * wv;
                if (got == want)
                    exact_match++;
                else if (abs((int)got - (int)want) == 1 && ((got ^ want) & 0x8000u) == 0)
                    off_by_one++;
                else
                    worse++;
                const double budget = ldexp(fabs(e), -8) + ((double)k / 16 + 5) * ldexp(absum[i * n + j], -24);
                if (!(fabs(g - e) <= budget)) over_budget++;
            }
        }
        const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        const int64_t total = m * n;
        CHECK(pad_touched == 0, "%s %s: %lld padding elements written", label, mode ? "fp64" : "fp32",
              (long long)pad_touched);
        if (mode) {
            CHECK(rel <= 1e-6, "%s fp64: rel-L2 %.3e > 1e-6", label, rel);
            CHECK(worse == 0, "%s fp64: %lld outputs more than 1 ulp off", label, (long long)worse);
            CHECK(off_by_one * 1000 <= total, "%s fp64: %lld of %lld outputs 1 ulp off (rounding boundaries are rare)",
                  label, (long long)off_by_one, (long long)total);
        } else {
            CHECK(over_budget == 0, "%s fp32: %lld outputs beyond the fp32 error budget", label,
                  (long long)over_budget);
            CHECK(rel <= 4e-3, "%s fp32: rel-L2 %.3e > 4e-3", label, rel);
        }
        printf("  %-34s %s: %lld/%lld exact, %lld 1-ulp, %lld worse, rel-L2 %.2e\n", label, mode ? "fp64" : "fp32",
               (long long)exact_match, (long long)total, (long long)off_by_one, (long long)worse, rel);
    }
    free(x);
    free(w);
    free(res);
    free(y);
    free(exact);
    free(absum);
}

/* Row i of a batch equals the same row computed alone (no dependence on m or on the other rows). */
static void test_batch_independence(void) {
    const int64_t m = 7, n = 33, k = 515;
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(m * k)), *w = malloc(sizeof(uint16_t) * (size_t)(n * k));
    uint16_t *yb = malloc(sizeof(uint16_t) * (size_t)(m * n)), y1[33];
    fill(x, m * k, 1.0);
    fill(w, n * k, 0.05);
    for (int mode = 0; mode < 2; mode++) {
        const k3_accum acc = mode ? K3_ACCUM_FP64 : K3_ACCUM_FP32;
        k3_cpu_linear(m, n, k, x, k, w, NULL, yb, n, acc);
        int diff = 0;
        for (int64_t i = 0; i < m; i++) {
            k3_cpu_linear(1, n, k, x + i * k, k, w, NULL, y1, n, acc);
            diff += memcmp(y1, yb + i * n, sizeof y1) != 0;
        }
        CHECK(diff == 0, "%s: %d rows differ between m = 7 and m = 1", mode ? "fp64" : "fp32", diff);
    }
    free(x);
    free(w);
    free(yb);
}

/* Hand-checkable values: exact small integers, a residual, rounding to even at the end. */
static void test_exact_values(void) {
    /* x = [1, 2, 3], w rows [1, 1, 1], [0.5, -1, 2] -> 6, 4.5; residual [0.25, -4.5] -> 6.25, 0 */
    const uint16_t x[3] = {0x3f80, 0x4000, 0x4040};
    const uint16_t w[6] = {0x3f80, 0x3f80, 0x3f80, 0x3f00, 0xbf80, 0x4000};
    const uint16_t r[2] = {0x3e80, 0xc090};
    uint16_t y[2];
    for (int mode = 0; mode < 2; mode++) {
        const k3_accum acc = mode ? K3_ACCUM_FP64 : K3_ACCUM_FP32;
        k3_cpu_linear(1, 2, 3, x, 3, w, NULL, y, 2, acc);
        CHECK(y[0] == 0x40c0 && y[1] == 0x4090, "6 and 4.5: got %04x %04x", y[0], y[1]);
        k3_cpu_linear(1, 2, 3, x, 3, w, r, y, 2, acc);
        CHECK(y[0] == 0x40c8 && y[1] == 0x0000, "6.25 and 0: got %04x %04x", y[0], y[1]);
    }
    /* a sum exactly halfway between two bf16 values rounds to even: 1 + 2^-8 -> 1; 1 + 3 * 2^-8 -> 1 + 2^-6 */
    const uint16_t ones[2] = {0x3f80, 0x3f80};
    const uint16_t wa[2] = {0x3f80, 0x3b80}; /* 1, 2^-8 */
    const uint16_t wb[2] = {0x3f80, 0x3c40}; /* 1, 3 * 2^-8 */
    for (int mode = 0; mode < 2; mode++) {
        const k3_accum acc = mode ? K3_ACCUM_FP64 : K3_ACCUM_FP32;
        k3_cpu_linear(1, 1, 2, ones, 2, wa, NULL, y, 1, acc);
        CHECK(y[0] == 0x3f80, "1 + 2^-8 rounds to even 1: %04x", y[0]);
        k3_cpu_linear(1, 1, 2, ones, 2, wb, NULL, y, 1, acc);
        CHECK(y[0] == 0x3f82, "1 + 3 * 2^-8 rounds to even 1 + 2^-6: %04x", y[0]);
    }
    /* fp64 mode rounds once: 1 + 2^-8 + 2^-40 is above the midpoint and must round up to 1 + 2^-7, although the
     * float nearest to it is the midpoint itself (a double rounding through float would give 1) */
    const uint16_t x3[3] = {0x3f80, 0x3f80, 0x3f80};
    const uint16_t w3[3] = {0x3f80, 0x3b80, 0x2b80}; /* 1, 2^-8, 2^-40 */
    k3_cpu_linear(1, 1, 3, x3, 3, w3, NULL, y, 1, K3_ACCUM_FP64);
    CHECK(y[0] == 0x3f81, "fp64 mode rounds 1 + 2^-8 + 2^-40 once, up: %04x", y[0]);
}

/* Times the K3 linears (informational; the limit that matters is the whole block's 5 s). */
static void time_k3_shapes(void) {
    static const int64_t shapes[][2] = {{3584, 7168}, {7168, 3584}, {1536, 7168}, {7168, 768}};
    uint16_t *x = malloc(sizeof(uint16_t) * 16 * 7168), *y = malloc(sizeof(uint16_t) * 16 * 7168);
    uint16_t *w = malloc(sizeof(uint16_t) * 3584 * 7168);
    fill(x, 16 * 7168, 1.0);
    fill(w, 3584 * 7168, 0.01);
    printf("timing (fp32 accumulation):\n");
    for (int s = 0; s < 4; s++) {
        const int64_t n = shapes[s][0], k = shapes[s][1];
        for (int64_t m = 1; m <= 16; m *= 16) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            k3_cpu_linear(m, n, k, x, k, w, NULL, y, n, K3_ACCUM_FP32);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6;
            printf("  %5lld x %5lld, m = %2lld: %8.2f ms (%.2f GFLOP/s)\n", (long long)n, (long long)k, (long long)m,
                   ms, 2e-6 * (double)(m * n * k) / ms);
        }
    }
    free(x);
    free(y);
    free(w);
}

/* k3_linear_workspace_size with a NULL out_bytes fails with a message (it used to leave none). */
static void test_workspace_size_null(void) {
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CPU;
    k3_ctx *ctx = NULL;
    CHECK(k3_ctx_create(&opt, &ctx) == K3_STATUS_SUCCESS, "cpu context");
    k3_linear_desc d;
    k3_linear_desc_init(&d, 64, 128);
    k3_linear_plan *p = NULL;
    CHECK(k3_linear_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "plan: %s", k3_ctx_last_error(ctx));
    CHECK(k3_linear_workspace_size(p, NULL) == K3_STATUS_INVALID_ARGUMENT &&
              strstr(k3_ctx_last_error(ctx), "out_bytes is NULL"),
          "linear workspace size NULL out_bytes: '%s'", k3_ctx_last_error(ctx));
    size_t ws = 1;
    CHECK(k3_linear_workspace_size(p, &ws) == K3_STATUS_SUCCESS && !strcmp(k3_ctx_last_error(ctx), ""),
          "linear workspace size clears the message");
    CHECK(k3_linear_workspace_size(NULL, &ws) == K3_STATUS_INVALID_ARGUMENT, "NULL plan");
    k3_linear_plan_destroy(p);
    k3_ctx_destroy(ctx);
}

int main(void) {
    const uint64_t seed = 0x11AE4Bull;
    printf("seed 0x%llx\n", (unsigned long long)seed);
    rng.s = seed;
    test_exact_values();
    test_workspace_size_null();
    const shape shapes[] = {
        {1, 1, 1, 0, 0, 0},        {3, 5, 3, 0, 0, 0},        {5, 1, 7168, 0, 0, 1},   {16, 64, 7168, 0, 0, 0},
        {4, 37, 3, 11, 40, 1},     {7, 29, 100, 128, 31, 2},  {1, 200, 7168, 0, 0, 2}, {16, 48, 1536, 0, 0, 1},
        {9, 17, 17, 20, 18, 0},    {2, 3, 1, 5, 4, 2},
    };
    const char *labels[] = {
        "m1 n1 k1",        "m3 n5 k3",          "m5 n1 k7168 +res",     "m16 n64 k7168",
        "m4 n37 k3 strided +res", "m7 n29 k100 strided alias", "m1 n200 k7168 alias", "m16 n48 k1536 +res",
        "m9 n17 k17 strided", "m2 n3 k1 strided alias",
    };
    printf("shapes:\n");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) run_shape(shapes[i], labels[i]);
    test_batch_independence();
    if (getenv("K3_TEST_TIMING")) time_k3_shapes();
    return k3t_finish();
}
