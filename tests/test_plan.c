/* GEMM plan on the CPU: table parsing (good tables, every malformed kind with its line number), the writer
 * round trip, the embedded tables, table selection per simulated capability, plan fallbacks, the forced-kernel
 * override, table keys, and the linear run on the CPU backend against an fp64 loop written here. */
#include <stdint.h>
#include <string.h>

#include "k3.h"
#include "plan/linear_plan.h"
#include "test_util.h"

#define SEED 0x5EED0004u

/* ---------------------------------------------------------------- helpers ---------------------- */

/* Configuration names come from the registry (it changes as kernels are tuned): {SK}, {SK2} = the first two
 * skinny configurations for any K, {SKK} = a static-K skinny one (else {SK}), {MM}, {MM2} = the first and last
 * mma configurations for any K, {MW} = the first whole-K warp tile (max_k > 0). S() substitutes them into a text
 * (a ring of buffers, valid for a while). */
static char SK[40], SK2[40], SKK[40], MM[40], MM2[40], MW[40];
static int have_skk;

static void pick_configs(void) {
    int32_t count = 0;
    const k3_gemm_config *all = k3_gemm_configs(&count);
    for (int32_t i = 0; i < count; i++) {
        const k3_gemm_config *c = &all[i];
        if (c->kernel == K3_KERNEL_SKINNY && c->static_k == 0) {
            if (!SK[0]) snprintf(SK, sizeof SK, "%s", c->name);
            else if (!SK2[0]) snprintf(SK2, sizeof SK2, "%s", c->name);
        }
        if (c->kernel == K3_KERNEL_SKINNY && c->static_k == 7168 && !have_skk) {
            snprintf(SKK, sizeof SKK, "%s", c->name);
            have_skk = 1;
        }
        if (c->kernel == K3_KERNEL_MMA && c->max_k == 0) {
            if (!MM[0]) snprintf(MM, sizeof MM, "%s", c->name);
            snprintf(MM2, sizeof MM2, "%s", c->name);
        }
        if (c->kernel == K3_KERNEL_MMA && c->max_k > 0 && !MW[0]) snprintf(MW, sizeof MW, "%s", c->name);
    }
    if (!SK2[0]) snprintf(SK2, sizeof SK2, "%s", SK);
    if (!have_skk) snprintf(SKK, sizeof SKK, "%s", SK);
    CHECK(SK[0] && MM[0] && MW[0], "the registry has skinny, mma and whole-K mma configurations");
    printf("configurations used: SK %s, SK2 %s, SKK %s%s, MM %s, MM2 %s, MW %s\n", SK, SK2, SKK,
           have_skk ? "" : " (no static-K config)", MM, MM2, MW);
}

static const char *S(const char *tmpl) {
    static char ring[16][2048];
    static int next;
    char *out = ring[next];
    next = (next + 1) % 16;
    size_t o = 0;
    for (const char *p = tmpl; *p && o < sizeof ring[0] - 1;) {
        const char *name = NULL;
        size_t skip = 0;
        if (!strncmp(p, "{SK}", 4)) name = SK, skip = 4;
        else if (!strncmp(p, "{SK2}", 5)) name = SK2, skip = 5;
        else if (!strncmp(p, "{SKK}", 5)) name = SKK, skip = 5;
        else if (!strncmp(p, "{MM}", 4)) name = MM, skip = 4;
        else if (!strncmp(p, "{MM2}", 5)) name = MM2, skip = 5;
        else if (!strncmp(p, "{MW}", 4)) name = MW, skip = 4;
        if (name) {
            for (const char *q = name; *q && o < sizeof ring[0] - 1; q++) out[o++] = *q;
            p += skip;
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    return out;
}

typedef struct log_count {
    int warn, error;
    char last[512];
} log_count;

static void count_log(void *user, k3_log_level level, const char *msg) {
    log_count *c = (log_count *)user;
    if (level == K3_LOG_WARN) c->warn++;
    if (level == K3_LOG_ERROR) c->error++;
    snprintf(c->last, sizeof c->last, "%s", msg);
}

static k3_ctx *sim_ctx(int major, int minor, log_count *logs) {
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CPU;
    opt.sim_major = major;
    opt.sim_minor = minor;
    if (logs) {
        opt.log_fn = count_log;
        opt.log_user = logs;
        opt.log_level = K3_LOG_WARN;
    }
    k3_ctx *ctx = NULL;
    k3_status st = k3_ctx_create(&opt, &ctx);
    CHECK(st == K3_STATUS_SUCCESS && ctx, "simulated %d.%d context: %s", major, minor, k3_status_string(st));
    return ctx;
}

static const char *TMP_TABLE = "test_plan_tmp_table.txt";

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fputs(text, f);
    return fclose(f) == 0;
}

/* Parses text expecting failure at `line` with `what` in the message. */
static void expect_bad(const char *text, int line, const char *what) {
    char err[512], want[32];
    k3_table *t = (k3_table *)0x1;
    k3_status st = k3_table_parse(text, "t.txt", &t, err, sizeof err);
    snprintf(want, sizeof want, "t.txt:%d: ", line);
    CHECK(st == K3_STATUS_FORMAT_ERROR, "malformed table accepted (want '%s'): %s", what, text);
    CHECK(t == NULL, "no table on failure");
    CHECK(strstr(err, want) == err, "message '%s' should start with '%s'", err, want);
    CHECK(strstr(err, what) != NULL, "message '%s' should mention '%s'", err, what);
}

/* ---------------------------------------------------------------- parsing ---------------------- */

static const char *GOOD =
    "# a test table\n"
    "format 1\n"
    "arch sm90\n"
    "gpu NVIDIA H200   # trailing comment\n"
    "sm_count 132\n"
    "capability 9.0\n"
    "driver 13000\n"
    "runtime 13000\n"
    "library 0.1.0\n"
    "date 2026-11-29\n"
    "note hand written for the test\n"
    "\n"
    "1536 7168 1-6 skinny {SK2}\n"
    "1536\t7168  7-16 mma {MM2}\n"
    "144 7168 1-8 skinny {SK}\n"
    "144 7168 9 cublaslt h2\n"
    "144 7168 10-16 cublaslt\n"
    "7168 7168 3 skinny {SKK}\n";

static void test_parse_good(void) {
    char err[512];
    k3_table *t = NULL;
    k3_status st = k3_table_parse(S(GOOD), "good.txt", &t, err, sizeof err);
    CHECK(st == K3_STATUS_SUCCESS && t, "good table parses: %s", err);
    if (!t) return;
    CHECK(!strcmp(t->key.arch, "sm90") && !strcmp(t->key.gpu, "NVIDIA H200") && t->key.sm_count == 132 &&
              t->key.cc_major == 9 && t->key.cc_minor == 0 && t->key.driver == 13000 && t->key.runtime == 13000 &&
              !strcmp(t->key.library, "0.1.0") && !strcmp(t->key.date, "2026-11-29") &&
              !strcmp(t->key.note, "hand written for the test"),
          "key fields (gpu '%s', note '%s')", t->key.gpu, t->key.note);
    CHECK(t->n_rows == 3, "3 shapes, got %d", (int)t->n_rows);
    const k3_table_row *r = k3_table_find(t, 1536, 7168);
    CHECK(r != NULL, "1536x7168 present");
    if (r) {
        for (int m = 1; m <= 6; m++)
            CHECK(r->m[m].kernel == K3_KERNEL_SKINNY && !strcmp(r->m[m].cfg->name, S("{SK2}")), "m %d skinny", m);
        for (int m = 7; m <= 16; m++)
            CHECK(r->m[m].kernel == K3_KERNEL_MMA && !strcmp(r->m[m].cfg->name, S("{MM2}")), "m %d mma", m);
        CHECK(r->m[17].kernel == K3_KERNEL_AUTO, "m 17 unlisted");
        CHECK(r->line[1] == 13 && r->line[7] == 14, "line numbers kept (%d, %d)", (int)r->line[1], (int)r->line[7]);
    }
    r = k3_table_find(t, 144, 7168);
    CHECK(r && r->m[9].kernel == K3_KERNEL_FALLBACK && r->m[9].algo == 2, "cublaslt h2");
    CHECK(r && r->m[12].kernel == K3_KERNEL_FALLBACK && r->m[12].algo == 0, "cublaslt default h0");
    CHECK(k3_table_find(t, 7168, 1536) == NULL, "unlisted shape");
    k3_table_destroy(t);

    /* minimal: only arch, no rows; CRLF line ends */
    st = k3_table_parse("arch sm103\r\n# nothing tuned\r\n", "min.txt", &t, err, sizeof err);
    CHECK(st == K3_STATUS_SUCCESS && t && t->n_rows == 0 && !strcmp(t->key.arch, "sm103"), "minimal table: %s", err);
    k3_table_destroy(t);
}

static void test_parse_bad(void) {
    /* unknown kernel */
    expect_bad("arch sm90\n1536 7168 1-4 cutlass b1\n", 2, "unknown kernel 'cutlass'");
    /* unknown configuration names, per the registry */
    expect_bad("arch sm90\n\n1536 7168 1-4 skinny b999_o9_u9\n", 3, "unknown skinny configuration 'b999_o9_u9'");
    expect_bad(S("arch sm90\n1536 7168 1-4 mma {SK}\n"), 2, "unknown mma configuration");
    expect_bad("arch sm90\n1536 7168 1-4 skinny\n", 2, "needs a configuration name");
    /* configurations that cannot run (N, K) or the range's M */
    expect_bad(S("arch sm90\n1536 100 1-4 skinny {SK}\n"), 2, "cannot run N=1536 K=100");
    if (have_skk) expect_bad(S("arch sm90\n1536 1536 1 skinny {SKK}\n"), 2, "static");
    expect_bad(S("arch sm90\n1536 7168 1-32 skinny {SK}\n"), 2, "max_m");
    expect_bad(S("arch sm90\n1536 7176 1-16 mma {MM}\n"), 2, "cannot run N=1536 K=7176");
    expect_bad(S("arch sm90\n1536 7168 1-16 mma {MW}\n"), 2, "cannot run N=1536 K=7168");
    /* M out of range */
    expect_bad("arch sm90\n1536 7168 0-4 cublaslt\n", 2, "out of range");
    expect_bad("arch sm90\n1536 7168 1-33 cublaslt\n", 2, "out of range");
    expect_bad("arch sm90\n1536 7168 6-3 cublaslt\n", 2, "out of range");
    expect_bad("arch sm90\n1536 7168 1-x cublaslt\n", 2, "M range");
    /* overlapping ranges (the earlier line is named) */
    expect_bad("arch sm90\n1536 7168 1-6 cublaslt\n1536 7168 6-8 cublaslt h1\n", 3, "already set on line 2");
    expect_bad("arch sm90\n144 7168 4 cublaslt\n1536 7168 4 cublaslt\n144 7168 2-5 cublaslt\n", 4, "overlapping");
    /* duplicate keys */
    expect_bad("arch sm90\ngpu A\ngpu B\n", 3, "duplicate header field 'gpu'");
    expect_bad("arch sm90\narch sm90\n", 2, "duplicate header field 'arch'");
    /* bad numbers */
    expect_bad("arch sm90\n15x6 7168 1 cublaslt\n", 2, "N '15x6'");
    expect_bad("arch sm90\n1536 -7168 1 cublaslt\n", 2, "K '-7168'");
    expect_bad("arch sm90\n-1536 7168 1 cublaslt\n", 2, "N '-1536'");
    expect_bad("arch sm90\n0 7168 1 cublaslt\n", 2, "N '0'");
    expect_bad("arch sm90\n99999999999999 7168 1 cublaslt\n", 2, "N '99999999999999'");
    expect_bad("arch sm90\n1536 7168 1 cublaslt h9\n", 2, "hI");
    expect_bad("arch sm90\n1536 7168 1 cublaslt 3\n", 2, "hI");
    expect_bad("arch sm90\nsm_count many\n", 2, "sm_count 'many'");
    expect_bad("arch sm90\ncapability 9\n", 2, "capability '9'");
    expect_bad("arch sm90\ndriver 12.8\n", 2, "driver '12.8'");
    /* field counts, header placement, header values */
    expect_bad("arch sm90\n1536 7168 1\n", 2, "found 3 field(s)");
    expect_bad(S("arch sm90\n1536 7168 1 skinny {SK} extra\n"), 2, "at most 5 fields");
    expect_bad("arch sm90\n1536 7168 1 cublaslt\ngpu late\n", 3, "after the first row");
    expect_bad("arch sm90\nvendor acme\n", 2, "unknown header field 'vendor'");
    expect_bad("arch sm95\n", 1, "arch 'sm95'");
    expect_bad("format 2\narch sm90\n", 1, "format '2'");
    expect_bad("arch\n", 1, "has no value");
    expect_bad("# no arch\n1536 7168 1 cublaslt\n", 0, "no 'arch' field");
    {
        char longline[1200];
        memset(longline, 'a', sizeof longline);
        memcpy(longline, "arch sm90\nnote ", 15);
        longline[sizeof longline - 1] = '\0';
        expect_bad(longline, 2, "longer than");
    }
    /* NULL arguments never crash */
    char err[64];
    k3_table *t = NULL;
    CHECK(k3_table_parse(NULL, "n", &t, err, sizeof err) == K3_STATUS_FORMAT_ERROR && t == NULL, "NULL text");
    CHECK(k3_table_parse("arch sm90\n", "n", NULL, err, sizeof err) == K3_STATUS_INVALID_ARGUMENT, "NULL out");
    CHECK(k3_table_parse("arch sm90\n", NULL, &t, NULL, 0) == K3_STATUS_SUCCESS, "NULL err buffer is fine");
    k3_table_destroy(t);
}

static int tables_equal(const k3_table *a, const k3_table *b) {
    if (memcmp(&a->key, &b->key, sizeof a->key) != 0 || a->n_rows != b->n_rows) return 0;
    for (int32_t i = 0; i < a->n_rows; i++) {
        const k3_table_row *rb = k3_table_find(b, a->rows[i].n, a->rows[i].k);
        if (!rb) return 0;
        for (int m = 1; m <= K3_TABLE_MAX_M; m++) {
            const k3_table_choice x = a->rows[i].m[m], y = rb->m[m];
            if (x.kernel != y.kernel || x.cfg != y.cfg || x.algo != y.algo) return 0;
        }
    }
    return 1;
}

static void test_round_trip(void) {
    /* a table built in code (as the tuner does), written, parsed back */
    k3_table *t = k3_table_create();
    CHECK(t != NULL, "create");
    if (!t) return;
    snprintf(t->key.arch, sizeof t->key.arch, "sm100");
    snprintf(t->key.gpu, sizeof t->key.gpu, "NVIDIA B200");
    t->key.sm_count = 148;
    t->key.cc_major = 10;
    t->key.driver = 13000;
    snprintf(t->key.note, sizeof t->key.note, "round trip");
    const k3_gemm_config *sk = k3_gemm_config_find(K3_KERNEL_SKINNY, S("{SK}"));
    const k3_gemm_config *mm = k3_gemm_config_find(K3_KERNEL_MMA, S("{MM}"));
    CHECK(sk && mm, "registry has the test configurations");
    if (!sk || !mm) {
        k3_table_destroy(t);
        return;
    }
    k3t_rng rng = {SEED};
    for (int64_t m = 1; m <= 16; m++) {
        k3_table_choice c;
        uint64_t r = k3t_next(&rng) % 3;
        if (m <= 8 && r == 0) c = (k3_table_choice){K3_KERNEL_SKINNY, sk, 0};
        else if (r == 1) c = (k3_table_choice){K3_KERNEL_MMA, mm, 0};
        else c = (k3_table_choice){K3_KERNEL_FALLBACK, NULL, (int32_t)(k3t_next(&rng) % 4)};
        CHECK(k3_table_set(t, 2112, 7168, m, c) == K3_STATUS_SUCCESS, "set m %d", (int)m);
    }
    CHECK(k3_table_set(t, 20480, 7168, 1, (k3_table_choice){K3_KERNEL_MMA, mm, 0}) == K3_STATUS_SUCCESS, "set");
    CHECK(k3_table_set(t, 144, 7168, 32, (k3_table_choice){K3_KERNEL_FALLBACK, NULL, 3}) == K3_STATUS_SUCCESS, "set");
    CHECK(k3_table_set(t, 144, 7168, 33, (k3_table_choice){K3_KERNEL_FALLBACK, NULL, 0}) == K3_STATUS_INVALID_ARGUMENT,
          "m 33 refused");
    CHECK(k3_table_set(t, 144, 7168, 1, (k3_table_choice){K3_KERNEL_SKINNY, mm, 0}) == K3_STATUS_INVALID_ARGUMENT,
          "a config of another kernel refused");
    CHECK(k3_table_set(t, 144, 7168, 1, (k3_table_choice){K3_KERNEL_FALLBACK, NULL, 8}) == K3_STATUS_INVALID_ARGUMENT,
          "h8 refused");
    char *text = k3_table_format(t);
    CHECK(text != NULL, "format");
    char err[512];
    k3_table *back = NULL;
    k3_status st = text ? k3_table_parse(text, "written", &back, err, sizeof err) : K3_STATUS_INTERNAL_ERROR;
    CHECK(st == K3_STATUS_SUCCESS && back, "written table parses: %s\n%s", err, text ? text : "");
    if (back) {
        CHECK(tables_equal(t, back), "round trip preserves every choice and the key\n%s", text);
        char *text2 = k3_table_format(back);
        CHECK(text2 && !strcmp(text, text2), "writing twice gives the same text");
        free(text2);
    }
    /* rows are sorted by N then K in the text */
    if (text) {
        const char *a = strstr(text, "\n144 7168"), *b = strstr(text, "\n2112 7168"), *c = strstr(text, "\n20480 7168");
        CHECK(a && b && c && a < b && b < c, "rows sorted");
    }
    free(text);
    k3_table_destroy(back);
    k3_table_destroy(t);

    /* the hand-written table survives a round trip too */
    k3_table *g = NULL;
    CHECK(k3_table_parse(S(GOOD), "good", &g, err, sizeof err) == K3_STATUS_SUCCESS, "good: %s", err);
    if (g) {
        char *gt = k3_table_format(g);
        k3_table *g2 = NULL;
        CHECK(gt && k3_table_parse(gt, "good2", &g2, err, sizeof err) == K3_STATUS_SUCCESS && tables_equal(g, g2),
              "good table round trip: %s", err);
        free(gt);
        k3_table_destroy(g2);
        k3_table_destroy(g);
    }
}

static void test_embedded(void) {
    const k3_table_id ids[] = {K3_TABLE_SM90, K3_TABLE_SM100, K3_TABLE_SM103};
    for (int i = 0; i < 3; i++) {
        const char *text = k3_table_embedded_text(ids[i]);
        CHECK(text != NULL, "embedded %s exists", k3_table_name(ids[i]));
        if (!text) continue;
        char err[512];
        k3_table *t = NULL;
        CHECK(k3_table_parse(text, k3_table_name(ids[i]), &t, err, sizeof err) == K3_STATUS_SUCCESS,
              "embedded %s parses: %s", k3_table_name(ids[i]), err);
        CHECK(t && !strcmp(t->key.arch, k3_table_name(ids[i])), "embedded %s says arch %s", k3_table_name(ids[i]),
              t ? t->key.arch : "?");
        k3_table_destroy(t);
    }
    CHECK(k3_table_embedded_text(K3_TABLE_NONE) == NULL, "no table for NONE");
}

/* ---------------------------------------------------------------- selection / plans ----------- */

static void plan_string(k3_ctx *ctx, int64_t n, int64_t k, int64_t m, char *buf, size_t size) {
    k3_linear_desc d;
    k3_linear_desc_init(&d, n, k);
    k3_linear_plan *p = NULL;
    buf[0] = '\0';
    k3_status st = k3_linear_plan_create(ctx, &d, &p);
    CHECK(st == K3_STATUS_SUCCESS, "plan %lldx%lld: %s", (long long)n, (long long)k, k3_ctx_last_error(ctx));
    if (p) CHECK(k3_linear_plan_kernel(p, m, buf, size) == K3_STATUS_SUCCESS, "plan_kernel");
    k3_linear_plan_destroy(p);
}

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

static void test_keys(void) {
    log_count logs;
    memset(&logs, 0, sizeof logs);
    k3_ctx *ctx = sim_ctx(9, 0, &logs);
    if (!ctx) return;
    /* a device-keyed table (as `k3 tune` writes) does not match a simulated device */
    CHECK(write_text(TMP_TABLE, S("arch sm90\ngpu NVIDIA H200\nsm_count 132\ncapability 9.0\ndriver 13000\n"
                                  "1536 7168 1 skinny {SK}\n")),
          "write");
    k3_status st = k3_ctx_load_table(ctx, TMP_TABLE, 0);
    CHECK(st == K3_STATUS_KEY_MISMATCH, "device key mismatch refused: %s", k3_status_string(st));
    const char *e = k3_ctx_last_error(ctx);
    CHECK(strstr(e, "gpu: table 'NVIDIA H200'") && strstr(e, "sm_count: table 132") && !strstr(e, "capability"),
          "message names the differing fields: %s", e);
    /* plans still use the embedded table after a refused load */
    char s[256];
    plan_string(ctx, 1536, 7168, 1, s, sizeof s);
    CHECK(strstr(s, "embedded sm90") != NULL, "refused load leaves the embedded table: %s", s);
    int warn0 = logs.warn;
    st = k3_ctx_load_table(ctx, TMP_TABLE, 1);
    CHECK(st == K3_STATUS_SUCCESS, "forced load: %s", k3_ctx_last_error(ctx));
    CHECK(logs.warn > warn0 && strstr(logs.last, "forced"), "forced load warns: %s", logs.last);
    plan_string(ctx, 1536, 7168, 1, s, sizeof s);
    CHECK(strstr(s, S("skinny {SK}")) && strstr(s, TMP_TABLE), "forced table used: %s", s);

    /* an architecture-only table of another architecture */
    k3_ctx *ctx10 = sim_ctx(10, 0, NULL);
    CHECK(write_text(TMP_TABLE, "arch sm90\n"), "write");
    st = k3_ctx_load_table(ctx10, TMP_TABLE, 0);
    CHECK(st == K3_STATUS_KEY_MISMATCH && strstr(k3_ctx_last_error(ctx10), "arch: table sm90, context sm100"),
          "arch mismatch: %s", k3_ctx_last_error(ctx10));
    /* a capability mismatch on a matching architecture (table says 9.0, SM107 shares sm103's slot) */
    k3_ctx *ctx107 = sim_ctx(10, 7, NULL);
    CHECK(write_text(TMP_TABLE, "arch sm103\ncapability 10.3\n"), "write");
    st = k3_ctx_load_table(ctx107, TMP_TABLE, 0);
    CHECK(st == K3_STATUS_KEY_MISMATCH && strstr(k3_ctx_last_error(ctx107), "capability: table 10.3, device 10.7"),
          "capability mismatch: %s", k3_ctx_last_error(ctx107));
    CHECK(k3_ctx_load_table(ctx107, TMP_TABLE, 1) == K3_STATUS_SUCCESS, "forced");

    /* malformed and missing files */
    CHECK(write_text(TMP_TABLE, "arch sm90\n\n1536 7168 1-4 skinny nope\n"), "write");
    st = k3_ctx_load_table(ctx, TMP_TABLE, 1);
    CHECK(st == K3_STATUS_FORMAT_ERROR && strstr(k3_ctx_last_error(ctx), ":3: unknown skinny configuration 'nope'"),
          "malformed file: %s", k3_ctx_last_error(ctx));
    st = k3_ctx_load_table(ctx, "no/such/table.txt", 0);
    CHECK(st == K3_STATUS_IO_ERROR && strstr(k3_ctx_last_error(ctx), "no/such/table.txt"), "missing file: %s",
          k3_ctx_last_error(ctx));
    CHECK(k3_ctx_load_table(NULL, TMP_TABLE, 0) == K3_STATUS_INVALID_ARGUMENT, "NULL ctx");
    k3_ctx_destroy(ctx107);
    k3_ctx_destroy(ctx10);
    k3_ctx_destroy(ctx);
    remove(TMP_TABLE);
}

/* ---------------------------------------------------------------- CPU run ---------------------- */

/* double -> BF16 bits, round to nearest even (the test's own conversion). */
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
    test_parse_good();
    test_parse_bad();
    test_round_trip();
    test_embedded();
    test_selection();
    test_plan_fallbacks();
    test_forced();
    test_desc_validation();
    test_keys();
    test_cpu_run();
    test_run_validation();
    return k3t_finish();
}
