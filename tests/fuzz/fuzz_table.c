/*
 * libFuzzer target: the plan-table parser and writer. The input bytes are a table's text (cut at the first NUL,
 * as a C string would be). A text that parses is formatted, and the formatted text must parse again into the same
 * table: same header, same moe and kda sections, the same choice at every (N, K, M). That is the writer's promise
 * in table.h ("parsing it gives t back"), so a violation aborts like a crash does.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/table.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what, const char *text) {
    fprintf(stderr, "fuzz_table: round trip broken: %s\n--- formatted text ---\n%s\n", what, text ? text : "(null)");
    abort();
}

static int choice_eq(k3_table_choice a, k3_table_choice b) {
    if (a.kernel != b.kernel) return 0;
    if (a.kernel == K3_KERNEL_AUTO) return 1;
    return a.cfg == b.cfg && (a.kernel != K3_KERNEL_FALLBACK || a.algo == b.algo);
}

static int row_empty(const k3_table_row *r) {
    for (int m = 1; m <= K3_TABLE_MAX_M; ++m)
        if (r->m[m].kernel != K3_KERNEL_AUTO) return 0;
    return 1;
}

/* Every choice of a is in b (rows without any choice count as absent). */
static int rows_within(const k3_table *a, const k3_table *b) {
    for (int32_t i = 0; i < a->n_rows; ++i) {
        const k3_table_row *ra = &a->rows[i];
        if (row_empty(ra)) continue;
        const k3_table_row *rb = k3_table_find(b, ra->n, ra->k);
        if (!rb) return 0;
        for (int m = 1; m <= K3_TABLE_MAX_M; ++m)
            if (!choice_eq(ra->m[m], rb->m[m])) return 0;
    }
    return 1;
}

static int key_eq(const k3_table_key *a, const k3_table_key *b) {
    return !strcmp(a->arch, b->arch) && !strcmp(a->gpu, b->gpu) && a->sm_count == b->sm_count &&
           a->cc_major == b->cc_major && a->cc_minor == b->cc_minor && a->driver == b->driver &&
           a->runtime == b->runtime && !strcmp(a->library, b->library) && !strcmp(a->date, b->date) &&
           !strcmp(a->note, b->note);
}

static int moe_eq(const k3_table_moe *a, const k3_table_moe *b) {
    if (a->present != b->present) return 0;
    if (!a->present) return 1;
    return a->async_nt1_max_m == b->async_nt1_max_m && a->ring_nt1_max_m == b->ring_nt1_max_m &&
           a->ring_nt2_max_m == b->ring_nt2_max_m && a->fold_waves == b->fold_waves &&
           a->early_waves == b->early_waves && a->pair_waves == b->pair_waves &&
           a->wide_blocks_per_sm == b->wide_blocks_per_sm && a->dense_split_waves == b->dense_split_waves &&
           a->dense_k1_waves == b->dense_k1_waves && a->g2_t4_waves == b->g2_t4_waves &&
           a->g2_split_chunks == b->g2_split_chunks;
}

static int kda_eq(const k3_table_kda *a, const k3_table_kda *b) {
    if (a->present != b->present) return 0;
    if (!a->present) return 1;
    if (a->overlap_max_tokens != b->overlap_max_tokens) return 0;
    for (int m = 1; m <= K3_TABLE_KDA_MAX_M; ++m)
        if (a->shape[m] != b->shape[m] || a->qkvg[m] != b->qkvg[m] || a->head_steps[m] != b->head_steps[m] ||
            a->unfused_shape[m] != b->unfused_shape[m] || a->unfused_qkvg[m] != b->unfused_qkvg[m])
            return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = (char *)malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';

    char err[512];
    err[0] = '\0';
    k3_table *t = NULL;
    const k3_status st = k3_table_parse(text, "fuzz", &t, err, sizeof err);
    free(text);
    if (st != K3_STATUS_SUCCESS) {
        if (t != NULL) fail("parse failed but returned a table", NULL);
        if (st != K3_STATUS_OUT_OF_MEMORY && err[0] == '\0') fail("parse failed without a message", NULL);
        return 0;
    }
    if (t == NULL) fail("parse succeeded without a table", NULL);

    char *out = k3_table_format(t);
    if (!out) { /* out of memory: nothing to check */
        k3_table_destroy(t);
        return 0;
    }
    k3_table *t2 = NULL;
    err[0] = '\0';
    if (k3_table_parse(out, "fuzz-formatted", &t2, err, sizeof err) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "fuzz_table: the formatted text does not parse: %s\n", err);
        fail("re-parse failed", out);
    }
    if (!key_eq(&t->key, &t2->key)) fail("header differs", out);
    if (!moe_eq(&t->moe, &t2->moe)) fail("moe section differs", out);
    if (!kda_eq(&t->kda, &t2->kda)) fail("kda section differs", out);
    if (!rows_within(t, t2) || !rows_within(t2, t)) fail("GEMM rows differ", out);

    /* The writer is deterministic and a fixed point: the re-parsed table formats to the same text. */
    char *out2 = k3_table_format(t2);
    if (out2 && strcmp(out, out2) != 0) fail("formatting the re-parsed table gives a different text", out2);
    free(out2);
    free(out);
    k3_table_destroy(t2);
    k3_table_destroy(t);
    return 0;
}
