#define _POSIX_C_SOURCE 200809L /* clock_gettime, isatty, gmtime_r */
/* k3 tune: measures every candidate kernel/configuration and cuBLASLt's top algorithms per (N, K, M) on this
 * GPU with the benchmark method (gemm_bench.c) and writes the table (src/plan/table.h format). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "gemm_bench.h"
#include "gemm_shapes.h"
/* internals: the tuner builds a table from the registry's candidates and writes it in the table format */
#include "plan/linear_plan.h"
#include "plan/table.h"

#define TUNE_KEEP_RATIO 1.05 /* a specialized kernel must beat the best cuBLASLt by >= 5% */
/* Close calls are measured again: one pass's medians move by a few percent, enough to send a point near the 5%
 * threshold to cuBLASLt while its neighbouring M keep their kernel (bench/NOTES-gemm.md). Where the decision is
 * within this band of the threshold, or the runner-up configuration within TUNE_CLOSE of the best, the finalists
 * (the best two specialized, the best two cuBLASLt algorithms) are measured twice more each, interleaved, and each
 * is judged by the median of its three measurements. */
#define TUNE_BAND_LO 0.97
#define TUNE_BAND_HI 1.12
#define TUNE_CLOSE 1.03

static double median3(double a, double b, double c) {
    return a > b ? (b > c ? b : a > c ? c : a) : (a > c ? a : b > c ? c : b);
}

/* The fastest two candidates of one kind (specialized, or cuBLASLt) at a point: indices into the candidate list
 * (-1: none yet) and their times. */
typedef struct top2 {
    int best, second;
    double best_us, second_us;
} top2;

static void top2_add(top2 *t, int c, double us) {
    if (t->best < 0 || us < t->best_us) {
        t->second = t->best, t->second_us = t->best_us;
        t->best = c, t->best_us = us;
    } else if (t->second < 0 || us < t->second_us) {
        t->second = c, t->second_us = us;
    }
}

/* A close call (see TUNE_BAND_LO): measures the finalists of spec and lt twice more, interleaved, and replaces
 * each kind's best by the finalist with the lower median of three. Returns 1 if it did (0: not a close call, or a
 * best finalist failed a re-measurement, so the first pass's decision stands). */
static int remeasure_close_call(k3b_shape *s, const k3b_candidate *cand, int64_t n, int64_t k, int64_t m, top2 *spec,
                                top2 *lt) {
    if (spec->best < 0 || !((lt->best_us >= TUNE_BAND_LO * TUNE_KEEP_RATIO * spec->best_us &&
                             lt->best_us <= TUNE_BAND_HI * TUNE_KEEP_RATIO * spec->best_us) ||
                            (spec->second >= 0 && spec->second_us <= TUNE_CLOSE * spec->best_us)))
        return 0;
    /* finalists: 0 best specialized, 1 runner-up specialized, 2 best cuBLASLt, 3 runner-up cuBLASLt */
    const int fin[4] = {spec->best, spec->second, lt->best, lt->second};
    double us[4][3] = {{spec->best_us}, {spec->second_us}, {lt->best_us}, {lt->second_us}};
    int ok[4];
    for (int f = 0; f < 4; f++) ok[f] = fin[f] >= 0;
    for (int rep = 1; rep < 3; rep++)
        for (int f = 0; f < 4; f++) {
            if (!ok[f]) continue;
            k3_linear_desc d;
            k3b_result r;
            k3b_candidate_desc(&cand[fin[f]], n, k, &d);
            k3b_measure(s, &d, m, &r);
            ok[f] = r.status == K3_STATUS_SUCCESS && r.correct;
            us[f][rep] = r.us;
        }
    if (!ok[0] || !ok[2]) return 0;
    double med[4];
    for (int f = 0; f < 4; f++) med[f] = ok[f] ? median3(us[f][0], us[f][1], us[f][2]) : 0;
    const int s1 = ok[1] && med[1] < med[0], l1 = ok[3] && med[3] < med[2];
    spec->best = fin[s1], spec->best_us = med[s1];
    lt->best = fin[2 + l1], lt->best_us = med[2 + l1];
    return 1;
}

static void tune_help(void) {
    printf("usage: k3 tune [--shapes k3|tp8|all|N,K[,N,K...]|FILE] [--m 1-16] [--out FILE] [--reps R] [--note TEXT]\n\n"
           "For every (N, K, M) times every compiled configuration that supports it and cuBLASLt's top %d\n"
           "heuristic algorithms (CUDA graph replay, cold weights, median; every candidate checked against the CPU\n"
           "reference first; see `k3 bench gemm --help`), keeps a specialized kernel only where it beats the best\n"
           "cuBLASLt algorithm by >= 5%% (else writes `cublaslt hI`, the best algorithm), and writes the table\n"
           "(close calls, within -3%%..+12%% of that threshold or with a runner-up configuration within 3%%, are\n"
           "measured twice more, interleaved, and decided on the medians of three)\n"
           "keyed by this device (GPU name, SM count, capability, driver, runtime, library version, date).\n\n"
           "  --shapes S   k3 = all (default): the TP8 shapes of docs/model.md plus TP4/TP16; tp8; N,K,...;\n"
           "               or a file with one \"N K\" per line\n"
           "  --m LIST     token counts (default 1-16; at most 32)\n"
           "  --out FILE   where the table goes (default stdout), e.g. tables/sm90.txt\n"
           "  --reps R     timed replays per candidate (>= 7, default 9)\n"
           "  --note TEXT  appended to the table's note line\n"
           "Progress goes to stderr (a bar with ETA on a terminal, one line per point otherwise).\n",
           K3B_LT_ALGOS);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fmt_time(double s, char *buf, size_t size) {
    if (s < 0 || !isfinite(s)) s = 0;
    if (s > 359999) s = 359999; /* 99:59:59 */
    int t = (int)(s + 0.5);
    snprintf(buf, size, "%d:%02d", t / 60 % 10000, t % 60);
}

typedef struct progress {
    int tty;
    long total, done;
    double t0;
} progress;

static void progress_draw(const progress *pr, const char *what) {
    if (!pr->tty) return;
    const double el = now_s() - pr->t0;
    const double frac = pr->total ? (double)pr->done / (double)pr->total : 1;
    const double eta = pr->done ? el / (double)pr->done * (double)(pr->total - pr->done) : 0;
    char e1[16], e2[16], bar[31];
    fmt_time(el, e1, sizeof e1);
    fmt_time(eta, e2, sizeof e2);
    int fill = (int)(frac * 30);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    fprintf(stderr, "\r[%s] %3.0f%% %ld/%ld %-22.22s elapsed %s ETA %s ", bar, 100 * frac, pr->done, pr->total, what,
            e1, e2);
    fflush(stderr);
}

/* Prints a line above the bar (or a plain line). */
static void progress_line(const progress *pr, const char *line) {
    if (pr->tty) fprintf(stderr, "\r%-110s\r", "");
    fprintf(stderr, "%s\n", line);
}

static int write_file(const char *path, const char *text) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        fprintf(stderr, "k3 tune: cannot write '%s'\n", tmp);
        return 0;
    }
    size_t len = strlen(text);
    int ok = fwrite(text, 1, len, f) == len;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "k3 tune: writing '%s' failed\n", path);
        remove(tmp);
        return 0;
    }
    return 1;
}

int k3_cmd_tune(int argc, char **argv) {
    k3b_sweep_args sw = {"k3", "1-16", 9, 20261129};
    const char *out = NULL, *note = NULL;
    if (k3_cli_wants_help(argc, argv)) {
        tune_help();
        return K3_EXIT_OK;
    }
    for (int i = 1; i < argc; i++) {
        const int r = k3b_parse_sweep_arg(argc, argv, &i, &sw);
        if (r < 0) return K3_EXIT_USAGE;
        if (r) continue;
        if (!strcmp(argv[i], "--out")) {
            if (!(out = k3_cli_value(argc, argv, &i, "--out"))) return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--note")) {
            if (!(note = k3_cli_value(argc, argv, &i, "--note"))) return K3_EXIT_USAGE;
        } else {
            fprintf(stderr, "k3 tune: unknown option '%s' (see k3 tune --help)\n", argv[i]);
            return K3_EXIT_USAGE;
        }
    }
    if (sw.reps < 7 || sw.reps > 1000) {
        fprintf(stderr, "k3 tune: --reps must be 7..1000\n");
        return K3_EXIT_USAGE;
    }
    static k3_shape shapes[K3_SHAPES_MAX];
    const int n_shapes = k3_shapes_parse(sw.shapes, "all", 1, shapes, K3_SHAPES_MAX);
    if (!n_shapes) return K3_EXIT_USAGE;
    int64_t ms[K3_TABLE_MAX_M], max_m = 0;
    const int n_m = k3b_parse_m(sw.m, "k3 tune", K3_TABLE_MAX_M, ms, K3_TABLE_MAX_M, &max_m);
    if (!n_m) return K3_EXIT_USAGE;
    k3_ctx *ctx = k3b_open_cuda("k3 tune");
    if (!ctx) return K3_EXIT_FAIL;
    k3_status st;
    k3_arch_info a;
    k3_ctx_arch(ctx, &a);
    if (a.table == K3_TABLE_NONE) {
        fprintf(stderr, "k3 tune: %s (sm_%d) has no table slot (sm90, sm100, sm103); src/arch decides which "
                        "architectures get tables\n", a.device_name, (int)a.sm_version);
        k3_ctx_destroy(ctx);
        return K3_EXIT_FAIL;
    }
    k3_table *t = k3_table_create();
    if (!t) {
        k3_ctx_destroy(ctx);
        return K3_EXIT_FAIL;
    }
    /* the tuned table replaces the GEMM rows only: the moe and kda rows of the table this context plans with carry
     * over (the KDA and MoE choices are measured by their own benchmarks) */
    {
        const k3_table *base = NULL;
        char serr[600] = "";
        st = k3_linear_ctx_table(ctx, &base);
        if (st == K3_STATUS_SUCCESS) st = k3_table_sections_for(base, a.table, &t->moe, &t->kda, serr, sizeof serr);
        if (st != K3_STATUS_SUCCESS) {
            fprintf(stderr, "k3 tune: cannot read the current table's moe and kda rows: %s\n",
                    serr[0] ? serr : k3_ctx_last_error(ctx));
            k3_table_destroy(t);
            k3_ctx_destroy(ctx);
            return K3_EXIT_FAIL;
        }
    }

    progress pr = {isatty(2), 0, 0, now_s()};
    for (int si = 0; si < n_shapes; si++)
        for (int mi = 0; mi < n_m; mi++) {
            k3b_candidate tmp[K3B_MAX_CAND];
            pr.total += k3b_candidates(shapes[si].n, shapes[si].k, ms[mi], 1, tmp);
        }
    fprintf(stderr, "k3 tune: %s (%d SMs, capability %d.%d), %d shapes x %d M, %ld measurements, %d replays each\n",
            a.device_name, (int)a.sm_count, (int)a.cc_major, (int)a.cc_minor, n_shapes, n_m, pr.total, (int)sw.reps);

    const k3b_options bo = {(int32_t)sw.reps, 2, (uint64_t)sw.seed};
    int rc = K3_EXIT_OK, kept = 0, points = 0, incorrect = 0, undecided = 0;
    double log_gain = 0;
    for (int si = 0; si < n_shapes && rc == K3_EXIT_OK; si++) {
        const int64_t n = shapes[si].n, k = shapes[si].k;
        k3b_shape *s = NULL;
        char err[320], line[512], what[48];
        st = k3b_shape_open(ctx, n, k, max_m, &bo, &s, err, sizeof err);
        if (st != K3_STATUS_SUCCESS) {
            snprintf(line, sizeof line, "k3 tune: %lld x %lld: %s", (long long)n, (long long)k, err);
            progress_line(&pr, line);
            rc = K3_EXIT_FAIL;
            break;
        }
        for (int mi = 0; mi < n_m && rc == K3_EXIT_OK; mi++) {
            const int64_t m = ms[mi];
            k3b_candidate cand[K3B_MAX_CAND];
            const int nc = k3b_candidates(n, k, m, 1, cand);
            top2 spec = {-1, -1, 0, 0}, lt = {-1, -1, 0, 0};
            snprintf(what, sizeof what, "%lldx%lld M=%lld", (long long)n, (long long)k, (long long)m);
            for (int c = 0; c < nc; c++) {
                k3_linear_desc d;
                k3b_result r;
                k3b_candidate_desc(&cand[c], n, k, &d);
                progress_draw(&pr, what);
                k3b_measure(s, &d, m, &r);
                pr.done++;
                if (r.status == K3_STATUS_CUDA_ERROR) {
                    snprintf(line, sizeof line, "k3 tune: %s %s: CUDA error, stopping: %s", what, cand[c].config,
                             r.message);
                    progress_line(&pr, line);
                    rc = K3_EXIT_FAIL;
                    break;
                }
                if (r.status != K3_STATUS_SUCCESS) {
                    if (cand[c].kernel != K3_KERNEL_FALLBACK || r.status != K3_STATUS_INVALID_ARGUMENT) {
                        snprintf(line, sizeof line, "k3 tune: %s %s not measured: %s", what, cand[c].config,
                                 r.message);
                        progress_line(&pr, line);
                    }
                    continue;
                }
                if (!r.correct) {
                    incorrect++;
                    snprintf(line, sizeof line, "k3 tune: %s %s is INCORRECT (rel-L2 %.2e, %d NaN): excluded", what,
                             r.kernel, r.rel_l2, (int)r.nan_count);
                    progress_line(&pr, line);
                    continue;
                }
                top2_add(cand[c].kernel == K3_KERNEL_FALLBACK ? &lt : &spec, c, r.us);
            }
            if (rc != K3_EXIT_OK) break;
            k3_table_choice choice = {K3_KERNEL_AUTO, NULL, 0};
            if (lt.best < 0) {
                snprintf(line, sizeof line, "k3 tune: %s: no cuBLASLt algorithm measured; left to the default", what);
                progress_line(&pr, line);
                undecided++;
                continue;
            }
            points++;
            const int remeasured = remeasure_close_call(s, cand, n, k, m, &spec, &lt);
            const int best_spec = spec.best, best_lt = lt.best;
            const double spec_us = spec.best_us, lt_us = lt.best_us;
            if (best_spec >= 0 && lt_us >= TUNE_KEEP_RATIO * spec_us) {
                choice.kernel = cand[best_spec].kernel;
                choice.cfg = k3_gemm_config_find(choice.kernel, cand[best_spec].config);
                kept++;
                log_gain += log(lt_us / spec_us);
            } else {
                choice.kernel = K3_KERNEL_FALLBACK;
                choice.algo = cand[best_lt].config[1] - '0';
            }
            if (k3_table_set(t, n, k, m, choice) != K3_STATUS_SUCCESS) {
                progress_line(&pr, "k3 tune: internal error recording a choice");
                rc = K3_EXIT_FAIL;
                break;
            }
            char chosen[96];
            k3_table_choice_string(choice, chosen, sizeof chosen);
            snprintf(line, sizeof line, "%-22s best specialized %-22s %8.2f us | best cublaslt %s %8.2f us | -> %s%s",
                     what, best_spec >= 0 ? cand[best_spec].config : "-", spec_us, cand[best_lt].config, lt_us, chosen,
                     remeasured ? " (close: medians of 3)" : "");
            if (!pr.tty) progress_line(&pr, line);
        }
        k3b_shape_close(s);
        if (pr.tty && rc == K3_EXIT_OK) {
            snprintf(line, sizeof line, "k3 tune: %lld x %lld done", (long long)n, (long long)k);
            progress_line(&pr, line);
        }
    }
    const double elapsed = now_s() - pr.t0;
    char el[16];
    fmt_time(elapsed, el, sizeof el);
    if (pr.tty) fprintf(stderr, "\r%-110s\r", "");

    if (rc == K3_EXIT_OK) {
        /* the device key */
        snprintf(t->key.arch, sizeof t->key.arch, "%s", k3_table_name(a.table));
        snprintf(t->key.gpu, sizeof t->key.gpu, "%s", a.device_name);
        t->key.sm_count = a.sm_count;
        t->key.cc_major = a.cc_major;
        t->key.cc_minor = a.cc_minor;
        t->key.driver = a.driver_version;
        t->key.runtime = a.runtime_version;
        snprintf(t->key.library, sizeof t->key.library, "%s", k3_version());
        time_t now = time(NULL);
        struct tm tmv;
        gmtime_r(&now, &tmv);
        strftime(t->key.date, sizeof t->key.date, "%Y-%m-%d", &tmv);
        snprintf(t->key.note, sizeof t->key.note,
                 "k3 tune --shapes %s --m %s --reps %d: a kernel is kept where >= 5%% faster than the best of "
                 "cuBLASLt's top %d algorithms%s%s",
                 sw.shapes, sw.m, (int)sw.reps, K3B_LT_ALGOS, note ? "; " : "", note ? note : "");
        for (char *c = t->key.note; *c; c++)
            if (*c == '#' || *c == '\n' || *c == '\r') *c = ' '; /* '#' would start a comment */
        char *text = k3_table_format(t);
        k3_table *check = NULL;
        char err[512];
        if (!text || k3_table_parse(text, out ? out : "stdout", &check, err, sizeof err) != K3_STATUS_SUCCESS) {
            fprintf(stderr, "k3 tune: the written table does not parse back (%s): not written\n", text ? err : "oom");
            rc = K3_EXIT_FAIL;
        } else if (out) {
            if (!write_file(out, text)) rc = K3_EXIT_FAIL;
            else fprintf(stderr, "k3 tune: wrote %s\n", out);
        } else {
            fputs(text, stdout);
        }
        k3_table_destroy(check);
        free(text);
        fprintf(stderr,
                "k3 tune: %d points, a specialized kernel kept at %d (geometric-mean gain there %.2fx), "
                "%d incorrect candidates excluded; elapsed %s\n",
                points, kept, kept ? exp(log_gain / kept) : 0, incorrect, el);
        if (undecided)
            fprintf(stderr, "k3 tune: %d more points left to the default: no cuBLASLt algorithm could be measured there "
                            "to compare with (listed above)\n", undecided);
    } else {
        fprintf(stderr, "k3 tune: failed after %s; no table written\n", el);
    }
    k3_table_destroy(t);
    k3_ctx_destroy(ctx);
    return rc;
}
