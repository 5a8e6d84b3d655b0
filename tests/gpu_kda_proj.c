/* KDA projection on the GPU at Kimi-K3 TP8 shapes: the overlapped path captured into a CUDA graph on a non-default
 * stream and replayed; qkvg, beta and g1 vs an independent fp64 evaluation; every element written; replays bitwise
 * identical; overlapped == sequential bit for bit (qkvg only where the overlapped path is the one-launch projection,
 * whose fab and g1 add K in another order than the sequential kernels); with the tuned QKVG kernel, the linear plan
 * table's and cuBLASLt's. The one-launch projection (K3_KDA_RUN_N_FUSED) besides: its qkvg bit for bit that of the
 * linear plan's mma w4_t1_u4_l_h2 (the tile code it shares), and a run on the token rows reversed gives the reversed
 * rows bit for bit (which would catch a stale launch epoch: the branch would add an earlier launch's partial sums).
 * Exit 77 (skipped) without a GPU.
 * Usage: gpu_kda_proj [--no-cublaslt]. --no-cublaslt leaves out the variant whose QKVG is cuBLASLt's, for
 * compute-sanitizer racecheck of this library's kernels alone: cuBLASLt's nvjet kernels report shared-memory hazards
 * of their own, and excluding them by kernel name (--kernel-name-exclude) made the sanitizer fail on a hardware
 * exception in them (session 26). */
#include <string.h>

#include "k3.h"
#include "kda_ref.h"
#include "plan/kda_tuning.h"
#include "test_util.h"

#ifndef K3_HAVE_CUDA
int main(void) { K3T_SKIP("built without CUDA"); }
#else
#include <cuda_runtime.h>

#define CU(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));                                      \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

enum { H = 7168, Q = 6144, F = 144, G = 1536, P = 6288, MT = 16, GUARD = 64 };

/* Copies the first m rows of the device outputs into the scratch buffers (q2, f2, g2) and compares them bit for
 * bit with the earlier results (q, f, g). */
static int same_bits(int64_t m, const void *qkvg, const void *fab, const void *g1, const uint16_t *q,
                     const uint16_t *f, const uint16_t *g, uint16_t *q2, uint16_t *f2, uint16_t *g2) {
    CU(cudaMemcpy(q2, qkvg, 2 * m * Q, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(f2, fab, 2 * m * F, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(g2, g1, 2 * m * G, cudaMemcpyDeviceToHost));
    return !memcmp(q, q2, 2 * m * Q) && !memcmp(f, f2, 2 * m * F) && !memcmp(g, g2, 2 * m * G);
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
    const uint64_t seed = 20261129u;
    printf("seed %llu\n", (unsigned long long)seed);
    k3_ctx_options o;
    k3_ctx_options_init(&o);
    o.backend = K3_BACKEND_CUDA;
    k3_ctx *ctx = NULL;
    CHECK(k3_ctx_create(&o, &ctx) == K3_STATUS_SUCCESS, "cuda context");
    if (!ctx) return k3t_finish();

    k3t_rng rng = {seed};
    uint16_t *hx = malloc(2 * MT * H), *hw = malloc((size_t)2 * P * H), *hfb = malloc(2 * G * 128);
    for (int i = 0; i < MT * H; i++) hx[i] = k3_bf16_from_f32(k3t_uniform(&rng));
    for (size_t i = 0; i < (size_t)P * H; i++) hw[i] = k3_bf16_from_f32(0.02f * k3t_uniform(&rng));
    for (int i = 0; i < G * 128; i++) hfb[i] = k3_bf16_from_f32(0.1f * k3t_uniform(&rng));
    double *rq = malloc(sizeof(double) * MT * Q), *rf = malloc(sizeof(double) * MT * F),
           *rg = malloc(sizeof(double) * MT * G);
    kref_kda(MT, H, Q, F, G, hx, hw, hfb, rq, rf, rg); /* token rows are independent: one reference for all m */

    void *x, *w, *wfb, *qkvg, *fab, *g1;
    CU(cudaMalloc(&x, 2 * MT * H));
    CU(cudaMalloc(&w, (size_t)2 * P * H));
    CU(cudaMalloc(&wfb, 2 * G * 128));
    CU(cudaMalloc(&qkvg, 2 * (MT * Q + GUARD)));
    CU(cudaMalloc(&fab, 2 * (MT * F + GUARD)));
    CU(cudaMalloc(&g1, 2 * (MT * G + GUARD)));
    CU(cudaMemcpy(x, hx, 2 * MT * H, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(w, hw, (size_t)2 * P * H, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(wfb, hfb, 2 * G * 128, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize()); /* pageable copies may still be landing; the test's stream is non-blocking */

    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint16_t *oq = malloc(2 * (MT * Q + GUARD)), *of = malloc(2 * (MT * F + GUARD)), *og = malloc(2 * (MT * G + GUARD));
    uint16_t *oq2 = malloc(2 * MT * Q), *of2 = malloc(2 * MT * F), *og2 = malloc(2 * MT * G);
    /* the QKVG kernel and the F_AB kernel's blocks tuned per m for this architecture, then forced: the linear
     * plan's table's or cuBLASLt's QKVG at every m, with every run_n shape */
    const int32_t variants[][2] = {{K3_KDA_QKVG_TUNED, K3_KDA_RUN_N_TUNED},
                                   {K3_KDA_QKVG_TABLE, K3_KDA_RUN_N_NARROW},
                                   {K3_KDA_QKVG_CUBLASLT, K3_KDA_RUN_N_ROWS1},
                                   {K3_KDA_QKVG_TABLE, K3_KDA_RUN_N_ROWS2},
                                   {K3_KDA_QKVG_TABLE, K3_KDA_RUN_N_SLICED},
                                   {K3_KDA_QKVG_TABLE, K3_KDA_RUN_N_FUSED}};
    /* the fused variant's reference QKVG kernel, and the token rows of x reversed */
    k3_linear_desc ld;
    k3_linear_desc_init(&ld, Q, H);
    ld.force_kernel = K3_KERNEL_MMA;
    ld.force_config = "w4_t1_u4_l_h2";
    k3_linear_plan *tile_plan = NULL;
    CHECK(k3_linear_plan_create(ctx, &ld, &tile_plan) == K3_STATUS_SUCCESS, "w4_t1_u4_l_h2 plan: %s",
          k3_ctx_last_error(ctx));
    if (!tile_plan) return k3t_finish();
    void *xr, *qref;
    CU(cudaMalloc(&xr, 2 * MT * H));
    CU(cudaMalloc(&qref, 2 * MT * Q));
    uint16_t *oqr = malloc(2 * MT * Q);
    /* where the tuned plan runs the one-launch projection (K3_KDA_RUN_N_FUSED) on this device */
    k3_arch_info ai;
    CHECK(k3_ctx_arch(ctx, &ai) == K3_STATUS_SUCCESS, "arch");
    k3_kda_tuning tuned;
    memset(&tuned, 0, sizeof tuned);
    CHECK(k3_kda_tuning_for_ctx(ctx, &tuned) == K3_STATUS_SUCCESS, "tuning: %s", k3_ctx_last_error(ctx));
    const int fused_fits = k3_kda_fused_layout_for(ai.sm_count, H, Q, F, G, 128, NULL, NULL);
    for (int kv = 0; kv < (int)(sizeof variants / sizeof variants[0]); kv++) {
        k3_kda_proj_desc d, dseq;
        k3_kda_proj_desc_init(&d);
        d.qkvg_kernel = (k3_kda_qkvg)variants[kv][0];
        d.run_n_shape = (k3_kda_run_n)variants[kv][1];
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
        if (ws_bytes) CU(cudaMalloc(&ws, ws_bytes));
        const int64_t ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 14, 15, 16}; /* 8: the last m of the tuned sliced F_AB */
        for (int t = 0; t < (int)(sizeof ms / sizeof ms[0]); t++) {
            const int64_t m = ms[t];
            CU(cudaMemsetAsync(qkvg, 0xff, 2 * (MT * Q + GUARD), s));
            CU(cudaMemsetAsync(fab, 0xff, 2 * (MT * F + GUARD), s));
            CU(cudaMemsetAsync(g1, 0xff, 2 * (MT * G + GUARD), s));
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            k3_status st = k3_kda_proj_run(plan, m, x, w, wfb, qkvg, fab, g1, ws, ws_bytes, s);
            CU(cudaStreamEndCapture(s, &graph));
            CHECK(st == K3_STATUS_SUCCESS, "capture m=%lld: %s", (long long)m, k3_ctx_last_error(ctx));
            CU(cudaGraphInstantiate(&exec, graph, 0));
            CU(cudaGraphLaunch(exec, s));
            CU(cudaStreamSynchronize(s));
            CU(cudaMemcpy(oq, qkvg, 2 * (MT * Q + GUARD), cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(of, fab, 2 * (MT * F + GUARD), cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(og, g1, 2 * (MT * G + GUARD), cudaMemcpyDeviceToHost));
            const double eq = kref_rel_l2(m, 0, Q, oq, Q, rq, Q);
            const double eb = kref_rel_l2(m, 128, 12, of, F, rf, F); /* beta columns 128..139 */
            const double ea = kref_rel_l2(m, 0, 128, of, F, rf, F);  /* f_a */
            const double eg = kref_rel_l2(m, 0, G, og, G, rg, G);
            CHECK(eq <= 2e-3 && eb <= 2e-3 && ea <= 2e-3 && eg <= 2e-3,
                  "m=%lld rel-L2 qkvg %.3g beta %.3g f_a %.3g g1 %.3g", (long long)m, eq, eb, ea, eg);
            int unwritten = 0, guard_hit = 0;
            for (int64_t i = 0; i < m * Q; i++) unwritten += oq[i] == 0xffff;
            for (int64_t i = 0; i < m * F; i++) unwritten += of[i] == 0xffff;
            for (int64_t i = 0; i < m * G; i++) unwritten += og[i] == 0xffff;
            for (int64_t i = m * Q; i < MT * Q + GUARD; i++) guard_hit += oq[i] != 0xffff;
            for (int64_t i = m * F; i < MT * F + GUARD; i++) guard_hit += of[i] != 0xffff;
            for (int64_t i = m * G; i < MT * G + GUARD; i++) guard_hit += og[i] != 0xffff;
            CHECK(unwritten == 0, "m=%lld: %d output elements not written (or NaN)", (long long)m, unwritten);
            CHECK(guard_hit == 0, "m=%lld: %d elements written past row m", (long long)m, guard_hit);

            /* replay: bitwise identical */
            CU(cudaGraphLaunch(exec, s));
            CU(cudaStreamSynchronize(s));
            CHECK(same_bits(m, qkvg, fab, g1, oq, of, og, oq2, of2, og2), "m=%lld: replay not bitwise identical",
                  (long long)m);

            /* sequential plan, eager on the stream: the same bits (qkvg only after the one-launch projection) */
            const int fused = d.run_n_shape == K3_KDA_RUN_N_FUSED ||
                              (d.run_n_shape == K3_KDA_RUN_N_TUNED && fused_fits &&
                               tuned.run_n_shape[m] == K3_KDA_RUN_N_FUSED);
            st = k3_kda_proj_run(seq, m, x, w, wfb, qkvg, fab, g1, ws, ws_bytes, s);
            CHECK(st == K3_STATUS_SUCCESS, "sequential m=%lld: %s", (long long)m, k3_ctx_last_error(ctx));
            CU(cudaStreamSynchronize(s));
            if (fused) {
                CU(cudaMemcpy(oq2, qkvg, 2 * m * Q, cudaMemcpyDeviceToHost));
                CHECK(!memcmp(oq, oq2, 2 * m * Q), "m=%lld: one-launch and sequential qkvg differ", (long long)m);
            } else {
                CHECK(same_bits(m, qkvg, fab, g1, oq, of, og, oq2, of2, og2),
                      "m=%lld: overlapped and sequential differ", (long long)m);
            }
            if (d.run_n_shape == K3_KDA_RUN_N_FUSED) {
                CHECK(k3_linear_run(tile_plan, m, x, w, NULL, qref, NULL, 0, s) == K3_STATUS_SUCCESS, "tile plan: %s",
                      k3_ctx_last_error(ctx));
                CU(cudaStreamSynchronize(s));
                CU(cudaMemcpy(oq2, qref, 2 * m * Q, cudaMemcpyDeviceToHost));
                CHECK(!memcmp(oq, oq2, 2 * m * Q), "m=%lld: fused qkvg differs from mma w4_t1_u4_l_h2",
                      (long long)m);
                for (int64_t r = 0; r < m; r++) /* x's first m rows reversed */
                    CU(cudaMemcpyAsync((uint16_t *)xr + r * H, (const uint16_t *)x + (m - 1 - r) * H, 2 * H,
                                       cudaMemcpyDeviceToDevice, s));
                CHECK(k3_kda_proj_run(plan, m, xr, w, wfb, qkvg, fab, g1, ws, ws_bytes, s) == K3_STATUS_SUCCESS,
                      "reversed m=%lld: %s", (long long)m, k3_ctx_last_error(ctx));
                CU(cudaStreamSynchronize(s));
                CU(cudaMemcpy(oqr, qkvg, 2 * m * Q, cudaMemcpyDeviceToHost));
                CU(cudaMemcpy(of2, fab, 2 * m * F, cudaMemcpyDeviceToHost));
                CU(cudaMemcpy(og2, g1, 2 * m * G, cudaMemcpyDeviceToHost));
                int same = 1;
                for (int64_t r = 0; r < m; r++)
                    same = same && !memcmp(oqr + r * Q, oq + (m - 1 - r) * Q, 2 * Q) &&
                           !memcmp(of2 + r * F, of + (m - 1 - r) * F, 2 * F) &&
                           !memcmp(og2 + r * G, og + (m - 1 - r) * G, 2 * G);
                CHECK(same, "m=%lld: fused run on reversed token rows is not the reversed result", (long long)m);
            }
            CU(cudaGraphExecDestroy(exec));
            CU(cudaGraphDestroy(graph));
            printf("m=%2lld rel-L2 qkvg %.2e beta %.2e f_a %.2e g1 %.2e\n", (long long)m, eq, eb, ea, eg);
        }
        /* validation on the device path: misaligned pointer */
        CHECK(k3_kda_proj_run(plan, 1, (char *)x + 2, w, wfb, qkvg, fab, g1, ws, ws_bytes, s) ==
                  K3_STATUS_INVALID_ARGUMENT, "misaligned x rejected");
        k3_kda_proj_plan_destroy(plan);
        k3_kda_proj_plan_destroy(seq);
        cudaFree(ws);
    }
    k3_linear_plan_destroy(tile_plan);
    cudaFree(xr), cudaFree(qref), free(oqr);
    CU(cudaStreamDestroy(s));
    cudaFree(x), cudaFree(w), cudaFree(wfb), cudaFree(qkvg), cudaFree(fab), cudaFree(g1);
    free(hx), free(hw), free(hfb), free(rq), free(rf), free(rg), free(oq), free(of), free(og), free(oq2), free(of2),
        free(og2);
    k3_ctx_destroy(ctx);
    return k3t_finish();
}
#endif
