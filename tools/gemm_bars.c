/* The GEMM acceptance bars (see gemm_bars.h). */
#include "gemm_bars.h"

#include <math.h>
#include <string.h>

void k3b_bars_init(k3b_bars *b) { memset(b, 0, sizeof *b); }

/* Appends ", item" (or "item") to list, silently stopping when full (the counts stay exact). */
static void list_add(char *list, const char *item) {
    const size_t len = strlen(list), add = strlen(item) + (len ? 2 : 0);
    if (len + add + 1 > K3B_BARS_LIST) return;
    if (len) strcat(list, ", ");
    strcat(list, item);
}

/* The percent of the ceiling the small-M shapes' bar asks of (n, k) at m, or 0 where it asks nothing. */
static double small_m_bar(int64_t n, int64_t k, int64_t m) {
    if (k != 7168) return 0.0;
    if (n == 1536) return m <= 8 ? 76.0 : (m >= 12 && m <= 16) ? 70.0 : 0.0;
    if (n == 2112) return m <= 8 ? 82.0 : 0.0;
    return 0.0;
}

void k3b_bars_add(k3b_bars *b, int64_t n, int64_t k, int64_t m, double plan_us, double lt_us, double pct) {
    char item[64];
    if (!(plan_us > 0) || !(lt_us > 0)) return;
    const double l = log(lt_us / plan_us);
    b->n_points++;
    b->log_sum += l;
    if (plan_us > K3B_BARS_SLOWER * lt_us) {
        b->slow_misses++;
        snprintf(item, sizeof item, "%lldx%lld M=%lld (%.2f vs %.2f us)", (long long)n, (long long)k, (long long)m,
                 plan_us, lt_us);
        list_add(b->slow_list, item);
    }
    if (m >= 1 && m <= K3B_BARS_MAX_M) {
        b->n_m[m]++;
        b->log_sum_m[m] += l;
    }
    if (2.0 * (double)n * (double)k >= K3B_BARS_BIG_BYTES && m <= 8) {
        b->big_points++;
        if (pct < K3B_BARS_BIG_PCT) {
            b->big_misses++;
            snprintf(item, sizeof item, "%lldx%lld M%lld %.1f%%", (long long)n, (long long)k, (long long)m, pct);
            list_add(b->big_list, item);
        }
    }
    if (n == 144 && k == 7168 && m <= 16) {
        b->tiny_points++;
        if (plan_us > b->tiny_worst_us) b->tiny_worst_us = plan_us, b->tiny_worst_m = m;
        if (plan_us > 3.0) {
            b->tiny_misses++;
            snprintf(item, sizeof item, "M%lld %.2f us", (long long)m, plan_us);
            list_add(b->tiny_list, item);
        }
    }
    const double sm_pct = small_m_bar(n, k, m);
    if (sm_pct > 0) {
        b->sm_points++;
        if (pct < sm_pct) {
            b->sm_misses++;
            snprintf(item, sizeof item, "%lldx%lld M%lld %.1f%%", (long long)n, (long long)k, (long long)m, pct);
            list_add(b->sm_list, item);
        }
    }
    if (n == 1536 && k == 128 && m <= 16) {
        b->fb_points++;
        if (plan_us > (m <= 8 ? 1.2 : 1.5)) {
            b->fb_misses++;
            snprintf(item, sizeof item, "M%lld %.2f us", (long long)m, plan_us);
            list_add(b->fb_list, item);
        }
    }
}

double k3b_bars_geomean(const k3b_bars *b) { return b->n_points ? exp(b->log_sum / b->n_points) : 0.0; }

int k3b_bars_print(const k3b_bars *b, FILE *f) {
    int failed = b->slow_misses > 0;
    fprintf(f, "bar: no point slower than cuBLASLt by > 2%%: %s\n", b->slow_misses ? "FAIL" : "PASS");
    if (b->n_points) {
        const double g = k3b_bars_geomean(b);
        const int ok = g >= K3B_BARS_GEOMEAN;
        failed += !ok;
        fprintf(f, "bar: geometric-mean speedup >= %.2fx (over the K3 TP8 set and M in {1,2,3,4,6,8,12,16}): %s "
                   "(%.3fx over the %d points measured)\n",
                K3B_BARS_GEOMEAN, ok ? "PASS" : "FAIL", g, b->n_points);
        fprintf(f, "geometric mean by M:");
        for (int m = 1; m <= K3B_BARS_MAX_M; m++)
            if (b->n_m[m]) fprintf(f, " M%d %.3f", m, exp(b->log_sum_m[m] / b->n_m[m]));
        fprintf(f, "\n");
    }
    if (b->big_points) {
        failed += b->big_misses > 0;
        fprintf(f, "bar: weights >= 40 MB reach >= %.0f%% of the ceiling at M <= 8: %s (%d of %d points under%s%s)\n",
                K3B_BARS_BIG_PCT, b->big_misses ? "FAIL" : "PASS", b->big_misses, b->big_points,
                b->big_misses ? ": " : "", b->big_list);
    }
    if (b->tiny_points) {
        failed += b->tiny_misses > 0;
        fprintf(f, "bar: 144x7168 <= 3.0 us at M <= 16: %s (worst %.2f us at M %lld%s%s)\n",
                b->tiny_misses ? "FAIL" : "PASS", b->tiny_worst_us, (long long)b->tiny_worst_m,
                b->tiny_misses ? "; over: " : "", b->tiny_list);
    }
    if (b->fb_points) {
        failed += b->fb_misses > 0;
        fprintf(f, "bar: 1536x128 <= 1.2 us at M <= 8 and <= 1.5 us at M <= 16: %s (%d of %d points over%s%s)\n",
                b->fb_misses ? "FAIL" : "PASS", b->fb_misses, b->fb_points, b->fb_misses ? ": " : "", b->fb_list);
    }
    if (b->sm_points) {
        failed += b->sm_misses > 0;
        fprintf(f, "bar: 1536x7168 >= 76%% of the ceiling at M <= 8 and >= 70%% at M 12-16, 2112x7168 >= 82%% at M <= 8: "
                   "%s (%d of %d points under%s%s)\n",
                b->sm_misses ? "FAIL" : "PASS", b->sm_misses, b->sm_points, b->sm_misses ? ": " : "", b->sm_list);
    }
    return failed;
}
