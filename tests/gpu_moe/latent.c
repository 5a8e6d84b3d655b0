/* gpu_moe, the last group: the latent-MoE block against the CPU backend, and the run-time refusals. */
#ifdef K3_HAVE_CUDA
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_moe/gpu_moe.h"
#include "plan/latent_tuning.h"

static uint16_t *rand_bf16_buf(k3t_rng *r, int64_t n, float scale, float offset) {
    uint16_t *b = (uint16_t *)malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) b[i] = k3t_bf16_bits(offset + scale * k3t_uniform(r));
    return b;
}

/* Latent case options. */
enum { LAT_RESIDUAL = 1, LAT_GRAPH = 2, LAT_SLOW = 4 /* left out by K3_MOE_QUICK */ };

/* shape = {H, L, E, top_k, I, shared I}; m tokens; options LAT_*; seed offsets 400 + i */
static const k3t_case k_latent_cases[] = {
    {"latent", {1024, 512, 56, 8, 128, 256}, 1, 0, 400, K3T_OP_LATENT_MOE},
    {"latent", {1024, 512, 56, 8, 128, 256}, 16, LAT_RESIDUAL | LAT_GRAPH, 401, K3T_OP_LATENT_MOE},
    /* K3 widths, fewer experts */
    {"latent", {7168, 3584, 64, 16, 384, 768}, 4, LAT_RESIDUAL | LAT_GRAPH | LAT_SLOW, 402, K3T_OP_LATENT_MOE},
};

/* Plan p captured (two calls) on a stream at the device's least and at its greatest priority: every kernel of the
 * graph (the branches on the plan's own streams too) carries the capturing stream's priority, and the graph
 * instantiated with per-node priorities, as PyTorch instantiates its graphs, replays the eager run's bits (yg). */
static void latent_graph_priorities(k3_latent_moe_plan *p, const char *name, int32_t M, const void *dx,
                                    const k3_latent_moe_weights *dw, const void *dres, const uint16_t *yg,
                                    int64_t nh, k3t_dout *dy, void *ws, size_t wsg) {
    int range[2] = {0, 0}; /* least, greatest */
    if (!k3t_cuda_ok(cudaDeviceGetStreamPriorityRange(&range[0], &range[1]), "stream priority range")) return;
    for (int r = 0; r < 2; r++) {
        cudaStream_t s = NULL;
        cudaGraph_t gr = NULL;
        cudaGraphExec_t ex = NULL;
        if (!k3t_cuda_ok(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, range[r]), "priority stream"))
            continue;
        if (k3t_cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "priority capture")) {
            k3_status st = K3_STATUS_SUCCESS; /* two calls: a fork of a branch stream already in the capture */
            for (int call = 0; call < 2 && st == K3_STATUS_SUCCESS; call++)
                st = k3_latent_moe_run(p, M, dx, dw, dres, k3t_dout_ptr(dy), NULL, NULL, ws, wsg, s);
            const cudaError_t ce = cudaStreamEndCapture(s, &gr);
            CHECK(st == K3_STATUS_SUCCESS && ce == cudaSuccess, "latent %s capture at priority %d: %s / %s", name,
                  range[r], k3_ctx_last_error(g_gpu), cudaGetErrorString(ce));
        }
        int kernels = 0;
        const int bad = gr ? k3t_graph_priority_mismatches(gr, range[r], &kernels) : -1;
        CHECK(bad == 0 && kernels > 0, "latent %s graph captured at priority %d: %d of %d kernels at another", name,
              range[r], bad, kernels);
        if (gr && k3t_cuda_ok(cudaGraphInstantiate(&ex, gr, cudaGraphInstantiateFlagUseNodePriority),
                              "instantiate with node priorities")) {
            k3t_dout_poison(dy, s);
            if (k3t_cuda_ok(cudaGraphLaunch(ex, s), "node-priority graph launch") &&
                k3t_cuda_ok(cudaStreamSynchronize(s), "node-priority graph sync")) {
                k3t_dout_check(dy, s, k3t_flat(nh), 0, NULL);
                char what[112];
                snprintf(what, sizeof what, "latent %s graph at priority %d (node priorities) vs eager: y", name,
                         range[r]);
                k3t_check_same(what, k3t_dout_host(dy), yg, K3T_BF16, nh);
            }
        }
        if (ex) cudaGraphExecDestroy(ex);
        if (gr) cudaGraphDestroy(gr);
        cudaStreamDestroy(s);
        cudaGetLastError();
    }
}

/* Every forced schedule gives the default plan's bits (y, routing) and reports itself; PRE_REDUCE's partial too
 * (the same kernels on other streams: the order of the arithmetic does not change). */
static void latent_schedules(const k3_latent_moe_desc *d0, int32_t M, const void *dx, const k3_latent_moe_weights *dw,
                             const void *dres, const uint16_t *yg, const int32_t *idg, const float *wg, k3t_dout *dy,
                             k3t_dout *dids, k3t_dout *dwt) {
    enum { NS = 5 };
    static const k3_latent_schedule scheds[NS] = {K3_LATENT_SCHEDULE_SHARED_BESIDE, K3_LATENT_SCHEDULE_ROUTER_BESIDE,
                                                  K3_LATENT_SCHEDULE_SERIAL, K3_LATENT_SCHEDULE_SELECT_BESIDE,
                                                  K3_LATENT_SCHEDULE_LOGITS_FIRST};
    static const char *names[NS] = {"shared-beside", "router-beside", "serial", "select-beside", "logits-first"};
    const int64_t nk = (int64_t)M * d0->experts.top_k, nh = (int64_t)M * d0->hidden;
    float *part[NS] = {NULL, NULL, NULL, NULL, NULL};
    size_t count = 0;
    for (int i = 0; i < NS; i++) {
        k3_latent_moe_desc d = *d0;
        d.schedule = scheds[i];
        k3_latent_moe_plan *p = NULL;
        const k3_status sc = k3_latent_moe_plan_create(g_gpu, &d, &p);
        CHECK(sc == K3_STATUS_SUCCESS, "latent %s plan: %s", names[i], k3_ctx_last_error(g_gpu));
        if (sc != K3_STATUS_SUCCESS) continue;
        k3_latent_schedule got = K3_LATENT_SCHEDULE_AUTO;
        CHECK(k3_latent_moe_plan_schedule(p, &got) == K3_STATUS_SUCCESS && got == scheds[i],
              "latent %s plan reports schedule %d", names[i], (int)got);
        got = K3_LATENT_SCHEDULE_AUTO;
        CHECK(k3_latent_moe_plan_schedule_at(p, M, &got) == K3_STATUS_SUCCESS && got == scheds[i],
              "latent %s plan reports schedule %d at m %d", names[i], (int)got, (int)M);
        size_t wsg = 0;
        k3_latent_moe_workspace_size(p, &wsg);
        k3_latent_moe_partial_count(p, M, &count);
        void *ws = k3t_dalloc(wsg);
        part[i] = (float *)k3t_dalloc(count * 4);
        k3t_dout_poison(dy, g_stream), k3t_dout_poison(dids, g_stream), k3t_dout_poison(dwt, g_stream);
        const k3_status st = k3_latent_moe_run(p, M, dx, dw, dres, k3t_dout_ptr(dy), (int32_t *)k3t_dout_ptr(dids),
                                               (float *)k3t_dout_ptr(dwt), ws, wsg, g_stream);
        const k3_status sp = k3_latent_moe_run_stage(p, K3_LATENT_PRE_REDUCE, M, dx, dw, NULL, NULL, part[i], NULL,
                                                     NULL, ws, wsg, g_stream);
        CHECK(st == K3_STATUS_SUCCESS && sp == K3_STATUS_SUCCESS, "latent %s run: %s", names[i],
              k3_ctx_last_error(g_gpu));
        if (k3t_cuda_ok(cudaStreamSynchronize(g_stream), "latent schedule sync")) {
            k3t_dout_check(dy, g_stream, k3t_flat(nh), 0, NULL);
            k3t_dout_check(dids, g_stream, k3t_flat(nk), 0, NULL);
            k3t_dout_check(dwt, g_stream, k3t_flat(nk), 0, NULL);
            char what[96];
            snprintf(what, sizeof what, "latent schedule %s vs the default: y", names[i]);
            k3t_check_same(what, k3t_dout_host(dy), yg, K3T_BF16, nh);
            snprintf(what, sizeof what, "latent schedule %s vs the default: ids", names[i]);
            k3t_check_same(what, k3t_dout_host(dids), idg, K3T_I32, nk);
            snprintf(what, sizeof what, "latent schedule %s vs the default: weights", names[i]);
            k3t_check_same(what, k3t_dout_host(dwt), wg, K3T_F32, nk);
        }
        latent_graph_priorities(p, names[i], M, dx, dw, dres, yg, nh, dy, ws, wsg);
        cudaFree(ws);
        k3_latent_moe_plan_destroy(p);
    }
    if (part[0] && part[1] && part[2] && part[3] && part[4]) {
        float *h[NS];
        for (int i = 0; i < NS; i++) {
            h[i] = (float *)malloc(count * 4);
            cudaMemcpy(h[i], part[i], count * 4, cudaMemcpyDeviceToHost);
        }
        k3t_check_same("latent PRE_REDUCE partial: router-beside vs shared-beside", h[1], h[0], K3T_F32,
                       (int64_t)count);
        k3t_check_same("latent PRE_REDUCE partial: serial vs shared-beside", h[2], h[0], K3T_F32, (int64_t)count);
        k3t_check_same("latent PRE_REDUCE partial: select-beside vs shared-beside", h[3], h[0], K3T_F32,
                       (int64_t)count);
        k3t_check_same("latent PRE_REDUCE partial: logits-first vs shared-beside", h[4], h[0], K3T_F32,
                       (int64_t)count);
        for (int i = 0; i < NS; i++) free(h[i]);
    }
    for (int i = 0; i < NS; i++) cudaFree(part[i]);
}

static void latent_case(const k3t_case *c) {
    const uint64_t seed = k3t_case_begin(c);
    const int f0 = k3t_failed;
    const int64_t H = c->shape[0], L = c->shape[1], I = c->shape[4], Is = c->shape[5];
    const int32_t E = (int32_t)c->shape[2], K = (int32_t)c->shape[3], M = (int32_t)c->m;
    const int use_res = (c->options & LAT_RESIDUAL) != 0, graph = (c->options & LAT_GRAPH) != 0;
    const double tol = k3t_budget_of(c->budget)->tol;
    k3t_rng rng = {seed};
    const mcase ec = {{"latent", {E, K, L, I, 0, 0}, M, ROUTE_RANDOM, 0, K3T_OP_MOE_W4A16},
                      K3_WEIGHT_NVFP4,
                      K3_SCALE_LINEAR,
                      0,
                      K3_MOE_W4A16,
                      K3_ACT_SITU,
                      0};
    moe_data md;
    const int made = moe_data_make(&md, &ec, &rng);
    CHECK(made, "latent: expert data");
    uint16_t *x = rand_bf16_buf(&rng, M * H, 1.0f, 0.0f), *res = rand_bf16_buf(&rng, M * H, 1.0f, 0.0f);
    uint16_t *gate = rand_bf16_buf(&rng, (int64_t)E * H, 0.05f, 0.0f);
    float *bias = (float *)malloc((size_t)E * 4);
    for (int32_t e = 0; e < E; e++) bias[e] = 0.02f * k3t_uniform(&rng);
    uint16_t *down = rand_bf16_buf(&rng, L * H, 2.0f / sqrtf((float)H), 0.0f);
    uint16_t *norm = rand_bf16_buf(&rng, L, 0.1f, 1.0f);
    uint16_t *up = rand_bf16_buf(&rng, H * L, 2.0f / sqrtf((float)L), 0.0f);
    uint16_t *sgu = rand_bf16_buf(&rng, 2 * Is * H, 2.0f / sqrtf((float)H), 0.0f);
    uint16_t *sdn = rand_bf16_buf(&rng, H * Is, 2.0f / sqrtf((float)Is), 0.0f);
    k3_latent_moe_desc d;
    k3_latent_moe_desc_init(&d);
    d.hidden = H, d.router.hidden = H, d.router.num_experts = E, d.router.top_k = K;
    d.experts = md.d;
    d.shared_inter = Is, d.max_tokens = M;
    k3_latent_moe_weights hw, dw;
    memset(&hw, 0, sizeof hw);
    hw.gate = gate, hw.bias = bias, hw.down_proj = down, hw.experts = md.hw, hw.norm = norm, hw.up_proj = up;
    hw.shared_gate_up = sgu, hw.shared_down = sdn;
    dw = hw;
    dw.gate = k3t_dup(gate, (size_t)E * (size_t)H * 2);
    dw.bias = (const float *)k3t_dup(bias, (size_t)E * 4);
    dw.down_proj = k3t_dup(down, (size_t)(L * H) * 2);
    dw.experts = md.dw;
    dw.norm = k3t_dup(norm, (size_t)L * 2);
    dw.up_proj = k3t_dup(up, (size_t)(H * L) * 2);
    dw.shared_gate_up = k3t_dup(sgu, (size_t)(2 * Is * H) * 2);
    dw.shared_down = k3t_dup(sdn, (size_t)(H * Is) * 2);
    k3_latent_moe_plan *pc = NULL, *pg = NULL;
    const k3_status sc = k3_latent_moe_plan_create(g_cpu, &d, &pc);
    const k3_status sg = k3_latent_moe_plan_create(g_gpu, &d, &pg);
    CHECK(sc == K3_STATUS_SUCCESS, "latent cpu plan: %s", k3_ctx_last_error(g_cpu));
    CHECK(sg == K3_STATUS_SUCCESS, "latent gpu plan: %s", k3_ctx_last_error(g_gpu));
    if (sg == K3_STATUS_SUCCESS) { /* AUTO runs the architecture's data at every m (shared experts present) */
        k3_arch_info a;
        k3_ctx_arch(g_gpu, &a);
        k3_latent_tuning t;
        k3_latent_tuning_for_table(a.table, &t);
        int bad_m = 0;
        for (int32_t m = 1; m <= M; m++) {
            k3_latent_schedule got = K3_LATENT_SCHEDULE_AUTO;
            if (k3_latent_moe_plan_schedule_at(pg, m, &got) != K3_STATUS_SUCCESS || got != t.schedule[m]) bad_m = m;
        }
        CHECK(bad_m == 0, "latent AUTO plan: the schedule at m %d is not the %s data's", (int)bad_m,
              k3_table_name(a.table));
    }
    double rel = INFINITY, rel_graph = -1.0, us = 0.0;
    int ids_eq = 0, w_eq = 0, bitwise = 0, graph_ok = -1;
    const int64_t nk = (int64_t)M * K, nh = (int64_t)M * H;
    k3t_dout dy, dids, dwt;
    memset(&dy, 0, sizeof dy), memset(&dids, 0, sizeof dids), memset(&dwt, 0, sizeof dwt);
    if (sc == K3_STATUS_SUCCESS && sg == K3_STATUS_SUCCESS && made && k3t_dout_alloc(&dy, "latent y", K3T_BF16, nh) &&
        k3t_dout_alloc(&dids, "latent topk ids", K3T_I32, nk) &&
        k3t_dout_alloc(&dwt, "latent topk weights", K3T_F32, nk)) {
        size_t wsc = 0, wsg = 0;
        k3_latent_moe_workspace_size(pc, &wsc);
        k3_latent_moe_workspace_size(pg, &wsg);
        void *hws = malloc(wsc);
        uint16_t *yc = (uint16_t *)malloc((size_t)nh * 2), *yg = (uint16_t *)malloc((size_t)nh * 2);
        int32_t *idc = (int32_t *)malloc((size_t)nk * 4), *idg = (int32_t *)malloc((size_t)nk * 4);
        float *wc = (float *)malloc((size_t)nk * 4), *wg = (float *)malloc((size_t)nk * 4);
        CHECK(k3_latent_moe_run(pc, M, x, &hw, use_res ? res : NULL, yc, idc, wc, hws, wsc, NULL) == K3_STATUS_SUCCESS,
              "latent cpu run: %s", k3_ctx_last_error(g_cpu));
        void *dx = k3t_dup(x, (size_t)nh * 2), *dres = k3t_dup(res, (size_t)nh * 2);
        uint16_t *py = (uint16_t *)k3t_dout_ptr(&dy);
        int32_t *pid = (int32_t *)k3t_dout_ptr(&dids);
        float *pw = (float *)k3t_dout_ptr(&dwt);
        void *dws = k3t_dalloc(wsg);
        cudaMemsetAsync(dws, 0xff, wsg, g_stream);
        k3t_dout_poison(&dy, g_stream), k3t_dout_poison(&dids, g_stream), k3t_dout_poison(&dwt, g_stream);
        k3_status st = k3_latent_moe_run(pg, M, dx, &dw, use_res ? dres : NULL, py, pid, pw, dws, wsg, g_stream);
        CHECK(st == K3_STATUS_SUCCESS, "latent gpu run: %s", k3_ctx_last_error(g_gpu));
        if (k3t_cuda_ok(cudaStreamSynchronize(g_stream), "latent sync")) {
            k3t_dout_check(&dy, g_stream, k3t_flat(nh), 0, NULL);
            k3t_dout_check(&dids, g_stream, k3t_flat(nk), 0, NULL);
            k3t_dout_check(&dwt, g_stream, k3t_flat(nk), 0, NULL);
            memcpy(yg, k3t_dout_host(&dy), (size_t)nh * 2);
            memcpy(idg, k3t_dout_host(&dids), (size_t)nk * 4);
            memcpy(wg, k3t_dout_host(&dwt), (size_t)nk * 4);
            const k3t_verdict vi = k3t_compare("latent routing ids vs cpu", k3t_view1(idg, K3T_I32, nk),
                                               k3t_view1(idc, K3T_I32, nk), k3t_budget_of(K3T_OP_ROUTER));
            const k3t_verdict vw = k3t_compare("latent routing weights vs cpu", k3t_view1(wg, K3T_F32, nk),
                                               k3t_view1(wc, K3T_F32, nk), k3t_budget_of(K3T_OP_ROUTER));
            ids_eq = k3t_expect(&vi);
            w_eq = k3t_expect(&vw);
            rel = k3t_check_close("latent y vs cpu", k3t_view1(yg, K3T_BF16, nh), k3t_view1(yc, K3T_BF16, nh),
                                  c->budget)
                      .metric;
            /* second run, on poisoned outputs: bitwise the same */
            k3t_dout_poison(&dy, g_stream), k3t_dout_poison(&dids, g_stream), k3t_dout_poison(&dwt, g_stream);
            k3_latent_moe_run(pg, M, dx, &dw, use_res ? dres : NULL, py, pid, pw, dws, wsg, g_stream);
            cudaStreamSynchronize(g_stream);
            k3t_dout_check(&dy, g_stream, k3t_flat(nh), 0, NULL);
            k3t_dout_check(&dids, g_stream, k3t_flat(nk), 0, NULL);
            k3t_dout_check(&dwt, g_stream, k3t_flat(nk), 0, NULL);
            bitwise = k3t_check_same("latent second run vs the first: y", k3t_dout_host(&dy), yg, K3T_BF16, nh);
            k3t_check_same("latent second run vs the first: ids", k3t_dout_host(&dids), idg, K3T_I32, nk);
            k3t_check_same("latent second run vs the first: weights", k3t_dout_host(&dwt), wg, K3T_F32, nk);
            { /* the norm weights at an address that is not 16-byte aligned: the RMSNorm reads them element by
                 element, in the same summation order, so y keeps its bits */
                uint8_t *odd = (uint8_t *)k3t_dalloc((size_t)L * 2 + 16);
                k3_latent_moe_weights dw_odd = dw;
                if (odd && k3t_to_device(odd + 2, norm, (size_t)L * 2)) {
                    dw_odd.norm = odd + 2;
                    k3t_dout_poison(&dy, g_stream);
                    CHECK(k3_latent_moe_run(pg, M, dx, &dw_odd, use_res ? dres : NULL, py, pid, pw, dws, wsg,
                                            g_stream) == K3_STATUS_SUCCESS,
                          "latent gpu run, unaligned norm: %s", k3_ctx_last_error(g_gpu));
                    cudaStreamSynchronize(g_stream);
                    k3t_dout_check(&dy, g_stream, k3t_flat(nh), 0, NULL);
                    k3t_check_same("latent run with unaligned norm weights vs aligned: y", k3t_dout_host(&dy), yg,
                                   K3T_BF16, nh);
                }
                cudaFree(odd);
            }
            latent_schedules(&d, M, dx, &dw, use_res ? dres : NULL, yg, idg, wg, &dy, &dids, &dwt);
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            cudaEventRecord(e0, g_stream);
            for (int it = 0; it < 10; it++)
                k3_latent_moe_run(pg, M, dx, &dw, use_res ? dres : NULL, py, NULL, NULL, dws, wsg, g_stream);
            cudaEventRecord(e1, g_stream);
            if (k3t_cuda_ok(cudaEventSynchronize(e1), "latent timing")) {
                float ms = 0.0f;
                cudaEventElapsedTime(&ms, e0, e1);
                us = 100.0 * ms;
            }
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
        }
        if (graph) { /* the whole block (router, fork/join, linear plans) captured; replayed on a new x */
            cudaGraph_t gr = NULL;
            cudaGraphExec_t ex = NULL;
            graph_ok = 0;
            if (k3t_cuda_ok(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal), "latent capture")) {
                const k3_status cst =
                    k3_latent_moe_run(pg, M, dx, &dw, use_res ? dres : NULL, py, pid, pw, dws, wsg, g_stream);
                const cudaError_t ce = cudaStreamEndCapture(g_stream, &gr);
                CHECK(cst == K3_STATUS_SUCCESS && ce == cudaSuccess, "latent capture: %s / %s",
                      k3_ctx_last_error(g_gpu), cudaGetErrorString(ce));
                if (cst == K3_STATUS_SUCCESS && ce == cudaSuccess &&
                    k3t_cuda_ok(cudaGraphInstantiate(&ex, gr, 0), "latent instantiate")) {
                    for (int64_t i = 0; i < nh; i++) x[i] = k3t_rand_bf16(&rng, 1.0f);
                    cudaMemcpyAsync(dx, x, (size_t)nh * 2, cudaMemcpyHostToDevice, g_stream);
                    k3t_dout_poison(&dy, g_stream), k3t_dout_poison(&dids, g_stream), k3t_dout_poison(&dwt, g_stream);
                    if (k3t_cuda_ok(cudaGraphLaunch(ex, g_stream), "latent graph launch") &&
                        k3t_cuda_ok(cudaStreamSynchronize(g_stream), "latent graph sync")) {
                        k3t_dout_check(&dy, g_stream, k3t_flat(nh), 0, NULL);
                        k3t_dout_check(&dids, g_stream, k3t_flat(nk), 0, NULL);
                        k3t_dout_check(&dwt, g_stream, k3t_flat(nk), 0, NULL);
                        k3_latent_moe_run(pc, M, x, &hw, use_res ? res : NULL, yc, idc, wc, hws, wsc, NULL);
                        rel_graph = k3t_check_close("latent graph replay on a new x: y vs cpu",
                                                    k3t_view1(k3t_dout_host(&dy), K3T_BF16, nh),
                                                    k3t_view1(yc, K3T_BF16, nh), c->budget)
                                        .metric;
                        const k3t_verdict vg =
                            k3t_compare("latent graph replay on a new x: ids vs cpu",
                                        k3t_view1(k3t_dout_host(&dids), K3T_I32, nk), k3t_view1(idc, K3T_I32, nk),
                                        k3t_budget_of(K3T_OP_ROUTER));
                        graph_ok = k3t_expect(&vg) && rel_graph <= tol;
                    }
                }
            }
            if (ex) cudaGraphExecDestroy(ex);
            if (gr) cudaGraphDestroy(gr);
            cudaGetLastError();
        }
        cudaFree(dx), cudaFree(dres), cudaFree(dws);
        free(hws), free(yc), free(yg), free(idc), free(idg), free(wc), free(wg);
    }
    const int pass = rel <= tol && ids_eq && w_eq && bitwise && graph_ok != 0 && k3t_failed == f0;
    printf("%s latent H=%lld L=%lld E=%d k=%d I=%lld Is=%lld M=%d residual=%d: routing ids %s, weights %s, y rel-L2 "
           "%.3e (tol %.0e), two runs %s, gpu %.1f us/call",
           pass ? "PASS" : "FAIL", (long long)H, (long long)L, E, K, (long long)I, (long long)Is, M, use_res,
           ids_eq ? "equal" : "DIFFER", w_eq ? "bitwise equal" : "DIFFER", rel, tol,
           bitwise ? "bitwise equal" : "DIFFER", us);
    if (graph) printf(", graph replay on new x %s (rel-L2 %.3e)", graph_ok > 0 ? "ok" : "FAILED", rel_graph);
    printf(", seed 0x%llx\n", (unsigned long long)seed);
    fflush(stdout);
    CHECK(pass, "latent case M=%d", M);
    k3_latent_moe_plan_destroy(pc);
    k3_latent_moe_plan_destroy(pg);
    k3t_dout_free(&dy), k3t_dout_free(&dids), k3t_dout_free(&dwt);
    cudaFree((void *)dw.gate), cudaFree((void *)dw.bias), cudaFree((void *)dw.down_proj), cudaFree((void *)dw.norm);
    cudaFree((void *)dw.up_proj), cudaFree((void *)dw.shared_gate_up), cudaFree((void *)dw.shared_down);
    moe_data_free(&md);
    free(x), free(res), free(gate), free(bias), free(down), free(norm), free(up), free(sgu), free(sdn);
}

/* ======================================================================= validation =================== */

static void validation_checks(void) {
    k3t_case_enter("validation", 0);
    k3_moe_desc d;
    k3_moe_desc_init(&d);
    d.hidden = 48; /* a multiple of 16 (valid NVFP4) but not of 32: the CUDA kernels refuse it at plan time */
    d.inter = 64;
    k3_moe_plan *p = NULL;
    const k3_status st = k3_moe_plan_create(g_gpu, &d, &p);
    CHECK(st == K3_STATUS_UNSUPPORTED && p == NULL, "L = 48 on CUDA: %s", k3_status_string(st));
    printf("%s validation: L = 48 refused on CUDA with \"%s\"\n", st == K3_STATUS_UNSUPPORTED ? "PASS" : "FAIL",
           k3_ctx_last_error(g_gpu));
    k3_moe_plan_destroy(p);

    /* host memory given to a CUDA run is refused before any launch (host buffers are an easy mistake for a
     * caller, and a kernel reading them would fault) */
    k3_moe_desc_init(&d);
    d.num_experts = 8, d.top_k = 2, d.hidden = 128, d.inter = 64, d.max_tokens = 4;
    p = NULL;
    k3_status st2 = k3_moe_plan_create(g_gpu, &d, &p);
    size_t wsb = 0;
    if (st2 == K3_STATUS_SUCCESS) k3_moe_workspace_size(p, &wsb);
    void *dws = st2 == K3_STATUS_SUCCESS ? k3t_dalloc(wsb) : NULL;
    uint8_t *h = (uint8_t *)calloc(1, 1 << 20);
    k3_moe_weights hw;
    memset(&hw, 0, sizeof hw);
    hw.w13 = hw.w2 = hw.w13_scale = hw.w2_scale = h;
    hw.w13_scale_2 = hw.w2_scale_2 = (const float *)(void *)h;
    if (st2 == K3_STATUS_SUCCESS && dws && h)
        st2 = k3_moe_run(p, 1, h, (const int32_t *)(void *)h, (const float *)(void *)h, &hw, h, NULL, dws, wsb, g_stream);
    const int refused = st2 == K3_STATUS_INVALID_ARGUMENT && strstr(k3_ctx_last_error(g_gpu), "host memory") != NULL;
    CHECK(refused, "host pointers on CUDA: %s: %s", k3_status_string(st2), k3_ctx_last_error(g_gpu));
    printf("%s validation: host pointers refused on CUDA with \"%s\"\n", refused ? "PASS" : "FAIL",
           k3_ctx_last_error(g_gpu));
    k3t_cuda_ok(cudaStreamSynchronize(g_stream), "sync after the refused run");
    k3_moe_plan_destroy(p);
    cudaFree(dws);
    free(h);
}

/* shape = {experts, top_k, hidden}; m tokens; seed offsets 100 + i */

void gpu_moe_latent_group(int quick) {
    for (size_t i = 0; i < sizeof k_latent_cases / sizeof k_latent_cases[0]; i++)
        if (!quick || !(k_latent_cases[i].options & LAT_SLOW)) latent_case(&k_latent_cases[i]);
    validation_checks();
}
#endif
