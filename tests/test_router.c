/*
 * The router through the public API against an independent fp64 evaluation written here:
 * ids identical, weights within 1e-6; exact ties go to the lower id; top_k 1, 16 and E; softmax; BF16 and F32
 * gates; NaN logits; every plan and run validation error.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "k3.h"
#include "test_util.h"

static k3t_rng rng;

/* a workspace large enough for every CPU plan here (E <= 4096 floats plus alignment slack) */
static float g_ws[4096 + 64];

static float t_bf16_to_f32(uint16_t b) { return k3t_bf16_to_f32(b); }
static uint16_t t_trunc_bf16(float x) {
    union {
        uint32_t u;
        float f;
    } v;
    v.f = x;
    return (uint16_t)(v.u >> 16);
}

/*
 * The reference for one token: fp64 logits, sigmoid (noaux_tc) or softmax in fp64, then top-k by repeated
 * arg-max over the not-yet-chosen experts (first maximum wins: the lower id), NaN keys counting as -inf.
 */
static void ref_router(const k3_router_desc *d, const uint16_t *x, const void *gate, const float *bias,
                       int32_t *ids, double *wts) {
    const int32_t E = d->num_experts, k = d->top_k;
    double *logit = malloc(sizeof(double) * (size_t)E), *key = malloc(sizeof(double) * (size_t)E);
    char *taken = calloc((size_t)E, 1);
    for (int32_t e = 0; e < E; e++) {
        double s = 0;
        for (int64_t h = 0; h < d->hidden; h++) {
            double g = d->gate_dtype == K3_DTYPE_F32 ? ((const float *)gate)[e * d->hidden + h]
                                                     : t_bf16_to_f32(((const uint16_t *)gate)[e * d->hidden + h]);
            s += (double)t_bf16_to_f32(x[h]) * g;
        }
        logit[e] = s;
    }
    double mx = -INFINITY, z = 0;
    if (d->kind == K3_ROUTER_SOFTMAX) {
        for (int32_t e = 0; e < E; e++)
            if (!isnan(logit[e]) && logit[e] > mx) mx = logit[e];
        for (int32_t e = 0; e < E; e++) z += isnan(logit[e]) ? 0.0 : exp(logit[e] - mx);
    }
    for (int32_t e = 0; e < E; e++) {
        if (d->kind == K3_ROUTER_SOFTMAX)
            key[e] = isnan(logit[e]) ? 0.0 : exp(logit[e] - mx) / z;
        else
            key[e] = 1.0 / (1.0 + exp(-logit[e])) + (bias ? bias[e] : 0.0);
        if (isnan(key[e])) key[e] = -INFINITY;
    }
    double sum = 0;
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || key[e] > key[best])) best = e;
        taken[best] = 1;
        ids[j] = best;
        if (d->kind == K3_ROUTER_SOFTMAX)
            wts[j] = key[best];
        else
            wts[j] = isnan(logit[best]) ? 0.0 : 1.0 / (1.0 + exp(-logit[best]));
        sum += wts[j];
    }
    for (int32_t j = 0; j < k; j++) {
        if (d->renormalize) wts[j] /= (d->kind == K3_ROUTER_SOFTMAX ? sum : sum + 1e-20);
        wts[j] *= d->scaling_factor;
    }
    free(logit);
    free(key);
    free(taken);
}

/* Runs the plan for m tokens and compares every token with the reference. Returns the number of bad tokens. */
static int compare(k3_ctx *ctx, const k3_router_desc *d, int64_t m, const uint16_t *x, const void *gate,
                   const float *bias, const char *label) {
    k3_router_plan *plan = NULL;
    k3_status st = k3_router_plan_create(ctx, d, &plan);
    CHECK(st == K3_STATUS_SUCCESS, "%s: plan: %s", label, k3_ctx_last_error(ctx));
    if (st != K3_STATUS_SUCCESS) return 1;
    size_t ws = 0;
    CHECK(k3_router_workspace_size(plan, &ws) == K3_STATUS_SUCCESS && ws >= sizeof(float) * (size_t)d->num_experts,
          "%s: workspace %zu holds E floats", label, ws);
    void *wsp = malloc(ws); /* exactly what the plan asks for: ASan sees any write past it */
    const int32_t k = d->top_k;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(m * k)), *rids = malloc(sizeof(int32_t) * (size_t)k);
    float *w = malloc(sizeof(float) * (size_t)(m * k));
    double *rw = malloc(sizeof(double) * (size_t)k);
    st = k3_router_run(plan, m, x, gate, bias, ids, w, wsp, ws, NULL);
    CHECK(st == K3_STATUS_SUCCESS, "%s: run: %s", label, k3_ctx_last_error(ctx));
    int bad_ids = 0, bad_w = 0;
    double worst = 0;
    for (int64_t t = 0; t < m; t++) {
        ref_router(d, x + t * d->hidden, gate, bias, rids, rw);
        if (memcmp(rids, ids + t * k, sizeof(int32_t) * (size_t)k)) {
            if (bad_ids++ < 2) {
                fprintf(stderr, "  %s token %lld ids:", label, (long long)t);
                for (int32_t j = 0; j < k && j < 8; j++) fprintf(stderr, " %d/%d", ids[t * k + j], rids[j]);
                fprintf(stderr, "\n");
            }
        }
        for (int32_t j = 0; j < k; j++) {
            double e = fabs(w[t * k + j] - rw[j]);
            if (e > worst) worst = e;
            if (!(e <= 1e-6)) bad_w++;
        }
    }
    CHECK(bad_ids == 0, "%s: %d of %lld tokens with different ids", label, bad_ids, (long long)m);
    CHECK(bad_w == 0, "%s: %d weights beyond 1e-6", label, bad_w);
    printf("  %-40s m %2lld: ids identical %s, max |weight err| %.2e\n", label, (long long)m,
           bad_ids ? "NO" : "yes", worst);
    free(ids);
    free(rids);
    free(w);
    free(rw);
    free(wsp);
    k3_router_plan_destroy(plan);
    return bad_ids + bad_w;
}

typedef struct {
    k3_router_kind kind;
    int32_t E, k;
    int64_t H;
    k3_dtype dt;
    int renorm;
    float sf;
    int use_bias;
    int64_t m;
    const char *label;
} rcase;

static void random_case(k3_ctx *ctx, rcase c) {
    k3_router_desc d;
    k3_router_desc_init(&d);
    d.kind = c.kind;
    d.num_experts = c.E;
    d.top_k = c.k;
    d.hidden = c.H;
    d.gate_dtype = c.dt;
    d.renormalize = c.renorm;
    d.scaling_factor = c.sf;
    d.max_tokens = c.m;
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(c.m * c.H));
    void *gate = malloc((c.dt == K3_DTYPE_F32 ? 4 : 2) * (size_t)(c.E * c.H));
    float *bias = malloc(sizeof(float) * (size_t)c.E);
    for (int64_t i = 0; i < c.m * c.H; i++) x[i] = t_trunc_bf16((float)k3t_normal(&rng));
    /* logits ~ N(0, 1.5^2) so the sigmoid is not saturated and top-k gaps are >> fp32 logit error */
    const double gs = 1.5 / sqrt((double)c.H);
    for (int64_t i = 0; i < c.E * c.H; i++) {
        float v = (float)(k3t_normal(&rng) * gs);
        if (c.dt == K3_DTYPE_F32)
            ((float *)gate)[i] = v;
        else
            ((uint16_t *)gate)[i] = t_trunc_bf16(v);
    }
    for (int32_t e = 0; e < c.E; e++) bias[e] = 0.1f * k3t_uniform(&rng);
    compare(ctx, &d, c.m, x, gate, c.use_bias ? bias : NULL, c.label);
    free(x);
    free(gate);
    free(bias);
}

/* Exact ties: a zero gate makes every logit 0 (score 0.5); the bias has classes of equal values. */
static void test_ties(k3_ctx *ctx) {
    k3_router_desc d;
    k3_router_desc_init(&d);
    d.num_experts = 64;
    d.top_k = 16;
    d.hidden = 32;
    d.max_tokens = 2;
    uint16_t x[64];
    for (int i = 0; i < 64; i++) x[i] = t_trunc_bf16((float)k3t_normal(&rng));
    uint16_t gate[64 * 32];
    memset(gate, 0, sizeof gate);
    float bias[64];
    for (int e = 0; e < 64; e++) bias[e] = (float)(e % 5) * 0.25f; /* class 4 = ids 4, 9, ..., 59 (12 of them) */
    compare(ctx, &d, 2, x, gate, bias, "ties: zero gate, 5 bias classes");
    /* the expected answer by hand: the 12 ids of class 4 ascending, then the 4 lowest ids of class 3 */
    k3_router_plan *plan = NULL;
    int32_t ids[32];
    float w[32];
    CHECK(k3_router_plan_create(ctx, &d, &plan) == K3_STATUS_SUCCESS, "ties plan");
    CHECK(k3_router_run(plan, 2, x, gate, bias, ids, w, g_ws, sizeof g_ws, NULL) == K3_STATUS_SUCCESS, "ties run");
    int ok = 1;
    for (int j = 0; j < 12; j++) ok &= ids[j] == 4 + 5 * j && ids[16 + j] == 4 + 5 * j;
    for (int j = 0; j < 4; j++) ok &= ids[12 + j] == 3 + 5 * j && ids[28 + j] == 3 + 5 * j;
    for (int j = 0; j < 32; j++) ok &= fabsf(w[j] - 1.0f / 16) <= 1e-7f;
    CHECK(ok, "ties: class 4 ascending then 3, 8, 13, 18; weights 1/16");
    k3_router_plan_destroy(plan);

    /* no bias: all 64 scores tie, so the answer is ids 0..15 in order */
    CHECK(k3_router_plan_create(ctx, &d, &plan) == K3_STATUS_SUCCESS, "ties plan 2");
    CHECK(k3_router_run(plan, 1, x, gate, NULL, ids, w, g_ws, sizeof g_ws, NULL) == K3_STATUS_SUCCESS, "ties run 2");
    ok = 1;
    for (int j = 0; j < 16; j++) ok &= ids[j] == j;
    CHECK(ok, "all tied: ids 0..15");
    k3_router_plan_destroy(plan);

    /* softmax, all tied: uniform probabilities, ids 0..15, renormalized weights 1/16 */
    d.kind = K3_ROUTER_SOFTMAX;
    compare(ctx, &d, 1, x, gate, NULL, "ties: softmax zero gate");
}

/* NaN logits (an F32 gate row of NaN) are chosen last, lowest id first, with weight 0. */
static void test_nan(k3_ctx *ctx) {
    k3_router_desc d;
    k3_router_desc_init(&d);
    d.num_experts = 8;
    d.top_k = 8;
    d.hidden = 16;
    d.gate_dtype = K3_DTYPE_F32;
    d.max_tokens = 1;
    uint16_t x[16];
    float gate[8 * 16];
    for (int i = 0; i < 16; i++) x[i] = t_trunc_bf16(1.0f);
    for (int e = 0; e < 8; e++)
        for (int h = 0; h < 16; h++) gate[e * 16 + h] = (e == 1 || e == 5) ? NAN : 0.01f * (float)e;
    for (int kind = 0; kind < 2; kind++) {
        d.kind = (k3_router_kind)kind;
        k3_router_plan *plan = NULL;
        int32_t ids[8];
        float w[8];
        CHECK(k3_router_plan_create(ctx, &d, &plan) == K3_STATUS_SUCCESS, "nan plan");
        CHECK(k3_router_run(plan, 1, x, gate, NULL, ids, w, g_ws, sizeof g_ws, NULL) == K3_STATUS_SUCCESS, "nan run");
        const int32_t want[8] = {7, 6, 4, 3, 2, 0, 1, 5};
        CHECK(!memcmp(ids, want, sizeof want), "%s: NaN experts last: %d %d %d %d %d %d %d %d",
              kind ? "softmax" : "sigmoid", ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], ids[7]);
        float s = 0;
        int finite = 1;
        for (int j = 0; j < 8; j++) {
            s += w[j];
            finite &= isfinite(w[j]);
        }
        CHECK(finite && w[6] == 0.0f && w[7] == 0.0f && fabsf(s - 1.0f) < 1e-6f, "%s: NaN weights 0, sum 1",
              kind ? "softmax" : "sigmoid");
        k3_router_plan_destroy(plan);
        compare(ctx, &d, 1, x, gate, NULL, kind ? "nan logits, softmax" : "nan logits, sigmoid");
    }
}

#define EXPECT_PLAN_ERR(ctx, d, needle, label)                                                                 \
    do {                                                                                                       \
        k3_router_plan *p_ = (k3_router_plan *)1;                                                              \
        k3_status st_ = k3_router_plan_create((ctx), (d), &p_);                                                \
        CHECK(st_ == K3_STATUS_INVALID_ARGUMENT && p_ == NULL, "%s: status %d", label, (int)st_);             \
        CHECK(strstr(k3_ctx_last_error(ctx), needle) != NULL, "%s: message \"%s\" lacks \"%s\"", label,        \
              k3_ctx_last_error(ctx), needle);                                                                 \
    } while (0)

static void test_validation(k3_ctx *ctx) {
    k3_router_desc d, base;
    k3_router_desc_init(&base);
    CHECK(base.kind == K3_ROUTER_SIGMOID_NOAUX_TC && base.num_experts == 896 && base.top_k == 16 &&
              base.hidden == 7168 && base.gate_dtype == K3_DTYPE_BF16 && base.renormalize == 1 &&
              base.scaling_factor == 1.0f && base.max_tokens == 16,
          "K3 defaults");
    k3_router_plan *p = NULL;
    CHECK(k3_router_plan_create(NULL, &base, &p) == K3_STATUS_INVALID_ARGUMENT, "NULL ctx");
    CHECK(k3_router_plan_create(ctx, &base, NULL) == K3_STATUS_INVALID_ARGUMENT &&
              strstr(k3_ctx_last_error(ctx), "out is NULL"),
          "NULL out: %s", k3_ctx_last_error(ctx));
    EXPECT_PLAN_ERR(ctx, NULL, "descriptor is NULL", "NULL desc");
    d = base, d.kind = (k3_router_kind)2;
    EXPECT_PLAN_ERR(ctx, &d, "router kind 2 is unknown", "kind 2");
    d = base, d.num_experts = 0;
    EXPECT_PLAN_ERR(ctx, &d, "num_experts must be in [1, 4096] (got 0)", "E 0");
    d = base, d.num_experts = 4097;
    EXPECT_PLAN_ERR(ctx, &d, "num_experts must be in [1, 4096] (got 4097)", "E 4097");
    d = base, d.top_k = 0;
    EXPECT_PLAN_ERR(ctx, &d, "top_k must be in [1, min(num_experts, 32)] = [1, 32] (got 0)", "top_k 0");
    d = base, d.top_k = 33;
    EXPECT_PLAN_ERR(ctx, &d, "(got 33)", "top_k 33");
    d = base, d.num_experts = 8, d.top_k = 9;
    EXPECT_PLAN_ERR(ctx, &d, "= [1, 8] (got 9)", "top_k > E");
    d = base, d.hidden = 0;
    EXPECT_PLAN_ERR(ctx, &d, "hidden must be in [1, 16777216] (got 0)", "hidden 0");
    d = base, d.hidden = -5;
    EXPECT_PLAN_ERR(ctx, &d, "hidden must be in [1, 16777216] (got -5)", "hidden -5");
    d = base, d.gate_dtype = (k3_dtype)7;
    EXPECT_PLAN_ERR(ctx, &d, "gate_dtype 7 is unknown", "dtype 7");
    d = base, d.renormalize = 2;
    EXPECT_PLAN_ERR(ctx, &d, "renormalize must be 0 or 1", "renormalize 2");
    d = base, d.scaling_factor = 0.0f;
    EXPECT_PLAN_ERR(ctx, &d, "scaling_factor must be finite and > 0", "scale 0");
    d = base, d.scaling_factor = -1.0f;
    EXPECT_PLAN_ERR(ctx, &d, "scaling_factor must be finite and > 0", "scale -1");
    d = base, d.scaling_factor = NAN;
    EXPECT_PLAN_ERR(ctx, &d, "scaling_factor must be finite and > 0", "scale NaN");
    d = base, d.scaling_factor = INFINITY;
    EXPECT_PLAN_ERR(ctx, &d, "scaling_factor must be finite and > 0", "scale inf");
    d = base, d.max_tokens = 0;
    EXPECT_PLAN_ERR(ctx, &d, "max_tokens must be in [1, 65536] (got 0)", "max_tokens 0");
    /* unbounded sizes wrapped the CUDA workspace (max_tokens * E * 4 = 0 for 2^62 x 4) */
    d = base, d.num_experts = 4, d.top_k = 2, d.max_tokens = INT64_C(1) << 62;
    EXPECT_PLAN_ERR(ctx, &d, "max_tokens must be in [1, 65536] (got 4611686018427387904)", "max_tokens 2^62");
    d = base, d.max_tokens = 65537;
    EXPECT_PLAN_ERR(ctx, &d, "max_tokens must be in [1, 65536] (got 65537)", "max_tokens 65537");
    d = base, d.hidden = (INT64_C(1) << 24) + 1;
    EXPECT_PLAN_ERR(ctx, &d, "hidden must be in [1, 16777216] (got 16777217)", "hidden 2^24 + 1");
    d = base, d.hidden = INT64_MAX;
    EXPECT_PLAN_ERR(ctx, &d, "hidden must be in [1, 16777216]", "hidden INT64_MAX");
    d = base, d.max_tokens = 65536, d.hidden = INT64_C(1) << 24;
    CHECK(k3_router_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "max_tokens 65536, hidden 2^24 valid: %s",
          k3_ctx_last_error(ctx));
    k3_router_plan_destroy(p);
    /* the edges that are valid */
    d = base, d.num_experts = 4096, d.top_k = 32;
    CHECK(k3_router_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "E 4096 top_k 32 valid");
    k3_router_plan_destroy(p);
    d = base, d.num_experts = 1, d.top_k = 1, d.hidden = 1, d.max_tokens = 1;
    CHECK(k3_router_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "E 1 top_k 1 H 1 valid");
    k3_router_plan_destroy(p);
    k3_router_plan_destroy(NULL);

    /* run-time checks */
    d = base, d.num_experts = 8, d.top_k = 2, d.hidden = 4, d.max_tokens = 3;
    CHECK(k3_router_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "small plan");
    uint16_t x[12] = {0};
    uint16_t gate[32] = {0};
    float bias[8] = {0}, w[6];
    int32_t ids[6];
    CHECK(k3_router_run(NULL, 1, x, gate, NULL, ids, w, g_ws, sizeof g_ws, NULL) == K3_STATUS_INVALID_ARGUMENT,
          "NULL plan");
    struct {
        int64_t m;
        const void *x, *gate;
        const float *bias;
        int32_t *ids;
        float *w;
        const char *needle;
    } rc[] = {
        {0, x, gate, NULL, ids, w, "m must be in [1, max_tokens = 3] (got 0)"},
        {4, x, gate, NULL, ids, w, "too many tokens for this plan: m = 4, the plan was made for max_tokens = 3"},
        {-1, x, gate, NULL, ids, w, "(got -1)"},
        {1, NULL, gate, NULL, ids, w, "x is NULL"},
        {1, x, NULL, NULL, ids, w, "gate is NULL"},
        {1, x, gate, NULL, NULL, w, "topk_ids is NULL"},
        {1, x, gate, NULL, ids, NULL, "topk_weights is NULL"},
    };
    for (size_t i = 0; i < sizeof rc / sizeof rc[0]; i++) {
        k3_status st =
            k3_router_run(p, rc[i].m, rc[i].x, rc[i].gate, rc[i].bias, rc[i].ids, rc[i].w, g_ws, sizeof g_ws, NULL);
        CHECK(st == K3_STATUS_INVALID_ARGUMENT, "run case %zu: status %d", i, (int)st);
        CHECK(strstr(k3_ctx_last_error(ctx), rc[i].needle) != NULL, "run case %zu: \"%s\" lacks \"%s\"", i,
              k3_ctx_last_error(ctx), rc[i].needle);
    }
    /* misaligned tensors are refused, naming the pointer (the CPU router reads them as uint16 / float) */
    {
        static float fbuf[64];
        static uint16_t hbuf[64];
        const char *hb = (const char *)hbuf, *fb = (const char *)fbuf;
        struct {
            const void *x, *gate;
            const float *bias;
            int32_t *ids;
            float *w;
            const char *needle;
        } mc[] = {
            {hb + 1, gate, NULL, ids, w, "x ("},
            {x, hb + 1, NULL, ids, w, "gate ("},
            {x, gate, (const float *)(const void *)(fb + 2), ids, w, "bias ("},
            {x, gate, NULL, (int32_t *)(void *)(fbuf + 1), w, NULL}, /* aligned: the control */
            {x, gate, NULL, (int32_t *)(void *)((char *)fbuf + 2), w, "topk_ids ("},
            {x, gate, NULL, ids, (float *)(void *)((char *)fbuf + 1), "topk_weights ("},
        };
        for (size_t i = 0; i < sizeof mc / sizeof mc[0]; i++) {
            k3_status st = k3_router_run(p, 1, mc[i].x, mc[i].gate, mc[i].bias, mc[i].ids, mc[i].w, g_ws, sizeof g_ws,
                                         NULL);
            if (!mc[i].needle) {
                CHECK(st == K3_STATUS_SUCCESS, "aligned control run: %s", k3_ctx_last_error(ctx));
                continue;
            }
            CHECK(st == K3_STATUS_INVALID_ARGUMENT && strstr(k3_ctx_last_error(ctx), mc[i].needle) &&
                      strstr(k3_ctx_last_error(ctx), "aligned"),
                  "misaligned case %zu: status %d, \"%s\" lacks \"%s\"", i, (int)st, k3_ctx_last_error(ctx),
                  mc[i].needle);
        }
        /* the F32 gate needs 4 bytes */
        k3_router_desc df = d;
        df.gate_dtype = K3_DTYPE_F32;
        k3_router_plan *pf = NULL;
        CHECK(k3_router_plan_create(ctx, &df, &pf) == K3_STATUS_SUCCESS, "f32 plan");
        CHECK(k3_router_run(pf, 1, x, hb + 2, NULL, ids, w, g_ws, sizeof g_ws, NULL) == K3_STATUS_INVALID_ARGUMENT &&
                  strstr(k3_ctx_last_error(ctx), "gate (") && strstr(k3_ctx_last_error(ctx), "4-byte aligned (F32)"),
              "f32 gate at 2 bytes: %s", k3_ctx_last_error(ctx));
        k3_router_plan_destroy(pf);
    }
    /* the CPU scratch comes from the caller's workspace: NULL or short is refused; an unaligned one is fine */
    {
        size_t need = 0;
        CHECK(k3_router_workspace_size(p, &need) == K3_STATUS_SUCCESS && need >= 8 * sizeof(float), "ws need %zu",
              need);
        CHECK(k3_router_run(p, 1, x, gate, NULL, ids, w, NULL, 0, NULL) == K3_STATUS_INVALID_ARGUMENT &&
                  strstr(k3_ctx_last_error(ctx), "ws_bytes is 0, the plan needs"),
              "no workspace: %s", k3_ctx_last_error(ctx));
        CHECK(k3_router_run(p, 1, x, gate, NULL, ids, w, NULL, need, NULL) == K3_STATUS_INVALID_ARGUMENT &&
                  strstr(k3_ctx_last_error(ctx), "ws is NULL"),
              "NULL workspace: %s", k3_ctx_last_error(ctx));
        CHECK(k3_router_run(p, 1, x, gate, NULL, ids, w, g_ws, need - 1, NULL) == K3_STATUS_INVALID_ARGUMENT,
              "short workspace");
        unsigned char *raw = malloc(need + 1);
        CHECK(raw && k3_router_run(p, 1, x, gate, NULL, ids, w, raw + 1, need, NULL) == K3_STATUS_SUCCESS,
              "unaligned workspace of the asked size: %s", k3_ctx_last_error(ctx));
        free(raw);
    }
    CHECK(k3_router_run(p, 3, x, gate, bias, ids, w, g_ws, sizeof g_ws, NULL) == K3_STATUS_SUCCESS &&
              !strcmp(k3_ctx_last_error(ctx), ""),
          "a good run clears the error");
    CHECK(k3_router_workspace_size(p, NULL) == K3_STATUS_INVALID_ARGUMENT, "NULL out_bytes");
    CHECK(k3_router_workspace_size(NULL, NULL) == K3_STATUS_INVALID_ARGUMENT, "NULL plan ws");
    k3_router_plan_destroy(p);
    d.kind = K3_ROUTER_SOFTMAX;
    CHECK(k3_router_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS, "softmax plan");
    CHECK(k3_router_run(p, 1, x, gate, bias, ids, w, g_ws, sizeof g_ws, NULL) == K3_STATUS_INVALID_ARGUMENT &&
              strstr(k3_ctx_last_error(ctx), "bias is only used by SIGMOID_NOAUX_TC"),
          "softmax with a bias: %s", k3_ctx_last_error(ctx));
    k3_router_plan_destroy(p);
}

/* On a CUDA context the router plans (the GPU router; its bitwise equality with the CPU router is tested by
 * tests/gpu_moe.c); a CPU-only build or a machine without a GPU skips this. */
static void test_cuda_context(void) {
    k3_ctx_options opt;
    k3_ctx_options_init(&opt);
    opt.backend = K3_BACKEND_CUDA;
    k3_ctx *ctx = NULL;
    if (k3_ctx_create(&opt, &ctx) != K3_STATUS_SUCCESS) {
        printf("no CUDA context here: the CUDA-context check is not run (not counted)\n");
        return;
    }
    k3_router_desc d;
    k3_router_desc_init(&d);
    k3_router_plan *p = NULL;
    CHECK(k3_router_plan_create(ctx, &d, &p) == K3_STATUS_SUCCESS && p != NULL, "CUDA router plans: %s",
          k3_ctx_last_error(ctx));
    k3_router_plan_destroy(p);
    k3_ctx_destroy(ctx);
}

int main(void) {
    const uint64_t seed = 0x4007E4ull;
    printf("seed 0x%llx\n", (unsigned long long)seed);
    rng.s = seed;
    k3_ctx *ctx = k3t_cpu_ctx();
    CHECK(ctx != NULL, "cpu context");
    if (!ctx) return k3t_finish();
    const rcase cases[] = {
        {K3_ROUTER_SIGMOID_NOAUX_TC, 896, 16, 7168, K3_DTYPE_BF16, 1, 1.0f, 1, 4, "K3: E 896 top-16 H 7168 bf16 + bias"},
        {K3_ROUTER_SIGMOID_NOAUX_TC, 896, 16, 7168, K3_DTYPE_F32, 1, 1.0f, 1, 2, "K3 shape, f32 gate"},
        {K3_ROUTER_SIGMOID_NOAUX_TC, 256, 1, 512, K3_DTYPE_BF16, 1, 1.0f, 1, 16, "top_k 1 (weight 1)"},
        {K3_ROUTER_SIGMOID_NOAUX_TC, 32, 32, 300, K3_DTYPE_BF16, 1, 2.5f, 1, 5, "top_k = E = 32, scale 2.5"},
        {K3_ROUTER_SIGMOID_NOAUX_TC, 7, 7, 33, K3_DTYPE_F32, 0, 1.0f, 1, 3, "top_k = E = 7, no renormalize"},
        {K3_ROUTER_SIGMOID_NOAUX_TC, 128, 8, 1000, K3_DTYPE_BF16, 0, 2.0f, 0, 6, "no bias, no renorm, scale 2"},
        {K3_ROUTER_SIGMOID_NOAUX_TC, 4096, 32, 64, K3_DTYPE_BF16, 1, 1.0f, 1, 2, "E 4096 top-32"},
        {K3_ROUTER_SOFTMAX, 64, 8, 2048, K3_DTYPE_BF16, 1, 1.0f, 0, 8, "softmax E 64 top-8 renorm"},
        {K3_ROUTER_SOFTMAX, 64, 6, 2048, K3_DTYPE_F32, 0, 1.0f, 0, 4, "softmax f32, no renorm"},
        {K3_ROUTER_SOFTMAX, 16, 16, 100, K3_DTYPE_BF16, 1, 1.0f, 0, 3, "softmax top_k = E"},
        {K3_ROUTER_SOFTMAX, 1, 1, 5, K3_DTYPE_BF16, 1, 1.0f, 0, 1, "softmax E 1"},
    };
    printf("random cases vs fp64:\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) random_case(ctx, cases[i]);
    test_ties(ctx);
    test_nan(ctx);
    test_validation(ctx);
    k3_ctx_destroy(ctx);
    test_cuda_context();
    return k3t_finish();
}
