/* gpu_moe, group 0: the GPU router against the CPU router, bitwise (ids and weights). */
#ifdef K3_HAVE_CUDA
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_moe/gpu_moe.h"

typedef struct rcase {
    k3t_case c; /* shape = {experts, top_k, hidden}; m tokens */
    k3_router_kind kind;
    k3_dtype gdt;
    int32_t renorm, use_bias, ties, nan_row;
    float scaling;
} rcase;

static void router_case(const rcase *c) {
    const uint64_t seed = k3t_case_begin(&c->c);
    const int f0 = k3t_failed;
    k3t_rng rng = {seed};
    const int64_t H = c->c.shape[2];
    const int32_t E = (int32_t)c->c.shape[0], k = (int32_t)c->c.shape[1], m = (int32_t)c->c.m;
    const size_t gsz = c->gdt == K3_DTYPE_F32 ? 4 : 2;
    uint16_t *x = (uint16_t *)malloc((size_t)(m * H) * 2);
    uint8_t *gate = (uint8_t *)malloc((size_t)E * (size_t)H * gsz);
    float *bias = (float *)malloc((size_t)E * 4);
    int32_t *ids_c = (int32_t *)malloc((size_t)(m * k) * 4);
    float *w_c = (float *)malloc((size_t)(m * k) * 4);
    for (int64_t i = 0; i < m * H; i++) x[i] = k3t_rand_bf16(&rng, 1.0f);
    for (int64_t i = 0; i < (int64_t)E * H; i++) {
        const float v = 0.05f * k3t_uniform(&rng);
        if (c->gdt == K3_DTYPE_F32) memcpy(gate + i * 4, &v, 4);
        else {
            const uint16_t b = k3t_bf16_bits(v);
            memcpy(gate + i * 2, &b, 2);
        }
    }
    /* ties 1: expert 2j + 1 gets expert 2j's row (equal logits, the lower id must win); ties 2: every expert gets
     * expert 0's row (every key equal) */
    for (int32_t e = 1; c->ties && e < E; e++)
        if (c->ties == 2 || e % 2 == 1)
            memcpy(gate + (size_t)e * H * gsz, gate + (size_t)(c->ties == 2 ? 0 : e - 1) * H * gsz, (size_t)H * gsz);
    if (c->nan_row >= 0) { /* one NaN element: that expert's logit is NaN for every token */
        const float nanv = NAN;
        if (c->gdt == K3_DTYPE_F32) memcpy(gate + ((size_t)c->nan_row * H + 3) * 4, &nanv, 4);
        else {
            const uint16_t b = 0x7fc0u;
            memcpy(gate + ((size_t)c->nan_row * H + 3) * 2, &b, 2);
        }
    }
    for (int32_t e = 0; e < E; e++) bias[e] = c->ties ? 0.0f : 0.02f * k3t_uniform(&rng);

    k3_router_desc d;
    k3_router_desc_init(&d);
    d.kind = c->kind, d.num_experts = E, d.top_k = k, d.hidden = H, d.gate_dtype = c->gdt;
    d.renormalize = c->renorm, d.scaling_factor = c->scaling, d.max_tokens = m;
    k3_router_plan *pc = NULL, *pg = NULL;
    const int ok_c = k3_router_plan_create(g_cpu, &d, &pc) == K3_STATUS_SUCCESS;
    const k3_status sg = k3_router_plan_create(g_gpu, &d, &pg);
    CHECK(ok_c && sg == K3_STATUS_SUCCESS, "router plans: %s", k3_ctx_last_error(g_gpu));
    const float *bias_use = (c->use_bias && c->kind == K3_ROUTER_SIGMOID_NOAUX_TC) ? bias : NULL;
    int64_t id_mis = -1, w_mis = -1;
    int compared = 0;
    double us = 0.0;
    k3t_dout dids, dw;
    memset(&dids, 0, sizeof dids), memset(&dw, 0, sizeof dw);
    if (ok_c && sg == K3_STATUS_SUCCESS && k3t_dout_alloc(&dids, "router ids", K3T_I32, (int64_t)m * k) &&
        k3t_dout_alloc(&dw, "router weights", K3T_F32, (int64_t)m * k)) {
        size_t wsc = 0, wsg = 0;
        k3_router_workspace_size(pc, &wsc);
        k3_router_workspace_size(pg, &wsg);
        void *cws = malloc(wsc);
        CHECK(k3_router_run(pc, m, x, gate, bias_use, ids_c, w_c, cws, wsc, NULL) == K3_STATUS_SUCCESS, "cpu router");
        free(cws);
        void *dx = k3t_dup(x, (size_t)(m * H) * 2), *dg = k3t_dup(gate, (size_t)E * (size_t)H * gsz);
        float *db = (float *)k3t_dup(bias, (size_t)E * 4);
        void *dws = k3t_dalloc(wsg);
        int32_t *pid = (int32_t *)k3t_dout_ptr(&dids);
        float *pw = (float *)k3t_dout_ptr(&dw);
        k3t_dout_poison(&dids, g_stream);
        k3t_dout_poison(&dw, g_stream);
        const k3_status st = k3_router_run(pg, m, dx, dg, bias_use ? db : NULL, pid, pw, dws, wsg, g_stream);
        CHECK(st == K3_STATUS_SUCCESS, "gpu router run: %s", k3_ctx_last_error(g_gpu));
        k3t_cuda_ok(cudaStreamSynchronize(g_stream), "router sync");
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        cudaEventRecord(e0, g_stream);
        for (int it = 0; it < 10; it++) k3_router_run(pg, m, dx, dg, bias_use ? db : NULL, pid, pw, dws, wsg, g_stream);
        cudaEventRecord(e1, g_stream);
        k3t_cuda_ok(cudaEventSynchronize(e1), "router timing");
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, e0, e1);
        us = 1000.0 * ms / 10.0;
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        if (k3t_dout_check(&dids, g_stream, k3t_flat((int64_t)m * k), 0, NULL) &
            k3t_dout_check(&dw, g_stream, k3t_flat((int64_t)m * k), 0, NULL)) {
            const k3t_verdict vi = k3t_compare("router ids vs cpu", k3t_view1(k3t_dout_host(&dids), K3T_I32, m * k),
                                               k3t_view1(ids_c, K3T_I32, m * k), k3t_budget_of(c->c.budget));
            const k3t_verdict vw = k3t_compare("router weights vs cpu", k3t_view1(k3t_dout_host(&dw), K3T_F32, m * k),
                                               k3t_view1(w_c, K3T_F32, m * k), k3t_budget_of(c->c.budget));
            k3t_expect(&vi);
            k3t_expect(&vw);
            id_mis = vi.index, w_mis = vw.index, compared = 1;
        }
        cudaFree(dx), cudaFree(dg), cudaFree(db), cudaFree(dws);
    }
    const int pass = ok_c && sg == K3_STATUS_SUCCESS && compared && id_mis < 0 && w_mis < 0 && k3t_failed == f0;
    printf("%s router %s gate=%s E=%d k=%d m=%d H=%lld renorm=%d bias=%d ties=%d nan_row=%d: ids %s, weights %s "
           "(%.1f us/call), seed 0x%llx\n",
           pass ? "PASS" : "FAIL", c->kind == K3_ROUTER_SOFTMAX ? "softmax" : "sigmoid",
           c->gdt == K3_DTYPE_F32 ? "f32" : "bf16", E, k, m, (long long)H, c->renorm, c->use_bias, c->ties,
           c->nan_row, id_mis < 0 ? "equal" : "DIFFER", w_mis < 0 ? "bitwise equal" : "DIFFER", us,
           (unsigned long long)seed);
    if (id_mis >= 0)
        printf("    first id mismatch at [%d][%d]: cpu %d gpu %d\n", (int)(id_mis / k), (int)(id_mis % k),
               ids_c[id_mis], ((const int32_t *)k3t_dout_host(&dids))[id_mis]);
    if (w_mis >= 0)
        printf("    first weight mismatch at [%d][%d]: cpu %.9g gpu %.9g\n", (int)(w_mis / k), (int)(w_mis % k),
               (double)w_c[w_mis], (double)((const float *)k3t_dout_host(&dw))[w_mis]);
    CHECK(pass, "router case E=%d k=%d m=%d", E, k, m);
    k3_router_plan_destroy(pc);
    k3_router_plan_destroy(pg);
    k3t_dout_free(&dids), k3t_dout_free(&dw);
    free(x), free(gate), free(bias), free(ids_c), free(w_c);
}

static const rcase k_router_cases[] = {
    {{"sigmoid", {896, 16, 7168}, 1, 0, 100, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 0, -1, 1.0f},
    {{"sigmoid", {896, 16, 7168}, 16, 0, 101, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 0, 5, 2.5f},
    {{"sigmoid", {896, 16, 7168}, 3, 0, 102, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_F32, 1, 0, 0, -1, 1.0f},
    {{"sigmoid", {56, 8, 1000}, 64, 0, 103, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 0, 1, -1, 1.0f},
    {{"sigmoid", {56, 8, 1000}, 8, 0, 104, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 0, 1, 0, 7, 1.5f},
    {{"sigmoid", {20, 20, 333}, 5, 0, 105, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_F32, 1, 1, 0, 0, 1.0f},
    {{"softmax", {56, 8, 7168}, 16, 0, 106, K3T_OP_ROUTER}, K3_ROUTER_SOFTMAX, K3_DTYPE_BF16, 1, 0, 0, -1, 1.0f},
    {{"softmax", {128, 4, 4096}, 4, 0, 107, K3T_OP_ROUTER}, K3_ROUTER_SOFTMAX, K3_DTYPE_F32, 0, 0, 1, 9, 1.0f},
    {{"softmax", {8, 2, 256}, 512, 0, 108, K3T_OP_ROUTER}, K3_ROUTER_SOFTMAX, K3_DTYPE_BF16, 1, 0, 0, -1, 1.0f},
    /* E not a multiple of the logits blocks' experts; h 1000 = 125 pieces: threads 125..127 hold no piece */
    {{"sigmoid", {900, 16, 1000}, 2, 0, 109, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_F32, 1, 1, 0, 11, 1.0f},
    {{"sigmoid", {900, 16, 1000}, 6, 0, 110, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 1, -1, 2.5f},
    /* the logits kernels' blockings by m (the staged kernel's 2 x 4, 2 x 8 and 4 x 8 experts per group x tokens), a
     * gate of 2 pieces per thread */
    {{"sigmoid", {896, 16, 7168}, 4, 0, 114, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 0, -1, 1.0f},
    {{"sigmoid", {896, 16, 7168}, 8, 0, 115, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 0, 2, 1.0f},
    {{"sigmoid", {896, 16, 7168}, 33, 0, 116, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 0, -1, 2.5f},
    {{"sigmoid", {64, 8, 2048}, 5, 0, 117, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_F32, 0, 1, 1, -1, 1.0f},
    /* the staged logits kernel with 8 rows of x at h 10240 (160 KB of shared memory: fits a block on SM90 and
     * later), and at h 16384 (256 KB: does not fit, the one-group kernel runs) */
    {{"sigmoid", {40, 8, 10240}, 12, 0, 121, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 0, -1, 1.0f},
    {{"sigmoid", {64, 8, 16384}, 9, 0, 122, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 0, 3, 1.0f},
    /* the bulk logits kernel (m 1, BF16): a last block of fewer experts and threads that hold no piece (E 900,
     * h 1000); past its 16 experts per block (E 2400: the one-group kernel) and past its shared memory (h 65536) */
    {{"sigmoid", {900, 16, 1000}, 1, 0, 123, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 0, 1, 1.0f},
    {{"sigmoid", {2400, 8, 512}, 1, 0, 124, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 0, -1, 1.0f},
    {{"sigmoid", {64, 8, 65536}, 1, 0, 125, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 0, -1, 1.0f},
    /* E 1024 (now the threshold selection, 32 full warps); the merging selection's sizes: its most lists (E 480, k 16:
     * 15 warps of keys, fewer than k), one list (32); k 16 against 17 (the other selection) */
    {{"sigmoid", {480, 16, 512}, 3, 0, 130, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 1, 479, 1.0f},
    {{"sigmoid", {1024, 16, 512}, 3, 0, 118, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 1, 7, 1.0f},
    {{"sigmoid", {32, 16, 520}, 7, 0, 119, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 0, 31, 1.0f},
    {{"sigmoid", {300, 17, 512}, 2, 0, 120, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 1, -1, 1.0f},
    /* the threshold selection's candidate ranking: by one warp (ties 1 at E 896: ~40 candidates) and by as many
     * threads as candidates (ties 2: every key equal, 481 candidates); its largest top_k (32 over 32 warps) and its
     * least warps (k 8 over 8: E 225) */
    {{"sigmoid", {896, 16, 7168}, 5, 0, 126, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 0, 1, -1, 1.0f},
    {{"sigmoid", {896, 16, 2048}, 3, 0, 127, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 0, 2, -1, 1.0f},
    {{"sigmoid", {1024, 32, 512}, 4, 0, 128, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_F32, 1, 1, 0, 9, 2.5f},
    {{"sigmoid", {225, 8, 512}, 4, 0, 129, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 0, 1, 0, 224, 1.0f},
    /* the selection's method boundaries (src/cuda/router/select.cu): sigmoid keys over <= 1024 experts with top_k
     * <= 32 over at least top_k warps of keys take the threshold, with top_k <= 16 otherwise merge (E 56, k 8: two
     * warps); softmax over 257..1024 sorts by warps of 128; otherwise (1025 experts) the arg-max rounds */
    {{"sigmoid", {257, 8, 256}, 2, 0, 111, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_F32, 1, 1, 1, 3, 1.0f},
    {{"softmax", {1024, 8, 512}, 3, 0, 112, K3T_OP_ROUTER}, K3_ROUTER_SOFTMAX, K3_DTYPE_BF16, 1, 0, 1, 100, 1.0f},
    {{"sigmoid", {1025, 4, 256}, 2, 0, 113, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 0, 1, 0, -1, 1.0f},
};

/* name: the tag; shape = {E, top_k, L, I}; m = M; options = the routing (ROUTE_*); seed offsets 300 + i; the
 * budget by mode */

void gpu_moe_router_group(void) {
    for (size_t i = 0; i < sizeof k_router_cases / sizeof k_router_cases[0]; i++) router_case(&k_router_cases[i]);
}
#endif
