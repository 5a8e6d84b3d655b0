/* The latent block split over tensor-parallel ranks on the GPU: TP2 ranks cut from one full block (two plans on
 * one device), each PRE_REDUCE on CUDA, the partials summed, POST_REDUCE on CUDA; against the CPU backend's same
 * stages and its unsharded block (the CPU stages are checked against an fp64 evaluation by test_latent_tp); the
 * same with EP2 ranks (half the experts each, through the expert map on the device). Then
 * the library-driven mode through a one-rank NCCL communicator (the one machine has one GPU): the run with
 * parallel.nccl_comm against the stages, a CUDA graph of it replayed on a new x against the CPU block, and a
 * communicator that does not fit the plan refused; and the data-parallel tokens (parallel.tokens PER_RANK) through
 * it, bit for bit the replicated run, eager and in a replayed graph. Exits 77 without a CUDA device. */
#include <stdint.h>
#include <string.h>

#include "k3.h"
#include "test_util.h"

#ifndef K3_HAVE_CUDA
int main(void) { K3T_SKIP("built without CUDA"); }
#else

#include "k3t_harness_cuda.h"
#include "latent_data.h"
#include "latent_shard.h"

#ifdef K3_HAVE_NCCL
#include <dlfcn.h>
#include <pthread.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#endif

#define SEED 0x47545032ull /* "GTP2" */
#define TP 2

static k3_ctx *g_gpu, *g_cpu;
static cudaStream_t g_stream;

typedef struct block {
    k3_latent_moe_desc d;
    lat_data ld;              /* its host tensors */
    k3_latent_moe_weights hw; /* = ld.w */
} block;

static void block_make(block *b, k3t_rng *r) {
    memset(b, 0, sizeof *b);
    k3_latent_moe_desc *d = &b->d;
    k3_latent_moe_desc_init(d);
    d->hidden = d->router.hidden = 1024;
    d->router.num_experts = d->experts.num_experts = 56;
    d->router.top_k = d->experts.top_k = 8;
    d->experts.hidden = 512;
    d->experts.inter = 256;
    d->shared_inter = 256;
    d->max_tokens = 8;
    ld_make(&b->ld, d, r, 1);
    b->hw = b->ld.w;
}

static void block_free(block *b) { ld_free(&b->ld); }

/* Device copies of a rank's weights (the experts' sizes follow from its descriptor). */
typedef struct dweights {
    k3_latent_moe_weights w;
    void *p[16];
    int n;
} dweights;

static const void *dw_put(dweights *dw, const void *h, size_t bytes) {
    if (!h) return NULL;
    void *d = k3t_dup(h, bytes);
    dw->p[dw->n++] = d;
    return d;
}

static void dw_make(dweights *dw, const k3_latent_moe_desc *d, const k3_latent_moe_weights *hw) {
    memset(dw, 0, sizeof *dw);
    const int64_t h = d->hidden, l = d->experts.hidden, in = d->experts.inter, is = d->shared_inter;
    const int64_t e = d->experts.num_experts, eg = d->router.num_experts; /* EP: the router's are global */
    dw->w.gate = dw_put(dw, hw->gate, (size_t)(eg * h) * 2);
    dw->w.bias = (const float *)dw_put(dw, hw->bias, (size_t)eg * 4);
    dw->w.down_proj = dw_put(dw, hw->down_proj, (size_t)(l * h) * 2);
    dw->w.norm = dw_put(dw, hw->norm, (size_t)l * 2);
    dw->w.up_proj = dw_put(dw, hw->up_proj, (size_t)(h * l) * 2);
    dw->w.shared_gate_up = dw_put(dw, hw->shared_gate_up, (size_t)(2 * is * h) * 2);
    dw->w.shared_down = dw_put(dw, hw->shared_down, (size_t)(h * is) * 2);
    const k3_moe_weights *x = &hw->experts;
    k3_moe_weights *o = &dw->w.experts;
    o->w13 = dw_put(dw, x->w13, (size_t)(e * 2 * in * l / 2));
    o->w13_scale = dw_put(dw, x->w13_scale, (size_t)(e * 2 * in * l / 16));
    o->w2 = dw_put(dw, x->w2, (size_t)(e * l * in / 2));
    o->w2_scale = dw_put(dw, x->w2_scale, (size_t)(e * l * in / 16));
    o->w13_scale_2 = (const float *)dw_put(dw, x->w13_scale_2, (size_t)e * 4 * (d->experts.w13_separate_scale_2 ? 2 : 1));
    o->w2_scale_2 = (const float *)dw_put(dw, x->w2_scale_2, (size_t)e * 4);
    if (d->experts.global_experts > 0)
        o->expert_map = (const int32_t *)dw_put(dw, x->expert_map, (size_t)d->experts.global_experts * 4);
}

static void dw_free(dweights *dw) {
    for (int i = 0; i < dw->n; i++) cudaFree(dw->p[i]);
}

static void *ws_of(k3_latent_moe_plan *p, size_t *bytes, int device) {
    *bytes = 0;
    k3_latent_moe_workspace_size(p, bytes);
    if (device) return k3t_dalloc(*bytes);
    return malloc(*bytes ? *bytes : 1);
}

/* y of the TP ranks through the stages, on one backend: device 0 = the CPU (host buffers), 1 = CUDA. */
static int tp_stages(const block *b, const k3t_tp_shard *sh, const k3_latent_moe_weights *hw_rank, int device,
                     int64_t m, const uint16_t *x, const uint16_t *res, uint16_t *y, int32_t *ids) {
    k3_ctx *ctx = device ? g_gpu : g_cpu;
    const int64_t h = b->d.hidden, k = b->d.experts.top_k;
    k3_latent_moe_plan *p[TP] = {0};
    void *ws[TP] = {0};
    size_t wsb[TP] = {0}, count = 0;
    dweights dw[TP];
    memset(dw, 0, sizeof dw);
    float *sum = NULL, *part = NULL, *dpart[TP] = {0};
    void *dx = device ? k3t_dup(x, (size_t)(m * h) * 2) : (void *)x;
    void *dres = device ? k3t_dup(res, (size_t)(m * h) * 2) : (void *)res;
    void *dy = device ? k3t_dalloc((size_t)(m * h) * 2) : (void *)y;
    int32_t *dids = device ? (int32_t *)k3t_dalloc((size_t)(m * k) * 4) : ids;
    int ok = 1;
    for (int r = 0; r < TP && ok; r++) {
        ok = k3_latent_moe_plan_create(ctx, &sh[r].d, &p[r]) == K3_STATUS_SUCCESS;
        CHECK(ok, "%s rank %d plan: %s", device ? "cuda" : "cpu", r, k3_ctx_last_error(ctx));
        if (!ok) break;
        ws[r] = ws_of(p[r], &wsb[r], device);
        k3_latent_moe_partial_count(p[r], m, &count);
        if (device) {
            dw_make(&dw[r], &sh[r].d, &hw_rank[r]);
            dpart[r] = (float *)k3t_dalloc(count * 4);
        } else {
            dpart[r] = (float *)malloc(count * 4);
        }
        const k3_latent_moe_weights *w = device ? &dw[r].w : &hw_rank[r];
        const k3_status st = k3_latent_moe_run_stage(p[r], K3_LATENT_PRE_REDUCE, m, dx, w, NULL, NULL, dpart[r],
                                                     dids, NULL, ws[r], wsb[r], device ? g_stream : NULL);
        ok = st == K3_STATUS_SUCCESS;
        CHECK(ok, "%s rank %d pre: %s", device ? "cuda" : "cpu", r, k3_ctx_last_error(ctx));
    }
    if (ok) {
        /* the reduction, on the host in rank order (an engine's all-reduce) */
        sum = (float *)calloc(count, 4);
        part = (float *)malloc(count * 4);
        for (int r = 0; r < TP; r++) {
            if (device) {
                K3T_CU(cudaStreamSynchronize(g_stream));
                K3T_CU(cudaMemcpy(part, dpart[r], count * 4, cudaMemcpyDeviceToHost));
            } else {
                memcpy(part, dpart[r], count * 4);
            }
            for (size_t i = 0; i < count; i++) sum[i] += part[i];
        }
        if (device) (void)k3t_to_device(dpart[0], sum, count * 4);
        float *in = device ? dpart[0] : sum;
        const k3_latent_moe_weights *w = device ? &dw[0].w : &hw_rank[0];
        const k3_status st = k3_latent_moe_run_stage(p[0], K3_LATENT_POST_REDUCE, m, NULL, w, dres, dy, in, NULL, NULL,
                                                     ws[0], wsb[0], device ? g_stream : NULL);
        ok = st == K3_STATUS_SUCCESS;
        CHECK(ok, "%s post: %s", device ? "cuda" : "cpu", k3_ctx_last_error(ctx));
        if (ok && device) {
            K3T_CU(cudaStreamSynchronize(g_stream));
            K3T_CU(cudaMemcpy(y, dy, (size_t)(m * h) * 2, cudaMemcpyDeviceToHost));
            K3T_CU(cudaMemcpy(ids, dids, (size_t)(m * k) * 4, cudaMemcpyDeviceToHost));
        }
    }
    for (int r = 0; r < TP; r++) {
        k3_latent_moe_plan_destroy(p[r]);
        if (device) {
            cudaFree(ws[r]), cudaFree(dpart[r]);
            dw_free(&dw[r]);
        } else {
            free(ws[r]), free(dpart[r]);
        }
    }
    if (device) cudaFree(dx), cudaFree(dres), cudaFree(dy), cudaFree(dids);
    free(sum), free(part);
    return ok;
}

static void test_tp_stages(const block *b, k3t_rng *r, int ep) {
    k3t_case_enter(ep ? "ep2 stages" : "tp2 stages", ep ? 1 : 0);
    const char *tag = ep ? "ep2" : "tp2";
    const int64_t m = 4, h = b->d.hidden, k = b->d.experts.top_k, n = m * h;
    uint16_t *x = md_bf16_normal(r, n, 1.0), *res = md_bf16_normal(r, n, 1.0);
    k3t_tp_shard sh[TP];
    k3_latent_moe_weights hw[TP];
    for (int rk = 0; rk < TP; rk++) {
        if (ep)
            k3t_ep_cut(&sh[rk], &b->d, &b->hw.experts, b->ld.sgu, b->ld.sdown, rk, TP);
        else
            k3t_tp_cut(&sh[rk], &b->d, &b->hw.experts, b->ld.sgu, b->ld.sdown, rk, TP);
        hw[rk] = k3t_tp_weights(&sh[rk], &b->hw);
    }
    uint16_t *yc = (uint16_t *)malloc((size_t)n * 2), *yg = (uint16_t *)malloc((size_t)n * 2);
    uint16_t *yfull = (uint16_t *)malloc((size_t)n * 2);
    int32_t *idc = (int32_t *)malloc((size_t)(m * k) * 4), *idg = (int32_t *)malloc((size_t)(m * k) * 4);
    int32_t *idf = (int32_t *)malloc((size_t)(m * k) * 4);
    const int okc = tp_stages(b, sh, hw, 0, m, x, res, yc, idc);
    const int okg = tp_stages(b, sh, hw, 1, m, x, res, yg, idg);
    /* the unsharded block on the CPU */
    k3_latent_moe_plan *pf = NULL;
    size_t wsf = 0;
    int okf = k3_latent_moe_plan_create(g_cpu, &b->d, &pf) == K3_STATUS_SUCCESS;
    void *hws = okf ? ws_of(pf, &wsf, 0) : NULL;
    okf = okf && k3_latent_moe_run(pf, m, x, &b->hw, res, yfull, idf, NULL, hws, wsf, NULL) == K3_STATUS_SUCCESS;
    CHECK(okf, "cpu unsharded block: %s", k3_ctx_last_error(g_cpu));
    if (okc && okg && okf) {
        char what[96];
        snprintf(what, sizeof what, "%s routing: cuda vs cpu", tag);
        k3t_check_same(what, idg, idc, K3T_I32, m * k);
        snprintf(what, sizeof what, "%s routing: cpu vs the unsharded block", tag);
        k3t_check_same(what, idc, idf, K3T_I32, m * k);
        snprintf(what, sizeof what, "%s y: cuda stages vs cpu stages", tag);
        const double e1 =
            k3t_check_close(what, k3t_view1(yg, K3T_BF16, n), k3t_view1(yc, K3T_BF16, n), K3T_OP_LATENT_MOE).metric;
        snprintf(what, sizeof what, "%s y: cuda stages vs the unsharded cpu block", tag);
        const double e2 =
            k3t_check_close(what, k3t_view1(yg, K3T_BF16, n), k3t_view1(yfull, K3T_BF16, n), K3T_OP_LATENT_MOE).metric;
        printf("%s stages: y rel-L2 %.3e vs the cpu stages, %.3e vs the unsharded cpu block\n", tag, e1, e2);
    }
    k3_latent_moe_plan_destroy(pf);
    free(hws);
    for (int rk = 0; rk < TP; rk++) k3t_tp_free(&sh[rk]);
    free(x), free(res), free(yc), free(yg), free(yfull), free(idc), free(idg), free(idf);
}

#ifdef K3_HAVE_NCCL
typedef ncclResult_t (*uid_fn)(ncclUniqueId *);
typedef ncclResult_t (*init_fn)(ncclComm_t *, int, ncclUniqueId, int);
typedef ncclResult_t (*destroy_fn)(ncclComm_t);

/* Data-parallel tokens through the one-rank communicator: the PER_RANK run (all-gather, PRE_REDUCE on the gathered
 * rows, grouped reduce-scatter, POST_REDUCE) is bit for bit the REPLICATED run of the same tokens (a gather and a
 * reduce-scatter of one rank are copies), its routing too; a captured graph of it replayed on a new x as well; and
 * the gathered tokens beyond max_tokens are the capacity status. */
static void test_nccl_per_rank(const block *b, k3t_rng *r, ncclComm_t comm) {
    k3t_case_enter("nccl one rank, per-rank tokens", 2);
    const int64_t m = 3, h = b->d.hidden, k = b->d.experts.top_k, n = m * h;
    k3_latent_moe_desc drep = b->d;
    drep.parallel.layout = K3_PARALLEL_TP;
    drep.parallel.nccl_comm = comm;
    k3_latent_moe_desc ddp = drep;
    ddp.parallel.tokens = K3_TOKENS_PER_RANK;
    k3_latent_moe_plan *prep = NULL, *pdp = NULL;
    CHECK(k3_latent_moe_plan_create(g_gpu, &drep, &prep) == K3_STATUS_SUCCESS, "replicated plan: %s",
          k3_ctx_last_error(g_gpu));
    CHECK(k3_latent_moe_plan_create(g_gpu, &ddp, &pdp) == K3_STATUS_SUCCESS, "per-rank plan: %s",
          k3_ctx_last_error(g_gpu));
    if (prep && pdp) {
        dweights dw;
        dw_make(&dw, &b->d, &b->hw);
        uint16_t *x = md_bf16_normal(r, n, 1.0), *res = md_bf16_normal(r, n, 1.0);
        uint16_t *y1 = (uint16_t *)malloc((size_t)n * 2), *y2 = (uint16_t *)malloc((size_t)n * 2);
        int32_t *i1 = (int32_t *)malloc((size_t)(m * k) * 4), *i2 = (int32_t *)malloc((size_t)(m * k) * 4);
        float *w1 = (float *)malloc((size_t)(m * k) * 4), *w2 = (float *)malloc((size_t)(m * k) * 4);
        size_t wr = 0, wd = 0;
        void *dwr = ws_of(prep, &wr, 1), *dwd = ws_of(pdp, &wd, 1);
        void *dx = k3t_dup(x, (size_t)n * 2), *dres = k3t_dup(res, (size_t)n * 2);
        void *dy1 = k3t_dalloc((size_t)n * 2), *dy2 = k3t_dalloc((size_t)n * 2);
        int32_t *di1 = (int32_t *)k3t_dalloc((size_t)(m * k) * 4), *di2 = (int32_t *)k3t_dalloc((size_t)(m * k) * 4);
        float *dw1 = (float *)k3t_dalloc((size_t)(m * k) * 4), *dw2 = (float *)k3t_dalloc((size_t)(m * k) * 4);
        /* run 0: eager; run 1: a captured graph of the per-rank run, replayed on a new x */
        for (int run = 0; run < 2; run++) {
            const char *tag = run ? "graph replay on a new x" : "eager";
            k3_status st = K3_STATUS_SUCCESS;
            if (run) {
                cudaGraph_t gr = NULL;
                cudaGraphExec_t ex = NULL;
                int launched = 0;
                if (k3t_cuda_ok(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal), "dp capture")) {
                    st = k3_latent_moe_run(pdp, m, dx, &dw.w, dres, dy2, di2, dw2, dwd, wd, g_stream);
                    const cudaError_t ce = cudaStreamEndCapture(g_stream, &gr);
                    CHECK(st == K3_STATUS_SUCCESS && ce == cudaSuccess, "dp capture: %s / %s",
                          k3_ctx_last_error(g_gpu), cudaGetErrorString(ce));
                    if (st == K3_STATUS_SUCCESS && ce == cudaSuccess &&
                        k3t_cuda_ok(cudaGraphInstantiate(&ex, gr, 0), "dp graph instantiate")) {
                        for (int64_t i = 0; i < n; i++) x[i] = k3_bf16_from_f32((float)k3t_normal(r));
                        K3T_CU(cudaMemcpy(dx, x, (size_t)n * 2, cudaMemcpyHostToDevice));
                        K3T_CU(cudaMemset(dy2, 0xff, (size_t)n * 2));
                        K3T_CU(cudaDeviceSynchronize()); /* the copies ran on the legacy stream */
                        launched = k3t_cuda_ok(cudaGraphLaunch(ex, g_stream), "dp graph launch");
                    }
                }
                if (ex) cudaGraphExecDestroy(ex);
                if (gr) cudaGraphDestroy(gr);
                if (!launched) break;
            } else {
                st = k3_latent_moe_run(pdp, m, dx, &dw.w, dres, dy2, di2, dw2, dwd, wd, g_stream);
                CHECK(st == K3_STATUS_SUCCESS, "per-rank run: %s", k3_ctx_last_error(g_gpu));
            }
            const k3_status sr = k3_latent_moe_run(prep, m, dx, &dw.w, dres, dy1, di1, dw1, dwr, wr, g_stream);
            CHECK(sr == K3_STATUS_SUCCESS, "replicated run: %s", k3_ctx_last_error(g_gpu));
            if (st != K3_STATUS_SUCCESS || sr != K3_STATUS_SUCCESS) break;
            K3T_CU(cudaStreamSynchronize(g_stream));
            K3T_CU(cudaMemcpy(y1, dy1, (size_t)n * 2, cudaMemcpyDeviceToHost));
            K3T_CU(cudaMemcpy(y2, dy2, (size_t)n * 2, cudaMemcpyDeviceToHost));
            K3T_CU(cudaMemcpy(i1, di1, (size_t)(m * k) * 4, cudaMemcpyDeviceToHost));
            K3T_CU(cudaMemcpy(i2, di2, (size_t)(m * k) * 4, cudaMemcpyDeviceToHost));
            K3T_CU(cudaMemcpy(w1, dw1, (size_t)(m * k) * 4, cudaMemcpyDeviceToHost));
            K3T_CU(cudaMemcpy(w2, dw2, (size_t)(m * k) * 4, cudaMemcpyDeviceToHost));
            char what[96];
            snprintf(what, sizeof what, "per-rank vs replicated y (%s)", tag);
            const int same = k3t_check_same(what, y2, y1, K3T_BF16, n);
            snprintf(what, sizeof what, "per-rank vs replicated topk_ids (%s)", tag);
            k3t_check_same(what, i2, i1, K3T_I32, m * k);
            snprintf(what, sizeof what, "per-rank vs replicated topk_weights (%s)", tag);
            k3t_check_same(what, w2, w1, K3T_F32, m * k);
            printf("nccl one rank, per-rank tokens (%s): y %s the replicated run\n", tag,
                   same ? "bitwise equal to" : "DIFFERS from");
        }
        /* the gathered tokens beyond the plan (one rank: m = max_tokens + 1) */
        const k3_status so = k3_latent_moe_run(pdp, b->d.max_tokens + 1, dx, &dw.w, NULL, dy2, NULL, NULL, dwd, wd,
                                               g_stream);
        CHECK(so == K3_STATUS_INVALID_ARGUMENT && strstr(k3_ctx_last_error(g_gpu), "too many tokens for this plan"),
              "per-rank run beyond max_tokens: %s (%s)", k3_status_string(so), k3_ctx_last_error(g_gpu));
        cudaFree(dwr), cudaFree(dwd), cudaFree(dx), cudaFree(dres), cudaFree(dy1), cudaFree(dy2);
        cudaFree(di1), cudaFree(di2), cudaFree(dw1), cudaFree(dw2);
        free(x), free(res), free(y1), free(y2), free(i1), free(i2), free(w1), free(w2);
        dw_free(&dw);
    }
    k3_latent_moe_plan_destroy(prep), k3_latent_moe_plan_destroy(pdp);
}

typedef ncclResult_t (*init_all_fn)(ncclComm_t *, int, const int *);

/* One rank's library-driven run on its own thread (NCCL's collectives need every rank calling at once); the
 * checks are made by the main thread afterwards. */
typedef struct dp_gpu_rank {
    int device;
    k3_ctx *ctx;
    k3_latent_moe_plan *plan;
    const k3_latent_moe_weights *w;
    int64_t m;
    const void *x, *res;
    void *y, *ws;
    int32_t *ids;
    size_t ws_bytes;
    cudaStream_t stream;
    k3_status st;
    cudaError_t ce;
    char err[1024];
} dp_gpu_rank;

static void *dp_gpu_rank_run(void *arg) {
    dp_gpu_rank *g = (dp_gpu_rank *)arg;
    g->st = K3_STATUS_CUDA_ERROR;
    g->ce = cudaSetDevice(g->device);
    if (g->ce != cudaSuccess) return NULL;
    g->st = k3_latent_moe_run(g->plan, g->m, g->x, g->w, g->res, g->y, g->ids, NULL, g->ws, g->ws_bytes, g->stream);
    if (g->st != K3_STATUS_SUCCESS) {
        snprintf(g->err, sizeof g->err, "%s", k3_ctx_last_error(g->ctx));
        return NULL;
    }
    g->ce = cudaStreamSynchronize(g->stream);
    return NULL;
}

/* Two GPUs, one thread each, over a two-rank communicator: TP2 and EP2 ranks with their own m tokens
 * (parallel.tokens PER_RANK). Each rank's library-driven y against the same plans' stages with the reduce-scatter
 * done on the host (bitwise: a sum of two partials has one order), its routing against the gathered routing's
 * rows, and all of y against the CPU backend's stages on the gathered tokens. Skipped with fewer than 2 GPUs. */
static void test_nccl_two_gpus(const block *b, k3t_rng *r, void *lib, int ep) {
    enum { S = 2 };
    const char *tag = ep ? "ep2" : "tp2";
    char what[128];
    snprintf(what, sizeof what, "nccl two gpus, %s, per-rank tokens", tag);
    k3t_case_enter(what, 3 + (uint64_t)ep);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < S) {
        printf("SKIP %s: %d CUDA device(s), 2 needed\n", what, ndev);
        return;
    }
    init_all_fn init_all = (init_all_fn)dlsym(lib, "ncclCommInitAll");
    destroy_fn destroy = (destroy_fn)dlsym(lib, "ncclCommDestroy");
    ncclComm_t comm[S] = {0};
    const int devs[S] = {0, 1};
    const int made = init_all && destroy && init_all(comm, S, devs) == ncclSuccess;
    CHECK(made, "%s: ncclCommInitAll of devices 0 and 1", what);
    if (!made) return;
    const int64_t m = 3, mg = S * m, h = b->d.hidden, k = b->d.experts.top_k, l = b->d.experts.hidden;
    const int64_t hs = b->d.shared_inter > 0 ? h : 0;
    uint16_t *xg = md_bf16_normal(r, mg * h, 1.0), *resg = md_bf16_normal(r, mg * h, 1.0);
    k3t_tp_shard sh[S];
    k3_latent_moe_weights hw[S];
    for (int rk = 0; rk < S; rk++) {
        if (ep)
            k3t_ep_cut(&sh[rk], &b->d, &b->hw.experts, b->ld.sgu, b->ld.sdown, rk, S);
        else
            k3t_tp_cut(&sh[rk], &b->d, &b->hw.experts, b->ld.sgu, b->ld.sdown, rk, S);
        sh[rk].d.parallel.tokens = K3_TOKENS_PER_RANK;
        hw[rk] = k3t_tp_weights(&sh[rk], &b->hw);
    }
    /* the CPU backend's stages of the same ranks on all the gathered tokens (row by row what each rank owns) */
    uint16_t *ycpu = (uint16_t *)malloc((size_t)(mg * h) * 2), *ylib = (uint16_t *)malloc((size_t)(mg * h) * 2);
    uint16_t *ystage = (uint16_t *)malloc((size_t)(mg * h) * 2);
    int32_t *idcpu = (int32_t *)malloc((size_t)(mg * k) * 4), *idlib = (int32_t *)malloc((size_t)(mg * k) * 4);
    int32_t *idstage = (int32_t *)malloc((size_t)(mg * k) * 4);
    const int okc = tp_stages(b, sh, hw, 0, mg, xg, resg, ycpu, idcpu);

    k3_ctx *ctx[S] = {0};
    cudaStream_t st[S] = {0};
    k3_latent_moe_plan *p[S] = {0};
    dweights dw[S];
    memset(dw, 0, sizeof dw);
    void *ws[S] = {0}, *dx[S] = {0}, *dres[S] = {0}, *dy[S] = {0}, *dxg[S] = {0};
    int32_t *dids[S] = {0};
    float *dpart[S] = {0};
    size_t wsb[S] = {0}, count = 0, lcount = 0;
    int ok = okc;
    for (int rk = 0; rk < S && ok; rk++) {
        K3T_CU(cudaSetDevice(rk));
        k3_ctx_options opt;
        k3_ctx_options_init(&opt);
        opt.backend = K3_BACKEND_CUDA;
        opt.device = rk;
        ok = k3_ctx_create(&opt, &ctx[rk]) == K3_STATUS_SUCCESS;
        CHECK(ok, "%s: CUDA context on device %d", what, rk);
        if (!ok) break;
        K3T_CU(cudaStreamCreateWithFlags(&st[rk], cudaStreamNonBlocking));
        k3_latent_moe_desc d = sh[rk].d;
        d.parallel.nccl_comm = comm[rk];
        ok = k3_latent_moe_plan_create(ctx[rk], &d, &p[rk]) == K3_STATUS_SUCCESS;
        CHECK(ok, "%s: rank %d plan: %s", what, rk, k3_ctx_last_error(ctx[rk]));
        if (!ok) break;
        ws[rk] = ws_of(p[rk], &wsb[rk], 1);
        dw_make(&dw[rk], &sh[rk].d, &hw[rk]);
        dx[rk] = k3t_dup(xg + rk * m * h, (size_t)(m * h) * 2);
        dres[rk] = k3t_dup(resg + rk * m * h, (size_t)(m * h) * 2);
        dxg[rk] = k3t_dup(xg, (size_t)(mg * h) * 2);
        dy[rk] = k3t_dalloc((size_t)(m * h) * 2);
        dids[rk] = (int32_t *)k3t_dalloc((size_t)(mg * k) * 4);
        k3_latent_moe_partial_count(p[rk], mg, &count);
        k3_latent_moe_partial_count(p[rk], m, &lcount);
        dpart[rk] = (float *)k3t_dalloc(count * 4);
    }
    if (ok) {
        dp_gpu_rank g[S];
        pthread_t th[S];
        memset(g, 0, sizeof g);
        int started[S] = {0};
        for (int rk = 0; rk < S; rk++) {
            g[rk] = (dp_gpu_rank){.device = rk, .ctx = ctx[rk], .plan = p[rk], .w = &dw[rk].w, .m = m, .x = dx[rk],
                                  .res = dres[rk], .y = dy[rk], .ws = ws[rk], .ids = dids[rk], .ws_bytes = wsb[rk],
                                  .stream = st[rk]};
            started[rk] = pthread_create(&th[rk], NULL, dp_gpu_rank_run, &g[rk]) == 0;
            CHECK(started[rk], "%s: thread of rank %d", what, rk);
        }
        for (int rk = 0; rk < S; rk++)
            if (started[rk]) pthread_join(th[rk], NULL);
        for (int rk = 0; rk < S; rk++) {
            CHECK(started[rk] && g[rk].st == K3_STATUS_SUCCESS && g[rk].ce == cudaSuccess,
                  "%s: rank %d library-driven run: %s / %s", what, rk, g[rk].err, cudaGetErrorString(g[rk].ce));
            ok &= started[rk] && g[rk].st == K3_STATUS_SUCCESS && g[rk].ce == cudaSuccess;
        }
    }
    if (ok) {
        /* the same plans' stages, the reduce-scatter on the host */
        float *sum = (float *)calloc(count, 4), *part = (float *)malloc(count * 4), *local = (float *)malloc(lcount * 4);
        for (int rk = 0; rk < S && ok; rk++) {
            K3T_CU(cudaSetDevice(rk));
            K3T_CU(cudaMemcpy(ylib + rk * m * h, dy[rk], (size_t)(m * h) * 2, cudaMemcpyDeviceToHost));
            K3T_CU(cudaMemcpy(idlib + rk * m * k, dids[rk], (size_t)(m * k) * 4, cudaMemcpyDeviceToHost));
            const k3_status s1 = k3_latent_moe_run_stage(p[rk], K3_LATENT_PRE_REDUCE, mg, dxg[rk], &dw[rk].w, NULL,
                                                         NULL, dpart[rk], dids[rk], NULL, ws[rk], wsb[rk], st[rk]);
            CHECK(s1 == K3_STATUS_SUCCESS, "%s: rank %d pre: %s", what, rk, k3_ctx_last_error(ctx[rk]));
            ok &= s1 == K3_STATUS_SUCCESS;
            K3T_CU(cudaStreamSynchronize(st[rk]));
            K3T_CU(cudaMemcpy(part, dpart[rk], count * 4, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < count; i++) sum[i] += part[i];
            if (rk == 0) K3T_CU(cudaMemcpy(idstage, dids[rk], (size_t)(mg * k) * 4, cudaMemcpyDeviceToHost));
        }
        for (int rk = 0; rk < S && ok; rk++) {
            K3T_CU(cudaSetDevice(rk));
            memcpy(local, sum + rk * m * l, (size_t)(m * l) * 4);
            if (hs) memcpy(local + m * l, sum + mg * l + rk * m * hs, (size_t)(m * hs) * 4);
            (void)k3t_to_device(dpart[rk], local, lcount * 4);
            const k3_status s2 = k3_latent_moe_run_stage(p[rk], K3_LATENT_POST_REDUCE, m, NULL, &dw[rk].w, dres[rk],
                                                         dy[rk], dpart[rk], NULL, NULL, ws[rk], wsb[rk], st[rk]);
            CHECK(s2 == K3_STATUS_SUCCESS, "%s: rank %d post: %s", what, rk, k3_ctx_last_error(ctx[rk]));
            ok &= s2 == K3_STATUS_SUCCESS;
            K3T_CU(cudaStreamSynchronize(st[rk]));
            K3T_CU(cudaMemcpy(ystage + rk * m * h, dy[rk], (size_t)(m * h) * 2, cudaMemcpyDeviceToHost));
        }
        if (ok) {
            snprintf(what, sizeof what, "%s per-rank tokens: the library-driven y vs the stages", tag);
            const int same = k3t_check_same(what, ylib, ystage, K3T_BF16, mg * h);
            snprintf(what, sizeof what, "%s per-rank tokens: each rank's routing vs its rows of the gathered", tag);
            k3t_check_same(what, idlib, idstage, K3T_I32, mg * k);
            snprintf(what, sizeof what, "%s per-rank tokens: the gathered routing, cuda vs cpu", tag);
            k3t_check_same(what, idstage, idcpu, K3T_I32, mg * k);
            snprintf(what, sizeof what, "%s per-rank tokens: y of both gpus vs the cpu stages", tag);
            const double e = k3t_check_close(what, k3t_view1(ylib, K3T_BF16, mg * h), k3t_view1(ycpu, K3T_BF16, mg * h),
                                             K3T_OP_LATENT_MOE)
                                 .metric;
            printf("nccl two gpus, %s, per-rank tokens: y %s the stages; rel-L2 %.3e vs the cpu stages\n", tag,
                   same ? "bitwise equal to" : "DIFFERS from", e);
        }
        free(sum), free(part), free(local);
    }
    for (int rk = 0; rk < S; rk++) {
        if (ctx[rk]) {
            cudaSetDevice(rk);
            k3_latent_moe_plan_destroy(p[rk]);
            cudaFree(ws[rk]), cudaFree(dx[rk]), cudaFree(dres[rk]), cudaFree(dxg[rk]), cudaFree(dy[rk]);
            cudaFree(dids[rk]), cudaFree(dpart[rk]);
            dw_free(&dw[rk]);
            if (st[rk]) cudaStreamDestroy(st[rk]);
            k3_ctx_destroy(ctx[rk]);
        }
        destroy(comm[rk]);
        k3t_tp_free(&sh[rk]);
    }
    K3T_CU(cudaSetDevice(0));
    free(xg), free(resg), free(ycpu), free(ylib), free(ystage), free(idcpu), free(idlib), free(idstage);
}

/* One rank of one: the library-driven run against the stages (bitwise: the same kernels around a one-rank sum), a
 * captured graph of it replayed on a new x against the CPU block, and a communicator that does not fit refused. */
static void test_nccl_one_rank(const block *b, k3t_rng *r) {
    k3t_case_enter("nccl one rank", 0);
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("SKIP nccl one rank: libnccl.so.2 cannot be opened (%s)\n", dlerror());
        return;
    }
    uid_fn get_uid = (uid_fn)dlsym(lib, "ncclGetUniqueId");
    init_fn init = (init_fn)dlsym(lib, "ncclCommInitRank");
    destroy_fn destroy = (destroy_fn)dlsym(lib, "ncclCommDestroy");
    typedef const char *(*errstr_fn)(ncclResult_t);
    errstr_fn errstr = (errstr_fn)dlsym(lib, "ncclGetErrorString");
    ncclUniqueId uid;
    ncclComm_t comm = NULL;
    ncclResult_t e1 = ncclSuccess, e2 = ncclSuccess;
    const int made = get_uid && init && destroy && (e1 = get_uid(&uid)) == ncclSuccess &&
                     (e2 = init(&comm, 1, uid, 0)) == ncclSuccess;
    CHECK(made, "a one-rank NCCL communicator: ncclGetUniqueId %s, ncclCommInitRank %s",
          errstr ? errstr(e1) : "?", errstr ? errstr(e2) : "?");
    if (!made) {
        dlclose(lib);
        return;
    }
    const int64_t m = 3, h = b->d.hidden, n = m * h;
    k3_latent_moe_desc d = b->d;
    d.parallel.layout = K3_PARALLEL_TP;
    d.parallel.nccl_comm = comm;
    k3_latent_moe_desc d_stage = d;
    d_stage.parallel.nccl_comm = NULL;
    k3_latent_moe_plan *pl = NULL, *ps = NULL, *pc = NULL;
    CHECK(k3_latent_moe_plan_create(g_gpu, &d, &pl) == K3_STATUS_SUCCESS, "nccl plan: %s", k3_ctx_last_error(g_gpu));
    CHECK(k3_latent_moe_plan_create(g_gpu, &d_stage, &ps) == K3_STATUS_SUCCESS, "stage plan: %s",
          k3_ctx_last_error(g_gpu));
    CHECK(k3_latent_moe_plan_create(g_cpu, &b->d, &pc) == K3_STATUS_SUCCESS, "cpu plan: %s", k3_ctx_last_error(g_cpu));
    /* a plan of rank 0 of 2 with a one-rank communicator */
    k3_latent_moe_desc bad = d;
    bad.parallel.size = 2;
    bad.experts.inter /= 2, bad.shared_inter /= 2;
    k3_latent_moe_plan *pb = NULL;
    const k3_status sb = k3_latent_moe_plan_create(g_gpu, &bad, &pb);
    CHECK(sb == K3_STATUS_COMM_ERROR && !pb && strstr(k3_ctx_last_error(g_gpu), "rank 0 of 1"),
          "a communicator that does not fit: %s (%s)", k3_status_string(sb), k3_ctx_last_error(g_gpu));
    printf("nccl: a one-rank communicator for a plan of 2 ranks: %s, \"%s\"\n", k3_status_string(sb),
           k3_ctx_last_error(g_gpu));
    if (pl && ps && pc) {
        dweights dw;
        dw_make(&dw, &b->d, &b->hw);
        uint16_t *x = md_bf16_normal(r, n, 1.0), *res = md_bf16_normal(r, n, 1.0);
        uint16_t *y1 = (uint16_t *)malloc((size_t)n * 2), *y2 = (uint16_t *)malloc((size_t)n * 2);
        uint16_t *yc = (uint16_t *)malloc((size_t)n * 2);
        size_t wl = 0, wsz = 0, wc = 0, count = 0;
        void *dwl = ws_of(pl, &wl, 1), *dws = ws_of(ps, &wsz, 1), *hwc = ws_of(pc, &wc, 0);
        k3_latent_moe_partial_count(ps, m, &count);
        float *dpart = (float *)k3t_dalloc(count * 4);
        void *dx = k3t_dup(x, (size_t)n * 2), *dres = k3t_dup(res, (size_t)n * 2), *dy = k3t_dalloc((size_t)n * 2);
        k3_status st = k3_latent_moe_run(pl, m, dx, &dw.w, dres, dy, NULL, NULL, dwl, wl, g_stream);
        CHECK(st == K3_STATUS_SUCCESS, "library-driven run: %s", k3_ctx_last_error(g_gpu));
        K3T_CU(cudaStreamSynchronize(g_stream));
        K3T_CU(cudaMemcpy(y1, dy, (size_t)n * 2, cudaMemcpyDeviceToHost));
        st = k3_latent_moe_run_stage(ps, K3_LATENT_PRE_REDUCE, m, dx, &dw.w, NULL, NULL, dpart, NULL, NULL, dws, wsz,
                                     g_stream);
        if (st == K3_STATUS_SUCCESS)
            st = k3_latent_moe_run_stage(ps, K3_LATENT_POST_REDUCE, m, NULL, &dw.w, dres, dy, dpart, NULL, NULL, dws,
                                         wsz, g_stream);
        CHECK(st == K3_STATUS_SUCCESS, "stages: %s", k3_ctx_last_error(g_gpu));
        K3T_CU(cudaStreamSynchronize(g_stream));
        K3T_CU(cudaMemcpy(y2, dy, (size_t)n * 2, cudaMemcpyDeviceToHost));
        const int same = k3t_check_same("nccl run vs the stages", y1, y2, K3T_BF16, n);
        /* the one-GPU block (layout NONE) of the same weights: the same kernels, so the same bits */
        k3_latent_moe_plan *pn = NULL;
        int same_one = 0;
        CHECK(k3_latent_moe_plan_create(g_gpu, &b->d, &pn) == K3_STATUS_SUCCESS, "one-GPU plan: %s",
              k3_ctx_last_error(g_gpu));
        if (pn) {
            size_t wn = 0;
            void *dwn = ws_of(pn, &wn, 1);
            uint16_t *y3 = (uint16_t *)malloc((size_t)n * 2);
            CHECK(k3_latent_moe_run(pn, m, dx, &dw.w, dres, dy, NULL, NULL, dwn, wn, g_stream) == K3_STATUS_SUCCESS,
                  "one-GPU block: %s", k3_ctx_last_error(g_gpu));
            K3T_CU(cudaStreamSynchronize(g_stream));
            K3T_CU(cudaMemcpy(y3, dy, (size_t)n * 2, cudaMemcpyDeviceToHost));
            same_one = k3t_check_same("nccl run vs the one-GPU block", y1, y3, K3T_BF16, n);
            free(y3);
            cudaFree(dwn);
            k3_latent_moe_plan_destroy(pn);
        }
        /* captured, replayed on a new x */
        cudaGraph_t gr = NULL;
        cudaGraphExec_t ex = NULL;
        double eg = -1.0;
        if (k3t_cuda_ok(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal), "nccl capture")) {
            const k3_status cst = k3_latent_moe_run(pl, m, dx, &dw.w, dres, dy, NULL, NULL, dwl, wl, g_stream);
            const cudaError_t ce = cudaStreamEndCapture(g_stream, &gr);
            CHECK(cst == K3_STATUS_SUCCESS && ce == cudaSuccess, "nccl capture: %s / %s", k3_ctx_last_error(g_gpu),
                  cudaGetErrorString(ce));
            if (cst == K3_STATUS_SUCCESS && ce == cudaSuccess &&
                k3t_cuda_ok(cudaGraphInstantiate(&ex, gr, 0), "nccl graph instantiate")) {
                for (int64_t i = 0; i < n; i++) x[i] = k3_bf16_from_f32((float)k3t_normal(r));
                /* waited for: g_stream does not wait for the legacy stream's copy */
                if (k3t_to_device(dx, x, (size_t)n * 2) && k3t_cuda_ok(cudaGraphLaunch(ex, g_stream), "nccl graph launch") &&
                    k3t_cuda_ok(cudaStreamSynchronize(g_stream), "nccl graph sync")) {
                    K3T_CU(cudaMemcpy(y1, dy, (size_t)n * 2, cudaMemcpyDeviceToHost));
                    CHECK(k3_latent_moe_run(pc, m, x, &b->hw, res, yc, NULL, NULL, hwc, wc, NULL) == K3_STATUS_SUCCESS,
                          "cpu block: %s", k3_ctx_last_error(g_cpu));
                    eg = k3t_check_close("nccl graph replay on a new x vs the cpu block", k3t_view1(y1, K3T_BF16, n),
                                         k3t_view1(yc, K3T_BF16, n), K3T_OP_LATENT_MOE)
                             .metric;
                }
            }
        }
        if (ex) cudaGraphExecDestroy(ex);
        if (gr) cudaGraphDestroy(gr);
        printf("nccl one rank: run %s the stages and %s the one-GPU block; graph replay on a new x rel-L2 %.3e vs "
               "the cpu block\n",
               same ? "bitwise equal to" : "DIFFERS from", same_one ? "bitwise equal to" : "DIFFERS from", eg);
        cudaFree(dwl), cudaFree(dws), cudaFree(dpart), cudaFree(dx), cudaFree(dres), cudaFree(dy);
        free(hwc), free(x), free(res), free(y1), free(y2), free(yc);
        dw_free(&dw);
    }
    k3_latent_moe_plan_destroy(pl), k3_latent_moe_plan_destroy(ps), k3_latent_moe_plan_destroy(pc);
    test_nccl_per_rank(b, r, comm);
    destroy(comm);
    test_nccl_two_gpus(b, r, lib, 0);
    test_nccl_two_gpus(b, r, lib, 1);
    dlclose(lib);
}
#endif

int main(void) {
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CUDA;
    const k3_status st = k3_ctx_create(&opt, &g_gpu);
    if (st == K3_STATUS_NOT_AVAILABLE) K3T_SKIP("no CUDA device");
    CHECK(st == K3_STATUS_SUCCESS, "CUDA context: %s", k3_status_string(st));
    if (!g_gpu || !(g_cpu = k3t_cpu_ctx())) return k3t_finish();
    K3T_CU(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    k3t_rng r = {k3t_seed_init("gpu_latent_tp", SEED)};
    block b;
    block_make(&b, &r);
    test_tp_stages(&b, &r, 0);
    test_tp_stages(&b, &r, 1);
#ifdef K3_HAVE_NCCL
    test_nccl_one_rank(&b, &r);
#else
    printf("SKIP nccl one rank: this build has no NCCL\n");
#endif
    block_free(&b);
    cudaStreamDestroy(g_stream);
    k3_ctx_destroy(g_gpu);
    k3_ctx_destroy(g_cpu);
    return k3t_finish();
}
#endif
