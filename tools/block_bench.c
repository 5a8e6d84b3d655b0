/* k3 bench block: the whole latent-MoE block (k3_latent_moe_run) as docs/benchmarks.md says (CUDA graph replay of
 * back-to-back calls, weights rotated through copies larger than the L2, medians), with its bytes against the HBM
 * read ceiling, and each stage timed alone in the same run (router, down, experts, norm+up, shared), their replays
 * interleaved with the block's, so the cost of composing them is a printed number. */
#include <stdlib.h>
#include <string.h>

#include "bench_graph.h"
#include "block_bench.h"
#include "block_synth.h"
#include "cli.h"
#include "plan/latent_tuning.h"

static void block_bench_help(void) {
    printf("usage: k3 bench block [--config tp8|ep16] [--m LIST] [--reps R] [--schedule S] [--json]\n"
           "       k3 bench block --tp N | --ep N [--config tp8|ep16] [--m LIST] [--reps R] [--json]\n\n"
           "Times the Kimi-K3 latent-MoE block (k3_latent_moe_run: router, down projection, routed experts, RMSNorm,\n"
           "up projection adding the shared experts' output from the aux stream; no residual) on one GPU, per\n"
           "token count M:\n"
           "  tp8   one TP8 rank: H 7168, 896 NVFP4 experts top-16 with L 3584 and I 384, shared Is 768 (default)\n"
           "  ep16  one EP16 rank: the router over 896 experts, 56 whole experts here (I 3072, expert map),\n"
           "        shared Is 384; tokens replicated\n"
           "and, in the same run, each stage alone: the router; the down projection; the routed experts on the\n"
           "block's routing; norm+up (the shared output rounded, RMSNorm, and the up projection that adds it: the\n"
           "POST_REDUCE stage); the shared experts' two projections through BF16 linear plans (the block's shared\n"
           "down writes fp32; their activation, about a microsecond, left out). The stages' sum beside the\n"
           "block's time is the composition cost (the shared experts overlap the routed path in the block, so the\n"
           "sum can exceed it); 'x main' is the block over the main path's stages alone (router + down + experts +\n"
           "norm+up: the shared experts hidden, the composition bar's ratio). Bytes = router gate + down + up +\n"
           "shared + the distinct experts the routing touches (weights and block scales) + x + y; %% of the floor =\n"
           "bytes / 4.37 TB/s over the block's time.\n"
           "Method: calls captured into a CUDA graph over weight copies exceeding 3x the L2, replayed R times\n"
           "(default 11), the six variants' replays interleaved, median per call.\n"
           "  --config C   tp8 (default) or ep16\n"
           "  --m LIST     token counts (default 1,2,4,8,16; 1..%d, at most %d values)\n"
           "  --reps R     graph replays per point (7..1000)\n"
           "  --schedule S the block's stream schedule (k3_latent_schedule): auto (default: the plan's choice),\n"
           "               shared-beside, router-beside, serial, select-beside or logits-first; the stages are\n"
           "               timed alone either way\n"
           "  --table FILE plan the block's BF16 GEMMs from this table file (k3_ctx_load_table; e.g. to compare two\n"
           "               tables in one call); --force loads it whatever its device key\n"
           "  --json       one JSON object: a row per M with every column\n\n"
           "--tp N / --ep N: the block on N GPUs (0..N-1), one host thread each with its own context, stream and\n"
           "plan whose k3_parallel_desc holds that rank's NCCL communicator (made here by ncclCommInitAll), so the\n"
           "block reduces its fp32 partial across the ranks itself (library-driven). Each rank is the K3 TP-N shard\n"
           "(all 896 experts with I = 3072 / N, shared Is = 6144 / N) or EP-N shard (896 / N whole experts with\n"
           "I 3072 and an expert map, Is = 6144 / N); with --config the rank has that shape instead (tp8 or ep16:\n"
           "--tp 1 --config tp8 is the TP8 rank on one GPU with a one-rank communicator). Every rank captures its\n"
           "graph of back-to-back calls; the replays start on all ranks together (a barrier before each), are\n"
           "timed on every rank with events, and the slowest rank's median per call is reported for: the block\n"
           "with NCCL; the same rank's block without a communicator (layout NONE, the one-GPU slice); a bare\n"
           "ncclAllReduce (fp32 sum, in place) of the block's partial (k3_latent_moe_partial_count floats),\n"
           "captured the same way. reduction = block with NCCL - block without; ratio = reduction / all-reduce.\n"
           "NCCL_NVLS_ENABLE is set to 0 (NVLink SHARP / multicast off) unless the environment already sets it.\n"
           "Needs N GPUs, a build with CUDA and nccl.h, and libnccl.so.2 at run time (else exit 1).\n"
           "  --tp N       N tensor-parallel ranks (1..64; 3072 / N a multiple of 16 and 6144 / N whole)\n"
           "  --ep N       N expert-parallel ranks (1..64; N divides 896 and 6144)\n"
           "exit status: 0 measured, 1 failure (no GPU, fewer GPUs than ranks, no NCCL, a CUDA error), 2 usage\n",
           BB_MAX_M, BB_MAX_LIST);
#ifdef K3_MOE_TRACE
    printf("This build traces the MoE kernels (-DK3_MOE_TRACE):\n"
           "  --trace W    after each point, W (block or experts) replayed once more and the per-block stamps of\n"
           "               GEMM1, GEMM2 and the combine of its last call printed to stderr\n");
#endif
}

const char *k3_bench_schedule_name(k3_latent_schedule s) {
    switch (s) {
    case K3_LATENT_SCHEDULE_AUTO: return "auto";
    case K3_LATENT_SCHEDULE_SHARED_BESIDE: return "shared-beside";
    case K3_LATENT_SCHEDULE_ROUTER_BESIDE: return "router-beside";
    case K3_LATENT_SCHEDULE_SERIAL: return "serial";
    case K3_LATENT_SCHEDULE_SELECT_BESIDE: return "select-beside";
    case K3_LATENT_SCHEDULE_LOGITS_FIRST: return "logits-first";
    }
    return "?";
}

static int bb_parse(int argc, char **argv, bb_opts *o) {
    static const int64_t def_ms[] = {1, 2, 4, 8, 16};
    memset(o, 0, sizeof *o);
    memcpy(o->ms, def_ms, sizeof def_ms);
    o->nm = 5, o->reps = 11;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--json")) o->json = 1;
        else if (!strcmp(argv[i], "--force")) o->force = 1;
        else if (!strcmp(argv[i], "--table")) {
            if (!(o->table = k3_cli_value(argc, argv, &i, "--table"))) return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--schedule")) {
            if (!(v = k3_cli_value(argc, argv, &i, "--schedule"))) return K3_EXIT_USAGE;
            o->schedule = -1;
            for (int s = K3_LATENT_SCHEDULE_AUTO; s <= K3_LATENT_SCHEDULE_LAST; s++)
                if (!strcmp(v, k3_bench_schedule_name((k3_latent_schedule)s))) o->schedule = s;
            if (o->schedule < 0) {
                fprintf(stderr, "k3 bench block: --schedule must be auto, shared-beside, router-beside, serial, select-beside or "
                        "logits-first (got "
                        "'%s')\n", v);
                return K3_EXIT_USAGE;
            }
        } else if (!strcmp(argv[i], "--config")) {
            if (!(v = k3_cli_value(argc, argv, &i, "--config"))) return K3_EXIT_USAGE;
            if (!strcmp(v, "tp8")) o->ep = 0;
            else if (!strcmp(v, "ep16")) o->ep = 1;
            else {
                fprintf(stderr, "k3 bench block: --config must be tp8 or ep16 (got '%s')\n", v);
                return K3_EXIT_USAGE;
            }
            o->has_config = 1;
        } else if (!strcmp(argv[i], "--tp") || !strcmp(argv[i], "--ep")) {
            const char *a = argv[i];
            int64_t n = 0;
            if (!(v = k3_cli_value(argc, argv, &i, a)) || !k3_cli_parse_i64(v, a, &n)) return K3_EXIT_USAGE;
            if (n < 1 || n > 64) {
                fprintf(stderr, "k3 bench block: %s must be a rank (GPU) count in 1..64 (got %s)\n", a, v);
                return K3_EXIT_USAGE;
            }
            if (o->ranks && o->ranks_ep != (a[2] == 'e')) {
                fprintf(stderr, "k3 bench block: --tp and --ep are exclusive\n");
                return K3_EXIT_USAGE;
            }
            o->ranks = (int32_t)n, o->ranks_ep = a[2] == 'e';
        } else if (!strcmp(argv[i], "--m")) {
            if (!(v = k3_cli_value(argc, argv, &i, "--m")) || !(o->nm = k3_cli_parse_list(v, "--m", o->ms, BB_MAX_LIST)))
                return K3_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--reps")) {
            if (!(v = k3_cli_value(argc, argv, &i, "--reps")) || !k3_cli_parse_i64(v, "--reps", &o->reps))
                return K3_EXIT_USAGE;
#ifdef K3_MOE_TRACE
        } else if (!strcmp(argv[i], "--trace")) {
            if (!(v = k3_cli_value(argc, argv, &i, "--trace"))) return K3_EXIT_USAGE;
            o->trace = !strcmp(v, "block") ? 1 : !strcmp(v, "experts") ? 2 : 0;
            if (!o->trace) {
                fprintf(stderr, "k3 bench block: --trace must be block or experts (got '%s')\n", v);
                return K3_EXIT_USAGE;
            }
#endif
        } else {
            fprintf(stderr, "k3 bench block: unknown option '%s' (see k3 bench block --help)\n", argv[i]);
            return K3_EXIT_USAGE;
        }
    }
    for (int j = 0; j < o->nm; j++)
        if (o->ms[j] < 1 || o->ms[j] > BB_MAX_M) {
            fprintf(stderr, "k3 bench block: --m values must be in 1..%d (got %lld)\n", BB_MAX_M, (long long)o->ms[j]);
            return K3_EXIT_USAGE;
        }
    if (o->reps < 7 || o->reps > 1000) {
        fprintf(stderr, "k3 bench block: --reps must be 7..1000 (the median of >= 7 replays)\n");
        return K3_EXIT_USAGE;
    }
    const int32_t n = o->ranks;
    if (n && !o->has_config && !o->ranks_ep &&
        (BB_K3_INTER % n != 0 || (BB_K3_INTER / n) % 16 != 0 || BB_K3_SHARED % n != 0)) {
        fprintf(stderr, "k3 bench block: --tp %d: the K3 intermediate I = %d must split into %d slices of a multiple of "
                        "16 (the NVFP4 block) and Is = %d into %d whole slices\n",
                (int)n, BB_K3_INTER, (int)n, BB_K3_SHARED, (int)n);
        return K3_EXIT_USAGE;
    }
    if (n && !o->has_config && o->ranks_ep && (BB_K3_EXPERTS % n != 0 || BB_K3_SHARED % n != 0)) {
        fprintf(stderr, "k3 bench block: --ep %d: the %d K3 experts and the shared Is = %d must split into %d equal "
                        "parts\n",
                (int)n, BB_K3_EXPERTS, BB_K3_SHARED, (int)n);
        return K3_EXIT_USAGE;
    }
    return K3_EXIT_OK;
}

/* --help (1 with *rc = 0), a usage error (1 with *rc = 2), or options to run with (0), in every build alike. */
static int bb_front(int argc, char **argv, bb_opts *o, int *rc) {
    if (k3_cli_wants_help(argc, argv)) {
        block_bench_help();
        *rc = K3_EXIT_OK;
        return 1;
    }
    *rc = bb_parse(argc, argv, o);
    return *rc != K3_EXIT_OK;
}

void k3_bench_block_header(FILE *f) {
    fputs("    M   block us  router    down  experts norm+up  shared  stages sum  compose  x main   MB read  floor us  "
          "% floor  schedule\n",
          f);
}

void k3_bench_block_row(FILE *f, const bb_point *p) {
    const double *us = p->us;
    fprintf(f, "%5lld %10.1f %7.1f %7.1f %8.1f %7.1f %7.1f %11.1f %8.1f %7.3f %9.1f %9.1f %8.1f  %s\n",
            (long long)p->m, us[0], us[1], us[2], us[3], us[4], us[5], p->sum_us, us[0] - p->sum_us,
            us[0] / p->main_us, p->bytes / 1e6, p->floor_us, 100.0 * p->floor_us / us[0],
            k3_bench_schedule_name(p->schedule));
}

void k3_bench_block_row_json(FILE *f, const bb_point *p) {
    const double *us = p->us;
    fprintf(f, "{\"m\": %lld, \"block_us\": %.3f, \"router_us\": %.3f, \"down_us\": %.3f, \"experts_us\": %.3f, "
               "\"norm_up_us\": %.3f, \"shared_us\": %.3f, \"stages_sum_us\": %.3f, \"composition_us\": %.3f, "
               "\"main_path_us\": %.3f, \"block_over_main_path\": %.4f, "
               "\"experts_touched\": %d, \"bytes\": %.0f, \"floor_us\": %.3f, \"percent_of_floor\": %.2f, "
               "\"schedule\": \"%s\"}",
            (long long)p->m, us[0], us[1], us[2], us[3], us[4], us[5], p->sum_us, us[0] - p->sum_us, p->main_us,
            us[0] / p->main_us, (int)p->touched,
            p->bytes, p->floor_us, 100.0 * p->floor_us / us[0], k3_bench_schedule_name(p->schedule));
}

#ifndef K3_HAVE_CUDA
int k3_bench_block_measure(bb_measure *bm) {
    fprintf(stderr, "%s: this build has no CUDA backend\n", bm->who);
    return 0;
}

int k3_bench_block(int argc, char **argv) {
    bb_opts o;
    int rc;
    if (bb_front(argc, argv, &o, &rc)) return rc;
    if (o.ranks) return k3_bench_block_ranks(&o);
    fprintf(stderr, "k3 bench block: this build has no CUDA backend\n");
    return K3_EXIT_FAIL;
}
#else
#include <cuda_runtime.h>

/* Everything the timed calls use; copy c of the weights in w[c]. */
typedef struct bb {
    k3_latent_moe_desc d;
    int64_t m;
    int32_t copies;
    k3_latent_moe_weights *w; /* [copies], device */
    k3_latent_moe_plan *lp;
    k3_router_plan *rp;
    k3_moe_plan *mp;
    k3_linear_plan *down, *sgu, *sdown;
    void *lws, *rws, *mws, *dws, *sgws, *sdws;
    size_t lws_b, rws_b, mws_b, dws_b, sgws_b, sdws_b;
    uint16_t *x, *y, *xl, *mo, *g, *a;
    int32_t *ids;
    float *wts, *partial, *uf;
} bb;

#ifdef K3_MOE_TRACE
#include "cuda/moe/moe.h" /* k3x_moe_trace and the trace's sizes */
/* Diagnostic builds (-DK3_MOE_TRACE, src/cuda/moe/trace.cuh): `--trace block|experts` replays the block (or the
 * experts stage alone) once more after each point and prints, to stderr, percentiles over the blocks of each MoE
 * kernel of the last call: each stamp in us from GEMM1's first block start, and the phases between stamps. */
typedef struct xt_kernel {
    const unsigned long long *t; /* [2][nb][MT_WORDS] */
    const unsigned *n;           /* [nb]: launches per block */
    int nb;
} xt_kernel;
static const unsigned long long *xt_last(const xt_kernel *k, int b) {
    return k->n[b] < 2 ? NULL : k->t + ((size_t)((k->n[b] - 1) & 1u) * (size_t)k->nb + (size_t)b) * MT_WORDS;
}
static int xt_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
/* stamp i of every block of k's last launch (j < 0: relative to t0, else minus stamp j), as percentiles */
static void xt_row(const char *name, const xt_kernel *k, int i, int j, double t0, double *v) {
    int c = 0;
    for (int b = 0; b < k->nb; b++) {
        const unsigned long long *u = xt_last(k, b);
        if (!u || !u[i] || (j >= 0 && !u[j])) continue;
        v[c++] = j >= 0 ? (double)(u[i] - u[j]) / 1e3 : ((double)u[i] - t0) / 1e3;
    }
    if (!c) {
        fprintf(stderr, "  %-22s none\n", name);
        return;
    }
    qsort(v, (size_t)c, sizeof *v, xt_cmp);
    fprintf(stderr, "  %-22s n %5d  min %7.2f  p10 %7.2f  p50 %7.2f  p90 %7.2f  max %7.2f\n", name, c, v[0],
            v[c / 10], v[c / 2], v[(c * 9) / 10], v[c - 1]);
}
static void xt_print(int64_t m) {
    const size_t w = 2u * MT_WORDS * sizeof(unsigned long long);
    unsigned long long *g1 = malloc(MT_G1_BLOCKS * w), *g2 = malloc(MT_G2_BLOCKS * w), *cb = malloc(MT_CB_BLOCKS * w);
    unsigned *n1 = calloc(MT_G1_BLOCKS, sizeof *n1), *n2 = calloc(MT_G2_BLOCKS, sizeof *n2);
    unsigned *nc = calloc(MT_CB_BLOCKS, sizeof *nc);
    double *v = malloc(MT_G2_BLOCKS * sizeof *v);
    if (!g1 || !g2 || !cb || !n1 || !n2 || !nc || !v || k3x_moe_trace(0, g1, n1, g2, n2, cb, nc)) {
        fprintf(stderr, "trace M %lld: the stamps could not be read\n", (long long)m);
    } else {
        const xt_kernel k1 = {g1, n1, MT_G1_BLOCKS}, k2 = {g2, n2, MT_G2_BLOCKS}, kc = {cb, nc, MT_CB_BLOCKS};
        double t0 = 1e30;
        int per_sm[1024] = {0}, sms = 0, most = 0;
        for (int b = 0; b < MT_G1_BLOCKS; b++) {
            const unsigned long long *u = xt_last(&k1, b);
            if (!u) continue;
            if ((double)u[0] < t0) t0 = (double)u[0];
            const unsigned sm = (unsigned)u[MT_WORDS - 1] & 1023u;
            if (u[1] && !per_sm[sm]++) sms++;
            if (u[1] && per_sm[sm] > most) most = per_sm[sm];
        }
        fprintf(stderr, "trace M %lld (us from GEMM1's first block start in the last call; GEMM1 blocks that work: on "
                        "%d SMs, at most %d on one)\n", (long long)m, sms, most);
        static const char *const s1[] = {"g1 start", "g1 routed", "g1 ring issued", "g1 pre-loop", "g1 loop done",
                                         "g1 partials synced", "g1 end"};
        for (int i = 0; i < 7; i++) xt_row(s1[i], &k1, i, -1, t0, v);
        static const char *const d1[] = {"g1 d routing", "g1 d fill+list", "g1 d loop", "g1 d sync", "g1 d epilogue",
                                         "g1 d life"};
        static const int d1i[][2] = {{1, 0}, {3, 1}, {4, 3}, {5, 4}, {6, 5}, {6, 0}};
        for (int i = 0; i < 6; i++) xt_row(d1[i], &k1, d1i[i][0], d1i[i][1], t0, v);
        static const char *const s2[] = {"g2 start", "g2 routed", "g2 wait returned", "g2 end"};
        for (int i = 0; i < 4; i++) xt_row(s2[i], &k2, i, -1, t0, v);
        xt_row("g2 d after wait", &k2, 3, 2, t0, v);
        static const char *const sc[] = {"cb start", "cb wait returned", "cb end"};
        for (int i = 0; i < 3; i++) xt_row(sc[i], &kc, i, -1, t0, v);
    }
    free(g1), free(g2), free(cb), free(n1), free(n2), free(nc), free(v);
}
#endif

static k3_status st_of(k3_status st, char *err, size_t n, const char *what) {
    if (st != K3_STATUS_SUCCESS) snprintf(err, n, "%s: %s", what, k3_status_string(st));
    return st;
}

static k3_status call_block(void *u, int32_t c, void *s, char *err, size_t n) {
    bb *b = (bb *)u;
    return st_of(k3_latent_moe_run(b->lp, b->m, b->x, &b->w[c], NULL, b->y, NULL, NULL, b->lws, b->lws_b, s), err, n,
                 "block");
}
static k3_status call_router(void *u, int32_t c, void *s, char *err, size_t n) {
    bb *b = (bb *)u;
    return st_of(k3_router_run(b->rp, b->m, b->x, b->w[c].gate, b->w[c].bias, b->ids, b->wts, b->rws, b->rws_b, s), err,
                 n, "router");
}
static k3_status call_down(void *u, int32_t c, void *s, char *err, size_t n) {
    bb *b = (bb *)u;
    return st_of(k3_linear_run(b->down, b->m, b->x, b->w[c].down_proj, NULL, b->xl, b->dws, b->dws_b, s), err, n,
                 "down");
}
static k3_status call_experts(void *u, int32_t c, void *s, char *err, size_t n) {
    bb *b = (bb *)u;
    return st_of(k3_moe_run(b->mp, b->m, b->xl, b->ids, b->wts, &b->w[c].experts, b->mo, b->uf, b->mws, b->mws_b, s),
                 err, n, "experts");
}
static k3_status call_norm_up(void *u, int32_t c, void *s, char *err, size_t n) {
    bb *b = (bb *)u;
    return st_of(k3_latent_moe_run_stage(b->lp, K3_LATENT_POST_REDUCE, b->m, NULL, &b->w[c], NULL, b->y, b->partial,
                                         NULL, NULL, b->lws, b->lws_b, s),
                 err, n, "norm+up");
}
static k3_status call_shared(void *u, int32_t c, void *s, char *err, size_t n) {
    bb *b = (bb *)u;
    k3_status st = k3_linear_run(b->sgu, b->m, b->x, b->w[c].shared_gate_up, NULL, b->g, b->sgws, b->sgws_b, s);
    if (st == K3_STATUS_SUCCESS)
        st = k3_linear_run(b->sdown, b->m, b->a, b->w[c].shared_down, NULL, b->y, b->sdws, b->sdws_b, s);
    return st_of(st, err, n, "shared");
}

static k3_status bb_linear(k3_ctx *ctx, int64_t n, int64_t k, int64_t max_m, k3_linear_plan **p, void **ws,
                           size_t *wsb) {
    k3_linear_desc d;
    k3_linear_desc_init(&d, n, k);
    d.max_m = max_m;
    k3_status st = k3_linear_plan_create(ctx, &d, p);
    if (st == K3_STATUS_SUCCESS) st = k3_linear_workspace_size(*p, wsb);
    if (st != K3_STATUS_SUCCESS) return st;
    return cudaMalloc(ws, *wsb ? *wsb : 16) == cudaSuccess ? K3_STATUS_SUCCESS : K3_STATUS_OUT_OF_MEMORY;
}

int k3_bench_block_measure(bb_measure *bm) {
    const char *who = bm->who;
    const k3_synth_block *hb = bm->hb;
    k3_ctx *ctx = bm->ctx;
    int ok = 0;
    bb b;
    memset(&b, 0, sizeof b);
    k3_cli_mem *mm = NULL;
    int nmm = 0;
    int32_t *dmap = NULL, *hids = NULL;
    unsigned char *seen = NULL;
    cudaStream_t s = NULL;
    char err[512] = "";
    k3_status st = K3_STATUS_SUCCESS;
    b.d = hb->d;
    b.d.schedule = bm->schedule;
    const int32_t e_global = b.d.router.num_experts, e_local = b.d.experts.num_experts;
    const int64_t max_m = b.d.max_tokens;
    for (int j = 0; j < bm->nm; j++)
        if (bm->ms[j] < 1 || bm->ms[j] > max_m) {
            fprintf(stderr, "%s: M %lld is outside 1..%lld (the plan's max_tokens)\n", who, (long long)bm->ms[j],
                    (long long)max_m);
            return 0;
        }
    k3_ctx_arch(ctx, &bm->arch);
    b.copies = k3_bench_cold_copies((double)(hb->bytes_fp4 + hb->bytes_dense), bm->arch.l2_bytes);
    if (bm->max_copies > 0 && b.copies > bm->max_copies) b.copies = bm->max_copies;
    bm->copies = b.copies, bm->calls = b.copies * 4;
    b.w = (k3_latent_moe_weights *)calloc((size_t)b.copies, sizeof *b.w);
    mm = (k3_cli_mem *)calloc((size_t)b.copies, sizeof *mm);
    hids = (int32_t *)malloc(sizeof(int32_t) * (size_t)(max_m * b.d.experts.top_k));
    seen = (unsigned char *)malloc((size_t)(e_local > 0 ? e_local : 1));
    if (!b.w || !mm || !hids || !seen) goto oom;
    if (bm->progress)
        fprintf(bm->progress, "%s: %d weight copies to the device (%.2f GB each)\n", who, (int)b.copies,
                (double)(hb->bytes_fp4 + hb->bytes_dense) / 1e9);
    const size_t map_b = sizeof(int32_t) * (size_t)e_global;
    if (bm->expert_map && (cudaMalloc((void **)&dmap, map_b) != cudaSuccess ||
                           cudaMemcpy(dmap, bm->expert_map, map_b, cudaMemcpyHostToDevice) != cudaSuccess))
        goto cuda_fail;
    const double t_copy = k3_cli_now();
    for (int32_t c = 0; c < b.copies; c++) {
        k3_cli_mem_init(&mm[nmm], ctx);
        if (!k3_synth_block_weights_in(hb, &mm[nmm++], &b.w[c])) goto oom;
        if (dmap) b.w[c].experts.expert_map = dmap;
    }
    bm->copy_s = k3_cli_now() - t_copy;
    /* plans: the block, and each stage's own */
    if ((st = k3_latent_moe_plan_create(ctx, &b.d, &b.lp)) != K3_STATUS_SUCCESS) goto plan_fail;
    k3_latent_moe_workspace_size(b.lp, &b.lws_b);
    k3_router_desc rd = b.d.router;
    rd.max_tokens = max_m;
    if ((st = k3_router_plan_create(ctx, &rd, &b.rp)) != K3_STATUS_SUCCESS) goto plan_fail;
    k3_router_workspace_size(b.rp, &b.rws_b);
    k3_moe_desc md = b.d.experts;
    md.max_tokens = max_m;
    if ((st = k3_moe_plan_create(ctx, &md, &b.mp)) != K3_STATUS_SUCCESS) goto plan_fail;
    k3_moe_workspace_size(b.mp, &b.mws_b);
    const int64_t H = b.d.hidden, L = b.d.experts.hidden, IS = b.d.shared_inter, K = b.d.experts.top_k;
    if ((st = bb_linear(ctx, L, H, max_m, &b.down, &b.dws, &b.dws_b)) != K3_STATUS_SUCCESS ||
        (st = bb_linear(ctx, 2 * IS, H, max_m, &b.sgu, &b.sgws, &b.sgws_b)) != K3_STATUS_SUCCESS ||
        (st = bb_linear(ctx, H, IS, max_m, &b.sdown, &b.sdws, &b.sdws_b)) != K3_STATUS_SUCCESS)
        goto plan_fail;
    size_t pcount = 0;
    k3_latent_moe_partial_count(b.lp, max_m, &pcount);
    const size_t mh = (size_t)(max_m * H), ml = (size_t)(max_m * L), mk = (size_t)(max_m * K);
    if (cudaMalloc(&b.lws, b.lws_b) != cudaSuccess || cudaMalloc(&b.rws, b.rws_b ? b.rws_b : 16) != cudaSuccess ||
        cudaMalloc(&b.mws, b.mws_b) != cudaSuccess || cudaMalloc((void **)&b.x, mh * 2) != cudaSuccess ||
        cudaMalloc((void **)&b.y, mh * 2) != cudaSuccess || cudaMalloc((void **)&b.xl, ml * 2) != cudaSuccess ||
        cudaMalloc((void **)&b.mo, ml * 2) != cudaSuccess || cudaMalloc((void **)&b.uf, ml * 4) != cudaSuccess ||
        cudaMalloc((void **)&b.g, (size_t)(max_m * 2 * IS) * 2) != cudaSuccess ||
        cudaMalloc((void **)&b.a, (size_t)(max_m * IS) * 2) != cudaSuccess ||
        cudaMalloc((void **)&b.ids, mk * 4) != cudaSuccess || cudaMalloc((void **)&b.wts, mk * 4) != cudaSuccess ||
        cudaMalloc((void **)&b.partial, pcount * 4) != cudaSuccess ||
        cudaMemset(b.a, 0, (size_t)(max_m * IS) * 2) != cudaSuccess ||
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
        goto cuda_fail;
    {
        uint16_t *hx = (uint16_t *)malloc(mh * 2);
        if (!hx) goto oom;
        k3_synth_bf16(bm->rng, hx, mh, 1.0);
        const int in = cudaMemcpy(b.x, hx, mh * 2, cudaMemcpyHostToDevice) == cudaSuccess;
        free(hx);
        if (!in) goto cuda_fail;
    }
    if (bm->on_ready) bm->on_ready(bm->user, bm);
    const size_t per_expert = (size_t)(2 * b.d.experts.inter * L) / 2 + (size_t)(L * b.d.experts.inter) / 2 +
                              (size_t)(2 * b.d.experts.inter * L) / 16 + (size_t)(L * b.d.experts.inter) / 16 + 8;
    for (int j = 0; j < bm->nm; j++) {
        b.m = bm->ms[j];
        /* the routing the experts stage runs on, and the partial the norm+up stage reads: the block's own */
        if ((st = k3_router_run(b.rp, b.m, b.x, b.w[0].gate, b.w[0].bias, b.ids, b.wts, b.rws, b.rws_b, s)) !=
                K3_STATUS_SUCCESS ||
            (st = k3_latent_moe_run_stage(b.lp, K3_LATENT_PRE_REDUCE, b.m, b.x, &b.w[0], NULL, NULL, b.partial, NULL,
                                          NULL, b.lws, b.lws_b, s)) != K3_STATUS_SUCCESS ||
            (st = k3_linear_run(b.down, b.m, b.x, b.w[0].down_proj, NULL, b.xl, b.dws, b.dws_b, s)) !=
                K3_STATUS_SUCCESS)
            goto plan_fail;
        if (cudaMemcpyAsync(hids, b.ids, (size_t)(b.m * K) * 4, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
            k3_bench_sync(s, err, sizeof err) != K3_STATUS_SUCCESS)
            goto cuda_fail;
        bb_point p;
        memset(&p, 0, sizeof p);
        p.m = b.m;
        if ((st = k3_latent_moe_plan_schedule_at(b.lp, b.m, &p.schedule)) != K3_STATUS_SUCCESS) goto plan_fail;
        memset(seen, 0, (size_t)(e_local > 0 ? e_local : 1));
        for (int64_t i = 0; i < b.m * K; i++) {
            const int32_t gid = hids[i];
            const int32_t loc = gid >= 0 && gid < e_global ? (bm->expert_map ? bm->expert_map[gid] : gid) : -1;
            if (loc >= 0 && loc < e_local && !seen[loc]) seen[loc] = 1, p.touched++;
        }
        p.bytes = 2.0 * (double)(b.d.router.num_experts * H + 2 * L * H + 3 * IS * H + L) +
                  (double)p.touched * (double)per_expert + 4.0 * (double)(b.m * H);
        const k3_bench_variant v[BB_VARIANTS] = {{call_block, &b},   {call_router, &b},  {call_down, &b},
                                                 {call_experts, &b}, {call_norm_up, &b}, {call_shared, &b}};
        const k3_bench_timing tm = {b.copies, bm->calls, 3, (int32_t)bm->reps};
        if ((st = k3_bench_graph_time_n(v, BB_VARIANTS, &tm, s, p.us, err, sizeof err)) != K3_STATUS_SUCCESS) {
            fprintf(stderr, "%s: M %lld: %s\n", who, (long long)b.m, err);
            goto done;
        }
#ifdef K3_MOE_TRACE
        if (bm->trace) { /* the block (1) or the experts alone (2) once more, traced */
            double us1 = 0.0;
            const k3_bench_variant *tv = &v[bm->trace == 2 ? 3 : 0];
            if (k3x_moe_trace(1, NULL, NULL, NULL, NULL, NULL, NULL) == 0 &&
                k3_bench_graph_time_n(tv, 1, &tm, s, &us1, err, sizeof err) == K3_STATUS_SUCCESS) {
                fprintf(stderr, "trace of the %s: %.2f us per call (stamps included)\n",
                        bm->trace == 2 ? "experts alone" : "block", us1);
                xt_print(b.m);
            }
        }
#endif
        p.sum_us = p.us[1] + p.us[2] + p.us[3] + p.us[4] + p.us[5];
        p.main_us = p.us[1] + p.us[2] + p.us[3] + p.us[4];
        p.floor_us = p.bytes / K3_BENCH_READ_CEILING * 1e6;
        if (bm->on_point) bm->on_point(bm->user, bm, &p, j);
    }
    ok = 1;
    goto done;
plan_fail:
    fprintf(stderr, "%s: %s: %s\n", who, k3_status_string(st), k3_ctx_last_error(ctx));
    goto done;
cuda_fail:
    fprintf(stderr, "%s: a CUDA call failed: %s %s\n", who, cudaGetErrorString(cudaGetLastError()), err);
    goto done;
oom:
    fprintf(stderr, "%s: out of memory\n", who);
done:
    if (s) cudaStreamDestroy(s);
    k3_latent_moe_plan_destroy(b.lp);
    k3_router_plan_destroy(b.rp);
    k3_moe_plan_destroy(b.mp);
    k3_linear_plan_destroy(b.down);
    k3_linear_plan_destroy(b.sgu);
    k3_linear_plan_destroy(b.sdown);
    void *dev[] = {b.lws, b.rws, b.mws, b.dws, b.sgws, b.sdws, b.x, b.y, b.xl, b.mo, b.g, b.a, b.ids, b.wts,
                   b.partial, b.uf, dmap};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cudaFree(dev[i]);
    for (int i = 0; i < nmm; i++) k3_cli_mem_free(&mm[i]);
    free(mm);
    free(b.w);
    free(hids);
    free(seen);
    return ok;
}

/* The one-GPU bench's printing, as the measurement reaches each step. */
typedef struct bb_print {
    const bb_opts *o;
} bb_print;

static void bb_print_ready(void *user, const bb_measure *bm) {
    const bb_opts *o = ((const bb_print *)user)->o;
    const k3_latent_moe_desc *d = &bm->hb->d;
    if (!o->json) {
        printf("k3 bench block: %s rank on %s (%d SMs): H %lld, E %d of %d top-%lld, L %lld, I %lld, Is %lld, "
               "NVFP4 W4A16 SiTU, schedule %s%s; table %s; %d weight copies, %lld replays\n",
               o->ep ? "EP16" : "TP8", bm->arch.device_name, (int)bm->arch.sm_count, (long long)d->hidden,
               (int)d->experts.num_experts, (int)d->router.num_experts, (long long)d->experts.top_k,
               (long long)d->experts.hidden, (long long)d->experts.inter, (long long)d->shared_inter,
               k3_bench_schedule_name((k3_latent_schedule)o->schedule),
               o->schedule == K3_LATENT_SCHEDULE_AUTO ? " (the plan's choice per M: last column)" : "",
               o->table ? o->table : k3_table_name(bm->arch.table), (int)bm->copies, (long long)o->reps);
        k3_bench_block_header(stdout);
    } else {
        printf("{\"config\": \"%s\", \"schedule\": \"%s\", \"table\": ", o->ep ? "ep16" : "tp8",
               k3_bench_schedule_name((k3_latent_schedule)o->schedule));
        k3_cli_json_string(stdout, o->table ? o->table : k3_table_name(bm->arch.table));
        printf(", \"gpu\": ");
        k3_cli_json_string(stdout, bm->arch.device_name);
        printf(", \"copies\": %d, \"reps\": %lld, \"rows\": [", (int)bm->copies, (long long)o->reps);
    }
}

static void bb_print_point(void *user, const bb_measure *bm, const bb_point *p, int j) {
    const bb_opts *o = ((const bb_print *)user)->o;
    (void)bm;
    if (!o->json) {
        k3_bench_block_row(stdout, p);
    } else {
        if (j) fputs(", ", stdout);
        k3_bench_block_row_json(stdout, p);
    }
    fflush(stdout);
}

int k3_bench_block(int argc, char **argv) {
    bb_opts o;
    int front_rc;
    if (bb_front(argc, argv, &o, &front_rc)) return front_rc;
    if (o.ranks) return k3_bench_block_ranks(&o);
    k3_ctx *ctx = k3_cli_ctx("cuda");
    if (!ctx) return K3_EXIT_FAIL;
    int rc = K3_EXIT_FAIL;
    if (o.table && k3_ctx_load_table(ctx, o.table, o.force) != K3_STATUS_SUCCESS) {
        fprintf(stderr, "k3 bench block: --table %s: %s\n", o.table, k3_ctx_last_error(ctx));
        k3_ctx_destroy(ctx);
        return K3_EXIT_FAIL;
    }
    k3_synth_block hb;
    memset(&hb, 0, sizeof hb);
    int32_t *hmap = NULL;
    /* the rank: TP8 (every expert, I / 8) or EP16 (56 whole experts, the router over all 896) */
    const int32_t e_local = o.ep ? 56 : 896;
    k3_synth_block_desc(&hb.d, e_local, 16, 7168, 3584, o.ep ? 3072 : 384, o.ep ? 384 : 768, BB_MAX_M);
    if (o.ep) {
        hb.d.router.num_experts = 896;
        hb.d.experts.global_experts = 896;
        hb.d.parallel.layout = K3_PARALLEL_NONE; /* one rank measured alone: its own partial is normalized */
        if (!(hmap = (int32_t *)malloc(sizeof(int32_t) * 896))) {
            fprintf(stderr, "k3 bench block: out of memory\n");
            goto done;
        }
        for (int32_t g = 0; g < 896; g++) hmap[g] = g < e_local ? g : -1; /* EP16: this rank holds experts 0..55 */
    }
    k3_synth_rng r = {BB_SEED};
    fprintf(stderr, "k3 bench block: synthesizing the %s rank's weights\n", o.ep ? "EP16" : "TP8");
    if (!k3_synth_block_make(&hb, &r)) {
        fprintf(stderr, "k3 bench block: out of host memory\n");
        goto done;
    }
    bb_print pr = {&o};
    bb_measure bm;
    memset(&bm, 0, sizeof bm);
    bm.who = "k3 bench block", bm.ctx = ctx, bm.hb = &hb, bm.expert_map = hmap, bm.rng = &r;
    bm.ms = o.ms, bm.nm = o.nm, bm.reps = o.reps, bm.max_copies = 8, bm.progress = stderr;
    bm.on_ready = bb_print_ready, bm.on_point = bb_print_point, bm.user = &pr;
    bm.schedule = (k3_latent_schedule)o.schedule;
    bm.trace = o.trace;
    if (!k3_bench_block_measure(&bm)) goto done;
    if (o.json) printf("]}\n");
    rc = K3_EXIT_OK;
done:
    free(hmap);
    k3_synth_block_free(&hb);
    k3_ctx_destroy(ctx);
    return rc;
}
#endif
