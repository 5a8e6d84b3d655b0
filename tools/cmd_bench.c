/* k3 bench gemm: the plan against cuBLASLt, measured as docs/benchmarks.md describes (harness: gemm_bench.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_graph.h"
#include "cli.h"
#include "gemm_bars.h"
#include "gemm_bench.h"
#include "gemm_shapes.h"

#define BENCH_MAX_M_LIST 32

static void bench_help(FILE *f) {
    fprintf(f, "usage: k3 bench gemm [--shapes k3|tp8|all|N,K[,N,K...]] [--m LIST] [--reps R] [--json | --csv]\n"
           "                     [--all-candidates] [--table FILE [--force]] [--seed S]\n\n"
           "Times the library's planned BF16 GEMM and cuBLASLt (the best of its heuristic's top %d algorithms)\n"
           "side by side on the GPU (docs/benchmarks.md): every timed plan is first checked against the CPU reference\n"
           "on fresh random data (rel-L2 <= 2e-3, no NaN, outputs poisoned); weights rotate through copies\n"
           "totalling >= max(180 MB, 3 x L2); one call per copy is captured into a CUDA graph, warmed up and\n"
           "replayed R times; the per-call time is the median replay / calls. Bytes = weights + x + y; percent\n"
           "of the 4.37 TB/s read ceiling; speedup = cuBLASLt / plan; geometric mean over all points; points\n"
           "where the plan is slower than cuBLASLt by more than 2%% are listed; then a PASS/FAIL line for each\n"
           "acceptance bar of docs/benchmarks.md that the measured points cover (no point > 2%% slower than cuBLASLt;\n"
           "geometric mean >= 1.35x, also shown by M; weights >= 40 MB at >= 85%% of the ceiling at M <= 8;\n"
           "144x7168 <= 3.0 us; 1536x128 <= 1.2 us at M <= 8 and <= 1.5 us at M <= 16; 1536x7168 >= 76%% of the\n"
           "ceiling at M <= 8 and >= 70%% at M 12-16, 2112x7168 >= 82%% at M <= 8). The bars do not change the exit\n"
           "status.\n\n"
           "  --shapes S        k3 = tp8 (default): the 14 TP8 shapes; all: + TP4/TP16; or N,K[,N,K...]\n"
           "  --m LIST          token counts, e.g. 1-16 or 1,2,4 (default 1,2,3,4,6,8,12,16)\n"
           "  --reps R          timed replays per measurement (>= 7, default 11)\n"
           "  --all-candidates  also time every registry configuration that supports the shape\n"
           "  --table FILE      plan from this table file (k3_ctx_load_table); --force ignores its device key\n"
           "  --json / --csv    machine-readable output on stdout\n"
           "exit status: 0 done and every measured kernel correct, 1 failure or an incorrect kernel, 2 usage\n",
           K3B_LT_ALGOS);
}

typedef struct point {
    int64_t n, k, m;
    k3b_result plan;
    k3b_result lt[K3B_LT_ALGOS];
    int best_lt; /* index into lt, -1 when none measured correctly */
    int n_cand;
    k3b_candidate cand[K3B_MAX_CAND];
    k3b_result cand_r[K3B_MAX_CAND];
} point;

static const char *csv_field(const char *s, char *buf, size_t size) {
    snprintf(buf, size, "\"%s\"", s); /* kernel strings never contain quotes */
    return buf;
}

static void print_result_json(const char *role, const k3b_result *r, int64_t n, int64_t k, int64_t m, double lt_us) {
    printf("{\"role\": \"%s\", \"kernel\": \"%s\", \"measured\": %s", role, r->kernel,
           r->status == K3_STATUS_SUCCESS ? "true" : "false");
    if (r->status == K3_STATUS_SUCCESS) {
        printf(", \"us\": %.4f, \"pct_ceiling\": %.2f, \"rel_l2\": %.3e, \"nan\": %d, \"correct\": %s", r->us,
               k3b_percent_of_ceiling(n, k, m, r->us), r->rel_l2, (int)r->nan_count, r->correct ? "true" : "false");
        if (lt_us > 0) printf(", \"speedup_vs_cublaslt\": %.4f", lt_us / r->us);
    } else {
        printf(", \"error\": \"%s\"", k3_status_string(r->status));
    }
    printf("}");
}

static void print_result_csv(const char *role, const k3b_result *r, int64_t n, int64_t k, int64_t m, double lt_us) {
    char buf[160];
    if (r->status != K3_STATUS_SUCCESS) {
        printf("%lld,%lld,%lld,%s,%s,,,,,\n", (long long)n, (long long)k, (long long)m, role,
               csv_field(r->kernel[0] ? r->kernel : k3_status_string(r->status), buf, sizeof buf));
        return;
    }
    printf("%lld,%lld,%lld,%s,%s,%.4f,%.2f,%.3e,%d,", (long long)n, (long long)k, (long long)m, role,
           csv_field(r->kernel, buf, sizeof buf), r->us, k3b_percent_of_ceiling(n, k, m, r->us), r->rel_l2,
           r->correct);
    if (lt_us > 0) printf("%.4f", lt_us / r->us);
    printf("\n");
}

/* Measures one (shape, M) point; returns 0, or 1 after a CUDA error (the context may be unusable). */
static int measure_point(k3b_shape *s, point *p, int all_candidates) {
    k3_linear_desc d;
    k3_linear_desc_init(&d, p->n, p->k);
    k3b_measure(s, &d, p->m, &p->plan);
    if (p->plan.status == K3_STATUS_CUDA_ERROR) return 1;
    p->best_lt = -1;
    for (int a = 0; a < K3B_LT_ALGOS; a++) {
        k3b_candidate c = {K3_KERNEL_FALLBACK, ""};
        snprintf(c.config, sizeof c.config, "h%d", a);
        k3b_candidate_desc(&c, p->n, p->k, &d);
        k3b_measure(s, &d, p->m, &p->lt[a]);
        if (p->lt[a].status == K3_STATUS_CUDA_ERROR) return 1;
        if (p->lt[a].status == K3_STATUS_SUCCESS && p->lt[a].correct &&
            (p->best_lt < 0 || p->lt[a].us < p->lt[p->best_lt].us))
            p->best_lt = a;
    }
    p->n_cand = 0;
    if (all_candidates) {
        p->n_cand = k3b_candidates(p->n, p->k, p->m, 0, p->cand);
        for (int i = 0; i < p->n_cand; i++) {
            k3b_candidate_desc(&p->cand[i], p->n, p->k, &d);
            k3b_measure(s, &d, p->m, &p->cand_r[i]);
            if (p->cand_r[i].status == K3_STATUS_CUDA_ERROR) return 1;
        }
    }
    return 0;
}

/* An lt result that was not measured because the heuristic offers fewer algorithms is not a failure. */
static int lt_skipped(const k3b_result *r) { return r->status == K3_STATUS_INVALID_ARGUMENT; }

static int bench_gemm(int argc, char **argv) {
    k3b_sweep_args sw = {"k3", "1,2,3,4,6,8,12,16", 11, 20261129};
    const char *table = NULL;
    int json = 0, csv = 0, all_candidates = 0, force = 0;
    for (int i = 1; i < argc; i++) {
        const int r = k3b_parse_sweep_arg(argc, argv, &i, &sw);
        if (r < 0) return K3_EXIT_USAGE;
        if (r) continue;
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--csv")) csv = 1;
        else if (!strcmp(argv[i], "--all-candidates")) all_candidates = 1;
        else if (!strcmp(argv[i], "--force")) force = 1;
        else if (!strcmp(argv[i], "--table")) {
            if (!(table = k3_cli_value(argc, argv, &i, "--table"))) return K3_EXIT_USAGE;
        } else {
            fprintf(stderr, "k3 bench gemm: unknown option '%s' (see k3 bench gemm --help)\n", argv[i]);
            return K3_EXIT_USAGE;
        }
    }
    if (json && csv) {
        fprintf(stderr, "k3 bench gemm: --json and --csv are exclusive\n");
        return K3_EXIT_USAGE;
    }
    if (sw.reps < 7 || sw.reps > 1000) {
        fprintf(stderr, "k3 bench gemm: --reps must be 7..1000 (docs/benchmarks.md: the median of >= 7 replays)\n");
        return K3_EXIT_USAGE;
    }
    static k3_shape shapes[K3_SHAPES_MAX];
    int n_shapes = k3_shapes_parse(sw.shapes, "tp8", 0, shapes, K3_SHAPES_MAX);
    if (!n_shapes) return K3_EXIT_USAGE;
    int64_t ms[BENCH_MAX_M_LIST], max_m = 0;
    const int n_m = k3b_parse_m(sw.m, "k3 bench gemm", K3B_MAX_M, ms, BENCH_MAX_M_LIST, &max_m);
    if (!n_m) return K3_EXIT_USAGE;
    k3_ctx *ctx = k3b_open_cuda("k3 bench gemm");
    if (!ctx) return K3_EXIT_FAIL;
    k3_status st;
    if (table && (st = k3_ctx_load_table(ctx, table, force)) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 bench gemm: %s: %s\n", k3_status_string(st), k3_ctx_last_error(ctx));
        k3_ctx_destroy(ctx);
        return K3_EXIT_FAIL;
    }
    k3_arch_info a;
    k3_ctx_arch(ctx, &a);
    const k3b_options bo = {(int32_t)sw.reps, 3, (uint64_t)sw.seed};
    const char *table_name = table ? table : k3_table_name(a.table);

    if (json) {
        printf("{\"device\": \"%s\", \"sm_count\": %d, \"capability\": \"%d.%d\", \"driver\": %d, \"runtime\": %d, "
               "\"library\": \"%s\", \"table\": \"%s\", \"reps\": %d, \"seed\": %lld, \"ceiling_tb_s\": %.2f, "
               "\"points\": [",
               a.device_name, (int)a.sm_count, (int)a.cc_major, (int)a.cc_minor, (int)a.driver_version,
               (int)a.runtime_version, k3_version(), table_name, (int)sw.reps, (long long)sw.seed,
               K3_BENCH_READ_CEILING / 1e12);
    } else if (csv) {
        printf("n,k,m,role,kernel,us,pct_ceiling,rel_l2,correct,speedup_vs_cublaslt\n");
    } else {
        printf("k3 bench gemm: %s (%d SMs, capability %d.%d), driver %d, runtime %d, k3 %s, table %s\n",
               a.device_name, (int)a.sm_count, (int)a.cc_major, (int)a.cc_minor, (int)a.driver_version,
               (int)a.runtime_version, k3_version(), table_name);
        printf("method: CUDA graph replay, cold weights (>= %.0f MB rotated), 3 warm-up + %d timed replays, median "
               "per call; seed %lld; ceiling %.2f TB/s\n",
               fmax(K3_BENCH_COLD_MIN_BYTES, 3.0 * (double)a.l2_bytes) / 1e6, (int)sw.reps, (long long)sw.seed,
               K3_BENCH_READ_CEILING / 1e12);
        printf("%-13s %3s  %-34s %8s %6s  %8s %-3s %6s  %7s  %s\n", "N x K", "M", "plan kernel", "plan us", "%ceil",
               "cublasLt", "", "%ceil", "speedup", "rel-L2 plan");
    }

    int rc = K3_EXIT_OK, first_json = 1, n_incorrect = 0;
    k3b_bars bars; /* the points compared with cuBLASLt: the geometric mean and the bars of docs/benchmarks.md */
    k3b_bars_init(&bars);
    point *p = (point *)calloc(1, sizeof *p);
    if (!p) {
        k3_ctx_destroy(ctx);
        return K3_EXIT_FAIL;
    }
    for (int si = 0; si < n_shapes && rc == K3_EXIT_OK; si++) {
        k3b_shape *s = NULL;
        char err[320];
        st = k3b_shape_open(ctx, shapes[si].n, shapes[si].k, max_m, &bo, &s, err, sizeof err);
        if (st != K3_STATUS_SUCCESS) {
            fprintf(stderr, "k3 bench gemm: %lld x %lld: %s\n", (long long)shapes[si].n, (long long)shapes[si].k, err);
            rc = K3_EXIT_FAIL;
            break;
        }
        for (int mi = 0; mi < n_m; mi++) {
            memset(p, 0, sizeof *p);
            p->n = shapes[si].n;
            p->k = shapes[si].k;
            p->m = ms[mi];
            if (measure_point(s, p, all_candidates)) {
                const k3b_result *bad = p->plan.status == K3_STATUS_CUDA_ERROR ? &p->plan : NULL;
                for (int a2 = 0; !bad && a2 < K3B_LT_ALGOS; a2++)
                    if (p->lt[a2].status == K3_STATUS_CUDA_ERROR) bad = &p->lt[a2];
                for (int c = 0; !bad && c < p->n_cand; c++)
                    if (p->cand_r[c].status == K3_STATUS_CUDA_ERROR) bad = &p->cand_r[c];
                fprintf(stderr, "k3 bench gemm: %lld x %lld M=%lld: CUDA error, stopping: %s\n", (long long)p->n,
                        (long long)p->k, (long long)p->m, bad ? bad->message : "?");
                rc = K3_EXIT_FAIL;
                break;
            }
            const k3b_result *lt = p->best_lt >= 0 ? &p->lt[p->best_lt] : NULL;
            const double lt_us = lt ? lt->us : 0;
            const int plan_ok = p->plan.status == K3_STATUS_SUCCESS;
            if (!plan_ok) {
                fprintf(stderr, "k3 bench gemm: %lld x %lld M=%lld: the plan could not be measured: %s\n",
                        (long long)p->n, (long long)p->k, (long long)p->m, p->plan.message);
                rc = K3_EXIT_FAIL;
            }
            if (plan_ok && !p->plan.correct) n_incorrect++;
            for (int a2 = 0; a2 < K3B_LT_ALGOS; a2++)
                if (p->lt[a2].status == K3_STATUS_SUCCESS && !p->lt[a2].correct) n_incorrect++;
                else if (p->lt[a2].status != K3_STATUS_SUCCESS && !lt_skipped(&p->lt[a2]))
                    fprintf(stderr, "k3 bench gemm: %lld x %lld M=%lld cublaslt h%d: %s\n", (long long)p->n,
                            (long long)p->k, (long long)p->m, a2, p->lt[a2].message);
            for (int c = 0; c < p->n_cand; c++)
                if (p->cand_r[c].status == K3_STATUS_SUCCESS && !p->cand_r[c].correct) n_incorrect++;
            if (plan_ok && p->plan.correct && lt) {
                k3b_bars_add(&bars, p->n, p->k, p->m, p->plan.us, lt_us,
                             k3b_percent_of_ceiling(p->n, p->k, p->m, p->plan.us));
            }
            if (json) {
                printf("%s{\"n\": %lld, \"k\": %lld, \"m\": %lld, \"bytes\": %.0f, \"plan\": ", first_json ? "" : ", ",
                       (long long)p->n, (long long)p->k, (long long)p->m, k3b_bytes(p->n, p->k, p->m));
                first_json = 0;
                print_result_json("plan", &p->plan, p->n, p->k, p->m, lt_us);
                printf(", \"cublaslt_best\": \"%s\", \"cublaslt\": [", lt ? lt->kernel : "");
                int firstc = 1;
                for (int a2 = 0; a2 < K3B_LT_ALGOS; a2++) {
                    if (lt_skipped(&p->lt[a2])) continue;
                    printf("%s", firstc ? "" : ", ");
                    firstc = 0;
                    print_result_json("cublaslt", &p->lt[a2], p->n, p->k, p->m, lt_us);
                }
                printf("], \"candidates\": [");
                for (int c = 0; c < p->n_cand; c++) {
                    printf("%s", c ? ", " : "");
                    print_result_json("candidate", &p->cand_r[c], p->n, p->k, p->m, lt_us);
                }
                printf("]}");
            } else if (csv) {
                print_result_csv("plan", &p->plan, p->n, p->k, p->m, lt_us);
                for (int a2 = 0; a2 < K3B_LT_ALGOS; a2++)
                    if (!lt_skipped(&p->lt[a2])) print_result_csv("cublaslt", &p->lt[a2], p->n, p->k, p->m, lt_us);
                for (int c = 0; c < p->n_cand; c++) print_result_csv("candidate", &p->cand_r[c], p->n, p->k, p->m, lt_us);
            } else {
                char shape[32], lt_name[8] = "";
                snprintf(shape, sizeof shape, "%lldx%lld", (long long)p->n, (long long)p->k);
                if (lt) snprintf(lt_name, sizeof lt_name, "h%d", p->best_lt);
                if (plan_ok)
                    printf("%-13s %3lld  %-34.34s %8.2f %5.1f%%  %8.2f %-3s %5.1f%%  %6.2fx  %.1e%s\n", shape,
                           (long long)p->m, p->plan.kernel, p->plan.us,
                           k3b_percent_of_ceiling(p->n, p->k, p->m, p->plan.us), lt_us, lt_name,
                           k3b_percent_of_ceiling(p->n, p->k, p->m, lt_us), lt_us > 0 ? lt_us / p->plan.us : 0,
                           p->plan.rel_l2, p->plan.correct ? "" : "  INCORRECT");
                else
                    printf("%-13s %3lld  plan not measured: %s\n", shape, (long long)p->m, p->plan.message);
                for (int c = 0; c < p->n_cand; c++) {
                    const k3b_result *r = &p->cand_r[c];
                    char name[64];
                    snprintf(name, sizeof name, "%s %s", p->cand[c].kernel == K3_KERNEL_SKINNY ? "skinny" : "mma",
                             p->cand[c].config);
                    if (r->status == K3_STATUS_SUCCESS)
                        printf("      candidate %-24s %8.2f us %5.1f%%  %6.2fx vs cuBLASLt  rel-L2 %.1e%s\n", name,
                               r->us, k3b_percent_of_ceiling(p->n, p->k, p->m, r->us), lt_us > 0 ? lt_us / r->us : 0,
                               r->rel_l2, r->correct ? "" : "  INCORRECT");
                    else
                        printf("      candidate %-24s not measured: %s\n", name, r->message);
                }
                fflush(stdout);
            }
        }
        k3b_shape_close(s);
    }
    free(p);
    const double geomean = k3b_bars_geomean(&bars);
    const int n_points = bars.n_points, n_slower = bars.slow_misses;
    if (json) {
        printf("], \"points_compared\": %d, \"geomean_speedup\": %.4f, \"slower_than_cublaslt_by_2pct\": %d, "
               "\"incorrect\": %d}\n",
               n_points, geomean, n_slower, n_incorrect);
    } else {
        FILE *f = csv ? stderr : stdout;
        fprintf(f, "geometric-mean speedup over cuBLASLt: %.3fx over %d points\n", geomean, n_points);
        fprintf(f, "points where the plan is slower than cuBLASLt by > 2%%: %d%s%s\n", n_slower, n_slower ? ": " : "",
                bars.slow_list);
        if (n_incorrect) fprintf(f, "INCORRECT results (rel-L2 > %.0e or NaN): %d\n", K3B_REL_L2_MAX, n_incorrect);
        k3b_bars_print(&bars, f);
    }
    if (n_incorrect) rc = K3_EXIT_FAIL;
    k3_ctx_destroy(ctx);
    return rc;
}

int k3_cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        FILE *f = argc < 2 ? stderr : stdout; /* no benchmark named is a usage error: its text goes to stderr */
        fprintf(f, "usage: k3 bench gemm|kda|moe|block [OPTIONS]   (k3 bench gemm --help, k3 bench kda --help, "
                   "k3 bench moe --help, k3 bench block --help)\n\n");
        bench_help(f);
        return argc < 2 ? K3_EXIT_USAGE : K3_EXIT_OK;
    }
    if (!strcmp(argv[1], "gemm")) {
        if (k3_cli_wants_help(argc - 1, argv + 1)) {
            bench_help(stdout);
            return K3_EXIT_OK;
        }
        return bench_gemm(argc - 1, argv + 1);
    }
    if (!strcmp(argv[1], "kda")) return k3_bench_kda(argc - 1, argv + 1); /* tools/kda_bench.c */
    if (!strcmp(argv[1], "moe")) {
        int k3_bench_moe(int argc, char **argv); /* tools/moe_bench.c */
        return k3_bench_moe(argc - 1, argv + 1);
    }
    if (!strcmp(argv[1], "block")) {
        int k3_bench_block(int argc, char **argv); /* tools/block_bench.c */
        return k3_bench_block(argc - 1, argv + 1);
    }
    fprintf(stderr, "k3 bench: unknown benchmark '%s' (available: gemm, kda, moe, block)\n", argv[1]);
    return K3_EXIT_USAGE;
}
