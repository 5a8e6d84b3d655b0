/* The data model of the plan tables (GEMM rows, the moe and kda sections, the device key): the types every part
 * of the table code shares (src/plan/table.h documents the format and declares the functions). */
#ifndef K3_PLAN_TABLE_TYPES_H
#define K3_PLAN_TABLE_TYPES_H

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

/* The moe rows (see the top of this file); present 0 when the table has none. */
typedef struct k3_table_moe {
    int32_t present;            /* 1 when the table has the moe rows (all keys), else 0 */
    int32_t async_nt1_max_m, ring_nt1_max_m, ring_nt2_max_m;
    int32_t fold_waves, early_waves, pair_waves, wide_blocks_per_sm;
    int32_t dense_split_waves, dense_k1_waves, g2_t4_waves, g2_split_chunks;
    int32_t line;               /* the first moe line (messages), 0 when set by code */
} k3_table_moe;

#define K3_TABLE_KDA_MAX_M 16 /* the KDA projection's largest m */

/* The kda rows (see the top of this file), indexed by m (1..K3_TABLE_KDA_MAX_M; [0] unused); present 0 when the
 * table has none. */
typedef struct k3_table_kda {
    int32_t present;
    int32_t overlap_max_tokens;                          /* 0 .. K3_TABLE_KDA_MAX_M */
    k3_kda_run_n shape[K3_TABLE_KDA_MAX_M + 1];          /* ROWS1 .. FUSED */
    k3_kda_qkvg qkvg[K3_TABLE_KDA_MAX_M + 1];            /* TABLE or CUBLASLT */
    int32_t head_steps[K3_TABLE_KDA_MAX_M + 1];          /* 1 .. K3_KDA_FUSED_MAX_HEAD_STEPS */
    k3_kda_run_n unfused_shape[K3_TABLE_KDA_MAX_M + 1];  /* where shape is FUSED: ROWS1 .. SLICED; else = shape */
    k3_kda_qkvg unfused_qkvg[K3_TABLE_KDA_MAX_M + 1];    /* where shape is FUSED: TABLE or CUBLASLT; else = qkvg */
    int32_t line;                                        /* the first kda line (messages), 0 when set by code */
} k3_table_kda;

typedef struct k3_table {
    k3_table_key key;
    k3_table_row *rows;
    int32_t n_rows, cap_rows;
    k3_table_moe moe;
    k3_table_kda kda;
    char source[128]; /* where it came from: "embedded sm90" or a file path (messages) */
} k3_table;

/* kda rows: the one launch's head prefetch steps compiled (src/plan/kda_tuning.h checks its own count against it) */
#define K3_TABLE_KDA_MAX_HEAD_STEPS 2

#ifdef __cplusplus
}
#endif
#endif
