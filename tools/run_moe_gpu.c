/* k3 run moe --tp N / --ep N --device cuda: the latent block as N ranks on GPUs 0..N-1, one host thread per GPU,
 * each with its own context on its device, its stream, and a plan whose k3_parallel_desc carries the rank's NCCL
 * communicator, so that k3_latent_moe_run reduces across the ranks itself (library-driven). The shards are cut on
 * the host by the CPU path's code (tools/run_moe_tp.c) and copied to each rank's GPU; rank 0's output is written. */
#define _POSIX_C_SOURCE 200809L /* pthread barriers */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_nccl.h"
#include "run_moe.h"

int k3_run_gpus_ready(const run_opts *o) {
    const int32_t have = k3_cli_gpu_count();
    if (have < o->tp) {
        fprintf(stderr,
                CMD ": --%s %d with --device cuda runs one rank per GPU and needs %d GPU%s; this process sees %d%s\n",
                o->ep ? "ep" : "tp", (int)o->tp, (int)o->tp, o->tp == 1 ? "" : "s", (int)have,
#ifdef K3_HAVE_CUDA
                ""
#else
                " (a build without CUDA)"
#endif
        );
        return 0;
    }
    k3_cli_nccl n;
    if (!k3_cli_nccl_open(&n, CMD)) return 0;
    k3_cli_nccl_close(&n);
    return 1;
}

#ifndef K3_HAVE_CUDA
int k3_run_gpus(const run_opts *o, run_setup *s, const k3_st_file *wf, const k3_st_file *xf, double t0) {
    (void)o, (void)s, (void)wf, (void)xf, (void)t0;
    fprintf(stderr, CMD ": this build has no CUDA backend\n");
    return K3_EXIT_FAIL;
}
#else
#include <cuda_runtime.h>
#include <pthread.h>

#include "bench_graph.h" /* k3_bench_sync: a wait that reports a hang instead of blocking forever */
#include "cli_mem.h"

/* One rank's thread. */
typedef struct gpu_rank {
    const run_opts *o;
    const run_setup *s;
    const k3_st_file *wf, *xf;
    const k3_latent_moe_desc *ld;
    int32_t rank, n;
    void *comm;
    pthread_barrier_t *bar;
    struct gpu_rank *all; /* every rank's (their ok flags, read after the barrier) */
    int ok;
    uint16_t *y; /* rank 0: the host output and routing */
    int32_t *ids;
    float *wts;
} gpu_rank;

static int rank_fail(gpu_rank *g, k3_ctx *ctx, const char *what, k3_status st) {
    fprintf(stderr, CMD ": rank %d (GPU %d): %s: %s: %s\n", (int)g->rank, (int)g->rank, what, k3_status_string(st),
            ctx ? k3_ctx_last_error(ctx) : "");
    return 0;
}

static int rank_cuda_fail(gpu_rank *g, const char *what, cudaError_t e) {
    fprintf(stderr, CMD ": rank %d (GPU %d): %s: %s\n", (int)g->rank, (int)g->rank, what, cudaGetErrorString(e));
    return 0;
}

/* Waits at the barrier; 1 when every rank is still ok (the collective below needs them all). */
static int all_ok(gpu_rank *g) {
    pthread_barrier_wait(g->bar);
    int ok = 1;
    for (int32_t r = 0; r < g->n; r++) ok = ok && g->all[r].ok;
    return ok;
}

/* The rank's weights on its GPU: its own cut buffers and the whole tensors (router, latent projections, norm). */
static int weights_in(gpu_rank *g, k3_cli_mem *mm, const k3_run_shard *cut, k3_latent_moe_weights *dw) {
    int ok = 1;
    *dw = cut->lw;
#define K3_RUN_GPU_IN(field)                                                                                          \
    (field) = k3_cli_mem_in(mm, (field),                                                                              \
                            k3_run_shard_bytes(cut, (field)) ? k3_run_shard_bytes(cut, (field))                      \
                                                             : k3_run_data_bytes(g->s, g->wf, g->xf, (field)),        \
                            &ok)
    K3_RUN_GPU_IN(dw->gate);
    K3_RUN_GPU_IN(dw->bias);
    K3_RUN_GPU_IN(dw->down_proj);
    K3_RUN_GPU_IN(dw->norm);
    K3_RUN_GPU_IN(dw->up_proj);
    K3_RUN_GPU_IN(dw->shared_gate_up);
    K3_RUN_GPU_IN(dw->shared_down);
    K3_RUN_GPU_IN(dw->experts.w13);
    K3_RUN_GPU_IN(dw->experts.w13_scale);
    K3_RUN_GPU_IN(dw->experts.w13_scale_2);
    K3_RUN_GPU_IN(dw->experts.w13_input_scale);
    K3_RUN_GPU_IN(dw->experts.w2);
    K3_RUN_GPU_IN(dw->experts.w2_scale);
    K3_RUN_GPU_IN(dw->experts.w2_scale_2);
    K3_RUN_GPU_IN(dw->experts.w2_input_scale);
    K3_RUN_GPU_IN(dw->experts.expert_map);
#undef K3_RUN_GPU_IN
    return ok;
}

static void *rank_main(void *arg) {
    gpu_rank *g = (gpu_rank *)arg;
    const run_setup *s = g->s;
    const int64_t m = s->m, k = s->md.top_k;
    k3_ctx *ctx = NULL;
    k3_latent_moe_plan *p = NULL;
    cudaStream_t stream = NULL;
    k3_cli_mem mm;
    int mm_made = 0;
    k3_run_shard cut;
    memset(&cut, 0, sizeof cut);
    k3_latent_moe_weights dw;
    void *ws = NULL, *dy = NULL;
    int32_t *dids = NULL;
    float *dwts = NULL;
    const void *dx = NULL;
    size_t wsb = 0;
    k3_status st;
    cudaError_t ce;
    g->ok = 1;
    if ((ce = cudaSetDevice((int)g->rank)) != cudaSuccess) {
        g->ok = rank_cuda_fail(g, "cudaSetDevice", ce);
        goto wait;
    }
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CUDA;
    opt.device = g->rank;
    if ((st = k3_ctx_create(&opt, &ctx)) != K3_STATUS_SUCCESS) {
        g->ok = rank_fail(g, NULL, "CUDA context", st);
        goto wait;
    }
    if (!k3_run_shard_cut(s, g->rank, g->n, g->o->ep, &cut)) {
        fprintf(stderr, CMD ": rank %d: out of host memory cutting its shard\n", (int)g->rank);
        g->ok = 0;
        goto wait;
    }
    k3_latent_moe_desc d;
    k3_run_shard_desc(g->ld, s, &cut, g->rank, g->n, g->o->ep, &d);
    d.parallel.nccl_comm = g->comm;
    if ((st = k3_latent_moe_plan_create(ctx, &d, &p)) != K3_STATUS_SUCCESS) {
        g->ok = rank_fail(g, ctx, "latent-MoE plan", st);
        goto wait;
    }
    k3_latent_moe_workspace_size(p, &wsb);
    k3_cli_mem_init(&mm, ctx);
    mm_made = 1;
    int in_ok = weights_in(g, &mm, &cut, &dw);
    dx = k3_cli_mem_in(&mm, s->x->data, s->x->nbytes, &in_ok);
    ws = k3_cli_mem_alloc(&mm, wsb);
    dy = k3_cli_mem_alloc(&mm, sizeof(uint16_t) * (size_t)(m * s->h));
    dids = (int32_t *)k3_cli_mem_alloc(&mm, sizeof(int32_t) * (size_t)(m * k));
    dwts = (float *)k3_cli_mem_alloc(&mm, sizeof(float) * (size_t)(m * k));
    if (!in_ok || !ws || !dy || !dids || !dwts) {
        fprintf(stderr, CMD ": rank %d (GPU %d): out of device memory\n", (int)g->rank, (int)g->rank);
        g->ok = 0;
        goto wait;
    }
    k3_run_shard_free(&cut); /* on the device now */
    if ((ce = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess)
        g->ok = rank_cuda_fail(g, "cudaStreamCreate", ce);
wait:
    /* every rank calls the collective or none does */
    if (!all_ok(g)) goto done;
    if ((st = k3_latent_moe_run(p, m, dx, &dw, NULL, dy, dids, dwts, ws, wsb, stream)) != K3_STATUS_SUCCESS) {
        g->ok = rank_fail(g, ctx, "latent-MoE run", st);
        goto done;
    }
    char err[512] = "";
    if (k3_bench_sync(stream, err, sizeof err) != K3_STATUS_SUCCESS) {
        fprintf(stderr, CMD ": rank %d (GPU %d): waiting for the run: %s\n", (int)g->rank, (int)g->rank, err);
        g->ok = 0;
        goto done;
    }
    if (g->rank == 0 && (!k3_cli_mem_out(&mm, g->y, dy, sizeof(uint16_t) * (size_t)(m * s->h)) ||
                         !k3_cli_mem_out(&mm, g->ids, dids, sizeof(int32_t) * (size_t)(m * k)) ||
                         !k3_cli_mem_out(&mm, g->wts, dwts, sizeof(float) * (size_t)(m * k)))) {
        fprintf(stderr, CMD ": rank 0: copying the results back from the device failed\n");
        g->ok = 0;
    }
done:
    if (stream) cudaStreamDestroy(stream);
    k3_latent_moe_plan_destroy(p);
    if (mm_made) k3_cli_mem_free(&mm);
    k3_run_shard_free(&cut);
    k3_ctx_destroy(ctx);
    return NULL;
}

int k3_run_gpus(const run_opts *o, run_setup *s, const k3_st_file *wf, const k3_st_file *xf, double t0) {
    const int32_t n = o->tp;
    if (!s->latent) {
        fprintf(stderr, CMD ": --%s %d --device cuda runs the whole latent block (the weights' router and latent "
                            "tensors, an input without topk_ids), whose ranks the library reduces through NCCL; the "
                            "experts alone split N ways run with --device cpu\n",
                o->ep ? "ep" : "tp", (int)n);
        return K3_EXIT_FAIL;
    }
    if (!k3_run_tp_check(s, n, o->ep)) return K3_EXIT_FAIL;
    int rc = K3_EXIT_FAIL;
    k3_cli_nccl nc;
    memset(&nc, 0, sizeof nc);
    void **comms = (void **)calloc((size_t)n, sizeof *comms);
    gpu_rank *g = (gpu_rank *)calloc((size_t)n, sizeof *g);
    pthread_t *th = (pthread_t *)calloc((size_t)n, sizeof *th);
    const size_t mk = (size_t)(s->m * s->md.top_k);
    uint16_t *y = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(s->m * s->h));
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * mk);
    float *wts = (float *)malloc(sizeof(float) * mk);
    pthread_barrier_t bar;
    int bar_made = 0, comms_made = 0, all = 1;
    if (!comms || !g || !th || !y || !ids || !wts) {
        fprintf(stderr, CMD ": out of host memory\n");
        goto done;
    }
    if (!k3_cli_nccl_open(&nc, CMD) || !(comms_made = k3_cli_nccl_comms(&nc, n, comms, CMD))) goto done;
    if (pthread_barrier_init(&bar, NULL, (unsigned)n) != 0) {
        fprintf(stderr, CMD ": pthread_barrier_init failed\n");
        goto done;
    }
    bar_made = 1;
    /* the ranks' weights: the host tensors, cut per rank by each thread */
    s->lw.gate = s->gate ? s->gate->data : NULL;
    s->lw.bias = s->bias ? (const float *)s->bias->data : NULL;
    s->lw.experts = s->mw;
    k3_latent_moe_desc ld;
    k3_run_latent_desc(o, s, &ld);
    fprintf(stderr, CMD ": %d %s ranks on GPUs 0..%d over NCCL\n", (int)n, o->ep ? "EP" : "TP", (int)n - 1);
    int32_t started = 0;
    for (int32_t r = 0; r < n; r++) {
        g[r] = (gpu_rank){o, s, wf, xf, &ld, r, n, comms[r], &bar, g, 1, y, ids, wts};
        if (pthread_create(&th[r], NULL, rank_main, &g[r]) != 0) {
            /* the barrier counts n threads: without all of them the started ones would wait forever */
            fprintf(stderr, CMD ": cannot start rank %d's thread\n", (int)r);
            exit(K3_EXIT_FAIL);
        }
        started++;
    }
    for (int32_t r = 0; r < started; r++) pthread_join(th[r], NULL);
    for (int32_t r = 0; r < n; r++) all = all && g[r].ok;
    if (all) rc = k3_run_finish(o, s, y, ids, wts, "cuda", t0);
done:
    if (comms_made) k3_cli_nccl_free(&nc, comms, n, !all);
    if (bar_made) pthread_barrier_destroy(&bar);
    k3_cli_nccl_close(&nc);
    free(comms), free(g), free(th), free(y), free(ids), free(wts);
    return rc;
}
#endif
