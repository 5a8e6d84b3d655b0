/* The GPU router and routed experts (issue 6) against the CPU reference (a CPU context running the same plan):
 * router ids and weights bitwise equal (sigmoid noaux_tc and softmax, BF16 and F32 gates, ties, NaN rows);
 * the device dispatch against a host counting sort (decode and prefill sizes); the experts' outputs within
 * rel-L2 1e-2 (W4A16) / 2e-2 (W4A4) for NVFP4 (shared and separate gate/up scale_2), MXFP4 and BF16 weights,
 * linear and swizzled scales, every activation, M 1..512, top-k 1..16, E 8 / 56 / 896 (and the real K3 TP8
 * shape), experts with no tokens, all tokens on one expert; bitwise identical across two runs; CUDA-graph
 * capture, then replay with new routing copied into the captured buffers. One PASS/FAIL line per case with
 * its numbers. Exits 77 without a CUDA device; a 300 s alarm turns a hang into a failure. Fixed seeds. */
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

#include <cuda_runtime.h>

#include "cuda/moe/moe.h"

#define SEED 0x6D6F45u

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

static int cuda_ok(cudaError_t e, const char *what) {
    CHECK(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

static void *dalloc(size_t bytes) {
    void *p = NULL;
    if (!cuda_ok(cudaMalloc(&p, bytes ? bytes : 16), "cudaMalloc")) return NULL;
    return p;
}

static void *dup_to_device(const void *h, size_t bytes) {
    void *d = dalloc(bytes);
    /* a pageable cudaMemcpy may return before its DMA lands, and the tests' stream does not wait for the legacy
     * stream: wait for the copy here */
    if (d && bytes && cuda_ok(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "copy to device"))
        cuda_ok(cudaDeviceSynchronize(), "copy to device (sync)");
    return d;
}

static uint16_t rand_bf16(k3t_rng *r, float scale) { return k3_bf16_from_f32(scale * k3t_uniform(r)); }

/* Random bytes, 8 per generator step (the K3 TP8 weights are ~2 GB). */
static void fill_bytes(k3t_rng *r, uint8_t *p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint64_t v = k3t_next(r);
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)k3t_next(r);
}

/* ======================================================================= router ======================= */

typedef struct rcase {
    k3_router_kind kind;
    int32_t E, k, m;
    int64_t H;
    k3_dtype gdt;
    int32_t renorm, use_bias, ties, nan_row;
    float scaling;
} rcase;

static void router_case(const rcase *c, uint64_t seed) {
    k3t_rng rng = {seed};
    const int64_t H = c->H;
    const int32_t E = c->E, k = c->k, m = c->m;
    const size_t gsz = c->gdt == K3_DTYPE_F32 ? 4 : 2;
    uint16_t *x = (uint16_t *)malloc((size_t)(m * H) * 2);
    uint8_t *gate = (uint8_t *)malloc((size_t)E * (size_t)H * gsz);
    float *bias = (float *)malloc((size_t)E * 4);
    int32_t *ids_c = (int32_t *)malloc((size_t)(m * k) * 4), *ids_g = (int32_t *)malloc((size_t)(m * k) * 4);
    float *w_c = (float *)malloc((size_t)(m * k) * 4), *w_g = (float *)malloc((size_t)(m * k) * 4);
    for (int64_t i = 0; i < m * H; i++) x[i] = rand_bf16(&rng, 1.0f);
    for (int64_t i = 0; i < (int64_t)E * H; i++) {
        const float v = 0.05f * k3t_uniform(&rng);
        if (c->gdt == K3_DTYPE_F32) memcpy(gate + i * 4, &v, 4);
        else {
            const uint16_t b = k3_bf16_from_f32(v);
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
    int id_mis = -1, w_mis = -1;
    double us = 0.0;
    if (ok_c && sg == K3_STATUS_SUCCESS) {
        size_t wsc = 0, wsg = 0;
        k3_router_workspace_size(pc, &wsc);
        k3_router_workspace_size(pg, &wsg);
        CHECK(k3_router_run(pc, m, x, gate, bias_use, ids_c, w_c, NULL, 0, NULL) == K3_STATUS_SUCCESS, "cpu router");
        void *dx = dup_to_device(x, (size_t)(m * H) * 2), *dg = dup_to_device(gate, (size_t)E * (size_t)H * gsz);
        float *db = (float *)dup_to_device(bias, (size_t)E * 4);
        int32_t *dids = (int32_t *)dalloc((size_t)(m * k) * 4);
        float *dw = (float *)dalloc((size_t)(m * k) * 4);
        void *dws = dalloc(wsg);
        const k3_status st = k3_router_run(pg, m, dx, dg, bias_use ? db : NULL, dids, dw, dws, wsg, g_stream);
        CHECK(st == K3_STATUS_SUCCESS, "gpu router run: %s", k3_ctx_last_error(g_gpu));
        cuda_ok(cudaStreamSynchronize(g_stream), "router sync");
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        cudaEventRecord(e0, g_stream);
        for (int it = 0; it < 10; it++) k3_router_run(pg, m, dx, dg, bias_use ? db : NULL, dids, dw, dws, wsg, g_stream);
        cudaEventRecord(e1, g_stream);
        cuda_ok(cudaEventSynchronize(e1), "router timing");
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, e0, e1);
        us = 1000.0 * ms / 10.0;
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        cuda_ok(cudaMemcpy(ids_g, dids, (size_t)(m * k) * 4, cudaMemcpyDeviceToHost), "ids back");
        cuda_ok(cudaMemcpy(w_g, dw, (size_t)(m * k) * 4, cudaMemcpyDeviceToHost), "weights back");
        for (int64_t i = 0; i < (int64_t)m * k; i++) {
            if (id_mis < 0 && ids_c[i] != ids_g[i]) id_mis = (int)i;
            if (w_mis < 0 && memcmp(&w_c[i], &w_g[i], 4) != 0) w_mis = (int)i;
        }
        cudaFree(dx), cudaFree(dg), cudaFree(db), cudaFree(dids), cudaFree(dw), cudaFree(dws);
    }
    const int pass = ok_c && sg == K3_STATUS_SUCCESS && id_mis < 0 && w_mis < 0;
    printf("%s router %s gate=%s E=%d k=%d m=%d H=%lld renorm=%d bias=%d ties=%d nan_row=%d: ids %s, weights %s "
           "(%.1f us/call)\n",
           pass ? "PASS" : "FAIL", c->kind == K3_ROUTER_SOFTMAX ? "softmax" : "sigmoid",
           c->gdt == K3_DTYPE_F32 ? "f32" : "bf16", E, k, m, (long long)H, c->renorm, c->use_bias, c->ties,
           c->nan_row, id_mis < 0 ? "equal" : "DIFFER", w_mis < 0 ? "bitwise equal" : "DIFFER", us);
    if (id_mis >= 0)
        printf("    first id mismatch at [%d][%d]: cpu %d gpu %d\n", id_mis / k, id_mis % k, ids_c[id_mis], ids_g[id_mis]);
    if (w_mis >= 0)
        printf("    first weight mismatch at [%d][%d]: cpu %.9g gpu %.9g\n", w_mis / k, w_mis % k, (double)w_c[w_mis],
               (double)w_g[w_mis]);
    CHECK(pass, "router case E=%d k=%d m=%d", E, k, m);
    k3_router_plan_destroy(pc);
    k3_router_plan_destroy(pg);
    free(x), free(gate), free(bias), free(ids_c), free(ids_g), free(w_c), free(w_g);
}

/* ======================================================================= dispatch ===================== */

/* tpu: tokens per unit (the GEMMs' tokens per pass: 8 or 16; other values exercise the cut) */
static void dispatch_case(int32_t m, int32_t k, int32_t E, int skew, int32_t tpu, uint64_t seed) {
    k3t_rng rng = {seed};
    const int32_t np = m * k, nu = (np < E ? np : E) + np / tpu; /* the units' bound (k3_cuda_moe_dispatch) */
    int32_t *ids = (int32_t *)malloc((size_t)np * 4), *list = (int32_t *)malloc((size_t)np * 4);
    int32_t *offs = (int32_t *)malloc((size_t)(E + 1) * 4), *act = (int32_t *)malloc((size_t)nu * 4);
    int32_t *g_list = (int32_t *)malloc((size_t)np * 4), *g_offs = (int32_t *)malloc((size_t)(E + 1) * 4);
    int32_t *g_act = (int32_t *)malloc((size_t)nu * 4), *cur = (int32_t *)malloc((size_t)E * 4);
    int32_t *aoff = (int32_t *)malloc((size_t)(nu + 1) * 4), *g_aoff = (int32_t *)malloc((size_t)(nu + 1) * 4);
    float *wts = (float *)malloc((size_t)np * 4), *g_wsort = (float *)malloc((size_t)np * 4);
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

    int32_t *dids = (int32_t *)dup_to_device(ids, (size_t)np * 4);
    int32_t *d_offs = (int32_t *)dalloc((size_t)(E + 1) * 4), *d_cur = (int32_t *)dalloc((size_t)E * 4);
    int32_t *d_act = (int32_t *)dalloc((size_t)nu * 4), *d_n = (int32_t *)dalloc(4), *d_list = (int32_t *)dalloc((size_t)np * 4);
    int32_t *d_aoff = (int32_t *)dalloc((size_t)(nu + 1) * 4);
    float *d_wts = (float *)dup_to_device(wts, (size_t)np * 4), *d_wsort = (float *)dalloc((size_t)np * 4);
    cudaMemsetAsync(d_wsort, 0xff, (size_t)np * 4, g_stream); /* NaN: every entry must be written */
    cudaMemsetAsync(d_list, 0xff, (size_t)np * 4, g_stream);
    cudaMemsetAsync(d_aoff, 0xff, (size_t)(nu + 1) * 4, g_stream);
    const double t0 = now_s();
    const k3_status st = k3_cuda_moe_dispatch(g_gpu, dids, np, E, tpu, d_offs, d_cur, d_act, d_aoff, d_n, d_list, d_wts,
                                              d_wsort, g_stream);
    cuda_ok(cudaStreamSynchronize(g_stream), "dispatch sync");
    const double dt = now_s() - t0;
    int32_t g_n = -1;
    cudaMemcpy(g_offs, d_offs, (size_t)(E + 1) * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(g_act, d_act, (size_t)nu * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(&g_n, d_n, 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(g_list, d_list, (size_t)np * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(g_aoff, d_aoff, (size_t)(nu + 1) * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(g_wsort, d_wsort, (size_t)np * 4, cudaMemcpyDeviceToHost);
    const int ok_offs = memcmp(offs, g_offs, (size_t)(E + 1) * 4) == 0;
    const int ok_act = g_n == nact && memcmp(act, g_act, (size_t)nact * 4) == 0 &&
                       memcmp(aoff, g_aoff, (size_t)(nact + 1) * 4) == 0;
    const int ok_list = memcmp(list, g_list, (size_t)np * 4) == 0;
    int ok_wsort = 1; /* the routing weight of each grouped pair, copied bit for bit */
    for (int32_t p = 0; p < np; p++) ok_wsort &= memcmp(&g_wsort[p], &wts[list[p]], 4) == 0;
    const int pass = st == K3_STATUS_SUCCESS && ok_offs && ok_act && ok_list && ok_wsort;
    printf("%s dispatch m=%d k=%d E=%d skew=%d tpu=%d: offsets %s, units %s (%d vs %d), list %s, weights %s (%.1f us "
           "incl. sync)\n",
           pass ? "PASS" : "FAIL", m, k, E, skew, tpu, ok_offs ? "equal" : "DIFFER", ok_act ? "equal" : "DIFFER", g_n, nact,
           ok_list ? "equal" : "DIFFER", ok_wsort ? "equal" : "DIFFER", dt * 1e6);
    CHECK(pass, "dispatch m=%d k=%d E=%d", m, k, E);
    cudaFree(dids), cudaFree(d_offs), cudaFree(d_cur), cudaFree(d_act), cudaFree(d_n), cudaFree(d_list);
    cudaFree(d_aoff), cudaFree(d_wts), cudaFree(d_wsort);
    free(wts), free(g_wsort);
    free(ids), free(list), free(offs), free(act), free(g_list), free(g_offs), free(g_act), free(cur), free(aoff), free(g_aoff);
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
    const char *tag;
    k3_weight_format fmt;
    k3_scale_layout layout;
    int32_t sep;
    k3_moe_mode mode;
    k3_act_kind act;
    int32_t E, k;
    int64_t L, I;
    int32_t M;
    int32_t route;
    int32_t graph; /* also capture + replay with new routing */
} mcase;

typedef struct moe_data {
    k3_moe_desc d;
    size_t w13_b, w2_b, w13s_b, w2s_b, s2_13;
    uint8_t *w13, *w2, *w13s, *w2s;
    float *s13, *s2, *in13, *in2;
    k3_moe_weights hw, dw; /* host and device pointers */
} moe_data;

static void fill_routing(const mcase *c, k3t_rng *rng, int32_t *ids, float *wts) {
    for (int32_t t = 0; t < c->M; t++) {
        int32_t *row = ids + (int64_t)t * c->k;
        float sum = 0.0f;
        for (int32_t j = 0; j < c->k; j++) {
            int32_t e;
            int dup;
            do { /* distinct experts per token, as a router gives (except ROUTE_DUP) */
                if (c->route == ROUTE_DUP) {
                    e = 3 % c->E;
                    break;
                }
                if (c->route == ROUTE_ONE_EXPERT && j == 0) e = 3 % c->E;
                else if (c->route == ROUTE_LOW_EXPERTS) e = (int32_t)(k3t_next(rng) % (uint64_t)(c->k + 1 < c->E ? c->k + 1 : c->E));
                else e = (int32_t)(k3t_next(rng) % (uint64_t)c->E);
                dup = 0;
                for (int32_t i = 0; i < j; i++) dup |= row[i] == e;
            } while (dup);
            row[j] = e;
            wts[(int64_t)t * c->k + j] = 0.1f + 0.9f * (0.5f + 0.5f * k3t_uniform(rng));
            sum += wts[(int64_t)t * c->k + j];
        }
        for (int32_t j = 0; j < c->k; j++) wts[(int64_t)t * c->k + j] /= sum;
    }
}

static int moe_data_make(moe_data *md, const mcase *c, k3t_rng *rng) {
    memset(md, 0, sizeof *md);
    k3_moe_desc *d = &md->d;
    k3_moe_desc_init(d);
    d->num_experts = c->E, d->top_k = c->k, d->hidden = c->L, d->inter = c->I, d->format = c->fmt;
    d->scale_layout = c->layout, d->w13_separate_scale_2 = c->sep, d->mode = c->mode, d->max_tokens = c->M;
    if (c->act == K3_ACT_SITU) k3_act_desc_k3(&d->act);
    else k3_act_desc_init(&d->act, c->act);
    if (c->act == K3_ACT_SILU) d->act.limit = 7.0f; /* exercise the clamp */
    const int64_t E = c->E, L = c->L, I = c->I, w1 = (c->act == K3_ACT_RELU2_NO_MUL ? 1 : 2) * I;
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
        fill_bytes(rng, md->w13, md->w13_b);
        fill_bytes(rng, md->w2, md->w2_b);
        const int nv = c->fmt == K3_WEIGHT_NVFP4;
        for (size_t i = 0; i < md->w13s_b; i++) md->w13s[i] = (uint8_t)(nv ? 0x28 + k3t_next(rng) % 25 : 124 + k3t_next(rng) % 6);
        for (size_t i = 0; i < md->w2s_b; i++) md->w2s[i] = (uint8_t)(nv ? 0x28 + k3t_next(rng) % 25 : 124 + k3t_next(rng) % 6);
    } else {
        uint16_t *a = (uint16_t *)(void *)md->w13, *b = (uint16_t *)(void *)md->w2;
        for (int64_t i = 0; i < E * w1 * L; i++) a[i] = rand_bf16(rng, 2.0f / sqrtf((float)L));
        for (int64_t i = 0; i < E * L * I; i++) b[i] = rand_bf16(rng, 2.0f / sqrtf((float)I));
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
    md->dw.w13 = dup_to_device(md->w13, md->w13_b);
    md->dw.w2 = dup_to_device(md->w2, md->w2_b);
    md->dw.w13_scale = fp4 ? dup_to_device(md->w13s, md->w13s_b) : NULL;
    md->dw.w2_scale = fp4 ? dup_to_device(md->w2s, md->w2s_b) : NULL;
    md->dw.w13_scale_2 = md->hw.w13_scale_2 ? (const float *)dup_to_device(md->s13, (size_t)E * 8) : NULL;
    md->dw.w2_scale_2 = md->hw.w2_scale_2 ? (const float *)dup_to_device(md->s2, (size_t)E * 4) : NULL;
    md->dw.w13_input_scale = md->hw.w13_input_scale ? (const float *)dup_to_device(md->in13, (size_t)E * 4) : NULL;
    md->dw.w2_input_scale = md->hw.w2_input_scale ? (const float *)dup_to_device(md->in2, (size_t)E * 4) : NULL;
    return md->dw.w13 && md->dw.w2;
}

static void moe_data_free(moe_data *md) {
    free(md->w13), free(md->w2), free(md->w13s), free(md->w2s), free(md->s13), free(md->s2), free(md->in13), free(md->in2);
    cudaFree((void *)md->dw.w13), cudaFree((void *)md->dw.w2), cudaFree((void *)md->dw.w13_scale);
    cudaFree((void *)md->dw.w2_scale), cudaFree((void *)md->dw.w13_scale_2), cudaFree((void *)md->dw.w2_scale_2);
    cudaFree((void *)md->dw.w13_input_scale), cudaFree((void *)md->dw.w2_input_scale);
}

/* rel-L2 of a against the reference r; NaN/Inf anywhere in a gives +inf */
static double rel_l2(const float *a, const float *r, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        const double dd = (double)a[i] - (double)r[i];
        num += dd * dd;
        den += (double)r[i] * (double)r[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static const char *fmt_name(k3_weight_format f) {
    return f == K3_WEIGHT_NVFP4 ? "nvfp4" : f == K3_WEIGHT_MXFP4 ? "mxfp4" : "bf16";
}

static void moe_case(const mcase *c, uint64_t seed) {
    k3t_rng rng = {seed};
    moe_data md;
    const double t_start = now_s();
    const int made = moe_data_make(&md, c, &rng);
    CHECK(made, "%s: data", c->tag);
    const int64_t M = c->M, L = c->L, np = M * c->k;
    uint16_t *x = (uint16_t *)malloc((size_t)(M * L) * 2);
    int32_t *ids = (int32_t *)malloc((size_t)np * 4);
    float *wts = (float *)malloc((size_t)np * 4);
    uint16_t *out_c = (uint16_t *)malloc((size_t)(M * L) * 2), *out_g = (uint16_t *)malloc((size_t)(M * L) * 2);
    uint16_t *out_g2 = (uint16_t *)malloc((size_t)(M * L) * 2);
    float *f_c = (float *)malloc((size_t)(M * L) * 4), *f_g = (float *)malloc((size_t)(M * L) * 4);
    float *f_g2 = (float *)malloc((size_t)(M * L) * 4);
    for (int64_t i = 0; i < M * L; i++) x[i] = rand_bf16(&rng, 1.0f);
    fill_routing(c, &rng, ids, wts);

    k3_moe_plan *pc = NULL, *pg = NULL;
    double rel = INFINITY, rel_bf = INFINITY, rel_graph = -1.0, us = 0.0, t_cpu = 0.0;
    int bitwise = 0, graph_ok = -1, same_dispatch = -1, same_unpaired = -1, same_one_tile = -1, same_late = -1;
    int g2_tiles = 1;
    const double tol = c->mode == K3_MOE_W4A4 ? 2e-2 : 1e-2;
    const k3_status sc = made ? k3_moe_plan_create(g_cpu, &md.d, &pc) : K3_STATUS_INTERNAL_ERROR;
    const k3_status sg = made ? k3_moe_plan_create(g_gpu, &md.d, &pg) : K3_STATUS_INTERNAL_ERROR;
    CHECK(sc == K3_STATUS_SUCCESS, "%s: cpu plan: %s", c->tag, k3_ctx_last_error(g_cpu));
    CHECK(sg == K3_STATUS_SUCCESS, "%s: gpu plan: %s", c->tag, k3_ctx_last_error(g_gpu));
    if (sc == K3_STATUS_SUCCESS && sg == K3_STATUS_SUCCESS) {
        size_t wsc = 0, wsg = 0;
        k3_moe_workspace_size(pc, &wsc);
        k3_moe_workspace_size(pg, &wsg);
        void *hws = malloc(wsc);
        const double t0 = now_s();
        CHECK(k3_moe_run(pc, M, x, ids, wts, &md.hw, out_c, f_c, hws, wsc, NULL) == K3_STATUS_SUCCESS, "%s: cpu run: %s",
              c->tag, k3_ctx_last_error(g_cpu));
        t_cpu = now_s() - t0;
        void *dx = dup_to_device(x, (size_t)(M * L) * 2);
        int32_t *dids = (int32_t *)dup_to_device(ids, (size_t)np * 4);
        float *dwts = (float *)dup_to_device(wts, (size_t)np * 4);
        uint16_t *dout = (uint16_t *)dalloc((size_t)(M * L) * 2);
        float *dof = (float *)dalloc((size_t)(M * L) * 4);
        void *dws = dalloc(wsg);
        cudaMemsetAsync(dws, 0xff, wsg, g_stream); /* poison: every workspace value read must have been written; on
                                                   * g_stream (non-blocking: a legacy-stream memset could land late) */
        cudaMemsetAsync(dout, 0xff, (size_t)(M * L) * 2, g_stream);
        cudaMemsetAsync(dof, 0xff, (size_t)(M * L) * 4, g_stream);
        k3_status st = k3_moe_run(pg, M, dx, dids, dwts, &md.dw, dout, dof, dws, wsg, g_stream);
        CHECK(st == K3_STATUS_SUCCESS, "%s: gpu run: %s", c->tag, k3_ctx_last_error(g_gpu));
        if (cuda_ok(cudaStreamSynchronize(g_stream), "moe run sync")) {
            cudaMemcpy(out_g, dout, (size_t)(M * L) * 2, cudaMemcpyDeviceToHost);
            cudaMemcpy(f_g, dof, (size_t)(M * L) * 4, cudaMemcpyDeviceToHost);
            rel = rel_l2(f_g, f_c, M * L);
            for (int64_t i = 0; i < M * L; i++) { /* the BF16 output is the rounding of out_f32 */
                f_g2[i] = k3_bf16_to_f32(out_g[i]);
            }
            rel_bf = rel_l2(f_g2, f_c, M * L);
            /* second run: bitwise the same */
            st = k3_moe_run(pg, M, dx, dids, dwts, &md.dw, dout, dof, dws, wsg, g_stream);
            cuda_ok(cudaStreamSynchronize(g_stream), "moe run 2 sync");
            cudaMemcpy(out_g2, dout, (size_t)(M * L) * 2, cudaMemcpyDeviceToHost);
            cudaMemcpy(f_g2, dof, (size_t)(M * L) * 4, cudaMemcpyDeviceToHost);
            bitwise = st == K3_STATUS_SUCCESS && memcmp(out_g, out_g2, (size_t)(M * L) * 2) == 0 &&
                      memcmp(f_g, f_g2, (size_t)(M * L) * 4) == 0;
            /* Other launch shapes of the same call must give bitwise the same output: where the GEMMs route
             * themselves (W4A16, np <= 256, small grids: the dispatch folded in, session 14b), the dispatch-kernel path
             * (K3_CUDA_MOE_NO_FOLD); where GEMM1 runs in paired tiles (session 17), its 16-output blocks
             * (K3_CUDA_MOE_NO_PAIR); where GEMM2 runs two or four row tiles per warp (session 21), one
             * (K3_CUDA_MOE_NO_T2); where GEMM1's first wave routes itself ahead of the dispatch kernel (session 22),
             * every block after it (K3_CUDA_MOE_NO_EARLY) */
            k3_cuda_moe cm;
            if (k3_cuda_moe_prepare(g_gpu, &cm, &md.d) == K3_STATUS_SUCCESS) {
                g2_tiles = k3_cuda_moe_g2_tiles(g_gpu, &cm, M, &md.dw);
                const int32_t alt[4] = {k3_cuda_moe_folds(g_gpu, &cm, M, &md.dw) ? K3_CUDA_MOE_NO_FOLD : 0,
                                        k3_cuda_moe_pairs(g_gpu, &cm, M, &md.dw) ? K3_CUDA_MOE_NO_PAIR : 0,
                                        g2_tiles > 1 ? K3_CUDA_MOE_NO_T2 : 0,
                                        k3_cuda_moe_early(g_gpu, &cm, M, &md.dw) ? K3_CUDA_MOE_NO_EARLY : 0};
                int *const same[4] = {&same_dispatch, &same_unpaired, &same_one_tile, &same_late};
                static const char *const alt_name[4] = {"dispatch-path", "unpaired", "one-tile", "late-routing"};
                for (int a = 0; a < 4; a++) {
                    if (!alt[a]) continue;
                    void *dws2 = NULL;
                    *same[a] = 0;
                    if ((dws2 = dalloc(k3_cuda_moe_ws_bytes(&cm))) != NULL) {
                        cudaMemsetAsync(dws2, 0xff, k3_cuda_moe_ws_bytes(&cm), g_stream);
                        cudaMemsetAsync(dout, 0xff, (size_t)(M * L) * 2, g_stream);
                        cudaMemsetAsync(dof, 0xff, (size_t)(M * L) * 4, g_stream);
                        const k3_status s3 = k3_cuda_moe_run_stages(g_gpu, &cm, M, dx, dids, dwts, &md.dw, dout, dof,
                                                                    dws2, g_stream, K3_CUDA_MOE_STAGE_ALL | alt[a]);
                        CHECK(s3 == K3_STATUS_SUCCESS, "%s: %s run: %s", c->tag, alt_name[a], k3_ctx_last_error(g_gpu));
                        if (s3 == K3_STATUS_SUCCESS && cuda_ok(cudaStreamSynchronize(g_stream), "alternative-path sync")) {
                            cudaMemcpy(out_g2, dout, (size_t)(M * L) * 2, cudaMemcpyDeviceToHost);
                            cudaMemcpy(f_g2, dof, (size_t)(M * L) * 4, cudaMemcpyDeviceToHost);
                            *same[a] = memcmp(out_g, out_g2, (size_t)(M * L) * 2) == 0 &&
                                       memcmp(f_g, f_g2, (size_t)(M * L) * 4) == 0;
                        }
                    }
                    cudaFree(dws2);
                }
            }
            /* top_k 1 (GEMM2 writes out itself, no combine): ids outside [0, E) are skipped by the CUDA kernels
             * (the CPU refuses them), so their tokens' rows must come out zero, and every other row bitwise as
             * above (each token's output depends on its own expert only) */
            if (c->k == 1 && M >= 2) {
                int32_t *ids2 = (int32_t *)malloc((size_t)np * 4);
                int32_t *dids2 = NULL;
                int ok = 0;
                if (ids2) {
                    for (int64_t t = 0; t < M; t++) ids2[t] = t % 4 == 1 ? -1 : t % 4 == 3 ? (int32_t)c->E : ids[t];
                    dids2 = (int32_t *)dup_to_device(ids2, (size_t)np * 4);
                }
                if (dids2) {
                    cudaMemsetAsync(dout, 0xff, (size_t)(M * L) * 2, g_stream);
                    cudaMemsetAsync(dof, 0xff, (size_t)(M * L) * 4, g_stream);
                    const k3_status s4 = k3_moe_run(pg, M, dx, dids2, dwts, &md.dw, dout, dof, dws, wsg, g_stream);
                    if (s4 == K3_STATUS_SUCCESS && cuda_ok(cudaStreamSynchronize(g_stream), "skipped-ids sync")) {
                        cudaMemcpy(out_g2, dout, (size_t)(M * L) * 2, cudaMemcpyDeviceToHost);
                        cudaMemcpy(f_g2, dof, (size_t)(M * L) * 4, cudaMemcpyDeviceToHost);
                        ok = 1;
                        for (int64_t t = 0; t < M && ok; t++) {
                            const size_t o = (size_t)(t * L);
                            if (t % 2 == 1) {
                                for (int64_t i = 0; i < L && ok; i++)
                                    ok = out_g2[o + i] == 0 && f_g2[o + i] == 0.0f && !signbit(f_g2[o + i]);
                            } else {
                                ok = memcmp(out_g2 + o, out_g + o, (size_t)L * 2) == 0 &&
                                     memcmp(f_g2 + o, f_g + o, (size_t)L * 4) == 0;
                            }
                        }
                    }
                }
                CHECK(ok, "%s: top-k 1 with skipped ids: their rows must be +0, the others bitwise unchanged", c->tag);
                printf("%s moe %-12s top-k 1, ids outside [0, E) on odd tokens: zero rows, the others bitwise\n",
                       ok ? "PASS" : "FAIL", c->tag);
                cudaFree(dids2);
                free(ids2);
            }
            /* timing (without out_f32) */
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            const int iters = M >= 256 ? 3 : 20;
            cudaEventRecord(e0, g_stream);
            for (int it = 0; it < iters; it++) k3_moe_run(pg, M, dx, dids, dwts, &md.dw, dout, NULL, dws, wsg, g_stream);
            cudaEventRecord(e1, g_stream);
            if (cuda_ok(cudaEventSynchronize(e1), "moe timing")) {
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
            if (cuda_ok(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal), "begin capture")) {
                const k3_status cst = k3_moe_run(pg, M, dx, dids, dwts, &md.dw, dout, dof, dws, wsg, g_stream);
                const cudaError_t ce = cudaStreamEndCapture(g_stream, &graph);
                CHECK(cst == K3_STATUS_SUCCESS && ce == cudaSuccess, "%s: capture: %s / %s", c->tag,
                      k3_ctx_last_error(g_gpu), cudaGetErrorString(ce));
                if (cst == K3_STATUS_SUCCESS && ce == cudaSuccess &&
                    cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "graph instantiate")) {
                    mcase c2 = *c;
                    c2.route = ROUTE_RANDOM;
                    fill_routing(&c2, &rng, ids, wts);
                    for (int64_t i = 0; i < M * L; i++) x[i] = rand_bf16(&rng, 1.0f);
                    cudaMemcpyAsync(dx, x, (size_t)(M * L) * 2, cudaMemcpyHostToDevice, g_stream);
                    cudaMemcpyAsync(dids, ids, (size_t)np * 4, cudaMemcpyHostToDevice, g_stream);
                    cudaMemcpyAsync(dwts, wts, (size_t)np * 4, cudaMemcpyHostToDevice, g_stream);
                    cudaMemsetAsync(dof, 0xff, (size_t)(M * L) * 4, g_stream);
                    if (cuda_ok(cudaGraphLaunch(exec, g_stream), "graph launch") &&
                        cuda_ok(cudaStreamSynchronize(g_stream), "graph sync")) {
                        cudaMemcpy(f_g, dof, (size_t)(M * L) * 4, cudaMemcpyDeviceToHost);
                        k3_moe_run(pc, M, x, ids, wts, &md.hw, out_c, f_c, hws, wsc, NULL);
                        rel_graph = rel_l2(f_g, f_c, M * L);
                        /* and bitwise equal to a direct run on the new routing */
                        k3_moe_run(pg, M, dx, dids, dwts, &md.dw, dout, dof, dws, wsg, g_stream);
                        cudaStreamSynchronize(g_stream);
                        cudaMemcpy(f_g2, dof, (size_t)(M * L) * 4, cudaMemcpyDeviceToHost);
                        graph_ok = rel_graph <= tol && memcmp(f_g, f_g2, (size_t)(M * L) * 4) == 0;
                    }
                }
            }
            if (exec) cudaGraphExecDestroy(exec);
            if (graph) cudaGraphDestroy(graph);
            cudaGetLastError();
        }
        cudaFree(dx), cudaFree(dids), cudaFree(dwts), cudaFree(dout), cudaFree(dof), cudaFree(dws);
        free(hws);
    }
    const int pass = rel <= tol && rel_bf <= tol && bitwise && graph_ok != 0 && same_dispatch != 0 && same_unpaired != 0 &&
                     same_one_tile != 0 && same_late != 0;
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
               (long long)bad_rows, (long long)M, ids[(worst / L) * c->k]);
    }
    printf("%s moe %-10s %s %s%s %s act=%s E=%d k=%d M=%d L=%lld I=%lld route=%s: rel-L2 %.3e (bf16 out %.3e, tol %.0e), "
           "two runs %s%s, gpu %.1f us/call, cpu ref %.2f s, case %.1f s",
           pass ? "PASS" : "FAIL", c->tag, fmt_name(c->fmt), c->layout == K3_SCALE_SWIZZLED ? "swizzled" : "linear",
           c->sep ? " sep-s2" : "", c->mode == K3_MOE_W4A4 ? "w4a4" : "w4a16", k3_act_name(c->act), c->E, c->k, c->M,
           (long long)c->L, (long long)c->I,
           c->route == ROUTE_ONE_EXPERT    ? "one-expert"
           : c->route == ROUTE_LOW_EXPERTS ? "few-experts"
           : c->route == ROUTE_DUP         ? "dup-ids"
                                           : "random",
           rel,
           rel_bf, tol, bitwise ? "bitwise equal" : "DIFFER", "", us, t_cpu, now_s() - t_start);
    printf(same_dispatch < 0 ? ", not folded" : same_dispatch ? ", folded = dispatch path bitwise" : ", folded = dispatch path DIFFER");
    if (same_unpaired >= 0) printf(same_unpaired ? ", paired = unpaired bitwise" : ", paired = unpaired DIFFER");
    if (same_one_tile >= 0) printf(same_one_tile ? ", %d tiles = 1 tile bitwise" : ", %d tiles = 1 tile DIFFER", g2_tiles);
    if (same_late >= 0) printf(same_late ? ", early = late routing bitwise" : ", early = late routing DIFFER");
    if (c->graph) printf(", graph replay with new routing %s (rel-L2 %.3e)", graph_ok > 0 ? "ok" : "FAILED", rel_graph);
    printf("\n");
    fflush(stdout);
    CHECK(pass, "moe case %s", c->tag);
    k3_moe_plan_destroy(pc);
    k3_moe_plan_destroy(pg);
    moe_data_free(&md);
    free(x), free(ids), free(wts), free(out_c), free(out_g), free(out_g2), free(f_c), free(f_g), free(f_g2);
}

/* ======================================================================= latent block ================= */

static uint16_t *rand_bf16_buf(k3t_rng *r, int64_t n, float scale, float offset) {
    uint16_t *b = (uint16_t *)malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) b[i] = k3_bf16_from_f32(offset + scale * k3t_uniform(r));
    return b;
}

static void latent_case(int64_t H, int64_t L, int32_t E, int32_t k, int64_t I, int64_t Is, int32_t M, int use_res,
                        int graph, uint64_t seed) {
    k3t_rng rng = {seed};
    const mcase ec = {"latent", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, E, k, L, I, M,
                      ROUTE_RANDOM, 0};
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
    d.hidden = H, d.router.hidden = H, d.router.num_experts = E, d.router.top_k = k;
    d.experts = md.d;
    d.shared_inter = Is, d.max_tokens = M;
    k3_latent_moe_weights hw, dw;
    memset(&hw, 0, sizeof hw);
    hw.gate = gate, hw.bias = bias, hw.down_proj = down, hw.experts = md.hw, hw.norm = norm, hw.up_proj = up;
    hw.shared_gate_up = sgu, hw.shared_down = sdn;
    dw = hw;
    dw.gate = dup_to_device(gate, (size_t)E * (size_t)H * 2);
    dw.bias = (const float *)dup_to_device(bias, (size_t)E * 4);
    dw.down_proj = dup_to_device(down, (size_t)(L * H) * 2);
    dw.experts = md.dw;
    dw.norm = dup_to_device(norm, (size_t)L * 2);
    dw.up_proj = dup_to_device(up, (size_t)(H * L) * 2);
    dw.shared_gate_up = dup_to_device(sgu, (size_t)(2 * Is * H) * 2);
    dw.shared_down = dup_to_device(sdn, (size_t)(H * Is) * 2);
    k3_latent_moe_plan *pc = NULL, *pg = NULL;
    const k3_status sc = k3_latent_moe_plan_create(g_cpu, &d, &pc);
    const k3_status sg = k3_latent_moe_plan_create(g_gpu, &d, &pg);
    CHECK(sc == K3_STATUS_SUCCESS, "latent cpu plan: %s", k3_ctx_last_error(g_cpu));
    CHECK(sg == K3_STATUS_SUCCESS, "latent gpu plan: %s", k3_ctx_last_error(g_gpu));
    double rel = INFINITY, rel_graph = -1.0, us = 0.0;
    int ids_eq = 0, w_eq = 0, bitwise = 0, graph_ok = -1;
    const int64_t nk = (int64_t)M * k;
    if (sc == K3_STATUS_SUCCESS && sg == K3_STATUS_SUCCESS && made) {
        size_t wsc = 0, wsg = 0;
        k3_latent_moe_workspace_size(pc, &wsc);
        k3_latent_moe_workspace_size(pg, &wsg);
        void *hws = malloc(wsc);
        uint16_t *yc = (uint16_t *)malloc((size_t)(M * H) * 2), *yg = (uint16_t *)malloc((size_t)(M * H) * 2);
        uint16_t *yg2 = (uint16_t *)malloc((size_t)(M * H) * 2);
        int32_t *idc = (int32_t *)malloc((size_t)nk * 4), *idg = (int32_t *)malloc((size_t)nk * 4);
        float *wc = (float *)malloc((size_t)nk * 4), *wg = (float *)malloc((size_t)nk * 4);
        float *fc = (float *)malloc((size_t)(M * H) * 4), *fg = (float *)malloc((size_t)(M * H) * 4);
        CHECK(k3_latent_moe_run(pc, M, x, &hw, use_res ? res : NULL, yc, idc, wc, hws, wsc, NULL) == K3_STATUS_SUCCESS,
              "latent cpu run: %s", k3_ctx_last_error(g_cpu));
        void *dx = dup_to_device(x, (size_t)(M * H) * 2), *dres = dup_to_device(res, (size_t)(M * H) * 2);
        uint16_t *dy = (uint16_t *)dalloc((size_t)(M * H) * 2);
        int32_t *dids = (int32_t *)dalloc((size_t)nk * 4);
        float *dwt = (float *)dalloc((size_t)nk * 4);
        void *dws = dalloc(wsg);
        cudaMemsetAsync(dws, 0xff, wsg, g_stream);
        k3_status st = k3_latent_moe_run(pg, M, dx, &dw, use_res ? dres : NULL, dy, dids, dwt, dws, wsg, g_stream);
        CHECK(st == K3_STATUS_SUCCESS, "latent gpu run: %s", k3_ctx_last_error(g_gpu));
        if (cuda_ok(cudaStreamSynchronize(g_stream), "latent sync")) {
            cudaMemcpy(yg, dy, (size_t)(M * H) * 2, cudaMemcpyDeviceToHost);
            cudaMemcpy(idg, dids, (size_t)nk * 4, cudaMemcpyDeviceToHost);
            cudaMemcpy(wg, dwt, (size_t)nk * 4, cudaMemcpyDeviceToHost);
            ids_eq = memcmp(idc, idg, (size_t)nk * 4) == 0;
            w_eq = memcmp(wc, wg, (size_t)nk * 4) == 0;
            for (int64_t i = 0; i < M * H; i++) fc[i] = k3_bf16_to_f32(yc[i]), fg[i] = k3_bf16_to_f32(yg[i]);
            rel = rel_l2(fg, fc, M * H);
            k3_latent_moe_run(pg, M, dx, &dw, use_res ? dres : NULL, dy, dids, dwt, dws, wsg, g_stream);
            cudaStreamSynchronize(g_stream);
            cudaMemcpy(yg2, dy, (size_t)(M * H) * 2, cudaMemcpyDeviceToHost);
            bitwise = memcmp(yg, yg2, (size_t)(M * H) * 2) == 0;
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            cudaEventRecord(e0, g_stream);
            for (int it = 0; it < 10; it++)
                k3_latent_moe_run(pg, M, dx, &dw, use_res ? dres : NULL, dy, NULL, NULL, dws, wsg, g_stream);
            cudaEventRecord(e1, g_stream);
            if (cuda_ok(cudaEventSynchronize(e1), "latent timing")) {
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
            if (cuda_ok(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal), "latent capture")) {
                const k3_status cst = k3_latent_moe_run(pg, M, dx, &dw, use_res ? dres : NULL, dy, dids, dwt, dws, wsg, g_stream);
                const cudaError_t ce = cudaStreamEndCapture(g_stream, &gr);
                CHECK(cst == K3_STATUS_SUCCESS && ce == cudaSuccess, "latent capture: %s / %s", k3_ctx_last_error(g_gpu),
                      cudaGetErrorString(ce));
                if (cst == K3_STATUS_SUCCESS && ce == cudaSuccess && cuda_ok(cudaGraphInstantiate(&ex, gr, 0), "latent instantiate")) {
                    for (int64_t i = 0; i < M * H; i++) x[i] = rand_bf16(&rng, 1.0f);
                    cudaMemcpyAsync(dx, x, (size_t)(M * H) * 2, cudaMemcpyHostToDevice, g_stream);
                    if (cuda_ok(cudaGraphLaunch(ex, g_stream), "latent graph launch") &&
                        cuda_ok(cudaStreamSynchronize(g_stream), "latent graph sync")) {
                        cudaMemcpy(yg, dy, (size_t)(M * H) * 2, cudaMemcpyDeviceToHost);
                        cudaMemcpy(idg, dids, (size_t)nk * 4, cudaMemcpyDeviceToHost);
                        k3_latent_moe_run(pc, M, x, &hw, use_res ? res : NULL, yc, idc, wc, hws, wsc, NULL);
                        for (int64_t i = 0; i < M * H; i++) fc[i] = k3_bf16_to_f32(yc[i]), fg[i] = k3_bf16_to_f32(yg[i]);
                        rel_graph = rel_l2(fg, fc, M * H);
                        graph_ok = rel_graph <= 1e-2 && memcmp(idc, idg, (size_t)nk * 4) == 0;
                    }
                }
            }
            if (ex) cudaGraphExecDestroy(ex);
            if (gr) cudaGraphDestroy(gr);
            cudaGetLastError();
        }
        cudaFree(dx), cudaFree(dres), cudaFree(dy), cudaFree(dids), cudaFree(dwt), cudaFree(dws);
        free(hws), free(yc), free(yg), free(yg2), free(idc), free(idg), free(wc), free(wg), free(fc), free(fg);
    }
    const int pass = rel <= 1e-2 && ids_eq && w_eq && bitwise && graph_ok != 0;
    printf("%s latent H=%lld L=%lld E=%d k=%d I=%lld Is=%lld M=%d residual=%d: routing ids %s, weights %s, y rel-L2 "
           "%.3e (tol 1e-2), two runs %s, gpu %.1f us/call",
           pass ? "PASS" : "FAIL", (long long)H, (long long)L, E, k, (long long)I, (long long)Is, M, use_res,
           ids_eq ? "equal" : "DIFFER", w_eq ? "bitwise equal" : "DIFFER", rel, bitwise ? "bitwise equal" : "DIFFER", us);
    if (graph) printf(", graph replay on new x %s (rel-L2 %.3e)", graph_ok > 0 ? "ok" : "FAILED", rel_graph);
    printf("\n");
    fflush(stdout);
    CHECK(pass, "latent case M=%d", M);
    k3_latent_moe_plan_destroy(pc);
    k3_latent_moe_plan_destroy(pg);
    cudaFree((void *)dw.gate), cudaFree((void *)dw.bias), cudaFree((void *)dw.down_proj), cudaFree((void *)dw.norm);
    cudaFree((void *)dw.up_proj), cudaFree((void *)dw.shared_gate_up), cudaFree((void *)dw.shared_down);
    moe_data_free(&md);
    free(x), free(res), free(gate), free(bias), free(down), free(norm), free(up), free(sgu), free(sdn);
}

/* ======================================================================= validation =================== */

static void validation_checks(void) {
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

    /* host memory given to a CUDA run is refused before any launch (the CLI tools used to pass host buffers) */
    k3_moe_desc_init(&d);
    d.num_experts = 8, d.top_k = 2, d.hidden = 128, d.inter = 64, d.max_tokens = 4;
    p = NULL;
    k3_status st2 = k3_moe_plan_create(g_gpu, &d, &p);
    size_t wsb = 0;
    if (st2 == K3_STATUS_SUCCESS) k3_moe_workspace_size(p, &wsb);
    void *dws = st2 == K3_STATUS_SUCCESS ? dalloc(wsb) : NULL;
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
    cuda_ok(cudaStreamSynchronize(g_stream), "sync after the refused run");
    k3_moe_plan_destroy(p);
    cudaFree(dws);
    free(h);
}

static const rcase k_router_cases[] = {
    {K3_ROUTER_SIGMOID_NOAUX_TC, 896, 16, 1, 7168, K3_DTYPE_BF16, 1, 1, 0, -1, 1.0f},
    {K3_ROUTER_SIGMOID_NOAUX_TC, 896, 16, 16, 7168, K3_DTYPE_BF16, 1, 1, 0, 5, 2.5f},
    {K3_ROUTER_SIGMOID_NOAUX_TC, 896, 16, 3, 7168, K3_DTYPE_F32, 1, 0, 0, -1, 1.0f},
    {K3_ROUTER_SIGMOID_NOAUX_TC, 56, 8, 64, 1000, K3_DTYPE_BF16, 1, 0, 1, -1, 1.0f},
    {K3_ROUTER_SIGMOID_NOAUX_TC, 56, 8, 8, 1000, K3_DTYPE_BF16, 0, 1, 0, 7, 1.5f},
    {K3_ROUTER_SIGMOID_NOAUX_TC, 20, 20, 5, 333, K3_DTYPE_F32, 1, 1, 0, 0, 1.0f},
    {K3_ROUTER_SOFTMAX, 56, 8, 16, 7168, K3_DTYPE_BF16, 1, 0, 0, -1, 1.0f},
    {K3_ROUTER_SOFTMAX, 128, 4, 4, 4096, K3_DTYPE_F32, 0, 0, 1, 9, 1.0f},
    {K3_ROUTER_SOFTMAX, 8, 2, 512, 256, K3_DTYPE_BF16, 1, 0, 0, -1, 1.0f},
    /* the ring kernel's token blockings (2 and 8 per block), E not a multiple of its 8 experts, a partial last
     * chunk (1000 = 3 x 256 + 232 bf16 / 7 x 128 + 104 f32) */
    {K3_ROUTER_SIGMOID_NOAUX_TC, 900, 16, 2, 1000, K3_DTYPE_F32, 1, 1, 0, 11, 1.0f},
    {K3_ROUTER_SIGMOID_NOAUX_TC, 900, 16, 6, 1000, K3_DTYPE_BF16, 1, 1, 1, -1, 2.5f},
    /* the selection's method boundaries (moe_route.cu): 257 and 1024 experts sort, 1025 takes the arg-max rounds */
    {K3_ROUTER_SIGMOID_NOAUX_TC, 257, 8, 2, 256, K3_DTYPE_F32, 1, 1, 1, 3, 1.0f},
    {K3_ROUTER_SOFTMAX, 1024, 8, 3, 512, K3_DTYPE_BF16, 1, 0, 1, 100, 1.0f},
    {K3_ROUTER_SIGMOID_NOAUX_TC, 1025, 4, 2, 256, K3_DTYPE_BF16, 0, 1, 0, -1, 1.0f},
};

static const mcase k_moe_cases[] = {
    /* the simplest shapes first (one expert, one token, whole chunks): isolate the MMA fragment mapping */
    {"basic", K3_WEIGHT_BF16, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 1, 1, 128, 128, 1, ROUTE_RANDOM, 0},
    {"basic", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 1, 1, 128, 128, 1, ROUTE_RANDOM, 0},
    {"basic", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 1, 1, 128, 128, 8, ROUTE_RANDOM, 0},
    {"basic", K3_WEIGHT_MXFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 1, 1, 128, 128, 1, ROUTE_RANDOM, 0},
    /* M sweep, NVFP4 SiTU (L, I multiples of 128: whole chunks only) */
    {"m-sweep", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 8, 2, 256, 128, 1, ROUTE_RANDOM, 0},
    {"m-sweep", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 8, 2, 256, 128, 2, ROUTE_RANDOM, 0},
    {"m-sweep", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 8, 2, 256, 128, 3, ROUTE_RANDOM, 0},
    {"m-sweep", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 8, 2, 256, 128, 8, ROUTE_RANDOM, 0},
    {"m-sweep", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 8, 2, 256, 128, 16, ROUTE_RANDOM, 0},
    {"m-sweep", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 8, 2, 256, 128, 64, ROUTE_RANDOM, 0},
    {"m-sweep", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 8, 2, 256, 128, 512, ROUTE_RANDOM, 0},
    /* tails (L = 224: one chunk + 6 steps; I = 96: steps only), top-k sweep, E = 56 */
    {"tails", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 1, K3_MOE_W4A16, K3_ACT_SITU, 56, 8, 224, 96, 1, ROUTE_RANDOM, 0},
    {"tails", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 1, K3_MOE_W4A16, K3_ACT_SITU, 56, 8, 224, 96, 16, ROUTE_RANDOM, 0},
    {"topk1", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 1, 256, 128, 16, ROUTE_RANDOM, 0},
    {"topk16", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 16, 256, 128, 8, ROUTE_RANDOM, 0},
    {"prefill", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 8, 256, 128, 512, ROUTE_RANDOM, 0},
    /* E = 896 (small L / I so the CPU reference stays fast): most experts get no tokens */
    {"e896", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 896, 16, 128, 64, 1, ROUTE_RANDOM, 0},
    {"e896", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 896, 16, 128, 64, 16, ROUTE_RANDOM, 0},
    {"e896", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 896, 16, 128, 64, 64, ROUTE_RANDOM, 0},
    {"e896", K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A16, K3_ACT_SITU, 896, 16, 128, 64, 3, ROUTE_RANDOM, 0},
    /* routing extremes */
    {"one-expert", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 1, 256, 128, 64, ROUTE_ONE_EXPERT, 0},
    {"one-expert", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 4, 256, 128, 40, ROUTE_ONE_EXPERT, 0},
    {"few-experts", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 2, 256, 128, 100, ROUTE_LOW_EXPERTS, 0},
    /* formats and layouts */
    {"mxfp4", K3_WEIGHT_MXFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 8, 256, 64, 3, ROUTE_RANDOM, 0},
    {"mxfp4", K3_WEIGHT_MXFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 8, 224, 96, 16, ROUTE_RANDOM, 0},
    {"mxfp4-swz", K3_WEIGHT_MXFP4, K3_SCALE_SWIZZLED, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 8, 256, 128, 8, ROUTE_RANDOM, 0},
    {"nvfp4-swz", K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 8, 256, 160, 8, ROUTE_RANDOM, 0},
    {"nvfp4-swz", K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A16, K3_ACT_SITU, 8, 2, 384, 256, 16, ROUTE_RANDOM, 0},
    {"bf16", K3_WEIGHT_BF16, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 8, 2, 128, 64, 1, ROUTE_RANDOM, 0},
    {"bf16", K3_WEIGHT_BF16, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 8, 2, 224, 96, 8, ROUTE_RANDOM, 0},
    /* W4A4 */
    {"w4a4", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A4, K3_ACT_SITU, 56, 8, 256, 128, 1, ROUTE_RANDOM, 0},
    {"w4a4", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 1, K3_MOE_W4A4, K3_ACT_SITU, 56, 8, 256, 128, 16, ROUTE_RANDOM, 0},
    {"w4a4", K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 0, K3_MOE_W4A4, K3_ACT_SITU, 8, 2, 224, 96, 64, ROUTE_RANDOM, 0},
    /* every activation */
    {"act", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SILU, 8, 2, 256, 128, 8, ROUTE_RANDOM, 0},
    {"act", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 1, K3_MOE_W4A16, K3_ACT_SWIGLUOAI, 8, 2, 256, 128, 8, ROUTE_RANDOM, 0},
    {"act", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SWIGLUOAI_UNINTERLEAVE, 8, 2, 256, 128, 8, ROUTE_RANDOM, 0},
    {"act", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_RELU2_NO_MUL, 8, 2, 256, 128, 8, ROUTE_RANDOM, 0},
    {"act", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A4, K3_ACT_RELU2_NO_MUL, 8, 2, 256, 128, 8, ROUTE_RANDOM, 0},
    {"act", K3_WEIGHT_MXFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SWIGLUOAI, 8, 2, 256, 128, 8, ROUTE_RANDOM, 0},
    /* CUDA-graph capture, replay with new routing */
    {"graph", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 8, 256, 128, 16, ROUTE_RANDOM, 1},
    {"graph", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 1, K3_MOE_W4A4, K3_ACT_SITU, 896, 16, 128, 64, 4, ROUTE_ONE_EXPERT, 1},
    /* the real shapes: K3 TP8 (896 experts, I 384, L 3584) and an EP16 expert width (I 3072) */
    {"k3-tp8", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 896, 16, 3584, 384, 1, ROUTE_RANDOM, 0},
    {"k3-tp8", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 896, 16, 3584, 384, 4, ROUTE_RANDOM, 1},
    {"k3-ep16", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 16, 3584, 3072, 1, ROUTE_RANDOM, 0},
    /* GEMM2 split along K (I >= 1024) at small L, so the sanitizers' quick mode covers it: 8 and 9 chunks (an
     * uneven split), linear and swizzled scales, W4A16 and W4A4, one and two token groups per pass */
    {"split-k", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 8, 2, 256, 1024, 4, ROUTE_RANDOM, 0},
    {"split-k", K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A4, K3_ACT_SITU, 56, 8, 128, 1152, 16, ROUTE_RANDOM, 0},
    /* the EP16 shape of `k3 bench moe` (one expert per token at I 3072: 1 and 4 experts), a TP8-like small case
     * (many slots, whole 128-wide chunks, NT 1) and duplicate ids (one expert gets M * k pairs: 2-3 passes through
     * GEMM1's 4-warp split-K epilogue, the block barrier between passes) with linear and swizzled scales, W4A16
     * and W4A4 (NT 1: the cp.async kernels take 8 tokens per pass through m 64 since session 19) */
    {"k3-ep16-k1", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 1, 3584, 3072, 1, ROUTE_RANDOM, 1},
    {"k3-ep16-k1", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 1, 3584, 3072, 4, ROUTE_RANDOM, 0},
    {"many-slots", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 896, 16, 256, 128, 8, ROUTE_RANDOM, 0},
    {"dup-ids", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 8, 4, 512, 256, 4, ROUTE_DUP, 0},
    {"dup-ids", K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A4, K3_ACT_SITU, 8, 4, 384, 128, 6, ROUTE_DUP, 0},
    {"dup-ids", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 1, K3_MOE_W4A4, K3_ACT_SITU, 8, 3, 256, 256, 12, ROUTE_DUP, 1},
    /* the dispatch folded into the GEMMs (W4A16, m * top_k <= 256, grids of about a wave; session 14b), captured
     * then replayed with new routing: duplicate ids (24 pairs on one expert: 3 passes) replayed with random ones,
     * exactly 256 pairs (two ids per thread, the last chunk full) over E 56 and E 896 (1,024 GEMM1 blocks at NT 1:
     * folded, as the E 56 case), and 264 pairs (past the fold: the dispatch kernel) */
    {"fold-graph", K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A16, K3_ACT_SITU, 8, 4, 384, 128, 6, ROUTE_DUP, 1},
    {"fold-edge", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 16, 128, 64, 16, ROUTE_RANDOM, 1},
    {"fold-edge", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 896, 16, 128, 64, 16, ROUTE_RANDOM, 1},
    {"fold-edge", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 8, 256, 128, 33, ROUTE_RANDOM, 1},
    /* GEMM2 split over 8 warps (256-thread blocks, grids of <= 2 blocks per SM; session 17) with the fold at 256
     * threads: 9 chunks (warp 0 takes two) with swizzled separate scales, SwiGLU-OAI and graph replay; 12 pairs
     * on one expert (two passes through the 8-warp split-K sum); and 8 chunks plus 4 tail steps (I 1088: the
     * 16-element steps split over the 8 warps too) */
    {"wide-k", K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A16, K3_ACT_SWIGLUOAI, 8, 2, 256, 1152, 1, ROUTE_RANDOM, 1},
    {"wide-k", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 8, 4, 384, 1024, 3, ROUTE_DUP, 0},
    {"wide-k", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 8, 2, 256, 1088, 2, ROUTE_RANDOM, 0},
    /* GEMM2's denser instances at NT 1 (session 18; grids past a wave of the default on a 132-SM H200): split-K
     * with 896 blocks (56 slots x 16 tiles) through the dispatch kernel, with swizzled scales and graph replay;
     * split-K folded (16 slots: GEMM1 1,024 blocks, GEMM2 768); KS 1 at 8 blocks per SM (128 slots x 16 blocks:
     * past two waves) */
    {"dense-g2", K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A16, K3_ACT_SITU, 56, 8, 256, 1024, 8, ROUTE_RANDOM, 1},
    {"dense-g2", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 16, 2, 768, 1024, 8, ROUTE_RANDOM, 0},
    {"dense-g2", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 896, 16, 1024, 64, 8, ROUTE_RANDOM, 0},
    /* tokens per pass (session 19): the cp.async kernels at NT 2 past m 64 (split-K GEMM2, W4A4, swizzled separate
     * scales, graph replay); the register-ring kernels at NT 4 past m 16, where the cp.async ring cannot run (MXFP4,
     * and NVFP4 with L 224: linear scale words not 4-byte aligned) */
    {"nt2", K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A4, K3_ACT_SITU, 56, 8, 128, 1152, 80, ROUTE_RANDOM, 1},
    {"nt4", K3_WEIGHT_MXFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 8, 224, 96, 40, ROUTE_RANDOM, 0},
    {"nt4", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 1, K3_MOE_W4A16, K3_ACT_SITU, 56, 8, 224, 96, 40, ROUTE_RANDOM, 1},
    /* GEMM2 with four row tiles per warp (session 21: where the two-tile grid is more than 6 waves; here ~610 units
     * x 8 block rows of L 1024 on a 132-SM H200), W4A16 with graph replay and W4A4 with swizzled separate scales;
     * gpu_moe compares both with one tile per warp, bitwise */
    {"g2-tiles", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 896, 16, 1024, 64, 64, ROUTE_RANDOM, 1},
    {"g2-tiles", K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A4, K3_ACT_SITU, 896, 16, 1024, 64, 64, ROUTE_RANDOM, 0},
    /* two tiles with direct output (top_k 1; unfolded: GEMM1's 64 x 56 blocks are past two waves; I 896 < 1024 keeps
     * GEMM2 at KS 1), also rerun with ids outside [0, E) on odd tokens */
    {"g2-tiles", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 896, 1, 256, 896, 64, ROUTE_RANDOM, 0},
    /* GEMM1's first wave routing itself ahead of the dispatch kernel (session 22; unfolded: GEMM1 grids past two
     * waves, and within EARLY_WAVES, 8 on a 132-SM H200). Every token on expert 3 at M 16: its 16 pairs are two
     * units, so the units are not the touched experts and the first wave takes the dispatch's units after its wait
     * (graph replay: new routing, random, where it routes itself). Duplicate ids at M 4: units are whole experts
     * (tpu = np), several passes of one block. Non-gated (RELU2): the other instance. */
    {"early", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_SITU, 56, 4, 256, 1024, 16, ROUTE_ONE_EXPERT, 1},
    {"early", K3_WEIGHT_NVFP4, K3_SCALE_SWIZZLED, 1, K3_MOE_W4A16, K3_ACT_SITU, 8, 4, 512, 4096, 4, ROUTE_DUP, 0},
    {"early", K3_WEIGHT_NVFP4, K3_SCALE_LINEAR, 0, K3_MOE_W4A16, K3_ACT_RELU2_NO_MUL, 56, 8, 256, 1024, 8, ROUTE_RANDOM, 1},
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
    cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking);
    const double t0 = now_s();
    if (gi == 0) {
        k3_arch_info ai;
        k3_ctx_arch(g_gpu, &ai);
        printf("gpu_moe: seed 0x%X, device %s (sm_%d)\n", SEED, ai.device_name, ai.sm_version);
        for (size_t i = 0; i < sizeof k_router_cases / sizeof k_router_cases[0]; i++)
            router_case(&k_router_cases[i], SEED + 100 + i);
    } else if (gi == 1) {
        dispatch_case(1, 16, 896, 0, 8, SEED + 200);
        dispatch_case(16, 16, 896, 0, 8, SEED + 201);
        dispatch_case(3, 8, 56, 0, 1, SEED + 202);
        dispatch_case(512, 8, 56, 1, 16, SEED + 203);
        dispatch_case(4096, 16, 896, 0, 16, SEED + 204);
        dispatch_case(4096, 1, 8, 1, 5, SEED + 205);
        dispatch_case(16, 8, 9000, 0, 8, SEED + 206); /* past 8192 experts: the counters in cur [E] */
        dispatch_refused(0, 0, "tokens_per_unit 0");
        dispatch_refused(8, 1, "wts without wsort");
    } else if (gi < N_GROUPS - 1) {
        const int first = (gi - 2) * MOE_PER_GROUP;
        for (int i = first; i < first + MOE_PER_GROUP && i < N_MOE_CASES; i++) {
            if (quick && (k_moe_cases[i].L > 512 || k_moe_cases[i].M > 80)) continue;
            moe_case(&k_moe_cases[i], SEED + 300 + (uint64_t)i);
        }
    } else {
        latent_case(1024, 512, 56, 8, 128, 256, 1, 0, 0, SEED + 400);
        latent_case(1024, 512, 56, 8, 128, 256, 16, 1, 1, SEED + 401);
        if (!quick) latent_case(7168, 3584, 64, 16, 384, 768, 4, 1, 1, SEED + 402); /* K3 widths, fewer experts */
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
