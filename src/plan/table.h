/*
 * GEMM plan tables: the data model, the text parser and the writer.
 *
 * A table says, for a local weight shape (N, K) and a token count M, which kernel and configuration runs
 * y[M, N] = x[M, K] W[N, K]^T. It is data: tables/<arch>.txt are embedded into the library at build time
 * (k3_embedded_tables[], looked up by k3_table_name()), `k3 tune` writes new ones, k3_ctx_load_table() loads one.
 *
 * Text format (version 1), one item per line; '#' starts a comment that runs to the end of the line; blank
 * lines are ignored; tokens are separated by spaces or tabs.
 *
 *   Header (every field before the first row, each at most once; `arch` is required):
 *     format 1                    the format version (optional; when present it must be 1)
 *     arch sm90                   the architecture table this is: sm90, sm100 or sm103
 *     gpu NVIDIA H200             device key: the GPU name as the CUDA runtime reports it (rest of the line)
 *     sm_count 132                device key: multiprocessors
 *     capability 9.0              device key: compute capability
 *     driver 13000                cudaDriverGetVersion of the tuning run (mismatch = warning only)
 *     runtime 13000               cudaRuntimeGetVersion of the tuning run (mismatch = warning only)
 *     library 0.1.0               k3kernels version of the tuning run (mismatch = warning only)
 *     date 2026-11-29             when it was measured (informational)
 *     note free text              anything (informational; rest of the line)
 *
 *   Rows:   N K M-RANGE KERNEL [CONFIG]
 *     N, K       the local weight shape, 1 .. 2^31-1
 *     M-RANGE    "4" or "1-6": token counts 1 .. K3_TABLE_MAX_M; ranges of one (N, K) must not overlap
 *     KERNEL     skinny | mma     (CONFIG required: a configuration name of src/plan/gemm_configs.h that can
 *                                  run (N, K) for every M of the range)
 *                cublaslt         the explicit fallback; CONFIG optional: "hI" = the I-th algorithm (0-based)
 *                                  of cuBLASLt's heuristic list for that M, default h0
 *   (N, K, M) not listed -> the fallback (cuBLASLt h0) at plan time.
 *
 * Keys: a table loaded from a file whose header names a gpu is matched against the device on gpu, sm_count and
 * capability (a mismatch is refused unless forced); driver/runtime/library differences are only logged. A table
 * without a gpu field is keyed by architecture only (its arch must be the context's table). Embedded tables are
 * keyed by architecture only: src/arch picks the table, the header is informational.
 */
#ifndef K3_PLAN_TABLE_H
#define K3_PLAN_TABLE_H

#include <stddef.h>

#include "core/internal.h"
#include "plan/gemm_configs.h"

#ifdef __cplusplus
extern "C" {
#endif

#define K3_TABLE_MAX_M 32      /* the largest token count a table row may name */
#define K3_TABLE_MAX_ALGO 7    /* cublaslt hI: I in 0 .. K3_TABLE_MAX_ALGO */

/* One (N, K, M) decision. kernel == K3_KERNEL_AUTO means "not listed". */
typedef struct k3_table_choice {
    k3_kernel kernel;          /* AUTO (none), FALLBACK (cublaslt), SKINNY or MMA */
    const k3_gemm_config *cfg; /* SKINNY / MMA: the registry entry; else NULL */
    int32_t algo;              /* FALLBACK: index in cuBLASLt's heuristic list (0 = its first) */
} k3_table_choice;

typedef struct k3_table_row {
    int64_t n, k;
    k3_table_choice m[K3_TABLE_MAX_M + 1]; /* indexed by M; [0] unused */
    int32_t line[K3_TABLE_MAX_M + 1];      /* the text line that set each M (0 when set by code) */
} k3_table_row;

typedef struct k3_table_key {
    char arch[16];     /* "sm90", "sm100", "sm103" */
    char gpu[128];     /* "" = keyed by architecture only */
    int32_t sm_count;  /* 0 = absent */
    int32_t cc_major;  /* 0 = absent */
    int32_t cc_minor;
    int32_t driver;    /* 0 = absent */
    int32_t runtime;   /* 0 = absent */
    char library[32];
    char date[32];
    char note[256];
} k3_table_key;

typedef struct k3_table {
    k3_table_key key;
    k3_table_row *rows;
    int32_t n_rows, cap_rows;
    char source[128]; /* where it came from: "embedded sm90" or a file path (messages) */
} k3_table;

/* An empty table (no rows, empty key); NULL when out of memory. */
k3_table *k3_table_create(void);
/* NULL is accepted. */
void k3_table_destroy(k3_table *t);

/* The row of (n, k), or NULL. */
const k3_table_row *k3_table_find(const k3_table *t, int64_t n, int64_t k);
/* Sets the choice of (n, k, m) (creating the row). INVALID_ARGUMENT for m outside 1..K3_TABLE_MAX_M or a choice
 * that is not well formed; OUT_OF_MEMORY. The tuner builds its output with this. */
k3_status k3_table_set(k3_table *t, int64_t n, int64_t k, int64_t m, k3_table_choice c);

/*
 * Parses the text of a table. `source` names it in messages ("tables/sm90.txt"). On failure *out is NULL, the
 * status is FORMAT_ERROR (or OUT_OF_MEMORY) and err holds "<source>:<line>: <what was wrong>".
 */
k3_status k3_table_parse(const char *text, const char *source, k3_table **out, char *err, size_t err_size);

/* The text of t in the format above (rows sorted by N then K, equal neighbouring M merged into ranges), with
 * a comment block that documents the format. Returns a malloc'd string (caller frees) or NULL (out of memory). */
char *k3_table_format(const k3_table *t);

/* The embedded text of an architecture's table (tables/<name>.txt at build time), or NULL when none. */
const char *k3_table_embedded_text(k3_table_id id);

/* "skinny b256_o4_u4", "mma m16_s4", "cublaslt h0", "none" into buf. */
void k3_table_choice_string(k3_table_choice c, char *buf, size_t buf_size);

/*
 * Compares a table's key with the context's device (see the top of this file). Returns SUCCESS, or
 * KEY_MISMATCH with a message naming each differing field (unless force != 0: then it logs a warning and
 * succeeds). Driver, runtime and library differences are logged at WARN and never refuse.
 */
k3_status k3_table_check_key(k3_ctx *ctx, const k3_table *t, int32_t force);

#ifdef __cplusplus
}
#endif
#endif
