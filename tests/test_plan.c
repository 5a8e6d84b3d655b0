/* GEMM plan on the CPU: table selection per simulated capability, plan fallbacks, the forced-kernel override,
 * descriptor validation, and the linear run on the CPU backend against an fp64 loop written here. (The tables
 * themselves: test_table_gemm.c.) */
#include "plan_test_util.h"

/* a table file of this program's own (ctest runs the tests side by side in one folder) */
static const char *TMP_TABLE = "test_plan_tmp_table.txt";


static void test_selection(void) {
    struct {
        int major, minor;
        const char *table;
    } rows[] = {{9, 0, "table embedded sm90"},
                {10, 0, "table embedded sm100"},
                {10, 3, "table embedded sm103"},
                {10, 7, "table embedded sm103"}, /* Rubin uses SM103's table (src/arch) */
                {12, 0, "table none"},
                {8, 0, "table none"}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        k3_ctx *ctx = sim_ctx(rows[i].major, rows[i].minor, NULL);
        if (!ctx) continue;
        char s[256];
        plan_string(ctx, 1536, 7168, 1, s, sizeof s);
        CHECK(strstr(s, rows[i].table) != NULL, "(%d,%d) plan says '%s', want '%s'", rows[i].major, rows[i].minor, s,
              rows[i].table);
        CHECK(strstr(s, "cpu reference") == s, "a CPU context runs the reference: '%s'", s);
        if (!strcmp(rows[i].table, "table none"))
            CHECK(strstr(s, "cublaslt h0 [not in table]") != NULL, "(%d,%d) no table -> fallback: '%s'",
                  rows[i].major, rows[i].minor, s);
        k3_ctx_destroy(ctx);
    }
}

static const char *FILE_TABLE = "arch sm90\n"
                                "1536 7168 1-4 skinny {SK2}\n"
                                "1536 7168 5-8 mma {MM}\n"
                                "1536 7168 9 cublaslt h1\n";

static void check_choice(k3_linear_plan *p, int64_t m, k3_kernel kernel, const char *cfg, k3_choice_source src) {
    k3_choice_source got_src;
    const k3_table_choice *c = k3_linear_plan_choice(p, m, &got_src);
    CHECK(c != NULL, "choice m %lld", (long long)m);
    if (!c) return;
    CHECK(c->kernel == kernel, "m %lld kernel %d want %d", (long long)m, (int)c->kernel, (int)kernel);
    if (cfg && c->cfg) CHECK(!strcmp(c->cfg->name, cfg), "m %lld config %s want %s", (long long)m, c->cfg->name, cfg);
    if (cfg && !c->cfg) CHECK(0, "m %lld has no config, want %s", (long long)m, cfg);
    CHECK(got_src == src, "m %lld source %d want %d", (long long)m, (int)got_src, (int)src);
}

static void test_plan_fallbacks(void) {
    k3_ctx *ctx = sim_ctx(9, 0, NULL);
    if (!ctx) return;
    CHECK(write_text(TMP_TABLE, S(FILE_TABLE)), "write temp table");
    CHECK(k3_ctx_load_table(ctx, TMP_TABLE, 0) == K3_STATUS_SUCCESS, "arch-only table loads on 9.0: %s",
          k3_ctx_last_error(ctx));
    k3_linear_desc d;
    k3_linear_desc_init(&d, 1536, 7168);
    k3_linear_plan *p = NULL;
    CHECK(k3_linear_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "plan: %s", k3_ctx_last_error(ctx));
    if (p) {
        for (int64_t m = 1; m <= 4; m++) check_choice(p, m, K3_KERNEL_SKINNY, S("{SK2}"), K3_CHOICE_TABLE);
        for (int64_t m = 5; m <= 8; m++) check_choice(p, m, K3_KERNEL_MMA, S("{MM}"), K3_CHOICE_TABLE);
        check_choice(p, 9, K3_KERNEL_FALLBACK, NULL, K3_CHOICE_TABLE);
        CHECK(k3_linear_plan_choice(p, 9, NULL)->algo == 1, "h1 kept");
        for (int64_t m = 10; m <= 16; m++) check_choice(p, m, K3_KERNEL_FALLBACK, NULL, K3_CHOICE_UNLISTED);
        CHECK(k3_linear_plan_choice(p, 0, NULL) == NULL && k3_linear_plan_choice(p, 17, NULL) == NULL, "range");
        char s[256];
        CHECK(k3_linear_plan_kernel(p, 2, s, sizeof s) == K3_STATUS_SUCCESS && strstr(s, S("skinny {SK2}")) &&
                  strstr(s, TMP_TABLE),
              "kernel string '%s'", s);
        CHECK(k3_linear_plan_kernel(p, 12, s, sizeof s) == K3_STATUS_SUCCESS && strstr(s, "not in table"),
              "fallback string '%s'", s);
        CHECK(k3_linear_plan_kernel(p, 17, s, sizeof s) == K3_STATUS_INVALID_ARGUMENT, "m beyond max_m");
        CHECK(k3_linear_plan_kernel(p, 1, NULL, 4) == K3_STATUS_INVALID_ARGUMENT, "NULL buf");
        size_t ws = 1;
        CHECK(k3_linear_workspace_size(p, &ws) == K3_STATUS_SUCCESS && ws == 0, "CPU plans need no workspace");
    }
    k3_linear_plan_destroy(p);
    p = NULL;

    /* an unlisted shape: fallback at every M */
    k3_linear_desc_init(&d, 2112, 7168);
    d.max_m = 32;
    CHECK(k3_linear_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "unlisted plan");
    for (int64_t m = 1; p && m <= 32; m++) check_choice(p, m, K3_KERNEL_FALLBACK, NULL, K3_CHOICE_UNLISTED);
    k3_linear_plan_destroy(p);
    p = NULL;

    /* a row stride the table's configurations cannot read (not 16-byte rows): demoted to the fallback */
    k3_linear_desc_init(&d, 1536, 7168);
    d.x_stride = 7172;
    CHECK(k3_linear_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "strided plan");
    if (p) {
        check_choice(p, 1, K3_KERNEL_FALLBACK, NULL, K3_CHOICE_DEMOTED);
        check_choice(p, 6, K3_KERNEL_FALLBACK, NULL, K3_CHOICE_DEMOTED);
        check_choice(p, 9, K3_KERNEL_FALLBACK, NULL, K3_CHOICE_TABLE);
    }
    k3_linear_plan_destroy(p);
    p = NULL;
    /* a 16-byte multiple stride keeps the table's kernels (the KDA f_a slice: stride 144) */
    k3_linear_desc_init(&d, 1536, 7168);
    d.x_stride = 7168 + 64;
    CHECK(k3_linear_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "strided plan 2");
    if (p) check_choice(p, 1, K3_KERNEL_SKINNY, S("{SK2}"), K3_CHOICE_TABLE);
    k3_linear_plan_destroy(p);
    p = NULL;

    /* back to the embedded table */
    CHECK(k3_ctx_load_table(ctx, NULL, 0) == K3_STATUS_SUCCESS, "unload");
    k3_linear_desc_init(&d, 1536, 7168);
    CHECK(k3_linear_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "plan after unload");
    char s[256];
    if (p) CHECK(k3_linear_plan_kernel(p, 1, s, sizeof s) == K3_STATUS_SUCCESS && strstr(s, "embedded sm90"), "%s", s);
    k3_linear_plan_destroy(p);
    k3_ctx_destroy(ctx);
    remove(TMP_TABLE);
}

static k3_status try_plan(k3_ctx *ctx, k3_linear_desc *d) {
    k3_linear_plan *p = (k3_linear_plan *)0x1;
    k3_status st = k3_linear_plan_create(ctx, d, &p);
    if (st != K3_STATUS_SUCCESS) CHECK(p == NULL, "*out is NULL on failure");
    k3_linear_plan_destroy(st == K3_STATUS_SUCCESS ? p : NULL);
    return st;
}

static void expect_plan_error(k3_ctx *ctx, k3_linear_desc *d, const char *what) {
    k3_status st = try_plan(ctx, d);
    CHECK(st == K3_STATUS_INVALID_ARGUMENT, "plan should fail with invalid argument (%s), got %s", what,
          k3_status_string(st));
    CHECK(strstr(k3_ctx_last_error(ctx), what) != NULL, "message '%s' should mention '%s'", k3_ctx_last_error(ctx),
          what);
}

static void test_forced(void) {
    k3_ctx *ctx = sim_ctx(9, 0, NULL);
    if (!ctx) return;
    k3_linear_desc d;
    /* valid forced choices */
    k3_linear_desc_init(&d, 1536, 7168);
    d.force_kernel = K3_KERNEL_MMA;
    d.force_config = S("{MM2}");
    k3_linear_plan *p = NULL;
    CHECK(k3_linear_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "forced mma: %s", k3_ctx_last_error(ctx));
    for (int64_t m = 1; p && m <= 16; m++) check_choice(p, m, K3_KERNEL_MMA, S("{MM2}"), K3_CHOICE_FORCED);
    k3_linear_plan_destroy(p);
    p = NULL;
    d.force_kernel = K3_KERNEL_SKINNY;
    d.force_config = NULL; /* the first skinny configuration that runs the shape */
    d.max_m = 8;
    CHECK(k3_linear_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "forced skinny, no config");
    if (p) CHECK(k3_linear_plan_choice(p, 3, NULL)->kernel == K3_KERNEL_SKINNY, "skinny");
    k3_linear_plan_destroy(p);
    p = NULL;
    d.force_kernel = K3_KERNEL_FALLBACK;
    d.force_config = "h3";
    d.max_m = 16;
    CHECK(k3_linear_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "forced fallback h3");
    if (p) CHECK(k3_linear_plan_choice(p, 16, NULL)->algo == 3, "h3");
    k3_linear_plan_destroy(p);

    /* unknown configuration names */
    k3_linear_desc_init(&d, 1536, 7168);
    d.force_kernel = K3_KERNEL_SKINNY;
    d.force_config = "b4096_o1_u1";
    d.max_m = 8;
    expect_plan_error(ctx, &d, "b4096_o1_u1");
    d.force_kernel = K3_KERNEL_MMA;
    d.force_config = S("{SK}"); /* a skinny name is not an mma configuration */
    expect_plan_error(ctx, &d, "not a mma configuration");
    /* configurations that cannot run K */
    k3_linear_desc_init(&d, 1536, 100);
    d.force_kernel = K3_KERNEL_SKINNY;
    d.force_config = S("{SK}");
    d.max_m = 8;
    expect_plan_error(ctx, &d, "cannot run n=1536 k=100");
    if (have_skk) {
        k3_linear_desc_init(&d, 1536, 1536);
        d.force_kernel = K3_KERNEL_SKINNY;
        d.force_config = S("{SKK}");
        d.max_m = 8;
        expect_plan_error(ctx, &d, "static");
    }
    k3_linear_desc_init(&d, 1536, 7170);
    d.force_kernel = K3_KERNEL_MMA;
    d.force_config = NULL;
    expect_plan_error(ctx, &d, "no mma configuration can run");
    /* a whole-K warp tile runs K up to its max_k (k_unroll x 32) and refuses more, naming max_k */
    k3_linear_desc_init(&d, 1536, 128);
    d.force_kernel = K3_KERNEL_MMA;
    d.force_config = S("{MW}");
    p = NULL;
    CHECK(k3_linear_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "forced whole-K: %s", k3_ctx_last_error(ctx));
    for (int64_t m = 1; p && m <= 16; m++) check_choice(p, m, K3_KERNEL_MMA, S("{MW}"), K3_CHOICE_FORCED);
    k3_linear_plan_destroy(p);
    p = NULL;
    k3_linear_desc_init(&d, 1536, 7168);
    d.force_kernel = K3_KERNEL_MMA;
    d.force_config = S("{MW}");
    expect_plan_error(ctx, &d, "max_k");
    /* max_m beyond the configuration's */
    k3_linear_desc_init(&d, 1536, 7168);
    d.force_kernel = K3_KERNEL_SKINNY;
    d.force_config = S("{SK}");
    d.max_m = 32; /* beyond every configuration's max_m */
    expect_plan_error(ctx, &d, "max_m");
    /* FP64 is the CPU reference's; a forced GPU kernel accumulates in fp32 */
    k3_linear_desc_init(&d, 1536, 7168);
    d.force_kernel = K3_KERNEL_MMA;
    d.accum = K3_ACCUM_FP64;
    expect_plan_error(ctx, &d, "FP64");
    /* malformed fallback configurations, a config without a forced kernel, bad enums */
    k3_linear_desc_init(&d, 1536, 7168);
    d.force_kernel = K3_KERNEL_FALLBACK;
    d.force_config = "h9";
    expect_plan_error(ctx, &d, "hI");
    d.force_config = "algo1";
    expect_plan_error(ctx, &d, "hI");
    d.force_kernel = K3_KERNEL_AUTO;
    d.force_config = S("{SK}");
    expect_plan_error(ctx, &d, "needs force_kernel");
    k3_linear_desc_init(&d, 1536, 7168);
    d.force_kernel = (k3_kernel)7;
    expect_plan_error(ctx, &d, "force_kernel");
    k3_ctx_destroy(ctx);
}

static void test_desc_validation(void) {
    k3_ctx *ctx = sim_ctx(9, 0, NULL);
    if (!ctx) return;
    k3_linear_desc d;
    k3_linear_desc_init(&d, 0, 7168);
    expect_plan_error(ctx, &d, "n = 0");
    k3_linear_desc_init(&d, 1536, 0);
    expect_plan_error(ctx, &d, "k = 0");
    k3_linear_desc_init(&d, 1536, -4);
    expect_plan_error(ctx, &d, "k = -4");
    k3_linear_desc_init(&d, 1536, 7168);
    d.max_m = 0;
    expect_plan_error(ctx, &d, "max_m = 0");
    d.max_m = 33;
    expect_plan_error(ctx, &d, "max_m = 33");
    k3_linear_desc_init(&d, 1536, 7168);
    d.x_stride = 7000;
    expect_plan_error(ctx, &d, "x_stride = 7000");
    k3_linear_desc_init(&d, 1536, 7168);
    d.y_stride = 1535;
    expect_plan_error(ctx, &d, "y_stride = 1535");
    k3_linear_desc_init(&d, 1536, 7168);
    d.accum = (k3_accum)3;
    expect_plan_error(ctx, &d, "accum = 3");
    k3_linear_desc_init(&d, 1536, 7168);
    k3_linear_plan *p = NULL;
    CHECK(k3_linear_plan_create(ctx, NULL, &p) == K3_STATUS_INVALID_ARGUMENT && p == NULL, "NULL desc");
    CHECK(k3_linear_plan_create(ctx, &d, NULL) == K3_STATUS_INVALID_ARGUMENT, "NULL out");
    CHECK(k3_linear_plan_create(NULL, &d, &p) == K3_STATUS_INVALID_ARGUMENT, "NULL ctx");
    size_t ws;
    CHECK(k3_linear_workspace_size(NULL, &ws) == K3_STATUS_INVALID_ARGUMENT, "NULL plan ws");
    k3_linear_plan_destroy(NULL);
    k3_linear_desc_init(NULL, 1, 1); /* tolerated */
    k3_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- keys ------------------------- */

static uint16_t ref_bf16(double v) {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) return (uint16_t)(u >> 16);
    uint32_t lsb = (u >> 16) & 1u;
    return (uint16_t)((u + 0x7fffu + lsb) >> 16);
}

static double bf16_val(uint16_t b) { return k3t_bf16_to_f32(b); }

/* One CPU-backend run against the fp64 loop below; strided x and y, optional residual (possibly aliasing y). */
static void check_cpu_run(k3_ctx *ctx, int64_t n, int64_t k, int64_t m, int64_t xs, int64_t ys, int residual_mode,
                          k3_accum accum, uint64_t seed) {
    k3t_rng rng = {seed};
    const int64_t max_m = m + 2;
    uint16_t *x = (uint16_t *)aligned_alloc(16, (size_t)((max_m * xs * 2 + 15) / 16 * 16));
    uint16_t *w = (uint16_t *)aligned_alloc(16, (size_t)((n * k * 2 + 15) / 16 * 16));
    uint16_t *y = (uint16_t *)aligned_alloc(16, (size_t)((max_m * ys * 2 + 15) / 16 * 16));
    uint16_t *r = (uint16_t *)aligned_alloc(16, (size_t)((max_m * ys * 2 + 15) / 16 * 16));
    double *want = (double *)malloc((size_t)(m * n) * sizeof(double));
    if (!x || !w || !y || !r || !want) {
        CHECK(0, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < max_m * xs; i++) x[i] = k3_bf16_from_f32(k3t_uniform(&rng));
    for (int64_t i = 0; i < n * k; i++) w[i] = k3_bf16_from_f32(k3t_uniform(&rng));
    for (int64_t i = 0; i < max_m * ys; i++) r[i] = k3_bf16_from_f32(4.0f * k3t_uniform(&rng));
    for (int64_t i = 0; i < max_m * ys; i++) y[i] = 0x7fc1; /* poison: a NaN every element must overwrite */
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t kk = 0; kk < k; kk++) s += bf16_val(x[i * xs + kk]) * bf16_val(w[j * k + kk]);
            if (residual_mode) s += bf16_val(r[i * ys + j]);
            want[i * n + j] = bf16_val(ref_bf16(s));
        }
    const uint16_t *res = NULL;
    if (residual_mode == 1) res = r;
    if (residual_mode == 2) { /* residual aliases y */
        memcpy(y, r, (size_t)(max_m * ys * 2));
        res = y;
    }
    k3_linear_desc d;
    k3_linear_desc_init(&d, n, k);
    d.max_m = max_m;
    d.x_stride = xs;
    d.y_stride = ys;
    d.accum = accum;
    k3_linear_plan *p = NULL;
    CHECK(k3_linear_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "plan %lldx%lld: %s", (long long)n, (long long)k,
          k3_ctx_last_error(ctx));
    if (!p) goto done;
    k3_status st = k3_linear_run(p, m, x, w, res, y, NULL, 0, NULL);
    CHECK(st == K3_STATUS_SUCCESS, "run: %s", k3_ctx_last_error(ctx));
    double num = 0, den = 0;
    int bad = 0, guard_bad = 0;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double g = bf16_val(y[i * ys + j]), e = want[i * n + j];
            if (g != g) bad++;
            else num += (g - e) * (g - e);
            den += e * e;
        }
        for (int64_t j = n; j < ys; j++) /* the stride gap is never written */
            guard_bad += y[i * ys + j] != (residual_mode == 2 ? r[i * ys + j] : 0x7fc1);
    }
    for (int64_t i = m * ys; i < max_m * ys; i++) guard_bad += y[i] != (residual_mode == 2 ? r[i] : 0x7fc1);
    const double rel = sqrt(num / (den > 0 ? den : 1));
    CHECK(bad == 0 && rel <= 2e-3,
          "cpu linear n %lld k %lld m %lld xs %lld ys %lld residual %d accum %d: rel-L2 %.3e, %d NaN (seed %llx)",
          (long long)n, (long long)k, (long long)m, (long long)xs, (long long)ys, residual_mode, (int)accum, rel, bad,
          (unsigned long long)seed);
    CHECK(guard_bad == 0, "%d elements outside y[m, n] were written", guard_bad);
    k3_linear_plan_destroy(p);
done:
    free(x);
    free(w);
    free(y);
    free(r);
    free(want);
}

static void test_cpu_run(void) {
    printf("seed 0x%x\n", (unsigned)SEED);
    k3_ctx *ctx = sim_ctx(9, 0, NULL); /* resolves the sm90 table, runs the CPU reference */
    if (!ctx) return;
    uint64_t s = SEED;
    check_cpu_run(ctx, 37, 70, 3, 70, 37, 0, K3_ACCUM_FP32, s++);
    check_cpu_run(ctx, 37, 70, 3, 72, 40, 1, K3_ACCUM_FP32, s++);
    check_cpu_run(ctx, 64, 128, 5, 144, 64, 2, K3_ACCUM_FP32, s++); /* f_a-style stride, residual aliases y */
    check_cpu_run(ctx, 144, 1024, 16, 1024, 144, 0, K3_ACCUM_FP64, s++);
    check_cpu_run(ctx, 19, 333, 1, 341, 23, 1, K3_ACCUM_FP64, s++);
    check_cpu_run(ctx, 96, 512, 32 - 2, 512, 96, 2, K3_ACCUM_FP32, s++);
    k3_ctx_destroy(ctx);
}

static void test_run_validation(void) {
    k3_ctx *ctx = sim_ctx(9, 0, NULL);
    if (!ctx) return;
    const int64_t n = 16, k = 32;
    _Alignas(16) uint16_t x[4 * 32 + 16], w[16 * 32 + 16], y[4 * 16 + 16], r[4 * 16 + 16];
    memset(x, 0, sizeof x);
    memset(w, 0, sizeof w);
    memset(r, 0, sizeof r);
    k3_linear_desc d;
    k3_linear_desc_init(&d, n, k);
    d.max_m = 4;
    k3_linear_plan *p = NULL;
    CHECK(k3_linear_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "plan");
    if (!p) {
        k3_ctx_destroy(ctx);
        return;
    }
    CHECK(k3_linear_run(p, 4, x, w, r, y, NULL, 0, NULL) == K3_STATUS_SUCCESS, "valid run");
    struct {
        int64_t m;
        const void *x, *w, *r;
        void *y;
        const char *what;
    } bad[] = {
        {0, x, w, NULL, y, "m = 0"},
        {-1, x, w, NULL, y, "m = -1"},
        {5, x, w, NULL, y, "m = 5"},
        {1, NULL, w, NULL, y, "x NULL"},
        {1, x, NULL, NULL, y, "w NULL"},
        {1, x, w, NULL, NULL, "y NULL"},
        {1, x + 1, w, NULL, y, "misaligned: x"},
        {1, x, w + 4, NULL, y, "misaligned: w"},
        {1, x, w, NULL, y + 3, "misaligned: y"},
        {1, x, w, r + 1, y, "misaligned: residual"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        k3_status st = k3_linear_run(p, bad[i].m, bad[i].x, bad[i].w, bad[i].r, bad[i].y, NULL, 0, NULL);
        CHECK(st == K3_STATUS_INVALID_ARGUMENT, "%s: got %s", bad[i].what, k3_status_string(st));
        CHECK(strstr(k3_ctx_last_error(ctx), bad[i].what) != NULL, "message '%s' should mention '%s'",
              k3_ctx_last_error(ctx), bad[i].what);
    }
    CHECK(k3_linear_run(NULL, 1, x, w, NULL, y, NULL, 0, NULL) == K3_STATUS_INVALID_ARGUMENT, "NULL plan");
    CHECK(k3_linear_run(p, 2, x, w, NULL, y, NULL, 0, NULL) == K3_STATUS_SUCCESS &&
              !strcmp(k3_ctx_last_error(ctx), ""),
          "a good call clears the last error");
    k3_linear_plan_destroy(p);
    k3_ctx_destroy(ctx);
}

int main(void) {
    pick_configs();
    test_selection();
    test_plan_fallbacks();
    test_forced();
    test_desc_validation();
    test_cpu_run();
    test_run_validation();
    return k3t_finish();
}
