/* k3 bench kda: the KDA projection overlap measured by the method of docs/benchmarks.md (graph replay, cold weights,
 * medians), in one run: overlapped, sequential with our kernels, the sequential cuBLAS chain (QKVG, F_AB, f_b)
 * and the QKVG GEMM alone, for each M. Also checks every variant against an fp64 evaluation first. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_graph.h"
#include "cli.h"
#include "cuda/kda/proj.h" /* internals: the F_AB block shapes timed one by one */

static void kda_bench_help(void) {
    printf("usage: k3 bench kda [--m LIST] [--reps R] [--json] [--table FILE [--force]] [--diag]\n\n"
           "Times, per token count M (default 1-16), on the CUDA device, at Kimi-K3 TP8 shapes\n"
           "(x [M, 7168], packed in_proj [6288, 7168], f_b [1536, 128]):\n"
           "  ov           the default (tuned) plan: on SM90 the whole projection in one launch (QKVG tiles on\n"
           "               128 SMs, F_AB then f_b on the rest); elsewhere QKVG on the caller's stream, F_AB then\n"
           "               f_b on the aux stream (fork/join)\n"
           "  alternatives the same overlap with the QKVG kernel (lt = cuBLASLt, tab = the linear plan's table)\n"
           "               and the F_AB kernel's blocks (r1 / r2: 1 / 2 output rows per hidden/16-thread block;\n"
           "               n: 128-thread blocks, one row each; s: 128-thread blocks of 16 rows x one K slice, about\n"
           "               one per SM) forced: lt-r1 lt-r2 tab-r2 tab-n tab-s; fused = the whole projection in\n"
           "               one launch (K3_KDA_RUN_N_FUSED);\n"
           "               the fastest is named at the end of the row with its margin over the fastest QKVG alone\n"
           "  sequential   the default plan's sequential path: QKVG, F_AB, f_b one after another on one stream\n"
           "               (after the one launch: the same QKVG tiles, the two-row F_AB)\n"
           "  qkvg-tab     the QKVG GEMM alone through the linear plan's table; qkvg-lt: through cuBLASLt\n"
           "  cublas       QKVG, F_AB, f_b each through cuBLASLt, one after another\n"
           "Method: each variant is captured into a CUDA graph of many back-to-back calls over enough weight\n"
           "copies to exceed 3x the L2, replayed R times (default 15); the median per-call time is reported.\n"
           "Bars (docs/benchmarks.md), for M = 1..14: overlapped <= the faster QKVG alone + 1.0 us and <= 0.75 x cublas.\n"
           "Also prints the largest M through which overlapping never loses to sequential (the tuned max_tokens)\n"
           "and the fastest alternative per M (the data of the table's kda rows, tables/<arch>.txt).\n"
           "  --table FILE   plan the QKVG GEMM from this table file (k3_ctx_load_table); --force ignores its key\n"
           "  --diag         also time, under the bench's own fork/join, the table's QKVG with a branch of: nothing\n"
           "                 (the events alone), the sliced F_AB kernel alone (M <= 8; the narrow one above), f_b\n"
           "                 alone, and both; printed minus qkvg-tab (what each part of the branch costs beside\n"
           "                 QKVG); then a timeline of direct (not captured) calls of both: when QKVG, F_AB and\n"
           "                 f_b finish after the fork\n"
           "All variants of one M are timed in one interleaved run (replay r of each before replay r + 1 of any).\n");
}

#ifndef K3_HAVE_CUDA
int k3_bench_kda(int argc, char **argv) {
    if (k3_cli_wants_help(argc, argv)) {
        kda_bench_help();
        return K3_EXIT_OK;
    }
    fprintf(stderr, "k3 bench kda: this build has no CUDA backend\n");
    return K3_EXIT_FAIL;
}
#else
#include <cuda_runtime.h>

enum { KB_H = 7168, KB_Q = 6144, KB_F = 144, KB_G = 1536, KB_P = 6288, KB_MT = 16 };

typedef struct kda_bench {
    k3_ctx *ctx;
    int64_t m;
    int32_t copies;
    uint16_t **w, **wfb; /* device weight copies */
    uint16_t *x, *qkvg, *fab, *g1;
    void *ws;
    size_t ws_bytes;
    k3_kda_proj_plan *def, *seq; /* the default (tuned) plan overlapped at every M, and sequential */
    k3_linear_plan *qkvg_plan, *lt_qkvg, *lt_fab, *lt_fb;
    cudaStream_t aux; /* --diag: the bench's own fork/join (an aux stream at the default priority, as the bench's) */
    k3_cuda_kda_sliced *sliced; /* --diag: the sliced F_AB kernel's state */
    cudaEvent_t fork, join;
    cudaEvent_t ts[4]; /* --diag trace (timing events, direct launches): fork, QKVG done, F_AB done, f_b done */
    int trace;         /* call_fj records ts[] */
} kda_bench;

/* The overlapped alternatives the tuning chooses between: the QKVG kernel x the F_AB kernel's shape (r1 / r2 = one
 * or two rows per hidden / 16-thread block; n = the narrow 128-thread blocks, one row each; s = the sliced ones),
 * and the whole projection in one launch (fused). */
enum { KB_ALTS = 6 };
typedef struct kda_alt {
    kda_bench *b;
    k3_kda_proj_plan *plan;
    const char *name;
    k3_kda_qkvg qkvg_kernel;
    k3_kda_run_n run_n_shape;
} kda_alt;
static const kda_alt kb_alt_init[KB_ALTS] = {
    {NULL, NULL, "lt-r1", K3_KDA_QKVG_CUBLASLT, K3_KDA_RUN_N_ROWS1},
    {NULL, NULL, "lt-r2", K3_KDA_QKVG_CUBLASLT, K3_KDA_RUN_N_ROWS2},
    {NULL, NULL, "tab-r2", K3_KDA_QKVG_TABLE, K3_KDA_RUN_N_ROWS2},
    {NULL, NULL, "tab-n", K3_KDA_QKVG_TABLE, K3_KDA_RUN_N_NARROW},
    {NULL, NULL, "tab-s", K3_KDA_QKVG_TABLE, K3_KDA_RUN_N_SLICED},
    {NULL, NULL, "fused", K3_KDA_QKVG_TABLE, K3_KDA_RUN_N_FUSED},
};

static k3_status report(kda_bench *b, k3_status st, const char *what) {
    if (st != K3_STATUS_SUCCESS)
        fprintf(stderr, "k3 bench kda: %s: %s: %s\n", what, k3_status_string(st), k3_ctx_last_error(b->ctx));
    return st;
}

#define KB_CALL_ARGS void *u, int32_t c, void *s, char *err, size_t err_size

/* One projection through plan p / one QKVG GEMM through plan q, with weight copy c; report() prints the
 * context's message on failure. */
static k3_status run_kda(kda_bench *b, k3_kda_proj_plan *p, int32_t c, void *s, const char *what) {
    return report(b, k3_kda_proj_run(p, b->m, b->x, b->w[c], b->wfb[c], b->qkvg, b->fab, b->g1, b->ws, b->ws_bytes, s),
                  what);
}
static k3_status run_qkvg(kda_bench *b, k3_linear_plan *q, int32_t c, void *s, const char *what) {
    return report(b, k3_linear_run(q, b->m, b->x, b->w[c], NULL, b->qkvg, b->ws, b->ws_bytes, s), what);
}
#define KB_UNUSED_ERR (void)err, (void)err_size
static k3_status call_overlap(KB_CALL_ARGS) {
    KB_UNUSED_ERR;
    return run_kda((kda_bench *)u, ((kda_bench *)u)->def, c, s, "overlapped");
}
static k3_status call_alt(KB_CALL_ARGS) { /* u: a kda_alt */
    KB_UNUSED_ERR;
    return run_kda(((kda_alt *)u)->b, ((kda_alt *)u)->plan, c, s, ((kda_alt *)u)->name);
}
static k3_status call_seq(KB_CALL_ARGS) {
    KB_UNUSED_ERR;
    return run_kda((kda_bench *)u, ((kda_bench *)u)->seq, c, s, "sequential");
}
static k3_status call_qkvg(KB_CALL_ARGS) {
    KB_UNUSED_ERR;
    return run_qkvg((kda_bench *)u, ((kda_bench *)u)->qkvg_plan, c, s, "qkvg");
}
static k3_status call_qkvg_lt(KB_CALL_ARGS) {
    KB_UNUSED_ERR;
    return run_qkvg((kda_bench *)u, ((kda_bench *)u)->lt_qkvg, c, s, "qkvg (cuBLASLt)");
}
static k3_status call_cublas(KB_CALL_ARGS) {
    kda_bench *b = (kda_bench *)u;
    (void)err, (void)err_size; /* report() prints the context's message */
    k3_status st = k3_linear_run(b->lt_qkvg, b->m, b->x, b->w[c], NULL, b->qkvg, b->ws, b->ws_bytes, s);
    if (st == K3_STATUS_SUCCESS)
        st = k3_linear_run(b->lt_fab, b->m, b->x, b->w[c] + (size_t)KB_Q * KB_H, NULL, b->fab, b->ws, b->ws_bytes, s);
    if (st == K3_STATUS_SUCCESS)
        st = k3_linear_run(b->lt_fb, b->m, b->fab, b->wfb[c], NULL, b->g1, b->ws, b->ws_bytes, s);
    return report(b, st, "cublas chain");
}

/* --diag variants: what each part of the branch costs beside the table's QKVG. QKVG (the linear plan's table) is
 * queued first on the caller's stream, as the library does; the branch runs on the bench's own aux stream (at the
 * bench stream's priority, as the library's fork sets it) after a fork event and is joined back: nothing (the
 * events alone), the F_AB kernel alone (sliced at M <= 8, narrow above), f_b alone (reading whatever fab holds:
 * timing only), or both (the library's overlap with that shape). */
enum { FJ_FAB = 1, FJ_FB = 2 };

static k3_status call_fj(kda_bench *b, int32_t c, cudaStream_t s, int parts, char *err, size_t err_size) {
    k3_status st = K3_STATUS_SUCCESS;
    if (cudaEventRecord(b->fork, s) != cudaSuccess || (b->trace && cudaEventRecord(b->ts[0], s) != cudaSuccess))
        goto cuda_fail;
    st = k3_linear_run(b->qkvg_plan, b->m, b->x, b->w[c], NULL, b->qkvg, b->ws, b->ws_bytes, s);
    if (st) return report(b, st, "diag");
    if ((b->trace && cudaEventRecord(b->ts[1], s) != cudaSuccess) ||
        cudaStreamWaitEvent(b->aux, b->fork, 0) != cudaSuccess)
        goto cuda_fail;
    const int32_t shape = !(parts & FJ_FAB) ? 0 : b->m <= 8 ? K3_KDA_RUN_N_SLICED : K3_KDA_RUN_N_NARROW;
    if (shape) st = k3_cuda_kda_run_n(b->ctx, b->m, b->x, KB_H, b->w[c] + (size_t)KB_Q * KB_H, KB_F, shape, b->sliced,
                                      b->fab, b->aux);
    if (!st && b->trace && cudaEventRecord(b->ts[2], b->aux) != cudaSuccess) goto cuda_fail;
    if (!st && (parts & FJ_FB))
        st = k3_cuda_kda_run_k(b->ctx, b->m, b->fab, KB_F, b->wfb[c], KB_G, shape, b->g1, b->aux);
    if (!st && b->trace && cudaEventRecord(b->ts[3], b->aux) != cudaSuccess) goto cuda_fail;
    if (st) return report(b, st, "diag");
    if (cudaEventRecord(b->join, b->aux) != cudaSuccess || cudaStreamWaitEvent(s, b->join, 0) != cudaSuccess)
        goto cuda_fail;
    return K3_STATUS_SUCCESS;
cuda_fail:
    snprintf(err, err_size, "diag fork/join: %s", cudaGetErrorString(cudaGetLastError()));
    return K3_STATUS_CUDA_ERROR;
}
static k3_status call_fj_none(KB_CALL_ARGS) { return call_fj((kda_bench *)u, c, (cudaStream_t)s, 0, err, err_size); }
static k3_status call_fj_fab(KB_CALL_ARGS) {
    return call_fj((kda_bench *)u, c, (cudaStream_t)s, FJ_FAB, err, err_size);
}
static k3_status call_fj_fb(KB_CALL_ARGS) { return call_fj((kda_bench *)u, c, (cudaStream_t)s, FJ_FB, err, err_size); }
static k3_status call_fj_both(KB_CALL_ARGS) {
    return call_fj((kda_bench *)u, c, (cudaStream_t)s, FJ_FAB | FJ_FB, err, err_size);
}

static double bf(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* rel-L2 of the m x cols bf16 block (row stride ld, from column c0) vs doubles (row stride ldr). */
static double rel_l2(int64_t m, int64_t c0, int64_t cols, const uint16_t *y, int64_t ld, const double *r, int64_t ldr) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = c0; j < c0 + cols; j++) {
            /* vs the reference rounded to the output's bf16: the kernel's own error, not the output rounding */
            const double v = bf(y[i * ld + j]), e = bf(k3_bf16_from_f32((float)r[i * ldr + j]));
            if (v != v) return INFINITY;
            num += (v - e) * (v - e);
            den += e * e;
        }
    return sqrt(num / (den > 0 ? den : 1));
}

/* Checks the outputs left in b's buffers for m tokens (weights copy 0) against the fp64 reference. */
static int check_outputs(kda_bench *b, const char *what, const double *rq, const double *rf, const double *rg) {
    const int64_t m = b->m;
    uint16_t *q = malloc(2 * m * KB_Q), *f = malloc(2 * m * KB_F), *g = malloc(2 * m * KB_G);
    int ok = q && f && g && cudaMemcpy(q, b->qkvg, 2 * m * KB_Q, cudaMemcpyDeviceToHost) == cudaSuccess &&
             cudaMemcpy(f, b->fab, 2 * m * KB_F, cudaMemcpyDeviceToHost) == cudaSuccess &&
             cudaMemcpy(g, b->g1, 2 * m * KB_G, cudaMemcpyDeviceToHost) == cudaSuccess;
    if (ok) {
        const double eq = rel_l2(m, 0, KB_Q, q, KB_Q, rq, KB_Q), eb = rel_l2(m, 0, 140, f, KB_F, rf, KB_F),
                     eg = rel_l2(m, 0, KB_G, g, KB_G, rg, KB_G);
        ok = eq <= 2e-3 && eb <= 2e-3 && eg <= 2e-3;
        if (!ok)
            fprintf(stderr, "k3 bench kda: %s m=%lld FAILED the check: rel-L2 qkvg %.3g fab %.3g g1 %.3g\n", what,
                    (long long)m, eq, eb, eg);
    }
    free(q), free(f), free(g);
    return ok;
}

/* Runs variant v once on weight copy 0 and checks its outputs (err receives a failed call's reason). */
static int variant_correct(kda_bench *b, const k3_bench_variant *v, cudaStream_t s, const char *what, const double *rq,
                           const double *rf, const double *rg, char *err, size_t err_size) {
    return v->fn(v->user, 0, s, err, err_size) == K3_STATUS_SUCCESS &&
           k3_bench_sync(s, err, err_size) == K3_STATUS_SUCCESS && check_outputs(b, what, rq, rf, rg);
}

static void reference(const uint16_t *x, const uint16_t *w, const uint16_t *wfb, double *rq, double *rf,
                      double *rg) {
    for (int i = 0; i < KB_MT; i++) {
        for (int r = 0; r < KB_P; r++) {
            double s = 0;
            for (int k = 0; k < KB_H; k++) s += bf(x[i * KB_H + k]) * bf(w[(size_t)r * KB_H + k]);
            if (r < KB_Q) rq[i * KB_Q + r] = s;
            else rf[i * KB_F + r - KB_Q] = s;
        }
        for (int r = 0; r < KB_G; r++) {
            double s = 0;
            for (int k = 0; k < 128; k++)
                s += bf(k3_bf16_from_f32((float)rf[i * KB_F + k])) * bf(wfb[r * 128 + k]);
            rg[i * KB_G + r] = s;
        }
    }
}

int k3_bench_kda(int argc, char **argv) {
    int64_t ms[64];
    int nm = 16, json = 0;
    int64_t reps = 15;
    const char *table = NULL;
    int force = 0, diag = 0;
    for (int i = 0; i < 16; i++) ms[i] = i + 1;
    if (k3_cli_wants_help(argc, argv)) {
        kda_bench_help();
        return K3_EXIT_OK;
    }
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--m")) {
            if (!(v = k3_cli_value(argc, argv, &i, "--m")) || !(nm = k3_cli_parse_list(v, "--m", ms, 64)))
                return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--reps")) {
            if (!(v = k3_cli_value(argc, argv, &i, "--reps")) || !k3_cli_parse_i64(v, "--reps", &reps))
                return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--table")) {
            if (!(table = k3_cli_value(argc, argv, &i, "--table"))) return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--force")) {
            force = 1;
        } else if (!strcmp(argv[i], "--diag")) {
            diag = 1;
        } else {
            fprintf(stderr, "k3 bench kda: unknown option '%s' (see k3 bench kda --help)\n", argv[i]);
            return K3_EXIT_USAGE;
        }
    }
    for (int i = 0; i < nm; i++)
        if (ms[i] < 1 || ms[i] > 16) {
            fprintf(stderr, "k3 bench kda: --m values must be in 1..16\n");
            return K3_EXIT_USAGE;
        }
    if (reps < 3 || reps > 1000) {
        fprintf(stderr, "k3 bench kda: --reps must be in 3..1000\n");
        return K3_EXIT_USAGE;
    }
    kda_bench b;
    kda_alt alts[KB_ALTS];
    memcpy(alts, kb_alt_init, sizeof alts);
    memset(&b, 0, sizeof b);
    if (!(b.ctx = k3_cli_ctx("cuda"))) return K3_EXIT_FAIL;
    if (table && k3_ctx_load_table(b.ctx, table, force) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 bench kda: %s\n", k3_ctx_last_error(b.ctx));
        k3_ctx_destroy(b.ctx);
        return K3_EXIT_FAIL;
    }
    k3_arch_info arch;
    k3_ctx_arch(b.ctx, &arch);
    const size_t wbytes = (size_t)2 * KB_P * KB_H, fbbytes = 2 * KB_G * 128;
    b.copies = k3_bench_cold_copies((double)(wbytes + fbbytes), arch.l2_bytes);
    b.w = calloc((size_t)b.copies, sizeof *b.w);
    b.wfb = calloc((size_t)b.copies, sizeof *b.wfb);
    uint16_t *hx = malloc(2 * KB_MT * KB_H), *hw = malloc(wbytes), *hfb = malloc(fbbytes);
    double *rq = malloc(sizeof(double) * KB_MT * KB_Q), *rf = malloc(sizeof(double) * KB_MT * KB_F),
           *rg = malloc(sizeof(double) * KB_MT * KB_G);
    int rc = K3_EXIT_FAIL;
    if (!b.w || !b.wfb || !hx || !hw || !hfb || !rq || !rf || !rg) goto done;
    uint64_t st64 = 0x6b33u;
    for (size_t i = 0; i < (size_t)KB_P * KB_H + KB_MT * KB_H + KB_G * 128; i++) {
        st64 = st64 * 6364136223846793005ull + 1442695040888963407ull; /* LCG: fast, fixed seed */
        const float u = (float)((st64 >> 40) * (2.0 / 16777216.0) - 1.0);
        if (i < (size_t)KB_P * KB_H) hw[i] = k3_bf16_from_f32(0.02f * u);
        else if (i < (size_t)KB_P * KB_H + KB_MT * KB_H) hx[i - (size_t)KB_P * KB_H] = k3_bf16_from_f32(u);
        else hfb[i - (size_t)KB_P * KB_H - KB_MT * KB_H] = k3_bf16_from_f32(0.1f * u);
    }
    for (int32_t c = 0; c < b.copies; c++) {
        if (cudaMalloc((void **)&b.w[c], wbytes) != cudaSuccess || cudaMalloc((void **)&b.wfb[c], fbbytes) != cudaSuccess ||
            cudaMemcpy(b.w[c], hw, wbytes, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(b.wfb[c], hfb, fbbytes, cudaMemcpyHostToDevice) != cudaSuccess) {
            fprintf(stderr, "k3 bench kda: device allocation/copy of weight copy %d failed\n", (int)c);
            goto done;
        }
    }
    if (cudaMalloc((void **)&b.x, 2 * KB_MT * KB_H) != cudaSuccess ||
        cudaMalloc((void **)&b.qkvg, 2 * KB_MT * KB_Q) != cudaSuccess ||
        cudaMalloc((void **)&b.fab, 2 * KB_MT * KB_F) != cudaSuccess ||
        cudaMalloc((void **)&b.g1, 2 * KB_MT * KB_G) != cudaSuccess ||
        cudaMemcpy(b.x, hx, 2 * KB_MT * KB_H, cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "k3 bench kda: device allocation failed\n");
        goto done;
    }
    {
        k3_kda_proj_desc d;
        k3_kda_proj_desc_init(&d);
        d.overlap_max_tokens = 16; /* measure the overlap at every M; the tuned threshold is the output */
        k3_kda_proj_desc ds = d;
        ds.overlap_max_tokens = 0;
        k3_linear_desc lq, lf, lg;
        k3_linear_desc_init(&lq, KB_Q, KB_H);
        k3_linear_desc_init(&lf, KB_F, KB_H);
        k3_linear_desc_init(&lg, KB_G, 128);
        lg.x_stride = KB_F;
        k3_linear_plan *qp = NULL;
        if (report(&b, k3_kda_proj_plan_create(b.ctx, &d, &b.def), "plan") ||
            report(&b, k3_kda_proj_plan_create(b.ctx, &ds, &b.seq), "plan") ||
            report(&b, k3_linear_plan_create(b.ctx, &lq, &qp), "plan"))
            goto done;
        for (int a = 0; a < KB_ALTS; a++) {
            k3_kda_proj_desc da = d;
            alts[a].b = &b;
            da.qkvg_kernel = alts[a].qkvg_kernel;
            da.run_n_shape = alts[a].run_n_shape;
            if (report(&b, k3_kda_proj_plan_create(b.ctx, &da, &alts[a].plan), "plan")) goto done;
        }
        b.qkvg_plan = qp;
        lq.force_kernel = lf.force_kernel = lg.force_kernel = K3_KERNEL_FALLBACK;
        if (report(&b, k3_linear_plan_create(b.ctx, &lq, &b.lt_qkvg), "plan") ||
            report(&b, k3_linear_plan_create(b.ctx, &lf, &b.lt_fab), "plan") ||
            report(&b, k3_linear_plan_create(b.ctx, &lg, &b.lt_fb), "plan"))
            goto done;
        size_t all[6 + KB_ALTS] = {0}, mx = 0;
        k3_kda_proj_workspace_size(b.def, &all[0]);
        k3_kda_proj_workspace_size(b.seq, &all[1]);
        k3_linear_workspace_size(b.qkvg_plan, &all[2]);
        k3_linear_workspace_size(b.lt_qkvg, &all[3]);
        k3_linear_workspace_size(b.lt_fab, &all[4]);
        k3_linear_workspace_size(b.lt_fb, &all[5]);
        for (int a = 0; a < KB_ALTS; a++) k3_kda_proj_workspace_size(alts[a].plan, &all[6 + a]);
        for (int i = 0; i < 6 + KB_ALTS; i++) mx = all[i] > mx ? all[i] : mx;
        if (diag) {
            if (cudaStreamCreateWithFlags(&b.aux, cudaStreamNonBlocking) != cudaSuccess ||
                cudaEventCreateWithFlags(&b.fork, cudaEventDisableTiming) != cudaSuccess ||
                cudaEventCreateWithFlags(&b.join, cudaEventDisableTiming) != cudaSuccess ||
                cudaEventCreate(&b.ts[0]) != cudaSuccess || cudaEventCreate(&b.ts[1]) != cudaSuccess ||
                cudaEventCreate(&b.ts[2]) != cudaSuccess || cudaEventCreate(&b.ts[3]) != cudaSuccess) {
                fprintf(stderr, "k3 bench kda: --diag: creating the aux streams or events failed\n");
                goto done;
            }
            if (report(&b, k3_cuda_kda_sliced_create(b.ctx, KB_H, KB_F, &b.sliced), "diag")) goto done;
        }
        b.ws_bytes = mx;
        if (mx && cudaMalloc(&b.ws, mx) != cudaSuccess) goto done;
    }
    fprintf(stderr, "k3 bench kda: fp64 reference for %d tokens (a few seconds)...\n", KB_MT);
    reference(hx, hw, hfb, rq, rf, rg);

    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) goto done;
    char kname[128] = "";
    k3_linear_plan_kernel(b.qkvg_plan, 1, kname, sizeof kname);
    if (!json) {
        printf("k3 bench kda on %s (sm_%d), %d weight copies (%.0f MB), %lld replays, median us per call\n",
               arch.device_name, (int)arch.sm_version, (int)b.copies, b.copies * (wbytes + fbbytes) / 1e6,
               (long long)reps);
        printf("%3s %8s", "M", "ov");
        for (int a = 0; a < KB_ALTS; a++) printf(" %8s", alts[a].name);
        printf(" %11s %9s %9s %9s %9s %9s %s\n", "sequential", "qkvg-tab", "qkvg-lt", "cublas", "ov-qkvg", "ov/cublas",
               "bars (M<=14: ov<=qkvg+1.0, ov<=0.75 cublas; qkvg = faster of qkvg-tab/-lt)  fastest overlap");
    } else
        printf("{\"device\": \"%s\", \"copies\": %d, \"rows\": [", arch.device_name, (int)b.copies);
    int all_ok = 1, tuned_max = 0, still_wins = 1;
    const int32_t calls = b.copies * 8;
    for (int i = 0; i < nm; i++) {
        b.m = ms[i];
        const k3_bench_timing tm = {b.copies, calls, 3, (int32_t)reps};
        /* 0 ov, 1 sequential, 2 qkvg-tab, 3 qkvg-lt, 4 cublas, 5.. the alternatives, then the --diag four */
        enum { KB_NV = 5 + KB_ALTS + 4 };
        k3_bench_variant v[KB_NV] = {{call_overlap, &b}, {call_seq, &b}, {call_qkvg, &b}, {call_qkvg_lt, &b},
                                     {call_cublas, &b}};
        for (int a = 0; a < KB_ALTS; a++) v[5 + a] = (k3_bench_variant){call_alt, &alts[a]};
        const k3_bench_variant dv[4] = {{call_fj_none, &b}, {call_fj_fab, &b}, {call_fj_fb, &b}, {call_fj_both, &b}};
        for (int j = 0; j < 4; j++) v[5 + KB_ALTS + j] = dv[j];
        /* correctness of each variant that writes all three outputs, on copy 0, before timing */
        char err[320] = "";
        int ok = variant_correct(&b, &v[0], s, "overlapped", rq, rf, rg, err, sizeof err);
        for (int a = 0; a < KB_ALTS; a++)
            ok = ok && variant_correct(&b, &v[5 + a], s, alts[a].name, rq, rf, rg, err, sizeof err);
        ok = ok && variant_correct(&b, &v[1], s, "sequential", rq, rf, rg, err, sizeof err) &&
             variant_correct(&b, &v[4], s, "cublas", rq, rf, rg, err, sizeof err) &&
             (!diag || variant_correct(&b, &v[KB_NV - 1], s, "diag both", rq, rf, rg, err, sizeof err));
        double t[KB_NV];
        if (!ok || k3_bench_graph_time_n(v, diag ? KB_NV : KB_NV - 4, &tm, s, t, err, sizeof err)) {
            if (err[0]) fprintf(stderr, "k3 bench kda: m=%lld: %s\n", (long long)b.m, err);
            goto done;
        }
        const double t_ov = t[0], t_seq = t[1], t_qt = t[2], t_ql = t[3], t_lt = t[4], *t_alt = t + 5;
        const double t_q = t_qt < t_ql ? t_qt : t_ql; /* the bar holds the overlap to the fastest QKVG alone */
        int best = 0;
        for (int a = 1; a < KB_ALTS; a++) best = t_alt[a] < t_alt[best] ? a : best;
        const int bar1 = t_ov <= t_q + 1.0, bar2 = t_ov <= 0.75 * t_lt, in_scope = b.m <= 14;
        if (in_scope && !(bar1 && bar2)) all_ok = 0;
        if (still_wins && t_ov <= t_seq) tuned_max = (int)b.m;
        else still_wins = 0;
        if (json) {
            printf("%s{\"m\": %lld, \"overlapped_us\": %.3f, \"sequential_us\": %.3f, \"qkvg_table_us\": %.3f, "
                   "\"qkvg_cublaslt_us\": %.3f, \"cublas_chain_us\": %.3f, \"alternatives_us\": {",
                   i ? ", " : "", (long long)b.m, t_ov, t_seq, t_qt, t_ql, t_lt);
            for (int a = 0; a < KB_ALTS; a++) printf("%s\"%s\": %.3f", a ? ", " : "", alts[a].name, t_alt[a]);
            printf("}}");
        } else {
            printf("%3lld %8.2f", (long long)b.m, t_ov);
            for (int a = 0; a < KB_ALTS; a++) printf(" %8.2f", t_alt[a]);
            printf(" %11.2f %9.2f %9.2f %9.2f %+9.2f %9.3f %-24s %s %+.2f\n", t_seq, t_qt, t_ql, t_lt, t_ov - t_q,
                   t_ov / t_lt,
                   !in_scope ? "(not in scope)" : (bar1 && bar2) ? "PASS" : !bar1 ? "FAIL (ov > qkvg + 1.0)" :
                                                                                    "FAIL (ov > 0.75 cublas)",
                   alts[best].name, t_alt[best] - t_q);
        }
        const double *td = t + 5 + KB_ALTS;
        if (diag && json)
            printf(", {\"m\": %lld, \"diag_us\": {\"none\": %.3f, \"fab\": %.3f, \"fb\": %.3f, \"both\": %.3f}}",
                   (long long)b.m, td[0], td[1], td[2], td[3]);
        else if (diag)
            printf("    diag M=%lld, table QKVG first, minus qkvg-tab: "
                   "branch none %+.2f  fab %+.2f  fb %+.2f  both %+.2f us\n",
                   (long long)b.m, td[0] - t_qt, td[1] - t_qt, td[2] - t_qt, td[3] - t_qt);
        if (diag && !json) { /* a timeline of the last of `calls` direct (not captured) calls of "both" */
            float e[3] = {0, 0, 0};
            b.trace = 1;
            for (int32_t c = 0; c < calls && ok; c++)
                ok = call_fj(&b, c % b.copies, s, FJ_FAB | FJ_FB, err, sizeof err) == K3_STATUS_SUCCESS;
            b.trace = 0;
            ok = ok && cudaStreamSynchronize(s) == cudaSuccess;
            for (int j = 0; j < 3 && ok; j++) ok = cudaEventElapsedTime(&e[j], b.ts[0], b.ts[j + 1]) == cudaSuccess;
            if (!ok) {
                fprintf(stderr, "k3 bench kda: m=%lld: diag trace failed: %s\n", (long long)b.m, err);
                goto done;
            }
            printf("    trace M=%lld (direct launches, from the fork): "
                   "QKVG done %.2f  F_AB done %.2f  f_b done %.2f us\n",
                   (long long)b.m, 1000.0 * e[0], 1000.0 * e[1], 1000.0 * e[2]);
        }
    }
    if (json)
        printf("], \"overlap_never_loses_through\": %d, \"bars_pass\": %s}\n", tuned_max, all_ok ? "true" : "false");
    else {
        printf("QKVG kernel of the linear plan's table at M=1 (qkvg-tab, tab-*): %s\n", kname);
        printf("overlap never slower than sequential for M = 1..%d (measured M in order; tuned max_tokens)\n",
               tuned_max);
        printf("bars for M <= 14 (ov, the default plan): %s\n", all_ok ? "PASS" : "FAIL");
    }
    cudaStreamDestroy(s);
    rc = all_ok ? K3_EXIT_OK : K3_EXIT_FAIL;
done:
    k3_kda_proj_plan_destroy(b.def);
    k3_kda_proj_plan_destroy(b.seq);
    for (int a = 0; a < KB_ALTS; a++) k3_kda_proj_plan_destroy(alts[a].plan);
    k3_linear_plan_destroy(b.qkvg_plan);
    k3_linear_plan_destroy(b.lt_qkvg);
    k3_linear_plan_destroy(b.lt_fab);
    k3_linear_plan_destroy(b.lt_fb);
    k3_cuda_kda_sliced_destroy(b.sliced);
    if (b.fork) cudaEventDestroy(b.fork);
    if (b.join) cudaEventDestroy(b.join);
    if (b.aux) cudaStreamDestroy(b.aux);
    for (int i = 0; i < 4; i++)
        if (b.ts[i]) cudaEventDestroy(b.ts[i]);
    for (int32_t c = 0; b.w && c < b.copies; c++) cudaFree(b.w[c]);
    for (int32_t c = 0; b.wfb && c < b.copies; c++) cudaFree(b.wfb[c]);
    cudaFree(b.x), cudaFree(b.qkvg), cudaFree(b.fab), cudaFree(b.g1), cudaFree(b.ws);
    free(b.w), free(b.wfb), free(hx), free(hw), free(hfb), free(rq), free(rf), free(rg);
    k3_ctx_destroy(b.ctx);
    return rc;
}
#endif
