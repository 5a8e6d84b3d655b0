/* The GPU router and routed experts against the CPU reference (a CPU context running the same plan):
 * router ids and weights bitwise equal (sigmoid noaux_tc and softmax, BF16 and F32 gates, ties, NaN rows);
 * the device dispatch against a host counting sort (decode and prefill sizes); the experts' outputs within
 * the MoE budgets (rel-L2 1e-2 W4A16 / 2e-2 W4A4) for NVFP4 (shared and separate gate/up scale_2), MXFP4 and
 * BF16 weights, linear and swizzled scales, every activation, M 1..512, top-k 1..16, E 8 / 56 / 896 (and the
 * real K3 TP8 shape), experts with no tokens, all tokens on one expert; bitwise identical across two runs and
 * across the launch shapes the kernels choose between; CUDA-graph capture, then replay with new routing copied
 * into the captured buffers; ids -1 and outside [0, E) dropped (expert parallelism); the latent-MoE block. Every
 * device output goes through the harness (tests/k3t_harness.h): poisoned before each run, guard bytes around it, every element written, no NaN/Inf.
 * One PASS/FAIL line per case with its numbers and seed. Exits 77 without a CUDA device; a 300 s alarm turns a
 * hang into a failure. Fixed seeds; K3T_SEED=<n> changes the base seed. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define K3T_DEFINE_STATE /* this file owns main(): the shared counts and seed live here */
#include "k3.h"
#include "test_util.h"

#ifndef K3_HAVE_CUDA
int main(void) { K3T_SKIP("built without CUDA"); }
#else

#include "k3t_harness_cuda.h"

#include "gpu_moe/gpu_moe.h"

#define DEFAULT_SEED 0x6D6F45u

k3_ctx *g_gpu, *g_cpu;
cudaStream_t g_stream;

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL gpu_moe: TIMEOUT (300 s alarm): a kernel or the CPU reference hung\n";
    ssize_t r = write(2, msg, sizeof msg - 1);
    (void)r;
    _exit(1);
}

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ======================================================================= experts ====================== */
/* The launch shapes a CUDA MoE call chooses between, each of which must give bitwise the same output as the
 * shape the call takes: where the GEMMs route themselves (W4A16, np <= 256, small grids: the dispatch folded
 * in), the dispatch-kernel path; where GEMM1 runs in paired tiles, its 16-output blocks; where GEMM2 runs two or
 * four row tiles per warp, one; where GEMM1's first wave routes itself ahead of the dispatch kernel, every block
 * after it; where the folded GEMM1 is held to its grid's share of blocks per SM, as many as fit. Each alternative
 * is a plan of the same descriptor with that shape forced off (k3_moe_desc.force_shape), and k3_moe_plan_kernel
 * says which of them the call at M takes. */
enum { ALT_DISPATCH_PATH, ALT_UNPAIRED, ALT_ONE_TILE, ALT_LATE_ROUTING, ALT_UNBALANCED, N_ALT };
static const char *const k_alt_name[N_ALT] = {"dispatch-path", "unpaired", "one-tile", "late-routing", "unbalanced"};
static const int32_t k_alt_force[N_ALT] = {K3_MOE_FORCE_NO_FOLD, K3_MOE_FORCE_NO_PAIR, K3_MOE_FORCE_NO_TILES,
                                           K3_MOE_FORCE_NO_EARLY, K3_MOE_FORCE_NO_BALANCE};

typedef struct alt_shapes {
    k3_moe_plan *plan[N_ALT]; /* the descriptor with that shape forced off (NULL where it does not apply) */
    int applies[N_ALT];       /* the call at M takes the shape this alternative turns off */
    int32_t g2_tiles;         /* GEMM2's row tiles per warp at M */
    size_t ws_bytes;          /* the largest workspace of the alternatives' plans */
} alt_shapes;

static void shape_facts_free(alt_shapes *a) {
    for (int i = 0; i < N_ALT; i++) k3_moe_plan_destroy(a->plan[i]);
    memset(a, 0, sizeof *a);
}

/* Which alternatives apply to description d at M tokens, and their plans. 0 when a plan could not be made (then
 * no alternative is run and the failure is counted). */
static int shape_facts(const k3_moe_desc *d, int64_t M, const k3_moe_weights *dw, alt_shapes *a) {
    (void)dw;
    memset(a, 0, sizeof *a);
    a->g2_tiles = 1;
    k3_moe_plan *base = NULL;
    k3_moe_launch_info li;
    if (k3_moe_plan_create(g_gpu, d, &base) != K3_STATUS_SUCCESS || k3_moe_plan_kernel(base, M, &li) != K3_STATUS_SUCCESS) {
        CHECK(0, "the plan's launch at m %lld: %s", (long long)M, k3_ctx_last_error(g_gpu));
        k3_moe_plan_destroy(base);
        return 0;
    }
    k3_moe_plan_destroy(base);
    a->g2_tiles = li.gemm2_tiles;
    a->applies[ALT_DISPATCH_PATH] = li.fold;
    a->applies[ALT_UNPAIRED] = li.pair;
    a->applies[ALT_ONE_TILE] = li.gemm2_tiles > 1;
    a->applies[ALT_LATE_ROUTING] = li.early;
    a->applies[ALT_UNBALANCED] = li.gemm1_blocks_per_sm > 0;
    for (int i = 0; i < N_ALT; i++) {
        if (!a->applies[i]) continue;
        k3_moe_desc fd = *d;
        fd.force_shape = k_alt_force[i];
        size_t ws = 0;
        if (k3_moe_plan_create(g_gpu, &fd, &a->plan[i]) != K3_STATUS_SUCCESS ||
            k3_moe_workspace_size(a->plan[i], &ws) != K3_STATUS_SUCCESS) {
            CHECK(0, "%s plan: %s", k_alt_name[i], k3_ctx_last_error(g_gpu));
            shape_facts_free(a);
            return 0;
        }
        if (ws > a->ws_bytes) a->ws_bytes = ws;
    }
    return 1;
}

/* One whole call in alternative alt (an ALT_*) on `stream`. */
static k3_status run_alt_shape(const alt_shapes *a, int alt, int64_t M, const void *x, const int32_t *ids,
                               const float *wts, const k3_moe_weights *dw, void *out, float *out_f32, void *ws,
                               cudaStream_t stream) {
    return k3_moe_run(a->plan[alt], M, x, ids, wts, dw, out, out_f32, ws, a->ws_bytes, stream);
}

/* Poison both outputs of an experts call. */
static void poison_outs(k3t_dout *out, k3t_dout *of) {
    k3t_dout_poison(out, g_stream);
    k3t_dout_poison(of, g_stream);
}

/* After the work on g_stream: both outputs fully written (finite), guards intact. Returns 1 when so. */
static int check_outs(k3t_dout *out, k3t_dout *of, int64_t n) {
    const int a = k3t_dout_check(out, g_stream, k3t_flat(n), 0, NULL);
    const int b = k3t_dout_check(of, g_stream, k3t_flat(n), 0, NULL);
    return a && b;
}

/* The fetched outputs bit for bit against out_g, f_g. */
static int same_outs(const char *tag, const char *what, const k3t_dout *out, const k3t_dout *of, const uint16_t *out_g,
                     const float *f_g, int64_t n) {
    char w[160];
    snprintf(w, sizeof w, "%s: %s: out", tag, what);
    const int a = k3t_check_same(w, k3t_dout_host(out), out_g, K3T_BF16, n);
    snprintf(w, sizeof w, "%s: %s: out_f32", tag, what);
    const int b = k3t_check_same(w, k3t_dout_host(of), f_g, K3T_F32, n);
    return a && b;
}

static void moe_case(const mcase *c) {
    const uint64_t seed = k3t_case_begin(&c->c);
    const int f0 = k3t_failed;
    const char *tag = c->c.name;
    k3t_rng rng = {seed};
    moe_data md;
    const double t_start = now_s();
    const int made = moe_data_make(&md, c, &rng);
    CHECK(made, "%s: data", tag);
    const int32_t E = (int32_t)c->c.shape[0], K = (int32_t)c->c.shape[1];
    const int64_t M = c->c.m, L = c->c.shape[2], I = c->c.shape[3], np = M * K, n = M * L;
    const int32_t route = (int32_t)c->c.options;
    uint16_t *x = (uint16_t *)malloc((size_t)n * 2);
    int32_t *ids = (int32_t *)malloc((size_t)np * 4);
    float *wts = (float *)malloc((size_t)np * 4);
    uint16_t *out_c = (uint16_t *)malloc((size_t)n * 2), *out_g = (uint16_t *)malloc((size_t)n * 2);
    float *f_c = (float *)malloc((size_t)n * 4), *f_g = (float *)malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) x[i] = k3t_rand_bf16(&rng, 1.0f);
    fill_routing(c, route, &rng, ids, wts);

    k3_moe_plan *pc = NULL, *pg = NULL;
    double rel = INFINITY, rel_bf = INFINITY, rel_graph = -1.0, us = 0.0, t_cpu = 0.0;
    int bitwise = 0, graph_ok = -1, same[N_ALT] = {-1, -1, -1, -1, -1};
    int32_t g2_tiles = 1;
    CHECK(c->c.budget == (c->mode == K3_MOE_W4A4 ? K3T_OP_MOE_W4A4 : K3T_OP_MOE_W4A16),
          "%s: the case's budget is its mode's", tag);
    const double tol = k3t_budget_of(c->c.budget)->tol;
    k3t_dout dout, dof;
    memset(&dout, 0, sizeof dout), memset(&dof, 0, sizeof dof);
    const k3_status sc = made ? k3_moe_plan_create(g_cpu, &md.d, &pc) : K3_STATUS_INTERNAL_ERROR;
    const k3_status sg = made ? k3_moe_plan_create(g_gpu, &md.d, &pg) : K3_STATUS_INTERNAL_ERROR;
    CHECK(sc == K3_STATUS_SUCCESS, "%s: cpu plan: %s", tag, k3_ctx_last_error(g_cpu));
    CHECK(sg == K3_STATUS_SUCCESS, "%s: gpu plan: %s", tag, k3_ctx_last_error(g_gpu));
    if (sc == K3_STATUS_SUCCESS && sg == K3_STATUS_SUCCESS && k3t_dout_alloc(&dout, "moe out", K3T_BF16, n) &&
        k3t_dout_alloc(&dof, "moe out_f32", K3T_F32, n)) {
        size_t wsc = 0, wsg = 0;
        k3_moe_workspace_size(pc, &wsc);
        k3_moe_workspace_size(pg, &wsg);
        void *hws = malloc(wsc);
        const double t0 = now_s();
        CHECK(k3_moe_run(pc, M, x, ids, wts, &md.hw, out_c, f_c, hws, wsc, NULL) == K3_STATUS_SUCCESS, "%s: cpu run: %s",
              tag, k3_ctx_last_error(g_cpu));
        t_cpu = now_s() - t0;
        void *dx = k3t_dup(x, (size_t)n * 2);
        int32_t *dids = (int32_t *)k3t_dup(ids, (size_t)np * 4);
        float *dwts = (float *)k3t_dup(wts, (size_t)np * 4);
        uint16_t *pout = (uint16_t *)k3t_dout_ptr(&dout);
        float *pof = (float *)k3t_dout_ptr(&dof);
        void *dws = k3t_dalloc(wsg);
        cudaMemsetAsync(dws, 0xff, wsg, g_stream); /* poison: every workspace value read must have been written; on
                                                   * g_stream (non-blocking: a legacy-stream memset could land late) */
        poison_outs(&dout, &dof);
        k3_status st = k3_moe_run(pg, M, dx, dids, dwts, &md.dw, pout, pof, dws, wsg, g_stream);
        CHECK(st == K3_STATUS_SUCCESS, "%s: gpu run: %s", tag, k3_ctx_last_error(g_gpu));
        if (k3t_cuda_ok(cudaStreamSynchronize(g_stream), "moe run sync")) {
            check_outs(&dout, &dof, n);
            memcpy(out_g, k3t_dout_host(&dout), (size_t)n * 2);
            memcpy(f_g, k3t_dout_host(&dof), (size_t)n * 4);
            char w[128];
            snprintf(w, sizeof w, "%s: out_f32 vs cpu", tag);
            rel = k3t_check_close(w, k3t_view1(f_g, K3T_F32, n), k3t_view1(f_c, K3T_F32, n), c->c.budget).metric;
            snprintf(w, sizeof w, "%s: out (the BF16 rounding of out_f32) vs cpu out_f32", tag);
            rel_bf = k3t_check_close(w, k3t_view1(out_g, K3T_BF16, n), k3t_view1(f_c, K3T_F32, n), c->c.budget).metric;
            /* second run, on poisoned outputs: bitwise the same */
            poison_outs(&dout, &dof);
            st = k3_moe_run(pg, M, dx, dids, dwts, &md.dw, pout, pof, dws, wsg, g_stream);
            k3t_cuda_ok(cudaStreamSynchronize(g_stream), "moe run 2 sync");
            check_outs(&dout, &dof, n);
            bitwise = same_outs(tag, "second run vs the first", &dout, &dof, out_g, f_g, n) && st == K3_STATUS_SUCCESS;
            /* the other launch shapes of the same call: bitwise the same output */
            alt_shapes as;
            if (shape_facts(&md.d, M, &md.dw, &as)) {
                g2_tiles = as.g2_tiles;
                for (int a = 0; a < N_ALT; a++) {
                    if (!as.applies[a]) continue;
                    same[a] = 0;
                    void *dws2 = k3t_dalloc(as.ws_bytes);
                    if (dws2) {
                        cudaMemsetAsync(dws2, 0xff, as.ws_bytes, g_stream);
                        poison_outs(&dout, &dof);
                        const k3_status s3 =
                            run_alt_shape(&as, a, M, dx, dids, dwts, &md.dw, pout, pof, dws2, g_stream);
                        CHECK(s3 == K3_STATUS_SUCCESS, "%s: %s run: %s", tag, k_alt_name[a], k3_ctx_last_error(g_gpu));
                        if (s3 == K3_STATUS_SUCCESS &&
                            k3t_cuda_ok(cudaStreamSynchronize(g_stream), "alternative-path sync")) {
                            check_outs(&dout, &dof, n);
                            char wa[96];
                            snprintf(wa, sizeof wa, "%s vs the call's own launch shape", k_alt_name[a]);
                            same[a] = same_outs(tag, wa, &dout, &dof, out_g, f_g, n);
                        }
                    }
                    cudaFree(dws2);
                }
                shape_facts_free(&as);
            }
            /* top_k 1 (GEMM2 writes out itself, no combine): ids outside [0, E) are skipped (on both backends; the
             * ROUTE_EP cases compare such routings with the CPU), so their tokens' rows must come out zero, and
             * every other row bitwise as above (each token's output depends on its own expert only) */
            if (K == 1 && M >= 2) {
                int32_t *ids2 = (int32_t *)malloc((size_t)np * 4);
                int32_t *dids2 = NULL;
                int ok = 0;
                if (ids2) {
                    for (int64_t t = 0; t < M; t++) ids2[t] = t % 4 == 1 ? -1 : t % 4 == 3 ? E : ids[t];
                    dids2 = (int32_t *)k3t_dup(ids2, (size_t)np * 4);
                }
                if (dids2) {
                    poison_outs(&dout, &dof);
                    const k3_status s4 = k3_moe_run(pg, M, dx, dids2, dwts, &md.dw, pout, pof, dws, wsg, g_stream);
                    if (s4 == K3_STATUS_SUCCESS && k3t_cuda_ok(cudaStreamSynchronize(g_stream), "skipped-ids sync")) {
                        check_outs(&dout, &dof, n);
                        const uint16_t *o2 = (const uint16_t *)k3t_dout_host(&dout);
                        const float *f2 = (const float *)k3t_dout_host(&dof);
                        ok = 1;
                        for (int64_t t = 0; t < M && ok; t++) {
                            const size_t o = (size_t)(t * L);
                            if (t % 2 == 1) {
                                for (int64_t i = 0; i < L && ok; i++)
                                    ok = o2[o + i] == 0 && f2[o + i] == 0.0f && !signbit(f2[o + i]);
                            } else {
                                ok = memcmp(o2 + o, out_g + o, (size_t)L * 2) == 0 &&
                                     memcmp(f2 + o, f_g + o, (size_t)L * 4) == 0;
                            }
                        }
                    }
                }
                CHECK(ok, "%s: top-k 1 with skipped ids: their rows must be +0, the others bitwise unchanged", tag);
                printf("%s moe %-12s top-k 1, ids outside [0, E) on odd tokens: zero rows, the others bitwise\n",
                       ok ? "PASS" : "FAIL", tag);
                cudaFree(dids2);
                free(ids2);
            }
            /* timing (without out_f32) */
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            const int iters = M >= 256 ? 3 : 20;
            cudaEventRecord(e0, g_stream);
            for (int it = 0; it < iters; it++) k3_moe_run(pg, M, dx, dids, dwts, &md.dw, pout, NULL, dws, wsg, g_stream);
            cudaEventRecord(e1, g_stream);
            if (k3t_cuda_ok(cudaEventSynchronize(e1), "moe timing")) {
                float ms = 0.0f;
                cudaEventElapsedTime(&ms, e0, e1);
                us = 1000.0 * ms / iters;
            }
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
        }
        if (c->graph && sc == K3_STATUS_SUCCESS) {
            /* capture one run, then copy NEW routing (and x) into the captured buffers and replay */
            cudaGraph_t graph = NULL;
            cudaGraphExec_t exec = NULL;
            graph_ok = 0;
            if (k3t_cuda_ok(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal), "begin capture")) {
                const k3_status cst = k3_moe_run(pg, M, dx, dids, dwts, &md.dw, pout, pof, dws, wsg, g_stream);
                const cudaError_t ce = cudaStreamEndCapture(g_stream, &graph);
                CHECK(cst == K3_STATUS_SUCCESS && ce == cudaSuccess, "%s: capture: %s / %s", tag,
                      k3_ctx_last_error(g_gpu), cudaGetErrorString(ce));
                if (cst == K3_STATUS_SUCCESS && ce == cudaSuccess &&
                    k3t_cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "graph instantiate")) {
                    fill_routing(c, route == ROUTE_EP ? ROUTE_EP : ROUTE_RANDOM, &rng, ids, wts);
                    for (int64_t i = 0; i < n; i++) x[i] = k3t_rand_bf16(&rng, 1.0f);
                    cudaMemcpyAsync(dx, x, (size_t)n * 2, cudaMemcpyHostToDevice, g_stream);
                    cudaMemcpyAsync(dids, ids, (size_t)np * 4, cudaMemcpyHostToDevice, g_stream);
                    cudaMemcpyAsync(dwts, wts, (size_t)np * 4, cudaMemcpyHostToDevice, g_stream);
                    poison_outs(&dout, &dof);
                    if (k3t_cuda_ok(cudaGraphLaunch(exec, g_stream), "graph launch") &&
                        k3t_cuda_ok(cudaStreamSynchronize(g_stream), "graph sync")) {
                        check_outs(&dout, &dof, n);
                        memcpy(f_g, k3t_dout_host(&dof), (size_t)n * 4);
                        k3_moe_run(pc, M, x, ids, wts, &md.hw, out_c, f_c, hws, wsc, NULL);
                        char w[128];
                        snprintf(w, sizeof w, "%s: graph replay with new routing: out_f32 vs cpu", tag);
                        rel_graph = k3t_check_close(w, k3t_view1(f_g, K3T_F32, n), k3t_view1(f_c, K3T_F32, n),
                                                    c->c.budget)
                                        .metric;
                        /* and bitwise equal to a direct run on the new routing */
                        poison_outs(&dout, &dof);
                        k3_moe_run(pg, M, dx, dids, dwts, &md.dw, pout, pof, dws, wsg, g_stream);
                        cudaStreamSynchronize(g_stream);
                        check_outs(&dout, &dof, n);
                        snprintf(w, sizeof w, "%s: graph replay vs a direct run: out_f32", tag);
                        const int same_direct = k3t_check_same(w, f_g, k3t_dout_host(&dof), K3T_F32, n);
                        graph_ok = rel_graph <= tol && same_direct;
                    }
                }
            }
            if (exec) cudaGraphExecDestroy(exec);
            if (graph) cudaGraphDestroy(graph);
            cudaGetLastError();
        }
        cudaFree(dx), cudaFree(dids), cudaFree(dwts), cudaFree(dws);
        free(hws);
    }
    int pass = rel <= tol && rel_bf <= tol && bitwise && graph_ok != 0 && k3t_failed == f0;
    for (int a = 0; a < N_ALT; a++) pass = pass && same[a] != 0;
    if (!pass && isfinite(rel) && rel > tol) { /* where it goes wrong: the worst element and the first bad row */
        int64_t worst = 0, bad_rows = 0;
        double wd = -1.0;
        for (int64_t t = 0; t < M; t++) {
            double num = 0.0, den = 0.0;
            for (int64_t i = t * L; i < (t + 1) * L; i++) {
                const double dd = fabs((double)f_g[i] - (double)f_c[i]);
                num += dd * dd, den += (double)f_c[i] * (double)f_c[i];
                if (dd > wd) wd = dd, worst = i;
            }
            bad_rows += num > tol * tol * (den > 0 ? den : 1.0);
        }
        printf("    worst element token %lld col %lld: gpu %.6g cpu %.6g; %lld of %lld token rows off; ids[token][0] = %d\n",
               (long long)(worst / L), (long long)(worst % L), (double)f_g[worst], (double)f_c[worst],
               (long long)bad_rows, (long long)M, ids[(worst / L) * K]);
    }
    printf("%s moe %-10s %s %s%s %s act=%s E=%d k=%d M=%d L=%lld I=%lld route=%s: rel-L2 %.3e (bf16 out %.3e, tol %.0e), "
           "two runs %s, gpu %.1f us/call, cpu ref %.2f s, case %.1f s",
           pass ? "PASS" : "FAIL", tag, fmt_name(c->fmt), c->layout == K3_SCALE_SWIZZLED ? "swizzled" : "linear",
           c->sep ? " sep-s2" : "", c->mode == K3_MOE_W4A4 ? "w4a4" : "w4a16", k3_act_name(c->act), E, K, (int)M,
           (long long)L, (long long)I,
           route == ROUTE_ONE_EXPERT    ? "one-expert"
           : route == ROUTE_LOW_EXPERTS ? "few-experts"
           : route == ROUTE_DUP         ? "dup-ids"
           : route == ROUTE_EP          ? "ep-dropped"
                                        : "random",
           rel, rel_bf, tol, bitwise ? "bitwise equal" : "DIFFER", us, t_cpu, now_s() - t_start);
    const int sd = same[ALT_DISPATCH_PATH], su = same[ALT_UNPAIRED], st1 = same[ALT_ONE_TILE],
              sl = same[ALT_LATE_ROUTING], sb = same[ALT_UNBALANCED];
    printf(sd < 0 ? ", not folded" : sd ? ", folded = dispatch path bitwise" : ", folded = dispatch path DIFFER");
    if (su >= 0) printf(su ? ", paired = unpaired bitwise" : ", paired = unpaired DIFFER");
    if (st1 >= 0) printf(st1 ? ", %d tiles = 1 tile bitwise" : ", %d tiles = 1 tile DIFFER", g2_tiles);
    if (sl >= 0) printf(sl ? ", early = late routing bitwise" : ", early = late routing DIFFER");
    if (sb >= 0) printf(sb ? ", balanced = unbalanced bitwise" : ", balanced = unbalanced DIFFER");
    if (c->graph) printf(", graph replay with new routing %s (rel-L2 %.3e)", graph_ok > 0 ? "ok" : "FAILED", rel_graph);
    printf(", seed 0x%llx\n", (unsigned long long)seed);
    fflush(stdout);
    CHECK(pass, "moe case %s", tag);
    k3_moe_plan_destroy(pc);
    k3_moe_plan_destroy(pg);
    k3t_dout_free(&dout), k3t_dout_free(&dof);
    moe_data_free(&md);
    free(x), free(ids), free(wts), free(out_c), free(out_g), free(f_c), free(f_g);
}

static const mcase k_moe_cases[] = {
    /* the simplest shapes first (one expert, one token, whole chunks): isolate the MMA fragment mapping */
    {{"basic", {1, 1, 128, 128}, 1, ROUTE_RANDOM, 300, K3T_OP_MOE_W4A16}, K3_WEIGHT_BF16, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"basic", {1, 1, 128, 128}, 1, ROUTE_RANDOM, 301, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"basic", {1, 1, 128, 128}, 8, ROUTE_RANDOM, 302, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"basic", {1, 1, 128, 128}, 1, ROUTE_RANDOM, 303, K3T_OP_MOE_W4A16}, K3_WEIGHT_MXFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    /* M sweep, NVFP4 SiTU (L, I multiples of 128: whole chunks only) */
    {{"m-sweep", {8, 2, 256, 128}, 1, ROUTE_RANDOM, 304, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"m-sweep", {8, 2, 256, 128}, 2, ROUTE_RANDOM, 305, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"m-sweep", {8, 2, 256, 128}, 3, ROUTE_RANDOM, 306, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"m-sweep", {8, 2, 256, 128}, 8, ROUTE_RANDOM, 307, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"m-sweep", {8, 2, 256, 128}, 16, ROUTE_RANDOM, 308, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"m-sweep", {8, 2, 256, 128}, 64, ROUTE_RANDOM, 309, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"m-sweep", {8, 2, 256, 128}, 512, ROUTE_RANDOM, 310, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    /* tails (L = 224: one chunk + 6 steps; I = 96: steps only), top-k sweep, E = 56 */
    {{"tails", {56, 8, 224, 96}, 1, ROUTE_RANDOM, 311, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 1, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"tails", {56, 8, 224, 96}, 16, ROUTE_RANDOM, 312, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 1, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"topk1", {56, 1, 256, 128}, 16, ROUTE_RANDOM, 313, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"topk16", {56, 16, 256, 128}, 8, ROUTE_RANDOM, 314, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"prefill", {56, 8, 256, 128}, 512, ROUTE_RANDOM, 315, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    /* E = 896 (small L / I so the CPU reference stays fast): most experts get no tokens */
    {{"e896", {896, 16, 128, 64}, 1, ROUTE_RANDOM, 316, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"e896", {896, 16, 128, 64}, 16, ROUTE_RANDOM, 317, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"e896", {896, 16, 128, 64}, 64, ROUTE_RANDOM, 318, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"e896", {896, 16, 128, 64}, 3, ROUTE_RANDOM, 319, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A16, K3_ACT_SITU, 0},
    /* routing extremes */
    {{"one-expert", {56, 1, 256, 128}, 64, ROUTE_ONE_EXPERT, 320, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"one-expert", {56, 4, 256, 128}, 40, ROUTE_ONE_EXPERT, 321, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"few-experts", {56, 2, 256, 128}, 100, ROUTE_LOW_EXPERTS, 322, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    /* formats and layouts */
    {{"mxfp4", {56, 8, 256, 64}, 3, ROUTE_RANDOM, 323, K3T_OP_MOE_W4A16}, K3_WEIGHT_MXFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"mxfp4", {56, 8, 224, 96}, 16, ROUTE_RANDOM, 324, K3T_OP_MOE_W4A16}, K3_WEIGHT_MXFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"mxfp4-swz", {56, 8, 256, 128}, 8, ROUTE_RANDOM, 325, K3T_OP_MOE_W4A16}, K3_WEIGHT_MXFP4, K3_SCALE_SWIZZLED, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"nvfp4-swz", {56, 8, 256, 160}, 8, ROUTE_RANDOM, 326, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"nvfp4-swz", {8, 2, 384, 256}, 16, ROUTE_RANDOM, 327, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"bf16", {8, 2, 128, 64}, 1, ROUTE_RANDOM, 328, K3T_OP_MOE_W4A16}, K3_WEIGHT_BF16, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"bf16", {8, 2, 224, 96}, 8, ROUTE_RANDOM, 329, K3T_OP_MOE_W4A16}, K3_WEIGHT_BF16, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    /* W4A4 */
    {{"w4a4", {56, 8, 256, 128}, 1, ROUTE_RANDOM, 330, K3T_OP_MOE_W4A4}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A4, K3_ACT_SITU, 0},
    {{"w4a4", {56, 8, 256, 128}, 16, ROUTE_RANDOM, 331, K3T_OP_MOE_W4A4}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 1, K3_MOE_W4A4, K3_ACT_SITU, 0},
    {{"w4a4", {8, 2, 224, 96}, 64, ROUTE_RANDOM, 332, K3T_OP_MOE_W4A4}, K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 0, K3_MOE_W4A4, K3_ACT_SITU, 0},
    /* every activation */
    {{"act", {8, 2, 256, 128}, 8, ROUTE_RANDOM, 333, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SILU, 0},
    {{"act", {8, 2, 256, 128}, 8, ROUTE_RANDOM, 334, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 1, K3_MOE_W4A16, K3_ACT_SWIGLUOAI, 0},
    {{"act", {8, 2, 256, 128}, 8, ROUTE_RANDOM, 335, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SWIGLUOAI_UNINTERLEAVE, 0},
    {{"act", {8, 2, 256, 128}, 8, ROUTE_RANDOM, 336, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_RELU2_NO_MUL, 0},
    {{"act", {8, 2, 256, 128}, 8, ROUTE_RANDOM, 337, K3T_OP_MOE_W4A4}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A4, K3_ACT_RELU2_NO_MUL, 0},
    {{"act", {8, 2, 256, 128}, 8, ROUTE_RANDOM, 338, K3T_OP_MOE_W4A16}, K3_WEIGHT_MXFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SWIGLUOAI, 0},
    /* CUDA-graph capture, replay with new routing */
    {{"graph", {56, 8, 256, 128}, 16, ROUTE_RANDOM, 339, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 1},
    {{"graph", {896, 16, 128, 64}, 4, ROUTE_ONE_EXPERT, 340, K3T_OP_MOE_W4A4}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 1, K3_MOE_W4A4, K3_ACT_SITU, 1},
    /* the real shapes: K3 TP8 (896 experts, I 384, L 3584) and an EP16 expert width (I 3072) */
    {{"k3-tp8", {896, 16, 3584, 384}, 1, ROUTE_RANDOM, 341, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"k3-tp8", {896, 16, 3584, 384}, 4, ROUTE_RANDOM, 342, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 1},
    {{"k3-ep16", {56, 16, 3584, 3072}, 1, ROUTE_RANDOM, 343, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    /* GEMM2 split along K (I >= 1024) at small L, so the sanitizers' quick mode covers it: 8 and 9 chunks (an
     * uneven split), linear and swizzled scales, W4A16 and W4A4, one and two token groups per pass */
    {{"split-k", {8, 2, 256, 1024}, 4, ROUTE_RANDOM, 344, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"split-k", {56, 8, 128, 1152}, 16, ROUTE_RANDOM, 345, K3T_OP_MOE_W4A4}, K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A4, K3_ACT_SITU, 0},
    /* the EP16 shape of `k3 bench moe` (one expert per token at I 3072: 1 and 4 experts), a TP8-like small case
     * (many slots, whole 128-wide chunks, NT 1) and duplicate ids (one expert gets M * k pairs: 2-3 passes through
     * GEMM1's 4-warp split-K epilogue, the block barrier between passes) with linear and swizzled scales, W4A16
     * and W4A4 (NT 1: the cp.async kernels take 8 tokens per pass through m 64) */
    {{"k3-ep16-k1", {56, 1, 3584, 3072}, 1, ROUTE_RANDOM, 346, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 1},
    {{"k3-ep16-k1", {56, 1, 3584, 3072}, 4, ROUTE_RANDOM, 347, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"many-slots", {896, 16, 256, 128}, 8, ROUTE_RANDOM, 348, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"dup-ids", {8, 4, 512, 256}, 4, ROUTE_DUP, 349, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"dup-ids", {8, 4, 384, 128}, 6, ROUTE_DUP, 350, K3T_OP_MOE_W4A4}, K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A4, K3_ACT_SITU, 0},
    {{"dup-ids", {8, 3, 256, 256}, 12, ROUTE_DUP, 351, K3T_OP_MOE_W4A4}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 1, K3_MOE_W4A4, K3_ACT_SITU, 1},
    /* the dispatch folded into the GEMMs (W4A16, m * top_k <= 256, grids of about a wave), captured
     * then replayed with new routing: duplicate ids (24 pairs on one expert: 3 passes) replayed with random ones,
     * exactly 256 pairs (two ids per thread, the last chunk full) over E 56 and E 896 (1,024 GEMM1 blocks at NT 1:
     * folded, as the E 56 case), and 264 pairs (past the fold: the dispatch kernel) */
    {{"fold-graph", {8, 4, 384, 128}, 6, ROUTE_DUP, 352, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A16, K3_ACT_SITU, 1},
    {{"fold-edge", {56, 16, 128, 64}, 16, ROUTE_RANDOM, 353, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 1},
    {{"fold-edge", {896, 16, 128, 64}, 16, ROUTE_RANDOM, 354, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 1},
    {{"fold-edge", {56, 8, 256, 128}, 33, ROUTE_RANDOM, 355, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 1},
    /* GEMM2 split over 8 warps (256-thread blocks, grids of <= 2 blocks per SM) with the fold at 256
     * threads: 9 chunks (warp 0 takes two) with swizzled separate scales, SwiGLU-OAI and graph replay; 12 pairs
     * on one expert (two passes through the 8-warp split-K sum); and 8 chunks plus 4 tail steps (I 1088: the
     * 16-element steps split over the 8 warps too) */
    {{"wide-k", {8, 2, 256, 1152}, 1, ROUTE_RANDOM, 356, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A16, K3_ACT_SWIGLUOAI, 1},
    {{"wide-k", {8, 4, 384, 1024}, 3, ROUTE_DUP, 357, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"wide-k", {8, 2, 256, 1088}, 2, ROUTE_RANDOM, 358, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    /* GEMM2's denser instances at NT 1 (grids past a wave of the default on a 132-SM H200): split-K
     * with 896 blocks (56 slots x 16 tiles) through the dispatch kernel, with swizzled scales and graph replay;
     * split-K folded (16 slots: GEMM1 1,024 blocks, GEMM2 768); KS 1 at 8 blocks per SM (128 slots x 16 blocks:
     * past two waves) */
    {{"dense-g2", {56, 8, 256, 1024}, 8, ROUTE_RANDOM, 359, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A16, K3_ACT_SITU, 1},
    {{"dense-g2", {16, 2, 768, 1024}, 8, ROUTE_RANDOM, 360, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"dense-g2", {896, 16, 1024, 64}, 8, ROUTE_RANDOM, 361, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    /* tokens per pass: the cp.async kernels at NT 2 past m 64 (split-K GEMM2, W4A4, swizzled separate
     * scales, graph replay); the register-ring kernels at NT 4 past m 16, where the cp.async ring cannot run (MXFP4,
     * and NVFP4 with L 224: linear scale words not 4-byte aligned) */
    {{"nt2", {56, 8, 128, 1152}, 80, ROUTE_RANDOM, 362, K3T_OP_MOE_W4A4}, K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A4, K3_ACT_SITU, 1},
    {{"nt4", {56, 8, 224, 96}, 40, ROUTE_RANDOM, 363, K3T_OP_MOE_W4A16}, K3_WEIGHT_MXFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"nt4", {56, 8, 224, 96}, 40, ROUTE_RANDOM, 364, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 1, K3_MOE_W4A16, K3_ACT_SITU, 1},
    /* GEMM2 with four row tiles per warp (where the two-tile grid is more than 6 waves; here ~610 units
     * x 8 block rows of L 1024 on a 132-SM H200), W4A16 with graph replay and W4A4 with swizzled separate scales;
     * gpu_moe compares both with one tile per warp, bitwise */
    {{"g2-tiles", {896, 16, 1024, 64}, 64, ROUTE_RANDOM, 365, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 1},
    {{"g2-tiles", {896, 16, 1024, 64}, 64, ROUTE_RANDOM, 366, K3T_OP_MOE_W4A4}, K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A4, K3_ACT_SITU, 0},
    /* two tiles with direct output (top_k 1; unfolded: GEMM1's 64 x 56 blocks are past two waves; I 896 < 1024 keeps
     * GEMM2 at KS 1), also rerun with ids outside [0, E) on odd tokens */
    {{"g2-tiles", {896, 1, 256, 896}, 64, ROUTE_RANDOM, 367, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    /* GEMM1's first wave routing itself ahead of the dispatch kernel (unfolded: GEMM1 grids past two
     * waves, and within EARLY_WAVES, 8 on a 132-SM H200). Every token on expert 3 at M 16: its 16 pairs are two
     * units, so the units are not the touched experts and the first wave takes the dispatch's units after its wait
     * (graph replay: new routing, random, where it routes itself). Duplicate ids at M 4: units are whole experts
     * (tpu = np), several passes of one block. Non-gated (RELU2): the other instance. */
    {{"early", {56, 4, 256, 1024}, 16, ROUTE_ONE_EXPERT, 368, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 1},
    {{"early", {8, 4, 512, 4096}, 4, ROUTE_DUP, 369, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"early", {56, 8, 256, 1024}, 8, ROUTE_RANDOM, 370, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_RELU2_NO_MUL, 1},
    /* expert parallelism: -1 and out-of-range ids drop their slots (token 1 entirely), compared with the CPU
     * reference, which drops them too: the folded path (W4A16, few pairs), the dispatch kernel (W4A4, more pairs),
     * top-k 1 (GEMM2 writes out directly), E 896 with swizzled scales, and a captured graph replayed with new
     * dropped routing */
    {{"ep-ids", {56, 8, 256, 128}, 4, ROUTE_EP, 371, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"ep-ids", {56, 8, 256, 128}, 40, ROUTE_EP, 372, K3T_OP_MOE_W4A4}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 1, K3_MOE_W4A4, K3_ACT_SITU, 0},
    {{"ep-ids", {56, 1, 256, 128}, 16, ROUTE_EP, 373, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"ep-ids", {896, 16, 128, 64}, 8, ROUTE_EP, 374, K3T_OP_MOE_W4A16}, K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A16, K3_ACT_SITU, 0},
    {{"ep-ids", {56, 8, 256, 128}, 16, ROUTE_EP, 375, K3T_OP_MOE_W4A16}, K3_WEIGHT_MXFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 1},
};

#define N_MOE_CASES ((int)(sizeof k_moe_cases / sizeof k_moe_cases[0]))
#define MOE_PER_GROUP 8
/* groups: 0 router, 1 dispatch, 2 .. 2 + ceil(N_MOE_CASES / MOE_PER_GROUP) - 1 experts, then latent + validation */
#define N_GROUPS (3 + (N_MOE_CASES + MOE_PER_GROUP - 1) / MOE_PER_GROUP)

/* One group of cases in a child process: a sticky CUDA error (an illegal address, say) then costs only that
 * group, and every other group still reports. Returns the child's exit status (77: no device). */
static int run_group(int gi, int quick) {
    k3t_passed = k3t_failed = 0; /* this group's own counts (a forked child inherits the parent's) */
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) return 77;
    signal(SIGALRM, on_alarm);
    alarm(300);
    k3_ctx_options o;
    k3_ctx_options_init(&o);
    o.backend = K3_BACKEND_CUDA;
    if (k3_ctx_create(&o, &g_gpu) != K3_STATUS_SUCCESS) return 77;
    o.backend = K3_BACKEND_CPU;
    CHECK(k3_ctx_create(&o, &g_cpu) == K3_STATUS_SUCCESS, "cpu context");
    k3t_cuda_ok(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking), "stream");
    const double t0 = now_s();
    if (gi == 0) {
        k3_arch_info ai;
        k3_ctx_arch(g_gpu, &ai);
        printf("gpu_moe: device %s (sm_%d)\n", ai.device_name, ai.sm_version);
        gpu_moe_router_group();
    } else if (gi == 1) {
        gpu_moe_dispatch_group();
    } else if (gi < N_GROUPS - 1) {
        const int first = (gi - 2) * MOE_PER_GROUP;
        for (int i = first; i < first + MOE_PER_GROUP && i < N_MOE_CASES; i++) {
            if (quick && (k_moe_cases[i].c.shape[2] > 512 || k_moe_cases[i].c.m > 80)) continue;
            moe_case(&k_moe_cases[i]);
        }
    } else {
        gpu_moe_latent_group(quick);
    }
    printf("gpu_moe: group %d: %d passed, %d failed (%.1f s)\n", gi, k3t_passed, k3t_failed, now_s() - t0);
    fflush(stdout);
    fflush(stderr);
    cudaStreamDestroy(g_stream);
    k3_ctx_destroy(g_gpu);
    k3_ctx_destroy(g_cpu);
    return k3t_failed ? 1 : (k3t_passed ? 0 : 1);
}

/* Whether group gi is in the comma-separated list. */
static int group_listed(const char *list, int gi) {
    for (const char *p = list; *p;) {
        char *end = NULL;
        const long v = strtol(p, &end, 10);
        if (end == p) return 0;
        if (v == gi) return 1;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return 0;
    }
    return 0;
}

int main(void) {
    /* K3_MOE_QUICK=1 (e.g. under compute-sanitizer): only the cases with small weights */
    const int quick = getenv("K3_MOE_QUICK") && atoi(getenv("K3_MOE_QUICK")) != 0;
    /* K3_MOE_NOFORK=1 runs every group in this process (for debuggers / compute-sanitizer) */
    const int nofork = getenv("K3_MOE_NOFORK") && atoi(getenv("K3_MOE_NOFORK")) != 0;
    /* K3_MOE_GROUPS=1,2,7 runs only those groups (racecheck is slow); the others are reported as not run */
    const char *only = getenv("K3_MOE_GROUPS");
    const double t0 = now_s();
    k3t_seed_init("gpu_moe", DEFAULT_SEED); /* before the fork: every group inherits it */
    /* the parent never touches CUDA, so each child initializes it afresh after fork */
    for (int gi = 0; gi < N_GROUPS; gi++) {
        if (only && !group_listed(only, gi)) {
            printf("gpu_moe: group %d not run (K3_MOE_GROUPS=%s)\n", gi, only);
            continue;
        }
        fflush(stdout);
        fflush(stderr);
        int status = 1;
        if (nofork) {
            const int p0 = k3t_passed, f0 = k3t_failed;
            status = run_group(gi, quick);
            k3t_passed = p0, k3t_failed = f0; /* counted once below, per group, as with fork */
        } else {
            const pid_t pid = fork();
            if (pid == 0) {
                const int st = run_group(gi, quick);
                fflush(stdout);
                _exit(st);
            }
            int ws = 0;
            if (pid < 0 || waitpid(pid, &ws, 0) != pid) {
                CHECK(0, "group %d: fork/wait failed", gi);
                continue;
            }
            status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + (WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
        }
        if (status == 77) {
            if (gi == 0) K3T_SKIP("no CUDA device (or no usable CUDA context)");
            CHECK(0, "group %d: the CUDA device went away", gi);
            continue;
        }
        CHECK(status == 0, "group %d failed (exit status %d; its FAIL lines are above)", gi, status);
    }
    printf("gpu_moe: %d groups, total %.1f s\n", N_GROUPS, now_s() - t0);
    return k3t_finish();
}
#endif
