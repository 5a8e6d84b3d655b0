/* GEMM tables on the CPU: parsing (good tables, every malformed kind with its line number), the writer round trip,
 * the embedded tables, and table keys against the device. */
#include "plan_test_util.h"

/* a table file of this program's own (ctest runs the tests side by side in one folder) */
static const char *TMP_TABLE = "test_table_gemm_tmp_table.txt";

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
    {
        /* A header value longer than its field is refused, not cut: a cut note could end in a blank that the
         * writer prints and a re-parse trims, so format and parse would not give the table back. */
        char text[400];
        char note[300];
        memset(note, 'n', sizeof note);
        note[254] = ' '; /* the 255th character: a cut to the field's 255 characters would end in it */
        note[256] = '\0';
        snprintf(text, sizeof text, "arch sm90\nnote %s\n", note);
        expect_bad(text, 2, "note value longer than 255 characters");
        note[255] = '\0'; /* 255 characters, the last one a blank, which is trimmed */
        snprintf(text, sizeof text, "arch sm90\nnote %s\n", note);
        char err[512];
        k3_table *t = NULL, *t2 = NULL;
        CHECK(k3_table_parse(text, "n255", &t, err, sizeof err) == K3_STATUS_SUCCESS && t, "255-char note: %s", err);
        if (t) {
            CHECK(strlen(t->key.note) == 254 && t->key.note[253] == 'n', "note trimmed to 254, got %zu",
                  strlen(t->key.note));
            char *out = k3_table_format(t);
            CHECK(out && k3_table_parse(out, "n255-out", &t2, err, sizeof err) == K3_STATUS_SUCCESS && t2 &&
                      !strcmp(t2->key.note, t->key.note),
                  "a long note survives format + parse: %s", err);
            free(out);
        }
        k3_table_destroy(t2);
        k3_table_destroy(t);
        note[255] = 'n';
        note[299] = '\0'; /* a 299-character value also names the field */
        snprintf(text, sizeof text, "arch sm90\ngpu %s\n", note);
        expect_bad(text, 2, "gpu value longer than");
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

int main(void) {
    pick_configs();
    test_parse_good();
    test_parse_bad();
    test_round_trip();
    test_embedded();
    test_keys();
    return k3t_finish();
}
