/* Plan tables: the moe and kda sections (parsed, checked, written; the format is documented in table.h). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/table_sections.h"

/* ------------------------------------------------------------------ moe ---------------------- */

typedef struct moe_key {
    const char *name;
    size_t offset; /* of its int32_t in k3_table_moe */
    int32_t lo, hi;
} moe_key;

#define MOE_KEY(name, lo, hi) {#name, offsetof(k3_table_moe, name), lo, hi}
static const moe_key moe_keys[K3_TABLE_MOE_KEYS] = {
    MOE_KEY(async_nt1_max_m, 1, 4096),  MOE_KEY(ring_nt1_max_m, 1, 4096),   MOE_KEY(ring_nt2_max_m, 1, 4096),
    MOE_KEY(fold_waves, 0, 64),         MOE_KEY(early_waves, 0, 64),        MOE_KEY(pair_waves, 0, 64),
    MOE_KEY(wide_blocks_per_sm, 0, 64), MOE_KEY(dense_split_waves, 0, 64),  MOE_KEY(dense_k1_waves, 0, 64),
    MOE_KEY(g2_t4_waves, 0, 64),        MOE_KEY(g2_split_chunks, 1, 64),
};
#undef MOE_KEY
_Static_assert(sizeof(k3_table_moe) == (K3_TABLE_MOE_KEYS + 2) * sizeof(int32_t),
               "moe_keys lists every value member of k3_table_moe");
enum { MOE_RING_NT1 = 1, MOE_RING_NT2 = 2 }; /* indices in moe_keys */

static int32_t *moe_field(k3_table_moe *m, int key) { return (int32_t *)((char *)m + moe_keys[key].offset); }
static int32_t moe_value(const k3_table_moe *m, int key) {
    return *(const int32_t *)((const char *)m + moe_keys[key].offset);
}

k3_status k3_table_parse_moe(k3_table_parser *p, k3_table *t, char **tok, int ntok) {
    if (ntok < 3) return k3_table_perr(p, "a moe row is 'moe KEY VALUE', found %d field(s)", ntok);
    int key = -1;
    for (int i = 0; i < K3_TABLE_MOE_KEYS && key < 0; i++)
        if (!strcmp(tok[1], moe_keys[i].name)) key = i;
    if (key < 0)
        return k3_table_perr(p,
                             "unknown moe key '%s' (keys: async_nt1_max_m ring_nt1_max_m ring_nt2_max_m fold_waves "
                             "early_waves pair_waves wide_blocks_per_sm dense_split_waves dense_k1_waves "
                             "g2_t4_waves g2_split_chunks)",
                             tok[1]);
    const moe_key *k = &moe_keys[key];
    if (ntok > 3) return k3_table_perr(p, "moe %s: junk after the value: '%s'", k->name, tok[3]);
    if (p->moe_line[key])
        return k3_table_perr(p, "moe key '%s' is repeated (first on line %d)", k->name, (int)p->moe_line[key]);
    int64_t v = 0;
    if (!k3_table_parse_num(tok[2], 0, 1000000, &v) || v < k->lo || v > k->hi)
        return k3_table_perr(p, "moe %s '%s' is not a number in its range [%d, %d]", k->name, tok[2], (int)k->lo,
                             (int)k->hi);
    p->moe_line[key] = p->line;
    if (!t->moe.line) t->moe.line = p->line;
    *moe_field(&t->moe, key) = (int32_t)v;
    return K3_STATUS_SUCCESS;
}

/* The rule across keys: 2 token tiles cover at least what 1 does. */
static int moe_tiles_ordered(const k3_table_moe *m) {
    return moe_value(m, MOE_RING_NT2) >= moe_value(m, MOE_RING_NT1);
}

k3_status k3_table_moe_check(const k3_table_moe *moe, char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!moe || !moe->present) return K3_STATUS_SUCCESS;
    for (int i = 0; i < K3_TABLE_MOE_KEYS; i++) {
        const int32_t v = moe_value(moe, i);
        if (v < moe_keys[i].lo || v > moe_keys[i].hi) {
            if (err) snprintf(err, err_size, "moe %s %d is outside its range [%d, %d]", moe_keys[i].name, (int)v,
                              (int)moe_keys[i].lo, (int)moe_keys[i].hi);
            return K3_STATUS_FORMAT_ERROR;
        }
    }
    if (!moe_tiles_ordered(moe)) {
        if (err) snprintf(err, err_size, "moe ring_nt2_max_m %d is below ring_nt1_max_m %d",
                          (int)moe->ring_nt2_max_m, (int)moe->ring_nt1_max_m);
        return K3_STATUS_FORMAT_ERROR;
    }
    return K3_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------ kda ---------------------- */

/* Words for k3_kda_run_n and k3_kda_qkvg, indexed by value (TUNED is never written). */
static const char *const shape_words[] = {"tuned", "rows1", "rows2", "narrow", "sliced", "fused"};
static const char *const qkvg_words[] = {"tuned", "table", "cublaslt"};

static int shape_of(const char *w, k3_kda_run_n *out) {
    for (int i = K3_KDA_RUN_N_ROWS1; i <= K3_KDA_RUN_N_FUSED; i++)
        if (!strcmp(w, shape_words[i])) {
            *out = (k3_kda_run_n)i;
            return 1;
        }
    return 0;
}

static int qkvg_of(const char *w, k3_kda_qkvg *out) {
    for (int i = K3_KDA_QKVG_TABLE; i <= K3_KDA_QKVG_CUBLASLT; i++)
        if (!strcmp(w, qkvg_words[i])) {
            *out = (k3_kda_qkvg)i;
            return 1;
        }
    return 0;
}

static k3_status kda_range(k3_table_parser *p, const char *s, int64_t *lo, int64_t *hi) {
    const int r = k3_table_parse_range(s, K3_TABLE_KDA_MAX_M, lo, hi);
    if (r == 0) return k3_table_perr(p, "kda M range '%s' is not a number or LO-HI", s);
    if (r < 0)
        return k3_table_perr(p, "kda M range '%s' is out of range (1 <= LO <= HI <= %d)", s, K3_TABLE_KDA_MAX_M);
    return K3_STATUS_SUCCESS;
}

static k3_status kda_words(k3_table_parser *p, const char *shape_w, const char *qkvg_w, k3_kda_run_n *shape,
                           k3_kda_qkvg *qkvg) {
    if (!shape_of(shape_w, shape))
        return k3_table_perr(p, "kda shape '%s' is not one of rows1 rows2 narrow sliced fused", shape_w);
    if (!qkvg_of(qkvg_w, qkvg)) return k3_table_perr(p, "kda QKVG kernel '%s' is not table or cublaslt", qkvg_w);
    return K3_STATUS_SUCCESS;
}

static k3_status parse_kda_unfused(k3_table_parser *p, k3_table *t, char **tok, int ntok) {
    if (ntok < 5) return k3_table_perr(p, "a kda unfused row is 'kda unfused M-RANGE SHAPE QKVG'");
    if (ntok > 5) return k3_table_perr(p, "kda unfused: junk after the QKVG kernel: '%s'", tok[5]);
    int64_t lo = 0, hi = 0;
    K3_TRY(kda_range(p, tok[2], &lo, &hi));
    k3_kda_run_n shape;
    k3_kda_qkvg qkvg;
    K3_TRY(kda_words(p, tok[3], tok[4], &shape, &qkvg));
    if (shape == K3_KDA_RUN_N_FUSED)
        return k3_table_perr(p, "kda unfused shape cannot be fused (it is the choice where the one launch does not "
                                "fit the device)");
    for (int64_t m = lo; m <= hi; m++)
        if (p->kda_unfused_line[m])
            return k3_table_perr(p, "kda unfused m %d is already set on line %d (overlapping M ranges)", (int)m,
                                 (int)p->kda_unfused_line[m]);
    for (int64_t m = lo; m <= hi; m++) {
        t->kda.unfused_shape[m] = shape;
        t->kda.unfused_qkvg[m] = qkvg;
        p->kda_unfused_line[m] = p->line;
    }
    return K3_STATUS_SUCCESS;
}

k3_status k3_table_parse_kda(k3_table_parser *p, k3_table *t, char **tok, int ntok) {
    if (ntok < 2)
        return k3_table_perr(p, "a kda row is 'kda overlap_max_tokens N', 'kda M-RANGE SHAPE QKVG HEAD_STEPS' or "
                                "'kda unfused M-RANGE SHAPE QKVG'");
    if (!t->kda.line) t->kda.line = p->line;
    if (!strcmp(tok[1], "overlap_max_tokens")) {
        if (ntok < 3) return k3_table_perr(p, "kda overlap_max_tokens needs a value");
        if (ntok > 3) return k3_table_perr(p, "kda overlap_max_tokens: junk after the value: '%s'", tok[3]);
        if (p->kda_overlap_line)
            return k3_table_perr(p, "kda overlap_max_tokens is repeated (first on line %d)", (int)p->kda_overlap_line);
        int64_t v = 0;
        if (!k3_table_parse_num(tok[2], 0, K3_TABLE_KDA_MAX_M, &v))
            return k3_table_perr(p, "kda overlap_max_tokens '%s' is outside its range [0, %d]", tok[2],
                                 K3_TABLE_KDA_MAX_M);
        t->kda.overlap_max_tokens = (int32_t)v;
        p->kda_overlap_line = p->line;
        return K3_STATUS_SUCCESS;
    }
    if (!strcmp(tok[1], "unfused")) return parse_kda_unfused(p, t, tok, ntok);
    if (tok[1][0] < '0' || tok[1][0] > '9')
        return k3_table_perr(p, "unknown kda row '%s' (expected overlap_max_tokens, unfused or an M range)", tok[1]);
    int64_t lo = 0, hi = 0;
    K3_TRY(kda_range(p, tok[1], &lo, &hi));
    if (ntok < 5) return k3_table_perr(p, "a kda choice row is 'kda M-RANGE SHAPE QKVG HEAD_STEPS'");
    if (ntok > 5) return k3_table_perr(p, "kda %s: junk after the head steps: '%s'", tok[1], tok[5]);
    k3_kda_run_n shape;
    k3_kda_qkvg qkvg;
    K3_TRY(kda_words(p, tok[2], tok[3], &shape, &qkvg));
    int64_t steps = 0;
    if (!k3_table_parse_num(tok[4], 1, K3_TABLE_KDA_MAX_HEAD_STEPS, &steps))
        return k3_table_perr(p, "kda head steps '%s' is outside its range [1, %d] (the compiled instances)", tok[4],
                             K3_TABLE_KDA_MAX_HEAD_STEPS);
    for (int64_t m = lo; m <= hi; m++)
        if (p->kda_line[m])
            return k3_table_perr(p, "kda m %d already has a choice on line %d (overlapping M ranges)", (int)m,
                                 (int)p->kda_line[m]);
    for (int64_t m = lo; m <= hi; m++) {
        t->kda.shape[m] = shape;
        t->kda.qkvg[m] = qkvg;
        t->kda.head_steps[m] = (int32_t)steps;
        p->kda_line[m] = p->line;
    }
    return K3_STATUS_SUCCESS;
}

static int qkvg_ok(k3_kda_qkvg q) { return q == K3_KDA_QKVG_TABLE || q == K3_KDA_QKVG_CUBLASLT; }

k3_status k3_table_kda_check(const k3_table_kda *kda, char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!kda || !kda->present) return K3_STATUS_SUCCESS;
    if (!err) err_size = 0;
    if (kda->overlap_max_tokens < 0 || kda->overlap_max_tokens > K3_TABLE_KDA_MAX_M) {
        snprintf(err, err_size, "kda overlap_max_tokens %d is outside its range [0, %d]", (int)kda->overlap_max_tokens,
                 K3_TABLE_KDA_MAX_M);
        return K3_STATUS_FORMAT_ERROR;
    }
    for (int m = 1; m <= K3_TABLE_KDA_MAX_M; m++) {
        const k3_kda_run_n shape = kda->shape[m], unfused = kda->unfused_shape[m];
        const char *why = NULL;
        if (shape < K3_KDA_RUN_N_ROWS1 || shape > K3_KDA_RUN_N_FUSED) why = "the shape is not rows1 .. fused";
        else if (!qkvg_ok(kda->qkvg[m])) why = "the QKVG kernel is not table or cublaslt";
        else if (kda->head_steps[m] < 1 || kda->head_steps[m] > K3_TABLE_KDA_MAX_HEAD_STEPS)
            why = "the head steps are outside [1, K3_TABLE_KDA_MAX_HEAD_STEPS]";
        else if (shape == K3_KDA_RUN_N_FUSED && (unfused < K3_KDA_RUN_N_ROWS1 || unfused > K3_KDA_RUN_N_SLICED))
            why = "the unfused shape is not rows1 .. sliced";
        else if (shape == K3_KDA_RUN_N_FUSED && !qkvg_ok(kda->unfused_qkvg[m]))
            why = "the unfused QKVG kernel is not table or cublaslt";
        else if (shape != K3_KDA_RUN_N_FUSED && (unfused != shape || kda->unfused_qkvg[m] != kda->qkvg[m]))
            why = "the shape is not fused, so the unfused choice must equal the choice";
        if (why) {
            snprintf(err, err_size, "kda m %d: %s", m, why);
            return K3_STATUS_FORMAT_ERROR;
        }
    }
    return K3_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------ completeness ------------- */

k3_status k3_table_sections_finish(k3_table_parser *p, k3_table *t) {
    if (t->moe.line) {
        p->line = t->moe.line;
        for (int i = 0; i < K3_TABLE_MOE_KEYS; i++)
            if (!p->moe_line[i])
                return k3_table_perr(p, "moe key '%s' is missing (every moe key is required once a moe row is "
                                        "present; the first is on this line)",
                                     moe_keys[i].name);
        if (!moe_tiles_ordered(&t->moe)) {
            p->line = p->moe_line[MOE_RING_NT2];
            return k3_table_perr(p, "moe ring_nt2_max_m %d is below ring_nt1_max_m %d (line %d)",
                                 (int)t->moe.ring_nt2_max_m, (int)t->moe.ring_nt1_max_m,
                                 (int)p->moe_line[MOE_RING_NT1]);
        }
        t->moe.present = 1;
    }
    if (t->kda.line) {
        p->line = t->kda.line;
        if (!p->kda_overlap_line)
            return k3_table_perr(p, "the kda rows have no 'kda overlap_max_tokens N' row (the first kda row is on "
                                    "this line)");
        for (int m = 1; m <= K3_TABLE_KDA_MAX_M; m++)
            if (!p->kda_line[m])
                return k3_table_perr(p, "kda m %d has no choice row (every m 1-%d needs one once a kda row is "
                                        "present; the first is on this line)",
                                     m, K3_TABLE_KDA_MAX_M);
        for (int m = 1; m <= K3_TABLE_KDA_MAX_M; m++) {
            const int fused = t->kda.shape[m] == K3_KDA_RUN_N_FUSED;
            if (fused && !p->kda_unfused_line[m]) {
                p->line = p->kda_line[m];
                return k3_table_perr(p, "kda m %d is fused but has no 'kda unfused' row (its choice where the one "
                                        "launch does not fit the device)",
                                     m);
            }
            if (!fused && p->kda_unfused_line[m]) {
                p->line = p->kda_unfused_line[m];
                return k3_table_perr(p, "kda unfused row for m %d, whose choice (line %d) is not fused", m,
                                     (int)p->kda_line[m]);
            }
            if (!fused) { /* nothing to drop: the choice stands */
                t->kda.unfused_shape[m] = t->kda.shape[m];
                t->kda.unfused_qkvg[m] = t->kda.qkvg[m];
            }
        }
        t->kda.present = 1;
    }
    return K3_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------ writer ------------------- */

static const char *word(const char *const *words, int n, int v) { return v >= 0 && v < n ? words[v] : "?"; }
#define SHAPE_WORD(v) word(shape_words, (int)(sizeof shape_words / sizeof shape_words[0]), (int)(v))
#define QKVG_WORD(v) word(qkvg_words, (int)(sizeof qkvg_words / sizeof qkvg_words[0]), (int)(v))

static void range_text(char *buf, size_t size, int lo, int hi) {
    if (lo == hi) snprintf(buf, size, "%d", lo);
    else snprintf(buf, size, "%d-%d", lo, hi);
}

void k3_table_format_sections(k3_sbuf *b, const k3_table *t) {
    if (t->moe.present) {
        k3_sbuf_printf(b, "# moe KEY VALUE (the routed-experts MoE thresholds, src/plan/table.h)\n");
        for (int i = 0; i < K3_TABLE_MOE_KEYS; i++)
            k3_sbuf_printf(b, "moe %s %d\n", moe_keys[i].name, (int)moe_value(&t->moe, i));
    }
    if (!t->kda.present) return;
    const k3_table_kda *k = &t->kda;
    char r[32];
    k3_sbuf_printf(b, "# kda M-RANGE SHAPE QKVG HEAD_STEPS; kda unfused M-RANGE SHAPE QKVG (where the one launch\n"
                      "# does not fit the device)\n"
                      "kda overlap_max_tokens %d\n",
                   (int)k->overlap_max_tokens);
    for (int m = 1; m <= K3_TABLE_KDA_MAX_M;) {
        int hi = m;
        while (hi + 1 <= K3_TABLE_KDA_MAX_M && k->shape[hi + 1] == k->shape[m] && k->qkvg[hi + 1] == k->qkvg[m] &&
               k->head_steps[hi + 1] == k->head_steps[m])
            hi++;
        range_text(r, sizeof r, m, hi);
        k3_sbuf_printf(b, "kda %s %s %s %d\n", r, SHAPE_WORD(k->shape[m]), QKVG_WORD(k->qkvg[m]),
                       (int)k->head_steps[m]);
        m = hi + 1;
    }
    for (int m = 1; m <= K3_TABLE_KDA_MAX_M;) {
        if (k->shape[m] != K3_KDA_RUN_N_FUSED) {
            m++;
            continue;
        }
        int hi = m;
        while (hi + 1 <= K3_TABLE_KDA_MAX_M && k->shape[hi + 1] == K3_KDA_RUN_N_FUSED &&
               k->unfused_shape[hi + 1] == k->unfused_shape[m] && k->unfused_qkvg[hi + 1] == k->unfused_qkvg[m])
            hi++;
        range_text(r, sizeof r, m, hi);
        k3_sbuf_printf(b, "kda unfused %s %s %s\n", r, SHAPE_WORD(k->unfused_shape[m]),
                       QKVG_WORD(k->unfused_qkvg[m]));
        m = hi + 1;
    }
}

/* ------------------------------------------------------------------ a context's sections ----- */

