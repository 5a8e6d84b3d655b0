/* The GEMM measurement harness of `k3 bench gemm` and `k3 tune` (docs/benchmarks.md, "Method"):
 *   - correctness first: every measured plan runs once on fresh random data and is compared with the CPU
 *     reference (rel-L2 <= 2e-3, no NaN; outputs poisoned first), and again after the timed replays;
 *   - cold weights: enough distinct weight copies that they total >= max(180 MB, 3 x L2), rotated per call;
 *   - a CUDA graph of one call per copy (at least K3B_MIN_CALLS calls), warm-up replays, then >= 7 timed
 *     replays with CUDA events; the per-call time is the median replay time / calls.
 * Everything goes through the public plan API (forced kernels for candidates). CUDA builds only: without
 * K3_HAVE_CUDA every entry point answers K3_STATUS_NOT_AVAILABLE. */
#ifndef K3_TOOLS_GEMM_BENCH_H
#define K3_TOOLS_GEMM_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "k3.h"

#define K3B_REL_L2_MAX 2e-3             /* BF16 GEMM correctness bar */
#define K3B_MIN_CALLS 8                 /* calls per graph, so the replay's own launch cost is amortized */
#define K3B_MAX_M 32

typedef struct k3b_options {
    int32_t reps;   /* timed replays, >= 7 */
    int32_t warmup; /* untimed replays first */
    uint64_t seed;  /* random data */
} k3b_options;

typedef struct k3b_result {
    k3_status status;   /* SUCCESS when measured (even if incorrect: see correct) */
    char message[320];  /* why not measured */
    double us;          /* median per-call microseconds */
    double rel_l2;      /* vs the CPU reference: the worse of the first run and the last replay */
    int32_t nan_count;  /* NaN/Inf outputs (poisoned elements never written count here) */
    int32_t correct;    /* rel_l2 <= K3B_REL_L2_MAX and nan_count == 0 */
    char kernel[128];   /* k3_linear_plan_kernel for m */
} k3b_result;

typedef struct k3b_shape k3b_shape;

/* Prepares a shape: random x [max_m, k] and W [n, k] (BF16, from seed), the CPU reference (fp32 accumulation)
 * for all max_m rows, the weight copies on the device. Errors print nothing: err receives the reason. */
k3_status k3b_shape_open(k3_ctx *ctx, int64_t n, int64_t k, int64_t max_m, const k3b_options *o, k3b_shape **out,
                         char *err, size_t err_size);
void k3b_shape_close(k3b_shape *s);
/* Weight copies rotated, and calls per graph. */
int32_t k3b_shape_copies(const k3b_shape *s);
int32_t k3b_shape_calls(const k3b_shape *s);

/* Measures the plan described by d (n and k must be the shape's; max_m is set to m) at m tokens. */
void k3b_measure(k3b_shape *s, const k3_linear_desc *d, int64_t m, k3b_result *r);

/* One thing to time: a registry configuration (SKINNY/MMA + its name) or a cuBLASLt heuristic algorithm
 * (FALLBACK + "h0".."h3"). */
typedef struct k3b_candidate {
    k3_kernel kernel;
    char config[40];
} k3b_candidate;

#define K3B_LT_ALGOS 4 /* the cuBLASLt heuristic's top algorithms timed (K3_LT_KEEP_ALGOS) */

/* Room for every candidate of a point: every registry configuration plus h0..h3. gemm_bench.c checks at compile
 * time that the registry fits, so no candidate is ever dropped (a tuner that lost the cuBLASLt candidates would
 * write a table of defaults). */
#define K3B_MAX_CAND 128

/* The candidates for (n, k, m) with dense x: every registry configuration that supports it, then (when
 * with_cublaslt) h0..h3. Returns the count (<= K3B_MAX_CAND). */
int k3b_candidates(int64_t n, int64_t k, int64_t m, int with_cublaslt, k3b_candidate out[K3B_MAX_CAND]);
/* A plan description forcing candidate c for shape (n, k). */
void k3b_candidate_desc(const k3b_candidate *c, int64_t n, int64_t k, k3_linear_desc *d);

/* Parses --m LIST for command `cmd` (values 1..limit) into ms (at most cap); returns the count and the largest
 * value in *max_m, or 0 after printing why. */
int k3b_parse_m(const char *arg, const char *cmd, int64_t limit, int64_t *ms, int cap, int64_t *max_m);
/* The options `k3 bench gemm` and `k3 tune` share (set the defaults before parsing). */
typedef struct k3b_sweep_args {
    const char *shapes; /* --shapes */
    const char *m;      /* --m */
    int64_t reps, seed; /* --reps, --seed */
} k3b_sweep_args;
/* argv[*i] is one of those options: consumes it and its value and returns 1; not one of them: 0; a missing or
 * malformed value: -1 after printing why. */
int k3b_parse_sweep_arg(int argc, char **argv, int *i, k3b_sweep_args *a);
/* A CUDA context for command `cmd`, or NULL after printing that nothing was measured. */
k3_ctx *k3b_open_cuda(const char *cmd);

/* Bytes one call moves: weights + x + y (BF16). */
double k3b_bytes(int64_t n, int64_t k, int64_t m);
/* Percent of the read ceiling reached by one call of `us` microseconds. */
double k3b_percent_of_ceiling(int64_t n, int64_t k, int64_t m, double us);

#endif
