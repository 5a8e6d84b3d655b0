/* Plan tables: the writer (the format is documented in table.h; the moe and kda rows come from
 * table_sections.c). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/table.h"


/* The opening comment of every written table: enough of the format to edit one by hand. */
static const char format_comment[] =
    "# k3kernels plan table, format 1 (documented in src/plan/table.h).\n"
    "# Header: KEY VALUE lines. GEMM rows: N K M-RANGE KERNEL [CONFIG]\n"
    "#   KERNEL skinny|mma CONFIG = a configuration of src/plan/gemm_configs.h;\n"
    "#   KERNEL cublaslt [hI] = the explicit fallback, the I-th algorithm of cuBLASLt's heuristic.\n"
    "# (N, K, M) not listed -> cuBLASLt h0. Embedded tables are keyed by architecture only; a table\n"
    "# loaded from a file must match the device's gpu, sm_count and capability unless forced.\n"
    "# moe KEY VALUE: the routed-experts MoE thresholds; kda ...: the KDA projection's choices per m.\n";

static int row_cmp(const void *a, const void *b) {
    const k3_table_row *x = *(const k3_table_row *const *)a, *y = *(const k3_table_row *const *)b;
    if (x->n != y->n) return x->n < y->n ? -1 : 1;
    if (x->k != y->k) return x->k < y->k ? -1 : 1;
    return 0;
}

static int choice_equal(k3_table_choice a, k3_table_choice b) {
    return a.kernel == b.kernel && a.cfg == b.cfg && (a.kernel != K3_KERNEL_FALLBACK || a.algo == b.algo);
}

char *k3_table_format(const k3_table *t) {
    if (!t) return NULL;
    k3_sbuf b = {NULL, 0, 0, 0};
    k3_sbuf_printf(&b, "%s", format_comment);
    k3_sbuf_printf(&b, "format 1\narch %s\n", t->key.arch[0] ? t->key.arch : "sm90");
    if (t->key.gpu[0]) k3_sbuf_printf(&b, "gpu %s\n", t->key.gpu);
    if (t->key.sm_count) k3_sbuf_printf(&b, "sm_count %d\n", (int)t->key.sm_count);
    if (t->key.cc_major) k3_sbuf_printf(&b, "capability %d.%d\n", (int)t->key.cc_major, (int)t->key.cc_minor);
    if (t->key.driver) k3_sbuf_printf(&b, "driver %d\n", (int)t->key.driver);
    if (t->key.runtime) k3_sbuf_printf(&b, "runtime %d\n", (int)t->key.runtime);
    if (t->key.library[0]) k3_sbuf_printf(&b, "library %s\n", t->key.library);
    if (t->key.date[0]) k3_sbuf_printf(&b, "date %s\n", t->key.date);
    if (t->key.note[0]) k3_sbuf_printf(&b, "note %s\n", t->key.note);
    k3_table_format_sections(&b, t);

    const k3_table_row **order = NULL;
    if (t->n_rows > 0) {
        order = (const k3_table_row **)malloc((size_t)t->n_rows * sizeof *order);
        if (!order) {
            free(b.s);
            return NULL;
        }
        for (int32_t i = 0; i < t->n_rows; i++) order[i] = &t->rows[i];
        qsort(order, (size_t)t->n_rows, sizeof *order, row_cmp);
        k3_sbuf_printf(&b, "# N K M kernel config\n");
    }
    for (int32_t i = 0; i < t->n_rows; i++) {
        const k3_table_row *r = order[i];
        for (int m = 1; m <= K3_TABLE_MAX_M;) {
            if (r->m[m].kernel == K3_KERNEL_AUTO) {
                m++;
                continue;
            }
            int hi = m;
            while (hi + 1 <= K3_TABLE_MAX_M && choice_equal(r->m[hi + 1], r->m[m])) hi++;
            char what[96];
            k3_table_choice_string(r->m[m], what, sizeof what);
            if (hi == m) k3_sbuf_printf(&b, "%lld %lld %d %s\n", (long long)r->n, (long long)r->k, m, what);
            else k3_sbuf_printf(&b, "%lld %lld %d-%d %s\n", (long long)r->n, (long long)r->k, m, hi, what);
            m = hi + 1;
        }
    }
    free(order);
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
