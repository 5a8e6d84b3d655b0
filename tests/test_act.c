/*
 * Activations: every formula against an independent fp64 evaluation written here, the SiTU facts of
 * docs/model.md section 2 (bound, SiLU limits), the layouts, and every descriptor validation rule.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "core/act.h"
#include "core/act_check.h"
#include "test_util.h"

/* ---- fp64 references (straight from docs/model.md section 2, sharing nothing with core/act.h) ---- */
static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double ref_clamp(double v, double lo, double hi) { return v < lo ? lo : (v > hi ? hi : v); }

static double ref_silu(double g, double u, double lim) {
    if (lim > 0) {
        g = g < lim ? g : lim;
        u = ref_clamp(u, -lim, lim);
    }
    return g * ref_sigmoid(g) * u;
}
static double ref_swiglu(double g, double u, double alpha, double beta, double lim) {
    if (lim > 0) {
        g = g < lim ? g : lim;
        u = ref_clamp(u, -lim, lim);
    }
    return (u + beta) * g * ref_sigmoid(alpha * g);
}
static double ref_situ(double g, double u, double b, double lb) {
    double a = b * tanh(g / b) * ref_sigmoid(g);
    return a * (lb > 0 ? lb * tanh(u / lb) : u);
}
static double ref_relu2(double x) { return x > 0 ? x * x : 0.0; }

static double ref_gated(const k3_act_desc *d, double g, double u) {
    switch (d->kind) {
    case K3_ACT_SILU: return ref_silu(g, u, d->limit);
    case K3_ACT_SWIGLUOAI:
    case K3_ACT_SWIGLUOAI_UNINTERLEAVE: return ref_swiglu(g, u, d->alpha, d->beta, d->limit);
    case K3_ACT_SITU: return ref_situ(g, u, d->situ_beta, d->situ_linear_beta);
    default: return ref_relu2(g);
    }
}

/*
 * Tolerance: |got - ref| <= RTOL * |ref| + ATOL. RTOL covers a handful of fp32 roundings and the 1-2 ulp error
 * of expf/tanhf, plus for SWIGLUOAI the rounding of alpha*g inside the sigmoid, whose relative effect grows like
 * |alpha g| * 2^-24 (up to ~87 * 6e-8 = 5e-6 before the sigmoid underflows). ATOL only absorbs denormal
 * results (fp32 subnormals have few significant bits).
 */
#define ACT_RTOL 8e-6
#define ACT_ATOL 1e-36

static k3t_rng rng;

/* A draw whose magnitude spans 1e-3 .. 1e4 (log-uniform), plus a sprinkle of fixed extremes. */
static float draw(double max_scale) {
    double s = pow(10.0, -3.0 + (log10(max_scale) + 3.0) * (k3t_uniform(&rng) * 0.5 + 0.5));
    return (float)(k3t_uniform(&rng) * s);
}

static void check_formula(const k3_act_desc *d, double g_scale, double u_scale, int n, const char *label) {
    double worst = 0.0;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        float g = draw(g_scale), u = draw(u_scale);
        float got = k3_act_gated(d, g, u);
        double ref = ref_gated(d, g, u);
        double err = fabs((double)got - ref);
        double rel = err / (fabs(ref) + 1e-300);
        if (fabs(ref) > 1e-30 && rel > worst) worst = rel;
        if (!(err <= ACT_RTOL * fabs(ref) + ACT_ATOL)) {
            if (bad++ < 3)
                fprintf(stderr, "  %s: g=%.9g u=%.9g got %.9g ref %.9g\n", label, (double)g, (double)u, (double)got,
                        ref);
        }
    }
    CHECK(bad == 0, "%s: %d of %d points outside rtol %.0e", label, bad, n, ACT_RTOL);
    printf("  %-28s max rel err %.2e over %d points (|g| <= %.0e, |u| <= %.0e)\n", label, worst, n, g_scale,
           u_scale);
}

static void test_formulas(void) {
    k3_act_desc d;
    printf("formulas vs fp64:\n");
    k3_act_desc_init(&d, K3_ACT_SILU);
    check_formula(&d, 1e2, 1e3, 20000, "silu");
    d.limit = 7.0f;
    check_formula(&d, 1e4, 1e4, 20000, "silu limit 7");
    k3_act_desc_init(&d, K3_ACT_SWIGLUOAI);
    check_formula(&d, 1e4, 1e4, 20000, "swigluoai (1.702, 1, 7)");
    d.limit = 0.0f;
    check_formula(&d, 1e2, 1e3, 20000, "swigluoai no limit");
    d.alpha = 0.5f;
    d.beta = -2.0f;
    d.limit = 3.0f;
    check_formula(&d, 1e4, 1e4, 20000, "swigluoai (0.5, -2, 3)");
    k3_act_desc_init(&d, K3_ACT_SWIGLUOAI_UNINTERLEAVE);
    check_formula(&d, 1e4, 1e4, 20000, "swigluoai_uninterleave");
    k3_act_desc_k3(&d);
    check_formula(&d, 1e4, 1e4, 20000, "situ 4/25");
    d.situ_linear_beta = 0.0f;
    check_formula(&d, 1e4, 1e3, 20000, "situ 4, no linear_beta");
    d.situ_beta = 0.5f;
    d.situ_linear_beta = 2.0f;
    check_formula(&d, 1e4, 1e4, 20000, "situ 0.5/2");

    /* relu2 and the fixed large-|x| points every kind must survive without NaN */
    int bad = 0;
    for (int i = 0; i < 20000; i++) {
        float x = draw(1e15);
        double ref = ref_relu2(x);
        float got = k3_act_relu2(x);
        if (!(fabs(got - ref) <= 1e-7 * ref)) bad++;
    }
    CHECK(bad == 0, "relu2: %d bad points", bad);
    CHECK(k3_act_relu2(-0.0f) == 0.0f && k3_act_relu2(-3.0f) == 0.0f && k3_act_relu2(3.0f) == 9.0f, "relu2 exact");

    const float big[] = {88.0f, 89.0f, 100.0f, 1e4f, 1e30f, FLT_MAX};
    for (int i = 0; i < 6; i++) {
        for (int s = -1; s <= 1; s += 2) {
            float x = s * big[i];
            float sg = k3_act_sigmoid(x);
            CHECK(sg >= 0.0f && sg <= 1.0f, "sigmoid(%g) = %g in [0, 1]", (double)x, (double)sg);
            CHECK(fabs(sg - ref_sigmoid(x)) <= 1e-7, "sigmoid(%g) = %g vs %g", (double)x, (double)sg,
                  ref_sigmoid(x));
            k3_act_desc_k3(&d);
            CHECK(!isnan(k3_act_gated(&d, x, 1.0f)), "situ(%g, 1) not NaN", (double)x);
            k3_act_desc_init(&d, K3_ACT_SILU);
            float v = k3_act_gated(&d, x, 1.0f);
            CHECK(!isnan(v) && fabs(v - ref_silu(x, 1.0, 0)) <= 1e-6 * fabs(ref_silu(x, 1.0, 0)) + ACT_ATOL,
                  "silu(%g, 1) = %g", (double)x, (double)v);
            k3_act_desc_init(&d, K3_ACT_SWIGLUOAI);
            v = k3_act_gated(&d, x, 1.0f);
            CHECK(!isnan(v), "swigluoai(%g, 1) not NaN", (double)x);
        }
    }
    CHECK(k3_act_sigmoid(-100.0f) > 0.0f && k3_act_sigmoid(-100.0f) < 1e-43f, "sigmoid(-100) ~ 3.7e-44, not 0");
}

/* |situ| <= beta * linear_beta on extreme inputs (infinities included). */
static void test_situ_bound(void) {
    const float ext[] = {0.0f, 1.0f, 4.0f, 25.0f, 100.0f, 1e4f, 1e30f, FLT_MAX, INFINITY};
    const float betas[][2] = {{4.0f, 25.0f}, {0.5f, 2.0f}, {1e3f, 1e-2f}};
    int bad = 0, n = 0;
    float worst = 0.0f;
    for (int b = 0; b < 3; b++) {
        k3_act_desc d;
        k3_act_desc_k3(&d);
        d.situ_beta = betas[b][0];
        d.situ_linear_beta = betas[b][1];
        const float bound = d.situ_beta * d.situ_linear_beta;
        for (int i = 0; i < 9; i++)
            for (int j = 0; j < 9; j++)
                for (int s = 0; s < 4; s++) {
                    float g = (s & 1 ? -1.0f : 1.0f) * ext[i], u = (s & 2 ? -1.0f : 1.0f) * ext[j];
                    float v = k3_act_gated(&d, g, u);
                    n++;
                    if (!(fabsf(v) <= bound)) bad++;
                    if (b == 0 && fabsf(v) > worst) worst = fabsf(v);
                }
        for (int i = 0; i < 20000; i++) {
            float v = k3_act_gated(&d, draw(1e30), draw(1e30));
            n++;
            if (!(fabsf(v) <= bound)) bad++;
        }
    }
    CHECK(bad == 0, "situ bound: %d of %d outputs exceed beta * linear_beta (or are NaN)", bad, n);
    CHECK(worst == 100.0f, "K3 situ reaches its bound 100 at (+inf, +-inf): max seen %g", (double)worst);
    printf("situ bound: %d outputs, none above beta * linear_beta; K3 max |out| = %g\n", n, (double)worst);
}

/*
 * SiTU ~ SiLU for |g| << beta: beta tanh(g / beta) = g (1 - (g/beta)^2 / 3 + ...), so without linear_beta the
 * relative difference is at most (g/beta)^2 / 3. Checked against that bound (plus fp32 noise) and checked to be
 * really present (SiTU is not SiLU) at g = beta / 10.
 */
static void test_situ_vs_silu(void) {
    k3_act_desc situ, silu;
    k3_act_desc_k3(&situ);
    situ.situ_linear_beta = 0.0f;
    k3_act_desc_init(&silu, K3_ACT_SILU);
    int bad = 0;
    double worst_ratio = 0.0;
    for (int i = 0; i < 20000; i++) {
        float g = k3t_uniform(&rng) * 0.4f; /* |g| <= beta / 10 */
        float u = k3t_uniform(&rng) * 10.0f;
        float a = k3_act_gated(&situ, g, u), b = k3_act_gated(&silu, g, u);
        double q = (double)g / situ.situ_beta;
        double bound = (q * q / 3.0) * fabs(b) + 1e-6 * fabs(b) + ACT_ATOL;
        if (!(fabs(a - b) <= bound)) bad++;
        if (fabs(b) > 1e-6 && q * q > 1e-4) {
            double ratio = fabs(a - b) / fabs(b) / (q * q / 3.0);
            if (ratio > worst_ratio) worst_ratio = ratio;
        }
    }
    CHECK(bad == 0, "situ vs silu for |g| <= beta/10: %d points beyond (g/beta)^2/3", bad);
    float a = k3_act_gated(&situ, 0.4f, 1.0f), b = k3_act_gated(&silu, 0.4f, 1.0f);
    double rel = fabs(a - b) / fabs(b);
    CHECK(rel > 2e-3 && rel < 4e-3, "situ(0.4) differs from silu(0.4) by %.3e (expected ~ 0.01/3)", rel);
    printf("situ vs silu, |g| <= 0.4 = beta/10: |diff| / |silu| <= %.3f * (g/beta)^2/3; at g = 0.4 %.3e\n",
           worst_ratio, rel);

    /* linear_beta 25 for |u| << 25 behaves like u */
    k3_act_desc_k3(&situ);
    bad = 0;
    for (int i = 0; i < 5000; i++) {
        float g = k3t_uniform(&rng) * 0.4f, u = k3t_uniform(&rng) * 2.5f;
        float s = k3_act_gated(&situ, g, u), l = k3_act_gated(&silu, g, u);
        double qg = (double)g / 4.0, qu = (double)u / 25.0;
        if (!(fabs(s - l) <= (qg * qg / 3 + qu * qu / 3 + 1e-6) * fabs(l) + ACT_ATOL)) bad++;
    }
    CHECK(bad == 0, "situ 4/25 vs silu for small g and u: %d points off", bad);
}

/*
 * SiTU with beta 1e6 and no linear_beta equals SiLU within fp32 rounding: for |g| <= 100 the analytic gap
 * (g/beta)^2/3 <= 3.4e-9 is below fp32 resolution, so what remains is rounding: a few roundings plus expf/tanhf
 * on each side. Tolerance: 8 ulps relative (8 * 2^-24 = 4.8e-7).
 */
static void test_situ_big_beta(void) {
    k3_act_desc situ, silu;
    k3_act_desc_init(&situ, K3_ACT_SITU);
    situ.situ_beta = 1e6f;
    k3_act_desc_init(&silu, K3_ACT_SILU);
    CHECK(k3_act_desc_validate(&situ, NULL, 0) == K3_STATUS_SUCCESS, "beta 1e6 valid");
    const double tol = 8.0 * ldexp(1.0, -24);
    double worst = 0.0;
    int bad = 0, exact = 0;
    for (int i = 0; i < 20000; i++) {
        float g = k3t_uniform(&rng) * 100.0f, u = k3t_uniform(&rng) * 100.0f;
        float a = k3_act_gated(&situ, g, u), b = k3_act_gated(&silu, g, u);
        if (a == b) exact++;
        double rel = fabs((double)a - b) / (fabs(b) + 1e-300);
        if (fabs(b) > 1e-30 && rel > worst) worst = rel;
        if (!(fabs((double)a - b) <= tol * fabs(b) + ACT_ATOL)) bad++;
    }
    CHECK(bad == 0, "situ(beta 1e6) vs silu: %d of 20000 beyond 8 ulps", bad);
    printf("situ beta 1e6 vs silu (|g|, |u| <= 100): max rel diff %.2e (%.1f ulps), %d of 20000 bitwise equal\n",
           worst, worst / ldexp(1.0, -24), exact);
}

/* k3_act_row reads the kind's layout: interleaved SWIGLUOAI == [gate; up] SWIGLUOAI_UNINTERLEAVE, bitwise. */
static void test_layouts(void) {
    enum { D = 37 };
    float gate_up[2 * D], inter[2 * D], o1[D], o2[D], o3[D];
    for (int i = 0; i < D; i++) {
        gate_up[i] = draw(20.0);
        gate_up[D + i] = draw(20.0);
        inter[2 * i] = gate_up[i];
        inter[2 * i + 1] = gate_up[D + i];
    }
    k3_act_desc a, b;
    k3_act_desc_init(&a, K3_ACT_SWIGLUOAI);
    k3_act_desc_init(&b, K3_ACT_SWIGLUOAI_UNINTERLEAVE);
    CHECK(a.limit == b.limit && a.limit == 7.0f, "both default to limit 7");
    k3_act_row(&a, inter, o1, D);
    k3_act_row(&b, gate_up, o2, D);
    CHECK(!memcmp(o1, o2, sizeof o1), "interleaved and uninterleaved layouts agree bitwise");
    int bad = 0;
    for (int i = 0; i < D; i++)
        if (!(fabs(o2[i] - ref_swiglu(gate_up[i], gate_up[D + i], a.alpha, a.beta, a.limit)) <=
              ACT_RTOL * fabs(o2[i]) + ACT_ATOL))
            bad++;
    CHECK(bad == 0, "swigluoai row vs fp64: %d bad", bad);

    const k3_act_kind gated[] = {K3_ACT_SILU, K3_ACT_SITU};
    for (int t = 0; t < 2; t++) {
        k3_act_desc d;
        if (gated[t] == K3_ACT_SITU)
            k3_act_desc_k3(&d);
        else
            k3_act_desc_init(&d, gated[t]);
        k3_act_row(&d, gate_up, o3, D);
        bad = 0;
        for (int i = 0; i < D; i++) {
            double ref = ref_gated(&d, gate_up[i], gate_up[D + i]);
            if (!(fabs(o3[i] - ref) <= ACT_RTOL * fabs(ref) + ACT_ATOL)) bad++;
        }
        CHECK(bad == 0, "%s row reads [gate; up]: %d bad", k3_act_name(gated[t]), bad);
    }
    /* RELU2_NO_MUL reads only dim elements: the second half is poisoned to prove it */
    k3_act_desc r;
    k3_act_desc_init(&r, K3_ACT_RELU2_NO_MUL);
    float in[2 * D];
    for (int i = 0; i < D; i++) in[i] = gate_up[i];
    for (int i = D; i < 2 * D; i++) in[i] = NAN;
    for (int i = 0; i < D; i++) o3[i] = -1.0f;
    k3_act_row(&r, in, o3, D);
    bad = 0;
    for (int i = 0; i < D; i++)
        if (o3[i] != (float)ref_relu2(in[i]) && fabs(o3[i] - ref_relu2(in[i])) > 1e-7 * ref_relu2(in[i])) bad++;
    CHECK(bad == 0, "relu2 row: %d bad", bad);
    CHECK(k3_act_width_factor(K3_ACT_RELU2_NO_MUL) == 1, "relu2 width 1");
    const k3_act_kind all_gated[] = {K3_ACT_SILU, K3_ACT_SWIGLUOAI, K3_ACT_SWIGLUOAI_UNINTERLEAVE, K3_ACT_SITU};
    for (int i = 0; i < 4; i++) CHECK(k3_act_width_factor(all_gated[i]) == 2, "kind %d width 2", (int)all_gated[i]);
}

static void expect_invalid(const k3_act_desc *d, const char *needle, const char *label) {
    char msg[256];
    k3_status st = k3_act_desc_validate(d, msg, sizeof msg);
    CHECK(st == K3_STATUS_INVALID_ARGUMENT, "%s: status %d", label, (int)st);
    CHECK(strstr(msg, needle) != NULL, "%s: message \"%s\" lacks \"%s\"", label, msg, needle);
}

static void test_validation(void) {
    k3_act_desc d;
    char msg[256];
    /* valid descriptors */
    const k3_act_kind kinds[] = {K3_ACT_SILU, K3_ACT_SWIGLUOAI, K3_ACT_SWIGLUOAI_UNINTERLEAVE, K3_ACT_RELU2_NO_MUL};
    for (int i = 0; i < 4; i++) {
        k3_act_desc_init(&d, kinds[i]);
        CHECK(k3_act_desc_validate(&d, msg, sizeof msg) == K3_STATUS_SUCCESS && msg[0] == '\0',
              "default %s valid", k3_act_name(kinds[i]));
    }
    k3_act_desc_k3(&d);
    CHECK(k3_act_desc_validate(&d, msg, sizeof msg) == K3_STATUS_SUCCESS, "K3 preset valid");
    CHECK(d.kind == K3_ACT_SITU && d.situ_beta == 4.0f && d.situ_linear_beta == 25.0f && d.limit == 0.0f,
          "K3 preset = SITU 4/25, no limit");
    d.situ_linear_beta = 0.0f;
    CHECK(k3_act_desc_validate(&d, NULL, 0) == K3_STATUS_SUCCESS, "linear_beta unset (0) is fine");
    d.situ_linear_beta = -1.0f; /* 0 is the only unset value: a negative one must not drop the linear clamp */
    expect_invalid(&d, "activation_situ_linear_beta must be finite and > 0", "linear_beta -1 refused");
    d.situ_linear_beta = -25.0f;
    expect_invalid(&d, "(0 means unset; got -25)", "linear_beta -25 refused, value named");
    k3_act_desc_k3(&d);
    d.situ_beta = 1e-45f; /* a tiny positive (denormal) beta is valid, and never "not finite" */
    CHECK(k3_act_desc_validate(&d, msg, sizeof msg) == K3_STATUS_SUCCESS, "situ_beta 1e-45 is valid: %s", msg);
    d.situ_linear_beta = 1e-45f;
    CHECK(k3_act_desc_validate(&d, msg, sizeof msg) == K3_STATUS_SUCCESS, "linear_beta 1e-45 is valid: %s", msg);
    k3_act_desc_init(&d, K3_ACT_SILU);
    d.limit = 10.0f;
    CHECK(k3_act_desc_validate(&d, NULL, 0) == K3_STATUS_SUCCESS, "silu with a limit is fine");
    d.limit = -1.0f;
    expect_invalid(&d, "activation limit must be finite and >= 0 (0 means no clamp; got -1)", "negative limit refused");
    d.limit = -5.0f;
    expect_invalid(&d, "activation limit", "limit -5 refused");
    d.limit = 1e-45f;
    CHECK(k3_act_desc_validate(&d, msg, sizeof msg) == K3_STATUS_SUCCESS, "limit 1e-45 is valid: %s", msg);
    k3_act_desc_init(&d, K3_ACT_SWIGLUOAI);
    d.limit = 0.0f;
    CHECK(k3_act_desc_validate(&d, NULL, 0) == K3_STATUS_SUCCESS, "interleaved swigluoai without a limit is fine");

    /* every rule */
    k3_act_desc_init(&d, K3_ACT_SITU);
    expect_invalid(&d, "SITU activation requires activation_situ_beta", "situ without beta");
    d.situ_beta = -4.0f;
    expect_invalid(&d, "activation_situ_beta must be finite and > 0 (0 means unset; got -4)", "situ beta < 0");
    d.situ_beta = -1.0f;
    expect_invalid(&d, "activation_situ_beta", "situ beta -1");
    d.situ_beta = NAN;
    expect_invalid(&d, "activation_situ_beta must be finite", "situ beta NaN");
    d.situ_beta = INFINITY;
    expect_invalid(&d, "activation_situ_beta must be finite", "situ beta inf");
    k3_act_desc_k3(&d);
    d.situ_linear_beta = NAN;
    expect_invalid(&d, "activation_situ_linear_beta must be finite", "linear_beta NaN");
    d.situ_linear_beta = -INFINITY;
    expect_invalid(&d, "activation_situ_linear_beta must be finite", "linear_beta -inf");
    k3_act_desc_k3(&d);
    d.limit = 7.0f;
    expect_invalid(&d, "SITU activation takes no clamp limit", "situ with a limit");
    k3_act_desc_init(&d, K3_ACT_SWIGLUOAI_UNINTERLEAVE);
    d.limit = 0.0f;
    expect_invalid(&d, "SWIGLUOAI_UNINTERLEAVE activation requires a clamp limit", "uninterleave without limit");
    d.limit = -2.0f;
    expect_invalid(&d, "activation limit must be finite and >= 0", "uninterleave limit < 0");
    k3_act_desc_init(&d, K3_ACT_SWIGLUOAI);
    d.alpha = INFINITY;
    expect_invalid(&d, "activation alpha must be finite", "alpha inf");
    k3_act_desc_init(&d, K3_ACT_SWIGLUOAI);
    d.beta = NAN;
    expect_invalid(&d, "activation beta must be finite", "beta NaN");
    k3_act_desc_init(&d, K3_ACT_SILU);
    d.limit = NAN;
    expect_invalid(&d, "activation limit must be finite", "limit NaN");
    d.limit = INFINITY;
    expect_invalid(&d, "activation limit must be finite", "limit inf");
    k3_act_desc_init(&d, K3_ACT_SILU);
    d.kind = (k3_act_kind)5;
    expect_invalid(&d, "activation kind 5 is unknown", "kind 5");
    d.kind = (k3_act_kind)-1;
    expect_invalid(&d, "activation kind -1 is unknown", "kind -1");
    k3_act_desc_init(&d, K3_ACT_SILU);
    d.situ_beta = 4.0f;
    expect_invalid(&d, "use K3_ACT_SITU", "situ_beta on a silu kind");
    k3_act_desc_init(&d, K3_ACT_SILU);
    d.situ_linear_beta = 25.0f;
    expect_invalid(&d, "use K3_ACT_SITU", "situ_linear_beta on a silu kind");
    /* the defaults of every kind hold no negative value (so they stay valid under the "0 = unset" rule) */
    for (int kk = 0; kk <= 4; kk++) {
        k3_act_desc_init(&d, (k3_act_kind)kk);
        CHECK(d.limit >= 0.0f && d.situ_beta >= 0.0f && d.situ_linear_beta >= 0.0f, "kind %d defaults non-negative",
              kk);
    }
    CHECK(k3_act_desc_validate(NULL, msg, sizeof msg) == K3_STATUS_INVALID_ARGUMENT && strstr(msg, "NULL"),
          "NULL descriptor: %s", msg);
    k3_act_desc_init(&d, K3_ACT_SITU);
    CHECK(k3_act_desc_validate(&d, NULL, 0) == K3_STATUS_INVALID_ARGUMENT, "NULL msg buffer accepted");
    char tiny[8];
    CHECK(k3_act_desc_validate(&d, tiny, sizeof tiny) == K3_STATUS_INVALID_ARGUMENT && strlen(tiny) == 7,
          "message truncated to the buffer");

    /* k3_act_check records the message on the context */
    k3_ctx *ctx = k3t_cpu_ctx();
    CHECK(ctx != NULL, "cpu ctx");
    CHECK(k3_act_check(ctx, &d) == K3_STATUS_INVALID_ARGUMENT, "act_check fails");
    CHECK(!strcmp(k3_ctx_last_error(ctx), "SITU activation requires activation_situ_beta"), "ctx message: %s",
          k3_ctx_last_error(ctx));
    k3_act_desc_k3(&d);
    CHECK(k3_act_check(ctx, &d) == K3_STATUS_SUCCESS, "act_check passes the K3 preset");
    k3_ctx_destroy(ctx);

    /* names and defaults */
    CHECK(!strcmp(k3_act_name(K3_ACT_SITU), "situ") && !strcmp(k3_act_name(K3_ACT_SILU), "silu") &&
              !strcmp(k3_act_name(K3_ACT_SWIGLUOAI), "swigluoai") &&
              !strcmp(k3_act_name(K3_ACT_SWIGLUOAI_UNINTERLEAVE), "swigluoai_uninterleave") &&
              !strcmp(k3_act_name(K3_ACT_RELU2_NO_MUL), "relu2") && !strcmp(k3_act_name((k3_act_kind)9), "unknown"),
          "names");
    k3_act_desc_init(&d, K3_ACT_SWIGLUOAI);
    CHECK(d.alpha == 1.702f && d.beta == 1.0f && d.limit == 7.0f && d.situ_beta == 0.0f, "swigluoai defaults");
    k3_act_desc_init(&d, K3_ACT_SILU);
    CHECK(d.limit == 0.0f, "silu default: no clamp");
    k3_act_desc_init(NULL, K3_ACT_SILU);
    k3_act_desc_k3(NULL);
}

int main(void) {
    const uint64_t seed = 0xAC7AC7ull;
    printf("seed 0x%llx\n", (unsigned long long)seed);
    rng.s = seed;
    test_formulas();
    test_situ_bound();
    test_situ_vs_silu();
    test_situ_big_beta();
    test_layouts();
    test_validation();
    return k3t_finish();
}
