/* The GPU tests' harness (tests/k3t_harness.h) on host buffers: each check must catch what it claims (an element
 * left poisoned, a write into either guard or outside the region, a NaN, an Inf, an error just over each budget
 * kind, one differing bit of an int32 id) and pass a correct result (and an error just under each budget), with
 * messages that name the buffer, the index and the seed. Every "caught" assertion fails if its check is
 * disabled. */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k3t_harness.h"

static int has(const k3t_verdict *v, const char *needle) { return strstr(v->msg, needle) != NULL; }

/* An output of rows x ld bf16 elements whose first cols columns are the op's: written with ref, rounded. */
static void write_bf16(k3t_out *o, const double *ref, int64_t rows, int64_t cols, int64_t ld) {
    uint16_t *y = (uint16_t *)k3t_out_body(o);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) y[r * ld + c] = k3t_bf16_bits((float)ref[r * cols + c]);
}

static void test_bf16_and_rng(void) {
    CHECK(k3t_bf16_bits(1.0f) == 0x3F80, "1.0");
    CHECK(k3t_bf16_bits(-2.0f) == 0xC000, "-2.0");
    const uint32_t ties[][2] = {
        {0x3F808000u, 0x3F80}, /* halfway, even below: down */
        {0x3F818000u, 0x3F82}, /* halfway, odd below: up */
        {0x3F808001u, 0x3F81}, /* past halfway: up */
        {0x3F807FFFu, 0x3F80}, /* under halfway: down */
        {0x7F7FFFFFu, 0x7F80}, /* the largest float rounds to infinity */
        {0x7F800000u, 0x7F80}, /* infinity */
        {0x00000001u, 0x0000}, /* the smallest subnormal: to zero */
    };
    for (size_t i = 0; i < sizeof ties / sizeof ties[0]; i++) {
        float f;
        memcpy(&f, &ties[i][0], 4);
        CHECK(k3t_bf16_bits(f) == ties[i][1], "0x%08x -> 0x%04x, got 0x%04x", (unsigned)ties[i][0],
              (unsigned)ties[i][1], (unsigned)k3t_bf16_bits(f));
    }
    const uint16_t nan_bits = k3t_bf16_bits(NAN);
    CHECK((nan_bits & 0x7F80) == 0x7F80 && (nan_bits & 0x7F), "NaN stays NaN: 0x%04x", (unsigned)nan_bits);
    /* a NaN whose payload sits only in the low 16 bits must not round into infinity */
    const uint32_t low_nan = 0x7F800001u;
    float lf;
    memcpy(&lf, &low_nan, 4);
    CHECK((k3t_bf16_bits(lf) & 0x7F) != 0, "low-payload NaN stays NaN: 0x%04x", (unsigned)k3t_bf16_bits(lf));
    CHECK(k3t_round_bf16(1.0 + 1.0 / 512) == 1.0, "1 + 2^-9 rounds to 1 (tie to even)");
    CHECK(k3t_round_bf16(1.0 + 3.0 / 512) == 1.0 + 4.0 / 512, "1 + 3 * 2^-9 rounds up");
    /* agrees with the library's codec (written apart) on finite values */
    k3t_rng r = {12345};
    int differ = 0;
    for (int i = 0; i < 200000; i++) {
        const uint32_t u = (uint32_t)k3t_next(&r);
        float f;
        memcpy(&f, &u, 4);
        if (isfinite(f)) differ += k3t_bf16_bits(f) != k3_bf16_from_f32(f);
    }
    CHECK(differ == 0, "%d of 200000 random floats round differently from the library's codec", differ);
    /* k3t_rand_bf16: in range, and a seed gives the same sequence */
    k3t_rng a = {7}, b = {7};
    int bad = 0, same = 1;
    for (int i = 0; i < 1000; i++) {
        const uint16_t x = k3t_rand_bf16(&a, 0.5f), y = k3t_rand_bf16(&b, 0.5f);
        bad += !(fabs(k3t_bf16_to_f32(x)) <= 0.5);
        same &= x == y;
    }
    CHECK(bad == 0 && same, "k3t_rand_bf16: %d out of range, same sequence %d", bad, same);
}

static void test_seeds(void) {
    setenv("K3T_SEED", "0x1234", 1);
    CHECK(k3t_seed_init("test_harness", 99) == 0x1234, "K3T_SEED (hex) replaces the default");
    setenv("K3T_SEED", "77", 1);
    CHECK(k3t_seed_init("test_harness", 99) == 77, "K3T_SEED (decimal)");
    unsetenv("K3T_SEED");
    CHECK(k3t_seed_init("test_harness", 0xABCDEF) == 0xABCDEF, "the default without K3T_SEED");
    const k3t_case c = {"seeded", {8, 16, 0, 0, 0, 0}, 4, 0, 5, K3T_OP_GEMM};
    CHECK(k3t_case_begin(&c) == 0xABCDEF + 5, "a case's seed is the base plus its offset");
    CHECK(k3t_case_enter("dynamic", 9) == 0xABCDEF + 9, "a run-time case likewise");
    char buf[160];
    k3t_where(buf, sizeof buf);
    CHECK(strstr(buf, "dynamic") && strstr(buf, "0xabcdf8") && strstr(buf, "K3T_SEED=0xabcdef"), "where: %s", buf);
}

/* The budget numbers the GPU tests use: a change here is a change of what they accept. */
static void test_budget_table(void) {
    const struct {
        k3t_op op;
        k3t_budget_kind kind;
        double tol;
    } want[] = {{K3T_OP_LINEAR, K3T_REL_L2, 2e-3},     {K3T_OP_GEMM, K3T_REL_L2, 2e-3},
                {K3T_OP_KDA_PROJ, K3T_REL_L2, 2e-3},   {K3T_OP_MOE_W4A16, K3T_REL_L2, 1e-2},
                {K3T_OP_MOE_W4A4, K3T_REL_L2, 2e-2},   {K3T_OP_LATENT_MOE, K3T_REL_L2, 1e-2},
                {K3T_OP_ROUTER, K3T_BITWISE, 0},       {K3T_OP_DISPATCH, K3T_BITWISE, 0},
                {K3T_OP_REPEAT, K3T_BITWISE, 0}};
    CHECK(sizeof want / sizeof want[0] == K3T_OP_COUNT, "every op has its budget checked here");
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const k3t_budget *b = k3t_budget_of(want[i].op);
        CHECK(b->op && b->kind == want[i].kind && b->tol == want[i].tol, "budget %s: kind %d tol %g", b->op,
              (int)b->kind, b->tol);
    }
}

static void test_output_checks(void) {
    k3t_case_enter("outputs", 3);
    const int64_t rows = 4, cols = 6, ld = 8, n = 5 * ld; /* a stride gap of 2 and a fifth row the op must leave */
    double ref[4 * 6];
    k3t_rng r = {42};
    for (int i = 0; i < rows * cols; i++) ref[i] = k3t_uniform(&r);
    k3t_out o;
    if (!k3t_out_init(&o, "y_test", K3T_BF16, n)) return;
    const k3t_region reg = k3t_rows(rows, cols, ld);

    /* freshly made: poisoned, guards intact; nothing of the region written */
    k3t_verdict v = k3t_out_guards(&o);
    CHECK(v.ok, "fresh guards: %s", v.msg);
    v = k3t_out_written(&o, reg, 0);
    CHECK(!v.ok && v.count == rows * cols && v.index == 0, "a fresh output is all poison: count %lld",
          (long long)v.count);
    v = k3t_out_outside(&o, reg, NULL);
    CHECK(v.ok, "a fresh output is untouched outside: %s", v.msg);

    /* a correct result passes everything */
    write_bf16(&o, ref, rows, cols, ld);
    v = k3t_out_guards(&o);
    CHECK(v.ok, "guards: %s", v.msg);
    v = k3t_out_written(&o, reg, 0);
    CHECK(v.ok && v.count == 0, "written: %s", v.msg);
    v = k3t_out_outside(&o, reg, NULL);
    CHECK(v.ok, "outside: %s", v.msg);
    CHECK(k3t_check_out(&o, reg, 0, NULL), "k3t_check_out passes a correct result");

    uint16_t *y = (uint16_t *)k3t_out_body(&o);
    /* one element missed (still poison) */
    const uint16_t keep = y[2 * ld + 5];
    y[2 * ld + 5] = 0xFFFF;
    v = k3t_out_written(&o, reg, 0);
    CHECK(!v.ok && v.count == 1 && v.index == 2 * ld + 5, "a missed element is caught (count %lld index %lld)",
          (long long)v.count, (long long)v.index);
    CHECK(has(&v, "y_test") && has(&v, "index 21") && has(&v, "row 2 col 5") && has(&v, "seed 0x"), "message: %s",
          v.msg);
    y[2 * ld + 5] = keep;

    /* NaN (another NaN than the poison) and Inf in the region */
    y[1 * ld + 0] = 0x7FC0;
    v = k3t_out_written(&o, reg, 0);
    CHECK(!v.ok && v.count == 1 && v.index == ld, "a NaN is caught: %s", v.msg);
    CHECK(has(&v, "1 NaN/Inf"), "message: %s", v.msg);
    v = k3t_out_written(&o, reg, K3T_NONFINITE_OK);
    CHECK(v.ok, "a NaN where the case expects one passes: %s", v.msg);
    y[1 * ld + 0] = 0x7F80;
    v = k3t_out_written(&o, reg, 0);
    CHECK(!v.ok && v.index == ld, "+Inf is caught: %s", v.msg);
    y[1 * ld + 0] = 0xFF80;
    v = k3t_out_written(&o, reg, 0);
    CHECK(!v.ok && v.index == ld, "-Inf is caught: %s", v.msg);
    y[1 * ld + 0] = k3t_bf16_bits((float)ref[cols]);
    CHECK(k3t_out_written(&o, reg, 0).ok, "restored");

    /* a write into the stride gap, and into the row past the region */
    y[0 * ld + 6] = 0;
    v = k3t_out_outside(&o, reg, NULL);
    CHECK(!v.ok && v.count == 1 && v.index == 6, "a write into the stride gap is caught: %s", v.msg);
    CHECK(has(&v, "y_test") && has(&v, "index 6"), "message: %s", v.msg);
    y[0 * ld + 6] = 0xFFFF;
    y[4 * ld + 0] = 0x3F80;
    v = k3t_out_outside(&o, reg, NULL);
    CHECK(!v.ok && v.index == 4 * ld, "a write past the region's rows is caught: %s", v.msg);
    v = k3t_out_written(&o, reg, 0);
    CHECK(v.ok, "which the region check does not see: %s", v.msg);
    y[4 * ld + 0] = 0xFFFF;

    /* outside compared with an image (aliased residual: the rest must hold what it held) */
    uint16_t *img = (uint16_t *)malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) img[i] = (uint16_t)(0x3000 + i);
    for (int64_t i = 0; i < n; i++)
        if (!k3t_in_region(reg, i)) y[i] = img[i];
    v = k3t_out_outside(&o, reg, img);
    CHECK(v.ok, "outside equal to the image: %s", v.msg);
    y[3 * ld + 7] ^= 1;
    v = k3t_out_outside(&o, reg, img);
    CHECK(!v.ok && v.index == 3 * ld + 7, "one bit changed outside is caught: %s", v.msg);
    y[3 * ld + 7] ^= 1;
    v = k3t_out_outside(&o, reg, NULL);
    CHECK(!v.ok, "and the image is not poison");
    free(img);
    k3t_out_poison(&o);
    write_bf16(&o, ref, rows, cols, ld);

    /* guards: the byte just before the body, the byte just after it */
    o.img[K3T_GUARD_BYTES - 1] = 0;
    v = k3t_out_guards(&o);
    CHECK(!v.ok && v.count == 1 && v.index == -1, "a write just before the body is caught: %s", v.msg);
    CHECK(has(&v, "y_test") && has(&v, "before"), "message: %s", v.msg);
    o.img[K3T_GUARD_BYTES - 1] = K3T_GUARD_BYTE;
    o.img[K3T_GUARD_BYTES + (size_t)n * 2] = 0xFF;
    v = k3t_out_guards(&o);
    CHECK(!v.ok && v.count == 1 && v.index == n * 2, "a write just after the body is caught: %s", v.msg);
    CHECK(has(&v, "after"), "message: %s", v.msg);
    o.img[K3T_GUARD_BYTES + (size_t)n * 2] = K3T_GUARD_BYTE;
    o.img[0] = 1;
    CHECK(!k3t_out_guards(&o).ok, "the first guard byte");
    o.img[0] = K3T_GUARD_BYTE;
    o.img[k3t_out_img_bytes(&o) - 1] = 1;
    CHECK(!k3t_out_guards(&o).ok, "the last guard byte");
    o.img[k3t_out_img_bytes(&o) - 1] = K3T_GUARD_BYTE;
    CHECK(k3t_out_guards(&o).ok, "guards restored");

    /* a region that does not fit the buffer is a broken test, not a pass */
    v = k3t_out_written(&o, k3t_rows(6, cols, ld), 0);
    CHECK(!v.ok && has(&v, "does not fit"), "oversized region: %s", v.msg);
    k3t_out_free(&o);

    /* int32 and f32 outputs: their own poison */
    k3t_out ids, w;
    if (!k3t_out_init(&ids, "ids_test", K3T_I32, 6) || !k3t_out_init(&w, "w_test", K3T_F32, 6)) return;
    int32_t *pi = (int32_t *)k3t_out_body(&ids);
    float *pw = (float *)k3t_out_body(&w);
    CHECK(pi[0] == (int32_t)0xA5A5A5A5 && isnan(pw[0]), "int32 and f32 poison");
    for (int i = 0; i < 6; i++) pi[i] = i == 3 ? -1 : i, pw[i] = 0.25f * (float)i;
    CHECK(k3t_out_written(&ids, k3t_flat(6), 0).ok, "int32 ids written (-1 is not poison)");
    CHECK(k3t_out_written(&w, k3t_flat(6), 0).ok, "f32 written");
    pi[4] = (int32_t)0xA5A5A5A5;
    v = k3t_out_written(&ids, k3t_flat(6), 0);
    CHECK(!v.ok && v.index == 4 && has(&v, "ids_test"), "a missed int32 is caught: %s", v.msg);
    v = k3t_out_written(&ids, k3t_flat(4), 0);
    CHECK(v.ok, "but not outside a 4-element region: %s", v.msg);
    v = k3t_out_outside(&ids, k3t_flat(4), NULL);
    CHECK(!v.ok && v.index == 5, "where element 5 was written: %s", v.msg);
    CHECK(!k3t_out_outside(&ids, k3t_flat(4), NULL).ok && k3t_out_outside(&ids, k3t_flat(6), NULL).ok, "flat regions");
    pw[2] = INFINITY;
    CHECK(!k3t_out_written(&w, k3t_flat(6), 0).ok, "an f32 Inf is caught");
    memset(&pw[2], 0xFF, 4);
    v = k3t_out_written(&w, k3t_flat(6), 0);
    CHECK(!v.ok && v.index == 2 && has(&v, "1 elements left poisoned"), "an unwritten f32 is caught: %s", v.msg);
    k3t_out_free(&ids);
    k3t_out_free(&w);
}

static void test_compare(void) {
    k3t_case_enter("compare", 4);
    enum { N = 64 };
    double ref[N];
    float got[N];
    uint16_t gb[N];
    k3t_rng r = {5};
    for (int i = 0; i < N; i++) ref[i] = 0.5 + 0.5 * k3t_uniform(&r);
    double ss = 0;
    for (int i = 0; i < N; i++) ss += ref[i] * ref[i];
    const double norm = sqrt(ss);
    const k3t_view vref = k3t_view1(ref, K3T_F64, N);

    /* rel-L2: an error vector of norm tol * ||ref|| * (1 -/+ 1%) on one element */
    const k3t_budget rel = {"rel_test", K3T_REL_L2, 1e-2};
    double g64[N];
    for (int s = 0; s < 2; s++) {
        const double scale = s ? 1.01 : 0.99;
        memcpy(g64, ref, sizeof ref);
        g64[7] += rel.tol * norm * scale;
        const k3t_verdict v = k3t_compare("rel", k3t_view1(g64, K3T_F64, N), vref, &rel);
        CHECK(v.ok == !s && fabs(v.metric - rel.tol * scale) < 1e-9, "rel-L2 %s the budget: metric %.6g ok %d",
              s ? "just over" : "just under", v.metric, v.ok);
        if (s) CHECK(has(&v, "rel-L2") && has(&v, "row 0 col 7") && has(&v, "seed 0x"), "message: %s", v.msg);
    }
    /* an all-zero reference: the absolute norm */
    double z[4] = {0, 0, 0, 0}, zg[4] = {0, 0, 0, 0};
    CHECK(k3t_compare("zero", k3t_view1(zg, K3T_F64, 4), k3t_view1(z, K3T_F64, 4), &rel).ok, "zero vs zero");
    zg[1] = 0.02;
    CHECK(!k3t_compare("zero", k3t_view1(zg, K3T_F64, 4), k3t_view1(z, K3T_F64, 4), &rel).ok, "0.02 vs zero");

    /* NaN / Inf in got: +inf error, caught */
    for (int i = 0; i < N; i++) got[i] = (float)ref[i];
    const k3t_view vgot = k3t_view1(got, K3T_F32, N);
    CHECK(k3t_compare("f32", vgot, vref, &rel).ok, "f32 copy of the reference passes");
    got[9] = NAN;
    k3t_verdict v = k3t_compare("nan", vgot, vref, &rel);
    CHECK(!v.ok && isinf(v.metric) && v.index == 9 && has(&v, "NaN/Inf"), "a NaN is caught: %s", v.msg);
    got[9] = -INFINITY;
    v = k3t_compare("inf", vgot, vref, &rel);
    CHECK(!v.ok && v.index == 9, "an Inf is caught: %s", v.msg);
    got[9] = (float)ref[9];
    /* a NaN in the reference fails too (a broken reference is no pass) */
    const double keep = ref[3];
    ref[3] = NAN;
    CHECK(!k3t_compare("nan ref", vgot, vref, &rel).ok, "a NaN reference");
    ref[3] = keep;

    /* max-abs */
    const k3t_budget ab = {"abs_test", K3T_MAX_ABS, 1.0 / 64};
    for (int s = 0; s < 2; s++) {
        memcpy(g64, ref, sizeof ref);
        g64[11] -= ab.tol * (s ? 1.01 : 0.99);
        v = k3t_compare("abs", k3t_view1(g64, K3T_F64, N), vref, &ab);
        CHECK(v.ok == !s && v.index == 11, "max-abs %s: %.6g", s ? "just over" : "just under", v.metric);
    }

    /* max-ulp on BF16: 2 steps allowed, 2 pass and 3 fail (also across zero) */
    const k3t_budget ulp = {"ulp_test", K3T_MAX_ULP, 2};
    for (int i = 0; i < N; i++) gb[i] = k3t_bf16_bits((float)ref[i]);
    const k3t_view vgb = k3t_view1(gb, K3T_BF16, N);
    v = k3t_compare("ulp", vgb, vref, &ulp);
    CHECK(v.ok && v.metric == 0, "the rounded reference is 0 ulps away: %s", v.msg);
    gb[5] += 2;
    v = k3t_compare("ulp", vgb, vref, &ulp);
    CHECK(v.ok && v.metric == 2, "2 ulps pass: %g", v.metric);
    gb[5] += 1;
    v = k3t_compare("ulp", vgb, vref, &ulp);
    CHECK(!v.ok && v.metric == 3 && v.index == 5, "3 ulps fail: %s", v.msg);
    gb[5] -= 3;
    double tiny[2] = {0.0, 0.0};
    uint16_t across[2] = {0x8001, 0x0002}; /* -1 and +2 steps from zero */
    v = k3t_compare("ulp0", k3t_view1(across, K3T_BF16, 2), k3t_view1(tiny, K3T_F64, 2), &ulp);
    CHECK(v.ok && v.metric == 2, "ulps across zero: %g", v.metric);
    across[0] = 0x8003;
    CHECK(!k3t_compare("ulp0", k3t_view1(across, K3T_BF16, 2), k3t_view1(tiny, K3T_F64, 2), &ulp).ok,
          "3 steps below zero");
    /* f32 ulps */
    float fu[1] = {1.0f}, fr[1] = {1.0f};
    uint32_t bits;
    memcpy(&bits, fu, 4);
    bits += 3;
    memcpy(fu, &bits, 4);
    CHECK(!k3t_compare("ulpf", k3t_view1(fu, K3T_F32, 1), k3t_view1(fr, K3T_F32, 1), &ulp).ok, "3 f32 ulps");

    /* a reference rounded to BF16 first: a BF16 output equal to the rounding has no error at all */
    const k3t_budget tight = {"tight", K3T_REL_L2, 1e-12};
    CHECK(k3t_compare("rounded", vgb, k3t_rounded(vref), &tight).ok, "bf16 vs the rounded reference");
    CHECK(!k3t_compare("unrounded", vgb, vref, &tight).ok, "bf16 vs the unrounded one has the rounding error");

    /* 2-D views with strides and a column offset */
    uint16_t y2[3 * 10];
    double r2[3 * 4];
    for (int i = 0; i < 30; i++) y2[i] = 0xFFFF; /* poison in the unused columns must not be read */
    for (int row = 0; row < 3; row++)
        for (int c = 0; c < 4; c++) {
            r2[row * 4 + c] = row + 0.25 * c;
            y2[row * 10 + 2 + c] = k3t_bf16_bits((float)(row + 0.25 * c));
        }
    v = k3t_compare("2d", k3t_view2(y2 + 2, K3T_BF16, 3, 4, 10), k3t_view2(r2, K3T_F64, 3, 4, 4), &tight);
    CHECK(v.ok, "strided view: %s", v.msg);
    y2[2 * 10 + 2 + 3] = k3t_bf16_bits(9.0f);
    v = k3t_compare("2d", k3t_view2(y2 + 2, K3T_BF16, 3, 4, 10), k3t_view2(r2, K3T_F64, 3, 4, 4), &tight);
    CHECK(!v.ok && has(&v, "row 2 col 3"), "strided view, a wrong element: %s", v.msg);
    CHECK(!k3t_compare("shape", k3t_view2(y2, K3T_BF16, 3, 3, 10), k3t_view2(r2, K3T_F64, 3, 4, 4), &tight).ok,
          "differing shapes");
}

static void test_bitwise(void) {
    k3t_case_enter("bitwise", 5);
    int32_t ids[16], ref[16];
    for (int i = 0; i < 16; i++) ids[i] = ref[i] = (i * 37) % 896;
    const k3t_budget *b = k3t_budget_of(K3T_OP_ROUTER);
    k3t_verdict v = k3t_compare("ids", k3t_view1(ids, K3T_I32, 16), k3t_view1(ref, K3T_I32, 16), b);
    CHECK(v.ok && v.metric == 0, "equal ids: %s", v.msg);
    ids[13] ^= 1 << 9; /* one bit of one id */
    v = k3t_compare("ids", k3t_view1(ids, K3T_I32, 16), k3t_view1(ref, K3T_I32, 16), b);
    CHECK(!v.ok && v.count == 1 && v.index == 13, "one differing bit of an int32 id is caught: %s", v.msg);
    CHECK(has(&v, "ids") && has(&v, "col 13") && has(&v, "seed 0x"), "message: %s", v.msg);
    ids[13] ^= 1 << 9;
    /* bitwise means bits: -0 differs from +0, and a NaN equals the same NaN */
    float a[2] = {-0.0f, NAN}, c[2] = {0.0f, NAN};
    v = k3t_compare("signed zero", k3t_view1(a, K3T_F32, 2), k3t_view1(c, K3T_F32, 2), b);
    CHECK(!v.ok && v.count == 1 && v.index == 0, "-0 vs +0 differ bitwise: %s", v.msg);
    a[0] = 0.0f;
    CHECK(k3t_compare("nan", k3t_view1(a, K3T_F32, 2), k3t_view1(c, K3T_F32, 2), b).ok, "the same NaN bits");
    /* a bitwise comparison across types is refused */
    CHECK(!k3t_compare("types", k3t_view1(a, K3T_F32, 2), k3t_view1(ids, K3T_I32, 2), b).ok, "f32 vs i32");
    CHECK(k3t_check_same("same", ids, ref, K3T_I32, 16), "k3t_check_same passes equal buffers");
}

/* A description too long for the message is cut, never the case and seed. */
static void test_long_message(void) {
    k3t_case_enter("long", 6);
    char longname[1200];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    k3t_verdict v;
    k3t_verdict_init(&v);
    k3t_verdict_fail(&v, "%s", longname);
    CHECK(!v.ok && strstr(v.msg, "case long seed 0x") && strlen(v.msg) < sizeof v.msg, "message: %.80s...",
          v.msg + strlen(v.msg) - (strlen(v.msg) > 80 ? 80 : strlen(v.msg)));
}

/* k3t_expect records a failing verdict as one failure, a passing one as one pass. */
static void test_expect_counts(void) {
    k3t_verdict good, bad;
    k3t_verdict_init(&good);
    k3t_verdict_init(&bad);
    k3t_verdict_fail(&bad, "an expected failure of the harness's own test (not a real one)");
    const int p0 = k3t_passed, f0 = k3t_failed;
    const int rg = k3t_expect(&good), rb = k3t_expect(&bad);
    const int dp = k3t_passed - p0, df = k3t_failed - f0;
    k3t_passed = p0, k3t_failed = f0; /* undo, then record what was seen */
    CHECK(rg == 1 && rb == 0 && dp == 1 && df == 1, "k3t_expect: returns %d %d, counted %d passed %d failed", rg, rb,
          dp, df);
}

int main(void) {
    test_bf16_and_rng();
    test_seeds();
    test_budget_table();
    test_output_checks();
    test_compare();
    test_bitwise();
    test_long_message();
    test_expect_counts();
    return k3t_finish();
}
