/* gpu_moe, group 1: the dispatch kernel against a host evaluation of the same grouping, exactly. */
#ifdef K3_HAVE_CUDA
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/moe/moe.h" /* internals: the dispatch kernel tested on its own */
#include "gpu_moe/gpu_moe.h"

/* shape = {top_k, E, tokens per unit (the GEMMs' tokens per pass: 8 or 16; other values exercise the cut)};
 * m tokens; options: 1 = skewed ids (three experts take every pair); seed offsets 200 + i */
static const k3t_case k_dispatch_cases[] = {
    {"dispatch", {16, 896, 8}, 1, 0, 200, K3T_OP_DISPATCH},
    {"dispatch", {16, 896, 8}, 16, 0, 201, K3T_OP_DISPATCH},
    {"dispatch", {8, 56, 1}, 3, 0, 202, K3T_OP_DISPATCH},
    {"dispatch", {8, 56, 16}, 512, 1, 203, K3T_OP_DISPATCH},
    {"dispatch", {16, 896, 16}, 4096, 0, 204, K3T_OP_DISPATCH},
    {"dispatch", {1, 8, 5}, 4096, 1, 205, K3T_OP_DISPATCH},
    {"dispatch", {8, 9000, 8}, 16, 0, 206, K3T_OP_DISPATCH}, /* past 8192 experts: the counters in cur [E] */
};

static void dispatch_case(const k3t_case *c) {
    const uint64_t seed = k3t_case_begin(c);
    const int f0 = k3t_failed;
    k3t_rng rng = {seed};
    const int32_t m = (int32_t)c->m, k = (int32_t)c->shape[0], E = (int32_t)c->shape[1], tpu = (int32_t)c->shape[2];
    const int skew = (int)(c->options & 1);
    const int32_t np = m * k, nu = (np < E ? np : E) + np / tpu; /* the units' bound (k3_cuda_moe_dispatch) */
    int32_t *ids = (int32_t *)malloc((size_t)np * 4), *list = (int32_t *)malloc((size_t)np * 4);
    int32_t *offs = (int32_t *)malloc((size_t)(E + 1) * 4), *act = (int32_t *)malloc((size_t)nu * 4);
    int32_t *cur = (int32_t *)malloc((size_t)E * 4), *aoff = (int32_t *)malloc((size_t)(nu + 1) * 4);
    float *wts = (float *)malloc((size_t)np * 4), *wsort = (float *)malloc((size_t)np * 4);
    for (int32_t i = 0; i < np; i++)
        ids[i] = skew ? (int32_t)(k3t_next(&rng) % 3u) * (E / 3) : (int32_t)(k3t_next(&rng) % (uint64_t)E);
    /* weights almost surely distinct, so a gather from the wrong pair shows */
    for (int32_t i = 0; i < np; i++) wts[i] = (float)(k3t_next(&rng) % 1000003u) * 1e-6f + 1e-3f;
    /* host counting sort: the expected grouping */
    memset(offs, 0, (size_t)(E + 1) * 4);
    for (int32_t i = 0; i < np; i++) offs[ids[i] + 1]++;
    for (int32_t e = 0; e < E; e++) offs[e + 1] += offs[e];
    int32_t nact = 0;
    for (int32_t e = 0; e < E; e++) /* units: each expert's pairs in runs of at most tpu */
        for (int32_t p = offs[e]; p < offs[e + 1]; p += tpu) aoff[nact] = p, act[nact++] = e;
    aoff[nact] = offs[E];
    memcpy(cur, offs, (size_t)E * 4);
    for (int32_t i = 0; i < np; i++) list[cur[ids[i]]++] = i;
    for (int32_t p = 0; p < np; p++) wsort[p] = wts[list[p]]; /* the routing weight of each grouped pair */

    /* outputs: the units past n_active are never written (they stay poison) */
    k3t_dout d_offs, d_act, d_n, d_list, d_aoff, d_wsort;
    int32_t *dids = (int32_t *)k3t_dup(ids, (size_t)np * 4), *d_cur = (int32_t *)k3t_dalloc((size_t)E * 4);
    float *d_wts = (float *)k3t_dup(wts, (size_t)np * 4);
    const int made = k3t_dout_alloc(&d_offs, "dispatch offs", K3T_I32, E + 1) &&
                     k3t_dout_alloc(&d_act, "dispatch active", K3T_I32, nu) &&
                     k3t_dout_alloc(&d_n, "dispatch n_active", K3T_I32, 1) &&
                     k3t_dout_alloc(&d_list, "dispatch list", K3T_I32, np) &&
                     k3t_dout_alloc(&d_aoff, "dispatch act_off", K3T_I32, nu + 1) &&
                     k3t_dout_alloc(&d_wsort, "dispatch wsort", K3T_F32, np);
    k3_status st = K3_STATUS_INTERNAL_ERROR;
    double dt = 0.0;
    int32_t g_n = -1;
    int ok_offs = 0, ok_act = 0, ok_list = 0, ok_wsort = 0;
    if (made) {
        k3t_dout_poison(&d_offs, g_stream), k3t_dout_poison(&d_act, g_stream), k3t_dout_poison(&d_n, g_stream);
        k3t_dout_poison(&d_list, g_stream), k3t_dout_poison(&d_aoff, g_stream), k3t_dout_poison(&d_wsort, g_stream);
        k3t_cuda_ok(cudaStreamSynchronize(g_stream), "poison sync");
        const double t0 = now_s();
        st = k3_cuda_moe_dispatch(g_gpu, dids, np, E, tpu, (int32_t *)k3t_dout_ptr(&d_offs), d_cur,
                                  (int32_t *)k3t_dout_ptr(&d_act), (int32_t *)k3t_dout_ptr(&d_aoff),
                                  (int32_t *)k3t_dout_ptr(&d_n), (int32_t *)k3t_dout_ptr(&d_list), d_wts,
                                  (float *)k3t_dout_ptr(&d_wsort), g_stream);
        k3t_cuda_ok(cudaStreamSynchronize(g_stream), "dispatch sync");
        dt = now_s() - t0;
        CHECK(st == K3_STATUS_SUCCESS, "dispatch: %s", k3_ctx_last_error(g_gpu));
        k3t_dout_check(&d_offs, g_stream, k3t_flat(E + 1), 0, NULL);
        k3t_dout_check(&d_n, g_stream, k3t_flat(1), 0, NULL);
        k3t_dout_check(&d_act, g_stream, k3t_flat(nact), 0, NULL);
        k3t_dout_check(&d_aoff, g_stream, k3t_flat(nact + 1), 0, NULL);
        k3t_dout_check(&d_list, g_stream, k3t_flat(np), 0, NULL);
        k3t_dout_check(&d_wsort, g_stream, k3t_flat(np), 0, NULL);
        g_n = *(const int32_t *)k3t_dout_host(&d_n);
        CHECK(g_n == nact, "dispatch: %d units, expected %d", (int)g_n, (int)nact);
        const k3t_budget *b = k3t_budget_of(c->budget);
        const k3t_verdict vo = k3t_compare("dispatch offs", k3t_view1(k3t_dout_host(&d_offs), K3T_I32, E + 1),
                                           k3t_view1(offs, K3T_I32, E + 1), b);
        const k3t_verdict va = k3t_compare("dispatch active", k3t_view1(k3t_dout_host(&d_act), K3T_I32, nact),
                                           k3t_view1(act, K3T_I32, nact), b);
        const k3t_verdict vf = k3t_compare("dispatch act_off", k3t_view1(k3t_dout_host(&d_aoff), K3T_I32, nact + 1),
                                           k3t_view1(aoff, K3T_I32, nact + 1), b);
        const k3t_verdict vl = k3t_compare("dispatch list", k3t_view1(k3t_dout_host(&d_list), K3T_I32, np),
                                           k3t_view1(list, K3T_I32, np), b);
        const k3t_verdict vw = k3t_compare("dispatch wsort", k3t_view1(k3t_dout_host(&d_wsort), K3T_F32, np),
                                           k3t_view1(wsort, K3T_F32, np), b);
        ok_offs = k3t_expect(&vo);
        const int ok_units = k3t_expect(&va), ok_unit_offs = k3t_expect(&vf);
        ok_act = g_n == nact && ok_units && ok_unit_offs;
        ok_list = k3t_expect(&vl);
        ok_wsort = k3t_expect(&vw);
    }
    const int pass = st == K3_STATUS_SUCCESS && ok_offs && ok_act && ok_list && ok_wsort && k3t_failed == f0;
    printf("%s dispatch m=%d k=%d E=%d skew=%d tpu=%d: offsets %s, units %s (%d vs %d), list %s, weights %s (%.1f us "
           "incl. sync), seed 0x%llx\n",
           pass ? "PASS" : "FAIL", m, k, E, skew, tpu, ok_offs ? "equal" : "DIFFER", ok_act ? "equal" : "DIFFER", g_n,
           nact, ok_list ? "equal" : "DIFFER", ok_wsort ? "equal" : "DIFFER", dt * 1e6, (unsigned long long)seed);
    CHECK(pass, "dispatch m=%d k=%d E=%d", m, k, E);
    cudaFree(dids), cudaFree(d_cur), cudaFree(d_wts);
    k3t_dout_free(&d_offs), k3t_dout_free(&d_act), k3t_dout_free(&d_n), k3t_dout_free(&d_list);
    k3t_dout_free(&d_aoff), k3t_dout_free(&d_wsort);
    free(ids), free(list), free(offs), free(act), free(cur), free(aoff), free(wts), free(wsort);
}

/* A bad argument must come back INVALID_ARGUMENT (nothing is launched: the pointers are never read). */
static void dispatch_refused(int32_t tpu, int with_wts, const char *what) {
    int32_t dummy[2] = {0, 0};
    float wdummy[2] = {0.0f, 0.0f};
    const k3_status st = k3_cuda_moe_dispatch(g_gpu, dummy, 0, 8, tpu, dummy, dummy, dummy, dummy, dummy, dummy,
                                              with_wts ? wdummy : NULL, NULL, g_stream);
    CHECK(st == K3_STATUS_INVALID_ARGUMENT, "dispatch: %s must be refused (got %d)", what, (int)st);
    printf("%s dispatch %s refused: %s\n", st == K3_STATUS_INVALID_ARGUMENT ? "PASS" : "FAIL", what,
           k3_ctx_last_error(g_gpu));
}

void gpu_moe_dispatch_group(void) {
    for (size_t i = 0; i < sizeof k_dispatch_cases / sizeof k_dispatch_cases[0]; i++) dispatch_case(&k_dispatch_cases[i]);
    dispatch_refused(0, 0, "tokens_per_unit 0");
    dispatch_refused(8, 1, "wts without wsort");
}
#endif
