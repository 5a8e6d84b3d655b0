/* The moe and kda rows of the plan tables: parsing, every malformed case, the writer's round trip, the embedded
 * tables' values (written here by hand) and what `k3 tune` carries over into a table it writes. */
#include <stdio.h>
#include <string.h>

#include "plan/kda_tuning.h"
#include "plan/table.h"
#include "plan_test_util.h" /* expect_bad */

#define MOE_ROWS                                                                                             \
    "moe async_nt1_max_m 64\n"                                                                               \
    "moe ring_nt1_max_m 8\n"                                                                                 \
    "moe ring_nt2_max_m 16\n"                                                                                \
    "moe fold_waves 2\n"                                                                                     \
    "moe early_waves 8\n"                                                                                    \
    "moe pair_waves 1\n"                                                                                     \
    "moe wide_blocks_per_sm 2\n"                                                                             \
    "moe dense_split_waves 1\n"                                                                              \
    "moe dense_k1_waves 2\n"                                                                                 \
    "moe g2_t4_waves 6\n"                                                                                    \
    "moe g2_split_chunks 2\n"

/* SM90's values before they became data (src/cuda/moe_nvfp4.cu's constants), in k3_table_moe's order */
static const int32_t SM90_MOE[11] = {64, 8, 16, 2, 8, 1, 2, 1, 2, 6, 2};

static void moe_values(const k3_table_moe *m, int32_t v[11]) {
    const int32_t x[11] = {m->async_nt1_max_m,    m->ring_nt1_max_m,    m->ring_nt2_max_m, m->fold_waves,
                           m->early_waves,        m->pair_waves,        m->wide_blocks_per_sm,
                           m->dense_split_waves,  m->dense_k1_waves,    m->g2_t4_waves,    m->g2_split_chunks};
    memcpy(v, x, sizeof x);
}

static int moe_is(const k3_table_moe *m, const int32_t want[11]) {
    int32_t v[11];
    moe_values(m, v);
    return m->present == 1 && !memcmp(v, want, sizeof v);
}

static int moe_equal(const k3_table_moe *a, const k3_table_moe *b) {
    k3_table_moe x = *a, y = *b;
    x.line = y.line = 0;
    return !memcmp(&x, &y, sizeof x);
}

static int kda_equal(const k3_table_kda *a, const k3_table_kda *b) {
    if (a->present != b->present || a->overlap_max_tokens != b->overlap_max_tokens) return 0;
    for (int m = 1; m <= K3_TABLE_KDA_MAX_M; m++)
        if (a->shape[m] != b->shape[m] || a->qkvg[m] != b->qkvg[m] || a->head_steps[m] != b->head_steps[m] ||
            a->unfused_shape[m] != b->unfused_shape[m] || a->unfused_qkvg[m] != b->unfused_qkvg[m])
            return 0;
    return 1;
}

/* ---------------------------------------------------------------- good rows -------------------- */

static const char *GOOD = "arch sm90\n"                                       /* 1 */
                          "note sections\n"                                   /* 2 */
                          "moe async_nt1_max_m 32   # a comment\n"            /* 3 */
                          "moe ring_nt1_max_m 4\n"                            /* 4 */
                          "moe\tring_nt2_max_m  4\n"                          /* 5: equal to nt1 is fine */
                          "moe fold_waves 0\n"                                /* 6 */
                          "moe early_waves 64\n"                              /* 7 */
                          "moe pair_waves 3\n"                                /* 8 */
                          "moe wide_blocks_per_sm 5\n"                        /* 9 */
                          "1536 7168 1-16 cublaslt h1\n"                      /* 10: a GEMM row between */
                          "moe dense_split_waves 7\n"                         /* 11 */
                          "moe dense_k1_waves 9\n"                            /* 12 */
                          "moe g2_t4_waves 11\n"                              /* 13 */
                          "moe g2_split_chunks 1\n"                           /* 14 */
                          "kda 9-16 rows2 cublaslt 1\n"                       /* 15: order is free */
                          "kda overlap_max_tokens 12\n"                       /* 16 */
                          "kda 1 fused table 2\n"                             /* 17 */
                          "kda 2-4 sliced table 2\n"                          /* 18 */
                          "kda 5-8 fused cublaslt 1\n"                        /* 19 */
                          "kda unfused 5-8 narrow cublaslt\n"                 /* 20 */
                          "kda unfused 1 rows1 table\n";                      /* 21 */

static void test_parse_good(void) {
    char err[512];
    k3_table *t = NULL;
    k3_status st = k3_table_parse(GOOD, "good.txt", &t, err, sizeof err);
    CHECK(st == K3_STATUS_SUCCESS && t, "good sections parse: %s", err);
    if (!t) return;
    const int32_t want[11] = {32, 4, 4, 0, 64, 3, 5, 7, 9, 11, 1};
    CHECK(moe_is(&t->moe, want), "moe values");
    CHECK(t->moe.line == 3, "first moe line 3, got %d", (int)t->moe.line);
    const k3_table_kda *k = &t->kda;
    CHECK(k->present == 1 && k->overlap_max_tokens == 12 && k->line == 15, "kda present, overlap 12, line %d",
          (int)k->line);
    for (int m = 1; m <= 16; m++) {
        k3_kda_run_n shape, ushape;
        k3_kda_qkvg q, uq;
        int steps;
        if (m == 1) shape = K3_KDA_RUN_N_FUSED, q = K3_KDA_QKVG_TABLE, steps = 2, ushape = K3_KDA_RUN_N_ROWS1,
                    uq = K3_KDA_QKVG_TABLE;
        else if (m <= 4) shape = ushape = K3_KDA_RUN_N_SLICED, q = uq = K3_KDA_QKVG_TABLE, steps = 2;
        else if (m <= 8) shape = K3_KDA_RUN_N_FUSED, q = K3_KDA_QKVG_CUBLASLT, steps = 1,
                         ushape = K3_KDA_RUN_N_NARROW, uq = K3_KDA_QKVG_CUBLASLT;
        else shape = ushape = K3_KDA_RUN_N_ROWS2, q = uq = K3_KDA_QKVG_CUBLASLT, steps = 1;
        CHECK(k->shape[m] == shape && k->qkvg[m] == q && k->head_steps[m] == steps && k->unfused_shape[m] == ushape &&
                  k->unfused_qkvg[m] == uq,
              "kda m %d: %d %d %d unfused %d %d", m, (int)k->shape[m], (int)k->qkvg[m], (int)k->head_steps[m],
              (int)k->unfused_shape[m], (int)k->unfused_qkvg[m]);
    }
    const k3_table_row *r = k3_table_find(t, 1536, 7168);
    CHECK(t->n_rows == 1 && r && r->m[16].kernel == K3_KERNEL_FALLBACK && r->m[16].algo == 1, "the GEMM row");
    CHECK(k3_table_moe_check(&t->moe, err, sizeof err) == K3_STATUS_SUCCESS, "parsed moe checks: %s", err);
    CHECK(k3_table_kda_check(&t->kda, err, sizeof err) == K3_STATUS_SUCCESS, "parsed kda checks: %s", err);
    k3_table_destroy(t);

    /* old tables without the sections still parse, with the sections absent */
    st = k3_table_parse("format 1\narch sm100\n144 7168 1-16 cublaslt\n", "old.txt", &t, err, sizeof err);
    CHECK(st == K3_STATUS_SUCCESS && t && !t->moe.present && !t->kda.present, "a table without sections: %s", err);
    k3_table_destroy(t);
    /* one section without the other */
    st = k3_table_parse("arch sm90\n" MOE_ROWS, "moe.txt", &t, err, sizeof err);
    CHECK(st == K3_STATUS_SUCCESS && t && moe_is(&t->moe, SM90_MOE) && !t->kda.present, "moe only: %s", err);
    k3_table_destroy(t);
    st = k3_table_parse("arch sm90\nkda overlap_max_tokens 0\nkda 1-16 rows1 table 1\n", "kda.txt", &t, err,
                        sizeof err);
    CHECK(st == K3_STATUS_SUCCESS && t && !t->moe.present && t->kda.present && t->kda.overlap_max_tokens == 0,
          "kda only: %s", err);
    k3_table_destroy(t);
}

/* ---------------------------------------------------------------- malformed rows --------------- */

/* MOE_ROWS without the line naming `key` */
static void moe_without(const char *key, char *out, size_t size) {
    char rows[] = MOE_ROWS;
    out[0] = '\0';
    strncat(out, "arch sm90\n", size - 1);
    for (char *line = strtok(rows, "\n"); line; line = strtok(NULL, "\n")) {
        char name[64];
        if (sscanf(line, "moe %63s", name) == 1 && !strcmp(name, key)) continue;
        strncat(out, line, size - strlen(out) - 1);
        strncat(out, "\n", size - strlen(out) - 1);
    }
}

static void test_moe_bad(void) {
    static const char *const keys[] = {"async_nt1_max_m",    "ring_nt1_max_m",    "ring_nt2_max_m", "fold_waves",
                                       "early_waves",        "pair_waves",        "wide_blocks_per_sm",
                                       "dense_split_waves",  "dense_k1_waves",    "g2_t4_waves",    "g2_split_chunks"};
    for (int i = 0; i < 11; i++) { /* each key missing: named, at the first moe line */
        char text[1024], what[96];
        moe_without(keys[i], text, sizeof text);
        snprintf(what, sizeof what, "moe key '%s' is missing", keys[i]);
        expect_bad(text, 2, what);
    }
    expect_bad("arch sm90\n" MOE_ROWS "moe fold_waves 2\n", 13, "moe key 'fold_waves' is repeated (first on line 5)");
    /* out of range: the message names the range */
    expect_bad("arch sm90\nmoe fold_waves 65\n", 2, "fold_waves '65' is not a number in its range [0, 64]");
    expect_bad("arch sm90\nmoe async_nt1_max_m 0\n", 2, "[1, 4096]");
    expect_bad("arch sm90\nmoe ring_nt2_max_m 4097\n", 2, "[1, 4096]");
    expect_bad("arch sm90\nmoe g2_split_chunks 0\n", 2, "[1, 64]");
    expect_bad("arch sm90\nmoe pair_waves -1\n", 2, "[0, 64]");
    expect_bad("arch sm90\nmoe early_waves two\n", 2, "early_waves 'two'");
    expect_bad("arch sm90\nmoe early_waves 8x\n", 2, "[0, 64]");
    /* junk after the value, no value, unknown key */
    expect_bad("arch sm90\nmoe fold_waves 2 3\n", 2, "junk after the value: '3'");
    expect_bad("arch sm90\nmoe fold_waves 2 waves\n", 2, "junk after the value");
    expect_bad("arch sm90\nmoe fold_waves\n", 2, "moe KEY VALUE");
    expect_bad("arch sm90\nmoe\n", 2, "moe KEY VALUE");
    expect_bad("arch sm90\nmoe fold_wave 2\n", 2, "unknown moe key 'fold_wave'");
    /* across keys: NT 2 covers at least NT 1 (reported at the ring_nt2_max_m line) */
    {
        char text[1024];
        moe_without("ring_nt2_max_m", text, sizeof text);
        strncat(text, "moe ring_nt2_max_m 7\n", sizeof text - strlen(text) - 1);
        expect_bad(text, 12, "ring_nt2_max_m 7 is below ring_nt1_max_m 8");
    }
    /* the header comes before every row, section rows included */
    expect_bad("arch sm90\nmoe fold_waves 2\ngpu late\n", 3, "after the first row");
}

#define KDA_OK "kda overlap_max_tokens 16\n"

static void test_kda_bad(void) {
    /* completeness */
    expect_bad("arch sm90\nkda 1-16 rows1 table 2\n", 2, "no 'kda overlap_max_tokens N' row");
    expect_bad("arch sm90\n" KDA_OK "kda 1-15 rows1 table 2\n", 2, "kda m 16 has no choice row");
    expect_bad("arch sm90\n" KDA_OK, 2, "kda m 1 has no choice row");
    expect_bad("arch sm90\n" KDA_OK "kda 1-8 rows1 table 2\nkda 10-16 rows1 table 2\n", 2, "kda m 9 has no");
    expect_bad("arch sm90\n" KDA_OK "kda 1-8 rows1 table 2\nkda 9-16 fused table 2\nkda unfused 9-15 rows2 table\n",
               4, "kda m 16 is fused but has no 'kda unfused' row");
    expect_bad("arch sm90\n" KDA_OK "kda 1-16 rows1 table 2\nkda unfused 3 sliced table\n", 4,
               "kda unfused row for m 3, whose choice (line 3) is not fused");
    /* overlapping M ranges (the earlier line is named) */
    expect_bad("arch sm90\n" KDA_OK "kda 1-8 rows1 table 2\nkda 8-16 rows2 table 2\n", 4,
               "kda m 8 already has a choice on line 3");
    expect_bad("arch sm90\n" KDA_OK "kda 1-16 fused table 2\nkda unfused 1-16 rows1 table\nkda unfused 4 rows2 table\n",
               5, "kda unfused m 4 is already set on line 4");
    /* repeated, out of range */
    expect_bad("arch sm90\n" KDA_OK KDA_OK, 3, "overlap_max_tokens is repeated (first on line 2)");
    expect_bad("arch sm90\nkda overlap_max_tokens 17\n", 2, "overlap_max_tokens '17' is outside its range [0, 16]");
    expect_bad("arch sm90\nkda overlap_max_tokens -1\n", 2, "[0, 16]");
    expect_bad("arch sm90\nkda overlap_max_tokens\n", 2, "needs a value");
    expect_bad("arch sm90\nkda 0-4 rows1 table 2\n", 2, "kda M range '0-4' is out of range (1 <= LO <= HI <= 16)");
    expect_bad("arch sm90\nkda 1-17 rows1 table 2\n", 2, "out of range");
    expect_bad("arch sm90\nkda 5-3 rows1 table 2\n", 2, "out of range");
    expect_bad("arch sm90\nkda 1-x rows1 table 2\n", 2, "kda M range '1-x' is not a number or LO-HI");
    expect_bad("arch sm90\nkda unfused 9-17 rows2 table\n", 2, "out of range");
    expect_bad("arch sm90\nkda 1-16 fused table 0\n", 2, "kda head steps '0' is outside its range [1, 2]");
    expect_bad("arch sm90\nkda 1-16 fused table 3\n", 2, "[1, 2]");
    /* bad words */
    expect_bad("arch sm90\nkda 1-16 wide table 2\n", 2,
               "kda shape 'wide' is not one of rows1 rows2 narrow sliced fused");
    expect_bad("arch sm90\nkda 1-16 tuned table 2\n", 2, "kda shape 'tuned'");
    expect_bad("arch sm90\nkda 1-16 rows1 mma 2\n", 2, "kda QKVG kernel 'mma' is not table or cublaslt");
    expect_bad("arch sm90\nkda unfused 1-16 fused table\n", 2, "kda unfused shape cannot be fused");
    expect_bad("arch sm90\nkda unfused 1-16 slice table\n", 2, "kda shape 'slice'");
    expect_bad("arch sm90\nkda overlap 16\n", 2, "unknown kda row 'overlap'");
    /* field counts: junk after the last field, missing fields */
    expect_bad("arch sm90\nkda 1-16 rows1 table 2 extra\n", 2, "junk after the head steps: 'extra'");
    expect_bad("arch sm90\nkda 1-16 rows1 table\n", 2, "kda M-RANGE SHAPE QKVG HEAD_STEPS");
    expect_bad("arch sm90\nkda unfused 1-16 rows1 table 2\n", 2, "junk after the QKVG kernel: '2'");
    expect_bad("arch sm90\nkda unfused 1-16 rows1\n", 2, "kda unfused M-RANGE SHAPE QKVG");
    expect_bad("arch sm90\nkda overlap_max_tokens 16 16\n", 2, "junk after the value: '16'");
    expect_bad("arch sm90\nkda\n", 2, "a kda row is");
    expect_bad("arch sm90\nkda 1-16 rows1 table 2\ndate 2026-01-01\n", 3, "after the first row");
}

/* ---------------------------------------------------------------- code-set sections ------------ */

static void set_moe(k3_table_moe *m, const int32_t v[11]) {
    memset(m, 0, sizeof *m);
    m->present = 1;
    m->async_nt1_max_m = v[0], m->ring_nt1_max_m = v[1], m->ring_nt2_max_m = v[2], m->fold_waves = v[3];
    m->early_waves = v[4], m->pair_waves = v[5], m->wide_blocks_per_sm = v[6], m->dense_split_waves = v[7];
    m->dense_k1_waves = v[8], m->g2_t4_waves = v[9], m->g2_split_chunks = v[10];
}

/* A kda section with a different choice at most m (so range merging has work), fused at a few of them. */
static void set_kda(k3_table_kda *k) {
    memset(k, 0, sizeof *k);
    k->present = 1;
    k->overlap_max_tokens = 9;
    for (int m = 1; m <= 16; m++) {
        k->shape[m] = (k3_kda_run_n)(1 + (m * 7 / 3) % 5);
        k->qkvg[m] = m % 3 ? K3_KDA_QKVG_TABLE : K3_KDA_QKVG_CUBLASLT;
        k->head_steps[m] = m > 10 ? 1 : 2;
        if (k->shape[m] == K3_KDA_RUN_N_FUSED) {
            k->unfused_shape[m] = (k3_kda_run_n)(1 + m % 4);
            k->unfused_qkvg[m] = m % 2 ? K3_KDA_QKVG_CUBLASLT : K3_KDA_QKVG_TABLE;
        } else {
            k->unfused_shape[m] = k->shape[m];
            k->unfused_qkvg[m] = k->qkvg[m];
        }
    }
    /* and a run of fused m whose unfused choices differ (not one range) */
    const k3_kda_run_n us[3] = {K3_KDA_RUN_N_ROWS1, K3_KDA_RUN_N_ROWS1, K3_KDA_RUN_N_SLICED};
    const k3_kda_qkvg uq[3] = {K3_KDA_QKVG_TABLE, K3_KDA_QKVG_CUBLASLT, K3_KDA_QKVG_CUBLASLT};
    for (int i = 0; i < 3; i++) {
        k->shape[12 + i] = K3_KDA_RUN_N_FUSED;
        k->unfused_shape[12 + i] = us[i];
        k->unfused_qkvg[12 + i] = uq[i];
    }
}

static void test_round_trip(void) {
    char err[512];
    k3_table *t = k3_table_create();
    CHECK(t != NULL, "create");
    if (!t) return;
    snprintf(t->key.arch, sizeof t->key.arch, "sm103");
    const int32_t v[11] = {1, 3, 4095, 64, 0, 17, 33, 2, 5, 8, 64};
    set_moe(&t->moe, v);
    set_kda(&t->kda);
    int fused = 0;
    for (int m = 1; m <= 16; m++) fused += t->kda.shape[m] == K3_KDA_RUN_N_FUSED;
    CHECK(fused >= 2 && fused <= 6, "the test section has a few fused m (%d)", fused);
    CHECK(k3_table_moe_check(&t->moe, err, sizeof err) == K3_STATUS_SUCCESS, "moe checks: %s", err);
    CHECK(k3_table_kda_check(&t->kda, err, sizeof err) == K3_STATUS_SUCCESS, "kda checks: %s", err);
    CHECK(k3_table_set(t, 144, 7168, 3, (k3_table_choice){K3_KERNEL_FALLBACK, NULL, 2}) == K3_STATUS_SUCCESS, "set");
    char *text = k3_table_format(t);
    CHECK(text != NULL, "format");
    k3_table *back = NULL;
    k3_status st = text ? k3_table_parse(text, "written", &back, err, sizeof err) : K3_STATUS_INTERNAL_ERROR;
    CHECK(st == K3_STATUS_SUCCESS && back, "written sections parse: %s\n%s", err, text ? text : "");
    if (back) {
        CHECK(moe_equal(&t->moe, &back->moe), "moe round trip\n%s", text);
        CHECK(kda_equal(&t->kda, &back->kda), "kda round trip\n%s", text);
        CHECK(back->moe.line > 0 && back->kda.line > back->moe.line, "parsed lines set (%d, %d)",
              (int)back->moe.line, (int)back->kda.line);
        const k3_table_row *r = k3_table_find(back, 144, 7168);
        CHECK(r && r->m[3].kernel == K3_KERNEL_FALLBACK && r->m[3].algo == 2, "GEMM row kept");
        char *text2 = k3_table_format(back);
        CHECK(text2 && !strcmp(text, text2), "writing twice gives the same text");
        free(text2);
    }
    free(text);
    k3_table_destroy(back);

    /* the hand-written sections survive a round trip too */
    k3_table *g = NULL, *g2 = NULL;
    CHECK(k3_table_parse(GOOD, "good", &g, err, sizeof err) == K3_STATUS_SUCCESS, "good: %s", err);
    char *gt = g ? k3_table_format(g) : NULL;
    CHECK(gt && k3_table_parse(gt, "good2", &g2, err, sizeof err) == K3_STATUS_SUCCESS, "good written: %s", err);
    CHECK(g && g2 && moe_equal(&g->moe, &g2->moe) && kda_equal(&g->kda, &g2->kda), "good round trip\n%s",
          gt ? gt : "");
    /* merged ranges: the four m 5-8 become one row, as written by hand */
    CHECK(gt && strstr(gt, "\nkda 5-8 fused cublaslt 1\n") && strstr(gt, "\nkda unfused 5-8 narrow cublaslt\n"),
          "ranges merged\n%s", gt ? gt : "");
    free(gt);
    k3_table_destroy(g2);
    k3_table_destroy(g);

    /* a table without sections writes none */
    k3_table *plain = k3_table_create();
    if (plain) {
        snprintf(plain->key.arch, sizeof plain->key.arch, "sm90");
        char *pt = k3_table_format(plain);
        CHECK(pt && !strstr(pt, "\nmoe ") && !strstr(pt, "\nkda "), "no section rows written for none");
        free(pt);
        k3_table_destroy(plain);
    }

    /* the checks of code-set sections refuse what the parser refuses */
    k3_table_moe bm = t->moe;
    bm.fold_waves = 65;
    CHECK(k3_table_moe_check(&bm, err, sizeof err) == K3_STATUS_FORMAT_ERROR && strstr(err, "fold_waves") &&
              strstr(err, "[0, 64]"),
          "moe out of range: %s", err);
    bm = t->moe;
    bm.ring_nt2_max_m = bm.ring_nt1_max_m - 1;
    CHECK(k3_table_moe_check(&bm, err, sizeof err) == K3_STATUS_FORMAT_ERROR && strstr(err, "below"),
          "moe nt2 < nt1: %s", err);
    bm.present = 0;
    CHECK(k3_table_moe_check(&bm, err, sizeof err) == K3_STATUS_SUCCESS, "absent moe is fine");
    k3_table_kda bk = t->kda;
    bk.head_steps[7] = K3_KDA_FUSED_MAX_HEAD_STEPS + 1;
    CHECK(k3_table_kda_check(&bk, err, sizeof err) == K3_STATUS_FORMAT_ERROR && strstr(err, "m 7") &&
              strstr(err, "head steps"),
          "kda head steps: %s", err);
    bk = t->kda;
    bk.overlap_max_tokens = 17;
    CHECK(k3_table_kda_check(&bk, err, sizeof err) == K3_STATUS_FORMAT_ERROR && strstr(err, "overlap"),
          "kda overlap: %s", err);
    bk = t->kda;
    bk.shape[2] = K3_KDA_RUN_N_TUNED;
    CHECK(k3_table_kda_check(&bk, err, sizeof err) == K3_STATUS_FORMAT_ERROR && strstr(err, "m 2"), "kda tuned: %s",
          err);
    bk = t->kda;
    bk.qkvg[3] = K3_KDA_QKVG_TUNED;
    CHECK(k3_table_kda_check(&bk, err, sizeof err) == K3_STATUS_FORMAT_ERROR && strstr(err, "QKVG"), "kda qkvg: %s",
          err);
    bk = t->kda;
    for (int m = 1; m <= 16; m++)
        if (bk.shape[m] == K3_KDA_RUN_N_FUSED) {
            bk.unfused_shape[m] = K3_KDA_RUN_N_FUSED;
            break;
        }
    CHECK(k3_table_kda_check(&bk, err, sizeof err) == K3_STATUS_FORMAT_ERROR && strstr(err, "unfused"),
          "kda unfused fused: %s", err);
    bk = t->kda;
    for (int m = 1; m <= 16; m++)
        if (bk.shape[m] != K3_KDA_RUN_N_FUSED) {
            bk.unfused_qkvg[m] = bk.qkvg[m] == K3_KDA_QKVG_TABLE ? K3_KDA_QKVG_CUBLASLT : K3_KDA_QKVG_TABLE;
            break;
        }
    CHECK(k3_table_kda_check(&bk, err, sizeof err) == K3_STATUS_FORMAT_ERROR && strstr(err, "unfused"),
          "kda unfused differs where not fused: %s", err);
    k3_table_destroy(t);
}

/* ---------------------------------------------------------------- embedded tables -------------- */

static void test_embedded(void) {
    const k3_table_id ids[] = {K3_TABLE_SM90, K3_TABLE_SM100, K3_TABLE_SM103};
    for (int i = 0; i < 3; i++) {
        const char *name = k3_table_name(ids[i]);
        char err[512] = "";
        k3_table *t = NULL;
        const char *text = k3_table_embedded_text(ids[i]);
        CHECK(text && k3_table_parse(text, name, &t, err, sizeof err) == K3_STATUS_SUCCESS, "%s parses: %s", name,
              err);
        if (!t) continue;
        /* the same MoE thresholds everywhere (measured on SM90 only) */
        CHECK(moe_is(&t->moe, SM90_MOE), "%s: moe rows present with SM90's values", name);
        /* the raw kda rows (the tuning they make is checked in test_kda_proj) */
        const k3_table_kda *k = &t->kda;
        CHECK(k->present == 1, "%s: kda rows present", name);
        if (ids[i] == K3_TABLE_SM90) {
            CHECK(k->overlap_max_tokens == 16, "sm90 overlap 16");
            for (int m = 1; m <= 16; m++)
                CHECK(k->shape[m] == K3_KDA_RUN_N_FUSED && k->qkvg[m] == K3_KDA_QKVG_TABLE &&
                          k->head_steps[m] == (m <= 4 ? 2 : 1) &&
                          k->unfused_shape[m] == (m <= 8 ? K3_KDA_RUN_N_SLICED : K3_KDA_RUN_N_ROWS2) &&
                          k->unfused_qkvg[m] == (m <= 8 ? K3_KDA_QKVG_TABLE : K3_KDA_QKVG_CUBLASLT),
                      "sm90 kda m %d", m);
        } else {
            CHECK(k->overlap_max_tokens == 14, "%s overlap 14", name);
            for (int m = 1; m <= 16; m++)
                CHECK(k->shape[m] == K3_KDA_RUN_N_ROWS1 && k->qkvg[m] == K3_KDA_QKVG_TABLE && k->head_steps[m] == 2 &&
                          k->unfused_shape[m] == K3_KDA_RUN_N_ROWS1 && k->unfused_qkvg[m] == K3_KDA_QKVG_TABLE,
                      "%s kda m %d", name, m);
        }
        /* the writer gives the same sections and GEMM rows back */
        char *w = k3_table_format(t);
        k3_table *back = NULL;
        CHECK(w && k3_table_parse(w, "written", &back, err, sizeof err) == K3_STATUS_SUCCESS, "%s written: %s", name,
              err);
        CHECK(back && moe_equal(&back->moe, &t->moe) && kda_equal(&back->kda, &t->kda) && back->n_rows == t->n_rows,
              "%s round trip through the writer\n%s", name, w ? w : "");
        free(w);
        k3_table_destroy(back);
        /* the unmeasured tables say so in a comment */
        if (ids[i] != K3_TABLE_SM90) {
            char want[64];
            snprintf(want, sizeof want, "not measured on %s", name);
            CHECK(strstr(text, want) != NULL, "%s says its moe and kda rows were not measured there", name);
        }
        k3_table_destroy(t);
    }
}

/* ---------------------------------------------------------------- what k3 tune carries ---------- */

/* `k3 tune` builds a table of GEMM rows in code and takes the moe and kda sections of the table the context plans
 * with through k3_table_sections_for (tools/cmd_tune.c); here the same steps on the CPU. */
static void test_tune_carries(void) {
    char err[512];
    k3_table *base = NULL; /* a loaded table with its own kda rows but no moe rows */
    CHECK(k3_table_parse("arch sm103\nkda overlap_max_tokens 5\nkda 1-16 rows2 cublaslt 1\n", "loaded", &base, err,
                         sizeof err) == K3_STATUS_SUCCESS,
          "base: %s", err);
    if (!base) return;
    k3_table *tuned = k3_table_create();
    CHECK(tuned != NULL, "create");
    if (!tuned) {
        k3_table_destroy(base);
        return;
    }
    snprintf(tuned->key.arch, sizeof tuned->key.arch, "sm103");
    CHECK(k3_table_sections_for(base, K3_TABLE_SM103, &tuned->moe, &tuned->kda, err, sizeof err) ==
              K3_STATUS_SUCCESS,
          "sections: %s", err);
    CHECK(moe_is(&tuned->moe, SM90_MOE), "the moe rows the loaded table lacks come from the embedded sm103");
    CHECK(kda_equal(&tuned->kda, &base->kda), "the loaded table's own kda rows are kept");
    CHECK(k3_table_set(tuned, 6144, 7168, 1, (k3_table_choice){K3_KERNEL_FALLBACK, NULL, 1}) == K3_STATUS_SUCCESS,
          "set");
    char *text = k3_table_format(tuned);
    k3_table *back = NULL;
    CHECK(text && k3_table_parse(text, "tuned", &back, err, sizeof err) == K3_STATUS_SUCCESS, "tuned parses: %s", err);
    CHECK(back && moe_equal(&back->moe, &tuned->moe) && kda_equal(&back->kda, &base->kda) &&
              k3_table_find(back, 6144, 7168),
          "the written table carries the moe and kda rows and its GEMM row\n%s", text ? text : "");
    free(text);
    k3_table_destroy(back);

    /* an embedded table as the base: both sections carried as they are */
    k3_table *e90 = NULL;
    CHECK(k3_table_parse(k3_table_embedded_text(K3_TABLE_SM90), "embedded sm90", &e90, err, sizeof err) ==
              K3_STATUS_SUCCESS,
          "sm90: %s", err);
    k3_table_moe moe;
    k3_table_kda kda;
    CHECK(e90 && k3_table_sections_for(e90, K3_TABLE_SM90, &moe, &kda, err, sizeof err) == K3_STATUS_SUCCESS &&
              moe_equal(&moe, &e90->moe) && kda_equal(&kda, &e90->kda),
          "sm90 sections as they are");
    /* no table and no architecture table: absent */
    memset(&moe, 0x5a, sizeof moe);
    memset(&kda, 0x5a, sizeof kda);
    CHECK(k3_table_sections_for(NULL, K3_TABLE_NONE, &moe, &kda, err, sizeof err) == K3_STATUS_SUCCESS &&
              !moe.present && !kda.present,
          "nothing for an architecture without a table");
    CHECK(k3_table_sections_for(NULL, K3_TABLE_SM100, NULL, &kda, err, sizeof err) == K3_STATUS_SUCCESS &&
              kda.present && kda.overlap_max_tokens == 14,
          "no table: the embedded sm100 kda rows (moe not wanted)");
    k3_table_destroy(e90);
    k3_table_destroy(tuned);
    k3_table_destroy(base);
}

int main(void) {
    test_parse_good();
    test_moe_bad();
    test_kda_bad();
    test_round_trip();
    test_embedded();
    test_tune_carries();
    return k3t_finish();
}
