/* The GPU router and routed experts against the CPU reference (a CPU context running the same plan):
 * router ids and weights bitwise equal (sigmoid noaux_tc and softmax, BF16 and F32 gates, ties, NaN rows);
 * the device dispatch against a host counting sort (decode and prefill sizes); the experts' outputs within
 * the MoE budgets (rel-L2 1e-2 W4A16 / 2e-2 W4A4) for NVFP4 (shared and separate gate/up scale_2), MXFP4 and
 * BF16 weights, linear and swizzled scales, every activation, M 1..512, top-k 1..16, E 8 / 56 / 896 (and the
 * real K3 TP8 shape), experts with no tokens, all tokens on one expert; bitwise identical across two runs and
 * across the launch shapes the kernels choose between; CUDA-graph capture, then replay with new routing copied
 * into the captured buffers; the latent-MoE block. Every device output goes through the harness
 * (tests/k3t_harness.h): poisoned before each run, guard bytes around it, every element written, no NaN/Inf.
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

#include "k3.h"
#include "test_util.h"

#ifndef K3_HAVE_CUDA
int main(void) { K3T_SKIP("built without CUDA"); }
#else

#include "cuda/moe/moe.h"
#include "k3t_harness_cuda.h"

#define DEFAULT_SEED 0x6D6F45u

static k3_ctx *g_gpu, *g_cpu;
static cudaStream_t g_stream;

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL gpu_moe: TIMEOUT (300 s alarm): a kernel or the CPU reference hung\n";
    ssize_t r = write(2, msg, sizeof msg - 1);
    (void)r;
    _exit(1);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ======================================================================= router ======================= */

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
    if (c->ties) /* expert 2j + 1 gets expert 2j's row: equal logits, the lower id must win */
        for (int32_t e = 1; e < E; e += 2) memcpy(gate + (size_t)e * H * gsz, gate + (size_t)(e - 1) * H * gsz, (size_t)H * gsz);
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
        CHECK(k3_router_run(pc, m, x, gate, bias_use, ids_c, w_c, NULL, 0, NULL) == K3_STATUS_SUCCESS, "cpu router");
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

/* ======================================================================= dispatch ===================== */

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

/* ======================================================================= experts ====================== */

/* ROUTE_DUP: every slot of a token names the same expert (3 % E): one expert gets M * k pairs, more than one
 * pass takes at decode sizes (a router never repeats an id; the kernels must still handle it) */
enum { ROUTE_RANDOM = 0, ROUTE_ONE_EXPERT = 1, ROUTE_LOW_EXPERTS = 2, ROUTE_DUP = 3 };

typedef struct mcase {
    k3t_case c; /* name: the tag; shape = {E, top_k, L, I}; m = M; options = the routing (ROUTE_*) */
    k3_weight_format fmt;
    k3_scale_layout layout;
    int32_t sep;
    k3_moe_mode mode;
    k3_act_kind act;
    int32_t graph; /* also capture + replay with new routing */
} mcase;

typedef struct moe_data {
    k3_moe_desc d;
    size_t w13_b, w2_b, w13s_b, w2s_b, s2_13;
    uint8_t *w13, *w2, *w13s, *w2s;
    float *s13, *s2, *in13, *in2;
    k3_moe_weights hw, dw; /* host and device pointers */
} moe_data;

static void fill_routing(const mcase *c, int32_t route, k3t_rng *rng, int32_t *ids, float *wts) {
    const int32_t M = (int32_t)c->c.m, K = (int32_t)c->c.shape[1], E = (int32_t)c->c.shape[0];
    for (int32_t t = 0; t < M; t++) {
        int32_t *row = ids + (int64_t)t * K;
        float sum = 0.0f;
        for (int32_t j = 0; j < K; j++) {
            int32_t e;
            int dup;
            do { /* distinct experts per token, as a router gives (except ROUTE_DUP) */
                if (route == ROUTE_DUP) {
                    e = 3 % E;
                    break;
                }
                if (route == ROUTE_ONE_EXPERT && j == 0) e = 3 % E;
                else if (route == ROUTE_LOW_EXPERTS) e = (int32_t)(k3t_next(rng) % (uint64_t)(K + 1 < E ? K + 1 : E));
                else e = (int32_t)(k3t_next(rng) % (uint64_t)E);
                dup = 0;
                for (int32_t i = 0; i < j; i++) dup |= row[i] == e;
            } while (dup);
            row[j] = e;
            wts[(int64_t)t * K + j] = 0.1f + 0.9f * (0.5f + 0.5f * k3t_uniform(rng));
            sum += wts[(int64_t)t * K + j];
        }
        for (int32_t j = 0; j < K; j++) wts[(int64_t)t * K + j] /= sum;
    }
}

static int moe_data_make(moe_data *md, const mcase *c, k3t_rng *rng) {
    memset(md, 0, sizeof *md);
    k3_moe_desc *d = &md->d;
    k3_moe_desc_init(d);
    const int64_t E = c->c.shape[0], L = c->c.shape[2], I = c->c.shape[3];
    d->num_experts = (int32_t)E, d->top_k = (int32_t)c->c.shape[1], d->hidden = L, d->inter = I, d->format = c->fmt;
    d->scale_layout = c->layout, d->w13_separate_scale_2 = c->sep, d->mode = c->mode, d->max_tokens = c->c.m;
    if (c->act == K3_ACT_SITU) k3_act_desc_k3(&d->act);
    else k3_act_desc_init(&d->act, c->act);
    if (c->act == K3_ACT_SILU) d->act.limit = 7.0f; /* exercise the clamp */
    const int64_t w1 = (c->act == K3_ACT_RELU2_NO_MUL ? 1 : 2) * I;
    const int fp4 = c->fmt != K3_WEIGHT_BF16;
    md->w13_b = (size_t)(E * w1 * L) * (fp4 ? 1 : 4) / 2;
    md->w2_b = (size_t)(E * L * I) * (fp4 ? 1 : 4) / 2;
    if (fp4) {
        const k3_fp4_format f = c->fmt == K3_WEIGHT_NVFP4 ? K3_FP4_NVFP4 : K3_FP4_MXFP4;
        size_t a = 0, b = 0;
        if (k3_fp4_scale_bytes(f, c->layout, w1, L, &a) != K3_STATUS_SUCCESS ||
            k3_fp4_scale_bytes(f, c->layout, L, I, &b) != K3_STATUS_SUCCESS)
            return 0;
        md->w13s_b = a * (size_t)E, md->w2s_b = b * (size_t)E;
    }
    md->w13 = (uint8_t *)malloc(md->w13_b), md->w2 = (uint8_t *)malloc(md->w2_b);
    md->w13s = (uint8_t *)malloc(md->w13s_b + 1), md->w2s = (uint8_t *)malloc(md->w2s_b + 1);
    md->s13 = (float *)malloc((size_t)E * 8), md->s2 = (float *)malloc((size_t)E * 4);
    md->in13 = (float *)malloc((size_t)E * 4), md->in2 = (float *)malloc((size_t)E * 4);
    if (!md->w13 || !md->w2 || !md->w13s || !md->w2s || !md->s13 || !md->s2 || !md->in13 || !md->in2) return 0;
    if (fp4) {
        /* random codes; scales keep the dot products O(1): e4m3 codes 0x28..0x40 (0.25 .. 2), ue8m0 124..129 */
        k3t_fill_bytes(rng, md->w13, md->w13_b);
        k3t_fill_bytes(rng, md->w2, md->w2_b);
        const int nv = c->fmt == K3_WEIGHT_NVFP4;
        for (size_t i = 0; i < md->w13s_b; i++) md->w13s[i] = (uint8_t)(nv ? 0x28 + k3t_next(rng) % 25 : 124 + k3t_next(rng) % 6);
        for (size_t i = 0; i < md->w2s_b; i++) md->w2s[i] = (uint8_t)(nv ? 0x28 + k3t_next(rng) % 25 : 124 + k3t_next(rng) % 6);
    } else {
        uint16_t *a = (uint16_t *)(void *)md->w13, *b = (uint16_t *)(void *)md->w2;
        for (int64_t i = 0; i < E * w1 * L; i++) a[i] = k3t_rand_bf16(rng, 2.0f / sqrtf((float)L));
        for (int64_t i = 0; i < E * L * I; i++) b[i] = k3t_rand_bf16(rng, 2.0f / sqrtf((float)I));
    }
    for (int64_t e = 0; e < E; e++) {
        md->s13[2 * e] = (0.7f + 0.3f * k3t_uniform(rng)) / sqrtf((float)L);
        md->s13[2 * e + 1] = c->sep ? (0.7f + 0.3f * k3t_uniform(rng)) / sqrtf((float)L) : md->s13[2 * e];
        md->s2[e] = (0.7f + 0.3f * k3t_uniform(rng)) / sqrtf((float)I);
        md->in13[e] = (1.0f + 0.2f * k3t_uniform(rng)) / 2688.0f;
        md->in2[e] = (3.0f + 0.5f * k3t_uniform(rng)) / 2688.0f;
    }
    if (!c->sep) /* shared scale_2: [E] */
        for (int64_t e = 0; e < E; e++) md->s13[e] = md->s13[2 * e];
    md->hw.w13 = md->w13, md->hw.w2 = md->w2;
    md->hw.w13_scale = fp4 ? md->w13s : NULL, md->hw.w2_scale = fp4 ? md->w2s : NULL;
    md->hw.w13_scale_2 = c->fmt == K3_WEIGHT_NVFP4 ? md->s13 : NULL;
    md->hw.w2_scale_2 = c->fmt == K3_WEIGHT_NVFP4 ? md->s2 : NULL;
    md->hw.w13_input_scale = c->mode == K3_MOE_W4A4 ? md->in13 : NULL;
    md->hw.w2_input_scale = c->mode == K3_MOE_W4A4 ? md->in2 : NULL;
    md->dw.w13 = k3t_dup(md->w13, md->w13_b);
    md->dw.w2 = k3t_dup(md->w2, md->w2_b);
    md->dw.w13_scale = fp4 ? k3t_dup(md->w13s, md->w13s_b) : NULL;
    md->dw.w2_scale = fp4 ? k3t_dup(md->w2s, md->w2s_b) : NULL;
    md->dw.w13_scale_2 = md->hw.w13_scale_2 ? (const float *)k3t_dup(md->s13, (size_t)E * 8) : NULL;
    md->dw.w2_scale_2 = md->hw.w2_scale_2 ? (const float *)k3t_dup(md->s2, (size_t)E * 4) : NULL;
    md->dw.w13_input_scale = md->hw.w13_input_scale ? (const float *)k3t_dup(md->in13, (size_t)E * 4) : NULL;
    md->dw.w2_input_scale = md->hw.w2_input_scale ? (const float *)k3t_dup(md->in2, (size_t)E * 4) : NULL;
    return md->dw.w13 && md->dw.w2;
}

static void moe_data_free(moe_data *md) {
    free(md->w13), free(md->w2), free(md->w13s), free(md->w2s), free(md->s13), free(md->s2), free(md->in13), free(md->in2);
    cudaFree((void *)md->dw.w13), cudaFree((void *)md->dw.w2), cudaFree((void *)md->dw.w13_scale);
    cudaFree((void *)md->dw.w2_scale), cudaFree((void *)md->dw.w13_scale_2), cudaFree((void *)md->dw.w2_scale_2);
    cudaFree((void *)md->dw.w13_input_scale), cudaFree((void *)md->dw.w2_input_scale);
}

static const char *fmt_name(k3_weight_format f) {
    return f == K3_WEIGHT_NVFP4 ? "nvfp4" : f == K3_WEIGHT_MXFP4 ? "mxfp4" : "bf16";
}

/* The launch shapes a CUDA MoE call chooses between, each of which must give bitwise the same output as the
 * shape the call takes: where the GEMMs route themselves (W4A16, np <= 256, small grids: the dispatch folded
 * in), the dispatch-kernel path; where GEMM1 runs in paired tiles, its 16-output blocks; where GEMM2 runs two or
 * four row tiles per warp, one; where GEMM1's first wave routes itself ahead of the dispatch kernel, every block
 * after it. Each alternative is a plan of the same descriptor with that shape forced off (k3_moe_desc.force_shape),
 * and k3_moe_plan_kernel says which of them the call at M takes. */
enum { ALT_DISPATCH_PATH, ALT_UNPAIRED, ALT_ONE_TILE, ALT_LATE_ROUTING, N_ALT };
static const char *const k_alt_name[N_ALT] = {"dispatch-path", "unpaired", "one-tile", "late-routing"};
static const int32_t k_alt_force[N_ALT] = {K3_MOE_FORCE_NO_FOLD, K3_MOE_FORCE_NO_PAIR, K3_MOE_FORCE_NO_TILES,
                                           K3_MOE_FORCE_NO_EARLY};

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
    int bitwise = 0, graph_ok = -1, same[N_ALT] = {-1, -1, -1, -1};
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
            /* top_k 1 (GEMM2 writes out itself, no combine): ids outside [0, E) are skipped by the CUDA kernels
             * (the CPU refuses them), so their tokens' rows must come out zero, and every other row bitwise as
             * above (each token's output depends on its own expert only) */
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
                    fill_routing(c, ROUTE_RANDOM, &rng, ids, wts);
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
                                        : "random",
           rel, rel_bf, tol, bitwise ? "bitwise equal" : "DIFFER", us, t_cpu, now_s() - t_start);
    const int sd = same[ALT_DISPATCH_PATH], su = same[ALT_UNPAIRED], st1 = same[ALT_ONE_TILE],
              sl = same[ALT_LATE_ROUTING];
    printf(sd < 0 ? ", not folded" : sd ? ", folded = dispatch path bitwise" : ", folded = dispatch path DIFFER");
    if (su >= 0) printf(su ? ", paired = unpaired bitwise" : ", paired = unpaired DIFFER");
    if (st1 >= 0) printf(st1 ? ", %d tiles = 1 tile bitwise" : ", %d tiles = 1 tile DIFFER", g2_tiles);
    if (sl >= 0) printf(sl ? ", early = late routing bitwise" : ", early = late routing DIFFER");
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

/* ======================================================================= latent block ================= */

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
    /* the ring kernel's token blockings (2 and 8 per block), E not a multiple of its 8 experts, a partial last
     * chunk (1000 = 3 x 256 + 232 bf16 / 7 x 128 + 104 f32) */
    {{"sigmoid", {900, 16, 1000}, 2, 0, 109, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_F32, 1, 1, 0, 11, 1.0f},
    {{"sigmoid", {900, 16, 1000}, 6, 0, 110, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 1, 1, 1, -1, 2.5f},
    /* the selection's method boundaries (moe_route.cu): 257 and 1024 experts sort, 1025 takes the arg-max rounds */
    {{"sigmoid", {257, 8, 256}, 2, 0, 111, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_F32, 1, 1, 1, 3, 1.0f},
    {{"softmax", {1024, 8, 512}, 3, 0, 112, K3T_OP_ROUTER}, K3_ROUTER_SOFTMAX, K3_DTYPE_BF16, 1, 0, 1, 100, 1.0f},
    {{"sigmoid", {1025, 4, 256}, 2, 0, 113, K3T_OP_ROUTER}, K3_ROUTER_SIGMOID_NOAUX_TC, K3_DTYPE_BF16, 0, 1, 0, -1, 1.0f},
};

/* name: the tag; shape = {E, top_k, L, I}; m = M; options = the routing (ROUTE_*); seed offsets 300 + i; the
 * budget by mode */
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
        for (size_t i = 0; i < sizeof k_router_cases / sizeof k_router_cases[0]; i++) router_case(&k_router_cases[i]);
    } else if (gi == 1) {
        for (size_t i = 0; i < sizeof k_dispatch_cases / sizeof k_dispatch_cases[0]; i++)
            dispatch_case(&k_dispatch_cases[i]);
        dispatch_refused(0, 0, "tokens_per_unit 0");
        dispatch_refused(8, 1, "wts without wsort");
    } else if (gi < N_GROUPS - 1) {
        const int first = (gi - 2) * MOE_PER_GROUP;
        for (int i = first; i < first + MOE_PER_GROUP && i < N_MOE_CASES; i++) {
            if (quick && (k_moe_cases[i].c.shape[2] > 512 || k_moe_cases[i].c.m > 80)) continue;
            moe_case(&k_moe_cases[i]);
        }
    } else {
        for (size_t i = 0; i < sizeof k_latent_cases / sizeof k_latent_cases[0]; i++)
            if (!quick || !(k_latent_cases[i].options & LAT_SLOW)) latent_case(&k_latent_cases[i]);
        validation_checks();
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
