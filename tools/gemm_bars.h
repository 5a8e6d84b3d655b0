/* The GEMM acceptance bars of docs/benchmarks.md, judged by `k3 bench gemm` from the points it measured:
 * the geometric-mean speedup over cuBLASLt (also by M), weights >= 40 MB at M <= 8 reaching 85% of the read
 * ceiling, 144x7168 <= 3.0 us at M <= 16, 1536x128 <= 1.2 us at M <= 8 / <= 1.5 us at M <= 16, no point
 * slower than cuBLASLt by more than 2%, and the shapes where a public small-M kernel was faster: 1536x7168 at
 * >= 76% of the ceiling at M <= 8 and >= 70% at M 12-16, 2112x7168 at >= 82% at M <= 8. Pure host code, built once as an object library that the CLI and
 * tests/test_gemm_bars.c both link. */
#ifndef K3_TOOLS_GEMM_BARS_H
#define K3_TOOLS_GEMM_BARS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define K3B_BARS_MAX_M 32
#define K3B_BARS_GEOMEAN 1.35
#define K3B_BARS_SLOWER 1.02        /* a point is "slower than cuBLASLt" past this ratio of the times */
#define K3B_BARS_BIG_BYTES 40e6     /* weights of at least this many bytes ... */
#define K3B_BARS_BIG_PCT 85.0       /* ... reach this percent of the ceiling at M <= 8 */
#define K3B_BARS_LIST 768

typedef struct k3b_bars {
    int n_points;
    double log_sum;
    int n_m[K3B_BARS_MAX_M + 1];
    double log_sum_m[K3B_BARS_MAX_M + 1];
    int big_points, big_misses;          /* weights >= 40 MB, M <= 8 */
    int tiny_points, tiny_misses;        /* 144x7168, M <= 16 */
    double tiny_worst_us;
    int64_t tiny_worst_m;
    int fb_points, fb_misses;            /* 1536x128, M <= 16 */
    int sm_points, sm_misses;            /* 1536x7168 at M <= 8 and 12-16, 2112x7168 at M <= 8 */
    int slow_misses;                     /* plan_us > K3B_BARS_SLOWER * lt_us */
    char big_list[K3B_BARS_LIST], tiny_list[K3B_BARS_LIST], fb_list[K3B_BARS_LIST], slow_list[K3B_BARS_LIST];
    char sm_list[K3B_BARS_LIST];
} k3b_bars;

void k3b_bars_init(k3b_bars *b);
/* One measured, correct point: the plan's and the best cuBLASLt algorithm's time (us); pct = the plan's percent
 * of the read ceiling. */
void k3b_bars_add(k3b_bars *b, int64_t n, int64_t k, int64_t m, double plan_us, double lt_us, double pct);
/* The geometric-mean speedup over cuBLASLt of the points added (0 when none). */
double k3b_bars_geomean(const k3b_bars *b);
/* "bar: no point slower than cuBLASLt by > 2%: PASS|FAIL", then one line per other bar that the measured points
 * cover ("bar ...: PASS|FAIL ...", the geometric mean followed by its values by M). Returns the number of failed
 * bars. */
int k3b_bars_print(const k3b_bars *b, FILE *f);

#endif
