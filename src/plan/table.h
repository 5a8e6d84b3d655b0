/*
 * Plan tables: the data model, the text parser and the writer.
 *
 * A table holds an architecture's tuned choices as data: tables/<arch>.txt are embedded into the library at build
 * time (k3_embedded_tables[], looked up by k3_table_name()), `k3 tune` writes new ones, k3_ctx_load_table() loads
 * one. Its GEMM rows say, for a local weight shape (N, K) and a token count M, which kernel and configuration runs
 * y[M, N] = x[M, K] W[N, K]^T; its moe rows hold the routed-experts MoE thresholds; its kda rows the KDA
 * projection's per-M choices.
 *
 * Text format (version 1), one item per line; '#' starts a comment that runs to the end of the line; blank
 * lines are ignored; tokens are separated by spaces or tabs.
 *
 *   Header (every field before the first row of any kind, each at most once; `arch` is required):
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
 *   GEMM rows:   N K M-RANGE KERNEL [CONFIG]
 *     N, K       the local weight shape, 1 .. 2^31-1
 *     M-RANGE    "4" or "1-6": token counts 1 .. K3_TABLE_MAX_M; ranges of one (N, K) must not overlap
 *     KERNEL     skinny | mma     (CONFIG required: a configuration name of src/plan/gemm_configs.h that can
 *                                  run (N, K) for every M of the range)
 *                cublaslt         the explicit fallback; CONFIG optional: "hI" = the I-th algorithm (0-based)
 *                                  of cuBLASLt's heuristic list for that M, default h0
 *   (N, K, M) not listed -> the fallback (cuBLASLt h0) at plan time.
 *
 *   MoE rows:    moe KEY VALUE   (an integer). Optional as a section; once any moe row is present every key below
 *   must appear exactly once (k3_table_moe, field for field; the kernels' code says how each is applied):
 *     async_nt1_max_m      [1, 4096]  cp.async (NVFP4) kernels: 1 token tile per pass through this m, 2 past it
 *     ring_nt1_max_m       [1, 4096]  register-ring kernels: 1 token tile through this m
 *     ring_nt2_max_m       [1, 4096]  register-ring kernels: 2 token tiles through this m, 4 past it
 *                                     (>= ring_nt1_max_m)
 *     fold_waves           [0, 64]    the GEMMs route themselves (no dispatch kernel) where both grids fit this
 *                                     many waves
 *     early_waves          [0, 64]    GEMM1's first wave routes itself where GEMM1's grid is at most this many waves
 *     pair_waves           [0, 64]    GEMM1 pairs tiles where the doubled grid fits this many waves
 *     wide_blocks_per_sm   [0, 64]    GEMM2 wide split-K where its grid is at most this many blocks per SM
 *     dense_split_waves    [0, 64]    GEMM2's denser split-K instance where its grid exceeds this many waves
 *     dense_k1_waves       [0, 64]    GEMM2's denser KS 1 instance where its grid exceeds this many waves
 *     g2_t4_waves          [0, 64]    GEMM2 four row tiles per warp where the two-tile grid exceeds this many waves
 *     g2_split_chunks      [1, 64]    GEMM2 splits K where inter / 128 >= this x 4 (chunks of 128 per warp)
 *
 *   KDA rows:    the KDA projection's choices per token count m (1 .. K3_TABLE_KDA_MAX_M). Optional as a
 *   section; once any kda row is present the overlap row is required, every m needs exactly one choice row, every
 *   m whose shape is `fused` exactly one unfused row, and no other m may have one:
 *     kda overlap_max_tokens N             overlap the aux branch for m <= N (0 .. 16)
 *     kda M-RANGE SHAPE QKVG HEAD_STEPS    the choice at each m of the range:
 *       SHAPE       the F_AB kernel's blocks: rows1 | rows2 | narrow | sliced, or fused (the whole projection
 *                   in one launch; see k3_kda_run_n in k3.h)
 *       QKVG        the QKVG GEMM's kernel where it runs on its own: table (the GEMM rows) | cublaslt
 *       HEAD_STEPS  the one launch's QKVG weight steps requested into L2 before its dependency wait,
 *                   1 .. K3_KDA_FUSED_MAX_HEAD_STEPS (used wherever the one launch runs, forced or tuned)
 *     kda unfused M-RANGE SHAPE QKVG       where the m's shape is fused but the one launch does not fit the device:
 *                                          the shape (not fused) and QKVG kernel it runs instead
 *
 * Sections: a table loaded from a file without moe or kda rows takes that section from the embedded table of
 * the context's architecture (k3_table_sections_for). A context with no architecture table at all (the CPU
 * backend without a simulated capability) has no moe section (present 0) and the KDA defaults of
 * k3_kda_tuning_for_ctx.
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
#include "plan/table_sections.h"
#include "plan/table_types.h"

#ifdef __cplusplus
extern "C" {
#endif


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

/* The text of t in the format above (the header, the moe and kda rows when present, then the GEMM rows sorted by
 * N then K; equal neighbouring M merged into ranges), with a comment block that documents the format. Parsing it
 * gives t back. Returns a malloc'd string (caller frees) or NULL (out of memory). */
char *k3_table_format(const k3_table *t);

/* The moe and kda sections the plans of a context use, from its table t (k3_linear_ctx_table: loaded, or the
 * embedded one; NULL when the architecture has none): t's own section where present, else the embedded table's of
 * `arch` (parsed here), else present 0. moe or kda may be NULL (not wanted). Errors: OUT_OF_MEMORY; INTERNAL_ERROR
 * with err when the embedded table does not parse (a build bug). */
k3_status k3_table_sections_for(const k3_table *t, k3_table_id arch, k3_table_moe *moe, k3_table_kda *kda, char *err,
                                size_t err_size);

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
