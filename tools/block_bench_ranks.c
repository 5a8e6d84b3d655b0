/* k3 bench block --tp N / --ep N: the latent-MoE block on N GPUs, library-driven over NCCL. One host thread per GPU
 * with its own context, stream, synthetic K3 shard (tools/block_synth.c) and plan whose k3_parallel_desc carries the
 * rank's communicator. Three variants on the same rank shape, each captured per rank as a graph of back-to-back
 * calls by the method of docs/benchmarks.md (tools/bench_graph.c): the block with NCCL, the block without a
 * communicator (layout NONE), and a bare ncclAllReduce of the block's fp32 partial. The replays start on every rank
 * together (a barrier before each) and interleave round robin; each rank times its own with events; the slowest
 * rank's median per call is the reported number. */
#define _POSIX_C_SOURCE 200809L /* pthread barriers */
#include <stdlib.h>
#include <string.h>

#include "bench_graph.h"
#include "block_bench.h"
#include "block_synth.h"
#include "cli.h"
#include "cli_nccl.h"

#define BR_VARIANTS 3 /* block with NCCL, block without, bare all-reduce */
#define BR_WARMUP 3
#define BR_MAX_COPIES 8

#ifndef K3_HAVE_CUDA
int k3_bench_block_ranks(const bb_opts *o) {
    fprintf(stderr, "k3 bench block: --%s %d runs one rank per GPU and needs %d GPU%s; this process sees 0 (a build "
                    "without CUDA)\n",
            o->ranks_ep ? "ep" : "tp", (int)o->ranks, (int)o->ranks, o->ranks == 1 ? "" : "s");
    return K3_EXIT_FAIL;
}
#else
#include <cuda_runtime.h>
#include <pthread.h>

/* The rank's shape: TP-N or EP-N of the full K3 block, or the --config rank's. */
static void br_shape(const bb_opts *o, int32_t *e_local, int64_t *inter, int64_t *is) {
    const int32_t n = o->ranks;
    if (o->has_config) {
        *e_local = o->ep ? 56 : BB_K3_EXPERTS;
        *inter = o->ep ? BB_K3_INTER : BB_K3_INTER / 8;
        *is = o->ep ? BB_K3_SHARED / 16 : BB_K3_SHARED / 8;
    } else {
        *e_local = o->ranks_ep ? BB_K3_EXPERTS / n : BB_K3_EXPERTS;
        *inter = o->ranks_ep ? BB_K3_INTER : BB_K3_INTER / n;
        *is = BB_K3_SHARED / n;
    }
}

typedef struct br_run {
    const bb_opts *o;
    int32_t n;
    k3_cli_nccl nc;
    pthread_barrier_t bar;
    int fail;     /* any rank failed (atomic): the others stop before their next collective */
    int32_t copies;
    double *us;   /* [n][nm][BR_VARIANTS]: each rank's median per call */
    size_t *count; /* [nm]: the partial's floats at each M */
    char gpu[256];
    int32_t sms;
} br_run;

typedef struct br_rank {
    br_run *run;
    int32_t rank;
    void *comm;
    /* what the timed calls use */
    int64_t m;
    int32_t copies;
    k3_latent_moe_weights w[BR_MAX_COPIES];
    k3_latent_moe_plan *lp, *lp_none;
    void *ws, *ws_none;
    size_t ws_b, ws_none_b;
    uint16_t *x, *y;
    float *partial;
    size_t count;
} br_rank;

static void br_set_fail(br_run *run) { __atomic_store_n(&run->fail, 1, __ATOMIC_SEQ_CST); }
static int br_failed(br_run *run) { return __atomic_load_n(&run->fail, __ATOMIC_SEQ_CST); }
/* Every rank here, then 1 when none failed. The flag is read between two barriers, where no rank can set it, so
   every rank reads the same value and they all take the same branch (the barrier counts must match). */
static int br_sync(br_rank *k) {
    pthread_barrier_wait(&k->run->bar);
    const int ok = !br_failed(k->run);
    pthread_barrier_wait(&k->run->bar);
    return ok;
}

static int br_err(br_rank *k, const char *what, const char *why) {
    fprintf(stderr, "k3 bench block: rank %d (GPU %d): %s: %s\n", (int)k->rank, (int)k->rank, what, why);
    br_set_fail(k->run);
    return 0;
}

static k3_status br_st(k3_status st, char *err, size_t n, const char *what) {
    if (st != K3_STATUS_SUCCESS) snprintf(err, n, "%s: %s", what, k3_status_string(st));
    return st;
}

static k3_status call_nccl_block(void *u, int32_t c, void *s, char *err, size_t n) {
    br_rank *k = (br_rank *)u;
    return br_st(k3_latent_moe_run(k->lp, k->m, k->x, &k->w[c], NULL, k->y, NULL, NULL, k->ws, k->ws_b, s), err, n,
                 "block with NCCL");
}
static k3_status call_block(void *u, int32_t c, void *s, char *err, size_t n) {
    br_rank *k = (br_rank *)u;
    return br_st(k3_latent_moe_run(k->lp_none, k->m, k->x, &k->w[c], NULL, k->y, NULL, NULL, k->ws_none,
                                   k->ws_none_b, s),
                 err, n, "block");
}
static k3_status call_allreduce(void *u, int32_t c, void *s, char *err, size_t n) {
    br_rank *k = (br_rank *)u;
    (void)c;
    return k3_cli_nccl_allreduce_f32(&k->run->nc, k->partial, k->count, k->comm, s, err, n) ? K3_STATUS_SUCCESS
                                                                                             : K3_STATUS_COMM_ERROR;
}

/* One M: the three graphs captured, warmed and replayed together with the other ranks; the rank's medians. */
static int br_point(br_rank *k, cudaStream_t s, const bb_opts *o, double *us, double *times) {
    const k3_bench_variant v[BR_VARIANTS] = {{call_nccl_block, k}, {call_block, k}, {call_allreduce, k}};
    const k3_bench_timing tm = {k->copies, k->copies * 4, BR_WARMUP, (int32_t)o->reps};
    void *exec[BR_VARIANTS] = {0};
    char err[512] = "";
    int ok = 1;
    k3_latent_moe_partial_count(k->lp, k->m, &k->count);
    for (int j = 0; ok && j < BR_VARIANTS; j++)
        if (k3_bench_graph_capture(&v[j], &tm, s, &exec[j], err, sizeof err) != K3_STATUS_SUCCESS)
            ok = br_err(k, "capture", err);
    /* warmup and timed replays alike: every rank launches replay r of variant j together */
    for (int32_t r = 0; r < BR_WARMUP + tm.reps; r++)
        for (int j = 0; j < BR_VARIANTS; j++) {
            if (!br_sync(k)) ok = 0;
            if (!ok) continue; /* keep meeting the barrier: the others count on it */
            float ms = 0;
            if (k3_bench_graph_replay(exec[j], s, &ms, err, sizeof err) != K3_STATUS_SUCCESS) {
                ok = br_err(k, "replay", err);
                continue;
            }
            if (r >= BR_WARMUP) times[(size_t)j * (size_t)tm.reps + (size_t)(r - BR_WARMUP)] = 1000.0 * ms / tm.calls;
        }
    for (int j = 0; j < BR_VARIANTS; j++) {
        if (ok) us[j] = k3_bench_median(times + (size_t)j * (size_t)tm.reps, tm.reps);
        k3_bench_graph_destroy(exec[j]);
    }
    return ok;
}

static void *br_main(void *arg) {
    br_rank *k = (br_rank *)arg;
    br_run *run = k->run;
    const bb_opts *o = run->o;
    k3_ctx *ctx = NULL;
    cudaStream_t s = NULL;
    k3_synth_block hb;
    memset(&hb, 0, sizeof hb);
    k3_cli_mem mm[BR_MAX_COPIES + 1];
    int nmm = 0;
    double *times = (double *)calloc((size_t)(BR_VARIANTS * o->reps), sizeof *times);
    k3_status st;
    cudaError_t ce;
    char why[600];
    int ok = 1;
    if (!times) ok = br_err(k, "setup", "out of host memory");
    if (ok && (ce = cudaSetDevice((int)k->rank)) != cudaSuccess) ok = br_err(k, "cudaSetDevice", cudaGetErrorString(ce));
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CUDA;
    opt.device = k->rank;
    if (ok && (st = k3_ctx_create(&opt, &ctx)) != K3_STATUS_SUCCESS) ok = br_err(k, "CUDA context", k3_status_string(st));
    if (ok && o->table && (st = k3_ctx_load_table(ctx, o->table, o->force)) != K3_STATUS_SUCCESS)
        ok = br_err(k, "--table", k3_ctx_last_error(ctx));
    if (ok && (ce = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess)
        ok = br_err(k, "cudaStreamCreate", cudaGetErrorString(ce));
    /* the rank's shard: the same seed on every rank, so every rank routes the same replicated tokens alike */
    int32_t e_local;
    int64_t inter, is;
    br_shape(o, &e_local, &inter, &is);
    const int ep = o->has_config ? o->ep : o->ranks_ep;
    k3_synth_block_desc(&hb.d, e_local, 16, 7168, 3584, inter, is, BB_MAX_M);
    if (ep) hb.d.router.num_experts = BB_K3_EXPERTS, hb.d.experts.global_experts = BB_K3_EXPERTS;
    k3_synth_rng rng = {BB_SEED};
    if (ok && !k3_synth_block_make(&hb, &rng)) ok = br_err(k, "synthesizing the weights", "out of host memory");
    k3_arch_info arch;
    if (ok) {
        k3_ctx_arch(ctx, &arch);
        k->copies = k3_bench_cold_copies((double)(hb.bytes_fp4 + hb.bytes_dense), arch.l2_bytes);
        if (k->copies > BR_MAX_COPIES) k->copies = BR_MAX_COPIES;
        if (k->rank == 0) {
            snprintf(run->gpu, sizeof run->gpu, "%s", arch.device_name);
            run->sms = arch.sm_count, run->copies = k->copies;
        }
    }
    int32_t *hmap = (int32_t *)malloc(sizeof(int32_t) * BB_K3_EXPERTS);
    const int32_t *dmap = NULL;
    if (ok && !hmap) ok = br_err(k, "setup", "out of host memory");
    for (int32_t c = 0; ok && c < k->copies; c++) {
        k3_cli_mem_init(&mm[nmm], ctx);
        if (!k3_synth_block_weights_in(&hb, &mm[nmm++], &k->w[c])) ok = br_err(k, "weights", "out of device memory");
    }
    if (ok && ep) { /* EP: the rank holds experts [e0, e0 + e_local) of the 896 */
        const int32_t e0 = (int32_t)(((int64_t)k->rank * e_local) % BB_K3_EXPERTS);
        for (int32_t g = 0; g < BB_K3_EXPERTS; g++) hmap[g] = g >= e0 && g < e0 + e_local ? g - e0 : -1;
        int in_ok = 1;
        dmap = (const int32_t *)k3_cli_mem_in(&mm[0], hmap, sizeof(int32_t) * BB_K3_EXPERTS, &in_ok);
        if (!in_ok) ok = br_err(k, "expert map", "out of device memory");
        for (int32_t c = 0; c < k->copies; c++) k->w[c].experts.expert_map = dmap;
    }
    /* the plans: the rank with its communicator, and the same shape alone */
    k3_latent_moe_desc d = hb.d, dn = hb.d;
    k3_synth_block_free(&hb); /* on the device now */
    d.parallel.layout = ep ? K3_PARALLEL_EP : K3_PARALLEL_TP;
    d.parallel.rank = k->rank, d.parallel.size = run->n, d.parallel.nccl_comm = k->comm;
    dn.parallel.layout = K3_PARALLEL_NONE; /* the rank measured alone: its own partial is normalized */
    if (ok && (st = k3_latent_moe_plan_create(ctx, &d, &k->lp)) != K3_STATUS_SUCCESS) {
        snprintf(why, sizeof why, "%s: %s", k3_status_string(st), k3_ctx_last_error(ctx));
        ok = br_err(k, "the plan with NCCL", why);
    }
    if (ok && (st = k3_latent_moe_plan_create(ctx, &dn, &k->lp_none)) != K3_STATUS_SUCCESS) {
        snprintf(why, sizeof why, "%s: %s", k3_status_string(st), k3_ctx_last_error(ctx));
        ok = br_err(k, "the plan without a communicator", why);
    }
    size_t pmax = 0;
    if (ok) {
        k3_latent_moe_workspace_size(k->lp, &k->ws_b);
        k3_latent_moe_workspace_size(k->lp_none, &k->ws_none_b);
        k3_latent_moe_partial_count(k->lp, BB_MAX_M, &pmax);
        k3_cli_mem *mx = &mm[nmm++];
        k3_cli_mem_init(mx, ctx);
        const size_t mh = (size_t)(BB_MAX_M * d.hidden);
        uint16_t *hx = (uint16_t *)malloc(mh * 2);
        k->ws = k3_cli_mem_alloc(mx, k->ws_b);
        k->ws_none = k3_cli_mem_alloc(mx, k->ws_none_b);
        k->y = (uint16_t *)k3_cli_mem_alloc(mx, mh * 2);
        k->partial = (float *)k3_cli_mem_alloc(mx, pmax * 4); /* zeroed by nothing: the sum's values do not matter */
        int in_ok = hx != NULL;
        if (hx) k3_synth_bf16(&rng, hx, mh, 1.0);
        k->x = hx ? (uint16_t *)k3_cli_mem_in(mx, hx, mh * 2, &in_ok) : NULL;
        free(hx);
        if (!in_ok || !k->ws || !k->ws_none || !k->y || !k->partial || !k->x)
            ok = br_err(k, "buffers", "out of memory");
        else if ((ce = cudaMemsetAsync(k->partial, 0, pmax * 4, s)) != cudaSuccess)
            ok = br_err(k, "cudaMemset", cudaGetErrorString(ce));
    }
    /* one eager call of each, all ranks together, before any capture (NCCL connects on first use) */
    if (!br_sync(k)) ok = 0;
    for (int j = 0; ok && j < BR_VARIANTS; j++) {
        const k3_bench_call_fn fn[BR_VARIANTS] = {call_nccl_block, call_block, call_allreduce};
        k->m = 1;
        k->count = pmax;
        if (fn[j](k, 0, s, why, sizeof why) != K3_STATUS_SUCCESS ||
            k3_bench_sync(s, why, sizeof why) != K3_STATUS_SUCCESS)
            ok = br_err(k, "the first calls", why);
    }
    for (int jm = 0; jm < o->nm; jm++) {
        if (!br_sync(k)) ok = 0;
        if (!ok) break; /* every rank sees the same flag after the barrier and leaves together */
        k->m = o->ms[jm];
        if (!br_point(k, s, o, run->us + ((size_t)k->rank * (size_t)o->nm + (size_t)jm) * BR_VARIANTS, times)) ok = 0;
        if (k->rank == 0) run->count[jm] = k->count;
    }
    if (ok) k3_bench_sync(s, why, sizeof why);
    k3_latent_moe_plan_destroy(k->lp);
    k3_latent_moe_plan_destroy(k->lp_none);
    for (int i = 0; i < nmm; i++) k3_cli_mem_free(&mm[i]);
    if (s) cudaStreamDestroy(s);
    k3_ctx_destroy(ctx);
    free(hmap), free(times);
    return NULL;
}

int k3_bench_block_ranks(const bb_opts *o) {
    const int32_t n = o->ranks, have = k3_cli_gpu_count();
    const int ep = o->has_config ? o->ep : o->ranks_ep;
    if (have < n) {
        fprintf(stderr, "k3 bench block: --%s %d runs one rank per GPU and needs %d GPU%s; this process sees %d\n",
                o->ranks_ep ? "ep" : "tp", (int)n, (int)n, n == 1 ? "" : "s", (int)have);
        return K3_EXIT_FAIL;
    }
    int rc = K3_EXIT_FAIL, bar_made = 0, comms_made = 0;
    br_run run;
    memset(&run, 0, sizeof run);
    run.o = o, run.n = n;
    void **comms = (void **)calloc((size_t)n, sizeof *comms);
    br_rank *k = (br_rank *)calloc((size_t)n, sizeof *k);
    pthread_t *th = (pthread_t *)calloc((size_t)n, sizeof *th);
    run.us = (double *)calloc((size_t)(n * o->nm * BR_VARIANTS), sizeof *run.us);
    run.count = (size_t *)calloc((size_t)o->nm, sizeof *run.count);
    if (!comms || !k || !th || !run.us || !run.count) {
        fprintf(stderr, "k3 bench block: out of host memory\n");
        goto done;
    }
    if (!k3_cli_nccl_open(&run.nc, "k3 bench block") ||
        !(comms_made = k3_cli_nccl_comms(&run.nc, n, comms, "k3 bench block")))
        goto done;
    if (pthread_barrier_init(&run.bar, NULL, (unsigned)n) != 0) {
        fprintf(stderr, "k3 bench block: pthread_barrier_init failed\n");
        goto done;
    }
    bar_made = 1;
    int32_t e_local;
    int64_t inter, is;
    br_shape(o, &e_local, &inter, &is);
    fprintf(stderr, "k3 bench block: %d %s ranks on GPUs 0..%d: synthesizing each rank's weights\n", (int)n,
            ep ? "EP" : "TP", (int)n - 1);
    for (int32_t r = 0; r < n; r++) {
        k[r].run = &run, k[r].rank = r, k[r].comm = comms[r];
        if (pthread_create(&th[r], NULL, br_main, &k[r]) != 0) {
            /* the barrier counts n threads: the started ones would wait for this one forever */
            fprintf(stderr, "k3 bench block: cannot start rank %d's thread\n", (int)r);
            exit(K3_EXIT_FAIL);
        }
    }
    for (int32_t r = 0; r < n; r++) pthread_join(th[r], NULL);
    if (run.fail) goto done;
    char lay[32];
    snprintf(lay, sizeof lay, "%s%d", ep ? "EP" : "TP", (int)n);
    if (!o->json)
        printf("k3 bench block: %s on %d x %s (%d SMs), library-driven NCCL; each rank%s: H 7168, E %d of %d "
               "top-16, L 3584, I %lld, Is %lld, NVFP4 W4A16 SiTU; %d weight copies, %lld replays, the slowest "
               "rank's median per call\n"
               "    M  nccl block us  block us  reduction us  all-reduce us  reduction/all-reduce  partial floats\n",
               lay, (int)n, run.gpu, (int)run.sms, o->has_config ? (o->ep ? " (the EP16 rank's shape)" : " (the TP8 "
                                                                                                         "rank's shape)")
                                                                 : "",
               (int)e_local, ep ? BB_K3_EXPERTS : (int)e_local, (long long)inter, (long long)is, (int)run.copies,
               (long long)o->reps);
    else {
        printf("{\"layout\": \"%s\", \"ranks\": %d, \"shape\": \"%s\", \"gpu\": ", ep ? "ep" : "tp", (int)n,
               o->has_config ? (o->ep ? "ep16" : "tp8") : lay);
        k3_cli_json_string(stdout, run.gpu);
        printf(", \"experts\": %d, \"inter\": %lld, \"shared_inter\": %lld, \"copies\": %d, \"reps\": %lld, "
               "\"rows\": [",
               (int)e_local, (long long)inter, (long long)is, (int)run.copies, (long long)o->reps);
    }
    for (int jm = 0; jm < o->nm; jm++) {
        double worst[BR_VARIANTS] = {0};
        for (int32_t r = 0; r < n; r++)
            for (int j = 0; j < BR_VARIANTS; j++) {
                const double u = run.us[((size_t)r * (size_t)o->nm + (size_t)jm) * BR_VARIANTS + (size_t)j];
                if (u > worst[j]) worst[j] = u;
            }
        const double red = worst[0] - worst[1], ratio = worst[2] > 0 ? red / worst[2] : 0.0;
        if (!o->json) {
            printf("%5lld %14.1f %9.1f %13.1f %14.1f %21.2f %15zu\n", (long long)o->ms[jm], worst[0], worst[1], red,
                   worst[2], ratio, run.count[jm]);
        } else {
            printf("%s{\"m\": %lld, \"block_nccl_us\": %.3f, \"block_us\": %.3f, \"reduction_us\": %.3f, "
                   "\"allreduce_us\": %.3f, \"reduction_over_allreduce\": %.4f, \"partial_floats\": %zu, "
                   "\"block_nccl_us_per_rank\": [",
                   jm ? ", " : "", (long long)o->ms[jm], worst[0], worst[1], red, worst[2], ratio, run.count[jm]);
            for (int32_t r = 0; r < n; r++)
                printf("%s%.3f", r ? ", " : "", run.us[((size_t)r * (size_t)o->nm + (size_t)jm) * BR_VARIANTS]);
            printf("]}");
        }
    }
    if (o->json) printf("]}\n");
    rc = K3_EXIT_OK;
done:
    if (comms_made) k3_cli_nccl_free(&run.nc, comms, n, run.fail);
    if (bar_made) pthread_barrier_destroy(&run.bar);
    k3_cli_nccl_close(&run.nc);
    free(comms), free(k), free(th), free(run.us), free(run.count);
    return rc;
}
#endif
