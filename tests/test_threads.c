/*
 * One CPU context shared by several threads: router, MoE and linear plans made on it (some by the threads
 * themselves, concurrently) and run concurrently, each thread with its own workspace and outputs, give bitwise
 * the results of one thread running alone. Plans keep no per-call scratch (the router's comes from the caller's
 * workspace) and the context's table is parsed when the context is made, so nothing here is written by two
 * threads.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "k3.h"
#include "moe_data.h"
#include "test_util.h"

#define NT 4      /* threads */
#define ITERS 200 /* runs of each plan per thread */
#define M 8
#define E 64
#define TOPK 6
#define H 256     /* router width */
#define L 64      /* experts' width */
#define I 32
#define LN 96     /* linear: y[M, LN] = x[M, H] W[LN, H]^T */

static k3_ctx *g_ctx;
static k3_ctx *g_plan_ctx; /* where the threads make their own plans */
static k3_router_plan *g_rp;
static k3_moe_plan *g_mp;
static k3_linear_plan *g_lp;
static k3_moe_desc g_md;
static k3_linear_desc g_ld;
static moe_data g_mdata;
static uint16_t *g_x, *g_gate, *g_xl, *g_w;
static float g_bias[E];
/* the single-thread results */
static int32_t g_ids[M * TOPK];
static float g_wts[M * TOPK];
static uint16_t g_moe[M * L], g_lin[M * LN];

typedef struct {
    int own_plans; /* 1: the thread makes its own plans on the shared context, concurrently with the others */
    int bad_router, bad_moe, bad_linear, errors;
    char msg[256];
} worker;

static void note(worker *wk, k3_status st, const char *what) {
    if (st == K3_STATUS_SUCCESS) return;
    if (wk->errors++ == 0) snprintf(wk->msg, sizeof wk->msg, "%s: %s", what, k3_status_string(st));
}

static pthread_barrier_t g_start; /* every thread starts its work at once, so the runs overlap */

static void *work(void *arg) {
    worker *wk = (worker *)arg;
    pthread_barrier_wait(&g_start);
    k3_router_plan *rp = g_rp;
    k3_moe_plan *mp = g_mp;
    k3_linear_plan *lp = g_lp;
    if (wk->own_plans) {
        k3_router_desc rd;
        k3_router_desc_init(&rd);
        rd.num_experts = E, rd.top_k = TOPK, rd.hidden = H, rd.max_tokens = M;
        rp = NULL, mp = NULL, lp = NULL;
        note(wk, k3_router_plan_create(g_plan_ctx, &rd, &rp), "router plan");
        note(wk, k3_moe_plan_create(g_plan_ctx, &g_md, &mp), "moe plan");
        note(wk, k3_linear_plan_create(g_plan_ctx, &g_ld, &lp), "linear plan");
        if (wk->errors) goto done;
    }
    size_t rb = 0, mb = 0, lb = 0;
    note(wk, k3_router_workspace_size(rp, &rb), "router ws");
    note(wk, k3_moe_workspace_size(mp, &mb), "moe ws");
    note(wk, k3_linear_workspace_size(lp, &lb), "linear ws");
    void *rws = malloc(rb ? rb : 1), *mws = malloc(mb ? mb : 1), *lws = malloc(lb ? lb : 1);
    int32_t ids[M * TOPK];
    float wts[M * TOPK];
    uint16_t out[M * L], y[M * LN];
    for (int it = 0; it < ITERS && !wk->errors; it++) {
        memset(ids, 0xff, sizeof ids);
        memset(out, 0xff, sizeof out);
        memset(y, 0xff, sizeof y);
        note(wk, k3_router_run(rp, M, g_x, g_gate, g_bias, ids, wts, rws, rb, NULL), "router run");
        wk->bad_router += memcmp(ids, g_ids, sizeof ids) != 0 || memcmp(wts, g_wts, sizeof wts) != 0;
        note(wk, k3_moe_run(mp, M, g_xl, g_ids, g_wts, &g_mdata.w, out, NULL, mws, mb, NULL), "moe run");
        wk->bad_moe += memcmp(out, g_moe, sizeof out) != 0;
        note(wk, k3_linear_run(lp, M, g_x, g_w, NULL, y, lws, lb, NULL), "linear run");
        wk->bad_linear += memcmp(y, g_lin, sizeof y) != 0;
    }
    free(rws);
    free(mws);
    free(lws);
done:
    if (wk->own_plans) {
        k3_router_plan_destroy(rp);
        k3_moe_plan_destroy(mp);
        k3_linear_plan_destroy(lp);
    }
    return NULL;
}

/* Every thread at once, twice: on the main thread's plans, then each on plans of its own. */
static void run_threads(int own_plans, const char *label) {
    const int failed_before = k3t_failed;
    pthread_t th[NT];
    worker wk[NT];
    memset(wk, 0, sizeof wk);
    int started[NT] = {0};
    pthread_barrier_init(&g_start, NULL, NT);
    for (int i = 0; i < NT; i++) {
        wk[i].own_plans = own_plans;
        started[i] = pthread_create(&th[i], NULL, work, &wk[i]) == 0;
        CHECK(started[i], "%s: thread %d starts", label, i);
    }
    for (int i = 0; i < NT; i++)
        if (started[i]) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&g_start);
    for (int i = 0; i < NT; i++) {
        CHECK(wk[i].errors == 0, "%s: thread %d: %d failing calls (first: %s)", label, i, wk[i].errors, wk[i].msg);
        CHECK(wk[i].bad_router == 0, "%s: thread %d: %d of %d router runs differ from one thread's", label, i,
              wk[i].bad_router, ITERS);
        CHECK(wk[i].bad_moe == 0, "%s: thread %d: %d of %d moe runs differ", label, i, wk[i].bad_moe, ITERS);
        CHECK(wk[i].bad_linear == 0, "%s: thread %d: %d of %d linear runs differ", label, i, wk[i].bad_linear, ITERS);
    }
    printf("  %s: %d threads x %d runs of router, moe and linear: %s\n", label, NT, ITERS,
           k3t_failed != failed_before ? "FAILED" : "bitwise the single-thread results");
}

int main(void) {
    k3t_rng r = {0x7E4EADull};
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CPU;
    opt.sim_major = 9; /* a simulated sm_90a: plans consult its embedded table */
    opt.sim_minor = 0;
    CHECK(k3_ctx_create(&opt, &g_ctx) == K3_STATUS_SUCCESS, "context");
    if (!g_ctx) return k3t_finish();

    g_x = md_bf16_normal(&r, (int64_t)M * H, 1.0);
    g_gate = md_bf16_normal(&r, (int64_t)E * H, 0.1);
    g_xl = md_bf16_normal(&r, (int64_t)M * L, 1.0);
    g_w = md_bf16_normal(&r, (int64_t)LN * H, 0.1);
    for (int e = 0; e < E; e++) g_bias[e] = (float)(0.01 * k3t_normal(&r));

    k3_router_desc rd;
    k3_router_desc_init(&rd);
    rd.num_experts = E, rd.top_k = TOPK, rd.hidden = H, rd.max_tokens = M;
    k3_moe_desc_init(&g_md);
    g_md.num_experts = E, g_md.top_k = TOPK, g_md.hidden = L, g_md.inter = I, g_md.max_tokens = M;
    md_make(&g_mdata, &g_md, &r);
    k3_linear_desc_init(&g_ld, LN, H);
    g_ld.max_m = M;
    CHECK(k3_router_plan_create(g_ctx, &rd, &g_rp) == K3_STATUS_SUCCESS, "router plan: %s", k3_ctx_last_error(g_ctx));
    CHECK(k3_moe_plan_create(g_ctx, &g_md, &g_mp) == K3_STATUS_SUCCESS, "moe plan: %s", k3_ctx_last_error(g_ctx));
    CHECK(k3_linear_plan_create(g_ctx, &g_ld, &g_lp) == K3_STATUS_SUCCESS, "linear plan: %s", k3_ctx_last_error(g_ctx));

    if (g_rp && g_mp && g_lp) {
        /* the reference: one thread, alone */
        size_t rb = 0, mb = 0, lb = 0;
        k3_router_workspace_size(g_rp, &rb);
        k3_moe_workspace_size(g_mp, &mb);
        k3_linear_workspace_size(g_lp, &lb);
        void *rws = malloc(rb), *mws = malloc(mb), *lws = malloc(lb ? lb : 1);
        CHECK(k3_router_run(g_rp, M, g_x, g_gate, g_bias, g_ids, g_wts, rws, rb, NULL) == K3_STATUS_SUCCESS,
              "reference router run: %s", k3_ctx_last_error(g_ctx));
        CHECK(k3_moe_run(g_mp, M, g_xl, g_ids, g_wts, &g_mdata.w, g_moe, NULL, mws, mb, NULL) == K3_STATUS_SUCCESS,
              "reference moe run: %s", k3_ctx_last_error(g_ctx));
        CHECK(k3_linear_run(g_lp, M, g_x, g_w, NULL, g_lin, lws, lb, NULL) == K3_STATUS_SUCCESS,
              "reference linear run: %s", k3_ctx_last_error(g_ctx));
        free(rws);
        free(mws);
        free(lws);
        run_threads(0, "shared plans");
        g_plan_ctx = g_ctx;
        run_threads(1, "plans made by each thread");
        /* a context no plan has used yet: the threads' first plans are its first (its table was parsed when it
         * was made, not by whichever plan came first) */
        k3_ctx *fresh = NULL;
        CHECK(k3_ctx_create(&opt, &fresh) == K3_STATUS_SUCCESS, "fresh context");
        if (fresh) {
            g_plan_ctx = fresh;
            run_threads(1, "first plans of a fresh context, made by each thread");
            k3_ctx_destroy(fresh);
        }
    }
    k3_router_plan_destroy(g_rp);
    k3_moe_plan_destroy(g_mp);
    k3_linear_plan_destroy(g_lp);
    md_free(&g_mdata);
    free(g_x);
    free(g_gate);
    free(g_xl);
    free(g_w);
    k3_ctx_destroy(g_ctx);
    return k3t_finish();
}
