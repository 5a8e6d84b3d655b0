/* KDA projection on the GPU at Kimi-K3 TP8 shapes: the overlapped path captured into a CUDA graph on a non-default
 * stream and replayed; qkvg, beta, f_a and g1 vs an independent fp64 evaluation (tests/kda_ref.h) rounded to BF16,
 * within the KDA budget; through the harness (tests/k3t_harness.h) every output poisoned before every run (every
 * element of the first m rows written, nothing past them, guard bytes around each output, no NaN/Inf); replays
 * bitwise identical; overlapped == sequential bit for bit (qkvg only where the overlapped path is the one-launch
 * projection, whose fab and g1 add K in another order than the sequential kernels); with the tuned QKVG kernel,
 * the linear plan table's and cuBLASLt's. The one-launch projection (K3_KDA_RUN_N_FUSED) besides: its qkvg bit for
 * bit that of the linear plan's mma w4_t1_u4_l_h2 (the tile code it shares), and a run on the token rows reversed
 * gives the reversed rows bit for bit (which would catch a stale launch epoch: the branch would add an earlier
 * launch's partial sums). Exit 77 (skipped) without a GPU. K3T_SEED=<n> changes the seed.
 * Usage: gpu_kda_proj [--no-cublaslt]. --no-cublaslt leaves out the variant whose QKVG is cuBLASLt's, for
 * compute-sanitizer racecheck of this library's kernels alone: cuBLASLt's nvjet kernels report shared-memory hazards
 * of their own, and excluding them by kernel name (--kernel-name-exclude) made the sanitizer itself fail on a
 * hardware exception in them. */
#include <string.h>

#include "k3.h"
#include "kda_ref.h"
#include "plan/kda_tuning.h"
#include "test_util.h"

#ifndef K3_HAVE_CUDA
int main(void) { K3T_SKIP("built without CUDA"); }
#else
#include "k3t_harness_cuda.h"

#define DEFAULT_SEED 20261129u

enum { H = 7168, Q = 6144, F = 144, G = 1536, P = 6288, MT = 16 };

/* A variant of the plan: shape = {hidden, qkvg rows, f_ab rows, g1 rows}; m: the most tokens (the runs take the
 * m list below); every variant runs on the same data (seed offset 0). qkvg_kernel and run_n_shape are forced
 * into the description (-1 and TUNED: the context's tuning for this architecture). */
typedef struct kda_case {
    k3t_case c;
    k3_kda_qkvg qkvg_kernel;
    k3_kda_run_n run_n_shape;
} kda_case;

static const kda_case k_cases[] = {
    {{"tuned", {H, Q, F, G}, MT, 0, 0, K3T_OP_KDA_PROJ}, K3_KDA_QKVG_TUNED, K3_KDA_RUN_N_TUNED},
    {{"table qkvg, narrow run_n", {H, Q, F, G}, MT, 0, 0, K3T_OP_KDA_PROJ}, K3_KDA_QKVG_TABLE, K3_KDA_RUN_N_NARROW},
    {{"cublaslt qkvg, rows1 run_n", {H, Q, F, G}, MT, 0, 0, K3T_OP_KDA_PROJ}, K3_KDA_QKVG_CUBLASLT, K3_KDA_RUN_N_ROWS1},
    {{"table qkvg, rows2 run_n", {H, Q, F, G}, MT, 0, 0, K3T_OP_KDA_PROJ}, K3_KDA_QKVG_TABLE, K3_KDA_RUN_N_ROWS2},
    {{"table qkvg, sliced run_n", {H, Q, F, G}, MT, 0, 0, K3T_OP_KDA_PROJ}, K3_KDA_QKVG_TABLE, K3_KDA_RUN_N_SLICED},
    {{"one-launch projection", {H, Q, F, G}, MT, 0, 0, K3T_OP_KDA_PROJ}, K3_KDA_QKVG_TABLE, K3_KDA_RUN_N_FUSED},
};

/* The three outputs and the first result of the case at this m (host copies). */
typedef struct outs {
    k3t_dout q, f, g;
    uint16_t *q0, *f0, *g0;
} outs;

static int poison_all(outs *o, cudaStream_t s) {
    return k3t_dout_poison(&o->q, s) && k3t_dout_poison(&o->f, s) && k3t_dout_poison(&o->g, s);
}

/* After the work on s: every output's first m rows written (finite), nothing past them, guards intact. */
static void check_all(outs *o, cudaStream_t s, int64_t m) {
    k3t_dout_check(&o->q, s, k3t_rows(m, Q, Q), 0, NULL);
    k3t_dout_check(&o->f, s, k3t_rows(m, F, F), 0, NULL);
    k3t_dout_check(&o->g, s, k3t_rows(m, G, G), 0, NULL);
}

/* The fetched outputs' first m rows bit for bit against qr, fr, gr (all three, or qkvg alone). */
static void same_bits(const char *what, int64_t m, const outs *o, const uint16_t *qr, const uint16_t *fr,
                      const uint16_t *gr, int qkvg_only) {
    char w[160];
    snprintf(w, sizeof w, "m=%lld: %s: qkvg", (long long)m, what);
    k3t_check_same(w, k3t_dout_host(&o->q), qr, K3T_BF16, m * Q);
    if (qkvg_only) return;
    snprintf(w, sizeof w, "m=%lld: %s: fab", (long long)m, what);
    k3t_check_same(w, k3t_dout_host(&o->f), fr, K3T_BF16, m * F);
    snprintf(w, sizeof w, "m=%lld: %s: g1", (long long)m, what);
    k3t_check_same(w, k3t_dout_host(&o->g), gr, K3T_BF16, m * G);
}

int main(int argc, char **argv) {
    int no_cublaslt = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-cublaslt")) {
            no_cublaslt = 1;
        } else {
            fprintf(stderr, "usage: gpu_kda_proj [--no-cublaslt]\n  --no-cublaslt  leave out the variant whose QKVG "
                            "GEMM is cuBLASLt's (racecheck of this library's kernels alone)\n");
            return 2;
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) K3T_SKIP("no CUDA device");
    k3t_seed_init("gpu_kda_proj", DEFAULT_SEED);
    const uint64_t seed = k3t_case_enter("data (every variant)", 0);
    k3_ctx_options o;
    k3_ctx_options_init(&o);
    o.backend = K3_BACKEND_CUDA;
    k3_ctx *ctx = NULL;
    CHECK(k3_ctx_create(&o, &ctx) == K3_STATUS_SUCCESS, "cuda context");
    if (!ctx) return k3t_finish();

    k3t_rng rng = {seed};
    uint16_t *hx = malloc(2 * MT * H), *hw = malloc((size_t)2 * P * H), *hfb = malloc(2 * G * 128);
    double *rq = malloc(sizeof(double) * MT * Q), *rf = malloc(sizeof(double) * MT * F),
           *rg = malloc(sizeof(double) * MT * G);
    outs ob;
    memset(&ob, 0, sizeof ob);
    ob.q0 = malloc(2 * MT * Q), ob.f0 = malloc(2 * MT * F), ob.g0 = malloc(2 * MT * G);
    uint16_t *rev_q = malloc(2 * MT * Q), *rev_f = malloc(2 * MT * F), *rev_g = malloc(2 * MT * G);
    if (!hx || !hw || !hfb || !rq || !rf || !rg || !ob.q0 || !ob.f0 || !ob.g0 || !rev_q || !rev_f || !rev_g) {
        CHECK(0, "out of host memory");
        return k3t_finish();
    }
    for (int i = 0; i < MT * H; i++) hx[i] = k3t_rand_bf16(&rng, 1.0f);
    for (size_t i = 0; i < (size_t)P * H; i++) hw[i] = k3t_rand_bf16(&rng, 0.02f);
    for (int i = 0; i < G * 128; i++) hfb[i] = k3t_rand_bf16(&rng, 0.1f);
    kref_kda(MT, H, Q, F, G, hx, hw, hfb, rq, rf, rg); /* token rows are independent: one reference for all m */

    void *x, *w, *wfb;
    K3T_CU(cudaMalloc(&x, 2 * MT * H));
    K3T_CU(cudaMalloc(&w, (size_t)2 * P * H));
    K3T_CU(cudaMalloc(&wfb, 2 * G * 128));
    if (!k3t_dout_alloc(&ob.q, "qkvg", K3T_BF16, MT * Q) || !k3t_dout_alloc(&ob.f, "fab", K3T_BF16, MT * F) ||
        !k3t_dout_alloc(&ob.g, "g1", K3T_BF16, MT * G))
        return k3t_finish();
    K3T_CU(cudaMemcpy(x, hx, 2 * MT * H, cudaMemcpyHostToDevice));
    K3T_CU(cudaMemcpy(w, hw, (size_t)2 * P * H, cudaMemcpyHostToDevice));
    K3T_CU(cudaMemcpy(wfb, hfb, 2 * G * 128, cudaMemcpyHostToDevice));
    K3T_CU(cudaDeviceSynchronize()); /* pageable copies may still be landing; the test's stream is non-blocking */
    void *qkvg = k3t_dout_ptr(&ob.q), *fab = k3t_dout_ptr(&ob.f), *g1 = k3t_dout_ptr(&ob.g);

    cudaStream_t s;
    K3T_CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    /* the fused variant's reference QKVG kernel, and the token rows of x reversed */
    k3_linear_desc ld;
    k3_linear_desc_init(&ld, Q, H);
    ld.force_kernel = K3_KERNEL_MMA;
    ld.force_config = "w4_t1_u4_l_h2";
    k3_linear_plan *tile_plan = NULL;
    CHECK(k3_linear_plan_create(ctx, &ld, &tile_plan) == K3_STATUS_SUCCESS, "w4_t1_u4_l_h2 plan: %s",
          k3_ctx_last_error(ctx));
    if (!tile_plan) return k3t_finish();
    void *xr;
    k3t_dout qref;
    K3T_CU(cudaMalloc(&xr, 2 * MT * H));
    if (!k3t_dout_alloc(&qref, "w4_t1_u4_l_h2 qkvg", K3T_BF16, MT * Q)) return k3t_finish();
    /* where the tuned plan runs the one-launch projection (K3_KDA_RUN_N_FUSED) on this device */
    k3_arch_info ai;
    CHECK(k3_ctx_arch(ctx, &ai) == K3_STATUS_SUCCESS, "arch");
    k3_kda_tuning tuned;
    memset(&tuned, 0, sizeof tuned);
    CHECK(k3_kda_tuning_for_ctx(ctx, &tuned) == K3_STATUS_SUCCESS, "tuning: %s", k3_ctx_last_error(ctx));
    const int fused_fits = k3_kda_fused_layout_for(ai.sm_count, H, Q, F, G, 128, NULL, NULL);
    for (int kv = 0; kv < (int)(sizeof k_cases / sizeof k_cases[0]); kv++) {
        const kda_case *kc = &k_cases[kv];
        k3t_case_begin(&kc->c);
        k3_kda_proj_desc d, dseq;
        k3_kda_proj_desc_init(&d);
        d.qkvg_kernel = kc->qkvg_kernel;
        d.run_n_shape = kc->run_n_shape;
        printf("qkvg_kernel %d, run_n_shape %d\n", (int)d.qkvg_kernel, (int)d.run_n_shape);
        if (no_cublaslt && d.qkvg_kernel == K3_KDA_QKVG_CUBLASLT) {
            printf("the cuBLASLt QKVG variant is not run (--no-cublaslt)\n");
            continue;
        }
        if (d.run_n_shape == K3_KDA_RUN_N_FUSED && !fused_fits) { /* too few SMs: refused, with a reason */
            k3_kda_proj_plan *no = NULL;
            CHECK(k3_kda_proj_plan_create(ctx, &d, &no) == K3_STATUS_UNSUPPORTED && !no &&
                      strstr(k3_ctx_last_error(ctx), "SMs"),
                  "a forced one-launch plan on %d SMs is refused: %s", (int)ai.sm_count, k3_ctx_last_error(ctx));
            printf("the one-launch projection does not fit %d SMs: its variant is not run\n", (int)ai.sm_count);
            continue;
        }
        dseq = d;
        dseq.overlap_max_tokens = 0;
        k3_kda_proj_plan *plan = NULL, *seq = NULL;
        CHECK(k3_kda_proj_plan_create(ctx, &d, &plan) == K3_STATUS_SUCCESS, "plan: %s", k3_ctx_last_error(ctx));
        CHECK(k3_kda_proj_plan_create(ctx, &dseq, &seq) == K3_STATUS_SUCCESS, "seq plan: %s", k3_ctx_last_error(ctx));
        if (!plan || !seq) return k3t_finish();
        size_t ws_bytes = 0, ws2 = 0;
        k3_kda_proj_workspace_size(plan, &ws_bytes);
        k3_kda_proj_workspace_size(seq, &ws2);
        if (ws2 > ws_bytes) ws_bytes = ws2;
        void *ws = NULL;
        if (ws_bytes) K3T_CU(cudaMalloc(&ws, ws_bytes));
        const int64_t ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 14, 15, 16}; /* 8: the last m of the tuned sliced F_AB */
        for (int t = 0; t < (int)(sizeof ms / sizeof ms[0]); t++) {
            const int64_t m = ms[t];
            if (!poison_all(&ob, s)) return k3t_finish();
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            K3T_CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            k3_status st = k3_kda_proj_run(plan, m, x, w, wfb, qkvg, fab, g1, ws, ws_bytes, s);
            K3T_CU(cudaStreamEndCapture(s, &graph));
            CHECK(st == K3_STATUS_SUCCESS, "capture m=%lld: %s", (long long)m, k3_ctx_last_error(ctx));
            /* the branch's kernels at the capturing stream's priority; instantiated as PyTorch's graphs are */
            int prio = 0, kernels = 0;
            K3T_CU(cudaStreamGetPriority(s, &prio));
            const int bad = k3t_graph_priority_mismatches(graph, prio, &kernels);
            CHECK(bad == 0 && kernels > 0, "m=%lld graph: %d of %d kernels at a priority other than the stream's %d",
                  (long long)m, bad, kernels, prio);
            K3T_CU(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUseNodePriority));
            K3T_CU(cudaGraphLaunch(exec, s));
            K3T_CU(cudaStreamSynchronize(s));
            check_all(&ob, s, m);
            const uint16_t *oq = (const uint16_t *)k3t_dout_host(&ob.q), *of = (const uint16_t *)k3t_dout_host(&ob.f),
                           *og = (const uint16_t *)k3t_dout_host(&ob.g);
            char wq[64], wb[64], wa[64], wg[64];
            snprintf(wq, sizeof wq, "m=%lld qkvg", (long long)m);
            snprintf(wb, sizeof wb, "m=%lld beta", (long long)m);
            snprintf(wa, sizeof wa, "m=%lld f_a", (long long)m);
            snprintf(wg, sizeof wg, "m=%lld g1", (long long)m);
            const double eq = k3t_check_close(wq, k3t_view2(oq, K3T_BF16, m, Q, Q),
                                              k3t_rounded(k3t_view2(rq, K3T_F64, m, Q, Q)), K3T_OP_KDA_PROJ)
                                  .metric;
            /* beta: fab columns 128..139; f_a: columns 0..127 */
            const double eb = k3t_check_close(wb, k3t_view2(of + 128, K3T_BF16, m, 12, F),
                                              k3t_rounded(k3t_view2(rf + 128, K3T_F64, m, 12, F)), K3T_OP_KDA_PROJ)
                                  .metric;
            const double ea = k3t_check_close(wa, k3t_view2(of, K3T_BF16, m, 128, F),
                                              k3t_rounded(k3t_view2(rf, K3T_F64, m, 128, F)), K3T_OP_KDA_PROJ)
                                  .metric;
            const double eg = k3t_check_close(wg, k3t_view2(og, K3T_BF16, m, G, G),
                                              k3t_rounded(k3t_view2(rg, K3T_F64, m, G, G)), K3T_OP_KDA_PROJ)
                                  .metric;
            memcpy(ob.q0, oq, 2 * m * Q), memcpy(ob.f0, of, 2 * m * F), memcpy(ob.g0, og, 2 * m * G);

            /* replay (on poisoned outputs): bitwise identical */
            if (!poison_all(&ob, s)) return k3t_finish();
            K3T_CU(cudaGraphLaunch(exec, s));
            K3T_CU(cudaStreamSynchronize(s));
            check_all(&ob, s, m);
            same_bits("replay vs the first run", m, &ob, ob.q0, ob.f0, ob.g0, 0);

            /* sequential plan, eager on the stream: the same bits (qkvg only after the one-launch projection) */
            const int fused = d.run_n_shape == K3_KDA_RUN_N_FUSED ||
                              (d.run_n_shape == K3_KDA_RUN_N_TUNED && fused_fits &&
                               tuned.run_n_shape[m] == K3_KDA_RUN_N_FUSED);
            if (!poison_all(&ob, s)) return k3t_finish();
            st = k3_kda_proj_run(seq, m, x, w, wfb, qkvg, fab, g1, ws, ws_bytes, s);
            CHECK(st == K3_STATUS_SUCCESS, "sequential m=%lld: %s", (long long)m, k3_ctx_last_error(ctx));
            K3T_CU(cudaStreamSynchronize(s));
            check_all(&ob, s, m);
            same_bits(fused ? "one-launch vs sequential" : "overlapped vs sequential", m, &ob, ob.q0, ob.f0, ob.g0,
                      fused);
            if (d.run_n_shape == K3_KDA_RUN_N_FUSED) {
                if (!k3t_dout_poison(&qref, s)) return k3t_finish();
                CHECK(k3_linear_run(tile_plan, m, x, w, NULL, k3t_dout_ptr(&qref), NULL, 0, s) == K3_STATUS_SUCCESS,
                      "tile plan: %s", k3_ctx_last_error(ctx));
                K3T_CU(cudaStreamSynchronize(s));
                k3t_dout_check(&qref, s, k3t_rows(m, Q, Q), 0, NULL);
                char wt[96];
                snprintf(wt, sizeof wt, "m=%lld: fused qkvg vs mma w4_t1_u4_l_h2", (long long)m);
                k3t_check_same(wt, ob.q0, k3t_dout_host(&qref), K3T_BF16, m * Q);
                for (int64_t r = 0; r < m; r++) /* x's first m rows reversed */
                    K3T_CU(cudaMemcpyAsync((uint16_t *)xr + r * H, (const uint16_t *)x + (m - 1 - r) * H, 2 * H,
                                           cudaMemcpyDeviceToDevice, s));
                if (!poison_all(&ob, s)) return k3t_finish();
                CHECK(k3_kda_proj_run(plan, m, xr, w, wfb, qkvg, fab, g1, ws, ws_bytes, s) == K3_STATUS_SUCCESS,
                      "reversed m=%lld: %s", (long long)m, k3_ctx_last_error(ctx));
                K3T_CU(cudaStreamSynchronize(s));
                check_all(&ob, s, m);
                for (int64_t r = 0; r < m; r++) { /* the expected: the first run's rows reversed */
                    memcpy(rev_q + r * Q, ob.q0 + (m - 1 - r) * Q, 2 * Q);
                    memcpy(rev_f + r * F, ob.f0 + (m - 1 - r) * F, 2 * F);
                    memcpy(rev_g + r * G, ob.g0 + (m - 1 - r) * G, 2 * G);
                }
                same_bits("fused run on reversed token rows vs the reversed result", m, &ob, rev_q, rev_f, rev_g, 0);
            }
            K3T_CU(cudaGraphExecDestroy(exec));
            K3T_CU(cudaGraphDestroy(graph));
            printf("m=%2lld rel-L2 qkvg %.2e beta %.2e f_a %.2e g1 %.2e\n", (long long)m, eq, eb, ea, eg);
        }
        /* validation on the device path: misaligned pointer, refused without writing */
        if (!poison_all(&ob, s)) return k3t_finish();
        CHECK(k3_kda_proj_run(plan, 1, (char *)x + 2, w, wfb, qkvg, fab, g1, ws, ws_bytes, s) ==
                  K3_STATUS_INVALID_ARGUMENT, "misaligned x rejected");
        K3T_CU(cudaStreamSynchronize(s));
        check_all(&ob, s, 0);
        k3_kda_proj_plan_destroy(plan);
        k3_kda_proj_plan_destroy(seq);
        cudaFree(ws);
    }
    k3_linear_plan_destroy(tile_plan);
    cudaFree(xr);
    k3t_dout_free(&qref);
    K3T_CU(cudaStreamDestroy(s));
    cudaFree(x), cudaFree(w), cudaFree(wfb);
    k3t_dout_free(&ob.q), k3t_dout_free(&ob.f), k3t_dout_free(&ob.g);
    free(hx), free(hw), free(hfb), free(rq), free(rf), free(rg), free(ob.q0), free(ob.f0), free(ob.g0);
    free(rev_q), free(rev_f), free(rev_g);
    k3_ctx_destroy(ctx);
    return k3t_finish();
}
#endif
